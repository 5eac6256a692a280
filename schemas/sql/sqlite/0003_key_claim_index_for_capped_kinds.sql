-- Each queued job is in one claim index: jobs_claim_kind for kinds without a per-key cap
-- (fair = 0), jobs_claim_key for kinds with one (fair = 1), so that an enqueue and a claim write
-- one claim index, not two (measured: about a fifth of each statement's cost).
-- jobs.fair = (the kind's per_key_cap > 0): set by enqueue, and by set_caps for the kind's jobs
-- that can still be queued (queued, running, waiting, and dead ones a retry requeues).

ALTER TABLE jobs ADD COLUMN fair INTEGER NOT NULL DEFAULT 0;

UPDATE jobs SET fair = 1
  WHERE kind IN (SELECT kind FROM caps WHERE per_key_cap > 0)
    AND status IN ('queued', 'running', 'waiting', 'dead');

DROP INDEX jobs_claim_kind;

CREATE INDEX jobs_claim_kind ON jobs (kind, priority, run_after_ms, id)
  WHERE status = 'queued' AND fair = 0;

DROP INDEX jobs_claim_key;

CREATE INDEX jobs_claim_key ON jobs (kind, concurrency_key, priority, run_after_ms, id)
  WHERE status = 'queued' AND fair = 1;
