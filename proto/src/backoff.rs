//! The one retry delay of the services (the executor's retries, the
//! planner's capture sessions and writes): exponential with jitter
//! (`backon`'s exponential backoff), from a floor to a ceiling, never giving
//! up by itself (the caller's stop signal or deadline ends a retry loop).

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};

/// Successive retry delays: `min`, then doubling up to `max`, each with
/// random jitter so that processes retrying together spread out.
pub struct Backoff {
    min: Duration,
    max: Duration,
    delays: ExponentialBackoff,
}

impl Backoff {
    /// Delays from `min` doubling to `max`.
    pub fn new(min: Duration, max: Duration) -> Self {
        Self {
            min,
            max,
            delays: Self::build(min, max),
        }
    }

    fn build(min: Duration, max: Duration) -> ExponentialBackoff {
        ExponentialBuilder::default()
            .with_min_delay(min)
            .with_max_delay(max)
            .with_factor(2.0)
            .with_jitter()
            .without_max_times()
            .build()
    }

    /// The next delay (at least `min`, at most about twice `max` with jitter).
    pub fn next_delay(&mut self) -> Duration {
        self.delays.next().unwrap_or(self.max).max(self.min)
    }

    /// The delay before retry number `failures` (1: after the first
    /// failure) of delays from `min` doubling to `max`: what
    /// [`Backoff::next_delay`] gives at that call, jitter included, for
    /// retries whose count is stored rather than held in a `Backoff`
    /// (webhook deliveries).
    pub fn nth_delay(min: Duration, max: Duration, failures: u32) -> Duration {
        let mut backoff = Self::new(min, max);
        let mut delay = min;
        // Past 64 doublings every delay is `max` (with jitter).
        for _ in 0..failures.clamp(1, 64) {
            delay = backoff.next_delay();
        }
        delay
    }

    /// Starts again from `min` (after a success).
    pub fn reset(&mut self) {
        self.delays = Self::build(self.min, self.max);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_grow_from_the_floor_and_stay_bounded() {
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
        let delays: Vec<Duration> = (0..20).map(|_| backoff.next_delay()).collect();
        assert!(
            delays.iter().all(|d| *d >= Duration::from_millis(100)),
            "{delays:?}"
        );
        assert!(
            delays.iter().all(|d| *d <= Duration::from_secs(2)),
            "{delays:?}"
        );
        assert!(
            delays[10..].iter().all(|d| *d >= Duration::from_secs(1)),
            "{delays:?}"
        );
        backoff.reset();
        assert!(backoff.next_delay() < Duration::from_millis(250));
        let (min, max) = (Duration::from_secs(5), Duration::from_secs(3600));
        assert!(Backoff::nth_delay(min, max, 1) < Duration::from_secs(10));
        let fourth = Backoff::nth_delay(min, max, 4);
        assert!(fourth >= Duration::from_secs(40) && fourth <= Duration::from_secs(80));
        let late = Backoff::nth_delay(min, max, 1000);
        assert!(late >= max && late <= 2 * max, "{late:?}");
    }
}
