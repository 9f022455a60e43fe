-- The overview's arrivals per source over the last hour (ListSources).
CREATE INDEX dead_letters_captured_at ON dead_letters (captured_at);

-- The overview's error groups: the folded error text kept beside each dead
-- letter (redrive_error_group is IMMUTABLE), so that a summary by error
-- reads a column instead of running five regular expressions per row. The
-- same function, which now skips the expressions for no error text (the
-- usual RabbitMQ rejection): folding costs a row at insert about 2 µs
-- without an error text and 37 µs with a 150-byte one (docs/benchmarks.md).
CREATE OR REPLACE FUNCTION redrive_error_group(error TEXT) RETURNS TEXT
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN coalesce(error, '') = '' THEN '' ELSE
    btrim(regexp_replace(regexp_replace(regexp_replace(regexp_replace(regexp_replace(
        error,
        '[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}', '<uuid>', 'g'),
        '\m0[xX][0-9A-Fa-f]+\M', '<hex>', 'g'),
        '\m(?=[A-Fa-f]*[0-9])(?=[0-9]*[A-Fa-f])[0-9A-Fa-f]{8,}\M', '<hex>', 'g'),
        '[0-9]+', '<n>', 'g'),
        '\s+', ' ', 'g')) END
$$;

ALTER TABLE dead_letters
    ADD COLUMN error_group TEXT GENERATED ALWAYS AS (redrive_error_group(error_text)) STORED;
