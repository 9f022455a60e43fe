//! The reporter of a lease's outcomes ([`super::Lease::reporter`]): batches
//! audit events and streams them to `ReportOutcomes` with the token.

use std::{sync::Arc, time::Duration};

use prost::Message as _;
use redrive_proto::{
    backoff::Backoff,
    error::is_stale_token,
    v1::{self, coordinator_client::CoordinatorClient},
};
use tokio::{sync::mpsc, time::Instant};
use tonic::transport::Channel;
use tracing::{info, warn};

use super::{REPORTS, Shared, StopReason};

/// Outcome events buffered before a report is sent.
pub(super) const REPORT_BATCH: usize = 256;
/// Most encoded bytes of outcome events per report (no bodies travel in a
/// report, but a state-check hook's reasons may be long): far below the
/// planner's gRPC message limit.
const REPORT_MAX_BYTES: usize = 4 * 1024 * 1024;
/// Longest a buffered outcome waits before it is reported.
const REPORT_INTERVAL: Duration = Duration::from_millis(100);
/// How long a report is retried while the planner cannot be reached; then
/// its events are dropped (the lease expires, and the planner marks every
/// unreported item `uncertain`).
const REPORT_GIVE_UP: Duration = Duration::from_secs(60);

/// The reporter task of [`Lease::reporter`].
pub(super) async fn report(
    mut coordinator: CoordinatorClient<Channel>,
    shared: Arc<Shared>,
    mut receiver: mpsc::Receiver<v1::AuditEvent>,
) {
    let mut buffer = Vec::with_capacity(REPORT_BATCH);
    let mut buffered_bytes = 0;
    let mut open = true;
    while open || !buffer.is_empty() {
        if open {
            open = gather(&mut receiver, &mut buffer, &mut buffered_bytes).await;
        }
        if buffer.is_empty() {
            continue;
        }
        let request = v1::ReportOutcomesRequest {
            slice_id: shared.slice_id.clone(),
            fencing_token: shared.token,
            events: std::mem::take(&mut buffer),
        };
        buffered_bytes = 0;
        send_report(&mut coordinator, &shared, &request).await;
    }
}

/// Adds the events that come within [`REPORT_INTERVAL`] to `buffer` (and
/// their encoded size to `bytes`), up to a batch; `false` once every sender
/// is gone.
async fn gather(
    receiver: &mut mpsc::Receiver<v1::AuditEvent>,
    buffer: &mut Vec<v1::AuditEvent>,
    bytes: &mut usize,
) -> bool {
    let deadline = tokio::time::sleep(REPORT_INTERVAL);
    tokio::pin!(deadline);
    loop {
        tokio::select! {
            () = &mut deadline => return true,
            event = receiver.recv() => match event {
                Some(event) => {
                    *bytes += event.encoded_len();
                    buffer.push(event);
                    if buffer.len() >= REPORT_BATCH || *bytes >= REPORT_MAX_BYTES {
                        return true;
                    }
                }
                None => return false,
            },
        }
    }
}

/// Sends one report, retrying with backoff for up to [`REPORT_GIVE_UP`]
/// while the planner does not answer; a stale token or giving up marks the
/// lease's outcomes unreported and stops it.
async fn send_report(
    coordinator: &mut CoordinatorClient<Channel>,
    shared: &Shared,
    request: &v1::ReportOutcomesRequest,
) {
    let started = Instant::now();
    let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(2));
    loop {
        // Bounded: a half-open link to the planner must not hold the
        // report (and the slice loop behind it) for ever.
        let call = async {
            let mut responses = coordinator
                .report_outcomes(tokio_stream::iter(vec![request.clone()]))
                .await?
                .into_inner();
            responses.message().await
        };
        let answer = match tokio::time::timeout(shared.ttl / 3, call).await {
            Ok(answer) => answer,
            Err(_) => Err(tonic::Status::deadline_exceeded(
                "the outcome report took longer than a third of the lease TTL",
            )),
        };
        let delay = backoff.next_delay();
        match answer {
            Ok(Some(answer)) => {
                shared.answered(REPORTS);
                take_answer(shared, &answer);
                break;
            }
            Ok(None) => {
                warn!("outcome report answered nothing; retrying");
            }
            Err(status) if is_stale_token(&status) => {
                // A token the slice never had: nothing of it can be recorded.
                warn!(grpc_message = status.message(), "outcome report refused");
                shared
                    .unreported
                    .store(true, std::sync::atomic::Ordering::SeqCst);
                shared.stop(StopReason::Lost(status.message().to_owned()));
                break;
            }
            Err(status) if started.elapsed() < REPORT_GIVE_UP => {
                let reason = format!("{:?}: {}", status.code(), status.message());
                if shared.failed(REPORTS, &reason, delay) {
                    warn!(planner = %shared.said.planner, code = ?status.code(), grpc_message = status.message(),
                        "outcome report failed; retrying (said once for all slice loops)");
                }
            }
            Err(status) => {
                warn!(code = ?status.code(), grpc_message = status.message(), events = request.events.len(),
                    "giving up on an outcome report; when the lease expires the planner marks its unreported items uncertain");
                shared
                    .unreported
                    .store(true, std::sync::atomic::Ordering::SeqCst);
                shared.stop(StopReason::Lost("outcomes cannot be reported".to_owned()));
                break;
            }
        }
        tokio::time::sleep(delay).await;
    }
}

/// What the planner's answer to a report means for the lease.
fn take_answer(shared: &Shared, answer: &v1::ReportOutcomesResponse) {
    if answer.refused > 0 && !answer.lease_lost {
        // Under a lease this executor still holds, a refusal
        // means it reported what it never marked (a bug
        // here): publish nothing more, and neither complete
        // nor release the slice, so that its expiry judges
        // the unreported items by the mark.
        tracing::error!(
            refused = answer.refused,
            accepted = answer.accepted,
            "the planner refused outcomes of a live lease; stopping the slice and letting its lease expire"
        );
        shared
            .unreported
            .store(true, std::sync::atomic::Ordering::SeqCst);
        shared.stop(StopReason::Lost(
            "the planner refused outcomes of this lease".to_owned(),
        ));
    } else if answer.refused > 0 {
        info!(
            refused = answer.refused,
            accepted = answer.accepted,
            "late outcomes of an expired lease refused; the planner recorded its marked items as uncertain"
        );
    }
    if answer.lease_lost {
        shared.stop(StopReason::Lost(
            "the planner says this lease expired or another holds the slice now".to_owned(),
        ));
    }
}
