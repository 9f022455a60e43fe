-- Capture batches: the unit acked together on the broker. A redelivered
-- message can only be a copy of a dead letter whose batch was committed but
-- never acked (the planner died between commit and ack) by an earlier capture
-- session; each such stored row absorbs at most one redelivery.
CREATE TABLE capture_batches (
    id         BIGINT      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    session    UUID        NOT NULL,
    source     TEXT        NOT NULL,
    acked      BOOLEAN     NOT NULL DEFAULT false,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX capture_batches_unacked ON capture_batches (id) WHERE NOT acked;

ALTER TABLE dead_letters ADD COLUMN capture_batch BIGINT REFERENCES capture_batches (id);
CREATE INDEX dead_letters_capture_batch ON dead_letters (capture_batch);
