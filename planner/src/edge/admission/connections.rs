//! Connections in two pools: [`admit`] counts each accepted connection in
//! the unauthenticated pool (making room for a peer holding fewer when it is
//! full), [`Connections::authenticate`] moves it to the authenticated pool
//! at its first authenticated request, and [`AdmittedConnection`] ends it
//! at its deadlines or when evicted.

use std::{
    collections::{HashMap, VecDeque},
    future::Future,
    io,
    net::{IpAddr, SocketAddr},
    pin::Pin,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};

use futures::{Stream, StreamExt};
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::TcpStream,
    time::{Instant, Sleep},
};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tonic::{
    Status,
    transport::server::{Connected, TcpConnectInfo},
};
use tracing::warn;

use super::{
    DEFAULT_FIRST_REQUEST_TIMEOUT, DEFAULT_IDLE_TIMEOUT, DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_CONNECTIONS_PER_PEER, DEFAULT_MAX_UNAUTHENTICATED,
    DEFAULT_MAX_UNAUTHENTICATED_PER_PEER, Open, Throttled,
};

/// Caps on connections ([`admit`]). A connection is first
/// *unauthenticated*, in a pool of its own with a short deadline; its first
/// request that passes authentication moves it to the pool of authenticated
/// connections, so that clients without credentials, however many, cannot
/// take the places of those with them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Authenticated connections from one peer address.
    pub per_peer: usize,
    /// Authenticated connections in total.
    pub total: usize,
    /// Connections not yet authenticated from one peer address.
    pub unauthenticated_per_peer: usize,
    /// Connections not yet authenticated in total. When full, a new one
    /// takes the place of the oldest of the peer holding the most, if that
    /// peer holds at least two more than the newcomer's: so a client from a
    /// peer of its own always gets a place while others hold several.
    pub unauthenticated_total: usize,
    /// A connection that sends nothing for this long is closed.
    pub idle_timeout: Duration,
    /// A connection that made no request passing authentication (health
    /// checks do not count) this long after it opened is closed.
    pub first_request_timeout: Duration,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        Self {
            per_peer: DEFAULT_MAX_CONNECTIONS_PER_PEER,
            total: DEFAULT_MAX_CONNECTIONS,
            unauthenticated_per_peer: DEFAULT_MAX_UNAUTHENTICATED_PER_PEER,
            unauthenticated_total: DEFAULT_MAX_UNAUTHENTICATED,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            first_request_timeout: DEFAULT_FIRST_REQUEST_TIMEOUT,
        }
    }
}

/// One open connection, as the pools know it.
#[derive(Debug)]
struct Conn {
    id: u64,
    /// Set at its first request that passed authentication.
    authenticated: AtomicBool,
    /// Cancelled when a newcomer takes its unauthenticated place.
    evicted: CancellationToken,
}

/// The places taken, by pool.
#[derive(Debug, Default)]
struct Pools {
    authenticated: Open<IpAddr>,
    /// Unauthenticated connections by peer address, oldest first.
    unauthenticated: HashMap<IpAddr, VecDeque<Arc<Conn>>>,
    unauthenticated_total: usize,
    /// Every open connection by its socket address (a request names it).
    by_socket: HashMap<SocketAddr, Arc<Conn>>,
}

impl Pools {
    /// Removes `conn` from the unauthenticated pool; whether it was there.
    fn leave_unauthenticated(&mut self, peer: IpAddr, conn: &Conn) -> bool {
        let Some(queue) = self.unauthenticated.get_mut(&peer) else {
            return false;
        };
        let before = queue.len();
        queue.retain(|other| other.id != conn.id);
        let left = queue.len() < before;
        if queue.is_empty() {
            self.unauthenticated.remove(&peer);
        }
        if left {
            self.unauthenticated_total = self.unauthenticated_total.saturating_sub(1);
        }
        left
    }
}

/// The planner's open connections ([`admit`]), shared with
/// [`RateLimitLayer`](super::RateLimitLayer), which sees every
/// authenticated request and moves its connection to the authenticated
/// pool.
#[derive(Debug, Clone)]
pub struct Connections {
    registry: Arc<Registry>,
}

impl Connections {
    /// No connection yet, within `limits`.
    pub fn new(limits: ConnectionLimits) -> Self {
        Self {
            registry: Arc::new(Registry {
                limits,
                pools: Mutex::default(),
                refused: Throttled::default(),
                evicted: Throttled::default(),
                next_id: AtomicU64::new(0),
            }),
        }
    }

    /// Moves the connection from `peer` (its socket address) to the
    /// authenticated pool at its first authenticated request.
    ///
    /// # Errors
    /// `RESOURCE_EXHAUSTED` when the authenticated pool is full for its
    /// peer or in total: the connection stays unauthenticated (and is
    /// closed at its deadline).
    pub(super) fn authenticate(&self, peer: SocketAddr) -> Result<(), Status> {
        let limits = &self.registry.limits;
        let mut pools = self
            .registry
            .pools
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let Some(conn) = pools.by_socket.get(&peer).cloned() else {
            return Ok(());
        };
        if conn.authenticated.load(Ordering::Relaxed) {
            return Ok(());
        }
        if let Err(cap) = pools
            .authenticated
            .enter(peer.ip(), limits.per_peer, limits.total)
        {
            let most = if cap == "total" {
                limits.total
            } else {
                limits.per_peer
            };
            drop(pools);
            if let Some(refused) = self.registry.refused.count() {
                warn!(peer = %peer, cap, most, refused, "authenticated connections refused");
            }
            return Err(Status::resource_exhausted(format!(
                "the planner holds its most authenticated connections ({cap}: at most {most}); \
                 retry later"
            )));
        }
        pools.leave_unauthenticated(peer.ip(), &conn);
        conn.authenticated.store(true, Ordering::Relaxed);
        Ok(())
    }
}

#[derive(Debug)]
struct Registry {
    limits: ConnectionLimits,
    pools: Mutex<Pools>,
    refused: Throttled,
    evicted: Throttled,
    next_id: AtomicU64,
}

impl Registry {
    /// Counts a new connection from `peer` in the unauthenticated pool,
    /// taking the place of another when it is full ([`ConnectionLimits`]),
    /// or says which cap it is over.
    fn enter(self: &Arc<Self>, peer: SocketAddr) -> Result<Admission, &'static str> {
        let limits = &self.limits;
        let ip = peer.ip();
        let conn = Arc::new(Conn {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            authenticated: AtomicBool::new(false),
            evicted: CancellationToken::new(),
        });
        let mut pools = self.pools.lock().unwrap_or_else(PoisonError::into_inner);
        let mine = pools.unauthenticated.get(&ip).map_or(0, VecDeque::len);
        if mine >= limits.unauthenticated_per_peer {
            return Err("the per-peer cap on connections not yet authenticated");
        }
        let mut evicted = None;
        if pools.unauthenticated_total >= limits.unauthenticated_total {
            let heaviest = pools
                .unauthenticated
                .iter()
                .max_by_key(|(_, queue)| queue.len())
                .map(|(ip, queue)| (*ip, queue.len()));
            match heaviest {
                Some((victim, most)) if most > mine + 1 => {
                    if let Some(oldest) = pools
                        .unauthenticated
                        .get_mut(&victim)
                        .and_then(VecDeque::pop_front)
                    {
                        oldest.evicted.cancel();
                        pools.unauthenticated_total -= 1;
                        evicted = Some(victim);
                    }
                    if pools
                        .unauthenticated
                        .get(&victim)
                        .is_some_and(VecDeque::is_empty)
                    {
                        pools.unauthenticated.remove(&victim);
                    }
                }
                _ => return Err("the cap on connections not yet authenticated"),
            }
        }
        pools
            .unauthenticated
            .entry(ip)
            .or_default()
            .push_back(Arc::clone(&conn));
        pools.unauthenticated_total += 1;
        pools.by_socket.insert(peer, Arc::clone(&conn));
        drop(pools);
        if let Some(victim) = evicted
            && let Some(count) = self.evicted.count()
        {
            warn!(
                peer = %peer,
                from = %victim,
                evicted = count,
                "unauthenticated connections closed to make room for a peer holding fewer"
            );
        }
        Ok(Admission {
            registry: Arc::clone(self),
            peer,
            conn,
        })
    }
}

/// A counted connection; leaving it (drop) frees its place.
#[derive(Debug)]
struct Admission {
    registry: Arc<Registry>,
    peer: SocketAddr,
    conn: Arc<Conn>,
}

impl Drop for Admission {
    fn drop(&mut self) {
        let mut pools = self
            .registry
            .pools
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if pools
            .by_socket
            .get(&self.peer)
            .is_some_and(|conn| conn.id == self.conn.id)
        {
            pools.by_socket.remove(&self.peer);
        }
        if self.conn.authenticated.load(Ordering::Relaxed) {
            pools.authenticated.leave(&self.peer.ip());
        } else {
            pools.leave_unauthenticated(self.peer.ip(), &self.conn);
        }
    }
}

/// The accepted connections of `incoming` within the limits of
/// `connections`: one over a cap is closed at once (the client sees the
/// connection reset) and logged, at most every 10 s, with the peer and the
/// cap. Accept errors pass through.
pub fn admit<S>(
    incoming: S,
    connections: Connections,
) -> impl Stream<Item = io::Result<AdmittedConnection>> + Send + 'static
where
    S: Stream<Item = io::Result<TcpStream>> + Send + 'static,
{
    incoming.filter_map(move |accepted| {
        let registry = Arc::clone(&connections.registry);
        async move {
            let stream = match accepted {
                Ok(stream) => stream,
                Err(error) => return Some(Err(error)),
            };
            let Ok(peer) = stream.peer_addr() else {
                // Gone before we looked.
                return None;
            };
            match registry.enter(peer) {
                Ok(admission) => Some(Ok(AdmittedConnection::new(stream, admission))),
                Err(cap) => {
                    if let Some(refused) = registry.refused.count() {
                        warn!(peer = %peer, cap, refused, limits = ?registry.limits, "connections refused");
                    }
                    None
                }
            }
        }
    })
}

/// A connection within the caps: a TCP stream that fails with `TimedOut`
/// once nothing was read from it for the idle timeout, or when it made no
/// authenticated request by its deadline, and with `ConnectionReset` when
/// a newcomer took its unauthenticated place.
#[derive(Debug)]
pub struct AdmittedConnection {
    stream: TcpStream,
    admission: Admission,
    idle_timeout: Duration,
    last_read: Instant,
    /// Until when the first authenticated request may come.
    first_request_by: Instant,
    idle: Pin<Box<Sleep>>,
    evicted: Pin<Box<WaitForCancellationFutureOwned>>,
}

impl AdmittedConnection {
    fn new(stream: TcpStream, admission: Admission) -> Self {
        let limits = admission.registry.limits;
        let now = Instant::now();
        let first_request_by = now + limits.first_request_timeout;
        let evicted = Box::pin(admission.conn.evicted.clone().cancelled_owned());
        Self {
            stream,
            admission,
            idle_timeout: limits.idle_timeout,
            last_read: now,
            first_request_by,
            idle: Box::pin(tokio::time::sleep_until(
                first_request_by.min(now + limits.idle_timeout),
            )),
            evicted,
        }
    }

    /// `Err(TimedOut)` when the idle timer ran out since the last read, or
    /// the first-request time passed without an authenticated request;
    /// `Err(ConnectionReset)` when its place was taken; re-arms the timer
    /// otherwise.
    fn poll_idle(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        let authenticated = self.admission.conn.authenticated.load(Ordering::Relaxed);
        if !authenticated && self.evicted.as_mut().poll(cx).is_ready() {
            return Err(io::Error::new(
                io::ErrorKind::ConnectionReset,
                "closed without an authenticated request to make room for another peer",
            ));
        }
        while self.idle.as_mut().poll(cx).is_ready() {
            let now = Instant::now();
            let mut deadline = self.last_read + self.idle_timeout;
            if !self.admission.conn.authenticated.load(Ordering::Relaxed) {
                if self.first_request_by <= now {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "no authenticated request since the connection opened",
                    ));
                }
                deadline = deadline.min(self.first_request_by);
            }
            if deadline <= now {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("idle for {:?}", self.idle_timeout),
                ));
            }
            self.idle.as_mut().reset(deadline);
        }
        Ok(())
    }
}

impl AsyncRead for AdmittedConnection {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        match Pin::new(&mut self.stream).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    self.last_read = Instant::now();
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(error)) => Poll::Ready(Err(error)),
            Poll::Pending => match self.poll_idle(cx) {
                Ok(()) => Poll::Pending,
                Err(error) => Poll::Ready(Err(error)),
            },
        }
    }
}

impl AsyncWrite for AdmittedConnection {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

impl Connected for AdmittedConnection {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.stream.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio_stream::wrappers::TcpListenerStream;

    use super::*;

    /// Outcomes of connections an echo server holds for its test, unread.
    const ENDS: usize = 16;

    /// A listener behind [`admit`] whose admitted connections echo one
    /// byte back, then wait for their peer or their idle timeout; the
    /// outcome of each is sent on the channel (bounded: a connection frees
    /// its place before it reports, so a test that reads no outcome holds
    /// up only the reports).
    async fn echo_server(
        limits: ConnectionLimits,
    ) -> (SocketAddr, tokio::sync::mpsc::Receiver<io::ErrorKind>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let (ended, ends) = tokio::sync::mpsc::channel(ENDS);
        tokio::spawn(async move {
            let mut admitted = Box::pin(admit(
                TcpListenerStream::new(listener),
                Connections::new(limits),
            ));
            while let Some(Ok(mut connection)) = admitted.next().await {
                let ended = ended.clone();
                tokio::spawn(async move {
                    let mut byte = [0_u8; 1];
                    let end = loop {
                        match connection.read(&mut byte).await {
                            Ok(0) => break io::ErrorKind::UnexpectedEof,
                            Ok(_) => {
                                let _ = connection.write_all(&byte).await;
                            }
                            Err(error) => break error.kind(),
                        }
                    };
                    drop(connection);
                    let _ = ended.send(end).await;
                });
            }
        });
        (address, ends)
    }

    /// Whether the server answers on `stream` (an admitted connection
    /// echoes; a refused one was closed).
    async fn answers(stream: &mut TcpStream) -> bool {
        if stream.write_all(b"x").await.is_err() {
            return false;
        }
        let mut byte = [0_u8; 1];
        matches!(
            tokio::time::timeout(Duration::from_secs(5), stream.read(&mut byte)).await,
            Ok(Ok(1))
        )
    }

    #[tokio::test]
    async fn connections_over_the_per_peer_cap_are_closed_and_a_closed_one_frees_its_place() {
        let limits = ConnectionLimits {
            unauthenticated_per_peer: 2,
            unauthenticated_total: 10,
            idle_timeout: Duration::from_secs(60),
            first_request_timeout: Duration::from_secs(60),
            ..ConnectionLimits::default()
        };
        let (address, _ends) = echo_server(limits).await;
        let mut first = TcpStream::connect(address).await.unwrap();
        let mut second = TcpStream::connect(address).await.unwrap();
        assert!(answers(&mut first).await && answers(&mut second).await);
        let mut third = TcpStream::connect(address).await.unwrap();
        assert!(
            !answers(&mut third).await,
            "a third from one peer is closed"
        );
        drop(first);
        // The server sees the close when its read returns; then the place is free.
        let mut fourth = None;
        for _ in 0..50 {
            let mut again = TcpStream::connect(address).await.unwrap();
            if answers(&mut again).await {
                fourth = Some(again);
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(fourth.is_some(), "a closed connection frees its place");
        assert!(answers(&mut second).await, "the others are untouched");
    }

    #[test]
    fn a_full_unauthenticated_pool_makes_room_for_a_peer_holding_fewer() {
        let connections = Connections::new(ConnectionLimits {
            unauthenticated_per_peer: 3,
            unauthenticated_total: 4,
            ..ConnectionLimits::default()
        });
        let registry = &connections.registry;
        let at = |last: u8, port: u16| SocketAddr::from(([10, 0, 0, last], port));
        let first = registry.enter(at(1, 1)).unwrap();
        let second = registry.enter(at(1, 2)).unwrap();
        let _third = registry.enter(at(1, 3)).unwrap();
        let _other = registry.enter(at(2, 1)).unwrap();
        assert!(registry.enter(at(1, 4)).is_err(), "over the per-peer cap");
        // Full: a peer holding none takes the oldest place of the peer
        // holding the most.
        let _newcomer = registry.enter(at(3, 1)).unwrap();
        assert!(first.conn.evicted.is_cancelled());
        assert!(!second.conn.evicted.is_cancelled());
        let _next = registry.enter(at(4, 1)).unwrap();
        assert!(second.conn.evicted.is_cancelled());
        // Now every peer holds one or two: a fifth is not worth a place.
        assert!(registry.enter(at(5, 1)).is_err());
        // An evicted connection that closes frees nothing twice.
        drop(first);
        assert!(registry.enter(at(5, 1)).is_err());
        // An authenticated connection leaves the pool and makes room.
        connections.authenticate(at(2, 1)).unwrap();
        let _fifth = registry.enter(at(5, 1)).unwrap();
        let pools = registry.pools.lock().unwrap();
        assert_eq!(pools.unauthenticated_total, 4);
        assert_eq!(pools.authenticated.total, 1);
    }

    #[tokio::test]
    async fn a_connection_that_sends_nothing_is_closed_after_the_idle_timeout() {
        let limits = ConnectionLimits {
            unauthenticated_per_peer: 4,
            unauthenticated_total: 4,
            idle_timeout: Duration::from_millis(300),
            first_request_timeout: Duration::from_secs(60),
            ..ConnectionLimits::default()
        };
        let (address, mut ends) = echo_server(limits).await;
        let mut busy = TcpStream::connect(address).await.unwrap();
        let _idle = TcpStream::connect(address).await.unwrap();
        // The busy one keeps talking past several idle timeouts.
        for _ in 0..8 {
            assert!(answers(&mut busy).await, "a talking connection stays open");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(
            tokio::time::timeout(Duration::from_secs(5), ends.recv()).await,
            Ok(Some(io::ErrorKind::TimedOut)),
            "the idle one ended by its timeout"
        );
        assert!(answers(&mut busy).await);
    }
}
