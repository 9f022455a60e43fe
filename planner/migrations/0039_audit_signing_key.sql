-- The key whose MACs and signatures the log takes now: the C2SP signed-note
-- key name and key id (`name+hash`, the hash as 8 hex digits) of the
-- `--audit-signing-key` of the planner that started last, set under the
-- state row's lock before that planner serves. A planner moves it only from
-- NULL, from its own key or from its `--audit-previous-key` (a rotation), and
-- one whose key is not this one seals nothing and stops (docs/audit-log.md,
-- "Rotating the key"): a planner still running on the old key would refuse
-- the new key's rows as forged before the new key's first checkpoint.
-- NULL until a keyed planner starts.
ALTER TABLE audit_log_state ADD COLUMN signing_key TEXT;
