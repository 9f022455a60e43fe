-- Re-keying a stored backlog (RekeyDeadLetters; docs/replay.md, "Identity").
--
-- 1. The keys a dead letter had before: the replay record (audit events) is
--    never rewritten, so the precheck, plan approval and the claim match a
--    replay under any of the dead letter's keys, current or previous. A
--    delivered message stays already_replayed after a re-key.
ALTER TABLE dead_letters
    ADD COLUMN previous_message_keys TEXT[] NOT NULL DEFAULT '{}';

-- 2. Every re-key run: who, when, why, with which rules, and what it did.
CREATE TABLE dead_letter_rekeys (
    id        BIGINT      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    actor     TEXT        NOT NULL,
    reason    TEXT        NOT NULL,
    -- The rules in `--message-key` syntax; empty: the default rule.
    key_rules TEXT[]      NOT NULL,
    -- The selector, as JSON (for the record).
    selector  TEXT        NOT NULL,
    started_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    finished_at TIMESTAMPTZ,
    -- Counted as the batches commit.
    rekeyed   BIGINT      NOT NULL DEFAULT 0,
    changed   BIGINT      NOT NULL DEFAULT 0
);

-- 3. Each changed dead letter gets a `rekey` line in its history
--    (GetDeadLetter's archive_history).
ALTER TABLE dead_letter_archive_history
    DROP CONSTRAINT dead_letter_archive_history_action_check,
    ADD CONSTRAINT dead_letter_archive_history_action_check
        CHECK (action IN ('archive', 'unarchive', 'delete', 'rekey'));

-- A re-dead-letter re-keyed since is still found by the key its replay was
-- recorded under (the precheck's "came back" test).
CREATE INDEX dead_letters_previous_message_keys ON dead_letters
    USING gin (previous_message_keys);
