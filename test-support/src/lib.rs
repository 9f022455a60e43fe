//! Test helpers shared by the executor's tests (`executor/tests/support`)
//! and `redrive-tests`, which re-exports them: neither can depend on the
//! other (`redrive-tests` depends on the executor), so the one
//! implementation lives here, on third-party crates only. Every helper works
//! against the local services (`scripts/services.sh` starts them) without touching what other
//! tests use: names are unique, and what a test declares is deleted also
//! when it fails.
//!
//! # Layout
//! - `amqp.rs`: [`amqp::content_header`] and [`amqp::encode`], content
//!   headers with any bytes (which lapin cannot publish), for the planner's
//!   fallback reader's tests.
//! - `lib.rs`: the local services' addresses and URLs ([`AMQP_ADDR`],
//!   [`AMQP_URL`], [`REDIS_ADDR`], [`REDIS_URL`], [`amqp_url`],
//!   [`redis_url`]), [`unique`] names, and [`block_on_aside`], the async
//!   clean-up of a `Drop`.
//! - `broker.rs`: [`Broker`], a RabbitMQ connection with a confirming
//!   channel to declare, bind, publish, count and drain with; it deletes
//!   what it declared on [`Broker::cleanup`] or when dropped.
//! - `database.rs`: [`TestDb`], a PostgreSQL database of the test's own,
//!   dropped also when the test fails; [`POSTGRES_URL`].
//! - `proxy.rs`: [`TcpProxy`], forwarding to a server until cut (connections
//!   closed, new ones refused) or stalled (nothing forwarded).
//! - `redis_servers.rs`: [`RedisCluster`] and [`RedisSentinelGroup`],
//!   private `redis-server` processes on ports of their own.

pub mod amqp;
mod broker;
mod database;
mod proxy;
mod redis_servers;

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};

pub use broker::Broker;
pub use database::{POSTGRES_URL, TestDb};
pub use proxy::TcpProxy;
pub use redis_servers::{RedisCluster, RedisProcess, RedisSentinelGroup};

/// The local RabbitMQ.
pub const AMQP_ADDR: SocketAddr = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 5672));
/// The local RabbitMQ ([`AMQP_ADDR`]) with the default credentials and vhost.
pub const AMQP_URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";
/// The local Redis.
pub const REDIS_ADDR: SocketAddr = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 6379));
/// The local Redis ([`REDIS_ADDR`]).
pub const REDIS_URL: &str = "redis://127.0.0.1:6379";

/// `amqp://` URL of `addr` (a [`TcpProxy`], say) with the default
/// credentials and vhost.
pub fn amqp_url(addr: SocketAddr) -> String {
    format!("amqp://guest:guest@{addr}/%2f")
}

/// `redis://` URL of `addr` (a [`TcpProxy`], say).
pub fn redis_url(addr: SocketAddr) -> String {
    format!("redis://{addr}/")
}

/// `{prefix}_{12 hex}`: a name no other test run uses. The separator is `_`
/// so that the name can also be a PostgreSQL database's.
pub fn unique(prefix: &str) -> String {
    format!(
        "{prefix}_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    )
}

/// Runs `work` to completion on a runtime of its own, on a thread of its own:
/// `Drop` cannot await, and may run inside a runtime.
pub fn block_on_aside<F>(work: impl FnOnce() -> F + Send + 'static)
where
    F: std::future::Future<Output = ()>,
{
    let _ = std::thread::spawn(move || {
        if let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            runtime.block_on(work());
        }
    })
    .join();
}
