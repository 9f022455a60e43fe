//! The executor's health, served as the gRPC health checking protocol
//! (`grpc.health.v1.Health`, grpc/grpc `doc/health-checking.md`) on
//! `--health-listen`, for an orchestrator's probes (Kubernetes `grpc:`
//! probes, `grpc_health_probe`).
//!
//! | service name | `SERVING` when |
//! | --- | --- |
//! | `""` (the server) and `readiness` | ready: the broker accepts a connection, Redis answers `PING` (when configured) and the planner's `redrive.v1.Coordinator` reports `SERVING`, all checked every [`CHECK_INTERVAL`] |
//! | `liveness` | live: every slice loop beat its [`Heartbeat`] within the liveness timeout (it beats on every claim answer, publish, outcome and each second of a wait) |
//!
//! Until the first check ends, every name is `NOT_SERVING`. Health is served
//! from the start, also while the executor still waits for Redis: not
//! ready then, but live (nothing is wedged; the slice loops have not
//! started).

use std::{
    sync::{
        Arc, OnceLock,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use redrive_proto::amqp_nodes::AmqpNodes;
use tokio::{net::TcpListener, time::Instant};
use tokio_util::{sync::CancellationToken, task::AbortOnDropHandle};
use tonic::transport::Channel;
use tonic_health::{
    ServingStatus,
    pb::{HealthCheckRequest, health_check_response, health_client::HealthClient},
    server::HealthReporter,
};
use tracing::{info, warn};

use crate::publisher::{Publisher, PublisherOptions};

/// How often readiness and liveness are checked.
pub const CHECK_INTERVAL: Duration = Duration::from_secs(2);
/// How long one dependency check may take before it counts as unreachable.
pub const CHECK_TIMEOUT: Duration = Duration::from_secs(3);
/// The service name of readiness (also answered for `""`).
pub const READINESS: &str = "readiness";
/// The service name of liveness.
pub const LIVENESS: &str = "liveness";
/// The planner's service whose health readiness follows.
const PLANNER_SERVICE: &str = "redrive.v1.Coordinator";

/// The last time a slice loop showed it is not wedged: milliseconds since
/// the executor started, shared between the loop and the health checks.
#[derive(Debug, Clone)]
pub struct Heartbeat {
    started: Instant,
    last_ms: Arc<AtomicU64>,
}

impl Heartbeat {
    /// A heartbeat that beat now, measured from `started`.
    pub fn new(started: Instant) -> Self {
        let heartbeat = Self {
            started,
            last_ms: Arc::new(AtomicU64::new(0)),
        };
        heartbeat.beat();
        heartbeat
    }

    /// The loop is alive now.
    pub fn beat(&self) {
        let elapsed = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.fetch_max(elapsed, Ordering::Relaxed);
    }

    /// Time since the last beat.
    pub fn silent_for(&self) -> Duration {
        let now = self.started.elapsed();
        now.saturating_sub(Duration::from_millis(self.last_ms.load(Ordering::Relaxed)))
    }
}

/// What readiness checks and liveness watches.
pub struct HealthChecks {
    /// The broker's node URLs: ready when one of them accepts a
    /// connection (tried in turn, round robin).
    pub amqp: AmqpNodes,
    /// Publisher options (TLS, heartbeat) for the broker check.
    pub publisher: PublisherOptions,
    /// Redis, when configured: set once connected (not ready before).
    pub redis: Option<Arc<OnceLock<crate::redis_topology::RedisConnection>>>,
    /// The planner channel the executor uses.
    pub planner: Channel,
    /// One per slice loop, set when the loops start (live before: starting
    /// is not being wedged).
    pub heartbeats: Arc<OnceLock<Vec<Heartbeat>>>,
    /// A loop silent longer than this is wedged.
    pub liveness_timeout: Duration,
}

/// Serves `grpc.health.v1.Health` on `listener` and keeps its statuses
/// current until `shutdown`; returns once the server and the status checks
/// have both ended.
///
/// # Errors
/// The server failing.
pub async fn serve(
    listener: TcpListener,
    checks: HealthChecks,
    shutdown: CancellationToken,
) -> Result<(), tonic::transport::Error> {
    let (reporter, service) = tonic_health::server::health_reporter();
    for name in ["", READINESS, LIVENESS] {
        reporter
            .set_service_status(name, ServingStatus::NotServing)
            .await;
    }
    if let Ok(address) = listener.local_addr() {
        info!(%address, "health serving grpc.health.v1");
    }
    // Owned here: it ends with the server, also when the server fails.
    let checks_done = shutdown.child_token();
    let keeping = AbortOnDropHandle::new(tokio::spawn(keep_current(
        reporter,
        checks,
        checks_done.clone(),
    )));
    let served = tonic::transport::Server::builder()
        .add_service(service)
        .serve_with_incoming_shutdown(
            tonic::transport::server::TcpIncoming::from(listener),
            shutdown.cancelled_owned(),
        )
        .await;
    checks_done.cancel();
    // It returns at its next await of the token (a check in progress is
    // dropped there).
    let _ = keeping.await;
    served
}

async fn keep_current(reporter: HealthReporter, checks: HealthChecks, shutdown: CancellationToken) {
    let mut was_ready = None;
    let mut said: Option<Vec<&'static str>> = None;
    let mut was_live = None;
    loop {
        let problems = tokio::select! {
            () = shutdown.cancelled() => return,
            problems = readiness_problems(&checks) => problems,
        };
        let ready = problems.is_empty();
        // A line whenever what is missing changes, not only readiness: a
        // dependency that came back while another is still away is said.
        if said.as_ref() != Some(&problems) {
            if ready {
                info!("ready: broker, Redis and planner reachable");
            } else {
                warn!(unreachable = ?problems, "not ready");
            }
            said = Some(problems.clone());
        }
        if was_ready != Some(ready) {
            let status = serving(ready);
            reporter.set_service_status("", status).await;
            reporter.set_service_status(READINESS, status).await;
            was_ready = Some(ready);
        }
        let wedged = checks
            .heartbeats
            .get()
            .map(Vec::as_slice)
            .unwrap_or_default()
            .iter()
            .enumerate()
            .filter(|(_, heartbeat)| heartbeat.silent_for() > checks.liveness_timeout)
            .map(|(index, _)| index)
            .collect::<Vec<_>>();
        let live = wedged.is_empty();
        if was_live != Some(live) {
            if !live {
                warn!(loops = ?wedged, timeout_seconds = checks.liveness_timeout.as_secs(), "slice loops silent past the liveness timeout: not live");
            }
            reporter.set_service_status(LIVENESS, serving(live)).await;
            was_live = Some(live);
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(CHECK_INTERVAL) => {}
        }
    }
}

fn serving(up: bool) -> ServingStatus {
    if up {
        ServingStatus::Serving
    } else {
        ServingStatus::NotServing
    }
}

/// Which dependencies do not answer (`broker`, `redis`, `planner`), checked
/// at once; Redis before the executor's first connection to it is `redis
/// (connecting)` (the executor waits for it at start: not yet known to be
/// away).
async fn readiness_problems(checks: &HealthChecks) -> Vec<&'static str> {
    let broker = async {
        // Any node will do: each in turn, each within the check's timeout.
        for _ in 0..checks.amqp.len() {
            let node = checks.amqp.next();
            let connected = tokio::time::timeout(
                CHECK_TIMEOUT,
                Publisher::connect_with(&node.url, checks.publisher),
            )
            .await;
            if let Ok(Ok(publisher)) = connected {
                let _ = tokio::time::timeout(CHECK_TIMEOUT, publisher.close()).await;
                return true;
            }
        }
        false
    };
    let redis = async {
        let Some(connection) = &checks.redis else {
            return Ok(());
        };
        let Some(connection) = connection.get() else {
            return Err("redis (connecting)");
        };
        let mut connection = connection.clone();
        let command = redis::cmd("PING");
        // On a cluster, every master is asked and all must answer.
        let ping = command.query_async::<redis::Value>(&mut connection);
        let answered = matches!(tokio::time::timeout(CHECK_TIMEOUT, ping).await, Ok(Ok(answer)) if !matches!(answer, redis::Value::ServerError(_)));
        if answered { Ok(()) } else { Err("redis") }
    };
    let planner = async {
        let mut client = HealthClient::new(checks.planner.clone());
        let check = client.check(HealthCheckRequest {
            service: PLANNER_SERVICE.to_owned(),
        });
        match tokio::time::timeout(CHECK_TIMEOUT, check).await {
            Ok(Ok(answer)) => {
                answer.into_inner().status == health_check_response::ServingStatus::Serving as i32
            }
            _ => false,
        }
    };
    let (broker, redis, planner) = tokio::join!(broker, redis, planner);
    [
        (!broker).then_some("broker"),
        redis.err(),
        (!planner).then_some("planner"),
    ]
    .into_iter()
    .flatten()
    .collect()
}

#[cfg(test)]
mod tests {
    use tonic::transport::Endpoint;

    use super::*;

    async fn liveness(client: &mut HealthClient<Channel>) -> Option<i32> {
        client
            .check(HealthCheckRequest {
                service: LIVENESS.to_owned(),
            })
            .await
            .ok()
            .map(|answer| answer.into_inner().status)
    }

    async fn wait_liveness(
        client: &mut HealthClient<Channel>,
        expected: health_check_response::ServingStatus,
    ) {
        let deadline = Instant::now() + Duration::from_secs(15);
        while liveness(client).await != Some(expected as i32) {
            assert!(
                Instant::now() < deadline,
                "liveness never became {expected:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// A slice loop that stops beating makes `liveness` NOT_SERVING after
    /// the timeout (an orchestrator restarts the executor), and a beat
    /// makes it SERVING again; readiness, with nothing reachable, stays
    /// NOT_SERVING throughout and does not hide it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_silent_slice_loop_makes_liveness_not_serving() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("a port");
        let address = listener.local_addr().expect("its address");
        let beating = Heartbeat::new(Instant::now());
        let silent = Heartbeat::new(Instant::now());
        let checks = HealthChecks {
            // Nothing listens on port 1: readiness stays NOT_SERVING.
            amqp: AmqpNodes::single("amqp://127.0.0.1:1/%2f"),
            publisher: PublisherOptions::with_window(1),
            redis: None,
            planner: Endpoint::from_static("http://127.0.0.1:1").connect_lazy(),
            heartbeats: Arc::new(OnceLock::from(vec![beating.clone(), silent.clone()])),
            liveness_timeout: Duration::from_secs(3),
        };
        let shutdown = CancellationToken::new();
        let serving = tokio::spawn(serve(listener, checks, shutdown.clone()));
        let keep_beating = tokio::spawn(async move {
            loop {
                beating.beat();
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        let mut client = HealthClient::new(
            Endpoint::from_shared(format!("http://{address}"))
                .expect("an endpoint")
                .connect_lazy(),
        );

        // Both loops beat at first (the first check refuses fast: nothing
        // listens on port 1): live.
        wait_liveness(&mut client, health_check_response::ServingStatus::Serving).await;
        // One loop silent past the timeout: not live.
        wait_liveness(
            &mut client,
            health_check_response::ServingStatus::NotServing,
        )
        .await;
        let readiness = client
            .check(HealthCheckRequest {
                service: READINESS.to_owned(),
            })
            .await
            .expect("readiness answers")
            .into_inner()
            .status;
        assert_eq!(
            readiness,
            health_check_response::ServingStatus::NotServing as i32
        );

        // It beats again: live.
        let silent_beats = tokio::spawn(async move {
            loop {
                silent.beat();
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        wait_liveness(&mut client, health_check_response::ServingStatus::Serving).await;

        keep_beating.abort();
        silent_beats.abort();
        shutdown.cancel();
        serving
            .await
            .expect("the server task")
            .expect("the server ends cleanly");
    }
}
