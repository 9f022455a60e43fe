//! The fake planner the `redrivectl` tests run against: an in-process
//! `Planner` on `127.0.0.1:0` that records what it received and answers
//! from scripts, and helpers to run `redrivectl` against it.
#![allow(dead_code)]

pub use std::{
    collections::HashMap,
    net::SocketAddr,
    pin::Pin,
    process::{Command, Output, Stdio},
    sync::{Arc, Mutex},
};

pub use redrive_proto::v1::{
    self, IngestDeadLettersRequest, IngestRejection,
    planner_server::{Planner, PlannerServer},
};
pub use tokio_stream::{Stream, StreamExt, wrappers::TcpListenerStream};
pub use tonic::{Request, Response, Status, Streaming};

/// (method, `x-redrive-actor` metadata) of one call.
pub type ActorSeen = (&'static str, Option<String>);

/// What the fake planner received.
#[derive(Debug, Default, Clone)]
pub struct Fake {
    /// Every ingest call, as the list of items it streamed.
    pub calls: Arc<Mutex<Vec<Vec<IngestDeadLettersRequest>>>>,
    /// (method, `x-redrive-actor` metadata) of every unary call.
    pub actors: Arc<Mutex<Vec<ActorSeen>>>,
    /// Every RunPrecheck request.
    pub prechecks: Arc<Mutex<Vec<v1::RunPrecheckRequest>>>,
    /// Every ListPrecheckItems request.
    pub item_calls: Arc<Mutex<Vec<v1::ListPrecheckItemsRequest>>>,
    /// Every plan call but GetPlan, in order.
    pub plan_calls: Arc<Mutex<Vec<PlanCall>>>,
    /// GetPlan calls per plan id.
    pub polls: Arc<Mutex<HashMap<String, usize>>>,
    /// Lets the `plan-stalled` watch stream go on.
    pub resume: Arc<tokio::sync::Notify>,
    /// Every ArchiveDeadLetters (`archive`) and UnarchiveDeadLetters
    /// (`unarchive`) request.
    pub archives: Arc<Mutex<Vec<(&'static str, v1::ArchiveDeadLettersRequest)>>>,
    /// Every RekeyDeadLetters request.
    pub rekeys: Arc<Mutex<Vec<v1::RekeyDeadLettersRequest>>>,
}

/// A plan RPC the fake planner received (GetPlan is counted in `polls`).
#[derive(Debug, Clone, PartialEq)]
pub enum PlanCall {
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
    pub fn record<T>(&self, method: &'static str, request: &Request<T>) {
        let actor = request
            .metadata()
            .get("x-redrive-actor")
            .map(|value| value.to_str().unwrap().to_owned());
        self.actors.lock().unwrap().push((method, actor));
    }

    pub fn actors(&self) -> Vec<ActorSeen> {
        self.actors.lock().unwrap().clone()
    }

    pub fn plan_call(&self, call: PlanCall) {
        self.plan_calls.lock().unwrap().push(call);
    }

    pub fn plan_calls(&self) -> Vec<PlanCall> {
        self.plan_calls.lock().unwrap().clone()
    }

    pub fn polls(&self, plan_id: &str) -> usize {
        self.polls
            .lock()
            .unwrap()
            .get(plan_id)
            .copied()
            .unwrap_or(0)
    }
}

pub fn actor_of<T>(request: &Request<T>) -> String {
    request
        .metadata()
        .get("x-redrive-actor")
        .map_or("anonymous", |value| value.to_str().unwrap())
        .to_owned()
}

pub const DIGEST: &str = "9f86d081";

/// A plan of 7 items, `done` of them sent.
pub fn plan(plan_id: &str, state: v1::PlanState, done: u64) -> v1::Plan {
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
        kind: v1::PlanKind::Bulk.into(),
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
pub fn scripted_plan(plan_id: &str, poll: usize) -> Result<v1::Plan, Status> {
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

pub fn event(action: v1::AuditAction, key: &str, reason: &str, wave: v1::Wave) -> v1::AuditEvent {
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
        message_id: String::new(),
    }
}

/// The CSV export of `plan-done`, cut mid-line and mid-field, with a byte
/// that is not UTF-8: redrivectl must pass it through as is.
pub const CSV_CHUNKS: [&[u8]; 4] = [
    b"plan_id,message_key,action,reason\r\nplan-done,order-1:pay,sent,\r\n",
    b"plan-done,\"key,2\",skipped_",
    b"stale,\"older than \"\"2h\"\"\"\r\n",
    b"plan-done,bin-\xff\xfe,failed,nack\r\n",
];

/// A dead letter with long names and keys, died at a time with
/// nanoseconds.
pub fn long_dead_letter() -> v1::DeadLetter {
    v1::DeadLetter {
        id: "1234567".into(),
        source: "payments.settlement.dead-letter-queue".into(),
        reason_class: v1::ReasonClass::Exhausted.into(),
        death: Some(v1::Death {
            reason: "delivery_limit".into(),
            queue: "payments.settlement".into(),
            ..Default::default()
        }),
        destination: "payments.settlement".into(),
        event_type: Some("payment.settlement.captured".into()),
        message_key: "order-9f86d081884c7d659a2feaa0c55ad015:capture".into(),
        message_id: Some("m-9f86d081884c7d659a2feaa0c55ad015".into()),
        body_size: 16_777_216,
        died_at: Some(prost_types::Timestamp {
            seconds: 1_764_576_000,
            nanos: 123_456_789,
        }),
        captured_at: Some(prost_types::Timestamp {
            seconds: 1_764_576_001,
            nanos: 5_000,
        }),
        ..Default::default()
    }
}

/// The CSV export of `plan-formula` as the planner sends it: cells a
/// spreadsheet would run already quoted with `'` (the planner's
/// `audit::spreadsheet_safe`), times in the one format.
pub const FORMULA_CSV: &[u8] = b"at,plan_id,message_key,action,reason\n\
2024-05-01T12:10:00.000Z,plan-formula,\"'=HYPERLINK(\"\"http://x\"\",\"\"y\"\")\",failed,'+1 nack\n\
2024-05-01T12:10:00.500Z,plan-formula,'@SUM(A1),sent,'-2\n\
2024-05-01T12:10:01.000Z,plan-formula,'\tkey,sent,\"'\rcr\"\n";

/// The JSONL export of `plan-formula` as the planner sends it.
pub const FORMULA_JSONL: &[u8] =
    b"{\"at\":\"2024-05-01T12:10:00.000Z\",\"attempt\":-1,\"message_key\":\"'=HYPERLINK(1)\"}\n";

pub const PRECHECK_ID: &str = "0190f3a2-7c1e-7b3a-9d4e-2f6a8b1c0d5e";

/// A report with some verdicts zero, as the planner sends it.
pub fn report(actor: &str) -> v1::PrecheckReport {
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
            message_id: String::new(),
        }],
        ..Default::default()
    }
}

pub type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

impl Fake {
    /// Archive or unarchive: every selected id changes, but id `7`, which is
    /// unchanged, and id `404`, which names nothing; a selector with id `9`
    /// is in a live plan.
    fn archive_answer(
        &self,
        verb: &'static str,
        request: Request<v1::ArchiveDeadLettersRequest>,
    ) -> Result<Response<v1::ArchiveDeadLettersResponse>, Status> {
        self.record(verb, &request);
        let request = request.into_inner();
        self.archives.lock().unwrap().push((verb, request.clone()));
        let ids = request.selector.unwrap_or_default().ids;
        if ids.iter().any(|id| id == "9") {
            return Err(Status::failed_precondition(
                "dead letter 9 is an item of plan p-1 (main), which has not ended",
            ));
        }
        let not_found_ids: Vec<String> = ids.iter().filter(|id| *id == "404").cloned().collect();
        let changed: Vec<String> = ids
            .into_iter()
            .filter(|id| id != "7" && id != "404")
            .collect();
        Ok(Response::new(v1::ArchiveDeadLettersResponse {
            changed: changed.len() as u64,
            unchanged: 1,
            dead_letter_ids: changed,
            not_found_ids,
        }))
    }
}

#[tonic::async_trait]
impl Planner for Fake {
    /// Re-keys 3 dead letters, 2 changed; a rule `bad` is refused.
    async fn rekey_dead_letters(
        &self,
        request: Request<v1::RekeyDeadLettersRequest>,
    ) -> Result<Response<v1::RekeyDeadLettersResponse>, Status> {
        self.record("rekey", &request);
        let request = request.into_inner();
        self.rekeys.lock().unwrap().push(request.clone());
        if let Some(index) = request.key_rules.iter().position(|rule| rule == "bad") {
            return Err(Status::invalid_argument(format!(
                "key_rules[{index}]: \"bad\": expected property:NAME, header:NAME, json:/pointer or body"
            )));
        }
        Ok(Response::new(v1::RekeyDeadLettersResponse {
            rekeyed: 3,
            changed: 2,
            examples: vec![
                v1::RekeyExample {
                    dead_letter_id: "1".into(),
                    old_key: "sha256:ab12".into(),
                    new_key: "o-1".into(),
                },
                v1::RekeyExample {
                    dead_letter_id: "2".into(),
                    old_key: "sha256:cd34".into(),
                    new_key: "o-1".into(),
                },
            ],
            rekey_id: "7".into(),
            not_found_ids: Vec::new(),
        }))
    }

    async fn archive_dead_letters(
        &self,
        request: Request<v1::ArchiveDeadLettersRequest>,
    ) -> Result<Response<v1::ArchiveDeadLettersResponse>, Status> {
        self.archive_answer("archive", request)
    }

    async fn unarchive_dead_letters(
        &self,
        request: Request<v1::ArchiveDeadLettersRequest>,
    ) -> Result<Response<v1::ArchiveDeadLettersResponse>, Status> {
        self.archive_answer("unarchive", request)
    }

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

    /// Two pages of one dead letter each; with source `long`, one page of
    /// [`long_dead_letter`].
    async fn list_dead_letters(
        &self,
        request: Request<v1::ListDeadLettersRequest>,
    ) -> Result<Response<v1::ListDeadLettersResponse>, Status> {
        self.record("list_dead_letters", &request);
        let request = request.into_inner();
        if request
            .selector
            .is_some_and(|selector| selector.sources.iter().any(|source| source == "long"))
        {
            return Ok(Response::new(v1::ListDeadLettersResponse {
                dead_letters: vec![long_dead_letter()],
                next_page_token: String::new(),
            }));
        }
        let token = request.page_token;
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

    /// `long`: [`long_dead_letter`]; `spoof`: line breaks in its archive
    /// reason, capture note and header; `bin`: a binary body with control
    /// bytes; `json`: a JSON body whose keys are not in alphabetical order
    /// (the planner's preview sorts them); else `not_found`.
    async fn get_dead_letter(
        &self,
        request: Request<v1::GetDeadLetterRequest>,
    ) -> Result<Response<v1::GetDeadLetterResponse>, Status> {
        let id = request.into_inner().id;
        let (body, body_preview): (&[u8], &str) = match id.as_str() {
            "long" => (b"{}", "{}"),
            "bin" => (
                b"\x00\x1b[2J\x1b]52;c;aGk=\x07\xff\xfe\x9b tail",
                "\u{0}\u{1b}[2J\u{1b}]52;c;aGk=\u{7}\u{fffd}\u{fffd}\u{fffd} tail",
            ),
            "spoof" => {
                // Texts with line breaks where a producer or an operator
                // wrote them: each later line tries to pass for a field.
                let record = v1::ArchiveRecord {
                    action: "archive".into(),
                    actor: "bob".into(),
                    reason: "dup of 7\nstatus: open".into(),
                    at: None,
                };
                return Ok(Response::new(v1::GetDeadLetterResponse {
                    dead_letter: Some(v1::DeadLetter {
                        id,
                        capture_notes: vec!["note\nstatus: open".into()],
                        headers: Some(v1::HeaderTable {
                            fields: [(
                                "x-name\nstatus: open".to_owned(),
                                v1::HeaderValue {
                                    value: Some(v1::header_value::Value::LongString(
                                        b"v\nstatus: open".to_vec(),
                                    )),
                                },
                            )]
                            .into(),
                        }),
                        archived: Some(record.clone()),
                        archive_history: vec![record],
                        ..long_dead_letter()
                    }),
                    body_preview: "{}".into(),
                }));
            }
            "json" => (
                br#"{"order_id":"o-1","amount":{"value":12.50,"currency":"EUR"},"customer":"c-9"}"#,
                "{\n  \"amount\": {\n    \"currency\": \"EUR\",\n    \"value\": 12.5\n  },\n  \"customer\": \"c-9\",\n  \"order_id\": \"o-1\"\n}",
            ),
            _ => return Err(Status::not_found(format!("dead letter {id} not found"))),
        };
        Ok(Response::new(v1::GetDeadLetterResponse {
            dead_letter: Some(v1::DeadLetter {
                id,
                body: body.to_vec(),
                body_size: body.len() as u64,
                ..long_dead_letter()
            }),
            body_preview: body_preview.into(),
        }))
    }

    /// With source `long`: one group keyed by every requested name, long
    /// values and the planner's `hour` form; else `unimplemented`.
    async fn summarize_dead_letters(
        &self,
        request: Request<v1::SummarizeDeadLettersRequest>,
    ) -> Result<Response<v1::SummarizeDeadLettersResponse>, Status> {
        let request = request.into_inner();
        if !request
            .selector
            .is_some_and(|selector| selector.sources.iter().any(|source| source == "long"))
        {
            return Err(Status::unimplemented("summarize_dead_letters"));
        }
        let key = [
            ("reason", "exhausted"),
            ("producer", "payments-settlement-service.eu-west-1"),
            ("event_type", "payment.settlement.captured"),
            ("hour", "2026-11-29T14:00Z"),
        ]
        .into_iter()
        .map(|(name, value)| (name.to_owned(), value.to_owned()))
        .collect();
        Ok(Response::new(v1::SummarizeDeadLettersResponse {
            total: 12,
            groups: vec![v1::SummaryGroup {
                key,
                count: 12,
                still_arriving: false,
                first_seen: Some(prost_types::Timestamp {
                    seconds: 1_764_424_800,
                    nanos: 987_654_321,
                }),
                last_seen: Some(prost_types::Timestamp {
                    seconds: 1_764_428_399,
                    nanos: 0,
                }),
            }],
            open: 12,
            archived: 3,
            replayed: 0,
        }))
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
            message_id: String::new(),
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
            message_id: String::new(),
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
            ..Default::default()
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

    async fn get_caller(
        &self,
        _: Request<v1::GetCallerRequest>,
    ) -> Result<Response<v1::Caller>, Status> {
        Err(Status::unimplemented("get_caller"))
    }

    async fn list_sources(
        &self,
        _: Request<v1::ListSourcesRequest>,
    ) -> Result<Response<v1::ListSourcesResponse>, Status> {
        Err(Status::unimplemented("list_sources"))
    }

    async fn preview_plan(
        &self,
        _: Request<v1::PreviewPlanRequest>,
    ) -> Result<Response<v1::PreviewPlanResponse>, Status> {
        Err(Status::unimplemented("preview_plan"))
    }

    async fn list_audit_events(
        &self,
        _: Request<v1::ListAuditEventsRequest>,
    ) -> Result<Response<v1::ListAuditEventsResponse>, Status> {
        Err(Status::unimplemented("list_audit_events"))
    }

    async fn get_audit_checkpoint(
        &self,
        _: Request<v1::GetAuditCheckpointRequest>,
    ) -> Result<Response<v1::AuditCheckpoint>, Status> {
        Err(Status::unimplemented("get_audit_checkpoint"))
    }

    async fn prove_audit_inclusion(
        &self,
        _: Request<v1::ProveAuditInclusionRequest>,
    ) -> Result<Response<v1::ProveAuditInclusionResponse>, Status> {
        Err(Status::unimplemented("prove_audit_inclusion"))
    }

    async fn prove_audit_consistency(
        &self,
        _: Request<v1::ProveAuditConsistencyRequest>,
    ) -> Result<Response<v1::AuditConsistencyProof>, Status> {
        Err(Status::unimplemented("prove_audit_consistency"))
    }

    type ExportAuditLogStream = BoxStream<v1::ExportAuditChunk>;

    async fn export_audit_log(
        &self,
        _: Request<v1::ExportAuditLogRequest>,
    ) -> Result<Response<Self::ExportAuditLogStream>, Status> {
        Err(Status::unimplemented("export_audit_log"))
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
        let formula = request.plan_id == "plan-formula";
        let chunks: Vec<Vec<u8>> = match request.format() {
            v1::ExportFormat::Csv if formula => vec![FORMULA_CSV.to_vec()],
            v1::ExportFormat::Jsonl if formula => vec![FORMULA_JSONL.to_vec()],
            v1::ExportFormat::Csv => CSV_CHUNKS.iter().map(|chunk| chunk.to_vec()).collect(),
            v1::ExportFormat::Jsonl => vec![
                b"{\"message_key\":\"order-1:pay\",\"action\":\"sent\"}\n{\"mess".to_vec(),
                b"age_key\":\"order-7:pay\",\"action\":\"skipped_stale\"}\n".to_vec(),
            ],
            v1::ExportFormat::Unspecified => {
                return Err(Status::invalid_argument("export format unspecified"));
            }
        };
        let stream = tokio_stream::iter(chunks.into_iter().map(|data| {
            Ok(v1::ExportAuditChunk {
                data,
                ..Default::default()
            })
        }));
        Ok(Response::new(Box::pin(stream)))
    }

    type WatchPlanStream = BoxStream<v1::WatchPlanResponse>;
    type ExportAuditStream = BoxStream<v1::ExportAuditChunk>;
}

/// The wall clock `seconds` from now (negative: ago).
pub fn timestamp_in(seconds: i64) -> prost_types::Timestamp {
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
    pub fn stalled_stream(&self, plan_id: &str) -> BoxStream<v1::WatchPlanResponse> {
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
    pub fn control(
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

/// A default [`Fake`] served on a local port ([`serve`]): the fake, to read
/// what it received, and its address.
pub async fn served() -> (Fake, SocketAddr) {
    let fake = Fake::default();
    let address = serve(fake.clone()).await;
    (fake, address)
}

pub async fn serve(fake: Fake) -> SocketAddr {
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
pub async fn redrivectl(address: SocketAddr, args: &[&str], stdin: &str) -> Output {
    redrivectl_with_env(address, args, stdin, &[("USER", Some("tester"))]).await
}

/// [`redrivectl`] with environment variables set (`Some`) or removed (`None`).
pub async fn redrivectl_with_env(
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

pub fn line(message_id: &str) -> String {
    format!(r#"{{"message_id":"{message_id}","body":"b","original_destination":"orders"}}"#)
}

// ---------------------------------------------------------------------------
// Plans
// ---------------------------------------------------------------------------

pub fn stdout_json(output: &Output) -> serde_json::Value {
    serde_json::from_slice(&output.stdout).unwrap_or_else(|error| {
        panic!(
            "{error}: {}\n{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )
    })
}

/// `redrivectl` with `args` against `address`, its stdout read line by line
/// as it comes: the child and a receiver of its lines (closed at its EOF).
pub fn redrivectl_live(
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
pub async fn lines_around(
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
pub fn figure<'a>(line: &'a str, label: &str) -> &'a str {
    let start = line
        .find(&format!("  {label} "))
        .unwrap_or_else(|| panic!("no {label} in {line:?}"))
        + label.len()
        + 3;
    line[start..].split("  ").next().unwrap()
}
