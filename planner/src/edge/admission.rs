//! What one caller may take of the planner, so that no caller can make it
//! unreachable for the others (docs/design.md, "Every input is bounded at
//! the edge"):
//!
//! - **connections**, in two pools ([`ConnectionLimits`], [`admit`]). A new
//!   connection is *unauthenticated*: a smaller pool, capped per peer
//!   address and in total, with a short deadline. It must make a request
//!   that passes authentication (health checks do not count) by then, or it
//!   is closed: without that, idle clients that never authenticate could
//!   hold every place, since HTTP/2 clients answer keepalive pings by
//!   themselves. When that pool is full, a newcomer takes the place of the
//!   oldest connection of the peer holding the most (if it holds at least
//!   two more than the newcomer's peer), so clients spread over a few
//!   addresses cannot keep a client of another address out. Its first
//!   authenticated request moves a connection to the *authenticated* pool,
//!   capped per peer and in total (past it the request is answered
//!   `RESOURCE_EXHAUSTED`). After that, a connection that sends nothing for
//!   the idle timeout (no request, no answer to the server's keepalive pings,
//!   RFC 9113 §6.7) is dead and closed. One over a cap is closed at once,
//!   and refusals are logged at most every 10 s;
//! - **requests**, per principal ([`RateLimitLayer`], GCRA from `governor`):
//!   over the rate a call is answered `RESOURCE_EXHAUSTED` before any work;
//! - **open `WatchPlan` streams**, per principal and in total
//!   ([`StreamLimits`]).
//!
//! The caller's key is its authenticated principal, or its peer address
//! when the planner runs without authentication ([`caller_key`]).

use std::{
    collections::{HashMap, VecDeque},
    future::Future,
    io,
    net::{IpAddr, SocketAddr},
    num::NonZeroU32,
    pin::Pin,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};

use futures::{Stream, StreamExt};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::TcpStream,
    time::{Instant, Sleep},
};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tonic::{
    Status,
    codegen::http,
    transport::server::{Connected, TcpConnectInfo},
};
use tracing::warn;

use crate::{edge::roles::Principal, metrics::PlannerMetrics};

/// Default cap on connections from one peer address.
pub const DEFAULT_MAX_CONNECTIONS_PER_PEER: usize = 64;
/// Default cap on connections in total (below the usual 1,024 open files,
/// with room for the database pool and the broker).
pub const DEFAULT_MAX_CONNECTIONS: usize = 512;
/// Default cap on connections not yet authenticated from one peer address.
pub const DEFAULT_MAX_UNAUTHENTICATED_PER_PEER: usize = 16;
/// Default cap on connections not yet authenticated in total.
pub const DEFAULT_MAX_UNAUTHENTICATED: usize = 256;
/// Default time a new connection has to make its first request that passes
/// authentication (its TLS handshake included).
pub const DEFAULT_FIRST_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Default idle timeout: longer than the keepalive interval plus its
/// timeout ([`KEEPALIVE_INTERVAL`], [`KEEPALIVE_TIMEOUT`]), so a live
/// client always answers a ping before it.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// How often the server pings a connection (HTTP/2 `PING`).
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(20);
/// How long a ping may go unanswered before the connection is closed.
pub const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);
/// Default request rate per principal, requests per second (a stream is
/// one request, however many messages it carries).
pub const DEFAULT_REQUESTS_PER_SECOND: u32 = 2_000;
/// Default burst of requests per principal above the rate.
pub const DEFAULT_REQUEST_BURST: u32 = 4_000;
/// Default cap on open `WatchPlan` streams per principal.
pub const DEFAULT_WATCHES_PER_PRINCIPAL: usize = 32;
/// Default cap on open `WatchPlan` streams in total.
pub const DEFAULT_WATCHES: usize = 512;
/// Default places among [`DEFAULT_WATCHES`] kept for a principal's first
/// `WatchPlan` stream.
pub const DEFAULT_RESERVED_WATCHES: usize = 128;
/// Default cap on open `WatchLease` streams per principal (an executor
/// watches each lease it holds once).
pub const DEFAULT_LEASE_WATCHES_PER_PRINCIPAL: usize = 256;
/// Default cap on open `WatchLease` streams in total.
pub const DEFAULT_LEASE_WATCHES: usize = 2_048;
/// Default places among [`DEFAULT_LEASE_WATCHES`] kept for a principal's
/// first `WatchLease` stream.
pub const DEFAULT_RESERVED_LEASE_WATCHES: usize = 256;
/// Refusals of one kind are logged at most this often.
const WARN_EVERY: Duration = Duration::from_secs(10);

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
/// [`RateLimitLayer`], which sees every authenticated request and moves its
/// connection to the authenticated pool.
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
    fn authenticate(&self, peer: SocketAddr) -> Result<(), Status> {
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

/// Logs a kind of refusal at most once per [`WARN_EVERY`], with how many
/// there were since the last line.
#[derive(Debug, Default)]
pub(crate) struct Throttled {
    last: Mutex<Option<Instant>>,
    since: AtomicU64,
}

impl Throttled {
    /// Counts one refusal; `Some(count)` when it is time to log: the
    /// refusals since the last line, this one included.
    pub(crate) fn count(&self) -> Option<u64> {
        self.count_at(Instant::now())
    }

    /// [`Throttled::count`] at `now`.
    fn count_at(&self, now: Instant) -> Option<u64> {
        self.since.fetch_add(1, Ordering::Relaxed);
        let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        if last.is_some_and(|last| now.saturating_duration_since(last) < WARN_EVERY) {
            return None;
        }
        *last = Some(now);
        // Taken under the lock: a refusal counted meanwhile goes into
        // this line or the next, never neither.
        Some(self.since.swap(0, Ordering::Relaxed))
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

/// Who a limit counts a request against: the authenticated principal's
/// name (`principal:NAME`), else the peer address (`peer:IP`), else
/// `unknown`.
pub fn caller_key(principal: Option<&Principal>, peer: Option<SocketAddr>) -> String {
    match (principal, peer) {
        (Some(principal), _) => format!("principal:{}", principal.name),
        (None, Some(peer)) => format!("peer:{}", peer.ip()),
        (None, None) => "unknown".to_owned(),
    }
}

/// The peer socket address of an HTTP request (plain or TLS).
fn http_peer(extensions: &http::Extensions) -> Option<SocketAddr> {
    extensions
        .get::<TcpConnectInfo>()
        .and_then(TcpConnectInfo::remote_addr)
        .or_else(|| {
            extensions
                .get::<tonic::transport::server::TlsConnectInfo<TcpConnectInfo>>()
                .and_then(|info| info.get_ref().remote_addr())
        })
}

/// [`caller_key`] of an HTTP request (in a tower layer).
pub(crate) fn http_caller_key(extensions: &http::Extensions) -> String {
    caller_key(extensions.get::<Principal>(), http_peer(extensions))
}

/// [`caller_key`] of a gRPC request (in a handler).
pub fn request_caller_key<T>(request: &tonic::Request<T>) -> String {
    caller_key(Principal::of(request), request.remote_addr())
}

/// A request rate per caller ([`caller_key`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestRate {
    /// Requests per second, sustained.
    pub per_second: NonZeroU32,
    /// Requests above the rate allowed at once.
    pub burst: NonZeroU32,
}

impl Default for RequestRate {
    fn default() -> Self {
        Self {
            per_second: NonZeroU32::new(DEFAULT_REQUESTS_PER_SECOND).unwrap_or(NonZeroU32::MIN),
            burst: NonZeroU32::new(DEFAULT_REQUEST_BURST).unwrap_or(NonZeroU32::MIN),
        }
    }
}

/// A tower layer that answers `RESOURCE_EXHAUSTED` to a caller over its
/// [`RequestRate`], before the request reaches a service. Placed inside the
/// authentication layer, so that it counts per principal. Health checks are
/// not counted.
#[derive(Clone)]
pub struct RateLimitLayer {
    limiter: Arc<DefaultKeyedRateLimiter<String>>,
    refused: Arc<Throttled>,
    rate: RequestRate,
    connections: Connections,
}

impl std::fmt::Debug for RateLimitLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("rate", &self.rate)
            .finish_non_exhaustive()
    }
}

impl RateLimitLayer {
    /// A limiter of `rate` per caller, moving the connections of the
    /// requests it sees to the authenticated pool of `connections`.
    pub fn new(rate: RequestRate, connections: Connections) -> Self {
        let quota = Quota::per_second(rate.per_second).allow_burst(rate.burst);
        Self {
            limiter: Arc::new(RateLimiter::keyed(quota)),
            refused: Arc::new(Throttled::default()),
            rate,
            connections,
        }
    }

    /// `Err` with the status to answer when `key` is over its rate. Forgets
    /// callers that are back to a full bucket now and then, so the table
    /// does not grow with every caller ever seen.
    fn check(&self, key: &str) -> Result<(), Status> {
        if self.limiter.len() > 10_000 {
            self.limiter.retain_recent();
        }
        match self.limiter.check_key(&key.to_owned()) {
            Ok(()) => Ok(()),
            Err(_) => {
                if let Some(refused) = self.refused.count() {
                    warn!(caller = key, refused, rate = ?self.rate, "requests refused over the rate limit");
                }
                Err(Status::resource_exhausted(format!(
                    "rate limit: {} requests per second (burst {}) per caller; retry later",
                    self.rate.per_second, self.rate.burst
                )))
            }
        }
    }
}

impl<S> tower::Layer<S> for RateLimitLayer {
    type Service = RateLimited<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimited {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service of [`RateLimitLayer`].
#[derive(Clone, Debug)]
pub struct RateLimited<S> {
    inner: S,
    layer: RateLimitLayer,
}

impl<S, B> tower::Service<http::Request<B>> for RateLimited<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<tonic::body::Body>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future =
        Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send + 'static>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let health = request.uri().path().starts_with("/grpc.health.v1.");
        // Inside authentication: this request passed it. Health checks
        // pass without credentials, so they do not authenticate a connection.
        if !health
            && let Some(peer) = http_peer(request.extensions())
            && let Err(status) = self.layer.connections.authenticate(peer)
        {
            return Box::pin(async move { Ok(status.into_http()) });
        }
        if !health && let Err(status) = self.layer.check(&http_caller_key(request.extensions())) {
            return Box::pin(async move { Ok(status.into_http()) });
        }
        Box::pin(self.inner.call(request))
    }
}

/// Open things (connections, streams) per key and in total.
#[derive(Debug)]
struct Open<K> {
    per_peer: HashMap<K, usize>,
    total: usize,
}

impl<K> Default for Open<K> {
    fn default() -> Self {
        Self {
            per_peer: HashMap::new(),
            total: 0,
        }
    }
}

impl<K: std::hash::Hash + Eq> Open<K> {
    /// Counts one more for `key` within `per_key` and `total`, or names the
    /// cap it is over.
    fn enter(&mut self, key: K, per_key: usize, total: usize) -> Result<(), &'static str> {
        if self.total >= total {
            return Err("total");
        }
        let of_key = self.per_peer.entry(key).or_default();
        if *of_key >= per_key {
            return Err("per caller");
        }
        *of_key += 1;
        self.total += 1;
        Ok(())
    }

    /// Counts one less for `key`.
    fn leave(&mut self, key: &K) {
        self.total = self.total.saturating_sub(1);
        if let Some(of_key) = self.per_peer.get_mut(key) {
            *of_key = of_key.saturating_sub(1);
            if *of_key == 0 {
                self.per_peer.remove(key);
            }
        }
    }
}

/// Caps on open server streams of one kind (`WatchPlan`, `WatchLease`):
/// per caller ([`caller_key`]: the principal, else the peer address) and in
/// total, with places of the total kept for callers that have none open
/// yet, so that the first watch of one caller is not refused because
/// others hold the rest.
#[derive(Debug, Clone)]
pub struct StreamLimits {
    what: &'static str,
    per_caller: usize,
    total: usize,
    reserved: usize,
    /// The settings that set the caps, named in refusals.
    settings: [&'static str; 2],
    open: Arc<Mutex<Open<String>>>,
    refused: Arc<Throttled>,
    metrics: Option<PlannerMetrics>,
}

impl StreamLimits {
    /// At most `per_caller` open `what` streams per caller and `total` in
    /// all, of which `reserved` (less than `total`) only for callers with
    /// none open yet. `settings` name the per-caller and total settings.
    pub fn new(
        what: &'static str,
        per_caller: usize,
        total: usize,
        reserved: usize,
        settings: [&'static str; 2],
    ) -> Self {
        Self {
            what,
            per_caller,
            total,
            reserved: reserved.min(total.saturating_sub(1)),
            settings,
            open: Arc::default(),
            refused: Arc::default(),
            metrics: None,
        }
    }

    /// Refusals are counted in `metrics` too
    /// ([`PlannerMetrics::stream_refused`]).
    #[must_use]
    pub fn with_metrics(mut self, metrics: PlannerMetrics) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Streams open now, in total.
    pub fn open_count(&self) -> usize {
        self.open
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .total
    }

    /// A place for one more stream of `caller` ([`caller_key`]), held until
    /// the permit is dropped (with the stream). A caller with none open may
    /// take any place; one with some open only those not reserved.
    ///
    /// # Errors
    /// `RESOURCE_EXHAUSTED` naming the cap and its setting when the caller
    /// already has `per_caller` open, or the places it may take are all
    /// held. Refusals are logged at most once every 10 s, with their count.
    pub fn open(&self, caller: String) -> Result<StreamPermit, Status> {
        let refused = {
            let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
            let mine = open.per_peer.get(&caller).copied().unwrap_or(0);
            let mut room = self.total;
            if mine > 0 {
                room -= self.reserved;
            }
            if mine >= self.per_caller {
                Some("per_principal")
            } else if open.total >= room {
                Some("total")
            } else {
                *open.per_peer.entry(caller.clone()).or_default() += 1;
                open.total += 1;
                None
            }
        };
        let Some(cap) = refused else {
            return Ok(StreamPermit {
                open: Arc::clone(&self.open),
                caller,
            });
        };
        if let Some(metrics) = &self.metrics {
            metrics.stream_refused(self.what, cap);
        }
        if let Some(count) = self.refused.count() {
            warn!(
                refused = count,
                last_caller = caller,
                cap,
                what = self.what,
                "streams refused at their cap (logged at most every 10 s)"
            );
        }
        Err(Status::resource_exhausted(if cap == "total" {
            format!(
                "the planner has its most open {} streams ({}, --{}; {} of them kept for callers' \
                 first stream, and you have some open): close one of yours, or try again later",
                self.what, self.total, self.settings[1], self.reserved
            )
        } else {
            format!(
                "you have the most open {} streams one caller may have ({}, --{}): close one first",
                self.what, self.per_caller, self.settings[0]
            )
        }))
    }
}

/// One open stream's place ([`StreamLimits::open`]); dropping it frees it.
#[derive(Debug)]
pub struct StreamPermit {
    open: Arc<Mutex<Open<String>>>,
    caller: String,
}

impl Drop for StreamPermit {
    fn drop(&mut self) {
        self.open
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .leave(&self.caller);
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio_stream::wrappers::TcpListenerStream;

    use super::*;

    /// A listener behind [`admit`] whose admitted connections echo one
    /// byte back, then wait for their peer or their idle timeout; the
    /// outcome of each is sent on the channel.
    async fn echo_server(
        limits: ConnectionLimits,
    ) -> (
        SocketAddr,
        tokio::sync::mpsc::UnboundedReceiver<io::ErrorKind>,
    ) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let (ended, ends) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut admitted = Box::pin(admit(
                TcpListenerStream::new(listener),
                Connections::new(limits),
            ));
            while let Some(Ok(mut connection)) = admitted.next().await {
                let ended = ended.clone();
                tokio::spawn(async move {
                    let mut byte = [0_u8; 1];
                    loop {
                        match connection.read(&mut byte).await {
                            Ok(0) => {
                                let _ = ended.send(io::ErrorKind::UnexpectedEof);
                                return;
                            }
                            Ok(_) => {
                                let _ = connection.write_all(&byte).await;
                            }
                            Err(error) => {
                                let _ = ended.send(error.kind());
                                return;
                            }
                        }
                    }
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

    #[tokio::test]
    async fn the_total_cap_holds_across_peers() {
        let mut open = Open::default();
        let peer = |last: u8| IpAddr::from([10, 0, 0, last]);
        assert_eq!(open.enter(peer(1), 5, 2), Ok(()));
        assert_eq!(open.enter(peer(2), 5, 2), Ok(()));
        assert_eq!(open.enter(peer(3), 5, 2), Err("total"));
        open.leave(&peer(1));
        assert_eq!(open.enter(peer(3), 5, 2), Ok(()));
        assert!(
            !open.per_peer.contains_key(&peer(1)),
            "no entry left behind"
        );
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

    #[test]
    fn a_caller_over_its_rate_is_refused_and_others_are_not() {
        let layer = RateLimitLayer::new(
            RequestRate {
                per_second: NonZeroU32::MIN,
                burst: NonZeroU32::new(2).unwrap(),
            },
            Connections::new(ConnectionLimits::default()),
        );
        assert!(layer.check("principal:a").is_ok());
        assert!(layer.check("principal:a").is_ok());
        let refused = layer.check("principal:a").unwrap_err();
        assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
        assert!(
            refused
                .message()
                .contains("1 requests per second (burst 2)"),
            "{}",
            refused.message()
        );
        assert!(layer.check("principal:b").is_ok(), "per caller");
    }

    #[test]
    fn streams_are_capped_per_caller_and_in_total() {
        let limits = StreamLimits::new("WatchPlan", 1, 2, 0, ["per", "all"]);
        let first = limits.open("principal:a".into()).unwrap();
        let refused = limits.open("principal:a".into()).unwrap_err();
        assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
        assert!(
            refused.message().contains("WatchPlan") && refused.message().contains("--per"),
            "{}",
            refused.message()
        );
        let _second = limits.open("principal:b".into()).unwrap();
        let refused = limits.open("principal:c".into()).unwrap_err();
        assert!(refused.message().contains("--all"), "{}", refused.message());
        drop(first);
        assert!(
            limits.open("principal:a".into()).is_ok(),
            "a closed stream frees its place"
        );
    }

    #[test]
    fn refusals_are_logged_at_most_every_ten_seconds_with_their_count() {
        let throttled = Throttled::default();
        let start = Instant::now();
        assert_eq!(throttled.count_at(start), Some(1), "the first at once");
        for second in 1..10 {
            assert_eq!(
                throttled.count_at(start + Duration::from_secs(second)),
                None
            );
        }
        assert_eq!(
            throttled.count_at(start + WARN_EVERY),
            Some(10),
            "then one line for the ten since"
        );
        assert_eq!(throttled.count_at(start + WARN_EVERY), None);
    }

    #[test]
    fn a_callers_first_stream_takes_a_reserved_place() {
        // 4 places, 2 kept for first streams; one caller may hold 10.
        let limits = StreamLimits::new("WatchPlan", 10, 4, 2, ["per", "all"]);
        let crowd: Vec<_> = (0..2)
            .map(|_| limits.open("principal:crowd".into()).unwrap())
            .collect();
        assert!(
            limits.open("principal:crowd".into()).is_err(),
            "a caller with streams open cannot take the reserved places"
        );
        let _mine = limits.open("principal:me".into()).unwrap();
        let _theirs = limits.open("principal:you".into()).unwrap();
        assert!(limits.open("principal:them".into()).is_err(), "total");
        assert!(limits.open("principal:me".into()).is_err());
        drop(crowd);
        assert_eq!(limits.open_count(), 2);
        // A caller with streams open may join only while fewer than
        // total − reserved = 2 are open; a first stream while fewer than 4.
        assert!(limits.open("principal:me".into()).is_err());
        assert!(limits.open("principal:them".into()).is_ok());
    }

    #[test]
    fn the_caller_is_its_principal_else_its_peer_address() {
        let mut extensions = http::Extensions::new();
        assert_eq!(http_caller_key(&extensions), "unknown");
        extensions.insert(TcpConnectInfo {
            local_addr: None,
            remote_addr: Some("192.0.2.7:4000".parse().unwrap()),
        });
        assert_eq!(http_caller_key(&extensions), "peer:192.0.2.7");
    }
}
