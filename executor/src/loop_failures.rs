//! [`LoopFailures`]: what an executor's slice loops last said of a failure
//! that is theirs alike, so that one line a round says it for all of them,
//! and one line says when it has mended.

use std::{collections::HashMap, sync::Arc, time::Duration};

use tokio::time::Instant;

/// Lines of one failure come at most this often, whatever the loops' retry
/// delays: a loop whose attempt takes long (a connect that times out) and
/// retries soon after would otherwise say it again in every loop's turn.
pub(crate) const LEAST_GAP: Duration = Duration::from_secs(5);

/// What an executor's slice loops last said of a failure that is theirs
/// alike (a claim, a broker connection, the token bucket, the planner's
/// answers to a lease), and when it is due again. They share one channel to
/// the planner, one Redis and one broker, so an outage or a refused login
/// fails every loop at once; one line a round says it for all of them
/// instead of one a loop, and [`LoopFailures::mended`] lets one loop say
/// once that it works again.
#[derive(Clone, Debug, Default)]
pub struct LoopFailures(Arc<std::sync::Mutex<HashMap<String, Failing>>>);

/// One kind of failure (`what`) as the loops met it.
#[derive(Debug, Default)]
struct Failing {
    /// Per reason: when it is to be said again, and the longest delay
    /// announced for it (a gap never shrinks while it goes on).
    said: HashMap<String, (Instant, Duration)>,
    /// When any loop last met it, said or not.
    last: Option<Instant>,
    /// The longest retry delay announced since it was last mended.
    gap: Duration,
    /// A line said it, and no line has said it mended since.
    outstanding: bool,
}

impl LoopFailures {
    /// Whether a failure of `what` (`claim`, `connect`, `token bucket`, a
    /// node's address) for `reason` at `now` is to be said: the first one
    /// of that reason, or one once the retry of the last said is due (`now`
    /// of that one plus its `retry_in`, the caller's delay before its next
    /// try; at least [`LEAST_GAP`]). Reasons are kept apart, so loops that
    /// fail with different texts at once do not make each other's lines due. While the same
    /// failure goes on, the gap between two lines never shrinks: a loop
    /// that starts a fresh backoff (a reconnect mid-slice) does not make
    /// the line more frequent. Every failure is recorded for
    /// [`LoopFailures::mended`], said or not.
    pub(crate) fn to_say(
        &self,
        what: &str,
        reason: &str,
        now: Instant,
        retry_in: Duration,
    ) -> bool {
        let mut failures = self.lock();
        let failing = failures.entry(what.to_owned()).or_default();
        let retry_in = retry_in.max(LEAST_GAP);
        failing.last = Some(now);
        failing.gap = failing.gap.max(retry_in);
        let (say, gap) = match failing.said.get(reason) {
            Some(&(due, gap)) => (now >= due, retry_in.max(gap)),
            None => (true, retry_in),
        };
        if say {
            failing.said.insert(reason.to_owned(), (now + gap, gap));
            failing.outstanding = true;
        }
        say
    }

    /// Whether `what`, which a loop just did with success, is to be said
    /// mended: `true` once, when a failure of it was said and no loop has
    /// met it for a whole retry gap (the longest delay announced), so that
    /// every loop that was failing has tried again since. A loop that still
    /// fails (one shard of several down, a request sent before the outage
    /// ended) keeps it unsaid. Cheap when nothing failed (one uncontended
    /// lock), so it may be asked on every success.
    pub(crate) fn mended(&self, what: &str, now: Instant) -> bool {
        self.take_mended(what, |failing| {
            failing
                .last
                .is_none_or(|last| now.saturating_duration_since(last) >= failing.gap)
        })
    }

    /// [`LoopFailures::mended`] for a success that is rare (a connection,
    /// which lasts): `true` once, when a failure of `what` was said and no
    /// loop has met it since this success's attempt `started`.
    pub(crate) fn mended_since(&self, what: &str, started: Instant) -> bool {
        self.take_mended(what, |failing| {
            failing.last.is_none_or(|last| last < started)
        })
    }

    /// Forgets `what` and answers `true` when a failure of it was said and
    /// `quiet` holds of it (no loop met it lately enough to doubt a success).
    fn take_mended(&self, what: &str, quiet: impl FnOnce(&Failing) -> bool) -> bool {
        let mut failures = self.lock();
        let mended = failures
            .get(what)
            .is_some_and(|failing| failing.outstanding && quiet(failing));
        if mended {
            failures.remove(what);
        }
        mended
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Failing>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
