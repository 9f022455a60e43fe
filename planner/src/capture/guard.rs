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
//! which stores the bad one as a placeholder and moves it aside.
//!
//! Only `amqp://` can be read this way; with `amqps://` lapin connects
//! directly (unguarded).

use std::net::SocketAddr;

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
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Guard {
    /// Listens for one connection and relays it to `host:port`.
    ///
    /// # Errors
    /// When no local port can be bound.
    pub async fn start(host: String, port: u16) -> std::io::Result<Self> {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let local = listener.local_addr()?;
        let ended = CancellationToken::new();
        let relay_ended = ended.clone();
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
                    warn!(%error, "capture guard: cannot reach the broker");
                    return;
                }
            };
            let _ = client.set_nodelay(true);
            let _ = broker.set_nodelay(true);
            relay(client, broker).await;
        });
        Ok(Self { local, ended, task })
    }

    /// Cancelled once the relay has ended: lapin's connection is over,
    /// whether or not lapin has noticed (a lapin call on a connection closed
    /// while it was being set up was seen to wait over 30 s).
    pub fn ended(&self) -> CancellationToken {
        self.ended.clone()
    }
}

/// Copies client → broker as it is, and broker → client frame by frame,
/// until either side ends or a header frame has a problem.
async fn relay(client: TcpStream, broker: TcpStream) {
    let (mut client_read, mut client_write) = client.into_split();
    let (mut broker_read, mut broker_write) = broker.into_split();
    let upstream = async {
        let _ = tokio::io::copy(&mut client_read, &mut broker_write).await;
    };
    let downstream = async {
        if let Err(why) = screen(&mut broker_read, &mut client_write).await {
            warn!(%why, "capture guard: closing the connection before lapin reads a delivery it cannot read safely");
        }
    };
    // Whichever side ends first ends both: dropping the halves closes them.
    tokio::select! {
        () = upstream => {}
        () = downstream => {}
    }
}

/// Bytes read from the broker at once, and the most the relay holds before
/// passing them on.
const RELAY_BUFFER: usize = 256 * 1024;

/// Forwards frames from `from` to `to`; returns why it stopped early. Reads
/// are buffered and what was read is passed on in one write whenever the
/// buffer runs dry (or fills), so a backlog costs a few syscalls per batch
/// of frames, not several per frame.
async fn screen(
    from: &mut (impl AsyncReadExt + Unpin),
    to: &mut (impl AsyncWriteExt + Unpin),
) -> Result<(), String> {
    let mut from = tokio::io::BufReader::with_capacity(RELAY_BUFFER, from);
    let mut out: Vec<u8> = Vec::with_capacity(RELAY_BUFFER);
    let mut head = [0u8; 7];
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
        if size > raw::MAX_INBOUND_FRAME {
            return Err(format!("a frame of {size} bytes"));
        }
        let start = out.len();
        out.extend_from_slice(&head);
        out.resize(start + 7 + size as usize + 1, 0);
        if from.read_exact(&mut out[start + 7..]).await.is_err() {
            return Ok(());
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
