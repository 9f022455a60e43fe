//! A guard in front of lapin: capture's connection to the broker passes
//! through a relay in the planner that reads every content header the broker
//! sends before lapin does (docs/design.md, "Messages the client cannot
//! read").
//!
//! lapin's frame parser is recursive and runs on a thread of its own: a
//! header table nested a few thousand levels deep overflows that thread's
//! stack and aborts the whole planner, before Redrive sees the message; the
//! broker then redelivers it to the next planner, which dies too. A short
//! string that is not UTF-8 or a header frame over `frame_max` ends lapin's
//! connection. The relay reads each header frame with the fallback reader's
//! bounded decoder ([`super::raw::decode_content_header`]: it reads nothing
//! deeper than [`super::raw::MAX_NESTING`] levels and never fails on a
//! value). When it finds a problem it closes both sides instead of passing
//! the frame on: lapin sees a lost connection, the session ends, and the
//! next round takes the messages one at a time with the fallback reader,
//! which stores the bad one as a placeholder and moves it aside. It also
//! stops a frame larger than the `frame_max` lapin negotiates: the smaller
//! of the broker's `connection.tune` and lapin's own (the URI's
//! `frame_max`), as lapin computes it (AMQP 0-9-1 §4.2.3: a peer must not
//! send larger frames, and lapin ends the connection at one). The guard
//! says why it stopped ([`Guard::stopped_for`]), so that the session's end
//! is known for what it is, a message to take one at a time, and not a
//! failure to back off from.
//!
//! Only `amqp://` can be read this way; with `amqps://` lapin connects
//! directly (unguarded).

use std::{
    net::SocketAddr,
    sync::{Arc, OnceLock},
};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
};
use tokio_util::sync::CancellationToken;
use tracing::warn;

use super::raw;

/// A relay for one lapin connection, listening on `127.0.0.1`.
pub struct Guard {
    /// Where lapin connects instead of the broker.
    pub local: SocketAddr,
    /// Cancelled once the relay has ended (either side closed, the broker
    /// could not be reached, or a header had a problem).
    ended: CancellationToken,
    /// Why the relay stopped a frame, once it has.
    stopped: Arc<OnceLock<String>>,
    /// Why the broker could not be reached, if it could not.
    unreachable: Arc<OnceLock<String>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Guard {
    /// Listens for one connection and relays it to `host:port`; lapin is
    /// configured with `frame_max` (0: none, take the broker's).
    ///
    /// # Errors
    /// When no local port can be bound.
    pub async fn start(host: String, port: u16, frame_max: u32) -> std::io::Result<Self> {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let local = listener.local_addr()?;
        let ended = CancellationToken::new();
        let relay_ended = ended.clone();
        let stopped = Arc::new(OnceLock::new());
        let relay_stopped = Arc::clone(&stopped);
        let unreachable = Arc::new(OnceLock::new());
        let relay_unreachable = Arc::clone(&unreachable);
        let task = tokio::spawn(async move {
            // However the relay ends, lapin's connection is over.
            let _ended = relay_ended.drop_guard();
            let Ok((client, _)) = listener.accept().await else {
                return;
            };
            drop(listener);
            let broker = match TcpStream::connect((host.as_str(), port)).await {
                Ok(broker) => broker,
                Err(error) => {
                    // The session's line says it, with the node.
                    let _ = relay_unreachable.set(format!("cannot reach the broker: {error}"));
                    return;
                }
            };
            let _ = client.set_nodelay(true);
            let _ = broker.set_nodelay(true);
            relay(client, broker, frame_max, &relay_stopped).await;
        });
        Ok(Self {
            local,
            ended,
            stopped,
            unreachable,
            task,
        })
    }

    /// Why the relay closed the connection instead of passing a frame on
    /// (the problems of a content header, or a frame over `frame_max`), if
    /// it did; `None` while it runs and when either side ended it.
    pub fn stopped_for(&self) -> Option<String> {
        self.stopped.get().cloned()
    }

    /// Why the guard could not reach the broker (its TCP connect failed:
    /// refused, no route, a name that does not resolve), if so; lapin then
    /// only sees the guard's own socket close.
    pub fn unreachable(&self) -> Option<String> {
        self.unreachable.get().cloned()
    }

    /// Cancelled once the relay has ended: lapin's connection is over,
    /// whether or not lapin has noticed (a lapin call on a connection closed
    /// while it was being set up was seen to wait over 30 s).
    pub fn ended(&self) -> CancellationToken {
        self.ended.clone()
    }
}

/// Copies client → broker as it is, and broker → client frame by frame,
/// until either side ends or a frame has a problem: then why goes into
/// `stopped` before either socket is closed, so that whoever sees the
/// connection end can read why.
async fn relay(client: TcpStream, broker: TcpStream, frame_max: u32, stopped: &OnceLock<String>) {
    let (mut client_read, mut client_write) = client.into_split();
    let (mut broker_read, mut broker_write) = broker.into_split();
    let upstream = async {
        let _ = tokio::io::copy(&mut client_read, &mut broker_write).await;
    };
    let downstream = async {
        if let Err(why) = screen(&mut broker_read, &mut client_write, frame_max).await {
            warn!(%why, "capture guard: closing the connection before lapin reads a delivery it cannot read safely");
            let _ = stopped.set(why);
        }
    };
    // Whichever side ends first ends both: dropping the halves closes them.
    tokio::select! {
        () = upstream => {}
        () = downstream => {}
    }
}

/// The `frame_max` lapin settles on from the broker's `announced` one and
/// its own `configured` one (0: none): the smaller of those given, at least
/// 4096 (AMQP 0-9-1 `frame-min-size`); 0 when neither gives one.
fn negotiated_frame_max(announced: u32, configured: u32) -> u32 {
    match (announced, configured) {
        (0, 0) => 0,
        (0, one) | (one, 0) => one.max(4096),
        (a, b) => a.min(b).max(4096),
    }
}

/// Bytes read from the broker at once, and the most the relay holds before
/// passing them on.
const RELAY_BUFFER: usize = 256 * 1024;

/// The `frame_max` of a `connection.tune` method frame's payload (class
/// 10, method 30: `channel-max` short, `frame-max` long, `heartbeat` short;
/// AMQP 0-9-1 §1.4.2.5), `None` for any other method.
fn tuned_frame_max(payload: &[u8]) -> Option<u32> {
    match payload {
        [0, 10, 0, 30, _, _, a, b, c, d, ..] => Some(u32::from_be_bytes([*a, *b, *c, *d])),
        _ => None,
    }
}

/// Forwards frames from `from` to `to`; returns why it stopped early. Reads
/// are buffered and what was read is passed on in one write whenever the
/// buffer runs dry (or fills), so a backlog costs a few syscalls per batch
/// of frames, not several per frame.
async fn screen(
    from: &mut (impl AsyncReadExt + Unpin),
    to: &mut (impl AsyncWriteExt + Unpin),
    configured_frame_max: u32,
) -> Result<(), String> {
    let mut from = tokio::io::BufReader::with_capacity(RELAY_BUFFER, from);
    let mut out: Vec<u8> = Vec::with_capacity(RELAY_BUFFER);
    let mut head = [0u8; 7];
    // lapin's `frame_max` (0: none), once the broker's `connection.tune`
    // is seen.
    let mut frame_max = configured_frame_max;
    loop {
        if (from.buffer().is_empty() || out.len() >= RELAY_BUFFER) && !out.is_empty() {
            if to.write_all(&out).await.is_err() {
                return Ok(());
            }
            out.clear();
        }
        if from.read_exact(&mut head).await.is_err() {
            let _ = to.write_all(&out).await;
            return Ok(());
        }
        // A protocol header (the broker refusing our version) passes as is.
        if &head[..4] == b"AMQP" {
            out.extend_from_slice(&head);
            let mut rest = [0u8; 1];
            let _ = from.read_exact(&mut rest).await;
            out.extend_from_slice(&rest);
            let _ = to.write_all(&out).await;
            return Ok(());
        }
        let size = u32::from_be_bytes([head[3], head[4], head[5], head[6]]);
        // A frame is its 7-byte head, its payload and the frame-end octet.
        let frame = u64::from(size) + 8;
        let over_frame_max = frame_max != 0 && frame > u64::from(frame_max);
        if over_frame_max || size > raw::MAX_INBOUND_FRAME {
            // Frames before it are passed on; this one and after, never.
            let _ = to.write_all(&out).await;
            return Err(if over_frame_max {
                format!("a frame of {frame} bytes, over the negotiated frame_max of {frame_max}")
            } else {
                format!("a frame of {frame} bytes")
            });
        }
        let start = out.len();
        out.extend_from_slice(&head);
        out.resize(start + 7 + size as usize + 1, 0);
        if from.read_exact(&mut out[start + 7..]).await.is_err() {
            return Ok(());
        }
        if head[0] == 1
            && let Some(announced) = tuned_frame_max(&out[start + 7..start + 7 + size as usize])
        {
            frame_max = negotiated_frame_max(announced, configured_frame_max);
        }
        if head[0] == 2 {
            let header = &out[start + 7..start + 7 + size as usize];
            match raw::decode_content_header(header) {
                Ok(decoded) if decoded.problems.is_empty() => {}
                // Frames before it are passed on; this one and after, never.
                Ok(decoded) => {
                    out.truncate(start);
                    let _ = to.write_all(&out).await;
                    return Err(decoded.problems.join("; "));
                }
                Err(error) => {
                    out.truncate(start);
                    let _ = to.write_all(&out).await;
                    return Err(error.to_string());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A frame of `kind` on `channel` with `payload`.
    fn frame(kind: u8, channel: u16, payload: &[u8]) -> Vec<u8> {
        let mut out = vec![kind];
        out.extend_from_slice(&channel.to_be_bytes());
        out.extend_from_slice(&u32::try_from(payload.len()).unwrap().to_be_bytes());
        out.extend_from_slice(payload);
        out.push(0xCE);
        out
    }

    /// `connection.tune` announcing `frame_max`.
    fn tune(frame_max: u32) -> Vec<u8> {
        let mut payload = vec![0, 10, 0, 30, 0x07, 0xFF];
        payload.extend_from_slice(&frame_max.to_be_bytes());
        payload.extend_from_slice(&60u16.to_be_bytes());
        frame(1, 0, &payload)
    }

    /// The big-header kind of tests/tests/unreadable.rs: a frame that
    /// `x-death` pushed over the broker's `frame_max` is stopped, with the
    /// frames before it passed on and none after; one exactly at it passes.
    #[tokio::test]
    async fn a_frame_over_the_announced_frame_max_is_stopped() {
        let heartbeat = frame(8, 0, &[]);
        let at_limit = frame(3, 1, &vec![b'x'; 4096 - 8]);
        let over = frame(3, 1, &vec![b'x'; 4096 - 7]);
        let input = [
            tune(4096),
            heartbeat,
            at_limit,
            over.clone(),
            frame(8, 0, &[]),
        ]
        .concat();
        let mut passed = Vec::new();
        let why = screen(&mut input.as_slice(), &mut passed, 0)
            .await
            .unwrap_err();
        assert_eq!(
            why,
            "a frame of 4097 bytes, over the negotiated frame_max of 4096"
        );
        assert_eq!(passed, input[..input.len() - over.len() - 8]);
    }

    /// Without a `frame_max` (0: no limit) only the hard ceiling applies.
    #[tokio::test]
    async fn no_announced_frame_max_passes_large_frames() {
        let input = [tune(0), frame(3, 1, &vec![b'x'; 300_000])].concat();
        let mut passed = Vec::new();
        screen(&mut input.as_slice(), &mut passed, 0).await.unwrap();
        assert_eq!(passed, input);
    }

    /// lapin configured with a smaller `frame_max` (the URI's) than the
    /// broker's takes the smaller: the guard stops at it too.
    #[tokio::test]
    async fn lapins_own_smaller_frame_max_counts() {
        let over = frame(2, 1, &vec![b'h'; 8192 - 7]);
        let input = [tune(131_072), over].concat();
        let mut passed = Vec::new();
        let why = screen(&mut input.as_slice(), &mut passed, 8192)
            .await
            .unwrap_err();
        assert_eq!(
            why,
            "a frame of 8193 bytes, over the negotiated frame_max of 8192"
        );
        assert_eq!(passed, tune(131_072));
        assert_eq!(negotiated_frame_max(0, 0), 0);
        assert_eq!(negotiated_frame_max(131_072, 0), 131_072);
        assert_eq!(negotiated_frame_max(0, 8192), 8192);
        assert_eq!(negotiated_frame_max(131_072, 1000), 4096);
    }
}
