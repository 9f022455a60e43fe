//! `redrivectl` end to end against an in-process fake planner on
//! `127.0.0.1:0`: what the operator sees (stdout, stderr, exit code) and what
//! the planner received.

use std::{
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
}

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

    async fn create_plan(
        &self,
        _: Request<v1::CreatePlanRequest>,
    ) -> Result<Response<v1::Plan>, Status> {
        Err(Status::unimplemented("create_plan"))
    }

    async fn approve_plan(
        &self,
        _: Request<v1::ApprovePlanRequest>,
    ) -> Result<Response<v1::Plan>, Status> {
        Err(Status::unimplemented("approve_plan"))
    }

    async fn get_plan(&self, _: Request<v1::GetPlanRequest>) -> Result<Response<v1::Plan>, Status> {
        Err(Status::unimplemented("get_plan"))
    }

    async fn list_plans(
        &self,
        _: Request<v1::ListPlansRequest>,
    ) -> Result<Response<v1::ListPlansResponse>, Status> {
        Err(Status::unimplemented("list_plans"))
    }

    async fn promote_plan(
        &self,
        _: Request<v1::PlanControlRequest>,
    ) -> Result<Response<v1::Plan>, Status> {
        Err(Status::unimplemented("promote_plan"))
    }

    async fn pause_plan(
        &self,
        _: Request<v1::PlanControlRequest>,
    ) -> Result<Response<v1::Plan>, Status> {
        Err(Status::unimplemented("pause_plan"))
    }

    async fn resume_plan(
        &self,
        _: Request<v1::PlanControlRequest>,
    ) -> Result<Response<v1::Plan>, Status> {
        Err(Status::unimplemented("resume_plan"))
    }

    async fn cancel_plan(
        &self,
        _: Request<v1::PlanControlRequest>,
    ) -> Result<Response<v1::Plan>, Status> {
        Err(Status::unimplemented("cancel_plan"))
    }

    async fn list_compensations(
        &self,
        _: Request<v1::ListCompensationsRequest>,
    ) -> Result<Response<v1::ListCompensationsResponse>, Status> {
        Err(Status::unimplemented("list_compensations"))
    }

    async fn get_audit_report(
        &self,
        _: Request<v1::GetAuditReportRequest>,
    ) -> Result<Response<v1::AuditReport>, Status> {
        Err(Status::unimplemented("get_audit_report"))
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

    async fn watch_plan(
        &self,
        _: Request<v1::WatchPlanRequest>,
    ) -> Result<Response<Self::WatchPlanStream>, Status> {
        Err(Status::unimplemented("watch_plan"))
    }

    async fn export_audit(
        &self,
        _: Request<v1::ExportAuditRequest>,
    ) -> Result<Response<Self::ExportAuditStream>, Status> {
        Err(Status::unimplemented("export_audit"))
    }

    type WatchPlanStream = BoxStream<v1::WatchPlanResponse>;
    type ExportAuditStream = BoxStream<v1::ExportAuditChunk>;
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
                 "reason": "reason 41", "destination": "payments", "event_type": "payment.captured"},
                {"dead_letter_id": "42", "message_key": "key-42", "verdict": "stale",
                 "reason": "reason 42", "destination": "payments", "event_type": null},
                {"dead_letter_id": "43", "message_key": "key-43", "verdict": "stale",
                 "reason": "reason 43", "destination": "payments", "event_type": "payment.refunded"},
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
