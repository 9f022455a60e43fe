-- When a dead letter first died (earliest x-death entry): the age of a message
-- without an event time counts from here (precheck, stale verdict).
ALTER TABLE dead_letters ADD COLUMN first_died_at TIMESTAMPTZ;
UPDATE dead_letters SET first_died_at = died_at WHERE first_died_at IS NULL;
ALTER TABLE dead_letters ALTER COLUMN first_died_at SET NOT NULL;

-- Message keys replayed successfully (written by executors' confirmed sends):
-- a later precheck classifies them already_replayed within its window.
CREATE TABLE replayed_keys (
    message_key    TEXT        NOT NULL,
    plan_id        UUID        NOT NULL,
    dead_letter_id BIGINT      NOT NULL,
    replayed_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (message_key, plan_id)
);
CREATE INDEX replayed_keys_replayed_at ON replayed_keys (replayed_at);

-- A precheck: the dry run over a selector. The report (counts, breakdowns,
-- warnings) is a prost-encoded redrive.v1.PrecheckReport written when done.
CREATE TABLE prechecks (
    id          UUID        PRIMARY KEY,
    actor       TEXT        NOT NULL,
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    state       TEXT        NOT NULL CHECK (state IN ('running', 'done', 'failed')),
    error       TEXT,
    digest      TEXT,
    report      BYTEA
);

-- One row per selected dead letter, with its verdict and reason.
CREATE TABLE precheck_items (
    precheck_id    UUID   NOT NULL REFERENCES prechecks (id) ON DELETE CASCADE,
    dead_letter_id BIGINT NOT NULL,
    verdict        TEXT   NOT NULL,
    reason         TEXT   NOT NULL DEFAULT '',
    PRIMARY KEY (precheck_id, dead_letter_id)
);
CREATE INDEX precheck_items_verdict ON precheck_items (precheck_id, verdict, dead_letter_id);
