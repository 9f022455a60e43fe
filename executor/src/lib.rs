//! The Redrive executor: claims slices of approved plans from the planner's
//! `Coordinator` service under leases and publishes them with publisher
//! confirms under a shared token bucket (docs/design.md, "Executor loop and
//! guarantees"). It holds no durable state: the planner owns slices, leases and
//! item states; Redis holds the shared bucket and the replay keys.
//!
//! # Layout
//! - `lib.rs`: [`run`], start-up and shutdown in named steps; `config.rs`:
//!   [`Config`], flags and validation;
//!   `main.rs`: the binary (settings, logging, signals, then [`run`]).
//! - [`worker`]: the claim loop and the per-run publishing pipeline.
//! - [`loop_failures`]: a failure every slice loop meets (a claim, a broker
//!   connection) said once a round for all of them.
//! - [`lease`]: one slice lease: renewal, the planner's stop signal, the
//!   executor's own deadline, outcome reports, the end of the lease.
//! - [`outcomes`]: publisher confirms → audit events, retries, token debt.
//! - [`publisher`]: publishing with publisher confirms and a confirm window.
//! - [`bucket`]: the GCRA token bucket in Redis (or in-process without Redis).
//! - [`replay_keys`]: the record of sent message keys in Redis.
//! - [`redis_topology`]: one Redis server, a Redis Cluster or Sentinel.
//! - [`message`]: the replayed message's properties and headers.
//! - [`metrics`]: the metric instruments (OpenTelemetry, Prometheus `/metrics`).
//! - [`health`]: `grpc.health.v1` readiness and liveness on `--health-listen`.
//! - `benches/publish.rs`: publish-with-confirm throughput, a naive loop
//!   against the [`publisher::Publisher`] with a confirm window.

pub mod bucket;
mod config;
#[cfg(test)]
mod fakes;
pub mod health;
pub mod item;
pub mod lease;
pub mod loop_failures;
pub mod message;
pub mod metrics;
pub mod outcomes;
pub mod publisher;
pub mod redis_topology;
pub mod replay_keys;
pub mod worker;

pub use config::Config;

use std::{
    sync::{Arc, OnceLock},
    time::Duration,
};

use anyhow::Context;
use redrive_proto::{
    settings::ServiceSettings,
    telemetry::{Metrics, MetricsSettings},
    v1::coordinator_client::CoordinatorClient,
};
use tokio::{task::JoinSet, time::Instant};
use tokio_util::{sync::CancellationToken, task::AbortOnDropHandle};
use tracing::{info, warn};

use crate::{
    bucket::{Bucket, DEFAULT_CALL_TIMEOUT, LocalBucket, RedisBucket},
    health::{HealthChecks, Heartbeat},
    metrics::ExecutorMetrics,
    publisher::PublisherOptions,
    replay_keys::ReplayKeys,
    worker::{Worker, WorkerSettings},
};

/// Runs the executor until `shutdown`: connects to Redis (waiting while it is
/// unreachable: without the bucket nothing is published), then claims and
/// replays slices. Every task it starts (the slice loops, the health
/// server) ends before it returns: after `shutdown`, within
/// `--shutdown-grace-seconds`, or aborted then.
///
/// # Errors
/// An invalid configuration or planner URL.
pub async fn run(config: Config, shutdown: CancellationToken) -> anyhow::Result<()> {
    config.validate()?;
    let executor_id = config
        .executor_id
        .clone()
        .unwrap_or_else(|| format!("executor-{}", uuid::Uuid::new_v4()));
    let planner_channel = planner_channel(&config)?;
    let coordinator = CoordinatorClient::new(planner_channel.clone())
        .max_decoding_message_size(256 * 1024 * 1024)
        .max_encoding_message_size(64 * 1024 * 1024);
    let metrics_pipeline = Metrics::start(
        "redrive-executor",
        &MetricsSettings::from(&config.telemetry),
        shutdown.clone(),
    )
    .await
    .map_err(|error| anyhow::anyhow!("invalid setting {}: {error}", error.setting()))?;
    let metrics = ExecutorMetrics::new(&metrics_pipeline.meter("redrive-executor"));
    let publisher_options = PublisherOptions {
        window: config.window,
        confirm_timeout: Duration::from_secs(config.confirm_timeout_seconds),
        heartbeat: Duration::from_secs(config.amqp_heartbeat_seconds),
    };
    // Health is served from here on, also while Redis is waited for (not
    // ready then, but live); a bad address ends the start before any claim.
    let health = HealthTask::start(&config, publisher_options, planner_channel, &shutdown).await?;
    let grace = Duration::from_secs(config.shutdown_grace_seconds);
    let Some((bucket, replay_keys)) = shared_state(&config, &health, &shutdown).await? else {
        // Shut down while Redis was waited for.
        info!("executor stopped (Redis was still waited for)");
        health.drain_until(Instant::now() + grace).await;
        metrics_pipeline.shutdown().await;
        return Ok(());
    };
    info!(executor.id = %executor_id, planner = %config.planner, window = config.window, "executor claiming");
    let settings = WorkerSettings {
        executor_id,
        amqp: config.amqp.nodes(),
        publisher: publisher_options,
        max_attempts: config.max_attempts,
        claim_wait: Duration::from_secs(config.claim_wait_seconds),
        planner: config
            .planner_url()
            .unwrap_or_else(|_| config.planner.clone()),
        redis: config
            .redis_topology()
            .and_then(Result::ok)
            .map_or_else(|| "in-process".to_owned(), |topology| topology.addresses()),
        failures: worker::LoopFailures::default(),
        ca_given: config.ca.is_some(),
    };
    let parts = LoopParts {
        settings,
        coordinator,
        bucket: Arc::new(bucket),
        replay_keys,
        metrics,
    };
    let (loops, heartbeats) = start_loops(parts, config.concurrent_slices, &shutdown);
    health.watch_loops(heartbeats);
    let grace_over = drain_loops(loops, &shutdown, grace).await;
    info!("executor stopped");
    health.drain_until(grace_over).await;
    metrics_pipeline.shutdown().await;
    Ok(())
}

/// The lazily connected channel to the planner, with `--planner`'s TLS.
///
/// # Errors
/// An invalid `--planner` URL or TLS file.
fn planner_channel(config: &Config) -> anyhow::Result<tonic::transport::Channel> {
    let url = config
        .planner_url()
        .map_err(|text| anyhow::anyhow!("invalid setting --planner: {text}"))?;
    let endpoint = tonic::transport::Endpoint::from_shared(url.clone())
        .with_context(|| format!("invalid setting --planner: {url}"))?;
    Ok(config
        .planner_tls()
        .apply(&url, endpoint)
        .map_err(|text| anyhow::anyhow!("invalid setting --planner: {text}"))?
        .tcp_nodelay(true)
        // A half-open link to the planner is noticed (HTTP/2 PING), so
        // claims, renewals and reports fail instead of hanging.
        .http2_keep_alive_interval(Duration::from_secs(10))
        .keep_alive_timeout(Duration::from_secs(5))
        .keep_alive_while_idle(true)
        .connect_lazy())
}

/// The health server of `--health-listen` (none when not set), owned by
/// [`run`] and drained at shutdown, and what its checks learn later: Redis
/// once connected, the slice loops' heartbeats once started.
struct HealthTask {
    serving: Option<AbortOnDropHandle<Result<(), tonic::transport::Error>>>,
    redis: Option<Arc<OnceLock<redis_topology::RedisConnection>>>,
    heartbeats: Arc<OnceLock<Vec<Heartbeat>>>,
}

impl HealthTask {
    /// Binds `--health-listen` and serves health until `shutdown`.
    ///
    /// # Errors
    /// The address cannot be bound.
    async fn start(
        config: &Config,
        publisher: PublisherOptions,
        planner: tonic::transport::Channel,
        shutdown: &CancellationToken,
    ) -> anyhow::Result<Self> {
        let mut task = Self {
            serving: None,
            redis: config.redis_url.as_ref().map(|_| Arc::new(OnceLock::new())),
            heartbeats: Arc::new(OnceLock::new()),
        };
        let Some(address) = config.health_listen else {
            return Ok(task);
        };
        let listener = tokio::net::TcpListener::bind(address)
            .await
            .with_context(|| format!("invalid setting --health-listen: cannot bind {address}"))?;
        let checks = HealthChecks {
            amqp: config.amqp.nodes(),
            publisher,
            redis: task.redis.clone(),
            planner,
            heartbeats: Arc::clone(&task.heartbeats),
            liveness_timeout: Duration::from_secs(config.liveness_timeout_seconds),
        };
        task.serving = Some(AbortOnDropHandle::new(tokio::spawn(health::serve(
            listener,
            checks,
            shutdown.clone(),
        ))));
        Ok(task)
    }

    /// Readiness checks Redis from now on.
    fn redis_connected(&self, connection: &redis_topology::RedisConnection) {
        if let Some(ready) = &self.redis {
            let _ = ready.set(connection.clone());
        }
    }

    /// Liveness watches these slice loops from now on.
    fn watch_loops(&self, heartbeats: Vec<Heartbeat>) {
        let _ = self.heartbeats.set(heartbeats);
    }

    /// Waits for the server to end (it ends at shutdown, once its open
    /// calls have), until `deadline`; then aborts it.
    async fn drain_until(self, deadline: Instant) {
        let Some(mut serving) = self.serving else {
            return;
        };
        match tokio::time::timeout_at(deadline, &mut serving).await {
            Ok(Ok(Err(error))) => warn!(%error, "the health server failed"),
            Ok(_) => {}
            Err(_) => {
                tracing::debug!("the health server outlived the grace period: aborted");
                serving.abort();
            }
        }
    }
}

/// The token bucket and the replay keys: in Redis with `--redis-url` (waits
/// until it is reachable), in-process without. `None` when `shutdown` came
/// first.
///
/// # Errors
/// Invalid Redis settings (normally refused at start-up) or replay key TTL.
async fn shared_state(
    config: &Config,
    health: &HealthTask,
    shutdown: &CancellationToken,
) -> anyhow::Result<Option<(Bucket, Option<ReplayKeys>)>> {
    let Some(topology) = config.redis_topology() else {
        info!(
            "single-executor mode: no --redis-url, so an in-process limiter and the planner's record of sent keys; run only one executor like this"
        );
        return Ok(Some((Bucket::Local(LocalBucket::new()), None)));
    };
    let topology =
        topology.map_err(|text| anyhow::anyhow!("invalid setting --redis-url: {text}"))?;
    let mut backoff =
        redrive_proto::backoff::Backoff::new(Duration::from_millis(200), Duration::from_secs(5));
    let connection = loop {
        let attempt = tokio::select! {
            () = shutdown.cancelled() => return Ok(None),
            attempt = redis_topology::connect(&topology, DEFAULT_CALL_TIMEOUT) => attempt,
        };
        match attempt {
            Ok(connection) => break connection,
            Err(error) => {
                // A refused password will not mend by itself.
                let advice = if redis_topology::credentials_refused(&error) {
                    ": Redis refused the credentials: check the user and password of --redis-url"
                } else {
                    ""
                };
                warn!(redis = %topology.addresses(), %error, "Redis unreachable: not publishing until it is back{advice}");
                tokio::select! {
                    () = shutdown.cancelled() => return Ok(None),
                    () = tokio::time::sleep(backoff.next_delay()) => {}
                }
            }
        }
    };
    // Both qualified by the broker (docs/replay.md, "Identity").
    let broker_id = config.broker_id();
    info!(broker.id = %broker_id, "replay keys and buckets are this broker's");
    let bucket = RedisBucket::new(
        connection.clone(),
        bucket::key_prefix_for(&config.redis_prefix, &broker_id),
        DEFAULT_CALL_TIMEOUT,
    );
    let ttl = Duration::from_secs(config.replay_key_ttl_days.saturating_mul(24 * 3600));
    let replay_keys = ReplayKeys::new(connection.clone(), config.redis_prefix.clone(), ttl)
        .map_err(anyhow::Error::msg)?
        .on_broker(broker_id);
    health.redis_connected(&connection);
    Ok(Some((Bucket::Redis(bucket), Some(replay_keys))))
}

/// What every slice loop of the executor shares.
struct LoopParts {
    settings: WorkerSettings,
    coordinator: CoordinatorClient<tonic::transport::Channel>,
    bucket: Arc<Bucket>,
    replay_keys: Option<ReplayKeys>,
    metrics: ExecutorMetrics,
}

/// Starts `count` slice loops, each with its own broker channel, so that
/// one slice's tail (last confirms, report, completion, next claim)
/// overlaps another's publishing. They share the bucket, the replay keys
/// and the token debt. The loops, and their heartbeats (loop `i`'s id is
/// the executor id with `/i`).
fn start_loops(
    parts: LoopParts,
    count: usize,
    shutdown: &CancellationToken,
) -> (JoinSet<()>, Vec<Heartbeat>) {
    let debt = outcomes::TokenDebt::default();
    let mut loops = JoinSet::new();
    let started = Instant::now();
    let mut heartbeats = Vec::with_capacity(count);
    for index in 0..count {
        let mut settings = parts.settings.clone();
        settings.executor_id = format!("{}/{index}", settings.executor_id);
        let heartbeat = Heartbeat::new(started);
        heartbeats.push(heartbeat.clone());
        let worker = Worker::new(
            settings,
            parts.coordinator.clone(),
            Arc::clone(&parts.bucket),
            parts.replay_keys.clone(),
            debt.clone(),
            parts.metrics.clone(),
            heartbeat,
        );
        loops.spawn(worker.run(shutdown.clone()));
    }
    (loops, heartbeats)
}

/// Waits for the slice loops: until `shutdown`, then for at most `grace`
/// while each stops publishing at once, drains its confirms and reports;
/// loops still running then are aborted. Returns when the grace period
/// ends (now when the loops all ended before `shutdown`).
async fn drain_loops(
    mut loops: JoinSet<()>,
    shutdown: &CancellationToken,
    grace: Duration,
) -> Instant {
    async fn all_ended(loops: &mut JoinSet<()>) {
        // `join_next` is cancel-safe: nothing is lost when this is dropped.
        while loops.join_next().await.is_some() {}
    }
    tokio::select! {
        () = shutdown.cancelled() => {}
        () = all_ended(&mut loops) => {}
    }
    if !shutdown.is_cancelled() {
        // Every loop ended by itself: nothing to wait for.
        return Instant::now();
    }
    let grace_over = Instant::now() + grace;
    if tokio::time::timeout_at(grace_over, all_ended(&mut loops))
        .await
        .is_err()
    {
        warn!(
            grace_seconds = grace.as_secs(),
            "shutdown grace period over: exiting with work unreported (its leases expire and the planner marks it uncertain)"
        );
        loops.abort_all();
        all_ended(&mut loops).await;
    }
    grace_over
}

/// The `redrive-executor` binary: parses the settings from `args` (as
/// [`std::env::args_os`] gives them, the program's name first), starts
/// logging, wires SIGINT and SIGTERM to a cancellation token
/// ([`start_service`](redrive_proto::telemetry::start_service)) and runs
/// [`run`] on a multi-threaded Tokio runtime. Messages read
/// `redrive-executor: ...` whatever the program's name.
///
/// Exit codes: success, `EX_USAGE` (64) for a setting refused at parsing,
/// otherwise [`run_failure_code`](redrive_proto::settings::run_failure_code).
///
/// # Panics
/// When the Tokio runtime cannot be built (as `#[tokio::main]`).
pub fn main_with_args(
    args: impl IntoIterator<Item = std::ffi::OsString>,
) -> std::process::ExitCode {
    use redrive_proto::{settings::run_failure_code, telemetry::start_service};
    use std::process::ExitCode;

    let args: Vec<std::ffi::OsString> = args.into_iter().collect();
    let main = async {
        let (config, logging, shutdown) = match start_service::<Config>("redrive-executor", args) {
            Ok(started) => started,
            Err(code) => return code,
        };
        let code = match run(config, shutdown).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                eprintln!(
                    "redrive-executor: {}",
                    redrive_proto::settings::error_text(error.as_ref())
                );
                run_failure_code(&error)
            }
        };
        logging.finish().await;
        code
    };
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("Failed building the Runtime")
        .block_on(main)
}
