-- Leases bound to the principal that claimed them (issue 15): every write
-- under a lease (renewal, mark, report, completion) must come from the same
-- authenticated principal. Without authentication every caller is the
-- principal '' and nothing changes.
ALTER TABLE plan_slices ADD COLUMN lease_principal TEXT NOT NULL DEFAULT '';

-- One row per lease a slice was given: its fencing token, who claimed it
-- (principal and the executor id it gave) and when. A late report under an
-- earlier lease is recorded only for the principal that held it.
CREATE TABLE slice_leases (
    slice_id      BIGINT      NOT NULL REFERENCES plan_slices (id),
    fencing_token BIGINT      NOT NULL,
    principal     TEXT        NOT NULL,
    executor_id   TEXT        NOT NULL,
    leased_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (slice_id, fencing_token)
);

INSERT INTO slice_leases (slice_id, fencing_token, principal, executor_id)
SELECT id, unnest(past_tokens), '', '' FROM plan_slices;
INSERT INTO slice_leases (slice_id, fencing_token, principal, executor_id)
SELECT id, fencing_token, '', coalesce(lease_owner, '') FROM plan_slices WHERE fencing_token > 0;

ALTER TABLE plan_slices DROP COLUMN past_tokens;
