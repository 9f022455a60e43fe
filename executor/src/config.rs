//! The executor's settings: flags and environment variables ([`Config`])
//! and their validation.

use std::{net::SocketAddr, path::PathBuf};

use clap::Parser;
use redrive_proto::{
    settings::{
        AmqpSettings, ServiceSettings, SettingError, SettingErrors, TelemetrySettings,
        read_secret_into,
    },
    tls::ClientTlsFiles,
};

use crate::redis_topology::RedisTopology;

/// `redrive-executor` settings.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "redrive-executor",
    version,
    about = "Redrive executor: replays plan slices with publisher confirms"
)]
pub struct Config {
    /// The planner: its gRPC URL (`https://` for TLS), or HOST:PORT alone
    /// for `http://HOST:PORT`.
    #[arg(
        long,
        env = "REDRIVE_PLANNER",
        default_value = "http://127.0.0.1:50051"
    )]
    pub planner: String,

    /// PEM bundle of the CAs the planner's certificate must chain to
    /// (default with `https://`: the platform's roots).
    #[arg(long, env = "REDRIVE_CA", value_name = "FILE")]
    pub ca: Option<PathBuf>,

    /// PEM client certificate presented to the planner: its CN (or first
    /// DNS name) is this executor's principal, which needs the executor
    /// role (needs --tls-client-key).
    #[arg(long, env = "REDRIVE_TLS_CLIENT_CERT", value_name = "FILE")]
    pub tls_client_cert: Option<PathBuf>,

    /// PEM private key of --tls-client-cert.
    #[arg(long, env = "REDRIVE_TLS_CLIENT_KEY", value_name = "FILE")]
    pub tls_client_key: Option<PathBuf>,

    /// The broker replays are published to: `--amqp-url`, `--amqp-url-file`.
    #[command(flatten)]
    pub amqp: AmqpSettings,

    /// Redis URL of the shared token bucket and replay keys (`rediss://` for
    /// TLS). With --redis-cluster: seed nodes of a Redis Cluster,
    /// comma-separated; with --redis-sentinel-master: the Sentinels' URLs.
    /// Without it the executor runs in single-executor mode (in-process
    /// limiter, the planner's record of sent keys): run only one such executor.
    #[arg(long, env = "REDRIVE_REDIS_URL", hide_env_values = true)]
    pub redis_url: Option<String>,

    /// A file holding --redis-url (read at start; overrides it): one URL, or
    /// several, comma-separated or one a line.
    #[arg(long, env = "REDRIVE_REDIS_URL_FILE", value_name = "FILE")]
    pub redis_url_file: Option<PathBuf>,

    /// --redis-url names seed nodes of a Redis Cluster (the client learns
    /// the other nodes and follows the slot map).
    #[arg(long, env = "REDRIVE_REDIS_CLUSTER")]
    pub redis_cluster: bool,

    /// --redis-url names Redis Sentinels; the bucket and replay keys live on
    /// the master they monitor under this name, found again after a
    /// failover.
    #[arg(long, env = "REDRIVE_REDIS_SENTINEL_MASTER", value_name = "NAME")]
    pub redis_sentinel_master: Option<String>,

    /// With --redis-sentinel-master: the master's password when it is not
    /// the Sentinels' (the --redis-url credentials are the Sentinels').
    #[arg(
        long,
        env = "REDRIVE_REDIS_MASTER_PASSWORD",
        hide_env_values = true,
        value_name = "PASSWORD"
    )]
    pub redis_master_password: Option<String>,

    /// A file holding --redis-master-password (read at start; overrides it).
    #[arg(long, env = "REDRIVE_REDIS_MASTER_PASSWORD_FILE", value_name = "FILE")]
    pub redis_master_password_file: Option<PathBuf>,

    /// Prefix of this deployment's Redis keys (bucket and replay keys).
    #[arg(long, env = "REDRIVE_REDIS_PREFIX", default_value = "redrive:")]
    pub redis_prefix: String,

    /// The name of the broker and virtual host this executor publishes to:
    /// its replay keys and token buckets in Redis are qualified by it, so
    /// executors of two brokers or vhosts that share a Redis (and a prefix)
    /// never skip each other's replays or share a rate. Default: the AMQP
    /// URL's `host:port/vhost` (`127.0.0.1:5672/%2f`, never the
    /// credentials). Every executor of one broker must use the same name:
    /// set it when they reach a cluster through different node addresses or
    /// host names (e.g. `--broker-id orders-cluster/%2f`). Required when
    /// `--amqp-url` lists several node URLs.
    #[arg(long, env = "REDRIVE_BROKER_ID")]
    pub broker_id: Option<String>,

    /// This executor's id in leases and audit events (default: a random one).
    #[arg(long, env = "REDRIVE_EXECUTOR_ID")]
    pub executor_id: Option<String>,

    /// Publishes in flight at once (the confirm window).
    #[arg(long, env = "REDRIVE_WINDOW", default_value_t = 256)]
    pub window: usize,

    /// Attempts per message: a nacked or unconfirmed one (its channel closed,
    /// e.g. by a destination exchange that does not exist) is then reported
    /// `failed`, a returned one `unroutable`. Retries back off from 0.2 s,
    /// doubling to 6.4 s.
    #[arg(long, env = "REDRIVE_MAX_ATTEMPTS", default_value_t = 5)]
    pub max_attempts: u32,

    /// Slices replayed at once by this executor (each with its own channel).
    #[arg(long, env = "REDRIVE_CONCURRENT_SLICES", default_value_t = 4)]
    pub concurrent_slices: usize,

    /// Days a sent message key stays in Redis's replay keys, 1 to 36500.
    #[arg(long, env = "REDRIVE_REPLAY_KEY_TTL_DAYS", default_value_t = 7)]
    pub replay_key_ttl_days: u64,

    /// Seconds a slice claim waits for work (long poll).
    #[arg(long, env = "REDRIVE_CLAIM_WAIT_SECONDS", default_value_t = 20)]
    pub claim_wait_seconds: u64,

    /// Seconds the oldest publish may wait for its publisher confirm, from
    /// when its frames were written (before that, from when it is first in
    /// line to be written; not while the broker blocks the connection),
    /// before the broker
    /// connection is taken for dead (a half-open connection): its written
    /// publishes become uncertain and are published again on a new one.
    #[arg(long, env = "REDRIVE_CONFIRM_TIMEOUT_SECONDS", default_value_t = 5)]
    pub confirm_timeout_seconds: u64,

    /// AMQP heartbeat in seconds asked of the broker unless the AMQP URL names
    /// one (`?heartbeat=N`); a connection silent for two heartbeats is closed.
    #[arg(long, env = "REDRIVE_AMQP_HEARTBEAT_SECONDS", default_value_t = 5)]
    pub amqp_heartbeat_seconds: u64,

    /// Seconds after SIGTERM or SIGINT for outstanding confirms to finish and
    /// outcomes to be reported; then the executor exits anyway (leases it
    /// still holds expire, and their unreported items become uncertain).
    #[arg(long, env = "REDRIVE_SHUTDOWN_GRACE_SECONDS", default_value_t = 10)]
    pub shutdown_grace_seconds: u64,

    /// Serve `grpc.health.v1.Health` here, plaintext: `""`/`readiness`
    /// (broker, Redis and planner reachable) and `liveness` (no slice loop
    /// wedged). Off when not set.
    #[arg(long, env = "REDRIVE_HEALTH_LISTEN", value_name = "ADDR")]
    pub health_listen: Option<SocketAddr>,

    /// Seconds a slice loop may go without a heartbeat before `liveness`
    /// reports `NOT_SERVING` (at least 10 more than --claim-wait-seconds
    /// and twice --confirm-timeout-seconds, the longest waits without a
    /// beat: a confirm timeout, then the wait for writes still queued).
    #[arg(long, env = "REDRIVE_LIVENESS_TIMEOUT_SECONDS", default_value_t = 90)]
    pub liveness_timeout_seconds: u64,

    /// Logging and telemetry: `--log-json`, `--metrics-listen`,
    /// `--otlp-endpoint`.
    #[command(flatten)]
    pub telemetry: TelemetrySettings,
}

impl Config {
    /// The broker identity that qualifies this executor's Redis keys:
    /// `--broker-id`, else the AMQP URL's `host:port/vhost`
    /// ([`redrive_proto::settings::broker_id_of`]); the URL itself when it
    /// does not parse (refused by [`ServiceSettings::validate`] anyway).
    pub fn broker_id(&self) -> String {
        self.amqp.broker_id(self.broker_id.as_deref())
    }

    /// Where the bucket and the replay keys live: `--redis-url` read with
    /// `--redis-cluster` and `--redis-sentinel-master`
    /// ([`RedisTopology::from_settings`]); `None` without `--redis-url`
    /// (single-executor mode).
    ///
    /// # Errors
    /// The sentence of [`RedisTopology::from_settings`].
    pub fn redis_topology(&self) -> Option<Result<RedisTopology, String>> {
        let urls = self.redis_url.as_deref()?;
        Some(
            RedisTopology::from_settings(
                urls,
                self.redis_cluster,
                self.redis_sentinel_master.as_deref(),
            )
            .and_then(|topology| topology.with_master_password(self.redis_master_password.clone())),
        )
    }

    /// The defaults pointed at `planner` (tests build configs this way).
    /// Reads no `REDRIVE_*` variable: what the environment of a test run
    /// happens to hold never changes a test's executor.
    pub fn for_planner(planner: impl Into<String>) -> Self {
        let mut config: Self = redrive_proto::settings::defaults_without_env("redrive-executor");
        config.planner = planner.into();
        config
    }

    /// The numeric settings outside their ranges.
    fn range_problems(&self) -> Vec<SettingError> {
        let mut problems = Vec::new();
        for (setting, value, range) in [
            (
                "window",
                u64::try_from(self.window).unwrap_or(u64::MAX),
                1..=u64::MAX,
            ),
            (
                "concurrent-slices",
                u64::try_from(self.concurrent_slices).unwrap_or(u64::MAX),
                1..=64,
            ),
            ("max-attempts", u64::from(self.max_attempts), 1..=u64::MAX),
            (
                "replay-key-ttl-days",
                self.replay_key_ttl_days,
                // A hundred years: more overflowed the seconds (a panic at
                // start) or Redis's expiry ("value is not an integer or
                // out of range" at every write).
                1..=36_500,
            ),
            ("claim-wait-seconds", self.claim_wait_seconds, 1..=30),
            (
                "liveness-timeout-seconds",
                self.liveness_timeout_seconds,
                self.claim_wait_seconds
                    .max(self.confirm_timeout_seconds.saturating_mul(2))
                    .saturating_add(10)..=86_400,
            ),
            (
                "confirm-timeout-seconds",
                self.confirm_timeout_seconds,
                1..=300,
            ),
            (
                "amqp-heartbeat-seconds",
                self.amqp_heartbeat_seconds,
                1..=600,
            ),
            (
                "shutdown-grace-seconds",
                self.shutdown_grace_seconds,
                0..=600,
            ),
        ] {
            if !range.contains(&value) {
                problems.push(SettingError::new(
                    setting,
                    if *range.end() == u64::MAX {
                        format!("must be at least {}", range.start())
                    } else {
                        format!("{} to {}", range.start(), range.end())
                    },
                ));
            }
        }
        problems
    }

    /// The planner's URL to dial: `--planner` as given when it is an
    /// `http://` or `https://` URL, `http://HOST:PORT` for `HOST:PORT` alone,
    /// as `redrivectl` reads the same `REDRIVE_PLANNER`
    /// ([`redrive_proto::tls::planner_url`]).
    ///
    /// # Errors
    /// What is wrong with the address.
    pub fn planner_url(&self) -> Result<String, String> {
        redrive_proto::tls::planner_url(&self.planner)
    }

    /// The TLS files for the planner connection.
    pub fn planner_tls(&self) -> ClientTlsFiles {
        ClientTlsFiles {
            ca: self.ca.clone(),
            client_cert: self.tls_client_cert.clone(),
            client_key: self.tls_client_key.clone(),
        }
    }
}

impl ServiceSettings for Config {
    /// Reads `--amqp-url-file` and `--redis-url-file` into
    /// `amqp.url` and `redis_url`.
    fn read_secret_files(&mut self, problems: &mut Vec<SettingError>) {
        self.amqp.read_secret_file(problems);
        let file = self.redis_url_file.as_deref();
        read_secret_into("redis-url-file", file, &mut self.redis_url, problems);
        let file = self.redis_master_password_file.as_deref();
        read_secret_into(
            "redis-master-password-file",
            file,
            &mut self.redis_master_password,
            problems,
        );
    }

    /// Checks what clap cannot, every setting.
    ///
    /// # Errors
    /// [`SettingErrors`] naming every wrong setting.
    fn validate(&self) -> Result<(), SettingErrors> {
        let mut problems = Vec::new();
        let mut problem = |setting, text: String| problems.push(SettingError::new(setting, text));
        match self.planner_url() {
            Err(error) => problem("planner", format!("{:?}: {error}", self.planner)),
            Ok(url) => match tonic::transport::Endpoint::from_shared(url.clone()) {
                Err(error) => problem("planner", error.to_string()),
                Ok(endpoint) => {
                    // Read and parsed now: a bad file is a bad setting, not
                    // a failed start, filed under its own flag.
                    if let Err(error) = self.planner_tls().apply_named(
                        &url,
                        endpoint,
                        &redrive_proto::tls::TlsFlags::PLANNER,
                    ) {
                        problem(error.setting, error.problem);
                    }
                }
            },
        }
        if let Err(errors) = self.amqp.check(self.broker_id.as_deref()) {
            for error in errors {
                problem(error.setting, error.problem);
            }
        }
        match self.redis_topology() {
            Some(Err(text)) => problem("redis-url", text),
            None if self.redis_cluster => problem(
                "redis-cluster",
                "needs --redis-url with the cluster's seed nodes".to_owned(),
            ),
            None if self.redis_sentinel_master.is_some() => problem(
                "redis-sentinel-master",
                "needs --redis-url with the Sentinels' URLs".to_owned(),
            ),
            None if self.redis_master_password.is_some() => problem(
                "redis-master-password",
                "needs --redis-sentinel-master and --redis-url with the Sentinels' URLs".to_owned(),
            ),
            _ => {}
        }
        if let Some(id) = &self.broker_id
            && (id.trim().is_empty() || id.len() > 255 || id.chars().any(char::is_control))
        {
            problem(
                "broker-id",
                format!("{id:?}: 1 to 255 bytes of printable text"),
            );
        }
        if let Some(id) = &self.executor_id
            && (id.trim().is_empty() || id.len() > 255 || id.chars().any(char::is_control))
        {
            problem(
                "executor-id",
                format!("{id:?}: 1 to 255 bytes of printable text"),
            );
        }
        problems.extend(self.range_problems());
        // The telemetry flags come last.
        problems.extend(self.telemetry.check().err());
        SettingErrors::check(problems)
    }

    fn telemetry(&self) -> &TelemetrySettings {
        &self.telemetry
    }
}
