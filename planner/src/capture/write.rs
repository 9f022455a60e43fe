//! The writer of a capture session: [`BatchWriter`] stores each batch the
//! session cuts and acks it after the commit; its [`AckRecorder`] records
//! the acks once the broker has processed them, while the writer stores the
//! next batch; [`store_batch`] degrades a batch PostgreSQL refuses for its
//! content to one dead letter at a time.

use std::time::Duration;

use lapin::{
    message::Delivery,
    options::{BasicAckOptions, BasicQosOptions},
};
use redrive_proto::backoff::Backoff;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, info, info_span, warn};

use crate::{
    dead_letters::NewDeadLetter,
    metrics::CaptureFailure,
    store::{Store, StoreError, dead_letters::InsertOutcome},
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

impl BatchWriter {
    /// Writes each batch of `to_write` ([`Self::write`]) until the session
    /// drops its sender or a batch is given up, then waits for the
    /// [`AckRecorder`] to record the acks already sent.
    pub(super) async fn run(self, mut to_write: mpsc::Receiver<Batch>) {
        let (acked, to_record) = mpsc::unbounded_channel();
        let recorder = AckRecorder {
            store: self.store.clone(),
            channel: self.channel.channel.clone(),
            prefetch: self.channel.prefetch,
        };
        let recorder = tokio::spawn(recorder.run(to_record).in_current_span());
        while let Some(batch) = to_write.recv().await {
            if !self.write(batch, &acked).await {
                break;
            }
        }
        drop(acked);
        let _ = recorder.await;
    }

    /// Stores `batch` (retrying while PostgreSQL is unavailable), acks it, and
    /// hands its capture batch ids to the recorder (`acked`). Returns false
    /// when it gave up because of shutdown or the end of the session (the
    /// batch stays unacked and returns to the queue).
    async fn write(&self, batch: Batch, acked: &mpsc::UnboundedSender<Vec<i64>>) -> bool {
        let Self {
            store,
            source,
            shutdown,
            session_over,
            ..
        } = self;
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
        loop {
            let span = info_span!(
                "planner.capture.batch",
                messaging.system = "rabbitmq",
                messaging.operation.type = "process",
                messaging.destination.name = %source,
                messaging.batch.message_count = batch.dead_letters.len(),
            );
            match store_batch(store, self.session, source, &batch.dead_letters)
                .instrument(span)
                .await
            {
                Ok((batch_ids, outcome)) => {
                    self.count(&batch.dead_letters, &outcome);
                    if self.ack(&batch.last).await {
                        // Never closed before this writer is done.
                        let _ = acked.send(batch_ids);
                    }
                    return true;
                }
                Err(error) => {
                    store
                        .metrics()
                        .capture_failed(source, CaptureFailure::Store);
                    let delay = backoff.next_delay();
                    warn!(%error, retry_in_ms = delay.as_millis() as u64, "storing dead letters failed; nothing acked");
                    if shutdown.is_cancelled() || session_over.is_cancelled() {
                        return false;
                    }
                    tokio::select! {
                        () = shutdown.cancelled() => {}
                        () = session_over.cancelled() => return false,
                        () = tokio::time::sleep(delay) => {}
                    }
                }
            }
        }
    }

    /// Counts the stored batch `dead_letters` in the metrics and logs what
    /// `outcome` says.
    fn count(&self, dead_letters: &[NewDeadLetter], outcome: &InsertOutcome) {
        let (store, source) = (&self.store, self.source.as_str());
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

    /// Acks a stored batch on its `last` delivery (`multiple`); `true` when
    /// the ack was sent. A failed ack leaves the batch open for
    /// redeliveries.
    async fn ack(&self, last: &Delivery) -> bool {
        if let Err(error) = last.acker.ack(BasicAckOptions { multiple: true }).await {
            // Stored but not acked: the broker redelivers them to the next
            // session, which matches them against this unacked batch.
            warn!(%error, "ack after commit failed");
            return false;
        }
        true
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
        let sync = self
            .channel
            .basic_qos(self.prefetch, BasicQosOptions::default())
            .await;
        if let Err(error) = sync {
            warn!(%error, batches = batch_ids.len(), "acks after commit are unconfirmed; their batches stay open for redeliveries");
            return;
        }
        if let Err(error) = self.store.mark_captures_acked(batch_ids).await {
            warn!(%error, ?batch_ids, "could not record the acks of capture batches");
        }
    }
}

/// Stores a captured batch; when PostgreSQL refuses it for its content (not
/// because it is unreachable), stores the dead letters one by one, each refused
/// one degraded to what is always storable ([`NewDeadLetter::degraded`]), so
/// that one odd message never stalls its queue.
///
/// # Errors
/// Retryable store errors (PostgreSQL unreachable), or a degraded dead letter
/// refused too.
pub(super) async fn store_batch(
    store: &Store,
    session: uuid::Uuid,
    source: &str,
    batch: &[NewDeadLetter],
) -> Result<(Vec<i64>, InsertOutcome), StoreError> {
    match store.insert_captured(session, source, batch).await {
        Err(error) if !error.is_retryable() && batch.len() > 1 => {
            warn!(%error, "a batch was refused; storing its dead letters one by one");
        }
        Err(error) if !error.is_retryable() => {
            let degraded = batch[0].degraded(&error.to_string());
            warn!(%error, "a dead letter was refused; storing it without its derived fields");
            let (id, outcome) = store
                .insert_captured(session, source, std::slice::from_ref(&degraded))
                .await?;
            return Ok((vec![id], outcome));
        }
        other => return other.map(|(id, outcome)| (vec![id], outcome)),
    }
    let mut ids = Vec::with_capacity(batch.len());
    let mut total = InsertOutcome::default();
    for dead_letter in batch {
        let single = std::slice::from_ref(dead_letter);
        let (id, outcome) = match store.insert_captured(session, source, single).await {
            Err(error) if !error.is_retryable() => {
                warn!(%error, "a dead letter was refused; storing it without its derived fields");
                let degraded = dead_letter.degraded(&error.to_string());
                store
                    .insert_captured(session, source, std::slice::from_ref(&degraded))
                    .await?
            }
            other => other?,
        };
        ids.push(id);
        total.inserted += outcome.inserted;
        total.already_stored += outcome.already_stored;
    }
    Ok((ids, total))
}
