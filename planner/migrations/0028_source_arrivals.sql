-- The overview's arrivals per source over the last hour (ListSources).
CREATE INDEX dead_letters_source_captured ON dead_letters (source, captured_at);
