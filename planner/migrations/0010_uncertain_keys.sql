-- A message key whose publish outcome is unknown (a confirm lost with the
-- connection, or a lease that expired with items unreported) may have been
-- delivered. Such keys are recorded too, as not `certain`, so that a later
-- precheck and other plans never call them replayable; the plan that holds
-- the item still publishes it again (same message id) and a confirmed
-- publish then makes the row certain.
ALTER TABLE replayed_keys ADD COLUMN certain BOOLEAN NOT NULL DEFAULT true;

INSERT INTO replayed_keys (message_key, plan_id, dead_letter_id, replayed_at, certain)
SELECT i.message_key, i.plan_id, i.dead_letter_id, now(), false
FROM plan_items i WHERE i.state = 'uncertain'
ON CONFLICT (message_key, plan_id) DO NOTHING;
