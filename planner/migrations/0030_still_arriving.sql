-- Do not replay into a fire that is still burning (docs/replay.md, "Still
-- arriving"): a plan remembers what its dead letters failed with, so that
-- dead letters that fail the same way after its precheck refuse its
-- approval and pause it while it runs.

-- The (source, error fingerprint) pairs of a plan's dead letters, written
-- with the plan.
CREATE TABLE plan_groups (
    plan_id     UUID NOT NULL REFERENCES plans (id),
    source      TEXT NOT NULL,
    error_group TEXT NOT NULL,
    PRIMARY KEY (plan_id, source, error_group)
);

INSERT INTO plan_groups (plan_id, source, error_group)
SELECT DISTINCT i.plan_id, d.source, d.error_group
FROM plan_items i JOIN dead_letters d ON d.id = i.dead_letter_id;

-- An operator approved or resumed the plan knowing that such dead letters
-- still arrive (operator action `override_arrivals`, with the reason): the
-- arrivals no longer stop it.
ALTER TABLE plans ADD COLUMN arrivals_overridden BOOLEAN NOT NULL DEFAULT false;
