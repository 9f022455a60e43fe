//! Capture: consume RabbitMQ dead-letter queues into PostgreSQL, losing nothing.
//!
//! Per queue, one channel with manual acks and a bounded prefetch feeds a
//! gatherer that cuts batches (by size or after a short wait); one writer stores
//! each batch in a single statement and, only after that commit, acks the whole
//! batch with one `basic.ack(multiple = true)` on its last delivery tag (AMQP
//! 0-9-1 §1.8.3.13). While a batch is written the next one is gathered.
//!
//! What happens when something dies:
//! - PostgreSQL down: the writer retries the same batch with backoff; nothing is
//!   acked, so the messages stay in the queue (prefetch bounds how many are held
//!   unacked) and capture resumes when PostgreSQL is back.
//! - RabbitMQ connection lost: the session ends and reconnects with backoff; the
//!   broker redelivers every unacked message with `redelivered` set.
//! - The planner dies between commit and ack: the broker redelivers; a
//!   redelivered message whose capture fingerprint (source, body, properties,
//!   headers) is already stored is not stored again, and is acked.

use std::{sync::Arc, time::Duration};

use chrono::Utc;
use futures::StreamExt;
use lapin::{
    Connection, ConnectionProperties,
    message::Delivery,
    options::{BasicAckOptions, BasicConsumeOptions, BasicQosOptions},
    types::FieldTable,
};
use redrive_proto::{amqp, v1::Origin};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, info, info_span, warn};

use crate::{
    dead_letter::{ExtractionRules, NewDeadLetter, RawDeadLetter, extract},
    store::{Store, StoreError},
};

/// How capture runs.
#[derive(Debug, Clone)]
pub struct CaptureConfig {
    /// AMQP URI of the broker.
    pub amqp_url: String,
    /// Dead-letter queues to consume (they must exist).
    pub queues: Vec<String>,
    /// Unacked deliveries the broker may push per queue (`basic.qos`); at least
    /// two batches so that gathering overlaps writing.
    pub prefetch: u16,
    /// Dead letters per insert.
    pub batch_size: usize,
    /// How long a partial batch waits for more before it is written.
    pub batch_wait: Duration,
    /// How dead letters are read.
    pub rules: Arc<ExtractionRules>,
}

/// Why a capture session ended.
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    /// The broker connection or channel failed.
    #[error("RabbitMQ: {0}")]
    Broker(#[from] lapin::Error),
    /// The consumer was cancelled by the broker (queue deleted).
    #[error("consumer of queue {0:?} ended (queue deleted or consumer cancelled)")]
    ConsumerEnded(String),
}

/// Consumes every configured queue until `shutdown`. Each queue reconnects on
/// its own with backoff (0.2 s doubling to 10 s).
pub async fn run(config: CaptureConfig, store: Store, shutdown: CancellationToken) {
    let mut sessions = tokio::task::JoinSet::new();
    for queue in config.queues.clone() {
        let config = config.clone();
        let store = store.clone();
        let shutdown = shutdown.clone();
        let span = info_span!("planner.capture", queue = %queue);
        sessions.spawn(
            async move {
                let mut backoff = Duration::from_millis(200);
                while !shutdown.is_cancelled() {
                    match session(&config, &queue, &store, &shutdown).await {
                        Ok(()) => break,
                        Err(error) => {
                            warn!(%error, retry_in_ms = backoff.as_millis() as u64, "capture session ended")
                        }
                    }
                    tokio::select! {
                        () = shutdown.cancelled() => break,
                        () = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(10));
                }
            }
            .instrument(span),
        );
    }
    while sessions.join_next().await.is_some() {}
}

/// A batch ready to store, with the delivery that acks it.
struct Batch {
    dead_letters: Vec<NewDeadLetter>,
    last: Delivery,
}

/// One connection's worth of consuming `queue`. `Ok` on shutdown.
async fn session(
    config: &CaptureConfig,
    queue: &str,
    store: &Store,
    shutdown: &CancellationToken,
) -> Result<(), CaptureError> {
    let connection = Connection::connect(&config.amqp_url, ConnectionProperties::default()).await?;
    let channel = connection.create_channel().await?;
    channel
        .basic_qos(config.prefetch, BasicQosOptions::default())
        .await?;
    let consumer_tag = format!("redrive-planner-{}", uuid::Uuid::new_v4());
    let mut consumer = channel
        .basic_consume(
            queue.into(),
            consumer_tag.as_str().into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    info!(
        prefetch = config.prefetch,
        batch_size = config.batch_size,
        "capturing"
    );

    // One batch queued while another is written: gathering overlaps the insert.
    let (batches, mut to_write) = mpsc::channel::<Batch>(1);
    let writer_store = store.clone();
    let writer_shutdown = shutdown.clone();
    let source = queue.to_owned();
    let writer = tokio::spawn(
        async move {
            while let Some(batch) = to_write.recv().await {
                if !write_batch(&writer_store, &source, batch, &writer_shutdown).await {
                    break;
                }
            }
        }
        .in_current_span(),
    );

    let outcome = gather(config, queue, &mut consumer, &batches, shutdown).await;
    drop(batches);
    if outcome.is_ok() {
        // Shutdown: let the writer store and ack what it holds (one last try).
        let _ = writer.await;
        let _ = channel.close(200, "planner shutting down".into()).await;
        let _ = connection.close(200, "planner shutting down".into()).await;
    } else {
        // The channel is gone: unacked deliveries come back redelivered, and
        // fingerprints keep a batch committed meanwhile from being stored twice.
        writer.abort();
    }
    outcome
}

/// Cuts batches from the consumer until shutdown (`Ok`) or a broker failure.
async fn gather(
    config: &CaptureConfig,
    queue: &str,
    consumer: &mut lapin::Consumer,
    batches: &mpsc::Sender<Batch>,
    shutdown: &CancellationToken,
) -> Result<(), CaptureError> {
    loop {
        let first = tokio::select! {
            () = shutdown.cancelled() => return Ok(()),
            next = consumer.next() => next,
        };
        let Some(first) = first else {
            return Err(CaptureError::ConsumerEnded(queue.to_owned()));
        };
        let mut deliveries = vec![first?];
        let deadline = tokio::time::Instant::now() + config.batch_wait;
        while deliveries.len() < config.batch_size {
            tokio::select! {
                () = tokio::time::sleep_until(deadline) => break,
                next = consumer.next() => match next {
                    Some(delivery) => deliveries.push(delivery?),
                    None => return Err(CaptureError::ConsumerEnded(queue.to_owned())),
                },
            }
        }
        let batch = extract_batch(&config.rules, queue, deliveries).await;
        if batches.send(batch).await.is_err() {
            // The writer gave up (shutdown while PostgreSQL was down).
            return Ok(());
        }
    }
}

async fn extract_batch(
    rules: &Arc<ExtractionRules>,
    queue: &str,
    deliveries: Vec<Delivery>,
) -> Batch {
    let captured_at = Utc::now();
    let mut dead_letters = Vec::with_capacity(deliveries.len());
    let mut last = None;
    for delivery in deliveries {
        let raw = RawDeadLetter {
            source: queue.to_owned(),
            origin: Origin::Rabbitmq,
            properties: amqp::properties_from_amqp(&delivery.properties),
            headers: delivery
                .properties
                .headers()
                .as_ref()
                .map(amqp::table_from_amqp)
                .unwrap_or_default(),
            redelivered: delivery.redelivered,
            body: delivery.data.clone(),
            reason: None,
            original_destination: None,
            error_text: None,
            attempts: None,
            occurred_at: None,
            captured_at,
        };
        let dead_letter = extract(rules, raw).await;
        if dead_letter.body_oversized {
            warn!(
                source = %dead_letter.source,
                body_size = dead_letter.body.len(),
                "dead letter body over the limit: captured, marked oversized"
            );
        }
        dead_letters.push(dead_letter);
        last = Some(delivery);
    }
    Batch {
        dead_letters,
        last: last.expect("a batch has at least one delivery"),
    }
}

/// Stores `batch` (retrying while PostgreSQL is unavailable) and then acks it.
/// Returns false when it gave up because of shutdown (the batch stays unacked
/// and returns to the queue).
async fn write_batch(
    store: &Store,
    source: &str,
    batch: Batch,
    shutdown: &CancellationToken,
) -> bool {
    let mut backoff = Duration::from_millis(100);
    loop {
        match store.insert_dead_letters(&batch.dead_letters).await {
            Ok(outcome) => {
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
                        "redelivered dead letters already stored"
                    );
                }
                if let Err(error) = batch
                    .last
                    .acker
                    .ack(BasicAckOptions { multiple: true })
                    .await
                {
                    // Stored but not acked: the broker redelivers them and the
                    // fingerprint check keeps them from being stored twice.
                    warn!(%error, "ack after commit failed");
                }
                return true;
            }
            Err(error) => {
                let retryable = error.is_retryable() || matches!(error, StoreError::Migrate(_));
                warn!(%error, retryable, retry_in_ms = backoff.as_millis() as u64, "storing dead letters failed; nothing acked");
                if shutdown.is_cancelled() {
                    return false;
                }
                tokio::select! {
                    () = shutdown.cancelled() => {}
                    () = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        }
    }
}
