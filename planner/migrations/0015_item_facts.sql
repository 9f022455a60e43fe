-- Per-item facts decided once (docs/design.md, "Plan items"): the precheck
-- records when each item turns stale under its options; a plan item records
-- where it is published (exchange, routing key) and that deadline when the
-- plan is created. The coordinator and the executor read them; nothing
-- recomputes them from the precheck's options or the dead letter later.
ALTER TABLE precheck_items ADD COLUMN stale_at TIMESTAMPTZ;
ALTER TABLE plan_items
    ADD COLUMN exchange TEXT,
    ADD COLUMN routing_key TEXT,
    ADD COLUMN stale_at TIMESTAMPTZ;

-- Plans created before: their route by the same rule (planner/src/store/
-- plans.rs, ITEM_EXCHANGE_SQL and ITEM_ROUTING_KEY_SQL); no send-time
-- deadline is recorded for them (the precheck's options were not kept per
-- item), so their remaining items are not checked for staleness at send.
UPDATE plan_items i SET
    exchange = CASE p.destination_mode
        WHEN 'redirect' THEN coalesce(p.redirect_exchange, '')
        WHEN 'exchange' THEN CASE
            WHEN coalesce(d.death_exchange, '') <> '' OR coalesce(cardinality(d.death_routing_keys), 0) > 0
                THEN coalesce(d.death_exchange, '')
            WHEN d.original_exchange IS NOT NULL THEN d.original_exchange
            WHEN strpos(d.destination, '/') > 0 THEN split_part(d.destination, '/', 1)
            ELSE '' END
        ELSE CASE WHEN (d.origin <> 'rabbitmq' OR d.exchange_only) AND strpos(d.destination, '/') > 0
                  THEN split_part(d.destination, '/', 1) ELSE '' END END,
    routing_key = CASE p.destination_mode
        WHEN 'redirect' THEN coalesce(p.redirect_routing_key, '')
        WHEN 'exchange' THEN CASE
            WHEN coalesce(d.death_exchange, '') <> '' OR coalesce(cardinality(d.death_routing_keys), 0) > 0
                THEN coalesce(d.death_routing_keys[1], '')
            WHEN d.original_exchange IS NOT NULL THEN coalesce(d.original_routing_key, '')
            WHEN strpos(d.destination, '/') > 0
                THEN substr(d.destination, strpos(d.destination, '/') + 1)
            ELSE d.destination END
        ELSE CASE WHEN (d.origin <> 'rabbitmq' OR d.exchange_only) AND strpos(d.destination, '/') > 0
                  THEN substr(d.destination, strpos(d.destination, '/') + 1)
                  ELSE d.destination END END
FROM plans p, dead_letters d
WHERE p.id = i.plan_id AND d.id = i.dead_letter_id;
