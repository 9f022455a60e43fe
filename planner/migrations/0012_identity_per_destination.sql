-- A dead letter's identity includes where it died (DESIGN.md, "Words"): one
-- message delivered by a fan-out exchange to queues `a` and `b` and
-- dead-lettered by both is two pieces of work. Replays are recorded per
-- message key and destination (the replayed dead letter's destination).
ALTER TABLE replayed_keys ADD COLUMN destination TEXT NOT NULL DEFAULT '';
UPDATE replayed_keys r SET destination = d.destination
FROM dead_letters d WHERE d.id = r.dead_letter_id;
ALTER TABLE replayed_keys ALTER COLUMN destination DROP DEFAULT;
ALTER TABLE replayed_keys DROP CONSTRAINT replayed_keys_pkey;
ALTER TABLE replayed_keys ADD PRIMARY KEY (message_key, destination, plan_id);

-- Duplicates, earlier replays and re-dead-letters are looked up by key and
-- destination.
CREATE INDEX dead_letters_key_destination ON dead_letters (message_key, destination);

-- Ingest and import idempotency: a repeat is the same source, destination,
-- message id, re-dead-letter plan (`redrive-plan-id`) and body. The key is
-- `v2:` and the hex SHA-256 of those fields joined by NUL bytes (text never
-- holds NUL) followed by the body's SHA-256, as `dead_letter::dedup_key`
-- computes it. Existing rows get the new key; none collide, since the new key
-- only tells more rows apart than the old one (message id, else body hash).
UPDATE dead_letters SET dedup_key = 'v2:' || encode(sha256(
    convert_to(destination, 'UTF8') || '\x00'::bytea ||
    convert_to(coalesce(message_id, ''), 'UTF8') || '\x00'::bytea ||
    convert_to(coalesce(redrive_plan_id, ''), 'UTF8') || '\x00'::bytea ||
    body_sha256), 'hex')
WHERE dedup_key IS NOT NULL;
