//! `redrive.v1.Coordinator` ([`CoordinatorGrpc`]): what executors call,
//! each handler one call of the [`crate::leases::Coordinator`].

use futures::{StreamExt, stream::BoxStream};
use redrive_proto::v1::{self, coordinator_server::Coordinator};
use tonic::{Request, Response, Status, Streaming};

use crate::{error::Error, ids::SliceId, leases::Coordinator as CoordinatorService};

/// The principal a lease is bound to: the caller's authenticated identity,
/// `""` when the planner runs without authentication (every caller is then
/// the same principal). Every write under a lease must come from the
/// principal that claimed it (docs/design.md, "Leases").
fn caller<T>(request: &Request<T>) -> String {
    crate::edge::roles::Principal::of(request)
        .map(|principal| principal.name.clone())
        .unwrap_or_default()
}

/// `redrive.v1.Coordinator`: what executors call.
#[derive(Debug, Clone)]
pub struct CoordinatorGrpc {
    coordinator: CoordinatorService,
    /// The live lease watches (they end when the planner stops).
    hub: crate::audit::watch_hub::WatchHub,
    /// Caps on open `WatchLease` streams, per caller and in total.
    lease_watches: crate::edge::admission::StreamLimits,
}

impl CoordinatorGrpc {
    /// The adapter over `coordinator`, its lease watches served by `hub`
    /// within `lease_watches`.
    pub fn new(
        coordinator: CoordinatorService,
        hub: crate::audit::watch_hub::WatchHub,
        lease_watches: crate::edge::admission::StreamLimits,
    ) -> Self {
        Self {
            coordinator,
            hub,
            lease_watches,
        }
    }
}

#[tonic::async_trait]
impl Coordinator for CoordinatorGrpc {
    async fn claim_slice(
        &self,
        request: Request<v1::ClaimSliceRequest>,
    ) -> Result<Response<v1::ClaimSliceResponse>, Status> {
        let caller = caller(&request);
        let request = request.into_inner();
        let wait = request
            .wait
            .as_ref()
            .map(|wait| {
                redrive_proto::time::from_duration(wait)
                    .ok_or_else(|| Error::invalid("wait", "must not be negative"))
            })
            .transpose()?
            .unwrap_or_default();
        let slice = self
            .coordinator
            .claim(
                &request.executor_id,
                &caller,
                wait,
                request.marks_publishing,
            )
            .await?;
        Ok(Response::new(v1::ClaimSliceResponse { slice }))
    }

    async fn heartbeat(
        &self,
        request: Request<v1::HeartbeatRequest>,
    ) -> Result<Response<v1::HeartbeatResponse>, Status> {
        let caller = caller(&request);
        let request = request.into_inner();
        let slice_id = SliceId::parse("slice_id", &request.slice_id)?;
        Ok(Response::new(
            self.coordinator
                .heartbeat(slice_id, request.fencing_token, &caller)
                .await?,
        ))
    }

    type ReportOutcomesStream = BoxStream<'static, Result<v1::ReportOutcomesResponse, Status>>;

    async fn report_outcomes(
        &self,
        request: Request<Streaming<v1::ReportOutcomesRequest>>,
    ) -> Result<Response<Self::ReportOutcomesStream>, Status> {
        let caller = caller(&request);
        let mut reports = request.into_inner();
        let coordinator = self.coordinator.clone();
        let (sender, receiver) = tokio::sync::mpsc::channel(16);
        tokio::spawn(async move {
            while let Some(report) = reports.next().await {
                let answer = match report {
                    Ok(report) => coordinator
                        .report(report, &caller)
                        .await
                        .map_err(Status::from),
                    Err(status) => Err(status),
                };
                let failed = answer.is_err();
                if sender.send(answer).await.is_err() || failed {
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(receiver),
        )))
    }

    type WatchLeaseStream = BoxStream<'static, Result<v1::LeaseSignal, Status>>;

    async fn watch_lease(
        &self,
        request: Request<v1::WatchLeaseRequest>,
    ) -> Result<Response<Self::WatchLeaseStream>, Status> {
        let permit = self
            .lease_watches
            .open(crate::edge::admission::request_caller_key(&request))?;
        let caller = caller(&request);
        let request = request.into_inner();
        let slice_id = SliceId::parse("slice_id", &request.slice_id)?;
        crate::leases::parse_token(request.fencing_token)?;
        let signals = self
            .hub
            .watch_lease(slice_id, request.fencing_token, &caller)
            .await?;
        // The permit lives as long as the stream.
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(signals).map(move |signal| {
                let _held = &permit;
                Ok(signal)
            }),
        )))
    }

    async fn complete_slice(
        &self,
        request: Request<v1::CompleteSliceRequest>,
    ) -> Result<Response<v1::CompleteSliceResponse>, Status> {
        let caller = caller(&request);
        let request = request.into_inner();
        let slice_id = SliceId::parse("slice_id", &request.slice_id)?;
        self.coordinator
            .complete(slice_id, request.fencing_token, &caller, request.release)
            .await?;
        Ok(Response::new(v1::CompleteSliceResponse {}))
    }

    async fn mark_publishing(
        &self,
        request: Request<v1::MarkPublishingRequest>,
    ) -> Result<Response<v1::MarkPublishingResponse>, Status> {
        let caller = caller(&request);
        let request = request.into_inner();
        let slice_id = SliceId::parse("slice_id", &request.slice_id)?;
        self.coordinator
            .mark_publishing(
                slice_id,
                request.fencing_token,
                &caller,
                &request.through_item_id,
            )
            .await?;
        Ok(Response::new(v1::MarkPublishingResponse {}))
    }

    async fn recheck_state(
        &self,
        request: Request<v1::RecheckStateRequest>,
    ) -> Result<Response<v1::RecheckStateResponse>, Status> {
        let caller = caller(&request);
        let request = request.into_inner();
        let slice_id = SliceId::parse("slice_id", &request.slice_id)?;
        let decisions = self
            .coordinator
            .recheck(
                &request.plan_id,
                slice_id,
                request.fencing_token,
                &caller,
                &request.dead_letter_ids,
            )
            .await?;
        Ok(Response::new(v1::RecheckStateResponse { decisions }))
    }
}
