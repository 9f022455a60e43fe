//! [`LoopFailures`]: what an executor's slice loops last said of a failure
//! that is theirs alike, so that one line a round says it for all of them.

use std::{collections::HashMap, sync::Arc, time::Duration};

use tokio::time::Instant;

/// What an executor's slice loops last said of a failure that is theirs
/// alike (a claim, a broker connection), and when it is due again. They
/// share one channel to the planner and one broker, so an outage or a
/// refused login fails every loop at once; one line a round says it for all
/// of them instead of one a loop.
#[derive(Clone, Debug, Default)]
pub struct LoopFailures(Arc<std::sync::Mutex<HashMap<String, (String, Instant)>>>);

impl LoopFailures {
    /// Whether a failure of `what` (`claim`, `connect`, a node's address) for `reason` at
    /// `now` is to be said: the first one, one for another reason, or one
    /// once the retry of the last said is due (`now` of that one plus its
    /// `retry_in`, the caller's delay before its next try). A loop-specific
    /// failure has a reason of its own and is said at once.
    pub(crate) fn to_say(
        &self,
        what: &str,
        reason: &str,
        now: Instant,
        retry_in: Duration,
    ) -> bool {
        let mut said = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let say = said
            .get(what)
            .is_none_or(|(last, due)| last != reason || now >= *due);
        if say {
            said.insert(what.to_owned(), (reason.to_owned(), now + retry_in));
        }
        say
    }
}
