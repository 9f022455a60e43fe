-- Outcomes an executor reported that the planner refused (issue 28): a
-- `sent`, `uncertain`, `failed` or `unroutable` for an item its lease never
-- marked as publishing, anything under a token that is not the slice's
-- current lease, an item outside the slice, a skip decision under an
-- expired lease, or a token the slice never had (for this principal). Each
-- refused event is one row, with the authenticated principal that sent it
-- (docs/design.md, "Reports need marks"). Nothing here changes a plan: it
-- is the record of late or forged reports. No foreign keys: a forged report
-- may name a slice or a dead letter that does not exist.
CREATE TABLE refused_outcomes (
    id             BIGSERIAL   PRIMARY KEY,
    slice_id       BIGINT      NOT NULL,
    fencing_token  BIGINT      NOT NULL,
    principal      TEXT        NOT NULL,
    dead_letter_id BIGINT      NOT NULL,
    action         TEXT        NOT NULL,
    -- `unmarked`, `stale_token`, `lease_ended`, `lease_expired`,
    -- `not_in_slice` or `unknown_lease`.
    reason         TEXT        NOT NULL,
    at             TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE INDEX refused_outcomes_slice ON refused_outcomes (slice_id, at);
