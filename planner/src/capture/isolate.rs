//! Taking messages one at a time with the fallback reader ([`super::raw`])
//! after a session lapin could not finish: [`isolate`] stores each one,
//! moves an unreadable one aside to its parking queue ([`park`]) or holds it
//! unacked when it cannot be moved ([`unparkable`]).

use std::time::Duration;

use chrono::Utc;
use redrive_proto::v1::ReasonClass;
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;
use tracing::warn;

use super::{
    CaptureConfig, raw, unreadable_queue,
    write::{Storer, count_stored},
};
use crate::{
    dead_letters::{NewDeadLetter, RawDeadLetter, extract},
    metrics::Quarantine,
    store::Store,
};

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

/// How long in all a round finds the queue empty, waiting for the messages
/// an ended session held to be back in it, before it believes it is empty.
/// A round runs after a session that reached `basic.consume` ended (or a
/// hold ended): after one that held nothing (a blip on an idle DLQ)
/// or whose messages another consumer took, the wait delays consuming
/// again by this much; nothing is lost meanwhile (new dead letters are
/// taken one at a time).
const RETURN_WAIT: Duration = Duration::from_secs(10);

/// How long a round's connection may take to connect and log in, as a
/// session's setup may.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How often it looks meanwhile.
const RETURN_POLL: Duration = Duration::from_millis(100);

/// What one round of [`isolate`] did.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Isolated {
    /// Messages taken from the queue.
    pub taken: usize,
    /// Of them, unreadable ones moved aside or held.
    pub quarantined: usize,
}

/// Takes the messages of `queue` a failed session held one at a time with
/// the fallback reader: they come back first (`redelivered`), the one
/// lapin could not read among them; each is taken here, so that none is
/// returned a second time, and the fresh ones behind them are consumed
/// again by a session ([`Round::take_messages`]). Returns how many were
/// taken and how many of them were unreadable.
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
/// Until a redelivered message was taken (the broker returns what the
/// ended session held once it notices the close), an empty queue is
/// believed only after [`RETURN_WAIT`] ([`Round::take_messages`]).
///
/// # Errors
/// [`raw::RawError`] from the broker, also when the connection ended as the
/// round did while it held messages (they are back in the queue);
/// [`raw::RawError::Unsupported`] when the fallback reader cannot be used
/// (`amqps://`).
pub(super) async fn isolate(
    config: &CaptureConfig,
    queue: &str,
    store: &Store,
    shutdown: &CancellationToken,
    held: &mut Option<raw::RawConnection>,
    expecting_returns: bool,
) -> Result<Isolated, raw::RawError> {
    // Reuse the holding connection while it lives: what it holds stays held.
    let mut connection = match held.take() {
        Some(mut holding) => {
            if holding.is_alive() {
                holding
            } else {
                // The broker ended the hold: what it held is back in the queue.
                connect_raw(config, expecting_returns).await?
            }
        }
        None => connect_raw(config, expecting_returns).await?,
    };
    let mut round = Round {
        config,
        queue,
        store,
        shutdown,
        session: uuid::Uuid::new_v4(),
        parking: unreadable_queue(queue),
        parker: None,
        readable: Vec::new(),
        readable_bytes: 0,
        expecting_returns,
    };
    let mut taken = Isolated::default();
    let outcome = round.take_messages(&mut connection, &mut taken).await;
    if let Some(parker) = round.parker {
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

/// One round of [`isolate`] on `queue`.
struct Round<'a> {
    config: &'a CaptureConfig,
    queue: &'a str,
    store: &'a Store,
    shutdown: &'a CancellationToken,
    /// The capture session the round's dead letters are recorded with.
    session: uuid::Uuid,
    /// Where unreadable messages are moved ([`unreadable_queue`]).
    parking: String,
    /// The connection that moves them ([`park`]), opened on first use.
    parker: Option<raw::RawConnection>,
    /// Readable messages taken and not yet stored, with their delivery
    /// tags: stored together, at most [`STORED_TOGETHER`] ([`Round::flush`]).
    readable: Vec<(u64, NewDeadLetter)>,
    /// The bodies' bytes in `readable`.
    readable_bytes: usize,
    /// A session of this planner that held messages ended: the broker is
    /// returning them, maybe late. Otherwise (the planner's first round)
    /// only the returned messages already at the head of the queue are
    /// taken, without waiting.
    expecting_returns: bool,
}

/// How many readable messages a round stores in one statement and acks
/// behind one round trip, at most (and at most `--capture-batch-size` and
/// `--capture-batch-bytes` of bodies): one at a time, each message cost a
/// store, an ack and a round trip.
const STORED_TOGETHER: usize = 100;

impl Round<'_> {
    /// Takes messages on `connection`, counting them in `taken`: every
    /// message the broker returned (`redelivered`), then the first fresh
    /// one behind them; at most `prefetch` (at least one) once the returns
    /// began, or an empty queue, or shutdown.
    ///
    /// The broker returns what the ended session held (`redelivered` set)
    /// once it has seen the connection close, which may come after this
    /// round's first `basic.get` (a quorum queue returns them through its
    /// log). A session started before would be handed them again, a second
    /// return: with a delivery limit of 1 the broker drops them all. So
    /// until a redelivered message was taken, an empty queue is believed
    /// only once it was found empty for [`RETURN_WAIT`] in all (polled every
    /// [`RETURN_POLL`]; what was taken is stored first), and new dead
    /// letters taken meanwhile do not count against `prefetch` for the
    /// first [`RETURN_WAIT`] of the round (a busy DLQ would end the round
    /// before the returns).
    async fn take_messages(
        &mut self,
        connection: &mut raw::RawConnection,
        taken: &mut Isolated,
    ) -> Result<(), raw::RawError> {
        let started = tokio::time::Instant::now();
        // Time spent finding the queue empty before the returns came.
        let mut waited = Duration::ZERO;
        let mut returned = false;
        let mut counted = 0_usize;
        while counted < usize::from(self.config.prefetch.max(1)) && !self.shutdown.is_cancelled() {
            let Some(message) = connection.get(self.queue).await? else {
                // What was taken is stored before waiting.
                if !self.flush(connection).await? {
                    break;
                }
                if self.expecting_returns && !returned && waited < RETURN_WAIT {
                    tokio::select! {
                        () = self.shutdown.cancelled() => break,
                        () = tokio::time::sleep(RETURN_POLL) => {
                            waited += RETURN_POLL;
                            continue;
                        }
                    }
                }
                break;
            };
            // Fresh after the returned ones, or at the head of the queue
            // when no returns are on their way: the returns are all taken.
            let fresh_after_returns = (returned || !self.expecting_returns) && !message.redelivered;
            returned |= message.redelivered;
            taken.taken += 1;
            if returned || !self.expecting_returns || started.elapsed() >= RETURN_WAIT {
                counted += 1;
            }
            if !self
                .take(connection, &message, &mut taken.quarantined)
                .await?
            {
                break;
            }
            // Every returned message is taken here, past unreadable ones
            // too: a session would be handed it again, and the next
            // unreadable one among them would return it a second time
            // (dropped at a delivery limit of 1; RabbitMQ 4 sets 20 on
            // every quorum queue). The fresh ones behind them are
            // consumed at a session's pace.
            if fresh_after_returns {
                break;
            }
        }
        self.flush(connection).await?;
        Ok(())
    }

    /// Stores the readable messages taken so far in one statement, then acks
    /// each (not `multiple`: the connection may hold an unparkable message
    /// with a lower tag) behind one round trip. `Ok(false)`: shutdown came
    /// before they were stored (they stay unacked and return to the queue).
    async fn flush(&mut self, connection: &mut raw::RawConnection) -> Result<bool, raw::RawError> {
        if self.readable.is_empty() {
            return Ok(true);
        }
        let (tags, dead_letters): (Vec<u64>, Vec<NewDeadLetter>) =
            std::mem::take(&mut self.readable).into_iter().unzip();
        self.readable_bytes = 0;
        let Some(batch_ids) = self.store(&dead_letters).await else {
            return Ok(false);
        };
        for tag in tags {
            connection.ack(tag).await?;
        }
        // As in a session: the acks are recorded once a reply behind them
        // proves the broker processed them.
        connection.sync().await?;
        for batch_id in batch_ids {
            if let Err(error) = self.store.mark_capture_acked(batch_id).await {
                warn!(%error, batch_id, "could not record the ack of a capture batch");
            }
        }
        Ok(true)
    }

    /// Takes `message`: a readable one joins those stored together
    /// ([`Round::flush`]); an unreadable one, after those before it are
    /// stored, is parked first, stored as a placeholder and acked, or left
    /// held unacked on `connection` when it cannot be moved, and counted in
    /// `quarantined` once stored. `Ok(false)`: shutdown came before it was
    /// stored (it stays unacked).
    async fn take(
        &mut self,
        connection: &mut raw::RawConnection,
        message: &raw::RawMessage,
        quarantined: &mut usize,
    ) -> Result<bool, raw::RawError> {
        let decoded = raw::decode_content_header(&message.header).unwrap_or_else(|error| {
            raw::DecodedHeader {
                problems: vec![format!("content header unreadable: {error}")],
                ..raw::DecodedHeader::default()
            }
        });
        let unreadable = !decoded.problems.is_empty();
        // The readable ones before it are stored first, in queue order, and
        // before it is moved aside: a failure after the move would leave it
        // unacked, moved again by the next round.
        if unreadable && !self.flush(connection).await? {
            return Ok(false);
        }
        // Where an unreadable message ends up: `Ok` parked, `Err(why)` held.
        let parked = if unreadable {
            match unparkable(message, &decoded, connection, &self.parking) {
                Some(why) => Err(why),
                None => park(
                    // Beside the round's connection, on its node.
                    &self.config.amqp.current().url,
                    &mut self.parker,
                    &self.parking,
                    message,
                )
                .await
                .map_err(|error| format!("moving it aside failed: {error}")),
            }
        } else {
            Ok(())
        };
        let raw_dead_letter = RawDeadLetter::from_queue(
            self.queue,
            message.body.clone(),
            decoded.properties.clone(),
            decoded.headers.clone(),
            message.redelivered,
            Utc::now(),
        );
        let mut dead_letter = extract(&self.config.rules, raw_dead_letter).await;
        if !unreadable {
            self.readable_bytes += message.body.len();
            self.readable.push((message.delivery_tag, dead_letter));
            let full = self.readable.len() >= STORED_TOGETHER.min(self.config.batch_size.max(1))
                || self.readable_bytes >= self.config.batch_bytes;
            if full {
                return self.flush(connection).await;
            }
            return Ok(true);
        }
        self.placeholder(&mut dead_letter, message, &decoded.problems, &parked);
        let Some(batch_ids) = self.store(std::slice::from_ref(&dead_letter)).await else {
            return Ok(false);
        };
        let how = if parked.is_ok() {
            Quarantine::Parked
        } else {
            Quarantine::Held
        };
        self.store.metrics().quarantined(self.queue, how);
        *quarantined += 1;
        if parked.is_err() {
            // Held: left unacked on this connection.
            return Ok(true);
        }
        connection.ack(message.delivery_tag).await?;
        // As in a session: the ack is recorded once a reply behind it
        // proves the broker processed it.
        connection.sync().await?;
        for batch_id in batch_ids {
            if let Err(error) = self.store.mark_capture_acked(batch_id).await {
                warn!(%error, batch_id, "could not record the ack of a capture batch");
            }
        }
        Ok(true)
    }

    /// Makes `dead_letter` the placeholder of unreadable `message`: reason
    /// class `unreadable`, a republish problem and a capture note naming its
    /// `problems` and where it is (`parked`: moved aside, or why it is held),
    /// its exact content header, and a fingerprint that covers the problems.
    fn placeholder(
        &self,
        dead_letter: &mut NewDeadLetter,
        message: &raw::RawMessage,
        problems: &[String],
        parked: &Result<(), String>,
    ) {
        let problems = problems.join("; ");
        let parking = &self.parking;
        let whereabouts = match parked {
            Ok(()) => format!("it was moved, byte for byte, to queue {parking}"),
            Err(why) => format!(
                "it cannot be moved aside ({why}), so it stays in this DLQ, held unacked by the planner while it runs; its exact bytes are kept here too"
            ),
        };
        warn!(
            source = self.queue,
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

    /// Stores `dead_letters` in one statement under ids taken ahead, as a
    /// session's batch is ([`Storer`]: a retry after a lost commit reply, or
    /// after the one-by-one fallback stopped part way, finds what an earlier
    /// attempt committed), retrying while PostgreSQL fails, counts them as a
    /// session's batch is ([`count_stored`]) and returns their capture
    /// batches; `None` on shutdown (nothing stored).
    async fn store(&self, dead_letters: &[NewDeadLetter]) -> Option<Vec<i64>> {
        let storer = Storer {
            store: self.store.clone(),
            source: self.queue.to_owned(),
            session: self.session,
            shutdown: self.shutdown.clone(),
            session_over: CancellationToken::new(),
        };
        let ids = storer
            .retry(|| self.store.take_capture_ids(dead_letters.len()))
            .await?;
        let (batch_ids, outcome) = storer.store_under(dead_letters, &ids, false).await?;
        count_stored(self.store, self.queue, dead_letters, &outcome);
        Some(batch_ids)
    }
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

/// A raw connection to the next of the broker's nodes
/// ([`CaptureConfig::amqp`]), or to the current one unless `advance`, the
/// node reached logged.
///
/// # Errors
/// The node refused or could not be reached.
async fn connect_raw(
    config: &CaptureConfig,
    advance: bool,
) -> Result<raw::RawConnection, raw::RawError> {
    // A round after a session moves on to the next node as a session
    // would; the planner's first round stays where its first session goes.
    let node = if advance {
        config.amqp.next()
    } else {
        config.amqp.current()
    };
    // Named: the line of a failed round says which node it could not reach
    // or that refused it. A URL this client cannot use is said as it is
    // (the round falls back to consuming on it).
    // A broker (or a path to it) that takes the connection and never
    // answers would hold the round, and capture, for ever.
    let connecting = tokio::time::timeout(CONNECT_TIMEOUT, raw::RawConnection::connect(&node.url));
    let connection = connecting
        .await
        .unwrap_or_else(|_| {
            Err(raw::RawError::Io(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!(
                    "no answer within {} s (connecting and logging in)",
                    CONNECT_TIMEOUT.as_secs()
                ),
            )))
        })
        .map_err(|error| match error {
            unsupported @ raw::RawError::Unsupported(_) => unsupported,
            other => raw::RawError::AtNode {
                node: node.to_string(),
                source: Box::new(other),
            },
        })?;
    tracing::info!(broker.node = %node, "connected to the broker to take messages one at a time");
    Ok(connection)
}
