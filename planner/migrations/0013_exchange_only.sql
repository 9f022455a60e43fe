-- A dead letter for which a framework recorded only the exchange and routing
-- key it was published with (Spring AMQP's republishing recoverer, Spring
-- Kafka, Kafka Connect), not the queue it failed in. Its destination reads
-- `exchange/routing-key`; queue mode never publishes it (a routing key is not
-- a queue name), exchange mode publishes it to that exchange with that key
-- (when the exchange is known), a redirect anywhere.
ALTER TABLE dead_letters ADD COLUMN exchange_only BOOLEAN NOT NULL DEFAULT false;

-- Such dead letters used to be stored without a destination and refused as
-- `invalid` by every precheck: give them their route.
UPDATE dead_letters
SET exchange_only = true,
    destination = coalesce(original_exchange, '') || '/' || coalesce(original_routing_key, ''),
    body_problem = NULL
WHERE origin = 'rabbitmq' AND destination = ''
  AND (original_exchange IS NOT NULL OR original_routing_key IS NOT NULL)
  AND body_problem LIKE 'only exchange %';
