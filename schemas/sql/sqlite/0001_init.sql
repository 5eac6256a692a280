-- Backhaul job queue, SQLite backend (SPEC D1-D14; DESIGN.md "The queue").
-- Times are Unix milliseconds from the injected clock. Statuses are text so that the file reads
-- well in the sqlite3 shell. Statements end with ";" at the end of a line (split_sql_statements).

CREATE TABLE jobs (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  kind TEXT NOT NULL,
  concurrency_key TEXT NOT NULL DEFAULT '',
  dedupe_key TEXT,
  status TEXT NOT NULL CHECK (status IN ('queued', 'running', 'waiting', 'succeeded', 'dead', 'cancelled')),
  priority INTEGER NOT NULL DEFAULT 0,
  attempts INTEGER NOT NULL DEFAULT 0,
  max_attempts INTEGER NOT NULL,
  run_after_ms INTEGER NOT NULL,
  lease_owner TEXT,
  lease_token TEXT,
  lease_expires_ms INTEGER NOT NULL DEFAULT 0,
  parent_id INTEGER REFERENCES jobs (id) ON DELETE SET NULL,
  pending_children INTEGER NOT NULL DEFAULT 0,
  -- 1 while this job is counted in its parent's pending_children: the child's terminal
  -- transaction decrements the parent only when it is 1, and sets it to 0 (exactly once).
  counted_in_parent INTEGER NOT NULL DEFAULT 0,
  wait_deadline_ms INTEGER NOT NULL DEFAULT 0,
  timeout_ms INTEGER NOT NULL DEFAULT 0,
  cancel_requested INTEGER NOT NULL DEFAULT 0,
  -- Claims ever made (attempt rows written, refunded ones included): the open attempt row's seq.
  claims INTEGER NOT NULL DEFAULT 0,
  dead_letter_id INTEGER,
  created_ms INTEGER NOT NULL,
  started_ms INTEGER NOT NULL DEFAULT 0,
  finished_ms INTEGER NOT NULL DEFAULT 0,
  updated_ms INTEGER NOT NULL,
  payload TEXT NOT NULL,
  checkpoint TEXT,
  result TEXT,
  last_error TEXT
);

-- Claim order among runnable jobs of a kind: (priority, run_after, id). Partial, so that the
-- index only holds queued jobs however many finished ones are kept.
CREATE INDEX jobs_claim_kind ON jobs (kind, priority, run_after_ms, id) WHERE status = 'queued';

-- The same per concurrency key: a kind with a per-key cap takes each key's head by a seek, so a
-- saturated key's backlog is never scanned (fairness, SPEC D7).
CREATE INDEX jobs_claim_key ON jobs (kind, concurrency_key, priority, run_after_ms, id)
  WHERE status = 'queued';

-- Running and waiting jobs by kind. Keyed on columns that never change, so that a heartbeat
-- (which moves lease_expires_ms) rewrites no index page: the sweep scans these few rows.
CREATE INDEX jobs_running ON jobs (kind) WHERE status = 'running';
CREATE INDEX jobs_waiting ON jobs (kind) WHERE status = 'waiting';

-- Retention (prune by finished time), listing of finished jobs, counts() of finished jobs.
CREATE INDEX jobs_finished ON jobs (status, finished_ms, kind)
  WHERE status IN ('succeeded', 'dead', 'cancelled');

-- cancel_key and listing by key. No status column: the entry is written once, at enqueue.
CREATE INDEX jobs_key ON jobs (concurrency_key, kind);

-- Fan-in: a parent's children (cancellation, listing, the ON DELETE SET NULL check).
CREATE INDEX jobs_parent ON jobs (parent_id) WHERE parent_id IS NOT NULL;

-- At most one active job per (kind, dedupe_key) (SPEC D10).
CREATE UNIQUE INDEX jobs_dedupe ON jobs (kind, dedupe_key)
  WHERE dedupe_key IS NOT NULL AND status IN ('queued', 'running', 'waiting');

-- One row per claim. attempt is the counted attempt number at claim time (a refunded attempt,
-- such as a deferral, is followed by a row with the same number); seq orders the rows.
CREATE TABLE attempts (
  job_id INTEGER NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
  seq INTEGER NOT NULL,
  attempt INTEGER NOT NULL,
  owner TEXT NOT NULL,
  started_ms INTEGER NOT NULL,
  finished_ms INTEGER NOT NULL DEFAULT 0,
  outcome TEXT NOT NULL DEFAULT 'running',
  error TEXT,
  PRIMARY KEY (job_id, seq)
) WITHOUT ROWID;

-- Dead letters (SPEC D5), kept in step with their job. No foreign key: a letter outlives the
-- pruned job until purge_dead_letters removes it.
CREATE TABLE dead_letters (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  job_id INTEGER NOT NULL UNIQUE,
  kind TEXT NOT NULL,
  concurrency_key TEXT NOT NULL,
  status TEXT NOT NULL CHECK (status IN ('pending', 'retrying', 'resolved', 'ignored')),
  error TEXT NOT NULL,
  retries INTEGER NOT NULL DEFAULT 0,
  created_ms INTEGER NOT NULL,
  updated_ms INTEGER NOT NULL
);
CREATE INDEX dead_letters_status ON dead_letters (status, kind, concurrency_key);
CREATE INDEX dead_letters_kind ON dead_letters (kind, status);
CREATE INDEX dead_letters_purge ON dead_letters (updated_ms) WHERE status IN ('resolved', 'ignored');

-- Concurrency caps per kind (SPEC D7); 0 = unlimited.
CREATE TABLE caps (
  kind TEXT PRIMARY KEY,
  per_key_cap INTEGER NOT NULL DEFAULT 0,
  global_cap INTEGER NOT NULL DEFAULT 0
) WITHOUT ROWID;

-- Running jobs per (kind, concurrency key) (total = 0) and per kind (total = 1, key ''),
-- maintained in the transactions that move jobs in and out of running; max_running is the
-- high-water mark recorded at claim time. One table, so a kind's rows share a page.
CREATE TABLE running_counts (
  kind TEXT NOT NULL,
  total INTEGER NOT NULL,
  concurrency_key TEXT NOT NULL,
  running INTEGER NOT NULL DEFAULT 0,
  max_running INTEGER NOT NULL DEFAULT 0,
  PRIMARY KEY (kind, total, concurrency_key)
) WITHOUT ROWID;

-- Token buckets (SPEC D8), shared by every host on the store.
CREATE TABLE throttle_buckets (
  bucket_key TEXT PRIMARY KEY,
  tokens REAL NOT NULL,
  updated_ms INTEGER NOT NULL
) WITHOUT ROWID;

-- Circuit breakers (SPEC E4), shared by every host on the store.
CREATE TABLE circuits (
  name TEXT PRIMARY KEY,
  state TEXT NOT NULL,
  failures INTEGER NOT NULL,
  opened_ms INTEGER NOT NULL,
  retry_at_ms INTEGER NOT NULL,
  updated_ms INTEGER NOT NULL
) WITHOUT ROWID;
