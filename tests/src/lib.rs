//! Support for Redrive's end-to-end tests and benchmarks: the planner in-process
//! on `127.0.0.1:0`, a fresh PostgreSQL database per test, uniquely named
//! RabbitMQ queues, and a TCP proxy a test can cut to simulate an outage
//! without touching the shared servers.
//!
//! # Layout
//! `lib.rs` holds the items below down to [`raw`], except those re-exported
//! from `redrive-test-support` (`test-support/`, shared with the executor's
//! own tests, which cannot depend on this crate); the rest are files of their
//! own.
//! - [`TestDb`]: a database of its own, dropped by [`TestDb::drop_database`]
//!   or when the guard drops (a failed test).
//! - [`Broker`] (re-exported): a RabbitMQ connection and helpers to declare,
//!   publish, count, drain and delete what a test uses (also on drop).
//! - [`unique`] (re-exported): names no other test run uses; [`AMQP_URL`]
//!   and [`REDIS_URL`] (re-exported) with [`POSTGRES_URL`]: the local
//!   services.
//! - [`RedisKeys`]: a Redis key prefix of its own, deleted on drop.
//! - [`TestBed`]: a database, a broker (or none), a Redis prefix, a planner
//!   and its client for one test, cleaned up on drop or by
//!   [`TestBed::finish`]; the planner can be stopped and restarted with
//!   other settings over the same database.
//! - [`TcpProxy`] (re-exported): forwards to a server until cut or stalled.
//! - [`ExecutorProcess`]: the `redrive-executor` binary as a child process.
//! - [`PlannerHandle`]: a running planner and its gRPC client.
//! - [`pki`]: a CA, certificates, tokens and JWTs made for one test;
//!   [`TestBed::start_secure`] runs the planner with TLS and authentication.
//! - [`raw`]: gRPC calls with bytes the generated clients would not send
//!   (undecodable and oversized requests).
//! - [`bench`]: what the benchmarks share (generated dead letters, the
//!   broker's raw limit, CPU and writes per message).
//! - [`orders_hook`]: the example `StateCheck` hook over an `orders` table.
//! - [`otlp`]: an OTLP trace receiver (the collector's gRPC service) for
//!   the traces tests.
//! - [`scenario`]: the order-fulfilment incident and its replay with the real
//!   binaries, run by `redrive-demo` and `tests/e2e.rs`.
//! - `bin/demo.rs`: `redrive-demo`, the scenario on the local services;
//!   `bin/orders_hook.rs`: the [`orders_hook`] as a service of its own;
//!   `bin/planner.rs`, `bin/executor.rs`, `bin/redrivectl.rs`: the real
//!   binaries' entry functions as binaries of this package, which cargo
//!   builds before its tests and benchmarks ([`scenario::Binaries`]).

pub mod bench;
pub mod browser;
pub mod orders_hook;
pub mod otlp;
pub mod pki;
pub mod scenario;

use std::{net::SocketAddr, sync::Arc, time::Duration};

use anyhow::Context;
use lapin::{BasicProperties, types::FieldTable};
use redrive_planner::Config;
use redrive_proto::{tls::ClientTlsFiles, v1::planner_client::PlannerClient};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel as GrpcChannel;

use redrive_test_support::block_on_aside;
pub use redrive_test_support::{
    AMQP_URL, Broker, POSTGRES_URL, REDIS_URL, RedisCluster, RedisProcess, RedisSentinelGroup,
    TcpProxy, TestDb, unique,
};

/// Logs to the test output when `REDRIVE_LOG` is set.
pub fn init_logging() {
    if let Ok(filter) = std::env::var("REDRIVE_LOG") {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_test_writer()
            .try_init();
    }
}

/// A `redrive-executor` child process, killed (SIGKILL) when dropped.
pub struct ExecutorProcess {
    child: tokio::process::Child,
}

impl ExecutorProcess {
    /// Starts `redrive-executor` (this package's binary of it, which cargo
    /// builds before the tests and benchmarks:
    /// [`scenario::Binaries::of_tests`]) with `args`; its log goes to this
    /// test's stderr.
    ///
    /// # Errors
    /// When the binary is missing or cannot be started.
    pub async fn start(args: &[String]) -> anyhow::Result<Self> {
        Self::start_logging(args, "info").await
    }

    /// [`ExecutorProcess::start`] logging warnings and errors only
    /// (benchmarks).
    ///
    /// # Errors
    /// When the binary is missing or cannot be started.
    pub async fn start_quiet(args: &[String]) -> anyhow::Result<Self> {
        Self::start_logging(args, "warn").await
    }

    async fn start_logging(args: &[String], level: &str) -> anyhow::Result<Self> {
        let binaries = scenario::Binaries::of_tests()?;
        let child = tokio::process::Command::new(&binaries.executor)
            .args(args)
            .env("REDRIVE_LOG", level)
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .context("starting redrive-executor")?;
        Ok(Self { child })
    }

    /// The process id, `None` once it has been waited for.
    pub fn id(&self) -> Option<u32> {
        self.child.id()
    }

    /// Sends `signal` (`TERM`, `STOP`, `CONT`, `KILL`) with kill(1).
    ///
    /// # Errors
    /// When the process is gone or kill(1) fails.
    pub async fn signal(&self, signal: &str) -> anyhow::Result<()> {
        let pid = self.child.id().context("the executor has exited")?;
        let status = tokio::process::Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(pid.to_string())
            .status()
            .await?;
        anyhow::ensure!(status.success(), "kill -{signal} {pid} failed");
        Ok(())
    }

    /// Waits up to `timeout` for the process to exit; its exit status.
    ///
    /// # Errors
    /// When it is still running after `timeout`.
    pub async fn wait_exit(
        &mut self,
        timeout: Duration,
    ) -> anyhow::Result<std::process::ExitStatus> {
        tokio::time::timeout(timeout, self.child.wait())
            .await
            .with_context(|| format!("the executor did not exit within {timeout:?}"))?
            .map_err(Into::into)
    }
}

/// A planner running in-process; dropped, it is told to shut down (and not
/// waited for).
pub struct PlannerHandle {
    /// Where it listens.
    pub addr: SocketAddr,
    /// Cancels it.
    pub shutdown: CancellationToken,
    /// `None` once [`PlannerHandle::halt`] waited for it.
    task: Option<JoinHandle<anyhow::Result<()>>>,
    /// What [`PlannerHandle::client`] presents (a CA and a client
    /// certificate when the planner serves TLS); empty for plain HTTP.
    pub tls: ClientTlsFiles,
}

impl PlannerHandle {
    /// Starts a planner with `config` on `127.0.0.1:0` and waits until it answers.
    ///
    /// # Errors
    /// When it does not answer within 30 s.
    pub async fn start(config: Config) -> anyhow::Result<Self> {
        Self::start_with(config, ClientTlsFiles::default()).await
    }

    /// [`PlannerHandle::start`] for a planner serving TLS: `tls` (the CA,
    /// and a client certificate when the planner requires one) is what its
    /// clients present.
    ///
    /// # Errors
    /// When it does not answer within 30 s.
    pub async fn start_with(config: Config, tls: ClientTlsFiles) -> anyhow::Result<Self> {
        let listener = redrive_planner::bind(std::net::SocketAddr::from(([127, 0, 0, 1], 0)))?;
        let addr = listener.local_addr()?;
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(redrive_planner::run(config, listener, shutdown.clone()));
        let handle = Self {
            addr,
            shutdown,
            task: Some(task),
            tls,
        };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            if matches!(handle.serving().await, Ok(true)) {
                return Ok(handle);
            }
            anyhow::ensure!(
                !handle.task.as_ref().is_some_and(JoinHandle::is_finished),
                "planner exited during start-up"
            );
            anyhow::ensure!(
                tokio::time::Instant::now() < deadline,
                "planner did not answer within 30 s"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// `http://127.0.0.1:port`, or `https://` when it serves TLS.
    pub fn url(&self) -> String {
        let scheme = if self.tls.any() { "https" } else { "http" };
        format!("{scheme}://{}", self.addr)
    }

    /// A connection presenting [`PlannerHandle::tls`].
    ///
    /// # Errors
    /// When the planner is not reachable or a TLS file is bad.
    pub async fn channel(&self) -> anyhow::Result<GrpcChannel> {
        self.channel_as(&self.tls).await
    }

    /// A connection presenting `tls` instead (another client certificate,
    /// or none).
    ///
    /// # Errors
    /// When the planner is not reachable or a TLS file is bad.
    pub async fn channel_as(&self, tls: &ClientTlsFiles) -> anyhow::Result<GrpcChannel> {
        let url = self.url();
        let endpoint = tls
            .apply(&url, GrpcChannel::from_shared(url.clone())?)
            .map_err(anyhow::Error::msg)?;
        Ok(endpoint.connect().await?)
    }

    /// Whether the planner's health service calls `redrive.v1.Planner`
    /// serving.
    ///
    /// # Errors
    /// When the planner is not reachable or the health check fails.
    pub async fn serving(&self) -> anyhow::Result<bool> {
        let mut health = tonic_health::pb::health_client::HealthClient::new(self.channel().await?);
        let answer = health
            .check(tonic_health::pb::HealthCheckRequest {
                service: "redrive.v1.Planner".to_owned(),
            })
            .await?
            .into_inner();
        Ok(answer.status() == tonic_health::pb::health_check_response::ServingStatus::Serving)
    }

    /// A Planner client.
    ///
    /// # Errors
    /// When the planner is not reachable.
    pub async fn client(&self) -> anyhow::Result<PlannerClient<GrpcChannel>> {
        Ok(PlannerClient::new(self.channel().await?).max_decoding_message_size(64 * 1024 * 1024))
    }

    /// Shuts the planner down and waits for it.
    ///
    /// # Errors
    /// What `run` returned.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        self.halt().await
    }

    /// [`PlannerHandle::stop`] in place: the handle stays, answering `Ok`
    /// at once when halted again.
    ///
    /// # Errors
    /// What `run` returned.
    pub async fn halt(&mut self) -> anyhow::Result<()> {
        self.shutdown.cancel();
        match self.task.take() {
            Some(task) => task.await?,
            None => Ok(()),
        }
    }
}

impl Drop for PlannerHandle {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// Polls `probe` every 50 ms until it returns true or `timeout` passes.
///
/// # Errors
/// The probe's error, or a timeout naming `what`.
pub async fn wait_until<F, Fut>(what: &str, timeout: Duration, mut probe: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<bool>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if probe().await? {
            return Ok(());
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// An AMQP field table from `(name, value)` pairs.
pub fn amqp_table(entries: Vec<(&str, lapin::types::AMQPValue)>) -> FieldTable {
    let mut table = FieldTable::default();
    for (key, value) in entries {
        table.insert(lapin::types::ShortString::from(key), value);
    }
    table
}

/// An AMQP long-string value.
pub fn amqp_text(text: &str) -> lapin::types::AMQPValue {
    lapin::types::AMQPValue::LongString(lapin::types::LongString::from(text.as_bytes().to_vec()))
}

/// A dead-letter topology: exchange `orders` (direct) → queue `work` (with a
/// dead-letter exchange) and a fanout `dlx` → `dlq`. Names are unique.
pub struct DlqTopology {
    /// The producers' exchange.
    pub exchange: String,
    /// The work queue (bound with routing key `to.<work>`).
    pub work: String,
    /// The dead-letter exchange.
    pub dlx: String,
    /// The dead-letter queue.
    pub dlq: String,
}

impl DlqTopology {
    /// Declares it on `broker`.
    ///
    /// # Errors
    /// Broker errors.
    pub async fn declare(broker: &Broker) -> anyhow::Result<Self> {
        let topology = Self {
            exchange: unique("orders"),
            work: unique("work"),
            dlx: unique("dlx"),
            dlq: unique("dlq"),
        };
        broker
            .exchange(&topology.exchange, lapin::ExchangeKind::Direct)
            .await?;
        broker
            .exchange(&topology.dlx, lapin::ExchangeKind::Fanout)
            .await?;
        broker.queue(&topology.dlq, FieldTable::default()).await?;
        broker.bind(&topology.dlq, &topology.dlx, "").await?;
        broker
            .queue(
                &topology.work,
                amqp_table(vec![("x-dead-letter-exchange", amqp_text(&topology.dlx))]),
            )
            .await?;
        broker
            .bind(&topology.work, &topology.exchange, &topology.routing_key())
            .await?;
        Ok(topology)
    }

    /// The routing key to the work queue.
    pub fn routing_key(&self) -> String {
        format!("to.{}", self.work)
    }

    /// Publishes to the work queue, takes the message back and rejects it
    /// without requeue: the broker dead-letters it with reason `rejected`.
    ///
    /// # Errors
    /// Broker errors.
    pub async fn reject(
        &self,
        broker: &Broker,
        body: &[u8],
        properties: BasicProperties,
    ) -> anyhow::Result<()> {
        broker
            .publish(&self.exchange, &self.routing_key(), body, properties)
            .await?;
        let delivery = broker
            .channel
            .basic_get(
                self.work.as_str().into(),
                lapin::options::BasicGetOptions::default(),
            )
            .await?
            .context("the work queue holds the message just published")?;
        delivery
            .acker
            .reject(lapin::options::BasicRejectOptions { requeue: false })
            .await?;
        Ok(())
    }
}

/// An executor running in-process.
pub struct ExecutorHandle {
    /// Cancels it (SIGTERM semantics: finish in-flight confirms, report, release).
    pub shutdown: CancellationToken,
    task: JoinHandle<anyhow::Result<()>>,
}

impl ExecutorHandle {
    /// Starts an executor with `config`.
    pub fn start(config: redrive_executor::Config) -> Self {
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(redrive_executor::run(config, shutdown.clone()));
        Self { shutdown, task }
    }

    /// An executor config for `planner`, with Redis at `redis_url` under a
    /// unique key prefix (or single-executor mode with `None`).
    pub fn config(
        planner: &PlannerHandle,
        redis: Option<(&str, &str)>,
    ) -> redrive_executor::Config {
        let mut config = redrive_executor::Config::for_planner(planner.url());
        config.amqp.url = AMQP_URL.to_owned();
        config.claim_wait_seconds = 1;
        if let Some((url, prefix)) = redis {
            config.redis_url = Some(url.to_owned());
            config.redis_prefix = prefix.to_owned();
        }
        config
    }

    /// Graceful stop, as on SIGTERM.
    ///
    /// # Errors
    /// What `run` returned.
    pub async fn stop(self) -> anyhow::Result<()> {
        self.shutdown.cancel();
        self.task.await?
    }

    /// A crash: the task is dropped mid-work, nothing is released or reported.
    pub fn kill(self) {
        self.task.abort();
    }
}

/// Deletes every Redis key under `prefix`: `SCAN` in pages of 1,000 and
/// `UNLINK` of each page, so that a million replay keys (the scale
/// benchmark's) neither block the shared Redis nor outrun one reply's
/// timeout, as one `KEYS` and one `DEL` of them all did.
///
/// # Errors
/// Redis errors.
pub async fn redis_cleanup(prefix: &str) -> anyhow::Result<()> {
    let client = redis::Client::open(REDIS_URL)?;
    let mut connection = client.get_multiplexed_async_connection().await?;
    let pattern = format!("{prefix}*");
    let mut cursor: u64 = 0;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(&pattern)
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut connection)
            .await?;
        if !keys.is_empty() {
            let _: () = redis::cmd("UNLINK")
                .arg(keys)
                .query_async(&mut connection)
                .await?;
        }
        if next == 0 {
            return Ok(());
        }
        cursor = next;
    }
}

/// A Redis key prefix of the test's own (`redrive-test-<random>:`).
///
/// Dropped without [`RedisKeys::cleanup`] (a test that failed early), it
/// deletes the prefix's keys itself, so failing tests leave nothing behind.
#[derive(Debug)]
pub struct RedisKeys {
    /// The prefix, ending in `:`.
    pub prefix: String,
    cleaned: std::sync::atomic::AtomicBool,
}

impl RedisKeys {
    /// A new prefix; nothing is written yet.
    pub fn new() -> Self {
        Self {
            prefix: unique("redrive-test") + ":",
            cleaned: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Deletes every key under the prefix.
    ///
    /// # Errors
    /// Redis errors.
    pub async fn cleanup(&self) -> anyhow::Result<()> {
        redis_cleanup(&self.prefix).await?;
        self.cleaned
            .store(true, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    }
}

impl Default for RedisKeys {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for RedisKeys {
    fn drop(&mut self) {
        if !self.cleaned.load(std::sync::atomic::Ordering::SeqCst) {
            let prefix = self.prefix.clone();
            block_on_aside(move || async move {
                let _ = redis_cleanup(&prefix).await;
            });
        }
    }
}

/// What a scenario test stands on: a database, a broker connection (or
/// none, for a test that only talks to the planner), a Redis prefix and a
/// planner with a client, each of the test's own. Dropped — also when the
/// test fails — it stops nothing gracefully but leaves nothing behind: the
/// database is dropped, the queues and exchanges the broker declared or
/// tracks are deleted, the Redis keys are removed and the planner is told
/// to shut down (each part's own `Drop`). [`TestBed::finish`] does the same
/// in order after a test that passed, and reports a planner that did not
/// stop.
pub struct TestBed {
    /// The planner's client.
    pub client: PlannerClient<GrpcChannel>,
    /// The planner, in-process.
    pub planner: PlannerHandle,
    /// Key prefix for executors' buckets and replay keys.
    pub redis: RedisKeys,
    /// Declares and publishes; deletes what it declared.
    broker: Option<Broker>,
    /// The database (created by the planner).
    pub db: TestDb,
    /// The credentials of a secure bed ([`TestBed::start_secure`]).
    pub pki: Option<Arc<pki::Pki>>,
}

impl TestBed {
    /// [`TestBed::start`] with TLS and authentication on
    /// ([`pki::Pki::secure`], then `configure`): the bed's client presents
    /// the `test-admin` client certificate (role admin); others connect with
    /// [`PlannerHandle::channel_as`].
    ///
    /// # Errors
    /// When a service is unreachable or the planner does not start.
    pub async fn start_secure(
        broker: Option<Broker>,
        pki: pki::Pki,
        configure: impl FnOnce(&mut Config),
    ) -> anyhow::Result<Self> {
        Self::launch(TestDb::new(), broker, Some(Arc::new(pki)), configure).await
    }

    /// A planner configured by `configure` over a new database (capture,
    /// keys and lease TTL are the caller's), with a broker connection and a
    /// Redis prefix.
    ///
    /// # Errors
    /// When a service is unreachable or the planner does not start.
    pub async fn start(
        broker: Broker,
        configure: impl FnOnce(&mut Config),
    ) -> anyhow::Result<Self> {
        Self::start_on(TestDb::new(), Some(broker), configure).await
    }

    /// [`TestBed::start`] without a broker connection: for a test that
    /// declares nothing on RabbitMQ through the bed.
    ///
    /// # Errors
    /// When the planner does not start.
    pub async fn without_broker(configure: impl FnOnce(&mut Config)) -> anyhow::Result<Self> {
        Self::start_on(TestDb::new(), None, configure).await
    }

    /// [`TestBed::start`] over `db`, which the caller named first (to reach
    /// it through a [`TcpProxy`], say: `configure` may set the URL).
    ///
    /// # Errors
    /// When a service is unreachable or the planner does not start.
    pub async fn start_on(
        db: TestDb,
        broker: Option<Broker>,
        configure: impl FnOnce(&mut Config),
    ) -> anyhow::Result<Self> {
        Self::launch(db, broker, None, configure).await
    }

    /// The planner over `db` (with TLS and authentication by `pki` when
    /// given, the client then `test-admin`) and the bed around it.
    async fn launch(
        db: TestDb,
        broker: Option<Broker>,
        pki: Option<Arc<pki::Pki>>,
        configure: impl FnOnce(&mut Config),
    ) -> anyhow::Result<Self> {
        let config = Self::config(&db, pki.as_deref(), configure);
        let planner = match &pki {
            Some(pki) => PlannerHandle::start_with(config, pki.client("test-admin")?).await?,
            None => PlannerHandle::start(config).await?,
        };
        let client = planner.client().await?;
        Ok(Self {
            client,
            planner,
            redis: RedisKeys::new(),
            broker,
            db,
            pki,
        })
    }

    /// A planner config for `db` and the local RabbitMQ (secured by `pki`
    /// when given), then `configure`d.
    fn config(db: &TestDb, pki: Option<&pki::Pki>, configure: impl FnOnce(&mut Config)) -> Config {
        let mut config = Config::for_database(db.url());
        config.amqp.url = AMQP_URL.to_owned();
        // One name for the local broker however a test reaches it (a proxy
        // in front of it, a restart): tests of the refusal set their own.
        config.broker_id = Some("redrive-tests".to_owned());
        if let Some(pki) = pki {
            pki.secure(&mut config);
        }
        configure(&mut config);
        config
    }

    /// The broker connection.
    ///
    /// # Panics
    /// When the bed was started [`TestBed::without_broker`].
    pub fn broker(&self) -> &Broker {
        self.broker
            .as_ref()
            .expect("a bed started with a broker (TestBed::start)")
    }

    /// Stops the planner and starts a new one over the same database,
    /// configured by `configure` (from the defaults, as in
    /// [`TestBed::start`]), with a new client.
    ///
    /// # Errors
    /// When the old planner did not stop cleanly or the new one does not start.
    pub async fn restart_planner(
        &mut self,
        configure: impl FnOnce(&mut Config),
    ) -> anyhow::Result<()> {
        self.planner.halt().await?;
        let config = Self::config(&self.db, self.pki.as_deref(), configure);
        self.planner = PlannerHandle::start_with(config, self.planner.tls.clone()).await?;
        self.client = self.planner.client().await?;
        Ok(())
    }

    /// Another planner on the bed's database (a replica: the bed's planner
    /// keeps running), configured by `configure` as
    /// [`TestBed::restart_planner`] does; the caller halts it.
    ///
    /// # Errors
    /// When it does not start.
    pub async fn start_replica(
        &self,
        configure: impl FnOnce(&mut Config),
    ) -> anyhow::Result<PlannerHandle> {
        let config = Self::config(&self.db, self.pki.as_deref(), configure);
        PlannerHandle::start_with(config, self.planner.tls.clone()).await
    }

    /// A pool on the test's database, for assertions.
    ///
    /// # Errors
    /// When PostgreSQL is unreachable.
    pub async fn pool(&self) -> anyhow::Result<sqlx::PgPool> {
        self.db.pool().await
    }

    /// An in-process executor config for this planner and Redis prefix.
    pub fn executor_config(&self) -> redrive_executor::Config {
        ExecutorHandle::config(&self.planner, Some((REDIS_URL, &self.redis.prefix)))
    }

    /// [`TestBed::executor_config`] for a secure bed: the executor trusts
    /// the bed's CA and presents a client certificate named `name`
    /// (`executor-*` names get the executor role).
    ///
    /// # Errors
    /// When the bed is not secure, or writing the certificate failed.
    pub fn secure_executor_config(&self, name: &str) -> anyhow::Result<redrive_executor::Config> {
        let pki = self
            .pki
            .as_ref()
            .context("a bed started with TestBed::start_secure")?;
        let tls = pki.client(name)?;
        let mut config = self.executor_config();
        config.ca = tls.ca;
        config.tls_client_cert = tls.client_cert;
        config.tls_client_key = tls.client_key;
        config.executor_id = Some(name.to_owned());
        Ok(config)
    }

    /// Stops the planner (unless [`PlannerHandle::halt`]ed already), then
    /// cleans up the broker, Redis and the database.
    ///
    /// # Errors
    /// When the planner did not stop cleanly, or Redis failed.
    pub async fn finish(self) -> anyhow::Result<()> {
        let Self {
            client,
            mut planner,
            redis,
            broker,
            db,
            pki,
        } = self;
        drop(client);
        drop(pki);
        let stopped = planner.halt().await;
        if let Some(broker) = broker {
            broker.cleanup().await;
        }
        redis.cleanup().await?;
        db.drop_database().await;
        stopped
    }
}

/// The request for a precheck of everything stored from `dlq`, with the
/// default options.
pub fn precheck_request(dlq: &str) -> redrive_proto::v1::RunPrecheckRequest {
    redrive_proto::v1::RunPrecheckRequest {
        selector: Some(redrive_proto::v1::Selector {
            sources: vec![dlq.to_owned()],
            ..Default::default()
        }),
        options: None,
    }
}

/// A fresh precheck of everything stored from `dlq` ([`precheck_request`]).
///
/// # Errors
/// When the planner refuses it.
pub async fn precheck(
    client: &mut PlannerClient<GrpcChannel>,
    dlq: &str,
) -> anyhow::Result<redrive_proto::v1::PrecheckReport> {
    let report = client.run_precheck(precheck_request(dlq)).await?;
    Ok(report.into_inner())
}

/// The first page (at most `page_size`) of the dead letters stored from
/// `source` (none while nothing was ever stored from it).
///
/// # Errors
/// When the planner refuses the listing.
pub async fn dead_letters_of(
    client: &mut PlannerClient<GrpcChannel>,
    source: &str,
    page_size: u32,
) -> anyhow::Result<redrive_proto::v1::ListDeadLettersResponse> {
    Ok(client
        .list_dead_letters(redrive_proto::v1::ListDeadLettersRequest {
            selector: Some(redrive_proto::v1::Selector {
                sources: vec![source.to_owned()],
                ..Default::default()
            }),
            page_size,
            page_token: String::new(),
        })
        .await
        .or_else(|status| match status.code() {
            // Nothing stored from it yet: the planner refuses a source it
            // has never seen (a typo), which for a waiting test is "none".
            tonic::Code::NotFound => Ok(tonic::Response::new(Default::default())),
            _ => Err(status),
        })?
        .into_inner())
}

/// How many dead letters from `source` are stored (a summary without
/// grouping; 0 while nothing was ever stored from it).
///
/// # Errors
/// When the planner refuses the summary.
pub async fn stored_total(
    client: &mut PlannerClient<GrpcChannel>,
    source: &str,
) -> anyhow::Result<u64> {
    Ok(client
        .summarize_dead_letters(redrive_proto::v1::SummarizeDeadLettersRequest {
            selector: Some(redrive_proto::v1::Selector {
                sources: vec![source.to_owned()],
                ..Default::default()
            }),
            group_by: vec![],
        })
        .await
        .or_else(|status| match status.code() {
            // Nothing stored from it yet (see `dead_letters_of`).
            tonic::Code::NotFound => Ok(tonic::Response::new(Default::default())),
            _ => Err(status),
        })?
        .into_inner()
        .total)
}

/// The first page (at most `page_size`) of the items of precheck
/// `precheck_id` with `verdict` (0: any).
///
/// # Errors
/// When the planner refuses the listing.
pub async fn precheck_items(
    client: &mut PlannerClient<GrpcChannel>,
    precheck_id: &str,
    verdict: i32,
    page_size: u32,
) -> anyhow::Result<redrive_proto::v1::ListPrecheckItemsResponse> {
    Ok(client
        .list_precheck_items(redrive_proto::v1::ListPrecheckItemsRequest {
            precheck_id: precheck_id.to_owned(),
            verdict,
            page_size,
            page_token: String::new(),
        })
        .await
        .or_else(|status| match status.code() {
            // Nothing stored from it yet: the planner refuses a source it
            // has never seen (a typo), which for a waiting test is "none".
            tonic::Code::NotFound => Ok(tonic::Response::new(Default::default())),
            _ => Err(status),
        })?
        .into_inner())
}

/// The request for a plan over the precheck `report` at `per_second` and
/// `burst` (rationale "test"), everything else left to the planner.
pub fn plan_request(
    report: &redrive_proto::v1::PrecheckReport,
    per_second: f64,
    burst: u32,
) -> redrive_proto::v1::CreatePlanRequest {
    redrive_proto::v1::CreatePlanRequest {
        precheck_id: report.precheck_id.clone(),
        rate: Some(redrive_proto::v1::Rate {
            per_second,
            burst,
            rationale: "test".into(),
        }),
        ..Default::default()
    }
}

/// A whole number from environment variable `name` (benchmark sizes), else
/// `default`.
pub fn env_count(name: &str, default: i64) -> i64 {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}

/// This process's peak resident memory (`VmHWM`), in MiB; 0 where
/// `/proc/self/status` does not say.
pub fn peak_rss_mib() -> f64 {
    bench::peak_rss_of(std::process::id())
}

/// Requests sent as encoded bytes, as no prost client would build them
/// (nested thousands deep, garbage, oversized).
pub mod raw {
    use prost::bytes::BufMut;
    use tonic::{
        Status,
        codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder},
        codegen::http::uri::PathAndQuery,
        transport::Channel,
    };

    use crate::PlannerHandle;

    /// Sends and receives encoded messages as they are: requests no prost
    /// client would build (nested thousands deep, garbage, oversized).
    #[derive(Debug, Clone, Copy, Default)]
    pub struct RawCodec;

    impl Codec for RawCodec {
        type Encode = Vec<u8>;
        type Decode = Vec<u8>;
        type Encoder = RawCodec;
        type Decoder = RawCodec;

        fn encoder(&mut self) -> Self {
            Self
        }

        fn decoder(&mut self) -> Self {
            Self
        }
    }

    impl Encoder for RawCodec {
        type Item = Vec<u8>;
        type Error = Status;

        fn encode(&mut self, item: Vec<u8>, buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
            buf.put_slice(&item);
            Ok(())
        }
    }

    impl Decoder for RawCodec {
        type Item = Vec<u8>;
        type Error = Status;

        fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, Status> {
            use prost::bytes::Buf;
            Ok(Some(buf.copy_to_bytes(buf.remaining()).to_vec()))
        }
    }

    /// A client that sends [`RawCodec`] bytes to `planner`, without message
    /// size limits.
    ///
    /// # Errors
    /// When the planner is not reachable.
    pub async fn raw_client(
        planner: &PlannerHandle,
    ) -> anyhow::Result<tonic::client::Grpc<Channel>> {
        let channel = Channel::from_shared(planner.url())?.connect().await?;
        Ok(tonic::client::Grpc::new(channel)
            .max_encoding_message_size(usize::MAX)
            .max_decoding_message_size(usize::MAX))
    }

    /// [`raw_client`], ready for a call; a connection failure as `UNKNOWN`.
    async fn ready_client(planner: &PlannerHandle) -> Result<tonic::client::Grpc<Channel>, Status> {
        let mut client = raw_client(planner)
            .await
            .map_err(|e| Status::unknown(e.to_string()))?;
        client
            .ready()
            .await
            .map_err(|e| Status::unknown(e.to_string()))?;
        Ok(client)
    }

    /// Calls unary `method` (`/redrive.v1.Planner/GetPlan`) with `bytes` as the
    /// request.
    ///
    /// # Errors
    /// The planner's answer (a connection failure as `UNKNOWN`).
    pub async fn raw_unary(
        planner: &PlannerHandle,
        method: &str,
        bytes: Vec<u8>,
    ) -> Result<Vec<u8>, Status> {
        let mut client = ready_client(planner).await?;
        let path = PathAndQuery::try_from(method.to_owned())
            .map_err(|e| Status::unknown(e.to_string()))?;
        client
            .unary(tonic::Request::new(bytes), path, RawCodec)
            .await
            .map(tonic::Response::into_inner)
    }

    /// Streams `items` to `IngestDeadLetters` as they are.
    ///
    /// # Errors
    /// The planner's answer (a connection failure as `UNKNOWN`).
    pub async fn raw_ingest(
        planner: &PlannerHandle,
        items: Vec<Vec<u8>>,
    ) -> Result<Vec<u8>, Status> {
        let mut client = ready_client(planner).await?;
        client
            .client_streaming(
                tonic::Request::new(tokio_stream::iter(items)),
                PathAndQuery::from_static("/redrive.v1.Planner/IngestDeadLetters"),
                RawCodec,
            )
            .await
            .map(tonic::Response::into_inner)
    }
}
