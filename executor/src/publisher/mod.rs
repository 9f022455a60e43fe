//! Publishing replayed messages with publisher confirms and a confirm window
//! (docs/design.md, "Executor loop and guarantees").
//!
//! A [`Publisher`] owns one AMQP connection and one channel in confirm mode.
//! [`Publisher::publish`] sends a message with `mandatory = true` and returns
//! at once with a [`Pending`] that resolves to the message's
//! [`PublishOutcome`] when the broker confirms it; up to `window` messages are
//! in flight at a time, so replay speed is not one round trip per message
//! (docs/benchmarks.md: ~1,000 msg/s one at a time, 5,600–8,200 with 256 in
//! flight on the local broker).
//!
//! # What counts as sent
//! Only a broker `basic.ack` for a message that was not returned with
//! `basic.return` is [`PublishOutcome::Sent`] (RabbitMQ "Publisher Confirms":
//! an unroutable mandatory message is returned, then acked). A returned
//! message is [`PublishOutcome::Unroutable`], a `basic.nack` is
//! [`PublishOutcome::Nacked`], and a message whose confirm never came because
//! the channel or connection closed is [`PublishOutcome::Uncertain`]: it may
//! or may not have been enqueued, so the caller publishes it again with the
//! same message id. A message whose frames were never all written to the
//! connection is [`PublishOutcome::NotPublished`]: the broker cannot have it.
//!
//! # When a publish returns
//! lapin's `basic_publish` takes the message's delivery tag and queues its
//! frames for lapin's io thread, then waits until that thread has written
//! them to the socket. Waiting for that write for every message costs the
//! executor two thread switches and a socket write per message
//! (docs/benchmarks.md, "The executor's publish and lapin's io thread"), so
//! by default ([`Handoff::Queued`]) a publish returns once its frames are
//! queued, and the write is awaited with the confirm: a write that then
//! fails makes it [`PublishOutcome::NotPublished`].
//! [`Handoff::Written`] returns only after the write, and a failed write is
//! then [`PublishError::ConnectionLost`] at once: for callers that must
//! publish a message again before any later one (an ordered plan).
//!
//! # Matching returns to messages
//! lapin hands a received `basic.return` to whichever confirm of the next ack
//! frame it completes first; when the broker acks several messages with one
//! `multiple` ack, that can be a different message from the returned one. The
//! publisher therefore does not trust that pairing: confirms are resolved in
//! delivery-tag order, and a return is matched to its message by content
//! (exchange, routing key, message id and body). lapin completes the
//! confirms of one `multiple` ack one at a time, in no set order, on its
//! own thread, so before a batch of outcomes is reported the return of
//! every confirm already resolved, also of later messages, is taken into
//! the pool: RabbitMQ sends a message's return before its ack, so the
//! confirm carrying it is resolved by the time the message's is. A return
//! that cannot be matched makes the rest of its batch
//! [`PublishOutcome::Uncertain`] rather than risk a false `Sent`. Identical
//! messages in flight together (same exchange, routing key, message id and
//! body: the same dead letter twice) are interchangeable: a return may be
//! matched to either of them, and the audit then says which one was
//! returned, never that both were delivered.
//! The price is that outcomes are delivered in publish order: a slow confirm
//! holds back the outcomes of later messages (not their publishing).

use std::{
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use lapin::{
    BasicProperties, Channel, Connection, ConnectionProperties, options::ConfirmSelectOptions,
};
use tokio::{
    sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot},
    task::JoinHandle,
    time::Instant,
};

mod confirms;
mod publish;

use confirms::{PublishRequest, Shared, publish_requests, resolve_confirms};
pub use publish::{AmqpConnect, Connect, Publish};

/// How long [`Publisher::connect`] waits for the broker.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// The AMQP heartbeat asked for unless the URL names one (`?heartbeat=N`):
/// a connection that receives nothing for two heartbeats is closed (AMQP
/// 0-9-1 section 4.2.7, RabbitMQ "Detecting Dead TCP Connections with
/// Heartbeats"), so a half-open connection is noticed on both sides.
pub const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(5);
/// How long the oldest publish may wait for its confirm before the
/// connection is taken for dead. A healthy broker confirms within
/// milliseconds; a stalled connection would otherwise hold a window of
/// messages until the kernel gives up on the socket.
///
/// It counts from the message's write, as the confirm task sees it (before
/// it is written, from when it is first in lapin's queue: only its own
/// write is waited for), and starts over while the broker has blocked the
/// connection (`connection.blocked`, RabbitMQ "Blocked Connection
/// Notifications": a resource alarm, during which the broker reads
/// nothing). When it passes,
/// every publish in flight that was written is
/// [`PublishOutcome::Uncertain`]; one lapin still holds is waited for one
/// more timeout: [`PublishOutcome::NotPublished`] if lapin fails its write
/// (the connection ended), else uncertain.
pub const DEFAULT_CONFIRM_TIMEOUT: Duration = Duration::from_secs(5);

/// How a [`Publisher`] connects and how long it waits.
#[derive(Debug, Clone, Copy)]
pub struct PublisherOptions {
    /// Messages in flight at once (published, not yet confirmed); at least 1.
    pub window: usize,
    /// See [`DEFAULT_CONFIRM_TIMEOUT`].
    pub confirm_timeout: Duration,
    /// See [`DEFAULT_HEARTBEAT`]; whole seconds, used when the URL names none.
    pub heartbeat: Duration,
}

impl PublisherOptions {
    /// The defaults with a window of `window`.
    pub fn with_window(window: usize) -> Self {
        Self {
            window,
            confirm_timeout: DEFAULT_CONFIRM_TIMEOUT,
            heartbeat: DEFAULT_HEARTBEAT,
        }
    }
}

/// `amqp_url` with `heartbeat` added when it names none.
pub fn with_heartbeat(amqp_url: &str, heartbeat: Duration) -> String {
    if amqp_url.contains("heartbeat=") {
        return amqp_url.to_owned();
    }
    let separator = if amqp_url.contains('?') { '&' } else { '?' };
    format!(
        "{amqp_url}{separator}heartbeat={}",
        heartbeat.as_secs().max(1)
    )
}

/// One message to publish.
///
/// `properties` are sent as given: a replay must be persistent, so the caller
/// sets `delivery_mode` 2 (and the message id, headers, ... of docs/design.md "The
/// replayed message"); the publisher adds nothing.
#[derive(Debug, Clone)]
pub struct Outgoing {
    /// Exchange name; `""` is the default exchange (routing key = queue name).
    pub exchange: String,
    /// Routing key.
    pub routing_key: String,
    /// Body bytes, unchanged from the dead letter.
    pub body: Vec<u8>,
    /// AMQP properties and headers.
    pub properties: BasicProperties,
}

/// When [`Publisher::publish_in`] returns (module docs, "When a publish
/// returns").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Handoff {
    /// Once lapin took the message's delivery tag and queued its frames;
    /// a write that fails later resolves its [`Pending`] to
    /// [`PublishOutcome::NotPublished`].
    #[default]
    Queued,
    /// Once its frames are written to the socket; a write that fails is
    /// [`PublishError::ConnectionLost`] (on TLS: its [`Pending`] is
    /// [`PublishOutcome::Uncertain`]), and every message published after it
    /// is refused too, so it can be published again before them.
    Written,
}

/// What the broker said about one published message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PublishOutcome {
    /// Acked and not returned: the broker has taken responsibility for it
    /// (for a persistent message to a durable queue, written to disk). The
    /// only outcome after which a message may be marked sent.
    Sent {
        /// From the start of the publish to its confirm.
        latency: Duration,
    },
    /// Returned by the broker (`basic.return` of a `mandatory` publish): no
    /// queue was bound for it, nothing was delivered.
    Unroutable {
        /// AMQP reply code of the return (312 `NO_ROUTE`).
        reply_code: u16,
        /// The broker's reply text.
        reply_text: String,
    },
    /// Negatively acknowledged by the broker (an internal error in the queue
    /// process, or a queue overflow with `reject-publish`): not enqueued.
    Nacked,
    /// No confirm came: the channel or connection closed first (for example
    /// the broker closed the channel with 404 because the exchange does not
    /// exist, or the connection dropped). The message may or may not be
    /// enqueued; publish it again with the same message id.
    Uncertain {
        /// Why no confirm came.
        reason: String,
    },
    /// Its frames were not all written to the socket: lapin failed them
    /// because the connection failed first (only after a
    /// [`Handoff::Queued`] publish). The broker cannot have it: a message
    /// is complete only once its content header and every body frame
    /// arrived (AMQP 0-9-1 section 4.2.6, "Content Framing"). Publish it
    /// again, as the same attempt. On a TLS connection a write that fails
    /// with an I/O error may have sent part of what it was given: such a
    /// message is [`PublishOutcome::Uncertain`] there.
    NotPublished {
        /// Why the write failed, as lapin said it.
        reason: String,
    },
}

impl PublishOutcome {
    /// Whether this is [`PublishOutcome::Sent`].
    pub fn is_sent(&self) -> bool {
        matches!(self, Self::Sent { .. })
    }
}

/// Why a publish could not even be attempted.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    /// The broker could not be reached, or refused the connection or confirm
    /// mode.
    #[error("cannot connect to the broker: {reason}")]
    Connect {
        /// What failed.
        reason: String,
    },
    /// The connection or the channel is closed (dropped, or closed by the
    /// broker, e.g. 404 after a publish to an exchange that does not exist).
    /// The message was not published; connect a new [`Publisher`] and
    /// publish it again.
    #[error("the broker connection is lost: {reason}")]
    ConnectionLost {
        /// Why, as the broker or lapin said it.
        reason: String,
    },
    /// The window must allow at least one message in flight.
    #[error("invalid confirm window {0}: must be at least 1")]
    InvalidWindow(usize),
    /// Its `not_after` passed before the publishing task got to it: not
    /// published.
    #[error("not published: its time to be published had passed")]
    Expired,
}

impl PublishError {
    /// Whether trying again (with a new connection) can help:
    /// [`PublishError::Connect`] and [`PublishError::ConnectionLost`].
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::Connect { .. } | Self::ConnectionLost { .. })
    }
}

/// A published message whose confirm is outstanding. Await it (it is a
/// future), or call [`Pending::outcome`]. Dropping it does not cancel the
/// publish, and the message keeps its place in the window until confirmed.
#[derive(Debug)]
pub struct Pending {
    outcome: oneshot::Receiver<PublishOutcome>,
}

impl Pending {
    /// A pending outcome that a test (or a fake publisher) resolves through
    /// the returned sender; dropping the sender resolves it
    /// [`PublishOutcome::Uncertain`].
    #[cfg(test)]
    pub(crate) fn fake() -> (oneshot::Sender<PublishOutcome>, Self) {
        let (sender, outcome) = oneshot::channel();
        (sender, Self { outcome })
    }

    /// A pending outcome that is already `outcome`.
    pub(crate) fn ready(outcome: PublishOutcome) -> Self {
        let (sender, outcome_received) = oneshot::channel();
        let _ = sender.send(outcome);
        Self {
            outcome: outcome_received,
        }
    }

    /// The broker's answer for this message.
    pub async fn outcome(self) -> PublishOutcome {
        self.await
    }
}

impl Future for Pending {
    type Output = PublishOutcome;

    fn poll(mut self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<PublishOutcome> {
        Pin::new(&mut self.outcome).poll(context).map(|received| {
            received.unwrap_or_else(|_| PublishOutcome::Uncertain {
                reason: "the publisher stopped before the confirm came".to_owned(),
            })
        })
    }
}

/// A reserved place in the confirm window ([`Publisher::reserve`]): a
/// publish made with it does not wait for the window. Dropping it frees the
/// place.
#[derive(Debug)]
pub struct Slot {
    permit: OwnedSemaphorePermit,
}

impl Slot {
    /// A slot of a fake publisher's own window (tests).
    #[cfg(test)]
    pub(crate) fn fake(permit: OwnedSemaphorePermit) -> Self {
        Self { permit }
    }
}

/// Publishes with confirms on one connection and channel; see the module
/// docs for the rules.
pub struct Publisher {
    connection: Connection,
    channel: Channel,
    window: Arc<Semaphore>,
    window_size: usize,
    requests: Option<mpsc::Sender<PublishRequest>>,
    shared: Arc<Shared>,
    publishing_task: Option<JoinHandle<()>>,
    confirming_task: Option<JoinHandle<()>>,
}

impl Publisher {
    /// Connects to `amqp_url` (`amqp://user:pass@host:port/vhost`), opens a
    /// channel and puts it in confirm mode (`confirm.select`). At most
    /// `window` messages are in flight (published, not yet confirmed).
    ///
    /// # Errors
    /// [`PublishError::InvalidWindow`] when `window` is 0;
    /// [`PublishError::Connect`] (retryable) when the broker is unreachable
    /// within [`CONNECT_TIMEOUT`] or refuses.
    #[tracing::instrument(name = "executor.publisher.connect", skip_all, fields(window = window), err(level = "debug"))]
    pub async fn connect(amqp_url: &str, window: usize) -> Result<Self, PublishError> {
        Self::connect_with(amqp_url, PublisherOptions::with_window(window)).await
    }

    /// [`Publisher::connect`] with every option: the heartbeat is added to
    /// the URL when it names none, and a confirm that takes longer than
    /// `confirm_timeout` takes the connection for dead (see
    /// [`DEFAULT_CONFIRM_TIMEOUT`] for what its publishes become).
    ///
    /// # Errors
    /// As [`Publisher::connect`].
    pub async fn connect_with(
        amqp_url: &str,
        options: PublisherOptions,
    ) -> Result<Self, PublishError> {
        let window = options.window;
        if window == 0 {
            return Err(PublishError::InvalidWindow(window));
        }
        let amqp_url = with_heartbeat(amqp_url, options.heartbeat);
        let properties =
            ConnectionProperties::default().with_connection_name("redrive-executor".into());
        let connect = async {
            let connection = Connection::connect(&amqp_url, properties).await?;
            let channel = connection.create_channel().await?;
            channel
                .confirm_select(ConfirmSelectOptions::default())
                .await?;
            Ok::<_, lapin::Error>((connection, channel))
        };
        let (connection, channel) = match tokio::time::timeout(CONNECT_TIMEOUT, connect).await {
            Ok(Ok(opened)) => opened,
            Ok(Err(error)) => {
                return Err(PublishError::Connect {
                    reason: error.to_string(),
                });
            }
            Err(_) => {
                return Err(PublishError::Connect {
                    reason: format!("no answer within {CONNECT_TIMEOUT:?}"),
                });
            }
        };
        let tls = amqp_url
            .get(..8)
            .is_some_and(|scheme| scheme.eq_ignore_ascii_case("amqps://"));
        let shared = Arc::new(Shared::new(window, tls, Some(connection.status().clone())));
        let (requests, requests_received) = mpsc::channel(window);
        let publishing_task = tokio::spawn(publish_requests(
            channel.clone(),
            Arc::clone(&shared),
            requests_received,
        ));
        let confirming_task = tokio::spawn(resolve_confirms(
            Arc::clone(&shared),
            options.confirm_timeout,
        ));
        Ok(Self {
            connection,
            channel,
            window: Arc::new(Semaphore::new(window)),
            window_size: window,
            requests: Some(requests),
            shared,
            publishing_task: Some(publishing_task),
            confirming_task: Some(confirming_task),
        })
    }

    /// Publishes `outgoing` with `mandatory = true` once a window slot is
    /// free, and returns once lapin has queued it ([`Handoff::Queued`]),
    /// without waiting for its confirm. Messages are published in call order.
    ///
    /// Cancel-safe in the sense that matters: once the message is handed to
    /// the publishing task it is published and tracked even if this future is
    /// dropped (its outcome is then lost to the caller, as for any message
    /// whose [`Pending`] is dropped).
    ///
    /// # Errors
    /// [`PublishError::ConnectionLost`] (retryable) when the connection or
    /// channel is closed: the message was not published.
    pub async fn publish(&self, outgoing: Outgoing) -> Result<Pending, PublishError> {
        self.publish_with(outgoing, Handoff::Queued).await
    }

    /// [`Publisher::publish`], returning as `handoff` says.
    ///
    /// # Errors
    /// As [`Publisher::publish`].
    pub async fn publish_with(
        &self,
        outgoing: Outgoing,
        handoff: Handoff,
    ) -> Result<Pending, PublishError> {
        let mut slots = self.reserve(1).await?;
        let slot = slots.pop().ok_or_else(|| PublishError::ConnectionLost {
            reason: "the publisher is closed".to_owned(),
        })?;
        self.publish_in(slot, outgoing, None, handoff).await
    }

    /// Waits until `count` places of the window are free and reserves them
    /// (at most the window; a larger `count` is cut to it). Cancel-safe:
    /// dropped while waiting, it reserves nothing. Lets a caller wait for
    /// room *before* it takes tokens from the rate limiter, so that tokens
    /// are spent the moment they are granted.
    ///
    /// # Errors
    /// [`PublishError::ConnectionLost`] when the publisher is closed or the
    /// connection is lost.
    pub async fn reserve(&self, count: usize) -> Result<Vec<Slot>, PublishError> {
        let count = count.clamp(1, self.window_size);
        let permits = Arc::clone(&self.window)
            .acquire_many_owned(u32::try_from(count).unwrap_or(u32::MAX))
            .await
            .map_err(|_| PublishError::ConnectionLost {
                reason: "the publisher is closed".to_owned(),
            })?;
        if !self.is_connected() {
            return Err(PublishError::ConnectionLost {
                reason: self.disconnect_reason(),
            });
        }
        let mut permits = permits;
        let mut slots = Vec::with_capacity(count);
        while permits.num_permits() > 1 {
            if let Some(one) = permits.split(1) {
                slots.push(Slot { permit: one });
            }
        }
        slots.push(Slot { permit: permits });
        Ok(slots)
    }

    /// Publishes `outgoing` in a reserved `slot` (see [`Publisher::publish`]);
    /// does not wait for the window, and returns as `handoff` says. With
    /// `not_after`, the publishing task refuses it ([`PublishError::Expired`])
    /// when it gets to it at or after that instant, and any request once the
    /// connection was declared dead.
    ///
    /// # Errors
    /// As [`Publisher::publish`]; [`PublishError::Expired`].
    pub async fn publish_in(
        &self,
        slot: Slot,
        outgoing: Outgoing,
        not_after: Option<Instant>,
        handoff: Handoff,
    ) -> Result<Pending, PublishError> {
        let lost = |reason: &str| PublishError::ConnectionLost {
            reason: reason.to_owned(),
        };
        let requests = self
            .requests
            .as_ref()
            .ok_or_else(|| lost("the publisher is closed"))?;
        if !self.is_connected() {
            return Err(PublishError::ConnectionLost {
                reason: self.disconnect_reason(),
            });
        }
        let (reply, replied) = oneshot::channel();
        requests
            .send(PublishRequest {
                outgoing,
                permit: slot.permit,
                not_after,
                handoff,
                reply,
            })
            .await
            .map_err(|_| lost("the publishing task stopped"))?;
        replied
            .await
            .map_err(|_| lost("the publishing task stopped"))?
    }

    /// How long the oldest publish in flight has waited for its confirm
    /// (`None` when nothing is in flight). A healthy broker answers within
    /// milliseconds; a long wait means a stalled connection or broker.
    pub fn oldest_unconfirmed_age(&self) -> Option<Duration> {
        self.shared
            .awaiting_since
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .map(|since| since.elapsed())
    }

    /// Whether the connection and the channel are open. After `false`, every
    /// publish fails with [`PublishError::ConnectionLost`]; connect a new
    /// publisher.
    pub fn is_connected(&self) -> bool {
        !self.shared.dead.load(std::sync::atomic::Ordering::SeqCst)
            && self.connection.status().connected()
            && self.channel.status().connected()
    }

    /// Window slots taken: messages being published or awaiting their
    /// confirm (at most the window).
    pub fn in_flight(&self) -> usize {
        self.window_size - self.window.available_permits()
    }

    fn disconnect_reason(&self) -> String {
        self.shared
            .last_error
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
            .unwrap_or_else(|| "the connection or the channel is closed".to_owned())
    }

    /// Stops publishing, waits until every outstanding message has its
    /// outcome (confirmed; uncertain or not published if the connection
    /// drops or stalls meanwhile; while the broker blocks the connection,
    /// not before it unblocks it),
    /// then closes the channel and the connection. Bound it with a timeout
    /// if the broker may hang.
    ///
    /// # Errors
    /// None in practice: a connection that is already closed is fine.
    pub async fn close(mut self) -> Result<(), PublishError> {
        self.requests = None;
        if let Some(task) = self.publishing_task.take() {
            let _ = task.await;
        }
        self.shared.publishing_done.cancel();
        if let Some(task) = self.confirming_task.take() {
            let _ = task.await;
        }
        if self.channel.status().connected() {
            let _ = self.channel.close(200, "OK".into()).await;
        }
        if self.connection.status().connected() {
            let _ = self.connection.close(200, "OK".into()).await;
        }
        Ok(())
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        // Outstanding confirms still resolve (their Pendings get outcomes);
        // the tasks end when the queue is empty, and lapin closes the
        // connection when its last handle is dropped.
        self.shared.publishing_done.cancel();
    }
}
