//! `redrivectl` end to end against an in-process fake planner on
//! `127.0.0.1:0`: what the operator sees (stdout, stderr, exit code) and what
//! the planner received.

use std::{
    collections::HashMap,
    net::SocketAddr,
    pin::Pin,
    process::{Command, Output, Stdio},
    sync::{Arc, Mutex},
};

use redrive_proto::v1::{
    self, IngestDeadLettersRequest, IngestRejection,
    planner_server::{Planner, PlannerServer},
};
use tokio_stream::{Stream, StreamExt, wrappers::TcpListenerStream};
use tonic::{Request, Response, Status, Streaming};

/// (method, `x-redrive-actor` metadata) of one call.
type ActorSeen = (&'static str, Option<String>);

/// What the fake planner received.
#[derive(Debug, Default, Clone)]
struct Fake {
    /// Every ingest call, as the list of items it streamed.
    calls: Arc<Mutex<Vec<Vec<IngestDeadLettersRequest>>>>,
    /// (method, `x-redrive-actor` metadata) of every unary call.
    actors: Arc<Mutex<Vec<ActorSeen>>>,
    /// Every RunPrecheck request.
    prechecks: Arc<Mutex<Vec<v1::RunPrecheckRequest>>>,
    /// Every ListPrecheckItems request.
    item_calls: Arc<Mutex<Vec<v1::ListPrecheckItemsRequest>>>,
    /// Every plan call but GetPlan, in order.
    plan_calls: Arc<Mutex<Vec<PlanCall>>>,
    /// GetPlan calls per plan id.
    polls: Arc<Mutex<HashMap<String, usize>>>,
    /// Lets the `plan-stalled` watch stream go on.
    resume: Arc<tokio::sync::Notify>,
}

/// A plan RPC the fake planner received (GetPlan is counted in `polls`).
#[derive(Debug, Clone, PartialEq)]
enum PlanCall {
    Create(v1::CreatePlanRequest),
    Approve(v1::ApprovePlanRequest),
    Control(&'static str, v1::PlanControlRequest),
    List(v1::ListPlansRequest),
    Compensations(v1::ListCompensationsRequest),
    Watch(v1::WatchPlanRequest),
    Report(v1::GetAuditReportRequest),
    Export(v1::ExportAuditRequest),
}

impl Fake {
    fn record<T>(&self, method: &'static str, request: &Request<T>) {
        let actor = request
            .metadata()
            .get("x-redrive-actor")
            .map(|value| value.to_str().unwrap().to_owned());
        self.actors.lock().unwrap().push((method, actor));
    }

    fn actors(&self) -> Vec<ActorSeen> {
        self.actors.lock().unwrap().clone()
    }

    fn plan_call(&self, call: PlanCall) {
        self.plan_calls.lock().unwrap().push(call);
    }

    fn plan_calls(&self) -> Vec<PlanCall> {
        self.plan_calls.lock().unwrap().clone()
    }

    fn polls(&self, plan_id: &str) -> usize {
        self.polls
            .lock()
            .unwrap()
            .get(plan_id)
            .copied()
            .unwrap_or(0)
    }
}

fn actor_of<T>(request: &Request<T>) -> String {
    request
        .metadata()
        .get("x-redrive-actor")
        .map_or("anonymous", |value| value.to_str().unwrap())
        .to_owned()
}

const DIGEST: &str = "9f86d081";

/// A plan of 7 items, `done` of them sent.
fn plan(plan_id: &str, state: v1::PlanState, done: u64) -> v1::Plan {
    v1::Plan {
        plan_id: plan_id.into(),
        precheck_id: PRECHECK_ID.into(),
        precheck_digest: DIGEST.into(),
        state: state.into(),
        rate: Some(v1::Rate {
            per_second: 50.0,
            burst: 10,
            rationale: "payments-api sustains 300/s".into(),
        }),
        destination: Some(v1::Destination {
            mode: Some(v1::destination::Mode::Queue(v1::QueueDestination {})),
        }),
        slice_size: 100,
        canary_fraction: 0.01,
        observe_for: Some(prost_types::Duration {
            seconds: 900,
            nanos: 0,
        }),
        total_items: 7,
        canary_items: 1,
        items_done: done,
        slices_total: 1,
        slices_completed: u64::from(done == 7),
        counts: Some(v1::ActionCounts {
            sent: done,
            ..Default::default()
        }),
        created_by: "alice".into(),
        created_at: Some(prost_types::Timestamp {
            seconds: 1_714_564_800,
            nanos: 0,
        }),
        ..Default::default()
    }
}

/// What GetPlan answers for `plan_id` on its `poll`-th call (1-based).
fn scripted_plan(plan_id: &str, poll: usize) -> Result<v1::Plan, Status> {
    use v1::PlanState::{Aborted, Canary, Cancelled, Completed, Main, Paused};
    let with_reason = |mut plan: v1::Plan, reason: &str| {
        plan.state_reason = reason.into();
        plan
    };
    Ok(match plan_id {
        "plan-done" if poll <= 2 => plan(plan_id, Main, 3),
        "plan-done" => plan(plan_id, Completed, 7),
        "plan-cancelled" if poll == 1 => plan(plan_id, Canary, 1),
        "plan-cancelled" => with_reason(plan(plan_id, Cancelled, 1), "wrong selection"),
        "plan-aborted" => with_reason(plan(plan_id, Aborted, 1), "canary gate: 1 failed"),
        "plan-paused" if poll <= 2 => with_reason(plan(plan_id, Paused, 3), "main gate"),
        "plan-paused" => plan(plan_id, Completed, 7),
        "plan-flaky" if poll == 1 => return Err(Status::unavailable("planner restarting")),
        "plan-flaky" => plan(plan_id, Completed, 7),
        "plan-slow" | "plan-cut" => plan(plan_id, Main, 3),
        _ => return Err(Status::not_found(format!("plan {plan_id} not found"))),
    })
}

fn event(action: v1::AuditAction, key: &str, reason: &str, wave: v1::Wave) -> v1::AuditEvent {
    v1::AuditEvent {
        plan_id: "plan-done".into(),
        slice_id: "slice-1".into(),
        dead_letter_id: "41".into(),
        message_key: key.into(),
        action: action.into(),
        reason: reason.into(),
        wave: wave.into(),
        executor_id: "executor-1".into(),
        attempt: 1,
        confirm_latency_us: 900,
        at: Some(prost_types::Timestamp {
            seconds: 1_714_565_000,
            nanos: 0,
        }),
    }
}

/// The CSV export of `plan-done`, cut mid-line and mid-field, with a byte
/// that is not UTF-8: redrivectl must pass it through as is.
const CSV_CHUNKS: [&[u8]; 4] = [
    b"plan_id,message_key,action,reason\r\nplan-done,order-1:pay,sent,\r\n",
    b"plan-done,\"key,2\",skipped_",
    b"stale,\"older than \"\"2h\"\"\"\r\n",
    b"plan-done,bin-\xff\xfe,failed,nack\r\n",
];

const PRECHECK_ID: &str = "0190f3a2-7c1e-7b3a-9d4e-2f6a8b1c0d5e";

/// A report with some verdicts zero, as the planner sends it.
fn report(actor: &str) -> v1::PrecheckReport {
    let at = |seconds| Some(prost_types::Timestamp { seconds, nanos: 0 });
    let counts = v1::VerdictCounts {
        replayable: 7,
        duplicate: 1,
        blocked_by_state: 2,
        ..Default::default()
    };
    v1::PrecheckReport {
        precheck_id: PRECHECK_ID.into(),
        actor: actor.into(),
        created_at: at(1_714_564_800),
        total: 10,
        counts: Some(counts),
        by_destination: vec![v1::Breakdown {
            value: "payments".into(),
            total: 10,
            counts: Some(counts),
        }],
        died_from: at(1_714_557_600),
        died_to: at(1_714_563_000),
        warnings: vec!["state check hooks blocked 2 of the 3 messages they checked".into()],
        digest: "9f86d081".into(),
        sample_blocked: vec![v1::PrecheckItem {
            dead_letter_id: "41".into(),
            message_key: "order-9:capture".into(),
            verdict: v1::Verdict::BlockedByState.into(),
            reason: "order 9 is cancelled".into(),
            destination: "payments".into(),
            event_type: Some("payment.captured".into()),
            at_send: false,
        }],
        ..Default::default()
    }
}

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

#[tonic::async_trait]
impl Planner for Fake {
    /// Rejects items whose message id starts with `bad`, counts those starting
    /// with `dup` as already stored, fails the call on `boom`.
    async fn ingest_dead_letters(
        &self,
        request: Request<Streaming<IngestDeadLettersRequest>>,
    ) -> Result<Response<v1::IngestDeadLettersResponse>, Status> {
        let mut stream = request.into_inner();
        let mut items = Vec::new();
        let mut answer = v1::IngestDeadLettersResponse::default();
        while let Some(item) = stream.next().await {
            let item = item?;
            if item.message_id == "boom" {
                return Err(Status::failed_precondition("boom"));
            }
            if item.message_id.starts_with("bad") {
                answer.rejected.push(IngestRejection {
                    index: items.len() as u64,
                    reason: format!("refused {}", item.message_id),
                });
            } else if item.message_id.starts_with("dup") {
                answer.duplicates += 1;
            } else {
                answer.accepted += 1;
            }
            items.push(item);
        }
        self.calls.lock().unwrap().push(items);
        Ok(Response::new(answer))
    }

    /// Two pages of one dead letter each.
    async fn list_dead_letters(
        &self,
        request: Request<v1::ListDeadLettersRequest>,
    ) -> Result<Response<v1::ListDeadLettersResponse>, Status> {
        self.record("list_dead_letters", &request);
        let token = request.into_inner().page_token;
        let (id, next) = if token.is_empty() {
            ("1", "p2")
        } else {
            ("2", "")
        };
        Ok(Response::new(v1::ListDeadLettersResponse {
            dead_letters: vec![v1::DeadLetter {
                id: id.into(),
                source: "orders.dlq".into(),
                ..Default::default()
            }],
            next_page_token: next.into(),
        }))
    }

    async fn get_dead_letter(
        &self,
        request: Request<v1::GetDeadLetterRequest>,
    ) -> Result<Response<v1::GetDeadLetterResponse>, Status> {
        Err(Status::not_found(format!(
            "dead letter {} not found",
            request.into_inner().id
        )))
    }

    async fn summarize_dead_letters(
        &self,
        _: Request<v1::SummarizeDeadLettersRequest>,
    ) -> Result<Response<v1::SummarizeDeadLettersResponse>, Status> {
        Err(Status::unimplemented("summarize_dead_letters"))
    }

    /// The [`report`], echoing the actor; `unavailable` like a planner whose
    /// state-check hook is down when the source is `hook-down` and the
    /// precheck does not block on hook errors.
    async fn run_precheck(
        &self,
        request: Request<v1::RunPrecheckRequest>,
    ) -> Result<Response<v1::PrecheckReport>, Status> {
        self.record("run_precheck", &request);
        let actor = request
            .metadata()
            .get("x-redrive-actor")
            .map_or("anonymous", |value| value.to_str().unwrap())
            .to_owned();
        let request = request.into_inner();
        self.prechecks.lock().unwrap().push(request.clone());
        let selector = request.selector.unwrap_or_default();
        let options = request.options.unwrap_or_default();
        if selector.sources.iter().any(|source| source == "hook-down")
            && !options.block_on_state_check_error
        {
            return Err(Status::unavailable(
                "state check hook http://127.0.0.1:9 for payment.*: connection refused; the \
                 precheck is not complete. Fix the hook, or run the precheck with \
                 block_on_state_check_error to mark its messages blocked_by_state",
            ));
        }
        Ok(Response::new(report(&actor)))
    }

    async fn get_precheck(
        &self,
        request: Request<v1::GetPrecheckRequest>,
    ) -> Result<Response<v1::PrecheckReport>, Status> {
        self.record("get_precheck", &request);
        let id = request.into_inner().precheck_id;
        if id == PRECHECK_ID {
            Ok(Response::new(report("carol")))
        } else {
            Err(Status::not_found(format!("precheck {id} not found")))
        }
    }

    /// Two pages: items 41 and 42, then 43.
    async fn list_precheck_items(
        &self,
        request: Request<v1::ListPrecheckItemsRequest>,
    ) -> Result<Response<v1::ListPrecheckItemsResponse>, Status> {
        self.record("list_precheck_items", &request);
        let request = request.into_inner();
        self.item_calls.lock().unwrap().push(request.clone());
        let verdict = match request.verdict() {
            v1::Verdict::Unspecified => v1::Verdict::BlockedByState,
            verdict => verdict,
        };
        let item = |id: &str, event_type: Option<&str>| v1::PrecheckItem {
            dead_letter_id: id.into(),
            message_key: format!("key-{id}"),
            verdict: verdict.into(),
            reason: format!("reason {id}"),
            destination: "payments".into(),
            event_type: event_type.map(Into::into),
            at_send: false,
        };
        let (items, next) = if request.page_token.is_empty() {
            (
                vec![item("41", Some("payment.captured")), item("42", None)],
                "p2",
            )
        } else {
            (vec![item("43", Some("payment.refunded"))], "")
        };
        Ok(Response::new(v1::ListPrecheckItemsResponse {
            items,
            next_page_token: next.into(),
        }))
    }

    /// An `awaiting_approval` plan echoing the request; `not_found` for
    /// another precheck than [`PRECHECK_ID`].
    async fn create_plan(
        &self,
        request: Request<v1::CreatePlanRequest>,
    ) -> Result<Response<v1::Plan>, Status> {
        self.record("create_plan", &request);
        let actor = actor_of(&request);
        let request = request.into_inner();
        self.plan_call(PlanCall::Create(request.clone()));
        if request.precheck_id != PRECHECK_ID {
            return Err(Status::not_found(format!(
                "precheck {} not found",
                request.precheck_id
            )));
        }
        let mut created = plan("plan-new", v1::PlanState::AwaitingApproval, 0);
        created.rate = request.rate;
        created.destination = request.destination;
        created.slice_size = match request.slice_size {
            0 => 100,
            size => size,
        };
        created.canary_fraction = request.canary_fraction.unwrap_or(0.01);
        if request.observe_for.is_some() {
            created.observe_for = request.observe_for;
        }
        created.created_by = actor;
        created.warnings = vec!["2 of 9 items are not replayable and stay out".into()];
        Ok(Response::new(created))
    }

    /// A `canary` plan for the right digest, `failed_precondition` otherwise.
    async fn approve_plan(
        &self,
        request: Request<v1::ApprovePlanRequest>,
    ) -> Result<Response<v1::Plan>, Status> {
        self.record("approve_plan", &request);
        let actor = actor_of(&request);
        let request = request.into_inner();
        self.plan_call(PlanCall::Approve(request.clone()));
        if request.digest != DIGEST {
            return Err(Status::failed_precondition(format!(
                "digest {} is not the precheck's digest {DIGEST}",
                request.digest
            )));
        }
        let mut approved = plan(&request.plan_id, v1::PlanState::Canary, 0);
        approved.approved_by = actor;
        Ok(Response::new(approved))
    }

    /// [`scripted_plan`], counting the calls per plan.
    async fn get_plan(
        &self,
        request: Request<v1::GetPlanRequest>,
    ) -> Result<Response<v1::Plan>, Status> {
        let plan_id = request.into_inner().plan_id;
        let poll = {
            let mut polls = self.polls.lock().unwrap();
            let poll = polls.entry(plan_id.clone()).or_default();
            *poll += 1;
            *poll
        };
        scripted_plan(&plan_id, poll).map(Response::new)
    }

    /// Two pages: plan-done, then plan-cancelled.
    async fn list_plans(
        &self,
        request: Request<v1::ListPlansRequest>,
    ) -> Result<Response<v1::ListPlansResponse>, Status> {
        let request = request.into_inner();
        self.plan_call(PlanCall::List(request.clone()));
        let (plans, next) = if request.page_token.is_empty() {
            (vec![plan("plan-done", v1::PlanState::Main, 3)], "p2")
        } else {
            (
                vec![plan("plan-cancelled", v1::PlanState::Cancelled, 1)],
                "",
            )
        };
        Ok(Response::new(v1::ListPlansResponse {
            plans,
            next_page_token: next.into(),
        }))
    }

    async fn promote_plan(
        &self,
        request: Request<v1::PlanControlRequest>,
    ) -> Result<Response<v1::Plan>, Status> {
        self.control("promote", v1::PlanState::Main, request)
    }

    async fn pause_plan(
        &self,
        request: Request<v1::PlanControlRequest>,
    ) -> Result<Response<v1::Plan>, Status> {
        self.control("pause", v1::PlanState::Paused, request)
    }

    async fn resume_plan(
        &self,
        request: Request<v1::PlanControlRequest>,
    ) -> Result<Response<v1::Plan>, Status> {
        self.control("resume", v1::PlanState::Main, request)
    }

    async fn cancel_plan(
        &self,
        request: Request<v1::PlanControlRequest>,
    ) -> Result<Response<v1::Plan>, Status> {
        self.control("cancel", v1::PlanState::Cancelled, request)
    }

    /// Two pages: items 51 and 52, then 53.
    async fn list_compensations(
        &self,
        request: Request<v1::ListCompensationsRequest>,
    ) -> Result<Response<v1::ListCompensationsResponse>, Status> {
        let request = request.into_inner();
        self.plan_call(PlanCall::Compensations(request.clone()));
        let item = |id: &str| v1::PrecheckItem {
            dead_letter_id: id.into(),
            message_key: format!("order-{id}:refund"),
            verdict: v1::Verdict::NeedsCompensation.into(),
            reason: format!("refund {id} already issued by hand"),
            destination: "payments".into(),
            event_type: Some("payment.refunded".into()),
            at_send: false,
        };
        let (items, next) = if request.page_token.is_empty() {
            (vec![item("51"), item("52")], "c2")
        } else {
            (vec![item("53")], "")
        };
        Ok(Response::new(v1::ListCompensationsResponse {
            items,
            next_page_token: next.into(),
        }))
    }

    /// plan-done: 6 sent, 1 skipped as stale.
    async fn get_audit_report(
        &self,
        request: Request<v1::GetAuditReportRequest>,
    ) -> Result<Response<v1::AuditReport>, Status> {
        let request = request.into_inner();
        self.plan_call(PlanCall::Report(request.clone()));
        let mut done = scripted_plan(&request.plan_id, usize::MAX)?;
        let counts = v1::ActionCounts {
            sent: 6,
            skipped_stale: 1,
            ..Default::default()
        };
        done.counts = Some(counts);
        Ok(Response::new(v1::AuditReport {
            plan: Some(done),
            counts: Some(counts),
            sent_keys: (1..=6).map(|n| format!("order-{n}:pay")).collect(),
            not_sent: vec![event(
                v1::AuditAction::SkippedStale,
                "order-7:pay",
                "older than 2h",
                v1::Wave::Main,
            )],
            possibly_duplicated_keys: vec![],
        }))
    }
    async fn replay_dead_letter(
        &self,
        _: Request<v1::ReplayDeadLetterRequest>,
    ) -> Result<Response<v1::ReplayDeadLetterResponse>, Status> {
        Err(Status::unimplemented("replay_dead_letter"))
    }

    async fn repair_dead_letter(
        &self,
        _: Request<v1::RepairDeadLetterRequest>,
    ) -> Result<Response<v1::GetDeadLetterResponse>, Status> {
        Err(Status::unimplemented("repair_dead_letter"))
    }

    /// plan-done: canary, main and completed snapshots (with an event after
    /// each of the first two when asked); plan-cut: one `main` snapshot, then
    /// the stream ends though the plan is not final; plan-stalled: `main`
    /// 3/7 (approved 90 s ago), then nothing until `resume` is notified, then
    /// 4/7 and completed; plan-observing: observing with 10 minutes left,
    /// then completed.
    async fn watch_plan(
        &self,
        request: Request<v1::WatchPlanRequest>,
    ) -> Result<Response<Self::WatchPlanStream>, Status> {
        use v1::watch_plan_response::Update;
        let request = request.into_inner();
        self.plan_call(PlanCall::Watch(request.clone()));
        let progress = |state, done| Update::Progress(plan(&request.plan_id, state, done));
        let updates = match request.plan_id.as_str() {
            "plan-done" => {
                let mut updates = vec![progress(v1::PlanState::Canary, 1)];
                if request.include_events {
                    updates.push(Update::Event(event(
                        v1::AuditAction::Sent,
                        "order-1:pay",
                        "",
                        v1::Wave::Canary,
                    )));
                }
                updates.push(progress(v1::PlanState::Main, 4));
                if request.include_events {
                    updates.push(Update::Event(event(
                        v1::AuditAction::SkippedStale,
                        "order-7:pay",
                        "older than 2h",
                        v1::Wave::Main,
                    )));
                }
                updates.push(progress(v1::PlanState::Completed, 7));
                updates
            }
            "plan-cut" => vec![progress(v1::PlanState::Main, 3)],
            "plan-stalled" => return Ok(Response::new(self.stalled_stream(&request.plan_id))),
            "plan-observing" => {
                let mut observing = plan(&request.plan_id, v1::PlanState::Observing, 1);
                observing.observing_until = Some(timestamp_in(600));
                vec![
                    Update::Progress(observing),
                    progress(v1::PlanState::Completed, 7),
                ]
            }
            other => return Err(Status::not_found(format!("plan {other} not found"))),
        };
        let stream = tokio_stream::iter(updates.into_iter().map(|update| {
            Ok(v1::WatchPlanResponse {
                update: Some(update),
            })
        }));
        Ok(Response::new(Box::pin(stream)))
    }

    /// [`CSV_CHUNKS`], or two JSON lines in two chunks.
    async fn export_audit(
        &self,
        request: Request<v1::ExportAuditRequest>,
    ) -> Result<Response<Self::ExportAuditStream>, Status> {
        let request = request.into_inner();
        self.plan_call(PlanCall::Export(request.clone()));
        let chunks: Vec<Vec<u8>> = match request.format() {
            v1::ExportFormat::Csv => CSV_CHUNKS.iter().map(|chunk| chunk.to_vec()).collect(),
            v1::ExportFormat::Jsonl => vec![
                b"{\"message_key\":\"order-1:pay\",\"action\":\"sent\"}\n{\"mess".to_vec(),
                b"age_key\":\"order-7:pay\",\"action\":\"skipped_stale\"}\n".to_vec(),
            ],
            v1::ExportFormat::Unspecified => {
                return Err(Status::invalid_argument("export format unspecified"));
            }
        };
        let stream = tokio_stream::iter(
            chunks
                .into_iter()
                .map(|data| Ok(v1::ExportAuditChunk { data })),
        );
        Ok(Response::new(Box::pin(stream)))
    }

    type WatchPlanStream = BoxStream<v1::WatchPlanResponse>;
    type ExportAuditStream = BoxStream<v1::ExportAuditChunk>;
}

/// The wall clock `seconds` from now (negative: ago).
fn timestamp_in(seconds: i64) -> prost_types::Timestamp {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    prost_types::Timestamp {
        seconds: i64::try_from(now.as_secs()).unwrap() + seconds,
        nanos: 0,
    }
}

impl Fake {
    /// The `plan-stalled` watch stream: `main` 3/7, a stall until `resume`
    /// is notified, then 4/7 and completed (all approved 90 s ago).
    fn stalled_stream(&self, plan_id: &str) -> BoxStream<v1::WatchPlanResponse> {
        use v1::watch_plan_response::Update;
        let approved = |state, done| {
            let mut plan = plan(plan_id, state, done);
            plan.approved_at = Some(timestamp_in(-90));
            Ok(v1::WatchPlanResponse {
                update: Some(Update::Progress(plan)),
            })
        };
        let (first, then, last) = (
            approved(v1::PlanState::Main, 3),
            approved(v1::PlanState::Main, 4),
            approved(v1::PlanState::Completed, 7),
        );
        let (sender, receiver) = tokio::sync::mpsc::channel(4);
        let resume = self.resume.clone();
        tokio::spawn(async move {
            sender.send(first).await.ok()?;
            resume.notified().await;
            sender.send(then).await.ok()?;
            sender.send(last).await.ok()
        });
        Box::pin(tokio_stream::wrappers::ReceiverStream::new(receiver))
    }

    /// A control RPC: records it and answers the plan in `state` with the
    /// operator action.
    #[allow(clippy::result_large_err)]
    fn control(
        &self,
        method: &'static str,
        state: v1::PlanState,
        request: Request<v1::PlanControlRequest>,
    ) -> Result<Response<v1::Plan>, Status> {
        self.record(method, &request);
        let actor = actor_of(&request);
        let request = request.into_inner();
        self.plan_call(PlanCall::Control(method, request.clone()));
        let mut answer = plan(&request.plan_id, state, 3);
        if matches!(state, v1::PlanState::Paused | v1::PlanState::Cancelled) {
            answer.state_reason = request.reason.clone();
        }
        answer.actions.push(v1::OperatorAction {
            action: method.into(),
            actor,
            reason: request.reason,
            at: Some(prost_types::Timestamp {
                seconds: 1_714_565_400,
                nanos: 0,
            }),
        });
        Ok(Response::new(answer))
    }
}

async fn serve(fake: Fake) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(PlannerServer::new(fake))
            .serve_with_incoming(TcpListenerStream::new(listener)),
    );
    address
}

/// Runs `redrivectl` with `args` against `address`, `stdin` on its stdin;
/// `USER` is `tester` and `REDRIVE_ACTOR` unset.
async fn redrivectl(address: SocketAddr, args: &[&str], stdin: &str) -> Output {
    redrivectl_with_env(address, args, stdin, &[("USER", Some("tester"))]).await
}

/// [`redrivectl`] with environment variables set (`Some`) or removed (`None`).
async fn redrivectl_with_env(
    address: SocketAddr,
    args: &[&str],
    stdin: &str,
    env: &[(&str, Option<&str>)],
) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_redrivectl"));
    command
        .args(args)
        .env("REDRIVE_PLANNER", format!("http://{address}"))
        .env_remove("REDRIVE_JSON")
        .env_remove("REDRIVE_ACTOR");
    for (name, value) in env {
        match value {
            Some(value) => command.env(name, value),
            None => command.env_remove(name),
        };
    }
    command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let stdin = stdin.to_owned();
    tokio::task::spawn_blocking(move || {
        let mut child = command.spawn().unwrap();
        let mut input = child.stdin.take().unwrap();
        std::io::Write::write_all(&mut input, stdin.as_bytes()).unwrap();
        drop(input);
        child.wait_with_output().unwrap()
    })
    .await
    .unwrap()
}

fn line(message_id: &str) -> String {
    format!(r#"{{"message_id":"{message_id}","body":"b","original_destination":"orders"}}"#)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn import_maps_rejections_back_to_file_lines_across_batches() {
    let fake = Fake::default();
    let address = serve(fake.clone()).await;
    let file = [
        line("m-1"),           // 1
        "not json".to_owned(), // 2: refused by redrivectl
        line("dup-1"),         // 3
        String::new(),         // 4: blank, skipped
        line("bad-1"),         // 5: refused by the planner (batch 2, index 0)
        line("m-2"),           // 6
        line("bad-2"),         // 7: refused by the planner (batch 3, index 0)
    ]
    .join("\n");

    let output = redrivectl(
        address,
        &[
            "import", "-", "--source", "export", "--batch", "2", "--json",
        ],
        &file,
    )
    .await;
    let stdout = String::from_utf8(output.stdout).unwrap();
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert_eq!(output.status.code(), Some(65), "{stdout}\n{stderr}");
    let report: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(
        report,
        serde_json::json!({
            "imported": 2,
            "duplicates": 1,
            "rejected": [
                {"line": 2, "reason": "not valid JSON: expected ident at line 1 column 2"},
                {"line": 5, "reason": "refused bad-1"},
                {"line": 7, "reason": "refused bad-2"},
            ],
        })
    );
    for expected in [
        "line 2: not valid JSON",
        "line 5: refused bad-1",
        "line 7: refused bad-2",
    ] {
        assert!(stderr.contains(expected), "{expected}: {stderr}");
    }

    let calls = fake.calls.lock().unwrap().clone();
    let ids: Vec<Vec<&str>> = calls
        .iter()
        .map(|call| call.iter().map(|item| item.message_id.as_str()).collect())
        .collect();
    assert_eq!(
        ids,
        [vec!["m-1", "dup-1"], vec!["bad-1", "m-2"], vec!["bad-2"]]
    );
    assert!(
        calls
            .iter()
            .flatten()
            .all(|item| item.imported && item.source == "export")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_import_exits_zero_with_a_summary_line() {
    let address = serve(Fake::default()).await;
    let output = redrivectl(address, &["import", "-", "--source", "s"], &line("m-1")).await;
    assert_eq!(output.status.code(), Some(0));
    assert_eq!(
        String::from_utf8(output.stdout).unwrap(),
        "imported 1, already present 0, rejected 0\n"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_all_follows_page_tokens() {
    let address = serve(Fake::default()).await;
    let output = redrivectl(address, &["dead-letters", "list", "--all", "--json"], "").await;
    assert_eq!(output.status.code(), Some(0));
    let listed: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let ids: Vec<&str> = listed["dead_letters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|dead_letter| dead_letter["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["1", "2"]);
    assert_eq!(listed["next_page_token"], "");

    let output = redrivectl(address, &["dead-letters", "list"], "").await;
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert!(stdout.ends_with("next page token: p2\n"), "{stdout}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_errors_print_code_and_message() {
    let address = serve(Fake::default()).await;
    let output = redrivectl(address, &["dead-letters", "show", "42"], "").await;
    assert_eq!(output.status.code(), Some(65));
    assert_eq!(
        String::from_utf8(output.stderr).unwrap(),
        "redrivectl: not_found: dead letter 42 not found\n"
    );
    let output = redrivectl(address, &["dead-letters", "summary"], "").await;
    assert_eq!(output.status.code(), Some(1));
    assert_eq!(
        String::from_utf8(output.stderr).unwrap(),
        "redrivectl: unimplemented: summarize_dead_letters\n"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_call_stops_the_import_and_says_how_far_it_got() {
    let fake = Fake::default();
    let address = serve(fake.clone()).await;
    let mut lines: Vec<String> = (0..5).map(|n| line(&format!("m-{n}"))).collect();
    lines.push(line("boom"));
    lines.extend((5..500).map(|n| line(&format!("m-{n}"))));
    let output = redrivectl(
        address,
        &["import", "-", "--source", "s", "--batch", "3"],
        &lines.join("\n"),
    )
    .await;
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert_eq!(
        stderr,
        "redrivectl: import stopped after line 3 (imported 3, already present 0, rejected 0); \
         importing the file again is safe\nredrivectl: failed_precondition: boom\n"
    );
    assert_eq!(fake.calls.lock().unwrap().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn precheck_sends_the_flags_and_the_actor_and_prints_stable_json() {
    let fake = Fake::default();
    let address = serve(fake.clone()).await;
    let output = redrivectl(
        address,
        &[
            "precheck",
            "--source",
            "payments.dlq",
            "--source",
            "refunds.dlq",
            "--reason",
            "rejected",
            "--event-type",
            "payment.captured",
            "--from",
            "2024-05-01T10:00:00Z",
            "--to",
            "2024-05-01T12:00:00Z",
            "--stale-after",
            "payment.*=2h",
            "--stale-after",
            "payment.captured=30m",
            "--default-stale-after",
            "1day",
            "--replay-key-window",
            "3days",
            "--max-redrives",
            "5",
            "--state-check-batch",
            "250",
            "--state-check-timeout",
            "4s",
            "--block-on-state-check-error",
            "--event-time-pointer",
            "/meta/occurred_at",
            "--actor",
            "alice",
            "--json",
        ],
        "",
    )
    .await;
    let stdout = String::from_utf8(output.stdout).unwrap();
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert_eq!(output.status.code(), Some(0), "{stdout}\n{stderr}");

    let seconds = |seconds| Some(prost_types::Duration { seconds, nanos: 0 });
    let requests = fake.prechecks.lock().unwrap().clone();
    assert_eq!(
        requests,
        [v1::RunPrecheckRequest {
            selector: Some(v1::Selector {
                sources: vec!["payments.dlq".into(), "refunds.dlq".into()],
                reasons: vec!["rejected".into()],
                event_types: vec!["payment.captured".into()],
                died_from: Some(prost_types::Timestamp {
                    seconds: 1_714_557_600,
                    nanos: 0,
                }),
                died_to: Some(prost_types::Timestamp {
                    seconds: 1_714_564_800,
                    nanos: 0,
                }),
                ..Default::default()
            }),
            options: Some(v1::PrecheckOptions {
                stale_after: [
                    ("payment.*".to_owned(), seconds(7200).unwrap()),
                    ("payment.captured".to_owned(), seconds(1800).unwrap()),
                ]
                .into_iter()
                .collect(),
                default_stale_after: seconds(86_400),
                replay_key_window: seconds(3 * 86_400),
                max_redrives: 5,
                state_check_batch_size: 250,
                state_check_timeout: seconds(4),
                block_on_state_check_error: true,
                event_time_pointer: "/meta/occurred_at".into(),
                ..Default::default()
            }),
        }]
    );
    assert_eq!(fake.actors(), [("run_precheck", Some("alice".to_owned()))]);

    let report: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let counts = serde_json::json!({
        "replayable": 7, "duplicate": 1, "already_replayed": 0, "looping": 0, "stale": 0,
        "blocked_by_state": 2, "needs_compensation": 0, "invalid": 0,
    });
    assert_eq!(
        report,
        serde_json::json!({
            "precheck_id": PRECHECK_ID,
            "actor": "alice",
            "created_at": "2024-05-01T12:00:00Z",
            "digest": "9f86d081",
            "total": 10,
            "options": {
                "stale_after_seconds": {},
                "stale_after_source_seconds": {},
                "default_stale_after_seconds": null,
                "replay_key_window_seconds": null,
                "max_redrives": 0,
                "event_time_pointer": null,
                "override_policy": false,
                "override_reason": null,
            },
            "counts": counts,
            "breakdowns": {
                "reason_class": [],
                "destination": [{"value": "payments", "total": 10, "counts": counts}],
                "event_type": [],
                "schema_version": [],
                "producer": [],
            },
            "died_from": "2024-05-01T10:00:00Z",
            "died_to": "2024-05-01T11:30:00Z",
            "warnings": ["state check hooks blocked 2 of the 3 messages they checked"],
            "sample_blocked": [{
                "dead_letter_id": "41",
                "message_key": "order-9:capture",
                "verdict": "blocked_by_state",
                "reason": "order 9 is cancelled",
                "destination": "payments",
                "event_type": "payment.captured",
                "at_send": false,
            }],
        })
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn precheck_prints_a_report_people_can_read() {
    let fake = Fake::default();
    let address = serve(fake.clone()).await;
    let output = redrivectl(address, &["precheck", "--source", "payments.dlq"], "").await;
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert_eq!(output.status.code(), Some(0), "{stdout}");
    for expected in [
        &format!("precheck id:  {PRECHECK_ID}")[..],
        "actor:        tester",
        "digest:       9f86d081",
        "total:        10",
        "died:         2024-05-01T10:00:00Z .. 2024-05-01T11:30:00Z",
        "\nreplayable          7\n",
        "\nneeds_compensation  0\n",
        "by destination:",
        "VALUE     TOTAL  REPLAYABLE  DUPLICATE  BLOCKED_BY_STATE",
        "WARNING: state check hooks blocked 2 of the 3 messages they checked",
        "first non-replayable items (1 of 3):",
        "41              order-9:capture  blocked_by_state  order 9 is cancelled",
    ] {
        assert!(stdout.contains(expected), "{expected:?} in:\n{stdout}");
    }
    assert!(
        stdout.ends_with(&format!(
            "\nnext: redrivectl precheck items {PRECHECK_ID} --verdict blocked_by_state\n"
        )),
        "{stdout}"
    );
    // Options left unset go out unset: the planner applies its defaults.
    let requests = fake.prechecks.lock().unwrap().clone();
    assert_eq!(requests[0].options, Some(v1::PrecheckOptions::default()));

    // `show` prints the same report.
    let shown = redrivectl(address, &["precheck", "show", PRECHECK_ID], "").await;
    let shown = String::from_utf8(shown.stdout).unwrap();
    assert_eq!(
        shown,
        stdout.replace("actor:        tester", "actor:        carol")
    );
    let output = redrivectl(address, &["precheck", "--json", "show", PRECHECK_ID], "").await;
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(report["actor"], "carol");
    assert_eq!(report["counts"]["looping"], 0);
    let output = redrivectl(address, &["precheck", "show", "nope"], "").await;
    assert_eq!(output.status.code(), Some(65));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_actor_defaults_to_user_then_anonymous_on_every_request() {
    let fake = Fake::default();
    let address = serve(fake.clone()).await;
    let run = ["precheck", "--source", "q", "--json"];
    for env in [
        &[("USER", Some("bob"))][..],
        &[("USER", Some("bob")), ("REDRIVE_ACTOR", Some("deploy-bot"))],
        &[("USER", None)],
        &[("USER", Some("")), ("REDRIVE_ACTOR", Some(""))],
    ] {
        let output = redrivectl_with_env(address, &run, "", env).await;
        assert_eq!(output.status.code(), Some(0), "{env:?}");
    }
    let output = redrivectl_with_env(
        address,
        &["dead-letters", "list"],
        "",
        &[("REDRIVE_ACTOR", Some("carol"))],
    )
    .await;
    assert_eq!(output.status.code(), Some(0));
    let actor = |name: &str| Some(name.to_owned());
    assert_eq!(
        fake.actors(),
        [
            ("run_precheck", actor("bob")),
            ("run_precheck", actor("deploy-bot")),
            ("run_precheck", actor("anonymous")),
            ("run_precheck", actor("anonymous")),
            ("list_dead_letters", actor("carol")),
        ]
    );

    // A name that cannot travel as metadata is refused before any call.
    let output = redrivectl_with_env(address, &run, "", &[("USER", Some("jos\u{e9}"))]).await;
    assert_eq!(output.status.code(), Some(64));
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(stderr.contains("set --actor or REDRIVE_ACTOR"), "{stderr}");
    assert_eq!(fake.actors().len(), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn precheck_items_follow_pages_with_the_verdict() {
    let fake = Fake::default();
    let address = serve(fake.clone()).await;
    let output = redrivectl(
        address,
        &[
            "precheck",
            "items",
            PRECHECK_ID,
            "--verdict",
            "stale",
            "--page-size",
            "2",
            "--all",
            "--json",
            "--actor",
            "dana",
        ],
        "",
    )
    .await;
    assert_eq!(output.status.code(), Some(0));
    let listed: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(
        listed,
        serde_json::json!({
            "items": [
                {"dead_letter_id": "41", "message_key": "key-41", "verdict": "stale",
                 "reason": "reason 41", "destination": "payments", "event_type": "payment.captured", "at_send": false},
                {"dead_letter_id": "42", "message_key": "key-42", "verdict": "stale",
                 "reason": "reason 42", "destination": "payments", "event_type": null, "at_send": false},
                {"dead_letter_id": "43", "message_key": "key-43", "verdict": "stale",
                 "reason": "reason 43", "destination": "payments", "event_type": "payment.refunded", "at_send": false},
            ],
            "next_page_token": "",
        })
    );
    let calls = fake.item_calls.lock().unwrap().clone();
    assert_eq!(
        calls,
        [
            v1::ListPrecheckItemsRequest {
                precheck_id: PRECHECK_ID.into(),
                verdict: v1::Verdict::Stale.into(),
                page_size: 2,
                page_token: String::new(),
            },
            v1::ListPrecheckItemsRequest {
                precheck_id: PRECHECK_ID.into(),
                verdict: v1::Verdict::Stale.into(),
                page_size: 2,
                page_token: "p2".into(),
            },
        ]
    );
    assert!(
        fake.actors()
            .iter()
            .all(|(_, actor)| actor.as_deref() == Some("dana"))
    );

    // One page, as a table, with every verdict.
    let output = redrivectl(address, &["precheck", "items", PRECHECK_ID], "").await;
    let stdout = String::from_utf8(output.stdout).unwrap();
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 4, "{stdout}");
    assert!(
        lines[0]
            .starts_with("DEAD_LETTER_ID  VERDICT           MESSAGE_KEY  DESTINATION  EVENT_TYPE"),
        "{stdout}"
    );
    assert!(
        lines[2].contains("42              blocked_by_state  key-42       payments     -"),
        "{stdout}"
    );
    assert_eq!(lines[3], "next page token: p2");
    let calls = fake.item_calls.lock().unwrap().clone();
    assert_eq!(calls[2].verdict, i32::from(v1::Verdict::Unspecified));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_check_hook_outage_is_unavailable_and_says_which_flag() {
    let fake = Fake::default();
    let address = serve(fake.clone()).await;
    let output = redrivectl(address, &["precheck", "--source", "hook-down"], "").await;
    assert_eq!(output.status.code(), Some(69));
    assert!(output.stdout.is_empty());
    assert_eq!(
        String::from_utf8(output.stderr).unwrap(),
        "redrivectl: unavailable: state check hook http://127.0.0.1:9 for payment.*: connection \
         refused; the precheck is not complete. Fix the hook, or run the precheck with \
         block_on_state_check_error to mark its messages blocked_by_state \
         (redrivectl precheck --block-on-state-check-error)\n"
    );
    let output = redrivectl(
        address,
        &[
            "precheck",
            "--source",
            "hook-down",
            "--block-on-state-check-error",
        ],
        "",
    )
    .await;
    assert_eq!(output.status.code(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_precheck_flags_exit_64_before_any_call() {
    let fake = Fake::default();
    let address = serve(fake.clone()).await;
    for (args, expected) in [
        (
            &["precheck", "--source", "q", "--stale-after", "payment.*"][..],
            "--stale-after <TYPE=DURATION>",
        ),
        (
            &["precheck", "--source", "q", "--stale-after", "pay*ment=2h"],
            "'*' may only end a pattern",
        ),
        (
            &[
                "precheck",
                "--source",
                "q",
                "--stale-after",
                "a=1h",
                "--stale-after",
                "a=2h",
            ],
            "--stale-after: a is given twice",
        ),
        (
            &["precheck", "items", PRECHECK_ID, "--verdict", "blocked"],
            "valid names: replayable, duplicate, already_replayed, looping, stale, \
             blocked_by_state, needs_compensation, invalid",
        ),
        (&["precheck", "--reason", "rejected"], "--source <SOURCE>"),
        (
            &["precheck", "--source", "q", "show", PRECHECK_ID],
            "takes no selector flags",
        ),
    ] {
        let output = redrivectl(address, args, "").await;
        let stderr = String::from_utf8(output.stderr).unwrap();
        assert_eq!(output.status.code(), Some(64), "{args:?}: {stderr}");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
    }
    assert!(fake.actors().is_empty());
}

// ---------------------------------------------------------------------------
// Plans
// ---------------------------------------------------------------------------

fn stdout_json(output: &Output) -> serde_json::Value {
    serde_json::from_slice(&output.stdout).unwrap_or_else(|error| {
        panic!(
            "{error}: {}\n{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plan_create_sends_the_flags_and_prints_the_plan() {
    let fake = Fake::default();
    let address = serve(fake.clone()).await;
    let output = redrivectl(
        address,
        &[
            "plan",
            "create",
            "--precheck",
            PRECHECK_ID,
            "--rate",
            "12.5",
            "--burst",
            "5",
            "--rationale",
            "payments-api sustains 300/s, peak 200/s",
            "--destination",
            "redirect:quarantine/",
            "--slice-size",
            "50",
            "--canary-fraction",
            "0.05",
            "--observe",
            "30m",
            "--json",
            "--actor",
            "alice",
        ],
        "",
    )
    .await;
    assert_eq!(output.status.code(), Some(0));
    assert_eq!(
        fake.plan_calls(),
        [PlanCall::Create(v1::CreatePlanRequest {
            precheck_id: PRECHECK_ID.into(),
            rate: Some(v1::Rate {
                per_second: 12.5,
                burst: 5,
                rationale: "payments-api sustains 300/s, peak 200/s".into(),
            }),
            destination: Some(v1::Destination {
                mode: Some(v1::destination::Mode::Redirect(v1::RedirectDestination {
                    exchange: "quarantine".into(),
                    routing_key: String::new(),
                })),
            }),
            slice_size: 50,
            canary_fraction: Some(0.05),
            observe_for: Some(prost_types::Duration {
                seconds: 1800,
                nanos: 0,
            }),
        })]
    );
    let plan = stdout_json(&output);
    assert_eq!(plan["plan_id"], "plan-new");
    assert_eq!(plan["state"], "awaiting_approval");
    assert_eq!(plan["precheck_digest"], DIGEST);
    assert_eq!(
        plan["rate"],
        serde_json::json!({"per_second": 12.5, "burst": 5,
                           "rationale": "payments-api sustains 300/s, peak 200/s"})
    );
    assert_eq!(
        plan["destination"],
        serde_json::json!({"redirect": {"exchange": "quarantine", "routing_key": ""}})
    );
    assert_eq!(plan["observe_for_seconds"], 1800);
    assert_eq!(plan["created_by"], "alice");
    assert_eq!(
        plan["counts"],
        serde_json::json!({
            "sent": 0, "skipped_duplicate": 0, "skipped_stale": 0, "skipped_state": 0,
            "needs_compensation": 0, "failed": 0, "unroutable": 0, "uncertain": 0,
        })
    );

    // People get the plan and the command to approve it; defaults left unset.
    let output = redrivectl(
        address,
        &[
            "plan",
            "create",
            "--precheck",
            PRECHECK_ID,
            "--rate",
            "50",
            "--burst",
            "10",
            "--rationale",
            "r",
        ],
        "",
    )
    .await;
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert_eq!(output.status.code(), Some(0), "{stdout}");
    for expected in [
        "plan id:      plan-new",
        "state:        awaiting_approval",
        "rate:         50/s, burst 10",
        "rationale:    r",
        "destination:  queue",
        "items:        7 total, 1 in the canary (1% of the items)",
        "WARNING: 2 of 9 items are not replayable and stay out",
    ] {
        assert!(stdout.contains(expected), "{expected:?} in:\n{stdout}");
    }
    assert!(
        stdout.ends_with(&format!(
            "\nnext: redrivectl plan approve plan-new --digest {DIGEST}\n"
        )),
        "{stdout}"
    );
    let PlanCall::Create(request) = &fake.plan_calls()[1] else {
        panic!("not create");
    };
    assert_eq!(
        (
            request.slice_size,
            request.canary_fraction,
            request.observe_for
        ),
        (0, None, None)
    );
    assert_eq!(
        request.destination,
        Some(v1::Destination {
            mode: Some(v1::destination::Mode::Queue(v1::QueueDestination {})),
        })
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_plan_flags_exit_64_before_any_call() {
    let fake = Fake::default();
    let address = serve(fake.clone()).await;
    let create = |extra: &[&'static str]| {
        let mut args = vec![
            "plan",
            "create",
            "--precheck",
            PRECHECK_ID,
            "--rate",
            "50",
            "--burst",
            "10",
            "--rationale",
            "r",
        ];
        args.extend_from_slice(extra);
        args
    };
    for (args, expected) in [
        (create(&["--rate", "0"]), "--rate <PER_SECOND>"),
        (create(&["--burst", "0"]), "--burst <N>"),
        (create(&["--rationale", "  "]), "--rationale <TEXT>"),
        (
            create(&["--destination", "redirect:quarantine"]),
            "--destination <DESTINATION>",
        ),
        (
            create(&["--canary-fraction", "1.5"]),
            "--canary-fraction <F>",
        ),
        (create(&["--observe", "0s"]), "--observe <DURATION>"),
        (
            vec!["plan", "wait", "plan-done", "--timeout", "never"],
            "--timeout <DURATION>",
        ),
        (
            vec!["plan", "list", "--state", "running"],
            "valid names: awaiting_approval",
        ),
        (
            vec!["plan", "report", "plan-done", "--format", "xml"],
            "--format <FORMAT>",
        ),
        (vec!["plan", "approve", "plan-new"], "--digest <DIGEST>"),
    ] {
        let output = redrivectl(address, &args, "").await;
        let stderr = String::from_utf8(output.stderr).unwrap();
        assert_eq!(output.status.code(), Some(64), "{args:?}: {stderr}");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
    }
    assert!(fake.plan_calls().is_empty());
    assert!(fake.actors().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plan_wait_exits_0_when_completed_1_when_cancelled_75_on_timeout() {
    let fake = Fake::default();
    let address = serve(fake.clone()).await;
    let wait = |plan_id: &'static str, extra: &[&'static str]| {
        let mut args = vec!["plan", "wait", plan_id, "--interval", "10ms", "--json"];
        args.extend_from_slice(extra);
        args
    };

    // Completed: exit 0, the final plan on stdout.
    let output = redrivectl(address, &wait("plan-done", &[]), "").await;
    assert_eq!(output.status.code(), Some(0));
    assert_eq!(stdout_json(&output)["state"], "completed");
    assert!(output.stderr.is_empty());
    assert_eq!(fake.polls("plan-done"), 3);

    // Paused is not final: the wait goes on until it completes.
    let output = redrivectl(address, &wait("plan-paused", &[]), "").await;
    assert_eq!(output.status.code(), Some(0));
    assert_eq!(fake.polls("plan-paused"), 3);

    // Cancelled or aborted: exit 1, the plan on stdout, why on stderr.
    let output = redrivectl(address, &wait("plan-cancelled", &[]), "").await;
    assert_eq!(output.status.code(), Some(1));
    assert_eq!(stdout_json(&output)["state"], "cancelled");
    assert_eq!(
        String::from_utf8(output.stderr).unwrap(),
        "redrivectl: plan plan-cancelled ended cancelled (wrong selection), not completed\n"
    );
    let output = redrivectl(address, &["plan", "wait", "plan-aborted"], "").await;
    assert_eq!(output.status.code(), Some(1));
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert!(
        stdout.contains("state:        aborted (canary gate: 1 failed)"),
        "{stdout}"
    );
    assert!(
        stdout.ends_with("next: redrivectl plan report plan-aborted\n"),
        "{stdout}"
    );

    // Timeout: exit 75 with the last plan seen.
    let output = redrivectl(address, &wait("plan-slow", &["--timeout", "2s"]), "").await;
    assert_eq!(output.status.code(), Some(75));
    assert_eq!(stdout_json(&output)["state"], "main");
    assert_eq!(
        String::from_utf8(output.stderr).unwrap(),
        "redrivectl: timed out after 2s: plan plan-slow is still main (--timeout)\n"
    );
    assert!(fake.polls("plan-slow") >= 2);

    // A planner that is briefly unavailable is waited for.
    let output = redrivectl(address, &wait("plan-flaky", &[]), "").await;
    assert_eq!(output.status.code(), Some(0));
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(
        stderr.contains("unavailable (planner restarting); still waiting"),
        "{stderr}"
    );

    // An unknown plan is not found at once.
    let output = redrivectl(address, &wait("plan-nope", &["--timeout", "5s"]), "").await;
    assert_eq!(output.status.code(), Some(65));
    assert_eq!(
        String::from_utf8(output.stderr).unwrap(),
        "redrivectl: not_found: plan plan-nope not found\n"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plan_watch_prints_one_line_per_update() {
    let fake = Fake::default();
    let address = serve(fake.clone()).await;
    let output = redrivectl(
        address,
        &["plan", "watch", "plan-done", "--events", "--json"],
        "",
    )
    .await;
    assert_eq!(output.status.code(), Some(0));
    let stdout = String::from_utf8(output.stdout).unwrap();
    let lines: Vec<serde_json::Value> = stdout
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    let kinds: Vec<(&str, &str)> = lines
        .iter()
        .map(|line| {
            let object = line.as_object().unwrap();
            assert_eq!(object.len(), 1, "{line}");
            let (kind, value) = object.iter().next().unwrap();
            let detail = match kind.as_str() {
                "progress" => value["state"].as_str().unwrap(),
                _ => value["action"].as_str().unwrap(),
            };
            (kind.as_str(), detail)
        })
        .collect();
    assert_eq!(
        kinds,
        [
            ("progress", "canary"),
            ("event", "sent"),
            ("progress", "main"),
            ("event", "skipped_stale"),
            ("progress", "completed"),
        ]
    );
    assert_eq!(lines[4]["progress"]["items_done"], 7);
    assert_eq!(lines[4]["progress"]["counts"]["sent"], 7);
    assert_eq!(
        lines[3]["event"],
        serde_json::json!({
            "plan_id": "plan-done", "slice_id": "slice-1", "dead_letter_id": "41",
            "message_key": "order-7:pay", "action": "skipped_stale", "reason": "older than 2h",
            "wave": "main", "executor_id": "executor-1", "attempt": 1,
            "confirm_latency_us": 900, "at": "2024-05-01T12:03:20Z",
        })
    );
    assert_eq!(
        fake.plan_calls(),
        [PlanCall::Watch(v1::WatchPlanRequest {
            plan_id: "plan-done".into(),
            include_events: true,
        })]
    );
    // The last snapshot was final: no GetPlan needed.
    assert_eq!(fake.polls("plan-done"), 0);

    // Not a terminal: one line per update, then the final state.
    let output = redrivectl(address, &["plan", "watch", "plan-done"], "").await;
    assert_eq!(output.status.code(), Some(0));
    // The pace: no rate yet (snapshots under a second apart), time since
    // the watch began (these plans have no approval time), no estimate.
    assert_eq!(
        String::from_utf8(output.stdout).unwrap(),
        "canary  1/7 14.3%  sent 1  rate —  watched 0s  eta —\n\
         main  4/7 57.1%  sent 4  rate —  watched 0s  eta —\n\
         completed  7/7 100.0%  sent 7\n\
         plan plan-done completed\n"
    );
    let output = redrivectl(address, &["plan", "watch", "plan-done", "--events"], "").await;
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert!(
        stdout.contains(
            "main  4/7 57.1%  sent 4  rate —  watched 0s  eta —\n\
             2024-05-01T12:03:20Z skipped_stale order-7:pay older than 2h\n"
        ),
        "{stdout}"
    );

    // A stream that ends before the plan is final: watch again.
    let output = redrivectl(address, &["plan", "watch", "plan-cut"], "").await;
    assert_eq!(output.status.code(), Some(69));
    assert_eq!(
        String::from_utf8(output.stdout).unwrap(),
        "main  3/7 42.9%  sent 3  rate —  watched 0s  eta —\n"
    );
    assert_eq!(
        String::from_utf8(output.stderr).unwrap(),
        "redrivectl: unavailable: the watch stream ended while plan plan-cut is still main; \
         run `redrivectl plan watch plan-cut` again\n"
    );
}

/// `redrivectl` with `args` against `address`, its stdout read line by line
/// as it comes: the child and a receiver of its lines (closed at its EOF).
fn redrivectl_live(
    address: SocketAddr,
    args: &[&str],
) -> (
    std::process::Child,
    tokio::sync::mpsc::UnboundedReceiver<String>,
) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_redrivectl"))
        .args(args)
        .env("REDRIVE_PLANNER", format!("http://{address}"))
        .env_remove("REDRIVE_JSON")
        .env_remove("REDRIVE_ACTOR")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (sender, receiver) = tokio::sync::mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in std::io::BufRead::lines(std::io::BufReader::new(stdout)) {
            if sender.send(line.unwrap()).is_err() {
                return;
            }
        }
    });
    (child, receiver)
}

/// Lines from `lines` up to and including the first that `last` accepts
/// (within 30 s), then, after `then` ran, the rest until EOF.
async fn lines_around(
    lines: &mut tokio::sync::mpsc::UnboundedReceiver<String>,
    last: impl Fn(&str) -> bool,
    then: impl FnOnce(),
) -> Vec<String> {
    let mut seen = Vec::new();
    loop {
        let line = tokio::time::timeout(std::time::Duration::from_secs(30), lines.recv())
            .await
            .unwrap_or_else(|_| panic!("no such line within 30 s; got {seen:#?}"))
            .unwrap_or_else(|| panic!("the output ended first: {seen:#?}"));
        let found = last(&line);
        seen.push(line);
        if found {
            break;
        }
    }
    then();
    while let Some(line) = lines.recv().await {
        seen.push(line);
    }
    seen
}

/// The figure after `label ` in a status line (`rate 0.5/s` → `0.5/s`).
fn figure<'a>(line: &'a str, label: &str) -> &'a str {
    let start = line
        .find(&format!("  {label} "))
        .unwrap_or_else(|| panic!("no {label} in {line:?}"))
        + label.len()
        + 3;
    line[start..].split("  ").next().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plan_watch_warns_once_of_a_stall_and_says_when_it_ends() {
    let fake = Fake::default();
    let address = serve(fake.clone()).await;

    // Lines: the plan stays in main at 3/7; the planner sends nothing.
    let (mut child, mut lines) = redrivectl_live(
        address,
        &["plan", "watch", "plan-stalled", "--stall-after", "1s"],
    );
    let seen = lines_around(
        &mut lines,
        |line| line.starts_with("warning: "),
        || fake.resume.notify_one(),
    )
    .await;
    assert_eq!(child.wait().unwrap().code(), Some(0), "{seen:#?}");
    // Approved 90 s ago; no rate nor estimate from one snapshot.
    assert!(
        seen[0].starts_with("main  3/7 42.9%  sent 3  rate —  elapsed 1m3")
            && seen[0].ends_with("  eta —"),
        "{seen:#?}"
    );
    let warnings: Vec<&String> = seen
        .iter()
        .filter(|line| line.starts_with("warning: "))
        .collect();
    assert_eq!(warnings.len(), 1, "once per stall: {seen:#?}");
    let warning = warnings[0];
    assert!(
        warning.starts_with("warning: no progress for ")
            && warning.ends_with(
                "s (plan main, 3/7 done); check the executors: are any running, what do their \
                 logs say? (to stop the plan: redrivectl plan pause plan-stalled --reason TEXT)"
            ),
        "{warning}"
    );
    let resumed = seen
        .iter()
        .position(|line| line.starts_with("progress resumed after "))
        .unwrap_or_else(|| panic!("no resumed line: {seen:#?}"));
    assert!(
        seen[resumed].ends_with("s stalled (plan main, 4/7 done)"),
        "{seen:#?}"
    );
    // Progress again: a rate above zero, and an estimate for the other 3.
    let moving = &seen[resumed + 1];
    assert!(
        moving.starts_with("main  4/7 57.1%  sent 4  rate "),
        "{moving}"
    );
    let rate: f64 = figure(moving, "rate")
        .strip_suffix("/s")
        .unwrap()
        .parse()
        .unwrap();
    assert!(rate > 0.0, "{moving}");
    assert_ne!(figure(moving, "eta"), "—", "{moving}");
    assert_eq!(
        seen[resumed + 2..],
        [
            "completed  7/7 100.0%  sent 7",
            "plan plan-stalled completed"
        ],
        "{seen:#?}"
    );

    // JSON: the same as tagged objects.
    let (mut child, mut lines) = redrivectl_live(
        address,
        &[
            "plan",
            "watch",
            "plan-stalled",
            "--stall-after",
            "1s",
            "--json",
        ],
    );
    let seen = lines_around(
        &mut lines,
        |line| line.starts_with("{\"stalled\""),
        || fake.resume.notify_one(),
    )
    .await;
    assert_eq!(child.wait().unwrap().code(), Some(0), "{seen:#?}");
    let objects: Vec<serde_json::Value> = seen
        .iter()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    let kinds: Vec<&str> = objects
        .iter()
        .map(|object| object.as_object().unwrap().keys().next().unwrap().as_str())
        .collect();
    assert_eq!(
        kinds,
        ["progress", "stalled", "resumed", "progress", "progress"],
        "{seen:#?}"
    );
    let stalled = &objects[1]["stalled"];
    assert_eq!(stalled["plan_id"], "plan-stalled");
    assert_eq!(stalled["state"], "main");
    assert_eq!(stalled["items_done"], 3);
    assert_eq!(stalled["total_items"], 7);
    assert!(
        stalled["no_progress_seconds"].as_u64().unwrap() >= 1,
        "{stalled}"
    );
    assert!(
        stalled["message"]
            .as_str()
            .unwrap()
            .starts_with("no progress for "),
        "{stalled}"
    );
    assert_eq!(objects[2]["resumed"]["items_done"], 4);
    assert_eq!(objects[4]["progress"]["state"], "completed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plan_watch_counts_down_the_observation_window() {
    let fake = Fake::default();
    let address = serve(fake.clone()).await;
    let output = redrivectl(address, &["plan", "watch", "plan-observing"], "").await;
    assert_eq!(output.status.code(), Some(0));
    let stdout = String::from_utf8(output.stdout).unwrap();
    let first = stdout.lines().next().unwrap();
    assert!(
        first.starts_with("observing  1/7 14.3%  sent 1  rate —  watched 0s  eta —"),
        "{stdout}"
    );
    // 10 minutes from when the fake answered, a moment ago.
    let left = figure(first, "observation ends in");
    assert!(left.starts_with("9m5") || left == "10m00s", "{stdout}");
    let output = redrivectl(address, &["plan", "watch", "plan-observing", "--json"], "").await;
    let stdout = String::from_utf8(output.stdout).unwrap();
    let first: serde_json::Value = serde_json::from_str(stdout.lines().next().unwrap()).unwrap();
    assert!(first["progress"]["observing_until"].is_string(), "{stdout}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plan_report_csv_and_jsonl_pass_the_export_through_byte_for_byte() {
    let fake = Fake::default();
    let address = serve(fake.clone()).await;
    let expected: Vec<u8> = CSV_CHUNKS.concat();
    for args in [
        &["plan", "report", "plan-done", "--format", "csv"][..],
        // The export is the export, --json or not.
        &["plan", "report", "plan-done", "--format", "csv", "--json"],
    ] {
        let output = redrivectl(address, args, "").await;
        assert_eq!(output.status.code(), Some(0), "{args:?}");
        assert_eq!(output.stdout, expected, "{args:?}");
    }
    let output = redrivectl(
        address,
        &["plan", "report", "plan-done", "--format", "jsonl"],
        "",
    )
    .await;
    assert_eq!(
        String::from_utf8(output.stdout).unwrap(),
        "{\"message_key\":\"order-1:pay\",\"action\":\"sent\"}\n\
         {\"message_key\":\"order-7:pay\",\"action\":\"skipped_stale\"}\n"
    );
    let export = |format: v1::ExportFormat| {
        PlanCall::Export(v1::ExportAuditRequest {
            plan_id: "plan-done".into(),
            format: format.into(),
        })
    };
    assert_eq!(
        fake.plan_calls(),
        [
            export(v1::ExportFormat::Csv),
            export(v1::ExportFormat::Csv),
            export(v1::ExportFormat::Jsonl),
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plan_report_json_and_text() {
    let fake = Fake::default();
    let address = serve(fake.clone()).await;
    let output = redrivectl(address, &["plan", "report", "plan-done", "--json"], "").await;
    assert_eq!(output.status.code(), Some(0));
    let report = stdout_json(&output);
    assert_eq!(
        report.as_object().unwrap().keys().collect::<Vec<_>>(),
        [
            "counts",
            "not_sent",
            "plan",
            "possibly_duplicated_keys",
            "sent_keys"
        ]
    );
    assert_eq!(report["plan"]["state"], "completed");
    assert_eq!(report["counts"]["sent"], 6);
    assert_eq!(report["counts"]["uncertain"], 0);
    assert_eq!(report["sent_keys"].as_array().unwrap().len(), 6);
    assert_eq!(report["sent_keys"][0], "order-1:pay");
    assert_eq!(report["not_sent"][0]["reason"], "older than 2h");
    // --format json without --json is the same document.
    let output = redrivectl(
        address,
        &["plan", "report", "plan-done", "--format", "json"],
        "",
    )
    .await;
    assert_eq!(stdout_json(&output), report);

    let output = redrivectl(address, &["plan", "report", "plan-done"], "").await;
    let stdout = String::from_utf8(output.stdout).unwrap();
    for expected in [
        "state:        completed",
        "sent                6",
        "skipped_stale       1",
        "sent keys: 6\n  order-1:pay\n",
        "not sent: 1",
        "41              order-7:pay  skipped_stale  main  2024-05-01T12:03:20Z  older than 2h",
        "redrivectl plan report plan-done --format csv",
    ] {
        assert!(stdout.contains(expected), "{expected:?} in:\n{stdout}");
    }
    assert!(
        fake.plan_calls()
            .iter()
            .all(|call| matches!(call, PlanCall::Report(_)))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plan_approve_and_controls_send_the_id_reason_and_actor() {
    let fake = Fake::default();
    let address = serve(fake.clone()).await;
    let output = redrivectl(
        address,
        &[
            "plan", "approve", "plan-new", "--digest", DIGEST, "--actor", "bob", "--json",
        ],
        "",
    )
    .await;
    assert_eq!(output.status.code(), Some(0));
    let plan = stdout_json(&output);
    assert_eq!(
        (plan["state"].clone(), plan["approved_by"].clone()),
        ("canary".into(), "bob".into())
    );

    // A digest that does not match is refused by the planner (exit 1).
    let output = redrivectl(
        address,
        &["plan", "approve", "plan-new", "--digest", "0000"],
        "",
    )
    .await;
    assert_eq!(output.status.code(), Some(1));
    assert_eq!(
        String::from_utf8(output.stderr).unwrap(),
        "redrivectl: failed_precondition: digest 0000 is not the precheck's digest 9f86d081\n"
    );

    for (command, state) in [
        ("promote", "main"),
        ("pause", "paused"),
        ("resume", "main"),
        ("cancel", "cancelled"),
    ] {
        let output = redrivectl(
            address,
            &[
                "plan",
                command,
                "plan-done",
                "--reason",
                "downstream alarm",
                "--json",
            ],
            "",
        )
        .await;
        assert_eq!(output.status.code(), Some(0), "{command}");
        let plan = stdout_json(&output);
        assert_eq!(plan["state"], state, "{command}");
        assert_eq!(
            plan["actions"],
            serde_json::json!([{"action": command, "actor": "tester",
                               "reason": "downstream alarm", "at": "2024-05-01T12:10:00Z"}])
        );
    }
    let output = redrivectl(address, &["plan", "pause", "plan-done"], "").await;
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert!(stdout.contains("state:        paused\n"), "{stdout}");
    assert!(
        stdout.ends_with("next: redrivectl plan resume plan-done --reason TEXT\n"),
        "{stdout}"
    );

    let control = |method, reason: &str| {
        PlanCall::Control(
            method,
            v1::PlanControlRequest {
                plan_id: "plan-done".into(),
                reason: reason.into(),
            },
        )
    };
    let approve = |digest: &str| {
        PlanCall::Approve(v1::ApprovePlanRequest {
            plan_id: "plan-new".into(),
            digest: digest.into(),
        })
    };
    assert_eq!(
        fake.plan_calls(),
        [
            approve(DIGEST),
            approve("0000"),
            control("promote", "downstream alarm"),
            control("pause", "downstream alarm"),
            control("resume", "downstream alarm"),
            control("cancel", "downstream alarm"),
            control("pause", ""),
        ]
    );
    let actors = fake.actors();
    assert_eq!(actors[0], ("approve_plan", Some("bob".to_owned())));
    assert_eq!(actors[2], ("promote", Some("tester".to_owned())));

    // status (alias show) is GetPlan.
    let output = redrivectl(address, &["plan", "show", "plan-done", "--json"], "").await;
    assert_eq!(stdout_json(&output)["state"], "main");
    let output = redrivectl(address, &["plan", "status", "plan-nope"], "").await;
    assert_eq!(output.status.code(), Some(65));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plan_list_and_compensations_follow_pages() {
    let fake = Fake::default();
    let address = serve(fake.clone()).await;
    let output = redrivectl(
        address,
        &[
            "plan",
            "list",
            "--state",
            "main",
            "--state",
            "cancelled",
            "--page-size",
            "1",
            "--all",
            "--json",
        ],
        "",
    )
    .await;
    assert_eq!(output.status.code(), Some(0));
    let listed = stdout_json(&output);
    let states: Vec<(&str, &str)> = listed["plans"]
        .as_array()
        .unwrap()
        .iter()
        .map(|plan| {
            (
                plan["plan_id"].as_str().unwrap(),
                plan["state"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        states,
        [("plan-done", "main"), ("plan-cancelled", "cancelled")]
    );
    assert_eq!(listed["next_page_token"], "");
    let list = |token: &str| {
        PlanCall::List(v1::ListPlansRequest {
            states: vec![v1::PlanState::Main.into(), v1::PlanState::Cancelled.into()],
            page_size: 1,
            page_token: token.into(),
        })
    };
    assert_eq!(fake.plan_calls(), [list(""), list("p2")]);

    let output = redrivectl(address, &["plan", "list"], "").await;
    let stdout = String::from_utf8(output.stdout).unwrap();
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{stdout}");
    assert!(
        lines[0].starts_with("PLAN_ID    STATE  DONE         RATE  DESTINATION  CREATED_BY"),
        "{stdout}"
    );
    assert!(
        lines[1].starts_with("plan-done  main   3/7 (42.9%)  50/s  queue        alice"),
        "{stdout}"
    );
    assert_eq!(lines[2], "next page token: p2");

    let output = redrivectl(
        address,
        &["plan", "compensations", "plan-done", "--all", "--json"],
        "",
    )
    .await;
    assert_eq!(output.status.code(), Some(0));
    let items = stdout_json(&output);
    assert_eq!(items["items"].as_array().unwrap().len(), 3);
    assert_eq!(
        items["items"][2],
        serde_json::json!({
            "dead_letter_id": "53", "message_key": "order-53:refund",
            "verdict": "needs_compensation", "reason": "refund 53 already issued by hand",
            "destination": "payments", "event_type": "payment.refunded", "at_send": false,
        })
    );
    assert_eq!(items["next_page_token"], "");
    let output = redrivectl(address, &["plan", "compensations", "plan-done"], "").await;
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert!(
        stdout.contains("51              needs_compensation  order-51:refund"),
        "{stdout}"
    );
    assert!(stdout.ends_with("next page token: c2\n"), "{stdout}");
}
