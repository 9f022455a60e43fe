-- The write-ahead mark of a lease (docs/design.md, "Precise uncertain
-- items"): the last item position its holder may have published. An executor
-- that claims with `marks_publishing` records it (MarkPublishing) before it
-- publishes past it; a lease that expires then makes only the unreported
-- items up to the mark `uncertain`. NULL: the holder does not mark, so every
-- unreported item of the slice may have been published (the rule before).
ALTER TABLE plan_slices ADD COLUMN published_through BIGINT;
