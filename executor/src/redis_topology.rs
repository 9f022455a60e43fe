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
//! - **Sentinel**: the master's address is asked of the Sentinels, then
//!   its `ROLE` checked, as the Sentinel client guidelines require
//!   (<https://redis.io/docs/latest/develop/reference/sentinel-clients/>).
//!   After a call fails because the master is gone (connection refused,
//!   dropped, timed out) or was demoted (`READONLY`), the next call asks the
//!   Sentinels again, in a search of its own that outlives the call that
//!   started it (Sentinels that do not answer cost it time, never the
//!   outcome). The failed call itself is not retried. Every second a
//!   Sentinel is also asked which master it names, and a connection to
//!   another one is dropped: a replaced master may accept writes for a
//!   while (after `SENTINEL FAILOVER`, until it is reconfigured), and what
//!   is written there is lost when it becomes a replica. The answer is the
//!   first Sentinel's that answers, not a majority's: on the wrong side of
//!   a partition an old master can still be named (Redis's own remedy is
//!   `min-replicas-to-write` on the master).
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
    sentinel::{SentinelClient, SentinelServerType},
};

/// Where the shared Redis state lives, as configured. Its `Debug` hides
/// every password.
#[derive(Clone, PartialEq, Eq)]
pub enum RedisTopology {
    /// One Redis server (`redis://host:port/db`, `rediss://` for TLS).
    Standalone(String),
    /// A Redis Cluster, reached through any of these seed nodes' URLs; the
    /// client learns the other nodes from them (`CLUSTER SLOTS`).
    Cluster(Vec<String>),
    /// The master that these Sentinels monitor under `master` (the name in
    /// the Sentinels' `sentinel monitor <name> ...`).
    Sentinel {
        /// The Sentinels' URLs (`redis://host:26379`): the first one's
        /// credentials authenticate to every Sentinel (none: no `AUTH`), its
        /// database and TLS are the master's.
        sentinels: Vec<String>,
        /// The master's name in the Sentinels' configuration.
        master: String,
        /// The master's password when it is not the Sentinels'
        /// (`--redis-master-password`); `None`: the first URL's credentials.
        master_password: Option<String>,
    },
}

impl std::fmt::Debug for RedisTopology {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use redrive_proto::settings::redact_url;
        let redacted = |urls: &[String]| urls.iter().map(|url| redact_url(url)).collect::<Vec<_>>();
        match self {
            Self::Standalone(url) => f.debug_tuple("Standalone").field(&redact_url(url)).finish(),
            Self::Cluster(urls) => f.debug_tuple("Cluster").field(&redacted(urls)).finish(),
            Self::Sentinel {
                sentinels,
                master,
                master_password,
            } => f
                .debug_struct("Sentinel")
                .field("sentinels", &redacted(sentinels))
                .field("master", master)
                .field(
                    "master_password",
                    &master_password.as_ref().map(|_| "<hidden>"),
                )
                .finish(),
        }
    }
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
                master: master.trim().to_owned(),
                master_password: None,
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

    /// The same topology with the Sentinel-watched master's own password
    /// (`--redis-master-password`).
    ///
    /// # Errors
    /// A password for another topology than Sentinel.
    pub fn with_master_password(self, password: Option<String>) -> Result<Self, String> {
        match (self, password) {
            (topology, None) => Ok(topology),
            (
                Self::Sentinel {
                    sentinels, master, ..
                },
                Some(password),
            ) => Ok(Self::Sentinel {
                sentinels,
                master,
                master_password: Some(password),
            }),
            (_, Some(_)) => Err(
                "--redis-master-password is the password of a master found through Sentinel: \
                 it needs --redis-sentinel-master (put a server's or a cluster's password in \
                 --redis-url)"
                    .to_owned(),
            ),
        }
    }

    /// Where it is, for the log, passwords redacted
    /// ([`redrive_proto::settings::redact_url`]): the server's URL, the
    /// seed nodes' URLs, or the Sentinels' URLs and the master's name
    /// (`redis://s1:26379, redis://s2:26379 (master mymaster)`).
    pub fn addresses(&self) -> String {
        use redrive_proto::settings::redact_url;
        let list = |urls: &[String]| {
            urls.iter()
                .map(|url| redact_url(url))
                .collect::<Vec<_>>()
                .join(", ")
        };
        match self {
            Self::Standalone(url) => redact_url(url),
            Self::Cluster(urls) => list(urls),
            Self::Sentinel {
                sentinels, master, ..
            } => format!("{} (master {master})", list(sentinels)),
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
/// A URL is invalid, or no server answers in time: a server or a seed node
/// within `call_timeout`; the Sentinels and the master they name within
/// [`MASTER_SEARCH_TIMEOUT`] (15 s: the Sentinels are asked in turn).
// The error is the span's at debug: the caller warns once, naming where.
#[tracing::instrument(name = "executor.redis.connect", skip_all, fields(redis.topology = topology.kind()), err(level = "debug"))]
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
            RedisTopology::Sentinel {
                sentinels,
                master,
                master_password,
            } => {
                let link =
                    SentinelLink::new(sentinels, master, master_password.as_deref(), call_timeout)?;
                link.connection().await?;
                link.watch();
                Ok(RedisConnection(Link::Sentinel(link)))
            }
        }
    };
    // Finding a master may take longer than one call: the Sentinels are asked
    // in turn.
    let limit = match topology {
        RedisTopology::Sentinel { .. } => MASTER_SEARCH_TIMEOUT.max(call_timeout),
        _ => call_timeout,
    };
    match tokio::time::timeout(limit, connecting).await {
        Ok(result) => result,
        Err(_) => Err(redis::RedisError::from(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("{} did not answer within {limit:?}", topology.kind()),
        ))),
    }
}

/// Whether `error` is Redis refusing the credentials of the URL (the
/// client's `AuthenticationFailed`, or the server's `WRONGPASS`/`NOAUTH`
/// replies: <https://redis.io/docs/latest/commands/auth/>), which will not
/// mend by itself as an outage does.
pub fn credentials_refused(error: &redis::RedisError) -> bool {
    error.kind() == redis::ErrorKind::AuthenticationFailed
        || matches!(error.code(), Some("WRONGPASS" | "NOAUTH"))
}

/// How long one search for the master may take: the Sentinels asked in
/// turn (each with the `redis` crate's own connect and reply timeouts), then
/// the master's `ROLE`. The search runs as a task of its own, so a caller
/// that gives up (its call timeout) does not cancel it: the next caller
/// waits for the same search.
const MASTER_SEARCH_TIMEOUT: Duration = Duration::from_secs(15);

/// How often the Sentinels are asked which master they name, so that a
/// connection to a master they replaced is dropped even while that master
/// still accepts writes (after `SENTINEL FAILOVER`, until the Sentinel
/// turns it into a replica; during a partition): the Sentinel client
/// guidelines' advice to notice a switch without waiting for an error.
const MASTER_CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// A master connection: its generation, the connection, the master's
/// address (`host:port`).
type Held = (u64, MultiplexedConnection, String);

/// The outcome of one search for the master, shared by its waiters.
type Search = futures::future::Shared<
    futures::future::BoxFuture<'static, Result<(u64, MultiplexedConnection), String>>,
>;

/// The master of a Sentinel-watched group: the connection to the master the
/// Sentinels named last, and how to ask them again.
#[derive(Clone)]
struct SentinelLink {
    sentinel: Arc<tokio::sync::Mutex<SentinelClient>>,
    /// The current master connection, its generation and the master's
    /// address; `None` after a failure that means the master is gone or
    /// demoted, or once the Sentinels name another master.
    current: Arc<Mutex<Option<Held>>>,
    /// The search under way, if any.
    searching: Arc<Mutex<Option<Search>>>,
    /// How to reach each Sentinel (its credentials, no database), for the
    /// once-a-second question of [`SentinelLink::watch`].
    sentinels: Arc<Vec<redis::ConnectionInfo>>,
    /// The master's name in the Sentinels' configuration.
    master: Arc<str>,
    generations: Arc<AtomicU64>,
    config: redis::AsyncConnectionConfig,
    db: i64,
}

impl SentinelLink {
    /// The Sentinels of `sentinels` (authenticated with the first URL's
    /// credentials, never with a database: Sentinels have none) watching
    /// `master`, whose connections use the first URL's database and
    /// `master_password` (else the first URL's credentials).
    fn new(
        sentinels: &[String],
        master: &str,
        master_password: Option<&str>,
        call_timeout: Duration,
    ) -> RedisResult<Self> {
        let mut addresses = Vec::new();
        let mut first = None;
        for url in sentinels {
            let info = url.as_str().into_connection_info()?;
            addresses.push(info.addr().clone());
            first.get_or_insert(info);
        }
        let first = first.ok_or_else(|| {
            redis::RedisError::from((redis::ErrorKind::InvalidClientConfig, "no Sentinel URL"))
        })?;
        let settings = first.redis_settings();
        let mut sentinel_settings = redis::RedisConnectionInfo::default();
        if let Some(username) = settings.username() {
            sentinel_settings = sentinel_settings.set_username(username);
        }
        if let Some(password) = settings.password() {
            sentinel_settings = sentinel_settings.set_password(password);
        }
        let sentinel_infos = addresses
            .iter()
            .map(|address| {
                address
                    .clone()
                    .into_connection_info()
                    .map(|info| info.set_redis_settings(sentinel_settings.clone()))
            })
            .collect::<RedisResult<Vec<_>>>()?;
        let db = settings.db();
        let mut builder = redis::sentinel::SentinelClientBuilder::new(
            addresses,
            master,
            SentinelServerType::Master,
        )?
        .set_client_to_redis_db(db);
        if let redis::ConnectionAddr::TcpTls { insecure, .. } = first.addr() {
            let mode = if *insecure {
                redis::TlsMode::Insecure
            } else {
                redis::TlsMode::Secure
            };
            builder = builder
                .set_client_to_redis_tls_mode(mode)
                .set_client_to_sentinel_tls_mode(mode);
        }
        if let Some(username) = settings.username() {
            builder = builder.set_client_to_sentinel_username(username);
        }
        if let Some(password) = settings.password() {
            builder = builder.set_client_to_sentinel_password(password);
        }
        match master_password {
            Some(password) => builder = builder.set_client_to_redis_password(password),
            None => {
                if let Some(username) = settings.username() {
                    builder = builder.set_client_to_redis_username(username);
                }
                if let Some(password) = settings.password() {
                    builder = builder.set_client_to_redis_password(password);
                }
            }
        }
        Ok(Self {
            sentinel: Arc::new(tokio::sync::Mutex::new(builder.build()?)),
            current: Arc::new(Mutex::new(None)),
            searching: Arc::new(Mutex::new(None)),
            sentinels: Arc::new(sentinel_infos),
            master: Arc::from(master),
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
            .as_ref()
            .map(|(generation, connection, _)| (*generation, connection.clone()))
    }

    /// Asks a Sentinel every [`MASTER_CHECK_INTERVAL`] which master it
    /// names (`SENTINEL GET-MASTER-ADDR-BY-NAME`, over one connection kept
    /// open, the next Sentinel after a failure), and forgets the connection
    /// to another one. No connection to the master is opened for it. Ends
    /// when every clone of the link is dropped.
    fn watch(&self) {
        let current = Arc::downgrade(&self.current);
        let sentinels = Arc::clone(&self.sentinels);
        let master = Arc::clone(&self.master);
        let config = self.config.clone();
        tokio::spawn(async move {
            let mut asking: Option<MultiplexedConnection> = None;
            let mut next = 0;
            loop {
                tokio::time::sleep(MASTER_CHECK_INTERVAL).await;
                let Some(current) = current.upgrade() else {
                    return;
                };
                let held = current
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .as_ref()
                    .map(|(generation, _, address)| (*generation, address.clone()));
                let Some((generation, address)) = held else {
                    continue;
                };
                if asking.is_none() && !sentinels.is_empty() {
                    let info = sentinels[next % sentinels.len()].clone();
                    next += 1;
                    if let Ok(client) = Client::open(info) {
                        asking = client
                            .get_multiplexed_async_connection_with_config(&config)
                            .await
                            .ok();
                    }
                }
                let Some(connection) = &mut asking else {
                    continue;
                };
                let mut question = redis::cmd("SENTINEL");
                question.arg("GET-MASTER-ADDR-BY-NAME").arg(&*master);
                match question
                    .query_async::<Option<(String, u16)>>(connection)
                    .await
                {
                    Ok(Some((host, port))) if format!("{host}:{port}") != address => forget(
                        &current,
                        generation,
                        &format!("the Sentinels name {host}:{port} now"),
                    ),
                    Ok(_) => {}
                    Err(_) => asking = None,
                }
            }
        });
    }

    /// The master connection; when there is none, waits for a search of
    /// the Sentinels (starting one unless one is under way).
    async fn connection(&self) -> RedisResult<(u64, MultiplexedConnection)> {
        if let Some(current) = self.cached() {
            return Ok(current);
        }
        let search = {
            let mut searching = self
                .searching
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            // A search that ended since the first look left its connection.
            if let Some(current) = self.cached() {
                return Ok(current);
            }
            searching.get_or_insert_with(|| self.search()).clone()
        };
        search.await.map_err(|reason| {
            redis::RedisError::from(std::io::Error::new(
                std::io::ErrorKind::NotConnected,
                reason,
            ))
        })
    }

    /// One search for the master, as a task of its own (see
    /// [`MASTER_SEARCH_TIMEOUT`]); it records its outcome and ends the
    /// search, so the next caller after a failure starts a new one.
    fn search(&self) -> Search {
        use futures::FutureExt as _;
        let link = self.clone();
        let task = tokio::spawn(async move {
            let found = tokio::time::timeout(MASTER_SEARCH_TIMEOUT, async {
                let client = link.sentinel.lock().await.async_get_client().await?;
                let address = client.get_connection_info().addr().to_string();
                let connection = client
                    .get_multiplexed_async_connection_with_config(&link.config)
                    .await?;
                RedisResult::Ok((connection, address))
            })
            .await;
            let outcome = match found {
                Ok(Ok((connection, address))) => {
                    let generation = link.generations.fetch_add(1, Ordering::Relaxed) + 1;
                    tracing::info!(generation, master = %address, "connected to the master the Sentinels name");
                    *link
                        .current
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner) =
                        Some((generation, connection.clone(), address));
                    Ok((generation, connection))
                }
                Ok(Err(error)) => Err(format!("no master from the Sentinels: {error}")),
                Err(_) => Err(format!(
                    "no master from the Sentinels within {MASTER_SEARCH_TIMEOUT:?}"
                )),
            };
            *link
                .searching
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = None;
            outcome
        });
        let searching = Arc::clone(&self.searching);
        async move {
            task.await.unwrap_or_else(|error| {
                // The task ended without clearing the slot (a panic, or its
                // runtime shut down): clear it, so the next call searches.
                *searching
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = None;
                Err(format!("the search for the master failed: {error}"))
            })
        }
        .boxed()
        .shared()
    }

    /// Forgets connection `generation` (not a newer one another call opened).
    fn forget(&self, generation: u64, reason: &str) {
        forget(&self.current, generation, reason);
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

/// Forgets the connection of `current` if it is still `generation`.
fn forget(current: &Mutex<Option<Held>>, generation: u64, reason: &str) {
    let mut current = current
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if current
        .as_ref()
        .is_some_and(|(held, _, _)| *held == generation)
    {
        tracing::warn!(
            reason,
            "the Redis master is lost: asking the Sentinels again"
        );
        *current = None;
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
                master: "orders".to_owned(),
                master_password: None,
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
        let secret = RedisTopology::from_settings("redis://:hunter2@s:26379", false, Some("m"))
            .and_then(|topology| topology.with_master_password(Some("hunter3".to_owned())))
            .unwrap();
        let shown = format!("{secret:?}");
        assert!(
            !shown.contains("hunter2") && !shown.contains("hunter3"),
            "{shown}"
        );
        // A refused password is told from an outage.
        let refused = redis::RedisError::from((
            redis::ErrorKind::AuthenticationFailed,
            "Password authentication failed",
        ));
        assert!(credentials_refused(&refused));
        let down =
            redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert!(!credentials_refused(&down));
        // The log's "Redis unreachable" line names where, never a password.
        assert_eq!(secret.addresses(), "redis://:***@s:26379 (master m)");
        assert_eq!(cluster.addresses(), "redis://:***@a:7000, redis://b:7001");
        assert_eq!(one.unwrap().addresses(), "redis://127.0.0.1:6379/2");
    }
}
