//! Health and readiness: the gRPC health service (`NOT_SERVING` until the
//! database is ready, then following PostgreSQL and the capture consumers)
//! and the gate that answers UNAVAILABLE meanwhile.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use redrive_proto::v1::{coordinator_server::CoordinatorServer, planner_server::PlannerServer};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::{
    capture::CaptureStatus,
    edge::grpc::{CoordinatorGrpc, PlannerGrpc},
    store::Store,
};

/// The health service, with `redrive.v1.Planner`, `redrive.v1.Coordinator`
/// and readiness (`""`) all `NOT_SERVING` until the database is ready.
pub(crate) async fn health_not_serving() -> (
    tonic_health::server::HealthReporter,
    tonic_health::pb::health_server::HealthServer<impl tonic_health::pb::health_server::Health>,
) {
    let (health_reporter, health_service) = tonic_health::server::health_reporter();
    health_reporter
        .set_not_serving::<PlannerServer<PlannerGrpc>>()
        .await;
    health_reporter
        .set_not_serving::<CoordinatorServer<CoordinatorGrpc>>()
        .await;
    // `""` is readiness: PostgreSQL and every capture consumer (report_health).
    health_reporter
        .set_service_status("", tonic_health::ServingStatus::NotServing)
        .await;
    (health_reporter, health_service)
}

/// The gRPC health service name of one capture queue's consumer:
/// `capture/<queue>`, `SERVING` while it consumes. Readiness (`""`) needs
/// all of them; this one tells which queue is missing.
pub fn capture_health_service(queue: &str) -> String {
    format!("capture/{queue}")
}

/// How often health follows PostgreSQL and capture after start-up.
const HEALTH_INTERVAL: Duration = Duration::from_secs(2);

/// Keeps health current (every [`HEALTH_INTERVAL`], gRPC health checking
/// protocol): `redrive.v1.Planner` and `redrive.v1.Coordinator` follow
/// PostgreSQL (`NOT_SERVING` while it does not answer, since every call
/// needs it); `""`, the server's readiness, also requires every capture
/// queue's consumer to be connected.
pub(crate) async fn report_health(
    store: Store,
    capture: CaptureStatus,
    reporter: tonic_health::server::HealthReporter,
    shutdown: CancellationToken,
) {
    let mut serving = true;
    let mut ready = None;
    let mut last_problems = Vec::new();
    let mut queues_consuming = std::collections::HashMap::new();
    loop {
        let up = store.ping().await.is_ok();
        if up != serving {
            serving = up;
            if up {
                info!("PostgreSQL answers again: health SERVING");
                reporter.set_serving::<PlannerServer<PlannerGrpc>>().await;
                reporter
                    .set_serving::<CoordinatorServer<CoordinatorGrpc>>()
                    .await;
            } else {
                warn!("PostgreSQL does not answer: health NOT_SERVING");
                reporter
                    .set_not_serving::<PlannerServer<PlannerGrpc>>()
                    .await;
                reporter
                    .set_not_serving::<CoordinatorServer<CoordinatorGrpc>>()
                    .await;
            }
        }
        let problems = capture.problems();
        let now_ready = up && problems.is_empty();
        for queue in capture.queues() {
            let consuming = capture.is_consuming(queue) == Some(true);
            if queues_consuming.insert(queue.to_owned(), consuming) != Some(consuming) {
                let status = if consuming {
                    tonic_health::ServingStatus::Serving
                } else {
                    tonic_health::ServingStatus::NotServing
                };
                reporter
                    .set_service_status(capture_health_service(queue), status)
                    .await;
            }
        }
        if ready != Some(now_ready) || (!now_ready && problems != last_problems) {
            if now_ready {
                info!("ready: PostgreSQL answers and every capture queue has a consumer");
            } else if ready.is_none() && up {
                // At start the capture queues are still being consumed:
                // not a failure yet; a later change is warned of.
                info!(
                    capture_queues_without_consumer = ?problems,
                    "not ready yet: {}",
                    problems.join("; ")
                );
            } else if problems.is_empty() {
                warn!(postgres = up, "not ready: PostgreSQL does not answer");
            } else {
                warn!(
                    postgres = up,
                    capture_queues_without_consumer = ?problems,
                    "not ready: {}",
                    problems.join("; ")
                );
            }
            last_problems = problems;
            let status = if now_ready {
                tonic_health::ServingStatus::Serving
            } else {
                tonic_health::ServingStatus::NotServing
            };
            reporter.set_service_status("", status).await;
            ready = Some(now_ready);
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(HEALTH_INTERVAL) => {}
        }
    }
}

/// Answers UNAVAILABLE until the database is ready.
#[derive(Debug, Clone)]
pub(crate) struct ReadyGate(pub(crate) Arc<AtomicBool>);

impl tonic::service::Interceptor for ReadyGate {
    fn call(&mut self, request: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if self.0.load(Ordering::SeqCst) {
            Ok(request)
        } else {
            Err(tonic::Status::unavailable(
                "the planner is starting: waiting for PostgreSQL and its migrations (see the planner's log)",
            ))
        }
    }
}
