-- An ordered plan publishes in dead-letter order across all its executors:
-- a slice can be claimed only once every earlier slice of its plan is
-- completed (docs/replay.md, "Order").
ALTER TABLE plans ADD COLUMN ordered BOOLEAN NOT NULL DEFAULT false;
