//! The planner's precheck policy and approval freshness against the real
//! services: a stale payment is refused by a single replay without any client
//! flag, a looser client rule needs an override that the report and the plan
//! record, an old or outdated precheck cannot be approved, and a source never
//! seen is an error.

use std::{sync::Arc, time::Duration};

use lapin::BasicProperties;
use redrive_planner::Config;
use redrive_proto::v1::{
    self, ApprovePlanRequest, CreatePlanRequest, PlanState, Rate, RunPrecheckRequest,
    planner_client::PlannerClient, replay_dead_letter_response::Outcome,
};
use redrive_tests::{Broker, DlqTopology, ExecutorHandle, TestBed, init_logging, wait_until};
use tonic::{Code, transport::Channel};

mod support;
use support::{
    Received, as_actor, assert_received_within_audit, cancel, consume, get_plan, stop_consuming,
};

/// A JSON order event of `event_type` whose `timestamp` property is `age` ago.
fn event(order_id: &str, event_type: &str, age: chrono::Duration) -> (Vec<u8>, BasicProperties) {
    let body = format!(r#"{{"order_id":"{order_id}","amount":10}}"#).into_bytes();
    let properties = BasicProperties::default()
        .with_message_id(format!("m-{order_id}").into())
        .with_type(event_type.into())
        .with_content_type("application/json".into())
        .with_timestamp((chrono::Utc::now() - age).timestamp() as u64);
    (body, properties)
}

fn hours(n: i64) -> prost_types::Duration {
    prost_types::Duration {
        seconds: n * 3600,
        nanos: 0,
    }
}

/// Asserts that `error` refuses a request as invalid, its message starting
/// with `field_and_reason` (the field's path first).
fn assert_invalid(error: &tonic::Status, field_and_reason: &str) {
    assert_eq!(error.code(), Code::InvalidArgument, "{}", error.message());
    assert!(
        error.message().starts_with(field_and_reason),
        "{}",
        error.message()
    );
}

/// A test's start: logging, a broker connection and a dead-letter topology
/// of the test's own on it.
async fn broker_with_topology() -> anyhow::Result<(Broker, DlqTopology)> {
    init_logging();
    let broker = Broker::connect().await?;
    let topology = DlqTopology::declare(&broker).await?;
    Ok((broker, topology))
}

/// A bed over `broker` whose planner captures `topology`'s DLQ, keys from
/// `/order_id`, with `policy` applied to its config.
async fn bed(
    broker: Broker,
    topology: &DlqTopology,
    policy: impl FnOnce(&mut Config),
) -> anyhow::Result<TestBed> {
    TestBed::start(broker, |config| {
        config.capture_queues = vec![topology.dlq.clone()];
        config.capture_batch_size = 20;
        config.capture_prefetch = 100;
        config.message_keys = vec!["json:/order_id".to_owned()];
        config.lease_ttl_seconds = 3;
        policy(config);
    })
    .await
}

/// Waits until `count` dead letters are stored; answers their ids by order id.
async fn captured(
    client: &mut PlannerClient<Channel>,
    dlq: &str,
    count: usize,
) -> anyhow::Result<std::collections::HashMap<String, String>> {
    let list = |mut client: PlannerClient<Channel>, dlq: String| async move {
        anyhow::Ok(
            client
                .list_dead_letters(v1::ListDeadLettersRequest {
                    selector: Some(v1::Selector {
                        sources: vec![dlq],
                        ..Default::default()
                    }),
                    page_size: 100,
                    page_token: String::new(),
                })
                .await?
                .into_inner()
                .dead_letters,
        )
    };
    wait_until("capture", Duration::from_secs(30), || {
        let (client, dlq) = (client.clone(), dlq.to_owned());
        async move {
            // Until the first capture the source is unknown to the planner.
            Ok(list(client, dlq)
                .await
                .is_ok_and(|found| found.len() >= count))
        }
    })
    .await?;
    Ok(list(client.clone(), dlq.to_owned())
        .await?
        .into_iter()
        .map(|dead_letter| {
            let order = dead_letter
                .message_key
                .split(':')
                .next()
                .unwrap_or_default()
                .to_owned();
            (order, dead_letter.id)
        })
        .collect())
}

fn replay(id: &str, options: Option<v1::PrecheckOptions>) -> v1::ReplayDeadLetterRequest {
    v1::ReplayDeadLetterRequest {
        dead_letter_id: id.to_owned(),
        reason: "customer ticket 4711".into(),
        options,
        wait: Some(prost_types::Duration {
            seconds: 30,
            nanos: 0,
        }),
    }
}

/// `ReplayDeadLetter` of dead letter `id` with `options` ([`replay`]).
async fn replay_one(
    client: &mut PlannerClient<Channel>,
    id: &str,
    options: Option<v1::PrecheckOptions>,
) -> Result<v1::ReplayDeadLetterResponse, tonic::Status> {
    Ok(client
        .replay_dead_letter(replay(id, options))
        .await?
        .into_inner())
}

/// A plan over the precheck `precheck_id` ([`create`]).
async fn plan_over(
    client: &mut PlannerClient<Channel>,
    precheck_id: &str,
) -> anyhow::Result<v1::Plan> {
    Ok(client.create_plan(create(precheck_id)).await?.into_inner())
}

/// Approves `plan` with the digest it shows, expecting the refusal
/// FailedPrecondition; returns it.
async fn approval_refused(client: &mut PlannerClient<Channel>, plan: &v1::Plan) -> tonic::Status {
    let request = ApprovePlanRequest {
        plan_id: plan.plan_id.clone(),
        digest: plan.precheck_digest.clone(),
        ..Default::default()
    };
    let error = client.approve_plan(request).await.unwrap_err();
    assert_eq!(error.code(), Code::FailedPrecondition);
    error
}

/// The request for a plan over `precheck_id` at 100/s.
fn create(precheck_id: &str) -> CreatePlanRequest {
    CreatePlanRequest {
        precheck_id: precheck_id.to_owned(),
        rate: Some(Rate {
            per_second: 100.0,
            burst: 10,
            rationale: "the test consumer takes this easily".into(),
        }),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stale_payment_is_refused_by_a_single_replay_without_any_flag() -> anyhow::Result<()> {
    let (broker, topology) = broker_with_topology().await?;
    for (order, age) in [("p-old", 3), ("p-new", 0)] {
        let (body, properties) = event(order, "payment.captured", chrono::Duration::hours(age));
        topology.reject(&broker, &body, properties).await?;
    }
    let mut bed = bed(broker, &topology, |config| {
        config.stale_after = vec!["payment.*=2h".to_owned()];
    })
    .await?;
    let ids = captured(&mut bed.client, &topology.dlq, 2).await?;
    let (received, consuming) = consume(bed.broker(), &topology.work).await?;
    let executor = ExecutorHandle::start(bed.executor_config());

    // No option at all: the planner's rule keeps the 3-hour-old payment out.
    let refused = replay_one(&mut bed.client, &ids["p-old"], None).await?;
    assert_eq!(
        refused.outcome(),
        Outcome::NotReplayed,
        "{}",
        refused.reason
    );
    assert_eq!(refused.verdict(), v1::Verdict::Stale);
    assert!(
        refused
            .reason
            .contains("past the 2h0m deadline of event type payment.captured"),
        "{}",
        refused.reason
    );
    assert!(refused.plan_id.is_empty(), "no plan is made for it");
    let fresh = replay_one(&mut bed.client, &ids["p-new"], None).await?;
    assert_eq!(fresh.outcome(), Outcome::Replayed, "{}", fresh.reason);

    // A looser client rule is not a way around it.
    let looser = v1::PrecheckOptions {
        stale_after: [("payment.*".to_owned(), hours(5))].into(),
        ..Default::default()
    };
    let error = replay_one(&mut bed.client, &ids["p-old"], Some(looser.clone()))
        .await
        .unwrap_err();
    assert_invalid(
        &error,
        "options.stale_after[\"payment.*\"]: 5h for event type payment.* is longer than the planner's policy there (2h)",
    );
    assert!(
        error.message().contains("options.override_policy"),
        "{}",
        error.message()
    );

    // An override with its reason is applied, and recorded.
    let overridden = bed
        .client
        .replay_dead_letter(as_actor(
            "alice",
            replay(
                &ids["p-old"],
                Some(v1::PrecheckOptions {
                    override_policy: true,
                    override_reason: "INC-42: the ledger still takes this capture".into(),
                    ..looser
                }),
            ),
        ))
        .await?
        .into_inner();
    assert_eq!(
        overridden.outcome(),
        Outcome::Replayed,
        "{}",
        overridden.reason
    );
    let report = bed
        .client
        .get_precheck(v1::GetPrecheckRequest {
            precheck_id: overridden.precheck_id.clone(),
        })
        .await?
        .into_inner();
    assert!(
        report.warnings[0].starts_with(
            "the planner's precheck policy is overridden by alice: INC-42: the ledger still takes this capture"
        ),
        "{:?}",
        report.warnings
    );
    let options = report.options.unwrap();
    assert!(options.override_policy);
    assert_eq!(options.stale_after["payment.*"], hours(5));
    let plan = get_plan(&mut bed.client, &overridden.plan_id).await?;
    let action = plan
        .actions
        .iter()
        .find(|action| action.action == "override_policy")
        .expect("the plan records the override");
    assert_eq!(action.actor, "alice");
    assert!(action.reason.contains("INC-42"), "{}", action.reason);

    // The consumer got the fresh payment, and the old one only with the override.
    wait_until("both deliveries", Duration::from_secs(10), || {
        let received = Arc::clone(&received);
        async move { Ok(received.lock().unwrap().len() >= 2) }
    })
    .await?;
    stop_consuming(consuming)?;
    executor.stop().await?;
    let received: Vec<Received> = received.lock().unwrap().clone();
    let ids: Vec<&str> = received.iter().map(|r| r.message_id.as_str()).collect();
    assert_eq!(ids, ["m-p-new", "m-p-old"]);
    let pool = bed.pool().await?;
    for (plan_id, id) in [
        (&fresh.plan_id, "m-p-new"),
        (&overridden.plan_id, "m-p-old"),
    ] {
        let replayed: Vec<Received> = received
            .iter()
            .filter(|r| r.message_id == id)
            .cloned()
            .collect();
        assert_received_within_audit(&pool, plan_id, &replayed).await?;
    }
    pool.close().await;
    bed.finish().await
}

/// The report's staleness row for `event_type`.
fn coverage<'a>(report: &'a v1::PrecheckReport, event_type: &str) -> &'a v1::StalenessCoverage {
    report
        .staleness
        .iter()
        .find(|row| row.event_type == event_type)
        .unwrap_or_else(|| panic!("no staleness row for {event_type}: {:?}", report.staleness))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_report_names_each_event_types_deadline_and_warns_of_uncovered_ages()
-> anyhow::Result<()> {
    let (broker, topology) = broker_with_topology().await?;
    for (order, event_type, age) in [
        ("o-old", "order.created", 72),
        ("o-new", "order.created", 1),
        ("p-old", "payment.captured", 3),
        ("x-old", "", 30),
    ] {
        let (body, mut properties) = event(order, event_type, chrono::Duration::hours(age));
        if event_type.is_empty() {
            properties = properties.with_type("".into());
        }
        topology.reject(&broker, &body, properties).await?;
    }
    // No policy at all: what a new user starts with.
    let mut bed = bed(broker, &topology, |_| {}).await?;
    let ids = captured(&mut bed.client, &topology.dlq, 4).await?;
    let selector = v1::Selector {
        sources: vec![topology.dlq.clone()],
        ..Default::default()
    };
    let report = bed
        .client
        .run_precheck(RunPrecheckRequest {
            selector: Some(selector.clone()),
            options: None,
        })
        .await?
        .into_inner();
    let counts = report.counts.unwrap_or_default();
    assert_eq!(
        (counts.replayable, counts.stale),
        (4, 0),
        "without a rule nothing is stale"
    );
    let orders = coverage(&report, "order.created");
    assert_eq!((orders.rule.as_str(), orders.count), ("", 2));
    assert_eq!(orders.max_age, None);
    assert_eq!(orders.oldest_age.unwrap().seconds / 3600, 72);
    let untyped = coverage(&report, "");
    assert_eq!((untyped.rule.as_str(), untyped.count), ("", 1));
    let warning = report
        .warnings
        .iter()
        .find(|warning| warning.starts_with("no staleness rule covers"))
        .unwrap_or_else(|| panic!("no staleness warning in {:?}", report.warnings));
    for expected in [
        "covers 4 dead letters",
        "order.created (2, oldest 3d0h)",
        "payment.captured (1, oldest 3h0m)",
        "no event type (1, oldest 1d6h)",
        // The oldest first, each age said once.
        "however old: order.created (2, oldest 3d0h), no event type (1, oldest 1d6h), \
         payment.captured (1, oldest 3h0m). Set",
        "--stale-after TYPE=AGE",
    ] {
        assert!(warning.contains(expected), "{expected:?} in {warning}");
    }

    // A rule for payments only: payments name it, the rest is still warned of.
    let report = bed
        .client
        .run_precheck(RunPrecheckRequest {
            selector: Some(selector.clone()),
            options: Some(v1::PrecheckOptions {
                stale_after: [("payment.*".to_owned(), hours(2))].into(),
                ..Default::default()
            }),
        })
        .await?
        .into_inner();
    let payments = coverage(&report, "payment.captured");
    assert_eq!(payments.rule, "stale_after payment.*=2h0m");
    assert_eq!((payments.count, payments.stale), (1, 1));
    assert_eq!(payments.max_age, Some(hours(2)));
    let warning = report
        .warnings
        .iter()
        .find(|warning| warning.starts_with("no staleness rule covers 3 dead letters"))
        .unwrap_or_else(|| panic!("no staleness warning in {:?}", report.warnings));
    assert!(!warning.contains("payment"), "{warning}");

    // A single replay runs the same precheck and answers its warning too; no
    // executor runs, so nothing is published and the plan of one is cancelled.
    let mut request = replay(&ids["o-old"], None);
    request.wait = Some(prost_types::Duration {
        seconds: 1,
        nanos: 0,
    });
    let answer = bed.client.replay_dead_letter(request).await?.into_inner();
    assert_eq!(answer.outcome(), Outcome::NotReplayed, "{}", answer.reason);
    assert!(
        answer
            .warnings
            .iter()
            .any(|warning| warning.contains("order.created (1, oldest 3d0h)")),
        "{:?}",
        answer.warnings
    );
    assert_eq!(bed.broker().ready_count(&topology.work).await?, 0);

    // A default deadline in the planner's policy covers everything: no warning.
    bed.restart_planner(|config| {
        config.default_stale_after = Some(Duration::from_secs(48 * 3600));
    })
    .await?;
    let report = bed
        .client
        .run_precheck(RunPrecheckRequest {
            selector: Some(selector),
            options: None,
        })
        .await?
        .into_inner();
    assert!(
        report
            .warnings
            .iter()
            .all(|warning| !warning.starts_with("no staleness rule")),
        "{:?}",
        report.warnings
    );
    let orders = coverage(&report, "order.created");
    assert_eq!(orders.rule, "default_stale_after 2d0h");
    assert_eq!((orders.count, orders.stale), (2, 1));
    bed.finish().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn prechecks_run_under_the_policy_and_an_override_is_on_the_record() -> anyhow::Result<()> {
    let (broker, topology) = broker_with_topology().await?;
    for (order, event_type, age) in [
        ("p-old", "payment.captured", 3),
        ("p-new", "payment.captured", 0),
        ("o-old", "order.paid", 3),
    ] {
        let (body, properties) = event(order, event_type, chrono::Duration::hours(age));
        topology.reject(&broker, &body, properties).await?;
    }
    let dlq = topology.dlq.clone();
    let mut bed = bed(broker, &topology, |config| {
        config.stale_after = vec!["payment.*=2h".to_owned()];
        config.stale_after_source = vec![format!("{dlq}=150m")];
    })
    .await?;
    captured(&mut bed.client, &topology.dlq, 3).await?;
    let selector = v1::Selector {
        sources: vec![topology.dlq.clone()],
        ..Default::default()
    };

    // Without options: both old events are stale, each by its own rule.
    let report = bed
        .client
        .run_precheck(RunPrecheckRequest {
            selector: Some(selector.clone()),
            options: None,
        })
        .await?
        .into_inner();
    let counts = report.counts.unwrap();
    assert_eq!((counts.replayable, counts.stale), (1, 2));
    let reasons: Vec<&str> = report
        .sample_blocked
        .iter()
        .map(|item| item.reason.as_str())
        .collect();
    assert!(
        reasons
            .iter()
            .any(|reason| reason.contains("deadline of event type payment.captured")),
        "{reasons:?}"
    );
    assert!(
        reasons
            .iter()
            .any(|reason| reason.contains(&format!("2h30m deadline of source {dlq}"))),
        "{reasons:?}"
    );
    // The report shows the effective options: the policy, which the digest covers.
    let options = report.options.unwrap();
    assert_eq!(options.stale_after["payment.*"], hours(2));
    assert_eq!(
        options.stale_after_source[&dlq],
        prost_types::Duration {
            seconds: 150 * 60,
            nanos: 0
        }
    );
    assert!(!options.override_policy);

    // A stricter client rule applies on top of the policy.
    let stricter = bed
        .client
        .run_precheck(RunPrecheckRequest {
            selector: Some(selector.clone()),
            options: Some(v1::PrecheckOptions {
                stale_after: [(
                    "payment.captured".to_owned(),
                    prost_types::Duration {
                        seconds: 0,
                        nanos: 1_000_000,
                    },
                )]
                .into(),
                ..Default::default()
            }),
        })
        .await?
        .into_inner();
    assert_eq!(stricter.counts.unwrap().stale, 3);

    // Looser without an override: refused, naming the field.
    let looser = v1::PrecheckOptions {
        stale_after_source: [(dlq.clone(), hours(4))].into(),
        ..Default::default()
    };
    let error = bed
        .client
        .run_precheck(RunPrecheckRequest {
            selector: Some(selector.clone()),
            options: Some(looser.clone()),
        })
        .await
        .unwrap_err();
    assert_invalid(&error, &format!("options.stale_after_source[\"{dlq}\"]"));

    // With the override: applied (the order event is replayable now), said in
    // the report, and in the actions of a plan made from it.
    let overridden = bed
        .client
        .run_precheck(as_actor(
            "bob",
            RunPrecheckRequest {
                selector: Some(selector.clone()),
                options: Some(v1::PrecheckOptions {
                    override_policy: true,
                    override_reason: "INC-7: orders accepts late events today".into(),
                    ..looser
                }),
            },
        ))
        .await?
        .into_inner();
    let counts = overridden.counts.unwrap();
    assert_eq!(
        (counts.replayable, counts.stale),
        (2, 1),
        "p-old stays stale"
    );
    let warning = &overridden.warnings[0];
    assert!(
        warning.starts_with(
            "the planner's precheck policy is overridden by bob: INC-7: orders accepts late events today"
        ) && warning.contains(&format!("options.stale_after_source[\"{dlq}\"]: 4h")),
        "{warning}"
    );
    let options = overridden.options.unwrap();
    assert_eq!(options.stale_after_source[&dlq], hours(4));
    assert_eq!(
        options.override_reason,
        "INC-7: orders accepts late events today"
    );
    let plan = bed
        .client
        .create_plan(as_actor("carol", create(&overridden.precheck_id)))
        .await?
        .into_inner();
    let action = plan
        .actions
        .iter()
        .find(|action| action.action == "override_policy")
        .expect("the plan records the override");
    assert_eq!(action.actor, "bob");
    assert!(
        action.reason.contains(&overridden.precheck_id) && action.reason.contains("INC-7"),
        "{}",
        action.reason
    );

    // A source never seen is an error, not an empty report.
    let error = bed
        .client
        .run_precheck(RunPrecheckRequest {
            selector: Some(v1::Selector {
                sources: vec!["orders.dql".into()],
                ..Default::default()
            }),
            options: None,
        })
        .await
        .unwrap_err();
    assert_eq!(error.code(), Code::NotFound);
    assert_eq!(
        error.message(),
        format!(
            "selector.sources[0] \"orders.dql\": no dead letter from this source has ever been stored (a typo?); known sources: {dlq}"
        )
    );

    bed.finish().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_old_or_outdated_precheck_cannot_be_approved() -> anyhow::Result<()> {
    let (broker, topology) = broker_with_topology().await?;
    for order in ["o-1", "o-2", "o-3"] {
        let (body, properties) = event(order, "order.paid", chrono::Duration::zero());
        topology.reject(&broker, &body, properties).await?;
    }
    let mut bed = bed(broker, &topology, |_| {}).await?;
    let ids = captured(&mut bed.client, &topology.dlq, 3).await?;
    let pool = bed.pool().await?;
    let selector = v1::Selector {
        sources: vec![topology.dlq.clone()],
        ..Default::default()
    };
    let precheck = |mut client: PlannerClient<Channel>| {
        let selector = selector.clone();
        async move {
            anyhow::Ok(
                client
                    .run_precheck(RunPrecheckRequest {
                        selector: Some(selector),
                        options: None,
                    })
                    .await?
                    .into_inner(),
            )
        }
    };
    let approve = |mut client: PlannerClient<Channel>, plan: v1::Plan| async move {
        client
            .approve_plan(ApprovePlanRequest {
                plan_id: plan.plan_id.clone(),
                digest: plan.precheck_digest.clone(),
                ..Default::default()
            })
            .await
    };

    // Older than --max-precheck-age (15 minutes by default).
    let old = precheck(bed.client.clone()).await?;
    let plan = plan_over(&mut bed.client, &old.precheck_id).await?;
    sqlx::query(
        "UPDATE prechecks SET created_at = now() - interval '20 minutes' WHERE id = $1::uuid",
    )
    .bind(&old.precheck_id)
    .execute(&pool)
    .await?;
    let error = approval_refused(&mut bed.client, &plan).await;
    assert!(
        error.message().contains(&format!(
            "precheck {} of plan {} is 20m",
            old.precheck_id, plan.plan_id
        )) && error
            .message()
            .contains("older than the planner's --max-precheck-age of 15m")
            && error.message().contains("run the precheck again"),
        "{}",
        error.message()
    );
    let unchanged = get_plan(&mut bed.client, &plan.plan_id).await?;
    assert_eq!(unchanged.state(), PlanState::AwaitingApproval);
    cancel(&mut bed.client, &plan.plan_id, "precheck too old").await?;

    // A dead letter repaired after the precheck.
    let before_repair = precheck(bed.client.clone()).await?;
    bed.client
        .repair_dead_letter(as_actor(
            "alice",
            v1::RepairDeadLetterRequest {
                dead_letter_id: ids["o-1"].clone(),
                new_body: br#"{"order_id":"o-1","amount":12}"#.to_vec(),
                reason: "amount was wrong".into(),
            },
        ))
        .await?;
    let plan = plan_over(&mut bed.client, &before_repair.precheck_id).await?;
    let error = approval_refused(&mut bed.client, &plan).await;
    assert!(
        error.message().contains(&format!(
            "dead letter {} was repaired (revision 1 by alice",
            ids["o-1"]
        )) && error.message().contains("run the precheck again"),
        "{}",
        error.message()
    );
    cancel(&mut bed.client, &plan.plan_id, "repaired since").await?;

    // A dead letter replayed by another plan after the precheck.
    let before_replay = precheck(bed.client.clone()).await?;
    let executor = ExecutorHandle::start(bed.executor_config());
    let single = replay_one(&mut bed.client, &ids["o-2"], None).await?;
    assert_eq!(single.outcome(), Outcome::Replayed, "{}", single.reason);
    let plan = plan_over(&mut bed.client, &before_replay.precheck_id).await?;
    let error = approval_refused(&mut bed.client, &plan).await;
    assert!(
        error.message().contains(&format!(
            "dead letter {}: its message key o-2:order.paid was replayed by plan {}",
            ids["o-2"], single.plan_id
        )),
        "{}",
        error.message()
    );

    // A fresh precheck sees all that, and its plan is approved.
    let fresh = precheck(bed.client.clone()).await?;
    assert_eq!(
        fresh.counts.unwrap().replayable,
        2,
        "o-2 is already replayed"
    );
    let plan = plan_over(&mut bed.client, &fresh.precheck_id).await?;
    let approved = approve(bed.client.clone(), plan).await?.into_inner();
    assert_eq!(approved.state(), PlanState::Canary);

    executor.stop().await?;
    bed.finish().await
}
