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
    }
}
