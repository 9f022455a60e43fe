-- Ramps (docs/replay.md, "Ramps"): a plan's canary may be followed by more
-- waves of growing size before its main wave, each published, observed and
-- promoted by itself when its observation window passes with the gates green.
-- `ramp_items` holds the cumulative item counts at the end of each wave
-- before the main one (one entry, the canary's, for a plan without a ramp);
-- `ramp_step` is the wave a plan in `canary` or `observing` is in (0: the
-- canary). A slice belongs to one wave.
ALTER TABLE plans
    ADD COLUMN ramp_items BIGINT[] NOT NULL DEFAULT '{}',
    ADD COLUMN ramp_step  INTEGER  NOT NULL DEFAULT 0;
UPDATE plans SET ramp_items = ARRAY[canary_items];
ALTER TABLE plan_slices ADD COLUMN ramp_step INTEGER NOT NULL DEFAULT 0;
