-- Idempotency keys (docs/api.md, "Idempotency keys"): a mutating call sent
-- with the `idempotency-key` metadata stores its answer under the caller and
-- the key, so that a retry (an orchestrator's, after a timeout) gets the
-- first call's answer instead of a second plan. Kept 24 hours.
CREATE TABLE idempotency_keys (
    principal      TEXT        NOT NULL,
    key            TEXT        NOT NULL,
    method         TEXT        NOT NULL,
    -- SHA-256 of the method and the request's protobuf encoding.
    request_sha256 BYTEA       NOT NULL,
    -- The answer (protobuf); NULL while the first call runs.
    response       BYTEA,
    created_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    completed_at   TIMESTAMPTZ,
    PRIMARY KEY (principal, key)
);
CREATE INDEX idempotency_keys_created ON idempotency_keys (created_at);
