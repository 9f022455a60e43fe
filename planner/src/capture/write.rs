//! The writer of a capture session: [`BatchWriter`] stores the batches the
//! session cuts, two side by side under ids taken in queue order, and acks
//! each after its commit and the one before it; its [`AckRecorder`] records
//! the acks once the broker has processed them; [`store_batch`] degrades a
//! batch PostgreSQL refuses for its content to one dead letter at a time.

use std::{collections::VecDeque, time::Duration};

use lapin::{
    message::Delivery,
    options::{BasicAckOptions, BasicQosOptions},
};
use redrive_proto::backoff::Backoff;
use tokio::{sync::mpsc, task::JoinHandle};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, info, info_span, warn};

use crate::{
    dead_letters::NewDeadLetter,
    metrics::CaptureFailure,
    store::{
        Store, StoreError,
        dead_letters::{CaptureIds, InsertOutcome, TakenIds},
    },
};

/// The session's channel, for the round trip that proves an ack processed.
pub(super) struct AckChannel {
    pub(super) channel: lapin::Channel,
    pub(super) prefetch: u16,
}

/// A batch ready to store, with the delivery that acks it.
pub(super) struct Batch {
    pub(super) dead_letters: Vec<NewDeadLetter>,
    pub(super) last: Delivery,
}

/// Stores the batches of one session of queue `source`, in order.
pub(super) struct BatchWriter {
    pub(super) store: Store,
    pub(super) channel: AckChannel,
    /// The queue the batches come from.
    pub(super) source: String,
    /// The capture session each batch is recorded with.
    pub(super) session: uuid::Uuid,
    pub(super) shutdown: CancellationToken,
    /// Cancelled when the session failed: a batch being written is not
    /// retried.
    pub(super) session_over: CancellationToken,
}

/// Batches one session stores at once: the next is written beside the one
/// before it, under ids taken in queue order when the writer takes it, and
/// acked only after it. One insert at a time left PostgreSQL's second core
/// idle (docs/benchmarks.md, "The state check's traffic and the wire
/// check").
const BATCHES_IN_FLIGHT: usize = 2;

/// What storing a batch needs, cloned into the batch's task.
#[derive(Clone)]
pub(super) struct Storer {
    pub(super) store: Store,
    pub(super) source: String,
    pub(super) session: uuid::Uuid,
    pub(super) shutdown: CancellationToken,
    /// Cancelled when the session is over (a round's never is).
    pub(super) session_over: CancellationToken,
}

/// A batch stored: its capture batch ids, what the insert found, and its
/// dead letters, for the metrics.
struct Stored {
    batch_ids: Vec<i64>,
    outcome: InsertOutcome,
    dead_letters: Vec<NewDeadLetter>,
}

/// What the writer waited for.
enum Step {
    /// The next batch, or `None` when the session sends no more (boxed: a
    /// batch's delivery is large beside the other variant).
    Received(Option<Box<Batch>>),
    /// The oldest batch in flight stored, or `None` when it was given up.
    Stored(Option<Stored>),
}

/// A batch's task's result: `None` when it was given up, or its task
/// failed (a panic, logged).
fn finished(result: Result<Option<Stored>, tokio::task::JoinError>) -> Option<Stored> {
    result.unwrap_or_else(|error| {
        warn!(%error, "storing a batch failed; it stays unacked");
        None
    })
}

impl Storer {
    /// Runs `attempt` until it succeeds, backing off while PostgreSQL fails.
    /// `None` when it gave up: a failure after shutdown, or the end of the
    /// session.
    pub(super) async fn retry<T, F, Fut>(&self, mut attempt: F) -> Option<T>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, StoreError>>,
    {
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
        loop {
            match attempt().await {
                Ok(value) => return Some(value),
                Err(error) => {
                    self.store
                        .metrics()
                        .capture_failed(&self.source, CaptureFailure::Store);
                    let delay = backoff.next_delay();
                    warn!(%error, retry_in_ms = delay.as_millis() as u64, "storing dead letters failed; nothing acked");
                    if self.shutdown.is_cancelled() || self.session_over.is_cancelled() {
                        return None;
                    }
                    tokio::select! {
                        () = self.shutdown.cancelled() => {}
                        () = self.session_over.cancelled() => return None,
                        () = tokio::time::sleep(delay) => {}
                    }
                }
            }
        }
    }

    /// [`store_batch`] of `dead_letters` under `ids`, retried ([`Storer::retry`])
    /// with the ids of the first attempt (after a failed attempt some rows
    /// may be committed under their ids: a commit whose reply was lost),
    /// each attempt in a `planner.capture.batch` span when `traced`: the
    /// capture batches and what the insert found; `None` when it gave up.
    pub(super) async fn store_under(
        &self,
        dead_letters: &[NewDeadLetter],
        ids: &CaptureIds,
        traced: bool,
    ) -> Option<(Vec<i64>, InsertOutcome)> {
        let mut attempts = 0;
        self.retry(|| {
            let taken = TakenIds {
                batch: ids.batch,
                ids: &ids.rows,
                retry: attempts > 0,
            };
            attempts += 1;
            let span = if traced {
                info_span!(
                    "planner.capture.batch",
                    messaging.system = "rabbitmq",
                    messaging.operation.type = "process",
                    messaging.destination.name = %self.source,
                    messaging.batch.message_count = dead_letters.len(),
                )
            } else {
                tracing::Span::none()
            };
            store_batch(
                &self.store,
                self.session,
                &self.source,
                dead_letters,
                Some(taken),
            )
            .instrument(span)
        })
        .await
    }

    /// Stores `dead_letters` under `ids` ([`store_batch`]), retrying while
    /// PostgreSQL is unavailable; `None` when it gave up (the batch stays
    /// unacked and returns to the queue).
    async fn store(self, dead_letters: Vec<NewDeadLetter>, ids: CaptureIds) -> Option<Stored> {
        let (batch_ids, outcome) = self.store_under(&dead_letters, &ids, true).await?;
        Some(Stored {
            batch_ids,
            outcome,
            dead_letters,
        })
    }
}

impl BatchWriter {
    /// Writes the batches of `to_write` until the session drops its sender
    /// or a batch is given up, then waits for the [`AckRecorder`] to record
    /// the acks already sent.
    ///
    /// Each batch's ids are taken when the writer takes it, so batches keep
    /// queue order while [`BATCHES_IN_FLIGHT`] are stored side by side; each
    /// is acked (`multiple`) only once it and every batch before it are
    /// committed, so an ack never covers a message not stored. A batch
    /// given up stops the writer: the batch after it is left to finish, so
    /// that no commit lands after the next session has started, and stays
    /// unacked even when it committed: its messages return to the queue and
    /// the next session absorbs them as redeliveries.
    pub(super) async fn run(self, mut to_write: mpsc::Receiver<Batch>) {
        let (acked, to_record) = mpsc::unbounded_channel();
        let recorder = AckRecorder {
            store: self.store.clone(),
            channel: self.channel.channel.clone(),
            prefetch: self.channel.prefetch,
            session_over: self.session_over.clone(),
        };
        let recorder = tokio::spawn(recorder.run(to_record).in_current_span());
        let storer = Storer {
            store: self.store.clone(),
            source: self.source.clone(),
            session: self.session,
            shutdown: self.shutdown.clone(),
            session_over: self.session_over.clone(),
        };
        // The batches being stored, oldest first, each with the delivery
        // that acks it.
        let mut in_flight: VecDeque<(Delivery, JoinHandle<Option<Stored>>)> = VecDeque::new();
        let mut open = true;
        // Whether every batch taken so far was stored: a batch after one
        // given up is never acked.
        let mut acking = true;
        // Whether the writer stopped before the session sent its last batch.
        let mut gave_up = false;
        loop {
            let taking = open && in_flight.len() < BATCHES_IN_FLIGHT;
            let step = match in_flight.front_mut() {
                None if !open => break,
                None => Step::Received(to_write.recv().await.map(Box::new)),
                Some((_, storing)) if taking => tokio::select! {
                    biased;
                    stored = storing => Step::Stored(finished(stored)),
                    batch = to_write.recv() => Step::Received(batch.map(Box::new)),
                },
                Some((_, storing)) => Step::Stored(finished(storing.await)),
            };
            match step {
                Step::Received(None) => open = false,
                Step::Received(Some(batch)) => {
                    let Batch { dead_letters, last } = *batch;
                    let count = dead_letters.len();
                    let Some(ids) = storer.retry(|| storer.store.take_capture_ids(count)).await
                    else {
                        gave_up = true;
                        break;
                    };
                    let storing =
                        tokio::spawn(storer.clone().store(dead_letters, ids).in_current_span());
                    in_flight.push_back((last, storing));
                }
                Step::Stored(stored) => {
                    let Some((last, _)) = in_flight.pop_front() else {
                        break;
                    };
                    if !self.stored(stored, &last, &acked).await {
                        acking = false;
                        gave_up = true;
                        break;
                    }
                }
            }
        }
        if gave_up && !self.shutdown.is_cancelled() {
            // A batch given up (its task failed): the session is over, and
            // the retries of the batch still in flight end with it.
            self.session_over.cancel();
        }
        // The batches still in flight finish, so that a commit under way
        // lands before the next session matches redeliveries (their retries
        // end with the session); each is acked while every batch before it
        // was stored.
        for (last, storing) in in_flight {
            let stored = finished(storing.await);
            if acking {
                acking = self.stored(stored, &last, &acked).await;
            }
        }
        drop(acked);
        let _ = recorder.await;
    }

    /// Counts and acks a batch `stored`, with its `last` delivery, and hands
    /// its capture batch ids to the recorder (`acked`); `false` when it was
    /// given up instead (nothing acked).
    async fn stored(
        &self,
        stored: Option<Stored>,
        last: &Delivery,
        acked: &mpsc::UnboundedSender<Vec<i64>>,
    ) -> bool {
        let Some(stored) = stored else {
            return false;
        };
        count_stored(
            &self.store,
            &self.source,
            &stored.dead_letters,
            &stored.outcome,
        );
        if self.ack(last).await {
            // Never closed before this writer is done.
            let _ = acked.send(stored.batch_ids);
        }
        true
    }

    /// Acks a stored batch on its `last` delivery (`multiple`); `true` when
    /// the ack was sent. A failed ack leaves the batch open for
    /// redeliveries.
    async fn ack(&self, last: &Delivery) -> bool {
        // Stored but not acked: the broker redelivers them to the next
        // session, which matches them against this unacked batch. lapin's
        // future can outlive a connection the guard ended (seen: a capture
        // stalled for good after a guard stop), so the session's end ends
        // the wait.
        let sent = tokio::select! {
            biased;
            sent = last.acker.ack(BasicAckOptions { multiple: true }) => sent,
            () = self.session_over.cancelled() => {
                warn!("ack after commit not sent: the session ended");
                return false;
            }
        };
        match sent {
            Ok(true) => true,
            Ok(false) => {
                warn!("ack after commit not sent: the channel is closed");
                false
            }
            Err(error) => {
                warn!(%error, "ack after commit failed");
                false
            }
        }
    }
}

/// Records the acks a [`BatchWriter`] sent, off its path: the writer goes on
/// to store the next batch while the recorder proves the acks processed and
/// marks their batches acked, all the batches acked meanwhile at once.
struct AckRecorder {
    store: Store,
    /// The session's channel, the acks' own.
    channel: lapin::Channel,
    /// The session's prefetch, set again as the proof ([`Self::record`]).
    prefetch: u16,
    /// Cancelled when the session failed: the proof never comes.
    session_over: CancellationToken,
}

impl AckRecorder {
    /// Records each group of acked batch ids from `to_record` until the
    /// writer is done.
    async fn run(self, mut to_record: mpsc::UnboundedReceiver<Vec<i64>>) {
        while let Some(mut batch_ids) = to_record.recv().await {
            while let Ok(more) = to_record.try_recv() {
                batch_ids.extend(more);
            }
            self.record(&batch_ids).await;
        }
    }

    /// Once the broker has processed the acks sent before this call, marks
    /// `batch_ids` acked. An unproven ack leaves them open for redeliveries.
    async fn record(&self, batch_ids: &[i64]) {
        // basic.ack has no reply, and a connection that dies right after it
        // (lapin drops frames it had not written) leaves the broker to
        // redeliver. A synchronous method behind the acks on the same
        // channel proves the broker processed them (frames of a channel are
        // handled in order, AMQP 0-9-1 §2.3.6); only then are the batches
        // recorded as acked. The writer sent every ack of `batch_ids`
        // before handing them over, so this basic.qos (the session's own
        // prefetch: a local reply) follows them all.
        // A session that failed ends the wait: lapin's reply future can
        // outlive the connection.
        let sync = tokio::select! {
            biased;
            sync = self.channel.basic_qos(self.prefetch, BasicQosOptions::default()) => sync.map_err(|error| error.to_string()),
            () = self.session_over.cancelled() => Err("the session ended first".to_owned()),
        };
        if let Err(error) = sync {
            warn!(%error, batches = batch_ids.len(), "acks after commit are unconfirmed; their batches stay open for redeliveries");
            return;
        }
        if let Err(error) = self.store.mark_captures_acked(batch_ids).await {
            warn!(%error, ?batch_ids, "could not record the acks of capture batches");
        }
    }
}

/// Stores a captured batch (under `row_ids` when given:
/// [`Store::insert_captured_as`]); when PostgreSQL refuses it for its
/// content (not because it is unreachable), stores the dead letters one by
/// one, each refused one degraded to what is always storable
/// ([`NewDeadLetter::degraded`]), so that one odd message never stalls its
/// queue. Returns the capture batches it stored in.
///
/// # Errors
/// Retryable store errors (PostgreSQL unreachable), or a degraded dead letter
/// refused too.
pub(super) async fn store_batch(
    store: &Store,
    session: uuid::Uuid,
    source: &str,
    batch: &[NewDeadLetter],
    row_ids: Option<TakenIds<'_>>,
) -> Result<(Vec<i64>, InsertOutcome), StoreError> {
    match store
        .insert_captured_as(session, source, batch, row_ids)
        .await
    {
        Err(error) if !error.is_retryable() && batch.len() > 1 => {
            warn!(%error, "a batch was refused; storing its dead letters one by one");
        }
        Err(error) if !error.is_retryable() => {
            let degraded = batch[0].degraded(&error.to_string());
            warn!(%error, "a dead letter was refused; storing it without its derived fields");
            let (id, outcome) = store
                .insert_captured_as(session, source, std::slice::from_ref(&degraded), row_ids)
                .await?;
            return Ok((vec![id], outcome));
        }
        other => return other.map(|(id, outcome)| (vec![id], outcome)),
    }
    let mut ids = Vec::with_capacity(batch.len());
    let mut total = InsertOutcome::default();
    for (position, dead_letter) in batch.iter().enumerate() {
        let single = std::slice::from_ref(dead_letter);
        let row_id = row_ids.map(|taken| TakenIds {
            batch: taken.batch,
            ids: &taken.ids[position..=position],
            retry: taken.retry,
        });
        let (id, outcome) = match store
            .insert_captured_as(session, source, single, row_id)
            .await
        {
            Err(error) if !error.is_retryable() => {
                warn!(%error, "a dead letter was refused; storing it without its derived fields");
                let degraded = dead_letter.degraded(&error.to_string());
                store
                    .insert_captured_as(session, source, std::slice::from_ref(&degraded), row_id)
                    .await?
            }
            other => other?,
        };
        // Under taken ids, every dead letter is stored in the one batch.
        if ids.last() != Some(&id) {
            ids.push(id);
        }
        total.inserted += outcome.inserted;
        total.already_stored += outcome.already_stored;
    }
    Ok((ids, total))
}

/// Counts the stored batch `dead_letters` of `source` in the metrics and
/// logs what `outcome` says (a batch that met dead letters stored before is
/// counted by source only).
pub(super) fn count_stored(
    store: &Store,
    source: &str,
    dead_letters: &[NewDeadLetter],
    outcome: &InsertOutcome,
) {
    let redead = dead_letters
        .iter()
        .filter(|dead_letter| dead_letter.redrive_plan_id.is_some())
        .count();
    if outcome.already_stored == 0 {
        store.metrics().captured(
            source,
            dead_letters
                .iter()
                .map(|dead_letter| dead_letter.reason_class),
            u64::try_from(redead).unwrap_or(u64::MAX),
        );
    } else {
        // Which ones were new is not known: counted by source only.
        store
            .metrics()
            .captured_unclassified(source, outcome.inserted);
    }
    tracing::debug!(
        source,
        inserted = outcome.inserted,
        already_stored = outcome.already_stored,
        "batch stored"
    );
    if outcome.already_stored > 0 {
        info!(
            source,
            already_stored = outcome.already_stored,
            "redeliveries of dead letters stored before the last crash"
        );
    }
}
