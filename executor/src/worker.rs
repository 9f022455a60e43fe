//! The executor loop (docs/design.md, "Executor loop and guarantees"): claim a slice
//! (long poll), hold its [`Lease`], and publish its items as a short pipeline
//! per run of items bound for one destination:
//!
//! 1. drop what is decided without publishing: a key the planner already
//!    saw replayed, an item past its deadline (`skipped_stale`), an item the
//!    owning service now blocks (state re-check through the planner);
//! 2. wait for room in the confirm window, pay any token debt (late or lost
//!    confirms, [`crate::outcomes`]), then take the run's tokens;
//! 3. read the replay keys in Redis (a concurrent plan may have sent a key);
//! 4. publish at once, each message only while [`Lease::may_publish`] holds
//!    and while its token is fresh: a token is never spent after an
//!    interruption (a reconnect, a stall, a lost lease).
//!
//! Confirms go to the slice's [`Collector`], which reports outcomes and sends
//! retries back. Every wait (window, tokens, state re-check, Redis, backoff)
//! also waits for [`Lease::stopped`], so a cancel, pause, gate abort, lost
//! lease or SIGTERM ends publishing at once; what was already handed to the
//! broker (at most the window) is still confirmed and reported.

use std::{
    collections::{HashMap, VecDeque},
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use redrive_proto::{
    backoff::Backoff,
    time::from_duration,
    v1::{self, coordinator_client::CoordinatorClient},
};
use tokio::{sync::mpsc, time::Instant};
use tokio_util::{sync::CancellationToken, task::AbortOnDropHandle};
use tonic::transport::Channel;
use tracing::{info, warn};

use crate::{
    bucket::{Bucket, BucketError, Rate},
    health::Heartbeat,
    lease::{Lease, StopReason},
    message,
    metrics::ExecutorMetrics,
    outcomes::{Collector, EventContext, Feedback, InFlight, LATE_CONFIRM, TokenDebt, Work},
    publisher::{Outgoing, PublishError, Publisher, PublisherOptions, Slot},
    replay_keys::ReplayKeys,
};

/// Most tokens taken from the bucket in one call.
const TOKEN_CHUNK: u32 = 64;
/// A run asks for about this much of the rate's time at once, so that slow
/// rates take one token at a time and checks stay close to the publish.
const RUN_SPAN: Duration = Duration::from_millis(50);
/// At full speed the write-ahead mark is kept about this much of the rate
/// ahead of publishing ([`mark_lookahead`]).
const MARK_AHEAD_SPAN: Duration = Duration::from_millis(100);
/// A bucket that granted the last run's tokens within this did not hold it
/// back: the next run's mark is sent while its tokens are taken.
const TOKENS_AT_ONCE: Duration = Duration::from_millis(5);
/// A token older than this is not spent: the run is taken again with fresh
/// tokens (an interruption between the grant and the publish).
pub const TOKEN_SPEND_LIMIT: Duration = Duration::from_millis(250);

/// The instrumentation scope of the publish spans (the crate, as the
/// `tracing` bridge names the executor's other spans).
const TRACER_SCOPE: &str = "redrive-executor";
/// A slice that publishes nothing and confirms nothing for this long, while
/// not told to stop, is logged as stalled with what it waits for.
const STALL_WARNING: Duration = Duration::from_secs(30);

/// What the loop needs.
#[derive(Clone)]
pub struct WorkerSettings {
    /// This executor's id in leases and audit events.
    pub executor_id: String,
    /// AMQP URL of the broker.
    pub amqp_url: String,
    /// The publisher's window, confirm timeout and heartbeat.
    pub publisher: PublisherOptions,
    /// Attempts before a nacked item is `failed`.
    pub max_attempts: u32,
    /// Long-poll wait of a claim.
    pub claim_wait: Duration,
}

/// The running executor: claims slices until `shutdown`.
pub struct Worker {
    settings: WorkerSettings,
    coordinator: CoordinatorClient<Channel>,
    bucket: Arc<Bucket>,
    replay_keys: Option<ReplayKeys>,
    publisher: Option<Publisher>,
    /// Late and lost confirms not yet charged, shared by every slice loop of
    /// the executor: a slice that ends does not take its debt with it.
    debt: TokenDebt,
    metrics: ExecutorMetrics,
    /// Beaten by the loop, for the health service's liveness.
    heartbeat: Heartbeat,
}

/// Why the publishing loop left a run.
enum Leave {
    /// Stop publishing this slice.
    Stop,
    /// Go on with the next run.
    Next,
}

/// What a slice loop is doing, for the stall warning.
#[derive(Clone, Default)]
struct Progress {
    /// Bumped on every publish and every final outcome.
    counter: Arc<AtomicU64>,
    /// What the loop waits for now.
    waiting_for: Arc<Mutex<&'static str>>,
    /// The loop's liveness, beaten with every bump.
    heartbeat: Option<Heartbeat>,
}

impl Progress {
    fn bump(&self) {
        self.counter.fetch_add(1, Ordering::Relaxed);
        if let Some(heartbeat) = &self.heartbeat {
            heartbeat.beat();
        }
    }

    fn waiting_for(&self, what: &'static str) {
        *self
            .waiting_for
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = what;
    }

    /// Logs a warning each time nothing moved for [`STALL_WARNING`].
    async fn watch(self) {
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
                warn!(
                    stalled_seconds = still_since.elapsed().as_secs(),
                    waiting_for, "slice made no progress"
                );
                still_since = Instant::now();
            }
        }
    }
}

/// One slice being replayed: its queue, what is outstanding and its channels.
struct SliceRun {
    rate: Rate,
    context: EventContext,
    queue: VecDeque<Work>,
    /// Items without a final outcome yet.
    outstanding: usize,
    events: mpsc::Sender<v1::AuditEvent>,
    feedback: mpsc::UnboundedReceiver<Feedback>,
    in_flight: mpsc::Sender<InFlight>,
    debt: TokenDebt,
    progress: Progress,
    /// How long the last run waited for its tokens.
    tokens_waited: Duration,
    /// The highest item position of the slice (the mark goes no further).
    last_position: u64,
}

impl SliceRun {
    /// Reports a final outcome decided without publishing.
    async fn finish(&mut self, work: &Work, action: v1::AuditAction, reason: &str) {
        let _ = self
            .events
            .send(self.context.event(work, action, reason, 0))
            .await;
        self.outstanding = self.outstanding.saturating_sub(1);
        self.progress.bump();
    }

    fn take_feedback(&mut self, feedback: Feedback) {
        match feedback {
            Feedback::Retry(work) => self.queue.push_back(*work),
            Feedback::Done => {
                self.outstanding = self.outstanding.saturating_sub(1);
                self.progress.bump();
            }
        }
    }

    /// Puts a run back at the front of the queue, in order.
    fn requeue(&mut self, run: impl IntoIterator<Item = Work, IntoIter: DoubleEndedIterator>) {
        for work in run.into_iter().rev() {
            self.queue.push_front(work);
        }
    }

    /// Puts a run back (not published) and passes on why: the end of a
    /// pipeline step that cannot go on.
    fn give_back(
        &mut self,
        run: impl IntoIterator<Item = Work, IntoIter: DoubleEndedIterator>,
        leave: Leave,
    ) -> Leave {
        self.requeue(run);
        leave
    }

    /// The next run ([`take_run`] from the queue).
    fn next_run(&mut self, first: Work, chunk: usize) -> Vec<Work> {
        take_run(&mut self.queue, first, chunk)
    }
}

/// The next run: `first` and the queued items for its destination
/// without a pending backoff, in queue order, at most `chunk`. Items for
/// other destinations keep their places. A slice whose items alternate
/// between destinations (a fan-out's dead letters) is thus published in
/// runs as long as one destination's items, not runs of one. Order is
/// kept per destination, never across destinations; the write-ahead mark
/// of a run covers the skipped items below it too, which only widens what
/// a lost lease may leave `uncertain`.
fn take_run(queue: &mut VecDeque<Work>, first: Work, chunk: usize) -> Vec<Work> {
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

/// How far ahead of a run the write-ahead mark is kept at full speed: about
/// [`MARK_AHEAD_SPAN`] of the rate (a mark's durable commit and round trip
/// take tens of milliseconds), at most the confirm window `window`, at
/// least 1. This much is added to what a lost lease may leave `uncertain`.
pub fn mark_lookahead(rate: Rate, window: usize) -> u64 {
    let span = (rate.per_second * MARK_AHEAD_SPAN.as_secs_f64()).ceil();
    let most = u64::try_from(window).unwrap_or(u64::MAX).max(1);
    // `span` is finite and ≥ 0 (a validated rate); the cast saturates.
    (span as u64).clamp(1, most)
}

/// Tokens per bucket call for `rate`: about [`RUN_SPAN`] of it, at least 1,
/// at most the burst, [`TOKEN_CHUNK`] and the window.
pub fn run_size(rate: Rate, window: usize) -> usize {
    let span = (rate.per_second * RUN_SPAN.as_secs_f64()).floor();
    let most = rate
        .burst
        .min(TOKEN_CHUNK)
        .min(u32::try_from(window).unwrap_or(u32::MAX))
        .max(1);
    // `span` is finite and ≥ 0 (a validated rate); the cast saturates.
    (span as u32).clamp(1, most) as usize
}

impl Worker {
    /// A worker over its parts; `debt` is shared by the executor's workers.
    pub fn new(
        settings: WorkerSettings,
        coordinator: CoordinatorClient<Channel>,
        bucket: Arc<Bucket>,
        replay_keys: Option<ReplayKeys>,
        debt: TokenDebt,
        metrics: ExecutorMetrics,
        heartbeat: Heartbeat,
    ) -> Self {
        Self {
            settings,
            coordinator,
            bucket,
            replay_keys,
            publisher: None,
            debt,
            metrics,
            heartbeat,
        }
    }

    /// Claims and replays slices until `shutdown`.
    pub async fn run(mut self, shutdown: CancellationToken) {
        let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(5));
        while !shutdown.is_cancelled() {
            self.heartbeat.beat();
            // No claim without a broker to publish to: a slice would only be held.
            if self.publisher(&shutdown, None).await.is_none() {
                break;
            }
            let claim = self.coordinator.claim_slice(v1::ClaimSliceRequest {
                executor_id: self.settings.executor_id.clone(),
                wait: Some(redrive_proto::time::duration(self.settings.claim_wait)),
                marks_publishing: true,
            });
            let answer = tokio::select! {
                () = shutdown.cancelled() => break,
                answer = claim => answer,
            };
            self.heartbeat.beat();
            match answer {
                Ok(answer) => {
                    backoff.reset();
                    if let Some(slice) = answer.into_inner().slice {
                        self.replay_slice(slice, &shutdown).await;
                    }
                }
                Err(status) => {
                    let delay = backoff.next_delay();
                    warn!(code = ?status.code(), grpc_message = status.message(), retry_in_ms = delay.as_millis() as u64, "claim failed");
                    tokio::select! {
                        () = shutdown.cancelled() => break,
                        () = tokio::time::sleep(delay) => {}
                    }
                }
            }
        }
        if let Some(publisher) = self.publisher.take()
            && tokio::time::timeout(Duration::from_secs(2), publisher.close())
                .await
                .is_err()
        {
            warn!("closing the broker connection timed out");
        }
        info!("executor stopped");
    }

    /// A connected publisher, reconnecting with backoff until `stop` or, with
    /// `give_up_after`, until that long has passed (`None` either way).
    async fn publisher(
        &mut self,
        stop: &CancellationToken,
        give_up_after: Option<Duration>,
    ) -> Option<&Publisher> {
        let started = Instant::now();
        if self
            .publisher
            .as_ref()
            .is_some_and(|publisher| !publisher.is_connected())
        {
            self.publisher = None;
        }
        let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(5));
        while self.publisher.is_none() {
            let connect = Publisher::connect_with(&self.settings.amqp_url, self.settings.publisher);
            let connected = tokio::select! {
                () = stop.cancelled() => return None,
                connected = connect => connected,
            };
            match connected {
                Ok(publisher) => self.publisher = Some(publisher),
                Err(error) => {
                    let delay = backoff.next_delay();
                    self.heartbeat.beat();
                    warn!(%error, retry_in_ms = delay.as_millis() as u64, "cannot connect to the broker");
                    if give_up_after.is_some_and(|limit| started.elapsed() >= limit) {
                        return None;
                    }
                    tokio::select! {
                        () = stop.cancelled() => return None,
                        () = tokio::time::sleep(delay) => {}
                    }
                }
            }
        }
        self.publisher.as_ref()
    }

    #[tracing::instrument(skip_all, name = "executor.slice", fields(slice.id = %slice.slice_id, plan.id = %slice.plan_id))]
    async fn replay_slice(&mut self, slice: v1::Slice, shutdown: &CancellationToken) {
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
            shutdown,
        )
        .await
        {
            Ok(lease) => lease,
            Err(error) => {
                warn!(%error, "slice not replayed");
                return;
            }
        };
        self.metrics.lease_claimed();
        let rate = slice.rate.clone().unwrap_or_default();
        let Ok(rate) = Rate::new(rate.per_second, rate.burst) else {
            warn!("slice carries an invalid rate; releasing it");
            lease.end(true).await;
            return;
        };
        info!(
            items = slice.items.len(),
            fencing_token = slice.fencing_token,
            "replaying slice"
        );
        let (events, reporting) = lease.reporter();
        let (in_flight, in_flight_received) =
            mpsc::channel::<InFlight>(self.settings.publisher.window.max(1));
        let (feedback_sender, feedback) = mpsc::unbounded_channel::<Feedback>();
        let debt = self.debt.clone();
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
            debt: debt.clone(),
        };
        let collecting = AbortOnDropHandle::new(tokio::spawn(collector.run(in_flight_received)));
        let progress = Progress {
            heartbeat: Some(self.heartbeat.clone()),
            ..Progress::default()
        };
        let _stall_warning = AbortOnDropHandle::new(tokio::spawn(progress.clone().watch()));
        let mut run = SliceRun {
            rate,
            context,
            queue: VecDeque::new(),
            outstanding: slice.items.len(),
            events,
            feedback,
            in_flight,
            debt,
            progress,
            tokens_waited: Duration::ZERO,
            last_position: slice
                .items
                .iter()
                .filter_map(|item| item.item_id.parse().ok())
                .max()
                .unwrap_or(0),
        };
        for item in slice.items {
            let work = Work {
                attempt: item.attempts + 1,
                item,
                not_before: None,
            };
            if work.item.key_replayed {
                let reason = "message key already replayed (planner record)";
                run.finish(&work, v1::AuditAction::SkippedDuplicate, reason)
                    .await;
            } else {
                run.queue.push_back(work);
            }
        }

        self.publish_slice(&lease, &mut run).await;

        // Outstanding confirms finish (or time out), then every outcome is
        // reported, then the lease ends.
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
            ..
        } = run;
        drop(in_flight);
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
        let _ = reporting.await;
        tracing::debug!("outcomes reported");
        let lost = matches!(lease.stop_reason(), Some(StopReason::Lost(_)));
        if let Some(StopReason::Lost(why)) = lease.stop_reason() {
            warn!(reason = %why, unfinished = outstanding, "lease lost: the slice goes to whichever executor claims it next");
        }
        self.metrics.lease_ended(lost);
        lease.end(outstanding > 0).await;
    }

    /// Publishes the slice's queue until it is empty or the lease stops.
    async fn publish_slice(&mut self, lease: &Lease, run: &mut SliceRun) {
        let chunk = run_size(run.rate, self.settings.publisher.window);
        loop {
            while let Ok(message) = run.feedback.try_recv() {
                run.take_feedback(message);
            }
            if run.outstanding == 0 || !lease.may_publish() {
                return;
            }
            let Some(work) = run.queue.pop_front() else {
                // Everything is published: wait for confirms or retries.
                run.progress.waiting_for("publisher confirms");
                tokio::select! {
                    () = lease.stopped() => return,
                    message = run.feedback.recv() => match message {
                        Some(message) => run.take_feedback(message),
                        None => return,
                    },
                }
                continue;
            };
            if let Some(not_before) = work.not_before {
                run.progress.waiting_for("a retry's backoff");
                tokio::select! {
                    () = lease.stopped() => {
                        run.queue.push_front(work);
                        return;
                    }
                    () = tokio::time::sleep_until(not_before) => {}
                }
            }
            let items = run.next_run(work, chunk);
            match self.publish_run(lease, run, items).await {
                Leave::Stop => return,
                Leave::Next => {}
            }
        }
    }

    /// One run of the pipeline (module docs). A step that cannot go on puts
    /// the run's items back at the front of the queue and says why
    /// ([`Leave`]).
    async fn publish_run(&mut self, lease: &Lease, run: &mut SliceRun, items: Vec<Work>) -> Leave {
        // 1. Decided without publishing.
        let items = drop_stale(run, items).await;
        let Some(items) = self.recheck_state(lease, run, items).await else {
            return Leave::Stop;
        };
        if items.is_empty() {
            return Leave::Next;
        }
        let Some(through) = items
            .iter()
            .map(Work::position)
            .try_fold(0, |most, position| {
                position.map(|position| most.max(position))
            })
        else {
            warn!("the slice has an item id that is not a position; giving the slice back");
            lease.stop(StopReason::Plan("item ids are not positions".to_owned()));
            return run.give_back(items, Leave::Stop);
        };
        let key = items[0].bucket_key();
        // 2. Room in the window, the debt, then the tokens and the mark.
        let slots = match self.room(lease, run, items.len()).await {
            Ok(slots) => slots,
            Err(leave) => return run.give_back(items, leave),
        };
        if let Err(leave) = self.pay_debt(lease, run, &key).await {
            return run.give_back(items, leave);
        }
        let tokens = u32::try_from(items.len()).unwrap_or(u32::MAX);
        let Some(granted_at) = self.grant(lease, run, &key, tokens, through).await else {
            return run.give_back(items, Leave::Stop);
        };
        self.metrics.tokens_granted(
            &items[0].item.exchange,
            &items[0].item.routing_key,
            tokens,
            run.tokens_waited,
            run.rate.per_second,
        );
        // 3. Sent by a concurrent plan or an earlier lease (Redis).
        run.progress.waiting_for("the replay keys in Redis");
        let Some(items) = self.drop_replayed(lease, run, items).await else {
            return Leave::Stop;
        };
        // 4. Publish, each only under a live lease and a fresh token.
        self.publish_items(lease, run, items, slots, granted_at)
            .await
    }

    /// A connected publisher with room for `count` publishes in its confirm
    /// window, and no confirm overdue: a confirm overdue means a stalled
    /// connection, so nothing more goes into it until it answers or the
    /// confirm timeout ends it. The broker unreachable for half the lease
    /// TTL gives the slice back.
    async fn room(
        &mut self,
        lease: &Lease,
        run: &mut SliceRun,
        count: usize,
    ) -> Result<Vec<Slot>, Leave> {
        run.progress.waiting_for("the broker connection");
        let Some(publisher) = self
            .publisher(&lease.stop_signal(), Some(lease.ttl() / 2))
            .await
        else {
            if lease.may_publish() {
                warn!("broker unreachable for half the lease TTL: giving the slice back");
                lease.stop(StopReason::Plan("broker unreachable".to_owned()));
            }
            return Err(Leave::Stop);
        };
        run.progress.waiting_for("room in the confirm window");
        let slots = tokio::select! {
            () = lease.stopped() => return Err(Leave::Stop),
            slots = publisher.reserve(count) => slots,
        };
        let Ok(slots) = slots else {
            self.publisher = None;
            return Err(Leave::Next);
        };
        let overdue = |publisher: &Publisher| {
            publisher
                .oldest_unconfirmed_age()
                .is_some_and(|age| age > LATE_CONFIRM)
        };
        if overdue(publisher) {
            run.progress.waiting_for("an overdue publisher confirm");
            tracing::debug!(
                in_flight = publisher.in_flight(),
                "a publisher confirm is overdue: not publishing until it comes"
            );
        }
        while overdue(publisher) && publisher.is_connected() {
            if let Some(heartbeat) = &run.progress.heartbeat {
                heartbeat.beat();
            }
            tokio::select! {
                () = lease.stopped() => return Err(Leave::Stop),
                () = tokio::time::sleep(Duration::from_millis(20)) => {}
            }
        }
        if !publisher.is_connected() {
            // The confirm timeout ended it: reconnect first. The debt of its
            // lost confirms is paid on the new connection, when whatever the
            // dead one held may reach the broker too.
            self.publisher = None;
            return Err(Leave::Next);
        }
        Ok(slots)
    }

    /// Charges late and lost confirms of `key` to the rate limit again, the
    /// moment the connection works again: that is when what a stalled one
    /// held reaches the broker too. Fails closed: with the bucket
    /// unreachable nothing is published (the run is taken again after
    /// 500 ms).
    async fn pay_debt(&self, lease: &Lease, run: &mut SliceRun, key: &str) -> Result<(), Leave> {
        run.progress.waiting_for("tokens of the rate limit");
        let owed = run.debt.take(key, u32::MAX);
        if owed == 0 {
            return Ok(());
        }
        info!(
            tokens = owed,
            destination = %key,
            "charging late or lost confirms to the rate limit again"
        );
        let charged = tokio::select! {
            () = lease.stopped() => {
                run.debt.add(key.to_owned(), owed);
                return Err(Leave::Stop);
            }
            charged = self.bucket.charge(key, run.rate, owed) => charged,
        };
        if let Err(error) = charged {
            warn!(%error, "cannot charge the rate limit: not publishing (fail closed)");
            run.debt.add(key.to_owned(), owed);
            tokio::select! {
                () = lease.stopped() => return Err(Leave::Stop),
                () = tokio::time::sleep(Duration::from_millis(500)) => return Err(Leave::Next),
            }
        }
        Ok(())
    }

    /// Takes `tokens` of `key` and makes sure the planner has the lease's
    /// write-ahead mark through item `through` ([`Lease::mark_publishing`]):
    /// nothing is published before both, so a lost lease judges only marked
    /// items uncertain. Each mark is a durable commit, a round trip too
    /// slow to pay per run at full speed. So, while the bucket answers at
    /// once, the mark is kept up to a confirm window ahead of the run
    /// ([`Lease::mark_ahead`], in the background), and a run waits only
    /// when it is not there yet (overlapping the bucket's round trip).
    /// Under a rate limit the run waits for its tokens first and then marks
    /// exactly itself: a run still waiting is not marked. When the tokens
    /// were granted; `None` when publishing stopped first.
    async fn grant(
        &self,
        lease: &Lease,
        run: &mut SliceRun,
        key: &str,
        tokens: u32,
        through: u64,
    ) -> Option<Instant> {
        let asked_at = Instant::now();
        let take = async {
            self.take_tokens(lease, key, run.rate, tokens)
                .await
                .then(Instant::now)
        };
        let (granted, marked) = if run.tokens_waited < TOKENS_AT_ONCE {
            let lookahead = mark_lookahead(run.rate, self.settings.publisher.window);
            let ahead = through
                .saturating_add(lookahead)
                .min(run.last_position)
                .max(through);
            if lease.is_marked_through(through) {
                // Moved once half the lookahead is used: one durable commit
                // per half a lookahead of items, not one per run.
                if !lease.is_marked_through(through.saturating_add(lookahead / 2)) {
                    lease.mark_ahead(ahead);
                }
                (take.await, true)
            } else {
                tokio::join!(take, lease.mark_publishing(ahead))
            }
        } else {
            match take.await {
                Some(granted_at) => (Some(granted_at), lease.mark_publishing(through).await),
                None => (None, false),
            }
        };
        let granted_at = granted.filter(|_| marked)?;
        run.tokens_waited = granted_at - asked_at;
        Some(granted_at)
    }

    /// Publishes `items` into `slots` (one each), each only while the lease
    /// allows it and while the run's tokens, granted at `granted_at`, are
    /// fresh ([`TOKEN_SPEND_LIMIT`]); the rest goes back to the queue.
    async fn publish_items(
        &mut self,
        lease: &Lease,
        run: &mut SliceRun,
        items: Vec<Work>,
        mut slots: Vec<Slot>,
        granted_at: Instant,
    ) -> Leave {
        let Some(publisher) = self.publisher.as_ref() else {
            return run.give_back(items, Leave::Next);
        };
        // With spans exported, each message's publish span is a child of the
        // slice's span.
        let tracing = redrive_proto::telemetry::tracing_enabled().then(|| {
            use tracing_opentelemetry::OpenTelemetrySpanExt as _;
            (
                opentelemetry::global::tracer(TRACER_SCOPE),
                tracing::Span::current().context(),
            )
        });
        let mut items = VecDeque::from(items);
        while let Some(work) = items.pop_front() {
            if !lease.may_publish() {
                items.push_front(work);
                return run.give_back(items, Leave::Stop);
            }
            if granted_at.elapsed() > TOKEN_SPEND_LIMIT {
                items.push_front(work);
                return run.give_back(items, Leave::Next);
            }
            // A slot first: a span is made only for a message that goes out.
            let Some(slot) = slots.pop() else {
                items.push_front(work);
                return run.give_back(items, Leave::Next);
            };
            if publisher
                .oldest_unconfirmed_age()
                .is_some_and(|age| age > LATE_CONFIRM)
            {
                // Overdue since the room was made: take the tokens again later.
                items.push_front(work);
                return run.give_back(items, Leave::Next);
            }
            // With spans exported, the message names its publish span;
            // otherwise a random traceparent, and no span per message.
            let span = tracing.as_ref().map(|(tracer, parent)| {
                message::publish_span(
                    tracer,
                    parent,
                    &run.context.plan_id,
                    &run.context.slice_id,
                    &work.item,
                )
            });
            let traceparent = span
                .as_ref()
                .and_then(|span| {
                    use opentelemetry::trace::Span as _;
                    redrive_proto::telemetry::traceparent_of_context(span.span_context())
                })
                .unwrap_or_else(message::traceparent);
            let properties = match message::properties(
                &run.context.plan_id,
                &run.context.executor_id,
                &work.item,
                work.attempt,
                &traceparent,
            ) {
                Ok(properties) => properties,
                Err(reason) => {
                    slots.push(slot);
                    run.finish(&work, v1::AuditAction::Failed, &reason).await;
                    continue;
                }
            };
            let outgoing = Outgoing {
                exchange: work.item.exchange.clone(),
                routing_key: work.item.routing_key.clone(),
                body: work.item.body.clone(),
                properties,
            };
            let not_after = lease.deadline().min(granted_at + TOKEN_SPEND_LIMIT);
            match publisher.publish_in(slot, outgoing, Some(not_after)).await {
                Ok(pending) => {
                    run.progress.bump();
                    if run
                        .in_flight
                        .send(InFlight {
                            work,
                            pending,
                            span,
                        })
                        .await
                        .is_err()
                    {
                        return Leave::Stop;
                    }
                }
                Err(PublishError::Expired) => {
                    // Not published: its token or the lease ran out while it
                    // waited for the publishing task.
                    items.push_front(work);
                    return run.give_back(items, Leave::Next);
                }
                Err(error) => {
                    // Not published: publish it again on a new connection,
                    // with new tokens.
                    warn!(%error, "publish failed; reconnecting");
                    self.publisher = None;
                    items.push_front(work);
                    return run.give_back(items, Leave::Next);
                }
            }
        }
        Leave::Next
    }

    /// Takes `tokens` of `key`; `false` when publishing stopped first or the
    /// bucket refused the request (the slice is given back then).
    async fn take_tokens(&self, lease: &Lease, key: &str, rate: Rate, tokens: u32) -> bool {
        let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(2));
        loop {
            // A slow rate waits long for its tokens: the loop is alive
            // meanwhile, and beats once a second to say so.
            let acquire = self.bucket.acquire(key, rate, tokens);
            tokio::pin!(acquire);
            let answer = loop {
                tokio::select! {
                    () = lease.stopped() => return false,
                    answer = &mut acquire => break answer,
                    () = tokio::time::sleep(Duration::from_secs(1)) => self.heartbeat.beat(),
                }
            };
            match answer {
                Ok(()) => return true,
                Err(BucketError::Unavailable { reason }) => {
                    warn!(%reason, "token bucket unreachable: not publishing (fail closed)");
                    tokio::select! {
                        () = lease.stopped() => return false,
                        () = tokio::time::sleep(backoff.next_delay()) => {}
                    }
                }
                Err(error) => {
                    warn!(%error, "token bucket refused the request; giving the slice back");
                    lease.stop(StopReason::Plan(error.to_string()));
                    return false;
                }
            }
        }
    }

    /// The owning services' verdicts now, for items a hook covers
    /// (`skipped_state` / `needs_compensation`); `None` when publishing
    /// stopped while the planner did not answer.
    async fn recheck_state(
        &self,
        lease: &Lease,
        run: &mut SliceRun,
        items: Vec<Work>,
    ) -> Option<Vec<Work>> {
        let to_check: Vec<String> = items
            .iter()
            .filter(|work| work.item.state_check)
            .map(|work| work.dead_letter_id().to_owned())
            .collect();
        if to_check.is_empty() {
            return Some(items);
        }
        run.progress.waiting_for("the state re-check");
        let mut backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(5));
        let decisions = loop {
            let mut coordinator = self.coordinator.clone();
            let request = v1::RecheckStateRequest {
                plan_id: run.context.plan_id.clone(),
                dead_letter_ids: to_check.clone(),
                slice_id: lease.slice_id().to_owned(),
                fencing_token: lease.token(),
            };
            let answer = tokio::select! {
                () = lease.stopped() => {
                    run.requeue(items);
                    return None;
                }
                answer = coordinator.recheck_state(request) => answer,
            };
            match answer {
                Ok(answer) => break answer.into_inner().decisions,
                Err(status) => {
                    warn!(code = ?status.code(), grpc_message = status.message(), "state re-check failed: not publishing these items until it answers");
                    tokio::select! {
                        () = lease.stopped() => {
                            run.requeue(items);
                            return None;
                        }
                        () = tokio::time::sleep(backoff.next_delay()) => {}
                    }
                }
            }
        };
        let decisions: HashMap<String, v1::StateDecision> = decisions
            .into_iter()
            .map(|decision| (decision.dead_letter_id.clone(), decision))
            .collect();
        let mut allowed = Vec::with_capacity(items.len());
        for work in items {
            match decisions.get(work.dead_letter_id()) {
                Some(decision) if decision.verdict() == v1::StateCheckVerdict::Block => {
                    let reason = decision.reason.clone();
                    run.finish(&work, v1::AuditAction::SkippedState, &reason)
                        .await;
                }
                Some(decision)
                    if decision.verdict() == v1::StateCheckVerdict::NeedsCompensation =>
                {
                    let reason = decision.reason.clone();
                    run.finish(&work, v1::AuditAction::NeedsCompensation, &reason)
                        .await;
                }
                _ => allowed.push(work),
            }
        }
        Some(allowed)
    }

    /// Drops items whose key Redis says was sent (by an earlier lease of this
    /// plan: `sent`; by another plan: `skipped_duplicate`); `None` when
    /// publishing stopped while Redis did not answer (fail closed).
    async fn drop_replayed(
        &self,
        lease: &Lease,
        run: &mut SliceRun,
        items: Vec<Work>,
    ) -> Option<Vec<Work>> {
        let Some(replay_keys) = &self.replay_keys else {
            return Some(items);
        };
        let keys: Vec<String> = items.iter().map(Work::replay_identity).collect();
        let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(2));
        let sent = loop {
            let answer = tokio::select! {
                () = lease.stopped() => {
                    run.requeue(items);
                    return None;
                }
                answer = replay_keys.sent_by(&keys) => answer,
            };
            match answer {
                Ok(sent) => break sent,
                Err(error) => {
                    warn!(%error, "replay keys unreachable: not publishing until Redis is back (fail closed)");
                    tokio::select! {
                        () = lease.stopped() => {
                            run.requeue(items);
                            return None;
                        }
                        () = tokio::time::sleep(backoff.next_delay()) => {}
                    }
                }
            }
        };
        let mut unsent = Vec::with_capacity(items.len());
        for (work, sent_by) in items.into_iter().zip(sent) {
            match sent_by {
                None => unsent.push(work),
                // An earlier lease of this plan had it confirmed and marked,
                // then died before reporting: it is sent.
                Some(plan) if plan == run.context.plan_id => {
                    let reason = "confirmed under an earlier lease of this plan (Redis replay key); not published again";
                    run.finish(&work, v1::AuditAction::Sent, reason).await;
                }
                // That replay came back as a re-dead-letter: not a duplicate.
                Some(plan) if work.item.came_back_from.contains(&plan) => unsent.push(work),
                Some(plan) => {
                    let reason =
                        format!("message key already replayed by plan {plan} (Redis replay keys)");
                    run.finish(&work, v1::AuditAction::SkippedDuplicate, &reason)
                        .await;
                }
            }
        }
        Some(unsent)
    }
}

/// Items past their deadline now are `skipped_stale`; the rest go on.
async fn drop_stale(run: &mut SliceRun, items: Vec<Work>) -> Vec<Work> {
    let now = chrono::Utc::now();
    let mut fresh = Vec::with_capacity(items.len());
    for work in items {
        let stale = work
            .item
            .stale_at
            .as_ref()
            .and_then(redrive_proto::time::from_timestamp)
            .is_some_and(|at| at <= now);
        if stale {
            let reason = "past its event type's deadline at send time";
            run.finish(&work, v1::AuditAction::SkippedStale, reason)
                .await;
        } else {
            fresh.push(work);
        }
    }
    fresh
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_take_about_a_twentieth_of_a_second_of_the_rate() {
        let rate = |per_second, burst| Rate::new(per_second, burst).unwrap();
        assert_eq!(run_size(rate(15.0, 5), 256), 1);
        assert_eq!(run_size(rate(0.5, 1), 256), 1);
        assert_eq!(run_size(rate(400.0, 40), 256), 20);
        assert_eq!(run_size(rate(200.0, 5), 256), 5);
        assert_eq!(run_size(rate(1e6, 1000), 256), 64);
        assert_eq!(run_size(rate(1e6, 1000), 8), 8);
    }

    fn work(id: u64, routing_key: &str, retry: bool) -> Work {
        Work {
            item: v1::SliceItem {
                item_id: id.to_string(),
                routing_key: routing_key.to_owned(),
                ..Default::default()
            },
            attempt: 1,
            not_before: retry.then(tokio::time::Instant::now),
        }
    }

    fn ids(works: &[Work]) -> Vec<&str> {
        works
            .iter()
            .map(|work| work.item.item_id.as_str())
            .collect()
    }

    #[tokio::test]
    async fn a_run_takes_one_destination_across_interleaved_items_and_keeps_the_rest_in_order() {
        // A fan-out's dead letters: destinations alternate, one is a retry.
        let mut queue: VecDeque<Work> = [
            work(2, "b", false),
            work(3, "a", false),
            work(4, "b", false),
            work(5, "a", true),
            work(6, "a", false),
            work(7, "a", false),
            work(8, "b", false),
        ]
        .into();
        let run = take_run(&mut queue, work(1, "a", false), 3);
        assert_eq!(
            ids(&run),
            ["1", "3", "6"],
            "at most the chunk, in order, no retry"
        );
        assert_eq!(ids(queue.make_contiguous()), ["2", "4", "5", "7", "8"]);
        let run = take_run(&mut queue.split_off(0), work(9, "c", false), 64);
        assert_eq!(ids(&run), ["9"], "nothing else for c");
    }

    #[tokio::test]
    async fn a_run_of_one_destination_is_taken_from_the_front() {
        let mut queue: VecDeque<Work> = (2..=6).map(|id| work(id, "a", false)).collect();
        let run = take_run(&mut queue, work(1, "a", false), 4);
        assert_eq!(ids(&run), ["1", "2", "3", "4"]);
        assert_eq!(ids(queue.make_contiguous()), ["5", "6"]);
        let run = take_run(&mut queue, work(0, "a", false), 1);
        assert_eq!(ids(&run), ["0"], "a chunk of one takes only the first");
        assert_eq!(ids(queue.make_contiguous()), ["5", "6"]);
    }
}
