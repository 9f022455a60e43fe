//! The seam between a slice loop and its publisher: the loop publishes
//! through [`Publish`] and connects through [`Connect`], which
//! [`Publisher`] and [`AmqpConnect`] implement (a test gives the loop a
//! fake publisher through the same seam).

use std::{future::Future, time::Duration};

use tokio::time::Instant;

use super::{Outgoing, Pending, PublishError, Publisher, PublisherOptions, Slot};

/// What a slice loop needs of a connected publisher; see [`Publisher`]'s
/// methods of the same names for the contract.
pub trait Publish: Send + Sync + 'static {
    /// Whether the connection and the channel are open
    /// ([`Publisher::is_connected`]).
    fn is_connected(&self) -> bool;

    /// Reserves `count` places of the confirm window
    /// ([`Publisher::reserve`]).
    ///
    /// # Errors
    /// [`PublishError::ConnectionLost`] when the publisher is closed.
    fn reserve(&self, count: usize)
    -> impl Future<Output = Result<Vec<Slot>, PublishError>> + Send;

    /// Publishes `outgoing` in `slot`, unless it is `not_after` by then
    /// ([`Publisher::publish_in`]).
    ///
    /// # Errors
    /// [`PublishError::ConnectionLost`], [`PublishError::Expired`].
    fn publish_in(
        &self,
        slot: Slot,
        outgoing: Outgoing,
        not_after: Option<Instant>,
    ) -> impl Future<Output = Result<Pending, PublishError>> + Send;

    /// How long the oldest publish in flight has waited for its confirm
    /// ([`Publisher::oldest_unconfirmed_age`]).
    fn oldest_unconfirmed_age(&self) -> Option<Duration>;

    /// Window places taken ([`Publisher::in_flight`]).
    fn in_flight(&self) -> usize;

    /// Waits for outstanding confirms, then closes ([`Publisher::close`]).
    ///
    /// # Errors
    /// None in practice.
    fn close(self) -> impl Future<Output = Result<(), PublishError>> + Send;
}

/// How a slice loop gets a new publisher (at the start, and after the
/// connection was lost).
pub trait Connect: Send + Sync + 'static {
    /// The publisher it connects.
    type Publisher: Publish;

    /// A new, connected publisher.
    ///
    /// # Errors
    /// A retryable [`PublishError::Connect`] when the broker cannot be
    /// reached; [`PublishError::InvalidWindow`].
    fn connect(&self) -> impl Future<Output = Result<Self::Publisher, PublishError>> + Send;
}

/// Connects [`Publisher`]s to the broker at `amqp_url` with `options`.
#[derive(Debug, Clone)]
pub struct AmqpConnect {
    /// The broker's AMQP URL.
    pub amqp_url: String,
    /// Window, confirm timeout and heartbeat of every publisher.
    pub options: PublisherOptions,
}

impl Connect for AmqpConnect {
    type Publisher = Publisher;

    fn connect(&self) -> impl Future<Output = Result<Publisher, PublishError>> + Send {
        Publisher::connect_with(&self.amqp_url, self.options)
    }
}

impl Publish for Publisher {
    fn is_connected(&self) -> bool {
        Self::is_connected(self)
    }

    fn reserve(
        &self,
        count: usize,
    ) -> impl Future<Output = Result<Vec<Slot>, PublishError>> + Send {
        Self::reserve(self, count)
    }

    fn publish_in(
        &self,
        slot: Slot,
        outgoing: Outgoing,
        not_after: Option<Instant>,
    ) -> impl Future<Output = Result<Pending, PublishError>> + Send {
        Self::publish_in(self, slot, outgoing, not_after)
    }

    fn oldest_unconfirmed_age(&self) -> Option<Duration> {
        Self::oldest_unconfirmed_age(self)
    }

    fn in_flight(&self) -> usize {
        Self::in_flight(self)
    }

    fn close(self) -> impl Future<Output = Result<(), PublishError>> + Send {
        Self::close(self)
    }
}
