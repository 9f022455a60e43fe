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

#[tokio::test]
async fn marked_keys_are_found_with_their_plan_and_ttl() {
    let prefix = unique("redrive-test-keys:");
    let ttl = Duration::from_secs(3600);
    let keys = record(&prefix, ttl).await;
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
    let redis_key = format!("{prefix}replayed-to:order-1:pay");
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
        .arg(format!("{prefix}replayed-to:*"))
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
