//! The publisher's two tasks: one publishes requests in order, one resolves
//! confirms in delivery-tag order and matches returns to their messages
//! (see the [`super`] docs, "Matching returns to messages").

use std::{
    collections::VecDeque,
    hash::{DefaultHasher, Hash, Hasher},
    pin::Pin,
    sync::{Arc, OnceLock},
    task::{Context, Poll, Waker},
    time::Duration,
};

use lapin::{
    BasicProperties, Channel, Confirmation, ConnectionStatus, ErrorKind,
    message::BasicReturnMessage, options::BasicPublishOptions,
};
use tokio::{
    sync::{Mutex, Notify, OwnedSemaphorePermit, mpsc, oneshot},
    time::Instant,
};
use tokio_util::sync::CancellationToken;
use tracing::warn;

use super::{Handoff, Outgoing, Pending, PublishError, PublishOutcome};

/// What became of a message handed to lapin.
// Kept in place in its window slot, as lapin's `Confirmation` (which holds
// a return inline) was before, rather than one more allocation per message.
#[allow(clippy::large_enum_variant)]
pub(super) enum Settled {
    /// lapin failed its frames before they were all written to the socket:
    /// the connection failed first (or was already closed). On a plain TCP
    /// connection the broker cannot have it: lapin counts a frame written
    /// only once the socket took its last byte, and a message is complete
    /// only once its content header and every body frame arrived (AMQP
    /// 0-9-1 section 4.2.6). See [`Shared::partial_writes`] for TLS.
    Unwritten(lapin::Error),
    /// Written; then its confirm's result.
    Confirmed(lapin::Result<Confirmation>),
}

/// A message's write, then its confirm: lapin's `basic_publish`, then its
/// [`lapin::PublisherConfirm`] (a test's own future). It sets its
/// [`WrittenAt`] once the write is done.
type Confirm = Pin<Box<dyn Future<Output = Settled> + Send>>;

/// When the message's frames were all written to the socket; unset until
/// then.
type WrittenAt = Arc<OnceLock<Instant>>;

/// A message handed to the broker, awaiting its confirm.
pub(super) struct InFlight {
    confirm: Confirm,
    written_at: WrittenAt,
    /// The confirm's result, once seen resolved while an earlier message's
    /// was still awaited (its return taken into the pool already).
    resolved: Option<Settled>,
    fingerprint: u64,
    published_at: Instant,
    outcome: oneshot::Sender<PublishOutcome>,
    /// Frees the window slot when the confirm is resolved, not when the
    /// caller drops its [`Pending`].
    _permit: OwnedSemaphorePermit,
}

pub(super) struct PublishRequest {
    pub(super) outgoing: Outgoing,
    pub(super) permit: OwnedSemaphorePermit,
    /// Not published at or after this instant (a stop, a lease deadline, a
    /// token grown old while the request waited).
    pub(super) not_after: Option<Instant>,
    pub(super) handoff: Handoff,
    pub(super) reply: oneshot::Sender<Result<Pending, PublishError>>,
}

/// What the publisher and its tasks share.
pub(super) struct Shared {
    /// In delivery-tag order. The publishing task holds the lock from before
    /// `basic_publish` registers a tag until the entry is pushed, so whoever
    /// holds the lock sees every tag the channel has handed out.
    pub(super) in_flight: Mutex<VecDeque<InFlight>>,
    pub(super) pushed: Notify,
    /// Cancelled when no more messages will be published.
    pub(super) publishing_done: CancellationToken,
    /// The last error lapin reported, to say why the connection is lost.
    pub(super) last_error: std::sync::Mutex<Option<String>>,
    /// When the publish whose confirm is awaited now was made (the oldest
    /// in flight); `None` while none is awaited.
    pub(super) awaiting_since: std::sync::Mutex<Option<Instant>>,
    /// Set when the confirm timeout declared the connection dead, or a
    /// write failed ([`Shared::unwritten`]).
    pub(super) dead: std::sync::atomic::AtomicBool,
    /// The connection is TLS (`amqps`). A TLS stream takes plaintext in
    /// records and may fail a write call after some of its records reached
    /// the socket (futures-rustls `poll_write`), and lapin then fails every
    /// frame of that call with the I/O error: a message it reports unwritten
    /// for an I/O error may be at the broker, so it is
    /// [`PublishOutcome::Uncertain`] here, never
    /// [`PublishOutcome::NotPublished`].
    pub(super) partial_writes: bool,
    /// The connection's status (`None` in unit tests): whether the broker
    /// has blocked it.
    pub(super) connection: Option<ConnectionStatus>,
    /// When the broker's block was last seen on ([`await_oldest`]): no
    /// confirm timeout counts from before it.
    pub(super) blocked_seen: std::sync::Mutex<Option<Instant>>,
}

impl Shared {
    /// What the tasks of a publisher with a confirm window of `window`
    /// share, on a connection whose status is `connection` (`None` in unit
    /// tests); `partial_writes` for TLS ([`Shared::partial_writes`]).
    pub(super) fn new(
        window: usize,
        partial_writes: bool,
        connection: Option<ConnectionStatus>,
    ) -> Self {
        Self {
            in_flight: Mutex::new(VecDeque::with_capacity(window)),
            pushed: Notify::new(),
            publishing_done: CancellationToken::new(),
            last_error: std::sync::Mutex::new(None),
            awaiting_since: std::sync::Mutex::new(None),
            dead: std::sync::atomic::AtomicBool::new(false),
            partial_writes,
            connection,
            blocked_seen: std::sync::Mutex::new(None),
        }
    }

    /// The outcome of a message lapin reports unwritten ([`Settled`]):
    /// [`PublishOutcome::NotPublished`], or on TLS after an I/O error
    /// [`PublishOutcome::Uncertain`] ([`Shared::partial_writes`]). A write
    /// fails only once the connection or the channel is broken: nothing
    /// more is published on it ([`Shared::dead`]).
    fn unwritten(&self, error: &lapin::Error) -> PublishOutcome {
        let reason = self.record_error(error);
        self.dead.store(true, std::sync::atomic::Ordering::SeqCst);
        // lapin reports an I/O error seen while its runtime shuts down as
        // `RuntimeShutdownError`: the same write failure.
        let io = matches!(
            error.kind(),
            ErrorKind::IOError(_) | ErrorKind::RuntimeShutdownError(_)
        );
        if self.partial_writes && io {
            PublishOutcome::Uncertain {
                reason: format!("{reason} (a TLS write that failed may have sent part of it)"),
            }
        } else {
            PublishOutcome::NotPublished { reason }
        }
    }

    /// Whether the broker has blocked the connection (`connection.blocked`,
    /// RabbitMQ "Blocked Connection Notifications": a resource alarm). It
    /// then reads nothing from it, so no confirm can come and none is
    /// overdue.
    fn broker_blocked(&self) -> bool {
        let blocked = self
            .connection
            .as_ref()
            .is_some_and(ConnectionStatus::blocked);
        if blocked {
            *self
                .blocked_seen
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(Instant::now());
        }
        blocked
    }

    /// The later of `since` and when the broker's block was last seen on.
    fn after_block(&self, since: Instant) -> Instant {
        self.blocked_seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .map_or(since, |seen| seen.max(since))
    }

    pub(super) fn record_error(&self, error: &lapin::Error) -> String {
        let reason = error.to_string();
        *self
            .last_error
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(reason.clone());
        reason
    }
}

/// The hash a returned message is matched by. Identical messages (same
/// destination, id and body) share it, and are interchangeable.
fn fingerprint(
    exchange: &str,
    routing_key: &str,
    body: &[u8],
    properties: &BasicProperties,
) -> u64 {
    let mut hasher = DefaultHasher::new();
    exchange.hash(&mut hasher);
    routing_key.hash(&mut hasher);
    properties
        .message_id()
        .as_ref()
        .map(lapin::types::ShortString::as_str)
        .hash(&mut hasher);
    body.hash(&mut hasher);
    hasher.finish()
}

fn returned_fingerprint(returned: &BasicReturnMessage) -> u64 {
    fingerprint(
        returned.delivery.exchange.as_str(),
        returned.delivery.routing_key.as_str(),
        &returned.delivery.data,
        &returned.delivery.properties,
    )
}

/// Publishes requests one at a time, in order, keeping `in_flight` complete
/// (see [`Shared::in_flight`]). Runs in its own task so that a caller dropping
/// [`Publisher::publish`] cannot leave a tag the confirm task does not know.
///
/// lapin's `basic_publish` takes the message's delivery tag and queues its
/// frames for its io thread when first polled, then waits until the io
/// thread has written them. With [`Handoff::Queued`] the request is
/// answered after that first poll, and the write is awaited by the confirm
/// task, before the confirm ([`Settled`]); with [`Handoff::Written`], after
/// the write. The first poll happens under the `in_flight` lock, so the
/// tags stay in order either way.
pub(super) async fn publish_requests(
    channel: Channel,
    shared: Arc<Shared>,
    mut requests: mpsc::Receiver<PublishRequest>,
) {
    while let Some(request) = requests.recv().await {
        let PublishRequest {
            outgoing,
            permit,
            not_after,
            handoff,
            reply,
        } = request;
        if not_after.is_some_and(|not_after| Instant::now() >= not_after) {
            let _ = reply.send(Err(PublishError::Expired));
            continue;
        }
        if shared.dead.load(std::sync::atomic::Ordering::SeqCst) {
            let _ = reply.send(Err(PublishError::ConnectionLost {
                reason: "the connection was taken for dead".to_owned(),
            }));
            continue;
        }
        let Outgoing {
            exchange,
            routing_key,
            body,
            properties,
        } = outgoing;
        let fingerprint = fingerprint(&exchange, &routing_key, &body, &properties);
        let written_at = WrittenAt::default();
        let mut confirm: Confirm = {
            let channel = channel.clone();
            let written_at = Arc::clone(&written_at);
            Box::pin(async move {
                let written = channel
                    .basic_publish(
                        exchange.into(),
                        routing_key.into(),
                        BasicPublishOptions {
                            mandatory: true,
                            immediate: false,
                        },
                        &body,
                        properties,
                    )
                    .await;
                match written {
                    Ok(confirm) => {
                        let _ = written_at.set(Instant::now());
                        Settled::Confirmed(confirm.await)
                    }
                    Err(error) => Settled::Unwritten(error),
                }
            })
        };
        let mut in_flight = shared.in_flight.lock().await;
        let published_at = Instant::now();
        // The first poll takes the delivery tag and queues the frames.
        let mut settled = ready_now(&mut confirm);
        if handoff == Handoff::Written && settled.is_none() {
            settled = until_written(&mut confirm, &written_at).await;
        }
        if let Some(Settled::Unwritten(error)) = &settled {
            drop(in_flight);
            let answer = match shared.unwritten(error) {
                PublishOutcome::NotPublished { reason } => {
                    Err(PublishError::ConnectionLost { reason })
                }
                uncertain => Ok(Pending::ready(uncertain)),
            };
            let _ = reply.send(answer);
            continue;
        }
        let (outcome, outcome_received) = oneshot::channel();
        in_flight.push_back(InFlight {
            confirm,
            written_at,
            resolved: settled,
            fingerprint,
            published_at,
            outcome,
            _permit: permit,
        });
        drop(in_flight);
        shared.pushed.notify_one();
        let _ = reply.send(Ok(Pending {
            outcome: outcome_received,
        }));
    }
}

/// The oldest message's result, or `None` once its confirm is overdue.
///
/// Its confirm is due `confirm_timeout` after its write, as this task sees
/// it written. Before it is written, the timeout counts from now: every
/// earlier message was written (its confirm came), so it is first in
/// lapin's queue, and only its own write is waited for (a path that takes
/// nothing is found out; a slow link that keeps writing is not). While the
/// broker has blocked the connection ([`Shared::broker_blocked`], looked at
/// every tenth of the timeout) nothing is due: the timeout starts over once
/// it unblocks, for this message and every later one (written before or
/// during the block), and the replay waits for the broker.
async fn await_oldest(
    shared: &Shared,
    oldest: &mut InFlight,
    confirm_timeout: Duration,
) -> Option<Settled> {
    if let Some(settled) = oldest.resolved.take() {
        return Some(settled);
    }
    let look = (confirm_timeout / 10).max(Duration::from_millis(100));
    let mut since = shared.after_block(
        oldest
            .written_at
            .get()
            .copied()
            .unwrap_or_else(Instant::now),
    );
    loop {
        let step = async {
            if oldest.written_at.get().is_some() {
                Some((&mut oldest.confirm).await)
            } else {
                // `None`: written just now; its deadline moves to the write.
                until_written(&mut oldest.confirm, &oldest.written_at).await
            }
        };
        let deadline = since + confirm_timeout;
        let stepped = tokio::time::timeout_at(deadline.min(Instant::now() + look), step).await;
        match stepped {
            Ok(Some(settled)) => return Some(settled),
            Ok(None) => {
                since = shared.after_block(oldest.written_at.get().copied().unwrap_or(since));
            }
            Err(_) if shared.broker_blocked() => since = Instant::now(),
            Err(_) if Instant::now() < deadline => {}
            Err(_) => return None,
        }
    }
}

/// Drives `confirm` until its message is written (`None`: its
/// `written_at` is set) or it settles first (then its result, never to be
/// polled again).
async fn until_written(confirm: &mut Confirm, written_at: &OnceLock<Instant>) -> Option<Settled> {
    std::future::poll_fn(|context| match confirm.as_mut().poll(context) {
        Poll::Ready(settled) => Poll::Ready(Some(settled)),
        Poll::Pending if written_at.get().is_some() => Poll::Ready(None),
        Poll::Pending => Poll::Pending,
    })
    .await
}

/// The confirm timeout passed: the connection is taken for dead (a
/// half-open TCP connection, a stalled broker). Every publish in flight
/// that was written is [`PublishOutcome::Uncertain`] (it may still reach
/// the broker). One still queued in lapin is waited for, one more confirm
/// timeout at most: if lapin fails its write (the connection ends) it is
/// not published ([`Shared::unwritten`]); if it is written, or still
/// queued then (lapin may write it later), it is uncertain. Publishing on
/// this connection stops: [`Publisher::is_connected`] is false from now
/// on, and the owner closes the publisher.
async fn give_up_connection(shared: &Shared, oldest: InFlight, confirm_timeout: Duration) {
    let reason = format!(
        "no publisher confirm within {confirm_timeout:?}: the connection is taken for dead"
    );
    warn!(%reason, "closing the broker connection");
    shared.dead.store(true, std::sync::atomic::Ordering::SeqCst);
    *shared
        .last_error
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(reason.clone());
    let mut abandoned = vec![oldest];
    abandoned.extend(shared.in_flight.lock().await.drain(..));
    *shared
        .awaiting_since
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = None;
    let uncertain = || PublishOutcome::Uncertain {
        reason: reason.clone(),
    };
    let grace = Instant::now() + confirm_timeout;
    for mut entry in abandoned {
        let settled = match entry.resolved.take() {
            Some(settled) => Some(settled),
            None if entry.written_at.get().is_some() => None,
            None => {
                tokio::time::timeout_at(grace, until_written(&mut entry.confirm, &entry.written_at))
                    .await
                    .unwrap_or(None)
            }
        };
        let outcome = match settled {
            Some(Settled::Unwritten(error)) => shared.unwritten(&error),
            _ => uncertain(),
        };
        let _ = entry.outcome.send(outcome);
    }
}

/// `confirm`'s result if it is settled now (polled once, with a waker that
/// does nothing: whoever awaits it later registers its own).
fn ready_now(confirm: &mut Confirm) -> Option<Settled> {
    let mut context = Context::from_waker(Waker::noop());
    match confirm.as_mut().poll(&mut context) {
        Poll::Ready(settled) => Some(settled),
        Poll::Pending => None,
    }
}

impl InFlight {
    /// The confirm's result if it is resolved (seen before, or now).
    fn take_resolved(&mut self) -> Option<Settled> {
        self.resolved
            .take()
            .or_else(|| ready_now(&mut self.confirm))
    }
}

/// Takes into `returns` the return each confirm of `in_flight` that is
/// already resolved carries, keeping the confirms' results for later.
///
/// lapin resolves the confirms of a `multiple` ack one at a time, in no set
/// order (a `HashMap`'s, lapin 4.12 `acknowledgement.rs`
/// `complete_pending_before`), on its io thread, and the first one it
/// resolves takes the waiting return, whichever message it belongs to.
/// RabbitMQ sends a message's `basic.return` before its ack, so by the time
/// a message's confirm is seen resolved, the confirm carrying its return
/// is resolved too: it is among the earlier confirms, or anywhere among
/// the later ones, not only in the unbroken run after the oldest.
fn pool_resolved_returns(in_flight: &mut VecDeque<InFlight>, returns: &mut Vec<Returned>) {
    for entry in in_flight.iter_mut() {
        if entry.resolved.is_none() {
            entry.resolved = ready_now(&mut entry.confirm);
        }
        if let Some(result) = &mut entry.resolved {
            returns.extend(Returned::take_from(result));
        }
    }
}

struct Returned {
    fingerprint: u64,
    reply_code: u16,
    reply_text: String,
}

impl Returned {
    /// The return a confirm's `result` carries, taken out of it (lapin puts
    /// a return on an ack or a nack).
    fn take_from(result: &mut Settled) -> Option<Self> {
        let Settled::Confirmed(Ok(Confirmation::Ack(returned) | Confirmation::Nack(returned))) =
            result
        else {
            return None;
        };
        let returned = returned.take()?;
        Some(Self {
            fingerprint: returned_fingerprint(&returned),
            reply_code: returned.reply_code,
            reply_text: returned.reply_text.to_string(),
        })
    }
}

/// Resolves confirms in delivery-tag order and hands out outcomes.
///
/// It waits for the oldest confirm, then takes every following one that is
/// already resolved, stopping at the first that is not. Before it reports
/// them, it takes into the pool the return of every confirm resolved so
/// far, also of later messages ([`pool_resolved_returns`]): a message's
/// return (if any) then sits in the pool, whichever confirm lapin put it
/// on; returns are matched by fingerprint.
pub(super) async fn resolve_confirms(shared: Arc<Shared>, confirm_timeout: Duration) {
    let mut returns: Vec<Returned> = Vec::new();
    loop {
        let oldest = shared.in_flight.lock().await.pop_front();
        let Some(mut oldest) = oldest else {
            if shared.publishing_done.is_cancelled() {
                return;
            }
            tokio::select! {
                () = shared.pushed.notified() => {}
                () = shared.publishing_done.cancelled() => {}
            }
            continue;
        };
        *shared
            .awaiting_since
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(oldest.published_at);
        let Some(first) = await_oldest(&shared, &mut oldest, confirm_timeout).await else {
            give_up_connection(&shared, oldest, confirm_timeout).await;
            // Every message in flight is settled now: returns pooled for
            // them must not be matched to later ones.
            returns.clear();
            continue;
        };
        *shared
            .awaiting_since
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = None;
        let mut batch = vec![(oldest, first)];
        let outstanding: Vec<u64> = {
            let mut in_flight = shared.in_flight.lock().await;
            while let Some(next) = in_flight.front_mut() {
                let Some(result) = next.take_resolved() else {
                    break;
                };
                if let Some(entry) = in_flight.pop_front() {
                    batch.push((entry, result));
                }
            }
            pool_resolved_returns(&mut in_flight, &mut returns);
            in_flight.iter().map(|entry| entry.fingerprint).collect()
        };
        let mut outcomes = batch_outcomes(&shared, &mut batch, &mut returns);
        // A return whose message is neither in this batch nor still in
        // flight cannot be placed: one of the messages already resolved may
        // not have been delivered. Never report Sent on that doubt.
        let unplaced = returns
            .iter()
            .filter(|returned| !outstanding.contains(&returned.fingerprint))
            .count();
        if unplaced > 0 {
            warn!(
                returns = unplaced,
                "returned message matches no message in flight; outcomes downgraded to uncertain"
            );
            returns.retain(|returned| outstanding.contains(&returned.fingerprint));
            for outcome in &mut outcomes {
                if outcome.is_sent() {
                    *outcome = PublishOutcome::Uncertain {
                        reason: "a returned message could not be matched to its publish".to_owned(),
                    };
                }
            }
        }
        for ((entry, _), outcome) in batch.into_iter().zip(outcomes) {
            let _ = entry.outcome.send(outcome);
        }
    }
}

/// The outcomes of a `batch` of resolved confirms, in order: the returns
/// its confirms carry join the pool `returns`, and each message takes its
/// own return from the pool (by fingerprint).
fn batch_outcomes(
    shared: &Shared,
    batch: &mut [(InFlight, Settled)],
    returns: &mut Vec<Returned>,
) -> Vec<PublishOutcome> {
    let resolved_at = Instant::now();
    let mut outcomes = Vec::with_capacity(batch.len());
    for (_, result) in batch.iter_mut() {
        returns.extend(Returned::take_from(result));
    }
    for (entry, result) in batch.iter() {
        let result = match result {
            Settled::Confirmed(result) => result,
            // Never written, so never returned either: no return is its.
            Settled::Unwritten(error) => {
                outcomes.push(shared.unwritten(error));
                continue;
            }
        };
        let own_return = returns
            .iter()
            .position(|returned| returned.fingerprint == entry.fingerprint)
            .map(|index| returns.swap_remove(index));
        let outcome = match (result, own_return) {
            (Ok(Confirmation::Ack(_)), None) => PublishOutcome::Sent {
                latency: resolved_at.duration_since(entry.published_at),
            },
            (Ok(Confirmation::Ack(_)), Some(returned)) => PublishOutcome::Unroutable {
                reply_code: returned.reply_code,
                reply_text: returned.reply_text,
            },
            (Ok(Confirmation::Nack(_)), _) => PublishOutcome::Nacked,
            (Ok(Confirmation::NotRequested), _) => PublishOutcome::Uncertain {
                reason: "the channel is not in confirm mode".to_owned(),
            },
            (Err(error), _) => PublishOutcome::Uncertain {
                reason: shared.record_error(error),
            },
        };
        outcomes.push(outcome);
    }
    outcomes
}

#[cfg(test)]
mod tests {
    use futures::FutureExt as _;
    use lapin::message::Delivery;
    use tokio::sync::Semaphore;

    use super::*;

    /// A message `body` to `x`/`rk` in flight, its confirm given by the
    /// returned sender, its outcome by the returned receiver.
    fn in_flight(
        body: &[u8],
        window: &Arc<Semaphore>,
    ) -> (
        InFlight,
        oneshot::Sender<Confirmation>,
        oneshot::Receiver<PublishOutcome>,
    ) {
        let (confirmed, confirm) = oneshot::channel::<Confirmation>();
        let (outcome, outcome_received) = oneshot::channel();
        let entry = InFlight {
            confirm: Box::pin(confirm.map(|confirmation| {
                Settled::Confirmed(Ok(confirmation.expect("the test resolves every confirm")))
            })),
            written_at: Arc::new(OnceLock::from(Instant::now())),
            resolved: None,
            fingerprint: fingerprint("x", "rk", body, &BasicProperties::default()),
            published_at: Instant::now(),
            outcome,
            _permit: Arc::clone(window).try_acquire_owned().unwrap(),
        };
        (entry, confirmed, outcome_received)
    }

    /// `body` returned by the broker (312 NO_ROUTE).
    fn returned(body: &[u8]) -> BasicReturnMessage {
        BasicReturnMessage {
            delivery: Delivery::mock(0, "x".into(), "rk".into(), false, body.to_vec()),
            reply_code: 312,
            reply_text: "NO_ROUTE".into(),
        }
    }

    /// lapin resolves a `multiple` ack's confirms in a `HashMap`'s order and
    /// gives the waiting return to the first: here the third confirm took
    /// the first message's return, and the second is not resolved yet when
    /// the first is seen. The first message was returned, never delivered:
    /// it must not be reported sent (it was, when only the unbroken run
    /// after the oldest was read).
    #[tokio::test]
    async fn a_return_on_a_later_confirm_of_the_same_ack_reaches_its_message() {
        let window = Arc::new(Semaphore::new(3));
        let shared = Arc::new(Shared::new(3, false, None));
        let (first, confirm_first, first_outcome) = in_flight(b"one", &window);
        let (second, confirm_second, second_outcome) = in_flight(b"two", &window);
        let (third, confirm_third, third_outcome) = in_flight(b"three", &window);
        shared.in_flight.lock().await.extend([first, second, third]);
        confirm_third
            .send(Confirmation::Ack(Some(returned(b"one"))))
            .unwrap();
        confirm_first.send(Confirmation::Ack(None)).unwrap();
        let confirming = tokio::spawn(resolve_confirms(
            Arc::clone(&shared),
            Duration::from_secs(30),
        ));
        let first_outcome = first_outcome.await.unwrap();
        assert!(
            matches!(
                first_outcome,
                PublishOutcome::Unroutable {
                    reply_code: 312,
                    ..
                }
            ),
            "the returned message: {first_outcome:?}"
        );
        confirm_second.send(Confirmation::Ack(None)).unwrap();
        assert!(second_outcome.await.unwrap().is_sent());
        assert!(third_outcome.await.unwrap().is_sent());
        shared.publishing_done.cancel();
        shared.pushed.notify_one();
        confirming.await.unwrap();
    }

    /// A message whose frames were never written is not published, and no
    /// return is its: here an identical message (the same dead letter
    /// published again after the first write failed) was returned, and
    /// that return must reach the one the broker returned, never be taken
    /// by the unwritten one, which would leave the returned one reported
    /// sent.
    #[tokio::test]
    async fn an_unwritten_publish_is_not_published_and_takes_no_return() {
        let window = Arc::new(Semaphore::new(2));
        let shared = Arc::new(Shared::new(3, false, None));
        let (outcome, unwritten_outcome) = oneshot::channel();
        let unwritten = InFlight {
            confirm: Box::pin(async {
                Settled::Unwritten(
                    lapin::ErrorKind::InvalidConnectionState(lapin::ConnectionState::Closed).into(),
                )
            }),
            written_at: WrittenAt::default(),
            resolved: None,
            fingerprint: fingerprint("x", "rk", b"same", &BasicProperties::default()),
            published_at: Instant::now(),
            outcome,
            _permit: Arc::clone(&window).try_acquire_owned().unwrap(),
        };
        let (returned_one, confirm_returned, returned_outcome) = in_flight(b"same", &window);
        shared
            .in_flight
            .lock()
            .await
            .extend([unwritten, returned_one]);
        confirm_returned
            .send(Confirmation::Ack(Some(returned(b"same"))))
            .unwrap();
        let confirming = tokio::spawn(resolve_confirms(
            Arc::clone(&shared),
            Duration::from_secs(30),
        ));
        let unwritten_outcome = unwritten_outcome.await.unwrap();
        assert!(
            matches!(unwritten_outcome, PublishOutcome::NotPublished { .. }),
            "the unwritten message: {unwritten_outcome:?}"
        );
        let returned_outcome = returned_outcome.await.unwrap();
        assert!(
            matches!(returned_outcome, PublishOutcome::Unroutable { .. }),
            "the returned message: {returned_outcome:?}"
        );
        shared.publishing_done.cancel();
        shared.pushed.notify_one();
        confirming.await.unwrap();
    }
}
