//! The planner's memory for `IngestDeadLetters`, bounded in total across
//! every stream and caller by one setting (`--ingest-memory-bytes`;
//! docs/design.md, "Every input is bounded at the edge").
//!
//! Each message of an ingest stream is charged to one shared budget before
//! its bytes reach tonic's decoder: [`IngestBudgetLayer`] reads the gRPC
//! length prefix of every message as the request body flows by (a 1-byte
//! compressed flag and a 4-byte big-endian length, gRPC over HTTP/2,
//! "Length-Prefixed-Message") and holds the body back until the message's
//! cost is reserved: twice its length until the item is stored, and the
//! growth of the stream's decoding buffer until the stream ends. While it waits, the stream is not
//! read, so HTTP/2 flow control holds the client back. The reservation then
//! travels with the item ([`Reservations`]) until the item is stored, and
//! is returned at once after. A stream that waits longer than the budget's
//! wait ends with `RESOURCE_EXHAUSTED`, after what it sent before was
//! stored (an ingest is idempotent: sending the whole stream again is safe).
//!
//! - `layer.rs`: [`IngestBudgetLayer`], which charges the messages of
//!   `IngestDeadLetters` requests.
//! - `body.rs`: the charged request body: the gRPC framing read as the
//!   bytes flow by, each message held back until its charge is reserved.
//! - here: the [`IngestBudget`], its shares and the items' [`Reservations`].

mod body;
mod layer;

use std::{
    collections::HashMap,
    collections::VecDeque,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tonic::Status;
use tracing::warn;

pub use self::layer::{IngestBudgetLayer, IngestBudgeted};
use crate::edge::admission::Throttled;

/// The path of the one call whose messages are charged.
pub const INGEST_PATH: &str = "/redrive.v1.Planner/IngestDeadLetters";
/// Default total of bytes ingest streams may hold at once: 256 MiB.
pub const DEFAULT_INGEST_MEMORY_BYTES: usize = 256 * 1024 * 1024;
/// Default time a stream waits for its share before it is refused.
pub const DEFAULT_INGEST_WAIT: Duration = Duration::from_secs(30);
/// Bytes charged per item on top of twice its size: the decoded item's
/// own fields and vectors.
const ITEM_OVERHEAD: usize = 1024;
/// Ingest streams that may wait for their share at once, across every
/// connection. A waiting stream is not read, so what its client sent
/// before it had to wait (at most [`STREAM_WINDOW_BYTES`]) stays in the
/// planner's HTTP/2 buffers, outside the budget; and it holds that much of
/// its connection's window ([`CONNECTION_WINDOW_BYTES`]). A stream that
/// would wait beyond this many is refused at once.
pub const MAX_WAITING_STREAMS: usize = 64;
/// The HTTP/2 flow-control window the planner gives each stream, in bytes
/// (RFC 9113, section 6.9.2, `SETTINGS_INITIAL_WINDOW_SIZE`): what a client
/// may send on a stream that the planner has not read yet.
pub const STREAM_WINDOW_BYTES: u32 = 1024 * 1024;
/// The HTTP/2 flow-control window the planner gives each connection, in
/// bytes (RFC 9113, section 6.9): room for the windows of every stream that
/// may wait ([`MAX_WAITING_STREAMS`]) and two more. The data a waiting
/// stream holds unread counts against its connection's window; were the
/// connection's window smaller, streams waiting on one connection would
/// leave none for the stream of that connection that holds the budget,
/// which then could not finish and return it: every stream would wait.
#[allow(clippy::cast_possible_truncation)]
pub const CONNECTION_WINDOW_BYTES: u32 = (MAX_WAITING_STREAMS as u32 + 2) * STREAM_WINDOW_BYTES;

/// One budget of bytes shared by every ingest stream of the planner.
#[derive(Debug, Clone)]
pub struct IngestBudget {
    permits: Arc<Semaphore>,
    /// Woken whenever a share is returned ([`Share`]).
    released: Arc<Notify>,
    total: usize,
    wait: Duration,
    largest_message: usize,
    refused: Arc<Throttled>,
    /// Streams waiting for their share now ([`MAX_WAITING_STREAMS`]).
    waiting: Arc<AtomicUsize>,
    /// Most bytes the streams of one caller may hold together.
    per_caller: usize,
    /// Bytes held now, per caller ([`crate::edge::admission::caller_key`]).
    held: Held,
}

/// Bytes of the budget held now, per caller.
type Held = Arc<Mutex<HashMap<Arc<str>, usize>>>;

impl IngestBudget {
    /// A budget of `total` bytes (at least 1 MiB, say
    /// [`crate::config::Config::validate`]); a stream waits at most `wait`
    /// for its share. Messages longer than `largest_message` are charged
    /// nothing: tonic refuses them before buffering them.
    pub fn new(total: usize, wait: Duration, largest_message: usize) -> Self {
        let total = total.clamp(1, Semaphore::MAX_PERMITS);
        Self {
            permits: Arc::new(Semaphore::new(total)),
            released: Arc::new(Notify::new()),
            total,
            wait,
            largest_message,
            refused: Arc::new(Throttled::default()),
            waiting: Arc::new(AtomicUsize::new(0)),
            per_caller: total,
            held: Arc::default(),
        }
    }

    /// The streams of one caller (a principal; a peer address without
    /// authentication) hold at most `bytes` together (at least 1, at most
    /// the budget), so that one caller cannot hold the whole budget.
    #[must_use]
    pub fn with_per_caller(mut self, bytes: usize) -> Self {
        self.per_caller = bytes.clamp(1, self.total);
        self
    }

    /// What a message of `length` bytes on the wire is charged, on a stream
    /// whose decoding buffer is `buffer` bytes so far: the item, twice its
    /// length and [`ITEM_OVERHEAD`] (the decoded item, then its copy in the
    /// statement that stores it), held until it is stored; and how much the
    /// stream's decoding buffer grows (tonic's decoder keeps a buffer as
    /// large as the largest message the stream has sent, until the stream
    /// ends), held until then. Together at most what the budget leaves
    /// beside `buffer` (a message larger than the budget is taken alone);
    /// nothing for a message longer than tonic accepts (it refuses it before
    /// buffering it).
    fn cost(&self, length: usize, buffer: usize) -> Cost {
        if length > self.largest_message {
            return Cost::default();
        }
        let room = self.per_caller.min(self.total).saturating_sub(buffer);
        let growth = length.saturating_sub(buffer).min(room);
        let item = length
            .saturating_mul(2)
            .saturating_add(ITEM_OVERHEAD)
            .min(room - growth);
        Cost { item, growth }
    }

    /// A place among the streams that wait ([`MAX_WAITING_STREAMS`]),
    /// `None` when they are all taken.
    fn wait_place(&self) -> Option<WaitPlace> {
        self.waiting
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |waiting| {
                (waiting < MAX_WAITING_STREAMS).then_some(waiting + 1)
            })
            .ok()
            .map(|_| WaitPlace(Arc::clone(&self.waiting)))
    }

    fn too_many_waiting(&self) -> Status {
        if let Some(refused) = self.refused.count() {
            warn!(
                refused,
                budget_bytes = self.total,
                waiting = MAX_WAITING_STREAMS,
                "ingest streams refused: too many streams already wait for the planner's ingest memory"
            );
        }
        Status::resource_exhausted(format!(
            "the planner's memory for ingest ({} MiB, --ingest-memory-bytes) is in use and {} other \
             streams already wait for it; the items before were stored; send the stream again later \
             (repeats are recognized)",
            self.total / (1024 * 1024),
            MAX_WAITING_STREAMS
        ))
    }

    /// How long the bytes of a message of `length` bytes may take to
    /// arrive once it is charged: the budget's wait and one more second per
    /// MiB. A client that sends a length prefix and then stalls holds its
    /// charge no longer (it answers keepalive pings, so the idle timer never
    /// closes it).
    fn payload_time(&self, length: usize) -> Duration {
        self.wait
            .saturating_add(Duration::from_secs((length / (1024 * 1024)) as u64))
    }

    fn stalled(&self, length: usize) -> Status {
        Status::resource_exhausted(format!(
            "the rest of an item of {length} bytes did not arrive within {}s of its length prefix \
             (--ingest-wait-seconds and 1 s per MiB); the planner's memory for ingest it held is \
             returned; the items before were stored; send the stream again (repeats are recognized)",
            self.payload_time(length).as_secs()
        ))
    }

    fn caller_exhausted(&self) -> Status {
        if let Some(refused) = self.refused.count() {
            warn!(
                refused,
                per_caller_bytes = self.per_caller,
                wait = ?self.wait,
                "ingest streams refused: their caller's streams held their most of the ingest memory"
            );
        }
        Status::resource_exhausted(format!(
            "your streams held their most of the planner's memory for ingest ({} MiB, \
             --ingest-memory-per-principal-bytes) for {}s; the items before were stored; send fewer \
             streams at once, or this one again later (repeats are recognized)",
            self.per_caller / (1024 * 1024),
            self.wait.as_secs()
        ))
    }

    fn exhausted(&self) -> Status {
        if let Some(refused) = self.refused.count() {
            warn!(
                refused,
                budget_bytes = self.total,
                wait = ?self.wait,
                "ingest streams refused: the planner's ingest memory stayed in use by other streams"
            );
        }
        Status::resource_exhausted(format!(
            "the planner's memory for ingest ({} MiB, --ingest-memory-bytes) stayed in use by other \
             streams for {}s; the items before were stored; send the stream again later (repeats are \
             recognized)",
            self.total / (1024 * 1024),
            self.wait.as_secs()
        ))
    }
}

/// What one message is charged ([`IngestBudget::cost`]), in bytes.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Cost {
    /// Held by the item until it is stored.
    item: usize,
    /// Added to the stream's decoding buffer, held until the stream ends.
    growth: usize,
}

/// Bytes of the budget held; dropping it returns them and wakes the
/// streams waiting for room.
#[derive(Debug)]
struct Share {
    permit: Option<OwnedSemaphorePermit>,
    released: Arc<Notify>,
    /// Whose bytes these are, counted in [`IngestBudget::held`] as long as
    /// the permit is held.
    caller: Option<(Held, Arc<str>)>,
}

impl Share {
    /// Moves `bytes` of this share into a share of their own.
    fn split(&mut self, bytes: usize) -> Option<Share> {
        let permit = self.permit.as_mut()?.split(bytes)?;
        Some(Share {
            permit: Some(permit),
            released: Arc::clone(&self.released),
            caller: self.caller.clone(),
        })
    }

    /// Adds `other`'s bytes to this share.
    fn merge(&mut self, mut other: Share) {
        if let (Some(mine), Some(theirs)) = (self.permit.as_mut(), other.permit.take()) {
            mine.merge(theirs);
        }
    }
}

impl Drop for Share {
    fn drop(&mut self) {
        // Return the bytes first, then wake the waiters, so that a woken
        // stream finds them.
        if let Some(permit) = self.permit.take() {
            if let Some((held, caller)) = &self.caller {
                let mut held = held.lock().unwrap_or_else(PoisonError::into_inner);
                if let Some(bytes) = held.get_mut(caller) {
                    *bytes = bytes.saturating_sub(permit.num_permits());
                    if *bytes == 0 {
                        held.remove(caller);
                    }
                }
            }
            drop(permit);
            self.released.notify_waiters();
        }
    }
}

/// A stream's place among those waiting ([`IngestBudget::wait_place`]);
/// dropping it gives the place up.
#[derive(Debug)]
struct WaitPlace(Arc<AtomicUsize>);

impl Drop for WaitPlace {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// One item's share of the budget; dropping it returns the share.
#[derive(Debug)]
pub struct Reservation {
    _share: Share,
}

/// The reservations of one ingest stream's messages, in stream order:
/// [`IngestBudgetLayer`] adds one per message it lets through, and the
/// handler takes one per item it receives ([`Reservations::take`]). Found in
/// the request's extensions.
#[derive(Debug, Clone, Default)]
pub struct Reservations(Arc<Mutex<VecDeque<Share>>>);

impl Reservations {
    fn push(&self, share: Share) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push_back(share);
    }

    /// The reservation of the next item of the stream (`None` when the
    /// stream was not charged, as in tests that call the handler directly).
    pub fn take(&self) -> Option<Reservation> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop_front()
            .map(|share| Reservation { _share: share })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_costs_twice_its_size_and_the_buffer_growth_within_the_budget() {
        let budget = IngestBudget::new(10_000, Duration::from_secs(1), 8_000);
        assert_eq!(
            budget.cost(100, 0),
            Cost {
                item: 1_224,
                growth: 100
            }
        );
        assert_eq!(
            budget.cost(100, 500),
            Cost {
                item: 1_224,
                growth: 0
            },
            "the buffer is large enough already"
        );
        assert_eq!(
            budget.cost(6_000, 1_000),
            Cost {
                item: 4_000,
                growth: 5_000
            },
            "at most what the budget leaves beside the buffer"
        );
        assert_eq!(
            budget.cost(9_000, 0),
            Cost::default(),
            "tonic refuses it unread"
        );
    }
}
