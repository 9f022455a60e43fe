//! [`RawConnection`]: one AMQP connection with one channel, speaking the few
//! methods capture needs, and the frames it writes and reads them in.

use std::time::Duration;

use amq_protocol::{
    frame::{AMQPFrame, WriteContext, gen_frame},
    protocol::{AMQPClass, basic, channel, confirm, connection, exchange, parse_class, queue},
    types::{AMQPValue, FieldTable, LongString, ShortString},
    uri::{AMQPScheme, AMQPUri},
};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt, BufReader},
    net::TcpStream,
};

use super::{MAX_BODY, MAX_INBOUND_FRAME, RawError, RawMessage, reader::Reader};

/// How long one broker round trip may take before the connection is given up.
const REPLY_TIMEOUT: Duration = Duration::from_secs(30);

const FRAME_METHOD: u8 = 1;
const FRAME_HEADER: u8 = 2;
const FRAME_BODY: u8 = 3;
const FRAME_HEARTBEAT: u8 = 8;
const FRAME_END: u8 = 0xCE;
const CHANNEL: u16 = 1;

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
                client_properties: client_properties(),
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

/// The client properties of `connection.start-ok`: the capability
/// `authentication_failure_close`, so that RabbitMQ answers a refused login
/// with `connection.close` 403 ACCESS_REFUSED, whose text says so, instead
/// of closing the socket (rabbitmq.com/docs/auth-notification), and the
/// product's name, which the management UI shows.
fn client_properties() -> FieldTable {
    let mut capabilities = FieldTable::default();
    capabilities.insert(
        ShortString::from("authentication_failure_close"),
        AMQPValue::Boolean(true),
    );
    let mut properties = FieldTable::default();
    properties.insert(
        ShortString::from("capabilities"),
        AMQPValue::FieldTable(capabilities),
    );
    properties.insert(
        ShortString::from("product"),
        AMQPValue::LongString(LongString::from("redrive-planner capture (one at a time)")),
    );
    properties
}
