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
//! - The planner dies between commit and ack: the broker redelivers those
//!   messages (`redelivered` set) to the next session. Each capture batch is
//!   recorded with its session and marked acked after the broker ack; a
//!   redelivered message is matched against a stored copy (same source and
//!   fingerprint: body, properties, headers) in a batch an *earlier* session
//!   committed but never acked, and each such copy absorbs at most one
//!   redelivery. Identical dead letters therefore stay distinct, and a crash
//!   never stores one twice.
//! - PostgreSQL refuses a batch for its content (a value out of range): the
//!   batch is stored one dead letter at a time, a refused one without its
//!   derived fields (body, properties and headers kept exactly, noted), so one
//!   odd message never stalls its queue.
//! - lapin cannot read a delivery (a short string that is not UTF-8, a header
//!   frame over `frame_max`): it ends the connection, and the broker
//!   requeues every message the session held; they come back first. The next
//!   round takes up to `prefetch` messages one at a time with the fallback
//!   reader ([`raw`], `basic.get`, no prefetch), so they are not returned
//!   again and again with every restart; readable ones are stored and
//!   acked as usual, an unreadable one is stored as a placeholder
//!   ([`ReasonClass::Unreadable`], `invalid` at precheck) and moved aside,
//!   byte for byte, to `<queue>.unreadable`, then acked, or held unacked in
//!   the DLQ when it cannot be moved. Then the session resumes with its
//!   prefetch (docs/design.md, "Messages the client cannot read").

pub mod guard;
pub mod ingest;
pub mod ingest_budget;
pub mod raw;

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use chrono::Utc;
use futures::StreamExt;
use lapin::{
    Connection, ConnectionProperties,
    message::Delivery,
    options::{BasicAckOptions, BasicConsumeOptions, BasicQosOptions, QueueDeclareOptions},
    types::FieldTable,
};
use redrive_proto::{amqp, backoff::Backoff, v1::ReasonClass};
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, info, info_span, warn};

use crate::{
    dead_letters::{ExtractionRules, NewDeadLetter, RawDeadLetter, extract},
    metrics::{CaptureFailure, Quarantine},
    store::{Store, StoreError, dead_letters::InsertOutcome},
};

/// Default of `--capture-batch-bytes`: a batch is written once its bodies
/// reach this many bytes, whatever its count.
pub const DEFAULT_BATCH_BYTES: usize = 64 * 1024 * 1024;

/// Largest `--capture-batch-bytes`: a batch's bodies go to PostgreSQL in one
/// array value, and PostgreSQL takes at most 1 GB in one value.
pub const MAX_BATCH_BYTES: usize = 256 * 1024 * 1024;

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
    /// Bytes of bodies per insert: a batch is written once its bodies reach
    /// this, whatever its count (at least one dead letter per batch).
    pub batch_bytes: usize,
    /// How long a partial batch waits for more before it is written.
    pub batch_wait: Duration,
    /// How dead letters are read.
    pub rules: Arc<ExtractionRules>,
    /// lapin connects through [`guard`] (plain `amqp://` only). Always on in
    /// service; off only to measure its cost.
    pub guard: bool,
    /// Where each queue's consumer says whether it is connected (readiness).
    pub status: CaptureStatus,
}

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

    fn set(&self, queue: &str, consuming: bool) {
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
    fn set_problem(&self, queue: &str, why: Option<String>) {
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

/// The header RabbitMQ adds to every message a stream queue delivers over
/// AMQP 0-9-1 (its offset in the stream; RabbitMQ docs, "Streams",
/// "Consuming"): how capture recognizes a stream.
pub const STREAM_OFFSET_HEADER: &str = "x-stream-offset";

/// Why capture refuses stream queues (docs/capture.md, "Stream queues").
pub const STREAM_REFUSAL: &str = "is a stream queue (x-queue-type: stream): a stream keeps every message after its ack, so capture cannot take dead letters from it and would read them all again after every restart; capture of this queue is refused (dead-letter into a classic or quorum queue, or remove it from --capture-queue)";

/// Why a capture session ended.
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    /// The broker connection or channel failed.
    #[error("RabbitMQ: {0}")]
    Broker(#[from] lapin::Error),
    /// The AMQP URI does not parse, or the capture guard cannot listen.
    #[error("{0}")]
    Uri(String),
    /// The consumer was cancelled by the broker (queue deleted).
    #[error("consumer of queue {0:?} ended (queue deleted or consumer cancelled)")]
    ConsumerEnded(String),
    /// The capture queue does not exist (a typo in `--capture-queue`, or not
    /// declared yet): the broker answered a passive `queue.declare` with
    /// 404 NOT_FOUND (AMQP 0-9-1 §1.7.2.1).
    #[error("capture queue {0} does not exist (404 NOT_FOUND on passive declare)")]
    MissingQueue(String),
    /// The capture queue is a stream ([`STREAM_REFUSAL`]).
    #[error("capture queue {0} {STREAM_REFUSAL}")]
    StreamQueue(String),
    /// The connection to the broker ended (the capture guard's relay
    /// closed) while lapin was still waiting on it.
    #[error("the connection to the broker ended (the capture guard's relay closed)")]
    ConnectionLost,
}

/// The queue an unreadable message of `queue` is moved to.
pub fn unreadable_queue(queue: &str) -> String {
    format!("{queue}.unreadable")
}

/// A session that consumed for this long before it failed was healthy: the
/// next attempt starts from the shortest delay again, not from where the
/// failures before it had left the backoff.
const HEALTHY_SESSION: Duration = Duration::from_secs(30);

/// The delay before reconnecting after a session that failed after running
/// for `ran`: the next of `backoff`, which starts over after a healthy
/// session ([`HEALTHY_SESSION`]).
fn delay_after_session(backoff: &mut Backoff, ran: Duration) -> Duration {
    if ran >= HEALTHY_SESSION {
        backoff.reset();
    }
    backoff.next_delay()
}

/// Consumes every configured queue until `shutdown`. Each queue reconnects on
/// its own with backoff (0.2 s doubling to 10 s, plus up to as much again of
/// jitter; from 0.2 s again after a session that had run for
/// [`HEALTHY_SESSION`]); after a session that failed while consuming, and
/// whenever the connection holding unparkable messages has ended, the
/// messages back in the queue are first taken one at a time (`isolate`).
pub async fn run(config: CaptureConfig, store: Store, shutdown: CancellationToken) {
    let mut sessions = tokio::task::JoinSet::new();
    for queue in config.queues.clone() {
        let config = config.clone();
        let store = store.clone();
        let shutdown = shutdown.clone();
        let span = info_span!("planner.capture", queue = %queue);
        sessions.spawn(
            async move {
                let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(10));
                let mut delay;
                let mut isolating = false;
                // The connection holding unreadable messages that could not
                // be moved aside, unacked.
                let mut held: Option<raw::RawConnection> = None;
                while !shutdown.is_cancelled() {
                    // The connection holding unparkable messages ended (a
                    // connection blip, the broker's `consumer_timeout`):
                    // the broker returned them to the queue, ahead of the
                    // rest. Hold them again one at a time before consuming,
                    // whatever ended the session before: lapin would meet
                    // them first, the guard would end that session too, and
                    // the hold would wait for one more backoff delay.
                    if !isolating && held.as_mut().is_some_and(|held| !held.is_alive()) {
                        info!("the connection holding unreadable messages ended; taking messages one at a time again before consuming");
                        isolating = true;
                    }
                    if isolating {
                        match isolate(&config, &queue, &store, &shutdown, &mut held).await {
                            Ok(taken) => {
                                info!(taken, "messages held by the failed session taken one at a time; consuming again");
                                // The backoff goes on: only a session that
                                // ran for a while starts it over.
                                isolating = false;
                                continue;
                            }
                            Err(raw::RawError::Unsupported(why)) => {
                                warn!(%why, "cannot take messages one at a time; consuming again");
                                isolating = false;
                                continue;
                            }
                            Err(error) => {
                                delay = backoff.next_delay();
                                warn!(%error, retry_in_ms = delay.as_millis() as u64, "taking messages one at a time failed");
                            }
                        }
                    } else {
                        let mut consumed = false;
                        let started = tokio::time::Instant::now();
                        let ended = session(&config, &queue, &store, &shutdown, &mut consumed).await;
                        config.status.set(&queue, false);
                        match ended {
                            Ok(()) => break,
                            Err(CaptureError::StreamQueue(_)) => {
                                // Refused for good: a stream stays a stream.
                                config.status.set_problem(&queue, Some(STREAM_REFUSAL.to_owned()));
                                tracing::error!(queue = %queue, "capture queue {queue} {STREAM_REFUSAL}");
                                break;
                            }
                            Err(CaptureError::MissingQueue(_)) => {
                                store.metrics().capture_failed(&queue, CaptureFailure::Session);
                                config.status.set_problem(
                                    &queue,
                                    Some("does not exist (404 NOT_FOUND on passive declare)".to_owned()),
                                );
                                delay = delay_after_session(&mut backoff, started.elapsed());
                                warn!(
                                    retry_in_ms = delay.as_millis() as u64,
                                    "capture queue {queue} does not exist (404 NOT_FOUND on passive declare); retrying in {:.1} s",
                                    delay.as_secs_f64()
                                );
                            }
                            Err(error) => {
                                config.status.set_problem(&queue, Some(format!("capture session ended: {error}")));
                                store.metrics().capture_failed(&queue, CaptureFailure::Session);
                                isolating = consumed;
                                delay = delay_after_session(&mut backoff, started.elapsed());
                                warn!(%error, retry_in_ms = delay.as_millis() as u64, "capture session ended");
                            }
                        }
                    }
                    tokio::select! {
                        () = shutdown.cancelled() => break,
                        () = tokio::time::sleep(delay) => {}
                    }
                }
            }
            .instrument(span),
        );
    }
    while sessions.join_next().await.is_some() {}
}

/// The session's channel, for the round trip that proves an ack processed.
struct AckChannel {
    channel: lapin::Channel,
    prefetch: u16,
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
    consumed: &mut bool,
) -> Result<(), CaptureError> {
    // lapin connects through the guard (plain amqp://), which stops a
    // delivery lapin cannot read safely before lapin parses it.
    let uri: lapin::uri::AMQPUri = config
        .amqp_url
        .parse()
        .map_err(|error: String| CaptureError::Uri(error))?;
    let (guard, uri) = if config.guard && uri.scheme == lapin::uri::AMQPScheme::AMQP {
        let guard = guard::Guard::start(uri.authority.host.clone(), uri.authority.port)
            .await
            .map_err(|error| CaptureError::Uri(format!("capture guard: {error}")))?;
        let mut local = uri.clone();
        local.authority.host = guard.local.ip().to_string();
        local.authority.port = guard.local.port();
        (Some(guard), local)
    } else {
        (None, uri)
    };
    // Cancelled once the guard's relay ended: lapin was seen waiting on a
    // connection closed while it was being set up, so every wait of the
    // session also ends with the relay (never, unguarded).
    let lost = guard.as_ref().map(guard::Guard::ended).unwrap_or_default();
    let setup = async {
        let connection = Connection::connect_uri(uri, ConnectionProperties::default()).await?;
        // Does the queue exist? A passive declare on a channel of its own: a
        // 404 closes only that channel, and says plainly what is wrong (a
        // consume would fail the same way, less clearly).
        let probe = connection.create_channel().await?;
        match probe
            .queue_declare(
                queue.into(),
                QueueDeclareOptions {
                    passive: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
        {
            Ok(_) => {}
            Err(error) => {
                let missing = matches!(error.kind(), lapin::ErrorKind::ProtocolError(amqp) if amqp.get_id() == 404);
                let _ = connection.close(200, "capture queue missing".into()).await;
                return Err(if missing {
                    CaptureError::MissingQueue(queue.to_owned())
                } else {
                    error.into()
                });
            }
        }
        if is_stream(&probe, queue).await? {
            let _ = connection
                .close(200, "stream queues are not captured".into())
                .await;
            return Err(CaptureError::StreamQueue(queue.to_owned()));
        }
        let channel = connection.create_channel().await?;
        channel
            .basic_qos(config.prefetch, BasicQosOptions::default())
            .await?;
        let consumer_tag = format!("redrive-planner-{}", uuid::Uuid::new_v4());
        // From here deliveries may come (and the guard may end the
        // connection at one before lapin's reply reaches this task).
        *consumed = true;
        let consumer = channel
            .basic_consume(
                queue.into(),
                consumer_tag.as_str().into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await?;
        Ok::<_, CaptureError>((connection, channel, consumer))
    };
    let (connection, channel, mut consumer) = tokio::select! {
        // A setup that ended (a missing queue, a stream) says why first.
        biased;
        setup = setup => setup?,
        () = lost.cancelled() => return Err(CaptureError::ConnectionLost),
    };
    *consumed = true;
    config.status.set(queue, true);
    let session_id = uuid::Uuid::new_v4();
    info!(prefetch = config.prefetch, batch_size = config.batch_size, capture.session = %session_id, "capturing");

    // One batch queued while another is written: gathering overlaps the insert.
    let (batches, mut to_write) = mpsc::channel::<Batch>(1);
    let writer_store = store.clone();
    let writer_channel = AckChannel {
        channel: channel.clone(),
        prefetch: config.prefetch,
    };
    let writer_shutdown = shutdown.clone();
    let session_over = CancellationToken::new();
    let writer_session_over = session_over.clone();
    let source = queue.to_owned();
    let writer = tokio::spawn(
        async move {
            while let Some(batch) = to_write.recv().await {
                let written = write_batch(
                    &writer_store,
                    &writer_channel,
                    &source,
                    session_id,
                    batch,
                    &writer_shutdown,
                    &writer_session_over,
                )
                .await;
                if !written {
                    break;
                }
            }
        }
        .in_current_span(),
    );

    let outcome = gather(config, queue, &mut consumer, &batches, shutdown, &lost).await;
    drop(batches);
    if matches!(outcome, Err(CaptureError::StreamQueue(_))) {
        // Nothing of the stream was stored or acked; a stream keeps it.
        session_over.cancel();
        let _ = writer.await;
        let _ = connection
            .close(200, "stream queues are not captured".into())
            .await;
        return outcome;
    }
    if outcome.is_err() {
        // The channel is gone: its unacked deliveries come back redelivered to
        // the next session. Let a write in progress finish (commit or fail)
        // before reconnecting, so that the next session sees what it committed
        // and matches the redeliveries against it; do not retry it.
        session_over.cancel();
    }
    let _ = writer.await;
    if outcome.is_ok() {
        let _ = channel.close(200, "planner shutting down".into()).await;
        let _ = connection.close(200, "planner shutting down".into()).await;
    }
    outcome
}

/// Cuts batches from the consumer until shutdown (`Ok`), a broker failure
/// or the end of the guard's relay (`lost`).
async fn gather(
    config: &CaptureConfig,
    queue: &str,
    consumer: &mut lapin::Consumer,
    batches: &mpsc::Sender<Batch>,
    shutdown: &CancellationToken,
    lost: &CancellationToken,
) -> Result<(), CaptureError> {
    loop {
        let first = tokio::select! {
            () = shutdown.cancelled() => return Ok(()),
            () = lost.cancelled() => return Err(CaptureError::ConnectionLost),
            next = consumer.next() => next,
        };
        let Some(first) = first else {
            return Err(CaptureError::ConsumerEnded(queue.to_owned()));
        };
        let first = first?;
        if is_stream_delivery(&first) {
            return Err(CaptureError::StreamQueue(queue.to_owned()));
        }
        let mut deliveries = vec![first];
        let mut batch_bytes = deliveries[0].data.len();
        let deadline = tokio::time::Instant::now() + config.batch_wait;
        // Cut by count and by bytes: a backlog of large bodies is written
        // every few bodies, and PostgreSQL takes at most 1 GB in one value.
        while deliveries.len() < config.batch_size && batch_bytes < config.batch_bytes {
            tokio::select! {
                () = tokio::time::sleep_until(deadline) => break,
                () = lost.cancelled() => return Err(CaptureError::ConnectionLost),
                next = consumer.next() => match next {
                    Some(delivery) => {
                        let delivery = delivery?;
                        batch_bytes += delivery.data.len();
                        deliveries.push(delivery);
                    }
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

/// Whether `queue` is a stream, asked on `probe` (a channel of its own,
/// which this closes or the broker does). A consumer argument only streams
/// accept, [`STREAM_OFFSET_HEADER`] `next`: RabbitMQ refuses it on a
/// classic or quorum queue before any consumer exists (`406
/// PRECONDITION_FAILED - invalid arg 'x-stream-offset' for queue … of queue
/// type rabbit_classic_queue`, seen on RabbitMQ 3.10), so nothing is
/// delivered there; a stream accepts it, and a stream consumer at `next`
/// takes nothing away (a stream keeps its messages).
async fn is_stream(probe: &lapin::Channel, queue: &str) -> Result<bool, CaptureError> {
    probe.basic_qos(1, BasicQosOptions::default()).await?;
    let mut arguments = FieldTable::default();
    arguments.insert(
        STREAM_OFFSET_HEADER.into(),
        lapin::types::AMQPValue::LongString("next".into()),
    );
    let tag = format!("redrive-planner-probe-{}", uuid::Uuid::new_v4());
    match probe
        .basic_consume(
            queue.into(),
            tag.as_str().into(),
            BasicConsumeOptions::default(),
            arguments,
        )
        .await
    {
        // The caller closes the connection, and the probe with it.
        Ok(_) => Ok(true),
        Err(error) => {
            let refused_argument = matches!(
                error.kind(),
                lapin::ErrorKind::ProtocolError(amqp)
                    if amqp.get_id() == 406 && amqp.get_message().as_str().contains(STREAM_OFFSET_HEADER)
            );
            if refused_argument {
                Ok(false)
            } else {
                Err(error.into())
            }
        }
    }
}

/// Whether `delivery` came from a stream queue: it carries the
/// [`STREAM_OFFSET_HEADER`] as the 64-bit integer RabbitMQ writes.
fn is_stream_delivery(delivery: &Delivery) -> bool {
    delivery
        .properties
        .headers()
        .as_ref()
        .is_some_and(|headers| {
            headers.inner().iter().any(|(name, value)| {
                name.as_str() == STREAM_OFFSET_HEADER
                    && matches!(value, lapin::types::AMQPValue::LongLongInt(_))
            })
        })
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
        let headers = delivery
            .properties
            .headers()
            .as_ref()
            .map(amqp::table_from_amqp)
            .unwrap_or_default();
        let raw = RawDeadLetter::from_queue(
            queue,
            delivery.data.clone(),
            amqp::properties_from_amqp(&delivery.properties),
            headers,
            delivery.redelivered,
            captured_at,
        );
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

/// Why an unreadable message cannot be moved aside, byte for byte, to the
/// parking queue, if so.
fn unparkable(
    message: &raw::RawMessage,
    decoded: &raw::DecodedHeader,
    connection: &raw::RawConnection,
    parking: &str,
) -> Option<String> {
    if parking.len() > 255 {
        return Some(format!(
            "the parking queue name {parking:?} is over 255 bytes"
        ));
    }
    if message.header.len() + 8 > connection.frame_max() as usize {
        return Some(format!(
            "its header ({} bytes) is over the broker's frame_max ({}), which the broker enforces on publishers",
            message.header.len(),
            connection.frame_max()
        ));
    }
    if let Some(user) = decoded.properties.user_id.as_deref()
        && user != connection.username()
    {
        return Some(format!(
            "its user_id {user:?} is not the planner's broker user: RabbitMQ refuses such a publish (rabbitmq.com/docs/validated-user-id)"
        ));
    }
    if decoded.properties.expiration.is_some() {
        return Some("it carries an expiration: it would expire in the parking queue".to_owned());
    }
    None
}

/// Takes up to `prefetch` messages of `queue` one at a time with the fallback
/// reader: the messages a failed session held come back first, so the one
/// lapin could not read is among them. Returns how many were taken.
///
/// Each message is stored before it is acked, as in a session. A readable one
/// becomes an ordinary dead letter. One with problems ([`raw::DecodedHeader`])
/// is first moved to [`unreadable_queue`] byte for byte, over a connection
/// of its own (a fanout exchange and queue of that name; `mandatory`,
/// confirmed), then stored as a placeholder (reason class `unreadable`, a
/// capture note and a republish problem naming each problem and where the
/// message is, its exact content header in `raw_content_header`, body and
/// every readable field kept; its fingerprint also covers the problems,
/// which name the bytes the lossy fields do not tell apart), and then acked. One
/// that cannot be moved ([`unparkable`], or the move failed: no permission,
/// a parking queue declared otherwise) stays in the DLQ: it is left unacked
/// on this round's connection, which is kept in `held` (one per queue, reused
/// while it lives) so that the messages behind it are captured; it returns
/// to the queue when the planner stops or the broker ends the hold. A
/// failure leaves the message unacked: it returns to the queue, and its
/// stored copy absorbs the redelivery.
///
/// # Errors
/// [`raw::RawError`] from the broker, also when the connection ended as the
/// round did while it held messages (they are back in the queue);
/// [`raw::RawError::Unsupported`] when the fallback reader cannot be used
/// (`amqps://`).
async fn isolate(
    config: &CaptureConfig,
    queue: &str,
    store: &Store,
    shutdown: &CancellationToken,
    held: &mut Option<raw::RawConnection>,
) -> Result<usize, raw::RawError> {
    // Reuse the holding connection while it lives: what it holds stays held.
    let mut connection = match held.take() {
        Some(mut holding) => {
            if holding.is_alive() {
                holding
            } else {
                // The broker ended the hold: what it held is back in the queue.
                raw::RawConnection::connect(&config.amqp_url).await?
            }
        }
        None => raw::RawConnection::connect(&config.amqp_url).await?,
    };
    let session = uuid::Uuid::new_v4();
    let parking = unreadable_queue(queue);
    let mut parker: Option<raw::RawConnection> = None;
    let mut taken = 0;
    let outcome = async {
        while taken < usize::from(config.prefetch.max(1)) && !shutdown.is_cancelled() {
            let Some(message) = connection.get(queue).await? else {
                break;
            };
            taken += 1;
            let decoded = raw::decode_content_header(&message.header).unwrap_or_else(|error| {
                raw::DecodedHeader {
                    problems: vec![format!("content header unreadable: {error}")],
                    ..raw::DecodedHeader::default()
                }
            });
            let unreadable = !decoded.problems.is_empty();
            // Where an unreadable message ends up: `Ok` parked, `Err(why)` held.
            let parked = if unreadable {
                match unparkable(&message, &decoded, &connection, &parking) {
                    Some(why) => Err(why),
                    None => park(&config.amqp_url, &mut parker, &parking, &message)
                        .await
                        .map_err(|error| format!("moving it aside failed: {error}")),
                }
            } else {
                Ok(())
            };
            let raw_dead_letter = RawDeadLetter::from_queue(
                queue,
                message.body.clone(),
                decoded.properties.clone(),
                decoded.headers.clone(),
                message.redelivered,
                Utc::now(),
            );
            let mut dead_letter = extract(&config.rules, raw_dead_letter).await;
            if unreadable {
                let problems = decoded.problems.join("; ");
                let whereabouts = match &parked {
                    Ok(()) => format!("it was moved, byte for byte, to queue {parking}"),
                    Err(why) => format!(
                        "it cannot be moved aside ({why}), so it stays in this DLQ, held unacked by the planner while it runs; its exact bytes are kept here too"
                    ),
                };
                warn!(
                    source = queue,
                    %problems,
                    %whereabouts,
                    "a dead letter the AMQP client cannot read: captured as a placeholder"
                );
                dead_letter.reason_class = ReasonClass::Unreadable;
                dead_letter.body_problem = Some(format!(
                    "the AMQP client cannot read it ({problems}); {whereabouts}"
                ));
                dead_letter.capture_notes.push(format!(
                    "unreadable by the AMQP client: {problems}; shown lossily; {whereabouts}"
                ));
                dead_letter.raw_content_header = Some(message.header.clone());
                // Lossy fields do not tell two unreadable messages apart; the
                // problems name the exact bytes (the raw header itself would
                // change with a quorum queue's x-delivery-count).
                let mut hasher = Sha256::new();
                hasher.update(dead_letter.fingerprint);
                hasher.update(problems.as_bytes());
                dead_letter.fingerprint = hasher.finalize().into();
            }
            let batch_ids = loop {
                match store_batch(store, session, queue, std::slice::from_ref(&dead_letter)).await
                {
                    Ok((ids, _)) => break ids,
                    Err(error) => {
                        warn!(%error, "storing a dead letter failed; nothing acked");
                        tokio::select! {
                            () = shutdown.cancelled() => return Ok(()),
                            () = tokio::time::sleep(Duration::from_secs(1)) => {}
                        }
                    }
                }
            };
            if unreadable {
                let how = if parked.is_ok() {
                    Quarantine::Parked
                } else {
                    Quarantine::Held
                };
                store.metrics().quarantined(queue, how);
            }
            if parked.is_err() {
                // Held: left unacked on this connection.
                continue;
            }
            connection.ack(message.delivery_tag).await?;
            // As in a session: the ack is recorded once a reply behind it
            // proves the broker processed it.
            connection.sync().await?;
            for batch_id in batch_ids {
                if let Err(error) = store.mark_capture_acked(batch_id).await {
                    warn!(%error, batch_id, "could not record the ack of a capture batch");
                }
            }
        }
        Ok::<(), raw::RawError>(())
    }
    .await;
    if let Some(parker) = parker {
        parker.close().await;
    }
    // After a failure everything goes back to the queue (the next round
    // holds again what must be held); otherwise the held messages stay held.
    let holding = connection.unacked() > 0;
    if outcome.is_ok() && holding && connection.is_alive() {
        *held = Some(connection);
        return Ok(taken);
    }
    connection.close().await;
    outcome?;
    if holding {
        // The connection ended as the round did: what it held is back in the
        // queue, and a session would meet it first. A failure, so that the
        // next round takes messages one at a time again.
        return Err(raw::RawError::Io(std::io::Error::new(
            std::io::ErrorKind::ConnectionAborted,
            "the connection holding unparkable messages ended; they are back in the queue",
        )));
    }
    Ok(taken)
}

/// Moves `message` byte for byte to the parking exchange and queue `parking`
/// over `parker` (connected and declared on first use; dropped on any
/// failure, so a channel the broker closed is not reused).
///
/// # Errors
/// Why it was not moved: connection, declaration (permissions, a queue of
/// that name declared with other arguments), a nack, or unroutable.
async fn park(
    url: &str,
    parker: &mut Option<raw::RawConnection>,
    parking: &str,
    message: &raw::RawMessage,
) -> Result<(), raw::RawError> {
    let mut connection = match parker.take() {
        Some(connection) => connection,
        None => {
            let mut connection = raw::RawConnection::connect(url).await?;
            connection.declare_parking(parking).await?;
            connection
        }
    };
    if !connection
        .publish(parking, b"", &message.header, &message.body)
        .await?
    {
        return Err(raw::RawError::Protocol(format!(
            "the broker did not take it into {parking} (nacked, or unroutable: is the queue bound?)"
        )));
    }
    *parker = Some(connection);
    Ok(())
}

/// Stores `batch` (retrying while PostgreSQL is unavailable), acks it, then
/// records the ack. Returns false when it gave up because of shutdown or the
/// end of the session (the batch stays unacked and returns to the queue).
async fn write_batch(
    store: &Store,
    channel: &AckChannel,
    source: &str,
    session: uuid::Uuid,
    batch: Batch,
    shutdown: &CancellationToken,
    session_over: &CancellationToken,
) -> bool {
    let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
    loop {
        let span = info_span!(
            "planner.capture.batch",
            messaging.system = "rabbitmq",
            messaging.operation.type = "process",
            messaging.destination.name = %source,
            messaging.batch.message_count = batch.dead_letters.len(),
        );
        match store_batch(store, session, source, &batch.dead_letters)
            .instrument(span)
            .await
        {
            Ok((batch_ids, outcome)) => {
                let redead = batch
                    .dead_letters
                    .iter()
                    .filter(|dead_letter| dead_letter.redrive_plan_id.is_some())
                    .count();
                if outcome.already_stored == 0 {
                    store.metrics().captured(
                        source,
                        batch
                            .dead_letters
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
                if let Err(error) = batch
                    .last
                    .acker
                    .ack(BasicAckOptions { multiple: true })
                    .await
                {
                    // Stored but not acked: the broker redelivers them to the next
                    // session, which matches them against this unacked batch.
                    warn!(%error, "ack after commit failed");
                    return true;
                }
                // basic.ack has no reply, and a connection that dies right
                // after it (lapin drops frames it had not written) leaves the
                // broker to redeliver. A synchronous method behind it on the
                // same channel proves the broker processed the ack (frames of
                // a channel are handled in order, AMQP 0-9-1 §2.3.6); only
                // then is the batch recorded as acked.
                // (basic.qos with the session's own prefetch: a local reply.)
                let sync = channel
                    .channel
                    .basic_qos(channel.prefetch, BasicQosOptions::default())
                    .await;
                if let Err(error) = sync {
                    warn!(%error, "the ack after commit is unconfirmed; the batch stays open for redeliveries");
                    return true;
                }
                for batch_id in batch_ids {
                    if let Err(error) = store.mark_capture_acked(batch_id).await {
                        warn!(%error, batch_id, "could not record the ack of a capture batch");
                    }
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

/// Stores a captured batch; when PostgreSQL refuses it for its content (not
/// because it is unreachable), stores the dead letters one by one, each refused
/// one degraded to what is always storable ([`NewDeadLetter::degraded`]), so
/// that one odd message never stalls its queue.
///
/// # Errors
/// Retryable store errors (PostgreSQL unreachable), or a degraded dead letter
/// refused too.
async fn store_batch(
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A queue whose connection dropped every few hours reconnected up to
    /// 10 s late ever after: the delay never went back down.
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

    #[test]
    fn a_healthy_session_starts_the_backoff_over() {
        let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(10));
        let failing: Vec<Duration> = (0..8)
            .map(|_| delay_after_session(&mut backoff, Duration::from_millis(50)))
            .collect();
        assert!(
            failing[7] >= Duration::from_secs(5),
            "failing sessions back off: {failing:?}"
        );
        let after_healthy = delay_after_session(&mut backoff, HEALTHY_SESSION);
        assert!(
            after_healthy < Duration::from_millis(500),
            "{after_healthy:?}"
        );
    }
}
