-- Webhooks (issue 31, part 5; docs/webhooks.md). A plan may name its own
-- target: the URL and the `whsec_` secret it is signed with (the secret is
-- kept because an HMAC is signed with the receiver's own key: whoever reads
-- this table can sign as the planner).
ALTER TABLE plans
    ADD COLUMN webhook_url    TEXT,
    ADD COLUMN webhook_secret TEXT;

-- The outbox: one row per event and target, inserted in the transaction of
-- the state change it reports, delivered at least once by whichever planner
-- replica takes it first (`FOR UPDATE SKIP LOCKED`, then `next_attempt_at`
-- pushed past the attempt as its lease).
CREATE TABLE webhook_deliveries (
    id              BIGSERIAL   PRIMARY KEY,
    -- The `webhook-id` header: the same on every attempt.
    webhook_id      TEXT        NOT NULL UNIQUE,
    -- `planner`: the planner's --webhook-url (delivered by replicas that
    -- have one); `plan`: the plan's own webhook_url and webhook_secret.
    target          TEXT        NOT NULL CHECK (target IN ('planner', 'plan')),
    event_type      TEXT        NOT NULL,
    plan_id         UUID,
    -- The payload's `data`, as of the state change (a final state's
    -- `report_digest` is added when the body is first made).
    data            JSONB       NOT NULL,
    occurred_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    -- The exact body sent, made at the first attempt and never changed.
    body            TEXT,
    state           TEXT        NOT NULL DEFAULT 'pending'
                                CHECK (state IN ('pending', 'delivered', 'failed')),
    attempts        INTEGER     NOT NULL DEFAULT 0,
    next_attempt_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    last_error      TEXT,
    delivered_at    TIMESTAMPTZ
);

CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_attempt_at) WHERE state = 'pending';
