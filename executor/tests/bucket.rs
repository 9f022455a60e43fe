//! The token bucket: the GCRA arithmetic over random rates (pure, with
//! `proptest`), then against the real Redis: the bound
//! (`per_second * t + burst` over any window `t`), the rates users reported
//! stalling (15/5, 30/10) without stall or busy loop, the extreme rates, a
//! budget shared by two executors, multi-token grants, bad requests, failing
//! closed while Redis is unreachable, and the in-process bucket's same bound.
//!
//! These are correctness tests with generous margins (85-90% of the bound as
//! the floor), not timing benchmarks.

mod support;

use std::{
    future::Future,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use futures::FutureExt;
use proptest::prelude::*;
use redrive_executor::bucket::{
    Bucket, BucketError, Grant, LocalBucket, MAX_BURST, MAX_PER_SECOND, MIN_PER_SECOND, Rate,
    RateError, RedisBucket, gcra_step,
};
use redrive_executor::redis_topology::RedisConnection;
use support::{REDIS_ADDR, TcpProxy, delete_prefix, redis, redis_url, unique};
use tokio::time::Instant;

const WINDOW: Duration = Duration::from_millis(1500);

/// Runs `test` with a fresh key prefix, then deletes the prefix's keys, also
/// when the test fails.
async fn with_prefix<F, Fut>(test: F)
where
    F: FnOnce(String) -> Fut,
    Fut: Future<Output = ()>,
{
    let prefix = unique("redrive-test-bucket:");
    let outcome = std::panic::AssertUnwindSafe(test(prefix.clone()))
        .catch_unwind()
        .await;
    delete_prefix(&mut redis().await, &prefix).await;
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

async fn redis_bucket(prefix: &str) -> RedisBucket {
    RedisBucket::connect(&redis_url(REDIS_ADDR), prefix, Duration::from_secs(2))
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
    with_prefix(|prefix| async move {
        let bucket = Bucket::Redis(redis_bucket(&prefix).await);
        assert!(bucket.is_shared());
        let rate = Rate::new(200.0, 10).unwrap();

        let granted = take_for(&bucket, "orders", rate, 1, WINDOW).await;

        assert_within(granted, rate, WINDOW);
    })
    .await;
}

#[tokio::test]
async fn two_executors_share_one_budget_per_destination() {
    with_prefix(|prefix| async move {
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
    })
    .await;
}

#[tokio::test]
async fn multi_token_acquire_counts_every_token() {
    with_prefix(|prefix| async move {
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
    })
    .await;
}

#[tokio::test]
async fn bad_requests_are_errors_that_name_the_field() {
    with_prefix(|prefix| async move {
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
            // The accepted ranges: 0.001 to 1,000,000 a second, burst up to
            // 1,000,000.
            for per_second in [MIN_PER_SECOND / 2.0, MAX_PER_SECOND * 1.5] {
                let out_of_range = Rate {
                    per_second,
                    burst: 1,
                };
                assert!(matches!(
                    bucket.acquire("k", out_of_range, 1).await,
                    Err(BucketError::InvalidRate(RateError::PerSecond(_)))
                ));
            }
            let huge_burst = Rate {
                per_second: 10.0,
                burst: MAX_BURST + 1,
            };
            assert!(matches!(
                bucket.acquire("k", huge_burst, 1).await,
                Err(BucketError::InvalidRate(RateError::Burst(1_000_001)))
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
        assert_eq!(Rate::new(1.0, 0), Err(RateError::Burst(0)));
        assert!(
            Rate::new(-1.0, 1)
                .unwrap_err()
                .to_string()
                .contains("per_second")
        );
        assert!(Rate::new(1.0, 0).unwrap_err().to_string().contains("burst"));
    })
    .await;
}

#[tokio::test]
async fn unreachable_redis_fails_closed_then_recovers() {
    with_prefix(|prefix| async move {
        let proxy = TcpProxy::start(REDIS_ADDR).await.unwrap();
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
    })
    .await;
}

#[tokio::test]
async fn connecting_to_an_unreachable_redis_is_unavailable() {
    let proxy = TcpProxy::start(REDIS_ADDR).await.unwrap();
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

// ---- The GCRA arithmetic over random rates (pure, no Redis) ----

/// Steps of one simulated caller.
const SIMULATED_STEPS: usize = 2_000;
/// A simulation starts at a realistic clock (2026-01-01, in ns).
const SIMULATION_START: u64 = 1_767_225_600_000_000_000;
const NANOS_PER_SECOND: f64 = 1e9;

/// A valid rate with `per_second` log-uniform over the accepted range, a
/// burst of 1 to 1,000, and a token chunk of 1 to `min(burst, 64)`.
fn rate_and_chunk() -> impl Strategy<Value = (Rate, u32)> {
    (-3.0f64..6.0, 1u32..=1000).prop_flat_map(|(exponent, burst)| {
        let per_second = 10f64.powf(exponent).clamp(MIN_PER_SECOND, MAX_PER_SECOND);
        (
            Just(Rate::new(per_second, burst).unwrap()),
            1..=burst.min(64),
        )
    })
}

/// The most tokens granted in any closed window `[t, t + window_ns]`, over
/// grants `(time_ns, tokens)` in time order.
fn most_in_window(grants: &[(u64, u32)], window_ns: u64) -> u64 {
    let mut most = 0;
    let mut in_window = 0;
    let mut end = 0;
    for (start, &(time, _)) in grants.iter().enumerate() {
        while end < grants.len() && grants[end].0 <= time.saturating_add(window_ns) {
            in_window += u64::from(grants[end].1);
            end += 1;
        }
        most = most.max(in_window);
        in_window -= u64::from(grants[start].1);
    }
    most
}

/// The GCRA bound over a window of `window_ns`: `per_second * t + burst`.
fn window_bound(rate: Rate, window_ns: u64) -> f64 {
    rate.per_second * window_ns as f64 / NANOS_PER_SECOND + f64::from(rate.burst)
}

/// SplitMix64, for the arrival times of a simulated caller.
fn next_random(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    /// A caller that asks again exactly when told: every wait is at least one
    /// emission interval and ends in a grant (no busy loop), the sustained
    /// rate is within 2% of the set rate (in fact 0.1%: `T` is rounded up to
    /// the ns), and no window of 1 s (or of a third of the run) holds more
    /// than `per_second * t + burst`.
    #[test]
    fn a_greedy_caller_gets_the_rate_and_never_more((rate, chunk) in rate_and_chunk()) {
        let interval = rate.emission_interval_ns();
        let mut now = SIMULATION_START;
        let mut tat = None;
        let mut grants = Vec::new();
        for _ in 0..SIMULATED_STEPS {
            let step = gcra_step(tat, now, rate, chunk).unwrap();
            if step.granted {
                grants.push((now, chunk));
                tat = step.tat_ns;
                continue;
            }
            prop_assert_eq!(step.tat_ns, tat, "a refusal changed the state");
            prop_assert!(
                step.retry_after_ns >= interval,
                "retry after {} ns, under one interval ({} ns)", step.retry_after_ns, interval
            );
            now += step.retry_after_ns;
            prop_assert!(gcra_step(tat, now, rate, chunk).unwrap().granted, "refused when told");
        }
        let granted: u64 = grants.iter().map(|&(_, tokens)| u64::from(tokens)).sum();
        let span = grants.last().unwrap().0 - SIMULATION_START;
        prop_assert!(span > 0, "every grant at the start");
        // The first instant takes (up to) the burst; the rest is the rate.
        let sustained = (granted as f64 - f64::from(rate.burst)) * NANOS_PER_SECOND / span as f64;
        prop_assert!(
            sustained >= 0.98 * rate.per_second && sustained <= rate.per_second * (1.0 + 1e-9),
            "sustained {} a second at {:?}", sustained, rate
        );
        for window in [1_000_000_000, span / 3, interval * u64::from(chunk)] {
            let most = most_in_window(&grants, window);
            prop_assert!(
                most as f64 <= window_bound(rate, window),
                "{} tokens within {} ns at {:?}", most, window, rate
            );
        }
    }

    /// Callers arriving at random times with random chunks: a refusal never
    /// says 0 and asking again exactly when told is granted, and no window
    /// holds more than `per_second * t + burst`.
    #[test]
    fn random_arrivals_never_exceed_the_bound((rate, _) in rate_and_chunk(), seed in any::<u64>()) {
        let interval = rate.emission_interval_ns();
        let most_chunk = rate.burst.min(64);
        let mut random = seed;
        let mut now = SIMULATION_START;
        let mut tat = None;
        let mut grants = Vec::new();
        for _ in 0..SIMULATED_STEPS {
            let chunk = 1 + (next_random(&mut random) % u64::from(most_chunk)) as u32;
            let step = gcra_step(tat, now, rate, chunk).unwrap();
            if step.granted {
                grants.push((now, chunk));
                tat = step.tat_ns;
            } else {
                prop_assert!(step.retry_after_ns >= 1);
                prop_assert!(
                    step.retry_after_ns <= interval * u64::from(chunk),
                    "retry after {} ns for {} tokens at {:?}", step.retry_after_ns, chunk, rate
                );
                let when_told = gcra_step(tat, now + step.retry_after_ns, rate, chunk).unwrap();
                prop_assert!(when_told.granted, "refused when told");
            }
            // Next arrival: now, or up to two intervals per token of the chunk later.
            now += next_random(&mut random) % (2 * interval * u64::from(most_chunk) + 1);
        }
        let span = now - SIMULATION_START;
        for window in [1_000_000_000, span / 3, interval, 10 * interval] {
            let most = most_in_window(&grants, window);
            prop_assert!(
                most as f64 <= window_bound(rate, window),
                "{} tokens within {} ns at {:?}", most, window, rate
            );
        }
    }
}

// ---- The rates users reported, and the extremes, against Redis ----

/// Redis's clock, ns since the epoch.
async fn redis_time_ns() -> u64 {
    let (seconds, micros): (u64, u64) = redis::cmd("TIME")
        .query_async(&mut redis().await)
        .await
        .expect("TIME");
    seconds * 1_000_000_000 + micros * 1_000
}

/// One greedy caller of a fresh bucket for `window`: the tokens it got, the
/// successful calls of `acquire`, and the Redis time the run spanned.
struct Run {
    granted: u64,
    acquired: u64,
    span_ns: u64,
}

async fn take_greedily(
    bucket: &RedisBucket,
    key: &str,
    rate: Rate,
    chunk: u32,
    window: Duration,
) -> Run {
    let started_ns = redis_time_ns().await;
    let deadline = Instant::now() + window;
    let mut run = Run {
        granted: 0,
        acquired: 0,
        span_ns: 0,
    };
    while let Ok(answer) = tokio::time::timeout_at(deadline, bucket.acquire(key, rate, chunk)).await
    {
        answer.expect("acquire");
        run.granted += u64::from(chunk);
        run.acquired += 1;
    }
    run.span_ns = redis_time_ns().await - started_ns;
    run
}

/// 15/5 and 30/10 used to grant one run and then answer "retry in 1 µs" for
/// ever. Each rate, with chunks of the burst and smaller: the first full
/// burst is granted at once, the tokens granted over 3 s of Redis time stay
/// within `per_second * t + burst` and reach 90% of it, and the script is
/// called at most once more than the grants plus one refusal per grant (no
/// busy loop).
#[tokio::test]
async fn reported_rates_neither_stall_nor_busy_loop() {
    with_prefix(|prefix| async move {
        const WINDOW: Duration = Duration::from_secs(3);
        let cases = [
            (15.0, 5, 5),
            (15.0, 5, 2),
            (30.0, 10, 10),
            (30.0, 10, 3),
            (7.0, 3, 3),
            (7.0, 3, 2),
            (0.5, 1, 1),
        ];
        let mut runs = Vec::new();
        for (per_second, burst, chunk) in cases {
            let rate = Rate::new(per_second, burst).unwrap();
            let bucket = redis_bucket(&prefix).await;
            runs.push(async move {
                let key = format!("{per_second}-{burst}-{chunk}");
                let first = bucket.try_acquire(&key, rate, burst).await.unwrap();
                assert_eq!(
                    first,
                    Grant::Granted,
                    "{rate:?}: a fresh bucket refused its burst"
                );
                // Wait out that burst (the bucket is fresh again after τ).
                tokio::time::sleep(Duration::from_nanos(
                    rate.emission_interval_ns() * u64::from(burst),
                ))
                .await;
                let calls_before = bucket.calls();
                let run = take_greedily(&bucket, &key, rate, chunk, WINDOW).await;
                (rate, chunk, run, bucket.calls() - calls_before)
            });
        }
        for (rate, chunk, run, calls) in futures::future::join_all(runs).await {
            let upper = window_bound(rate, run.span_ns);
            let lower = 0.9 * rate.per_second * WINDOW.as_secs_f64() + f64::from(rate.burst)
                - f64::from(chunk);
            eprintln!(
                "{rate:?} chunk {chunk}: {} tokens in {} acquires, {calls} script calls, \
                 {:.3} s of redis time, bound {upper:.1}",
                run.granted,
                run.acquired,
                run.span_ns as f64 / 1e9
            );
            assert!(
                run.granted as f64 <= upper,
                "{rate:?} chunk {chunk}: {} tokens in {} ns, above {upper}",
                run.granted,
                run.span_ns
            );
            assert!(
                run.granted as f64 >= lower,
                "{rate:?} chunk {chunk}: {} tokens, under {lower}",
                run.granted
            );
            // Each grant follows at most one refusal (its wait is exact), and
            // the call the deadline cut short adds one more.
            assert!(
                calls <= 2 * run.acquired + 2,
                "{rate:?} chunk {chunk}: {calls} script calls for {} grants",
                run.acquired
            );
        }
    })
    .await;
}

/// The fastest and the slowest accepted rates: 1,000,000/s grants a burst of
/// 1,000 at once and then keeps granting with at most one refusal per grant;
/// 0.001/s grants one token and then names a wait of 1,000 s (and the key
/// expires then) without asking again meanwhile; an earlier version's key (a
/// µs count) is read as a fresh bucket.
#[tokio::test]
async fn extreme_rates_grant_and_wait_exactly() {
    with_prefix(|prefix| async move {
        let bucket = redis_bucket(&prefix).await;
        let mut connection = redis().await;

        // 1,000,000/s: a burst of 1,000 is one ms of the rate, so after the
        // first grant nearly every acquire waits, for at most 1 ms as told
        // plus the floor, and is then granted.
        let fastest = Rate::new(MAX_PER_SECOND, 1000).unwrap();
        assert_eq!(
            bucket.try_acquire("fast", fastest, 1000).await.unwrap(),
            Grant::Granted
        );
        if let Grant::RetryAfter(wait) = bucket.try_acquire("fast", fastest, 1000).await.unwrap() {
            assert!(
                wait > Duration::ZERO && wait <= Duration::from_millis(1),
                "retry after {wait:?} at 1,000,000/s"
            );
        }
        let calls = bucket.calls();
        let run = take_greedily(&bucket, "fast", fastest, 1000, Duration::from_millis(300)).await;
        let calls = bucket.calls() - calls;
        let upper = window_bound(fastest, run.span_ns);
        eprintln!(
            "{fastest:?}: {} tokens in {} acquires, {calls} calls, bound {upper}",
            run.granted, run.acquired
        );
        assert!(
            run.granted as f64 <= upper,
            "{} tokens above {upper}",
            run.granted
        );
        assert!(
            run.acquired >= 10,
            "{} grants of 1,000 in 300 ms",
            run.acquired
        );
        assert!(
            calls <= 2 * run.acquired + 2,
            "{calls} script calls for {} grants",
            run.acquired
        );

        let slowest = Rate::new(MIN_PER_SECOND, 1).unwrap();
        assert_eq!(
            bucket.try_acquire("slow", slowest, 1).await.unwrap(),
            Grant::Granted
        );
        match bucket.try_acquire("slow", slowest, 1).await.unwrap() {
            Grant::RetryAfter(wait) => assert!(
                wait > Duration::from_secs(999) && wait <= Duration::from_secs(1000),
                "retry after {wait:?} at 0.001/s"
            ),
            Grant::Granted => panic!("a second token at 0.001/s"),
        }
        let ttl_ms: i64 = redis::cmd("PTTL")
            .arg(bucket.redis_key("slow"))
            .query_async(&mut connection)
            .await
            .unwrap();
        assert!(
            (990_000..=1_000_000).contains(&ttl_ms),
            "the key expires in {ttl_ms} ms, not at its TAT (1,000 s)"
        );
        let calls = bucket.calls();
        let waited = tokio::time::timeout(
            Duration::from_millis(300),
            bucket.acquire("slow", slowest, 1),
        )
        .await;
        assert!(waited.is_err(), "a token at 0.001/s within 300 ms");
        assert_eq!(bucket.calls() - calls, 1, "asked again while told to wait");

        an_old_format_key_counts_as_fresh(&bucket, &mut connection, slowest).await;
    })
    .await;
}

/// An earlier version's key (the TAT as a plain µs count) is read as a
/// fresh bucket: granted, and stored again as `"SEC NSEC"`.
async fn an_old_format_key_counts_as_fresh(
    bucket: &RedisBucket,
    connection: &mut RedisConnection,
    slowest: Rate,
) {
    // An earlier version stored the TAT as a plain µs count.
    let old_key = bucket.redis_key("old-format");
    let () = redis::cmd("SET")
        .arg(&old_key)
        .arg("9999999999999999")
        .arg("PX")
        .arg(60_000)
        .query_async(connection)
        .await
        .unwrap();
    assert_eq!(
        bucket.try_acquire("old-format", slowest, 1).await.unwrap(),
        Grant::Granted
    );
    let stored: String = redis::cmd("GET")
        .arg(&old_key)
        .query_async(connection)
        .await
        .unwrap();
    let limbs: Vec<u64> = stored
        .split(' ')
        .map(|limb| limb.parse().expect("integer limbs"))
        .collect();
    assert!(
        limbs.len() == 2 && limbs[1] < 1_000_000_000,
        "stored TAT {stored:?}, not \"SEC NSEC\""
    );
}

/// The in-process bucket (governor) at the reported rates: no stall with
/// chunks of the burst, and the bound over the run.
#[tokio::test]
async fn local_bucket_handles_the_reported_rates() {
    const WINDOW: Duration = Duration::from_secs(3);
    let bucket = Arc::new(Bucket::Local(LocalBucket::new()));
    let mut callers = Vec::new();
    for (per_second, burst, chunk) in [(15.0, 5, 5), (30.0, 10, 10), (7.0, 3, 2), (0.5, 1, 1)] {
        let bucket = Arc::clone(&bucket);
        let rate = Rate::new(per_second, burst).unwrap();
        callers.push(tokio::spawn(async move {
            let key = format!("{per_second}-{burst}-{chunk}");
            let started = Instant::now();
            let granted = take_for(&bucket, &key, rate, chunk, WINDOW).await;
            (rate, chunk, granted, started.elapsed())
        }));
    }
    for caller in callers {
        let (rate, chunk, granted, elapsed) = caller.await.unwrap();
        let upper = rate.per_second * elapsed.as_secs_f64() + f64::from(rate.burst);
        let lower =
            0.9 * rate.per_second * WINDOW.as_secs_f64() + f64::from(rate.burst) - f64::from(chunk);
        eprintln!("local {rate:?} chunk {chunk}: {granted} tokens, bound {upper:.1}");
        assert!(granted as f64 <= upper, "{rate:?}: {granted} above {upper}");
        assert!(granted as f64 >= lower, "{rate:?}: {granted} under {lower}");
    }
}
