-- A stored copy that absorbed a redelivery (docs/capture.md, "Planner dies
-- between commit and ack") records the id the capture session took for that
-- redelivery (and left unused). A batch retried under the same ids (a commit
-- whose reply was lost, a one by one fallback cut short) finds exactly the
-- copy each of its redeliveries absorbed, and no other: not a row stored
-- for another dead letter of the batch, not a copy another redelivery of it
-- absorbed. NULL for every other row; read only through the
-- (source, capture_fingerprint) index, so it has none of its own.
ALTER TABLE dead_letters ADD COLUMN absorbed_as BIGINT;
