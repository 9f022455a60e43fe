//! The gRPC adapters: request → domain types (validated, `InvalidArgument`
//! naming the field) → one domain call → response. No SQL and no business
//! branching here.

use std::sync::Arc;

use futures::stream::BoxStream;
use redrive_proto::v1::{self, coordinator_server::Coordinator, planner_server::Planner};
use tonic::{Request, Response, Status, Streaming};

use crate::{
    dead_letter::ExtractionRules,
    error::Error,
    ingest,
    inspect::{self, PageToken},
    precheck::{self, PrecheckOptions, PrecheckRequest},
    selector::Selector,
    state_check::StateChecker,
    store::Store,
};

/// What every handler needs; cheap to clone.
#[derive(Debug, Clone)]
pub struct PlannerState {
    /// PostgreSQL.
    pub store: Store,
    /// How ingested dead letters are read.
    pub rules: Arc<ExtractionRules>,
    /// The state-check hooks.
    pub checker: Arc<StateChecker>,
}

/// Request metadata key naming the person or system making a call (bound to a
/// credential by later authentication work).
pub const ACTOR_METADATA: &str = "x-redrive-actor";

/// The actor of `request`, `"anonymous"` when not given.
fn actor<T>(request: &Request<T>) -> String {
    request
        .metadata()
        .get(ACTOR_METADATA)
        .and_then(|value| value.to_str().ok())
        .map(str::trim)
        .filter(|value| !value.is_empty())
        .unwrap_or("anonymous")
        .to_owned()
}

fn precheck_id(field: &str, id: &str) -> Result<uuid::Uuid, Error> {
    uuid::Uuid::parse_str(id)
        .map_err(|_| Error::invalid(field, format!("{id:?} is not a precheck id (a UUID)")))
}

/// `redrive.v1.Planner` over [`PlannerState`].
#[derive(Debug, Clone)]
pub struct PlannerGrpc {
    state: PlannerState,
}

impl PlannerGrpc {
    /// The adapter over `state`.
    pub fn new(state: PlannerState) -> Self {
        Self { state }
    }
}

fn selector(selector: Option<v1::Selector>) -> Result<Selector, Error> {
    Selector::try_from(selector.unwrap_or_default())
}

fn later<T>(capability: &'static str) -> Result<Response<T>, Status> {
    Err(Error::Unimplemented(capability).into())
}

#[tonic::async_trait]
impl Planner for PlannerGrpc {
    async fn ingest_dead_letters(
        &self,
        request: Request<Streaming<v1::IngestDeadLettersRequest>>,
    ) -> Result<Response<v1::IngestDeadLettersResponse>, Status> {
        let summary =
            ingest::ingest(&self.state.store, &self.state.rules, request.into_inner()).await?;
        Ok(Response::new(v1::IngestDeadLettersResponse {
            accepted: summary.accepted,
            duplicates: summary.duplicates,
            rejected: summary.rejected,
        }))
    }

    async fn list_dead_letters(
        &self,
        request: Request<v1::ListDeadLettersRequest>,
    ) -> Result<Response<v1::ListDeadLettersResponse>, Status> {
        let request = request.into_inner();
        let selector = selector(request.selector)?;
        let token = PageToken::parse(&request.page_token)?;
        let (dead_letters, next_page_token) =
            inspect::list(&self.state.store, &selector, request.page_size, token).await?;
        Ok(Response::new(v1::ListDeadLettersResponse {
            dead_letters,
            next_page_token,
        }))
    }

    async fn get_dead_letter(
        &self,
        request: Request<v1::GetDeadLetterRequest>,
    ) -> Result<Response<v1::GetDeadLetterResponse>, Status> {
        let id = inspect::parse_id("id", &request.into_inner().id)?;
        let (dead_letter, body_preview) = inspect::get(&self.state.store, id).await?;
        Ok(Response::new(v1::GetDeadLetterResponse {
            dead_letter: Some(dead_letter),
            body_preview,
        }))
    }

    async fn summarize_dead_letters(
        &self,
        request: Request<v1::SummarizeDeadLettersRequest>,
    ) -> Result<Response<v1::SummarizeDeadLettersResponse>, Status> {
        let request = request.into_inner();
        let selector = selector(request.selector)?;
        let dimensions = request
            .group_by
            .iter()
            .enumerate()
            .map(|(index, value)| inspect::dimension(index, *value))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Response::new(
            inspect::summarize(&self.state.store, &selector, dimensions).await?,
        ))
    }

    async fn run_precheck(
        &self,
        request: Request<v1::RunPrecheckRequest>,
    ) -> Result<Response<v1::PrecheckReport>, Status> {
        let actor = actor(&request);
        let request = request.into_inner();
        let selector_proto = request.selector.unwrap_or_default();
        let options_proto = request.options.unwrap_or_default();
        let precheck = PrecheckRequest {
            actor,
            selector: Selector::try_from(selector_proto.clone())?,
            options: PrecheckOptions::try_from(options_proto.clone())?,
            selector_proto,
            options_proto,
        };
        Ok(Response::new(
            precheck::run(&self.state.store, &self.state.checker, precheck).await?,
        ))
    }

    async fn get_precheck(
        &self,
        request: Request<v1::GetPrecheckRequest>,
    ) -> Result<Response<v1::PrecheckReport>, Status> {
        let id = precheck_id("precheck_id", &request.into_inner().precheck_id)?;
        Ok(Response::new(precheck::get(&self.state.store, id).await?))
    }

    async fn list_precheck_items(
        &self,
        request: Request<v1::ListPrecheckItemsRequest>,
    ) -> Result<Response<v1::ListPrecheckItemsResponse>, Status> {
        let request = request.into_inner();
        let id = precheck_id("precheck_id", &request.precheck_id)?;
        let verdict = match v1::Verdict::try_from(request.verdict) {
            Ok(v1::Verdict::Unspecified) => None,
            Ok(verdict) => Some(verdict),
            Err(_) => {
                return Err(Error::invalid(
                    "verdict",
                    format!("{} is not a verdict", request.verdict),
                )
                .into());
            }
        };
        let token = PageToken::parse(&request.page_token)?;
        let (items, next_page_token) =
            precheck::list_items(&self.state.store, id, verdict, request.page_size, token).await?;
        Ok(Response::new(v1::ListPrecheckItemsResponse {
            items,
            next_page_token,
        }))
    }

    async fn create_plan(
        &self,
        _: Request<v1::CreatePlanRequest>,
    ) -> Result<Response<v1::Plan>, Status> {
        later("replay plans (CreatePlan)")
    }

    async fn approve_plan(
        &self,
        _: Request<v1::ApprovePlanRequest>,
    ) -> Result<Response<v1::Plan>, Status> {
        later("replay plans (ApprovePlan)")
    }

    async fn get_plan(&self, _: Request<v1::GetPlanRequest>) -> Result<Response<v1::Plan>, Status> {
        later("replay plans (GetPlan)")
    }

    async fn list_plans(
        &self,
        _: Request<v1::ListPlansRequest>,
    ) -> Result<Response<v1::ListPlansResponse>, Status> {
        later("replay plans (ListPlans)")
    }

    async fn promote_plan(
        &self,
        _: Request<v1::PlanControlRequest>,
    ) -> Result<Response<v1::Plan>, Status> {
        later("canary promotion (PromotePlan)")
    }

    async fn pause_plan(
        &self,
        _: Request<v1::PlanControlRequest>,
    ) -> Result<Response<v1::Plan>, Status> {
        later("plan controls (PausePlan)")
    }

    async fn resume_plan(
        &self,
        _: Request<v1::PlanControlRequest>,
    ) -> Result<Response<v1::Plan>, Status> {
        later("plan controls (ResumePlan)")
    }

    async fn cancel_plan(
        &self,
        _: Request<v1::PlanControlRequest>,
    ) -> Result<Response<v1::Plan>, Status> {
        later("plan controls (CancelPlan)")
    }

    async fn list_compensations(
        &self,
        _: Request<v1::ListCompensationsRequest>,
    ) -> Result<Response<v1::ListCompensationsResponse>, Status> {
        later("compensation lists (ListCompensations)")
    }

    type WatchPlanStream = BoxStream<'static, Result<v1::WatchPlanResponse, Status>>;

    async fn watch_plan(
        &self,
        _: Request<v1::WatchPlanRequest>,
    ) -> Result<Response<Self::WatchPlanStream>, Status> {
        later("plan watching (WatchPlan)")
    }

    async fn get_audit_report(
        &self,
        _: Request<v1::GetAuditReportRequest>,
    ) -> Result<Response<v1::AuditReport>, Status> {
        later("audit reports (GetAuditReport)")
    }

    type ExportAuditStream = BoxStream<'static, Result<v1::ExportAuditChunk, Status>>;

    async fn export_audit(
        &self,
        _: Request<v1::ExportAuditRequest>,
    ) -> Result<Response<Self::ExportAuditStream>, Status> {
        later("audit export (ExportAudit)")
    }

    async fn replay_dead_letter(
        &self,
        _: Request<v1::ReplayDeadLetterRequest>,
    ) -> Result<Response<v1::ReplayDeadLetterResponse>, Status> {
        later("single replay (ReplayDeadLetter)")
    }

    async fn repair_dead_letter(
        &self,
        _: Request<v1::RepairDeadLetterRequest>,
    ) -> Result<Response<v1::GetDeadLetterResponse>, Status> {
        later("body repair (RepairDeadLetter)")
    }
}

/// `redrive.v1.Coordinator`: executors' side. Replay execution is later work;
/// every call says so.
#[derive(Debug, Clone, Default)]
pub struct CoordinatorGrpc;

#[tonic::async_trait]
impl Coordinator for CoordinatorGrpc {
    async fn claim_slice(
        &self,
        _: Request<v1::ClaimSliceRequest>,
    ) -> Result<Response<v1::ClaimSliceResponse>, Status> {
        later("replay execution (ClaimSlice)")
    }

    async fn heartbeat(
        &self,
        _: Request<v1::HeartbeatRequest>,
    ) -> Result<Response<v1::HeartbeatResponse>, Status> {
        later("replay execution (Heartbeat)")
    }

    type ReportOutcomesStream = BoxStream<'static, Result<v1::ReportOutcomesResponse, Status>>;

    async fn report_outcomes(
        &self,
        _: Request<Streaming<v1::ReportOutcomesRequest>>,
    ) -> Result<Response<Self::ReportOutcomesStream>, Status> {
        later("replay execution (ReportOutcomes)")
    }

    async fn complete_slice(
        &self,
        _: Request<v1::CompleteSliceRequest>,
    ) -> Result<Response<v1::CompleteSliceResponse>, Status> {
        later("replay execution (CompleteSlice)")
    }

    async fn recheck_state(
        &self,
        _: Request<v1::RecheckStateRequest>,
    ) -> Result<Response<v1::RecheckStateResponse>, Status> {
        later("state re-check (RecheckState)")
    }
}
