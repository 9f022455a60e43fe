-- Triage by what went wrong (docs/design.md, "Error fingerprints"): dead
-- letters are grouped by a fingerprint of the failure, not only of its text.
--
-- The exception or error class a framework names (MassTransit
-- `MT-Fault-ExceptionType`, NServiceBus `NServiceBus.ExceptionInfo.ExceptionType`,
-- Spring's stack trace, Kafka `kafka_dlt-exception-fqcn`, the configured
-- error-class header) is kept beside the error text.
ALTER TABLE dead_letters ADD COLUMN error_class TEXT;

-- The fingerprint: `<reason class>`, then ` · <exception class>` when one is
-- known, then `: <folded error text>` when there is one. The error text is
-- folded so that values which differ per message do not split a group:
-- timestamps (ISO 8601 / RFC 3339, with or without a zone) become `<time>`,
-- UUIDs `<uuid>`, quoted values ('...' and "...", the quote opening after
-- no letter or digit, so that "can't" is no quote) `<q>`,
-- `0x` numbers and hexadecimal ids of 8 digits or more `<hex>`, other digit
-- runs `<n>`; white space is collapsed and the text cut at 300 characters.
-- "Timeout after 3000 ms for order 123" and "Timeout after 5000 ms for
-- order 456" are one group. IMMUTABLE, so it is a stored generated column.
CREATE OR REPLACE FUNCTION redrive_error_fingerprint(reason_class TEXT, error_class TEXT, error TEXT)
RETURNS TEXT LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT reason_class
        || CASE WHEN coalesce(error_class, '') = '' THEN '' ELSE ' · ' || left(btrim(error_class), 200) END
        || CASE WHEN coalesce(error, '') = '' THEN '' ELSE ': ' || left(btrim(
            regexp_replace(regexp_replace(regexp_replace(regexp_replace(regexp_replace(
            regexp_replace(regexp_replace(
                error,
                '\d{4}-\d{2}-\d{2}(?:[Tt ]\d{2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?(?:[Zz]|[+-]\d{2}:?\d{2})?)?', '<time>', 'g'),
                '[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}', '<uuid>', 'g'),
                '(^|[^[:alnum:]_])(?:''[^'']*''|"[^"]*")', '\1<q>', 'g'),
                '\m0[xX][0-9A-Fa-f]+\M', '<hex>', 'g'),
                '\m(?=[A-Fa-f]*[0-9])(?=[0-9]*[A-Fa-f])[0-9A-Fa-f]{8,}\M', '<hex>', 'g'),
                '[0-9]+', '<n>', 'g'),
                '\s+', ' ', 'g')), 300) END
$$;

-- The column keeps its name (summaries, selections, the console read it):
-- recomputed for every stored dead letter by the new rule.
DROP INDEX IF EXISTS dead_letters_error_group;
ALTER TABLE dead_letters DROP COLUMN error_group;
ALTER TABLE dead_letters
    ADD COLUMN error_group TEXT GENERATED ALWAYS AS
        (redrive_error_fingerprint(reason_class, error_class, error_text)) STORED;
DROP FUNCTION redrive_error_group(TEXT);

-- Selections by fingerprint, and the arrivals of a fingerprint since a time
-- (the precheck's and the plans' "still arriving" check).
CREATE INDEX dead_letters_error_group ON dead_letters (source, error_group, captured_at);
