// Runs jobs from a JobStore: a claim loop feeding a worker pool, a heartbeat loop whose lanes renew
// the leases of the jobs in hand, and a sweeper that recovers expired leases (SPEC D3-D6, F6).
// Handlers are registered by job kind. Job time comes from the injected Clock; only the loops' own
// pacing and a drain's grace period (how long a stopping process waits, in real time) use real
// waiting.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <spdlog/logger.h>

#include "core/common/clock.h"
#include "core/jobs/job_store.h"
#include "core/jobs/retry_policy.h"

namespace backhaul::jobs {

// Thrown by a handler to end the attempt as a failure. `fatal` sends the job straight to the dead
// letters; `retry_after_ms` > 0 is the least the retry waits: the retry policy's delay (with its
// jitter) when that is longer, so that a short wait asked for (a 503's "Retry-After: 1") does not
// retry faster than the backoff would. (A wait longer than the backoff is kept as asked, without
// jitter.)
class JobFailure : public Error {
 public:
  explicit JobFailure(const std::string& message, bool fatal = false, int64_t retry_after_ms = 0)
      : Error(message), fatal_(fatal), retry_after_ms_(retry_after_ms) {}
  bool fatal() const noexcept { return fatal_; }
  int64_t retry_after_ms() const noexcept { return retry_after_ms_; }

 private:
  bool fatal_;
  int64_t retry_after_ms_;
};

// Thrown by JobContext at a page boundary when the handler must stop: the job was cancelled, its
// lease was lost, or the scheduler is draining. Handlers let it propagate.
class JobInterrupted : public Error {
 public:
  enum class Reason { kCancelled = 1, kLeaseLost, kDraining };
  JobInterrupted(Reason reason, const std::string& message) : Error(message), reason_(reason) {}
  Reason reason() const noexcept { return reason_; }

 private:
  Reason reason_;
};

// What a handler returns when it did not fail.
struct Outcome {
  enum class Kind { kComplete = 1, kDefer, kWaitForChildren };
  Kind kind = Kind::kComplete;
  std::string result_json = "{}";
  int64_t until_ms = 0;  // defer: run_after; wait: deadline
  std::string reason;
  std::optional<std::string> checkpoint;

  static Outcome complete(std::string result_json = "{}") {
    return {Kind::kComplete, std::move(result_json), 0, {}, std::nullopt};
  }
  // Not an attempt: rate limit, throttle, open circuit.
  static Outcome defer(int64_t run_after_ms, std::string reason) {
    return {Kind::kDefer, "{}", run_after_ms, std::move(reason), std::nullopt};
  }
  static Outcome wait_for_children(int64_t deadline_ms,
                                   std::optional<std::string> checkpoint = std::nullopt) {
    return {Kind::kWaitForChildren, "{}", deadline_ms, {}, std::move(checkpoint)};
  }
};

class Scheduler;

// A running job as its handler sees it. [worker-thread]: used by one handler at a time.
class JobContext {
 public:
  const Job& job() const noexcept { return job_; }
  const std::string& lease_token() const noexcept { return token_; }
  int64_t now_ms() const { return clock_.now_ms(); }
  JobStore& store() const noexcept { return store_; }

  // Saves progress atomically with a lease heartbeat. Throws JobInterrupted when the job was
  // cancelled, its lease was lost, or the scheduler is draining (after saving): a drain lets the
  // page in flight finish, and releases the job at the checkpoint that ends it (SPEC F6).
  void checkpoint(const std::string& checkpoint_json);
  // Saves a checkpoint that is no progress (a count of waits: the work stands where it stood), so
  // the attempts before it still count towards max_attempts. Same throws, except that a drain
  // within its grace does not stop the handler here (it is about to end with a wait).
  void checkpoint_without_progress(const std::string& checkpoint_json);
  // A heartbeat without a checkpoint; same throws.
  void heartbeat();
  // True once the handler should stop at its next page boundary, where checkpoint() and
  // heartbeat() throw JobInterrupted: the scheduler asked running handlers to stop (a drain past
  // its grace period), or a heartbeat of the job's (the scheduler's, in the background) learnt that
  // it was cancelled or that its lease was lost. For a handler that waits on something else
  // between its checkpoints.
  bool stopping() const noexcept;

 private:
  friend class Scheduler;
  JobContext(Scheduler& scheduler, JobStore& store, const Clock& clock, Claimed claimed,
             int64_t lease_ms, const std::atomic<bool>& stopping, const std::atomic<bool>& draining)
      : scheduler_(scheduler),
        store_(store),
        clock_(clock),
        job_(std::move(claimed.job)),
        token_(std::move(claimed.lease_token)),
        lease_ms_(lease_ms),
        stopping_(stopping),
        draining_(draining) {}
  void beat(const std::optional<std::string>& checkpoint, bool progress = true);
  // One heartbeat at `now_ms`, and what it tells (cancel requested, lease lost, the store failing)
  // recorded for the rounds and the stats. Rethrows the store's errors once recorded. [any-thread]
  void renew(int64_t now_ms, const std::optional<std::string>& checkpoint, bool progress = true);
  // Records how a beat at `now_ms` went (`error` null: it went through) for the heartbeat order
  // and SchedulerStats::store_failures.
  void note_beat(int64_t now_ms, const char* error);

  Scheduler& scheduler_;  // told how each beat went (SchedulerStats::store_failures)
  JobStore& store_;
  const Clock& clock_;
  Job job_;
  std::string token_;
  int64_t lease_ms_;
  const std::atomic<bool>& stopping_;
  const std::atomic<bool>& draining_;   // the scheduler's: a drain is under way
  std::atomic<bool> cancelled_{false};  // set by the heartbeat loop too
  std::atomic<bool> lease_lost_{false};
  std::atomic<int64_t> last_beat_ms_{0};
  std::atomic<int64_t> beat_failed_ms_{0};  // when its last beat failed; 0: it did not
  bool beat_queued_ = false;  // a heartbeat lane has it to beat, or beats it [Scheduler::mutex_]
  // Its handler returned and its ending waits to be recorded: beaten after the running jobs
  // [Scheduler::mutex_]; and while that ending is in a finish call under way, not beaten at all
  // (on MySQL the call holds the job's row: the beat would wait for it, holding up a lane).
  bool ended_ = false;
  bool finishing_ = false;
};

using Handler = std::function<Outcome(JobContext&)>;

struct SchedulerOptions {
  std::string owner = "backhaul";  // lease owner; make it unique per host/process
  int workers = 8;
  size_t claim_batch = 16;  // at most this many per claim call
  // Claim loops, each with one claim call under way at most (at most workers + prefetch). More
  // than one lets a store that merges concurrent transactions into one commit (SQLite's group
  // commit; InnoDB's log flush) make one durable commit of several small claims: with a claim
  // batch of 1, one loop makes one commit per job.
  int claimers = 1;
  // Jobs claimed ahead of a free worker (heartbeated while they wait, like running ones). 0 suits
  // long jobs; short ones gain from a claim batch that outruns the workers.
  int prefetch = 0;
  int64_t lease_ms = 30'000;
  int64_t heartbeat_interval_ms = 10'000;
  // Heartbeats under way at once, at most. One that waits (on MySQL, for a row another
  // transaction holds: up to the lock wait) holds up its lane, not the others' beats.
  int heartbeat_lanes = 4;
  int64_t idle_poll_ms = 200;  // claim again after this long when nothing was due
  int64_t sweep_interval_ms = 5'000;
  int64_t retention_ms = 0;          // prune finished jobs older than this; 0 = keep forever
  int64_t prune_per_sweep = 10'000;  // finished jobs looked at per sweep round, at most
  // At start, expire every lease still held under `owner` (JobStore::recover_owner): set it only
  // when `owner` is stable across restarts and unique to this host.
  bool recover_own_leases = false;
  RetryPolicy retry;
  std::function<double()> unit_random = default_unit_random;
};

// How long the heartbeat loop sleeps after a round at `now_ms`: until the earliest beat falls due
// (`next_due_ms`, none while nothing runs), but at least 10 ms and at most half an interval, so a
// job that starts meanwhile (first beat one interval after its start) is not beaten late either.
int64_t heartbeat_wait_ms(int64_t now_ms, std::optional<int64_t> next_due_ms, int64_t interval_ms);

// Time jobs of one kind spent waiting to start (claim time - max(created, run_after)) and in
// their handler, summed over the handler runs of this process.
struct KindLatency {
  int64_t runs = 0;
  int64_t wait_ms_sum = 0;
  int64_t run_ms_sum = 0;
};

// A store operation of the scheduler's whose every call since `since_ms` has failed (thrown, or
// come back retryable): how many did, when the last one did, and its error.
struct StoreFailure {
  int64_t since_ms = 0;
  int64_t last_ms = 0;
  int64_t failures = 0;
  std::string error;
  // A span of failures (last_ms - since_ms) shorter than this is no evidence of an outage: for
  // heartbeats, one interval (the successes that would clear it may come that far apart).
  int64_t evidence_ms = 0;
};

// The heartbeat lanes now: a beat that has been under way long waits for the store (on MySQL,
// for a row another transaction holds), and beats queued while every lane is busy wait for one.
struct HeartbeatLanes {
  int lanes = 0;
  int busy = 0;           // lanes making a beat
  int64_t queued = 0;     // beats due, waiting for a lane
  int64_t oldest_ms = 0;  // how long the beat under way longest has been, by the clock; 0: none
  JobId oldest_job = 0;   // its job
};

struct SchedulerStats {
  int64_t claimed = 0;
  int64_t succeeded = 0;
  int64_t failed = 0;  // attempts that failed (retried or dead)
  int64_t deferred = 0;
  int64_t waiting = 0;  // parents that started waiting for children
  int64_t released = 0;
  int64_t interrupted = 0;
  int64_t in_flight = 0;
  std::map<std::string, KindLatency> latency;  // by job kind
  // By operation ("claim", "heartbeat", "finish", "sweep"): the ones failing now. A store that
  // still answers reads but refuses writes (a MySQL server turned read-only) shows here. One
  // successful call clears its operation; so does having nothing left to retry (see note_store).
  std::map<std::string, StoreFailure> store_failures;
  HeartbeatLanes heartbeats;  // the lanes of a scheduler started at least once
};

class Scheduler {
 public:
  // `store` and `clock` must outlive the scheduler. Throws std::invalid_argument for a lease or
  // heartbeat interval that is not positive, or a negative prefetch.
  Scheduler(JobStore& store, const Clock& clock, SchedulerOptions options);
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Before start(). Claims only kinds that have a handler: nothing while none has. Throws
  // std::invalid_argument for an empty handler.
  void register_handler(const std::string& kind, Handler handler);

  // Recovers what a crashed host left running (a sweep), then starts the loops. Does nothing
  // while they run; after drain() it starts them again. [main-thread]
  void start();
  // Graceful drain (SPEC F6): stop claiming; a running handler is stopped at its next checkpoint
  // (the page in flight finished and saved); wait up to `grace` for running handlers; then ask the
  // rest to stop at their next heartbeat too. Jobs stopped go back without an attempt.
  // Returns when every worker has returned. Idempotent. [main-thread]
  void drain(std::chrono::milliseconds grace);
  // Ends the grace of the drain() under way now, as if it had run out (or of the next drain(),
  // when none is under way: it will have none): running handlers are asked to stop at their next
  // page boundary. For an operator who will not wait (a second SIGTERM). start() forgets it.
  // [thread-safe]
  void hurry();

  // True while a drain asks the handlers still running to stop (its grace ran out, or it was
  // hurried): JobContext::stopping() is true for each of them. [thread-safe]
  bool asking_handlers_to_stop() const noexcept { return stopping_.load(); }

  // Claims up to `limit` jobs and runs them on the calling thread, one after another; returns how
  // many ran. For tests and tools; do not mix with start(). [any-thread]
  size_t run_once(size_t limit);

  SchedulerStats stats() const;
  // The job kinds with a handler: the only ones this scheduler claims. [any-thread]
  std::vector<std::string> kinds() const;

 private:
  friend class JobContext;  // note_store()
  void claim_loop();
  void worker_loop();
  // Each round queues the beats that are due for the heartbeat lanes, and does not wait for them.
  void heartbeat_loop();
  void heartbeat_lane(size_t lane);
  // At the start of a round at `now_ms`, under mutex_: logs each beat that has been under way for
  // an interval or longer, once.
  void report_waiting_beats(int64_t now_ms);
  // One beat of the heartbeat loop's, made at `now_ms`. Returns true when the store is down, as
  // far as a beat can tell (StorageError::outage).
  bool beat(JobContext& context, int64_t now_ms);
  static int64_t beat_due_ms(const JobContext& context, int64_t interval_ms);
  void sweep_loop();
  // How a job's attempt ended, on its way to the store.
  struct Ending {
    Finish finish;
    std::string kind;
    int attempts = 0;
    int max_attempts = 0;
    int64_t lease_until_ms = 0;  // when the lease runs out unless renewed (last beat + lease)
    // The job's context, heartbeated (in leased_) until the ending is recorded or given up on:
    // an ending waits for the finisher, whose store call may wait for locked rows for longer than
    // a lease. Null for endings of jobs no longer in leased_ (release_unstarted).
    std::shared_ptr<JobContext> context = nullptr;
  };
  // A context for each claimed job, registered for heartbeats from now on (the lease runs from the
  // claim, whether or not a worker is free).
  std::vector<std::shared_ptr<JobContext>> lease(std::vector<Claimed> claimed, int64_t now_ms);
  void execute(std::shared_ptr<JobContext> context);
  // Marks the jobs of endings[which] as in a finish call under way (or no longer).
  void mark_finishing(const std::vector<Ending>& endings, const std::vector<size_t>& which,
                      bool finishing);
  // After a heartbeat round, under `lock` (released meanwhile): jobs waiting for a worker whose
  // cancellation the round learnt of go back now (the store cancels them, no attempt counted),
  // not when a worker is free. That may be hours away, behind long jobs, while the job stays
  // running in the store, its parent waits for it, and it holds a place in hand.
  void hand_back_cancelled(std::unique_lock<std::mutex>& lock);
  // The ending that hands `context`'s job back to the queue without an attempt.
  Ending released(const JobContext& context) const;
  Ending finish(JobContext& context, const Outcome& outcome);
  Ending fail(JobContext& context, const std::string& error, bool fatal, int64_t retry_after_ms);
  // Hands the ending to the finisher thread (the worker is free at once), or, without threads
  // (run_once), applies it now.
  void end(Ending ending);
  // Writes endings to the store in one call, then counts and logs.
  void apply(std::vector<Ending>& endings, bool until_leases_end);
  // The store's results for `endings`. A failing store (the call throws, or items come back
  // FinishResult::retryable) is tried again with what is left: with `until_leases_end`, each
  // ending for as long as its own lease lasts (an outage shorter than the lease costs no attempt
  // and runs no job twice) until the scheduler stops; otherwise, and after that, 5 times more.
  // While it retries, endings handed over to the finisher join `endings` (and the results), so
  // that one the store keeps refusing holds back no other. Items given up on are left retryable.
  std::vector<FinishResult> record(std::vector<Ending>& endings, bool until_leases_end);
  // Hands back claimed jobs that no handler started (the attempt is not counted), in one store
  // call, and stops their heartbeats. One that cannot be released (its lease was lost, the store
  // is failing) is logged and keeps its lease until the sweep takes it back; nothing is thrown.
  void release_unstarted(const std::vector<std::shared_ptr<JobContext>>& jobs);
  // Stops heartbeating `context` (its job ended or went back). Under mutex_.
  void unlease_locked(const std::shared_ptr<JobContext>& context);
  void finisher_loop();
  // Sleeps up to `ms` or until woken (stop or a freed worker slot).
  void pause(std::unique_lock<std::mutex>& lock, int64_t ms);
  void sleep_unless_stopped(std::unique_lock<std::mutex>& lock, int64_t ms);
  // Records how a store call of `operation` went: `error` null when it succeeded.
  void note_store(const char* operation, const char* error);

  JobStore& store_;
  const Clock& clock_;
  SchedulerOptions options_;
  std::shared_ptr<spdlog::logger> log_;
  std::map<std::string, Handler> handlers_;

  mutable std::mutex mutex_;
  std::condition_variable wake_;  // the claim loop and drain(): every job's end fires it
  std::condition_variable stop_;  // heartbeat and sweep loops: only drain() fires it
  // Beats for the heartbeat lanes, and what fires when there are.
  std::deque<std::shared_ptr<JobContext>> beats_;
  std::condition_variable beats_ready_;
  struct LaneBeat {  // the beat a lane makes
    bool busy = false;
    JobId job = 0;
    int64_t since_ms = 0;
    bool reported = false;  // logged as waiting long
  };
  std::vector<LaneBeat> lane_beats_;               // by lane
  std::condition_variable work_ready_;             // workers
  std::deque<std::shared_ptr<JobContext>> ready_;  // claimed, waiting for a worker
  std::vector<Ending> endings_;                    // handed over by workers, not yet written
  int reserved_ = 0;  // places the claim calls under way may fill (claimers)
  // Endings handed over and not yet recorded (their jobs still heartbeated): a finisher stuck on
  // the store stops the claims once they are twice the places, rather than piling up endings,
  // each beaten every interval, for as long as it is stuck.
  int unrecorded_ = 0;
  std::condition_variable endings_ready_;
  bool finisher_running_ = false;  // endings go to the finisher thread
  // In ready_, in execute(), or ended with the ending not yet recorded: heartbeated.
  std::vector<std::shared_ptr<JobContext>> leased_;
  std::map<std::string, KindLatency> latency_;
  mutable std::mutex failures_mutex_;
  std::map<std::string, StoreFailure> store_failures_;  // [failures_mutex_]
  std::atomic<size_t> failing_operations_{0};           // its size, read without the lock
  int busy_ = 0;  // claimed and not yet finished (queued in ready_ or running)
  bool claiming_ = false;
  bool poked_ = false;  // a job became runnable since the claim loop last claimed
  // Wakeups that end a claim loop's idle pause at once (a job made runnable: an enqueue, a
  // requeue). A job's end does not, nor does its ending's commit: that sets commit_wake_at_, a
  // moment within the idle poll drawn at random, so that the hosts sharing a store have equal
  // chances at the cap place it freed.
  uint64_t wakes_ = 0;
  std::optional<std::chrono::steady_clock::time_point> commit_wake_at_;
  int subscription_ = 0;               // JobStore::subscribe id while started
  bool stopped_ = false;               // loops exit
  std::atomic<bool> stopping_{false};  // handlers asked to stop
  std::atomic<bool> draining_{false};  // a drain is under way: handlers stop at a checkpoint
  bool hurried_ = false;               // hurry(): drain() has no grace left
  std::vector<std::thread> threads_;

  std::atomic<int64_t> claimed_{0}, succeeded_{0}, failed_{0}, deferred_{0}, waiting_{0},
      released_{0}, interrupted_{0};
};

}  // namespace backhaul::jobs
