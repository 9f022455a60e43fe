//! One slice lease, as the executor holds it (docs/design.md, "Executor loop and
//! guarantees"): the fencing token, the renewal (heartbeat), the stop signal
//! pushed by the planner (`WatchLease`), the executor's own deadline, the
//! write-ahead mark of what it may publish (`MarkPublishing`), outcome
//! reports and the end of the lease.
//!
//! # When publishing stops
//! [`Lease::stopped`] resolves, and [`Lease::may_publish`] turns false, on the
//! first of:
//! - the executor shutting down (SIGTERM);
//! - the planner saying the plan no longer publishes (paused, cancelled,
//!   aborted by a gate): pushed on the `WatchLease` stream as it happens, so
//!   within a second; the heartbeat answer says it too;
//! - the lease being lost: the planner refuses a renewal or a report's token,
//!   or **the executor's own deadline passes**. The deadline is the send time
//!   of the last successful renewal plus two thirds of the TTL: the planner
//!   extends the lease by the TTL counted from when *it* handled the renewal,
//!   which is later, so the executor always stops before the planner can
//!   lease the slice to someone else, even when it cannot reach the planner
//!   to find out (a slow link, a SIGSTOPped process). [`Lease::may_publish`]
//!   reads the clock itself, so a process resumed after its deadline
//!   publishes nothing, whichever task runs first.
//!
//! Outcome reports keep flowing after a stop: the planner records the truth
//! about publishes under a lost lease too, so every confirmed publish ends
//! up `sent` in the audit.

use std::{
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use redrive_proto::{
    error::is_stale_token,
    v1::{self, coordinator_client::CoordinatorClient},
};
use tokio::{sync::mpsc, time::Instant};
use tokio_util::{
    sync::{CancellationToken, WaitForCancellationFuture},
    task::AbortOnDropHandle,
};
use tonic::transport::Channel;
use tracing::{Instrument, info, warn};

use redrive_proto::backoff::Backoff;

use crate::loop_failures::LoopFailures;

/// The write-ahead marks' failures in [`LoopFailures`].
const MARKS: &str = "write-ahead marks";
/// The renewals' failures in [`LoopFailures`].
const RENEWALS: &str = "lease renewals";
/// The outcome reports' failures in [`LoopFailures`].
const REPORTS: &str = "outcome reports";

/// Why a lease counts as lost when its own deadline passed.
const PAST_DEADLINE: &str =
    "no lease renewal for two thirds of its TTL (planner unreachable or this process was paused)";

mod report;
mod tasks;

use report::{REPORT_BATCH, report};
use tasks::{MarkFailed, heartbeat, mark, renew, stop_on_shutdown, watch, watch_deadline};

/// Why a lease could not be started.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    /// The planner refused the token: another executor holds the slice now.
    #[error("lease lost before it started: {0}")]
    Lost(String),
    /// The planner did not answer the first renewal in time.
    #[error("cannot confirm the lease with the planner: {0}")]
    Unavailable(String),
}

/// What stopped publishing, for the log and the slice's end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopReason {
    /// The executor is shutting down.
    Shutdown,
    /// The plan does not publish now (the planner's words, e.g. "plan is
    /// cancelled").
    Plan(String),
    /// The lease is gone or about to be: release nothing, report the truth.
    Lost(String),
}

/// Where a lease's failures that every slice loop shares (the planner not
/// answering renewals, marks or reports) are said: once a round for all
/// loops ([`LoopFailures`]), naming the planner.
#[derive(Clone, Debug, Default)]
pub struct SharedFailures {
    /// The planner's URL, as the lines name it.
    pub planner: String,
    /// What the executor's slice loops last said.
    pub failures: LoopFailures,
}

struct Shared {
    slice_id: String,
    said: SharedFailures,
    token: u64,
    ttl: Duration,
    /// Publishing must stop: any [`StopReason`].
    stop: CancellationToken,
    /// The first reason given.
    reason: Mutex<Option<StopReason>>,
    /// No publish at or after this instant.
    deadline: Mutex<Instant>,
    /// The reporter gave up on some outcomes, or the planner refused some
    /// of a live lease's: never release the slice then (its expiry makes
    /// the marked, unreported items uncertain; a release would let them be
    /// published again with no `uncertain` on the record).
    unreported: std::sync::atomic::AtomicBool,
    /// The write-ahead mark the planner recorded: items up to this position
    /// may be published (`None`: nothing yet).
    marked: Mutex<Option<u64>>,
    /// A [`Lease::mark_ahead`] is under way.
    marking_ahead: std::sync::atomic::AtomicBool,
    /// [`Lease::end`] is ending the lease: the planner's answers that it is
    /// gone (a renewal or the lease watch racing the completion) are the
    /// expected end, not a loss to warn about.
    ending: std::sync::atomic::AtomicBool,
}

impl Shared {
    /// Whether `what` (`lease renewals`, `write-ahead marks`, `outcome
    /// reports`) failing for `reason`, retried in `retry_in`, is to be said
    /// now ([`LoopFailures::to_say`]).
    fn failed(&self, what: &str, reason: &str, retry_in: Duration) -> bool {
        self.said
            .failures
            .to_say(what, reason, Instant::now(), retry_in)
    }

    /// Whether the lease counts as lost here (not merely stopped).
    fn is_lost(&self) -> bool {
        matches!(
            *self.reason.lock().unwrap_or_else(PoisonError::into_inner),
            Some(StopReason::Lost(_))
        )
    }

    /// Says once, for all slice loops, that the planner answers `what`
    /// again after a failure that was said.
    fn answered(&self, what: &str) {
        if self.said.failures.mended(what, Instant::now()) {
            info!(planner = %self.said.planner, "the planner answers {what} again (said once for all slice loops)");
        }
    }

    fn stop(&self, reason: StopReason) {
        let mut first = self.reason.lock().unwrap_or_else(PoisonError::into_inner);
        if first.is_none() {
            match &reason {
                StopReason::Shutdown => info!("shutting down: publishing stopped"),
                StopReason::Plan(why) => info!(reason = %why, "told to stop publishing"),
                StopReason::Lost(why) if self.ending.load(std::sync::atomic::Ordering::SeqCst) => {
                    tracing::debug!(reason = %why, "lease gone while it was being ended");
                }
                StopReason::Lost(why) => warn!(reason = %why, "lease lost: publishing stopped"),
            }
            *first = Some(reason);
        }
        drop(first);
        self.stop.cancel();
    }

    fn deadline(&self) -> Instant {
        *self.deadline.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether the recorded mark covers item position `through`.
    fn marked_through(&self, through: u64) -> bool {
        self.marked
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some_and(|marked| marked >= through)
    }

    /// The planner recorded the mark through `through`.
    fn record_mark(&self, through: u64) {
        let mut marked = self.marked.lock().unwrap_or_else(PoisonError::into_inner);
        *marked = Some(marked.map_or(through, |marked| marked.max(through)));
    }

    /// A renewal sent at `sent_at` succeeded.
    fn renewed(&self, sent_at: Instant) {
        let until = sent_at + self.ttl * 2 / 3;
        let mut deadline = self.deadline.lock().unwrap_or_else(PoisonError::into_inner);
        if until > *deadline {
            *deadline = until;
        }
    }
}

/// A held lease; its tasks (renewal, watch, deadline) end when it is dropped.
pub struct Lease {
    shared: Arc<Shared>,
    coordinator: CoordinatorClient<Channel>,
    _tasks: Vec<AbortOnDropHandle<()>>,
    /// The last [`Lease::mark_ahead`] task.
    marking: Mutex<Option<AbortOnDropHandle<()>>>,
}

impl Lease {
    /// Starts holding the lease `token` on `slice_id` (as claimed, TTL
    /// `ttl`): renews it once right away, so that the deadline counts from a
    /// renewal this executor timed, then keeps renewing at a third of the TTL
    /// and watches the planner's stop signal. Stops with `shutdown` too.
    /// Its tasks log in the caller's span (the slice's); failures every
    /// slice loop shares are said as `said` says.
    ///
    /// # Errors
    /// [`LeaseError::Lost`] when the planner refuses the token,
    /// [`LeaseError::Unavailable`] when it does not answer within a third of
    /// the TTL.
    pub async fn start(
        coordinator: CoordinatorClient<Channel>,
        slice_id: String,
        token: u64,
        ttl: Duration,
        said: SharedFailures,
        shutdown: &CancellationToken,
    ) -> Result<Self, LeaseError> {
        let shared = Arc::new(Shared {
            slice_id,
            said,
            token,
            ttl,
            stop: shutdown.child_token(),
            reason: Mutex::new(None),
            deadline: Mutex::new(Instant::now()),
            unreported: std::sync::atomic::AtomicBool::new(false),
            marked: Mutex::new(None),
            marking_ahead: std::sync::atomic::AtomicBool::new(false),
            ending: std::sync::atomic::AtomicBool::new(false),
        });
        let sent_at = Instant::now();
        match renew(&mut coordinator.clone(), &shared).await {
            Ok(answer) => {
                shared.renewed(sent_at);
                shared.answered(RENEWALS);
                if !answer.keep_publishing {
                    shared.stop(StopReason::Plan(answer.reason));
                }
            }
            Err(status) if is_stale_token(&status) => {
                return Err(LeaseError::Lost(status.message().to_owned()));
            }
            Err(status) => return Err(LeaseError::Unavailable(status.message().to_owned())),
        }
        let tasks = vec![
            AbortOnDropHandle::new(tokio::spawn(
                heartbeat(coordinator.clone(), Arc::clone(&shared)).in_current_span(),
            )),
            AbortOnDropHandle::new(tokio::spawn(
                watch(coordinator.clone(), Arc::clone(&shared)).in_current_span(),
            )),
            AbortOnDropHandle::new(tokio::spawn(
                watch_deadline(Arc::clone(&shared)).in_current_span(),
            )),
            AbortOnDropHandle::new(tokio::spawn(stop_on_shutdown(
                shutdown.clone(),
                Arc::clone(&shared),
            ))),
        ];
        Ok(Self {
            shared,
            coordinator,
            _tasks: tasks,
            marking: Mutex::new(None),
        })
    }

    /// The slice.
    pub fn slice_id(&self) -> &str {
        &self.shared.slice_id
    }

    /// The fencing token.
    pub fn token(&self) -> u64 {
        self.shared.token
    }

    /// The lease's TTL.
    pub fn ttl(&self) -> Duration {
        self.shared.ttl
    }

    /// Whether one more message may be published now: not stopped, and
    /// before the deadline (checked against the clock here, so that a
    /// process resumed after a pause stops even before any task has run).
    /// Call it right before every publish.
    pub fn may_publish(&self) -> bool {
        if self.shared.stop.is_cancelled() {
            return false;
        }
        if Instant::now() >= self.shared.deadline() {
            self.shared.stop(StopReason::Lost(PAST_DEADLINE.to_owned()));
            return false;
        }
        true
    }

    /// No publish at or after this instant (the executor's own deadline).
    pub fn deadline(&self) -> Instant {
        self.shared.deadline()
    }

    /// Resolves when publishing must stop; use it in every `select!` of a
    /// wait (tokens, confirms, retries).
    pub fn stopped(&self) -> WaitForCancellationFuture<'_> {
        self.shared.stop.cancelled()
    }

    /// A token cancelled when publishing stops (for waits that take one).
    pub fn stop_signal(&self) -> CancellationToken {
        self.shared.stop.child_token()
    }

    /// Why publishing stopped (`None` while it goes on).
    pub fn stop_reason(&self) -> Option<StopReason> {
        self.shared
            .reason
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Whether the lease is lost (not merely stopped).
    pub fn is_lost(&self) -> bool {
        self.shared.is_lost()
    }

    /// Makes sure the planner has recorded this lease's write-ahead mark
    /// through item position `through` (`MarkPublishing`; docs/design.md,
    /// "Precise uncertain items"): call it before publishing any item past
    /// the last mark, and publish nothing past it on `false`. A mark that
    /// already covers `through` costs nothing. Retried with backoff while
    /// the planner does not answer (each try bounded by a third of the TTL),
    /// until publishing stops: the lease's own deadline ends that wait.
    ///
    /// Returns `true` once recorded, `false` when publishing stopped first
    /// or the planner refused the token (the lease is lost then).
    pub async fn mark_publishing(&self, through: u64) -> bool {
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(2));
        loop {
            if self.shared.marked_through(through) {
                return true;
            }
            let attempt = mark(self.coordinator.clone(), &self.shared, through);
            let failed = tokio::select! {
                () = self.stopped() => return false,
                outcome = attempt => match outcome {
                    Ok(()) => {
                        self.shared.answered(MARKS);
                        return true;
                    }
                    Err(failed) => failed,
                },
            };
            let delay = backoff.next_delay();
            match failed {
                MarkFailed::Lost => return false,
                MarkFailed::Unanswered(why) => {
                    if self.shared.failed(MARKS, &why, delay) {
                        warn!(planner = %self.shared.said.planner, reason = %why, retry_in_ms = delay.as_millis() as u64,
                            "cannot mark what this lease publishes: not publishing past the mark; retrying (said once for all slice loops)");
                    }
                }
            }
            tokio::select! {
                () = self.stopped() => return false,
                () = tokio::time::sleep(delay) => {}
            }
        }
    }

    /// Some publishes will never be reported: [`Lease::end`] then releases
    /// nothing, and the planner's sweep judges the slice when the lease
    /// expires (its unreported items up to the mark become `uncertain`).
    pub fn keep_for_expiry(&self) {
        self.shared
            .unreported
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Whether the recorded write-ahead mark covers item position `through`.
    pub fn is_marked_through(&self, through: u64) -> bool {
        self.shared.marked_through(through)
    }

    /// Moves the write-ahead mark to `through` in the background, unless it
    /// is there already or a move is under way: at full speed the mark
    /// stays ahead of publishing, so a run rarely waits for the planner
    /// (each mark is a durable commit). One try; a failure is left to the
    /// next [`Lease::mark_publishing`], which waits.
    pub fn mark_ahead(&self, through: u64) {
        if self.shared.marked_through(through)
            || self
                .shared
                .marking_ahead
                .swap(true, std::sync::atomic::Ordering::SeqCst)
        {
            return;
        }
        let shared = Arc::clone(&self.shared);
        let coordinator = self.coordinator.clone();
        let task = tokio::spawn(
            async move {
                if let Err(MarkFailed::Unanswered(why)) = mark(coordinator, &shared, through).await
                {
                    tracing::debug!(reason = %why, "moving the mark ahead failed");
                }
                shared
                    .marking_ahead
                    .store(false, std::sync::atomic::Ordering::SeqCst);
            }
            .in_current_span(),
        );
        *self.marking.lock().unwrap_or_else(PoisonError::into_inner) =
            Some(AbortOnDropHandle::new(task));
    }

    /// Stops publishing for `reason`.
    pub fn stop(&self, reason: StopReason) {
        self.shared.stop(reason);
    }

    /// A reporter of this lease's outcomes: events sent to the returned
    /// sender are batched (up to 256, or 100 ms) and streamed to
    /// `ReportOutcomes` with the token. A report that answers `lease_lost`
    /// stops publishing, but reporting goes on: the planner still records
    /// what happened to publishes. The task ends when every sender is
    /// dropped and the buffer is reported (or given up after a minute of
    /// failures).
    pub fn reporter(&self) -> (mpsc::Sender<v1::AuditEvent>, AbortOnDropHandle<()>) {
        let (sender, receiver) = mpsc::channel(REPORT_BATCH * 4);
        let task = tokio::spawn(
            report(self.coordinator.clone(), Arc::clone(&self.shared), receiver).in_current_span(),
        );
        (sender, AbortOnDropHandle::new(task))
    }

    /// Ends the lease: completed, or with `release` given back for another
    /// executor (the planner completes nothing that has unfinished items).
    /// Also tried when the lease counts as lost here (its own deadline
    /// passed): the planner may still hold it, and a release spares the
    /// slice a wait for its TTL; a stale token is simply refused. Bounded by
    /// a third of the TTL.
    pub async fn end(self, release: bool) {
        if self
            .shared
            .unreported
            .load(std::sync::atomic::Ordering::SeqCst)
        {
            return;
        }
        let release = release || self.is_lost();
        self.shared
            .ending
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let request = v1::CompleteSliceRequest {
            slice_id: self.shared.slice_id.clone(),
            fencing_token: self.shared.token,
            release,
        };
        let mut coordinator = self.coordinator.clone();
        match tokio::time::timeout(self.shared.ttl / 3, coordinator.complete_slice(request)).await {
            Ok(Ok(_)) if release => info!("slice released"),
            Ok(Ok(_)) => info!("slice completed"),
            Ok(Err(status)) if is_stale_token(&status) => {
                tracing::debug!(
                    grpc_message = status.message(),
                    "the lease was already gone"
                );
            }
            Ok(Err(status)) => {
                warn!(planner = %self.shared.said.planner, code = ?status.code(), grpc_message = status.message(), "ending the lease failed; it expires by itself");
            }
            Err(_) => {
                warn!(planner = %self.shared.said.planner, "ending the lease timed out; it expires by itself")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    //! Lease timing on a paused clock, against the in-memory fake planner.

    use std::time::Duration;

    use tokio::time::Instant;
    use tokio_util::sync::CancellationToken;

    use super::{Lease, PAST_DEADLINE, StopReason};
    use crate::fakes::{Answers, FakePlanner};

    const TTL: Duration = Duration::from_secs(30);

    async fn hold(planner: &FakePlanner, shutdown: &CancellationToken) -> Lease {
        Lease::start(
            planner.client.clone(),
            "slice-1".to_owned(),
            7,
            TTL,
            super::SharedFailures::default(),
            shutdown,
        )
        .await
        .expect("the lease is held")
    }

    /// Renewed once at the start, then every third of the TTL; each renewal
    /// moves the executor's own deadline to two thirds of the TTL after it.
    #[tokio::test(start_paused = true)]
    async fn a_lease_is_renewed_every_third_of_its_ttl() {
        let planner = FakePlanner::start(Answers::default());
        let shutdown = CancellationToken::new();
        let started = Instant::now();
        let lease = hold(&planner, &shutdown).await;

        tokio::time::sleep(Duration::from_secs(35)).await;

        let beats: Vec<u64> = planner
            .calls()
            .heartbeats
            .iter()
            .map(|at| at.duration_since(started).as_secs())
            .collect();
        assert_eq!(beats, [0, 10, 20, 30]);
        assert!(lease.may_publish());
        assert_eq!(
            lease.deadline().duration_since(started).as_secs(),
            30 + 20,
            "two thirds of the TTL after the last renewal"
        );
    }

    /// A planner that stops answering renewals: the lease stops publishing
    /// by itself at two thirds of the TTL after the last renewal that was
    /// answered, before the planner could lease the slice again.
    #[tokio::test(start_paused = true)]
    async fn an_unrenewed_lease_stops_at_two_thirds_of_its_ttl() {
        let planner = FakePlanner::start(Answers {
            heartbeats_fail_from: Some(2),
            ..Answers::default()
        });
        let shutdown = CancellationToken::new();
        let started = Instant::now();
        let lease = hold(&planner, &shutdown).await;

        tokio::time::sleep_until(started + Duration::from_millis(19_900)).await;
        assert!(lease.may_publish(), "still within the deadline");
        lease.stopped().await;
        assert_eq!(started.elapsed().as_secs(), 20);
        assert!(!lease.may_publish());
        assert_eq!(
            lease.stop_reason(),
            Some(StopReason::Lost(PAST_DEADLINE.to_owned()))
        );
        assert!(planner.calls().heartbeats.len() >= 2, "renewals were tried");
    }

    /// Shutdown stops publishing at once; the lease is then ended (completed).
    #[tokio::test(start_paused = true)]
    async fn shutdown_stops_publishing_and_the_lease_ends() {
        let planner = FakePlanner::start(Answers::default());
        let shutdown = CancellationToken::new();
        let lease = hold(&planner, &shutdown).await;
        shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(1), lease.stopped())
            .await
            .expect("stopped at once");
        assert!(!lease.may_publish());
        // The reason is given by the lease's own task, right after.
        tokio::time::timeout(Duration::from_secs(1), async {
            while lease.stop_reason().is_none() {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("a stop reason");
        assert_eq!(lease.stop_reason(), Some(StopReason::Shutdown));
        lease.end(false).await;
        assert_eq!(planner.calls().completed, [false]);
    }
}
