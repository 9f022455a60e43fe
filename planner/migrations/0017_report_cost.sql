-- What a report writes per message (docs/design.md, "What a report
-- writes"; the throughput benchmark measures it).

-- 1. `dead_letters.replayed_by_plan` and `replayed_at` were set for every
--    sent item, rewriting the dead letter's row (its body inline) and every
--    index entry of it, and nothing read them: `replayed_keys` and the audit
--    hold the same facts.
ALTER TABLE dead_letters DROP COLUMN replayed_by_plan, DROP COLUMN replayed_at;

-- 2. A report changes an item's `state` and `attempts`, which no index
--    covers: with room on its page the new version is a HOT update and no
--    index entry is written. Leave room for one new version of every item
--    (pages written from now on).
ALTER TABLE plan_items SET (fillfactor = 50);

-- 3. Item counts per plan, slice and state, kept by statement triggers on
--    `plan_items`, so that reading a plan's progress costs one row per slice
--    and state instead of a scan of its items. Rows are locked in key order,
--    so two writers never deadlock on them.
CREATE TABLE plan_item_counts (
    plan_id  UUID   NOT NULL,
    slice_id BIGINT NOT NULL,
    state    TEXT   NOT NULL,
    items    BIGINT NOT NULL,
    PRIMARY KEY (plan_id, slice_id, state)
);

CREATE FUNCTION plan_item_counts_apply() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO plan_item_counts (plan_id, slice_id, state, items)
        SELECT plan_id, slice_id, state, count(*) FROM new_items
        GROUP BY plan_id, slice_id, state ORDER BY plan_id, slice_id, state
        ON CONFLICT (plan_id, slice_id, state) DO UPDATE SET items = plan_item_counts.items + excluded.items;
    ELSIF TG_OP = 'UPDATE' THEN
        INSERT INTO plan_item_counts (plan_id, slice_id, state, items)
        SELECT plan_id, slice_id, state, sum(change) FROM (
            SELECT plan_id, slice_id, state, 1 AS change FROM new_items
            UNION ALL
            SELECT plan_id, slice_id, state, -1 FROM old_items) c
        GROUP BY plan_id, slice_id, state HAVING sum(change) <> 0 ORDER BY plan_id, slice_id, state
        ON CONFLICT (plan_id, slice_id, state) DO UPDATE SET items = plan_item_counts.items + excluded.items;
    ELSE
        INSERT INTO plan_item_counts (plan_id, slice_id, state, items)
        SELECT plan_id, slice_id, state, -count(*) FROM old_items
        GROUP BY plan_id, slice_id, state ORDER BY plan_id, slice_id, state
        ON CONFLICT (plan_id, slice_id, state) DO UPDATE SET items = plan_item_counts.items + excluded.items;
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER plan_items_counted_insert AFTER INSERT ON plan_items
    REFERENCING NEW TABLE AS new_items FOR EACH STATEMENT EXECUTE FUNCTION plan_item_counts_apply();
CREATE TRIGGER plan_items_counted_update AFTER UPDATE ON plan_items
    REFERENCING OLD TABLE AS old_items NEW TABLE AS new_items FOR EACH STATEMENT EXECUTE FUNCTION plan_item_counts_apply();
CREATE TRIGGER plan_items_counted_delete AFTER DELETE ON plan_items
    REFERENCING OLD TABLE AS old_items FOR EACH STATEMENT EXECUTE FUNCTION plan_item_counts_apply();

INSERT INTO plan_item_counts (plan_id, slice_id, state, items)
SELECT plan_id, slice_id, state, count(*) FROM plan_items GROUP BY plan_id, slice_id, state;
