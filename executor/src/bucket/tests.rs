//! The exact arithmetic: `T` itself, the Redis script against
//! [`gcra_step`] at explicit times (real Redis), and `governor` against
//! [`gcra_step`] on a fake clock.

use std::num::NonZeroU32;

use futures::FutureExt;
use governor::clock::{Clock, FakeRelativeClock};

use governor::RateLimiter;
use redis::Script;

use crate::redis_topology::RedisConnection;

use super::{in_redis::GCRA_SCRIPT_AT, local::quota, *};

/// SplitMix64: a small deterministic generator, so a failure replays.
struct Random(u64);

impl Random {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..bound` (`bound > 0`; the modulo bias is irrelevant here).
    fn below(&mut self, bound: u64) -> u64 {
        self.next() % bound
    }

    /// A valid rate: mostly log-uniform, sometimes one of the rates users
    /// reported or an extreme.
    fn rate(&mut self) -> Rate {
        const KNOWN: [(f64, u32); 8] = [
            (15.0, 5),
            (30.0, 10),
            (7.0, 3),
            (0.5, 1),
            (20.0, 5),
            (1_000_000.0, 1000),
            (0.001, 1),
            (0.001, 1_000_000),
        ];
        if self.below(3) == 0 {
            let (per_second, burst) = KNOWN[self.below(KNOWN.len() as u64) as usize];
            return Rate::new(per_second, burst).unwrap();
        }
        let unit = self.next() as f64 / u64::MAX as f64;
        let per_second = 10f64
            .powf(-3.0 + 9.0 * unit)
            .clamp(MIN_PER_SECOND, MAX_PER_SECOND);
        let burst = 1 + self.below(1000) as u32;
        Rate::new(per_second, burst).unwrap()
    }

    fn tokens(&mut self, rate: Rate) -> u32 {
        1 + self.below(u64::from(rate.burst.min(64))) as u32
    }
}

#[test]
fn emission_interval_is_the_exact_ceiling() {
    for (per_second, expected) in [
        (15.0, 66_666_667),
        (30.0, 33_333_334),
        (7.0, 142_857_143),
        (20.0, 50_000_000),
        (0.5, 2_000_000_000),
        (0.25, 4_000_000_000),
        (MAX_PER_SECOND, 1_000),
        // 0.001 is stored a little above 1/1000, so 1e9 / it is just
        // under 1e12 and rounds up to it.
        (MIN_PER_SECOND, 1_000_000_000_000),
        (0.1, 10_000_000_000),
        // 0.3 is stored a little below 3/10: the quotient is just above
        // 3,333,333,333.33.
        (0.3, 3_333_333_334),
    ] {
        let rate = Rate::new(per_second, 1).unwrap();
        assert_eq!(rate.emission_interval_ns(), expected, "{per_second}/s");
    }
    for per_second in 1..=1_000_000_u64 {
        let rate = Rate::new(per_second as f64, 1).unwrap();
        assert_eq!(
            rate.emission_interval_ns(),
            NANOS_PER_SECOND.div_ceil(per_second),
            "{per_second}/s"
        );
    }
}

#[test]
fn rates_outside_the_bounds_are_refused_by_field() {
    for per_second in [0.0, 0.000_999, 1_000_000.5, -1.0, f64::NAN, f64::INFINITY] {
        let error = Rate::new(per_second, 1).unwrap_err();
        assert!(matches!(error, RateError::PerSecond(_)), "{error:?}");
        assert!(error.to_string().contains("per_second"), "{error}");
    }
    for burst in [0, MAX_BURST + 1, u32::MAX] {
        let error = Rate::new(1.0, burst).unwrap_err();
        assert_eq!(error, RateError::Burst(burst));
        assert!(error.to_string().contains("burst"), "{error}");
    }
    assert!(Rate::new(MIN_PER_SECOND, MAX_BURST).is_ok());
    assert!(Rate::new(MAX_PER_SECOND, 1).is_ok());
}

/// Sets the bucket key `key` to `stored` (deletes it for `None`).
async fn store(connection: &mut RedisConnection, key: &str, stored: Option<&str>) {
    match stored {
        Some(value) => {
            let () = redis::cmd("SET")
                .arg(key)
                .arg(value)
                .arg("PX")
                .arg(600_000)
                .query_async(connection)
                .await
                .unwrap();
        }
        None => {
            let _: i64 = redis::cmd("DEL")
                .arg(key)
                .query_async(connection)
                .await
                .unwrap();
        }
    }
}

/// The answer of [`GCRA_SCRIPT_AT`] (`script`) for `tokens` of `rate` at
/// `now` ns.
async fn script_at(
    script: &Script,
    connection: &mut RedisConnection,
    key: &str,
    rate: Rate,
    tokens: u32,
    now: u64,
) -> (i64, i64, i64) {
    let (increment, tolerance) = costs(rate, tokens).unwrap();
    let (now_s, now_ns) = split_ns(now);
    let (increment_s, increment_ns) = split_ns(increment);
    let (tolerance_s, tolerance_ns) = split_ns(tolerance);
    script
        .key(key)
        .arg(increment_s)
        .arg(increment_ns)
        .arg(tolerance_s)
        .arg(tolerance_ns)
        .arg(now_s)
        .arg(now_ns)
        .invoke_async(connection)
        .await
        .unwrap()
}

/// The Lua arithmetic and the pure function make the same decision, give
/// the same wait and store the same TAT (and a key expiry at the TAT),
/// from the same state at the same time, across carries, fresh and
/// old-format keys.
#[tokio::test]
async fn the_script_and_gcra_step_agree() {
    let mut connection = connect_redis("redis://127.0.0.1:6379/", Duration::from_secs(5))
        .await
        .expect("the local redis answers");
    let key = format!("redrive-test-bucket-unit:{}", uuid::Uuid::new_v4().simple());
    let run = {
        let mut connection = connection.clone();
        let key = key.clone();
        async move {
            let script = Script::new(GCRA_SCRIPT_AT);
            let mut random = Random(0x5eed_0010);
            let mut granted = 0;
            for step in 0..400 {
                let rate = random.rate();
                let tokens = random.tokens(rate);
                let (_, tolerance) = costs(rate, tokens).unwrap();
                // A realistic clock: 2026 plus up to ~30 years, any ns.
                let now = 1_767_225_600 * NANOS_PER_SECOND
                    + random.below(1_000_000_000 * NANOS_PER_SECOND);
                let old_format = random.below(10) == 0;
                let tat = match random.below(5) {
                    0 => None,
                    // Up to τ in the past, up to 2τ in the future.
                    _ => Some(now - tolerance + random.below(3 * tolerance + 1)),
                };
                let stored: Option<String> = match tat {
                    _ if old_format => Some(format!("{}", now / 1000)),
                    None => None,
                    Some(tat) => {
                        let (s, ns) = split_ns(tat);
                        Some(format!("{s} {ns}"))
                    }
                };
                store(&mut connection, &key, stored.as_deref()).await;
                let expected =
                    gcra_step(if old_format { None } else { tat }, now, rate, tokens).unwrap();

                let answer = script_at(&script, &mut connection, &key, rate, tokens, now).await;
                let context =
                    format!("step {step}: {rate:?}, {tokens} tokens, now {now}, stored {stored:?}");
                let (wait_s, wait_ns) = split_ns(expected.retry_after_ns);
                let expected_answer = (
                    i64::from(expected.granted),
                    if expected.granted { 0 } else { wait_s as i64 },
                    if expected.granted { 0 } else { wait_ns as i64 },
                );
                assert_eq!(answer, expected_answer, "{context}");

                let (value, ttl_ms): (Option<String>, i64) = redis::pipe()
                    .cmd("GET")
                    .arg(&key)
                    .cmd("PTTL")
                    .arg(&key)
                    .query_async(&mut connection)
                    .await
                    .unwrap();
                if expected.granted {
                    granted += 1;
                    let new_tat = expected.tat_ns.unwrap();
                    let (s, ns) = split_ns(new_tat);
                    let expiry_ms = (new_tat - now).div_ceil(1_000_000).max(1) as i64;
                    // The expiry runs on Redis's real clock while `now` is
                    // made up: a key set to expire within a few ms may be
                    // gone by the time it is read (a fresh bucket, which is
                    // what its state equals then).
                    if value.is_some() {
                        assert_eq!(value, Some(format!("{s} {ns}")), "{context}");
                        assert!(
                            ttl_ms <= expiry_ms && ttl_ms >= expiry_ms - 1_000,
                            "{context}: PTTL {ttl_ms}, expected {expiry_ms} ms"
                        );
                    } else {
                        assert!(
                            expiry_ms < 1_000,
                            "{context}: the key is gone although it expires in {expiry_ms} ms"
                        );
                    }
                } else {
                    assert_eq!(value, stored, "{context}: a refusal changed the key");
                }
            }
            // Both branches were exercised.
            assert!((50..350).contains(&granted), "{granted} of 400 granted");
        }
    };
    let outcome = std::panic::AssertUnwindSafe(run).catch_unwind().await;
    let _: i64 = redis::cmd("DEL")
        .arg(&key)
        .query_async(&mut connection)
        .await
        .unwrap();
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

/// `governor` (the in-process bucket) decides as [`gcra_step`] does and
/// names the same wait, to the ns, on a fake clock.
#[test]
fn governor_and_gcra_step_agree() {
    let mut random = Random(0x5eed_0020);
    for case in 0..200 {
        let rate = random.rate();
        let clock = FakeRelativeClock::default();
        let limiter = RateLimiter::direct_with_clock(quota(rate).unwrap(), clock.clone());
        let interval = rate.emission_interval_ns();
        let mut now = 0_u64;
        let mut tat = None;
        for step in 0..50 {
            let tokens = random.tokens(rate);
            let expected = gcra_step(tat, now, rate, tokens).unwrap();
            let actual = limiter.check_n(NonZeroU32::new(tokens).unwrap()).unwrap();
            let context = format!("case {case} step {step}: {rate:?}, {tokens} tokens");
            match actual {
                Ok(()) => assert!(expected.granted, "{context}: only governor granted"),
                Err(not_until) => {
                    assert!(!expected.granted, "{context}: only gcra_step granted");
                    assert_eq!(
                        not_until.wait_time_from(clock.now()),
                        Duration::from_nanos(expected.retry_after_ns),
                        "{context}"
                    );
                }
            }
            tat = expected.tat_ns;
            // Often exactly when told, otherwise up to two intervals per token.
            let advance = if !expected.granted && random.below(2) == 0 {
                expected.retry_after_ns
            } else {
                random.below(2 * interval * u64::from(tokens) + 1)
            };
            now += advance;
            clock.advance(Duration::from_nanos(advance));
        }
    }
}

/// The in-process bucket paces on tokio's clock: at 10 a second with a
/// burst of 4, on a paused clock, the burst goes at once and each further
/// token 100 ms after the one before, so 24 single tokens take 2 s of
/// (virtual) time, to within the waits' 1 ms floor; a new rate for the key
/// starts with a full burst.
#[tokio::test(start_paused = true)]
async fn the_local_bucket_paces_on_tokios_clock() {
    let bucket = LocalBucket::new();
    let rate = Rate::new(10.0, 4).unwrap();
    let started = tokio::time::Instant::now();
    let mut granted_at = Vec::new();
    for _ in 0..24 {
        bucket.acquire("q:orders", rate, 1).await.unwrap();
        granted_at.push(started.elapsed().as_millis());
    }
    assert_eq!(granted_at[..4], [0, 0, 0, 0], "the burst at once");
    for (index, at) in granted_at.iter().enumerate().skip(4) {
        let due = (index as u128 - 3) * 100;
        assert!(
            (due..=due + 1).contains(at),
            "token {index} at {at} ms, due at {due} ms: {granted_at:?}"
        );
    }
    // Another destination has a bucket of its own, full.
    let before = started.elapsed();
    bucket.acquire("q:invoices", rate, 4).await.unwrap();
    assert_eq!(
        started.elapsed(),
        before,
        "another destination waits for nothing"
    );
}
