//! The charged request body of an ingest stream ([`ChargedBody`]): the
//! gRPC framing read as the bytes flow by ([`Framing`]), each message's
//! bytes held back until its charge is reserved.

use std::{
    pin::Pin,
    sync::{Arc, PoisonError},
    task::{Context, Poll},
};

use bytes::{Buf, Bytes};
use http_body::{Body, Frame, SizeHint};
use tokio::{sync::futures::OwnedNotified, time::Sleep};
use tonic::Status;

use super::{Cost, IngestBudget, Reservations, Share, WaitPlace};

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
pub(super) struct ChargedBody {
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
    /// `inner`, the body of an ingest stream from `caller`, charged to
    /// `budget`; each message's reservation goes to `reservations`.
    pub(super) fn new(
        inner: tonic::body::Body,
        budget: IngestBudget,
        reservations: Reservations,
        caller: Arc<str>,
    ) -> Self {
        Self {
            inner,
            budget,
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
        }
    }

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
}
