-- A plan of one (ReplayDeadLetter) is claimable only until its caller stops
-- waiting: after `claim_by` no executor may start it, and the gates' sweep
-- cancels it, so a caller told NOT_REPLAYED (or whose planner died) never has
-- it published later. NULL for ordinary plans.
ALTER TABLE plans ADD COLUMN claim_by TIMESTAMPTZ;
CREATE INDEX plans_claim_by ON plans (claim_by) WHERE claim_by IS NOT NULL;
