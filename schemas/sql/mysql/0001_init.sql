-- Backhaul job queue, MySQL 8 / MariaDB 10.6+ backend (SPEC D1-D14; DESIGN.md "The queue").
-- InnoDB, utf8mb4. Times are Unix milliseconds from the injected clock. Statuses are text so that
-- the tables read well in the mysql shell. Statements end with ";" at the end of a line
-- (split_sql_statements); DDL commits implicitly, so every statement is written to be re-runnable
-- after a crash halfway through (IF NOT EXISTS).
--
-- Identifiers (kinds, keys, owners, names) are VARBINARY: compared byte for byte like SQLite's
-- TEXT, with no case folding and no trailing-space padding (utf8mb4_bin pads on MariaDB). Large
-- texts are MEDIUMTEXT (16 MiB), never LONGTEXT/JSON (see env-recipe.md section 4).

CREATE TABLE IF NOT EXISTS jobs (
  id BIGINT NOT NULL AUTO_INCREMENT,
  kind VARBINARY(255) NOT NULL,
  concurrency_key VARBINARY(1024) NOT NULL DEFAULT '',
  dedupe_key VARBINARY(1024) NULL,
  -- = dedupe_key while the job is active (queued, running, waiting), NULL once it is terminal:
  -- the unique index below then allows one active job per (kind, dedupe_key) (SPEC D10).
  active_dedupe_key VARBINARY(1024) NULL,
  status VARCHAR(16) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  priority INT NOT NULL DEFAULT 0,
  attempts INT NOT NULL DEFAULT 0,
  max_attempts INT NOT NULL,
  run_after_ms BIGINT NOT NULL,
  lease_owner VARBINARY(255) NULL,
  lease_token VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NULL,
  lease_expires_ms BIGINT NOT NULL DEFAULT 0,
  parent_id BIGINT NULL,
  -- Active children counted in this job: a child with counted_in_parent = 1 decrements it in the
  -- transaction that makes the child terminal, and clears its flag (exactly once).
  pending_children INT NOT NULL DEFAULT 0,
  counted_in_parent TINYINT NOT NULL DEFAULT 0,
  wait_deadline_ms BIGINT NOT NULL DEFAULT 0,
  timeout_ms BIGINT NOT NULL DEFAULT 0,
  cancel_requested TINYINT NOT NULL DEFAULT 0,
  dead_letter_id BIGINT NULL,
  created_ms BIGINT NOT NULL,
  started_ms BIGINT NOT NULL DEFAULT 0,
  finished_ms BIGINT NOT NULL DEFAULT 0,
  updated_ms BIGINT NOT NULL,
  payload MEDIUMTEXT NOT NULL,
  checkpoint MEDIUMTEXT NULL,
  result MEDIUMTEXT NULL,
  last_error TEXT NULL,
  PRIMARY KEY (id),
  UNIQUE KEY jobs_active_dedupe (kind, active_dedupe_key),
  -- Claim order of uncapped kinds: FOR UPDATE SKIP LOCKED walks this in (priority, run_after, id).
  KEY jobs_claim (status, priority, run_after_ms, id),
  -- Capped kinds: running counts per key and kind (a covering range), the distinct queued keys
  -- (loose index scan) and each key's head in claim order (fair share, SPEC D7).
  KEY jobs_claim_key (status, kind, concurrency_key, priority, run_after_ms, id),
  -- Retention (prune): set once, when the job becomes terminal.
  KEY jobs_finished (finished_ms),
  -- cancel_key and listing by key; fan-in (children of a parent).
  KEY jobs_key (concurrency_key, kind),
  KEY jobs_parent (parent_id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_unicode_ci;

-- One row per claim, closed by whatever ends the attempt. `attempt` is the counted attempt number
-- at claim time (a refunded attempt, such as a deferral, is followed by a row with the same
-- number); lease_token identifies the open row of a running job; id orders the history.
CREATE TABLE IF NOT EXISTS job_attempts (
  id BIGINT NOT NULL AUTO_INCREMENT,
  job_id BIGINT NOT NULL,
  attempt INT NOT NULL,
  owner VARBINARY(255) NOT NULL,
  lease_token VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  started_ms BIGINT NOT NULL,
  finished_ms BIGINT NOT NULL DEFAULT 0,
  outcome VARCHAR(32) CHARACTER SET ascii COLLATE ascii_bin NOT NULL DEFAULT 'running',
  error TEXT NULL,
  PRIMARY KEY (id),
  KEY job_attempts_job (job_id, lease_token)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_unicode_ci;

-- Dead letters (SPEC D5), kept in step with their job. No foreign key: a letter outlives the
-- pruned job until purge_dead_letters removes it.
CREATE TABLE IF NOT EXISTS dead_letters (
  id BIGINT NOT NULL AUTO_INCREMENT,
  job_id BIGINT NOT NULL,
  kind VARBINARY(255) NOT NULL,
  concurrency_key VARBINARY(1024) NOT NULL,
  status VARCHAR(16) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  error TEXT NOT NULL,
  retries INT NOT NULL DEFAULT 0,
  created_ms BIGINT NOT NULL,
  updated_ms BIGINT NOT NULL,
  PRIMARY KEY (id),
  UNIQUE KEY dead_letters_job (job_id),
  KEY dead_letters_status (status, kind, concurrency_key),
  KEY dead_letters_kind (kind, status),
  KEY dead_letters_updated (updated_ms)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_unicode_ci;

-- Concurrency caps per kind (SPEC D7); 0 = unlimited. The row of a capped kind is also the lock
-- that serializes claims of that kind across hosts (locked FOR UPDATE in kind order), so that the
-- running jobs a claim COUNTs cannot change under it.
CREATE TABLE IF NOT EXISTS job_caps (
  kind VARBINARY(255) NOT NULL,
  per_key_cap INT NOT NULL DEFAULT 0,
  global_cap INT NOT NULL DEFAULT 0,
  PRIMARY KEY (kind)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_unicode_ci;

-- Running jobs per (kind, concurrency key) and per kind, with their high-water marks recorded at
-- claim time: +n in the claim, -1 in every exit from running. Their statements come last in each
-- transaction (sorted: keys, then kinds), so these shared rows are locked only while the COMMIT
-- runs and never while waiting for another lock. Caps do not trust them: claims COUNT.
CREATE TABLE IF NOT EXISTS running_counts (
  kind VARBINARY(255) NOT NULL,
  concurrency_key VARBINARY(1024) NOT NULL,
  running INT NOT NULL DEFAULT 0,
  max_running INT NOT NULL DEFAULT 0,
  PRIMARY KEY (kind, concurrency_key)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_unicode_ci;
CREATE TABLE IF NOT EXISTS running_totals (
  kind VARBINARY(255) NOT NULL,
  running INT NOT NULL DEFAULT 0,
  max_running INT NOT NULL DEFAULT 0,
  PRIMARY KEY (kind)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_unicode_ci;

-- Token buckets (SPEC D8), shared by every host on the store.
CREATE TABLE IF NOT EXISTS throttle_buckets (
  bucket_key VARBINARY(1024) NOT NULL,
  tokens DOUBLE NOT NULL,
  updated_ms BIGINT NOT NULL,
  PRIMARY KEY (bucket_key)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_unicode_ci;

-- Circuit breakers (SPEC E4), shared by every host on the store.
CREATE TABLE IF NOT EXISTS circuits (
  name VARBINARY(1024) NOT NULL,
  state VARCHAR(16) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  failures INT NOT NULL,
  opened_ms BIGINT NOT NULL,
  retry_at_ms BIGINT NOT NULL,
  updated_ms BIGINT NOT NULL,
  PRIMARY KEY (name)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_unicode_ci;
