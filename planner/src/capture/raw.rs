//! A second, deliberately small AMQP 0-9-1 client for the deliveries lapin
//! cannot decode (docs/design.md, "Messages the client cannot read").
//!
//! lapin ends the whole connection when one frame fails to parse: a short
//! string that is not UTF-8 (a property such as `type`, a header name, the
//! routing key of `basic.deliver`), a header frame larger than the negotiated
//! `frame_max` (the broker adds `x-death` after the publisher sized it).
//! RabbitMQ accepts these from publishers,
//! and the broker redelivers the message first, so capture of that queue would
//! stop for good. This client takes one message at a time with `basic.get`
//! (AMQP 0-9-1 §1.8.3.10) and reads its content header leniently:
//! [`decode_content_header`] never fails on a value, it names each problem.
//!
//! It speaks only what capture needs: PLAIN login over `amqp://`, one channel,
//! `basic.get`/`ack`/`reject`, `queue.declare`, and publishing an exactly given
//! content header with publisher confirms (RabbitMQ, "Publisher Confirms").
//! Method frames are written and read by `amq-protocol` (lapin's own codec);
//! only `basic.get-ok` and content headers, which carry message data, are read
//! here.
//!
//! - `connection.rs`: [`RawConnection`], the handshake, `basic.get`, acks,
//!   declaring and publishing with confirms, and the frames under them.
//! - `header.rs`: [`decode_content_header`], the lenient reader of a content
//!   header into [`DecodedHeader`] (properties, headers table, problems).
//! - `reader.rs`: the length-checked cursor both read message bytes with.
//!
//! Encoders for content headers lapin cannot publish (any bytes in a short
//! string) are test support: `redrive_test_support::amqp`.

mod connection;
mod header;
mod reader;

use std::time::Duration;

pub use connection::RawConnection;
pub use header::{DecodedHeader, decode_content_header};

/// Frames above this many bytes are refused even from the broker: far above
/// any `frame_max` RabbitMQ negotiates (its default is 128 KiB), low enough
/// that a corrupt size cannot make the planner allocate gigabytes.
pub const MAX_INBOUND_FRAME: u32 = 64 * 1024 * 1024;

/// Tables and arrays nested deeper than this are not read further: real
/// headers nest three levels (`x-death` → entry → `routing-keys`); a deep one
/// is a problem of the message, never a crash of the planner. The API's limit
/// ([`redrive_proto::limits::MAX_HEADER_NESTING`]).
pub use redrive_proto::limits::MAX_HEADER_NESTING as MAX_NESTING;

/// At most this many problems are listed for one message (then one line
/// saying more were found): a crafted header with thousands of bad names
/// must not cost the planner memory.
pub const MAX_PROBLEMS: usize = 16;

/// Bodies above this are refused (RabbitMQ's own maximum message size is
/// 512 MiB, "max_message_size").
pub const MAX_BODY: u64 = 512 * 1024 * 1024;

/// What went wrong with the raw connection. The message being read stays
/// unacked, so the broker requeues it when the connection closes.
#[derive(Debug, thiserror::Error)]
pub enum RawError {
    /// Socket error.
    #[error("connection: {0}")]
    Io(#[from] std::io::Error),
    /// The broker closed the connection or channel.
    #[error("broker closed the {what}: {code} {text}")]
    Closed {
        /// `connection` or `channel`.
        what: &'static str,
        /// AMQP reply code.
        code: u16,
        /// Reply text.
        text: String,
    },
    /// The broker sent something this client cannot follow.
    #[error("protocol: {0}")]
    Protocol(String),
    /// The URI is not one this client can use.
    #[error("{0}")]
    Unsupported(String),
    /// No reply in time.
    #[error("no reply from the broker within {0:?}")]
    Timeout(Duration),
    /// Connecting to the broker `node` (`host:port (node i of n)`, no
    /// credentials) failed with `source`.
    #[error("broker {node}: {source}")]
    AtNode {
        /// The node.
        node: String,
        /// What failed.
        source: Box<RawError>,
    },
}

/// One message taken with `basic.get`, exactly as the broker sent it.
#[derive(Debug, Clone)]
pub struct RawMessage {
    /// Channel-scoped delivery tag, for [`RawConnection::ack`].
    pub delivery_tag: u64,
    /// The broker's `redelivered` flag.
    pub redelivered: bool,
    /// Exchange it was published to, bytes as sent.
    pub exchange: Vec<u8>,
    /// Routing key it was published with, bytes as sent.
    pub routing_key: Vec<u8>,
    /// The content header frame's payload, byte for byte (class, weight, body
    /// size, property flags and list).
    pub header: Vec<u8>,
    /// The body.
    pub body: Vec<u8>,
}
