-- The AMQP message id of each audited dead letter, written with the event
-- (the export's `message_id` column, for reconciliation with the producer's
-- records), so that the audit reads the same after retention deletes the
-- dead letter. Events written before this migration get it from their dead
-- letter when it is still stored.
ALTER TABLE audit_events ADD COLUMN message_id TEXT;
UPDATE audit_events e SET message_id = d.message_id
FROM dead_letters d WHERE d.id = e.dead_letter_id AND d.message_id IS NOT NULL;

-- Sources retention deleted dead letters of: still known, so that a
-- listing of a source whose dead letters were all deleted answers empty
-- instead of "no dead letter from this source has ever been stored" (the
-- refusal of an unknown source, a typo, in every request with a selector).
-- (A source all of whose dead letters retention deleted before this
-- migration is not known again: the deletion history has no source.)
CREATE TABLE retired_sources (source TEXT PRIMARY KEY);
