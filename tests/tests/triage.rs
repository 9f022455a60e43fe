//! Triage and the fire still burning (issue "Closed loop", parts 2 and 3), as
//! an on-call engineer meets them: dead letters grouped by a fingerprint of
//! what went wrong, selected and prechecked by it; an approval refused while
//! dead letters failing the same way keep arriving after the precheck, and
//! allowed once a fresh precheck took them in; a running plan paused when
//! its failure starts arriving again, and an operator's override of both,
//! recorded. Against the real PostgreSQL (and RabbitMQ for the running plan).

mod support;

use std::{collections::BTreeMap, time::Duration};

use lapin::BasicProperties;
use redrive_proto::v1::{
    self, ApprovePlanRequest, CreatePlanRequest, GetDeadLetterRequest, HeaderTable, HeaderValue,
    IngestDeadLettersRequest, ListDeadLettersRequest, PlanState, Selector,
    SummarizeDeadLettersRequest, SummaryDimension, header_value::Value,
    planner_client::PlannerClient,
};
use redrive_tests::{Broker, ExecutorHandle, TestBed, init_logging, unique};
use tonic::{Code, transport::Channel};

use support::{
    assert_bed_audit, bed, consume_rejecting, get_plan, incident, ingest, listed,
    precheck_selected, stop_consuming, wait_completed, wait_state,
};

type Client = PlannerClient<Channel>;

/// An ingested dead letter of `source` that failed with `error`, with the
/// framework `headers` given (name, text).
fn failed(
    source: &str,
    id: &str,
    error: &str,
    headers: &[(&str, &str)],
) -> IngestDeadLettersRequest {
    IngestDeadLettersRequest {
        source: source.to_owned(),
        message_id: id.to_owned(),
        body: format!(r#"{{"order_id":"{id}"}}"#).into_bytes(),
        reason: "rejected".to_owned(),
        error_text: error.to_owned(),
        original_destination: "orders.fulfil".to_owned(),
        headers: Some(HeaderTable {
            fields: headers
                .iter()
                .map(|(name, text)| {
                    (
                        (*name).to_owned(),
                        HeaderValue {
                            value: Some(Value::LongString(text.as_bytes().to_vec())),
                        },
                    )
                })
                .collect(),
        }),
        ..Default::default()
    }
}

/// Fingerprint → count of `selector`'s dead letters.
async fn groups(client: &mut Client, selector: &Selector) -> anyhow::Result<BTreeMap<String, u64>> {
    Ok(client
        .summarize_dead_letters(SummarizeDeadLettersRequest {
            selector: Some(selector.clone()),
            group_by: vec![SummaryDimension::Error.into()],
        })
        .await?
        .into_inner()
        .groups
        .into_iter()
        .map(|group| (group.key["error"].clone(), group.count))
        .collect())
}

/// A plan of `report` awaiting approval (canary of one, no observation).
async fn plan_of(client: &mut Client, report: &v1::PrecheckReport) -> anyhow::Result<v1::Plan> {
    Ok(client
        .create_plan(CreatePlanRequest {
            precheck_id: report.precheck_id.clone(),
            rate: Some(v1::Rate {
                per_second: 4.0,
                burst: 1,
                rationale: "the test consumer takes four a second".into(),
            }),
            slice_size: 5,
            observe_for: Some(prost_types::Duration::default()),
            ..Default::default()
        })
        .await?
        .into_inner())
}

fn approve(plan: &v1::Plan, digest: &str) -> ApprovePlanRequest {
    ApprovePlanRequest {
        plan_id: plan.plan_id.clone(),
        digest: digest.to_owned(),
        ..Default::default()
    }
}

const TIMEOUT_3000: &str = "Timeout after 3000 ms for order 123";
const TIMEOUT_5000: &str = "Timeout after 5000 ms for order 456";
const NULL_POINTER: &str = "Object reference not set to an instance of an object.";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fingerprints_group_failures_by_what_went_wrong() -> anyhow::Result<()> {
    init_logging();
    let mut bed = TestBed::without_broker(|_| {}).await?;
    let source = unique("triage");
    let timeout_mt = [
        ("MT-Fault-ExceptionType", "System.TimeoutException"),
        ("MT-Fault-Message", "Timeout after 10 s"),
    ];
    let null_mt = [
        ("MT-Fault-ExceptionType", "System.NullReferenceException"),
        ("MT-Fault-Message", NULL_POINTER),
    ];
    ingest(
        &mut bed.client,
        vec![
            failed(&source, "t1", TIMEOUT_3000, &[]),
            failed(&source, "t2", TIMEOUT_5000, &[]),
            failed(&source, "n1", NULL_POINTER, &[]),
            // The framework's exception class makes its own group, the text
            // from its header when the service gave none.
            failed(&source, "m1", "", &timeout_mt),
            failed(&source, "m2", "", &null_mt),
            failed(&source, "m3", "", &null_mt),
            // Quoted values, timestamps, UUIDs and hex ids fold; "can't" is no quote.
            failed(
                &source,
                "q1",
                "customer 'alice' can't pay at 2026-12-03T10:00:01.5Z",
                &[],
            ),
            failed(
                &source,
                "q2",
                "customer \"bob\" can't pay at 2026-11-30 23:59:59+01:00",
                &[],
            ),
            failed(
                &source,
                "u1",
                "lock 550e8400-e29b-41d4-a716-446655440000 held by 5f2b3c4d5e6f7a8b",
                &[],
            ),
            failed(
                &source,
                "u2",
                "lock 123e4567-e89b-12d3-a456-426614174000 held by 0xff",
                &[],
            ),
            failed(&source, "e1", "", &[]),
        ],
    )
    .await?;
    let everything = Selector {
        sources: vec![source.clone()],
        ..Default::default()
    };
    let timeouts = "rejected: Timeout after <n> ms for order <n>";
    let nulls_mt = format!("rejected · System.NullReferenceException: {NULL_POINTER}");
    assert_eq!(
        groups(&mut bed.client, &everything).await?,
        BTreeMap::from([
            ("rejected".to_owned(), 1),
            (timeouts.to_owned(), 2),
            (format!("rejected: {NULL_POINTER}"), 1),
            (
                "exhausted · System.TimeoutException: Timeout after <n> s".to_owned(),
                1
            ),
            (nulls_mt.clone(), 2),
            ("rejected: customer <q> can't pay at <time>".to_owned(), 2),
            ("rejected: lock <uuid> held by <hex>".to_owned(), 2),
        ])
    );

    // The fingerprint selects exactly: lists, prechecks.
    let by_group = |groups: &[&str]| Selector {
        error_groups: groups.iter().map(|group| (*group).to_owned()).collect(),
        ..everything.clone()
    };
    assert_eq!(
        listed(&mut bed.client, by_group(&[timeouts])).await?,
        ["t1", "t2"]
    );
    assert_eq!(
        listed(&mut bed.client, by_group(&[timeouts, &nulls_mt])).await?,
        ["m2", "m3", "t1", "t2"]
    );
    assert!(
        listed(&mut bed.client, by_group(&["rejected: Timeout after"]))
            .await?
            .is_empty(),
        "a fingerprint is matched whole, not as a prefix"
    );
    let report = precheck_selected(&mut bed.client, by_group(&[timeouts, &nulls_mt])).await?;
    let breakdown: BTreeMap<String, u64> = report
        .by_error_group
        .iter()
        .map(|row| (row.value.clone(), row.total))
        .collect();
    assert_eq!(
        breakdown,
        BTreeMap::from([(timeouts.to_owned(), 2), (nulls_mt.clone(), 2)])
    );
    // They all died just now: the precheck says so.
    assert_eq!(report.recent_arrivals, 4);
    assert_eq!(
        report.arrivals_window.map(|window| window.seconds),
        Some(900)
    );

    // One dead letter shows its class and fingerprint.
    let listed_mt = bed
        .client
        .list_dead_letters(ListDeadLettersRequest {
            selector: Some(by_group(&[&nulls_mt])),
            page_size: 1,
            page_token: String::new(),
        })
        .await?
        .into_inner();
    let shown = bed
        .client
        .get_dead_letter(GetDeadLetterRequest {
            id: listed_mt.dead_letters[0].id.clone(),
        })
        .await?
        .into_inner()
        .dead_letter
        .unwrap();
    assert_eq!(
        shown.error_class.as_deref(),
        Some("System.NullReferenceException")
    );
    assert_eq!(shown.error_group, nulls_mt);

    // Bad input names the field.
    for (groups, field) in [
        (vec![String::new()], "selector.error_groups[0]"),
        (vec![timeouts.to_owned(), "x".repeat(3000)], "error_groups"),
    ] {
        let error = bed
            .client
            .list_dead_letters(ListDeadLettersRequest {
                selector: Some(Selector {
                    error_groups: groups,
                    ..everything.clone()
                }),
                page_size: 10,
                page_token: String::new(),
            })
            .await
            .unwrap_err();
        assert_eq!(error.code(), Code::InvalidArgument, "{error:?}");
        assert!(error.message().contains(field), "{}", error.message());
    }
    bed.finish().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approval_is_refused_while_the_failure_keeps_arriving() -> anyhow::Result<()> {
    init_logging();
    let mut bed = TestBed::without_broker(|_| {}).await?;
    let source = unique("burning");
    ingest(
        &mut bed.client,
        (0..5)
            .map(|n| {
                failed(
                    &source,
                    &format!("a{n}"),
                    &format!("Timeout after {n}00 ms for order {n}"),
                    &[],
                )
            })
            .chain([failed(&source, "b0", NULL_POINTER, &[])])
            .collect(),
    )
    .await?;
    let timeouts = Selector {
        sources: vec![source.clone()],
        error_groups: vec!["rejected: Timeout after <n> ms for order <n>".to_owned()],
        ..Default::default()
    };
    let report = precheck_selected(&mut bed.client, timeouts.clone()).await?;
    assert_eq!(report.total, 5);
    let plan = plan_of(&mut bed.client, &report).await?;

    // Another group arriving is no reason to wait, nor is the same failure
    // in another queue (another consumer).
    let mut elsewhere = failed(&source, "c1", "Timeout after 800 ms for order 88", &[]);
    elsewhere.original_destination = "payments.capture".to_owned();
    ingest(
        &mut bed.client,
        vec![failed(&source, "b1", NULL_POINTER, &[]), elsewhere],
    )
    .await?;
    // The same failure arriving after the precheck is.
    ingest(
        &mut bed.client,
        vec![
            failed(&source, "a5", "Timeout after 700 ms for order 77", &[]),
            failed(&source, "a6", "Timeout after 900 ms for order 99", &[]),
        ],
    )
    .await?;
    let refused = bed
        .client
        .approve_plan(approve(&plan, &report.digest))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    let message = refused.message();
    assert!(
        message
            .starts_with("still arriving: 2 dead letter(s) failing like this plan's died since ")
            && message.contains("Timeout after 900 ms for order 99")
            && message.contains("--override-arrivals"),
        "{message}"
    );
    let still = get_plan(&mut bed.client, &plan.plan_id).await?;
    assert_eq!(still.state(), PlanState::AwaitingApproval);

    // An override needs a reason, and is recorded with the figures.
    let mut without_reason = approve(&plan, &report.digest);
    without_reason.override_arrivals = true;
    let error = bed.client.approve_plan(without_reason).await.unwrap_err();
    assert_eq!(error.code(), Code::InvalidArgument, "{error:?}");
    assert!(
        error.message().contains("override_reason"),
        "{}",
        error.message()
    );

    // Once it stops, a fresh precheck takes the new ones in, and its plan is
    // approved.
    let fresh = precheck_selected(&mut bed.client, timeouts.clone()).await?;
    assert_eq!(
        fresh.total, 8,
        "the new ones, and the same failure in the other queue"
    );
    let fresh_plan = plan_of(&mut bed.client, &fresh).await?;
    let approved = bed
        .client
        .approve_plan(approve(&fresh_plan, &fresh.digest))
        .await?
        .into_inner();
    assert_eq!(approved.state(), PlanState::Canary);
    bed.client
        .cancel_plan(v1::PlanControlRequest {
            plan_id: approved.plan_id.clone(),
            reason: "test over".into(),
            ..Default::default()
        })
        .await?;

    // The first plan, approved regardless by someone who knows why.
    let mut overriding = approve(&plan, &report.digest);
    overriding.override_arrivals = true;
    overriding.override_reason = "a known trickle from the retry job, harmless".into();
    let overridden = bed.client.approve_plan(overriding).await?.into_inner();
    assert_eq!(overridden.state(), PlanState::Canary);
    let action = overridden
        .actions
        .iter()
        .find(|action| action.action == "override_arrivals")
        .expect("the override is an operator action");
    assert!(
        action.reason.starts_with(
            "a known trickle from the retry job, harmless (arrivals: 2 dead letter(s)"
        ),
        "{}",
        action.reason
    );
    bed.finish().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_plan_pauses_when_its_failure_starts_arriving_again() -> anyhow::Result<()> {
    init_logging();
    let broker = Broker::connect().await?;
    // 60 at four a second: 15 s of main wave to notice the fresh failure in.
    let incident = incident(&broker, 60).await?;
    let mut bed = bed(broker, &[&incident.dlq], 60).await?;
    // The consumer is fixed for the replays, still broken for one new message.
    let (received, consuming) =
        consume_rejecting(bed.broker(), &incident.work, "fresh-poison").await?;
    let report = precheck_selected(
        &mut bed.client,
        Selector {
            sources: vec![incident.dlq.clone()],
            ..Default::default()
        },
    )
    .await?;
    let plan = plan_of(&mut bed.client, &report).await?;
    let plan = bed
        .client
        .approve_plan(approve(&plan, &report.digest))
        .await?
        .into_inner();
    let executor = ExecutorHandle::start(bed.executor_config());
    wait_state(
        &mut bed.client,
        &plan.plan_id,
        PlanState::Main,
        Duration::from_secs(30),
    )
    .await?;

    // The same failure again, in the same queue: a new message the consumer
    // still rejects (no `redrive-plan-id`: not a replay coming back, but the
    // cause still there).
    bed.broker()
        .publish(
            "",
            &incident.work,
            br#"{"order_id":"fresh-poison"}"#,
            BasicProperties::default().with_message_id("fresh-poison".into()),
        )
        .await?;

    let paused = wait_state(
        &mut bed.client,
        &plan.plan_id,
        PlanState::Paused,
        Duration::from_secs(30),
    )
    .await?;
    assert!(
        paused
            .state_reason
            .starts_with("still arriving: 1 dead letter(s) failing like this plan's died since "),
        "{}",
        paused.state_reason
    );
    let pause = paused.actions.last().expect("the gate's pause");
    assert_eq!(
        (pause.action.as_str(), pause.actor.as_str()),
        ("pause", "redrive-gate")
    );
    let sent_at_pause = paused.counts.as_ref().map_or(0, |counts| counts.sent);
    assert!(sent_at_pause < 60, "paused before the end: {sent_at_pause}");

    // A resume without an override would pause again on the same evidence
    // only for new arrivals; an operator who knows goes on regardless.
    let resumed = bed
        .client
        .resume_plan(v1::PlanControlRequest {
            plan_id: plan.plan_id.clone(),
            reason: "the retry job's leftovers, fixed".into(),
            override_arrivals: true,
        })
        .await?
        .into_inner();
    assert!(
        resumed
            .actions
            .iter()
            .any(|action| action.action == "override_arrivals")
    );
    let completed = wait_completed(&mut bed.client, &plan.plan_id, Duration::from_secs(60)).await?;
    assert_eq!(
        completed.counts.as_ref().map(|counts| counts.sent),
        Some(60)
    );
    executor.stop().await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop_consuming(consuming)?;
    let received = received.lock().unwrap().clone();
    assert_eq!(received.len(), 60, "every replayed message arrived once");
    assert!(
        !received
            .iter()
            .any(|delivery| delivery.message_id == "fresh-poison"),
        "the new dead letter is not the plan's"
    );
    assert_bed_audit(&bed, &plan.plan_id, &received).await?;
    bed.finish().await
}
