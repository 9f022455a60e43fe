//! The executor loop (DESIGN.md, "Executor loop and guarantees"): claim a slice
//! (long poll), heartbeat the lease at a third of its TTL, and for each item:
//! replay-key check → token from the shared bucket → publish with
//! `mandatory = true`, persistent → await the publisher confirm, with many
//! publishes in flight. Outcomes stream back to the planner with the fencing
//! token.
//!
//! Per slice, a publishing loop hands each publish's pending confirm to a
//! confirm collector in publish order; the collector turns outcomes into audit
//! events, retries nacks with backoff up to a limit, and sends items whose
//! confirm was lost with the connection back to be published again (same
//! message id) after reconnecting. A sent key is marked in Redis before the
//! `sent` report. On SIGTERM, a pause or cancel (heard through the heartbeat)
//! or a lost lease, the loop stops at an item boundary, lets outstanding
//! confirms finish, reports, and releases the slice.

use std::{
    collections::VecDeque,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use chrono::Utc;
use redrive_proto::{
    time::{from_duration, timestamp},
    v1::{self, coordinator_client::CoordinatorClient},
};
use tokio::sync::mpsc;
use tokio_util::{sync::CancellationToken, task::AbortOnDropHandle};
use tonic::{Code, transport::Channel};
use tracing::{info, warn};

use crate::{
    bucket::{Bucket, BucketError, Rate},
    message,
    publisher::{Outgoing, Pending, PublishOutcome, Publisher},
    replay_keys::ReplayKeys,
};

/// Outcome events buffered before a report is sent.
const REPORT_BATCH: usize = 256;
/// Longest a buffered outcome waits before it is reported.
const REPORT_INTERVAL: Duration = Duration::from_millis(100);
/// Most tokens taken from the bucket in one call.
const TOKEN_CHUNK: u32 = 32;

/// What the loop needs.
#[derive(Clone)]
pub struct WorkerSettings {
    /// This executor's id in leases and audit events.
    pub executor_id: String,
    /// AMQP URL of the broker.
    pub amqp_url: String,
    /// Publishes in flight at once.
    pub window: usize,
    /// Attempts before a nacked item is `failed`.
    pub max_attempts: u32,
    /// Long-poll wait of a claim.
    pub claim_wait: Duration,
}

/// An item on its way: the slice item and the attempt about to be made.
#[derive(Debug, Clone)]
struct Work {
    item: v1::SliceItem,
    attempt: u32,
    /// Not before this instant (nack backoff).
    not_before: Option<tokio::time::Instant>,
}

/// A published item awaiting its confirm.
struct InFlight {
    work: Work,
    pending: Pending,
}

/// What the collector tells the publishing loop.
enum Feedback {
    /// Publish this again (nacked with attempts left, or uncertain).
    Retry(Box<Work>),
    /// This item reached a final outcome.
    Done,
}

/// The running executor: claims slices until `shutdown`.
pub struct Worker {
    settings: WorkerSettings,
    coordinator: CoordinatorClient<Channel>,
    bucket: Arc<Bucket>,
    replay_keys: Option<ReplayKeys>,
    publisher: Option<Publisher>,
}

impl Worker {
    /// A worker over its parts.
    pub fn new(
        settings: WorkerSettings,
        coordinator: CoordinatorClient<Channel>,
        bucket: Arc<Bucket>,
        replay_keys: Option<ReplayKeys>,
    ) -> Self {
        Self {
            settings,
            coordinator,
            bucket,
            replay_keys,
            publisher: None,
        }
    }

    /// Claims and replays slices until `shutdown`.
    pub async fn run(mut self, shutdown: CancellationToken) {
        let mut backoff = Duration::from_millis(200);
        while !shutdown.is_cancelled() {
            // No claim without a broker to publish to: a slice would only be held.
            if self.publisher(&shutdown, None).await.is_none() {
                break;
            }
            let claim = self.coordinator.claim_slice(v1::ClaimSliceRequest {
                executor_id: self.settings.executor_id.clone(),
                wait: Some(redrive_proto::time::duration(self.settings.claim_wait)),
            });
            let answer = tokio::select! {
                () = shutdown.cancelled() => break,
                answer = claim => answer,
            };
            match answer {
                Ok(answer) => {
                    backoff = Duration::from_millis(200);
                    if let Some(slice) = answer.into_inner().slice {
                        self.replay_slice(slice, &shutdown).await;
                    }
                }
                Err(status) => {
                    warn!(code = ?status.code(), message = status.message(), retry_in_ms = backoff.as_millis() as u64, "claim failed");
                    tokio::select! {
                        () = shutdown.cancelled() => break,
                        () = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
            }
        }
        if let Some(publisher) = self.publisher.take() {
            let _ = publisher.close().await;
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
        let mut backoff = Duration::from_millis(200);
        while self.publisher.is_none() {
            match Publisher::connect(&self.settings.amqp_url, self.settings.window).await {
                Ok(publisher) => self.publisher = Some(publisher),
                Err(error) => {
                    warn!(%error, retry_in_ms = backoff.as_millis() as u64, "cannot connect to the broker");
                    if give_up_after.is_some_and(|limit| started.elapsed() >= limit) {
                        return None;
                    }
                    tokio::select! {
                        () = stop.cancelled() => return None,
                        () = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
            }
        }
        self.publisher.as_ref()
    }

    #[tracing::instrument(skip_all, name = "executor.slice", fields(slice.id = %slice.slice_id, plan.id = %slice.plan_id))]
    async fn replay_slice(&mut self, slice: v1::Slice, shutdown: &CancellationToken) {
        let token = slice.fencing_token;
        let lease_ttl = slice
            .lease_ttl
            .as_ref()
            .and_then(from_duration)
            .unwrap_or(Duration::from_secs(30));
        let rate = slice.rate.clone().unwrap_or_default();
        let Ok(rate) = Rate::new(rate.per_second, rate.burst) else {
            warn!("slice carries an invalid rate; releasing it in 5 s");
            tokio::select! {
                () = shutdown.cancelled() => {}
                () = tokio::time::sleep(Duration::from_secs(5)) => {}
            }
            let _ = self.complete(&slice.slice_id, token, true).await;
            return;
        };
        info!(
            items = slice.items.len(),
            fencing_token = token,
            "replaying slice"
        );
        // Stops publishing: shutdown, pause/cancel, or a lost lease.
        let stop = shutdown.child_token();
        let lease_lost = CancellationToken::new();
        // Tasks of this slice die with it (a crashed worker stops heartbeating).
        let heartbeat = AbortOnDropHandle::new(tokio::spawn(heartbeat(
            self.coordinator.clone(),
            slice.slice_id.clone(),
            token,
            lease_ttl,
            stop.clone(),
            lease_lost.clone(),
        )));
        let (events, reporting) = reporter(
            self.coordinator.clone(),
            slice.slice_id.clone(),
            token,
            lease_lost.clone(),
            stop.clone(),
        );
        let context = EventContext {
            plan_id: slice.plan_id.clone(),
            slice_id: slice.slice_id.clone(),
            wave: slice.wave,
            executor_id: self.settings.executor_id.clone(),
        };

        let mut queue: VecDeque<Work> = VecDeque::new();
        let mut finals = 0_usize;
        let total = slice.items.len();
        // The planner's record of sent keys here; Redis's just before each
        // publish (below), to keep the window for concurrent plans small.
        let mut candidates = Vec::new();
        for item in slice.items {
            let attempt = item.attempts + 1;
            if item.key_replayed {
                let _ = events
                    .send(context.event(
                        &item,
                        v1::AuditAction::SkippedDuplicate,
                        "message key already replayed (planner record)",
                        attempt,
                        0,
                    ))
                    .await;
                finals += 1;
            } else {
                candidates.push(Work {
                    item,
                    attempt,
                    not_before: None,
                });
            }
        }
        queue.extend(candidates);

        let outstanding = Arc::new(AtomicUsize::new(total - finals));
        let (in_flight_sender, in_flight) = mpsc::channel::<InFlight>(self.settings.window.max(1));
        let (feedback_sender, mut feedback) = mpsc::unbounded_channel::<Feedback>();
        let collector = AbortOnDropHandle::new(tokio::spawn(collect(
            in_flight,
            feedback_sender,
            events.clone(),
            context.clone(),
            self.replay_keys.clone(),
            self.settings.max_attempts,
        )));

        // The publishing loop.
        'publishing: while !stop.is_cancelled() && outstanding.load(Ordering::SeqCst) > 0 {
            while let Ok(message) = feedback.try_recv() {
                match message {
                    Feedback::Retry(work) => queue.push_back(*work),
                    Feedback::Done => {
                        outstanding.fetch_sub(1, Ordering::SeqCst);
                    }
                }
            }
            if outstanding.load(Ordering::SeqCst) == 0 {
                break;
            }
            let Some(work) = queue.pop_front() else {
                // Everything is published; wait for confirms or retries.
                tokio::select! {
                    () = stop.cancelled() => break 'publishing,
                    message = feedback.recv() => match message {
                        Some(Feedback::Retry(work)) => queue.push_back(*work),
                        Some(Feedback::Done) => { outstanding.fetch_sub(1, Ordering::SeqCst); }
                        None => break 'publishing,
                    },
                }
                continue;
            };
            if let Some(not_before) = work.not_before {
                tokio::select! {
                    () = stop.cancelled() => { queue.push_front(work); break 'publishing; }
                    () = tokio::time::sleep_until(not_before) => {}
                }
            }
            // Tokens for a run of items bound for the same destination.
            let key = bucket_key(&work.item);
            let mut run = vec![work];
            while run.len() < TOKEN_CHUNK.min(rate.burst) as usize
                && queue
                    .front()
                    .is_some_and(|next| next.not_before.is_none() && bucket_key(&next.item) == key)
            {
                run.push(queue.pop_front().expect("front exists"));
            }
            loop {
                match self.bucket.acquire(&key, rate, run.len() as u32).await {
                    Ok(()) => break,
                    Err(BucketError::Unavailable { reason }) => {
                        warn!(%reason, "token bucket unreachable: not publishing (fail closed)");
                        tokio::select! {
                            () = stop.cancelled() => {
                                requeue(&mut queue, run);
                                break 'publishing;
                            }
                            () = tokio::time::sleep(Duration::from_millis(500)) => {}
                        }
                    }
                    Err(error) => {
                        warn!(%error, "token bucket refused the request; releasing the slice");
                        requeue(&mut queue, run);
                        break 'publishing;
                    }
                }
            }
            // The replay keys are read after the token wait, just before
            // publishing, to keep the window for a concurrent plan small.
            if let Some(replay_keys) = &self.replay_keys {
                let keys: Vec<String> = run.iter().map(|work| message_key(&work.item)).collect();
                let sent = loop {
                    match replay_keys.sent_by(&keys).await {
                        Ok(sent) => break sent,
                        Err(error) => {
                            warn!(%error, "replay keys unreachable: not publishing until Redis is back (fail closed)");
                            tokio::select! {
                                () = stop.cancelled() => {
                                    requeue(&mut queue, run);
                                    break 'publishing;
                                }
                                () = tokio::time::sleep(Duration::from_millis(500)) => {}
                            }
                        }
                    }
                };
                let mut unsent = Vec::with_capacity(run.len());
                for (work, sent_by) in run.into_iter().zip(sent) {
                    match sent_by {
                        None => unsent.push(work),
                        // An earlier lease of this plan had it confirmed and
                        // marked, then died before reporting: it is sent.
                        Some(plan) if plan == context.plan_id => {
                            let reason = "confirmed under an earlier lease of this plan (Redis replay key); not published again";
                            finish(
                                &events,
                                &context,
                                &outstanding,
                                &work,
                                v1::AuditAction::Sent,
                                reason,
                            )
                            .await;
                        }
                        // That replay came back as a re-dead-letter: not a duplicate.
                        Some(plan) if work.item.came_back_from.contains(&plan) => {
                            unsent.push(work);
                        }
                        Some(plan) => {
                            let reason = format!(
                                "message key already replayed by plan {plan} (Redis replay keys)"
                            );
                            finish(
                                &events,
                                &context,
                                &outstanding,
                                &work,
                                v1::AuditAction::SkippedDuplicate,
                                &reason,
                            )
                            .await;
                        }
                    }
                }
                run = unsent;
                if run.is_empty() {
                    continue 'publishing;
                }
            }
            // Stale at send time, then the owning service's state now.
            let now = chrono::Utc::now();
            let mut fresh = Vec::with_capacity(run.len());
            for work in run {
                let stale = work
                    .item
                    .stale_at
                    .as_ref()
                    .and_then(redrive_proto::time::from_timestamp)
                    .is_some_and(|at| at <= now);
                if stale {
                    let reason = "past its event type's deadline at send time";
                    finish(
                        &events,
                        &context,
                        &outstanding,
                        &work,
                        v1::AuditAction::SkippedStale,
                        reason,
                    )
                    .await;
                } else {
                    fresh.push(work);
                }
            }
            let to_check: Vec<String> = fresh
                .iter()
                .filter(|work| work.item.state_check)
                .filter_map(|work| work.item.dead_letter.as_ref().map(|d| d.id.clone()))
                .collect();
            let mut run = fresh;
            if !to_check.is_empty() {
                let decisions = loop {
                    let mut coordinator = self.coordinator.clone();
                    let request = v1::RecheckStateRequest {
                        plan_id: context.plan_id.clone(),
                        dead_letter_ids: to_check.clone(),
                    };
                    match coordinator.recheck_state(request).await {
                        Ok(answer) => break answer.into_inner().decisions,
                        Err(status) => {
                            warn!(code = ?status.code(), message = status.message(), "state re-check failed: not publishing these items until it answers");
                            tokio::select! {
                                () = stop.cancelled() => {
                                    requeue(&mut queue, run);
                                    break 'publishing;
                                }
                                () = tokio::time::sleep(Duration::from_secs(1)) => {}
                            }
                        }
                    }
                };
                let decisions: std::collections::HashMap<String, v1::StateDecision> = decisions
                    .into_iter()
                    .map(|decision| (decision.dead_letter_id.clone(), decision))
                    .collect();
                let mut allowed = Vec::with_capacity(run.len());
                for work in run {
                    let id = work
                        .item
                        .dead_letter
                        .as_ref()
                        .map(|d| d.id.clone())
                        .unwrap_or_default();
                    let action = decisions
                        .get(&id)
                        .map(|decision| (decision.verdict(), decision.reason.clone()));
                    match action {
                        Some((v1::StateCheckVerdict::Block, reason)) => {
                            finish(
                                &events,
                                &context,
                                &outstanding,
                                &work,
                                v1::AuditAction::SkippedState,
                                &reason,
                            )
                            .await;
                        }
                        Some((v1::StateCheckVerdict::NeedsCompensation, reason)) => {
                            finish(
                                &events,
                                &context,
                                &outstanding,
                                &work,
                                v1::AuditAction::NeedsCompensation,
                                &reason,
                            )
                            .await;
                        }
                        _ => allowed.push(work),
                    }
                }
                run = allowed;
            }
            let mut run = VecDeque::from(run);
            while let Some(work) = run.pop_front() {
                if stop.is_cancelled() {
                    run.push_front(work);
                    requeue(&mut queue, run);
                    break 'publishing;
                }
                let properties =
                    match message::properties(&context.plan_id, &work.item, work.attempt) {
                        Ok(properties) => properties,
                        Err(reason) => {
                            finish(
                                &events,
                                &context,
                                &outstanding,
                                &work,
                                v1::AuditAction::Failed,
                                &reason,
                            )
                            .await;
                            continue;
                        }
                    };
                let outgoing = Outgoing {
                    exchange: work.item.exchange.clone(),
                    routing_key: work.item.routing_key.clone(),
                    body: work.item.body.clone(),
                    properties,
                };
                // Broker gone for long: give the slice back rather than hold it.
                let Some(publisher) = self.publisher(&stop, Some(lease_ttl / 2)).await else {
                    run.push_front(work);
                    requeue(&mut queue, run);
                    break 'publishing;
                };
                match publisher.publish(outgoing).await {
                    Ok(pending) => {
                        if in_flight_sender
                            .send(InFlight { work, pending })
                            .await
                            .is_err()
                        {
                            break 'publishing;
                        }
                    }
                    Err(error) => {
                        // Not published: publish it again on a new connection.
                        warn!(%error, "publish failed; reconnecting");
                        self.publisher = None;
                        run.push_front(work);
                    }
                }
            }
        }

        // Let outstanding confirms finish, then report and end the lease.
        tracing::debug!(
            outstanding = outstanding.load(Ordering::SeqCst),
            queued = queue.len(),
            "publishing stopped"
        );
        drop(in_flight_sender);
        let _ = collector.await;
        tracing::debug!("confirms collected");
        while let Ok(message) = feedback.try_recv() {
            if let Feedback::Done = message {
                outstanding.fetch_sub(1, Ordering::SeqCst);
            }
        }
        drop(events);
        let _ = reporting.await;
        tracing::debug!("outcomes reported");
        heartbeat.abort();
        let unfinished = outstanding.load(Ordering::SeqCst);
        if lease_lost.is_cancelled() {
            warn!(
                "lease lost or given up (the planner refused it, or it could not be renewed in time): publishing stopped; the slice goes to whichever executor claims it next"
            );
            return;
        }
        let release = unfinished > 0;
        match self.complete(&slice.slice_id, token, release).await {
            Ok(()) if release => info!(unfinished, "slice released"),
            Ok(()) => info!("slice completed"),
            Err(status) => {
                warn!(code = ?status.code(), message = status.message(), "completing the slice failed")
            }
        }
    }

    async fn complete(
        &mut self,
        slice_id: &str,
        token: u64,
        release: bool,
    ) -> Result<(), tonic::Status> {
        self.coordinator
            .complete_slice(v1::CompleteSliceRequest {
                slice_id: slice_id.to_owned(),
                fencing_token: token,
                release,
            })
            .await
            .map(|_| ())
    }
}

fn message_key(item: &v1::SliceItem) -> String {
    item.dead_letter
        .as_ref()
        .map(|d| d.message_key.clone())
        .unwrap_or_default()
}

/// The token-bucket key of an item: its destination, so that all executors and
/// plans publishing there share one budget.
pub fn bucket_key(item: &v1::SliceItem) -> String {
    format!("{}/{}", item.exchange, item.routing_key)
}

/// What every audit event of a slice shares.
#[derive(Clone)]
struct EventContext {
    plan_id: String,
    slice_id: String,
    wave: i32,
    executor_id: String,
}

impl EventContext {
    fn event(
        &self,
        item: &v1::SliceItem,
        action: v1::AuditAction,
        reason: &str,
        attempt: u32,
        latency_us: u64,
    ) -> v1::AuditEvent {
        v1::AuditEvent {
            plan_id: self.plan_id.clone(),
            slice_id: self.slice_id.clone(),
            dead_letter_id: item
                .dead_letter
                .as_ref()
                .map(|d| d.id.clone())
                .unwrap_or_default(),
            message_key: message_key(item),
            action: action.into(),
            reason: reason.to_owned(),
            wave: self.wave,
            executor_id: self.executor_id.clone(),
            attempt,
            confirm_latency_us: latency_us,
            at: Some(timestamp(Utc::now())),
        }
    }
}

/// Sent items marked in Redis per pipeline.
const MARK_BATCH: usize = 256;

/// Awaits confirms in publish order and turns them into events and feedback.
/// Confirms that are already in when the oldest one resolves are handled with
/// it, so sent keys are marked in Redis one pipeline per batch, not per item.
async fn collect(
    mut in_flight: mpsc::Receiver<InFlight>,
    feedback: mpsc::UnboundedSender<Feedback>,
    events: mpsc::Sender<v1::AuditEvent>,
    context: EventContext,
    replay_keys: Option<ReplayKeys>,
    max_attempts: u32,
) {
    use futures::FutureExt;
    let mut waiting: VecDeque<InFlight> = VecDeque::new();
    loop {
        if waiting.is_empty() {
            match in_flight.recv().await {
                Some(next) => waiting.push_back(next),
                None => return,
            }
        }
        while let Ok(next) = in_flight.try_recv() {
            waiting.push_back(next);
        }
        // The oldest confirm, then every later one that is already in.
        let mut resolved = Vec::new();
        let oldest = waiting.pop_front().expect("not empty");
        resolved.push((oldest.work, oldest.pending.await));
        while resolved.len() < MARK_BATCH {
            let Some(front) = waiting.front_mut() else {
                break;
            };
            let Some(outcome) = (&mut front.pending).now_or_never() else {
                break;
            };
            let done = waiting.pop_front().expect("front exists");
            resolved.push((done.work, outcome));
        }
        let sent_keys: Vec<(String, String)> = resolved
            .iter()
            .filter(|(_, outcome)| outcome.is_sent())
            .map(|(work, _)| (message_key(&work.item), context.plan_id.clone()))
            .collect();
        if let Some(replay_keys) = &replay_keys
            && !sent_keys.is_empty()
            && let Err(error) = replay_keys.mark_sent(&sent_keys).await
        {
            // Marked before the report; a failure here does not undo the send
            // (the planner's record still gets it).
            warn!(%error, "could not mark replay keys in Redis");
        }
        for (work, outcome) in resolved {
            handle_outcome(work, outcome, &feedback, &events, &context, max_attempts).await;
        }
    }
}

async fn handle_outcome(
    work: Work,
    outcome: PublishOutcome,
    feedback: &mpsc::UnboundedSender<Feedback>,
    events: &mpsc::Sender<v1::AuditEvent>,
    context: &EventContext,
    max_attempts: u32,
) {
    let item = &work.item;
    match outcome {
        PublishOutcome::Sent { latency } => {
            let latency_us = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
            let _ = events
                .send(context.event(item, v1::AuditAction::Sent, "", work.attempt, latency_us))
                .await;
            let _ = feedback.send(Feedback::Done);
        }
        PublishOutcome::Unroutable { .. } if work.attempt < max_attempts => {
            // A binding may come back (a consumer restarting): retry with backoff.
            let backoff = Duration::from_millis(100 * 2_u64.pow(work.attempt.min(6)));
            let retry = Work {
                attempt: work.attempt + 1,
                not_before: Some(tokio::time::Instant::now() + backoff),
                item: work.item.clone(),
            };
            let _ = feedback.send(Feedback::Retry(Box::new(retry)));
        }
        PublishOutcome::Unroutable {
            reply_code,
            reply_text,
        } => {
            let reason = format!(
                "returned by the broker: {reply_code} {reply_text} (no queue bound for {}/{})",
                item.exchange, item.routing_key
            );
            let _ = events
                .send(context.event(item, v1::AuditAction::Unroutable, &reason, work.attempt, 0))
                .await;
            let _ = feedback.send(Feedback::Done);
        }
        PublishOutcome::Nacked if work.attempt >= max_attempts => {
            let reason = format!("nacked by the broker {} times", work.attempt);
            let _ = events
                .send(context.event(item, v1::AuditAction::Failed, &reason, work.attempt, 0))
                .await;
            let _ = feedback.send(Feedback::Done);
        }
        PublishOutcome::Nacked => {
            let backoff = Duration::from_millis(100 * 2_u64.pow(work.attempt.min(6)));
            let retry = Work {
                attempt: work.attempt + 1,
                not_before: Some(tokio::time::Instant::now() + backoff),
                item: work.item.clone(),
            };
            let _ = feedback.send(Feedback::Retry(Box::new(retry)));
        }
        PublishOutcome::Uncertain { reason } if work.attempt >= max_attempts => {
            // A channel the broker keeps closing (a destination exchange that
            // does not exist: 404 NOT_FOUND) must not be retried for ever.
            let reason = format!(
                "no publisher confirm after {} attempts, the last: {reason} (it may have been published; the audit shows each attempt as uncertain)",
                work.attempt
            );
            let _ = events
                .send(context.event(item, v1::AuditAction::Failed, &reason, work.attempt, 0))
                .await;
            let _ = feedback.send(Feedback::Done);
        }
        PublishOutcome::Uncertain { reason } => {
            let reason = format!(
                "no publisher confirm: {reason}; publishing again with the same message id"
            );
            let _ = events
                .send(context.event(item, v1::AuditAction::Uncertain, &reason, work.attempt, 0))
                .await;
            let backoff = Duration::from_millis(100 * 2_u64.pow(work.attempt.min(6)));
            let retry = Work {
                attempt: work.attempt + 1,
                not_before: Some(tokio::time::Instant::now() + backoff),
                item: work.item.clone(),
            };
            let _ = feedback.send(Feedback::Retry(Box::new(retry)));
        }
    }
}

/// Streams buffered events to `ReportOutcomes` with the fencing token; a
/// refused report (stale token) cancels `lease_lost`.
fn reporter(
    mut coordinator: CoordinatorClient<Channel>,
    slice_id: String,
    token: u64,
    lease_lost: CancellationToken,
    stop: CancellationToken,
) -> (mpsc::Sender<v1::AuditEvent>, AbortOnDropHandle<()>) {
    let (sender, mut receiver) = mpsc::channel::<v1::AuditEvent>(REPORT_BATCH * 4);
    let task = AbortOnDropHandle::new(tokio::spawn(async move {
        let mut buffer = Vec::with_capacity(REPORT_BATCH);
        let mut open = true;
        while open || !buffer.is_empty() {
            if open {
                let deadline = tokio::time::sleep(REPORT_INTERVAL);
                tokio::pin!(deadline);
                loop {
                    tokio::select! {
                        () = &mut deadline => break,
                        event = receiver.recv() => match event {
                            Some(event) => {
                                buffer.push(event);
                                if buffer.len() >= REPORT_BATCH { break; }
                            }
                            None => { open = false; break; }
                        },
                    }
                }
            }
            if buffer.is_empty() {
                continue;
            }
            let request = v1::ReportOutcomesRequest {
                slice_id: slice_id.clone(),
                fencing_token: token,
                events: std::mem::take(&mut buffer),
            };
            let mut attempt = 0;
            loop {
                attempt += 1;
                let answer = async {
                    let mut responses = coordinator
                        .report_outcomes(tokio_stream::iter(vec![request.clone()]))
                        .await?
                        .into_inner();
                    responses.message().await
                }
                .await;
                match answer {
                    Ok(_) => break,
                    Err(status) if status.code() == Code::FailedPrecondition => {
                        warn!(message = status.message(), "outcome report refused");
                        lease_lost.cancel();
                        stop.cancel();
                        return;
                    }
                    Err(status) if attempt < 20 => {
                        warn!(code = ?status.code(), message = status.message(), "outcome report failed; retrying");
                        tokio::time::sleep(Duration::from_millis(250 * attempt.min(8))).await;
                    }
                    Err(status) => {
                        warn!(code = ?status.code(), message = status.message(), "giving up on an outcome report; the next lease resumes from the planner's item states");
                        lease_lost.cancel();
                        stop.cancel();
                        return;
                    }
                }
            }
        }
    }));
    (sender, task)
}

/// Renews the lease at a third of its TTL; stops publishing on pause or
/// cancel, and gives the lease up (stop, lease lost) on a stale token or when
/// no renewal has succeeded for two thirds of the TTL: past that the planner
/// may already have leased the slice to another executor, so publishing on
/// would make duplicates the audit never sees.
async fn heartbeat(
    mut coordinator: CoordinatorClient<Channel>,
    slice_id: String,
    token: u64,
    lease_ttl: Duration,
    stop: CancellationToken,
    lease_lost: CancellationToken,
) {
    let interval = (lease_ttl / 3).max(Duration::from_millis(100));
    let mut renewed_at = Instant::now();
    let mut ticker = tokio::time::interval(interval);
    ticker.tick().await;
    loop {
        ticker.tick().await;
        let started = Instant::now();
        let request = coordinator.heartbeat(v1::HeartbeatRequest {
            slice_id: slice_id.clone(),
            fencing_token: token,
        });
        let answer = match tokio::time::timeout(interval, request).await {
            Ok(answer) => answer,
            Err(_) => Err(tonic::Status::deadline_exceeded(
                "heartbeat took longer than its interval",
            )),
        };
        match answer {
            Ok(answer) => {
                renewed_at = started;
                let answer = answer.into_inner();
                if !answer.keep_publishing {
                    info!(reason = %answer.reason, "told to stop publishing");
                    stop.cancel();
                }
            }
            Err(status) if status.code() == Code::FailedPrecondition => {
                warn!(message = status.message(), "lease lost");
                lease_lost.cancel();
                stop.cancel();
                return;
            }
            Err(status) => {
                warn!(code = ?status.code(), message = status.message(), elapsed_ms = started.elapsed().as_millis() as u64, "heartbeat failed");
                if renewed_at.elapsed() >= lease_ttl * 2 / 3 {
                    warn!("no lease renewal for two thirds of its TTL: giving the slice up");
                    lease_lost.cancel();
                    stop.cancel();
                    return;
                }
            }
        }
    }
}

/// Puts a run of items back at the front of the queue, in order.
fn requeue(
    queue: &mut VecDeque<Work>,
    run: impl IntoIterator<Item = Work, IntoIter: DoubleEndedIterator>,
) {
    for work in run.into_iter().rev() {
        queue.push_front(work);
    }
}

/// Reports a final outcome decided without publishing, and counts the item done.
async fn finish(
    events: &mpsc::Sender<v1::AuditEvent>,
    context: &EventContext,
    outstanding: &AtomicUsize,
    work: &Work,
    action: v1::AuditAction,
    reason: &str,
) {
    let _ = events
        .send(context.event(&work.item, action, reason, work.attempt, 0))
        .await;
    outstanding.fetch_sub(1, Ordering::SeqCst);
}
