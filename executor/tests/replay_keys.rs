//! The replayed-key record against the real Redis: marks are found, carry the
//! plan id and a TTL, a batch of 1,000 goes in one call, and an unreachable
//! Redis is a retryable error (fail closed).

mod support;

use std::time::Duration;

use redrive_executor::{
    bucket::connect_redis,
    replay_keys::{ReplayKeys, ReplayKeysError, identity},
};
use support::{REDIS_ADDR, TcpProxy, delete_prefix, redis, redis_url, unique};

async fn record(prefix: &str, ttl: Duration) -> ReplayKeys {
    ReplayKeys::new(redis().await, prefix, ttl).expect("valid ttl")
}

/// The record of the local broker's default vhost, as an executor with the
/// default `--amqp-url` keeps it.
async fn local_record(prefix: &str, ttl: Duration) -> ReplayKeys {
    record(prefix, ttl).await.on_broker("127.0.0.1:5672/%2f")
}

#[tokio::test]
async fn marked_keys_are_found_with_their_plan_and_ttl() {
    let prefix = unique("redrive-test-keys:");
    let ttl = Duration::from_secs(3600);
    let keys = local_record(&prefix, ttl).await;
    let message_keys = vec![
        "order-1:pay".to_owned(),
        "order-2:pay".to_owned(),
        "order-3:pay".to_owned(),
    ];

    assert_eq!(
        keys.already_sent(&message_keys).await.unwrap(),
        vec![false, false, false]
    );
    keys.mark_sent(&[
        ("order-1:pay".to_owned(), "plan-a".to_owned()),
        ("order-3:pay".to_owned(), "plan-a".to_owned()),
    ])
    .await
    .unwrap();
    assert_eq!(
        keys.already_sent(&message_keys).await.unwrap(),
        vec![true, false, true]
    );
    assert_eq!(
        keys.sent_by(&message_keys).await.unwrap(),
        vec![Some("plan-a".to_owned()), None, Some("plan-a".to_owned())]
    );

    let mut connection = redis().await;
    let redis_key = format!("{prefix}replayed-on:18:127.0.0.1:5672/%2f:order-1:pay");
    assert_eq!(keys.redis_key("order-1:pay"), redis_key);
    let plan: String = redis::cmd("GET")
        .arg(&redis_key)
        .query_async(&mut connection)
        .await
        .unwrap();
    assert_eq!(plan, "plan-a");
    let pttl_ms: i64 = redis::cmd("PTTL")
        .arg(&redis_key)
        .query_async(&mut connection)
        .await
        .unwrap();
    assert!(
        pttl_ms > 0 && pttl_ms <= 3_600_000,
        "PTTL {pttl_ms} ms for a ttl of {ttl:?}"
    );

    // Marking again overwrites: the newest plan is named, the TTL is fresh.
    keys.mark_sent(&[("order-1:pay".to_owned(), "plan-b".to_owned())])
        .await
        .unwrap();
    let plan: String = redis::cmd("GET")
        .arg(&redis_key)
        .query_async(&mut connection)
        .await
        .unwrap();
    assert_eq!(plan, "plan-b");

    // Empty batches make no call and answer empty.
    assert!(keys.already_sent(&[]).await.unwrap().is_empty());
    keys.mark_sent(&[]).await.unwrap();
    delete_prefix(&mut connection, &prefix).await;
}

#[tokio::test]
async fn marks_expire_after_the_ttl() {
    let prefix = unique("redrive-test-keys:");
    let keys = record(&prefix, Duration::from_millis(200)).await;
    let message_key = vec!["short-lived".to_owned()];
    keys.mark_sent(&[("short-lived".to_owned(), "plan".to_owned())])
        .await
        .unwrap();
    assert_eq!(keys.already_sent(&message_key).await.unwrap(), vec![true]);
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(keys.already_sent(&message_key).await.unwrap(), vec![false]);
    delete_prefix(&mut redis().await, &prefix).await;
}

#[tokio::test]
async fn a_batch_of_a_thousand_in_one_call_each_way() {
    let prefix = unique("redrive-test-keys:");
    let keys = record(&prefix, Duration::from_secs(60)).await;
    let entries: Vec<(String, String)> = (0..1000)
        .map(|index| (format!("order-{index}:ship"), "plan-1000".to_owned()))
        .collect();
    let message_keys: Vec<String> = (0..2000)
        .map(|index| format!("order-{index}:ship"))
        .collect();

    keys.mark_sent(&entries).await.unwrap();
    let sent = keys.already_sent(&message_keys).await.unwrap();

    assert_eq!(sent.len(), 2000);
    assert!(sent[..1000].iter().all(|found| *found));
    assert!(sent[1000..].iter().all(|found| !*found));
    let mut connection = redis().await;
    let stored: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}replayed-on:*"))
        .query_async(&mut connection)
        .await
        .unwrap();
    assert_eq!(stored.len(), 1000);
    delete_prefix(&mut connection, &prefix).await;
    assert_eq!(
        keys.already_sent(&message_keys[..3]).await.unwrap(),
        vec![false; 3]
    );
}

#[tokio::test]
async fn unreachable_redis_is_a_retryable_error() {
    let prefix = unique("redrive-test-keys:");
    let proxy = TcpProxy::start(REDIS_ADDR).await.unwrap();
    let connection = connect_redis(&redis_url(proxy.addr()), Duration::from_millis(500))
        .await
        .unwrap();
    let keys = ReplayKeys::new(connection, &prefix, Duration::from_secs(60))
        .unwrap()
        .with_call_timeout(Duration::from_millis(500));
    keys.mark_sent(&[("k".to_owned(), "p".to_owned())])
        .await
        .unwrap();

    proxy.cut();
    let read = keys.already_sent(&["k".to_owned()]).await.unwrap_err();
    assert!(
        matches!(read, ReplayKeysError::Unavailable { .. }) && read.is_retryable(),
        "{read:?}"
    );
    let write = keys
        .mark_sent(&[("k2".to_owned(), "p".to_owned())])
        .await
        .unwrap_err();
    assert!(write.is_retryable(), "{write:?}");

    proxy.restore();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let found = loop {
        match keys.already_sent(&["k".to_owned()]).await {
            Ok(found) => break found,
            Err(error) => {
                assert!(tokio::time::Instant::now() < deadline, "{error}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    assert_eq!(found, vec![true]);
    delete_prefix(&mut redis().await, &prefix).await;
}

#[tokio::test]
async fn a_ttl_under_a_millisecond_is_refused() {
    let error = ReplayKeys::new(redis().await, "x:", Duration::from_micros(10))
        .err()
        .expect("refused");
    assert!(matches!(error, ReplayKeysError::InvalidTtl(_)));
    assert!(!error.is_retryable());
}

#[tokio::test]
async fn one_message_key_sent_to_one_queue_is_not_sent_to_another() {
    let prefix = unique("redrive-test-keys:");
    let keys = record(&prefix, Duration::from_secs(60)).await;
    let to_a = identity("a", "order-1");
    let to_b = identity("b", "order-1");
    // A ':' in either part cannot make two identities equal.
    assert_ne!(identity("a:b", "c"), identity("a", "b:c"));
    keys.mark_sent(&[(to_a.clone(), "plan-1".to_owned())])
        .await
        .unwrap();
    assert_eq!(
        keys.sent_by(&[to_a, to_b]).await.unwrap(),
        vec![Some("plan-1".to_owned()), None],
        "the fan-out copy that died in b is still to replay"
    );
    let mut connection = redis().await;
    delete_prefix(&mut connection, &prefix).await;
}

/// Two executors that share one Redis and one prefix but publish to two
/// brokers (or two virtual hosts of one broker) keep separate records: a
/// message id replayed to broker A's `orders` queue is still to replay on
/// broker B's `orders` queue.
#[tokio::test]
async fn one_prefix_two_brokers_keep_separate_records() {
    let prefix = unique("redrive-test-keys:");
    let ttl = Duration::from_secs(60);
    let on_a = record(&prefix, ttl).await.on_broker("127.0.0.1:5672/%2f");
    let on_b = record(&prefix, ttl)
        .await
        .on_broker("127.0.0.1:5672/tenant-b");
    let again_on_a = record(&prefix, ttl).await.on_broker("127.0.0.1:5672/%2f");
    let to_orders = identity("orders", "m-1");
    on_a.mark_sent(&[(to_orders.clone(), "plan-a".to_owned())])
        .await
        .unwrap();
    assert_eq!(
        on_b.sent_by(std::slice::from_ref(&to_orders))
            .await
            .unwrap(),
        vec![None],
        "broker B's orders queue is not broker A's"
    );
    assert_eq!(
        again_on_a
            .sent_by(std::slice::from_ref(&to_orders))
            .await
            .unwrap(),
        vec![Some("plan-a".to_owned())],
        "every executor of broker A sees A's replays"
    );
    // The broker id is length-prefixed: a ':' in it cannot make two keys equal.
    assert_ne!(
        record(&prefix, ttl).await.on_broker("a:1").redis_key("2:b"),
        record(&prefix, ttl).await.on_broker("a").redis_key("1:2:b")
    );
    assert!(
        !on_a.redis_key(&to_orders).contains("guest"),
        "never the credentials"
    );
    let mut connection = redis().await;
    delete_prefix(&mut connection, &prefix).await;
}

/// Keys written before the broker qualified them (`{prefix}replayed-to:…`)
/// are not read: the planner's ledger (`key_replayed` in each lease) covers
/// those replays.
#[tokio::test]
async fn keys_of_the_former_format_are_not_read() {
    let prefix = unique("redrive-test-keys:");
    let keys = record(&prefix, Duration::from_secs(60))
        .await
        .on_broker("127.0.0.1:5672/%2f");
    let to_orders = identity("orders", "m-1");
    let mut connection = redis().await;
    let _: () = redis::cmd("SET")
        .arg(format!("{prefix}replayed-to:{to_orders}"))
        .arg("plan-old")
        .arg("PX")
        .arg(60_000)
        .query_async(&mut connection)
        .await
        .unwrap();
    assert_eq!(
        keys.sent_by(std::slice::from_ref(&to_orders))
            .await
            .unwrap(),
        vec![None]
    );
    delete_prefix(&mut connection, &prefix).await;
}

#[test]
fn broker_ids_name_host_port_and_vhost_never_credentials() {
    use redrive_proto::settings::broker_id_of;
    assert_eq!(
        broker_id_of("amqp://guest:secret@127.0.0.1:5672/%2f").unwrap(),
        "127.0.0.1:5672/%2f"
    );
    assert_eq!(
        broker_id_of("amqp://guest:secret@RabbitMQ.Example:5672/tenant-b").unwrap(),
        "rabbitmq.example:5672/tenant-b"
    );
    assert_eq!(
        broker_id_of("amqp://localhost").unwrap(),
        "localhost:5672/%2f",
        "RabbitMQ's default port and vhost"
    );
    assert_eq!(
        broker_id_of("amqps://u:p@mq:5671/a%2fb").unwrap(),
        "mq:5671/a%2fb"
    );
    assert_ne!(
        broker_id_of("amqp://mq/a").unwrap(),
        broker_id_of("amqp://mq/b").unwrap()
    );
    assert!(broker_id_of("http://mq").is_err());
    // Buckets too: one prefix, two brokers, two keys.
    assert_ne!(
        redrive_executor::bucket::key_prefix_for("redrive:", "mq:5672/a"),
        redrive_executor::bucket::key_prefix_for("redrive:", "mq:5672/b")
    );
}

fn item(
    exchange: &str,
    routing_key: &str,
    died_in: &str,
    death_exchange: &str,
    death_key: &str,
) -> redrive_executor::item::LeasedItem {
    use redrive_proto::v1;
    redrive_executor::item::LeasedItem {
        exchange: exchange.to_owned(),
        routing_key: routing_key.to_owned(),
        dead_letter: v1::DeadLetter {
            origin: v1::Origin::Rabbitmq.into(),
            destination: died_in.to_owned(),
            death: Some(v1::Death {
                queue: died_in.to_owned(),
                exchange: death_exchange.to_owned(),
                routing_keys: vec![death_key.to_owned()],
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    }
}

/// The bucket is keyed by the queue a message lands in, whatever route it
/// takes there: queue mode (`/orders`), exchange mode along the death
/// (`orders-x/order.paid` for a dead letter that died in `orders`) and a
/// redirect through the default exchange to `orders` share one budget; a
/// redirect through a named exchange is keyed by its route.
#[test]
fn the_bucket_is_keyed_by_the_landing_queue() {
    use redrive_executor::outcomes::landing;
    let queue_mode = item("", "orders", "orders", "orders-x", "order.paid");
    let exchange_mode = item("orders-x", "order.paid", "orders", "orders-x", "order.paid");
    let redirect_default = item("", "orders", "payments", "pay-x", "p");
    assert_eq!(landing(&queue_mode), "q:orders");
    assert_eq!(landing(&exchange_mode), "q:orders");
    assert_eq!(landing(&redirect_default), "q:orders");
    // A redirect through a named exchange: the bindings decide.
    let redirect = item("quarantine-x", "q", "orders", "orders-x", "order.paid");
    assert_eq!(landing(&redirect), "x:12:quarantine-x/q");
    // Exchange mode for a fan-out's copies that died in a and b: two queues.
    let to_a = item("fan", "", "a", "fan", "");
    let to_b = item("fan", "", "b", "fan", "");
    assert_eq!(landing(&to_a), "q:a");
    assert_eq!(landing(&to_b), "q:b");
    // A dead letter whose queue is unknown (a framework named only the
    // exchange and key): the route.
    let mut exchange_only = item("orders-x", "order.paid", "orders-x/order.paid", "", "");
    exchange_only.dead_letter.exchange_only = true;
    exchange_only.dead_letter.death = None;
    assert_eq!(landing(&exchange_only), "x:8:orders-x/order.paid");
    // A queue name cannot pass for a route, nor the reverse.
    assert_ne!(
        landing(&item("", "x:1:a/b", "z", "", "")),
        landing(&item("a", "b", "z", "", ""))
    );
}
