// The SQLite backend of the job queue (SPEC D2). The contract is job_store.h; the schema is
// schemas/sql/sqlite/; the connection layer, group commit and reader pool are sqlite_db.h.
//
// Every write method is one operation run by the group-commit writer: it executes inside a
// savepoint of the writer's current BEGIN IMMEDIATE transaction and its caller returns after
// that transaction committed (synchronous=FULL: the commit is on disk). Operations read and write
// through the same connection, so they are serialized with each other and, through SQLite's
// write lock, with every other process using the file. Reads use the reader pool.
//
// Invariants kept by the operations below:
// * running_counts holds the number of running jobs per (kind, key) and per kind (total row):
//   +n in the claim, -1 in end_attempt() or end_successful_attempt(), one of which every exit
//   from running calls exactly once.
// * A claim opens an attempt (seq = jobs.claims, number = jobs.attempt_no), kept in the job row
//   while it runs; end_attempt() writes its row to attempts, once (schema 0002). A successful
//   attempt ends the job and stays in its row instead (end_successful_attempt(): lease_owner
//   keeps the owner; only a running job reports it as its lease).
// * A child counted in its parent's pending_children (counted_in_parent = 1) is uncounted in the
//   transaction that makes it terminal (succeeded, dead, cancelled), once. An active child counted
//   by nobody (its parent was terminal) is counted when its parent is retried.
// * A dead job has a pending dead letter; a retried one a retrying letter that becomes resolved
//   when the job succeeds, pending again when it dies, ignored when it is cancelled.
#include "core/jobs/sqlite_store.h"

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <stdexcept>
#include <tuple>
#include <type_traits>
#include <utility>

#include "core/jobs/migrations.h"
#include "core/jobs/sqlite_db.h"
#include "core/jobs/token_bucket.h"

namespace backhaul::jobs {
namespace {

using sqlite::Connection;
using sqlite::Query;

// --- rows ----------------------------------------------------------------------------------

const std::string kJobColumns =
    "id, kind, concurrency_key, dedupe_key, payload, status, priority, attempts, max_attempts, "
    "run_after_ms, lease_owner, lease_token, lease_expires_ms, checkpoint, result, last_error, "
    "parent_id, pending_children, wait_deadline_ms, timeout_ms, cancel_requested, created_ms, "
    "started_ms, finished_ms, updated_ms";

JobStatus status_from(const std::string& text) {
  std::optional<JobStatus> status = parse_job_status(text);
  if (!status) throw StorageError("sqlite: unknown job status '" + text + "'");
  return *status;
}

DeadLetterStatus letter_status_from(const std::string& text) {
  std::optional<DeadLetterStatus> status = parse_dead_letter_status(text);
  if (!status) throw StorageError("sqlite: unknown dead letter status '" + text + "'");
  return *status;
}

// Reads a row selected with kJobColumns.
Job read_job(const Query& q) {
  Job job;
  job.id = q.i64(0);
  job.kind = q.text(1);
  job.concurrency_key = q.text(2);
  job.dedupe_key = q.opt_text(3);
  job.payload = q.text(4);
  job.status = status_from(q.text(5));
  job.priority = q.i32(6);
  job.attempts = q.i32(7);
  job.max_attempts = q.i32(8);
  job.run_after_ms = q.i64(9);
  // A succeeded job keeps its last attempt's owner there (end_successful_attempt); a lease it
  // is not.
  if (job.status == JobStatus::kRunning) job.lease_owner = q.opt_text(10);
  job.lease_token = q.opt_text(11);
  job.lease_expires_ms = q.i64(12);
  job.checkpoint = q.opt_text(13);
  job.result = q.opt_text(14);
  job.last_error = q.opt_text(15);
  job.parent_id = q.opt_i64(16);
  job.pending_children = q.i32(17);
  job.wait_deadline_ms = q.i64(18);
  job.timeout_ms = q.i64(19);
  job.cancel_requested = q.i64(20) != 0;
  job.created_ms = q.i64(21);
  job.started_ms = q.i64(22);
  job.finished_ms = q.i64(23);
  job.updated_ms = q.i64(24);
  return job;
}

const std::string kLetterColumns =
    "id, job_id, kind, concurrency_key, status, error, retries, created_ms, updated_ms";

DeadLetter read_letter(const Query& q) {
  DeadLetter letter;
  letter.id = q.i64(0);
  letter.job_id = q.i64(1);
  letter.kind = q.text(2);
  letter.concurrency_key = q.text(3);
  letter.status = letter_status_from(q.text(4));
  letter.error = q.text(5);
  letter.retries = q.i32(6);
  letter.created_ms = q.i64(7);
  letter.updated_ms = q.i64(8);
  return letter;
}

// What the transitions need to know about a job.
struct JobState {
  JobId id = 0;
  JobStatus status = JobStatus::kQueued;
  std::string kind;
  std::string key;
  std::optional<std::string> token;
  std::optional<std::string> dedupe_key;
  int attempts = 0;
  int max_attempts = 0;
  int claims = 0;
  int pending_children = 0;
  bool cancel_requested = false;
  bool counted_in_parent = false;
  std::optional<JobId> parent_id;
  std::optional<int64_t> dead_letter_id;
};

const std::string kStateColumns =
    "id, status, kind, concurrency_key, lease_token, dedupe_key, attempts, max_attempts, claims, "
    "pending_children, cancel_requested, counted_in_parent, parent_id, dead_letter_id";
const std::string kLoadState = "SELECT " + kStateColumns + " FROM jobs WHERE id = ?1";

JobState read_state(const Query& q) {
  JobState s;
  s.id = q.i64(0);
  s.status = status_from(q.text(1));
  s.kind = q.text(2);
  s.key = q.text(3);
  s.token = q.opt_text(4);
  s.dedupe_key = q.opt_text(5);
  s.attempts = q.i32(6);
  s.max_attempts = q.i32(7);
  s.claims = q.i32(8);
  s.pending_children = q.i32(9);
  s.cancel_requested = q.i64(10) != 0;
  s.counted_in_parent = q.i64(11) != 0;
  s.parent_id = q.opt_i64(12);
  s.dead_letter_id = q.opt_i64(13);
  return s;
}

std::optional<JobState> load_state(Connection& c, JobId id) {
  Query q = c.query(kLoadState);
  q.args(id);
  if (!q.step()) return std::nullopt;
  return read_state(q);
}

JobState load_existing(Connection& c, JobId id) {
  std::optional<JobState> s = load_state(c, id);
  if (!s) throw JobNotFound("job " + std::to_string(id) + " not found");
  return *s;
}

// Fencing: why a write under `token` to job `id` (state `s`, none if it is gone) must not apply,
// or nothing when the job is running under that token.
std::optional<std::string> lease_problem(JobId id, const std::optional<JobState>& s,
                                         const std::string& token) {
  std::string job = "job " + std::to_string(id);
  if (!s) return job + " no longer exists";
  if (s->status != JobStatus::kRunning) {
    return job + " is " + std::string(to_string(s->status)) + ", not running";
  }
  if (s->token != token) return job + ": the lease was taken over (token mismatch)";
  return std::nullopt;
}

JobState load_running(Connection& c, JobId id, const std::string& token) {
  std::optional<JobState> s = load_state(c, id);
  if (auto problem = lease_problem(id, s, token)) throw LeaseLost(*problem);
  return *s;
}

// --- transitions ---------------------------------------------------------------------------

// The running attempt's row, from the job row before the ending changes it. ON CONFLICT: a job
// claimed before schema 0002 has its row open already.
const std::string kAttemptRowHead =
    "INSERT INTO attempts (job_id, seq, attempt, owner, started_ms, finished_ms, outcome, error) "
    "SELECT id, claims, attempt_no, lease_owner, started_ms, ";
const std::string kAttemptRowTail =
    " ON CONFLICT (job_id, seq) DO UPDATE SET finished_ms = excluded.finished_ms, "
    "outcome = excluded.outcome, error = excluded.error";
const std::string kEndAttempt =
    kAttemptRowHead + "?2, ?3, ?4 FROM jobs WHERE id = ?1" + kAttemptRowTail;
// The key's row and the kind's total row, by two primary-key seeks in one statement.
const std::string kRunningDown =
    "UPDATE running_counts SET running = running - 1 WHERE kind = ?1 "
    "AND ((total = 0 AND concurrency_key = ?2) OR (total = 1 AND concurrency_key = ''))";

// An exit from running other than success: writes the attempt's row, frees the running slot.
void end_attempt(Connection& c, const JobState& s, std::string_view outcome,
                 const std::optional<std::string>& error, int64_t now) {
  c.query(kEndAttempt).args(s.id, now, outcome, error).run();
  c.query(kRunningDown).args(s.kind, s.key).run();
}

// A successful attempt writes no row: it stays in the job row, which keeps its owner in
// lease_owner (attempts() reads it back). Only a row a claim opened before schema 0002 is
// closed, if there is one: a lookup that writes nothing otherwise.
const std::string kCloseOpenRows =
    "UPDATE attempts SET finished_ms = ?1, outcome = 'succeeded' "
    "WHERE outcome = 'running' AND job_id IN ";
const std::string kCloseOpenRow = kCloseOpenRows + "(?2)";

void end_successful_attempt(Connection& c, const JobState& s, int64_t now) {
  c.query(kCloseOpenRow).args(now, s.id).run();
  c.query(kRunningDown).args(s.kind, s.key).run();
}

const std::string kUncountChild =
    "UPDATE jobs SET pending_children = pending_children - 1, updated_ms = ?2, "
    "status = CASE WHEN status = 'waiting' AND pending_children = 1 THEN 'queued' "
    "ELSE status END, "
    "run_after_ms = CASE WHEN status = 'waiting' AND pending_children = 1 THEN ?2 "
    "ELSE run_after_ms END, "
    "wait_deadline_ms = CASE WHEN status = 'waiting' AND pending_children = 1 THEN 0 "
    "ELSE wait_deadline_ms END "
    "WHERE id = ?1 AND pending_children > 0";

// Fan-in: the job just became terminal (its own UPDATE set counted_in_parent = 0). A waiting
// parent whose last child this was becomes queued in this same transaction.
void uncount_from_parent(Connection& c, const JobState& s, int64_t now) {
  if (!s.parent_id || !s.counted_in_parent) return;
  c.query(kUncountChild).args(*s.parent_id, now).run();
}

const std::string kRequeue =
    "UPDATE jobs SET status = 'queued', run_after_ms = ?2, attempts = attempts - ?3, "
    "last_error = COALESCE(?4, last_error), lease_owner = NULL, lease_token = NULL, "
    "lease_expires_ms = 0, updated_ms = ?5 WHERE id = ?1";

// Back to queued; `refund` = 1 when the attempt does not count (defer, release).
void requeue(Connection& c, const JobState& s, int64_t run_after, int refund,
             const std::optional<std::string>& error, int64_t now) {
  c.query(kRequeue).args(s.id, run_after, refund, error, now).run();
}

const std::string kUpsertLetter =
    "INSERT INTO dead_letters (job_id, kind, concurrency_key, status, error, retries, "
    "created_ms, updated_ms) VALUES (?1, ?2, ?3, 'pending', ?4, 0, ?5, ?5) "
    "ON CONFLICT (job_id) DO UPDATE SET status = 'pending', error = excluded.error, "
    "updated_ms = excluded.updated_ms RETURNING id";
const std::string kMarkDead =
    "UPDATE jobs SET status = 'dead', last_error = ?2, dead_letter_id = ?3, finished_ms = ?4, "
    "updated_ms = ?4, lease_owner = NULL, lease_token = NULL, lease_expires_ms = 0, "
    "counted_in_parent = 0 WHERE id = ?1";

void cancel_active_children(Connection& c, JobId parent, int64_t now);

// Dead (attempts exhausted, FATAL, or an expired last lease): the dead letter is created, or a
// retried one is pending again with the new error. One asked to stop takes its active children
// with it, as its cancellation would have.
void mark_dead(Connection& c, const JobState& s, const std::string& error, int64_t now) {
  int64_t letter_id = 0;
  {
    Query q = c.query(kUpsertLetter);
    q.args(s.id, s.kind, s.key, error, now);
    if (!q.step()) throw StorageError("sqlite: dead letter upsert returned no id");
    letter_id = q.i64(0);
  }
  c.query(kMarkDead).args(s.id, error, letter_id, now).run();
  uncount_from_parent(c, s, now);
  if (s.cancel_requested) cancel_active_children(c, s.id, now);
}

const std::string kMarkCancelled =
    "UPDATE jobs SET status = 'cancelled', attempts = attempts - ?2, "
    "last_error = COALESCE(?3, last_error), finished_ms = ?4, updated_ms = ?4, "
    "lease_owner = NULL, lease_token = NULL, lease_expires_ms = 0, wait_deadline_ms = 0, "
    "counted_in_parent = 0 WHERE id = ?1";
const std::string kIgnoreRetryingLetter =
    "UPDATE dead_letters SET status = 'ignored', updated_ms = ?2 "
    "WHERE id = ?1 AND status = 'retrying'";
const std::string kActiveChildren =
    "SELECT id FROM jobs WHERE parent_id = ?1 AND status IN ('queued', 'running', 'waiting') "
    "ORDER BY id";

CancelOutcome cancel_job(Connection& c, JobId id, int64_t now);

// Cancelled (terminal), with its active children: queued and waiting ones at once, running ones
// asked to stop.
void mark_cancelled(Connection& c, const JobState& s, int refund,
                    const std::optional<std::string>& error, int64_t now) {
  c.query(kMarkCancelled).args(s.id, refund, error, now).run();
  if (s.dead_letter_id) c.query(kIgnoreRetryingLetter).args(*s.dead_letter_id, now).run();
  uncount_from_parent(c, s, now);
  cancel_active_children(c, s.id, now);
}

void cancel_active_children(Connection& c, JobId parent, int64_t now) {
  std::vector<JobId> children;
  {
    Query q = c.query(kActiveChildren);
    q.args(parent);
    while (q.step()) children.push_back(q.i64(0));
  }
  for (JobId child : children) cancel_job(c, child, now);
}

const std::string kRequestCancel =
    "UPDATE jobs SET cancel_requested = 1, updated_ms = ?2 WHERE id = ?1";

CancelOutcome cancel_job(Connection& c, JobId id, int64_t now) {
  JobState s = load_existing(c, id);
  if (is_terminal(s.status)) return CancelOutcome::kAlreadyFinished;
  if (s.status == JobStatus::kRunning) {
    c.query(kRequestCancel).args(id, now).run();
    return CancelOutcome::kRequested;
  }
  mark_cancelled(c, s, 0, std::nullopt, now);
  return CancelOutcome::kCancelled;
}

// --- producing -----------------------------------------------------------------------------

const std::string kFindActiveDedupe =
    "SELECT id FROM jobs WHERE kind = ?1 AND dedupe_key = ?2 "
    "AND status IN ('queued', 'running', 'waiting')";
const std::string kCountChild =
    "UPDATE jobs SET pending_children = pending_children + 1, updated_ms = ?2 "
    "WHERE id = ?1 AND status IN ('queued', 'running', 'waiting')";
const std::string kJobExists = "SELECT 1 FROM jobs WHERE id = ?1";
const std::string kInsertJob =
    "INSERT INTO jobs (kind, concurrency_key, dedupe_key, status, priority, max_attempts, "
    "run_after_ms, parent_id, counted_in_parent, timeout_ms, created_ms, updated_ms, payload, "
    "fair) VALUES (?1, ?2, ?3, 'queued', ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?10, ?11, ?12)";

std::optional<JobId> active_duplicate(Connection& c, const std::string& kind,
                                      const std::string& dedupe_key) {
  Query q = c.query(kFindActiveDedupe);
  q.args(kind, dedupe_key);
  if (!q.step()) return std::nullopt;
  return q.i64(0);
}

bool job_exists(Connection& c, JobId id) {
  Query q = c.query(kJobExists);
  q.args(id);
  return q.step();
}

// Adds a child to an active parent's pending_children. Returns false when the parent is
// already terminal (nothing waits for the child); throws JobNotFound when it does not exist.
bool count_child(Connection& c, JobId parent, int64_t now) {
  if (c.query(kCountChild).args(parent, now).run() > 0) return true;
  if (!job_exists(c, parent)) {
    throw JobNotFound("parent job " + std::to_string(parent) + " not found");
  }
  return false;
}

// A statement text repeating `row` `n` times, joined by ", " after `head` (multi-row VALUES and
// IN lists); `row` numbers its parameters from ?{first} and each repetition shifts them by
// `params` (written as "{0}", "{1}", ... relative to the row's first parameter).
std::string repeat_rows(const std::string& head, const std::string& row, int params, size_t n,
                        const std::string& tail = "") {
  std::string sql = head;
  for (size_t i = 0; i < n; ++i) {
    if (i > 0) sql += ", ";
    for (size_t pos = 0; pos < row.size(); ++pos) {
      if (row[pos] == '{') {
        size_t end = row.find('}', pos);
        int offset = std::stoi(row.substr(pos + 1, end - pos - 1));
        sql += "?" + std::to_string(static_cast<int>(i) * params + offset + 1);
        pos = end;
      } else {
        sql += row[pos];
      }
    }
  }
  return sql + tail;
}

// Kinds with a per-key cap: their queued jobs are in jobs_claim_key, the others' in
// jobs_claim_kind (jobs.fair, schema 0003).
using FairKinds = std::set<std::string>;
FairKinds fair_kinds(Connection& c);

// Rows per multi-row statement: one statement execution opens the table's and its indexes'
// cursors once for the whole chunk instead of once per job (measured: most of a single-row
// INSERT's cost with the jobs table's indexes).
constexpr size_t kChunk = 32;

const std::string& insert_jobs_sql(size_t n) {
  static const std::vector<std::string> sql = [] {
    std::vector<std::string> all(kChunk + 1);
    for (size_t i = 1; i <= kChunk; ++i) {
      all[i] = repeat_rows(
          "INSERT INTO jobs (kind, concurrency_key, status, priority, max_attempts, run_after_ms, "
          "timeout_ms, created_ms, updated_ms, payload, fair) VALUES ",
          "({0}, {1}, 'queued', {2}, {3}, {4}, {5}, {6}, {6}, {7}, {8})", 9, i);
    }
    return all;
  }();
  return sql[n];
}

// Jobs without a dedupe key or a parent (nothing to look up first), inserted by one statement.
void insert_plain(Connection& c, const std::vector<JobSpec>& specs, size_t begin, size_t end,
                  int64_t now, const FairKinds& fair, std::vector<EnqueueResult>& results) {
  Query q = c.query(insert_jobs_sql(end - begin));
  int index = 0;
  for (size_t i = begin; i < end; ++i) {
    const JobSpec& spec = specs[i];
    q.bind(++index, spec.kind);
    q.bind(++index, spec.concurrency_key);
    q.bind(++index, spec.priority);
    q.bind(++index, spec.max_attempts);
    q.bind(++index, spec.run_after_ms > 0 ? spec.run_after_ms : now);
    q.bind(++index, spec.timeout_ms);
    q.bind(++index, now);
    q.bind_static(++index, spec.payload);
    q.bind(++index, fair.count(spec.kind) > 0);
  }
  // No RETURNING (an ephemeral table per execution). The writer holds the write lock and
  // AUTOINCREMENT gives each new row max(ever used) + 1, so the rows got consecutive ids in
  // VALUES order, the last of which is the connection's last insert rowid.
  const int64_t n = static_cast<int64_t>(end - begin);
  if (q.run() != n) throw StorageError("sqlite: multi-row insert lost rows");
  const JobId last = sqlite3_last_insert_rowid(c.handle());
  for (JobId id = last - n + 1; id <= last; ++id) results.push_back({id, true});
}

EnqueueResult enqueue_one(Connection& c, const JobSpec& spec, int64_t now, const FairKinds& fair);

std::vector<EnqueueResult> enqueue_many(Connection& c, const std::vector<JobSpec>& specs,
                                        int64_t now) {
  const FairKinds fair = fair_kinds(c);
  std::vector<EnqueueResult> results;
  results.reserve(specs.size());
  auto plain = [](const JobSpec& spec) { return !spec.dedupe_key && !spec.parent_id; };
  for (size_t i = 0; i < specs.size();) {
    if (!plain(specs[i])) {
      results.push_back(enqueue_one(c, specs[i], now, fair));
      ++i;
      continue;
    }
    size_t end = i;
    while (end < specs.size() && end - i < kChunk && plain(specs[end])) ++end;
    insert_plain(c, specs, i, end, now, fair, results);
    i = end;
  }
  return results;
}

EnqueueResult enqueue_one(Connection& c, const JobSpec& spec, int64_t now, const FairKinds& fair) {
  if (spec.dedupe_key) {
    if (auto existing = active_duplicate(c, spec.kind, *spec.dedupe_key)) {
      return {*existing, false};
    }
  }
  bool counted = spec.parent_id && count_child(c, *spec.parent_id, now);
  int64_t run_after = spec.run_after_ms > 0 ? spec.run_after_ms : now;
  c.query(kInsertJob)
      .args(spec.kind, spec.concurrency_key, spec.dedupe_key, spec.priority, spec.max_attempts,
            run_after, spec.parent_id, counted, spec.timeout_ms, now, spec.payload,
            fair.count(spec.kind) > 0)
      .run();
  return {sqlite3_last_insert_rowid(c.handle()), true};
}

// --- claiming ------------------------------------------------------------------------------

struct Candidate {
  JobId id = 0;
  int priority = 0;
  int64_t run_after = 0;
  int64_t load = 0;  // running jobs of its key + its rank in the key (fair share)
};

bool claim_order(const Candidate& a, const Candidate& b) {
  return std::tie(a.priority, a.run_after, a.id) < std::tie(b.priority, b.run_after, b.id);
}

bool fair_order(const Candidate& a, const Candidate& b) {
  return std::tie(a.priority, a.load, a.run_after, a.id) <
         std::tie(b.priority, b.load, b.run_after, b.id);
}

const std::string kCaps = "SELECT kind, per_key_cap, global_cap FROM caps";
// The least kind (after ?1) with queued jobs: each claim index's, then the lesser of the two.
std::string queued_kind_sql(const std::string& after) {
  auto in = [&](const char* fair) {
    return "SELECT * FROM (SELECT kind FROM jobs WHERE status = 'queued' AND fair = " +
           std::string(fair) + after + " ORDER BY kind LIMIT 1)";
  };
  return in("0") + " UNION ALL " + in("1") + " ORDER BY 1 LIMIT 1";
}
const std::string kFirstQueuedKind = queued_kind_sql("");
const std::string kNextQueuedKind = queued_kind_sql(" AND kind > ?1");
const std::string kFirstQueuedKey =
    "SELECT concurrency_key FROM jobs WHERE status = 'queued' AND fair = 1 AND kind = ?1 "
    "ORDER BY concurrency_key LIMIT 1";
const std::string kNextQueuedKey =
    "SELECT concurrency_key FROM jobs WHERE status = 'queued' AND fair = 1 AND kind = ?1 "
    "AND concurrency_key > ?2 ORDER BY concurrency_key LIMIT 1";
// A claim reads a claim index one priority at a time (see read_due). Parameters: ?1 kind, ?2 a
// priority, ?3 now, (?4, ?5) the (run_after_ms, id) to read after, ?6 how many, ?7 the key (in
// jobs_claim_key). `at` and `first` read a range of the index, in claim order, that ends at the
// first job not yet due.
struct DueSql {
  std::string at;     // the due jobs of priority ?2 after (?4, ?5)
  std::string first;  // those of the least priority from ?2 on; then, in a last row whose id is
                      // NULL, the least priority above that one (NULL if there is none)
  std::string from;   // those of every priority from ?2 on, in one range (it steps over the jobs
                      // not yet due of each but the last priority it reads)
};
DueSql due_sql(const char* index, const char* key) {
  const std::string queued = std::string(" FROM jobs INDEXED BY ") + index +
                             " WHERE status = 'queued' AND fair = " + (key[0] ? "1" : "0") +
                             " AND kind = ?1" + key;
  const std::string select = "SELECT id, priority, run_after_ms" + queued;
  const std::string least =
      "(SELECT priority" + queued + " AND priority >= ?2 ORDER BY priority LIMIT 1)";
  const std::string next =
      "(SELECT priority" + queued + " AND priority > " + least + " ORDER BY priority LIMIT 1)";
  return {
      select +
          " AND priority = ?2 AND run_after_ms <= ?3 AND (run_after_ms, id) > (?4, ?5) "
          "ORDER BY run_after_ms, id LIMIT ?6",
      "SELECT * FROM (" + select + " AND priority = " + least +
          " AND run_after_ms <= ?3 ORDER BY run_after_ms, id LIMIT ?6) UNION ALL SELECT NULL, " +
          next + ", NULL",
      select +
          " AND priority >= ?2 AND run_after_ms <= ?3 "
          "ORDER BY priority, run_after_ms, id LIMIT ?6"};
}
const DueSql kDueOfKind = due_sql("jobs_claim_kind", "");
const DueSql kDueOfKey = due_sql("jobs_claim_key", " AND concurrency_key = ?7");
const std::string kKeyRunning =
    "SELECT running FROM running_counts WHERE kind = ?1 AND total = 0 AND concurrency_key = ?2";
const std::string kKindRunning =
    "SELECT running FROM running_counts WHERE kind = ?1 AND total = 1 AND concurrency_key = ''";

std::map<std::string, Caps> read_caps(Connection& c) {
  std::map<std::string, Caps> caps;
  Query q = c.query(kCaps);
  while (q.step()) caps[q.text(0)] = Caps{q.i32(1), q.i32(2)};
  return caps;
}

FairKinds fair_kinds(Connection& c) {
  FairKinds kinds;
  for (const auto& [kind, caps] : read_caps(c)) {
    if (caps.per_key > 0) kinds.insert(kind);
  }
  return kinds;
}

// Steps through the distinct values of an index prefix with one seek each (a skip scan).
std::optional<std::string> first_or_next(Connection& c, const std::string& first_sql,
                                         const std::string& next_sql,
                                         const std::optional<std::string>& kind,
                                         const std::optional<std::string>& after) {
  Query q = c.query(after ? next_sql : first_sql);
  if (kind) q.bind(1, *kind);
  if (after) q.bind(kind ? 2 : 1, *after);
  if (!q.step()) return std::nullopt;
  return q.text(0);
}

std::vector<std::string> queued_kinds(Connection& c) {
  std::vector<std::string> kinds;
  std::optional<std::string> kind;
  while ((kind = first_or_next(c, kFirstQueuedKind, kNextQueuedKind, std::nullopt, kind))) {
    kinds.push_back(*kind);
  }
  return kinds;
}

int64_t read_count(Connection& c, const std::string& sql, const std::string& kind,
                   const std::optional<std::string>& key) {
  Query q = c.query(sql);
  q.bind(1, kind);
  if (key) q.bind(2, *key);
  return q.step() ? q.i64(0) : 0;
}

// Up to `limit` due jobs of a kind (of one key, when `key` is given) in claim order, after
// `after` when given; the n-th one's load is base_load + n. Read one priority at a time: within a
// priority the due jobs are a range of the claim index that ends at the first job not yet due,
// so the jobs waiting for a later time (throttled, backing off) are not stepped over. Read as one
// range across priorities, they were, by every claim: 200 000 of them cost each claim about 22 ms
// of the writer's time. Each statement reads one priority and learns the next one, so a key or
// kind with one priority costs one statement, as before (two when `after` is given). Past
// kPrioritiesApart priorities the rest are read as one range, as before, which steps over the
// jobs not yet due of those priorities: cheaper than a statement for each of many priorities
// with few jobs each. `steps`: the reads' virtual machine steps are added to it.
constexpr int kPrioritiesApart = 16;

std::vector<Candidate> read_due(Connection& c, const std::string& kind, const std::string* key,
                                const Candidate* after, int64_t limit, int64_t now,
                                int64_t base_load, int64_t& steps) {
  const DueSql& sql = key ? kDueOfKey : kDueOfKind;
  std::vector<Candidate> out;
  // Reads a statement's due jobs into `out`; returns the priority of a last row whose id is NULL.
  // The due jobs come in the inner SELECT's order: SQLite runs a compound's LIMITed SELECT as a
  // co-routine, row by row, and the sentinel row is the compound's second part.
  const auto read = [&](const std::string& statement, int64_t priority, int64_t run_after,
                        int64_t id) {
    Query q = c.query(statement);
    q.args(kind, priority, now, run_after, id, limit - static_cast<int64_t>(out.size()));
    if (key) q.bind(7, *key);
    std::optional<int64_t> read_priority;
    while (q.step()) {
      if (q.is_null(0)) {
        if (!q.is_null(1)) read_priority = q.i64(1);
        continue;
      }
      out.push_back({q.i64(0), q.i32(1), q.i64(2), base_load + static_cast<int64_t>(out.size())});
    }
    steps += q.vm_steps();
    return read_priority;
  };
  int64_t from = INT64_MIN;  // the least priority still to read
  if (after) {
    read(sql.at, after->priority, after->run_after, after->id);
    from = int64_t{after->priority} + 1;
  }
  for (int apart = 0; static_cast<int64_t>(out.size()) < limit; ++apart) {
    if (apart == kPrioritiesApart) {
      read(sql.from, from, INT64_MIN, INT64_MIN);
      break;
    }
    const std::optional<int64_t> next = read(sql.first, from, INT64_MIN, INT64_MIN);
    if (!next) break;  // no priority after the one read
    from = *next;
  }
  return out;
}

// A kind with a per-key cap: the least-loaded keys go first (fair share: with 10 keys and a
// global cap of 30, each key gets 3 rather than the oldest keys all 30), and within a key the
// (priority, run_after, id) order holds. Each unsaturated key's list, in its index order, is
// already in that fair order (load = running + rank grows along it), so the lists are merged
// lazily: each key is read a page at a time by an index seek, about want/keys jobs per page, and
// saturated keys' backlogs are never scanned.
struct KeyCursor {
  std::string key;
  int64_t running = 0;
  int64_t room = 0;  // jobs this key may still start (cap - running - taken)
  std::vector<Candidate> page;
  size_t next = 0;
  bool exhausted = false;  // the last read returned less than asked
};

void read_page(Connection& c, const std::string& kind, KeyCursor& k, int64_t page, int64_t now,
               int64_t& steps) {
  const int64_t limit = std::min(page, k.room);
  const int64_t base = k.page.empty() ? k.running : k.page.back().load + 1;  // load = rank
  std::vector<Candidate> rows =
      read_due(c, kind, &k.key, k.page.empty() ? nullptr : &k.page.back(), limit, now, base, steps);
  k.exhausted = static_cast<int64_t>(rows.size()) < limit;
  k.page = std::move(rows);
  k.next = 0;
}

std::vector<Candidate> fair_candidates(Connection& c, const std::string& kind, int per_key,
                                       int64_t want, int64_t now, int64_t& steps) {
  std::vector<KeyCursor> keys;
  std::optional<std::string> key;
  while ((key = first_or_next(c, kFirstQueuedKey, kNextQueuedKey, kind, key))) {
    int64_t running = read_count(c, kKeyRunning, kind, key);
    if (running < per_key) keys.push_back({*key, running, per_key - running, {}, 0, false});
  }
  if (keys.empty() || want <= 0) return {};
  const int64_t page = want / static_cast<int64_t>(keys.size()) + 2;
  for (KeyCursor& k : keys) read_page(c, kind, k, page, now, steps);
  std::vector<Candidate> out;
  while (static_cast<int64_t>(out.size()) < want) {
    KeyCursor* best = nullptr;
    for (KeyCursor& k : keys) {
      if (k.next == k.page.size()) {
        if (k.exhausted || k.room <= 0 || k.page.empty()) continue;
        read_page(c, kind, k, page, now, steps);
        if (k.page.empty()) continue;
      }
      if (!best || fair_order(k.page[k.next], best->page[best->next])) best = &k;
    }
    if (!best) break;
    out.push_back(best->page[best->next++]);
    --best->room;
  }
  return out;
}

// The runnable jobs of one kind this claim may take, in the order it should take them.
std::vector<Candidate> kind_candidates(Connection& c, const std::string& kind, const Caps& caps,
                                       size_t limit, int64_t now, int64_t& steps) {
  // Held well below INT64_MAX: a limit of SIZE_MAX ("as many as there are") must become neither
  // -1 nor overflow the page arithmetic of fair_candidates.
  int64_t want = static_cast<int64_t>(std::min<size_t>(limit, INT64_MAX / 4));
  if (caps.global > 0) {
    want = std::min<int64_t>(want, caps.global - read_count(c, kKindRunning, kind, std::nullopt));
    if (want <= 0) return {};
  }
  if (caps.per_key > 0) return fair_candidates(c, kind, caps.per_key, want, now, steps);
  return read_due(c, kind, nullptr, nullptr, want, now, 0, steps);
}

// Merges the kinds' lists by (priority, run_after, id), keeping each list's own order.
std::vector<Candidate> merge_heads(const std::vector<std::vector<Candidate>>& lists, size_t limit) {
  std::vector<Candidate> out;
  std::vector<size_t> next(lists.size(), 0);
  while (out.size() < limit) {
    int best = -1;
    for (size_t i = 0; i < lists.size(); ++i) {
      if (next[i] == lists[i].size()) continue;
      if (best < 0 || claim_order(lists[i][next[i]], lists[best][next[best]])) {
        best = static_cast<int>(i);
      }
    }
    if (best < 0) break;
    out.push_back(lists[best][next[best]++]);
  }
  return out;
}

// Lease tokens: 128 random bits as hex. Used on the writer thread only.
class TokenSource {
 public:
  TokenSource() {
    std::random_device device;
    std::seed_seq seed{device(), device(), device(), device(),
                       device(), device(), device(), device()};
    rng_.seed(seed);
  }
  std::string next() {
    char buffer[33];
    std::snprintf(buffer, sizeof buffer, "%016llx%016llx", static_cast<unsigned long long>(rng_()),
                  static_cast<unsigned long long>(rng_()));
    return buffer;
  }

 private:
  std::mt19937_64 rng_;
};

// A claim takes its candidates kChunk at a time: one UPDATE and one SELECT of the claimed rows
// per chunk (ids padded with 0, which no job has). Each job's lease
// token is the chunk's random prefix followed by the job id: unique, and what the chunk's later
// statements select by. No RETURNING: SQLite buffers RETURNING rows in an ephemeral table per
// execution, which measured as much as the UPDATE itself.
std::string id_list(int first, size_t n, int stride = 1) {
  std::string sql = "(";
  for (size_t i = 0; i < n; ++i) {
    if (i > 0) sql += ", ";
    sql += "?" + std::to_string(first + stride * static_cast<int>(i));
  }
  return sql + ")";
}

const std::string kClaimChunk =
    "UPDATE jobs SET status = 'running', attempts = attempts + 1, attempt_no = attempts + 1, "
    "claims = claims + 1, "
    "lease_owner = ?2, lease_token = ?1 || id, lease_expires_ms = ?3, started_ms = ?4, "
    "updated_ms = ?4 WHERE status = 'queued' AND id IN " +
    id_list(5, kChunk);
const std::string kClaimedRows = "SELECT " + kJobColumns + " FROM jobs WHERE id IN " +
                                 id_list(2, kChunk) + " AND lease_token = ?1 || id";
// total = 0: one (kind, key); total = 1: the whole kind (key '').
const std::string kRunningUp =
    "INSERT INTO running_counts (kind, total, concurrency_key, running, max_running) "
    "VALUES (?1, ?2, ?3, ?4, ?4) ON CONFLICT (kind, total, concurrency_key) DO UPDATE SET "
    "running = running + excluded.running, "
    "max_running = MAX(max_running, running + excluded.running)";

void bind_ids(Query& q, int first, const std::vector<Candidate>& chunk) {
  for (size_t i = 0; i < kChunk; ++i) {
    q.bind(first + static_cast<int>(i), i < chunk.size() ? chunk[i].id : 0);
  }
}

// Claims the queued ones among `chunk`, appending them to `out` in the chunk's order.
void take_chunk(Connection& c, const std::vector<Candidate>& chunk, const ClaimRequest& r,
                TokenSource& tokens, std::vector<Claimed>& out) {
  const std::string prefix = tokens.next() + ".";
  const int64_t expires = later_by(r.now_ms, r.lease_ms);
  {
    Query q = c.query(kClaimChunk);
    q.args(prefix, r.owner, expires, r.now_ms);
    bind_ids(q, 5, chunk);
    if (q.run() == 0) return;
  }
  std::map<JobId, Claimed> rows;
  {
    Query q = c.query(kClaimedRows);
    q.bind(1, prefix);
    bind_ids(q, 2, chunk);
    while (q.step()) {
      Claimed claimed;
      claimed.job = read_job(q);
      claimed.lease_token = claimed.job.lease_token.value_or("");
      claimed.lease_expires_ms = expires;
      rows.emplace(claimed.job.id, std::move(claimed));
    }
  }
  for (const Candidate& candidate : chunk) {
    auto it = rows.find(candidate.id);
    if (it != rows.end()) out.push_back(std::move(it->second));
  }
}

// Records the new running jobs and the high-water marks, once per key and kind.
void count_running(Connection& c, const std::vector<Claimed>& claimed) {
  std::map<std::pair<std::string, std::string>, int> per_key;
  std::map<std::string, int> per_kind;
  for (const Claimed& one : claimed) {
    ++per_key[{one.job.kind, one.job.concurrency_key}];
    ++per_kind[one.job.kind];
  }
  for (const auto& [key, n] : per_key) {
    c.query(kRunningUp).args(key.first, 0, key.second, n).run();
  }
  for (const auto& [kind, n] : per_kind) c.query(kRunningUp).args(kind, 1, "", n).run();
}

// `steps`: the virtual machine steps of the reads of claim indexes are added to it.
std::vector<Claimed> claim_jobs(Connection& c, const ClaimRequest& r, TokenSource& tokens,
                                int64_t& steps) {
  if (r.limit == 0) return {};
  std::map<std::string, Caps> caps = read_caps(c);
  std::set<std::string> kinds(r.kinds.begin(), r.kinds.end());
  if (kinds.empty()) {
    for (std::string& kind : queued_kinds(c)) kinds.insert(std::move(kind));
  }
  std::vector<std::vector<Candidate>> lists;
  for (const std::string& kind : kinds) {
    auto it = caps.find(kind);
    lists.push_back(
        kind_candidates(c, kind, it == caps.end() ? Caps{} : it->second, r.limit, r.now_ms, steps));
  }
  std::vector<Claimed> claimed;
  const std::vector<Candidate> order = merge_heads(lists, r.limit);
  for (size_t i = 0; i < order.size(); i += kChunk) {
    const size_t end = std::min(order.size(), i + kChunk);
    take_chunk(c,
               std::vector<Candidate>(order.begin() + static_cast<ptrdiff_t>(i),
                                      order.begin() + static_cast<ptrdiff_t>(end)),
               r, tokens, claimed);
  }
  count_running(c, claimed);
  return claimed;
}

// --- running jobs --------------------------------------------------------------------------

const std::string kHeartbeat =
    "UPDATE jobs SET lease_expires_ms = ?3, updated_ms = ?4, "
    "checkpoint = CASE WHEN ?5 THEN ?6 ELSE checkpoint END, "
    "attempts = CASE WHEN ?5 AND ?7 THEN 1 ELSE attempts END "
    "WHERE id = ?1 AND lease_token = ?2 AND status = 'running' RETURNING cancel_requested";

HeartbeatResult heartbeat_job(Connection& c, JobId id, const std::string& token, int64_t now,
                              int64_t lease_ms, const std::optional<std::string>& checkpoint,
                              bool progress) {
  HeartbeatResult result;
  result.lease_expires_ms = later_by(now, lease_ms);
  {
    Query q = c.query(kHeartbeat);
    q.args(id, token, result.lease_expires_ms, now, checkpoint.has_value(), checkpoint, progress);
    if (q.step()) {
      result.cancel_requested = q.i64(0) != 0;
      return result;
    }
  }
  load_running(c, id, token);  // throws LeaseLost with the reason
  throw LeaseLost("job " + std::to_string(id) + ": lease lost");
}

const std::string kComplete =
    "UPDATE jobs SET status = 'succeeded', result = ?2, finished_ms = ?3, updated_ms = ?3, "
    "lease_token = NULL, lease_expires_ms = 0, counted_in_parent = 0 WHERE id = ?1";
const std::string kResolveLetter =
    "UPDATE dead_letters SET status = 'resolved', updated_ms = ?2 "
    "WHERE id = ?1 AND status = 'retrying'";

void complete_job(Connection& c, JobId id, const std::string& token, const std::string& result,
                  int64_t now) {
  JobState s = load_running(c, id, token);
  end_successful_attempt(c, s, now);
  c.query(kComplete).args(id, result, now).run();
  if (s.dead_letter_id) c.query(kResolveLetter).args(*s.dead_letter_id, now).run();
  uncount_from_parent(c, s, now);
}

JobStatus fail_job(Connection& c, JobId id, const std::string& token, const Failure& failure,
                   int64_t now) {
  JobState s = load_running(c, id, token);
  end_attempt(c, s, failure.fatal ? "fatal" : "failed", failure.error, now);
  const JobStatus next = after_failure(failure, s.attempts, s.max_attempts, s.cancel_requested);
  if (next == JobStatus::kDead) {
    mark_dead(c, s, failure.error, now);
  } else if (next == JobStatus::kCancelled) {  // what would have been a retry
    mark_cancelled(c, s, 0, failure.error, now);
  } else {
    requeue(c, s, later_by(now, failure.retry_delay_ms), 0, failure.error, now);
  }
  return next;
}

// defer and release: back to queued without counting the attempt -- unless the job was asked to
// stop: every exit that would requeue a cancel-requested job cancels it instead (fail, sweep and
// wait_for_children too), while complete() still succeeds and a death still dies.
JobStatus return_job(Connection& c, JobId id, const std::string& token, int64_t run_after,
                     std::string_view outcome, const std::optional<std::string>& reason,
                     int64_t now) {
  JobState s = load_running(c, id, token);
  if (s.cancel_requested) {
    end_attempt(c, s, "cancelled", reason, now);
    mark_cancelled(c, s, 1, std::nullopt, now);
    return JobStatus::kCancelled;
  }
  end_attempt(c, s, outcome, reason, now);
  requeue(c, s, run_after, 1, std::nullopt, now);
  return JobStatus::kQueued;
}

const std::string kWait =
    "UPDATE jobs SET "
    "status = CASE WHEN pending_children > 0 THEN 'waiting' ELSE 'queued' END, "
    "wait_deadline_ms = CASE WHEN pending_children > 0 THEN ?2 ELSE 0 END, "
    "run_after_ms = CASE WHEN pending_children > 0 THEN run_after_ms ELSE ?3 END, "
    "checkpoint = CASE WHEN ?4 THEN ?5 ELSE checkpoint END, "
    "attempts = CASE WHEN ?4 THEN 0 ELSE attempts - 1 END, "
    "lease_owner = NULL, lease_token = NULL, lease_expires_ms = 0, updated_ms = ?3 "
    "WHERE id = ?1";

// Fan-in: waiting until pending_children reaches 0 (queued at once if it already is).
JobStatus wait_job(Connection& c, JobId id, const std::string& token, int64_t deadline,
                   const std::optional<std::string>& checkpoint, int64_t now) {
  JobState s = load_running(c, id, token);
  if (s.cancel_requested) {
    end_attempt(c, s, "cancelled", std::nullopt, now);
    mark_cancelled(c, s, 1, std::nullopt, now);
    return JobStatus::kCancelled;
  }
  end_attempt(c, s, "waiting", std::nullopt, now);
  c.query(kWait).args(id, deadline, now, checkpoint.has_value(), checkpoint).run();
  return s.pending_children > 0 ? JobStatus::kWaiting : JobStatus::kQueued;
}

JobStatus finish_job(Connection& c, const Finish& f, int64_t now) {
  switch (f.kind) {
    case Finish::Kind::kComplete:
      complete_job(c, f.id, f.token, f.result_json, now);
      return JobStatus::kSucceeded;
    case Finish::Kind::kFail:
      return fail_job(c, f.id, f.token, f.failure, now);
    case Finish::Kind::kDefer:
      return return_job(c, f.id, f.token, f.until_ms, "deferred", f.reason, now);
    case Finish::Kind::kRelease:
      return return_job(c, f.id, f.token, now, "released", std::nullopt, now);
    case Finish::Kind::kWaitForChildren:
      return wait_job(c, f.id, f.token, f.until_ms, f.checkpoint, now);
  }
  throw std::invalid_argument(*finish_item_problem(f));
}

const std::string kRunningDownBy =
    "UPDATE running_counts SET running = running - ?3 WHERE kind = ?1 "
    "AND ((total = 0 AND concurrency_key = ?2) OR (total = 1 AND concurrency_key = ''))";

// complete_job() for a chunk of items (distinct jobs): their states are read by one SELECT and
// checked for the lease before any write, then the attempt rows and the jobs are written by one
// statement each; the running counters are decremented once per (kind, key) for the whole call
// (`down`). A statement the database refuses (a result over its length limit) fails the chunk:
// finish_jobs() undoes it and writes its items one by one, each in its own savepoint.
// A statement in widths 1, 2, 4, ... kChunk: a chunk uses the narrowest that holds it (padded
// with id 0, which no job has), so a few completions do not pay for kChunk lookups.
class Widths {
 public:
  explicit Widths(const std::function<std::string(size_t)>& build) {
    for (size_t n = 1; n <= kChunk; n *= 2) sql_.push_back(build(n));
  }
  static size_t width(size_t n) { return std::bit_ceil(std::max<size_t>(n, 1)); }
  const std::string& operator()(size_t n) const {
    return sql_[static_cast<size_t>(std::countr_zero(width(n)))];
  }

 private:
  std::vector<std::string> sql_;
};

const Widths kChunkStates([](size_t n) {
  return "SELECT " + kStateColumns + " FROM jobs WHERE id IN " + id_list(1, n);
});
const Widths kCloseOpenChunkRows([](size_t n) { return kCloseOpenRows + id_list(2, n); });

// "CASE id WHEN ?a THEN ?b ... END" over `n` rows of `stride` parameters from ?2, row i's id at
// ?(2 + stride * i) and its value `offset` after it.
std::string case_of_id(size_t n, int stride, int offset) {
  std::string sql = "CASE id";
  for (size_t i = 0; i < n; ++i) {
    const int id = 2 + stride * static_cast<int>(i);
    sql += " WHEN ?" + std::to_string(id) + " THEN ?" + std::to_string(id + offset);
  }
  return sql + " END";
}

const Widths kCompleteChunk([](size_t n) {
  return "UPDATE jobs SET status = 'succeeded', result = " + case_of_id(n, 2, 1) +
         ", finished_ms = ?1, updated_ms = ?1, lease_token = NULL, "
         "lease_expires_ms = 0, counted_in_parent = 0 WHERE id IN " +
         id_list(2, n, 2);
});

// The states of a chunk's jobs (distinct), read by one SELECT, and the items whose lease holds;
// the others get lease_lost in `results`. (The map's nodes, and so `valid`'s pointers, survive
// a move.)
struct CheckedChunk {
  std::map<JobId, JobState> states;
  std::vector<std::pair<size_t, const JobState*>> valid;  // item index, its job's state
};
CheckedChunk check_chunk(Connection& c, const std::vector<Finish>& items,
                         const std::vector<size_t>& chunk, std::vector<FinishResult>& results) {
  CheckedChunk out;
  {
    Query q = c.query(kChunkStates(chunk.size()));
    for (size_t i = 0; i < Widths::width(chunk.size()); ++i) {
      q.bind(1 + static_cast<int>(i), i < chunk.size() ? items[chunk[i]].id : 0);
    }
    while (q.step()) {
      JobState state = read_state(q);
      out.states.emplace(state.id, std::move(state));
    }
  }
  for (size_t index : chunk) {
    const Finish& f = items[index];
    auto it = out.states.find(f.id);
    std::optional<JobState> state;
    if (it != out.states.end()) state = it->second;
    if (auto problem = lease_problem(f.id, state, f.token)) {
      results[index].lease_lost = true;
      results[index].error = *problem;
      continue;
    }
    out.valid.emplace_back(index, &it->second);
  }
  return out;
}

void complete_chunk(Connection& c, const std::vector<Finish>& items,
                    const std::vector<size_t>& chunk, int64_t now,
                    std::map<std::pair<std::string, std::string>, int>& down,
                    std::vector<FinishResult>& results) {
  const CheckedChunk checked = check_chunk(c, items, chunk, results);
  const auto& valid = checked.valid;  // (item index, state)
  if (valid.empty()) return;
  {
    Query q = c.query(kCloseOpenChunkRows(valid.size()));
    q.bind(1, now);
    for (size_t i = 0; i < Widths::width(valid.size()); ++i)
      q.bind(2 + static_cast<int>(i), i < valid.size() ? valid[i].second->id : 0);
    q.run();
  }
  {
    Query q = c.query(kCompleteChunk(valid.size()));
    q.bind(1, now);
    for (size_t i = 0; i < Widths::width(valid.size()); ++i) {
      const int slot = 2 + 2 * static_cast<int>(i);
      if (i < valid.size()) {
        q.bind(slot, valid[i].second->id);
        q.bind_static(slot + 1, items[valid[i].first].result_json);
      } else {
        q.bind(slot, 0);
      }
    }
    q.run();
  }
  for (const auto& [index, state] : valid) {
    ++down[{state->kind, state->key}];
    if (state->dead_letter_id) c.query(kResolveLetter).args(*state->dead_letter_id, now).run();
    uncount_from_parent(c, *state, now);
    results[index].status = JobStatus::kSucceeded;
  }
}

// Retries (a failure that requeues), by rows of (id, run_after, error) from ?2; ?1 = now.
const Widths kEndFailedAttempts([](size_t n) {
  return kAttemptRowHead + "?1, 'failed', " + case_of_id(n, 3, 2) + " FROM jobs WHERE id IN " +
         id_list(2, n, 3) + kAttemptRowTail;
});
const Widths kRetryChunk([](size_t n) {
  return "UPDATE jobs SET status = 'queued', run_after_ms = " + case_of_id(n, 3, 1) +
         ", last_error = " + case_of_id(n, 3, 2) +
         ", lease_owner = NULL, lease_token = NULL, lease_expires_ms = 0, updated_ms = ?1 "
         "WHERE id IN " +
         id_list(2, n, 3);
});

// fail_job() for a chunk of items (distinct jobs). The failures that requeue -- the common case:
// not FATAL, attempts left, no cancel request -- are checked like complete_chunk's and written
// by one statement each; the others (dead, cancelled) go one by one through fail_job(). The
// requeued ones that have a parent are added to `requeued_children` (see finish_jobs()).
void fail_chunk(Connection& c, const std::vector<Finish>& items, const std::vector<size_t>& chunk,
                int64_t now, std::map<std::pair<std::string, std::string>, int>& down,
                std::vector<FinishResult>& results, std::vector<size_t>& one_by_one,
                std::vector<size_t>& requeued_children) {
  std::vector<size_t> retries;
  const CheckedChunk checked = check_chunk(c, items, chunk, results);
  for (const auto& [index, state] : checked.valid) {
    if (after_failure(items[index].failure, state->attempts, state->max_attempts,
                      state->cancel_requested) != JobStatus::kQueued) {
      one_by_one.push_back(index);
    } else {
      retries.push_back(index);
      ++down[{state->kind, state->key}];
      if (state->parent_id) requeued_children.push_back(index);
    }
  }
  if (retries.empty()) return;
  for (const Widths* statement : {&kEndFailedAttempts, &kRetryChunk}) {
    Query q = c.query((*statement)(retries.size()));
    q.bind(1, now);
    for (size_t i = 0; i < Widths::width(retries.size()); ++i) {
      const int slot = 2 + 3 * static_cast<int>(i);
      if (i < retries.size()) {
        const Finish& f = items[retries[i]];
        q.bind(slot, f.id);
        q.bind(slot + 1, later_by(now, f.failure.retry_delay_ms));
        q.bind_static(slot + 2, f.failure.error);
      } else {
        q.bind(slot, 0);
      }
    }
    q.run();
  }
  for (size_t index : retries) results[index].status = JobStatus::kQueued;
}

// Completions, and failures, in chunks of distinct jobs; every other item in its own savepoint
// inside the one transaction, so that one item's failure undoes only that item. An error that
// ended the transaction itself fails the whole call.
std::vector<FinishResult> finish_jobs(Connection& c, const std::vector<Finish>& items,
                                      int64_t now) {
  std::vector<FinishResult> results(items.size());
  std::map<std::pair<std::string, std::string>, int> down;
  // One item alone, in a savepoint.
  auto finish_one = [&](size_t i) {
    c.query("SAVEPOINT item").run();
    try {
      results[i].status = finish_job(c, items[i], now);
      c.query("RELEASE item").run();
      return;
    } catch (...) {  // a lost lease, an error that may pass (retryable), the item's own
      results[i] = finish_failure(std::current_exception());
    }
    // SQLite rolled the transaction back (the disk full, an I/O error): the call fails, and may
    // pass as the item's error may.
    if (c.autocommit()) {
      throw StorageError("sqlite: the transaction ended: " + results[i].error,
                         results[i].retryable);
    }
    c.query("ROLLBACK TO item").run();
    c.query("RELEASE item").run();
  };
  // The first item of each job, if it completes or fails, goes in a chunk of its kind; every
  // other item comes after them, in order (a repeat then finds its job no longer running under
  // the token, as it would one by one).
  std::vector<size_t> completes, fails, rest;
  std::set<JobId> seen;
  for (size_t i = 0; i < items.size(); ++i) {
    if (auto problem = finish_item_problem(items[i])) {  // this item's alone: nothing written
      results[i].error = *problem;
      continue;
    }
    const bool first = seen.insert(items[i].id).second;
    if (first && items[i].kind == Finish::Kind::kComplete) {
      completes.push_back(i);
    } else if (first && items[i].kind == Finish::Kind::kFail) {
      fails.push_back(i);
    } else {
      rest.push_back(i);
    }
  }
  auto chunks = [](const std::vector<size_t>& all, auto&& fn) {
    for (size_t at = 0; at < all.size(); at += kChunk) {
      fn(std::vector<size_t>(all.begin() + at, all.begin() + std::min(all.size(), at + kChunk)));
    }
  };
  std::vector<size_t> one_by_one;
  // A chunk the database refuses (one item's result it cannot hold, say) is undone and its items
  // go one by one, so that the refusal is that item's alone.
  std::vector<size_t> requeued_children;  // retries written with their chunk, of jobs with a parent
  auto isolated = [&](const std::vector<size_t>& chunk, auto&& write) {
    const auto down_before = down;
    const size_t queued_before = one_by_one.size();
    const size_t children_before = requeued_children.size();
    c.query("SAVEPOINT chunk").run();
    try {
      write(chunk);
      c.query("RELEASE chunk").run();
      return;
    } catch (const LeaseLost&) {
      if (c.autocommit()) throw;
    } catch (const std::exception&) {
      if (c.autocommit()) throw;  // the transaction ended: the whole call fails
    }
    c.query("ROLLBACK TO chunk").run();
    c.query("RELEASE chunk").run();
    down = down_before;
    one_by_one.resize(queued_before);
    requeued_children.resize(children_before);
    for (size_t index : chunk) {
      results[index] = {};
      one_by_one.push_back(index);
    }
  };
  chunks(completes, [&](const std::vector<size_t>& chunk) {
    isolated(chunk, [&](const std::vector<size_t>& part) {
      complete_chunk(c, items, part, now, down, results);
    });
  });
  chunks(fails, [&](const std::vector<size_t>& chunk) {
    isolated(chunk, [&](const std::vector<size_t>& part) {
      fail_chunk(c, items, part, now, down, results, one_by_one, requeued_children);
    });
  });
  one_by_one.insert(one_by_one.end(), rest.begin(), rest.end());
  std::sort(one_by_one.begin(), one_by_one.end());
  for (size_t index : one_by_one) finish_one(index);
  // A retry written with its chunk, ahead of the items above, whose parent (or an ancestor) one
  // of them cancelled: the cancellation found it queued and cancelled it. Its item reports that,
  // as it does when the parent's item is written first (the cancellation rule) and as the MySQL
  // store reports it. Only a job with a parent can be cancelled so: no other is read again.
  if (!one_by_one.empty()) {
    for (size_t index : requeued_children) {
      std::optional<JobState> s = load_state(c, items[index].id);
      if (s && s->status == JobStatus::kCancelled) results[index].status = JobStatus::kCancelled;
    }
  }
  for (const auto& [key, n] : down) c.query(kRunningDownBy).args(key.first, key.second, n).run();
  return results;
}

// --- recovery ------------------------------------------------------------------------------

const std::string kExpiredLeases =
    "SELECT id FROM jobs WHERE status = 'running' AND lease_expires_ms <= ?1 "
    "ORDER BY lease_expires_ms, id";
const std::string kWakeParents =
    "UPDATE jobs SET status = 'queued', run_after_ms = ?1, wait_deadline_ms = 0, "
    "updated_ms = ?1 WHERE status = 'waiting' AND wait_deadline_ms <= ?1";

std::vector<JobId> select_ids(Connection& c, const std::string& sql, int64_t arg) {
  std::vector<JobId> ids;
  Query q = c.query(sql);
  q.args(arg);
  while (q.step()) ids.push_back(q.i64(0));
  return ids;
}

// The expired leases of one sweep (or start-up recovery) pass, and what the pass did.
struct Expiry {
  SweepResult result;
  // Requeued jobs that have a parent: a parent's cancellation later in the same pass may end
  // them, and then they were not requeued after all (see counted()).
  std::vector<JobId> requeued_children;

  // The pass's result, counting as requeued only the jobs it left queued.
  SweepResult counted(Connection& c) {
    for (JobId id : requeued_children) {
      if (load_existing(c, id).status != JobStatus::kQueued) --result.requeued;
    }
    return result;
  }
};

// An expired lease: the worker crashed or hung. The attempt counts.
void expire_lease(Connection& c, const JobState& s, int64_t now, Expiry& pass) {
  const std::string expired = "lease expired (worker crashed or hung)";
  end_attempt(c, s, "lease_expired", expired, now);
  if (s.attempts >= s.max_attempts) {
    mark_dead(
        c, s,
        "lease expired after " + std::to_string(s.attempts) + " attempts (worker crashed or hung)",
        now);
    ++pass.result.dead;
  } else if (s.cancel_requested) {
    mark_cancelled(c, s, 0, expired, now);  // it would have been requeued
  } else {
    requeue(c, s, now, 0, expired, now);
    ++pass.result.requeued;
    if (s.parent_id) pass.requeued_children.push_back(s.id);
  }
}

const std::string kOwnedLeases =
    "SELECT id FROM jobs WHERE status = 'running' AND lease_owner = ?1 ORDER BY id";

SweepResult recover_owned(Connection& c, const std::string& owner, int64_t now) {
  Expiry pass;
  std::vector<JobId> ids;
  {
    Query q = c.query(kOwnedLeases);
    q.args(owner);
    while (q.step()) ids.push_back(q.i64(0));
  }
  for (JobId id : ids) expire_lease(c, load_existing(c, id), now, pass);
  return pass.counted(c);
}

SweepResult sweep_jobs(Connection& c, int64_t now) {
  Expiry pass;
  for (JobId id : select_ids(c, kExpiredLeases, now)) {
    expire_lease(c, load_existing(c, id), now, pass);
  }
  pass.result.parents_woken = static_cast<int>(c.query(kWakeParents).args(now).run());
  return pass.counted(c);
}

constexpr int64_t kPruneChunk = 1000;
// finished_ms > 0, as in the MySQL store: there, every active job sits at 0 in the finished_ms
// index, and a range taking in 0 read the whole backlog (or every kept job) for each chunk.
const std::string kPruneSql =
    "DELETE FROM jobs WHERE id IN (SELECT j.id FROM jobs j "
    "WHERE j.status IN ('succeeded', 'dead', 'cancelled') AND j.finished_ms > 0 "
    "AND j.finished_ms < ?1 "
    "AND (j.status <> 'dead' OR NOT EXISTS (SELECT 1 FROM dead_letters d "
    "WHERE d.job_id = j.id AND d.status IN ('pending', 'retrying'))) LIMIT ?2)";

// --- cancellation, checkpoints -------------------------------------------------------------

const std::string kActiveOfKey =
    "SELECT id FROM jobs WHERE concurrency_key = ?1 AND (?2 = '' OR kind = ?2) "
    "AND status IN ('queued', 'running', 'waiting') ORDER BY id";

// Every job of the key that is active now ends cancelled or asked to stop (a child may be
// cancelled through its parent first); the count is theirs.
int cancel_key_jobs(Connection& c, const std::string& key, const std::string& kind, int64_t now) {
  std::vector<JobId> ids;
  {
    Query q = c.query(kActiveOfKey);
    q.args(key, kind);
    while (q.step()) ids.push_back(q.i64(0));
  }
  for (JobId id : ids) cancel_job(c, id, now);
  return static_cast<int>(ids.size());
}

const std::string kSetCheckpoint = "UPDATE jobs SET checkpoint = ?2, updated_ms = ?3 WHERE id = ?1";

void set_job_checkpoint(Connection& c, JobId id, const std::optional<std::string>& checkpoint,
                        int64_t now) {
  JobState s = load_existing(c, id);
  if (s.status == JobStatus::kRunning) {
    throw InvalidTransition("job " + std::to_string(id) +
                            " is running: its checkpoint belongs to the worker");
  }
  c.query(kSetCheckpoint).args(id, checkpoint, now).run();
}

// --- throttle, circuits --------------------------------------------------------------------

const std::string kLoadBucket =
    "SELECT tokens, updated_ms FROM throttle_buckets WHERE bucket_key = ?1";
const std::string kSaveBucket =
    "INSERT INTO throttle_buckets (bucket_key, tokens, updated_ms) VALUES (?1, ?2, ?3) "
    "ON CONFLICT (bucket_key) DO UPDATE SET tokens = excluded.tokens, "
    "updated_ms = excluded.updated_ms";

// Token bucket (token_bucket.h): starts full, refills continuously, never above capacity.
int64_t take_bucket_tokens(Connection& c, const std::string& key, double cost, double capacity,
                           double refill_per_hour, int64_t now) {
  check_take(cost, capacity, refill_per_hour);
  std::optional<Bucket> stored;
  {
    Query q = c.query(kLoadBucket);
    q.args(key);
    if (q.step()) stored = Bucket{q.real(0), q.i64(1)};
  }
  const Take t = take_from(stored, cost, capacity, refill_per_hour, now);
  c.query(kSaveBucket).args(key, t.bucket.tokens, t.bucket.updated_ms).run();
  return t.wait_ms;
}

const std::string kLoadCircuit =
    "SELECT state, failures, opened_ms, retry_at_ms, updated_ms FROM circuits WHERE name = ?1";
const std::string kSaveCircuit =
    "INSERT INTO circuits (name, state, failures, opened_ms, retry_at_ms, updated_ms) "
    "VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT (name) DO UPDATE SET state = excluded.state, "
    "failures = excluded.failures, opened_ms = excluded.opened_ms, "
    "retry_at_ms = excluded.retry_at_ms, updated_ms = excluded.updated_ms";

CircuitRecord load_circuit(Connection& c, const std::string& name) {
  CircuitRecord current;
  Query q = c.query(kLoadCircuit);
  q.args(name);
  if (q.step()) current = {q.text(0), q.i32(1), q.i64(2), q.i64(3), q.i64(4)};
  return current;
}

CircuitRecord update_circuit_record(
    Connection& c, const std::string& name,
    const std::function<CircuitRecord(const CircuitRecord&)>& next) {
  CircuitRecord updated = next(load_circuit(c, name));
  c.query(kSaveCircuit)
      .args(name, updated.state, updated.failures, updated.opened_ms, updated.retry_at_ms,
            updated.updated_ms)
      .run();
  return updated;
}

// --- dead letters --------------------------------------------------------------------------

const std::string kLoadLetter = "SELECT " + kLetterColumns + " FROM dead_letters WHERE id = ?1";
const std::string kRetryJob =
    "UPDATE jobs SET status = 'queued', attempts = 0, run_after_ms = ?2, finished_ms = 0, "
    "cancel_requested = 0, counted_in_parent = ?3, pending_children = pending_children + ?4, "
    "updated_ms = ?2 WHERE id = ?1";
// The children of a dead job that are active but counted by nobody: retried or enqueued while
// it was dead (a bulk retry takes a child that died after its parent first).
const std::string kAdoptChildren =
    "UPDATE jobs SET counted_in_parent = 1 WHERE parent_id = ?1 AND counted_in_parent = 0 "
    "AND status IN ('queued', 'running', 'waiting')";
const std::string kRetryLetter =
    "UPDATE dead_letters SET status = 'retrying', retries = retries + 1, updated_ms = ?2 "
    "WHERE id = ?1";
const std::string kIgnoreLetter =
    "UPDATE dead_letters SET status = 'ignored', updated_ms = ?2 WHERE id = ?1";

std::optional<DeadLetter> load_letter(Connection& c, int64_t id) {
  Query q = c.query(kLoadLetter);
  q.args(id);
  if (!q.step()) return std::nullopt;
  return read_letter(q);
}

DeadLetter load_existing_letter(Connection& c, int64_t id) {
  std::optional<DeadLetter> letter = load_letter(c, id);
  if (!letter) throw JobNotFound("dead letter " + std::to_string(id) + " not found");
  return *letter;
}

// Checks everything before writing anything, so that a refusal leaves no trace (the bulk retry
// skips refused letters inside one transaction).
JobState check_retryable(Connection& c, const DeadLetter& letter) {
  std::string name = "dead letter " + std::to_string(letter.id);
  if (letter.status != DeadLetterStatus::kPending && letter.status != DeadLetterStatus::kIgnored) {
    throw InvalidTransition(name + " is " + std::string(to_string(letter.status)));
  }
  std::optional<JobState> s = load_state(c, letter.job_id);
  if (!s) throw JobNotFound(name + ": job " + std::to_string(letter.job_id) + " was pruned");
  if (s->status != JobStatus::kDead) {
    throw InvalidTransition(name + ": job " + std::to_string(s->id) + " is " +
                            std::string(to_string(s->status)));
  }
  if (s->dedupe_key) {
    if (auto other = active_duplicate(c, s->kind, *s->dedupe_key)) {
      throw InvalidTransition(name + ": job " + std::to_string(*other) +
                              " is active with the same dedupe key");
    }
  }
  return *s;
}

// The job goes back to queued with attempts reset (counted again by an active parent), and counts
// its active children that nobody counted, so that it waits for them as for the others.
void retry_letter(Connection& c, const DeadLetter& letter, int64_t now) {
  JobState s = check_retryable(c, letter);
  bool counted = s.parent_id && count_child(c, *s.parent_id, now);
  const int64_t adopted = c.query(kAdoptChildren).args(s.id).run();
  c.query(kRetryJob).args(s.id, now, counted, adopted).run();
  c.query(kRetryLetter).args(letter.id, now).run();
}

void ignore_letter(Connection& c, int64_t id, int64_t now) {
  DeadLetter letter = load_existing_letter(c, id);
  if (letter.status == DeadLetterStatus::kIgnored) return;
  if (letter.status != DeadLetterStatus::kPending) {
    throw InvalidTransition("dead letter " + std::to_string(id) + " is " +
                            std::string(to_string(letter.status)));
  }
  c.query(kIgnoreLetter).args(id, now).run();
}

// Dynamic filters bind fixed parameter numbers; unused ones are bound but absent from the text.
std::string letter_filter(const DeadLetterQuery& q) {
  std::string sql = " WHERE 1 = 1";
  if (q.status) sql += " AND status = '" + std::string(to_string(*q.status)) + "'";
  if (q.kind) sql += " AND kind = ?2";
  if (q.concurrency_key) sql += " AND concurrency_key = ?3";
  if (q.before_id) sql += " AND id < ?4";
  return sql + " ORDER BY id DESC LIMIT ?5";
}

void bind_letter_filter(Query& query, const DeadLetterQuery& q, int64_t limit) {
  query.args(std::nullopt, q.kind, q.concurrency_key, q.before_id, limit);
}

// Pending letters are read newest first, a page at a time, until `limit` were retried: a letter
// that is refused (a duplicate is active, the job was pruned) stays pending and does not count.
int retry_letters(Connection& c, const DeadLetterQuery& query, size_t limit, int64_t now) {
  if (query.status && *query.status != DeadLetterStatus::kPending) return 0;
  DeadLetterQuery pending = query;
  pending.status = DeadLetterStatus::kPending;
  int retried = 0;
  while (static_cast<size_t>(retried) < limit) {
    const size_t want = limit - static_cast<size_t>(retried);
    std::vector<DeadLetter> letters;
    {
      Query q = c.query("SELECT " + kLetterColumns + " FROM dead_letters" + letter_filter(pending));
      bind_letter_filter(q, pending, page_probe_rows(want) - 1);
      while (q.step()) letters.push_back(read_letter(q));
    }
    for (const DeadLetter& letter : letters) {
      try {
        retry_letter(c, letter, now);
        ++retried;
      } catch (const InvalidTransition&) {  // e.g. a duplicate is active: stays pending
      } catch (const JobNotFound&) {
      }
    }
    if (letters.size() < want) break;  // no older pending letter matches
    pending.before_id = letters.back().id;
  }
  return retried;
}

// --- schema --------------------------------------------------------------------------------

int64_t wall_clock_ms() {
  // The one wall-clock read of the store: schema_migrations.applied_ms audits when an operator
  // upgraded; it is not job time, and migrate() takes no clock.
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Runs inside the writer's BEGIN IMMEDIATE transaction, so two processes migrating at once are
// serialized and the second finds the work done.
SchemaVersions migrate_schema(Connection& c) {
  c.exec(
      "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, "
      "name TEXT NOT NULL, applied_ms INTEGER NOT NULL)");
  std::map<int, std::string> applied;
  {
    Query q = c.query("SELECT version, name FROM schema_migrations");
    while (q.step()) applied.emplace(q.i32(0), q.text(1));
  }
  check_history("sqlite", applied, sqlite_migrations());
  SchemaVersions versions;
  versions.before = applied.empty() ? 0 : applied.rbegin()->first;
  for (const Migration& m : sqlite_migrations()) {
    if (applied.count(m.version)) continue;
    for (const std::string& statement : split_sql_statements(m.sql)) c.exec(statement);
    c.query("INSERT INTO schema_migrations (version, name, applied_ms) VALUES (?1, ?2, ?3)")
        .args(m.version, std::string_view(m.name), wall_clock_ms())
        .run();
  }
  Query q = c.query("SELECT COALESCE(MAX(version), 0) FROM schema_migrations");
  versions.after = q.step() ? q.i32(0) : 0;
  return versions;
}

// --- the store -----------------------------------------------------------------------------

sqlite::ConnectionOptions connection_options(const SqliteStoreOptions& options, bool reader) {
  sqlite::ConnectionOptions o;
  o.busy_timeout_ms = options.busy_timeout_ms;
  o.cache_kib = reader ? options.reader_cache_kib : options.writer_cache_kib;
  return o;
}

class SqliteStore final : public SqliteJobStore {
 public:
  SqliteStore(const std::string& path, const SqliteStoreOptions& options)
      : writer_(std::make_unique<Connection>(path, connection_options(options, false)),
                options.max_batch) {
    // An in-memory database is private to its connection: reads must use the writer's.
    if (options.readers > 0 && path != ":memory:") {
      readers_ = std::make_unique<sqlite::ReaderPool>(path, connection_options(options, true),
                                                      options.readers);
    }
    if (options.migrate) migrate();
  }

  SchemaVersions apply_migrations() override {
    return write([](Connection& c) { return migrate_schema(c); });
  }
  std::string backend() const override { return "sqlite"; }

  EnqueueResult enqueue(const JobSpec& spec, int64_t now_ms) override {
    if (auto problem = spec_problem(spec)) throw std::invalid_argument(*problem);
    EnqueueResult result =
        write([&](Connection& c) { return enqueue_one(c, spec, now_ms, fair_kinds(c)); });
    notify_runnable();
    return result;
  }
  std::vector<EnqueueResult> enqueue_batch(const std::vector<JobSpec>& specs,
                                           int64_t now_ms) override {
    check_specs(specs);
    auto results = write([&](Connection& c) { return enqueue_many(c, specs, now_ms); });
    notify_runnable();
    return results;
  }

  std::vector<Claimed> claim(const ClaimRequest& request) override {
    check_lease_ms("claim", request.lease_ms);
    return write([&](Connection& c) {
      int64_t steps = 0;
      std::vector<Claimed> claimed = claim_jobs(c, request, tokens_, steps);
      claim_read_steps_ += steps;
      return claimed;
    });
  }
  HeartbeatResult heartbeat(JobId id, const std::string& token, int64_t now_ms, int64_t lease_ms,
                            const std::optional<std::string>& checkpoint, bool progress) override {
    check_lease_ms("heartbeat", lease_ms);
    if (checkpoint) check_text("heartbeat: checkpoint", *checkpoint);
    return write([&](Connection& c) {
      return heartbeat_job(c, id, token, now_ms, lease_ms, checkpoint, progress);
    });
  }
  void complete(JobId id, const std::string& token, const std::string& result_json,
                int64_t now_ms) override {
    check_text("complete: result", result_json);
    write([&](Connection& c) { complete_job(c, id, token, result_json, now_ms); });
  }
  // Error text is written in its stored form (stored_error()), copied only when it is not so.
  JobStatus fail(JobId id, const std::string& token, const Failure& failure,
                 int64_t now_ms) override {
    std::optional<Failure> stored;
    if (!is_stored_error(failure.error)) {
      stored = failure;
      stored->error = stored_error(failure.error);
    }
    const Failure& f = stored ? *stored : failure;
    return write([&](Connection& c) { return fail_job(c, id, token, f, now_ms); });
  }
  void defer(JobId id, const std::string& token, int64_t run_after_ms, const std::string& reason,
             int64_t now_ms) override {
    std::optional<std::string> stored;
    if (!is_stored_error(reason)) stored = stored_error(reason);
    const std::string& why = stored ? *stored : reason;
    write([&](Connection& c) { return_job(c, id, token, run_after_ms, "deferred", why, now_ms); });
  }
  void release(JobId id, const std::string& token, int64_t now_ms) override {
    write(
        [&](Connection& c) { return_job(c, id, token, now_ms, "released", std::nullopt, now_ms); });
  }
  void wait_for_children(JobId id, const std::string& token, int64_t deadline_ms,
                         const std::optional<std::string>& checkpoint, int64_t now_ms) override {
    if (checkpoint) check_text("wait_for_children: checkpoint", *checkpoint);
    write([&](Connection& c) { wait_job(c, id, token, deadline_ms, checkpoint, now_ms); });
  }
  std::vector<FinishResult> finish(const std::vector<Finish>& items, int64_t now_ms) override {
    if (items.empty()) return {};
    auto stored = [](const Finish& f) {
      return is_stored_error(f.failure.error) && is_stored_error(f.reason);
    };
    std::vector<Finish> copy;
    if (!std::all_of(items.begin(), items.end(), stored)) {
      copy = items;
      for (Finish& f : copy) {
        f.failure.error = stored_error(f.failure.error);
        f.reason = stored_error(f.reason);
      }
    }
    const std::vector<Finish>& ends = copy.empty() ? items : copy;
    return write([&](Connection& c) { return finish_jobs(c, ends, now_ms); });
  }

  SweepResult recover_owner(const std::string& owner, int64_t now_ms) override {
    return write([&](Connection& c) { return recover_owned(c, owner, now_ms); });
  }
  SweepResult sweep(int64_t now_ms) override {
    return write([&](Connection& c) { return sweep_jobs(c, now_ms); });
  }
  // Deletes in chunks, each its own operation, so that a large retention pass never holds the
  // writer for long; each chunk is atomic.
  using JobStore::prune;
  int64_t prune(int64_t finished_before_ms, int64_t max_jobs) override {
    int64_t total = 0;
    while (total < max_jobs) {
      const int64_t chunk = std::min(kPruneChunk, max_jobs - total);
      int64_t n = write(
          [&](Connection& c) { return c.query(kPruneSql).args(finished_before_ms, chunk).run(); });
      total += n;
      if (n < chunk) break;
    }
    return total;
  }

  CancelOutcome cancel(JobId id, int64_t now_ms) override {
    return write([&](Connection& c) { return cancel_job(c, id, now_ms); });
  }
  int cancel_key(const std::string& concurrency_key, const std::string& kind,
                 int64_t now_ms) override {
    return write([&](Connection& c) { return cancel_key_jobs(c, concurrency_key, kind, now_ms); });
  }

  std::optional<Job> get(JobId id) override;
  JobPage list(const JobQuery& query) override;
  std::vector<Attempt> newest_attempts(JobId id, size_t limit) override;
  std::map<std::pair<std::string, JobStatus>, int64_t> counts() override;
  std::map<std::string, int64_t> queued_by_kind() override;
  void set_checkpoint(JobId id, const std::optional<std::string>& checkpoint,
                      int64_t now_ms) override {
    if (checkpoint) check_text("set_checkpoint: checkpoint", *checkpoint);
    write([&](Connection& c) { set_job_checkpoint(c, id, checkpoint, now_ms); });
  }

  void set_caps(const std::string& kind, Caps caps) override;
  std::map<std::string, Caps> caps() override {
    return read([](Connection& c) { return read_caps(c); });
  }
  int max_running_seen(const std::string& kind, const std::string& concurrency_key) override {
    return running_column(kind, concurrency_key, "max_running");
  }
  int running(const std::string& kind, const std::string& concurrency_key) override {
    return running_column(kind, concurrency_key, "running");
  }

  int64_t take_tokens(const std::string& key, double cost, double capacity, double refill_per_hour,
                      int64_t now_ms) override {
    return write([&](Connection& c) {
      return take_bucket_tokens(c, key, cost, capacity, refill_per_hour, now_ms);
    });
  }
  CircuitRecord update_circuit(
      const std::string& name,
      const std::function<CircuitRecord(const CircuitRecord&)>& next) override {
    return write([&](Connection& c) { return update_circuit_record(c, name, next); });
  }
  CircuitRecord circuit(const std::string& name) override {
    return read([&](Connection& c) { return load_circuit(c, name); });
  }

  DeadLetterPage list_dead_letters(const DeadLetterQuery& query) override;
  std::optional<DeadLetter> get_dead_letter(int64_t id) override {
    return read([&](Connection& c) { return load_letter(c, id); });
  }
  std::map<std::pair<std::string, DeadLetterStatus>, int64_t> dead_letter_stats() override;
  void retry_dead_letter(int64_t id, int64_t now_ms) override {
    write([&](Connection& c) { retry_letter(c, load_existing_letter(c, id), now_ms); });
    notify_runnable();
  }
  int retry_dead_letters(const DeadLetterQuery& query, size_t limit, int64_t now_ms) override {
    int n = write([&](Connection& c) { return retry_letters(c, query, limit, now_ms); });
    if (n > 0) notify_runnable();
    return n;
  }
  void ignore_dead_letter(int64_t id, int64_t now_ms) override {
    write([&](Connection& c) { ignore_letter(c, id, now_ms); });
  }
  int64_t purge_dead_letters(int64_t updated_before_ms) override {
    return write([&](Connection& c) {
      return c
          .query(
              "DELETE FROM dead_letters WHERE status IN ('resolved', 'ignored') "
              "AND updated_ms < ?1")
          .args(updated_before_ms)
          .run();
    });
  }

  std::string writer_pragma(const std::string& name) override {
    return write([&](Connection& c) { return c.pragma(name); });
  }
  SqliteStoreStats stats() const override {
    sqlite::WriterStats s = writer_.stats();
    return {s.transactions, s.operations, s.max_batch, claim_read_steps_.load()};
  }

 private:
  template <class Op>
  auto write(Op&& op) -> std::invoke_result_t<Op&, Connection&> {
    return writer_.run(std::forward<Op>(op));
  }
  // Reads use a pooled reader connection (concurrent with the writer under WAL), or the writer
  // when there is no pool.
  template <class Op>
  auto read(Op&& op) -> std::invoke_result_t<Op&, Connection&> {
    if (readers_) return readers_->run(std::forward<Op>(op));
    return writer_.run(std::forward<Op>(op));
  }

  int running_column(const std::string& kind, const std::string& key, const char* column);

  TokenSource tokens_;  // before writer_: claim operations use it on the writer thread
  std::atomic<int64_t> claim_read_steps_{0};
  std::unique_ptr<sqlite::ReaderPool> readers_;
  sqlite::GroupCommitWriter writer_;
};

// The status as a literal (statuses come from the enum, never from user text), so that the
// planner can match the partial indexes, which a bound parameter would hide from it.
std::string status_filter(JobStatus status) {
  std::string literal = "'" + std::string(to_string(status)) + "'";
  if (!is_terminal(status)) return " AND status = " + literal;
  return " AND status = " + literal + " AND status IN ('succeeded', 'dead', 'cancelled')";
}

// Each part is a covering scan of one partial index, not of the table (queued jobs are in two:
// jobs_claim_kind and jobs_claim_key, which kQueuedCounts alone reads, for readiness).
const std::string kQueuedCounts =
    "SELECT kind, 'queued', COUNT(*) FROM jobs WHERE status = 'queued' AND fair = 0 GROUP BY kind "
    "UNION ALL SELECT kind, 'queued', COUNT(*) FROM jobs WHERE status = 'queued' AND fair = 1 "
    "GROUP BY kind";
const std::string kCounts =
    kQueuedCounts +
    " UNION ALL SELECT kind, 'running', COUNT(*) FROM jobs WHERE status = 'running' GROUP BY kind "
    "UNION ALL SELECT kind, 'waiting', COUNT(*) FROM jobs WHERE status = 'waiting' GROUP BY kind "
    "UNION ALL SELECT kind, status, COUNT(*) FROM jobs "
    "WHERE status IN ('succeeded', 'dead', 'cancelled') GROUP BY kind, status";

std::optional<Job> SqliteStore::get(JobId id) {
  return read([&](Connection& c) -> std::optional<Job> {
    Query q = c.query("SELECT " + kJobColumns + " FROM jobs WHERE id = ?1");
    q.args(id);
    if (!q.step()) return std::nullopt;
    return read_job(q);
  });
}

JobPage SqliteStore::list(const JobQuery& query) {
  if (query.limit == 0) return {};
  std::string sql = "SELECT " + kJobColumns + " FROM jobs WHERE 1 = 1";
  if (query.status) sql += status_filter(*query.status);
  if (query.kind) sql += " AND kind = ?2";
  if (query.concurrency_key) sql += " AND concurrency_key = ?3";
  if (query.parent_id) sql += " AND parent_id = ?4";
  if (query.before_id) sql += " AND id < ?5";
  sql += " ORDER BY id DESC LIMIT ?6";
  return read([&](Connection& c) {
    Query q = c.query(sql);
    // One row more than asked tells whether another page exists.
    q.args(std::nullopt, query.kind, query.concurrency_key, query.parent_id, query.before_id,
           page_probe_rows(query.limit));
    JobPage page;
    while (q.step()) page.jobs.push_back(read_job(q));
    if (page.jobs.size() > query.limit) {
      page.jobs.pop_back();
      page.next_before = page.jobs.back().id;
    }
    return page;
  });
}

std::vector<Attempt> SqliteStore::newest_attempts(JobId id, size_t limit) {
  // SQLite's LIMIT is an int64; a negative one is no limit.
  const int64_t rows = limit > static_cast<size_t>(INT64_MAX) ? -1 : static_cast<int64_t>(limit);
  return read([&](Connection& c) {
    std::vector<Attempt> out;
    // The attempts with a row, then the one the job row holds: a running attempt, or a
    // successful last one (end_successful_attempt() writes no row). One statement: one
    // snapshot.
    Query q = c.query(
        "SELECT seq, attempt, owner, started_ms, finished_ms, outcome, error FROM attempts "
        "WHERE job_id = ?1 UNION ALL "
        "SELECT claims, attempt_no, lease_owner, started_ms, "
        "CASE status WHEN 'running' THEN 0 ELSE finished_ms END, status, NULL FROM jobs "
        "WHERE id = ?1 AND status IN ('running', 'succeeded') AND lease_owner IS NOT NULL "
        "AND NOT EXISTS (SELECT 1 FROM attempts a WHERE a.job_id = jobs.id "
        "AND a.seq = jobs.claims) ORDER BY 1 DESC LIMIT ?2");
    q.args(id, rows);
    while (q.step()) {
      out.push_back({id, q.i32(1), q.text(2), q.i64(3), q.i64(4), q.text(5), q.opt_text(6)});
    }
    std::reverse(out.begin(), out.end());
    return out;
  });
}

std::map<std::string, int64_t> SqliteStore::queued_by_kind() {
  return read([](Connection& c) {
    std::map<std::string, int64_t> out;
    Query q = c.query(kQueuedCounts);
    while (q.step()) out[q.text(0)] += q.i64(2);
    return out;
  });
}

std::map<std::pair<std::string, JobStatus>, int64_t> SqliteStore::counts() {
  return read([](Connection& c) {
    std::map<std::pair<std::string, JobStatus>, int64_t> out;
    Query q = c.query(kCounts);
    while (q.step()) out[{q.text(0), status_from(q.text(1))}] += q.i64(2);
    return out;
  });
}

void SqliteStore::set_caps(const std::string& kind, Caps caps) {
  write([&](Connection& c) {
    const bool was_fair = fair_kinds(c).count(kind) > 0;
    c.query(
         "INSERT INTO caps (kind, per_key_cap, global_cap) VALUES (?1, ?2, ?3) "
         "ON CONFLICT (kind) DO UPDATE SET per_key_cap = excluded.per_key_cap, "
         "global_cap = excluded.global_cap")
        .args(kind, std::max(caps.per_key, 0), std::max(caps.global, 0))
        .run();
    const bool fair = caps.per_key > 0;
    if (fair == was_fair) return;
    // The kind's jobs that are or may again be queued move to the other claim index. One
    // statement per status (a literal), each through that status's partial index.
    for (const char* status : {"queued", "running", "waiting", "dead"}) {
      c.query("UPDATE jobs SET fair = ?2 WHERE status = '" + std::string(status) +
              "' AND kind = ?1")
          .args(kind, fair)
          .run();
    }
  });
}

// "" means the whole kind (the total row); any other key its own row.
int SqliteStore::running_column(const std::string& kind, const std::string& key,
                                const char* column) {
  std::string sql = std::string("SELECT ") + column +
                    " FROM running_counts WHERE kind = ?1 AND total = ?2 AND concurrency_key = ?3";
  return read([&](Connection& c) {
    Query q = c.query(sql);
    q.args(kind, key.empty(), key);
    return q.step() ? q.i32(0) : 0;
  });
}

DeadLetterPage SqliteStore::list_dead_letters(const DeadLetterQuery& query) {
  if (query.limit == 0) return {};
  return read([&](Connection& c) {
    Query q = c.query("SELECT " + kLetterColumns + " FROM dead_letters" + letter_filter(query));
    bind_letter_filter(q, query, page_probe_rows(query.limit));
    DeadLetterPage page;
    while (q.step()) page.items.push_back(read_letter(q));
    if (page.items.size() > query.limit) {
      page.items.pop_back();
      page.next_before = page.items.back().id;
    }
    return page;
  });
}

std::map<std::pair<std::string, DeadLetterStatus>, int64_t> SqliteStore::dead_letter_stats() {
  return read([](Connection& c) {
    std::map<std::pair<std::string, DeadLetterStatus>, int64_t> out;
    Query q = c.query("SELECT kind, status, COUNT(*) FROM dead_letters GROUP BY kind, status");
    while (q.step()) out[{q.text(0), letter_status_from(q.text(1))}] = q.i64(2);
    return out;
  });
}

}  // namespace

namespace detail {
std::vector<std::string> claim_read_statements() {
  std::vector<std::string> out;
  for (const DueSql* sql : {&kDueOfKind, &kDueOfKey}) {
    for (const std::string* statement : {&sql->at, &sql->first, &sql->from}) {
      out.push_back(*statement);
    }
  }
  return out;
}
}  // namespace detail

std::unique_ptr<SqliteJobStore> open_sqlite_store(const std::string& path,
                                                  const SqliteStoreOptions& options) {
  return std::make_unique<SqliteStore>(path, options);
}

std::unique_ptr<JobStore> open_sqlite_store(const std::string& path) {
  return open_sqlite_store(path, SqliteStoreOptions{});
}

}  // namespace backhaul::jobs
