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

/// Every ingest call, as the list of items it streamed.
#[derive(Debug, Default, Clone)]
struct Fake {
    calls: Arc<Mutex<Vec<Vec<IngestDeadLettersRequest>>>>,
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

    async fn run_precheck(
        &self,
        _: Request<v1::RunPrecheckRequest>,
    ) -> Result<Response<v1::PrecheckReport>, Status> {
        Err(Status::unimplemented("run_precheck"))
    }

    async fn get_precheck(
        &self,
        _: Request<v1::GetPrecheckRequest>,
    ) -> Result<Response<v1::PrecheckReport>, Status> {
        Err(Status::unimplemented("get_precheck"))
    }

    async fn list_precheck_items(
        &self,
        _: Request<v1::ListPrecheckItemsRequest>,
    ) -> Result<Response<v1::ListPrecheckItemsResponse>, Status> {
        Err(Status::unimplemented("list_precheck_items"))
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

/// Runs `redrivectl` with `args` against `address`, `stdin` on its stdin.
async fn redrivectl(address: SocketAddr, args: &[&str], stdin: &str) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_redrivectl"));
    command
        .args(args)
        .env("REDRIVE_PLANNER", format!("http://{address}"))
        .env_remove("REDRIVE_JSON")
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
