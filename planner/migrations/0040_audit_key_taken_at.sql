-- When the log took its current key (migration 0039), by the database's
-- clock: a planner moving the log on from that key (a second rotation)
-- waits until `ROTATION_SETTLE` after it (planner/src/audit/log.rs), so
-- that the rows the planners on the key before it wrote as they stopped
-- are sealed by the planners holding it as their previous key first.
-- NULL until a planner takes the log for a key.
ALTER TABLE audit_log_state ADD COLUMN signing_key_taken_at TIMESTAMPTZ;
