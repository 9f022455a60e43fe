//! The shared token bucket: how fast a replay may publish to one destination
//! (DESIGN.md, "token bucket").
//!
//! Every executor and every plan that publishes to the same downstream draws
//! from one budget, keyed by destination, so two plans to one queue cannot add
//! up to twice its capacity. The budget is a GCRA (Generic Cell Rate
//! Algorithm, the "virtual scheduling" form of the ATM Forum Traffic
//! Management Specification 4.0 and ITU-T I.371; the same shaping RFC 2697
//! describes with token counters) evaluated inside Redis by one Lua script, so
//! the state is a single number per destination and the clock is Redis's own
//! (`TIME`), not the executors'.
//!
//! Semantics shared by both implementations: with an emission interval
//! `T = 1 / per_second` and a tolerance `τ = T * burst`, a bucket that has been
//! idle grants `burst` tokens at once and then one every `T`; over any window
//! of length `t` at most `per_second * t + burst` tokens are granted.
//!
//! Fail closed (DESIGN.md, "Executor loop and guarantees"): when Redis cannot
//! be reached, [`Bucket::acquire`] returns [`BucketError::Unavailable`] and the
//! caller stops publishing; it never publishes without a token.

use std::{
    collections::HashMap,
    num::NonZeroU32,
    sync::{Arc, Mutex},
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

/// How long one Redis call may take before the bucket reports
/// [`BucketError::Unavailable`].
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(2);

/// The GCRA step. `KEYS[1]`: the bucket key. `ARGV[1]`: emission interval `T`
/// in µs (may be fractional), `ARGV[2]`: burst, `ARGV[3]`: tokens asked for.
/// Returns `{1, 0}` when granted, `{0, retry_after_us}` otherwise.
///
/// The theoretical arrival time (TAT) is stored as an integer number of µs
/// formatted with `%.0f`: Lua's default number-to-string conversion keeps 14
/// significant digits, which would round a µs timestamp. It is rounded up, so
/// rounding can only make the bucket stricter. The key expires when the TAT is
/// reached (at most `τ` from now), when its state equals a fresh bucket's.
const GCRA_SCRIPT: &str = r"
local time = redis.call('TIME')
local now_us = tonumber(time[1]) * 1000000 + tonumber(time[2])
local interval_us = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local tokens = tonumber(ARGV[3])
local tolerance_us = interval_us * burst
local tat_us = tonumber(redis.call('GET', KEYS[1])) or now_us
if tat_us < now_us then
  tat_us = now_us
end
local new_tat_us = math.ceil(tat_us + interval_us * tokens)
local allow_at_us = new_tat_us - tolerance_us
if allow_at_us > now_us then
  return {0, math.ceil(allow_at_us - now_us)}
end
local expiry_ms = math.ceil((new_tat_us - now_us) / 1000) + 1
redis.call('SET', KEYS[1], string.format('%.0f', new_tat_us), 'PX', string.format('%.0f', expiry_ms))
return {1, 0}
";

/// A publishing rate: a sustained `per_second` with up to `burst` tokens at
/// once after an idle period (the plan's rate, DESIGN.md "Plan").
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rate {
    /// Sustained tokens per second; finite and above 0 (fractions allowed,
    /// e.g. `0.5` is one token every 2 s).
    pub per_second: f64,
    /// Tokens that may be taken at once after an idle period; at least 1.
    /// Also the largest `tokens` one [`Bucket::acquire`] may ask for.
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
    ///
    /// # Errors
    /// [`RateError::PerSecond`] when `per_second` is not finite or not above 0,
    /// [`RateError::Burst`] when `burst` is 0.
    pub fn validate(&self) -> Result<(), RateError> {
        if !self.per_second.is_finite() || self.per_second <= 0.0 {
            return Err(RateError::PerSecond(self.per_second));
        }
        // Below ~1e-9/s the emission interval no longer fits a Duration in µs
        // usefully; a rate that slow is a mistake, not a plan.
        if 1e6 / self.per_second > 1e15 {
            return Err(RateError::PerSecond(self.per_second));
        }
        if self.burst == 0 {
            return Err(RateError::Burst);
        }
        Ok(())
    }

    /// The emission interval `T` in µs: time between two tokens at the
    /// sustained rate.
    pub fn emission_interval_us(&self) -> f64 {
        1e6 / self.per_second
    }
}

/// A [`Rate`] field out of range.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RateError {
    /// `per_second` must be finite and above 0.
    #[error("invalid rate: per_second must be a finite number above 0, got {0}")]
    PerSecond(f64),
    /// `burst` must be at least 1.
    #[error("invalid rate: burst must be at least 1")]
    Burst,
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
    /// Nothing was taken; asking again after this long can succeed.
    RetryAfter(Duration),
}

fn check_request(rate: Rate, tokens: u32) -> Result<(), BucketError> {
    rate.validate()?;
    if tokens == 0 || tokens > rate.burst {
        return Err(BucketError::InvalidTokens {
            tokens,
            burst: rate.burst,
        });
    }
    Ok(())
}

/// The token bucket an executor uses: shared through Redis, or in-process in
/// single-executor mode (DESIGN.md, "Components").
pub enum Bucket {
    /// Shared by every executor through Redis.
    Redis(RedisBucket),
    /// This process only (no Redis configured).
    Local(LocalBucket),
}

impl Bucket {
    /// Waits until `tokens` tokens of destination `key` at `rate` are granted.
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

    /// The Redis key holding destination `key`'s TAT.
    pub fn redis_key(&self, key: &str) -> String {
        format!("{}{key}", self.key_prefix)
    }

    /// One GCRA step: takes `tokens` now or says how long to wait. One
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
        check_request(rate, tokens)?;
        let mut connection = self.connection.clone();
        let mut invocation = self.script.key(self.redis_key(key));
        invocation
            .arg(format!("{:.6}", rate.emission_interval_us()))
            .arg(rate.burst)
            .arg(tokens);
        let call = invocation.invoke_async::<(i64, i64)>(&mut connection);
        let (allowed, retry_after_us) = match tokio::time::timeout(self.call_timeout, call).await {
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
        if allowed == 1 {
            return Ok(Grant::Granted);
        }
        let retry_after_us = u64::try_from(retry_after_us.max(1)).unwrap_or(1);
        Ok(Grant::RetryAfter(Duration::from_micros(retry_after_us)))
    }

    /// [`Bucket::acquire`] on Redis: calls [`RedisBucket::try_acquire`] and
    /// sleeps the retry-after it returns until granted.
    ///
    /// # Errors
    /// As [`Bucket::acquire`].
    pub async fn acquire(&self, key: &str, rate: Rate, tokens: u32) -> Result<(), BucketError> {
        loop {
            match self.try_acquire(key, rate, tokens).await? {
                Grant::Granted => return Ok(()),
                Grant::RetryAfter(wait) => tokio::time::sleep(wait).await,
            }
        }
    }
}

type DirectLimiter =
    RateLimiter<NotKeyed, InMemoryState, MonotonicClock, NoOpMiddleware<std::time::Instant>>;

/// An in-process bucket (`governor`, also GCRA) for single-executor mode
/// without Redis: the same [`Rate`] semantics, but nothing is shared with
/// other processes.
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
        let burst = NonZeroU32::new(rate.burst).ok_or(RateError::Burst)?;
        let quota = Quota::with_period(Duration::from_secs_f64(1.0 / rate.per_second))
            .ok_or(RateError::PerSecond(rate.per_second))?
            .allow_burst(burst);
        let limiter = Arc::new(RateLimiter::direct_with_clock(quota, MonotonicClock));
        limiters.insert(key.to_owned(), (rate, Arc::clone(&limiter)));
        Ok(limiter)
    }

    /// [`Bucket::acquire`] in-process. Cancel-safe: nothing is taken until
    /// the tokens are granted.
    ///
    /// # Errors
    /// [`BucketError::InvalidRate`] / [`BucketError::InvalidTokens`]; never
    /// unavailable.
    pub async fn acquire(&self, key: &str, rate: Rate, tokens: u32) -> Result<(), BucketError> {
        check_request(rate, tokens)?;
        let limiter = self.limiter(key, rate)?;
        let tokens_nonzero = NonZeroU32::new(tokens).ok_or(BucketError::InvalidTokens {
            tokens,
            burst: rate.burst,
        })?;
        loop {
            match limiter.check_n(tokens_nonzero) {
                Ok(Ok(())) => return Ok(()),
                Ok(Err(not_until)) => {
                    let wait = not_until.wait_time_from(MonotonicClock.now());
                    tokio::time::sleep(wait.max(Duration::from_micros(1))).await;
                }
                Err(_) => {
                    return Err(BucketError::InvalidTokens {
                        tokens,
                        burst: rate.burst,
                    });
                }
            }
        }
    }
}
