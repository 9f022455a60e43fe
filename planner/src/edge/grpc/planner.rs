//! `redrive.v1.Planner` ([`PlannerGrpc`]): each handler converts its
//! request, makes one domain call and converts the answer.

use std::sync::Arc;

use futures::{StreamExt, stream::BoxStream};
use redrive_proto::v1::{self, planner_server::Planner};
use tonic::{Request, Response, Status, Streaming};

use super::{ACTOR_METADATA, PlannerState};
use crate::{
    audit,
    capture::ingest,
    dead_letters::housekeeping,
    dead_letters::inspect,
    dead_letters::rekey,
    dead_letters::selector::Selector,
    error::Error,
    ids::{DeadLetterId, PageToken, PlanId, PrecheckId},
    plan,
    precheck::{self, PrecheckRequest},
};

/// The actor `request` is recorded under: the one authentication settled
/// ([`crate::edge::auth::Actor`]: the principal, or `portal-x for alice`), else
/// (authentication off) the `x-redrive-actor` header, `"anonymous"` when
/// not given.
fn actor<T>(request: &Request<T>) -> String {
    if let Some(actor) = request.extensions().get::<crate::edge::auth::Actor>() {
        return actor.to_string();
    }
    request
        .metadata()
        .get(ACTOR_METADATA)
        .and_then(|value| value.to_str().ok())
        .map(str::trim)
        .filter(|value| !value.is_empty())
        .unwrap_or("anonymous")
        .to_owned()
}

/// The store's names of the enum values of repeated field `field`, by
/// `name`; `InvalidArgument` naming `field[i]` with `problem` for a value
/// `name` does not know.
fn enum_names(
    values: &[i32],
    field: &str,
    problem: &str,
    name: impl Fn(i32) -> Option<&'static str>,
) -> Result<Vec<String>, Error> {
    values
        .iter()
        .enumerate()
        .map(|(index, value)| {
            name(*value)
                .map(str::to_owned)
                .ok_or_else(|| Error::invalid(format!("{field}[{index}]"), problem))
        })
        .collect()
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

    /// Promote, pause, resume or cancel, as the caller in the metadata.
    async fn control(
        &self,
        request: Request<v1::PlanControlRequest>,
        control: plan::Control,
    ) -> Result<Response<v1::Plan>, Status> {
        self.keyed(
            control.method(),
            request,
            move |this, actor, request| async move {
                let plan_id = PlanId::parse("plan_id", &request.plan_id)?;
                Ok(Response::new(
                    plan::control(
                        &this.state.store,
                        plan_id,
                        control,
                        &actor,
                        &request.reason,
                        request.override_arrivals,
                    )
                    .await?,
                ))
            },
        )
        .await
    }
}

impl PlannerGrpc {
    /// A call that creates or changes something, run once per idempotency
    /// key of its caller ([`crate::edge::idempotency::once`]): `call` gets a
    /// clone of this adapter, the caller's actor ([`actor`]) and the request.
    async fn keyed<Req, Resp, F, Fut>(
        &self,
        method: &'static str,
        request: Request<Req>,
        call: F,
    ) -> Result<Response<Resp>, Status>
    where
        Req: prost::Message + 'static,
        Resp: prost::Message + Default + 'static,
        F: FnOnce(Self, String, Req) -> Fut + Send + 'static,
        Fut: Future<Output = Result<Response<Resp>, Status>> + Send + 'static,
    {
        let actor = actor(&request);
        let this = self.clone();
        crate::edge::idempotency::once(
            &self.state.store,
            &actor.clone(),
            method,
            request,
            move |request| call(this, actor, request.into_inner()),
        )
        .await
    }

    /// Archive (`archive`) or unarchive, as the caller in the metadata.
    async fn set_archived(
        &self,
        request: Request<v1::ArchiveDeadLettersRequest>,
        archive: bool,
    ) -> Result<Response<v1::ArchiveDeadLettersResponse>, Status> {
        self.keyed(
            if archive {
                "ArchiveDeadLetters"
            } else {
                "UnarchiveDeadLetters"
            },
            request,
            move |this, actor, request| async move {
                Ok(Response::new(
                    housekeeping::set_archived(&this.state.store, &actor, request, archive).await?,
                ))
            },
        )
        .await
    }
}

fn selector(selector: Option<v1::Selector>) -> Result<Selector, Error> {
    Selector::try_from(selector.unwrap_or_default())
}

#[tonic::async_trait]
impl Planner for PlannerGrpc {
    async fn ingest_dead_letters(
        &self,
        request: Request<Streaming<v1::IngestDeadLettersRequest>>,
    ) -> Result<Response<v1::IngestDeadLettersResponse>, Status> {
        let reservations = request
            .extensions()
            .get::<crate::capture::ingest_budget::Reservations>()
            .cloned();
        let summary = ingest::ingest(
            &self.state.store,
            &self.state.rules,
            request.into_inner(),
            reservations,
        )
        .await?;
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
        crate::precheck::check_sources(&self.state.store, &selector.sources).await?;
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
        let id = DeadLetterId::parse("id", &request.into_inner().id)?;
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
        crate::precheck::check_sources(&self.state.store, &selector.sources).await?;
        Ok(Response::new(
            inspect::summarize(&self.state.store, &selector, dimensions).await?,
        ))
    }

    async fn archive_dead_letters(
        &self,
        request: Request<v1::ArchiveDeadLettersRequest>,
    ) -> Result<Response<v1::ArchiveDeadLettersResponse>, Status> {
        self.set_archived(request, true).await
    }

    async fn unarchive_dead_letters(
        &self,
        request: Request<v1::ArchiveDeadLettersRequest>,
    ) -> Result<Response<v1::ArchiveDeadLettersResponse>, Status> {
        self.set_archived(request, false).await
    }

    async fn rekey_dead_letters(
        &self,
        request: Request<v1::RekeyDeadLettersRequest>,
    ) -> Result<Response<v1::RekeyDeadLettersResponse>, Status> {
        self.keyed(
            "RekeyDeadLetters",
            request,
            move |this, actor, request| async move {
                Ok(Response::new(
                    rekey::rekey(&this.state.store, &this.state.rules, &actor, request).await?,
                ))
            },
        )
        .await
    }

    async fn run_precheck(
        &self,
        request: Request<v1::RunPrecheckRequest>,
    ) -> Result<Response<v1::PrecheckReport>, Status> {
        self.keyed(
            "RunPrecheck",
            request,
            move |this, actor, request| async move {
                let precheck = PrecheckRequest::new(
                    actor,
                    request.selector.unwrap_or_default(),
                    request.options.unwrap_or_default(),
                    &this.state.policy,
                )?;
                // Run detached: a caller that goes away does not leave the precheck
                // half done (it finishes and is stored, for GetPrecheck).
                let store = this.state.store.clone();
                let checker = Arc::clone(&this.state.checker);
                // The detached task keeps the call's span as its parent (traces).
                let report = tokio::spawn(tracing::Instrument::in_current_span(async move {
                    precheck::run(&store, &checker, precheck).await
                }))
                .await
                .map_err(|error| Status::internal(format!("precheck task failed: {error}")))??;
                Ok(Response::new(report))
            },
        )
        .await
    }

    async fn get_precheck(
        &self,
        request: Request<v1::GetPrecheckRequest>,
    ) -> Result<Response<v1::PrecheckReport>, Status> {
        let id = PrecheckId::parse("precheck_id", &request.into_inner().precheck_id)?;
        Ok(Response::new(precheck::get(&self.state.store, id).await?))
    }

    async fn list_precheck_items(
        &self,
        request: Request<v1::ListPrecheckItemsRequest>,
    ) -> Result<Response<v1::ListPrecheckItemsResponse>, Status> {
        let request = request.into_inner();
        let id = PrecheckId::parse("precheck_id", &request.precheck_id)?;
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
        let (items, next_page_token) = precheck::list_items(
            &self.state.store,
            id,
            verdict,
            request.page_size,
            token,
            None,
        )
        .await?;
        Ok(Response::new(v1::ListPrecheckItemsResponse {
            items,
            next_page_token,
        }))
    }

    async fn create_plan(
        &self,
        request: Request<v1::CreatePlanRequest>,
    ) -> Result<Response<v1::Plan>, Status> {
        self.keyed(
            "CreatePlan",
            request,
            move |this, actor, request| async move {
                let new_plan = plan::validate_create(request, actor)?;
                Ok(Response::new(
                    plan::create(&this.state.store, new_plan).await?,
                ))
            },
        )
        .await
    }

    async fn approve_plan(
        &self,
        request: Request<v1::ApprovePlanRequest>,
    ) -> Result<Response<v1::Plan>, Status> {
        self.keyed(
            "ApprovePlan",
            request,
            move |this, actor, request| async move {
                let plan_id = PlanId::parse("plan_id", &request.plan_id)?;
                Ok(Response::new(
                    plan::approve(
                        &this.state.store,
                        plan_id,
                        &request.digest,
                        &actor,
                        this.state.four_eyes,
                        this.state.max_precheck_age,
                        arrivals_override(&request)?,
                    )
                    .await?,
                ))
            },
        )
        .await
    }

    async fn get_plan(
        &self,
        request: Request<v1::GetPlanRequest>,
    ) -> Result<Response<v1::Plan>, Status> {
        let plan_id = PlanId::parse("plan_id", &request.into_inner().plan_id)?;
        Ok(Response::new(plan::get(&self.state.store, plan_id).await?))
    }

    async fn list_plans(
        &self,
        request: Request<v1::ListPlansRequest>,
    ) -> Result<Response<v1::ListPlansResponse>, Status> {
        let request = request.into_inner();
        let states = enum_names(&request.states, "states", "not a plan state", |value| {
            v1::PlanState::try_from(value)
                .ok()
                .filter(|state| *state != v1::PlanState::Unspecified)
                .map(v1::PlanState::name)
        })?;
        let kinds = enum_names(
            &request.kinds,
            "kinds",
            "not a plan kind (bulk or single)",
            |value| match v1::PlanKind::try_from(value) {
                Ok(v1::PlanKind::Bulk) => Some("bulk"),
                Ok(v1::PlanKind::Single) => Some("single"),
                _ => None,
            },
        )?;
        let (plans, next_page_token) = plan::list(
            &self.state.store,
            &states,
            &kinds,
            &request.page_token,
            request.page_size,
        )
        .await?;
        Ok(Response::new(v1::ListPlansResponse {
            plans,
            next_page_token,
        }))
    }

    async fn promote_plan(
        &self,
        request: Request<v1::PlanControlRequest>,
    ) -> Result<Response<v1::Plan>, Status> {
        self.control(request, plan::Control::Promote).await
    }

    async fn pause_plan(
        &self,
        request: Request<v1::PlanControlRequest>,
    ) -> Result<Response<v1::Plan>, Status> {
        self.control(request, plan::Control::Pause).await
    }

    async fn resume_plan(
        &self,
        request: Request<v1::PlanControlRequest>,
    ) -> Result<Response<v1::Plan>, Status> {
        self.control(request, plan::Control::Resume).await
    }

    async fn cancel_plan(
        &self,
        request: Request<v1::PlanControlRequest>,
    ) -> Result<Response<v1::Plan>, Status> {
        self.control(request, plan::Control::Cancel).await
    }

    async fn list_compensations(
        &self,
        request: Request<v1::ListCompensationsRequest>,
    ) -> Result<Response<v1::ListCompensationsResponse>, Status> {
        let request = request.into_inner();
        let plan_id = PlanId::parse("plan_id", &request.plan_id)?;
        let token = PageToken::parse(&request.page_token)?;
        let (items, next_page_token) =
            plan::compensations(&self.state.store, plan_id, request.page_size, token).await?;
        Ok(Response::new(v1::ListCompensationsResponse {
            items,
            next_page_token,
        }))
    }

    type WatchPlanStream = BoxStream<'static, Result<v1::WatchPlanResponse, Status>>;

    async fn watch_plan(
        &self,
        request: Request<v1::WatchPlanRequest>,
    ) -> Result<Response<Self::WatchPlanStream>, Status> {
        let permit = self
            .state
            .watches
            .open(crate::edge::admission::request_caller_key(&request))?;
        let request = request.into_inner();
        let plan_id = PlanId::parse("plan_id", &request.plan_id)?;
        let stream = self
            .state
            .hub
            .watch_plan(plan_id, request.include_events)
            .await?;
        // The permit lives as long as the stream: dropping the stream (the
        // client went away, or the watch ended) frees its place.
        let stream = stream.map(move |item| {
            let _held = &permit;
            item
        });
        Ok(Response::new(Box::pin(stream)))
    }

    async fn get_audit_report(
        &self,
        request: Request<v1::GetAuditReportRequest>,
    ) -> Result<Response<v1::AuditReport>, Status> {
        let plan_id = PlanId::parse("plan_id", &request.into_inner().plan_id)?;
        Ok(Response::new(
            audit::report(&self.state.store, plan_id).await?,
        ))
    }

    type ExportAuditStream = BoxStream<'static, Result<v1::ExportAuditChunk, Status>>;

    async fn export_audit(
        &self,
        request: Request<v1::ExportAuditRequest>,
    ) -> Result<Response<Self::ExportAuditStream>, Status> {
        let request = request.into_inner();
        let plan_id = PlanId::parse("plan_id", &request.plan_id)?;
        let format = v1::ExportFormat::try_from(request.format).unwrap_or_default();
        Ok(Response::new(
            audit::export(&self.state.store, plan_id, format).await?,
        ))
    }

    async fn replay_dead_letter(
        &self,
        request: Request<v1::ReplayDeadLetterRequest>,
    ) -> Result<Response<v1::ReplayDeadLetterResponse>, Status> {
        self.keyed(
            "ReplayDeadLetter",
            request,
            move |this, actor, request| async move {
                // Run detached: a caller that goes away does not leave the plan of one
                // half made (the wait then ends as it would have).
                let state = this.state.clone();
                let response =
                    tokio::spawn(async move { state.single().replay(&actor, request).await })
                        .await
                        .map_err(|error| {
                            Status::internal(format!("single replay task failed: {error}"))
                        })??;
                Ok(Response::new(response))
            },
        )
        .await
    }

    async fn repair_dead_letter(
        &self,
        request: Request<v1::RepairDeadLetterRequest>,
    ) -> Result<Response<v1::GetDeadLetterResponse>, Status> {
        self.keyed(
            "RepairDeadLetter",
            request,
            move |this, actor, request| async move {
                Ok(Response::new(
                    this.state.single().repair(&actor, request).await?,
                ))
            },
        )
        .await
    }

    async fn get_caller(
        &self,
        request: Request<v1::GetCallerRequest>,
    ) -> Result<Response<v1::Caller>, Status> {
        use crate::edge::roles::{Principal, Role};
        let (name, roles) = match Principal::of(&request) {
            Some(principal) => (
                principal.name.clone(),
                principal.roles.iter().map(ToString::to_string).collect(),
            ),
            None => (
                String::new(),
                Role::ALL.iter().map(ToString::to_string).collect(),
            ),
        };
        Ok(Response::new(v1::Caller {
            name,
            roles,
            authenticated: self.state.authenticated,
            four_eyes: self.state.four_eyes,
            max_precheck_age: Some(redrive_proto::time::duration(self.state.max_precheck_age)),
        }))
    }

    async fn list_sources(
        &self,
        _request: Request<v1::ListSourcesRequest>,
    ) -> Result<Response<v1::ListSourcesResponse>, Status> {
        Ok(Response::new(
            inspect::sources(&self.state.store, &self.state.capture).await?,
        ))
    }

    async fn preview_plan(
        &self,
        request: Request<v1::PreviewPlanRequest>,
    ) -> Result<Response<v1::PreviewPlanResponse>, Status> {
        let actor = actor(&request);
        let request = request.into_inner();
        let plan = plan::validate_create(request.plan.unwrap_or_default(), actor)?;
        Ok(Response::new(
            plan::preview::preview(&self.state.store, &plan, request.limit).await?,
        ))
    }

    async fn get_audit_checkpoint(
        &self,
        request: Request<v1::GetAuditCheckpointRequest>,
    ) -> Result<Response<v1::AuditCheckpoint>, Status> {
        let request = request.into_inner();
        Ok(Response::new(
            audit::log::checkpoint(&self.state.store, request.tree_size).await?,
        ))
    }

    async fn prove_audit_inclusion(
        &self,
        request: Request<v1::ProveAuditInclusionRequest>,
    ) -> Result<Response<v1::ProveAuditInclusionResponse>, Status> {
        let request = request.into_inner();
        Ok(Response::new(
            audit::log::prove_inclusion(&self.state.store, &request).await?,
        ))
    }

    async fn prove_audit_consistency(
        &self,
        request: Request<v1::ProveAuditConsistencyRequest>,
    ) -> Result<Response<v1::AuditConsistencyProof>, Status> {
        let request = request.into_inner();
        Ok(Response::new(
            audit::log::prove_consistency(&self.state.store, &request).await?,
        ))
    }

    type ExportAuditLogStream = BoxStream<'static, Result<v1::ExportAuditChunk, Status>>;

    async fn export_audit_log(
        &self,
        request: Request<v1::ExportAuditLogRequest>,
    ) -> Result<Response<Self::ExportAuditLogStream>, Status> {
        let request = request.into_inner();
        let format = v1::ExportFormat::try_from(request.format).unwrap_or_default();
        Ok(Response::new(
            audit::log::export(
                &self.state.store,
                &self.state.audit_log,
                format,
                request.tree_size,
            )
            .await?,
        ))
    }

    async fn list_audit_events(
        &self,
        request: Request<v1::ListAuditEventsRequest>,
    ) -> Result<Response<v1::ListAuditEventsResponse>, Status> {
        let request = request.into_inner();
        let plan_id = PlanId::parse("plan_id", &request.plan_id)?;
        let actions = enum_names(
            &request.actions,
            "actions",
            "not an audit action",
            |value| {
                v1::AuditAction::try_from(value)
                    .ok()
                    .filter(|action| *action != v1::AuditAction::Unspecified)
                    .map(v1::AuditAction::name)
            },
        )?;
        Ok(Response::new(
            audit::events(
                &self.state.store,
                plan_id,
                &actions,
                request.page_size,
                &request.page_token,
            )
            .await?,
        ))
    }
}

/// The reason of an approval's `override_arrivals` (`None` without one).
///
/// # Errors
/// `InvalidArgument` for `override_arrivals` without `override_reason`, or a
/// reason without the flag.
fn arrivals_override(request: &v1::ApprovePlanRequest) -> Result<Option<&str>, Status> {
    let reason = request.override_reason.trim();
    match (request.override_arrivals, reason.is_empty()) {
        (true, true) => Err(crate::error::Error::invalid(
            "override_reason",
            "required with override_arrivals: why the plan may run while such dead letters keep arriving",
        )
        .into()),
        (false, false) => Err(crate::error::Error::invalid(
            "override_reason",
            "given without override_arrivals: set both, or neither",
        )
        .into()),
        (true, false) => Ok(Some(reason)),
        (false, true) => Ok(None),
    }
}
