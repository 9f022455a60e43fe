//! How the executors reach Redis: one server, a Redis Cluster, or a master
//! found through Redis Sentinel (docs/operating.md, "Redis Cluster and
//! Sentinel").
//!
//! [`RedisTopology`] is what the settings say (`--redis-url`,
//! `--redis-cluster`, `--redis-sentinel-master`); [`connect`] opens a
//! [`RedisConnection`] to it, which the bucket ([`crate::bucket`]) and the
//! replay keys ([`crate::replay_keys`]) share:
//!
//! - **One server**: a reconnecting connection (`redis::aio::ConnectionManager`).
//! - **Redis Cluster**: the cluster client of the `redis` crate, which learns
//!   the slot map from the seed nodes and follows `MOVED` and `ASK`
//!   redirections (<https://redis.io/docs/latest/operate/oss_and_stack/reference/cluster-spec/>).
//!   Every script touches one key (the bucket's), so it runs on the node
//!   that owns that key's slot; an `MGET` of replay keys is split by slot by
//!   the client, and the marks are written one `SET` per key
//!   ([`RedisConnection::is_cluster`]): no command spans two slots, so no
//!   hash tags are needed and the replay keys spread over the whole cluster.
//! - **Sentinel**: the master's address is asked of the Sentinels
//!   (`SENTINEL get-master-addr-by-name`, then `ROLE` on the answer, as the
//!   Sentinel client guidelines require:
//!   <https://redis.io/docs/latest/develop/reference/sentinel-clients/>).
//!   After a call fails because the master is gone (connection refused,
//!   dropped, timed out) or was demoted (`READONLY`), the next call asks the
//!   Sentinels again. The failed call itself is not retried.
//!
//! In each case a call that cannot be served fails, and the callers fail
//! closed: while a node, a master or a whole cluster is failing over, the
//! executors publish nothing, and they resume on their own once it answers.

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use redis::{
    Client, Cmd, IntoConnectionInfo, Pipeline, RedisFuture, RedisResult, Value,
    aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig, MultiplexedConnection},
    cluster::ClusterClient,
    cluster_async::ClusterConnection,
    sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType},
};

/// Where the shared Redis state lives, as configured.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RedisTopology {
    /// One Redis server (`redis://host:port/db`, `rediss://` for TLS).
    Standalone(String),
    /// A Redis Cluster, reached through any of these seed nodes' URLs; the
    /// client learns the other nodes from them (`CLUSTER SLOTS`).
    Cluster(Vec<String>),
    /// The master that these Sentinels monitor under `master` (the name in
    /// the Sentinels' `sentinel monitor <name> ...`). The URLs' credentials,
    /// database and TLS are used for the Sentinels and for the master.
    Sentinel {
        /// The Sentinels' URLs (`redis://host:26379`).
        sentinels: Vec<String>,
        /// The master's name in the Sentinels' configuration.
        master: String,
    },
}

impl RedisTopology {
    /// The topology of the settings: `urls` is `--redis-url` (one URL, or
    /// several separated by commas or whitespace, each starting `redis://`
    /// or `rediss://`: a comma inside a password stays part of its URL,
    /// see [`redrive_proto::settings::split_urls`]), `cluster` is
    /// `--redis-cluster`, `sentinel_master` is `--redis-sentinel-master`.
    ///
    /// # Errors
    /// A sentence naming what is wrong (passwords are never in it): a URL
    /// that is not `redis://` or `rediss://` or does not parse, several URLs
    /// for one server, both `--redis-cluster` and `--redis-sentinel-master`,
    /// a database other than 0 in a cluster (Redis Cluster has only
    /// database 0), an empty master name.
    pub fn from_settings(
        urls: &str,
        cluster: bool,
        sentinel_master: Option<&str>,
    ) -> Result<Self, String> {
        let urls = redrive_proto::settings::split_urls(urls, &["redis://", "rediss://"]);
        if urls.is_empty() {
            return Err("no URL given".to_owned());
        }
        for url in &urls {
            let shown = redrive_proto::settings::redact_url(url);
            if !url.starts_with("redis://") && !url.starts_with("rediss://") {
                return Err(format!("{shown:?} is not a redis:// or rediss:// URL"));
            }
            let info = url.as_str().into_connection_info().map_err(|error| {
                format!(
                    "{shown:?}: {}",
                    redrive_proto::settings::redact_text(&error.to_string(), url)
                )
            })?;
            if cluster && info.redis_settings().db() != 0 {
                return Err(format!(
                    "{shown:?} names database {}: a Redis Cluster has only database 0",
                    info.redis_settings().db()
                ));
            }
        }
        match (cluster, sentinel_master) {
            (true, Some(_)) => Err(
                "--redis-cluster and --redis-sentinel-master exclude each other: a Redis Cluster \
                 fails over by itself, Sentinel watches one master and its replicas"
                    .to_owned(),
            ),
            (true, None) => Ok(Self::Cluster(urls)),
            (false, Some(master)) if master.trim().is_empty() => Err(
                "--redis-sentinel-master is empty: give the master's name the Sentinels monitor"
                    .to_owned(),
            ),
            (false, Some(master)) => Ok(Self::Sentinel {
                sentinels: urls,
                master: master.to_owned(),
            }),
            (false, None) if urls.len() > 1 => Err(format!(
                "{} URLs for one Redis server: add --redis-cluster (they are seed nodes of a \
                 Redis Cluster) or --redis-sentinel-master NAME (they are Sentinels)",
                urls.len()
            )),
            (false, None) => Ok(Self::Standalone(
                urls.into_iter().next().unwrap_or_default(),
            )),
        }
    }

    /// What the log says: `redis`, `redis cluster` or `redis sentinel`.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Standalone(_) => "redis",
            Self::Cluster(_) => "redis cluster",
            Self::Sentinel { .. } => "redis sentinel",
        }
    }
}

/// A connection to the shared Redis state, cheap to clone (clones share
/// the connection). Commands are sent with `query_async` as on any `redis`
/// connection.
#[derive(Clone)]
pub struct RedisConnection(Link);

#[derive(Clone)]
enum Link {
    Standalone(ConnectionManager),
    Cluster(ClusterConnection),
    Sentinel(SentinelLink),
}

impl RedisConnection {
    /// Whether this is a Redis Cluster: a pipeline may then only hold
    /// commands of one hash slot, so multi-key writes go one command per key.
    pub fn is_cluster(&self) -> bool {
        matches!(self.0, Link::Cluster(_))
    }
}

impl From<ConnectionManager> for RedisConnection {
    fn from(connection: ConnectionManager) -> Self {
        Self(Link::Standalone(connection))
    }
}

impl ConnectionLike for RedisConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match &mut self.0 {
            Link::Standalone(connection) => connection.req_packed_command(cmd),
            Link::Cluster(connection) => connection.req_packed_command(cmd),
            Link::Sentinel(link) => Box::pin(link.command(cmd)),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match &mut self.0 {
            Link::Standalone(connection) => connection.req_packed_commands(pipeline, offset, count),
            Link::Cluster(connection) => connection.req_packed_commands(pipeline, offset, count),
            Link::Sentinel(link) => Box::pin(link.commands(pipeline, offset, count)),
        }
    }

    fn get_db(&self) -> i64 {
        match &self.0 {
            Link::Standalone(connection) => connection.get_db(),
            Link::Cluster(connection) => connection.get_db(),
            Link::Sentinel(link) => link.db,
        }
    }
}

/// Opens a connection to `topology`. Connection attempts and responses time
/// out after `call_timeout`; later failures reconnect (one server: in the
/// background; a cluster: by refreshing the slot map; Sentinel: by asking
/// the Sentinels again on the next call), and calls fail until then.
///
/// # Errors
/// A URL is invalid, or no server (seed node, Sentinel and its master)
/// answers within `call_timeout`.
#[tracing::instrument(name = "executor.redis.connect", skip_all, fields(redis.topology = topology.kind()), err)]
pub async fn connect(
    topology: &RedisTopology,
    call_timeout: Duration,
) -> RedisResult<RedisConnection> {
    let connecting = async {
        match topology {
            RedisTopology::Standalone(url) => {
                let client = Client::open(url.as_str())?;
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(call_timeout))
                    .set_response_timeout(Some(call_timeout))
                    .set_number_of_retries(3)
                    .set_max_delay(Duration::from_secs(1));
                let connection = ConnectionManager::new_with_config(client, config).await?;
                Ok(RedisConnection(Link::Standalone(connection)))
            }
            RedisTopology::Cluster(seeds) => {
                let client = ClusterClient::builder(seeds.iter().map(String::as_str))
                    .connection_timeout(call_timeout)
                    .response_timeout(call_timeout)
                    .retries(3)
                    .min_retry_wait(50)
                    .max_retry_wait(1_000)
                    .build()?;
                let connection = client.get_async_connection().await?;
                Ok(RedisConnection(Link::Cluster(connection)))
            }
            RedisTopology::Sentinel { sentinels, master } => {
                let link = SentinelLink::new(sentinels, master, call_timeout)?;
                link.connection().await?;
                Ok(RedisConnection(Link::Sentinel(link)))
            }
        }
    };
    match tokio::time::timeout(call_timeout, connecting).await {
        Ok(result) => result,
        Err(_) => Err(redis::RedisError::from(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("{} did not answer within {call_timeout:?}", topology.kind()),
        ))),
    }
}

/// The master of a Sentinel-watched group: the connection to the master the
/// Sentinels named last, and how to ask them again.
#[derive(Clone)]
struct SentinelLink {
    sentinel: Arc<tokio::sync::Mutex<SentinelClient>>,
    /// The current master connection and its generation; `None` after a
    /// failure that means the master is gone or demoted.
    current: Arc<Mutex<Option<(u64, MultiplexedConnection)>>>,
    generations: Arc<AtomicU64>,
    config: redis::AsyncConnectionConfig,
    db: i64,
}

impl SentinelLink {
    fn new(sentinels: &[String], master: &str, call_timeout: Duration) -> RedisResult<Self> {
        let first = sentinels
            .first()
            .map(String::as_str)
            .unwrap_or_default()
            .into_connection_info()?;
        let settings = first.redis_settings().clone();
        let db = settings.db();
        let mut node = SentinelNodeConnectionInfo::default().set_redis_connection_info(settings);
        if let redis::ConnectionAddr::TcpTls { insecure, .. } = first.addr() {
            node = node.set_tls_mode(if *insecure {
                redis::TlsMode::Insecure
            } else {
                redis::TlsMode::Secure
            });
        }
        let sentinel = SentinelClient::build(
            sentinels.iter().map(String::as_str).collect(),
            master,
            Some(node),
            SentinelServerType::Master,
        )?;
        Ok(Self {
            sentinel: Arc::new(tokio::sync::Mutex::new(sentinel)),
            current: Arc::new(Mutex::new(None)),
            generations: Arc::new(AtomicU64::new(0)),
            config: redis::AsyncConnectionConfig::new()
                .set_connection_timeout(Some(call_timeout))
                .set_response_timeout(Some(call_timeout)),
            db,
        })
    }

    fn cached(&self) -> Option<(u64, MultiplexedConnection)> {
        self.current
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// The master connection, asking the Sentinels for the master when there
    /// is none (one caller asks; the others wait for its answer).
    async fn connection(&self) -> RedisResult<(u64, MultiplexedConnection)> {
        if let Some(current) = self.cached() {
            return Ok(current);
        }
        let mut sentinel = self.sentinel.lock().await;
        if let Some(current) = self.cached() {
            return Ok(current);
        }
        let connection = sentinel
            .get_async_connection_with_config(&self.config)
            .await?;
        let generation = self.generations.fetch_add(1, Ordering::Relaxed) + 1;
        *self
            .current
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) =
            Some((generation, connection.clone()));
        tracing::info!(generation, "connected to the master the Sentinels name");
        Ok((generation, connection))
    }

    /// Forgets connection `generation` (not a newer one another call opened).
    fn forget(&self, generation: u64, reason: &str) {
        let mut current = self
            .current
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if current
            .as_ref()
            .is_some_and(|(held, _)| *held == generation)
        {
            tracing::warn!(
                reason,
                "the Redis master is lost: asking the Sentinels again"
            );
            *current = None;
        }
    }

    async fn command(&self, cmd: &Cmd) -> RedisResult<Value> {
        let (generation, mut connection) = self.connection().await?;
        let answer = connection.req_packed_command(cmd).await;
        match &answer {
            Err(error) if master_lost(error) => self.forget(generation, &error.to_string()),
            Ok(Value::ServerError(error)) if error.code() == "READONLY" => {
                self.forget(generation, "READONLY");
            }
            _ => {}
        }
        answer
    }

    async fn commands(
        &self,
        pipeline: &Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisResult<Vec<Value>> {
        let (generation, mut connection) = self.connection().await?;
        let answers = connection
            .req_packed_commands(pipeline, offset, count)
            .await;
        match &answers {
            Err(error) if master_lost(error) => self.forget(generation, &error.to_string()),
            Ok(values)
                if values.iter().any(
                    |value| matches!(value, Value::ServerError(error) if error.code() == "READONLY"),
                ) =>
            {
                self.forget(generation, "READONLY");
            }
            _ => {}
        }
        answers
    }
}

/// Whether `error` means the master is unreachable or no longer the master.
fn master_lost(error: &redis::RedisError) -> bool {
    error.is_io_error()
        || error.is_connection_dropped()
        || error.is_connection_refusal()
        || error.is_timeout()
        || error.code() == Some("READONLY")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_name_the_topology_or_what_is_wrong() {
        let one = RedisTopology::from_settings("redis://127.0.0.1:6379/2", false, None);
        assert_eq!(
            one,
            Ok(RedisTopology::Standalone(
                "redis://127.0.0.1:6379/2".to_owned()
            ))
        );
        let cluster =
            RedisTopology::from_settings("redis://:p,w@a:7000, REDIS://b:7001\n", true, None)
                .unwrap();
        assert_eq!(
            cluster,
            RedisTopology::Cluster(vec![
                "redis://:p,w@a:7000".to_owned(),
                "redis://b:7001".to_owned()
            ])
        );
        let sentinel = RedisTopology::from_settings(
            "redis://s1:26379,redis://s2:26379",
            false,
            Some("orders"),
        )
        .unwrap();
        assert_eq!(
            sentinel,
            RedisTopology::Sentinel {
                sentinels: vec!["redis://s1:26379".to_owned(), "redis://s2:26379".to_owned()],
                master: "orders".to_owned()
            }
        );
        for (urls, cluster, master, expected) in [
            (
                "redis://a:1,redis://b:2",
                false,
                None,
                "add --redis-cluster",
            ),
            ("redis://a:1", true, Some("m"), "exclude each other"),
            ("redis://a:1/3", true, None, "only database 0"),
            ("redis://a:1", false, Some(" "), "is empty"),
            ("http://a:1", false, None, "is not a redis://"),
            ("amqp://b,redis://a:1", true, None, "\"amqp://b\" is not"),
            (" , ", false, None, "no URL"),
            ("redis://u:hunter2@a:notaport", false, None, "redis://u:"),
        ] {
            let error = RedisTopology::from_settings(urls, cluster, master).unwrap_err();
            assert!(error.contains(expected), "{urls}: {error}");
            assert!(!error.contains("hunter2"), "{error}");
        }
    }
}
