//! The seam between a slice loop and its publisher: the loop publishes
//! through [`Publish`] and connects through [`Connect`], which
//! [`Publisher`] and [`AmqpConnect`] implement (a test gives the loop a
//! fake publisher through the same seam).

use std::{future::Future, time::Duration};

use redrive_proto::amqp_nodes::{AmqpNode, AmqpNodes};
use tokio::time::Instant;

use super::{Handoff, Outgoing, Pending, PublishError, Publisher, PublisherOptions, Slot};

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

    /// Publishes `outgoing` in `slot`, unless it is `not_after` by then,
    /// returning as `handoff` says ([`Publisher::publish_in`]).
    ///
    /// # Errors
    /// [`PublishError::ConnectionLost`], [`PublishError::Expired`].
    fn publish_in(
        &self,
        slot: Slot,
        outgoing: Outgoing,
        not_after: Option<Instant>,
        handoff: Handoff,
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

/// Connects [`Publisher`]s to the broker's nodes `amqp` with `options`.
///
/// Each [`Connect::connect`] tries the nodes in turn, starting after the
/// node of the previous attempt ([`AmqpNodes::next`]: after a failed
/// attempt, and after a connection that was lost, since a slice loop only
/// connects again once its publisher is gone), until one accepts; so a
/// dead node is skipped within one call, and a reconnect goes to another
/// node. The node reached is logged (`host:port`, no credentials).
#[derive(Debug, Clone)]
pub struct AmqpConnect {
    /// The broker's node URLs, and which one is next.
    pub amqp: AmqpNodes,
    /// Window, confirm timeout and heartbeat of every publisher.
    pub options: PublisherOptions,
    /// What the slice loops last said of a node that failed them: each
    /// node's failure is said once a round for all loops.
    pub failures: crate::loop_failures::LoopFailures,
}

impl AmqpConnect {
    /// A publisher connected to the first of the nodes that accepts, in
    /// the round-robin order, and the node.
    ///
    /// # Errors
    /// When no node accepts: the last node's [`PublishError::Connect`],
    /// naming every node tried (`host:port` and why);
    /// [`PublishError::InvalidWindow`].
    pub async fn connect_to_a_node(&self) -> Result<(Publisher, AmqpNode), PublishError> {
        let mut failures = Vec::new();
        let nodes = self.amqp.len();
        for tried in 1..=nodes {
            let node = self.amqp.next();
            match Publisher::connect_with(&node.url, self.options).await {
                Ok(publisher) => return Ok((publisher, node)),
                Err(PublishError::Connect { reason }) => {
                    // After the last node, the caller's line names them all;
                    // before it, one line a round for all slice loops (a
                    // node's round is about the caller's longest delay).
                    if tried < nodes
                        && self.failures.to_say(
                            &node.address(),
                            &reason,
                            Instant::now(),
                            Duration::from_secs(5),
                        )
                    {
                        tracing::warn!(broker.node = %node, %reason, "broker node refused or unreachable; trying the next (said once for all slice loops)");
                    }
                    failures.push(format!("{}: {reason}", node.address()));
                }
                Err(other) => return Err(other),
            }
        }
        Err(PublishError::Connect {
            reason: failures.join("; "),
        })
    }
}

impl Connect for AmqpConnect {
    type Publisher = Publisher;

    async fn connect(&self) -> Result<Publisher, PublishError> {
        let started = Instant::now();
        let (publisher, node) = self.connect_to_a_node().await?;
        // Each slice loop has a connection of its own: said once for them
        // all, when the first connects to a node and after a failure said.
        if self.failures.mended_since("connect", started) {
            tracing::info!(broker.node = %node, "connected to the broker again (said once for all slice loops)");
        } else if self.failures.to_say(
            "connected",
            &node.address(),
            Instant::now(),
            Duration::from_secs(3600),
        ) {
            tracing::info!(broker.node = %node, "connected to the broker");
        } else {
            tracing::debug!(broker.node = %node, "connected to the broker");
        }
        Ok(publisher)
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
        handoff: Handoff,
    ) -> impl Future<Output = Result<Pending, PublishError>> + Send {
        Self::publish_in(self, slot, outgoing, not_after, handoff)
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
