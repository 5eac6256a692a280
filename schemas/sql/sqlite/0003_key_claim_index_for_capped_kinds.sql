-- The per-key claim index holds only the queued jobs of kinds with a per-key cap (fair = 1):
-- jobs of other kinds are claimed through jobs_claim_kind alone, so their enqueue and claim no
-- longer write a second claim index (measured: about a fifth of each statement's cost).
-- jobs.fair = (the kind's per_key_cap > 0): set by enqueue, and by set_caps for the kind's jobs
-- that can still be queued (queued, running, waiting, and dead ones a retry requeues).

ALTER TABLE jobs ADD COLUMN fair INTEGER NOT NULL DEFAULT 0;

UPDATE jobs SET fair = 1
  WHERE kind IN (SELECT kind FROM caps WHERE per_key_cap > 0)
    AND status IN ('queued', 'running', 'waiting', 'dead');

DROP INDEX jobs_claim_key;

CREATE INDEX jobs_claim_key ON jobs (kind, concurrency_key, priority, run_after_ms, id)
  WHERE status = 'queued' AND fair = 1;
