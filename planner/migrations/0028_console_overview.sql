-- The overview's arrivals per source over the last hour (ListSources).
CREATE INDEX dead_letters_captured_at ON dead_letters (captured_at);

-- The overview's error groups: the folded error text kept beside each dead
-- letter (redrive_error_group is IMMUTABLE), so that a summary by error
-- reads a column instead of running five regular expressions per row.
ALTER TABLE dead_letters
    ADD COLUMN error_group TEXT GENERATED ALWAYS AS (redrive_error_group(error_text)) STORED;
