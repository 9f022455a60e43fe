//! The token bucket against the real Redis: the GCRA bound
//! (`per_second * t + burst` over any window `t`), a budget shared by two
//! executors, multi-token grants, bad requests, failing closed while Redis is
//! unreachable, and the in-process bucket's same bound.
//!
//! These are correctness tests with generous margins (85% of the bound as the
//! floor), not timing benchmarks.

mod support;

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use redrive_executor::bucket::{
    Bucket, BucketError, Grant, LocalBucket, Rate, RateError, RedisBucket,
};
use support::{REDIS_ADDR, TcpProxy, delete_prefix, redis, redis_url, unique};
use tokio::time::Instant;

const WINDOW: Duration = Duration::from_millis(1500);

async fn redis_bucket(prefix: &str) -> RedisBucket {
    RedisBucket::connect(
        &redis_url(REDIS_ADDR.parse().unwrap()),
        prefix,
        Duration::from_secs(2),
    )
    .await
    .expect("redis bucket")
}

/// Takes `tokens` at a time from `key` until `window` has passed; returns the
/// tokens whose grant was seen within `window` of the start. (The timer may
/// fire up to a millisecond late, so the deadline alone is not the measure.)
async fn take_for(bucket: &Bucket, key: &str, rate: Rate, tokens: u32, window: Duration) -> u64 {
    let started = Instant::now();
    let deadline = started + window;
    let mut granted = 0;
    while let Ok(answer) =
        tokio::time::timeout_at(deadline, bucket.acquire(key, rate, tokens)).await
    {
        answer.expect("acquire");
        if started.elapsed() <= window {
            granted += u64::from(tokens);
        }
    }
    granted
}

fn bound(rate: Rate, window: Duration) -> f64 {
    rate.per_second * window.as_secs_f64() + f64::from(rate.burst)
}

fn assert_within(granted: u64, rate: Rate, window: Duration) {
    let bound = bound(rate, window);
    eprintln!("{granted} tokens in {window:?} at {rate:?}, bound {bound}");
    assert!(
        granted as f64 <= bound,
        "{granted} tokens granted in {window:?} at {rate:?}: above the bound {bound}"
    );
    assert!(
        granted as f64 >= 0.85 * bound,
        "{granted} tokens granted in {window:?} at {rate:?}: under 85% of the bound {bound}"
    );
}

#[tokio::test]
async fn one_caller_gets_rate_times_time_plus_burst() {
    let prefix = unique("redrive-test-bucket:");
    let bucket = Bucket::Redis(redis_bucket(&prefix).await);
    assert!(bucket.is_shared());
    let rate = Rate::new(200.0, 10).unwrap();

    let granted = take_for(&bucket, "orders", rate, 1, WINDOW).await;

    assert_within(granted, rate, WINDOW);
    delete_prefix(&mut redis().await, &prefix).await;
}

#[tokio::test]
async fn two_executors_share_one_budget_per_destination() {
    let prefix = unique("redrive-test-bucket:");
    // Two executors: separate connections, same Redis and prefix.
    let first = Arc::new(Bucket::Redis(redis_bucket(&prefix).await));
    let second = Arc::new(Bucket::Redis(redis_bucket(&prefix).await));
    let rate = Rate::new(200.0, 10).unwrap();

    let mut callers = Vec::new();
    for (bucket, key) in [
        (&first, "orders"),
        (&second, "orders"),
        (&first, "payments"),
    ] {
        let bucket = Arc::clone(bucket);
        callers.push(tokio::spawn(async move {
            take_for(&bucket, key, rate, 1, WINDOW).await
        }));
    }
    let mut granted = Vec::new();
    for caller in callers {
        granted.push(caller.await.unwrap());
    }

    let orders = granted[0] + granted[1];
    assert_within(orders, rate, WINDOW);
    assert!(
        granted[0] > 0 && granted[1] > 0,
        "both executors got tokens: {granted:?}"
    );
    // Another destination has its own budget, untouched by the first.
    assert_within(granted[2], rate, WINDOW);
    delete_prefix(&mut redis().await, &prefix).await;
}

#[tokio::test]
async fn multi_token_acquire_counts_every_token() {
    let prefix = unique("redrive-test-bucket:");
    let redis_bucket = redis_bucket(&prefix).await;
    let rate = Rate::new(100.0, 20).unwrap();

    // A full burst at once, then nothing until one emission interval (10 ms).
    assert_eq!(
        redis_bucket.try_acquire("batch", rate, 20).await.unwrap(),
        Grant::Granted
    );
    match redis_bucket.try_acquire("batch", rate, 1).await.unwrap() {
        Grant::RetryAfter(wait) => assert!(
            wait > Duration::ZERO && wait <= Duration::from_millis(10),
            "retry after {wait:?}"
        ),
        Grant::Granted => panic!("a 21st token was granted inside the burst"),
    }
    // Five at a time: the bound still holds in tokens.
    let fresh = Rate::new(100.0, 20).unwrap();
    let bucket = Bucket::Redis(redis_bucket);
    let granted = take_for(&bucket, "batch-5", fresh, 5, Duration::from_secs(1)).await;
    assert_within(granted, fresh, Duration::from_secs(1));
    delete_prefix(&mut redis().await, &prefix).await;
}

#[tokio::test]
async fn bad_requests_are_errors_that_name_the_field() {
    let prefix = unique("redrive-test-bucket:");
    let bucket = Bucket::Redis(redis_bucket(&prefix).await);
    let local = Bucket::Local(LocalBucket::new());
    let rate = Rate::new(10.0, 5).unwrap();

    for bucket in [&bucket, &local] {
        let too_many = bucket.acquire("k", rate, 6).await.unwrap_err();
        assert!(
            matches!(
                too_many,
                BucketError::InvalidTokens {
                    tokens: 6,
                    burst: 5
                }
            ),
            "{too_many:?}"
        );
        assert!(!too_many.is_retryable());
        assert!(matches!(
            bucket.acquire("k", rate, 0).await,
            Err(BucketError::InvalidTokens { tokens: 0, .. })
        ));
        let zero_rate = Rate {
            per_second: 0.0,
            burst: 5,
        };
        assert!(matches!(
            bucket.acquire("k", zero_rate, 1).await,
            Err(BucketError::InvalidRate(RateError::PerSecond(_)))
        ));
    }

    assert!(matches!(
        Rate::new(f64::NAN, 1),
        Err(RateError::PerSecond(_))
    ));
    assert!(matches!(
        Rate::new(f64::INFINITY, 1),
        Err(RateError::PerSecond(_))
    ));
    assert!(matches!(Rate::new(-1.0, 1), Err(RateError::PerSecond(_))));
    assert_eq!(Rate::new(1.0, 0), Err(RateError::Burst));
    assert!(
        Rate::new(-1.0, 1)
            .unwrap_err()
            .to_string()
            .contains("per_second")
    );
    assert!(Rate::new(1.0, 0).unwrap_err().to_string().contains("burst"));
    delete_prefix(&mut redis().await, &prefix).await;
}

#[tokio::test]
async fn unreachable_redis_fails_closed_then_recovers() {
    let prefix = unique("redrive-test-bucket:");
    let proxy = TcpProxy::start(REDIS_ADDR).await;
    let call_timeout = Duration::from_millis(500);
    let bucket = Bucket::Redis(
        RedisBucket::connect(&redis_url(proxy.addr()), &prefix, call_timeout)
            .await
            .expect("bucket through the proxy"),
    );
    let rate = Rate::new(1000.0, 10).unwrap();
    bucket
        .acquire("orders", rate, 1)
        .await
        .expect("before the cut");

    proxy.cut();
    for _ in 0..3 {
        let started = Instant::now();
        let error = bucket
            .acquire("orders", rate, 1)
            .await
            .expect_err("no token while redis is unreachable");
        assert!(
            matches!(error, BucketError::Unavailable { .. }),
            "{error:?}"
        );
        assert!(error.is_retryable());
        assert!(
            started.elapsed() <= call_timeout + Duration::from_millis(500),
            "unavailable after {:?}, the call timeout is {call_timeout:?}",
            started.elapsed()
        );
    }

    proxy.restore();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match bucket.acquire("orders", rate, 1).await {
            Ok(()) => break,
            Err(error) => {
                assert!(error.is_retryable(), "{error:?}");
                assert!(
                    Instant::now() < deadline,
                    "still unavailable 20 s after the restore: {error}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    delete_prefix(&mut redis().await, &prefix).await;
}

#[tokio::test]
async fn connecting_to_an_unreachable_redis_is_unavailable() {
    let proxy = TcpProxy::start(REDIS_ADDR).await;
    proxy.cut();
    let error = RedisBucket::connect(
        &redis_url(proxy.addr()),
        "unused:",
        Duration::from_millis(500),
    )
    .await
    .err()
    .expect("no bucket without redis");
    assert!(error.is_retryable(), "{error:?}");
}

#[tokio::test]
async fn local_bucket_respects_the_same_bound() {
    let bucket = Arc::new(Bucket::Local(LocalBucket::new()));
    assert!(!bucket.is_shared());
    let rate = Rate::new(200.0, 10).unwrap();
    let total = Arc::new(AtomicU64::new(0));

    // Two callers on one destination share it; another destination is apart.
    let mut callers = Vec::new();
    for key in ["orders", "orders", "payments"] {
        let bucket = Arc::clone(&bucket);
        let total = Arc::clone(&total);
        callers.push(tokio::spawn(async move {
            let granted = take_for(&bucket, key, rate, 1, WINDOW).await;
            if key == "orders" {
                total.fetch_add(granted, Ordering::SeqCst);
            }
            granted
        }));
    }
    let mut granted = Vec::new();
    for caller in callers {
        granted.push(caller.await.unwrap());
    }
    assert_within(total.load(Ordering::SeqCst), rate, WINDOW);
    assert_within(granted[2], rate, WINDOW);

    let multi = take_for(&bucket, "batch", rate, 5, Duration::from_secs(1)).await;
    assert_within(multi, rate, Duration::from_secs(1));
}
