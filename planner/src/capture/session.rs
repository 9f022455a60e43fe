//! One connection's worth of consuming a queue: [`session`] connects through
//! the guard, checks that the queue can be captured, consumes it and cuts
//! batches ([`gather`]) for the writer ([`super::write`]).

use std::sync::Arc;

use chrono::Utc;
use futures::StreamExt;
use lapin::{
    Connection, ConnectionProperties,
    message::Delivery,
    options::{BasicConsumeOptions, BasicQosOptions, QueueDeclareOptions},
    types::FieldTable,
    uri::AMQPUri,
};
use redrive_proto::{amqp, amqp_nodes::AmqpNode};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, info, warn};

use super::{
    CaptureConfig, CaptureError, STREAM_OFFSET_HEADER, guard,
    write::{AckChannel, Batch, BatchWriter},
};
use crate::{
    dead_letters::{ExtractionRules, RawDeadLetter, extract},
    store::Store,
};

/// One connection's worth of consuming `queue`. `Ok` on shutdown;
/// [`CaptureError::Unreadable`] when the guard stopped a delivery lapin
/// cannot read, whatever lapin made of the closed connection.
pub(super) async fn session(
    config: &CaptureConfig,
    queue: &str,
    store: &Store,
    shutdown: &CancellationToken,
    consumed: &mut bool,
) -> Result<(), CaptureError> {
    let (guard, uri, node) = through_guard(config).await?;
    // Cancelled once the guard's relay ended: lapin was seen waiting on a
    // connection closed while it was being set up, so every wait of the
    // session also ends with the relay (never, unguarded).
    let lost = guard.as_ref().map(guard::Guard::ended).unwrap_or_default();
    let named = node.to_string();
    let outcome = consume_queue(config, queue, store, shutdown, consumed, (uri, node), &lost).await;
    // A lost connection after the guard's stop was the stop; any other
    // failure (the writer's) says itself. A connection that failed names
    // the node, and says so when the guard could not reach it (lapin only
    // saw the guard's local socket close).
    match (outcome, guard.as_ref().and_then(guard::Guard::stopped_for)) {
        (
            Err(
                CaptureError::ConnectionLost
                | CaptureError::Broker(_)
                | CaptureError::ConsumerEnded(_),
            ),
            Some(why),
        ) => Err(CaptureError::Unreadable(why)),
        (Err(error @ (CaptureError::ConnectionLost | CaptureError::Broker(_))), None) => {
            let reason = match guard.as_ref().and_then(guard::Guard::unreachable) {
                Some(unreachable) => unreachable,
                None => match error {
                    CaptureError::Broker(error) => error.to_string(),
                    other => other.to_string(),
                },
            };
            Err(CaptureError::Connection {
                node: named,
                reason,
            })
        }
        (outcome, _) => outcome,
    }
}

/// How long a session's setup (TCP, AMQP handshake and login, the queue's
/// checks, `basic.consume`) may take before the broker counts as not
/// answering: as long as the executor's connect.
const SETUP_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// [`session`] on a connection to `uri` (of `node`), ending when `lost` is
/// cancelled, when the setup takes longer than [`SETUP_TIMEOUT`], or, while
/// it is set up, at `shutdown`.
async fn consume_queue(
    config: &CaptureConfig,
    queue: &str,
    store: &Store,
    shutdown: &CancellationToken,
    consumed: &mut bool,
    (uri, node): (AMQPUri, AmqpNode),
    lost: &CancellationToken,
) -> Result<(), CaptureError> {
    let (connection, channel, mut consumer, depth_probe) = tokio::select! {
        // A setup that ended (a missing queue, a stream) says why first.
        biased;
        setup = consume(config, queue, uri, consumed) => setup?,
        () = lost.cancelled() => return Err(CaptureError::ConnectionLost),
        // A broker (or a path to it) that takes the connection and never
        // answers: lapin would wait for ever, saying nothing.
        () = tokio::time::sleep(SETUP_TIMEOUT) => {
            return Err(CaptureError::Connection {
                node: node.to_string(),
                reason: format!(
                    "no answer within {} s (connecting, logging in and checking the queue)",
                    SETUP_TIMEOUT.as_secs()
                ),
            });
        }
        () = shutdown.cancelled() => return Ok(()),
    };
    *consumed = true;
    config.status.set(queue, true);
    let session_id = uuid::Uuid::new_v4();
    info!(prefetch = config.prefetch, batch_size = config.batch_size, capture.session = %session_id, broker.node = %node, "capturing");

    // One batch queued while another is written: gathering overlaps the insert.
    let (batches, to_write) = mpsc::channel::<Batch>(1);
    let session_over = CancellationToken::new();
    let writer = BatchWriter {
        store: store.clone(),
        channel: AckChannel {
            channel: channel.clone(),
            prefetch: config.prefetch,
        },
        source: queue.to_owned(),
        session: session_id,
        shutdown: shutdown.clone(),
        session_over: session_over.clone(),
    };
    let writer = tokio::spawn(writer.run(to_write).in_current_span());

    let depth = tokio::spawn(
        read_depth(
            depth_probe,
            queue.to_owned(),
            config.status.clone(),
            session_over.clone(),
        )
        .in_current_span(),
    );
    let outcome = gather(config, queue, &mut consumer, &batches, shutdown, lost).await;
    depth.abort();
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

/// The URI for lapin of the broker's next node ([`CaptureConfig::amqp`]:
/// after a session that failed or was lost, another node), the guard it goes
/// through, and the node: lapin connects through the guard (plain amqp://),
/// which stops a delivery lapin cannot read safely before lapin parses it.
/// No guard when it is off or the URI is `amqps://`.
async fn through_guard(
    config: &CaptureConfig,
) -> Result<(Option<guard::Guard>, AMQPUri, AmqpNode), CaptureError> {
    let node = config.amqp.next();
    let uri: AMQPUri = node
        .url
        .parse()
        .map_err(|error: String| CaptureError::Uri(error))?;
    if !(config.guard && uri.scheme == lapin::uri::AMQPScheme::AMQP) {
        return Ok((None, uri, node));
    }
    let guard = guard::Guard::start(
        uri.authority.host.clone(),
        uri.authority.port,
        uri.query.frame_max.unwrap_or_default(),
    )
    .await
    .map_err(|error| CaptureError::Uri(format!("capture guard: {error}")))?;
    let mut local = uri.clone();
    local.authority.host = guard.local.ip().to_string();
    local.authority.port = guard.local.port();
    Ok((Some(guard), local, node))
}

/// Connects to `uri`, checks that `queue` can be captured ([`check_queue`])
/// and consumes it with the configured prefetch. `consumed` is set once
/// deliveries may come. Also returns a channel of its own for
/// [`read_depth`], opened here so that the session's setup is the only
/// wait the guard's end must cut.
async fn consume(
    config: &CaptureConfig,
    queue: &str,
    uri: AMQPUri,
    consumed: &mut bool,
) -> Result<(Connection, lapin::Channel, lapin::Consumer, lapin::Channel), CaptureError> {
    let connection = Connection::connect_uri(uri, ConnectionProperties::default()).await?;
    check_queue(&connection, queue).await?;
    let depth_probe = connection.create_channel().await?;
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
    Ok((connection, channel, consumer, depth_probe))
}

/// Whether `queue` can be captured: it exists and is not a stream. Asked on
/// a channel of its own; closes `connection` when it cannot.
///
/// # Errors
/// [`CaptureError::MissingQueue`], [`CaptureError::StreamQueue`], or the
/// broker's failure.
async fn check_queue(connection: &Connection, queue: &str) -> Result<(), CaptureError> {
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
    Ok(())
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
            // A connection lost as shutdown came is lost: the writer's
            // waits on it end with the session (`session_over`).
            biased;
            () = lost.cancelled() => return Err(CaptureError::ConnectionLost),
            () = shutdown.cancelled() => return Ok(()),
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
        // The writer may be waiting on the lost connection (an ack lapin
        // never finishes) with the queue to it full: the session ends with
        // the connection, and the writer's waits with the session.
        let sent = tokio::select! {
            sent = batches.send(batch) => sent,
            () = lost.cancelled() => return Err(CaptureError::ConnectionLost),
        };
        if sent.is_err() {
            // The writer gave a batch up: on shutdown while PostgreSQL was
            // down, or when its task failed (the session ends, unacked, and
            // the next one takes the messages again).
            return if shutdown.is_cancelled() {
                Ok(())
            } else {
                Err(CaptureError::WriterStopped)
            };
        }
    }
}

/// Reads `queue`'s depth with a passive declare on `probe` (a channel of its
/// own) every [`super::DEPTH_INTERVAL`] into `status`, until `over` or the channel
/// fails (the session's end then says why).
async fn read_depth(
    probe: lapin::Channel,
    queue: String,
    status: super::CaptureStatus,
    over: CancellationToken,
) {
    let mut every = tokio::time::interval(super::DEPTH_INTERVAL);
    loop {
        tokio::select! {
            () = over.cancelled() => return,
            _ = every.tick() => {}
        }
        let declared = probe
            .queue_declare(
                queue.as_str().into(),
                QueueDeclareOptions {
                    passive: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await;
        match declared {
            Ok(declared) => status.set_depth(&queue, u64::from(declared.message_count())),
            Err(_) => return,
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
