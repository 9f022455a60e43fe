//! Re-keying a stored backlog (`RekeyDeadLetters`; docs/replay.md,
//! "Identity", "Re-keying a stored backlog") against PostgreSQL and
//! RabbitMQ: keys recomputed from the stored message, duplicates found by
//! the precheck, the re-key audited on each dead letter, and the ledger
//! unchanged: a dead letter replayed under its former key stays
//! `already_replayed`.

use std::time::Duration;

use redrive_proto::v1::{
    self, DeadLetterStatus, GetDeadLetterRequest, IngestDeadLettersRequest, ListDeadLettersRequest,
    RekeyDeadLettersRequest, RunPrecheckRequest, Selector,
};
use redrive_tests::{
    Broker, ExecutorHandle, TestBed, init_logging, pki::Pki, pki::token_of, unique,
};
use tonic::Code;

mod support;
use support::{
    approved_plan, as_actor, audit_report, captured, capturing, incident, wait_completed,
};

type Client = v1::planner_client::PlannerClient<tonic::transport::Channel>;

fn of(source: &str) -> Selector {
    Selector {
        sources: vec![source.to_owned()],
        ..Default::default()
    }
}

fn rekey(source: &str, rules: &[&str], reason: &str) -> RekeyDeadLettersRequest {
    RekeyDeadLettersRequest {
        selector: Some(of(source)),
        key_rules: rules.iter().map(|rule| (*rule).to_owned()).collect(),
        reason: reason.to_owned(),
    }
}

async fn counts(client: &mut Client, source: &str) -> anyhow::Result<v1::VerdictCounts> {
    Ok(client
        .run_precheck(RunPrecheckRequest {
            selector: Some(of(source)),
            options: None,
        })
        .await?
        .into_inner()
        .counts
        .unwrap_or_default())
}

async fn keys(client: &mut Client, source: &str) -> anyhow::Result<Vec<(String, String)>> {
    Ok(client
        .list_dead_letters(ListDeadLettersRequest {
            selector: Some(Selector {
                status: DeadLetterStatus::All.into(),
                ..of(source)
            }),
            page_size: 1000,
            page_token: String::new(),
        })
        .await?
        .into_inner()
        .dead_letters
        .into_iter()
        .map(|dead_letter| (dead_letter.id, dead_letter.message_key))
        .collect())
}

/// A backlog keyed by its body hash (no message ids) is re-keyed by a body
/// field: the keys change, the retries of one order are now duplicates, each
/// dead letter shows the re-key (who, when, from what, why) and its former
/// key. Bad rules and a missing reason are `InvalidArgument` naming the field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rekey_by_a_body_field_finds_the_retries_of_one_order() -> anyhow::Result<()> {
    init_logging();
    let mut bed = TestBed::without_broker(|_| {}).await?;
    let source = unique("rekey");
    let bodies = [
        r#"{"order_id":"o-1","try":1}"#,
        r#"{"order_id":"o-1","try":2}"#,
        r#"{"order_id":"o-1","try":3}"#,
        r#"{"order_id":"o-2"}"#,
    ];
    let items: Vec<IngestDeadLettersRequest> = bodies
        .iter()
        .map(|body| IngestDeadLettersRequest {
            source: source.clone(),
            body: body.as_bytes().to_vec(),
            reason: "rejected".to_owned(),
            original_destination: "orders".to_owned(),
            ..Default::default()
        })
        .collect();
    bed.client
        .ingest_dead_letters(tokio_stream::iter(items))
        .await?;
    let before = keys(&mut bed.client, &source).await?;
    assert!(
        before.iter().all(|(_, key)| key.starts_with("sha256:")),
        "{before:?}"
    );
    let first = counts(&mut bed.client, &source).await?;
    assert_eq!((first.replayable, first.duplicate), (4, 0));

    // Bad requests change nothing.
    for (rules, reason, field) in [
        (
            &["json:/order_id", "propety:message_id"][..],
            "why",
            "key_rules[1]:",
        ),
        (&["json:order_id"][..], "why", "key_rules[0]:"),
        (&["json:/order_id"][..], "  ", "reason:"),
    ] {
        let error = bed
            .client
            .rekey_dead_letters(rekey(&source, rules, reason))
            .await
            .unwrap_err();
        assert_eq!(error.code(), Code::InvalidArgument, "{error:?}");
        assert!(error.message().starts_with(field), "{}", error.message());
    }
    let error = bed
        .client
        .rekey_dead_letters(RekeyDeadLettersRequest {
            selector: Some(Selector::default()),
            key_rules: vec!["body".into()],
            reason: "all".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(error.code(), Code::InvalidArgument);
    assert!(
        error.message().starts_with("selector:"),
        "{}",
        error.message()
    );
    let error = bed
        .client
        .rekey_dead_letters(rekey("no-such-dlq-here", &["body"], "why"))
        .await
        .unwrap_err();
    assert_eq!(error.code(), Code::NotFound, "{error:?}");
    assert_eq!(keys(&mut bed.client, &source).await?, before);

    let answer = bed
        .client
        .rekey_dead_letters(as_actor(
            "alice",
            rekey(&source, &["json:/order_id"], "orders retry with new bodies"),
        ))
        .await?
        .into_inner();
    assert_eq!((answer.rekeyed, answer.changed), (4, 4), "{answer:?}");
    assert_eq!(answer.examples.len(), 4);
    assert_eq!(answer.examples[0].old_key, before[0].1);
    assert_eq!(answer.examples[0].new_key, "o-1");
    let after: Vec<String> = keys(&mut bed.client, &source)
        .await?
        .into_iter()
        .map(|(_, key)| key)
        .collect();
    assert_eq!(after, ["o-1", "o-1", "o-1", "o-2"]);
    let second = counts(&mut bed.client, &source).await?;
    assert_eq!((second.replayable, second.duplicate), (2, 2));

    let shown = bed
        .client
        .get_dead_letter(GetDeadLetterRequest {
            id: before[0].0.clone(),
        })
        .await?
        .into_inner()
        .dead_letter
        .unwrap_or_default();
    assert_eq!(shown.previous_message_keys, [before[0].1.clone()]);
    let line = shown
        .archive_history
        .iter()
        .find(|record| record.action == "rekey")
        .expect("a rekey line");
    assert_eq!(line.actor, "alice");
    assert!(line.at.is_some());
    assert_eq!(
        line.reason,
        format!(
            "re-keyed from {} to o-1 with --message-key json:/order_id (rekey {}): orders retry with new bodies",
            before[0].1, answer.rekey_id
        )
    );
    let (actor, rules, rekeyed, changed, finished): (String, Vec<String>, i64, i64, bool) =
        sqlx::query_as(
            "SELECT actor, key_rules, rekeyed, changed, finished_at IS NOT NULL \
             FROM dead_letter_rekeys WHERE id = $1",
        )
        .bind(answer.rekey_id.parse::<i64>()?)
        .fetch_one(&bed.pool().await?)
        .await?;
    assert_eq!(
        (actor.as_str(), rules, rekeyed, changed, finished),
        ("alice", vec!["json:/order_id".to_owned()], 4, 4, true)
    );

    // The same re-key again changes nothing; re-keying back restores the
    // hashes and keeps both former keys apart from the current one.
    let again = bed
        .client
        .rekey_dead_letters(rekey(&source, &["json:/order_id"], "again"))
        .await?
        .into_inner();
    assert_eq!((again.rekeyed, again.changed), (4, 0));
    let back = bed
        .client
        .rekey_dead_letters(rekey(&source, &["body"], "back to hashes"))
        .await?
        .into_inner();
    assert_eq!((back.rekeyed, back.changed), (4, 4));
    assert_eq!(keys(&mut bed.client, &source).await?, before);
    let shown = bed
        .client
        .get_dead_letter(GetDeadLetterRequest {
            id: before[0].0.clone(),
        })
        .await?
        .into_inner()
        .dead_letter
        .unwrap_or_default();
    assert_eq!(shown.previous_message_keys, ["o-1"]);

    // A dead letter a plan that has not ended holds is not re-keyed: the
    // plan's items keep the keys they were frozen with. Nothing changes.
    let report = bed
        .client
        .run_precheck(RunPrecheckRequest {
            selector: Some(of(&source)),
            options: None,
        })
        .await?
        .into_inner();
    let plan = bed
        .client
        .create_plan(v1::CreatePlanRequest {
            precheck_id: report.precheck_id,
            rate: Some(v1::Rate {
                per_second: 10.0,
                burst: 1,
                rationale: "the test consumer takes ten a second".into(),
            }),
            slice_size: 10,
            ..Default::default()
        })
        .await?
        .into_inner();
    let error = bed
        .client
        .rekey_dead_letters(rekey(&source, &["json:/order_id"], "during a plan"))
        .await
        .unwrap_err();
    assert_eq!(error.code(), Code::FailedPrecondition, "{error:?}");
    assert!(
        error.message().contains(&plan.plan_id) && error.message().contains("awaiting_approval"),
        "{}",
        error.message()
    );
    assert_eq!(keys(&mut bed.client, &source).await?, before);
    bed.finish().await
}

/// The issue's case: a backlog captured under body-hash keys is replayed
/// (RabbitMQ, an executor, publisher confirms), then re-keyed to the default
/// rule (`m-0`, ...). The audit still says `sha256:…` was delivered, and the
/// re-keyed dead letters stay `already_replayed`: a delivered message does
/// not become replayable again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replayed_dead_letter_stays_already_replayed_after_a_rekey() -> anyhow::Result<()> {
    init_logging();
    let broker = Broker::connect().await?;
    let incident = incident(&broker, 3).await?;
    let mut bed = TestBed::start(broker, |config| {
        capturing(config, &[&incident.dlq]);
        config.message_keys = vec!["body".to_owned()];
    })
    .await?;
    captured(&mut bed.client, &incident.dlq, 3).await?;
    let hashed = keys(&mut bed.client, &incident.dlq).await?;
    assert!(
        hashed.iter().all(|(_, key)| key.starts_with("sha256:")),
        "{hashed:?}"
    );
    let plan = approved_plan(&mut bed.client, &incident.dlq, 100.0, 10, None).await?;
    let executor = ExecutorHandle::start(bed.executor_config());
    wait_completed(&mut bed.client, &plan.plan_id, Duration::from_secs(60)).await?;
    executor.stop().await?;
    let report_before = audit_report(&mut bed.client, &plan.plan_id).await?;
    assert_eq!(report_before.sent_keys.len(), 3);
    let replayed = counts(&mut bed.client, &incident.dlq).await?;
    assert_eq!((replayed.already_replayed, replayed.replayable), (3, 0));

    let answer = bed
        .client
        .rekey_dead_letters(rekey(&incident.dlq, &[], "keys people know"))
        .await?
        .into_inner();
    assert_eq!((answer.rekeyed, answer.changed), (3, 3), "{answer:?}");
    let mut rekeyed: Vec<String> = keys(&mut bed.client, &incident.dlq)
        .await?
        .into_iter()
        .map(|(_, key)| key)
        .collect();
    rekeyed.sort();
    assert_eq!(rekeyed, ["m-0", "m-1", "m-2"]);

    let after = counts(&mut bed.client, &incident.dlq).await?;
    assert_eq!(
        (after.already_replayed, after.replayable),
        (3, 0),
        "a delivered message is never replayable again"
    );
    // The ledger is as it was.
    let report_after = audit_report(&mut bed.client, &plan.plan_id).await?;
    assert_eq!(report_after.sent_keys, report_before.sent_keys);
    assert_eq!(report_after.counts, report_before.counts);
    let mut sent: Vec<String> = sqlx::query_scalar(
        "SELECT message_key FROM audit_events WHERE plan_id = $1::uuid AND action = 'sent'",
    )
    .bind(&plan.plan_id)
    .fetch_all(&bed.pool().await?)
    .await?;
    sent.sort();
    let mut hashes: Vec<String> = hashed.into_iter().map(|(_, key)| key).collect();
    hashes.sort();
    assert_eq!(sent, hashes);

    // The claim asks too. A precheck that looks back only one second (an
    // audited override) calls them replayable and plans them; the
    // executors' Redis record is under the old keys, so only the planner's
    // claim check, which matches the former keys, stops the second delivery.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let report = bed
        .client
        .run_precheck(RunPrecheckRequest {
            selector: Some(of(&incident.dlq)),
            options: Some(v1::PrecheckOptions {
                replay_key_window: Some(prost_types::Duration {
                    seconds: 1,
                    nanos: 0,
                }),
                override_policy: true,
                override_reason: "test: look back one second only".into(),
                ..Default::default()
            }),
        })
        .await?
        .into_inner();
    let looked_back = report.counts.unwrap_or_default();
    assert_eq!(
        (looked_back.replayable, looked_back.already_replayed),
        (3, 0)
    );
    let second = bed
        .client
        .create_plan(v1::CreatePlanRequest {
            precheck_id: report.precheck_id.clone(),
            slice_size: 50,
            rate: Some(v1::Rate {
                per_second: 100.0,
                burst: 10,
                rationale: "test downstream takes this easily".into(),
            }),
            observe_for: Some(prost_types::Duration {
                seconds: 0,
                nanos: 0,
            }),
            ..Default::default()
        })
        .await?
        .into_inner();
    bed.client
        .approve_plan(v1::ApprovePlanRequest {
            plan_id: second.plan_id.clone(),
            digest: report.digest,
            ..Default::default()
        })
        .await?;
    let executor = ExecutorHandle::start(bed.executor_config());
    wait_completed(&mut bed.client, &second.plan_id, Duration::from_secs(60)).await?;
    executor.stop().await?;
    let claimed = audit_report(&mut bed.client, &second.plan_id)
        .await?
        .counts
        .unwrap_or_default();
    assert_eq!(
        (claimed.sent, claimed.skipped_duplicate),
        (0, 3),
        "the claim found the replays under the former keys"
    );
    bed.finish().await
}

/// Re-keying is an operator's action: a viewer is refused, naming the role.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_viewer_cannot_rekey() -> anyhow::Result<()> {
    init_logging();
    let mut bed = TestBed::start_secure(None, Pki::new()?, |_| {}).await?;
    let mut request = tonic::Request::new(rekey("dlq", &["body"], "why"));
    request.metadata_mut().insert(
        "authorization",
        format!("Bearer {}", token_of("vera")).parse()?,
    );
    let refused = bed.client.rekey_dead_letters(request).await.unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    assert!(
        refused.message().contains("vera") && refused.message().contains("operator"),
        "{refused:?}"
    );
    bed.finish().await
}

/// A backlog larger than a batch is re-keyed page by page (batches of 500,
/// one transaction each), and a selector's limit is honoured across pages.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_larger_than_a_batch_is_rekeyed_in_pages() -> anyhow::Result<()> {
    init_logging();
    let mut bed = TestBed::without_broker(|_| {}).await?;
    let source = unique("rekey-pages");
    let items: Vec<IngestDeadLettersRequest> = (0..1201)
        .map(|index| IngestDeadLettersRequest {
            source: source.clone(),
            message_id: format!("m-{index}"),
            body: format!(r#"{{"order_id":"o-{}"}}"#, index % 600).into_bytes(),
            reason: "rejected".to_owned(),
            original_destination: "orders".to_owned(),
            ..Default::default()
        })
        .collect();
    bed.client
        .ingest_dead_letters(tokio_stream::iter(items))
        .await?;
    let limited = bed
        .client
        .rekey_dead_letters(RekeyDeadLettersRequest {
            selector: Some(Selector {
                limit: 700,
                ..of(&source)
            }),
            key_rules: vec!["json:/order_id".into()],
            reason: "first 700".into(),
        })
        .await?
        .into_inner();
    assert_eq!((limited.rekeyed, limited.changed), (700, 700));
    assert_eq!(limited.examples.len(), 5);
    let all = bed
        .client
        .rekey_dead_letters(rekey(&source, &["json:/order_id"], "the rest"))
        .await?
        .into_inner();
    assert_eq!((all.rekeyed, all.changed), (1201, 501));
    let counts = counts(&mut bed.client, &source).await?;
    assert_eq!((counts.replayable, counts.duplicate), (600, 601));
    bed.finish().await
}
