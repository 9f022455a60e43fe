-- An idempotency key's first call that failed in a way that may come after
-- its effect (UNAVAILABLE, INTERNAL, ...): the error, kept so that a retry
-- is told to look instead of doing the work twice.
ALTER TABLE idempotency_keys ADD COLUMN failure TEXT;

-- "Still arriving" compares where the dead letters failed too: the same
-- fingerprint dying at the same source from another queue (another consumer,
-- another bug) is no reason to hold a plan back. A bare reason class
-- (`rejected`) is common to every rejection at a DLQ.
ALTER TABLE plan_groups ADD COLUMN destination TEXT NOT NULL DEFAULT '';
DELETE FROM plan_groups;
INSERT INTO plan_groups (plan_id, source, error_group, destination)
SELECT DISTINCT i.plan_id, d.source, d.error_group, d.destination
FROM plan_items i JOIN dead_letters d ON d.id = i.dead_letter_id;
ALTER TABLE plan_groups DROP CONSTRAINT plan_groups_pkey;
ALTER TABLE plan_groups ADD PRIMARY KEY (plan_id, source, error_group, destination);
