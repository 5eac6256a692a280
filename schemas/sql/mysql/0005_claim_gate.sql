-- Setting a cap waits for the claims in flight. A claim of a kind without caps locks no job_caps
-- row (there is none to lock), so a cap set while such a claim had locked jobs of the kind but
-- not committed could be overrun: a claim on another host counted the kind's running jobs
-- without those, and took the whole cap on top of them. Every claim now holds the one row of
-- claim_gate in share mode for its whole transaction, and set_caps takes it exclusively first:
-- it waits for the claims in flight, and the claims after it see the cap. Claims do not wait for
-- each other on it (share locks), only for a set_caps.

CREATE TABLE IF NOT EXISTS claim_gate (
  id TINYINT NOT NULL,
  PRIMARY KEY (id)
) ENGINE = InnoDB;

INSERT IGNORE INTO claim_gate (id) VALUES (1);
