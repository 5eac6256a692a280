// The job model of the persisted queue (SPEC D1): what a job is, its states, and the values
// passed between the store, the scheduler and handlers. Times are Unix milliseconds from an
// injected Clock.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace backhaul::jobs {

// Lifecycle: kQueued -> kRunning -> kSucceeded | kQueued (retry, release) | kWaiting (children)
// | kDead (attempts exhausted or FATAL) | kCancelled. kWaiting -> kQueued when the last child
// finishes (or the wait times out). kDead -> kQueued when a dead letter is retried.
enum class JobStatus { kQueued = 1, kRunning, kWaiting, kSucceeded, kDead, kCancelled };

std::string_view to_string(JobStatus status);
std::optional<JobStatus> parse_job_status(std::string_view text);
inline bool is_terminal(JobStatus s) {
  return s == JobStatus::kSucceeded || s == JobStatus::kDead || s == JobStatus::kCancelled;
}
// Active = counts against uniqueness (D10): queued, running or waiting.
inline bool is_active(JobStatus s) { return !is_terminal(s); }

using JobId = int64_t;

// What enqueue() takes.
// The longest kind, and the longest concurrency and dedupe key, a store takes (bytes): MySQL's
// columns hold no more, and SQLite refuses the same, so a job is taken or refused alike by both.
inline constexpr size_t kMaxKindBytes = 255;
inline constexpr size_t kMaxKeyBytes = 1024;
// The largest payload, checkpoint or result a store takes (bytes), and those must be UTF-8: MySQL's
// MEDIUMTEXT utf8mb4 columns hold no more and nothing else, and SQLite refuses the same.
inline constexpr size_t kMaxTextBytes = (16u << 20) - 1;

struct JobSpec {
  std::string kind;             // handler name, e.g. "backfill.run", "backfill.entity"
  std::string payload;          // JSON text, opaque to the store; never a secret
  std::string concurrency_key;  // caps and fairness group, e.g. the installation id; may be ""
  std::optional<std::string> dedupe_key;  // at most one active job per (kind, dedupe_key)
  int priority = 0;                       // lower runs first
  int max_attempts = 5;
  int64_t run_after_ms = 0;        // not before this time (0 = now)
  std::optional<JobId> parent_id;  // fan-in: the parent waits for this child
  int64_t timeout_ms = 0;          // child timeout as seen by the parent; 0 = none
};

struct Job {
  JobId id = 0;
  std::string kind;
  std::string concurrency_key;
  std::optional<std::string> dedupe_key;
  std::string payload;
  JobStatus status = JobStatus::kQueued;
  int priority = 0;
  int attempts = 0;  // attempts started since the last checkpoint (claims that counted)
  int max_attempts = 0;
  int64_t run_after_ms = 0;
  std::optional<std::string> lease_owner;
  std::optional<std::string> lease_token;
  int64_t lease_expires_ms = 0;
  std::optional<std::string> checkpoint;  // JSON text
  std::optional<std::string> result;      // JSON text
  std::optional<std::string> last_error;
  std::optional<JobId> parent_id;
  int pending_children = 0;
  int64_t wait_deadline_ms = 0;  // a waiting parent becomes runnable at this time at the latest
  int64_t timeout_ms = 0;
  bool cancel_requested = false;
  int64_t created_ms = 0;
  int64_t started_ms = 0;   // last claim
  int64_t finished_ms = 0;  // terminal state reached
  int64_t updated_ms = 0;
};

// A job handed to a worker together with the lease that fences every later write.
struct Claimed {
  Job job;
  std::string lease_token;
  int64_t lease_expires_ms = 0;
};

struct Attempt {
  JobId job_id = 0;
  int attempt = 0;
  std::string owner;
  int64_t started_ms = 0;
  int64_t finished_ms = 0;
  // "running" (open), "succeeded", "failed", "fatal", "lease_expired", "released", "deferred",
  // "waiting" (handed to its children) or "cancelled"
  std::string outcome;
  std::optional<std::string> error;
};

}  // namespace backhaul::jobs
