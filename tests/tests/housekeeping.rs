//! Dead-letter housekeeping against PostgreSQL (docs/design.md,
//! "Housekeeping"): error groups and the `error_contains` and body filters,
//! archive and unarchive (audited, left out of prechecks, refused for an item
//! of a live plan), and retention (never an open dead letter, never an item
//! of a live plan; the audit of past plans stays readable).

use std::{collections::BTreeMap, io::Write, time::Duration};

use futures::StreamExt;
use redrive_planner::{dead_letters::housekeeping, store::Store};
use redrive_proto::v1::{
    self, ArchiveDeadLettersRequest, BodyMatch, CreatePlanRequest, DeadLetterStatus,
    GetDeadLetterRequest, IngestDeadLettersRequest, ListDeadLettersRequest, RunPrecheckRequest,
    Selector, SummarizeDeadLettersRequest, SummaryDimension,
};
use redrive_tests::{ExecutorHandle, TestBed, init_logging, precheck_items, unique, wait_until};
use tonic::Code;

mod support;
use support::{
    approved_plan, as_actor, audit_report, cancel, get_plan, incident_bed, ingest, list_selected,
    listed, precheck_selected, wait_completed,
};

type Client = v1::planner_client::PlannerClient<tonic::transport::Channel>;

fn item(source: &str, message_id: &str, body: &[u8], error: &str) -> IngestDeadLettersRequest {
    IngestDeadLettersRequest {
        source: source.to_owned(),
        message_id: message_id.to_owned(),
        body: body.to_vec(),
        reason: "rejected".to_owned(),
        error_text: error.to_owned(),
        original_destination: "orders.fulfil".to_owned(),
        ..Default::default()
    }
}

fn gzip(text: &str) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    encoder.write_all(text.as_bytes()).unwrap();
    encoder.finish().unwrap()
}

/// Every dead letter of `source`, whatever its status.
fn all_of(source: &str) -> Selector {
    Selector {
        sources: vec![source.to_owned()],
        status: DeadLetterStatus::All.into(),
        ..Default::default()
    }
}

/// Message id → dead letter id of every dead letter of `source` (archived
/// ones too).
async fn ids(client: &mut Client, source: &str) -> anyhow::Result<BTreeMap<String, String>> {
    let listed = list_selected(client, all_of(source)).await?;
    Ok(listed
        .into_iter()
        .map(|dead_letter| (dead_letter.message_id.unwrap_or_default(), dead_letter.id))
        .collect())
}

/// The dead letter ids a precheck covered, sorted.
async fn precheck_ids(
    client: &mut Client,
    report: &v1::PrecheckReport,
) -> anyhow::Result<Vec<String>> {
    let mut ids: Vec<String> = precheck_items(client, &report.precheck_id, 0, 1000)
        .await?
        .items
        .into_iter()
        .map(|item| item.dead_letter_id)
        .collect();
    ids.sort();
    Ok(ids)
}

fn create_plan(precheck_id: &str) -> CreatePlanRequest {
    CreatePlanRequest {
        precheck_id: precheck_id.to_owned(),
        rate: Some(v1::Rate {
            per_second: 10.0,
            burst: 1,
            rationale: "the test consumer takes ten a second".into(),
        }),
        slice_size: 10,
        ..Default::default()
    }
}

fn archive(ids: &[&str], reason: &str) -> ArchiveDeadLettersRequest {
    ArchiveDeadLettersRequest {
        selector: Some(Selector {
            ids: ids.iter().map(|id| (*id).to_owned()).collect(),
            ..Default::default()
        }),
        reason: reason.to_owned(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn error_groups_fold_ids_and_filters_select_exactly() -> anyhow::Result<()> {
    init_logging();
    let mut bed = TestBed::without_broker(|_| {}).await?;
    let source = unique("find");
    let paid = |id: u32| format!(r#"{{"order":{{"status":"paid","id":{id}}},"tags":["a/b"]}}"#);
    ingest(
        &mut bed.client,
        vec![
            item(&source, "a", paid(1).as_bytes(), "Order 1001 not found"),
            item(
                &source,
                "b",
                br#"{"order":{"status":"refunded","id":2}}"#,
                "Order 2002 not found",
            ),
            item(
                &source,
                "c",
                br#"{"order":{"status":"paid"},"a/b":{"m~n":true}}"#,
                "row 550e8400-e29b-41d4-a716-446655440000 locked by 0x1F after   3 tries",
            ),
            item(
                &source,
                "d",
                b"status=paid (not JSON)",
                "row 123e4567-e89b-12d3-a456-426614174000 locked by 0xff after 12 tries",
            ),
            item(&source, "e", &gzip(r#"{"order":{"status":"paid"}}"#), ""),
            item(
                &source,
                "f",
                paid(3).as_bytes(),
                "payment 5f2b3c4d5e6f7a8b9c0d1e2f: TIMEOUT after 3000 ms",
            ),
        ],
    )
    .await?;
    let everything = Selector {
        sources: vec![source.clone()],
        ..Default::default()
    };

    // Error groups: the reason class, then the text with digits, hex
    // numbers and UUIDs folded, spaces collapsed.
    let summary = bed
        .client
        .summarize_dead_letters(SummarizeDeadLettersRequest {
            selector: Some(everything.clone()),
            group_by: vec![SummaryDimension::Error.into()],
        })
        .await?
        .into_inner();
    let groups: BTreeMap<String, u64> = summary
        .groups
        .iter()
        .map(|group| (group.key["error"].clone(), group.count))
        .collect();
    assert_eq!(
        groups,
        BTreeMap::from([
            ("rejected".to_owned(), 1),
            ("rejected: Order <n> not found".to_owned(), 2),
            (
                "rejected: payment <hex>: TIMEOUT after <n> ms".to_owned(),
                1
            ),
            (
                "rejected: row <uuid> locked by <hex> after <n> tries".to_owned(),
                2
            ),
        ])
    );
    assert_eq!(
        (summary.open, summary.archived, summary.replayed),
        (6, 0, 0)
    );

    // error_contains: a case-insensitive substring.
    let with = |text: &str| Selector {
        error_contains: text.to_owned(),
        ..everything.clone()
    };
    assert_eq!(
        listed(&mut bed.client, with("NOT FOUND")).await?,
        ["a", "b"]
    );
    assert_eq!(listed(&mut bed.client, with("timeout")).await?, ["f"]);
    assert_eq!(listed(&mut bed.client, with("0xff")).await?, ["d"]);
    assert!(listed(&mut bed.client, with("nowhere")).await?.is_empty());

    // Body filters: JSON bodies only (d is not JSON, e is gzip), every match
    // must hold, RFC 6901 escapes, array indexes, non-string values.
    let body = |matches: &[(&str, &str)]| Selector {
        body_matches: matches
            .iter()
            .map(|(pointer, value)| BodyMatch {
                pointer: (*pointer).to_owned(),
                value: (*value).to_owned(),
            })
            .collect(),
        ..everything.clone()
    };
    assert_eq!(
        listed(&mut bed.client, body(&[("/order/status", "paid")])).await?,
        ["a", "c", "f"]
    );
    assert_eq!(
        listed(
            &mut bed.client,
            body(&[("/order/status", "paid"), ("/order/id", "3")])
        )
        .await?,
        ["f"]
    );
    assert_eq!(
        listed(&mut bed.client, body(&[("/a~1b/m~0n", "true")])).await?,
        ["c"]
    );
    assert_eq!(
        listed(&mut bed.client, body(&[("/tags/0", "a/b")])).await?,
        ["a", "f"]
    );
    assert!(
        listed(&mut bed.client, body(&[("/order/missing", "paid")]))
            .await?
            .is_empty()
    );
    // Filters combine with each other and with summaries.
    let summary = bed
        .client
        .summarize_dead_letters(SummarizeDeadLettersRequest {
            selector: Some(Selector {
                error_contains: "order".into(),
                ..body(&[("/order/status", "paid")])
            }),
            group_by: vec![SummaryDimension::Error.into()],
        })
        .await?
        .into_inner();
    assert_eq!(summary.total, 1, "{summary:?}");

    // Bad input is refused naming the field.
    for (pointer, problem) in [("order/status", "starts with '/'"), ("/a~2", "~0")] {
        let error = bed
            .client
            .list_dead_letters(ListDeadLettersRequest {
                selector: Some(body(&[("/ok", "1"), (pointer, "paid")])),
                page_size: 10,
                page_token: String::new(),
            })
            .await
            .unwrap_err();
        assert_eq!(error.code(), Code::InvalidArgument, "{error:?}");
        assert!(
            error.message().contains("selector.body_matches[1].pointer")
                && error.message().contains(problem),
            "{}",
            error.message()
        );
    }
    let error = bed
        .client
        .list_dead_letters(ListDeadLettersRequest {
            selector: Some(with("   ")),
            page_size: 10,
            page_token: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(error.code(), Code::InvalidArgument);
    assert!(
        error.message().contains("selector.error_contains"),
        "{}",
        error.message()
    );
    bed.finish().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn archived_dead_letters_leave_prechecks_until_unarchived() -> anyhow::Result<()> {
    init_logging();
    let mut bed = TestBed::without_broker(|_| {}).await?;
    let source = unique("archive");
    ingest(
        &mut bed.client,
        ["m-1", "m-2", "m-3", "m-4"]
            .iter()
            .map(|id| {
                item(
                    &source,
                    id,
                    format!(r#"{{"order_id":"{id}"}}"#).as_bytes(),
                    "boom",
                )
            })
            .collect(),
    )
    .await?;
    let ids = ids(&mut bed.client, &source).await?;
    let (one, two, three, four) = (&ids["m-1"], &ids["m-2"], &ids["m-3"], &ids["m-4"]);
    let everything = Selector {
        sources: vec![source.clone()],
        ..Default::default()
    };

    // Bad requests: no reason, an empty selector.
    let error = bed
        .client
        .archive_dead_letters(archive(&[one], "  "))
        .await
        .unwrap_err();
    assert_eq!(error.code(), Code::InvalidArgument);
    assert!(
        error.message().starts_with("reason: required"),
        "{}",
        error.message()
    );
    let error = bed
        .client
        .archive_dead_letters(ArchiveDeadLettersRequest {
            selector: Some(Selector::default()),
            reason: "everything".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(error.code(), Code::InvalidArgument);
    assert!(
        error.message().starts_with("selector:"),
        "{}",
        error.message()
    );
    // A limit alone is no filter: it would take the first dead letters,
    // whatever they are.
    let error = bed
        .client
        .archive_dead_letters(ArchiveDeadLettersRequest {
            selector: Some(Selector {
                limit: 100_000,
                ..Default::default()
            }),
            reason: "oops".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(error.code(), Code::InvalidArgument, "{}", error.message());

    // Archive one, by alice.
    let answer = bed
        .client
        .archive_dead_letters(as_actor(
            "alice",
            archive(&[one, "999999"], "duplicate of an order settled by hand"),
        ))
        .await?
        .into_inner();
    assert_eq!(answer.changed, 1);
    assert_eq!(answer.unchanged, 0, "an unknown id selects nothing");
    assert_eq!(answer.not_found_ids, ["999999"], "and is named");
    assert_eq!(answer.dead_letter_ids, std::slice::from_ref(one));
    let again = bed
        .client
        .archive_dead_letters(archive(&[one], "again"))
        .await?
        .into_inner();
    assert_eq!((again.changed, again.unchanged), (0, 1));

    // Left out of listings, summaries and prechecks; there on request.
    assert_eq!(
        listed(&mut bed.client, everything.clone()).await?,
        ["m-2", "m-3", "m-4"]
    );
    let archived_only = Selector {
        status: DeadLetterStatus::Archived.into(),
        ..everything.clone()
    };
    assert_eq!(
        listed(&mut bed.client, archived_only.clone()).await?,
        ["m-1"]
    );
    let summary = bed
        .client
        .summarize_dead_letters(SummarizeDeadLettersRequest {
            selector: Some(everything.clone()),
            group_by: vec![SummaryDimension::Status.into()],
        })
        .await?
        .into_inner();
    assert_eq!(summary.total, 3);
    assert_eq!(
        (summary.open, summary.archived, summary.replayed),
        (3, 1, 0)
    );
    let report = precheck_selected(&mut bed.client, everything.clone()).await?;
    assert_eq!(report.total, 3);
    let mut expected = vec![two.clone(), three.clone(), four.clone()];
    expected.sort();
    assert_eq!(precheck_ids(&mut bed.client, &report).await?, expected);
    let error = bed
        .client
        .run_precheck(RunPrecheckRequest {
            selector: Some(archived_only),
            options: None,
        })
        .await
        .unwrap_err();
    assert_eq!(error.code(), Code::InvalidArgument);
    assert!(
        error.message().contains("selector.status"),
        "{}",
        error.message()
    );
    let error = bed
        .client
        .replay_dead_letter(v1::ReplayDeadLetterRequest {
            dead_letter_id: one.clone(),
            reason: "try it".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(error.code(), Code::FailedPrecondition);
    assert!(error.message().contains("archived"), "{}", error.message());

    // Who, when, why.
    let seen = shown(&mut bed.client, one).await?;
    assert_eq!(seen.status(), DeadLetterStatus::Archived);
    let record = seen.archived.unwrap();
    assert_eq!(record.actor, "alice");
    assert_eq!(record.reason, "duplicate of an order settled by hand");

    // Unarchived by bob: back in prechecks, the history keeps both.
    let answer = bed
        .client
        .unarchive_dead_letters(as_actor(
            "bob",
            archive(&[one, two], "settled twice after all"),
        ))
        .await?
        .into_inner();
    assert_eq!((answer.changed, answer.unchanged), (1, 1));
    let report = precheck_selected(&mut bed.client, everything.clone()).await?;
    assert_eq!(report.total, 4);
    assert!(precheck_ids(&mut bed.client, &report).await?.contains(one));
    let seen = shown(&mut bed.client, one).await?;
    assert_eq!(seen.status(), DeadLetterStatus::Open);
    assert!(seen.archived.is_none());
    let history: Vec<(String, String, String)> = seen
        .archive_history
        .iter()
        .map(|r| (r.action.clone(), r.actor.clone(), r.reason.clone()))
        .collect();
    assert_eq!(
        history,
        [
            (
                "archive".to_owned(),
                "alice".to_owned(),
                "duplicate of an order settled by hand".to_owned()
            ),
            (
                "unarchive".to_owned(),
                "bob".to_owned(),
                "settled twice after all".to_owned()
            ),
        ]
    );

    // An item of a plan that has not ended cannot be archived; nothing of
    // the selection is.
    let plan = bed
        .client
        .create_plan(create_plan(&report.precheck_id))
        .await?
        .into_inner();
    let error = bed
        .client
        .archive_dead_letters(archive(&[one, two], "too late"))
        .await
        .unwrap_err();
    assert_eq!(error.code(), Code::FailedPrecondition);
    assert!(
        error.message().contains(&plan.plan_id) && error.message().contains("awaiting_approval"),
        "{}",
        error.message()
    );
    assert_eq!(
        listed(
            &mut bed.client,
            Selector {
                status: DeadLetterStatus::Archived.into(),
                ..everything.clone()
            }
        )
        .await?
        .len(),
        0
    );
    cancel(&mut bed.client, &plan.plan_id, "archive instead").await?;
    // Once the plan ended, it can; and a plan from a precheck made before
    // the archive is refused.
    let report = precheck_selected(&mut bed.client, everything.clone()).await?;
    bed.client
        .archive_dead_letters(archive(&[four], "not needed"))
        .await?;
    let error = bed
        .client
        .create_plan(create_plan(&report.precheck_id))
        .await
        .unwrap_err();
    assert_eq!(error.code(), Code::FailedPrecondition);
    assert!(
        error.message().contains(&format!("dead letter {four}"))
            && error.message().contains("archived since")
            && error.message().contains("run the precheck again"),
        "{}",
        error.message()
    );
    bed.finish().await
}

/// Plan creation and the changes that would make its frozen items wrong
/// (archive, retention deletes) wait for each other: a plan created while
/// an archive or a delete is under way sees it when it commits and is
/// refused, and an archive started while a plan is being created waits for
/// it and is then refused for the plan's item. The test holds the freeze
/// lock in its own transaction, as each side does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plan_creation_and_archive_or_retention_wait_for_each_other() -> anyhow::Result<()> {
    use redrive_planner::store::freeze::{self, Freeze};
    use sqlx::Connection;

    init_logging();
    let mut bed = TestBed::without_broker(|_| {}).await?;
    let source = unique("freeze");
    ingest(
        &mut bed.client,
        ["m-1", "m-2", "m-3"]
            .iter()
            .map(|id| {
                item(
                    &source,
                    id,
                    format!(r#"{{"id":"{id}"}}"#).as_bytes(),
                    "boom",
                )
            })
            .collect(),
    )
    .await?;
    let ids = ids(&mut bed.client, &source).await?;
    let (one, two, three) = (&ids["m-1"], &ids["m-2"], &ids["m-3"]);
    let everything = Selector {
        sources: vec![source.clone()],
        ..Default::default()
    };
    let mut connection = sqlx::PgConnection::connect(&bed.db.url()).await?;
    let pending = Duration::from_millis(500);

    // An archive under way (committed after the plan creation started): the
    // plan waits for it, then is refused. A retention delete: the same, with
    // its own reason.
    for (change, id, refusal) in [
        (
            "UPDATE dead_letters SET archived_at = now(), archived_by = 'test' WHERE id = $1",
            three,
            format!(
                "1 of its replayable dead letters (dead letter {three} first) were archived since"
            ),
        ),
        (
            "DELETE FROM dead_letters WHERE id = $1",
            two,
            "1 of its replayable dead letters were deleted by retention since".to_owned(),
        ),
    ] {
        let report = precheck_selected(&mut bed.client, everything.clone()).await?;
        let mut changing = connection.begin().await?;
        freeze::lock(&mut changing, Freeze::Exclusive).await?;
        sqlx::query(change)
            .bind(id.parse::<i64>()?)
            .execute(&mut *changing)
            .await?;
        let mut client = bed.client.clone();
        let request = create_plan(&report.precheck_id);
        let creating = tokio::spawn(async move { client.create_plan(request).await });
        tokio::time::sleep(pending).await;
        assert!(
            !creating.is_finished(),
            "the plan did not wait for: {change}"
        );
        changing.commit().await?;
        let error = creating.await?.unwrap_err();
        assert_eq!(error.code(), Code::FailedPrecondition);
        assert!(error.message().contains(&refusal), "{}", error.message());
    }
    assert!(
        bed.client
            .list_plans(v1::ListPlansRequest::default())
            .await?
            .into_inner()
            .plans
            .is_empty(),
        "a refused plan left rows"
    );

    // A plan being created (its transaction not yet committed): an archive
    // of its dead letter waits, then is refused for the plan's item.
    let report = precheck_selected(&mut bed.client, everything.clone()).await?;
    let mut creating = connection.begin().await?;
    freeze::lock(&mut creating, Freeze::Shared).await?;
    // Plans are created side by side: a real one, beside the test's.
    let plan = bed
        .client
        .create_plan(create_plan(&report.precheck_id))
        .await?
        .into_inner();
    assert_eq!(plan.total_items, 1);
    let mut client = bed.client.clone();
    let request = archive(&[one], "while a plan is made");
    let archiving = tokio::spawn(async move { client.archive_dead_letters(request).await });
    tokio::time::sleep(pending).await;
    assert!(
        !archiving.is_finished(),
        "the archive did not wait for the plan"
    );
    creating.commit().await?;
    let error = archiving.await?.unwrap_err();
    assert_eq!(error.code(), Code::FailedPrecondition);
    assert!(
        error.message().contains(&plan.plan_id),
        "{}",
        error.message()
    );
    bed.finish().await
}

/// Retention's rows: which dead letters remain after a sweep. (Distinct
/// message ids: without `--message-key` the key is the `message_id`, and equal
/// keys would make all but one a `duplicate`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_deletes_only_old_resolved_dead_letters() -> anyhow::Result<()> {
    init_logging();
    let mut bed = TestBed::without_broker(|_| {}).await?;
    let source = unique("retention");
    let names = [
        "open",
        "archived-old",
        "archived-new",
        "replayed-old",
        "replayed-live",
        "pending-in-ended-plan",
    ];
    ingest(
        &mut bed.client,
        names
            .iter()
            .map(|name| {
                item(
                    &source,
                    name,
                    format!(r#"{{"order_id":"{name}"}}"#).as_bytes(),
                    "boom",
                )
            })
            .collect(),
    )
    .await?;
    let ids = ids(&mut bed.client, &source).await?;
    let id = |name: &str| ids[name].clone();
    let pool = bed.pool().await?;

    // Plan A over three of them, cancelled; two of its items were sent 40
    // days ago (as an executor's report writes them).
    let report = precheck_selected(
        &mut bed.client,
        Selector {
            ids: vec![
                id("replayed-old"),
                id("replayed-live"),
                id("pending-in-ended-plan"),
            ],
            ..Default::default()
        },
    )
    .await?;
    let plan_a = bed
        .client
        .create_plan(create_plan(&report.precheck_id))
        .await?
        .into_inner();
    let plan_a_id: uuid::Uuid = plan_a.plan_id.parse()?;
    let sent: Vec<i64> = vec![id("replayed-old").parse()?, id("replayed-live").parse()?];
    sqlx::query("UPDATE plan_items SET state = 'sent', attempts = 1 WHERE plan_id = $1 AND dead_letter_id = ANY($2)")
        .bind(plan_a_id)
        .bind(&sent)
        .execute(&pool)
        .await?;
    sqlx::query(
        "INSERT INTO audit_events (plan_id, slice_id, dead_letter_id, message_key, action, wave, executor_id, attempt, at) \
         SELECT plan_id, slice_id, dead_letter_id, message_key, 'sent', 'main', 'exec-1', 1, now() - interval '40 days' \
         FROM plan_items WHERE plan_id = $1 AND dead_letter_id = ANY($2)",
    )
    .bind(plan_a_id)
    .bind(&sent)
    .execute(&pool)
    .await?;
    cancel(&mut bed.client, &plan_a.plan_id, "sent two by hand").await?;

    // Plan B, awaiting approval, holds replayed-live.
    let report_b = precheck_selected(
        &mut bed.client,
        Selector {
            ids: vec![id("replayed-live")],
            ..Default::default()
        },
    )
    .await?;
    assert_eq!(report_b.counts.unwrap_or_default().replayable, 1);
    let plan_b = bed
        .client
        .create_plan(create_plan(&report_b.precheck_id))
        .await?
        .into_inner();

    // Two archived: one 40 days ago, one now.
    bed.client
        .archive_dead_letters(archive(
            &[&id("archived-old"), &id("archived-new")],
            "handled",
        ))
        .await?;
    sqlx::query("UPDATE dead_letters SET archived_at = now() - interval '40 days' WHERE id = $1")
        .bind(id("archived-old").parse::<i64>()?)
        .execute(&pool)
        .await?;

    let statuses: BTreeMap<String, DeadLetterStatus> =
        list_selected(&mut bed.client, all_of(&source))
            .await?
            .into_iter()
            .map(|d| (d.message_id.clone().unwrap_or_default(), d.status()))
            .collect();
    assert_eq!(statuses["open"], DeadLetterStatus::Open);
    assert_eq!(statuses["replayed-old"], DeadLetterStatus::Replayed);
    assert_eq!(statuses["replayed-live"], DeadLetterStatus::Replayed);
    assert_eq!(statuses["pending-in-ended-plan"], DeadLetterStatus::Open);
    assert_eq!(statuses["archived-old"], DeadLetterStatus::Archived);

    // The audit of plan A before retention.
    let export_before = export(&mut bed.client, &plan_a.plan_id).await?;
    let report_before = audit_report(&mut bed.client, &plan_a.plan_id).await?;
    assert_eq!(report_before.sent_keys.len(), 2);

    let store = Store::from_pool(pool.clone());
    let deleted =
        housekeeping::sweep(&store, chrono::Utc::now() - chrono::Duration::days(30)).await?;
    assert_eq!(deleted, 2);
    assert_eq!(
        housekeeping::sweep(&store, chrono::Utc::now() - chrono::Duration::days(30)).await?,
        0,
        "a second pass finds nothing"
    );
    assert_eq!(
        listed(&mut bed.client, all_of(&source)).await?,
        [
            "archived-new",
            "open",
            "pending-in-ended-plan",
            "replayed-live"
        ]
    );
    // Each delete is recorded.
    let recorded: Vec<(i64, String, String)> = sqlx::query_as(
        "SELECT dead_letter_id, action, actor FROM dead_letter_archive_history \
         WHERE action = 'delete' ORDER BY dead_letter_id",
    )
    .fetch_all(&pool)
    .await?;
    let mut expected = vec![
        (
            id("archived-old").parse::<i64>()?,
            "delete".to_owned(),
            "redrive-retention".to_owned(),
        ),
        (
            id("replayed-old").parse::<i64>()?,
            "delete".to_owned(),
            "redrive-retention".to_owned(),
        ),
    ];
    expected.sort();
    assert_eq!(recorded, expected);

    // The audit of plan A reads as before; its precheck still lists the
    // deleted item.
    assert_eq!(
        export(&mut bed.client, &plan_a.plan_id).await?,
        export_before
    );
    let report_after = audit_report(&mut bed.client, &plan_a.plan_id).await?;
    assert_eq!(report_after.sent_keys, report_before.sent_keys);
    assert_eq!(report_after.counts, report_before.counts);
    assert!(
        precheck_ids(&mut bed.client, &report)
            .await?
            .contains(&id("replayed-old"))
    );
    let error = bed
        .client
        .get_dead_letter(GetDeadLetterRequest {
            id: id("replayed-old"),
        })
        .await
        .unwrap_err();
    assert_eq!(error.code(), Code::NotFound);

    // Once plan B has ended too, replayed-live goes; the open ones never.
    cancel(&mut bed.client, &plan_b.plan_id, "not needed").await?;
    let deleted =
        housekeeping::sweep(&store, chrono::Utc::now() + chrono::Duration::days(1)).await?;
    assert_eq!(
        deleted, 2,
        "replayed-live, and archived-new by a later cutoff"
    );
    assert_eq!(
        listed(&mut bed.client, all_of(&source)).await?,
        ["open", "pending-in-ended-plan"]
    );
    // Plan A's sent dead letters are all gone: the plan is not looked at again.
    let swept: Option<chrono::DateTime<chrono::Utc>> =
        sqlx::query_scalar("SELECT retention_swept_at FROM plans WHERE id = $1")
            .bind(plan_a_id)
            .fetch_one(&pool)
            .await?;
    assert!(swept.is_some());
    bed.finish().await
}

/// A plan an executor really ran (capture, precheck, canary, main wave,
/// publisher confirms): its dead letters are replayed, retention deletes them
/// once older than the cutoff, and the plan's audit reads exactly as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn retention_after_a_real_replay_keeps_the_audit() -> anyhow::Result<()> {
    init_logging();
    let (incident, mut bed) = incident_bed(5).await?;
    let plan = approved_plan(&mut bed.client, &incident.dlq, 100.0, 10, None).await?;
    let executor = ExecutorHandle::start(bed.executor_config());
    wait_completed(&mut bed.client, &plan.plan_id, Duration::from_secs(60)).await?;
    executor.stop().await?;
    let summary = bed
        .client
        .summarize_dead_letters(SummarizeDeadLettersRequest {
            selector: Some(all_of(&incident.dlq)),
            group_by: vec![SummaryDimension::Status.into()],
        })
        .await?
        .into_inner();
    assert_eq!(
        (summary.open, summary.archived, summary.replayed),
        (0, 0, 5)
    );
    let export_before = export(&mut bed.client, &plan.plan_id).await?;
    let report_before = audit_report(&mut bed.client, &plan.plan_id).await?;
    assert_eq!(report_before.sent_keys.len(), 5);

    let store = Store::from_pool(bed.pool().await?);
    let now = chrono::Utc::now();
    assert_eq!(
        housekeeping::sweep(&store, now - chrono::Duration::days(30)).await?,
        0,
        "replayed a moment ago: kept for a 30-day retention"
    );
    assert_eq!(
        housekeeping::sweep(&store, now + chrono::Duration::minutes(1)).await?,
        5
    );
    assert!(
        list_selected(&mut bed.client, all_of(&incident.dlq))
            .await?
            .is_empty()
    );
    assert_eq!(export(&mut bed.client, &plan.plan_id).await?, export_before);
    let report_after = audit_report(&mut bed.client, &plan.plan_id).await?;
    assert_eq!(report_after.sent_keys, report_before.sent_keys);
    assert_eq!(report_after.counts, report_before.counts);
    let progress = get_plan(&mut bed.client, &plan.plan_id).await?;
    assert_eq!(progress.items_done, 5);
    assert_eq!(progress.counts.unwrap_or_default().sent, 5);
    bed.finish().await
}

/// `--retention` runs the sweep in the background (the first pass at start)
/// and logs how many it deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_retention_flag_deletes_in_the_background() -> anyhow::Result<()> {
    init_logging();
    let mut bed = TestBed::without_broker(|_| {}).await?;
    let source = unique("retention-flag");
    ingest(
        &mut bed.client,
        vec![
            item(&source, "old", b"{}", "boom"),
            item(&source, "open", b"{}", "boom"),
        ],
    )
    .await?;
    let ids = ids(&mut bed.client, &source).await?;
    bed.client
        .archive_dead_letters(archive(&[&ids["old"]], "handled"))
        .await?;
    sqlx::query("UPDATE dead_letters SET archived_at = now() - interval '31 days' WHERE id = $1")
        .bind(ids["old"].parse::<i64>()?)
        .execute(&bed.pool().await?)
        .await?;
    bed.restart_planner(|config| config.retention = Some(Duration::from_secs(30 * 86_400)))
        .await?;
    let mut client = bed.client.clone();
    let old = ids["old"].clone();
    wait_until("retention", Duration::from_secs(20), || {
        let mut client = client.clone();
        let old = old.clone();
        async move {
            Ok(client
                .get_dead_letter(GetDeadLetterRequest { id: old })
                .await
                .is_err_and(|error| error.code() == Code::NotFound))
        }
    })
    .await?;
    assert_eq!(listed(&mut client, all_of(&source)).await?, ["open"]);
    bed.finish().await
}

/// The dead letter `id` as `GetDeadLetter` answers.
async fn shown(client: &mut Client, id: &str) -> anyhow::Result<v1::DeadLetter> {
    client
        .get_dead_letter(GetDeadLetterRequest { id: id.to_owned() })
        .await?
        .into_inner()
        .dead_letter
        .ok_or_else(|| anyhow::anyhow!("no dead letter in the answer"))
}

async fn export(client: &mut Client, plan_id: &str) -> anyhow::Result<Vec<u8>> {
    let mut stream = client
        .export_audit(v1::ExportAuditRequest {
            plan_id: plan_id.to_owned(),
            format: v1::ExportFormat::Jsonl.into(),
        })
        .await?
        .into_inner();
    let mut data = Vec::new();
    while let Some(chunk) = stream.next().await {
        data.extend(chunk?.data);
    }
    Ok(data)
}
