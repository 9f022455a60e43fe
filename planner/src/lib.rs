//! The Redrive planner: captures dead letters from RabbitMQ DLQs, services and
//! files into PostgreSQL, lets operators inspect and summarize them, prechecks
//! them, makes plans that a person approves, leases their slices to executors
//! and keeps the audit. It is stateless: every piece of state lives in
//! PostgreSQL, so replicas are interchangeable.
//!
//! # Layout
//! This is the one map of the planner; `docs/layout.md` points here. Each
//! folder is a domain. [`edge`] converts a call and asks the domains; the
//! domains decide and ask [`store`] to read and write, in one transaction
//! where a decision must see and change the database at one moment
//! ([`store::Tx`]); the store decides nothing: it stores the domains' value
//! types and applies the plan state table ([`plan::state`]) in SQL.
//!
//! | folder | what it owns |
//! | --- | --- |
//! | `lib.rs`, `main.rs` | [`run`], the wiring of the services; the binary's start-up (settings, logging, signals, `--listen`: [`main_with_args`], which `main.rs` calls); `health.rs` (the health service and the readiness gate), `background.rs` (the background tasks, owned and drained within the shutdown grace) |
//! | [`config`] | the settings: flags with `REDRIVE_…` fallbacks, parsed once at start-up into typed values; `config/checks.rs` (the one parse, step by step in flag order), `config/rules.rs` (the precheck policy and extraction rules), `config/transport.rs` (TLS and authentication), `config/settings.rs` ([`Settings`]) |
//! | [`edge`] | the API edge: [`edge::grpc`] (the gRPC adapters: `grpc/planner.rs` `redrive.v1.Planner`, `grpc/coordinator.rs` `redrive.v1.Coordinator`), [`edge::auth`] (who is calling, the actor a call is recorded under: `auth/actor.rs` the actor and delegation, `auth/tokens.rs` the static token file, `auth/jwt.rs` bearer JWTs, `auth/certificates.rs` client certificates and `--cert-role`, `auth/layer.rs` the tower layer), [`edge::roles`] (the one table of which role each RPC needs), [`edge::console`] (the operator console's page and its security headers, served beside the API; grpc-web by tonic-web), [`edge::admission`] (what one caller may take: `admission/connections.rs` the connection pools and deadlines, `admission/rate.rs` the request rate, `admission/streams.rs` open streams) |
//! | [`capture`] | dead letters in: consuming DLQs into PostgreSQL, ack after commit; `capture/session.rs` (one connection's consuming: guard, queue checks, batches), `capture/write.rs` (storing a batch, the ack after commit), `capture/isolate.rs` (messages one at a time after a failed session, unreadable ones parked or held), `capture/status.rs` (which queues have a consumer); [`capture::guard`] (the relay that reads content headers before lapin), [`capture::raw`] (the small AMQP client for deliveries lapin cannot decode: `raw/connection.rs` the client, `raw/header.rs` the lenient content-header reader, `raw/reader.rs` the byte cursor), [`capture::ingest`] (`IngestDeadLetters`, from services and `redrivectl import`), [`capture::ingest_budget`] (the memory all ingest streams share: `ingest_budget/layer.rs` the tower layer, `ingest_budget/body.rs` the charged request body) |
//! | [`dead_letters`] | a dead letter about to be stored and the rules that derive what is kept beside it; `dead_letters/extract.rs` (the steps of extraction), [`dead_letters::death`] (the death that counts, its reason class, other frameworks' dead-letter headers), [`dead_letters::message_key`] (idempotency key and event type), [`dead_letters::event_time`] (the one reading of an event time), [`dead_letters::body`] (compression sniffing, previews), [`dead_letters::selector`] (which dead letters a call covers), [`dead_letters::inspect`] (listing, lookups, summaries, the sources' overview), [`dead_letters::rekey`] (re-keying a stored backlog), [`dead_letters::housekeeping`] (archive, unarchive, retention) |
//! | [`precheck`] | the dry run that gives every dead letter one verdict; `precheck/classify.rs` (the rules before the state check, then the hooks, a chunk at a time), `precheck/report.rs` (the report under construction and its warnings), `precheck/sources.rs` (a selector's sources checked against those stored), [`precheck::options`] (a precheck's options and the one age rule), [`precheck::policy`] (the planner's floor under them), [`precheck::staleness`] (which deadline applied, and warnings), [`precheck::state_check`] (the owning services' state-check hooks) |
//! | [`plan`] | plans made from a precheck and approved by digest; [`plan::state`] (the state machine: the one transition table that every part asks), [`plan::gates`] (the canary gates), [`plan::single`] (replays and repairs of one dead letter), [`plan::preview`] (a plan's first messages as they would be published) |
//! | [`leases`] | the coordinator: executors' slice claims, leases, fencing and reports; [`leases::outcomes`] (which reported outcomes are recorded and which refused, and the gates at a slice's end) |
//! | [`audit`] | a plan's report and audit export (the audit's SQL, writes and reads, is `store/audit.rs`); [`audit::watch_hub`] (`WatchPlan` and `WatchLease` streams sharing one reader per plan and per lease), [`audit::notifier`] (plan-change notifications across replicas), [`audit::log`] (the audit log: sealing rounds, signed checkpoints, the witness, proofs and the log export; its SQL is `store/audit_log.rs`, its pure part the `redrive-tlog` crate) |
//! | [`store`] | the PostgreSQL queries, and nothing else (its own `# Layout`, naming `store/leases/`: `claim.rs` the claim, `holder.rs` a holder's checks and marks, `expiry.rs` the sweep, `report.rs` a report's reads and writes); `migrations/`: the schema, one numbered SQL file per change |
//! | [`webhooks`] | telling callers what happened (Standard Webhooks): the events each state change reports and their data, secrets, target URLs and signatures; [`webhooks::deliver`] (the deliverer every replica runs over the outbox, `store/webhooks.rs`: at least once, retried with backoff), `webhooks/http.rs` (the HTTP client) |
//! | [`ids`], [`error`], [`metrics`] | ids (dead letter, slice, plan, precheck) and page tokens parsed once; the domain error and its one mapping to a status; the metric instruments, counted through the [`store::Store`] every part holds |

pub mod audit;
mod background;
pub mod capture;
pub mod config;
pub mod dead_letters;
pub mod edge;
pub mod error;
mod health;
pub mod ids;
pub mod leases;
pub mod metrics;
pub mod plan;
pub mod precheck;
pub mod store;
mod task_stream;
pub mod webhooks;

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use tonic::service::interceptor::InterceptedService;

use redrive_proto::{
    FILE_DESCRIPTOR_SET,
    v1::{coordinator_server::CoordinatorServer, planner_server::PlannerServer},
};
use sqlx::{Postgres, migrate::MigrateDatabase};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

pub use crate::config::{Config, Settings};
pub use crate::health::capture_health_service;
use crate::health::{ReadyGate, health_not_serving};
use crate::{
    audit::notifier::Notifier,
    background::{Background, start_background, stop_within_grace},
    capture::CaptureStatus,
    edge::grpc::{CoordinatorGrpc, PlannerGrpc, PlannerState},
    precheck::state_check::StateChecker,
    store::Store,
};

pub use redrive_proto::limits::MAX_GRPC_MESSAGE_BYTES;

/// tonic answers a request larger than [`MAX_GRPC_MESSAGE_BYTES`]
/// `OUT_OF_RANGE` before any handler sees it; by gRPC's table that code is
/// for iterating past a range, and the planner answers nothing else with it,
/// so it becomes `RESOURCE_EXHAUSTED` (tonic's text, naming the limit, stays).
fn oversized_is_resource_exhausted<B>(
    mut response: tonic::codegen::http::Response<B>,
) -> tonic::codegen::http::Response<B> {
    let headers = response.headers_mut();
    if headers
        .get("grpc-status")
        .is_some_and(|status| status == "11")
    {
        headers.insert(
            "grpc-status",
            tonic::codegen::http::HeaderValue::from_static("8"),
        );
    }
    response
}

/// Runs the planner on `listener` until `shutdown` is cancelled: creates the
/// database if missing, applies migrations (retrying while PostgreSQL is
/// unreachable), starts capture, serves `redrive.v1.Planner`,
/// `redrive.v1.Coordinator`, `grpc.health.v1.Health` and server reflection, and
/// on shutdown lets capture store and ack what it holds within the grace period.
/// `config` is parsed here into [`Settings`], once, before anything starts.
///
/// # Errors
/// An invalid configuration, a migration that fails for a reason other than
/// PostgreSQL being unreachable, or the server failing.
pub async fn run(
    config: Config,
    listener: TcpListener,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let Settings {
        config,
        policy,
        state_checks,
        extraction,
        authenticator,
        tls,
        webhooks,
        audit_log,
    } = Settings::parse(config)?;
    if config.exposed_without_protection() {
        warn!(
            listen = %config.listen,
            tls = tls.is_some(),
            authentication = authenticator.is_some(),
            "--insecure: serving a non-loopback address without TLS or without authentication; \
             anyone who reaches it can call every RPC as anyone"
        );
    }
    let metrics_pipeline = redrive_proto::telemetry::Metrics::start(
        "redrive-planner",
        &redrive_proto::telemetry::MetricsSettings::from(&config.telemetry),
        shutdown.clone(),
    )
    .await
    .map_err(|error| anyhow::anyhow!("invalid setting {}: {error}", error.setting()))?;
    let store = Store::connect_lazy_with(
        &config.database_url,
        config.database_max_connections,
        &audit_log.session_options(),
    )?
    .with_metrics(metrics::PlannerMetrics::new(
        &metrics_pipeline.meter("redrive-planner"),
    ))
    .with_planner_webhook(webhooks.target.is_some());
    let capture_status = CaptureStatus::new(&config.capture_queues);
    let rules = Arc::new(extraction);
    let notifier = Notifier::new();
    let checker = Arc::new(StateChecker::new(state_checks).with_tls(config.state_check_tls()));

    // Serve at once, so that callers get a clear UNAVAILABLE (and health
    // NOT_SERVING) while PostgreSQL is being waited for, instead of a hang.
    let ready = Arc::new(AtomicBool::new(false));
    let (health_reporter, health_service) = health_not_serving().await;
    let (planner, coordinator) = grpc_services(
        &config,
        policy,
        &store,
        checker,
        Wiring {
            rules: &rules,
            notifier: &notifier,
            shutdown: &shutdown,
            capture: &capture_status,
            authenticated: authenticator.is_some(),
            audit_log: &audit_log,
        },
    );
    info!(
        listen = %listener.local_addr()?,
        capture_queues = ?config.capture_queues,
        tls = tls.is_some(),
        authentication = authenticator.is_some(),
        "planner serving"
    );
    let server = Server {
        health: health_service,
        planner,
        coordinator,
        gate: ReadyGate(Arc::clone(&ready)),
        tls,
        authenticator,
    }
    .spawn(&config, listener, shutdown.clone())?;

    let prepared = prepare_database(&config, &store, &audit_log, &shutdown).await;
    let background = match prepared {
        Ok(true) => {
            ready.store(true, Ordering::SeqCst);
            let mut background = start_background(
                &config,
                store.clone(),
                health_reporter,
                capture_status,
                rules,
                notifier,
                &shutdown,
            )
            .await;
            background.seal_audit_log(store.clone(), audit_log, &shutdown);
            background.deliver_webhooks(store, webhooks, &shutdown);
            background
        }
        Ok(false) => Background::default(),
        Err(error) => {
            shutdown.cancel();
            let _ = server.await;
            return Err(error);
        }
    };
    // The last metrics and traces go out also when a background task
    // stopped the planner.
    let stopped = stop_within_grace(&config, server, background, &shutdown).await;
    metrics_pipeline.shutdown().await;
    stopped?;
    info!("planner stopped");
    Ok(())
}

/// What the gRPC services share with the rest of the planner.
struct Wiring<'a> {
    /// How ingested dead letters are read.
    rules: &'a Arc<dead_letters::ExtractionRules>,
    /// Plan-change notifications.
    notifier: &'a Notifier,
    /// The planner's shutdown.
    shutdown: &'a CancellationToken,
    /// Each capture queue's consumer and depth.
    capture: &'a CaptureStatus,
    /// Whether callers are authenticated.
    authenticated: bool,
    /// The audit log.
    audit_log: &'a audit::log::AuditLog,
}

/// The two gRPC services, `redrive.v1.Planner` and `redrive.v1.Coordinator`,
/// wired to the store, the notifier and one shared watch hub, each taking
/// messages up to [`MAX_GRPC_MESSAGE_BYTES`].
fn grpc_services(
    config: &Config,
    policy: precheck::policy::Policy,
    store: &Store,
    checker: Arc<StateChecker>,
    Wiring {
        rules,
        notifier,
        shutdown,
        capture,
        authenticated,
        audit_log,
    }: Wiring<'_>,
) -> (
    PlannerServer<PlannerGrpc>,
    CoordinatorServer<CoordinatorGrpc>,
) {
    let hub = audit::watch_hub::WatchHub::new(store.clone(), notifier.clone(), shutdown.clone());
    let coordinator_service = leases::Coordinator::new(
        store.clone(),
        notifier.clone(),
        config.lease_ttl(),
        Arc::clone(&checker),
    )
    .with_claim_max_bytes(config.claim_max_bytes)
    .with_shutdown(shutdown.clone());
    let planner = PlannerServer::new(PlannerGrpc::new(PlannerState {
        store: store.clone(),
        rules: Arc::clone(rules),
        checker,
        notifier: notifier.clone(),
        four_eyes: config.four_eyes,
        policy: Arc::new(policy),
        max_precheck_age: config.max_precheck_age,
        shutdown: shutdown.clone(),
        watches: config.watch_limits().with_metrics(store.metrics().clone()),
        hub: hub.clone(),
        capture: capture.clone(),
        authenticated,
        audit_log: audit_log.clone(),
    }))
    .max_decoding_message_size(MAX_GRPC_MESSAGE_BYTES)
    .max_encoding_message_size(MAX_GRPC_MESSAGE_BYTES);
    let coordinator = CoordinatorServer::new(CoordinatorGrpc::new(
        coordinator_service,
        hub,
        config
            .lease_watch_limits()
            .with_metrics(store.metrics().clone()),
    ))
    .max_decoding_message_size(MAX_GRPC_MESSAGE_BYTES)
    .max_encoding_message_size(MAX_GRPC_MESSAGE_BYTES);
    (planner, coordinator)
}

/// What the gRPC server serves: health, the two services behind the
/// readiness gate, and how callers are let in (TLS, authentication).
struct Server<H> {
    health: tonic_health::pb::health_server::HealthServer<H>,
    planner: PlannerServer<PlannerGrpc>,
    coordinator: CoordinatorServer<CoordinatorGrpc>,
    gate: ReadyGate,
    tls: Option<tonic::transport::ServerTlsConfig>,
    authenticator: Option<Arc<edge::auth::Authenticator>>,
}

impl<H: tonic_health::pb::health_server::Health> Server<H> {
    /// Spawns the server on `listener` until `shutdown`: health, server
    /// reflection (v1 and v1alpha), the planner and the coordinator, behind
    /// the layers (oversize mapping, authentication, rate limit, ingest
    /// budget) and the admitted connections with HTTP/2 keepalive.
    ///
    /// # Errors
    /// Reflection that cannot be built or a TLS configuration tonic refuses.
    fn spawn(
        self,
        config: &Config,
        listener: TcpListener,
        shutdown: CancellationToken,
    ) -> anyhow::Result<tokio::task::JoinHandle<Result<(), tonic::transport::Error>>> {
        // Both reflection versions: grpcurl before 1.8.8, grpcui and older Postman
        // speak only v1alpha.
        let reflection = || {
            tonic_reflection::server::Builder::configure()
                .register_encoded_file_descriptor_set(FILE_DESCRIPTOR_SET)
                .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        };
        let reflection_v1alpha = reflection().build_v1alpha()?;
        let reflection = reflection().build_v1()?;
        // HTTP/2 keepalive pings find dead clients; the admitted connections
        // close idle ones and cap how many one peer may hold.
        let connections = edge::admission::Connections::new(config.connection_limits());
        let mut builder = tonic::transport::Server::builder()
            // One server span per call, continuing the caller's traceparent.
            .trace_fn(redrive_proto::telemetry::grpc_server_span::<()>)
            .http2_keepalive_interval(Some(edge::admission::KEEPALIVE_INTERVAL))
            .http2_keepalive_timeout(Some(edge::admission::KEEPALIVE_TIMEOUT))
            // Room on every connection for the ingest streams that wait for
            // the ingest budget, whose data stays unread meanwhile.
            .initial_stream_window_size(capture::ingest_budget::STREAM_WINDOW_BYTES)
            .initial_connection_window_size(capture::ingest_budget::CONNECTION_WINDOW_BYTES)
            // The console's browsers speak HTTP/1.1 without TLS (grpc-web).
            .accept_http1(true);
        if let Some(tls) = self.tls {
            builder = builder.tls_config(tls)?;
        }
        Ok(tokio::spawn(
            builder
                // The console's page (GET), then grpc-web translated to gRPC
                // before authentication, so that its refusals reach the
                // browser as grpc-web too.
                .layer(edge::console::ConsoleLayer::new(
                    self.authenticator.is_some(),
                ))
                .layer(tonic_web::GrpcWebLayer::new())
                .layer(tower::util::MapResponseLayer::new(
                    oversized_is_resource_exhausted::<tonic::body::Body>,
                ))
                .layer(edge::auth::AuthLayer::new(self.authenticator))
                .layer(edge::admission::RateLimitLayer::new(
                    config.request_rate(),
                    connections.clone(),
                ))
                .layer(capture::ingest_budget::IngestBudgetLayer::new(
                    config.ingest_budget(),
                ))
                .add_service(self.health)
                .add_service(reflection)
                .add_service(reflection_v1alpha)
                .add_service(InterceptedService::new(self.planner, self.gate.clone()))
                .add_service(InterceptedService::new(self.coordinator, self.gate))
                .serve_with_incoming_shutdown(
                    edge::admission::admit(incoming(listener), connections),
                    shutdown.cancelled_owned(),
                ),
        ))
    }
}

/// How long the planner waits for PostgreSQL's first answer at start-up
/// before it says PostgreSQL is unreachable and tries again (the pool's
/// acquire timeout, 5 s, bounds every later connection the same way).
const FIRST_ANSWER: Duration = Duration::from_secs(5);

/// Creates the database if missing and applies migrations, retrying with
/// backoff while PostgreSQL is unreachable or does not answer. `Ok(false)`
/// when shut down first, also in the middle of an attempt.
async fn prepare_database(
    config: &Config,
    store: &Store,
    audit_log: &audit::log::AuditLog,
    shutdown: &CancellationToken,
) -> anyhow::Result<bool> {
    let mut backoff =
        redrive_proto::backoff::Backoff::new(Duration::from_millis(200), Duration::from_secs(5));
    // Where PostgreSQL is, for the log (host and port: never the URL,
    // which may hold a password).
    let address = config
        .database_url
        .parse::<sqlx::postgres::PgConnectOptions>()
        .map(|options| format!("{}:{}", options.get_host(), options.get_port()))
        .unwrap_or_default();
    loop {
        let attempt = async {
            // The first contact has a deadline of its own: a server (or a
            // proxy in front of one) that accepts the connection and never
            // answers would hold it forever, silently. The pool's
            // connections are bounded by its acquire timeout.
            let exists = tokio::time::timeout(
                FIRST_ANSWER,
                Postgres::database_exists(&config.database_url),
            )
            .await
            .map_err(|_| {
                std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!(
                        "no answer within {} s: the server accepted the connection but said nothing",
                        FIRST_ANSWER.as_secs()
                    ),
                )
            })??;
            if !exists {
                info!("creating database");
                Postgres::create_database(&config.database_url).await?;
            }
            store.migrate().await?;
            let broker_id = config.broker_id();
            let recorded = store.claim_deployment(&broker_id).await?;
            anyhow::ensure!(
                recorded == broker_id,
                "this database belongs to the deployment of broker {recorded:?}, and this planner's \
                 is {broker_id:?} (--broker-id, else the AMQP URL's host:port/vhost): one database \
                 holds one broker's record of what was delivered, so give each broker a database \
                 of its own, or pass --broker-id {recorded:?} if this is the same broker reached \
                 another way"
            );
            // A keyless planner on a signed log would write rows the log
            // refuses to seal (they carry no MAC), and must not seal others'.
            let audit = &config.audit_log;
            if audit.sealing()
                && audit.signing_key.is_none()
                && let Some(signed) = store.audit_checkpoint(None).await?
            {
                anyhow::bail!(
                    "the audit log in this database is signed (checkpoints of {:?}, the latest at \
                     {} leaves), and this planner has no --audit-signing-key: the rows it wrote \
                     would carry no MAC, and the log would refuse to seal them. Give every planner \
                     of this database the same --audit-signing-key (docs/audit-log.md)",
                    signed.note.lines().next().unwrap_or_default(),
                    signed.tree_size
                );
            }
            // The log takes this planner's key before it serves: a planner
            // still on the previous key stops at its next round, before the
            // rows written under this key reach it. One whose key is not
            // the log's (and not its previous) is refused.
            match audit_log.take_key(store).await {
                Err(crate::error::Error::Store(error)) => Err(error.into()),
                Err(refused) => Err(anyhow::anyhow!("{refused}")),
                Ok(()) => anyhow::Ok(()),
            }
        };
        // Shut down also while an attempt waits (a migration, a connection).
        let outcome = tokio::select! {
            () = shutdown.cancelled() => return Ok(false),
            outcome = attempt => outcome,
        };
        match outcome {
            Ok(()) => return Ok(true),
            Err(error) if is_unreachable(&error) => {
                let delay = backoff.next_delay();
                warn!(%error, postgres = %address, retry_in_ms = delay.as_millis() as u64,
                      "PostgreSQL unreachable, waiting");
                tokio::select! {
                    () = shutdown.cancelled() => return Ok(false),
                    () = tokio::time::sleep(delay) => {}
                }
            }
            Err(error) => return Err(error.context("preparing the database")),
        }
    }
}

/// Connections the kernel completes and queues for the planner to accept
/// (`listen(2)` backlog; Linux caps it at `net.core.somaxconn`, 4,096 by
/// default). Large, so that a flood of connections the planner closes at
/// once cannot fill the queue: a full queue drops new connections'
/// handshakes, and a legitimate client then waits a second for its
/// retransmission.
pub const LISTEN_BACKLOG: u32 = 4096;

/// A listener on `addr` for [`run`] with a [`LISTEN_BACKLOG`]-deep queue
/// (`SO_REUSEADDR` set, as `std` and Tokio's own `bind` do).
///
/// # Errors
/// When the address cannot be bound (in use, not local, no permission).
pub fn bind(addr: std::net::SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// Accepted connections with `TCP_NODELAY` set: without it, Nagle's algorithm
/// and delayed ACKs stall small gRPC frames for tens of milliseconds.
pub fn incoming(listener: TcpListener) -> tonic::transport::server::TcpIncoming {
    tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true))
}

/// The `redrive-planner` binary: parses the settings from `args` (as
/// [`std::env::args_os`] gives them, the program's name first), starts
/// logging, wires SIGINT and SIGTERM to a cancellation token
/// ([`start_service`](redrive_proto::telemetry::start_service)), binds
/// `--listen` and runs [`run`] on a multi-threaded Tokio runtime. Messages
/// read `redrive-planner: ...` whatever the program's name.
///
/// Exit codes: success, `EX_USAGE` (64) for a setting refused (at parsing,
/// binding `--listen` or start-up), otherwise
/// [`run_failure_code`](redrive_proto::settings::run_failure_code).
///
/// # Panics
/// When the Tokio runtime cannot be built (as `#[tokio::main]`).
pub fn main_with_args(
    args: impl IntoIterator<Item = std::ffi::OsString>,
) -> std::process::ExitCode {
    let args: Vec<std::ffi::OsString> = args.into_iter().collect();
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("Failed building the Runtime")
        .block_on(serve_main(args))
}

/// [`main_with_args`] on its runtime.
async fn serve_main(args: Vec<std::ffi::OsString>) -> std::process::ExitCode {
    use redrive_proto::{
        settings::{EX_USAGE, run_failure_code},
        telemetry::start_service,
    };
    use std::process::ExitCode;

    let (config, logging, shutdown) = match start_service::<Config>("redrive-planner", args) {
        Ok(started) => started,
        Err(code) => return code,
    };
    let listener = match bind(config.listen) {
        Ok(listener) => listener,
        Err(error) => {
            eprintln!(
                "redrive-planner: invalid setting --listen: cannot bind {}: {error}",
                config.listen
            );
            return ExitCode::from(EX_USAGE);
        }
    };
    let code = match run(config, listener, shutdown).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!(
                error = redrive_proto::settings::error_text(error.as_ref()),
                "planner failed"
            );
            let code = run_failure_code(&error);
            if code == ExitCode::from(EX_USAGE) {
                // A usage error goes where the parsing ones go, too.
                eprintln!(
                    "redrive-planner: {}",
                    redrive_proto::settings::error_text(error.as_ref())
                );
            }
            code
        }
    };
    logging.finish().await;
    code
}

fn is_unreachable(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| {
        cause.downcast_ref::<std::io::Error>().is_some()
            || matches!(
                cause.downcast_ref::<sqlx::Error>(),
                Some(sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut)
            )
    })
}
