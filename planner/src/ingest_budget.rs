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
    collections::VecDeque,
    future::Future,
    pin::Pin,
    sync::{Arc, Mutex, PoisonError},
    task::{Context, Poll},
    time::Duration,
};

use bytes::{Buf, Bytes};
use http_body::{Body, Frame, SizeHint};
use tokio::{
    sync::{AcquireError, OwnedSemaphorePermit, Semaphore},
    time::Sleep,
};
use tonic::{Status, codegen::http};
use tracing::warn;

use crate::admission::Throttled;

/// The path of the one call whose messages are charged.
pub const INGEST_PATH: &str = "/redrive.v1.Planner/IngestDeadLetters";
/// Default total of bytes ingest streams may hold at once: 256 MiB.
pub const DEFAULT_INGEST_MEMORY_BYTES: usize = 256 * 1024 * 1024;
/// Default time a stream waits for its share before it is refused.
pub const DEFAULT_INGEST_WAIT: Duration = Duration::from_secs(30);
/// Bytes charged per item on top of twice its size: the decoded item's
/// own fields and vectors.
const ITEM_OVERHEAD: usize = 1024;

/// One budget of bytes shared by every ingest stream of the planner.
#[derive(Debug, Clone)]
pub struct IngestBudget {
    permits: Arc<Semaphore>,
    total: usize,
    wait: Duration,
    largest_message: usize,
    refused: Arc<Throttled>,
}

impl IngestBudget {
    /// A budget of `total` bytes (at least 1 MiB, say
    /// [`crate::config::Config::validate`]); a stream waits at most `wait`
    /// for its share. Messages longer than `largest_message` are charged
    /// nothing: tonic refuses them before buffering them.
    pub fn new(total: usize, wait: Duration, largest_message: usize) -> Self {
        let total = total.clamp(1, Semaphore::MAX_PERMITS);
        Self {
            permits: Arc::new(Semaphore::new(total)),
            total,
            wait,
            largest_message,
            refused: Arc::new(Throttled::default()),
        }
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
        let room = self.total.saturating_sub(buffer);
        let growth = length.saturating_sub(buffer).min(room);
        let item = length
            .saturating_mul(2)
            .saturating_add(ITEM_OVERHEAD)
            .min(room - growth);
        Cost { item, growth }
    }

    /// Bytes reserved right now.
    pub fn in_use(&self) -> usize {
        self.total.saturating_sub(self.permits.available_permits())
    }

    /// The budget in bytes.
    pub fn total(&self) -> usize {
        self.total
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

/// One item's share of the budget; dropping it returns the share.
#[derive(Debug)]
pub struct Reservation {
    _permit: OwnedSemaphorePermit,
}

/// The reservations of one ingest stream's messages, in stream order:
/// [`IngestBudgetLayer`] adds one per message it lets through, and the
/// handler takes one per item it receives ([`Reservations::take`]). Found in
/// the request's extensions.
#[derive(Debug, Clone, Default)]
pub struct Reservations(Arc<Mutex<VecDeque<OwnedSemaphorePermit>>>);

impl Reservations {
    fn push(&self, permit: OwnedSemaphorePermit) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push_back(permit);
    }

    /// The reservation of the next item of the stream (`None` when the
    /// stream was not charged, as in tests that call the handler directly).
    pub fn take(&self) -> Option<Reservation> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop_front()
            .map(|permit| Reservation { _permit: permit })
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
            acquiring: None,
            deadline: None,
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

type Acquiring =
    Pin<Box<dyn Future<Output = Result<OwnedSemaphorePermit, AcquireError>> + Send + 'static>>;

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
    /// The reservation being waited for, and what it is for.
    acquiring: Option<(Acquiring, Cost)>,
    /// When the wait of the current reservation ends.
    deadline: Option<Pin<Box<Sleep>>>,
    /// The share of the stream's decoding buffer, held until the stream
    /// ends (with the body).
    buffer: Option<OwnedSemaphorePermit>,
    /// The largest message charged so far (what `buffer` covers).
    buffer_bytes: usize,
}

impl ChargedBody {
    /// Splits `permit` into the item's reservation and the buffer's growth.
    fn charged(&mut self, mut permit: OwnedSemaphorePermit, cost: Cost, length: usize) {
        if cost.growth > 0
            && let Some(growth) = permit.split(cost.growth)
        {
            match self.buffer.as_mut() {
                Some(buffer) => buffer.merge(growth),
                None => self.buffer = Some(growth),
            }
        }
        self.buffer_bytes = self.buffer_bytes.max(length);
        self.reservations.push(permit);
        self.deadline = None;
    }

    /// Reserves the charge of a message of `length` bytes; `Ready(Err)`
    /// when the wait ran out.
    fn poll_reserve(&mut self, cx: &mut Context<'_>, length: usize) -> Poll<Result<(), Status>> {
        if self.acquiring.is_none() {
            let cost = self.budget.cost(length, self.buffer_bytes);
            let permits = u32::try_from(cost.item + cost.growth).unwrap_or(u32::MAX);
            if let Ok(permit) = Arc::clone(&self.budget.permits).try_acquire_many_owned(permits) {
                self.charged(permit, cost, length);
                return Poll::Ready(Ok(()));
            }
            let acquiring = Box::pin(Arc::clone(&self.budget.permits).acquire_many_owned(permits));
            self.acquiring = Some((acquiring, cost));
        }
        let Some((acquiring, cost)) = self.acquiring.as_mut() else {
            return Poll::Ready(Ok(()));
        };
        let cost = *cost;
        match acquiring.as_mut().poll(cx) {
            Poll::Ready(Ok(permit)) => {
                self.acquiring = None;
                self.charged(permit, cost, length);
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(_closed)) => {
                Poll::Ready(Err(Status::unavailable("the planner is stopping")))
            }
            Poll::Pending => {
                let wait = self.budget.wait;
                let deadline = self
                    .deadline
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(wait)));
                if deadline.as_mut().poll(cx).is_ready() {
                    self.acquiring = None;
                    return Poll::Ready(Err(self.budget.exhausted()));
                }
                Poll::Pending
            }
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
