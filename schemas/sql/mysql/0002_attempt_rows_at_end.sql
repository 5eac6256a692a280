-- An attempt row is written once, when the attempt ends, instead of being opened by the claim
-- and updated at its end: two writes per attempt become one. The running attempt is read from
-- the job row (owner = lease_owner, lease_token, started_ms) and attempt_no, the counted attempt
-- number at claim time (a checkpoint resets jobs.attempts during the attempt). Each statement
-- can run again after a crash halfway (the runner skips an ADD COLUMN that already happened).

ALTER TABLE jobs ADD COLUMN attempt_no INT NOT NULL DEFAULT 0;

-- Jobs running across the upgrade: their open row moves into the job row.
UPDATE jobs j JOIN job_attempts a ON a.job_id = j.id AND a.lease_token = j.lease_token
  SET j.attempt_no = a.attempt
  WHERE j.status = 'running' AND a.outcome = 'running';

DELETE a FROM job_attempts a JOIN jobs j ON a.job_id = j.id AND a.lease_token = j.lease_token
  WHERE j.status = 'running' AND a.outcome = 'running';
