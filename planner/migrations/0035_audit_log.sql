-- The audit log (issue 32, docs/audit-log.md): every audit event and every
-- operator action, sealed in one total order into an RFC 6962 Merkle tree
-- whose roots the planner signs (C2SP tlog-checkpoint). The rows stay where
-- they are; the log holds each one's leaf hash, so that a changed, deleted
-- or added row shows against the signed roots.

-- What waits to be sealed: one row per event or action written, queued by
-- the statement triggers below in the writer's own transaction, with the
-- writer's MAC over the row (`redrive_audit_mac`). The sequencer
-- (`planner/src/audit/log.rs`) takes them in `seq` order.
CREATE TABLE audit_log_pending (
    seq     BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind    TEXT   NOT NULL CHECK (kind IN ('event', 'action')),
    plan_id UUID   NOT NULL,
    ref_id  BIGINT NOT NULL,
    mac     BYTEA
);

-- The sealed leaves: leaf `leaf_index` is the event (`kind` 'event',
-- `audit_events (plan_id, id)`) or operator action (`operator_actions.id`)
-- `ref_id`, its RFC 6962 leaf hash SHA-256(0x00 || canonical bytes).
CREATE TABLE audit_log (
    leaf_index BIGINT PRIMARY KEY CHECK (leaf_index >= 0),
    kind       TEXT   NOT NULL CHECK (kind IN ('event', 'action')),
    plan_id    UUID   NOT NULL,
    ref_id     BIGINT NOT NULL,
    leaf_hash  BYTEA  NOT NULL CHECK (octet_length(leaf_hash) = 32),
    UNIQUE (kind, ref_id, plan_id)
);

-- Interior nodes: the hash of every complete subtree at levels 4, 8, 12, ...
-- (16, 256, 4096, ... leaves), so that any subtree's hash is read from at
-- most 8 stored hashes (proofs) without storing every level.
CREATE TABLE audit_log_nodes (
    level SMALLINT NOT NULL CHECK (level > 0 AND level % 4 = 0),
    idx   BIGINT   NOT NULL,
    hash  BYTEA    NOT NULL CHECK (octet_length(hash) = 32),
    PRIMARY KEY (level, idx)
);

-- The tree as sealed so far: its size, the hashes of the perfect subtrees
-- its right edge decomposes into (largest first), and its root. One row,
-- locked by the sealing transaction: several planners seal one log.
-- `history_seq`: pending rows up to it were queued by this migration for
-- the rows written before the log existed (they have no MAC).
CREATE TABLE audit_log_state (
    singleton   BOOLEAN     PRIMARY KEY DEFAULT true CHECK (singleton),
    tree_size   BIGINT      NOT NULL DEFAULT 0,
    frontier    BYTEA[]     NOT NULL DEFAULT '{}',
    root_hash   BYTEA       NOT NULL,
    history_seq BIGINT      NOT NULL DEFAULT 0,
    sealed_at   TIMESTAMPTZ
);

-- Signed checkpoints: the C2SP signed note of the tree at `tree_size`.
CREATE TABLE audit_checkpoints (
    tree_size BIGINT      PRIMARY KEY,
    root_hash BYTEA       NOT NULL CHECK (octet_length(root_hash) = 32),
    note      TEXT        NOT NULL,
    signed_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- Rows the sequencer would not seal, and why (no MAC, a MAC that does not
-- match the row, the row gone): an export lists them as not in the log.
CREATE TABLE audit_log_refused (
    kind       TEXT        NOT NULL,
    plan_id    UUID        NOT NULL,
    ref_id     BIGINT      NOT NULL,
    reason     TEXT        NOT NULL,
    refused_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (kind, ref_id, plan_id)
);

-- HMAC-SHA256 (RFC 2104) with the key given as its two padded blocks:
-- `pads` = (K xor ipad) || (K xor opad), 64 bytes each, computed by the
-- planner from its audit key. NULL for a NULL or empty `pads`.
CREATE FUNCTION redrive_hmac(pads BYTEA, message BYTEA) RETURNS BYTEA
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN pads IS NULL OR octet_length(pads) <> 128 THEN NULL
                ELSE sha256(substring(pads FROM 65 FOR 64)
                            || sha256(substring(pads FROM 1 FOR 64) || message)) END
$$;

-- What a MAC covers: every column of the row, as a JSON array (times as
-- microseconds since the epoch, so that no session's time zone shows).
CREATE FUNCTION redrive_audit_event_mac_input(e audit_events) RETURNS BYTEA
LANGUAGE sql IMMUTABLE AS $$
    SELECT convert_to(json_build_array(
        'event', e.plan_id, e.id, e.slice_id, e.dead_letter_id, e.message_key, e.message_id,
        e.destination, e.action, e.reason, e.wave, e.executor_id, e.attempt,
        e.confirm_latency_us, (extract(epoch FROM e.at) * 1000000)::bigint)::text, 'UTF8')
$$;

CREATE FUNCTION redrive_audit_action_mac_input(a operator_actions) RETURNS BYTEA
LANGUAGE sql IMMUTABLE AS $$
    SELECT convert_to(json_build_array(
        'action', a.plan_id, a.id, a.action, a.actor, a.reason,
        (extract(epoch FROM a.at) * 1000000)::bigint)::text, 'UTF8')
$$;

-- The writer's key: the planner sets `redrive.audit_mac` on each of its
-- connections (a startup option, hex of the two pads). A session without it
-- (psql, a script) queues rows with no MAC, which the sequencer refuses.
CREATE FUNCTION redrive_audit_writer_pads() RETURNS BYTEA
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN length(current_setting('redrive.audit_mac', true)) = 256
                 AND current_setting('redrive.audit_mac', true) ~ '^[0-9a-f]+$'
                THEN decode(current_setting('redrive.audit_mac', true), 'hex') END
$$;

CREATE FUNCTION redrive_audit_events_pending() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF coalesce(current_setting('redrive.audit_log', true), '') = 'off' THEN
        RETURN NULL;
    END IF;
    INSERT INTO audit_log_pending (kind, plan_id, ref_id, mac)
    SELECT 'event', n.plan_id, n.id,
           redrive_hmac(redrive_audit_writer_pads(), redrive_audit_event_mac_input(n))
    FROM new_rows n ORDER BY n.id;
    RETURN NULL;
END
$$;

CREATE FUNCTION redrive_operator_actions_pending() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF coalesce(current_setting('redrive.audit_log', true), '') = 'off' THEN
        RETURN NULL;
    END IF;
    INSERT INTO audit_log_pending (kind, plan_id, ref_id, mac)
    SELECT 'action', n.plan_id, n.id,
           redrive_hmac(redrive_audit_writer_pads(), redrive_audit_action_mac_input(n))
    FROM new_rows n ORDER BY n.id;
    RETURN NULL;
END
$$;

CREATE TRIGGER audit_events_pending AFTER INSERT ON audit_events
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION redrive_audit_events_pending();
CREATE TRIGGER operator_actions_pending AFTER INSERT ON operator_actions
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION redrive_operator_actions_pending();

-- The history: every row written before the log existed, in the order it
-- was written, sealed at the first start without a MAC.
INSERT INTO audit_log_pending (kind, plan_id, ref_id)
SELECT kind, plan_id, ref_id FROM (
    SELECT 'event' AS kind, plan_id, id AS ref_id, at FROM audit_events
    UNION ALL
    SELECT 'action', plan_id, id, at FROM operator_actions
) history
ORDER BY at, kind, ref_id;

INSERT INTO audit_log_state (root_hash, history_seq)
SELECT sha256(''::bytea), coalesce(max(seq), 0) FROM audit_log_pending;
