-- Fencing tokens that cannot be guessed. A counter (1, 2, ...) let a caller
-- that knew a slice id (WatchPlan shows them) report into the live lease with
-- token 1. A token is now the slice's lease count in its high 32 bits and 31
-- random bits (from gen_random_uuid, PostgreSQL's strong random source) below:
-- it still grows with every lease, so a stale holder's token stays lower, but
-- only the claimer is told it.
CREATE FUNCTION redrive_next_fencing_token(previous BIGINT) RETURNS BIGINT
LANGUAGE sql VOLATILE AS $$
    SELECT (((previous >> 32) + 1) << 32)
         | (('x' || substr(gen_random_uuid()::text, 1, 8))::bit(32)::bigint & 2147483647)
$$;

-- The tokens of a slice's earlier leases: a late report under one of them
-- (a publish that happened) is recorded; any other token is refused.
ALTER TABLE plan_slices ADD COLUMN past_tokens BIGINT[] NOT NULL DEFAULT '{}';
UPDATE plan_slices
SET past_tokens = ARRAY(SELECT generate_series(1::bigint, fencing_token - 1))
WHERE fencing_token > 1;
