//! One slice from claim to end: its lease, its channels and collector,
//! its queue ([`SliceRun`]), and the stall warning ([`Progress`]).

use std::{
    collections::VecDeque,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use redrive_proto::{time::from_duration, v1};
use tokio::{sync::mpsc, time::Instant};
use tokio_util::{sync::CancellationToken, task::AbortOnDropHandle};
use tracing::{info, warn};

use super::{Leave, Worker};
use crate::{
    bucket::Rate,
    health::Heartbeat,
    item::{InvalidItem, LeasedItem},
    lease::{Lease, SharedFailures, StopReason},
    outcomes::{self, Collector, EventContext, Feedback, InFlight, TokenDebt, Work},
    publisher::{Connect, Handoff},
};

/// A slice that publishes nothing and confirms nothing for this long, while
/// not told to stop, is logged as stalled with what it waits for.
const STALL_WARNING: Duration = Duration::from_secs(30);

/// What a slice loop is doing, for the stall warning.
#[derive(Clone, Default)]
pub(super) struct Progress {
    /// Bumped on every publish and every final outcome.
    pub(super) counter: Arc<AtomicU64>,
    /// What the loop waits for now.
    pub(super) waiting_for: Arc<Mutex<&'static str>>,
    /// The loop's liveness, beaten with every bump.
    pub(super) heartbeat: Option<Heartbeat>,
}

impl Progress {
    pub(super) fn bump(&self) {
        self.counter.fetch_add(1, Ordering::Relaxed);
        if let Some(heartbeat) = &self.heartbeat {
            heartbeat.beat();
        }
    }

    pub(super) fn waiting_for(&self, what: &'static str) {
        *self
            .waiting_for
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = what;
    }

    /// Logs a warning each time nothing moved for [`STALL_WARNING`].
    pub(super) async fn watch(self) {
        self.watch_with(|stalled, waiting_for| {
            warn!(
                stalled_seconds = stalled.as_secs(),
                waiting_for, "slice made no progress"
            );
        })
        .await;
    }

    /// Calls `stalled` with how long nothing moved and what the loop waits
    /// for, each time nothing moved for [`STALL_WARNING`] (looking every
    /// third of it); runs until dropped.
    pub(super) async fn watch_with(self, mut stalled: impl FnMut(Duration, &'static str)) {
        let mut seen = self.counter.load(Ordering::Relaxed);
        let mut still_since = Instant::now();
        loop {
            tokio::time::sleep(STALL_WARNING / 3).await;
            let now = self.counter.load(Ordering::Relaxed);
            if now != seen {
                seen = now;
                still_since = Instant::now();
            } else if still_since.elapsed() >= STALL_WARNING {
                let waiting_for = *self
                    .waiting_for
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                stalled(still_since.elapsed(), waiting_for);
                still_since = Instant::now();
            }
        }
    }
}

/// One slice being replayed: its queue, what is outstanding and its channels.
pub(super) struct SliceRun {
    pub(super) rate: Rate,
    pub(super) context: EventContext,
    pub(super) queue: VecDeque<Work>,
    /// Items without a final outcome yet.
    pub(super) outstanding: usize,
    pub(super) events: mpsc::Sender<v1::AuditEvent>,
    pub(super) feedback: mpsc::Receiver<Feedback>,
    pub(super) in_flight: mpsc::Sender<InFlight>,
    pub(super) debt: TokenDebt,
    pub(super) progress: Progress,
    /// How long the last run waited for its tokens.
    pub(super) tokens_waited: Duration,
    /// The highest item position of the slice (the mark goes no further).
    pub(super) last_position: u64,
    /// When a publish returns: [`Handoff::Written`] in an ordered plan,
    /// whose message that was not written must be published again before
    /// any later one; [`Handoff::Queued`] otherwise.
    pub(super) handoff: Handoff,
}

impl SliceRun {
    /// Reports a final outcome decided without publishing.
    pub(super) async fn finish(&mut self, work: &Work, action: v1::AuditAction, reason: &str) {
        let _ = self
            .events
            .send(self.context.event(work, action, reason, 0))
            .await;
        self.outstanding = self.outstanding.saturating_sub(1);
        self.progress.bump();
    }

    pub(super) fn take_feedback(&mut self, feedback: Feedback) {
        match feedback {
            Feedback::Retry(work) => self.queue.push_back(*work),
            Feedback::Unpublished(work) => requeue_unpublished(&mut self.queue, *work),
            Feedback::Done => {
                self.outstanding = self.outstanding.saturating_sub(1);
                self.progress.bump();
            }
        }
    }

    /// Puts a run back at the front of the queue, in order.
    pub(super) fn requeue(
        &mut self,
        run: impl IntoIterator<Item = Work, IntoIter: DoubleEndedIterator>,
    ) {
        for work in run.into_iter().rev() {
            self.queue.push_front(work);
        }
    }

    /// Puts a run back (not published) and passes on why: the end of a
    /// pipeline step that cannot go on.
    pub(super) fn give_back(
        &mut self,
        run: impl IntoIterator<Item = Work, IntoIter: DoubleEndedIterator>,
        leave: Leave,
    ) -> Leave {
        self.requeue(run);
        leave
    }

    /// Queues a claimed slice's items in order; an item whose key the
    /// planner's record says was replayed is reported `skipped_duplicate`.
    pub(super) async fn enqueue(&mut self, items: Vec<LeasedItem>) {
        for item in items {
            let work = Work {
                attempt: item.attempts + 1,
                item,
                not_before: None,
            };
            if work.item.key_replayed {
                let reason = "message key already replayed (planner record)";
                self.finish(&work, v1::AuditAction::SkippedDuplicate, reason)
                    .await;
            } else {
                self.queue.push_back(work);
            }
        }
    }

    /// The next run ([`take_run`] from the queue).
    pub(super) fn next_run(&mut self, first: Work, chunk: usize) -> Vec<Work> {
        take_run(&mut self.queue, first, chunk)
    }
}

/// Puts `work`, never written to the broker, back in its place: before the
/// first later item of the slice still queued (the queue holds the slice's
/// items in order, retries at its end), so that it goes out before them.
pub(super) fn requeue_unpublished(queue: &mut VecDeque<Work>, work: Work) {
    let at = queue
        .iter()
        .position(|queued| queued.position() > work.position())
        .unwrap_or(queue.len());
    queue.insert(at, work);
}

/// The next run: `first` and the queued items for its destination
/// without a pending backoff, in queue order, at most `chunk`. Items for
/// other destinations keep their places. A slice whose items alternate
/// between destinations (a fan-out's dead letters) is thus published in
/// runs as long as one destination's items, not runs of one. Order is
/// kept per destination, never across destinations; the write-ahead mark
/// of a run covers the skipped items below it too, which only widens what
/// a lost lease may leave `uncertain`.
pub(super) fn take_run(queue: &mut VecDeque<Work>, first: Work, chunk: usize) -> Vec<Work> {
    let fits = |next: &Work| next.not_before.is_none() && next.same_destination(&first);
    let mut run = Vec::with_capacity(chunk.min(queue.len() + 1));
    // The common case, one destination: take from the front.
    while run.len() + 1 < chunk && queue.front().is_some_and(fits) {
        run.extend(queue.pop_front());
    }
    if run.len() + 1 < chunk && !queue.is_empty() {
        // Items for other destinations in between: one pass that keeps
        // them in order.
        let mut rest = VecDeque::with_capacity(queue.len());
        for next in queue.drain(..) {
            if run.len() + 1 < chunk && fits(&next) {
                run.push(next);
            } else {
                rest.push_back(next);
            }
        }
        *queue = rest;
    }
    run.insert(0, first);
    run
}

impl<C: Connect> Worker<C> {
    /// Replays one claimed slice: holds its lease, publishes its items,
    /// waits for their confirms and reports, then ends the lease.
    #[tracing::instrument(skip_all, name = "executor.slice", fields(slice.id = %slice.slice_id, plan.id = %slice.plan_id))]
    pub(super) async fn replay_slice(&mut self, slice: v1::Slice, shutdown: &CancellationToken) {
        let Some((lease, mut run, tasks)) = self.start_slice(slice, shutdown).await else {
            return;
        };
        self.publish_slice(&lease, &mut run).await;
        self.end_slice(lease, run, tasks).await;
    }

    /// Starts the lease, the reporter, the confirm collector and the stall
    /// warning of `slice`, and queues its items (reporting those the
    /// planner already knows replayed). `None` when the lease cannot be
    /// held or the slice cannot be replayed ([`replayable`]; then released).
    async fn start_slice(
        &mut self,
        mut slice: v1::Slice,
        shutdown: &CancellationToken,
    ) -> Option<(Lease, SliceRun, SliceTasks)> {
        let lease_ttl = slice
            .lease_ttl
            .as_ref()
            .and_then(from_duration)
            .unwrap_or(Duration::from_secs(30));
        let lease = match Lease::start(
            self.coordinator.clone(),
            slice.slice_id.clone(),
            slice.fencing_token,
            lease_ttl,
            SharedFailures {
                planner: self.settings.planner.clone(),
                failures: self.settings.failures.clone(),
            },
            shutdown,
        )
        .await
        {
            Ok(lease) => lease,
            Err(error) => {
                warn!(%error, "slice not replayed");
                return None;
            }
        };
        self.metrics.lease_claimed();
        let (rate, items) = match replayable(&mut slice) {
            Ok(checked) => checked,
            Err(reason) => {
                warn!(%reason, "slice cannot be replayed; releasing it");
                lease.end(true).await;
                return None;
            }
        };
        info!(
            items = items.len(),
            fencing_token = slice.fencing_token,
            "replaying slice"
        );
        let (events, reporting) = lease.reporter();
        let (in_flight, in_flight_received) =
            mpsc::channel::<InFlight>(self.settings.publisher.window.max(1));
        // Room for every item: the collector never waits (see there why).
        let (feedback_sender, feedback) = outcomes::feedback_channel(items.len());
        let context = EventContext {
            plan_id: slice.plan_id.clone(),
            slice_id: slice.slice_id.clone(),
            wave: slice.wave,
            executor_id: self.settings.executor_id.clone(),
            metrics: self.metrics.clone(),
        };
        let collector = Collector {
            events: events.clone(),
            feedback: feedback_sender,
            context: context.clone(),
            replay_keys: self.replay_keys.clone(),
            // An ordered plan's item is never published again after later
            // ones: its first outcome is final (docs/replay.md, "Order").
            max_attempts: if slice.ordered {
                1
            } else {
                self.settings.max_attempts
            },
            debt: self.debt.clone(),
        };
        let collecting = AbortOnDropHandle::new(tokio::spawn(collector.run(in_flight_received)));
        let progress = Progress {
            heartbeat: Some(self.heartbeat.clone()),
            ..Progress::default()
        };
        // In the slice's span: the warning names the slice and plan.
        let stall_warning = AbortOnDropHandle::new(tokio::spawn(
            tracing::Instrument::in_current_span(progress.clone().watch()),
        ));
        let mut run = SliceRun {
            rate,
            context,
            queue: VecDeque::new(),
            outstanding: items.len(),
            events,
            feedback,
            in_flight,
            debt: self.debt.clone(),
            progress,
            tokens_waited: Duration::ZERO,
            last_position: items.iter().map(|item| item.position).max().unwrap_or(0),
            handoff: if slice.ordered {
                Handoff::Written
            } else {
                Handoff::Queued
            },
        };
        run.enqueue(items).await;
        let tasks = SliceTasks {
            reporting,
            collecting,
            stall_warning,
        };
        Some((lease, run, tasks))
    }

    /// After publishing stopped: outstanding confirms finish (or time out),
    /// then every outcome is reported, then the lease ends (released when
    /// items are unfinished).
    async fn end_slice(&self, lease: Lease, run: SliceRun, tasks: SliceTasks) {
        tracing::debug!(
            outstanding = run.outstanding,
            queued = run.queue.len(),
            stop = ?lease.stop_reason(),
            "publishing stopped"
        );
        let SliceRun {
            mut outstanding,
            events,
            mut feedback,
            in_flight,
            progress: run_progress,
            ..
        } = run;
        let SliceTasks {
            reporting,
            collecting,
            stall_warning,
        } = tasks;
        drop(in_flight);
        run_progress.waiting_for("publisher confirms of what was handed to the broker");
        if collecting.await.is_err() {
            // The collector died with publishes in hand whose outcomes
            // nobody will report: never release the slice, so that its
            // expiry judges them by the write-ahead mark (`uncertain`).
            warn!("the confirm collector failed; leaving the slice to expire");
            lease.keep_for_expiry();
        }
        while let Ok(message) = feedback.try_recv() {
            if let Feedback::Done = message {
                outstanding = outstanding.saturating_sub(1);
            }
        }
        drop(events);
        run_progress.waiting_for("the planner to take the last outcome reports");
        let _ = reporting.await;
        tracing::debug!("outcomes reported");
        let lost = lease.is_lost();
        if let Some(StopReason::Lost(why)) = lease.stop_reason() {
            warn!(reason = %why, unfinished = outstanding, "lease lost: the slice goes to whichever executor claims it next");
        }
        self.metrics.lease_ended(lost);
        lease.end(outstanding > 0).await;
        // It only ever sleeps and logs: ended with the slice.
        stall_warning.abort();
        let _ = stall_warning.await;
    }
}

/// The tasks of one slice, owned by its loop and ended with the slice.
pub(super) struct SliceTasks {
    /// The lease's reporter: ends once every event sender is dropped and
    /// its buffer is reported.
    reporting: AbortOnDropHandle<()>,
    /// The confirm collector: ends once the in-flight channel is closed
    /// and empty.
    collecting: AbortOnDropHandle<()>,
    /// The stall warning: runs until aborted.
    stall_warning: AbortOnDropHandle<()>,
}

/// The rate and the items of a claimed slice, each checked once: the rate
/// within the bucket's bounds, every item a [`LeasedItem`]. Otherwise what
/// is wrong (a planner this executor cannot follow).
fn replayable(slice: &mut v1::Slice) -> Result<(Rate, Vec<LeasedItem>), String> {
    let rate = slice.rate.clone().unwrap_or_default();
    let rate = Rate::new(rate.per_second, rate.burst).map_err(|error| error.to_string())?;
    let items = std::mem::take(&mut slice.items)
        .into_iter()
        .map(LeasedItem::try_from)
        .collect::<Result<Vec<_>, InvalidItem>>()
        .map_err(|error| error.to_string())?;
    Ok((rate, items))
}
