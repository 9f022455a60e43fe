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

use std::{
    collections::HashMap,
    collections::VecDeque,
    future::Future,
    pin::Pin,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicUsize, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};

use bytes::{Buf, Bytes};
use http_body::{Body, Frame, SizeHint};
use tokio::{
    sync::{Notify, OwnedSemaphorePermit, Semaphore, futures::OwnedNotified},
    time::Sleep,
};
use tonic::{Status, codegen::http};
use tracing::warn;

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

/// A tower layer charging the messages of `IngestDeadLetters` requests to
/// an [`IngestBudget`]; other requests pass untouched.
#[derive(Debug, Clone)]
pub struct IngestBudgetLayer {
    budget: IngestBudget,
}

impl IngestBudgetLayer {
    /// The layer of `budget`.
    pub fn new(budget: IngestBudget) -> Self {
        Self { budget }
    }
}

impl<S> tower::Layer<S> for IngestBudgetLayer {
    type Service = IngestBudgeted<S>;

    fn layer(&self, inner: S) -> Self::Service {
        IngestBudgeted {
            inner,
            budget: self.budget.clone(),
        }
    }
}

/// The service of [`IngestBudgetLayer`].
#[derive(Debug, Clone)]
pub struct IngestBudgeted<S> {
    inner: S,
    budget: IngestBudget,
}

impl<S> tower::Service<http::Request<tonic::body::Body>> for IngestBudgeted<S>
where
    S: tower::Service<http::Request<tonic::body::Body>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        if request.uri().path() != INGEST_PATH {
            return self.inner.call(request);
        }
        let reservations = Reservations::default();
        let caller: Arc<str> = crate::edge::admission::http_caller_key(request.extensions()).into();
        let (mut parts, body) = request.into_parts();
        parts.extensions.insert(reservations.clone());
        let body = tonic::body::Body::new(ChargedBody {
            inner: body,
            budget: self.budget.clone(),
            reservations,
            framing: Framing::default(),
            held: None,
            scanned: 0,
            blocked: None,
            woken: None,
            deadline: None,
            waiting: None,
            payload_deadline: None,
            caller,
            over_caller: false,
            buffer: None,
            buffer_bytes: 0,
        });
        self.inner.call(http::Request::from_parts(parts, body))
    }
}

/// Where a stream is in the gRPC message framing.
#[derive(Debug, Default)]
struct Framing {
    prefix: [u8; 5],
    prefix_read: usize,
    /// Bytes of the current message's payload still to come.
    payload_left: usize,
}

/// A message prefix [`Framing::advance`] completed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Prefix {
    /// Where the prefix began in the data given (0 when it began in earlier
    /// data).
    start: usize,
    /// The message's length.
    length: usize,
}

impl Framing {
    /// Reads `data` up to the end of the first message prefix it
    /// completes: how many bytes it read, and that prefix (`None` when it
    /// read all of `data` without completing one).
    fn advance(&mut self, data: &[u8]) -> (usize, Option<Prefix>) {
        let mut read = 0;
        while read < data.len() {
            if self.payload_left > 0 {
                let skipped = self.payload_left.min(data.len() - read);
                self.payload_left -= skipped;
                read += skipped;
                continue;
            }
            let start = if self.prefix_read == 0 { read } else { 0 };
            let taken = (self.prefix.len() - self.prefix_read).min(data.len() - read);
            self.prefix[self.prefix_read..self.prefix_read + taken]
                .copy_from_slice(&data[read..read + taken]);
            self.prefix_read += taken;
            read += taken;
            if self.prefix_read == self.prefix.len() {
                self.prefix_read = 0;
                let [_, a, b, c, d] = self.prefix;
                let length = u32::from_be_bytes([a, b, c, d]) as usize;
                self.payload_left = length;
                return (read, Some(Prefix { start, length }));
            }
        }
        (read, None)
    }
}

/// A request body whose bytes are let through message by message: the
/// bytes of a message from its prefix on go on once the message is
/// charged, and those before it (earlier messages of the same frame) at
/// once, so that an item the budget has room for is never held back by the
/// next one.
struct ChargedBody {
    inner: tonic::body::Body,
    budget: IngestBudget,
    reservations: Reservations,
    framing: Framing,
    /// Data read from the client and not yet let through.
    held: Option<Bytes>,
    /// How much of `held` the framing has read.
    scanned: usize,
    /// A message of `held` whose prefix is read and whose charge is not
    /// reserved yet: its prefix's start in `held`, and its length.
    blocked: Option<Prefix>,
    /// Wakes this stream when a share is returned while it waits for room.
    woken: Option<Pin<Box<OwnedNotified>>>,
    /// When the wait of the current reservation ends.
    deadline: Option<Pin<Box<Sleep>>>,
    /// Its place among the streams waiting, while it waits.
    waiting: Option<WaitPlace>,
    /// When the rest of the message charged last must have arrived
    /// ([`IngestBudget::payload_time`]); `None` once it has.
    payload_deadline: Option<(usize, Pin<Box<Sleep>>)>,
    /// Who sends it ([`crate::edge::admission::caller_key`]).
    caller: Arc<str>,
    /// It waits because its caller's streams hold their most, not because
    /// the budget is in use by others.
    over_caller: bool,
    /// The share of the stream's decoding buffer, held until the stream
    /// ends (with the body).
    buffer: Option<Share>,
    /// The largest message charged so far (what `buffer` covers).
    buffer_bytes: usize,
}

impl ChargedBody {
    /// Splits `share` into the item's reservation and the buffer's growth.
    fn charged(&mut self, mut share: Share, cost: Cost, length: usize) {
        if cost.growth > 0
            && let Some(growth) = share.split(cost.growth)
        {
            match self.buffer.as_mut() {
                Some(buffer) => buffer.merge(growth),
                None => self.buffer = Some(growth),
            }
        }
        self.buffer_bytes = self.buffer_bytes.max(length);
        self.reservations.push(share);
        self.deadline = None;
        self.woken = None;
        self.waiting = None;
        self.payload_deadline = Some((
            length,
            Box::pin(tokio::time::sleep(self.budget.payload_time(length))),
        ));
    }

    /// Reserves the charge of a message of `length` bytes; `Ready(Err)`
    /// when the wait ran out.
    ///
    /// A stream takes its charge only when the budget has room for it
    /// whole, and never queues for it: a queue (first come, first served)
    /// would let a stream that holds its decoding buffer wait behind one
    /// that needs that very buffer returned, and neither would move. A
    /// stream without room waits until some share is returned, tries
    /// again, and is refused once its wait runs out.
    fn poll_reserve(&mut self, cx: &mut Context<'_>, length: usize) -> Poll<Result<(), Status>> {
        let cost = self.budget.cost(length, self.buffer_bytes);
        let permits = u32::try_from(cost.item + cost.growth).unwrap_or(u32::MAX);
        loop {
            // Listen before trying: a share returned between the try and
            // the wait still wakes this stream.
            let woken = self.woken.get_or_insert_with(|| {
                let mut woken = Box::pin(Arc::clone(&self.budget.released).notified_owned());
                woken.as_mut().enable();
                woken
            });
            // The caller's room is checked and taken under its lock, so
            // that two streams of one caller cannot both pass it.
            let mut held = self
                .budget
                .held
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let mine = held.get(&self.caller).copied().unwrap_or(0);
            let over_caller = mine + permits as usize > self.budget.per_caller;
            // Named in a refusal only when the caller's share is the
            // smaller bound.
            self.over_caller = over_caller && self.budget.per_caller < self.budget.total;
            if !over_caller {
                match Arc::clone(&self.budget.permits).try_acquire_many_owned(permits) {
                    Ok(permit) => {
                        *held.entry(Arc::clone(&self.caller)).or_default() += permits as usize;
                        drop(held);
                        let share = Share {
                            permit: Some(permit),
                            released: Arc::clone(&self.budget.released),
                            caller: Some((Arc::clone(&self.budget.held), Arc::clone(&self.caller))),
                        };
                        self.charged(share, cost, length);
                        return Poll::Ready(Ok(()));
                    }
                    Err(tokio::sync::TryAcquireError::Closed) => {
                        return Poll::Ready(Err(Status::unavailable("the planner is stopping")));
                    }
                    Err(tokio::sync::TryAcquireError::NoPermits) => {}
                }
            }
            drop(held);
            if woken.as_mut().poll(cx).is_ready() {
                self.woken = None;
                continue;
            }
            if self.waiting.is_none() {
                match self.budget.wait_place() {
                    Some(place) => self.waiting = Some(place),
                    None => {
                        self.woken = None;
                        return Poll::Ready(Err(self.budget.too_many_waiting()));
                    }
                }
            }
            let wait = self.budget.wait;
            let deadline = self
                .deadline
                .get_or_insert_with(|| Box::pin(tokio::time::sleep(wait)));
            if deadline.as_mut().poll(cx).is_ready() {
                self.woken = None;
                self.deadline = None;
                self.waiting = None;
                return Poll::Ready(Err(if self.over_caller {
                    self.budget.caller_exhausted()
                } else {
                    self.budget.exhausted()
                }));
            }
            return Poll::Pending;
        }
    }
}

impl Body for ChargedBody {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        loop {
            if let Some(prefix) = this.blocked {
                match this.poll_reserve(cx, prefix.length) {
                    Poll::Ready(Ok(())) => this.blocked = None,
                    Poll::Ready(Err(status)) => {
                        this.held = None;
                        this.blocked = None;
                        return Poll::Ready(Some(Err(status)));
                    }
                    Poll::Pending => {
                        // Let the messages before this one through now.
                        if prefix.start > 0
                            && let Some(held) = this.held.as_mut()
                        {
                            let before = held.split_to(prefix.start);
                            this.scanned -= prefix.start;
                            this.blocked = Some(Prefix { start: 0, ..prefix });
                            return Poll::Ready(Some(Ok(Frame::data(before))));
                        }
                        return Poll::Pending;
                    }
                }
            }
            if let Some(held) = this.held.as_ref() {
                let (read, prefix) = this.framing.advance(&held[this.scanned..]);
                let from = this.scanned;
                this.scanned += read;
                if this.framing.payload_left == 0 {
                    this.payload_deadline = None;
                }
                if let Some(prefix) = prefix {
                    this.blocked = Some(Prefix {
                        start: from + prefix.start,
                        ..prefix
                    });
                    continue;
                }
                this.scanned = 0;
                return Poll::Ready(this.held.take().map(|data| Ok(Frame::data(data))));
            }
            match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(mut data) => {
                        let data = data.copy_to_bytes(data.remaining());
                        if !data.is_empty() {
                            this.held = Some(data);
                        }
                    }
                    Err(frame) => return Poll::Ready(Some(Ok(frame))),
                },
                Poll::Pending => {
                    if let Some((length, deadline)) = this.payload_deadline.as_mut()
                        && deadline.as_mut().poll(cx).is_ready()
                    {
                        let length = *length;
                        this.payload_deadline = None;
                        // The charge goes back with the body, dropped
                        // after this error.
                        return Poll::Ready(Some(Err(this.budget.stalled(length))));
                    }
                    return Poll::Pending;
                }
                other => return other,
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.held.is_none() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_prefixes_are_found_across_any_split_of_the_frames() {
        // Three messages: 3 bytes, 0 bytes, 300 bytes.
        let mut wire = Vec::new();
        let mut starts = Vec::new();
        for length in [3_u32, 0, 300] {
            starts.push(wire.len());
            wire.push(0);
            wire.extend_from_slice(&length.to_be_bytes());
            wire.extend(std::iter::repeat_n(7_u8, length as usize));
        }
        for chunk in [1, 2, 4, 5, 6, 7, 64, wire.len()] {
            let mut framing = Framing::default();
            let mut lengths = Vec::new();
            let mut begun = Vec::new();
            let mut offset = 0;
            for piece in wire.chunks(chunk) {
                let mut read = 0;
                while read < piece.len() {
                    let (taken, prefix) = framing.advance(&piece[read..]);
                    if let Some(prefix) = prefix {
                        lengths.push(prefix.length);
                        begun.push(offset + read + prefix.start);
                    }
                    read += taken;
                }
                offset += piece.len();
            }
            assert_eq!(lengths, vec![3, 0, 300], "chunks of {chunk}");
            if chunk == wire.len() {
                assert_eq!(begun, starts, "where each prefix began");
            }
        }
    }

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
