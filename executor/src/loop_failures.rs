//! [`LoopFailures`]: what an executor's slice loops last said of a failure
//! that is theirs alike, so that one line a round says it for all of them,
//! and one line says when it has mended.

use std::{collections::HashMap, sync::Arc, time::Duration};

use tokio::time::Instant;

/// What an executor's slice loops last said of a failure that is theirs
/// alike (a claim, a broker connection, the token bucket, the planner's
/// answers to a lease), and when it is due again. They share one channel to
/// the planner, one Redis and one broker, so an outage or a refused login
/// fails every loop at once; one line a round says it for all of them
/// instead of one a loop, and [`LoopFailures::mended`] lets the first loop
/// that succeeds again say so once.
#[derive(Clone, Debug, Default)]
pub struct LoopFailures(Arc<std::sync::Mutex<HashMap<String, Said>>>);

impl LoopFailures {
    /// Whether a failure of `what` (`claim`, `connect`, `token bucket`, a
    /// node's address) for `reason` at `now` is to be said: the first one,
    /// one for another reason, or one once the retry of the last said is
    /// due (`now` of that one plus its `retry_in`, the caller's delay
    /// before its next try). While the same failure goes on, the gap
    /// between two lines never shrinks: a loop that starts a fresh backoff
    /// (a reconnect mid-slice) does not make the line more frequent. A
    /// loop-specific failure has a reason of its own and is said at once.
    pub(crate) fn to_say(
        &self,
        what: &str,
        reason: &str,
        now: Instant,
        retry_in: Duration,
    ) -> bool {
        let mut said = self.lock();
        let (say, gap) = match said.get(what) {
            Some(last) if last.reason == reason => (now >= last.due, retry_in.max(last.gap)),
            _ => (true, retry_in),
        };
        if say {
            said.insert(
                what.to_owned(),
                Said {
                    reason: reason.to_owned(),
                    due: now + gap,
                    gap,
                },
            );
        }
        say
    }

    /// Whether `what` just worked again after a failure that was said
    /// ([`LoopFailures::to_say`]): `true` once, for the first loop that
    /// succeeds, which then says that it is back. Cheap when nothing failed
    /// (one uncontended lock), so it may be asked on every success.
    pub(crate) fn mended(&self, what: &str) -> bool {
        let mut said = self.lock();
        !said.is_empty() && said.remove(what).is_some()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Said>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The last line said of one failure.
#[derive(Debug)]
struct Said {
    reason: String,
    /// When the same failure is to be said again.
    due: Instant,
    /// The longest delay announced for it so far.
    gap: Duration,
}
