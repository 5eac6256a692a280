-- An attempt row is written once, when the attempt ends, instead of being opened by the claim
-- and updated at its end: two writes per attempt become one. The running attempt is read from
-- the job row (seq = claims, owner = lease_owner, started_ms) and attempt_no, the counted attempt
-- number at claim time (a checkpoint resets jobs.attempts during the attempt).

ALTER TABLE jobs ADD COLUMN attempt_no INTEGER NOT NULL DEFAULT 0;

-- Jobs running across the upgrade keep the row their claim opened; its end updates that row.
UPDATE jobs SET attempt_no = COALESCE(
    (SELECT a.attempt FROM attempts a WHERE a.job_id = jobs.id AND a.seq = jobs.claims), attempts)
  WHERE status = 'running';
