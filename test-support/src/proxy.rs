//! [`TcpProxy`]: an outage of a shared server simulated between a test's
//! client and the server, never by stopping the server.

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
    },
    time::Duration,
};

use tokio::{net::TcpListener, task::JoinHandle};

/// A TCP proxy on `127.0.0.1:0` forwarding to `target`, which a test can cut
/// (close every connection and refuse new ones) and restore, or stall (keep
/// every connection open but forward nothing, in either direction: a
/// half-open network path) and heal, or have the server notice a client's
/// close late ([`TcpProxy::linger`]).
pub struct TcpProxy {
    addr: SocketAddr,
    cut: Arc<AtomicBool>,
    linger_ms: Arc<AtomicU64>,
    forwarded: Arc<AtomicUsize>,
    generation: tokio::sync::watch::Sender<u64>,
    stalled: tokio::sync::watch::Sender<bool>,
    task: JoinHandle<()>,
}

/// Copies `from` → `to`, holding what it read while `stalled` is true; once
/// `from` ends, waits `linger_ms` (when given) before it closes `to`.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut stalled: tokio::sync::watch::Receiver<bool>,
    linger_ms: Option<Arc<AtomicU64>>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buffer = vec![0_u8; 16 * 1024];
    loop {
        if stalled.wait_for(|stalled| !*stalled).await.is_err() {
            return;
        }
        let read = match from.read(&mut buffer).await {
            Ok(0) | Err(_) => {
                if let Some(linger_ms) = linger_ms {
                    let linger = Duration::from_millis(linger_ms.load(Ordering::SeqCst));
                    tokio::time::sleep(linger).await;
                }
                let _ = to.shutdown().await;
                return;
            }
            Ok(read) => read,
        };
        if stalled.wait_for(|stalled| !*stalled).await.is_err() {
            return;
        }
        if to.write_all(&buffer[..read]).await.is_err() {
            return;
        }
    }
}

impl TcpProxy {
    /// Starts forwarding to `target`.
    ///
    /// # Errors
    /// When binding fails.
    pub async fn start(target: SocketAddr) -> anyhow::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let cut = Arc::new(AtomicBool::new(false));
        let (generation, _) = tokio::sync::watch::channel(0_u64);
        let (stalled, _) = tokio::sync::watch::channel(false);
        let forwarded = Arc::new(AtomicUsize::new(0));
        let accept_forwarded = Arc::clone(&forwarded);
        let accept_cut = Arc::clone(&cut);
        let accept_generation = generation.clone();
        let accept_stalled = stalled.clone();
        let linger_ms = Arc::new(AtomicU64::new(0));
        let accept_linger_ms = Arc::clone(&linger_ms);
        let task = tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                if accept_cut.load(Ordering::SeqCst) {
                    drop(inbound);
                    continue;
                }
                accept_forwarded.fetch_add(1, Ordering::SeqCst);
                let mut killed = accept_generation.subscribe();
                let stalled = accept_stalled.subscribe();
                let linger_ms = Arc::clone(&accept_linger_ms);
                tokio::spawn(async move {
                    let Ok(outbound) = tokio::net::TcpStream::connect(target).await else {
                        return;
                    };
                    let _ = inbound.set_nodelay(true);
                    let _ = outbound.set_nodelay(true);
                    let (inbound_read, inbound_write) = inbound.into_split();
                    let (outbound_read, outbound_write) = outbound.into_split();
                    let upstream = pump(
                        inbound_read,
                        outbound_write,
                        stalled.clone(),
                        Some(linger_ms),
                    );
                    let downstream = pump(outbound_read, inbound_write, stalled, None);
                    tokio::select! {
                        () = async { tokio::join!(upstream, downstream); } => {}
                        _ = killed.changed() => {}
                    }
                });
            }
        });
        Ok(Self {
            addr,
            cut,
            linger_ms,
            forwarded,
            generation,
            stalled,
            task,
        })
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// How many connections it has accepted and forwarded so far (not
    /// those refused while cut).
    pub fn forwarded(&self) -> usize {
        self.forwarded.load(Ordering::SeqCst)
    }

    /// Closes every open connection and refuses new ones until [`TcpProxy::restore`].
    pub fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        self.generation.send_modify(|generation| *generation += 1);
    }

    /// Accepts connections again.
    pub fn restore(&self) {
        self.cut.store(false, Ordering::SeqCst);
    }

    /// Forwards nothing, in either direction, until [`TcpProxy::heal`];
    /// connections stay open and new ones are accepted (and hang).
    pub fn stall(&self) {
        self.stalled.send_replace(true);
    }

    /// Forwards again, what was held first.
    pub fn heal(&self) {
        self.stalled.send_replace(false);
    }

    /// From now on, when a client closes its connection, keeps the
    /// server's side open `linger` longer before closing it too: a server
    /// that notices a client's close late (a loaded broker). Connections
    /// a [`TcpProxy::cut`] ends close at once.
    pub fn linger(&self, linger: Duration) {
        let millis = u64::try_from(linger.as_millis()).unwrap_or(u64::MAX);
        self.linger_ms.store(millis, Ordering::SeqCst);
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.task.abort();
        self.generation.send_modify(|generation| *generation += 1);
    }
}
