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

use std::time::Duration;

mod in_redis;
mod local;
#[cfg(test)]
mod tests;

pub use in_redis::{RedisBucket, connect_redis};
pub use local::LocalBucket;

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
        "invalid rate: per_second must be a number from {MIN_PER_SECOND} to {MAX_PER_SECOND} tokens a second, got {0:?}"
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
