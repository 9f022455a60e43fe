-- The exact content header of a message the AMQP client could not read
-- (reason class `unreadable`): with the body, the message byte for byte,
-- kept even if the broker later drops it (a quorum DLQ's delivery limit).
ALTER TABLE dead_letters ADD COLUMN raw_content_header BYTEA;
