-- The replay ledger is the audit (docs/design.md, "What a report writes"; the
-- throughput benchmark measures it). Every key that `replayed_keys` recorded
-- was also an audit event of the same report (`sent`, or `uncertain`: may have
-- been delivered), so a report wrote two rows and five index entries where one
-- row and three entries say the same. The audit event now carries the key's
-- destination (the identity is the message key and the destination), and one
-- partial index finds a key's past deliveries.

-- 1. The destination of every event's dead letter: from the dead letter while
--    it is stored, else, for the events that delivered or may have delivered a
--    key, from the ledger row (retention may have deleted the dead letter; the
--    ledger outlived it).
ALTER TABLE audit_events ADD COLUMN destination TEXT;

UPDATE audit_events e SET destination = d.destination
FROM dead_letters d
WHERE d.id = e.dead_letter_id;

UPDATE audit_events e SET destination = r.destination
FROM replayed_keys r
WHERE e.destination IS NULL AND e.action IN ('sent', 'uncertain')
  AND r.message_key = e.message_key AND r.plan_id = e.plan_id;

-- 2. A ledger row without an event of its own (written by hand, or before the
--    audit existed) becomes one, so no past replay is forgotten.
INSERT INTO audit_events (plan_id, dead_letter_id, message_key, destination, action, reason, wave,
                          executor_id, attempt, at)
SELECT r.plan_id, r.dead_letter_id, r.message_key, r.destination,
       CASE WHEN r.certain THEN 'sent' ELSE 'uncertain' END,
       'recorded in the replay ledger before it was folded into the audit (migration 0021)',
       '', '', 1, r.replayed_at
FROM replayed_keys r
WHERE EXISTS (SELECT 1 FROM plans p WHERE p.id = r.plan_id)
  AND NOT EXISTS (SELECT 1 FROM audit_events e
                  WHERE e.plan_id = r.plan_id AND e.message_key = r.message_key
                    AND e.destination = r.destination AND e.action IN ('sent', 'uncertain'));

DROP TABLE replayed_keys;

-- 3. A key's past deliveries, by key and destination: the precheck's
--    `already_replayed`, the executor's per-slice check and the approval check
--    read it.
CREATE INDEX audit_events_replayed ON audit_events (message_key, destination)
    WHERE action IN ('sent', 'uncertain');

-- 4. Events are read by plan, in order (`WatchAudit`, exports, the report):
--    the primary key serves that, and the second index on (plan_id, id) goes.
ALTER TABLE audit_events DROP CONSTRAINT audit_events_pkey;
ALTER TABLE audit_events ADD PRIMARY KEY (plan_id, id);
DROP INDEX audit_events_plan;
