//! The in-process bucket of single-executor mode (`governor`).

use std::{
    collections::HashMap,
    num::NonZeroU32,
    ops::Add,
    sync::{Arc, Mutex},
    time::Duration,
};

use governor::{
    Quota, RateLimiter,
    clock::{Clock, Reference},
    middleware::NoOpMiddleware,
    nanos::Nanos,
    state::{InMemoryState, NotKeyed},
};

use super::{BucketError, MIN_WAIT, Rate, RateError, costs};

type DirectLimiter = RateLimiter<NotKeyed, InMemoryState, TokioClock, NoOpMiddleware<TokioInstant>>;

/// governor's clock on tokio's: the process's monotonic clock, which the
/// waits between grants also sleep on, and which a test pauses and advances
/// (`tokio::time::pause`).
#[derive(Debug, Clone, Copy, Default)]
pub struct TokioClock;

/// An instant of [`TokioClock`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct TokioInstant(tokio::time::Instant);

impl Add<Nanos> for TokioInstant {
    type Output = Self;

    fn add(self, nanos: Nanos) -> Self {
        Self(self.0 + Duration::from(nanos))
    }
}

impl Reference for TokioInstant {
    fn duration_since(&self, earlier: Self) -> Nanos {
        self.0.saturating_duration_since(earlier.0).into()
    }

    fn saturating_sub(&self, duration: Nanos) -> Self {
        self.0
            .checked_sub(duration.into())
            .map_or(*self, TokioInstant)
    }
}

impl Clock for TokioClock {
    type Instant = TokioInstant;

    fn now(&self) -> TokioInstant {
        TokioInstant(tokio::time::Instant::now())
    }
}

/// The `governor` quota of `rate`: period `T` ns and burst `burst`.
/// governor's GCRA works in integer ns with `t = T` and `τ = T * (burst - 1)`
/// and grants `n` cells when `tat + t * (n - 1) - τ <= now`: the same
/// decision as [`gcra_step`].
pub(super) fn quota(rate: Rate) -> Result<Quota, RateError> {
    rate.validate()?;
    let burst = NonZeroU32::new(rate.burst).ok_or(RateError::Burst(rate.burst))?;
    let quota = Quota::with_period(Duration::from_nanos(rate.emission_interval_ns()))
        .ok_or(RateError::PerSecond(rate.per_second))?;
    Ok(quota.allow_burst(burst))
}

/// An in-process bucket (`governor`, also GCRA in integer ns) for
/// single-executor mode without Redis: the same decisions as [`gcra_step`] on
/// the process's monotonic clock (tokio's, [`TokioClock`]) and the same
/// [`MIN_WAIT`], but nothing is shared with other processes.
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
        let limiter = Arc::new(RateLimiter::direct_with_clock(quota(rate)?, TokioClock));
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
                    let wait = not_until.wait_time_from(TokioClock.now());
                    tokio::time::sleep(wait.max(MIN_WAIT)).await;
                }
                Err(_) => return Err(invalid()),
            }
        }
    }
}
