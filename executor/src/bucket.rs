//! The shared token bucket: how fast a replay may publish to one destination
//! (docs/design.md, "token bucket").
//!
//! Every executor and every plan that publishes to the same downstream draws
//! from one budget, keyed by destination, so two plans to one queue cannot add
//! up to twice its capacity. The budget is a GCRA (Generic Cell Rate
//! Algorithm, the "virtual scheduling" form of the ATM Forum Traffic
//! Management Specification 4.0 and ITU-T I.371; the same shaping RFC 2697
//! describes with token counters) evaluated inside Redis by one Lua script, so
//! the state is one theoretical arrival time (TAT) per destination and the
//! clock is Redis's own (`TIME`), not the executors'.
//!
//! # Semantics (both implementations)
//!
//! All arithmetic is in whole nanoseconds. The emission interval is
//! `T = ceil(1e9 / per_second)` ns ([`Rate::emission_interval_ns`]), the
//! tolerance `τ = T * burst`, and taking `n` tokens costs `T * n`. A step at
//! time `now` with stored TAT `tat` (a missing or past TAT counts as `now`)
//! computes `new_tat = max(tat, now) + T * n`; it grants when
//! `new_tat <= now + τ` (and stores `new_tat`), otherwise it takes nothing and
//! answers "retry after `new_tat - τ - now`" ns (never 0). [`gcra_step`] is
//! this step as a pure function; the Redis script and the in-process
//! `governor` limiter make the same decisions.
//!
//! So a bucket that has been idle grants `burst` tokens at once and then one
//! every `T`; over any window of length `t`, at most `t / T + burst` tokens
//! are granted, which is at most `per_second * t + burst`. Rounding `T` up to
//! a whole nanosecond can only make the bucket stricter: the sustained rate is
//! `1e9 / T`, under `per_second` by less than 1 ns per token (at most 0.1%, at
//! 1,000,000/s). Asking again exactly when told is granted unless another
//! caller took the tokens meanwhile.
//!
//! # Waiting
//!
//! [`Bucket::acquire`] sleeps between refusals, never less than the answer and
//! never less than [`MIN_WAIT`] (1 ms), so a caller makes at most about one
//! refused call per millisecond, however close the answer. One caller
//! therefore gets at most about `burst` tokens per millisecond plus the Redis
//! round trips: a rate above 1,000/s needs a burst of at least
//! `per_second / 1000` to be reached by one caller.
//!
//! # Redis representation
//!
//! Lua in Redis has only doubles (integers exact up to 2^53, about 104 days
//! in ns), so the script never holds an absolute time in ns: times and
//! durations are pairs (seconds, nanoseconds) and the TAT is stored as the
//! string `"SEC NSEC"` under `{prefix}{destination}`. The key expires (`PX`,
//! at least 1 ms) once its TAT has passed, when its state equals a fresh
//! bucket's. A value in any other form, such as the plain µs count earlier
//! versions stored, counts as no value: after an upgrade each destination may
//! grant one extra burst, once. Earlier executors likewise read this form as
//! no value, so the two versions must not run side by side.
//!
//! Fail closed (docs/design.md, "Executor loop and guarantees"): when Redis cannot
//! be reached, [`Bucket::acquire`] returns [`BucketError::Unavailable`] and the
//! caller stops publishing; it never publishes without a token.

use std::{
    collections::HashMap,
    num::NonZeroU32,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use governor::{
    Quota, RateLimiter,
    clock::{Clock, MonotonicClock},
    middleware::NoOpMiddleware,
    state::{InMemoryState, NotKeyed},
};
use redis::{
    Client, Script,
    aio::{ConnectionManager, ConnectionManagerConfig},
};

/// Where bucket keys live in Redis unless configured otherwise: the key of
/// destination `d` is `redrive:bucket:d`.
pub const DEFAULT_KEY_PREFIX: &str = "redrive:bucket:";

/// The key prefix of one broker's buckets under a deployment's Redis prefix:
/// `{redis_prefix}bucket:{broker_id length}:{broker_id}:` (the length keeps a
/// `:` in the broker id from making two prefixes equal). Executors that
/// publish to different brokers or virtual hosts (see
/// `redrive_proto::settings::broker_id_of`) never share a bucket, whatever
/// Redis and prefix they share; every executor of one broker does.
pub fn key_prefix_for(redis_prefix: &str, broker_id: &str) -> String {
    format!("{redis_prefix}bucket:{}:{broker_id}:", broker_id.len())
}

/// How long one Redis call may take before the bucket reports
/// [`BucketError::Unavailable`].
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(2);

/// The shortest sleep of [`Bucket::acquire`] after a refusal, whatever the
/// answer: bounds the calls of a waiting caller to about one per millisecond
/// (see the module docs, "Waiting").
pub const MIN_WAIT: Duration = Duration::from_millis(1);

/// Slowest accepted [`Rate::per_second`]: one token every 1,000 s.
pub const MIN_PER_SECOND: f64 = 0.001;

/// Fastest accepted [`Rate::per_second`]: an emission interval of 1 µs (the
/// planner's limit for a plan's rate).
pub use redrive_proto::limits::MAX_RATE_PER_SECOND as MAX_PER_SECOND;

/// Largest accepted [`Rate::burst`] (the planner's limit for a plan's burst).
pub use redrive_proto::limits::MAX_RATE_BURST as MAX_BURST;

const NANOS_PER_SECOND: u64 = 1_000_000_000;

/// The tolerance of a charge ([`Bucket::charge`]): 10^12 s, more than any
/// TAT can lead the clock, and below 2^53 for the script's exact arithmetic.
const CHARGE_TOLERANCE_S: u64 = 1_000_000_000_000;

/// The body of the GCRA step, after a prelude that sets `now_s`, `now_ns`
/// (the current time as whole seconds and nanoseconds). `KEYS[1]`: the bucket
/// key. `ARGV[1]`, `ARGV[2]`: the cost of the tokens asked for (`T * tokens`)
/// as seconds and nanoseconds; `ARGV[3]`, `ARGV[4]`: the tolerance `τ`
/// likewise. Returns `{1, 0, 0}` when granted, `{0, sec, nsec}` (the wait, at
/// least 1 ns) otherwise. Every time the script holds is a pair of integers
/// below 2^53, so the double arithmetic of Lua is exact.
macro_rules! gcra_script_body {
    () => {
        r"
local BILLION = 1000000000
local inc_s, inc_ns = tonumber(ARGV[1]), tonumber(ARGV[2])
local tol_s, tol_ns = tonumber(ARGV[3]), tonumber(ARGV[4])
local function add(a_s, a_ns, b_s, b_ns)
  local s, ns = a_s + b_s, a_ns + b_ns
  if ns >= BILLION then
    return s + 1, ns - BILLION
  end
  return s, ns
end
local function sub(a_s, a_ns, b_s, b_ns)
  local s, ns = a_s - b_s, a_ns - b_ns
  if ns < 0 then
    return s - 1, ns + BILLION
  end
  return s, ns
end
local function less(a_s, a_ns, b_s, b_ns)
  return a_s < b_s or (a_s == b_s and a_ns < b_ns)
end
local tat_s, tat_ns = now_s, now_ns
local stored = redis.call('GET', KEYS[1])
if stored then
  local s, ns = string.match(stored, '^(%d+) (%d+)$')
  if s then
    s, ns = tonumber(s), tonumber(ns)
    if ns < BILLION and less(now_s, now_ns, s, ns) then
      tat_s, tat_ns = s, ns
    end
  end
end
local new_s, new_ns = add(tat_s, tat_ns, inc_s, inc_ns)
local limit_s, limit_ns = add(now_s, now_ns, tol_s, tol_ns)
if less(limit_s, limit_ns, new_s, new_ns) then
  local wait_s, wait_ns = sub(new_s, new_ns, limit_s, limit_ns)
  return {0, wait_s, wait_ns}
end
local ttl_s, ttl_ns = sub(new_s, new_ns, now_s, now_ns)
local ttl_ms = ttl_s * 1000 + math.ceil(ttl_ns / 1000000)
if ttl_ms < 1 then
  ttl_ms = 1
end
redis.call('SET', KEYS[1], string.format('%.0f %.0f', new_s, new_ns), 'PX', string.format('%.0f', ttl_ms))
return {1, 0, 0}
"
    };
}

/// The GCRA step on Redis's clock (`TIME`: seconds and µs); arguments and
/// answer as described on the script body above.
const GCRA_SCRIPT: &str = concat!(
    "local time = redis.call('TIME')\n",
    "local now_s, now_ns = tonumber(time[1]), tonumber(time[2]) * 1000\n",
    gcra_script_body!()
);

/// The same step at an explicit time (`ARGV[5]` seconds, `ARGV[6]`
/// nanoseconds), to compare the script with [`gcra_step`] exactly.
#[cfg(test)]
const GCRA_SCRIPT_AT: &str = concat!(
    "local now_s, now_ns = tonumber(ARGV[5]), tonumber(ARGV[6])\n",
    gcra_script_body!()
);

/// A publishing rate: a sustained `per_second` with up to `burst` tokens at
/// once after an idle period (the plan's rate, docs/design.md "Plan").
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rate {
    /// Sustained tokens per second, from [`MIN_PER_SECOND`] (0.001) to
    /// [`MAX_PER_SECOND`] (1,000,000); fractions allowed, e.g. `0.5` is one
    /// token every 2 s.
    pub per_second: f64,
    /// Tokens that may be taken at once after an idle period, from 1 to
    /// [`MAX_BURST`] (1,000,000). Also the largest `tokens` one
    /// [`Bucket::acquire`] may ask for.
    pub burst: u32,
}

impl Rate {
    /// A validated rate.
    ///
    /// # Errors
    /// [`RateError`] naming the field out of range.
    pub fn new(per_second: f64, burst: u32) -> Result<Self, RateError> {
        let rate = Self { per_second, burst };
        rate.validate()?;
        Ok(rate)
    }

    /// Checks the fields (they are public, so every bucket call checks again).
    /// The bounds keep every time the bucket computes exact: `T * burst` is at
    /// most 1e18 ns.
    ///
    /// # Errors
    /// [`RateError::PerSecond`] when `per_second` is not a number from
    /// [`MIN_PER_SECOND`] to [`MAX_PER_SECOND`], [`RateError::Burst`] when
    /// `burst` is not from 1 to [`MAX_BURST`].
    pub fn validate(&self) -> Result<(), RateError> {
        // NaN fails the range check too.
        if !(MIN_PER_SECOND..=MAX_PER_SECOND).contains(&self.per_second) {
            return Err(RateError::PerSecond(self.per_second));
        }
        if !(1..=MAX_BURST).contains(&self.burst) {
            return Err(RateError::Burst(self.burst));
        }
        Ok(())
    }

    /// The emission interval `T` in ns: `ceil(1e9 / per_second)`, computed
    /// exactly from the binary value of `per_second` (1,000 ns at 1,000,000/s,
    /// 66,666,667 ns at 15/s, 1e12 ns at 0.001/s). Rounding up makes the
    /// bucket stricter by less than 1 ns per token.
    ///
    /// Meaningful for a valid rate ([`Rate::validate`]); otherwise saturates
    /// to `u64::MAX` or 1.
    pub fn emission_interval_ns(&self) -> u64 {
        ceil_billion_over(self.per_second)
    }
}

/// `ceil(1e9 / x)` for a finite `x > 0`, exactly: `x` is `m * 2^e` with
/// integers `m < 2^53` and `e`, so the quotient is `1e9 * 2^-e / m` in
/// integers. Saturates to `1..=u64::MAX`.
fn ceil_billion_over(x: f64) -> u64 {
    if !(x.is_finite() && x > 0.0) {
        return u64::MAX;
    }
    let bits = x.to_bits();
    let biased = i32::try_from((bits >> 52) & 0x7ff).unwrap_or(0);
    let fraction = bits & ((1 << 52) - 1);
    let (mut mantissa, mut exponent) = if biased == 0 {
        (fraction, -1074)
    } else {
        (fraction | (1 << 52), biased - 1075)
    };
    let zeros = mantissa.trailing_zeros();
    mantissa >>= zeros;
    exponent += i32::try_from(zeros).unwrap_or(0);
    let billion = u128::from(NANOS_PER_SECOND);
    let (numerator, denominator) = if exponent >= 0 {
        match u128::from(mantissa).checked_shl(exponent.unsigned_abs()) {
            Some(denominator) if denominator >> exponent.unsigned_abs() == u128::from(mantissa) => {
                (billion, denominator)
            }
            // x is above 2^75: far more than 1e9 per ns.
            _ => return 1,
        }
    } else {
        let shift = exponent.unsigned_abs();
        // 1e9 < 2^30: the shifted numerator fits in u128 below a shift of 98.
        if shift > 97 {
            return u64::MAX;
        }
        (billion << shift, u128::from(mantissa))
    };
    let quotient = numerator.div_ceil(denominator);
    u64::try_from(quotient).unwrap_or(u64::MAX).max(1)
}

/// A [`Rate`] field out of range.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RateError {
    /// `per_second` must be a number from [`MIN_PER_SECOND`] to
    /// [`MAX_PER_SECOND`].
    #[error(
        "invalid rate: per_second must be a number from {MIN_PER_SECOND} to {MAX_PER_SECOND} tokens a second, got {0}"
    )]
    PerSecond(f64),
    /// `burst` must be from 1 to [`MAX_BURST`].
    #[error("invalid rate: burst must be from 1 to {MAX_BURST} tokens, got {0}")]
    Burst(u32),
}

/// Why a token could not be granted.
#[derive(Debug, thiserror::Error)]
pub enum BucketError {
    /// The rate itself is invalid.
    #[error(transparent)]
    InvalidRate(#[from] RateError),
    /// `tokens` must be in `1..=burst`: more than `burst` could never be
    /// granted at once.
    #[error("invalid token count {tokens}: must be between 1 and the burst ({burst})")]
    InvalidTokens {
        /// Tokens asked for.
        tokens: u32,
        /// The rate's burst.
        burst: u32,
    },
    /// Redis could not be reached, failed or did not answer within the call
    /// timeout. The caller must stop publishing and try again later
    /// (fail closed).
    #[error("token bucket unavailable: {reason}")]
    Unavailable {
        /// What failed, for the log.
        reason: String,
    },
}

impl BucketError {
    /// Whether asking again later can succeed: true only for
    /// [`BucketError::Unavailable`].
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::Unavailable { .. })
    }
}

/// The answer to one bucket call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grant {
    /// The tokens were taken.
    Granted,
    /// Nothing was taken; asking again after this long (at least 1 ns, exact
    /// to the ns) is granted unless another caller takes the tokens first.
    RetryAfter(Duration),
}

/// The costs of one request in ns: `T * tokens` and the tolerance
/// `τ = T * burst`, after checking the request.
fn costs(rate: Rate, tokens: u32) -> Result<(u64, u64), BucketError> {
    rate.validate()?;
    if tokens == 0 || tokens > rate.burst {
        return Err(BucketError::InvalidTokens {
            tokens,
            burst: rate.burst,
        });
    }
    let interval = rate.emission_interval_ns();
    // At most 1e12 ns * 1e6 = 1e18 ns for a valid rate: no overflow.
    Ok((
        interval.saturating_mul(u64::from(tokens)),
        interval.saturating_mul(u64::from(rate.burst)),
    ))
}

/// The result of one [`gcra_step`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GcraStep {
    /// Whether the tokens were granted.
    pub granted: bool,
    /// The TAT after the step, ns on the step's clock: the new TAT when
    /// granted, the given one (unchanged) otherwise.
    pub tat_ns: Option<u64>,
    /// 0 when granted; otherwise the ns until asking again is granted (at
    /// least 1).
    pub retry_after_ns: u64,
}

/// One GCRA step as a pure function, in integer ns: the decision the Redis
/// script and the in-process bucket make (module docs, "Semantics"). `tat_ns`
/// is the stored TAT (`None`: a fresh bucket), `now_ns` the current time on
/// the same clock (any origin), `tokens` the tokens asked for.
///
/// # Errors
/// [`BucketError::InvalidRate`] / [`BucketError::InvalidTokens`] as
/// [`Bucket::acquire`].
pub fn gcra_step(
    tat_ns: Option<u64>,
    now_ns: u64,
    rate: Rate,
    tokens: u32,
) -> Result<GcraStep, BucketError> {
    let (increment, tolerance) = costs(rate, tokens)?;
    let tat = tat_ns.map_or(now_ns, |tat| tat.max(now_ns));
    let new_tat = tat.saturating_add(increment);
    let limit = now_ns.saturating_add(tolerance);
    Ok(if new_tat <= limit {
        GcraStep {
            granted: true,
            tat_ns: Some(new_tat),
            retry_after_ns: 0,
        }
    } else {
        GcraStep {
            granted: false,
            tat_ns,
            retry_after_ns: new_tat - limit,
        }
    })
}

/// `ns` as (whole seconds, nanoseconds below a second): the two limbs the
/// script works in.
fn split_ns(ns: u64) -> (u64, u64) {
    (ns / NANOS_PER_SECOND, ns % NANOS_PER_SECOND)
}

/// The token bucket an executor uses: shared through Redis, or in-process in
/// single-executor mode (docs/design.md, "Components").
pub enum Bucket {
    /// Shared by every executor through Redis.
    Redis(RedisBucket),
    /// This process only (no Redis configured).
    Local(LocalBucket),
}

impl Bucket {
    /// Waits until `tokens` tokens of destination `key` at `rate` are granted,
    /// sleeping after each refusal at least the answer and at least
    /// [`MIN_WAIT`]. It has no stop signal of its own: a caller that must stop
    /// selects on this future and its stop signal.
    ///
    /// Cancel-safe: dropping the future while it sleeps takes nothing. Dropped
    /// during a Redis call, the call may still take its tokens, which are then
    /// lost: the bucket only ever errs on the slow side.
    ///
    /// # Errors
    /// [`BucketError::InvalidRate`] / [`BucketError::InvalidTokens`] for a bad
    /// request (`tokens` must be in `1..=rate.burst`);
    /// [`BucketError::Unavailable`] (retryable) when Redis fails: publish
    /// nothing until a later call succeeds.
    pub async fn acquire(&self, key: &str, rate: Rate, tokens: u32) -> Result<(), BucketError> {
        match self {
            Self::Redis(bucket) => bucket.acquire(key, rate, tokens).await,
            Self::Local(bucket) => bucket.acquire(key, rate, tokens).await,
        }
    }

    /// Charges `tokens` to destination `key` at once, without waiting and
    /// beyond the burst if need be: the bucket then grants nothing more
    /// until those tokens would have been granted. For messages that reached
    /// the broker at a time no token foresaw (held in a stalled connection,
    /// released when it healed): counted when they arrive, they keep every
    /// window within `per_second * t + burst` from then on. On Redis one
    /// script call (a GCRA step whose tolerance never refuses); in-process
    /// the tokens are taken in steps of at most the burst, waiting.
    ///
    /// # Errors
    /// [`BucketError::InvalidRate`]; [`BucketError::Unavailable`] when Redis
    /// fails (nothing was charged).
    pub async fn charge(&self, key: &str, rate: Rate, tokens: u32) -> Result<(), BucketError> {
        match self {
            Self::Redis(bucket) => bucket.charge(key, rate, tokens).await,
            Self::Local(bucket) => {
                let mut left = tokens;
                while left > 0 {
                    let step = left.min(rate.burst);
                    bucket.acquire(key, rate, step).await?;
                    left -= step;
                }
                Ok(())
            }
        }
    }

    /// Whether the budget is shared with other executors (Redis).
    pub fn is_shared(&self) -> bool {
        matches!(self, Self::Redis(_))
    }
}

/// Opens a reconnecting Redis connection for the bucket and the replay keys
/// ([`crate::replay_keys::ReplayKeys`]). Connection attempts and responses
/// time out after `call_timeout`; after a failure the manager reconnects in
/// the background, and calls fail until it has.
///
/// # Errors
/// The URL is invalid or Redis does not answer within `call_timeout`.
#[tracing::instrument(name = "executor.redis.connect", skip_all, err)]
pub async fn connect_redis(
    redis_url: &str,
    call_timeout: Duration,
) -> redis::RedisResult<ConnectionManager> {
    let client = Client::open(redis_url)?;
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(call_timeout))
        .set_response_timeout(Some(call_timeout))
        .set_number_of_retries(3)
        .set_max_delay(Duration::from_secs(1));
    match tokio::time::timeout(
        call_timeout,
        ConnectionManager::new_with_config(client, config),
    )
    .await
    {
        Ok(result) => result,
        Err(_) => Err(redis::RedisError::from(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("redis did not answer within {call_timeout:?}"),
        ))),
    }
}

/// The GCRA bucket in Redis, shared by every executor that uses the same
/// Redis and key prefix.
#[derive(Clone)]
pub struct RedisBucket {
    connection: ConnectionManager,
    key_prefix: String,
    call_timeout: Duration,
    script: Arc<Script>,
    calls: Arc<AtomicU64>,
}

impl RedisBucket {
    /// A bucket over `connection`; destination `d` is stored under
    /// `{key_prefix}{d}` (normally [`DEFAULT_KEY_PREFIX`]). Each Redis call
    /// that takes longer than `call_timeout` (normally
    /// [`DEFAULT_CALL_TIMEOUT`]) fails as [`BucketError::Unavailable`].
    pub fn new(
        connection: ConnectionManager,
        key_prefix: impl Into<String>,
        call_timeout: Duration,
    ) -> Self {
        Self {
            connection,
            key_prefix: key_prefix.into(),
            call_timeout,
            script: Arc::new(Script::new(GCRA_SCRIPT)),
            calls: Arc::new(AtomicU64::new(0)),
        }
    }

    /// [`connect_redis`] then [`RedisBucket::new`].
    ///
    /// # Errors
    /// [`BucketError::Unavailable`] when Redis cannot be reached.
    pub async fn connect(
        redis_url: &str,
        key_prefix: impl Into<String>,
        call_timeout: Duration,
    ) -> Result<Self, BucketError> {
        let connection = connect_redis(redis_url, call_timeout)
            .await
            .map_err(|error| BucketError::Unavailable {
                reason: format!("cannot connect to redis: {error}"),
            })?;
        Ok(Self::new(connection, key_prefix, call_timeout))
    }

    /// The Redis key holding destination `key`'s TAT (`"SEC NSEC"`).
    pub fn redis_key(&self, key: &str) -> String {
        format!("{}{key}", self.key_prefix)
    }

    /// Script calls ([`RedisBucket::try_acquire`]) made so far by this bucket
    /// and its clones, granted or not: what a waiting caller costs Redis.
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }

    /// One GCRA step on Redis's clock: takes `tokens` now or says how long to
    /// wait (exact to the ns, at least 1 ns; no floor applied here). One
    /// `EVALSHA` (the script is loaded on `NOSCRIPT`).
    ///
    /// # Errors
    /// As [`Bucket::acquire`].
    pub async fn try_acquire(
        &self,
        key: &str,
        rate: Rate,
        tokens: u32,
    ) -> Result<Grant, BucketError> {
        let (increment, tolerance) = costs(rate, tokens)?;
        let (increment_s, increment_ns) = split_ns(increment);
        let (tolerance_s, tolerance_ns) = split_ns(tolerance);
        let mut connection = self.connection.clone();
        let mut invocation = self.script.key(self.redis_key(key));
        invocation
            .arg(increment_s)
            .arg(increment_ns)
            .arg(tolerance_s)
            .arg(tolerance_ns);
        self.calls.fetch_add(1, Ordering::Relaxed);
        let call = invocation.invoke_async::<(i64, i64, i64)>(&mut connection);
        let answer = match tokio::time::timeout(self.call_timeout, call).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(error)) => {
                return Err(BucketError::Unavailable {
                    reason: format!("redis call failed: {error}"),
                });
            }
            Err(_) => {
                return Err(BucketError::Unavailable {
                    reason: format!("redis did not answer within {:?}", self.call_timeout),
                });
            }
        };
        grant_from_answer(answer)
    }

    /// [`Bucket::charge`] on Redis: the GCRA step with a tolerance so large
    /// (10^12 s) that it always grants, so the TAT moves by `T * tokens`.
    ///
    /// # Errors
    /// As [`Bucket::charge`].
    pub async fn charge(&self, key: &str, rate: Rate, tokens: u32) -> Result<(), BucketError> {
        rate.validate()?;
        if tokens == 0 {
            return Ok(());
        }
        let increment = rate
            .emission_interval_ns()
            .saturating_mul(u64::from(tokens));
        let (increment_s, increment_ns) = split_ns(increment);
        let mut connection = self.connection.clone();
        let mut invocation = self.script.key(self.redis_key(key));
        invocation
            .arg(increment_s)
            .arg(increment_ns)
            .arg(CHARGE_TOLERANCE_S)
            .arg(0);
        self.calls.fetch_add(1, Ordering::Relaxed);
        let call = invocation.invoke_async::<(i64, i64, i64)>(&mut connection);
        match tokio::time::timeout(self.call_timeout, call).await {
            Ok(Ok((1, _, _))) => Ok(()),
            Ok(Ok(answer)) => Err(BucketError::Unavailable {
                reason: format!("the bucket script refused a charge: {answer:?}"),
            }),
            Ok(Err(error)) => Err(BucketError::Unavailable {
                reason: format!("redis call failed: {error}"),
            }),
            Err(_) => Err(BucketError::Unavailable {
                reason: format!("redis did not answer within {:?}", self.call_timeout),
            }),
        }
    }

    /// [`Bucket::acquire`] on Redis: calls [`RedisBucket::try_acquire`] until
    /// granted, sleeping after each refusal the longer of its answer and
    /// [`MIN_WAIT`].
    ///
    /// # Errors
    /// As [`Bucket::acquire`].
    pub async fn acquire(&self, key: &str, rate: Rate, tokens: u32) -> Result<(), BucketError> {
        loop {
            match self.try_acquire(key, rate, tokens).await? {
                Grant::Granted => return Ok(()),
                Grant::RetryAfter(wait) => tokio::time::sleep(wait.max(MIN_WAIT)).await,
            }
        }
    }
}

/// The script's `{granted, sec, nsec}` as a [`Grant`].
fn grant_from_answer((granted, seconds, nanos): (i64, i64, i64)) -> Result<Grant, BucketError> {
    if granted == 1 {
        return Ok(Grant::Granted);
    }
    match (u64::try_from(seconds), u32::try_from(nanos)) {
        (Ok(seconds), Ok(nanos)) if granted == 0 && u64::from(nanos) < NANOS_PER_SECOND => {
            let wait = Duration::new(seconds, nanos);
            Ok(Grant::RetryAfter(wait.max(Duration::from_nanos(1))))
        }
        _ => Err(BucketError::Unavailable {
            reason: format!(
                "the bucket script answered {{{granted}, {seconds}, {nanos}}}, not a grant or a wait"
            ),
        }),
    }
}

type DirectLimiter =
    RateLimiter<NotKeyed, InMemoryState, MonotonicClock, NoOpMiddleware<std::time::Instant>>;

/// The `governor` quota of `rate`: period `T` ns and burst `burst`.
/// governor's GCRA works in integer ns with `t = T` and `τ = T * (burst - 1)`
/// and grants `n` cells when `tat + t * (n - 1) - τ <= now`: the same
/// decision as [`gcra_step`].
fn quota(rate: Rate) -> Result<Quota, RateError> {
    rate.validate()?;
    let burst = NonZeroU32::new(rate.burst).ok_or(RateError::Burst(rate.burst))?;
    let quota = Quota::with_period(Duration::from_nanos(rate.emission_interval_ns()))
        .ok_or(RateError::PerSecond(rate.per_second))?;
    Ok(quota.allow_burst(burst))
}

/// An in-process bucket (`governor`, also GCRA in integer ns) for
/// single-executor mode without Redis: the same decisions as [`gcra_step`] on
/// the process's monotonic clock and the same [`MIN_WAIT`], but nothing is
/// shared with other processes.
#[derive(Default)]
pub struct LocalBucket {
    /// One limiter per destination, with the rate it was built for.
    limiters: Mutex<HashMap<String, (Rate, Arc<DirectLimiter>)>>,
}

impl LocalBucket {
    /// An empty bucket set.
    pub fn new() -> Self {
        Self::default()
    }

    fn limiter(&self, key: &str, rate: Rate) -> Result<Arc<DirectLimiter>, BucketError> {
        let mut limiters = self
            .limiters
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((known_rate, limiter)) = limiters.get(key)
            && *known_rate == rate
        {
            return Ok(Arc::clone(limiter));
        }
        // A new rate for a destination starts a fresh bucket (with a full burst).
        let limiter = Arc::new(RateLimiter::direct_with_clock(quota(rate)?, MonotonicClock));
        limiters.insert(key.to_owned(), (rate, Arc::clone(&limiter)));
        Ok(limiter)
    }

    /// [`Bucket::acquire`] in-process, with the same floor on waits
    /// ([`MIN_WAIT`]). Cancel-safe: nothing is taken until the tokens are
    /// granted.
    ///
    /// # Errors
    /// [`BucketError::InvalidRate`] / [`BucketError::InvalidTokens`]; never
    /// unavailable.
    pub async fn acquire(&self, key: &str, rate: Rate, tokens: u32) -> Result<(), BucketError> {
        costs(rate, tokens)?;
        let limiter = self.limiter(key, rate)?;
        let invalid = || BucketError::InvalidTokens {
            tokens,
            burst: rate.burst,
        };
        let tokens_nonzero = NonZeroU32::new(tokens).ok_or_else(invalid)?;
        loop {
            match limiter.check_n(tokens_nonzero) {
                Ok(Ok(())) => return Ok(()),
                Ok(Err(not_until)) => {
                    let wait = not_until.wait_time_from(MonotonicClock.now());
                    tokio::time::sleep(wait.max(MIN_WAIT)).await;
                }
                Err(_) => return Err(invalid()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    //! The exact arithmetic: `T` itself, the Redis script against
    //! [`gcra_step`] at explicit times (real Redis), and `governor` against
    //! [`gcra_step`] on a fake clock.

    use futures::FutureExt;
    use governor::clock::FakeRelativeClock;

    use super::*;

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
                    match &stored {
                        Some(value) => {
                            let () = redis::cmd("SET")
                                .arg(&key)
                                .arg(value)
                                .arg("PX")
                                .arg(600_000)
                                .query_async(&mut connection)
                                .await
                                .unwrap();
                        }
                        None => {
                            let _: i64 = redis::cmd("DEL")
                                .arg(&key)
                                .query_async(&mut connection)
                                .await
                                .unwrap();
                        }
                    }
                    let expected =
                        gcra_step(if old_format { None } else { tat }, now, rate, tokens).unwrap();

                    let (increment, tolerance) = costs(rate, tokens).unwrap();
                    let (now_s, now_ns) = split_ns(now);
                    let (increment_s, increment_ns) = split_ns(increment);
                    let (tolerance_s, tolerance_ns) = split_ns(tolerance);
                    let answer: (i64, i64, i64) = script
                        .key(&key)
                        .arg(increment_s)
                        .arg(increment_ns)
                        .arg(tolerance_s)
                        .arg(tolerance_ns)
                        .arg(now_s)
                        .arg(now_ns)
                        .invoke_async(&mut connection)
                        .await
                        .unwrap();
                    let context = format!(
                        "step {step}: {rate:?}, {tokens} tokens, now {now}, stored {stored:?}"
                    );
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
}
