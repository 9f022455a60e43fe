//! From publisher confirms to audit events (docs/design.md, "Executor loop and
//! guarantees"): the confirm collector of one slice awaits confirms in
//! publish order, marks sent keys in Redis (one pipeline per batch of
//! confirms that are already in), reports every outcome to the lease's
//! reporter, and tells the publishing loop what to publish again.
//!
//! | broker said | attempts left | audit event | then |
//! | --- | --- | --- | --- |
//! | ack, not returned | — | `sent` | done |
//! | `basic.return` (no route) | yes | — | publish again after backoff |
//! | `basic.return` | no | `unroutable` | done |
//! | `basic.nack` | yes | — | publish again after backoff |
//! | `basic.nack` | no | `failed` | done |
//! | no confirm (connection lost or timed out) | yes | `uncertain` | publish again, same message id |
//! | no confirm | no | `failed` (may have been published) | done |
//! | not written (connection lost first) | — | — | publish again, the same attempt, in its place |
//!
//! A confirm that came late (after [`LATE_CONFIRM`]) or never may have
//! reached the consumer at a time the token bucket did not foresee (held in
//! a stalled connection, then delivered when it healed): the collector adds
//! one token of debt per such message to its destination, and the publishing
//! loop charges the debt to the shared bucket ([`crate::bucket::Bucket::charge`])
//! before it publishes more there, so every executor publishing there waits
//! for it.

use std::{
    collections::{HashMap, VecDeque},
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use chrono::Utc;
use redrive_proto::{time::timestamp, v1};
use tokio::sync::mpsc;
use tracing::warn;

use crate::{
    item::LeasedItem,
    metrics::{ExecutorMetrics, PublishFailure},
    publisher::{Pending, PublishOutcome},
    replay_keys::ReplayKeys,
};

/// A confirm slower than this may have been delivered late: its token is
/// charged to the bucket again (see the module docs).
pub const LATE_CONFIRM: Duration = Duration::from_millis(250);
/// Sent items marked in Redis per pipeline.
const MARK_BATCH: usize = 256;

/// An item on its way: the slice item and the attempt about to be made.
#[derive(Debug, Clone)]
pub struct Work {
    /// The item as the planner leased it.
    pub item: LeasedItem,
    /// 1-based attempt number of the next publish.
    pub attempt: u32,
    /// Not before this instant (retry backoff).
    pub not_before: Option<tokio::time::Instant>,
}

impl Work {
    /// The item's position in its plan (the planner gives positions in
    /// slice order).
    pub fn position(&self) -> u64 {
        self.item.position
    }

    /// The item's message key.
    pub fn message_key(&self) -> &str {
        &self.item.dead_letter.message_key
    }

    /// The item's replay identity in Redis: its message key qualified by its
    /// dead letter's destination ([`crate::replay_keys::identity`]).
    pub fn replay_identity(&self) -> String {
        crate::replay_keys::identity(&self.item.dead_letter.destination, self.message_key())
    }

    /// The item's dead letter id.
    pub fn dead_letter_id(&self) -> &str {
        &self.item.dead_letter.id
    }

    /// The token-bucket key: where the message lands, so that all executors
    /// and plans publishing there share one budget, whatever route they take
    /// (docs/replay.md, "Rate"). See [`landing`]. (Qualified by the broker in
    /// Redis: [`crate::bucket::key_prefix_for`].)
    pub fn bucket_key(&self) -> String {
        landing(&self.item)
    }

    /// Whether `other` is published along the same route (exchange and
    /// routing key) and lands in the same place (the same
    /// [`bucket_key`](Self::bucket_key)): one run of the publishing loop.
    pub fn same_destination(&self, other: &Self) -> bool {
        self.item.exchange == other.item.exchange
            && self.item.routing_key == other.item.routing_key
            && (self.item.exchange.is_empty() || landing(&self.item) == landing(&other.item))
    }

    /// This work again, attempt + 1, after a backoff that doubles from
    /// 200 ms to 6.4 s with the attempt.
    fn retry(&self) -> Self {
        let backoff = Duration::from_millis(100 * 2_u64.pow(self.attempt.min(6)));
        Self {
            item: self.item.clone(),
            attempt: self.attempt + 1,
            not_before: Some(tokio::time::Instant::now() + backoff),
        }
    }
}

/// Where a slice item lands, as the token bucket keys it:
///
/// - `q:{queue}` when the queue is known: a publish through the default
///   exchange (queue mode, or a redirect with an empty exchange) lands in the
///   queue its routing key names; a publish to the exchange and first routing
///   key of the death the broker recorded (exchange mode) lands in the queue
///   that death happened in, the dead letter's destination;
/// - `x:{exchange length}:{exchange}/{routing key}` otherwise (a redirect
///   through a named exchange, a dead letter whose queue is unknown): the
///   bindings decide, so the route is the best name there is.
///
/// So queue mode via `/orders` and exchange mode via `orders-x/order.paid`
/// for dead letters that died in `orders` share one budget.
pub fn landing(item: &LeasedItem) -> String {
    if item.exchange.is_empty() {
        return format!("q:{}", item.routing_key);
    }
    match death_queue(item) {
        Some(queue) => format!("q:{queue}"),
        None => format!(
            "x:{}:{}/{}",
            item.exchange.len(),
            item.exchange,
            item.routing_key
        ),
    }
}

/// The queue `item` lands in when it is published along the route its dead
/// letter took to the queue it died in: a RabbitMQ-captured dead letter
/// (its queue known, not `exchange_only`) whose death names the item's
/// exchange and routing key.
fn death_queue(item: &LeasedItem) -> Option<&str> {
    let dead_letter = &item.dead_letter;
    let death = dead_letter.death.as_ref()?;
    let along_the_death = dead_letter.origin() == v1::Origin::Rabbitmq
        && !dead_letter.exchange_only
        && !dead_letter.destination.is_empty()
        && death.queue == dead_letter.destination
        && death.exchange == item.exchange
        && death.routing_keys.first().map_or("", String::as_str) == item.routing_key;
    along_the_death.then_some(dead_letter.destination.as_str())
}

/// A published item awaiting its confirm.
pub struct InFlight {
    /// What was published.
    pub work: Work,
    /// Its confirm.
    pub pending: Pending,
    /// Its publish span (none when no spans are exported), ended with the
    /// outcome.
    pub span: Option<opentelemetry::global::BoxedSpan>,
}

/// What the collector tells the publishing loop.
pub enum Feedback {
    /// Publish this again (nacked or returned with attempts left, or uncertain).
    Retry(Box<Work>),
    /// Publish this again in its place, before the later items still
    /// queued: it was never written to the broker
    /// ([`PublishOutcome::NotPublished`]).
    Unpublished(Box<Work>),
    /// This item reached a final outcome.
    Done,
}

/// The feedback channel of a slice of `items` items (room for
/// `items.max(1)` messages).
///
/// # Why it cannot deadlock
/// The collector sends, the publishing loop receives; and the loop does
/// wait on the collector: for room in the in-flight channel (bounded by the
/// confirm window) while it publishes, and for the collector's end when the
/// slice stops, before it reads the last feedback. A bound the collector
/// could reach would deadlock both (a window's worth of feedback and a
/// full in-flight channel, or a stopped slice with more feedback than
/// room). So the bound is the slice's item count, which the collector
/// cannot reach: every [`Feedback`] is about one item, an item gets one only
/// when its publish resolves, and a [`Feedback::Retry`]'s item is published
/// again only after the loop received it. So each item has at most one
/// unreceived feedback, and the collector's send never waits. The memory is
/// bounded by the slice, which the loop holds anyway (tokio allocates a
/// channel's buffer as it fills, not up front).
pub fn feedback_channel(items: usize) -> (mpsc::Sender<Feedback>, mpsc::Receiver<Feedback>) {
    mpsc::channel(items.max(1))
}

/// Tokens owed to the bucket, per bucket key (see the module docs).
#[derive(Clone, Default)]
pub struct TokenDebt(Arc<Mutex<HashMap<String, u32>>>);

impl TokenDebt {
    /// Adds `tokens` to `key`'s debt.
    pub fn add(&self, key: String, tokens: u32) {
        let mut debts = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let debt = debts.entry(key).or_default();
        *debt = debt.saturating_add(tokens);
    }

    /// Takes up to `most` tokens of `key`'s debt (they are now the caller's
    /// to pay).
    pub fn take(&self, key: &str, most: u32) -> u32 {
        let mut debts = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(debt) = debts.get_mut(key) else {
            return 0;
        };
        let taken = (*debt).min(most);
        *debt -= taken;
        if *debt == 0 {
            debts.remove(key);
        }
        taken
    }
}

/// What every audit event of a slice shares.
#[derive(Clone)]
pub struct EventContext {
    /// Plan id.
    pub plan_id: String,
    /// Slice id.
    pub slice_id: String,
    /// `v1::Wave` as its number.
    pub wave: i32,
    /// This executor (slice loop).
    pub executor_id: String,
    /// Where every event is counted by action.
    pub metrics: ExecutorMetrics,
}

impl EventContext {
    /// The audit event of `work`'s attempt ending in `action`.
    pub fn event(
        &self,
        work: &Work,
        action: v1::AuditAction,
        reason: &str,
        latency_us: u64,
    ) -> v1::AuditEvent {
        self.metrics.item(action);
        v1::AuditEvent {
            plan_id: self.plan_id.clone(),
            slice_id: self.slice_id.clone(),
            dead_letter_id: work.dead_letter_id().to_owned(),
            message_key: work.message_key().to_owned(),
            action: action.into(),
            reason: reason.to_owned(),
            wave: self.wave,
            executor_id: self.executor_id.clone(),
            attempt: work.attempt,
            confirm_latency_us: latency_us,
            at: Some(timestamp(Utc::now())),
            message_id: String::new(),
        }
    }
}

/// The collector's parts.
pub struct Collector {
    /// Where outcomes go (the lease's reporter).
    pub events: mpsc::Sender<v1::AuditEvent>,
    /// What to publish again, and what is done: at most one message per
    /// item of the slice is ever unreceived, so a channel with room for
    /// every item never makes the collector wait ([`feedback_channel`]).
    pub feedback: mpsc::Sender<Feedback>,
    /// The slice's event fields.
    pub context: EventContext,
    /// Redis replay keys, marked before a `sent` is reported.
    pub replay_keys: Option<ReplayKeys>,
    /// Attempts before an item is `failed` / `unroutable`.
    pub max_attempts: u32,
    /// Late and lost confirms, charged again to the bucket.
    pub debt: TokenDebt,
}

impl Collector {
    /// Awaits confirms in publish order until `in_flight` closes and is empty.
    /// Confirms that are already in when the oldest one resolves are handled
    /// with it, so sent keys are marked in Redis one pipeline per batch.
    pub async fn run(self, mut in_flight: mpsc::Receiver<InFlight>) {
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
            let mut resolved = Vec::new();
            if let Some(oldest) = waiting.pop_front() {
                resolved.push((oldest.work, oldest.pending.await, oldest.span));
            }
            while resolved.len() < MARK_BATCH {
                let Some(front) = waiting.front_mut() else {
                    break;
                };
                let Some(outcome) = (&mut front.pending).now_or_never() else {
                    break;
                };
                if let Some(done) = waiting.pop_front() {
                    resolved.push((done.work, outcome, done.span));
                }
            }
            let sent_keys: Vec<(String, String)> = resolved
                .iter()
                .filter(|(_, outcome, _)| outcome.is_sent())
                .map(|(work, _, _)| (work.replay_identity(), self.context.plan_id.clone()))
                .collect();
            if let Some(replay_keys) = &self.replay_keys
                && !sent_keys.is_empty()
                && let Err(error) = replay_keys.mark_sent(&sent_keys).await
            {
                // A failure here does not undo the send: the planner's record
                // still gets it from the report.
                warn!(%error, "could not mark replay keys in Redis");
            }
            for (work, outcome, span) in resolved {
                let error = match &outcome {
                    PublishOutcome::Sent { .. } => None,
                    PublishOutcome::Nacked => Some("nacked"),
                    PublishOutcome::Unroutable { .. } => Some("unroutable"),
                    PublishOutcome::Uncertain { .. } => Some("uncertain"),
                    PublishOutcome::NotPublished { .. } => Some("not published"),
                };
                // The publish span ends here, at its outcome.
                if let Some(span) = span {
                    crate::message::end_publish_span(span, error);
                }
                self.handle(work, outcome).await;
            }
        }
    }

    async fn handle(&self, work: Work, outcome: PublishOutcome) {
        let late = match &outcome {
            PublishOutcome::Sent { latency } => *latency > LATE_CONFIRM,
            PublishOutcome::Uncertain { .. } => true,
            _ => false,
        };
        match &outcome {
            PublishOutcome::Sent { latency } => self.context.metrics.published(*latency),
            PublishOutcome::Nacked => self.context.metrics.publish_failed(PublishFailure::Nacked),
            PublishOutcome::Unroutable { .. } => {
                self.context
                    .metrics
                    .publish_failed(PublishFailure::Unroutable);
            }
            PublishOutcome::Uncertain { .. } => {
                self.context
                    .metrics
                    .publish_failed(PublishFailure::Uncertain);
            }
            // Nothing reached the broker: not a publish that failed there.
            PublishOutcome::NotPublished { .. } => {}
        }
        if late {
            self.debt.add(work.bucket_key(), 1);
        }
        let last_attempt = work.attempt >= self.max_attempts;
        let (event, feedback) = match outcome {
            // The broker cannot have it: this attempt was never made, and
            // there is nothing to audit (as for a publish refused at once).
            PublishOutcome::NotPublished { reason } => {
                tracing::debug!(%reason, "not published: its frames were never written; publishing it again");
                (None, Feedback::Unpublished(Box::new(work)))
            }
            PublishOutcome::Sent { latency } => {
                let latency_us = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
                let event = self
                    .context
                    .event(&work, v1::AuditAction::Sent, "", latency_us);
                (Some(event), Feedback::Done)
            }
            // A binding may come back (a consumer restarting): retry.
            PublishOutcome::Unroutable { .. } | PublishOutcome::Nacked if !last_attempt => {
                (None, Feedback::Retry(Box::new(work.retry())))
            }
            PublishOutcome::Unroutable {
                reply_code,
                reply_text,
            } => {
                let reason = format!(
                    "returned by the broker: {reply_code} {reply_text} (no queue bound for {}/{})",
                    work.item.exchange, work.item.routing_key
                );
                let event = self
                    .context
                    .event(&work, v1::AuditAction::Unroutable, &reason, 0);
                (Some(event), Feedback::Done)
            }
            PublishOutcome::Nacked => {
                let reason = format!("nacked by the broker {} times", work.attempt);
                let event = self
                    .context
                    .event(&work, v1::AuditAction::Failed, &reason, 0);
                (Some(event), Feedback::Done)
            }
            // A channel the broker keeps closing (a destination exchange that
            // does not exist: 404 NOT_FOUND) must not be retried for ever.
            PublishOutcome::Uncertain { reason } if last_attempt => {
                // It may have been published: the audit says so first (the
                // key is then possibly delivered, never replayable), then
                // that no attempt is left.
                let uncertain = self.context.event(
                    &work,
                    v1::AuditAction::Uncertain,
                    &format!("no publisher confirm: {reason}"),
                    0,
                );
                let _ = self.events.send(uncertain).await;
                let reason = format!(
                    "no publisher confirm after {} attempts, the last: {reason} (it may have been published; the audit shows each attempt as uncertain)",
                    work.attempt
                );
                let event = self
                    .context
                    .event(&work, v1::AuditAction::Failed, &reason, 0);
                (Some(event), Feedback::Done)
            }
            PublishOutcome::Uncertain { reason } => {
                let reason = format!(
                    "no publisher confirm: {reason}; publishing again with the same message id"
                );
                let event = self
                    .context
                    .event(&work, v1::AuditAction::Uncertain, &reason, 0);
                (Some(event), Feedback::Retry(Box::new(work.retry())))
            }
        };
        if let Some(event) = event {
            let _ = self.events.send(event).await;
        }
        let _ = self.feedback.send(feedback).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::publisher::Pending;

    fn context() -> EventContext {
        EventContext {
            plan_id: "plan".to_owned(),
            slice_id: "slice".to_owned(),
            wave: 0,
            executor_id: "executor".to_owned(),
            metrics: ExecutorMetrics::new(&opentelemetry::global::meter("test")),
        }
    }

    fn work(id: usize) -> Work {
        Work {
            item: LeasedItem {
                position: id as u64,
                routing_key: "q".to_owned(),
                ..Default::default()
            },
            attempt: 1,
            not_before: None,
        }
    }

    /// Runs a collector over `items` resolved publishes (every other one
    /// nacked, so a retry) with a feedback channel of `room`, sent through
    /// an in-flight channel smaller than the slice while nobody reads the
    /// feedback: what the publishing loop does at the end of a slice
    /// (it awaits the collector, then reads the feedback). Whether the
    /// collector ended, and the feedback it left.
    async fn collect_unread(items: usize, room: usize) -> (bool, Vec<Feedback>) {
        let (events, mut events_received) = mpsc::channel(items * 2);
        let (feedback, mut feedback_received) = if room == items {
            feedback_channel(items)
        } else {
            mpsc::channel(room)
        };
        let collector = Collector {
            events,
            feedback,
            context: context(),
            replay_keys: None,
            max_attempts: 5,
            debt: TokenDebt::default(),
        };
        let (in_flight, in_flight_received) = mpsc::channel(8);
        let collecting = tokio::spawn(collector.run(in_flight_received));
        let sending = async {
            for id in 0..items {
                let outcome = if id % 2 == 0 {
                    PublishOutcome::Sent {
                        latency: Duration::ZERO,
                    }
                } else {
                    PublishOutcome::Nacked
                };
                let pending = Pending::ready(outcome);
                let flight = InFlight {
                    work: work(id),
                    pending,
                    span: None,
                };
                if in_flight.send(flight).await.is_err() {
                    return;
                }
            }
            drop(in_flight);
        };
        let ended = tokio::time::timeout(Duration::from_secs(30), async {
            sending.await;
            collecting.await.is_ok()
        })
        .await
        .unwrap_or(false);
        let mut unread = Vec::new();
        while let Ok(message) = feedback_received.try_recv() {
            unread.push(message);
        }
        while events_received.try_recv().is_ok() {}
        (ended, unread)
    }

    /// The bound of [`feedback_channel`]: with room for every item, the
    /// collector handles a whole slice (more than a window and a mark
    /// batch) while nobody reads its feedback.
    #[tokio::test(start_paused = true)]
    async fn the_collector_never_waits_for_feedback_to_be_read() {
        let items = 2 * MARK_BATCH + 3;
        let (ended, unread) = collect_unread(items, items).await;
        assert!(ended, "the collector ended with its feedback unread");
        assert_eq!(unread.len(), items, "one feedback per item");
        let retries = unread
            .iter()
            .filter(|message| matches!(message, Feedback::Retry(_)))
            .count();
        assert_eq!(retries, items / 2, "every nacked item is retried");
    }

    /// Why the bound is not the confirm window: a feedback channel smaller
    /// than the slice fills while the loop waits for the collector, and
    /// both wait for ever.
    #[tokio::test(start_paused = true)]
    async fn a_feedback_channel_smaller_than_the_slice_would_deadlock() {
        let (ended, unread) = collect_unread(64, 8).await;
        assert!(!ended, "the collector waits for feedback to be read");
        assert_eq!(unread.len(), 8);
    }
}
