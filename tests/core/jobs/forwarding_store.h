// A JobStore that passes every call to another one: derive from it and override the calls a test
// wants to break (a store that fails for a while, say).
#pragma once

#include "core/jobs/job_store.h"

namespace backhaul::jobs {

class ForwardingStore : public JobStore {
 public:
  explicit ForwardingStore(JobStore& inner) : inner_(inner) {}
  JobStore& inner() { return inner_; }

  SchemaVersions apply_migrations() override { return inner_.apply_migrations(); }
  std::string backend() const override { return inner_.backend(); }
  EnqueueResult enqueue(const JobSpec& spec, int64_t now_ms) override {
    return inner_.enqueue(spec, now_ms);
  }
  std::vector<EnqueueResult> enqueue_batch(const std::vector<JobSpec>& specs,
                                           int64_t now_ms) override {
    return inner_.enqueue_batch(specs, now_ms);
  }
  std::vector<Claimed> claim(const ClaimRequest& request) override { return inner_.claim(request); }
  HeartbeatResult heartbeat(JobId id, const std::string& token, int64_t now_ms, int64_t lease_ms,
                            const std::optional<std::string>& checkpoint, bool progress) override {
    return inner_.heartbeat(id, token, now_ms, lease_ms, checkpoint, progress);
  }
  void complete(JobId id, const std::string& token, const std::string& result_json,
                int64_t now_ms) override {
    inner_.complete(id, token, result_json, now_ms);
  }
  JobStatus fail(JobId id, const std::string& token, const Failure& failure,
                 int64_t now_ms) override {
    return inner_.fail(id, token, failure, now_ms);
  }
  void defer(JobId id, const std::string& token, int64_t run_after_ms, const std::string& reason,
             int64_t now_ms) override {
    inner_.defer(id, token, run_after_ms, reason, now_ms);
  }
  void release(JobId id, const std::string& token, int64_t now_ms) override {
    inner_.release(id, token, now_ms);
  }
  std::vector<FinishResult> finish(const std::vector<Finish>& items, int64_t now_ms) override {
    return inner_.finish(items, now_ms);
  }
  void wait_for_children(JobId id, const std::string& token, int64_t deadline_ms,
                         const std::optional<std::string>& checkpoint, int64_t now_ms) override {
    inner_.wait_for_children(id, token, deadline_ms, checkpoint, now_ms);
  }
  SweepResult sweep(int64_t now_ms) override { return inner_.sweep(now_ms); }
  SweepResult recover_owner(const std::string& owner, int64_t now_ms) override {
    return inner_.recover_owner(owner, now_ms);
  }
  using JobStore::prune;
  int64_t prune(int64_t finished_before_ms, int64_t max_jobs) override {
    return inner_.prune(finished_before_ms, max_jobs);
  }
  CancelOutcome cancel(JobId id, int64_t now_ms) override { return inner_.cancel(id, now_ms); }
  int cancel_key(const std::string& concurrency_key, const std::string& kind,
                 int64_t now_ms) override {
    return inner_.cancel_key(concurrency_key, kind, now_ms);
  }
  std::optional<Job> get(JobId id) override { return inner_.get(id); }
  JobPage list(const JobQuery& query) override { return inner_.list(query); }
  std::vector<Attempt> newest_attempts(JobId id, size_t limit) override {
    return inner_.newest_attempts(id, limit);
  }
  std::map<std::pair<std::string, JobStatus>, int64_t> counts() override { return inner_.counts(); }
  std::map<std::string, int64_t> queued_by_kind() override { return inner_.queued_by_kind(); }
  void set_checkpoint(JobId id, const std::optional<std::string>& checkpoint,
                      int64_t now_ms) override {
    inner_.set_checkpoint(id, checkpoint, now_ms);
  }
  void set_caps(const std::string& kind, Caps caps) override { inner_.set_caps(kind, caps); }
  std::map<std::string, Caps> caps() override { return inner_.caps(); }
  int max_running_seen(const std::string& kind, const std::string& concurrency_key) override {
    return inner_.max_running_seen(kind, concurrency_key);
  }
  int running(const std::string& kind, const std::string& concurrency_key) override {
    return inner_.running(kind, concurrency_key);
  }
  int64_t take_tokens(const std::string& key, double cost, double capacity, double refill_per_hour,
                      int64_t now_ms) override {
    return inner_.take_tokens(key, cost, capacity, refill_per_hour, now_ms);
  }
  CircuitRecord update_circuit(
      const std::string& name,
      const std::function<CircuitRecord(const CircuitRecord&)>& next) override {
    return inner_.update_circuit(name, next);
  }
  CircuitRecord circuit(const std::string& name) override { return inner_.circuit(name); }
  DeadLetterPage list_dead_letters(const DeadLetterQuery& query) override {
    return inner_.list_dead_letters(query);
  }
  std::optional<DeadLetter> get_dead_letter(int64_t id) override {
    return inner_.get_dead_letter(id);
  }
  std::map<std::pair<std::string, DeadLetterStatus>, int64_t> dead_letter_stats() override {
    return inner_.dead_letter_stats();
  }
  void retry_dead_letter(int64_t id, int64_t now_ms) override {
    inner_.retry_dead_letter(id, now_ms);
  }
  int retry_dead_letters(const DeadLetterQuery& query, size_t limit, int64_t now_ms) override {
    return inner_.retry_dead_letters(query, limit, now_ms);
  }
  void ignore_dead_letter(int64_t id, int64_t now_ms) override {
    inner_.ignore_dead_letter(id, now_ms);
  }
  int64_t purge_dead_letters(int64_t updated_before_ms) override {
    return inner_.purge_dead_letters(updated_before_ms);
  }

 private:
  JobStore& inner_;
};

}  // namespace backhaul::jobs
