//! The background tasks of a held lease: renewal, the planner's stop
//! signal, the executor's own deadline and shutdown; and one
//! `MarkPublishing` call.

use std::{sync::Arc, time::Duration};

use redrive_proto::{
    backoff::Backoff,
    error::is_stale_token,
    v1::{self, coordinator_client::CoordinatorClient},
};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;
use tracing::warn;

use super::{PAST_DEADLINE, RENEWALS, Shared, StopReason};

/// Why one `MarkPublishing` call did not record the mark.
pub(super) enum MarkFailed {
    /// The planner refused the token: the lease is lost (and stopped).
    Lost,
    /// No answer, or an error other than a stale token.
    Unanswered(String),
}

/// One `MarkPublishing` call through `through`, bounded by a third of the
/// TTL; records the mark in `shared`, or stops the lease as lost.
pub(super) async fn mark(
    mut coordinator: CoordinatorClient<Channel>,
    shared: &Shared,
    through: u64,
) -> Result<(), MarkFailed> {
    let request = v1::MarkPublishingRequest {
        slice_id: shared.slice_id.clone(),
        fencing_token: shared.token,
        through_item_id: through.to_string(),
    };
    match tokio::time::timeout(shared.ttl / 3, coordinator.mark_publishing(request)).await {
        Ok(Ok(_)) => {
            shared.record_mark(through);
            Ok(())
        }
        Ok(Err(status)) if is_stale_token(&status) => {
            shared.stop(StopReason::Lost(status.message().to_owned()));
            Err(MarkFailed::Lost)
        }
        Ok(Err(status)) => Err(MarkFailed::Unanswered(format!(
            "{:?}: {}",
            status.code(),
            status.message()
        ))),
        Err(_) => Err(MarkFailed::Unanswered(
            "no answer within a third of the lease TTL".to_owned(),
        )),
    }
}

pub(super) async fn renew(
    coordinator: &mut CoordinatorClient<Channel>,
    shared: &Shared,
) -> Result<v1::HeartbeatResponse, tonic::Status> {
    let request = coordinator.heartbeat(v1::HeartbeatRequest {
        slice_id: shared.slice_id.clone(),
        fencing_token: shared.token,
    });
    match tokio::time::timeout(shared.ttl / 3, request).await {
        Ok(answer) => answer.map(tonic::Response::into_inner),
        Err(_) => Err(tonic::Status::deadline_exceeded(
            "the lease renewal took longer than a third of the TTL",
        )),
    }
}

/// Renews the lease at a third of its TTL until stopped and beyond (a
/// stopped lease is still renewed while its confirms drain and its outcomes
/// are reported).
pub(super) async fn heartbeat(mut coordinator: CoordinatorClient<Channel>, shared: Arc<Shared>) {
    let mut ticker = tokio::time::interval((shared.ttl / 3).max(Duration::from_millis(100)));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticker.tick().await;
    loop {
        ticker.tick().await;
        let sent_at = Instant::now();
        match renew(&mut coordinator, &shared).await {
            Ok(answer) => {
                shared.renewed(sent_at);
                shared.answered(RENEWALS);
                if !answer.keep_publishing {
                    shared.stop(StopReason::Plan(answer.reason));
                }
            }
            Err(status) if is_stale_token(&status) => {
                shared.stop(StopReason::Lost(status.message().to_owned()));
                return;
            }
            Err(status) => {
                let reason = format!("{:?}: {}", status.code(), status.message());
                // A lease already lost here is renewed only in case the
                // planner still holds it (its confirms drain, its outcomes
                // are reported): its renewal failing is no news.
                if shared.is_lost() {
                    tracing::debug!(code = ?status.code(), grpc_message = status.message(), "renewing a lease lost here failed");
                } else if shared.failed(RENEWALS, &reason, ticker.period()) {
                    warn!(planner = %shared.said.planner, code = ?status.code(), grpc_message = status.message(),
                        "lease renewal failed; the lease is lost if none succeeds for two thirds of its TTL (said once for all slice loops)");
                }
            }
        }
    }
}

/// Follows the planner's stop signal (`WatchLease`), reconnecting with
/// backoff while the planner is unreachable (the deadline covers that time).
pub(super) async fn watch(mut coordinator: CoordinatorClient<Channel>, shared: Arc<Shared>) {
    let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(2));
    loop {
        let request = v1::WatchLeaseRequest {
            slice_id: shared.slice_id.clone(),
            fencing_token: shared.token,
        };
        match coordinator.watch_lease(request).await {
            Ok(stream) => {
                let mut stream = stream.into_inner();
                loop {
                    match stream.message().await {
                        Ok(Some(signal)) => {
                            backoff.reset();
                            if signal.lease_lost {
                                shared.stop(StopReason::Lost(signal.reason));
                                return;
                            }
                            if !signal.keep_publishing {
                                shared.stop(StopReason::Plan(signal.reason));
                            }
                        }
                        Ok(None) => break,
                        Err(status) => {
                            tracing::debug!(code = ?status.code(), grpc_message = status.message(), "lease watch ended");
                            break;
                        }
                    }
                }
            }
            Err(status) if is_stale_token(&status) => {
                shared.stop(StopReason::Lost(status.message().to_owned()));
                return;
            }
            Err(status) => {
                tracing::debug!(code = ?status.code(), grpc_message = status.message(), "cannot watch the lease");
            }
        }
        tokio::time::sleep(backoff.next_delay()).await;
    }
}

/// Stops publishing when the deadline passes without a renewal.
pub(super) async fn watch_deadline(shared: Arc<Shared>) {
    loop {
        let deadline = shared.deadline();
        tokio::time::sleep_until(deadline).await;
        if Instant::now() >= shared.deadline() {
            shared.stop(StopReason::Lost(PAST_DEADLINE.to_owned()));
            return;
        }
    }
}

pub(super) async fn stop_on_shutdown(shutdown: CancellationToken, shared: Arc<Shared>) {
    shutdown.cancelled().await;
    shared.stop(StopReason::Shutdown);
}
