-- The state a paused plan resumes to.
ALTER TABLE plans ADD COLUMN paused_from TEXT;
