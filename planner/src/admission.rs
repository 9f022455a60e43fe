//! What one caller may take of the planner, so that no caller can make it
//! unreachable for the others (docs/design.md, "Every input is bounded at
//! the edge"):
//!
//! - **connections**, per peer address and in total ([`ConnectionLimits`],
//!   [`admit`]): one over either cap is closed at once and logged. A
//!   connection must make a request that passes authentication (health
//!   checks do not count) within the first-request timeout, or it is closed:
//!   without that, idle clients that never authenticate could hold every
//!   place, since HTTP/2 clients answer keepalive pings by themselves. After
//!   that, a connection that sends nothing for the idle timeout (no request,
//!   no answer to the server's keepalive pings, RFC 9113 §6.7) is dead and
//!   closed;
//! - **requests**, per principal ([`RateLimitLayer`], GCRA from `governor`):
//!   over the rate a call is answered `RESOURCE_EXHAUSTED` before any work;
//! - **open `WatchPlan` streams**, per principal and in total
//!   ([`StreamLimits`]).
//!
//! The caller's key is its authenticated principal, or its peer address
//! when the planner runs without authentication ([`caller_key`]).

use std::{
    collections::HashMap,
    future::Future,
    io,
    net::{IpAddr, SocketAddr},
    num::NonZeroU32,
    pin::Pin,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicU64, Ordering},
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
use tonic::{
    Status,
    codegen::http,
    transport::server::{Connected, TcpConnectInfo},
};
use tracing::warn;

use crate::roles::Principal;

/// Default cap on connections from one peer address.
pub const DEFAULT_MAX_CONNECTIONS_PER_PEER: usize = 64;
/// Default cap on connections in total (below the usual 1,024 open files,
/// with room for the database pool and the broker).
pub const DEFAULT_MAX_CONNECTIONS: usize = 512;
/// Default time a new connection has to make its first request that passes
/// authentication.
pub const DEFAULT_FIRST_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
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
/// Refusals of one kind are logged at most this often.
const WARN_EVERY: Duration = Duration::from_secs(10);

/// Caps on connections ([`admit`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Open connections from one peer address.
    pub per_peer: usize,
    /// Open connections in total.
    pub total: usize,
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
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            first_request_timeout: DEFAULT_FIRST_REQUEST_TIMEOUT,
        }
    }
}

/// Which open connections made a request that passed authentication, by
/// peer socket address (a connection's own): shared by [`admit`], which
/// registers each admitted connection, and [`RateLimitLayer`], which sees
/// every authenticated request and marks its connection used.
#[derive(Debug, Clone, Default)]
pub struct Activity {
    used: Arc<Mutex<HashMap<SocketAddr, Arc<std::sync::atomic::AtomicBool>>>>,
}

impl Activity {
    fn register(&self, peer: SocketAddr) -> Arc<std::sync::atomic::AtomicBool> {
        let flag = Arc::new(std::sync::atomic::AtomicBool::new(false));
        self.used
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(peer, Arc::clone(&flag));
        flag
    }

    fn forget(&self, peer: SocketAddr) {
        self.used
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&peer);
    }

    /// Marks the connection from `peer` used.
    fn mark(&self, peer: SocketAddr) {
        if let Some(flag) = self
            .used
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&peer)
        {
            flag.store(true, Ordering::Relaxed);
        }
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
    /// Counts one refusal; `Some(count)` when it is time to log.
    pub(crate) fn count(&self) -> Option<u64> {
        let refused = self.since.fetch_add(1, Ordering::Relaxed) + 1;
        let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        if last.is_some_and(|last| now.duration_since(last) < WARN_EVERY) {
            return None;
        }
        *last = Some(now);
        self.since.store(0, Ordering::Relaxed);
        Some(refused)
    }
}

#[derive(Debug)]
struct Registry {
    limits: ConnectionLimits,
    open: Mutex<Open<IpAddr>>,
    refused: Throttled,
}

impl Registry {
    /// Counts a new connection from `peer`, or says which cap it is over.
    fn enter(self: &Arc<Self>, peer: IpAddr) -> Result<Admission, &'static str> {
        self.open
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .enter(peer, self.limits.per_peer, self.limits.total)
            .map_err(|cap| match cap {
                "total" => "the planner's connection cap",
                _ => "the per-peer connection cap",
            })?;
        Ok(Admission {
            registry: Arc::clone(self),
            peer,
        })
    }
}

/// A counted connection; leaving it (drop) frees its place.
#[derive(Debug)]
struct Admission {
    registry: Arc<Registry>,
    peer: IpAddr,
}

impl Drop for Admission {
    fn drop(&mut self) {
        self.registry
            .open
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .leave(&self.peer);
    }
}

/// The accepted connections of `incoming` within `limits`: one over a cap
/// is closed at once (the client sees the connection reset) and logged, at
/// most every 10 s, with the peer and the cap. Accept errors pass through.
pub fn admit<S>(
    incoming: S,
    limits: ConnectionLimits,
    activity: Activity,
) -> impl Stream<Item = io::Result<AdmittedConnection>> + Send + 'static
where
    S: Stream<Item = io::Result<TcpStream>> + Send + 'static,
{
    let registry = Arc::new(Registry {
        limits,
        open: Mutex::default(),
        refused: Throttled::default(),
    });
    incoming.filter_map(move |accepted| {
        let registry = Arc::clone(&registry);
        let activity = activity.clone();
        async move {
            let stream = match accepted {
                Ok(stream) => stream,
                Err(error) => return Some(Err(error)),
            };
            let Ok(peer) = stream.peer_addr() else {
                // Gone before we looked.
                return None;
            };
            match registry.enter(peer.ip()) {
                Ok(admission) => Some(Ok(AdmittedConnection::new(
                    stream, admission, &limits, peer, activity,
                ))),
                Err(cap) => {
                    if let Some(refused) = registry.refused.count() {
                        warn!(peer = %peer, cap, refused, limits = ?limits, "connections refused");
                    }
                    None
                }
            }
        }
    })
}

/// A connection within the caps: a TCP stream that fails with `TimedOut`
/// once nothing was read from it for the idle timeout.
#[derive(Debug)]
pub struct AdmittedConnection {
    stream: TcpStream,
    _admission: Admission,
    idle_timeout: Duration,
    last_read: Instant,
    /// Until when the first authenticated request may come.
    first_request_by: Instant,
    /// Set by [`RateLimitLayer`] at the first authenticated request.
    used: Arc<std::sync::atomic::AtomicBool>,
    peer: SocketAddr,
    activity: Activity,
    idle: Pin<Box<Sleep>>,
}

impl Drop for AdmittedConnection {
    fn drop(&mut self) {
        self.activity.forget(self.peer);
    }
}

impl AdmittedConnection {
    fn new(
        stream: TcpStream,
        admission: Admission,
        limits: &ConnectionLimits,
        peer: SocketAddr,
        activity: Activity,
    ) -> Self {
        let now = Instant::now();
        let first_request_by = now + limits.first_request_timeout;
        Self {
            stream,
            _admission: admission,
            idle_timeout: limits.idle_timeout,
            last_read: now,
            first_request_by,
            used: activity.register(peer),
            peer,
            activity,
            idle: Box::pin(tokio::time::sleep_until(
                first_request_by.min(now + limits.idle_timeout),
            )),
        }
    }

    /// `Err(TimedOut)` when the idle timer ran out since the last read, or
    /// the first-request time passed without an authenticated request;
    /// re-arms the timer otherwise.
    fn poll_idle(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        while self.idle.as_mut().poll(cx).is_ready() {
            let now = Instant::now();
            let mut deadline = self.last_read + self.idle_timeout;
            if !self.used.load(Ordering::Relaxed) {
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
fn http_caller_key(extensions: &http::Extensions) -> String {
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
    activity: Activity,
}

impl std::fmt::Debug for RateLimitLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("rate", &self.rate)
            .finish_non_exhaustive()
    }
}

impl RateLimitLayer {
    /// A limiter of `rate` per caller, marking the connections of the
    /// requests it sees used in `activity`.
    pub fn new(rate: RequestRate, activity: Activity) -> Self {
        let quota = Quota::per_second(rate.per_second).allow_burst(rate.burst);
        Self {
            limiter: Arc::new(RateLimiter::keyed(quota)),
            refused: Arc::new(Throttled::default()),
            rate,
            activity,
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
        // pass without credentials, so they do not make a connection used.
        if !health && let Some(peer) = http_peer(request.extensions()) {
            self.layer.activity.mark(peer);
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

/// Caps on open server streams of one kind, per caller and in total.
#[derive(Debug, Clone)]
pub struct StreamLimits {
    what: &'static str,
    per_caller: usize,
    total: usize,
    open: Arc<Mutex<Open<String>>>,
}

impl StreamLimits {
    /// At most `per_caller` open `what` streams per caller, `total` in all.
    pub fn new(what: &'static str, per_caller: usize, total: usize) -> Self {
        Self {
            what,
            per_caller,
            total,
            open: Arc::default(),
        }
    }

    /// A place for one more stream of `caller` ([`caller_key`]), held until
    /// the permit is dropped (with the stream).
    ///
    /// # Errors
    /// `RESOURCE_EXHAUSTED` naming the cap when the caller, or everyone
    /// together, already has that many open.
    pub fn open(&self, caller: String) -> Result<StreamPermit, Status> {
        let entered = self
            .open
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .enter(caller.clone(), self.per_caller, self.total);
        match entered {
            Ok(()) => Ok(StreamPermit {
                open: Arc::clone(&self.open),
                caller,
            }),
            Err(cap) => {
                let most = if cap == "total" {
                    self.total
                } else {
                    self.per_caller
                };
                warn!(caller, cap, most, what = self.what, "stream refused");
                Err(Status::resource_exhausted(format!(
                    "too many open {} streams ({cap}: at most {most}); close one first",
                    self.what
                )))
            }
        }
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
                limits,
                Activity::default(),
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
            per_peer: 2,
            total: 10,
            idle_timeout: Duration::from_secs(60),
            first_request_timeout: Duration::from_secs(60),
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

    #[tokio::test]
    async fn a_connection_that_sends_nothing_is_closed_after_the_idle_timeout() {
        let limits = ConnectionLimits {
            per_peer: 4,
            total: 4,
            idle_timeout: Duration::from_millis(300),
            first_request_timeout: Duration::from_secs(60),
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
            Activity::default(),
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
        let limits = StreamLimits::new("WatchPlan", 1, 2);
        let first = limits.open("principal:a".into()).unwrap();
        let refused = limits.open("principal:a".into()).unwrap_err();
        assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
        assert!(
            refused.message().contains("WatchPlan"),
            "{}",
            refused.message()
        );
        let _second = limits.open("principal:b".into()).unwrap();
        assert!(limits.open("principal:c".into()).is_err(), "total");
        drop(first);
        assert!(
            limits.open("principal:a".into()).is_ok(),
            "a closed stream frees its place"
        );
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
