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

/// One capture queue: its name, whether it has a consumer, why not, and its
/// depth as last read.
#[derive(Debug)]
struct QueueStatus {
    name: String,
    consuming: AtomicBool,
    problem: Mutex<Option<String>>,
    /// Messages ready in the queue at the last passive declare.
    depth: Mutex<Option<u64>>,
}

impl CaptureStatus {
    /// Every queue of `queues` without a consumer yet.
    pub fn new(queues: &[String]) -> Self {
        Self(Arc::new(
            queues
                .iter()
                .map(|queue| QueueStatus {
                    name: queue.clone(),
                    consuming: AtomicBool::new(false),
                    problem: Mutex::new(None),
                    depth: Mutex::new(None),
                })
                .collect(),
        ))
    }

    pub(super) fn set(&self, queue: &str, consuming: bool) {
        for status in self.0.iter() {
            if status.name == queue {
                status.consuming.store(consuming, Ordering::SeqCst);
                if consuming && let Ok(mut problem) = status.problem.lock() {
                    *problem = None;
                }
            }
        }
    }

    /// Records why `queue` has no consumer (`None`: no known reason, e.g.
    /// not connected yet).
    pub(super) fn set_problem(&self, queue: &str, why: Option<String>) {
        for status in self.0.iter() {
            if status.name == queue
                && let Ok(mut problem) = status.problem.lock()
            {
                *problem = why.clone();
            }
        }
    }

    /// The queues without a consumer now (empty: capture is ready).
    pub fn not_consuming(&self) -> Vec<String> {
        self.0
            .iter()
            .filter(|status| !status.consuming.load(Ordering::SeqCst))
            .map(|status| status.name.clone())
            .collect()
    }

    /// Each queue without a consumer now, with why: `queue: does not exist
    /// (404 NOT_FOUND on passive declare)`, `queue: is a stream queue …`,
    /// or `queue: no consumer connected`. What readiness logs.
    pub fn problems(&self) -> Vec<String> {
        self.0
            .iter()
            .filter(|status| !status.consuming.load(Ordering::SeqCst))
            .map(|status| {
                let name = &status.name;
                let why = status
                    .problem
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
            .find(|status| status.name == queue)
            .map(|status| status.consuming.load(Ordering::SeqCst))
    }

    /// Records `queue`'s depth: messages ready, as a passive declare
    /// answered (AMQP 0-9-1 `queue.declare-ok` `message-count`).
    pub(super) fn set_depth(&self, queue: &str, depth: u64) {
        for status in self.0.iter() {
            if status.name == queue
                && let Ok(mut known) = status.depth.lock()
            {
                *known = Some(depth);
            }
        }
    }

    /// `queue`'s depth as last read (`None`: not a capture queue, or not
    /// read yet).
    pub fn depth(&self, queue: &str) -> Option<u64> {
        self.0
            .iter()
            .find(|status| status.name == queue)
            .and_then(|status| status.depth.lock().ok().and_then(|depth| *depth))
    }

    /// The capture queues, in configuration order.
    pub fn queues(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(|status| status.name.as_str())
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
        assert_eq!(status.depth("a"), None, "not read yet");
        status.set_depth("a", 42);
        assert_eq!(status.depth("a"), Some(42));
        assert_eq!(status.depth("z"), None);
    }
}
