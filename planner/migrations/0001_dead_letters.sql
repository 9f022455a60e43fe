-- Dead letters captured from RabbitMQ DLQs, pushed by services, or imported.
-- Bodies, properties and headers are kept exactly (properties and headers as
-- prost-encoded redrive.v1.MessageProperties / HeaderTable, so every AMQP field
-- type survives); everything else is derived at capture for selection.
CREATE TABLE dead_letters (
    id                   BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    source               TEXT        NOT NULL,
    origin               TEXT        NOT NULL CHECK (origin IN ('rabbitmq', 'ingest', 'import')),
    captured_at          TIMESTAMPTZ NOT NULL,
    -- SHA-256 over source, body hash, properties and headers: recognizes a
    -- RabbitMQ redelivery of a dead letter already stored.
    capture_fingerprint  BYTEA       NOT NULL,
    -- Ingest and import idempotency: message id, or sha256:<body hash>.
    dedup_key            TEXT,
    message_id           TEXT,
    message_key          TEXT        NOT NULL,
    body                 BYTEA       NOT NULL,
    body_size            BIGINT      NOT NULL,
    body_sha256          BYTEA       NOT NULL,
    body_oversized       BOOLEAN     NOT NULL,
    body_problem         TEXT,
    body_compression     TEXT        NOT NULL CHECK (body_compression IN ('none', 'gzip', 'zstd')),
    properties           BYTEA       NOT NULL,
    headers              BYTEA       NOT NULL,
    content_type         TEXT,
    death_reason         TEXT,
    death_queue          TEXT,
    death_exchange       TEXT,
    death_routing_keys   TEXT[],
    death_count          BIGINT,
    death_time           TIMESTAMPTZ,
    reason_class         TEXT        NOT NULL,
    destination          TEXT        NOT NULL,
    event_type           TEXT,
    schema_version       TEXT,
    producer             TEXT,
    error_text           TEXT,
    attempts             INTEGER,
    died_at              TIMESTAMPTZ NOT NULL,
    occurred_at          TIMESTAMPTZ,
    redrive_plan_id      TEXT,
    original_exchange    TEXT,
    original_routing_key TEXT,
    capture_notes        TEXT[]      NOT NULL DEFAULT '{}'
);

CREATE INDEX dead_letters_fingerprint ON dead_letters (source, capture_fingerprint);
CREATE UNIQUE INDEX dead_letters_dedup_key ON dead_letters (source, dedup_key)
    WHERE dedup_key IS NOT NULL;
CREATE INDEX dead_letters_source_id ON dead_letters (source, id);
CREATE INDEX dead_letters_died_at ON dead_letters (died_at);
CREATE INDEX dead_letters_message_key ON dead_letters (message_key);
CREATE INDEX dead_letters_redrive_plan ON dead_letters (redrive_plan_id)
    WHERE redrive_plan_id IS NOT NULL;

-- Repaired bodies (RepairDeadLetter); the captured body stays as it was.
CREATE TABLE dead_letter_revisions (
    dead_letter_id BIGINT      NOT NULL REFERENCES dead_letters (id),
    revision       INTEGER     NOT NULL,
    body           BYTEA       NOT NULL,
    body_sha256    BYTEA       NOT NULL,
    actor          TEXT        NOT NULL,
    reason         TEXT        NOT NULL,
    created_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (dead_letter_id, revision)
);
