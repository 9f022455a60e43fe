-- What capture writes per dead letter (the capture benchmark measures it,
-- docs/benchmarks.md). `dead_letters_message_key` on (message_key) is a
-- prefix of `dead_letters_key_destination` on (message_key, destination),
-- which serves every lookup by key alone as well: one index entry less for
-- every captured, imported or ingested dead letter.
DROP INDEX dead_letters_message_key;
