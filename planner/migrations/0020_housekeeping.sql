-- Dead-letter housekeeping (docs/design.md, "Housekeeping"): archive,
-- unarchive, retention, error groups and body filters.

-- 1. Archived dead letters: resolved by a person without a replay. The
--    current archive is kept on the row (selections filter on it); every
--    archive, unarchive and retention delete is a row of the history below.
ALTER TABLE dead_letters
    ADD COLUMN archived_at    TIMESTAMPTZ,
    ADD COLUMN archived_by    TEXT,
    ADD COLUMN archive_reason TEXT;
-- Retention walks archived dead letters by age.
CREATE INDEX dead_letters_archived_at ON dead_letters (archived_at) WHERE archived_at IS NOT NULL;

-- Who archived or unarchived a dead letter, when and why; and when retention
-- deleted it (actor `redrive-retention`). Kept after the dead letter is
-- deleted: no foreign key.
CREATE TABLE dead_letter_archive_history (
    id             BIGINT      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    dead_letter_id BIGINT      NOT NULL,
    action         TEXT        NOT NULL CHECK (action IN ('archive', 'unarchive', 'delete')),
    actor          TEXT        NOT NULL,
    reason         TEXT        NOT NULL,
    at             TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX dead_letter_archive_history_dead_letter ON dead_letter_archive_history (dead_letter_id, id);

-- 2. Retention deletes replayed dead letters whose plan ended. Plan items,
--    audit events, precheck items and replayed keys keep their own copy of
--    what the audit shows (dead letter id, message key, route), so they stay
--    and are detached: a plan item may now name a dead letter that is gone.
--    Plan creation locks the dead letters it freezes (FOR SHARE) instead of
--    the foreign key, so a retention delete and a new plan never cross.
ALTER TABLE plan_items DROP CONSTRAINT plan_items_dead_letter_id_fkey;
-- Terminal plans whose sent dead letters retention has all deleted: not
-- looked at again.
ALTER TABLE plans ADD COLUMN retention_swept_at TIMESTAMPTZ;
CREATE INDEX plans_retention_unswept ON plans (id)
    WHERE retention_swept_at IS NULL AND state IN ('completed', 'cancelled', 'aborted');

-- 3. Error groups: an error text with what differs between occurrences of
--    one failure folded, as ServicePulse groups failed messages by
--    exception. In order: UUIDs to <uuid>; 0x-prefixed numbers, and runs of
--    at least 8 hexadecimal digits holding both a digit and a letter
--    (hashes, object ids), to <hex>; every other run of digits to <n>; runs
--    of white space to one space; trimmed. NULL is ''.
CREATE FUNCTION redrive_error_group(error TEXT) RETURNS TEXT
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT btrim(regexp_replace(regexp_replace(regexp_replace(regexp_replace(regexp_replace(
        coalesce(error, ''),
        '[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}', '<uuid>', 'g'),
        '\m0[xX][0-9A-Fa-f]+\M', '<hex>', 'g'),
        '\m(?=[A-Fa-f]*[0-9])(?=[0-9]*[A-Fa-f])[0-9A-Fa-f]{8,}\M', '<hex>', 'g'),
        '[0-9]+', '<n>', 'g'),
        '\s+', ' ', 'g'))
$$;

-- 4. Body filters: the value at a JSON pointer (as a text[] path) of a body,
--    a JSON string by its text and any other value by its JSON text; NULL
--    when the body is not UTF-8 JSON or holds nothing there.
CREATE FUNCTION redrive_body_value(body BYTEA, path TEXT[]) RETURNS TEXT
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    document JSONB;
    found    JSONB;
BEGIN
    BEGIN
        document := convert_from(body, 'UTF8')::jsonb;
    EXCEPTION WHEN others THEN
        RETURN NULL;
    END;
    found := document #> path;
    IF found IS NULL THEN
        RETURN NULL;
    ELSIF jsonb_typeof(found) = 'string' THEN
        RETURN found #>> '{}';
    END IF;
    RETURN found::text;
END $$;
