-- Canary observation and gates.
ALTER TABLE plans ADD COLUMN observing_until TIMESTAMPTZ;
-- Failures and re-dead-letters count from here (set on resume and promote, so
-- that an operator who resumed after a gate paused the plan is not paused again
-- by the same evidence).
ALTER TABLE plans ADD COLUMN gates_since TIMESTAMPTZ;
