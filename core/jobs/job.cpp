#include "core/jobs/job.h"

#include <array>
#include <stdexcept>
#include <utility>

#include "core/common/json_check.h"
#include "core/common/utf8.h"
#include "core/jobs/job_store.h"

namespace backhaul::jobs {
namespace {

constexpr std::array<std::pair<JobStatus, std::string_view>, 6> kJobStatuses = {{
    {JobStatus::kQueued, "queued"},
    {JobStatus::kRunning, "running"},
    {JobStatus::kWaiting, "waiting"},
    {JobStatus::kSucceeded, "succeeded"},
    {JobStatus::kDead, "dead"},
    {JobStatus::kCancelled, "cancelled"},
}};

constexpr std::array<std::pair<DeadLetterStatus, std::string_view>, 4> kLetterStatuses = {{
    {DeadLetterStatus::kPending, "pending"},
    {DeadLetterStatus::kRetrying, "retrying"},
    {DeadLetterStatus::kResolved, "resolved"},
    {DeadLetterStatus::kIgnored, "ignored"},
}};

}  // namespace

std::string_view to_string(JobStatus status) {
  for (const auto& [s, name] : kJobStatuses) {
    if (s == status) return name;
  }
  return "unknown";
}

std::optional<JobStatus> parse_job_status(std::string_view text) {
  for (const auto& [s, name] : kJobStatuses) {
    if (name == text) return s;
  }
  return std::nullopt;
}

std::string_view to_string(DeadLetterStatus status) {
  for (const auto& [s, name] : kLetterStatuses) {
    if (s == status) return name;
  }
  return "unknown";
}

std::optional<DeadLetterStatus> parse_dead_letter_status(std::string_view text) {
  for (const auto& [s, name] : kLetterStatuses) {
    if (name == text) return s;
  }
  return std::nullopt;
}

FinishResult finish_failure(const std::exception_ptr& error) {
  FinishResult r;
  try {
    std::rethrow_exception(error);
  } catch (const LeaseLost& e) {
    r.lease_lost = true;
    r.error = e.what();
  } catch (const StorageError& e) {
    r.error = e.what();
    r.retryable = e.transient();
  } catch (const std::exception& e) {
    r.error = e.what();
  } catch (...) {
    r.error = "unknown error";
  }
  return r;
}

std::optional<std::string> text_problem(std::string_view what, std::string_view text) {
  if (text.size() > kMaxTextBytes) {
    return std::string(what) + " is " + std::to_string(text.size()) +
           " bytes, more than a store keeps (" + std::to_string(kMaxTextBytes) + ")";
  }
  if (!is_utf8(text)) return std::string(what) + " is not valid UTF-8";
  return std::nullopt;
}

void check_text(std::string_view what, std::string_view text) {
  if (auto problem = text_problem(what, text)) throw std::invalid_argument(*problem);
}

std::optional<std::string> spec_problem(const JobSpec& spec) {
  if (spec.kind.empty()) return "enqueue: job kind is empty";
  auto too_long = [](const char* what, size_t size, size_t limit) {
    return std::string("enqueue: ") + what + " is longer than " + std::to_string(limit) +
           " bytes (got " + std::to_string(size) + ")";
  };
  if (spec.kind.size() > kMaxKindBytes)
    return too_long("job kind", spec.kind.size(), kMaxKindBytes);
  if (spec.concurrency_key.size() > kMaxKeyBytes) {
    return too_long("concurrency key", spec.concurrency_key.size(), kMaxKeyBytes);
  }
  if (spec.dedupe_key && spec.dedupe_key->size() > kMaxKeyBytes) {
    return too_long("dedupe key", spec.dedupe_key->size(), kMaxKeyBytes);
  }
  if (spec.max_attempts < 1) {
    return "enqueue: max_attempts must be at least 1 (got " + std::to_string(spec.max_attempts) +
           ")";
  }
  if (spec.timeout_ms < 0) {
    return "enqueue: timeout_ms must not be negative (got " + std::to_string(spec.timeout_ms) + ")";
  }
  return text_problem("enqueue: payload", spec.payload);
}

void check_specs(const std::vector<JobSpec>& specs) {
  for (size_t i = 0; i < specs.size(); ++i) {
    if (auto problem = spec_problem(specs[i])) {
      throw std::invalid_argument(specs.size() == 1
                                      ? *problem
                                      : *problem + " (spec " + std::to_string(i) + " of " +
                                            std::to_string(specs.size()) + ")");
    }
  }
}

std::string stored_error(std::string_view error) {
  constexpr std::string_view kMark = " [truncated]";
  std::string valid = valid_utf8(error);
  if (valid.size() <= kStoredErrorBytes) return valid;
  return cut_utf8(valid, kStoredErrorBytes - kMark.size()).append(kMark);
}

bool is_stored_error(std::string_view error) {
  return error.size() <= kStoredErrorBytes && is_utf8(error);
}

void check_lease_ms(const char* operation, int64_t lease_ms) {
  if (lease_ms <= 0) {
    throw std::invalid_argument(std::string(operation) + ": lease_ms must be positive (got " +
                                std::to_string(lease_ms) + ")");
  }
}

std::optional<std::string> finish_item_problem(const Finish& item) {
  const auto of_job = [&](std::optional<std::string> problem) -> std::optional<std::string> {
    if (!problem) return std::nullopt;
    return "finish: job " + std::to_string(item.id) + ": " + *problem;
  };
  switch (item.kind) {  // no default: -Wswitch names a kind added and not handled here
    case Finish::Kind::kComplete:
      return of_job(text_problem("result", item.result_json));
    case Finish::Kind::kWaitForChildren:
      return item.checkpoint ? of_job(text_problem("checkpoint", *item.checkpoint)) : std::nullopt;
    case Finish::Kind::kFail:
    case Finish::Kind::kDefer:
    case Finish::Kind::kRelease:
      return std::nullopt;
  }
  return of_job("unknown ending kind " + std::to_string(static_cast<int>(item.kind)));
}

// One transaction per item; backends override this to share one.
std::vector<FinishResult> JobStore::finish(const std::vector<Finish>& items, int64_t now_ms) {
  std::vector<FinishResult> results(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    const Finish& f = items[i];
    FinishResult& r = results[i];
    if (auto problem = finish_item_problem(f)) {
      r.error = *problem;
      continue;
    }
    try {
      switch (f.kind) {
        case Finish::Kind::kComplete:
          complete(f.id, f.token, f.result_json, now_ms);
          r.status = JobStatus::kSucceeded;
          break;
        case Finish::Kind::kFail:
          r.status = fail(f.id, f.token, f.failure, now_ms);
          break;
        case Finish::Kind::kDefer:
          defer(f.id, f.token, f.until_ms, f.reason, now_ms);
          break;
        case Finish::Kind::kRelease:
          release(f.id, f.token, now_ms);
          break;
        case Finish::Kind::kWaitForChildren:
          wait_for_children(f.id, f.token, f.until_ms, f.checkpoint, now_ms);
          break;
      }
      // These may have cancelled the job (cancellation rule) or queued a parent at once.
      if (!r.status) {
        std::optional<Job> job = get(f.id);
        if (job) r.status = job->status;
      }
    } catch (...) {
      r = finish_failure(std::current_exception());
    }
  }
  return results;
}

std::map<std::string, int64_t> JobStore::queued_by_kind() {
  std::map<std::string, int64_t> out;
  for (const auto& [key, n] : counts()) {
    if (key.second == JobStatus::kQueued && n > 0) out[key.first] += n;
  }
  return out;
}

int JobStore::subscribe(std::function<void()> listener) {
  std::lock_guard lock(listeners_mutex_);
  listeners_.emplace(++next_listener_, std::move(listener));
  return next_listener_;
}

void JobStore::unsubscribe(int id) {
  std::lock_guard lock(listeners_mutex_);
  listeners_.erase(id);
}

void JobStore::notify_runnable() {
  std::lock_guard lock(listeners_mutex_);
  for (const auto& [id, listener] : listeners_) listener();
}

}  // namespace backhaul::jobs
