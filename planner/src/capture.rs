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
//!   frame over `frame_max`): the guard ([`guard`]) ends the connection
//!   before lapin reads it, and the broker requeues every message the
//!   session held; they come back first. That is no failure (no backoff, no
//!   capture error counted): at once, the next
//!   round takes the messages the broker returned (`redelivered`) one at a
//!   time with the fallback reader ([`raw`], `basic.get`, no prefetch), so
//!   that none is returned a second time (a quorum queue's
//!   `x-delivery-limit` counts returns); readable ones are stored and
//!   acked as usual, an unreadable one is stored as a placeholder
//!   ([`ReasonClass::Unreadable`](redrive_proto::v1::ReasonClass::Unreadable),
//!   `invalid` at precheck) and moved aside,
//!   byte for byte, to `<queue>.unreadable`, then acked, or held unacked in
//!   the DLQ when it cannot be moved. Then the session resumes with its
//!   prefetch (docs/design.md, "Messages the client cannot read").
//! - A planner stopped or killed in the middle of such a round leaves
//!   returned messages at the head of the queue: before its first session
//!   a planner takes the returned ones there one at a time, without
//!   waiting, so that no session of its own returns them a second time.
//!
//! - `session.rs`: one connection's worth of consuming a queue (the guard,
//!   the queue checks, gathering batches).
//! - `write.rs`: storing a session's batches, acking them after the commit.
//! - `isolate.rs`: taking messages one at a time with the fallback reader,
//!   parking or holding the unreadable ones.
//! - `status.rs`: [`CaptureStatus`], which queues have a consumer (readiness).

pub mod guard;
pub mod ingest;
pub mod ingest_budget;
mod isolate;
pub mod raw;
mod session;
mod status;
mod write;

use std::{sync::Arc, time::Duration};

use redrive_proto::{amqp_nodes::AmqpNodes, backoff::Backoff};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info, info_span, warn};

pub use self::status::CaptureStatus;
use self::{isolate::isolate, session::session};
use crate::{dead_letters::ExtractionRules, metrics::CaptureFailure, store::Store};

/// How often capture reads its queue's depth (a passive `queue.declare` on a
/// channel of its own): for the overview (`ListSources`) and the
/// `redrive.planner.source.depth` gauge.
pub const DEPTH_INTERVAL: Duration = Duration::from_secs(5);

/// Default of `--capture-batch-bytes`: a batch is written once its bodies
/// reach this many bytes, whatever its count.
pub const DEFAULT_BATCH_BYTES: usize = 64 * 1024 * 1024;

/// Largest `--capture-batch-bytes`: a batch's bodies go to PostgreSQL in one
/// array value, and PostgreSQL takes at most 1 GB in one value.
pub const MAX_BATCH_BYTES: usize = 256 * 1024 * 1024;

/// How capture runs.
#[derive(Debug, Clone)]
pub struct CaptureConfig {
    /// The broker's node URLs. Each session and each one-at-a-time round
    /// connects to the next node ([`AmqpNodes::next`]): after a session
    /// that could not connect or was lost, the next one goes to another
    /// node. Each queue goes round them on its own ([`run`] clones it).
    pub amqp: AmqpNodes,
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
    /// The longest reconnect delay after a failed session
    /// (`--capture-reconnect-max-ms`).
    pub reconnect_max: Duration,
    /// How dead letters are read.
    pub rules: Arc<ExtractionRules>,
    /// lapin connects through [`guard`] (plain `amqp://` only). Always on in
    /// service; off only to measure its cost.
    pub guard: bool,
    /// Where each queue's consumer says whether it is connected (readiness).
    pub status: CaptureStatus,
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
    /// closed) while lapin was still waiting on it; a session returns it
    /// as [`CaptureError::Connection`].
    #[error("the connection to the broker ended")]
    ConnectionLost,
    /// The broker `node` (`host:port (node i of n)`) could not be reached,
    /// or the connection to it failed or ended, for `reason` (the
    /// client's error, or the guard's when it could not reach the node).
    #[error("broker {node}: {reason}")]
    Connection {
        /// The node, without credentials.
        node: String,
        /// What failed.
        reason: String,
    },
    /// The session's writer stopped before the session did (a batch it
    /// could not store; the log says why): the session ends unacked, and
    /// the next one takes its messages again.
    #[error("the capture writer stopped: a batch could not be stored")]
    WriterStopped,
    /// The capture guard closed the connection at a delivery lapin cannot
    /// read safely (the problems named, or a frame over `frame_max`): not a
    /// failure, the next round takes the messages one at a time at once.
    #[error("a delivery the AMQP client cannot read: {0}")]
    Unreadable(String),
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
/// its own with backoff (0.2 s doubling to `reconnect_max`, 10 s by default, plus up to as much again of
/// jitter; from 0.2 s again after a session that had run for
/// [`HEALTHY_SESSION`]); after a session that failed while consuming, and
/// whenever the connection holding unparkable messages has ended, the
/// messages back in the queue are first taken one at a time (`isolate`).
/// A session the guard ended at an unreadable delivery
/// ([`CaptureError::Unreadable`]) is not a failure: the messages are taken
/// one at a time at once, and once that round has taken messages (the
/// stopped one among them) the backoff starts over, so a queue with many
/// unreadable messages is not slowed down by them. A round that took
/// nothing (the queue empty) or could not run (the fallback reader refused)
/// waits the next delay, so the guard and the round never spin.
pub async fn run(config: CaptureConfig, store: Store, shutdown: CancellationToken) {
    let mut sessions = tokio::task::JoinSet::new();
    for queue in config.queues.clone() {
        let config = config.clone();
        let store = store.clone();
        let shutdown = shutdown.clone();
        let span = info_span!("planner.capture", queue = %queue);
        sessions.spawn(
            async move {
                let mut backoff = Backoff::new(Duration::from_millis(200), config.reconnect_max);
                let mut delay;
                // The first round, before the first session, takes one at
                // a time what an earlier planner's session left returned at
                // the head of the queue (stopped or killed mid-round): a
                // session would be handed it again.
                let mut isolating = true;
                // The round follows a session of this planner that held
                // messages: the broker is returning them.
                let mut expecting_returns = false;
                // The last session ended at a delivery the guard stopped.
                let mut stopped_at_unreadable = false;
                // The connection holding unreadable messages that could not
                // be moved aside, unacked.
                let mut held: Option<raw::RawConnection> = None;
                // The round about to run follows a session end already
                // counted as a capture error (a deleted queue ends the
                // session first: one deletion, one count).
                let mut end_counted = false;
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
                        expecting_returns = true;
                        end_counted = false;
                    }
                    if isolating {
                        let after_unreadable = stopped_at_unreadable;
                        let expected = std::mem::replace(&mut expecting_returns, false);
                        match isolate(&config, &queue, &store, &shutdown, &mut held, expected).await {
                            Ok(round) if after_unreadable && round.taken == 0 => {
                                isolating = false;
                                stopped_at_unreadable = false;
                                delay = backoff.next_delay();
                                warn!(retry_in_ms = delay.as_millis() as u64, "the guard stopped a delivery, but no message was left to take one at a time; consuming again after a delay");
                            }
                            Ok(round) => {
                                if round.taken > 0 {
                                    info!(taken = round.taken, quarantined = round.quarantined, "messages returned by an ended session taken one at a time; consuming again");
                                }
                                // The backoff goes on after a failure: only
                                // a session that ran for a while starts it
                                // over. An unreadable message dealt with was
                                // no failure.
                                if after_unreadable {
                                    backoff.reset();
                                }
                                isolating = false;
                                stopped_at_unreadable = false;
                                continue;
                            }
                            Err(error) if !expected => {
                                // Looking for returns before the first
                                // session: the session says what is wrong
                                // (a missing queue, an unreachable broker)
                                // and counts it.
                                debug!(%error, "could not look for returned messages one at a time; consuming");
                                isolating = false;
                                continue;
                            }
                            Err(raw::RawError::Unsupported(why)) if after_unreadable => {
                                // The session would meet the same message
                                // at once: wait, as after a failure.
                                isolating = false;
                                stopped_at_unreadable = false;
                                delay = backoff.next_delay();
                                warn!(%why, retry_in_ms = delay.as_millis() as u64, "cannot take messages one at a time; consuming again after a delay");
                            }
                            Err(raw::RawError::Unsupported(why)) => {
                                warn!(%why, "cannot take messages one at a time; consuming again");
                                isolating = false;
                                continue;
                            }
                            Err(raw::RawError::Closed { code: 404, text, .. }) => {
                                // The queue was deleted (a session's
                                // consumer ended with it): nothing is held
                                // in it, so the next round consumes, and
                                // its passive declare says the same.
                                isolating = false;
                                stopped_at_unreadable = false;
                                delay = backoff.next_delay();
                                missing_queue(&config, &store, &queue, "basic.get", Some(&text), delay, !end_counted);
                            }
                            Err(error) => {
                                // The next round still expects the returns.
                                expecting_returns = true;
                                delay = backoff.next_delay();
                                warn!(%error, retry_in_ms = delay.as_millis() as u64, "{}", with_refusal_advice("taking messages one at a time failed", &error));
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
                            Err(CaptureError::Unreadable(why)) => {
                                // Known and handled: no error counted, no
                                // delay; the round takes them at once.
                                info!(%why, "the guard stopped a delivery the AMQP client cannot read; taking messages one at a time");
                                config.status.set_problem(&queue, Some(format!("taking messages one at a time after a delivery the AMQP client cannot read: {why}")));
                                isolating = true;
                                expecting_returns = true;
                                stopped_at_unreadable = true;
                                end_counted = false;
                                continue;
                            }
                            Err(CaptureError::MissingQueue(_)) => {
                                delay = delay_after_session(&mut backoff, started.elapsed());
                                missing_queue(&config, &store, &queue, "passive declare", None, delay, true);
                            }
                            Err(error) => {
                                config.status.set_problem(&queue, Some(format!("capture session ended: {error}")));
                                store.metrics().capture_failed(&queue, CaptureFailure::Session);
                                isolating = consumed;
                                expecting_returns = consumed;
                                end_counted = true;
                                delay = delay_after_session(&mut backoff, started.elapsed());
                                warn!(%error, retry_in_ms = delay.as_millis() as u64, "{}", with_refusal_advice("capture session ended", &error));
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

/// `what`, then, when `error` is a refusal by the broker that will not mend
/// by itself, what to check ([`redrive_proto::amqp_nodes::refusal_advice`]).
fn with_refusal_advice(what: &str, error: &dyn std::fmt::Display) -> String {
    match redrive_proto::amqp_nodes::refusal_advice(&error.to_string()) {
        Some(advice) => format!("{what}: {advice}"),
        None => what.to_owned(),
    }
}

/// Counts, shows and logs that `queue` was not found (a typo in
/// `--capture-queue`, not declared yet, or deleted while captured): the
/// broker answered `on` (a passive `queue.declare`, a `basic.get`) with 404
/// NOT_FOUND (AMQP 0-9-1 §1.7.2.1), saying `why` when its text is known
/// (RabbitMQ also answers 404 for a durable queue whose home node is down);
/// the next try comes after `delay`. `count`: a capture error not counted
/// yet (a session that ended as the queue was deleted counted it).
fn missing_queue(
    config: &CaptureConfig,
    store: &Store,
    queue: &str,
    on: &str,
    why: Option<&str>,
    delay: Duration,
    count: bool,
) {
    if count {
        store
            .metrics()
            .capture_failed(queue, CaptureFailure::Session);
    }
    let said = match why {
        Some(why) => format!("does not exist (404 NOT_FOUND on {on}: {why})"),
        None => format!("does not exist (404 NOT_FOUND on {on})"),
    };
    config.status.set_problem(queue, Some(said.clone()));
    warn!(
        retry_in_ms = delay.as_millis() as u64,
        "capture queue {queue} {said}; retrying in {:.1} s",
        delay.as_secs_f64()
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A queue whose connection dropped every few hours reconnected up to
    /// 10 s late ever after: the delay never went back down.
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
