// The storage interface of the job queue (SPEC D2) and its two backends' shared contract. Every
// method is one atomic transaction; every transition of a running job is conditional on its lease
// token (fencing): a worker whose lease expired and was taken over cannot write. Methods are
// [thread-safe]; implementations may merge concurrent calls into one transaction (group commit)
// but return only after their own change is durable.
//
// Cancellation rule: a job whose cancel was requested while it ran never goes back to queued —
// whichever transition would requeue it (fail with attempts left, defer, release,
// wait_for_children, a sweep of its expired lease) makes it kCancelled instead (finished_ms set,
// parent notified as for any terminal state). complete() still records success.
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/common/errors.h"
#include "core/jobs/job.h"

namespace backhaul::jobs {

// The lease token no longer matches (expired and re-claimed, released, or the job was cancelled
// and finished): the caller must stop working on the job and write nothing more.
class LeaseLost : public StorageError {
 public:
  using StorageError::StorageError;
};

class JobNotFound : public StorageError {
 public:
  using StorageError::StorageError;
};

// The operation does not apply to the job's current state (e.g. replacing the checkpoint of a
// running job, retrying a dead letter that is resolved). The message names the state.
class InvalidTransition : public StorageError {
 public:
  using StorageError::StorageError;
};

struct EnqueueResult {
  JobId id = 0;
  bool created = false;  // false: an active job with the same (kind, dedupe_key) exists; id is it
};

struct ClaimRequest {
  std::string owner;  // host/worker id, recorded as lease_owner
  size_t limit = 1;   // claim at most this many
  int64_t now_ms = 0;
  int64_t lease_ms = 30'000;       // lease length
  std::vector<std::string> kinds;  // only these kinds; empty = any
};

// Concurrency caps per job kind (SPEC D7): at most `per_key` running jobs of this kind per
// concurrency key, and at most `global` of this kind in all, across every host sharing the store.
// 0 = unlimited.
struct Caps {
  int per_key = 0;
  int global = 0;
};

struct HeartbeatResult {
  int64_t lease_expires_ms = 0;
  bool cancel_requested = false;  // the job was cancelled: stop at this page boundary
};

// How a failed attempt ends. The caller computes the delay (RetryPolicy, injected jitter).
struct Failure {
  std::string error;
  bool fatal = false;          // FATAL: straight to dead letters, whatever attempts remain
  int64_t retry_delay_ms = 0;  // run_after = now + delay when attempts remain
};

// Where a failed attempt leaves its job (SPEC D4, D9): dead when it was FATAL or the last attempt
// (even if a cancel was requested), else cancelled when a cancel was requested, else queued again
// at now + retry_delay_ms. Both stores decide by this, one job at a time or in batches.
inline JobStatus after_failure(const Failure& failure, int attempts, int max_attempts,
                               bool cancel_requested) {
  if (failure.fatal || attempts >= max_attempts) return JobStatus::kDead;
  return cancel_requested ? JobStatus::kCancelled : JobStatus::kQueued;
}

// now_ms + delay_ms, for a time the store writes (a lease's end, a retry's run_after): a negative
// delay counts as none, and a sum beyond the int64 range is INT64_MAX ("never") rather than a
// wrap into the past that would make the job runnable, or its lease expired, at once.
inline int64_t later_by(int64_t now_ms, int64_t delay_ms) {
  if (delay_ms <= 0) return now_ms;
  return now_ms > INT64_MAX - delay_ms ? INT64_MAX : now_ms + delay_ms;
}

// Error text as both stores keep it (a job's last_error, its attempt history, its dead letter):
// valid UTF-8 (each invalid byte replaced by U+FFFD) of at most kStoredErrorBytes, cut at a
// character boundary and marked " [truncated]" (the mark included in the size). is_stored_error()
// is true when `error` is so already (the common case: nothing to copy).
inline constexpr size_t kStoredErrorBytes = 65'000;
std::string stored_error(std::string_view error);
bool is_stored_error(std::string_view error);

// Throws std::invalid_argument unless lease_ms > 0 (a lease that has ended when it is granted
// would let the sweep take the job back from the worker that was just given it). `operation`
// names the caller in the message ("claim", "heartbeat").
void check_lease_ms(const char* operation, int64_t lease_ms);

struct SweepResult {
  int requeued = 0;       // leases expired, attempts remained: queued again (attempt counted)
  int dead = 0;           // leases expired, no attempts left: dead with a clear error
  int parents_woken = 0;  // waiting parents whose children-wait deadline passed
};

// One way a running job's attempt ends, for finish(): the arguments complete(), fail(), defer(),
// release() or wait_for_children() would take.
struct Finish {
  enum class Kind { kComplete = 1, kFail, kDefer, kRelease, kWaitForChildren };
  Kind kind = Kind::kComplete;
  JobId id = 0;
  std::string token;
  std::string result_json = "{}";         // kComplete
  Failure failure;                        // kFail
  int64_t until_ms = 0;                   // kDefer: run_after; kWaitForChildren: deadline
  std::string reason;                     // kDefer
  std::optional<std::string> checkpoint;  // kWaitForChildren
};

// Why a store refuses `text` as a payload, checkpoint or result (`what` names it with its caller,
// as "complete: result"): it is not UTF-8, or is longer than kMaxTextBytes. Or nothing.
std::optional<std::string> text_problem(std::string_view what, std::string_view text);
// Throws std::invalid_argument with text_problem()'s answer, if any: for heartbeat(), complete(),
// wait_for_children() and set_checkpoint(), before anything is read or written. Such a value is
// the caller's mistake, not a failing store (a StorageError), and no lease is looked at for it.
void check_text(std::string_view what, std::string_view text);

// Why enqueue() refuses `spec` (an empty kind, max_attempts below 1, a negative timeout, a payload
// text_problem() names), or nothing. The stores throw std::invalid_argument with it, before
// writing anything.
std::optional<std::string> spec_problem(const JobSpec& spec);
// Throws std::invalid_argument naming the first spec of `specs` with a problem (its index too).
void check_specs(const std::vector<JobSpec>& specs);

// Why finish() refuses `item` before applying it (its kind is none of Finish::Kind: a cast from a
// bad number; a result or checkpoint text_problem() names), or nothing. The stores report it in
// the item's result alone (not retryable), and apply the other items.
std::optional<std::string> finish_item_problem(const Finish& item);

struct FinishResult {
  // The job's status after the item: kSucceeded, kQueued, kDead, kWaiting or kCancelled. Unset
  // when the item was not applied.
  std::optional<JobStatus> status;
  bool lease_lost = false;  // not applied: the lease no longer matched (see LeaseLost)
  std::string error;        // not applied: why
  // Not applied because the store failed (StorageError::transient: the server unreachable, the
  // connection lost): the same item sent again may apply. Leases fence a repeat of one that
  // applied after all (a COMMIT whose reply was lost); the store recognizes such a repeat by its
  // attempt's row and reports it applied, with the outcome it had.
  bool retryable = false;
};

// The result of an item that was not applied because `error` (an exception) was thrown for it:
// lease_lost for LeaseLost, retryable for a transient StorageError.
FinishResult finish_failure(const std::exception_ptr& error);

enum class CancelOutcome {
  kCancelled = 1,    // was queued or waiting: now cancelled (with its active children)
  kRequested,        // was running: the worker learns at its next heartbeat or checkpoint
  kAlreadyFinished,  // terminal already; nothing changed
};

struct JobQuery {
  std::optional<JobStatus> status;
  std::optional<std::string> kind;
  std::optional<std::string> concurrency_key;
  std::optional<JobId> parent_id;
  std::optional<JobId> before_id;  // paging cursor: only ids < before_id
  size_t limit = 50;
};

// The row count a listing asks its backend for: one more than `limit` (that row tells whether
// another page exists), a limit beyond any table (SIZE_MAX: "all of them") held below INT64_MAX
// so that the probe neither wraps around to 0 nor overflows a signed SQL LIMIT.
inline int64_t page_probe_rows(size_t limit) {
  constexpr size_t kMost = static_cast<size_t>(INT64_MAX) - 1;
  return static_cast<int64_t>(limit < kMost ? limit : kMost) + 1;
}

struct JobPage {
  std::vector<Job> jobs;             // newest first (id descending)
  std::optional<JobId> next_before;  // pass as before_id for the next page; nullopt = last page
};

// Dead letters (SPEC D5): one row per dead job, kept in step with the job.
enum class DeadLetterStatus { kPending = 1, kRetrying, kResolved, kIgnored };
std::string_view to_string(DeadLetterStatus status);
std::optional<DeadLetterStatus> parse_dead_letter_status(std::string_view text);

struct DeadLetter {
  int64_t id = 0;
  JobId job_id = 0;
  std::string kind;
  std::string concurrency_key;
  DeadLetterStatus status = DeadLetterStatus::kPending;
  std::string error;  // the error that killed the job most recently
  int retries = 0;    // times an operator retried it
  int64_t created_ms = 0;
  int64_t updated_ms = 0;
};

struct DeadLetterQuery {
  std::optional<DeadLetterStatus> status;
  std::optional<std::string> kind;
  std::optional<std::string> concurrency_key;
  std::optional<int64_t> before_id;
  size_t limit = 50;
};

struct DeadLetterPage {
  std::vector<DeadLetter> items;  // newest first
  std::optional<int64_t> next_before;
};

// The state of one circuit breaker, stored so every host sees the same circuit (SPEC E4).
struct CircuitRecord {
  std::string state = "closed";  // "closed" | "open" | "half_open"
  int failures = 0;  // consecutive failures (open or half-open: with the failed probes since)
  int64_t opened_ms = 0;
  int64_t retry_at_ms = 0;  // when an open circuit may be probed (half-open)
  int64_t updated_ms = 0;
};

// The schema version a store had before JobStore::apply_migrations() (0: none, a store it
// created) and the one it has after.
struct SchemaVersions {
  int before = 0;
  int after = 0;
};

class JobStore {
 public:
  virtual ~JobStore() = default;

  // Applies the versioned migrations in schemas/sql/<backend>/ that are not applied yet.
  // Returns the schema version now in force. Safe to call from several hosts at once.
  int migrate() { return apply_migrations().after; }
  // migrate(), also telling the version it found, read under the same lock: `db migrate` says
  // whether it created the store, upgraded it or found it current.
  virtual SchemaVersions apply_migrations() = 0;
  virtual std::string backend() const = 0;  // "sqlite" | "mysql"

  // --- producing ---------------------------------------------------------------------------
  // With parent_id, the parent's pending_children grows by one in the same transaction.
  virtual EnqueueResult enqueue(const JobSpec& spec, int64_t now_ms) = 0;
  // All or nothing, one transaction; results in input order.
  virtual std::vector<EnqueueResult> enqueue_batch(const std::vector<JobSpec>& specs,
                                                   int64_t now_ms) = 0;

  // --- consuming ---------------------------------------------------------------------------
  // Atomically takes up to `limit` queued jobs whose run_after has come, in (priority,
  // run_after, id) order, skipping keys at their cap and kinds at their global cap. For a kind
  // with a per-key cap, keys take turns: the least-loaded key's next job first, so one tenant's
  // backlog cannot starve another's. Each claimed
  // job is running with a new lease token, attempts + 1, and a running attempt in attempts().
  virtual std::vector<Claimed> claim(const ClaimRequest& request) = 0;

  // Renews the lease and, when given, replaces the checkpoint in the same transaction. A
  // checkpoint is progress: `attempts` then counts from the running attempt again (it becomes 1),
  // so max_attempts bounds attempts without progress. A backfill interrupted at page 40, 41 and
  // 42 by crashes keeps going; a job that fails at the same point every time still dies. With
  // `progress` false, the checkpoint is saved and `attempts` left as it is: a count of waits, say,
  // where the work stands where it stood.
  virtual HeartbeatResult heartbeat(JobId id, const std::string& token, int64_t now_ms,
                                    int64_t lease_ms, const std::optional<std::string>& checkpoint,
                                    bool progress = true) = 0;
  virtual void complete(JobId id, const std::string& token, const std::string& result_json,
                        int64_t now_ms) = 0;
  // Returns the resulting status: kQueued (will retry), kDead (FATAL or attempts exhausted), or
  // kCancelled (a retry of a job whose cancel was requested: the cancellation rule).
  virtual JobStatus fail(JobId id, const std::string& token, const Failure& failure,
                         int64_t now_ms) = 0;
  // "Wait until T" (rate limit, throttle, open circuit): back to queued with run_after, and the
  // attempt is not counted. `reason` is recorded in the attempt history.
  virtual void defer(JobId id, const std::string& token, int64_t run_after_ms,
                     const std::string& reason, int64_t now_ms) = 0;
  // Graceful drain: back to queued at once, attempt not counted.
  virtual void release(JobId id, const std::string& token, int64_t now_ms) = 0;
  // Applies many endings at once, as the methods above would one by one, in as few transactions
  // as the backend can (SQLite: one). Each item stands alone: one whose lease was lost, or that
  // fails for any reason, is reported in its result and changes nothing, and the others still
  // apply. Returns once every applied item is durable; results are in input order. Throws only
  // when the store itself fails (then no item may be assumed applied); an item that failed
  // because the store did (its server unreachable) comes back `retryable`. The items may be
  // applied in another order than given (completions and failures first): when one item's job is
  // another's parent, a status reported may be the one after both (a parent whose wait began in
  // the same call as its last child's completion: kQueued, not kWaiting). The final state is the
  // same in either order.
  virtual std::vector<FinishResult> finish(const std::vector<Finish>& items, int64_t now_ms);
  // Fan-in: the parent stops running and waits for its children (attempt not counted). It
  // becomes queued again when pending_children reaches 0, or at deadline_ms.
  virtual void wait_for_children(JobId id, const std::string& token, int64_t deadline_ms,
                                 const std::optional<std::string>& checkpoint, int64_t now_ms) = 0;

  // --- recovery ----------------------------------------------------------------------------
  // Expired leases: queued again (the attempt counts) or, with no attempts left, dead with
  // "lease expired after N attempts (worker crashed or hung)". Waiting parents past their
  // deadline become queued. Concurrent sweeps from several hosts are safe.
  virtual SweepResult sweep(int64_t now_ms) = 0;
  // Start-up recovery under a stable owner name: every job still running under `owner` (left by
  // this host's previous process, which died holding it) is treated as an expired lease now, as
  // sweep() would treat it once the lease ran out. Only for an owner name no live process uses.
  virtual SweepResult recover_owner(const std::string& owner, int64_t now_ms) = 0;
  // Deletes finished (succeeded, cancelled, dead with a resolved/ignored letter) jobs that
  // finished before `before_ms`, with their attempts, in chunks (one transaction each, so a
  // large pass never holds the store for long). Returns the number of jobs deleted. A finish
  // time of 0 or less (a clock at the epoch; 0 is also "not finished") is never before it. The
  // jobs' children that stay lose their parent_id. At most `max_jobs` jobs are looked at (whole
  // chunks, the last one cut to fit), so that a caller with other work (the sweeper) can bound a
  // pass over a large backlog and come back for the rest.
  virtual int64_t prune(int64_t finished_before_ms, int64_t max_jobs) = 0;
  int64_t prune(int64_t finished_before_ms) {
    return prune(finished_before_ms, std::numeric_limits<int64_t>::max());
  }

  // --- cancellation --------------------------------------------------------------------------
  virtual CancelOutcome cancel(JobId id, int64_t now_ms) = 0;
  // Every active job with this concurrency key (all kinds when kind is empty). Returns how many
  // were cancelled or asked to stop.
  virtual int cancel_key(const std::string& concurrency_key, const std::string& kind,
                         int64_t now_ms) = 0;

  // --- reading -----------------------------------------------------------------------------
  virtual std::optional<Job> get(JobId id) = 0;
  virtual JobPage list(const JobQuery& query) = 0;
  // The job's attempt history, oldest first: every attempt, or its newest `limit`. Each wait
  // (throttle, rate limit, open circuit) is a row too, so a long-throttled job has thousands.
  virtual std::vector<Attempt> newest_attempts(JobId id, size_t limit) = 0;
  std::vector<Attempt> attempts(JobId id) { return newest_attempts(id, SIZE_MAX); }
  // Number of jobs by (kind, status).
  virtual std::map<std::pair<std::string, JobStatus>, int64_t> counts() = 0;
  // Queued jobs by kind (kinds with none left out): what readiness reports, on every probe. Read
  // from the queued jobs alone, not by counting the finished ones too, which retention may leave
  // by the million. By default, from counts().
  virtual std::map<std::string, int64_t> queued_by_kind();
  // Replaces (or clears) the checkpoint of a job that is not running (operators repairing a
  // cursor). Throws InvalidTransition when it is running, JobNotFound when absent.
  virtual void set_checkpoint(JobId id, const std::optional<std::string>& checkpoint,
                              int64_t now_ms) = 0;

  // --- caps ----------------------------------------------------------------------------------
  virtual void set_caps(const std::string& kind, Caps caps) = 0;
  virtual std::map<std::string, Caps> caps() = 0;
  // The highest number of jobs of `kind` ever running at once for `concurrency_key` ("" = all
  // keys of the kind), as recorded at claim time.
  virtual int max_running_seen(const std::string& kind, const std::string& concurrency_key) = 0;
  virtual int running(const std::string& kind, const std::string& concurrency_key) = 0;

  // --- throttle (token bucket per key, shared by every host) --------------------------------
  // Takes `cost` tokens from the bucket `key` (capacity `capacity`, refilled at
  // `refill_per_hour`). Returns 0 when granted, else the milliseconds until it would be. Throws
  // std::invalid_argument unless 0 <= cost <= capacity, capacity is finite and > 0 (a larger cost
  // could never be granted), and refill_per_hour is finite and >= 0.
  virtual int64_t take_tokens(const std::string& key, double cost, double capacity,
                              double refill_per_hour, int64_t now_ms) = 0;

  // --- circuit breakers ------------------------------------------------------------------------
  // Reads the record (a closed one when absent), applies `next`, stores and returns the result,
  // in one transaction. `next` may run more than once (a transaction retried after a deadlock),
  // so it must be a pure function of its argument.
  virtual CircuitRecord update_circuit(
      const std::string& name, const std::function<CircuitRecord(const CircuitRecord&)>& next) = 0;
  // Reads the record (a closed one when absent) and writes nothing: for reports, which must
  // answer while the store refuses writes.
  virtual CircuitRecord circuit(const std::string& name) = 0;

  // --- dead letters ----------------------------------------------------------------------------
  virtual DeadLetterPage list_dead_letters(const DeadLetterQuery& query) = 0;
  virtual std::optional<DeadLetter> get_dead_letter(int64_t id) = 0;
  // Counts by (kind, status).
  virtual std::map<std::pair<std::string, DeadLetterStatus>, int64_t> dead_letter_stats() = 0;
  // The job goes back to queued with attempts reset; the letter becomes retrying. When the job
  // succeeds the letter is resolved; when it dies again the letter is pending with the new error.
  // An active parent counts the job again; the job counts its active children that nobody counts
  // (retried or enqueued while it was dead), so that waiting for its children waits for them too.
  // Throws InvalidTransition unless the letter is pending (or ignored).
  virtual void retry_dead_letter(int64_t id, int64_t now_ms) = 0;
  // Retries up to `limit` pending letters matching the query (newest first); returns how many.
  virtual int retry_dead_letters(const DeadLetterQuery& query, size_t limit, int64_t now_ms) = 0;
  virtual void ignore_dead_letter(int64_t id, int64_t now_ms) = 0;
  // Deletes resolved and ignored letters last updated before `before_ms`; returns how many.
  virtual int64_t purge_dead_letters(int64_t updated_before_ms) = 0;

  // --- in-process wakeups ----------------------------------------------------------------------
  // `listener` runs after every committed write through this object that makes jobs runnable now
  // (enqueue, dead-letter retry), on the writing thread; it must be quick and must not call the
  // store. A scheduler on the same store object claims at once instead of at its next poll; other
  // processes' writes are seen by polling. Returns the id for unsubscribe(). [thread-safe]
  int subscribe(std::function<void()> listener);
  void unsubscribe(int id);

 protected:
  void notify_runnable();

 private:
  std::mutex listeners_mutex_;
  std::map<int, std::function<void()>> listeners_;
  int next_listener_ = 0;
};

// Opens the SQLite store at `path` (created if missing; WAL, synchronous=FULL) and migrates it.
std::unique_ptr<JobStore> open_sqlite_store(const std::string& path);
// Opens the MySQL/MariaDB store with a Poco connection string
// ("host=127.0.0.1;port=3306;db=backhaul;user=...;password=...") and migrates it, unless
// `migrate` is false (`db migrate`, which calls apply_migrations() to report what it did).
std::unique_ptr<JobStore> open_mysql_store(const std::string& connection_string,
                                           size_t pool_size = 8, bool migrate = true);
// Throws ConfigError naming what open_mysql_store() would refuse in `connection_string` before
// connecting (an unknown key, a value that is not one, no db=); connects to nothing.
void check_mysql_connection_string(const std::string& connection_string);

}  // namespace backhaul::jobs
