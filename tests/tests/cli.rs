//! `redrivectl` against a real planner: import a JSON Lines file (with bad lines
//! and a gzip body), inspect with `--json`, and the reflection service that
//! `grpcurl` relies on.

use std::io::Write;

use base64::Engine;
use clap::Parser;
use redrive_tests::{PlannerHandle, TestBed, init_logging, unique};
use redrivectl::Cli;

async fn redrivectl(planner: &PlannerHandle, args: &[&str]) -> (u8, String) {
    let cli = Cli::try_parse_from(
        [
            "redrivectl",
            "--planner",
            &planner.url(),
            "--actor",
            "tester",
        ]
        .iter()
        .copied()
        .chain(args.iter().copied()),
    )
    .expect("the command line parses");
    let mut out = Vec::new();
    let code = match redrivectl::run(cli, &mut out).await {
        Ok(code) => code,
        Err(error) => error.exit_code(),
    };
    (code, String::from_utf8(out).expect("output is UTF-8"))
}

/// [`redrivectl`] with the error line a person reads on stderr (after
/// `redrivectl: `), empty when the command succeeded.
async fn redrivectl_full(planner: &PlannerHandle, args: &[&str]) -> (u8, String, String) {
    let cli = Cli::try_parse_from(
        [
            "redrivectl",
            "--planner",
            &planner.url(),
            "--actor",
            "tester",
        ]
        .iter()
        .copied()
        .chain(args.iter().copied()),
    )
    .expect("the command line parses");
    let mut out = Vec::new();
    let (code, error) = match redrivectl::run(cli, &mut out).await {
        Ok(code) => (code, String::new()),
        Err(error) => (error.exit_code(), error.to_string()),
    };
    (
        code,
        String::from_utf8(out).expect("output is UTF-8"),
        error,
    )
}

fn gzip(text: &str) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    encoder.write_all(text.as_bytes()).unwrap();
    encoder.finish().unwrap()
}

/// A bed with default settings over a broker with a fresh queue
/// `unique(prefix)` (for replays to land in): the bed and the queue's name.
async fn bed_with_queue(prefix: &str) -> anyhow::Result<(TestBed, String)> {
    let broker = redrive_tests::Broker::connect().await?;
    let queue = unique(prefix);
    broker
        .queue(&queue, lapin::types::FieldTable::default())
        .await?;
    Ok((TestBed::start(broker, |_| {}).await?, queue))
}

/// Writes five dead letters for `queue` (message ids m-0..m-4, the body of
/// each `body(index)`) to a JSON Lines file and imports them under `source`:
/// the file's directory (removed on drop, also on failure) and the file.
async fn import_five(
    planner: &PlannerHandle,
    queue: &str,
    source: &str,
    body: impl Fn(usize) -> String,
) -> anyhow::Result<(tempfile::TempDir, std::path::PathBuf)> {
    let lines: Vec<String> = (0..5)
        .map(|index| {
            serde_json::json!({
                "message_id": format!("m-{index}"),
                "body": body(index),
                "reason": "rejected",
                "original_destination": queue,
            })
            .to_string()
        })
        .collect();
    let dir = tempfile::tempdir()?;
    let file = dir.path().join(format!("{source}.jsonl"));
    std::fs::write(&file, lines.join("\n") + "\n")?;
    let (code, output) = redrivectl(
        planner,
        &["import", file.to_str().unwrap(), "--source", source],
    )
    .await;
    anyhow::ensure!(code == 0, "import: {output}");
    Ok((dir, file))
}

/// `plan create` of `precheck_id` at 100/s with a 1 s observation, then
/// `extra`.
fn create_args<'a>(precheck_id: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "--json",
        "plan",
        "create",
        "--precheck",
        precheck_id,
        "--rate",
        "100",
        "--burst",
        "5",
        "--rationale",
        "the target handles 100/s",
        "--observe",
        "1s",
    ];
    args.extend(extra);
    args
}

/// Runs an executor while `plan wait --json` waits (30 s at most) for the
/// approved plan `plan_id`: the exit code and output.
async fn wait_with_executor(bed: &TestBed, plan_id: &str) -> anyhow::Result<(u8, String)> {
    let executor = redrive_tests::ExecutorHandle::start(redrive_tests::ExecutorHandle::config(
        &bed.planner,
        None,
    ));
    let answer = redrivectl(
        &bed.planner,
        &["--json", "plan", "wait", plan_id, "--timeout", "30s"],
    )
    .await;
    executor.stop().await?;
    Ok(answer)
}

/// The message keys the audit of `plan_id` holds as sent, sorted.
async fn sent_keys(planner: &PlannerHandle, plan_id: &str) -> anyhow::Result<Vec<String>> {
    let (code, output) = redrivectl(planner, &["--json", "plan", "report", plan_id]).await;
    anyhow::ensure!(code == 0, "plan report: {output}");
    let report: serde_json::Value = serde_json::from_str(&output)?;
    let mut keys: Vec<String> = report["sentKeys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|key| key.as_str().unwrap().to_owned())
        .collect();
    keys.sort();
    Ok(keys)
}

/// Imports are bounded in bytes as well as in count: lines of large bodies
/// go through, each `IngestDeadLetters` call ending at `--batch-bytes`
/// (three calls of two 5 MiB bodies under 12 MiB, each committed on its
/// own), and
/// every body is stored whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_import_of_large_lines_goes_through_in_calls_bounded_by_bytes() -> anyhow::Result<()> {
    init_logging();
    const MIB: usize = 1024 * 1024;
    let bed = TestBed::without_broker(|_| {}).await?;
    let source = unique("large");
    let file_dir = tempfile::tempdir()?;
    let file = file_dir.path().join(format!("{source}.jsonl"));
    {
        let mut out = std::io::BufWriter::new(std::fs::File::create(&file)?);
        for n in 0..6 {
            writeln!(
                out,
                r#"{{"message_id":"m-{n}","body":"{}","original_destination":"orders"}}"#,
                "x".repeat(5 * MIB)
            )?;
        }
    }
    let batch_bytes = (12 * MIB).to_string();
    let (code, output) = redrivectl(
        &bed.planner,
        &[
            "--json",
            "import",
            file.to_str().unwrap(),
            "--source",
            &source,
            "--batch-bytes",
            &batch_bytes,
        ],
    )
    .await;
    assert_eq!(code, 0, "{output}");
    let summary: serde_json::Value = serde_json::from_str(&output)?;
    assert_eq!(summary["imported"], 6, "{output}");
    let pool = bed.pool().await?;
    let (stored, whole, calls): (i64, i64, i64) = sqlx::query_as(
        "SELECT count(*), count(*) FILTER (WHERE octet_length(body) = $2), count(DISTINCT xmin::text) \
         FROM dead_letters WHERE source = $1",
    )
    .bind(&source)
    .bind(i32::try_from(5 * MIB)?)
    .fetch_one(&pool)
    .await?;
    assert_eq!((stored, whole), (6, 6), "every body stored whole");
    assert_eq!(calls, 3, "one commit per call of two bodies");
    pool.close().await;
    bed.finish().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn import_then_inspect_with_stable_json() -> anyhow::Result<()> {
    init_logging();
    let bed = TestBed::without_broker(|_| {}).await?;
    let source = unique("legacy");
    let compressed = gzip(r#"{"order_id":"o-2"}"#);
    let lines = [
        r#"{"message_id":"m-1","body":"{\"order_id\":\"o-1\"}","headers":{"event-type":"order.paid","retries":{"type":"i32","value":3}},"properties":{"content_type":"application/json"},"reason":"rejected","error_text":"stock timeout","original_destination":"orders","occurred_at":"2026-05-01T12:00:00Z"}"#.to_owned(),
        "this is not json".to_owned(),
        format!(
            r#"{{"message_id":"m-2","body_base64":"{}","reason":"delivery_limit","original_destination":"orders"}}"#,
            base64::engine::general_purpose::STANDARD.encode(&compressed)
        ),
        r#"{"message_id":"m-3","body":"x"}"#.to_owned(),
    ];
    let file_dir = tempfile::tempdir()?; // removed on drop, also on failure
    let file = file_dir.path().join(format!("{source}.jsonl"));
    std::fs::write(&file, lines.join("\n") + "\n")?;
    let path = file.to_str().unwrap();

    let (code, output) = redrivectl(
        &bed.planner,
        &["--json", "import", path, "--source", &source],
    )
    .await;
    assert_eq!(code, 65, "rejected lines make exit 65: {output}");
    let summary: serde_json::Value = serde_json::from_str(&output)?;
    assert_eq!(summary["imported"], 2);
    let rejected: Vec<u64> = summary["rejected"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["line"].as_u64().unwrap())
        .collect();
    assert_eq!(rejected, vec![2, 4], "bad lines are named by line number");
    let (_, again) = redrivectl(
        &bed.planner,
        &["--json", "import", path, "--source", &source],
    )
    .await;
    let again: serde_json::Value = serde_json::from_str(&again)?;
    assert_eq!(
        (again["imported"].as_u64(), again["duplicates"].as_u64()),
        (Some(0), Some(2))
    );

    let (code, output) = redrivectl(
        &bed.planner,
        &["--json", "dead-letters", "list", "--source", &source],
    )
    .await;
    assert_eq!(code, 0);
    let list: serde_json::Value = serde_json::from_str(&output)?;
    // The API's canonical proto3 JSON (ListDeadLettersResponse).
    let dead_letters = list["deadLetters"].as_array().unwrap();
    assert_eq!(dead_letters.len(), 2);
    assert_eq!(list.get("nextPageToken"), None, "the last page: no token");
    let m2 = dead_letters
        .iter()
        .find(|d| d["messageId"] == "m-2")
        .unwrap();
    let id = m2["id"].as_str().unwrap().to_owned();

    let (code, output) = redrivectl(&bed.planner, &["--json", "dead-letters", "show", &id]).await;
    assert_eq!(code, 0);
    // GetDeadLetterResponse: the dead letter and the planner's preview.
    let response: serde_json::Value = serde_json::from_str(&output)?;
    let shown = &response["deadLetter"];
    let body = base64::engine::general_purpose::STANDARD.decode(shown["body"].as_str().unwrap())?;
    assert_eq!(body, compressed, "the gzip body comes back byte-exact");
    assert_eq!(shown["bodyCompression"], "BODY_COMPRESSION_GZIP");
    assert_eq!(shown["origin"], "ORIGIN_IMPORT");
    assert_eq!(shown["reasonClass"], "REASON_CLASS_EXHAUSTED");
    assert_eq!(shown["destination"], "orders");
    assert_eq!(shown["death"]["reason"], "delivery_limit");
    assert!(
        response["bodyPreview"]
            .as_str()
            .unwrap()
            .contains("\"order_id\": \"o-2\"")
    );
    for field in [
        "source",
        "messageKey",
        "bodySha256",
        "properties",
        "headers",
        "diedAt",
        "capturedAt",
    ] {
        assert!(shown.get(field).is_some(), "show --json has {field}");
    }

    let (_, output) = redrivectl(
        &bed.planner,
        &[
            "--json",
            "dead-letters",
            "summary",
            "--source",
            &source,
            "--group-by",
            "reason",
        ],
    )
    .await;
    let summary: serde_json::Value = serde_json::from_str(&output)?;
    assert_eq!(summary["total"], "2");
    assert_eq!(summary["groups"].as_array().unwrap().len(), 2);

    let (code, output) =
        redrivectl(&bed.planner, &["--json", "precheck", "--source", &source]).await;
    assert_eq!(code, 0);
    let report: serde_json::Value = serde_json::from_str(&output)?;
    assert_eq!(report["actor"], "tester", "the actor travels as metadata");
    assert_eq!(report["total"], "2");
    assert_eq!(report["counts"]["replayable"], "2");

    let (code, _) = redrivectl(&bed.planner, &["dead-letters", "show", "999999"]).await;
    assert_eq!(code, 65, "an unknown id is refused input");
    bed.finish().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reflection_lists_the_redrive_services() -> anyhow::Result<()> {
    use tonic_reflection::pb::v1::{
        ServerReflectionRequest, server_reflection_client::ServerReflectionClient,
        server_reflection_request::MessageRequest, server_reflection_response::MessageResponse,
    };
    let bed = TestBed::without_broker(|_| {}).await?;
    let channel = bed.planner.channel().await?;
    let mut client = ServerReflectionClient::new(channel);
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut responses = client
        .server_reflection_info(tokio_stream::iter(vec![request]))
        .await?
        .into_inner();
    let response = responses.message().await?.expect("one answer");
    let Some(MessageResponse::ListServicesResponse(list)) = response.message_response else {
        panic!("a service list");
    };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    for service in [
        "redrive.v1.Planner",
        "redrive.v1.Coordinator",
        "grpc.health.v1.Health",
    ] {
        assert!(names.iter().any(|n| n == service), "{service} in {names:?}");
    }

    // The older v1alpha protocol too (grpcurl before 1.8.8, grpcui, Postman).
    {
        use tonic_reflection::pb::v1alpha::{
            ServerReflectionRequest, server_reflection_client::ServerReflectionClient,
            server_reflection_request::MessageRequest, server_reflection_response::MessageResponse,
        };
        let channel = bed.planner.channel().await?;
        let mut client = ServerReflectionClient::new(channel);
        let request = ServerReflectionRequest {
            host: String::new(),
            message_request: Some(MessageRequest::ListServices(String::new())),
        };
        let response = client
            .server_reflection_info(tokio_stream::iter(vec![request]))
            .await?
            .into_inner()
            .message()
            .await?
            .expect("one answer");
        let Some(MessageResponse::ListServicesResponse(list)) = response.message_response else {
            panic!("a service list");
        };
        assert!(
            list.service.iter().any(|s| s.name == "redrive.v1.Planner"),
            "{list:?}"
        );
    }
    bed.finish().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_plan_through_redrivectl_from_create_to_report() -> anyhow::Result<()> {
    init_logging();
    let (bed, queue) = bed_with_queue("cli_target").await?;
    let source = unique("svc");
    let _file = import_five(&bed.planner, &queue, &source, |index| {
        format!(r#"{{"order_id":"o-{index}"}}"#)
    })
    .await?;
    let (_, output) = redrivectl(&bed.planner, &["--json", "precheck", "--source", &source]).await;
    let report: serde_json::Value = serde_json::from_str(&output)?;
    let precheck_id = report["precheckId"].as_str().unwrap().to_owned();
    let digest = report["digest"].as_str().unwrap().to_owned();

    let (code, output) = redrivectl(&bed.planner, &create_args(&precheck_id, &[])).await;
    assert_eq!(code, 0, "{output}");
    let plan: serde_json::Value = serde_json::from_str(&output)?;
    assert_eq!(plan["state"], "PLAN_STATE_AWAITING_APPROVAL");
    let plan_id = plan["planId"].as_str().unwrap().to_owned();
    let (code, _) = redrivectl(
        &bed.planner,
        &["plan", "approve", &plan_id, "--digest", "wrong"],
    )
    .await;
    assert_ne!(code, 0, "a wrong digest is refused");
    let (code, output) = redrivectl(
        &bed.planner,
        &["--json", "plan", "approve", &plan_id, "--digest", &digest],
    )
    .await;
    assert_eq!(code, 0, "{output}");

    let (code, output) = wait_with_executor(&bed, &plan_id).await?;
    assert_eq!(code, 0, "{output}");
    let done: serde_json::Value = serde_json::from_str(output.lines().last().unwrap())?;
    assert_eq!(done["state"], "PLAN_STATE_COMPLETED");
    assert_eq!(done["counts"]["sent"], "5");
    assert_eq!(
        bed.broker().ready_count(&queue).await?,
        5,
        "the target received the five"
    );

    assert_eq!(sent_keys(&bed.planner, &plan_id).await?.len(), 5);
    let (code, csv) = redrivectl(
        &bed.planner,
        &["plan", "report", &plan_id, "--format", "csv"],
    )
    .await;
    assert_eq!(code, 0);
    assert!(csv.starts_with("at,plan_id,slice_id"), "{csv}");
    assert_eq!(
        csv.lines().filter(|line| line.contains(",sent,")).count(),
        5
    );
    let (code, jsonl) = redrivectl(
        &bed.planner,
        &["plan", "report", &plan_id, "--format", "jsonl"],
    )
    .await;
    assert_eq!(code, 0);
    assert_eq!(jsonl.lines().count(), 5);
    bed.finish().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn repair_then_replay_one_dead_letter_through_redrivectl() -> anyhow::Result<()> {
    init_logging();
    let (bed, queue) = bed_with_queue("cli_single").await?;
    let source = unique("svc");
    let line = format!(
        r#"{{"message_id":"m-1","body":"{{\"order_id\":\"o-1\",\"qty\":-1}}","reason":"rejected","original_destination":"{queue}"}}"#
    );
    let file_dir = tempfile::tempdir()?; // removed on drop, also on failure
    let file = file_dir.path().join(format!("{source}.jsonl"));
    std::fs::write(&file, line + "\n")?;
    let (code, _) = redrivectl(
        &bed.planner,
        &["import", file.to_str().unwrap(), "--source", &source],
    )
    .await;
    assert_eq!(code, 0);
    let (_, output) = redrivectl(
        &bed.planner,
        &["--json", "dead-letters", "list", "--source", &source],
    )
    .await;
    let listed: serde_json::Value = serde_json::from_str(&output)?;
    let id = listed["deadLetters"][0]["id"].as_str().unwrap().to_owned();

    let body_file_dir = tempfile::tempdir()?; // removed on drop, also on failure

    let body_file = body_file_dir.path().join(format!("{source}.body"));
    std::fs::write(&body_file, br#"{"order_id":"o-1","qty":1}"#)?;
    let (code, output) = redrivectl(
        &bed.planner,
        &[
            "dead-letters",
            "repair",
            &id,
            "--body-file",
            "/nonexistent/body.json",
            "--reason",
            "x",
        ],
    )
    .await;
    assert_eq!(code, 66, "a missing body file: {output}");
    let (code, output) = redrivectl(
        &bed.planner,
        &[
            "--json",
            "dead-letters",
            "repair",
            &id,
            "--body-file",
            body_file.to_str().unwrap(),
            "--reason",
            "negative quantity from bug 981",
        ],
    )
    .await;
    assert_eq!(code, 0, "{output}");
    let repaired: serde_json::Value = serde_json::from_str(&output)?;
    // GetDeadLetterResponse, as for show.
    let repaired = &repaired["deadLetter"];
    assert_eq!(repaired["revisions"][0]["revision"], 1);
    assert_eq!(repaired["revisions"][0]["actor"], "tester");

    let executor = redrive_tests::ExecutorHandle::start(redrive_tests::ExecutorHandle::config(
        &bed.planner,
        None,
    ));
    let (code, output) = redrivectl(
        &bed.planner,
        &["--json", "replay", &id, "--reason", "ticket 4711"],
    )
    .await;
    assert_eq!(code, 0, "{output}");
    let first: serde_json::Value = serde_json::from_str(&output)?;
    // ReplayDeadLetterResponse.
    assert_eq!(first["outcome"], "OUTCOME_REPLAYED", "{output}");
    assert_eq!(first["event"]["action"], "AUDIT_ACTION_SENT");
    let (code, output, error) = redrivectl_full(
        &bed.planner,
        &["--json", "replay", &id, "--reason", "ticket 4711"],
    )
    .await;
    // Said once, on stdout: stderr gets no second copy of the answer.
    let (text_code, text, text_error) =
        redrivectl_full(&bed.planner, &["replay", &id, "--reason", "ticket 4711"]).await;
    executor.stop().await?;
    assert_eq!(code, 1, "NOT_REPLAYED exits 1: {output}");
    assert_eq!(error, "", "no error line after the answer");
    assert_eq!((text_code, text_error.as_str()), (1, ""), "{text}");
    assert_eq!(text.matches("NOT_REPLAYED").count(), 1, "{text}");
    assert!(
        text.starts_with(&format!("NOT_REPLAYED: dead letter {id}: already_replayed")),
        "{text}"
    );
    let second: serde_json::Value = serde_json::from_str(&output)?;
    assert_eq!(second["outcome"], "OUTCOME_NOT_REPLAYED");
    assert!(
        second["reason"]
            .as_str()
            .unwrap()
            .starts_with("already_replayed"),
        "{output}"
    );

    // The target got one message, with the repaired body.
    let channel = bed.broker().connection.create_channel().await?;
    let delivery = channel
        .basic_get(queue.as_str().into(), Default::default())
        .await?
        .expect("one message");
    assert_eq!(delivery.data, br#"{"order_id":"o-1","qty":1}"#);
    assert!(
        channel
            .basic_get(queue.as_str().into(), Default::default())
            .await?
            .is_none(),
        "and only one"
    );
    channel.close(200, "done".into()).await?;
    bed.finish().await
}

/// A typo in a source is an error wherever a source is given, the same one
/// `precheck` gives: `NotFound` naming the source, the closest known name
/// and the known ones, from the planner (so any client gets it) and from
/// `redrivectl` (exit 65).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_source_is_refused_wherever_a_source_is_given() -> anyhow::Result<()> {
    use redrive_proto::v1;
    init_logging();
    let bed = TestBed::without_broker(|_| {}).await?;
    let source = unique("nt3_orders.dlq");
    let file_dir = tempfile::tempdir()?;
    let file = file_dir.path().join("one.jsonl");
    std::fs::write(
        &file,
        r#"{"message_id":"m-1","body":"{}","headers":{"event-type":"order.paid"},"reason":"rejected","original_destination":"orders"}"#.to_owned() + "\n",
    )?;
    let path = file.to_str().unwrap();
    let (code, output) = redrivectl(&bed.planner, &["import", path, "--source", &source]).await;
    assert_eq!(code, 0, "{output}");
    // Two letters swapped, as fingers do.
    let typo = source.replacen("nt3", "n3t", 1);
    let expected = format!(
        "selector.sources[0] {typo:?} (did you mean {source:?}?): no dead letter from this \
         source has ever been stored (a typo?); known sources: {source}"
    );
    let selector = || {
        Some(v1::Selector {
            sources: vec![typo.clone()],
            ..Default::default()
        })
    };
    let mut client = bed.client.clone();
    let refusals = [
        (
            "ListDeadLetters",
            client
                .list_dead_letters(v1::ListDeadLettersRequest {
                    selector: selector(),
                    ..Default::default()
                })
                .await
                .map(drop),
        ),
        (
            "SummarizeDeadLetters",
            client
                .summarize_dead_letters(v1::SummarizeDeadLettersRequest {
                    selector: selector(),
                    group_by: vec![],
                })
                .await
                .map(drop),
        ),
        (
            "ArchiveDeadLetters",
            client
                .archive_dead_letters(v1::ArchiveDeadLettersRequest {
                    selector: selector(),
                    reason: "done by hand".into(),
                })
                .await
                .map(drop),
        ),
        (
            "UnarchiveDeadLetters",
            client
                .unarchive_dead_letters(v1::ArchiveDeadLettersRequest {
                    selector: selector(),
                    reason: "needed after all".into(),
                })
                .await
                .map(drop),
        ),
        (
            "RunPrecheck",
            client
                .run_precheck(v1::RunPrecheckRequest {
                    selector: selector(),
                    options: None,
                })
                .await
                .map(drop),
        ),
    ];
    for (rpc, answer) in refusals {
        let status = answer.expect_err(rpc);
        assert_eq!(status.code(), tonic::Code::NotFound, "{rpc}: {status:?}");
        assert_eq!(status.message(), expected, "{rpc}");
    }

    // What a person types, and what they read: exit 65, the planner's words.
    for command in [
        vec!["dead-letters", "summary", "--source", &typo],
        vec!["dead-letters", "list", "--source", &typo],
        vec![
            "dead-letters",
            "archive",
            "--source",
            &typo,
            "--reason",
            "x",
        ],
        vec![
            "dead-letters",
            "unarchive",
            "--source",
            &typo,
            "--reason",
            "x",
        ],
        vec!["precheck", "--source", &typo],
    ] {
        let (code, output, error) = redrivectl_full(&bed.planner, &command).await;
        assert_eq!(code, 65, "{command:?}: {output}");
        assert_eq!(output, "", "{command:?}: nothing reads like an answer");
        assert_eq!(error, format!("not_found: {expected}"), "{command:?}");
    }
    // A second source that is right does not hide the wrong one; the right
    // one alone is answered.
    let (code, _, error) = redrivectl_full(
        &bed.planner,
        &[
            "dead-letters",
            "list",
            "--source",
            &source,
            "--source",
            &typo,
        ],
    )
    .await;
    assert_eq!(code, 65);
    assert!(
        error.contains(&format!("selector.sources[1] {typo:?}")),
        "{error}"
    );
    let (code, output, error) = redrivectl_full(
        &bed.planner,
        &["dead-letters", "summary", "--source", &source],
    )
    .await;
    assert_eq!(code, 0, "{error}");
    // The default summary says what died, why and where.
    let mut lines = output.lines();
    let header: Vec<&str> = lines
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(
        header[..4],
        ["EVENT_TYPE", "REASON", "DESTINATION", "COUNT"],
        "{output}"
    );
    let row: Vec<&str> = lines
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(
        row[..4],
        ["order.paid", "rejected", "orders", "1"],
        "{output}"
    );
    assert!(output.ends_with("total: 1\n"), "{output}");
    bed.finish().await
}

/// `redrivectl` with exactly `args` (no planner or actor added): exit code,
/// stdout and the error line.
async fn redrivectl_bare(args: &[&str]) -> (u8, String, String) {
    let cli = Cli::try_parse_from(std::iter::once("redrivectl").chain(args.iter().copied()))
        .expect("the command line parses");
    let mut out = Vec::new();
    let (code, error) = match redrivectl::run(cli, &mut out).await {
        Ok(code) => (code, String::new()),
        Err(error) => (error.exit_code(), error.to_string()),
    };
    (code, String::from_utf8_lossy(&out).into_owned(), error)
}

/// docs/security.md's development PKI, run as written: a planner serves the
/// certificate it makes (SAN 127.0.0.1 and localhost) and trusts its client
/// certificates; `redrivectl` reaches it with `--ca`, the executor's
/// certificate authenticates as `executor-1`; and the two TLS mistakes a
/// new user makes say what to do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_security_docs_pki_recipe_works() -> anyhow::Result<()> {
    init_logging();
    let docs = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/security.md"),
    )?;
    let recipe = docs
        .split("<!-- dev-pki -->\n```sh\n")
        .nth(1)
        .and_then(|rest| rest.split("\n```").next())
        .expect("docs/security.md has the dev-pki block");
    let dir = tempfile::tempdir()?;
    let run = std::process::Command::new("sh")
        .arg("-e")
        .arg("-c")
        .arg(recipe)
        .current_dir(dir.path())
        .output()?;
    assert!(
        run.status.success(),
        "the recipe fails: {}",
        String::from_utf8_lossy(&run.stderr)
    );
    let pki = dir.path().join("pki");
    let file = |name: &str| pki.join(name);
    let text = |name: &str| file(name).to_string_lossy().into_owned();

    let db = redrive_tests::TestDb::new();
    let mut config = redrive_planner::Config::for_database(db.url());
    config.tls_cert = Some(file("planner.pem"));
    config.tls_key = Some(file("planner.key"));
    config.tls_client_ca = Some(file("ca.pem"));
    config.cert_roles = vec!["executor-*=executor".to_owned()];
    let mut planner = PlannerHandle::start_with(
        config,
        redrive_proto::tls::ClientTlsFiles {
            ca: Some(file("ca.pem")),
            client_cert: Some(file("executor-1.pem")),
            client_key: Some(file("executor-1.key")),
        },
    )
    .await?;
    let port = planner.addr.port();
    let https = format!("https://127.0.0.1:{port}");
    let ca = text("ca.pem");

    // Through TLS with the executor's certificate, by IP and by name: the
    // planner knows it as executor-1, whose role may not list plans.
    for url in [https.clone(), format!("https://localhost:{port}")] {
        let (code, _, error) = redrivectl_bare(&[
            "--planner",
            &url,
            "--ca",
            &ca,
            "--tls-client-cert",
            &text("executor-1.pem"),
            "--tls-client-key",
            &text("executor-1.key"),
            "plan",
            "list",
        ])
        .await;
        assert_eq!(code, 1, "{error}");
        assert!(
            error.starts_with("permission_denied: ") && error.contains("executor-1"),
            "{url}: {error}"
        );
    }

    // http:// to the TLS port.
    let (code, out, error) = redrivectl_bare(&[
        "--planner",
        &format!("http://127.0.0.1:{port}"),
        "plan",
        "list",
    ])
    .await;
    assert_eq!((code, out.as_str()), (69, ""), "{error}");
    assert!(
        error.starts_with(&format!(
            "the planner at 127.0.0.1:{port} speaks TLS: use https://127.0.0.1:{port} and --ca FILE"
        )),
        "{error}"
    );
    assert!(!error.contains("is redrive-planner running"), "{error}");

    // https:// without --ca: the dev CA is not among the platform's roots.
    let (code, out, error) = redrivectl_bare(&["--planner", &https, "plan", "list"]).await;
    assert_eq!((code, out.as_str()), (69, ""), "{error}");
    assert!(
        error.starts_with(&format!(
            "the planner at {https} presented a certificate that is not signed by a CA this \
             client trusts: pass the CA that signed it with --ca FILE"
        )),
        "{error}"
    );
    assert!(!error.contains("is redrive-planner running"), "{error}");

    planner.halt().await?;
    db.drop_database().await;
    Ok(())
}

/// An orchestrator's script run twice with the same `--idempotency-key`s (a
/// retried Airflow task): one precheck, one plan, one approval, every
/// message delivered once; the same key with other flags is refused by the
/// planner naming the key; a key where it cannot help is refused before the
/// network.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_script_with_idempotency_keys_makes_one_plan() -> anyhow::Result<()> {
    init_logging();
    let (bed, queue) = bed_with_queue("cli_keyed").await?;
    let source = unique("svc");
    let (_dir, file) =
        import_five(&bed.planner, &queue, &source, |index| format!("o-{index}")).await?;
    let run = unique("run");
    let precheck_key = format!("{run}:precheck");
    let create_key = format!("{run}:create");
    let approve_key = format!("{run}:approve");

    let mut answers = Vec::new();
    for attempt in 0..2 {
        let (code, output) = redrivectl(
            &bed.planner,
            &[
                "--json",
                "--idempotency-key",
                &precheck_key,
                "precheck",
                "--source",
                &source,
            ],
        )
        .await;
        assert_eq!(code, 0, "attempt {attempt}: {output}");
        let report: serde_json::Value = serde_json::from_str(&output)?;
        let precheck_id = report["precheckId"].as_str().unwrap().to_owned();
        let digest = report["digest"].as_str().unwrap().to_owned();
        let (code, output) = redrivectl(
            &bed.planner,
            &create_args(&precheck_id, &["--idempotency-key", &create_key]),
        )
        .await;
        assert_eq!(code, 0, "attempt {attempt}: {output}");
        let plan: serde_json::Value = serde_json::from_str(&output)?;
        let plan_id = plan["planId"].as_str().unwrap().to_owned();
        let (code, output) = redrivectl(
            &bed.planner,
            &[
                "--json",
                "--idempotency-key",
                &approve_key,
                "plan",
                "approve",
                &plan_id,
                "--digest",
                &digest,
            ],
        )
        .await;
        assert_eq!(code, 0, "attempt {attempt}: the approval again: {output}");
        answers.push((precheck_id, plan_id));
    }
    assert_eq!(
        answers[0], answers[1],
        "the retry got the first precheck and the first plan"
    );
    let plan_id = answers[0].1.clone();

    // The same key with another request: refused, naming the key.
    let (code, _, error) = redrivectl_full(
        &bed.planner,
        &[
            "--idempotency-key",
            &precheck_key,
            "precheck",
            "--source",
            &source,
            "--max-redrives",
            "7",
        ],
    )
    .await;
    assert_eq!(code, 1, "{error}");
    assert!(
        error.contains(&precheck_key) && error.contains("another request"),
        "{error}"
    );
    // Where a key cannot help: refused before the network, saying why.
    for (args, says) in [
        (
            vec!["plan", "list"],
            "`plan status`, `list`, `watch`, `wait`, `report` and `compensations` (reads) change nothing",
        ),
        (
            vec!["precheck", "--source", &source, "--since", "1h"],
            "give the window as --from TIME",
        ),
        (
            vec!["import", file.to_str().unwrap(), "--source", &source],
            "`import` needs none",
        ),
    ] {
        let mut full = vec!["--idempotency-key", "k-1"];
        full.extend(args);
        let (code, _, error) = redrivectl_full(&bed.planner, &full).await;
        assert_eq!(code, 64, "{full:?}: {error}");
        assert!(error.contains(says), "{full:?}: {error}");
    }

    let (code, output) = wait_with_executor(&bed, &plan_id).await?;
    assert_eq!(code, 0, "{output}");
    let (code, output) = redrivectl(&bed.planner, &["--json", "plan", "list"]).await;
    assert_eq!(code, 0, "{output}");
    let listed: serde_json::Value = serde_json::from_str(&output)?;
    let plans = listed["plans"].as_array().unwrap();
    assert_eq!(plans.len(), 1, "one plan in this test's database: {output}");
    assert_eq!(plans[0]["planId"], plan_id.as_str());
    // What the consumer received, each once, all of it audited as sent.
    let mut received: Vec<String> = bed
        .broker()
        .drain(&queue)
        .await?
        .into_iter()
        .map(|body| String::from_utf8(body).unwrap().replace("o-", "m-"))
        .collect();
    received.sort();
    assert_eq!(received, ["m-0", "m-1", "m-2", "m-3", "m-4"]);
    assert_eq!(
        received,
        sent_keys(&bed.planner, &plan_id).await?,
        "received ⊆ audited sent"
    );
    bed.finish().await
}
