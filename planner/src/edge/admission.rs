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
//!
//! - `connections.rs`: the two pools of connections, [`admit`] and
//!   [`AdmittedConnection`] (idle and first-request deadlines, eviction).
//! - `rate.rs`: [`RateLimitLayer`], the requests per caller.
//! - `streams.rs`: [`StreamLimits`], the open server streams per caller.
//! - here: the defaults, the caller's key, and what the three share
//!   (counting per key and in total, throttled refusal logs).

mod connections;
mod rate;
mod streams;

use std::{
    collections::HashMap,
    net::SocketAddr,
    sync::{
        Mutex, PoisonError,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use tokio::time::Instant;
use tonic::{codegen::http, transport::server::TcpConnectInfo};

pub use self::{
    connections::{AdmittedConnection, ConnectionLimits, Connections, admit},
    rate::{RateLimitLayer, RateLimited, RequestRate},
    streams::{StreamLimits, StreamPermit},
};
use crate::edge::roles::Principal;

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

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use super::*;

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
