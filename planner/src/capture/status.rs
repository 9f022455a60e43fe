//! [`CaptureStatus`]: whether each capture queue has a consumer now, and why
//! not (readiness).

use std::sync::{
    Arc, Mutex,
    atomic::{AtomicBool, Ordering},
};

/// Whether each capture queue has a consumer now, and why not: what the
/// planner's readiness requires and reports (cheap to clone; shared by
/// capture and health).
#[derive(Debug, Clone, Default)]
pub struct CaptureStatus(Arc<Vec<QueueStatus>>);

/// One capture queue's name, whether it has a consumer, and why not.
type QueueStatus = (String, AtomicBool, Mutex<Option<String>>);

impl CaptureStatus {
    /// Every queue of `queues` without a consumer yet.
    pub fn new(queues: &[String]) -> Self {
        Self(Arc::new(
            queues
                .iter()
                .map(|queue| (queue.clone(), AtomicBool::new(false), Mutex::new(None)))
                .collect(),
        ))
    }

    pub(super) fn set(&self, queue: &str, consuming: bool) {
        for (name, flag, problem) in self.0.iter() {
            if name == queue {
                flag.store(consuming, Ordering::SeqCst);
                if consuming && let Ok(mut problem) = problem.lock() {
                    *problem = None;
                }
            }
        }
    }

    /// Records why `queue` has no consumer (`None`: no known reason, e.g.
    /// not connected yet).
    pub(super) fn set_problem(&self, queue: &str, why: Option<String>) {
        for (name, _, problem) in self.0.iter() {
            if name == queue
                && let Ok(mut problem) = problem.lock()
            {
                *problem = why.clone();
            }
        }
    }

    /// The queues without a consumer now (empty: capture is ready).
    pub fn not_consuming(&self) -> Vec<String> {
        self.0
            .iter()
            .filter(|(_, flag, _)| !flag.load(Ordering::SeqCst))
            .map(|(name, _, _)| name.clone())
            .collect()
    }

    /// Each queue without a consumer now, with why: `queue: does not exist
    /// (404 NOT_FOUND on passive declare)`, `queue: is a stream queue …`,
    /// or `queue: no consumer connected`. What readiness logs.
    pub fn problems(&self) -> Vec<String> {
        self.0
            .iter()
            .filter(|(_, flag, _)| !flag.load(Ordering::SeqCst))
            .map(|(name, _, problem)| {
                let why = problem
                    .lock()
                    .ok()
                    .and_then(|problem| problem.clone())
                    .unwrap_or_else(|| "no consumer connected".to_owned());
                format!("{name}: {why}")
            })
            .collect()
    }

    /// Whether `queue` has a consumer now (`None`: not a capture queue).
    pub fn is_consuming(&self, queue: &str) -> Option<bool> {
        self.0
            .iter()
            .find(|(name, _, _)| name == queue)
            .map(|(_, flag, _)| flag.load(Ordering::SeqCst))
    }

    /// The capture queues, in configuration order.
    pub fn queues(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(|(name, _, _)| name.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capture_status_says_which_queue_has_no_consumer_and_why() {
        let status = CaptureStatus::new(&["a".to_owned(), "b".to_owned(), "c".to_owned()]);
        status.set("a", true);
        status.set_problem(
            "b",
            Some("does not exist (404 NOT_FOUND on passive declare)".to_owned()),
        );
        assert_eq!(
            status.problems(),
            [
                "b: does not exist (404 NOT_FOUND on passive declare)",
                "c: no consumer connected"
            ]
        );
        assert_eq!(status.not_consuming(), ["b", "c"]);
        assert_eq!(status.is_consuming("a"), Some(true));
        assert_eq!(status.is_consuming("z"), None);
        status.set("b", true);
        assert_eq!(
            status.problems(),
            ["c: no consumer connected"],
            "a consumer clears the reason"
        );
        assert_eq!(status.queues().collect::<Vec<_>>(), ["a", "b", "c"]);
    }
}
