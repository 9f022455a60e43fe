-- Replay plans: a frozen, ordered set of replayable dead letters from one
-- precheck, cut into slices that executors lease.
CREATE TABLE plans (
    id                   UUID        PRIMARY KEY,
    precheck_id          UUID        NOT NULL REFERENCES prechecks (id),
    precheck_digest      TEXT        NOT NULL,
    state                TEXT        NOT NULL CHECK (state IN ('awaiting_approval', 'canary', 'observing',
                                         'main', 'completed', 'paused', 'cancelled', 'aborted')),
    state_reason         TEXT        NOT NULL DEFAULT '',
    rate_per_second      DOUBLE PRECISION NOT NULL CHECK (rate_per_second > 0),
    rate_burst           INTEGER     NOT NULL CHECK (rate_burst >= 1),
    rate_rationale       TEXT        NOT NULL,
    destination_mode     TEXT        NOT NULL CHECK (destination_mode IN ('queue', 'exchange', 'redirect')),
    redirect_exchange    TEXT,
    redirect_routing_key TEXT,
    slice_size           INTEGER     NOT NULL,
    canary_fraction      DOUBLE PRECISION NOT NULL,
    observe_for_ms       BIGINT      NOT NULL,
    total_items          BIGINT      NOT NULL,
    canary_items         BIGINT      NOT NULL,
    created_by           TEXT        NOT NULL,
    created_at           TIMESTAMPTZ NOT NULL DEFAULT now(),
    approved_by          TEXT,
    approved_at          TIMESTAMPTZ,
    completed_at         TIMESTAMPTZ,
    warnings             TEXT[]      NOT NULL DEFAULT '{}'
);
CREATE INDEX plans_state ON plans (state);

-- A slice: the unit an executor leases. Every write by an executor is
-- conditioned on the fencing token it was handed with the lease.
CREATE TABLE plan_slices (
    id               BIGINT      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    plan_id          UUID        NOT NULL REFERENCES plans (id),
    seq              INTEGER     NOT NULL,
    wave             TEXT        NOT NULL CHECK (wave IN ('canary', 'main')),
    state            TEXT        NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'leased', 'completed')),
    lease_owner      TEXT,
    lease_expires_at TIMESTAMPTZ,
    fencing_token    BIGINT      NOT NULL DEFAULT 0,
    UNIQUE (plan_id, seq)
);
CREATE INDEX plan_slices_open ON plan_slices (plan_id, seq) WHERE state <> 'completed';

-- Plan items in dead-letter order with their current state:
-- pending | uncertain (published, confirm lost: publish again) | a final action.
CREATE TABLE plan_items (
    plan_id        UUID    NOT NULL REFERENCES plans (id),
    position       BIGINT  NOT NULL,
    slice_id       BIGINT  NOT NULL REFERENCES plan_slices (id),
    dead_letter_id BIGINT  NOT NULL REFERENCES dead_letters (id),
    message_key    TEXT    NOT NULL,
    state          TEXT    NOT NULL DEFAULT 'pending',
    attempts       INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (plan_id, position)
);
CREATE INDEX plan_items_slice ON plan_items (slice_id, position);
CREATE INDEX plan_items_dead_letter ON plan_items (dead_letter_id);

-- Append-only: one row per outcome an executor reported (and per operator-visible
-- decision), including uncertain ones that were published again.
CREATE TABLE audit_events (
    id                 BIGINT      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    plan_id            UUID        NOT NULL REFERENCES plans (id),
    slice_id           BIGINT,
    dead_letter_id     BIGINT      NOT NULL,
    message_key        TEXT        NOT NULL,
    action             TEXT        NOT NULL,
    reason             TEXT        NOT NULL DEFAULT '',
    wave               TEXT        NOT NULL,
    executor_id        TEXT        NOT NULL,
    attempt            INTEGER     NOT NULL,
    confirm_latency_us BIGINT      NOT NULL DEFAULT 0,
    at                 TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX audit_events_plan ON audit_events (plan_id, id);

-- Who did what to a plan: create, approve, promote, pause, resume, cancel, abort.
CREATE TABLE operator_actions (
    id      BIGINT      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    plan_id UUID        NOT NULL REFERENCES plans (id),
    action  TEXT        NOT NULL,
    actor   TEXT        NOT NULL,
    reason  TEXT        NOT NULL DEFAULT '',
    at      TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX operator_actions_plan ON operator_actions (plan_id, id);

-- A sent dead letter is marked replayed with its plan.
ALTER TABLE dead_letters ADD COLUMN replayed_by_plan UUID, ADD COLUMN replayed_at TIMESTAMPTZ;
