//! Idempotency keys (issue "Closed loop", part 5), as an orchestrator that
//! retries after a timeout meets them: the same key and request get the first
//! call's answer (one plan, one precheck, one approval), another request
//! under the key is refused, an error is not kept, each caller has its own
//! keys, and a bad key is named. Against the real PostgreSQL.

mod support;

use redrive_proto::v1::{
    self, ApprovePlanRequest, CreatePlanRequest, IngestDeadLettersRequest, ListPlansRequest,
    PlanControlRequest, PlanState, RunPrecheckRequest, Selector, planner_client::PlannerClient,
};
use redrive_tests::{TestBed, init_logging, unique};
use tonic::{Code, Request, transport::Channel};

use support::ingest;

/// `message` as `actor` with idempotency key `key`.
fn keyed<T>(actor: &str, key: &str, message: T) -> Request<T> {
    let mut request = support::as_actor(actor, message);
    request
        .metadata_mut()
        .insert("idempotency-key", key.parse().expect("an ASCII key"));
    request
}

fn precheck_of(source: &str) -> RunPrecheckRequest {
    RunPrecheckRequest {
        selector: Some(Selector {
            sources: vec![source.to_owned()],
            ..Default::default()
        }),
        options: None,
    }
}

fn plan_of(precheck_id: &str, rationale: &str) -> CreatePlanRequest {
    CreatePlanRequest {
        precheck_id: precheck_id.to_owned(),
        rate: Some(v1::Rate {
            per_second: 10.0,
            burst: 1,
            rationale: rationale.to_owned(),
        }),
        ..Default::default()
    }
}

/// The plans made from precheck `precheck_id`.
async fn plans_of(
    client: &mut PlannerClient<Channel>,
    precheck_id: &str,
) -> anyhow::Result<Vec<v1::Plan>> {
    Ok(client
        .list_plans(ListPlansRequest {
            page_size: 1000,
            ..Default::default()
        })
        .await?
        .into_inner()
        .plans
        .into_iter()
        .filter(|plan| plan.precheck_id == precheck_id)
        .collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_call_gets_the_first_answer_and_never_a_second_plan() -> anyhow::Result<()> {
    init_logging();
    let mut bed = TestBed::without_broker(|_| {}).await?;
    let source = unique("keyed");
    ingest(
        &mut bed.client,
        (0..3)
            .map(|n| IngestDeadLettersRequest {
                source: source.clone(),
                message_id: format!("m-{n}"),
                body: format!(r#"{{"order_id":"o-{n}"}}"#).into_bytes(),
                reason: "rejected".to_owned(),
                original_destination: "orders".to_owned(),
                ..Default::default()
            })
            .collect(),
    )
    .await?;
    let client = &mut bed.client;

    // A precheck retried: one precheck.
    let first = client
        .run_precheck(keyed("airflow", "run-1:precheck", precheck_of(&source)))
        .await?
        .into_inner();
    let again = client
        .run_precheck(keyed("airflow", "run-1:precheck", precheck_of(&source)))
        .await?
        .into_inner();
    assert_eq!(again.precheck_id, first.precheck_id);
    assert_eq!(again.digest, first.digest);

    // An error is not kept: the same key then runs the fixed request.
    let missing = client
        .create_plan(keyed(
            "airflow",
            "run-1:create",
            plan_of("0190f3a2-7c1e-7b3a-9d4e-2f6a8b1c0d5e", "ten a second"),
        ))
        .await
        .unwrap_err();
    assert_eq!(missing.code(), Code::NotFound, "{missing:?}");
    let plan = client
        .create_plan(keyed(
            "airflow",
            "run-1:create",
            plan_of(&first.precheck_id, "ten a second"),
        ))
        .await?
        .into_inner();
    // The retry after a timeout: the same plan, and only one.
    let retried = client
        .create_plan(keyed(
            "airflow",
            "run-1:create",
            plan_of(&first.precheck_id, "ten a second"),
        ))
        .await?
        .into_inner();
    assert_eq!(retried.plan_id, plan.plan_id);
    assert_eq!(plans_of(client, &first.precheck_id).await?.len(), 1);

    // Another request under the key is refused, naming the first.
    let other = client
        .create_plan(keyed(
            "airflow",
            "run-1:create",
            plan_of(&first.precheck_id, "twenty a second"),
        ))
        .await
        .unwrap_err();
    assert_eq!(other.code(), Code::FailedPrecondition, "{other:?}");
    assert!(
        other
            .message()
            .contains("\"run-1:create\" was used for another request (CreatePlan at "),
        "{}",
        other.message()
    );
    // Another caller's key of the same name is its own.
    let theirs = client
        .create_plan(keyed(
            "cron",
            "run-1:create",
            plan_of(&first.precheck_id, "ten a second"),
        ))
        .await?
        .into_inner();
    assert_ne!(theirs.plan_id, plan.plan_id);
    assert_eq!(plans_of(client, &first.precheck_id).await?.len(), 2);

    // An approval retried gets the approval, not "approved twice".
    let approve = || ApprovePlanRequest {
        plan_id: plan.plan_id.clone(),
        digest: first.digest.clone(),
        ..Default::default()
    };
    let approved = client
        .approve_plan(keyed("bob", "run-1:approve", approve()))
        .await?
        .into_inner();
    assert_eq!(approved.state(), PlanState::Canary);
    let approved_again = client
        .approve_plan(keyed("bob", "run-1:approve", approve()))
        .await?
        .into_inner();
    assert_eq!(approved_again.state(), PlanState::Canary);
    assert_eq!(approved_again.approved_by, "bob");
    // Without a key a second approval is still refused.
    let twice = client
        .approve_plan(support::as_actor("bob", approve()))
        .await
        .unwrap_err();
    assert_eq!(twice.code(), Code::FailedPrecondition, "{twice:?}");

    // A pause retried: one pause action.
    let pause = || PlanControlRequest {
        plan_id: plan.plan_id.clone(),
        reason: "downstream deploy".into(),
        ..Default::default()
    };
    client
        .pause_plan(keyed("airflow", "run-1:pause", pause()))
        .await?;
    let paused = client
        .pause_plan(keyed("airflow", "run-1:pause", pause()))
        .await?
        .into_inner();
    assert_eq!(paused.state(), PlanState::Paused);
    assert_eq!(
        paused
            .actions
            .iter()
            .filter(|action| action.action == "pause")
            .count(),
        1
    );

    // Concurrent first calls with one key make one plan.
    let fresh = client
        .run_precheck(support::as_actor("airflow", precheck_of(&source)))
        .await?
        .into_inner();
    let racing = (0..4).map(|_| {
        let mut client = client.clone();
        let request = plan_of(&fresh.precheck_id, "ten a second");
        tokio::spawn(async move {
            client
                .create_plan(keyed("airflow", "run-2:create", request))
                .await
        })
    });
    let answers = futures::future::join_all(racing).await;
    let mut made = std::collections::BTreeSet::new();
    for answer in answers {
        match answer? {
            Ok(plan) => {
                made.insert(plan.into_inner().plan_id);
            }
            Err(status) => assert_eq!(status.code(), Code::Unavailable, "{status:?}"),
        }
    }
    assert!(made.len() <= 1, "{made:?}");
    assert_eq!(plans_of(client, &fresh.precheck_id).await?.len(), 1);

    // A bad key is named.
    for bad in ["", &"k".repeat(256), "a key with spaces"] {
        let mut request = Request::new(precheck_of(&source));
        request
            .metadata_mut()
            .insert("idempotency-key", bad.parse().expect("metadata"));
        let error = client.run_precheck(request).await.unwrap_err();
        assert_eq!(error.code(), Code::InvalidArgument, "{bad:?}: {error:?}");
        assert!(
            error.message().contains("idempotency-key"),
            "{}",
            error.message()
        );
    }
    bed.finish().await
}

/// A precheck whose state-check hook is down fails `UNAVAILABLE`; it changed
/// nothing, so its key is not held: the retry runs it again (and gets the
/// hook's error again, not a refusal of the key for 24 hours). A call that
/// changes something still keeps such an error (the test above).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_precheck_that_failed_does_not_hold_its_key() -> anyhow::Result<()> {
    init_logging();
    // Nothing listens on a port just freed: the hook is down.
    let down = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let mut bed = TestBed::without_broker(|config| {
        config.state_checks = vec![format!("destination:orders=http://{down}/check")];
    })
    .await?;
    let source = unique("keyed_down");
    ingest(
        &mut bed.client,
        vec![IngestDeadLettersRequest {
            source: source.clone(),
            message_id: "m-1".to_owned(),
            body: br#"{"order_id":"o-1"}"#.to_vec(),
            reason: "rejected".to_owned(),
            original_destination: "orders".to_owned(),
            ..Default::default()
        }],
    )
    .await?;
    for attempt in 0..2 {
        let status = bed
            .client
            .run_precheck(keyed("airflow", "run-9:precheck", precheck_of(&source)))
            .await
            .expect_err("the hook is down");
        assert_eq!(
            status.code(),
            Code::Unavailable,
            "attempt {attempt}: {}",
            status.message()
        );
        assert!(
            !status.message().contains("idempotency key"),
            "attempt {attempt} ran the precheck: {}",
            status.message()
        );
    }
    bed.finish().await
}
