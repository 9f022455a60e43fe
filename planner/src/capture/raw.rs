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

use std::time::Duration;

use amq_protocol::{
    frame::{AMQPFrame, WriteContext, gen_frame},
    protocol::{AMQPClass, basic, channel, confirm, connection, exchange, parse_class, queue},
    types::{FieldTable, LongString, ShortString},
    uri::{AMQPScheme, AMQPUri},
};
use redrive_proto::v1::{
    DecimalValue, HeaderArray, HeaderTable, HeaderValue, MessageProperties, Void,
    header_value::Value,
};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt, BufReader},
    net::TcpStream,
};

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

/// A field path in a problem keeps at most this many characters per name
/// and this many in all.
const PATH_NAME_CHARS: usize = 32;
const PATH_CHARS: usize = 200;

/// Bodies above this are refused (RabbitMQ's own maximum message size is
/// 512 MiB, "max_message_size").
pub const MAX_BODY: u64 = 512 * 1024 * 1024;

/// How long one broker round trip may take before the connection is given up.
const REPLY_TIMEOUT: Duration = Duration::from_secs(30);

const FRAME_METHOD: u8 = 1;
const FRAME_HEADER: u8 = 2;
const FRAME_BODY: u8 = 3;
const FRAME_HEARTBEAT: u8 = 8;
const FRAME_END: u8 = 0xCE;
const CHANNEL: u16 = 1;

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

/// A connection with one open channel.
pub struct RawConnection {
    reader: BufReader<tokio::net::tcp::OwnedReadHalf>,
    writer: tokio::net::tcp::OwnedWriteHalf,
    /// Negotiated `frame_max` (what this client may send).
    frame_max: u32,
    confirms: bool,
    published: u64,
    username: String,
    /// Messages taken with `basic.get` and not acked.
    unacked: usize,
}

impl RawConnection {
    /// Connects and opens channel 1.
    ///
    /// # Errors
    /// [`RawError::Unsupported`] for an `amqps://` URI or a mechanism other
    /// than PLAIN; otherwise connection and handshake failures.
    pub async fn connect(url: &str) -> Result<Self, RawError> {
        let uri: AMQPUri = url
            .parse()
            .map_err(|error: String| RawError::Unsupported(format!("AMQP URI: {error}")))?;
        if uri.scheme != AMQPScheme::AMQP {
            return Err(RawError::Unsupported(
                "the fallback reader speaks only amqp://, not amqps://".into(),
            ));
        }
        let stream = tokio::time::timeout(
            REPLY_TIMEOUT,
            TcpStream::connect((uri.authority.host.as_str(), uri.authority.port)),
        )
        .await
        .map_err(|_| RawError::Timeout(REPLY_TIMEOUT))??;
        stream.set_nodelay(true)?;
        let (read, write) = stream.into_split();
        let mut this = Self {
            reader: BufReader::new(read),
            writer: write,
            frame_max: 4096,
            confirms: false,
            published: 0,
            username: uri.authority.userinfo.username.clone(),
            unacked: 0,
        };
        this.writer.write_all(b"AMQP\x00\x00\x09\x01").await?;
        let AMQPClass::Connection(connection::AMQPMethod::Start(start)) = this.method(0).await?
        else {
            return Err(RawError::Protocol("expected connection.start".into()));
        };
        if !String::from_utf8_lossy(start.mechanisms.as_bytes())
            .split(' ')
            .any(|m| m == "PLAIN")
        {
            return Err(RawError::Unsupported(
                "the broker does not offer PLAIN login".into(),
            ));
        }
        let user = &uri.authority.userinfo;
        let response = format!("\0{}\0{}", user.username, user.password);
        this.send_method(
            0,
            AMQPClass::Connection(connection::AMQPMethod::StartOk(connection::StartOk {
                client_properties: FieldTable::default(),
                mechanism: ShortString::from("PLAIN"),
                response: LongString::from(response.into_bytes()),
                locale: ShortString::from("en_US"),
            })),
        )
        .await?;
        let AMQPClass::Connection(connection::AMQPMethod::Tune(tune)) = this.method(0).await?
        else {
            return Err(RawError::Protocol("expected connection.tune".into()));
        };
        // What we send stays within the broker's frame_max; what we accept is
        // bounded by MAX_INBOUND_FRAME instead (the point of this client).
        this.frame_max = if tune.frame_max == 0 {
            131_072
        } else {
            tune.frame_max
        };
        this.send_method(
            0,
            AMQPClass::Connection(connection::AMQPMethod::TuneOk(connection::TuneOk {
                channel_max: 1,
                frame_max: this.frame_max,
                heartbeat: 0,
            })),
        )
        .await?;
        this.send_method(
            0,
            AMQPClass::Connection(connection::AMQPMethod::Open(connection::Open {
                virtual_host: ShortString::from(uri.vhost.clone()),
            })),
        )
        .await?;
        let AMQPClass::Connection(connection::AMQPMethod::OpenOk(_)) = this.method(0).await? else {
            return Err(RawError::Protocol("expected connection.open-ok".into()));
        };
        this.send_method(
            CHANNEL,
            AMQPClass::Channel(channel::AMQPMethod::Open(channel::Open {})),
        )
        .await?;
        let AMQPClass::Channel(channel::AMQPMethod::OpenOk(_)) = this.method(CHANNEL).await? else {
            return Err(RawError::Protocol("expected channel.open-ok".into()));
        };
        Ok(this)
    }

    /// The negotiated `frame_max`: no frame this client sends may be larger.
    pub fn frame_max(&self) -> u32 {
        self.frame_max
    }

    /// The user this connection logged in as (`user_id` must match it on
    /// publish, rabbitmq.com/docs/validated-user-id).
    pub fn username(&self) -> &str {
        &self.username
    }

    /// Takes the message at the head of `queue` without acking it, or `None`
    /// when the queue is empty.
    ///
    /// # Errors
    /// Connection failures, or the broker closing the channel (no such queue).
    pub async fn get(&mut self, queue: &str) -> Result<Option<RawMessage>, RawError> {
        self.send_method(
            CHANNEL,
            AMQPClass::Basic(basic::AMQPMethod::Get(basic::Get {
                queue: short(queue)?,
                no_ack: false,
            })),
        )
        .await?;
        loop {
            let (channel_id, payload) = self.method_frame().await?;
            match class_method(&payload) {
                // basic.get-empty
                (60, 72) => return Ok(None),
                // basic.get-ok: read here, its strings are message data
                (60, 71) => {
                    let mut reader = Reader::new(&payload[4..]);
                    let delivery_tag = reader.u64()?;
                    let redelivered = reader.u8()? & 1 == 1;
                    let exchange = reader.short_bytes()?.to_vec();
                    let routing_key = reader.short_bytes()?.to_vec();
                    let (kind, _, header) = self.frame().await?;
                    if kind != FRAME_HEADER || header.len() < 14 {
                        return Err(RawError::Protocol("expected a content header".into()));
                    }
                    let body = self.body(&header).await?;
                    self.unacked += 1;
                    return Ok(Some(RawMessage {
                        delivery_tag,
                        redelivered,
                        exchange,
                        routing_key,
                        header,
                        body,
                    }));
                }
                _ => self.unexpected(channel_id, &payload)?,
            }
        }
    }

    /// Reads the body frames that follow content header `header`: exactly
    /// its declared size, at most [`MAX_BODY`], no empty frame.
    async fn body(&mut self, header: &[u8]) -> Result<Vec<u8>, RawError> {
        let body_size = u64::from_be_bytes(header[4..12].try_into().expect("8 bytes"));
        if body_size > MAX_BODY {
            return Err(RawError::Protocol(format!(
                "a body of {body_size} bytes is over {MAX_BODY}"
            )));
        }
        let mut body = Vec::new();
        while (body.len() as u64) < body_size {
            let (kind, _, chunk) = self.frame().await?;
            if kind != FRAME_BODY || chunk.is_empty() {
                return Err(RawError::Protocol("expected a non-empty body frame".into()));
            }
            body.extend_from_slice(&chunk);
            if body.len() as u64 > body_size {
                return Err(RawError::Protocol(format!(
                    "body frames carry more than the declared {body_size} bytes"
                )));
            }
        }
        Ok(body)
    }

    /// Messages taken with [`Self::get`] and not acked: held by this
    /// connection, back in their queue when it closes.
    pub fn unacked(&self) -> usize {
        self.unacked
    }

    /// Whether the connection is still usable, without waiting: the broker
    /// sends nothing unasked on it (no heartbeats, no capabilities), so any
    /// byte or end of stream means it closed the channel or connection (for
    /// example at `consumer_timeout`), which returned the held messages.
    pub fn is_alive(&mut self) -> bool {
        use futures::FutureExt;
        use tokio::io::AsyncBufReadExt;
        self.reader.fill_buf().now_or_never().is_none()
    }

    /// Acks one message (`basic.ack`, not multiple).
    ///
    /// # Errors
    /// Connection failures.
    pub async fn ack(&mut self, delivery_tag: u64) -> Result<(), RawError> {
        self.send_method(
            CHANNEL,
            AMQPClass::Basic(basic::AMQPMethod::Ack(basic::Ack {
                delivery_tag,
                multiple: false,
            })),
        )
        .await?;
        self.unacked = self.unacked.saturating_sub(1);
        Ok(())
    }

    /// A round trip on the channel (`basic.qos` with no limit, which
    /// `basic.get` ignores): its reply proves the broker processed every
    /// frame sent before it, such as an ack (AMQP 0-9-1 §2.3.6).
    ///
    /// # Errors
    /// Connection failures.
    pub async fn sync(&mut self) -> Result<(), RawError> {
        self.send_method(
            CHANNEL,
            AMQPClass::Basic(basic::AMQPMethod::Qos(basic::Qos {
                prefetch_count: 0,
                global: false,
            })),
        )
        .await?;
        loop {
            let (_, channel_id, payload) = self.frame().await?;
            if class_method(&payload) == (60, 11) {
                return Ok(());
            }
            self.unexpected(channel_id, &payload)?;
        }
    }

    /// Declares a durable fanout exchange and a durable classic queue, both
    /// named `name`, the queue bound to the exchange (idempotent). A message
    /// published to a fanout exchange reaches only its bound queues: its
    /// routing key and any `CC`/`BCC` header are ignored (RabbitMQ,
    /// "Sender-selected Distribution" applies to routing keys, which fanout
    /// does not read).
    ///
    /// # Errors
    /// The broker refusing (exists with other arguments, no permission),
    /// connection failures.
    pub async fn declare_parking(&mut self, name: &str) -> Result<(), RawError> {
        self.send_method(
            CHANNEL,
            AMQPClass::Exchange(exchange::AMQPMethod::Declare(exchange::Declare {
                exchange: short(name)?,
                kind: ShortString::from("fanout"),
                passive: false,
                durable: true,
                auto_delete: false,
                internal: false,
                nowait: false,
                arguments: FieldTable::default(),
            })),
        )
        .await?;
        self.expect(40, 11).await?;
        self.declare_queue(name).await?;
        self.send_method(
            CHANNEL,
            AMQPClass::Queue(queue::AMQPMethod::Bind(queue::Bind {
                queue: short(name)?,
                exchange: short(name)?,
                routing_key: ShortString::from(""),
                nowait: false,
                arguments: FieldTable::default(),
            })),
        )
        .await?;
        self.expect(50, 21).await
    }

    /// Declares a durable classic queue (idempotent when it exists with the
    /// same arguments).
    ///
    /// # Errors
    /// The broker refusing (different arguments), connection failures.
    pub async fn declare_queue(&mut self, name: &str) -> Result<(), RawError> {
        self.send_method(
            CHANNEL,
            AMQPClass::Queue(queue::AMQPMethod::Declare(queue::Declare {
                queue: short(name)?,
                passive: false,
                durable: true,
                exclusive: false,
                auto_delete: false,
                nowait: false,
                arguments: FieldTable::default(),
            })),
        )
        .await?;
        self.expect(50, 11).await
    }

    /// Waits for method `class.method` on the channel.
    async fn expect(&mut self, class: u16, method: u16) -> Result<(), RawError> {
        loop {
            let (_, channel_id, payload) = self.frame().await?;
            if class_method(&payload) == (class, method) {
                return Ok(());
            }
            self.unexpected(channel_id, &payload)?;
        }
    }

    /// Publishes `body` with exactly the content header `header` (a content
    /// header frame payload, as in [`RawMessage::header`]), `mandatory` set,
    /// and waits for the broker's confirm. `Ok(true)`: confirmed and routed;
    /// `Ok(false)`: nacked, or returned unroutable (`basic.return`, AMQP
    /// 0-9-1 §1.8.3.9; the broker acks a returned message too).
    ///
    /// # Errors
    /// [`RawError::Protocol`] when the header does not fit one frame of the
    /// negotiated `frame_max`; connection failures.
    pub async fn publish(
        &mut self,
        exchange: &str,
        routing_key: &[u8],
        header: &[u8],
        body: &[u8],
    ) -> Result<bool, RawError> {
        if header.len() + 8 > self.frame_max as usize {
            return Err(RawError::Protocol(format!(
                "content header of {} bytes is over the broker's frame_max {}",
                header.len(),
                self.frame_max
            )));
        }
        if !self.confirms {
            self.send_method(
                CHANNEL,
                AMQPClass::Confirm(confirm::AMQPMethod::Select(confirm::Select {
                    nowait: false,
                })),
            )
            .await?;
            loop {
                let (_, channel_id, payload) = self.frame().await?;
                if class_method(&payload) == (85, 11) {
                    break;
                }
                self.unexpected(channel_id, &payload)?;
            }
            self.confirms = true;
        }
        // basic.publish is written by hand: the routing key is message data
        // and may be any bytes.
        let mut method = Vec::with_capacity(16 + exchange.len() + routing_key.len());
        method.extend_from_slice(&60u16.to_be_bytes());
        method.extend_from_slice(&40u16.to_be_bytes());
        method.extend_from_slice(&0u16.to_be_bytes());
        push_short(&mut method, exchange.as_bytes())?;
        push_short(&mut method, routing_key)?;
        method.push(1); // mandatory
        let mut out = frame(FRAME_METHOD, CHANNEL, &method);
        out.extend(frame(FRAME_HEADER, CHANNEL, header));
        let chunk = (self.frame_max as usize).saturating_sub(8).max(1);
        for part in body.chunks(chunk) {
            out.extend(frame(FRAME_BODY, CHANNEL, part));
        }
        self.writer.write_all(&out).await?;
        self.published += 1;
        let mut returned = false;
        loop {
            let (channel_id, payload) = self.method_frame().await?;
            match class_method(&payload) {
                (60, 80) => return Ok(!returned),
                (60, 120) => return Ok(false),
                (60, 50) => {
                    let (kind, _, header) = self.frame().await?;
                    if kind != FRAME_HEADER || header.len() < 14 {
                        return Err(RawError::Protocol("expected a content header".into()));
                    }
                    self.body(&header).await?;
                    returned = true;
                }
                _ => self.unexpected(channel_id, &payload)?,
            }
        }
    }

    /// Closes the connection politely (unacked messages return to their
    /// queues).
    pub async fn close(mut self) {
        let _ = self
            .send_method(
                0,
                AMQPClass::Connection(connection::AMQPMethod::Close(connection::Close {
                    reply_code: 200,
                    reply_text: ShortString::from("done"),
                    class_id: 0,
                    method_id: 0,
                })),
            )
            .await;
        let _ = tokio::time::timeout(Duration::from_secs(2), async { self.frame().await }).await;
    }

    async fn send_method(&mut self, channel_id: u16, class: AMQPClass) -> Result<(), RawError> {
        let frame = AMQPFrame::Method(channel_id, class);
        let bytes = gen_frame(&frame)(WriteContext::from(Vec::new()))
            .map_err(|error| RawError::Protocol(format!("encoding a method: {error}")))?
            .write;
        self.writer.write_all(&bytes).await?;
        Ok(())
    }

    /// The next method on `channel_id`, parsed by amq-protocol.
    async fn method(&mut self, channel_id: u16) -> Result<AMQPClass, RawError> {
        loop {
            let (kind, got, payload) = self.frame().await?;
            if kind != FRAME_METHOD {
                continue;
            }
            if let Some(class) = self.closing(got, &payload)?
                && got == channel_id
            {
                return Ok(class);
            }
        }
    }

    /// Parses a method; a close from the broker is an error.
    fn closing(&mut self, channel_id: u16, payload: &[u8]) -> Result<Option<AMQPClass>, RawError> {
        let class = parse_class(payload)
            .map(|(_, class)| class)
            .map_err(|error| RawError::Protocol(format!("method frame: {error:?}")))?;
        match &class {
            AMQPClass::Connection(connection::AMQPMethod::Close(close)) => Err(RawError::Closed {
                what: "connection",
                code: close.reply_code,
                text: close.reply_text.to_string(),
            }),
            AMQPClass::Channel(channel::AMQPMethod::Close(close)) => Err(RawError::Closed {
                what: if channel_id == 0 {
                    "connection"
                } else {
                    "channel"
                },
                code: close.reply_code,
                text: close.reply_text.to_string(),
            }),
            _ => Ok(Some(class)),
        }
    }

    fn unexpected(&mut self, channel_id: u16, payload: &[u8]) -> Result<(), RawError> {
        let (class, method) = class_method(payload);
        self.closing(channel_id, payload)?;
        Err(RawError::Protocol(format!(
            "unexpected method {class}.{method} on channel {channel_id}"
        )))
    }

    /// Reads one frame that must be a method frame: (channel, payload).
    async fn method_frame(&mut self) -> Result<(u16, Vec<u8>), RawError> {
        let (kind, channel_id, payload) = self.frame().await?;
        if kind != FRAME_METHOD {
            return Err(RawError::Protocol(format!(
                "expected a method frame, got type {kind}"
            )));
        }
        Ok((channel_id, payload))
    }

    /// Reads one frame: (type, channel, payload). Heartbeats are skipped.
    async fn frame(&mut self) -> Result<(u8, u16, Vec<u8>), RawError> {
        tokio::time::timeout(REPLY_TIMEOUT, async {
            loop {
                let kind = self.reader.read_u8().await?;
                let channel_id = self.reader.read_u16().await?;
                let size = self.reader.read_u32().await?;
                if size > MAX_INBOUND_FRAME {
                    return Err(RawError::Protocol(format!(
                        "frame of {size} bytes is over {MAX_INBOUND_FRAME}"
                    )));
                }
                let mut payload = vec![0; size as usize];
                self.reader.read_exact(&mut payload).await?;
                if self.reader.read_u8().await? != FRAME_END {
                    return Err(RawError::Protocol("frame end octet missing".into()));
                }
                if kind != FRAME_HEARTBEAT {
                    return Ok((kind, channel_id, payload));
                }
            }
        })
        .await
        .map_err(|_| RawError::Timeout(REPLY_TIMEOUT))?
    }
}

fn class_method(payload: &[u8]) -> (u16, u16) {
    if payload.len() < 4 {
        return (0, 0);
    }
    (
        u16::from_be_bytes([payload[0], payload[1]]),
        u16::from_be_bytes([payload[2], payload[3]]),
    )
}

fn frame(kind: u8, channel_id: u16, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(payload.len() + 8);
    out.push(kind);
    out.extend_from_slice(&channel_id.to_be_bytes());
    out.extend_from_slice(
        &u32::try_from(payload.len())
            .unwrap_or(u32::MAX)
            .to_be_bytes(),
    );
    out.extend_from_slice(payload);
    out.push(FRAME_END);
    out
}

fn short(value: &str) -> Result<ShortString, RawError> {
    if value.len() > 255 {
        return Err(RawError::Protocol(format!(
            "{value:?} is over 255 bytes (an AMQP short string)"
        )));
    }
    Ok(ShortString::from(value))
}

fn push_short(out: &mut Vec<u8>, value: &[u8]) -> Result<(), RawError> {
    let len = u8::try_from(value.len()).map_err(|_| {
        RawError::Protocol(format!(
            "{} bytes is over 255 (an AMQP short string)",
            value.len()
        ))
    })?;
    out.push(len);
    out.extend_from_slice(value);
    Ok(())
}

/// A content header read leniently: every value that could be read, and what
/// could not be read faithfully.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DecodedHeader {
    /// The basic properties; a string that is not UTF-8 holds its lossy form.
    pub properties: MessageProperties,
    /// The `headers` table; a name or string that is not UTF-8 is held in its
    /// lossy form; a table cut short keeps the fields before the problem.
    pub headers: HeaderTable,
    /// Declared body size.
    pub body_size: u64,
    /// What could not be read faithfully, one readable line each (for
    /// example `property type is not UTF-8: 62 65 73 …`). Empty means the
    /// decoded form is exactly what lapin would have produced.
    pub problems: Vec<String>,
}

/// Reads a content header frame payload (AMQP 0-9-1 §4.2.6.1, basic class
/// properties in §1.8) without failing on a value: strings that are not UTF-8
/// are kept lossily, an unknown field type or nesting deeper than
/// [`MAX_NESTING`] ends that table, and each is named in `problems`. Field
/// types follow RabbitMQ's table (rabbitmq.com/amqp-0-9-1-errata, "Field
/// types"), as lapin does.
///
/// # Errors
/// Only when the payload is cut short before the property flags.
pub fn decode_content_header(payload: &[u8]) -> Result<DecodedHeader, RawError> {
    let mut reader = Reader::new(payload);
    let _class = reader.u16()?;
    let _weight = reader.u16()?;
    let body_size = reader.u64()?;
    let mut flags = Vec::new();
    loop {
        let word = reader.u16()?;
        flags.push(word);
        if word & 1 == 0 || flags.len() > 4 {
            break;
        }
    }
    let flag = |bit: u16| flags[0] & (1 << bit) != 0;
    let mut decoded = DecodedHeader {
        body_size,
        ..DecodedHeader::default()
    };
    if flags.len() > 1 || flags[0] & 0b11 != 0 {
        note(
            &mut decoded.problems,
            "property flags name properties AMQP 0-9-1 does not define".to_owned(),
        );
    }
    let outcome = decode_properties(&mut reader, &flag, &mut decoded);
    if let Err(problem) = outcome {
        note(&mut decoded.problems, problem);
    } else if !reader.is_empty() {
        note(
            &mut decoded.problems,
            format!("{} bytes after the last property", reader.bytes.len()),
        );
    }
    Ok(decoded)
}

fn decode_properties(
    reader: &mut Reader<'_>,
    flag: &dyn Fn(u16) -> bool,
    decoded: &mut DecodedHeader,
) -> Result<(), String> {
    let cut = |error: RawError| format!("content header cut short: {error}");
    let text = |reader: &mut Reader<'_>, name: &str, problems: &mut Vec<String>| {
        reader
            .short_bytes()
            .map(|bytes| lossy(bytes, &format!("property {name}"), problems))
            .map_err(cut)
    };
    let p = &mut decoded.properties;
    let problems = &mut decoded.problems;
    if flag(15) {
        p.content_type = Some(text(reader, "content_type", problems)?);
    }
    if flag(14) {
        p.content_encoding = Some(text(reader, "content_encoding", problems)?);
    }
    if flag(13) {
        let length = reader.u32().map_err(cut)? as usize;
        let table = reader.take(length).map_err(cut)?;
        decoded.headers = decode_table(table, 1, "headers", problems);
    }
    if flag(12) {
        p.delivery_mode = Some(u32::from(reader.u8().map_err(cut)?));
    }
    if flag(11) {
        p.priority = Some(u32::from(reader.u8().map_err(cut)?));
    }
    if flag(10) {
        p.correlation_id = Some(text(reader, "correlation_id", problems)?);
    }
    if flag(9) {
        p.reply_to = Some(text(reader, "reply_to", problems)?);
    }
    if flag(8) {
        p.expiration = Some(text(reader, "expiration", problems)?);
    }
    if flag(7) {
        p.message_id = Some(text(reader, "message_id", problems)?);
    }
    if flag(6) {
        p.timestamp = Some(reader.u64().map_err(cut)?);
    }
    if flag(5) {
        p.r#type = Some(text(reader, "type", problems)?);
    }
    if flag(4) {
        p.user_id = Some(text(reader, "user_id", problems)?);
    }
    if flag(3) {
        p.app_id = Some(text(reader, "app_id", problems)?);
    }
    if flag(2) {
        p.cluster_id = Some(text(reader, "cluster_id", problems)?);
    }
    Ok(())
}

fn lossy(bytes: &[u8], what: &str, problems: &mut Vec<String>) -> String {
    match std::str::from_utf8(bytes) {
        Ok(text) => text.to_owned(),
        Err(_) => {
            note(
                problems,
                format!("{what} is not UTF-8: {}", hex_preview(bytes)),
            );
            String::from_utf8_lossy(bytes).into_owned()
        }
    }
}

/// Records a problem, at most [`MAX_PROBLEMS`] of them and then one line
/// saying more were found.
fn note(problems: &mut Vec<String>, problem: String) {
    match problems.len() {
        n if n < MAX_PROBLEMS => problems.push(problem),
        n if n == MAX_PROBLEMS => problems.push("more problems not listed".to_owned()),
        _ => {}
    }
}

/// `path.name`, each name and the whole cut short for problem lines.
fn child_path(path: &str, name: &str) -> String {
    let mut child = String::with_capacity(path.len() + PATH_NAME_CHARS + 1);
    child.push_str(path);
    if child.chars().count() >= PATH_CHARS {
        return child;
    }
    child.push('.');
    child.extend(name.chars().take(PATH_NAME_CHARS));
    if name.chars().count() > PATH_NAME_CHARS {
        child.push('…');
    }
    child
}

fn hex_preview(bytes: &[u8]) -> String {
    let shown: Vec<String> = bytes.iter().take(32).map(|b| format!("{b:02x}")).collect();
    let more = if bytes.len() > 32 { " …" } else { "" };
    format!("{}{more}", shown.join(" "))
}

fn decode_table(bytes: &[u8], depth: usize, path: &str, problems: &mut Vec<String>) -> HeaderTable {
    let mut table = HeaderTable::default();
    if depth > MAX_NESTING {
        note(
            problems,
            format!("{path} nests deeper than {MAX_NESTING} levels; not read"),
        );
        return table;
    }
    let mut reader = Reader::new(bytes);
    while !reader.is_empty() {
        let key = match reader.short_bytes() {
            Ok(key) => key,
            Err(_) => {
                note(problems, format!("{path}: a field name is cut short"));
                break;
            }
        };
        let key = lossy(key, &format!("{path} field name"), problems);
        let field = child_path(path, &key);
        match decode_value(&mut reader, depth, &field, problems) {
            Some(value) => {
                if table.fields.insert(key, value).is_some() {
                    note(
                        problems,
                        format!("{field}: the name appears twice (or two names read the same)"),
                    );
                }
            }
            None => break,
        }
    }
    table
}

/// One field value; `None` when the rest of the enclosing table or array
/// cannot be read (unknown type, cut short), with the problem recorded.
fn decode_value(
    reader: &mut Reader<'_>,
    depth: usize,
    path: &str,
    problems: &mut Vec<String>,
) -> Option<HeaderValue> {
    let cut = |problems: &mut Vec<String>| {
        note(problems, format!("{path}: value cut short"));
        None
    };
    let Ok(tag) = reader.u8() else {
        return cut(problems);
    };
    macro_rules! read {
        ($e:expr) => {
            match $e {
                Ok(v) => v,
                Err(_) => return cut(problems),
            }
        };
    }
    let value = match tag {
        b't' => Value::Boolean(read!(reader.u8()) != 0),
        b'b' => Value::ShortShortInt(i32::from(read!(reader.u8()) as i8)),
        b'B' => Value::ShortShortUint(u32::from(read!(reader.u8()))),
        b's' | b'U' => Value::ShortInt(i32::from(read!(reader.u16()) as i16)),
        b'u' => Value::ShortUint(u32::from(read!(reader.u16()))),
        b'I' => Value::LongInt(read!(reader.u32()) as i32),
        b'i' => Value::LongUint(read!(reader.u32())),
        b'l' | b'L' => Value::LongLongInt(read!(reader.u64()) as i64),
        b'f' => Value::Float(f32::from_bits(read!(reader.u32()))),
        b'd' => Value::Double(f64::from_bits(read!(reader.u64()))),
        b'D' => {
            let scale = read!(reader.u8());
            let value = read!(reader.u32());
            Value::Decimal(DecimalValue {
                scale: u32::from(scale),
                value,
            })
        }
        b'S' => {
            let length = read!(reader.u32()) as usize;
            Value::LongString(read!(reader.take(length)).to_vec())
        }
        b'x' => {
            let length = read!(reader.u32()) as usize;
            Value::ByteArray(read!(reader.take(length)).to_vec())
        }
        b'T' => Value::Timestamp(read!(reader.u64())),
        b'V' => Value::Void(Void {}),
        b'F' => {
            let length = read!(reader.u32()) as usize;
            let inner = read!(reader.take(length));
            Value::Table(decode_table(inner, depth + 1, path, problems))
        }
        b'A' => {
            let length = read!(reader.u32()) as usize;
            let inner = read!(reader.take(length));
            let mut values = Vec::new();
            if depth + 1 > MAX_NESTING {
                note(
                    problems,
                    format!("{path} nests deeper than {MAX_NESTING} levels; not read"),
                );
            } else {
                let mut items = Reader::new(inner);
                while !items.is_empty() {
                    match decode_value(&mut items, depth + 1, path, problems) {
                        Some(value) => values.push(value),
                        None => break,
                    }
                }
            }
            Value::Array(HeaderArray { values })
        }
        other => {
            note(
                problems,
                format!(
                    "{path}: unknown field type {:?} (0x{other:02x}); the rest of its table is not read",
                    char::from(other)
                ),
            );
            return None;
        }
    };
    Some(HeaderValue { value: Some(value) })
}

/// A cursor over bytes; every read checks the length.
struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn new(bytes: &'a [u8]) -> Self {
        Self { bytes }
    }

    fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], RawError> {
        if self.bytes.len() < n {
            return Err(RawError::Protocol(format!(
                "{n} bytes wanted, {} left",
                self.bytes.len()
            )));
        }
        let (head, tail) = self.bytes.split_at(n);
        self.bytes = tail;
        Ok(head)
    }

    fn u8(&mut self) -> Result<u8, RawError> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<u16, RawError> {
        Ok(u16::from_be_bytes(
            self.take(2)?.try_into().expect("2 bytes"),
        ))
    }

    fn u32(&mut self) -> Result<u32, RawError> {
        Ok(u32::from_be_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }

    fn u64(&mut self) -> Result<u64, RawError> {
        Ok(u64::from_be_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }

    fn short_bytes(&mut self) -> Result<&'a [u8], RawError> {
        let length = self.u8()? as usize;
        self.take(length)
    }
}

/// Builds a content header payload from raw parts, for tests and tools that
/// need a message lapin cannot publish (any bytes in a short string).
/// `properties` are `(flag bit, encoded value)` pairs in descending bit order
/// (15 = `content_type` … 2 = `cluster_id`, AMQP 0-9-1 §1.8), each value
/// already encoded (a short string is its length byte then its bytes).
pub fn content_header(body_size: u64, properties: &[(u16, Vec<u8>)]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&60u16.to_be_bytes());
    out.extend_from_slice(&0u16.to_be_bytes());
    out.extend_from_slice(&body_size.to_be_bytes());
    let flags = properties
        .iter()
        .fold(0u16, |acc, (bit, _)| acc | (1 << bit));
    out.extend_from_slice(&flags.to_be_bytes());
    let mut sorted: Vec<&(u16, Vec<u8>)> = properties.iter().collect();
    sorted.sort_by_key(|(bit, _)| std::cmp::Reverse(*bit));
    for (_, value) in sorted {
        out.extend_from_slice(value);
    }
    out
}

/// Encoders for the parts of a content header, with any bytes (which lapin
/// cannot write): for tests and tools that need a message lapin cannot
/// publish. Field types per RabbitMQ's table (AMQP 0-9-1 errata).
pub mod encode {
    /// A short string: its length byte, then its bytes (at most 255).
    ///
    /// # Panics
    /// When `bytes` is over 255 bytes.
    pub fn short_string(bytes: &[u8]) -> Vec<u8> {
        let mut out = vec![u8::try_from(bytes.len()).expect("a short string is at most 255 bytes")];
        out.extend_from_slice(bytes);
        out
    }

    /// A field table from names and already encoded values (type tag
    /// included): its 4-byte length, then the fields.
    pub fn table(fields: &[(&[u8], Vec<u8>)]) -> Vec<u8> {
        let mut inner = Vec::new();
        for (key, value) in fields {
            inner.extend(short_string(key));
            inner.extend_from_slice(value);
        }
        let mut out = u32::try_from(inner.len())
            .unwrap_or(u32::MAX)
            .to_be_bytes()
            .to_vec();
        out.extend(inner);
        out
    }

    /// A long-string field value (`S`).
    pub fn long_string(bytes: &[u8]) -> Vec<u8> {
        let mut out = vec![b'S'];
        out.extend_from_slice(&u32::try_from(bytes.len()).unwrap_or(u32::MAX).to_be_bytes());
        out.extend_from_slice(bytes);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A header value nesting `depth` tables (or arrays) around a boolean.
    fn nested_value(depth: usize, arrays: bool) -> Vec<u8> {
        let mut value = vec![b't', 1];
        for _ in 0..depth {
            value = if arrays {
                let mut array = vec![b'A'];
                array.extend_from_slice(&u32::try_from(value.len()).unwrap().to_be_bytes());
                array.extend(value);
                array
            } else {
                [vec![b'F'], encode::table(&[(b"n", value)])].concat()
            };
        }
        value
    }

    proptest::proptest! {
        /// Issue 13's capture side: any bytes as the header table of a
        /// well-formed content header decode or are named, never a panic.
        #[test]
        fn any_header_table_decodes_or_is_named(
            table in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..600),
        ) {
            let _ = decode_content_header(&content_header(0, &[(13, table)]));
        }

        /// Tables and arrays nested up to thousands deep: read to the
        /// limit, the rest named as a problem, without deep recursion.
        #[test]
        fn nesting_is_cut_at_the_limit(depth in 1usize..3000, arrays in proptest::prelude::any::<bool>()) {
            let header = content_header(0, &[(13, encode::table(&[(b"h", nested_value(depth, arrays))]))]);
            let decoded = decode_content_header(&header).unwrap();
            if depth < MAX_NESTING - 2 {
                proptest::prop_assert!(decoded.problems.is_empty(), "{:?}", decoded.problems);
            }
            if depth > MAX_NESTING + 2 {
                proptest::prop_assert!(
                    decoded.problems.iter().any(|problem| problem.contains("deeper than")),
                    "{:?}",
                    decoded.problems
                );
            }
        }
    }

    #[test]
    fn a_readable_header_decodes_as_lapin_does() {
        use lapin::{
            BasicProperties,
            types::{AMQPValue, FieldArray, FieldTable as LapinTable},
        };
        let mut inner = LapinTable::default();
        inner.insert("count".into(), AMQPValue::LongLongInt(3));
        inner.insert("queue".into(), AMQPValue::LongString("work".into()));
        let mut headers = LapinTable::default();
        headers.insert(
            "x-death".into(),
            AMQPValue::FieldArray(FieldArray::from(vec![AMQPValue::FieldTable(inner)])),
        );
        headers.insert("flag".into(), AMQPValue::Boolean(true));
        headers.insert("n".into(), AMQPValue::ShortInt(-2));
        let properties = BasicProperties::default()
            .with_content_type("application/json".into())
            .with_message_id("m-1".into())
            .with_timestamp(1_700_000_000)
            .with_type("order.created".into())
            .with_delivery_mode(2)
            .with_headers(headers);
        let frame = AMQPFrame::Header(
            1,
            amq_protocol::frame::AMQPContentHeader {
                class_id: 60,
                body_size: 12,
                properties: properties.clone(),
            },
        );
        let bytes = gen_frame(&frame)(WriteContext::from(Vec::new()))
            .unwrap()
            .write;
        let decoded = decode_content_header(&bytes[7..bytes.len() - 1]).unwrap();
        assert!(decoded.problems.is_empty(), "{:?}", decoded.problems);
        assert_eq!(decoded.body_size, 12);
        assert_eq!(
            decoded.properties,
            redrive_proto::amqp::properties_from_amqp(&properties)
        );
        assert_eq!(
            decoded.headers,
            redrive_proto::amqp::table_from_amqp(properties.headers().as_ref().unwrap())
        );
    }

    #[test]
    fn every_non_utf8_string_is_named_and_kept_lossily() {
        let header = content_header(
            0,
            &[
                (15, encode::short_string(b"text/plain")),
                (
                    13,
                    encode::table(&[
                        (b"ge\xe4ndert", encode::long_string(b"x")),
                        (b"ok", encode::long_string(b"\xff")),
                    ]),
                ),
                (7, encode::short_string(b"id-\xfc")),
                (5, encode::short_string(b"bestellung.ge\xe4ndert")),
                (3, encode::short_string(b"app")),
            ],
        );
        let decoded = decode_content_header(&header).unwrap();
        assert_eq!(
            decoded.properties.content_type.as_deref(),
            Some("text/plain")
        );
        assert_eq!(
            decoded.properties.r#type.as_deref(),
            Some("bestellung.ge\u{fffd}ndert")
        );
        assert_eq!(decoded.properties.app_id.as_deref(), Some("app"));
        let problems = decoded.problems.join("\n");
        assert!(
            problems.contains("property type is not UTF-8: 62 65"),
            "{problems}"
        );
        assert!(
            problems.contains("property message_id is not UTF-8"),
            "{problems}"
        );
        assert!(
            problems.contains("headers field name is not UTF-8"),
            "{problems}"
        );
        // A long string is bytes in AMQP: not a problem.
        assert_eq!(decoded.problems.len(), 3, "{problems}");
        assert_eq!(decoded.headers.fields.len(), 2);
    }

    #[test]
    fn an_unknown_field_type_ends_its_table_with_a_problem() {
        let header = content_header(
            0,
            &[(
                13,
                encode::table(&[(b"a", encode::long_string(b"1")), (b"b", vec![b'Q', 1, 2])]),
            )],
        );
        let decoded = decode_content_header(&header).unwrap();
        assert_eq!(decoded.headers.fields.len(), 1);
        assert!(decoded.problems[0].contains("headers.b: unknown field type 'Q'"));
    }

    #[test]
    fn deep_nesting_is_a_problem_not_a_crash() {
        let mut value = encode::long_string(b"leaf");
        for _ in 0..200 {
            value = [vec![b'F'], encode::table(&[(b"k", value)])].concat();
        }
        let header = content_header(0, &[(13, encode::table(&[(b"deep", value)]))]);
        let decoded = decode_content_header(&header).unwrap();
        assert!(
            decoded
                .problems
                .iter()
                .any(|p| p.contains("nests deeper than 64")),
            "{:?}",
            decoded.problems
        );
    }

    #[test]
    fn a_cut_header_is_named() {
        let mut header = content_header(0, &[(5, encode::short_string(b"order.created"))]);
        header.truncate(header.len() - 3);
        let decoded = decode_content_header(&header).unwrap();
        assert!(
            decoded.problems[0].contains("cut short"),
            "{:?}",
            decoded.problems
        );
        assert!(decode_content_header(&header[..10]).is_err());
    }

    #[test]
    fn thousands_of_bad_names_cost_a_bounded_problem_list() {
        // One-byte invalid names, ~30,000 of them, under a 255-byte name.
        let mut inner = Vec::new();
        for _ in 0..30_000 {
            inner.extend(encode::short_string(b"\xff"));
            inner.push(b'V');
        }
        let mut nested = u32::try_from(inner.len()).unwrap().to_be_bytes().to_vec();
        nested.extend(inner);
        let long_name = vec![b'n'; 255];
        let header = content_header(
            0,
            &[(
                13,
                encode::table(&[(&long_name, [vec![b'F'], nested].concat())]),
            )],
        );
        let decoded = decode_content_header(&header).unwrap();
        assert_eq!(decoded.problems.len(), MAX_PROBLEMS + 1);
        assert!(
            decoded.problems.iter().all(|p| p.len() < 400),
            "{:?}",
            decoded.problems[0]
        );
        assert_eq!(decoded.problems[MAX_PROBLEMS], "more problems not listed");
    }

    #[test]
    fn unknown_flags_and_trailing_bytes_are_problems() {
        let mut header = content_header(0, &[(5, encode::short_string(b"t"))]);
        header.extend_from_slice(b"xyz");
        let decoded = decode_content_header(&header).unwrap();
        assert!(decoded.problems[0].contains("3 bytes after the last property"));
        let mut header = content_header(0, &[(5, encode::short_string(b"t"))]);
        header[13] |= 0b10;
        let decoded = decode_content_header(&header).unwrap();
        assert!(
            decoded.problems[0].contains("does not define"),
            "{:?}",
            decoded.problems
        );
    }

    proptest::proptest! {
        #[test]
        fn any_bytes_decode_without_panic_and_with_a_bounded_list(
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..4096)
        ) {
            if let Ok(decoded) = decode_content_header(&bytes) {
                proptest::prop_assert!(decoded.problems.len() <= MAX_PROBLEMS + 1);
            }
        }
    }
}
