//! The record of message keys already replayed, in Redis (docs/design.md,
//! "Executor loop and guarantees": "Mark sent (Redis key with TTL, default
//! 7 days) ... only after an ack without a return").
//!
//! Before publishing, an executor asks [`ReplayKeys::already_sent`] for a
//! batch of replay identities and skips those found; after a publisher
//! confirm without a return it records them with [`ReplayKeys::mark_sent`].
//!
//! A replay's identity is its message key *and* its dead letter's
//! destination (docs/design.md, "Words": one message delivered to queues `a` and
//! `b` and dead-lettered by both is two pieces of work), built by
//! [`identity`] as `{destination length}:{destination}:{message key}`. Each
//! identity `i` is stored as `{prefix}replayed-on:{b}:{broker}:{i}` (`b`
//! the broker id's length in bytes) holding the id of the plan that sent it,
//! with a TTL. The broker id ([`ReplayKeys::on_broker`]: the executor's
//! `--broker-id`, by default its AMQP URL's `host:port/vhost`) keeps two
//! brokers or virtual hosts sharing one Redis and prefix from taking each
//! other's replays for their own: a queue `orders` on broker A is not the
//! queue `orders` on broker B. Both calls are one round trip per batch (on
//! a Redis Cluster, one per node the batch's keys live on: see
//! [`crate::redis_topology`]).
//!
//! Entries of the former formats (`{prefix}replayed:{message key}`, without
//! the destination, and `{prefix}replayed-to:{i}`, without the broker) are
//! not read; they expire by their TTL. The planner's record of replays (the
//! audit's `sent` and `uncertain` events per message key and destination)
//! still covers those replays: every lease hands out `key_replayed` from it,
//! so an upgraded executor still skips them (docs/replay.md, "Identity").
//!
//! Fail closed like the token bucket: when Redis cannot be reached the calls
//! return [`ReplayKeysError::Unavailable`] and the caller stops publishing.

use std::time::Duration;

use crate::redis_topology::RedisConnection;

/// How long a replayed key is remembered unless configured otherwise.
pub const DEFAULT_TTL: Duration = Duration::from_secs(7 * 24 * 60 * 60);

/// Key prefix unless configured otherwise (keys are
/// `redrive:replayed-on:{broker length}:{broker}:{identity}`).
pub const DEFAULT_PREFIX: &str = "redrive:";

/// The replay identity of a message key published for a dead letter that died
/// in `destination` (the dead letter's destination, not a redirect):
/// `{destination length in bytes}:{destination}:{message key}`. The length
/// prefix keeps a `:` in either part from making two identities equal.
pub fn identity(destination: &str, message_key: &str) -> String {
    format!("{}:{destination}:{message_key}", destination.len())
}

/// Why the record of replayed keys could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum ReplayKeysError {
    /// Redis could not be reached, failed or did not answer within the call
    /// timeout. Retryable; publish nothing meanwhile (fail closed).
    #[error("replay key record unavailable: {reason}")]
    Unavailable {
        /// What failed, for the log.
        reason: String,
    },
    /// A TTL below 1 ms cannot be stored (`SET ... PX` needs at least 1).
    #[error("invalid replay key ttl {0:?}: must be at least 1 ms")]
    InvalidTtl(Duration),
}

impl ReplayKeysError {
    /// Whether trying again later can succeed: true for
    /// [`ReplayKeysError::Unavailable`].
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::Unavailable { .. })
    }
}

/// The replayed-key record over a reconnecting Redis connection (see
/// [`crate::redis_topology::connect`]).
#[derive(Clone)]
pub struct ReplayKeys {
    connection: RedisConnection,
    prefix: String,
    broker: String,
    ttl: Duration,
    call_timeout: Duration,
}

impl ReplayKeys {
    /// A record storing identities under `{prefix}replayed-on:` (normally
    /// [`DEFAULT_PREFIX`]) for `ttl` (normally [`DEFAULT_TTL`]). Calls time
    /// out after [`crate::bucket::DEFAULT_CALL_TIMEOUT`]; see
    /// [`ReplayKeys::with_call_timeout`].
    ///
    /// # Errors
    /// [`ReplayKeysError::InvalidTtl`] when `ttl` is under 1 ms.
    pub fn new(
        connection: RedisConnection,
        prefix: impl Into<String>,
        ttl: Duration,
    ) -> Result<Self, ReplayKeysError> {
        if ttl < Duration::from_millis(1) {
            return Err(ReplayKeysError::InvalidTtl(ttl));
        }
        Ok(Self {
            connection,
            prefix: prefix.into(),
            broker: String::new(),
            ttl,
            call_timeout: crate::bucket::DEFAULT_CALL_TIMEOUT,
        })
    }

    /// The same record for the broker (and virtual host) named `broker_id`:
    /// its keys are not another broker's (see the module docs). Without it
    /// the broker id is empty.
    #[must_use]
    pub fn on_broker(mut self, broker_id: impl Into<String>) -> Self {
        self.broker = broker_id.into();
        self
    }

    /// The broker id the keys are qualified by ([`ReplayKeys::on_broker`]).
    pub fn broker(&self) -> &str {
        &self.broker
    }

    /// The same record with another per-call timeout.
    #[must_use]
    pub fn with_call_timeout(mut self, call_timeout: Duration) -> Self {
        self.call_timeout = call_timeout;
        self
    }

    /// The Redis key recording `identity` (see [`identity`]):
    /// `{prefix}replayed-on:{broker length}:{broker}:{identity}`.
    pub fn redis_key(&self, identity: &str) -> String {
        format!(
            "{}replayed-on:{}:{}:{identity}",
            self.prefix,
            self.broker.len(),
            self.broker
        )
    }

    /// How long a mark lasts.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// For each of `message_keys` (replay identities, see [`identity`]), in
    /// order, whether it was marked sent (and
    /// has not expired). One `MGET`; an empty slice makes no call.
    ///
    /// # Errors
    /// [`ReplayKeysError::Unavailable`] (retryable) when Redis fails.
    pub async fn already_sent(
        &self,
        message_keys: &[String],
    ) -> Result<Vec<bool>, ReplayKeysError> {
        Ok(self
            .sent_by(message_keys)
            .await?
            .iter()
            .map(Option::is_some)
            .collect())
    }

    /// For each of `message_keys` (replay identities, see [`identity`]), in
    /// order, the plan id it was marked sent by
    /// (`None`: not marked, or expired). One `MGET`; an empty slice makes no
    /// call.
    ///
    /// # Errors
    /// [`ReplayKeysError::Unavailable`] (retryable) when Redis fails.
    pub async fn sent_by(
        &self,
        message_keys: &[String],
    ) -> Result<Vec<Option<String>>, ReplayKeysError> {
        if message_keys.is_empty() {
            return Ok(Vec::new());
        }
        let redis_keys: Vec<String> = message_keys
            .iter()
            .map(|message_key| self.redis_key(message_key))
            .collect();
        let mut command = redis::cmd("MGET");
        command.arg(&redis_keys);
        let mut connection = self.connection.clone();
        let values: Vec<Option<Vec<u8>>> = self
            .timed(command.query_async(&mut connection), "MGET")
            .await?;
        if values.len() != message_keys.len() {
            return Err(ReplayKeysError::Unavailable {
                reason: format!(
                    "MGET answered {} values for {} keys",
                    values.len(),
                    message_keys.len()
                ),
            });
        }
        Ok(values
            .into_iter()
            .map(|value| value.map(|plan| String::from_utf8_lossy(&plan).into_owned()))
            .collect())
    }

    /// Records each `(replay identity, plan id)` as sent (see [`identity`]),
    /// by `SET {prefix}replayed-on:…:{identity} {plan id} PX {ttl}`: one
    /// pipeline on one server or under Sentinel; on a Redis Cluster one
    /// command per key, all sent at once (a pipeline there may only hold
    /// keys of one hash slot), each to its slot's node. An existing mark is
    /// overwritten (new plan id, fresh TTL): the key means "sent at least
    /// once", and the newest sender is the useful one to name. Call it only
    /// after a publisher confirm ack without a return. An empty slice makes
    /// no call.
    ///
    /// # Errors
    /// [`ReplayKeysError::Unavailable`] (retryable) when Redis fails; some
    /// marks may then have been written.
    pub async fn mark_sent(&self, entries: &[(String, String)]) -> Result<(), ReplayKeysError> {
        if entries.is_empty() {
            return Ok(());
        }
        let ttl_ms = u64::try_from(self.ttl.as_millis()).unwrap_or(u64::MAX);
        let set = |message_key: &str, plan_id: &str| {
            let mut command = redis::cmd("SET");
            command
                .arg(self.redis_key(message_key))
                .arg(plan_id)
                .arg("PX")
                .arg(ttl_ms);
            command
        };
        if self.connection.is_cluster() {
            let writes = entries.iter().map(|(message_key, plan_id)| {
                let command = set(message_key, plan_id);
                let mut connection = self.connection.clone();
                async move { command.query_async::<()>(&mut connection).await }
            });
            return self
                .timed(
                    async { futures::future::try_join_all(writes).await.map(drop) },
                    "SET per key",
                )
                .await;
        }
        let mut pipeline = redis::pipe();
        for (message_key, plan_id) in entries {
            pipeline.add_command(set(message_key, plan_id)).ignore();
        }
        let mut connection = self.connection.clone();
        self.timed(pipeline.query_async::<()>(&mut connection), "SET pipeline")
            .await
    }

    async fn timed<T>(
        &self,
        call: impl Future<Output = redis::RedisResult<T>>,
        what: &str,
    ) -> Result<T, ReplayKeysError> {
        match tokio::time::timeout(self.call_timeout, call).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(error)) => Err(ReplayKeysError::Unavailable {
                reason: format!("redis {what} failed: {error}"),
            }),
            Err(_) => Err(ReplayKeysError::Unavailable {
                reason: format!("redis {what} did not answer within {:?}", self.call_timeout),
            }),
        }
    }
}
