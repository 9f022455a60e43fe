-- The latest repaired body's revision (RepairDeadLetter); NULL when never
-- repaired. Prechecks and replays read that revision's body instead of the
-- captured one.
ALTER TABLE dead_letters ADD COLUMN body_revision INTEGER;
