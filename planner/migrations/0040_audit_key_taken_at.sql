-- When the log took its current key (migration 0039) in a rotation, by the
-- database's clock, and the key it took it from: a planner moving the log on
-- from that key (a second rotation) waits until `ROTATION_SETTLE` after it
-- (planner/src/audit/log.rs), so that the rows the planners on the key
-- before it wrote as they stopped are sealed first by the planners holding
-- it as their previous key, unless the moving planner holds that key itself
-- (a rollback). Both NULL when the log took its first key, or none yet.
ALTER TABLE audit_log_state
    ADD COLUMN signing_key_taken_at TIMESTAMPTZ,
    ADD COLUMN signing_key_from TEXT;
