//! The publisher's two tasks: one publishes requests in order, one resolves
//! confirms in delivery-tag order and matches returns to their messages
//! (see the [`super`] docs, "Matching returns to messages").

use std::{
    collections::VecDeque,
    hash::{DefaultHasher, Hash, Hasher},
    pin::Pin,
    sync::Arc,
    task::{Context, Poll, Waker},
    time::Duration,
};

use lapin::{
    BasicProperties, Channel, Confirmation, PublisherConfirm, message::BasicReturnMessage,
    options::BasicPublishOptions,
};
use tokio::{
    sync::{Mutex, Notify, OwnedSemaphorePermit, mpsc, oneshot},
    time::Instant,
};
use tokio_util::sync::CancellationToken;
use tracing::warn;

use super::{Outgoing, Pending, PublishError, PublishOutcome};

/// A message handed to the broker, awaiting its confirm.
pub(super) struct InFlight {
    confirm: PublisherConfirm,
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
    /// Set when the confirm timeout declared the connection dead.
    pub(super) dead: std::sync::atomic::AtomicBool,
}

impl Shared {
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
        let mut in_flight = shared.in_flight.lock().await;
        let published_at = Instant::now();
        let published = channel
            .basic_publish(
                exchange.as_str().into(),
                routing_key.as_str().into(),
                BasicPublishOptions {
                    mandatory: true,
                    immediate: false,
                },
                &body,
                properties,
            )
            .await;
        let confirm = match published {
            Ok(confirm) => confirm,
            Err(error) => {
                drop(in_flight);
                let _ = reply.send(Err(PublishError::ConnectionLost {
                    reason: shared.record_error(&error),
                }));
                continue;
            }
        };
        let (outcome, outcome_received) = oneshot::channel();
        in_flight.push_back(InFlight {
            confirm,
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

/// The confirm timeout passed: the connection is taken for dead (a
/// half-open TCP connection, a stalled broker). Every publish in flight is
/// [`PublishOutcome::Uncertain`] (it may still reach the broker), and
/// publishing on this connection stops: [`Publisher::is_connected`] is false
/// from now on, and the owner drops the publisher, which closes the
/// connection.
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
    for entry in abandoned {
        let _ = entry.outcome.send(PublishOutcome::Uncertain {
            reason: reason.clone(),
        });
    }
}

/// The confirm's result if it is already resolved.
fn resolved_now(confirm: &mut PublisherConfirm) -> Option<lapin::Result<Confirmation>> {
    let mut context = Context::from_waker(Waker::noop());
    match Pin::new(confirm).poll(&mut context) {
        Poll::Ready(result) => Some(result),
        Poll::Pending => None,
    }
}

struct Returned {
    fingerprint: u64,
    reply_code: u16,
    reply_text: String,
}

/// Resolves confirms in delivery-tag order and hands out outcomes.
///
/// It waits for the oldest confirm, then takes every following one that is
/// already resolved, stopping at the first that is not. lapin resolves all
/// the confirms of one ack frame at once, and a `multiple` ack covers every
/// outstanding tag up to its own, so such a batch holds whole frames. RabbitMQ
/// sends a message's `basic.return` before its ack, so by the time a message
/// is resolved its return (if any) sits on a confirm of its batch or of an
/// earlier one; returns are pooled and matched by fingerprint.
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
        let deadline = oldest.published_at + confirm_timeout;
        let first = match tokio::time::timeout_at(deadline, &mut oldest.confirm).await {
            Ok(first) => first,
            Err(_) => {
                give_up_connection(&shared, oldest, confirm_timeout).await;
                continue;
            }
        };
        *shared
            .awaiting_since
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = None;
        let mut batch = vec![(oldest, first)];
        let outstanding: Vec<u64> = {
            let mut in_flight = shared.in_flight.lock().await;
            while let Some(next) = in_flight.front_mut() {
                let Some(result) = resolved_now(&mut next.confirm) else {
                    break;
                };
                if let Some(entry) = in_flight.pop_front() {
                    batch.push((entry, result));
                }
            }
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
    batch: &mut [(InFlight, lapin::Result<Confirmation>)],
    returns: &mut Vec<Returned>,
) -> Vec<PublishOutcome> {
    let resolved_at = Instant::now();
    let mut outcomes = Vec::with_capacity(batch.len());
    for (_, result) in batch.iter_mut() {
        if let Ok(Confirmation::Ack(returned) | Confirmation::Nack(returned)) = result
            && let Some(returned) = returned.take()
        {
            returns.push(Returned {
                fingerprint: returned_fingerprint(&returned),
                reply_code: returned.reply_code,
                reply_text: returned.reply_text.to_string(),
            });
        }
    }
    for (entry, result) in batch.iter() {
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
