//! Replay plans end to end against real RabbitMQ, Redis and PostgreSQL: what
//! the consumer receives, what the audit says, rates across executors, a killed
//! executor, fencing, a Redis outage and unroutable messages.

use std::{collections::HashMap, time::Duration};

use anyhow::Context;

use lapin::types::{AMQPValue, FieldTable};
use redrive_proto::v1::{
    self, ApprovePlanRequest, CreatePlanRequest, GetPlanRequest, PlanState, Rate,
    RunPrecheckRequest, coordinator_client::CoordinatorClient, planner_client::PlannerClient,
};
use redrive_tests::{
    AMQP_URL, Broker, ExecutorHandle, ExecutorProcess, REDIS_URL, TcpProxy, TestBed, amqp_table,
    amqp_text, dead_letters_of, init_logging, plan_request, unique, wait_until,
};
use tokio::time::Instant;
use tonic::{Code, transport::Channel};

mod support;
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_replayable_message_arrives_exactly_once_and_only_where_it_died() -> anyhow::Result<()>
{
    init_logging();
    let broker = Broker::connect().await?;
    let incident = incident(&broker, 300).await?;
    let healthy_before = broker.ready_count(&incident.healthy).await?;
    assert_eq!(healthy_before, 300);
    let mut bed = bed(broker, &[&incident.dlq], 300).await?;
    let (received, consuming) = consume(bed.broker(), &incident.work).await?;

    let plan = approved_plan(&mut bed.client, &incident.dlq, 2000.0, 100, None).await?;
    // Watch it live, as an ops portal would, from before the first claim.
    let mut watch = bed
        .client
        .watch_plan(v1::WatchPlanRequest {
            plan_id: plan.plan_id.clone(),
            include_events: true,
        })
        .await?
        .into_inner();
    let watching = tokio::spawn(async move {
        let (mut snapshots, mut events, mut last_state) = (0, 0, PlanState::Unspecified);
        while let Ok(Some(update)) = watch.message().await {
            match update.update {
                Some(v1::watch_plan_response::Update::Progress(plan)) => {
                    snapshots += 1;
                    last_state = plan.state();
                }
                Some(v1::watch_plan_response::Update::Event(_)) => events += 1,
                None => {}
            }
        }
        (snapshots, events, last_state)
    });
    let executor = ExecutorHandle::start(bed.executor_config());
    let done = wait_completed(&mut bed.client, &plan.plan_id, Duration::from_secs(60)).await?;
    let (snapshots, events, last_state) =
        tokio::time::timeout(Duration::from_secs(10), watching).await??;
    assert_eq!(
        last_state,
        PlanState::Completed,
        "the watch ends with the final state"
    );
    assert!(
        snapshots >= 2,
        "progress snapshots while it ran: {snapshots}"
    );
    assert_eq!(events, 300, "one audit event per message");
    executor.stop().await?;
    let received = drain(&received, consuming, Duration::from_millis(300)).await?;
    assert_eq!(received.len(), 300, "every replayable message arrived once");
    assert_bed_audit(&bed, &plan.plan_id, &received).await?;
    let mut by_id: HashMap<String, &Received> = HashMap::new();
    for delivery in &received {
        assert!(
            by_id
                .insert(delivery.message_id.clone(), delivery)
                .is_none(),
            "{} twice",
            delivery.message_id
        );
    }
    let m7 = by_id["m-7"];
    assert_eq!(m7.body, br#"{"order_id":"o-7","n":7}"#, "same body bytes");
    let headers = m7.headers.inner();
    assert!(
        !headers.contains_key("x-death"),
        "delivery accounting restarts"
    );
    assert!(!headers.contains_key("x-first-death-reason"));
    assert_eq!(
        headers.get("tenant"),
        Some(&amqp_text("acme")),
        "application headers kept"
    );
    assert_eq!(
        headers.get("seq"),
        Some(&AMQPValue::LongInt(7)),
        "with their AMQP types"
    );
    assert_eq!(
        headers.get("redrive-plan-id"),
        Some(&amqp_text(&plan.plan_id))
    );
    assert_eq!(headers.get("redrive-attempt"), Some(&AMQPValue::LongInt(1)));
    assert_eq!(
        headers.get("redrive-dead-letter-reason"),
        Some(&amqp_text("rejected"))
    );
    assert!(headers.contains_key("traceparent"));
    assert_eq!(
        bed.broker().ready_count(&incident.healthy).await?,
        300,
        "the healthy subscriber got no second copy"
    );

    let counts = done.counts.unwrap();
    assert_eq!(counts.sent, 300);
    assert_eq!(done.items_done, 300);
    let report = audit_report(&mut bed.client, &plan.plan_id).await?;
    assert_eq!(report.sent_keys.len(), 300);
    assert!(report.sent_keys.contains(&"o-7:order.paid".to_owned()));
    assert!(report.not_sent.is_empty());

    // Replaying the same dead letters again is refused by the precheck.
    let again = precheck(&mut bed.client, &incident.dlq).await?;
    assert_eq!(again.counts.unwrap().already_replayed, 300);

    bed.finish().await
}

/// A virtual host of the local broker made for one test, deleted when
/// dropped (`rabbitmqctl add_vhost` / `delete_vhost`; guest may use it).
struct Vhost(String);

impl Vhost {
    fn create() -> anyhow::Result<Self> {
        let name = unique("redrive-test-vhost");
        let rabbitmqctl = |args: &[&str]| -> anyhow::Result<()> {
            let status = std::process::Command::new("rabbitmqctl")
                .args(args)
                .stdout(std::process::Stdio::null())
                .status()
                .context("running rabbitmqctl")?;
            anyhow::ensure!(status.success(), "rabbitmqctl {args:?}: {status}");
            Ok(())
        };
        rabbitmqctl(&["add_vhost", &name])?;
        let vhost = Self(name);
        rabbitmqctl(&["set_permissions", "-p", &vhost.0, "guest", ".*", ".*", ".*"])?;
        Ok(vhost)
    }

    fn url(&self) -> String {
        format!("amqp://guest:guest@127.0.0.1:5672/{}", self.0)
    }
}

impl Drop for Vhost {
    fn drop(&mut self) {
        let _ = std::process::Command::new("rabbitmqctl")
            .args(["delete_vhost", &self.0])
            .stdout(std::process::Stdio::null())
            .status();
    }
}

/// Identity covers the broker: two deployments on two virtual hosts, with
/// queues of the same names and dead letters of the same message keys, whose
/// executors share one Redis and one prefix. Broker A's replay is done
/// first, so its replay keys are in Redis; broker B's executor still
/// delivers every message (none is skipped as a duplicate), and each vhost's
/// consumer gets each id once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_vhosts_sharing_one_redis_prefix_both_deliver() -> anyhow::Result<()> {
    init_logging();
    let vhost = Vhost::create()?;
    let broker_a = Broker::connect().await?;
    let broker_b = Broker::connect_to(&vhost.url()).await?;
    let names = Incident {
        exchange: unique("orders"),
        work: unique("work"),
        healthy: unique("healthy"),
        dlq: unique("dlq"),
    };
    let incident = declare_incident(&broker_a, names.clone(), 30, "", 0).await?;
    declare_incident(&broker_b, names, 30, "", 0).await?;
    let mut bed_a = bed(broker_a, &[&incident.dlq], 30).await?;
    let mut bed_b = TestBed::start(broker_b, |config| {
        capturing(config, &[&incident.dlq]);
        config.amqp.url = vhost.url();
    })
    .await?;
    captured(&mut bed_b.client, &incident.dlq, 30).await?;
    let (received_a, consuming_a) = consume(bed_a.broker(), &incident.work).await?;
    let (received_b, consuming_b) = consume(bed_b.broker(), &incident.work).await?;

    let plan_a = approved_plan(&mut bed_a.client, &incident.dlq, 500.0, 50, None).await?;
    let executor_a = ExecutorHandle::start(bed_a.executor_config());
    wait_completed(&mut bed_a.client, &plan_a.plan_id, Duration::from_secs(60)).await?;
    executor_a.stop().await?;

    let plan_b = approved_plan(&mut bed_b.client, &incident.dlq, 500.0, 50, None).await?;
    let mut config_b = bed_b.executor_config();
    config_b.amqp.url = vhost.url();
    config_b.redis_prefix = bed_a.redis.prefix.clone();
    let executor_b = ExecutorHandle::start(config_b);
    let done_b =
        wait_completed(&mut bed_b.client, &plan_b.plan_id, Duration::from_secs(60)).await?;
    executor_b.stop().await?;

    let received_a = drain(&received_a, consuming_a, Duration::from_millis(300)).await?;
    let received_b = drain(&received_b, consuming_b, Duration::from_millis(300)).await?;
    let counts_b = done_b.counts.unwrap();
    assert_eq!(
        (counts_b.sent, counts_b.skipped_duplicate),
        (30, 0),
        "broker B's replays are not broker A's"
    );
    for received in [&received_a, &received_b] {
        let copies = copies_by_id(received);
        assert_eq!(copies.len(), 30, "every message id arrived");
        assert!(copies.values().all(|copies| *copies == 1), "{copies:?}");
    }
    assert_eq!(
        copies_by_id(&received_a)
            .keys()
            .collect::<std::collections::BTreeSet<_>>(),
        copies_by_id(&received_b)
            .keys()
            .collect::<std::collections::BTreeSet<_>>(),
        "the same message ids on both vhosts"
    );
    assert_bed_audit(&bed_a, &plan_a.plan_id, &received_a).await?;
    assert_bed_audit(&bed_b, &plan_b.plan_id, &received_b).await?;
    bed_b.finish().await?;
    bed_a.finish().await?;
    drop(vhost);
    Ok(())
}

/// A plan's rate protects the queue the messages land in, however they are
/// routed there: one plan in queue mode (default exchange, routing key the
/// work queue) and one in exchange mode (the fan-out exchange they were
/// published to, which delivers to the work queue) draw from one budget.
/// Two executors; no 1 s window holds more than rate + burst across both.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_routes_into_one_queue_share_one_rate() -> anyhow::Result<()> {
    init_logging();
    let broker = Broker::connect().await?;
    let incident = incident_named(&broker, 120, "r-").await?;
    let mut bed = bed(broker, &[&incident.dlq], 120).await?;
    let listed = dead_letters_of(&mut bed.client, &incident.dlq, 500).await?;
    let ids: Vec<String> = listed.dead_letters.iter().map(|d| d.id.clone()).collect();
    assert_eq!(ids.len(), 120);
    let (received, consuming) = consume(bed.broker(), &incident.work).await?;
    let modes = [
        v1::destination::Mode::Queue(v1::QueueDestination {}),
        v1::destination::Mode::Exchange(v1::ExchangeDestination {}),
    ];
    let mut plans = Vec::new();
    let mut message_ids = Vec::new();
    for (half, mode) in ids.chunks(60).zip(modes) {
        message_ids.push(
            listed
                .dead_letters
                .iter()
                .filter(|d| half.contains(&d.id))
                .filter_map(|d| d.message_id.clone())
                .collect::<std::collections::HashSet<String>>(),
        );
        let report = bed
            .client
            .run_precheck(RunPrecheckRequest {
                selector: Some(v1::Selector {
                    sources: vec![incident.dlq.clone()],
                    ids: half.to_vec(),
                    ..Default::default()
                }),
                options: None,
            })
            .await?
            .into_inner();
        let plan = bed
            .client
            .create_plan(CreatePlanRequest {
                precheck_id: report.precheck_id.clone(),
                rate: Some(Rate {
                    per_second: 40.0,
                    burst: 4,
                    rationale: "the work queue's consumer handles 40/s".into(),
                }),
                destination: Some(v1::Destination { mode: Some(mode) }),
                slice_size: 10,
                canary_fraction: None,
                observe_for: Some(prost_types::Duration {
                    seconds: 0,
                    nanos: 0,
                }),
                ordered: false,
                ..Default::default()
            })
            .await?
            .into_inner();
        plans.push(
            bed.client
                .approve_plan(ApprovePlanRequest {
                    plan_id: plan.plan_id,
                    digest: report.digest,
                    ..Default::default()
                })
                .await?
                .into_inner(),
        );
    }
    assert_eq!(message_ids[0].len() + message_ids[1].len(), 120);
    assert!(
        plans[1]
            .warnings
            .iter()
            .any(|w| w.contains(&plans[0].plan_id) && w.contains(&incident.work)),
        "the exchange-mode plan is warned that it shares the queue-mode plan's budget: {:?}",
        plans[1].warnings
    );
    let executor = |id: &str| {
        let mut config = bed.executor_config();
        config.executor_id = Some(id.to_owned());
        ExecutorHandle::start(config)
    };
    let executor_a = executor("a");
    let executor_b = executor("b");
    for plan in &plans {
        wait_completed(&mut bed.client, &plan.plan_id, Duration::from_secs(60)).await?;
    }
    executor_a.stop().await?;
    executor_b.stop().await?;
    let received = drain(&received, consuming, Duration::from_millis(200)).await?;
    let copies = copies_by_id(&received);
    assert_eq!(copies.len(), 120, "every message id arrived");
    let worst = most_in_any(&received, Duration::from_secs(1));
    // As in two_executors_and_two_plans_share_one_rate: 50 ms of the rate
    // (2 messages) for the broker's delivery jitter; two budgets would show
    // about twice the bound.
    assert!(
        worst <= 40 + 4 + 2,
        "at most per_second + burst (+ 50 ms of receive jitter) in any 1 s window across both routes, saw {worst}"
    );
    assert!(worst >= 30, "the rate is used, not starved: {worst}");
    for (plan, ids) in plans.iter().zip(&message_ids) {
        let of_plan: Vec<Received> = received
            .iter()
            .filter(|r| ids.contains(&r.message_id))
            .cloned()
            .collect();
        assert_bed_audit(&bed, &plan.plan_id, &of_plan).await?;
    }
    bed.finish().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_executors_and_two_plans_share_one_rate() -> anyhow::Result<()> {
    init_logging();
    let broker = Broker::connect().await?;
    // Two incidents, two DLQs, two plans; both replay into one destination queue.
    let first = incident_named(&broker, 60, "a-").await?;
    let second = incident_named(&broker, 120, "b-").await?;
    let mut bed = bed(broker, &[&first.dlq, &second.dlq], 60).await?;
    captured(&mut bed.client, &second.dlq, 120).await?;
    let target = unique("downstream");
    bed.broker().queue(&target, FieldTable::default()).await?;
    let (received, consuming) = consume(bed.broker(), &target).await?;
    let mut plans = Vec::new();
    for dlq in [&first.dlq, &second.dlq] {
        let report = precheck(&mut bed.client, dlq).await?;
        let plan = bed
            .client
            .create_plan(CreatePlanRequest {
                precheck_id: report.precheck_id.clone(),
                rate: Some(Rate {
                    per_second: 40.0,
                    burst: 4,
                    rationale: "downstream handles 40/s".into(),
                }),
                destination: Some(v1::Destination {
                    mode: Some(v1::destination::Mode::Redirect(v1::RedirectDestination {
                        exchange: String::new(),
                        routing_key: target.clone(),
                    })),
                }),
                slice_size: 10,
                canary_fraction: None,
                observe_for: Some(prost_types::Duration {
                    seconds: 0,
                    nanos: 0,
                }),
                ordered: false,
                ..Default::default()
            })
            .await?
            .into_inner();
        plans.push(
            bed.client
                .approve_plan(ApprovePlanRequest {
                    plan_id: plan.plan_id,
                    digest: report.digest,
                    ..Default::default()
                })
                .await?
                .into_inner(),
        );
    }
    assert!(plans[0].warnings.is_empty());
    // A precheck of the first incident now warns: its queue is a running plan's.
    let again = precheck(&mut bed.client, &first.dlq).await?;
    assert!(
        again.warnings.iter().all(|w| !w.contains("rate budget")),
        "the running plans redirect elsewhere: {:?}",
        again.warnings
    );
    assert!(
        plans[1]
            .warnings
            .iter()
            .any(|w| w.contains(&plans[0].plan_id) && w.contains(&target)),
        "the second plan to one destination is warned about the first: {:?}",
        plans[1].warnings
    );
    let executor = |id: &str| {
        let mut config = bed.executor_config();
        config.executor_id = Some(id.to_owned());
        ExecutorHandle::start(config)
    };
    let executor_a = executor("a");
    let executor_b = executor("b");
    for plan in &plans {
        wait_completed(&mut bed.client, &plan.plan_id, Duration::from_secs(60)).await?;
    }
    executor_a.stop().await?;
    executor_b.stop().await?;
    let received = drain(&received, consuming, Duration::from_millis(200)).await?;
    assert_eq!(received.len(), 180, "60 + 120 items, each once");
    let times: Vec<Instant> = received.iter().map(|r| r.at).collect();
    let mut worst = 0;
    for (start, at) in times.iter().enumerate() {
        let in_window = times[start..]
            .iter()
            .take_while(|t| t.duration_since(*at) < Duration::from_secs(1))
            .count();
        worst = worst.max(in_window);
    }
    // The bucket bounds publishes; the consumer sees them through the
    // broker, whose delivery can bunch a few that were published apart (a
    // loaded machine's stall). As the demo's check does, 50 ms of the rate
    // (2 messages) is allowed for that; executors that did not share the
    // rate would show about twice the bound.
    assert!(
        worst <= 40 + 4 + 2,
        "at most per_second + burst (+ 50 ms of receive jitter) in any 1 s window, saw {worst}"
    );
    assert!(worst >= 30, "the rate is used, not starved: {worst}");
    // Exactly once by identity, and the limit was shared, not taken in
    // turns: both executors and both plans published at the same time.
    let mut ids: Vec<&str> = received.iter().map(|r| r.message_id.as_str()).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 180, "180 distinct message ids");
    let pool = bed.pool().await?;
    let mut checked = 0;
    for (plan, tag) in plans.iter().zip(["a-", "b-"]) {
        let of_plan: Vec<Received> = received
            .iter()
            .filter(|r| r.message_id.starts_with(tag))
            .cloned()
            .collect();
        checked += of_plan.len();
        assert_received_within_audit(&pool, &plan.plan_id, &of_plan).await?;
    }
    assert_eq!(checked, received.len(), "every delivery is one plan's");
    pool.close().await;
    let span_of = |header: &str, matches: &dyn Fn(&str) -> bool| {
        let times: Vec<Instant> = received
            .iter()
            .filter(|r| matches!(r.headers.inner().get(header), Some(AMQPValue::LongString(v)) if matches(&String::from_utf8_lossy(v.as_bytes()))))
            .map(|r| r.at)
            .collect();
        (times.iter().min().copied(), times.iter().max().copied())
    };
    let overlap = |(a_first, a_last): (Option<Instant>, Option<Instant>),
                   (b_first, b_last): (Option<Instant>, Option<Instant>)| {
        match (a_first, a_last, b_first, b_last) {
            (Some(a_first), Some(a_last), Some(b_first), Some(b_last)) => a_last
                .min(b_last)
                .saturating_duration_since(a_first.max(b_first)),
            _ => Duration::ZERO,
        }
    };
    let by_executor = overlap(
        span_of("redrive-executor-id", &|id| id.starts_with("a/")),
        span_of("redrive-executor-id", &|id| id.starts_with("b/")),
    );
    assert!(
        by_executor >= Duration::from_secs(1),
        "both executors published at once for {by_executor:?}"
    );
    let by_plan = overlap(
        span_of("redrive-plan-id", &|id| id == plans[0].plan_id),
        span_of("redrive-plan-id", &|id| id == plans[1].plan_id),
    );
    assert!(
        by_plan >= Duration::from_millis(500),
        "both plans published at once for {by_plan:?}"
    );

    bed.finish().await
}

/// A real crash: the executor process gets SIGKILL mid-plan. Another one
/// takes its slice over when the lease expires; every message arrives, a
/// second copy only of an item the audit calls `uncertain`, and the audit
/// calls uncertain only what the dead one may have published (its
/// write-ahead mark): at most its confirm window, one run and one report
/// interval's outcomes, not the rest of its slice.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_executor_is_replaced_and_nothing_is_lost() -> anyhow::Result<()> {
    init_logging();
    const WINDOW: usize = 16;
    const PER_SECOND: f64 = 100.0;
    let (incident, mut bed) = incident_bed(200).await?;
    let prefix = bed.redis.prefix.clone();
    let (received, consuming) = consume(bed.broker(), &incident.work).await?;
    // One main slice of 198 (the canary takes 2), so the rule before the
    // mark (every unreported item of the slice) would list well over 100.
    let plan = approved_plan_with(&mut bed.client, &incident.dlq, |request| {
        request.slice_size = 200;
        request.rate = Some(Rate {
            per_second: PER_SECOND,
            burst: 10,
            rationale: "test".into(),
        });
    })
    .await?;

    let args = |id: &str| {
        let mut args = executor_args(&bed.planner.url(), AMQP_URL, &prefix);
        args.extend(
            [
                "--executor-id",
                id,
                "--window",
                &WINDOW.to_string(),
                "--concurrent-slices",
                "1",
            ]
            .map(str::to_owned),
        );
        args
    };
    let doomed = ExecutorProcess::start(&args("doomed")).await?;
    wait_until(
        "the first executor is publishing",
        Duration::from_secs(60),
        || {
            let received = received.clone();
            async move { Ok(received.lock().unwrap().len() >= 60) }
        },
    )
    .await?;
    doomed.signal("KILL").await?;
    let survivor = ExecutorProcess::start(&args("survivor")).await?;
    let done = wait_completed(&mut bed.client, &plan.plan_id, Duration::from_secs(90)).await?;
    survivor.signal("TERM").await?;
    let received = drain(&received, consuming, Duration::from_millis(300)).await?;
    let copies = copies_by_id(&received);
    assert_eq!(copies.len(), 200, "nothing lost");
    assert_eq!(done.counts.unwrap().sent, 200);
    let pool = bed.pool().await?;
    // Received ⊆ sent ∪ uncertain, and every second copy is uncertain.
    let (_, uncertain) = assert_received_within_audit(&pool, &plan.plan_id, &received).await?;
    // The takeover happened: the dead one's items are uncertain under its
    // name, and the survivor sent the rest.
    let by = |action: &'static str, executor: &'static str| {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM audit_events WHERE action = $1 AND executor_id LIKE $2 || '/%'",
        )
        .bind(action)
        .bind(executor)
        .fetch_one(&pool)
    };
    let (doomed_sent, survivor_sent) = (by("sent", "doomed").await?, by("sent", "survivor").await?);
    assert!(doomed_sent >= 40, "the first executor sent {doomed_sent}");
    assert!(survivor_sent > 0, "the survivor took over");
    assert_eq!(
        by("uncertain", "doomed").await? as usize,
        uncertain.len(),
        "every uncertain item was the dead executor's"
    );
    // Precise: what was in its window, its current run, the mark's
    // lookahead and its last unreported outcomes (100 ms of the rate), never
    // the rest of its slice.
    let rate = redrive_executor::bucket::Rate::new(PER_SECOND, 10)?;
    let run = redrive_executor::worker::run_size(rate, WINDOW);
    let lookahead = redrive_executor::worker::mark_lookahead(rate, WINDOW) as usize;
    let bound = WINDOW + run + lookahead + (PER_SECOND / 10.0) as usize;
    let twice = copies.values().filter(|n| **n > 1).count();
    eprintln!(
        "killed after {doomed_sent} sent: {} uncertain (bound {bound}), {twice} delivered twice",
        uncertain.len()
    );
    assert!(
        uncertain.len() <= bound,
        "{} uncertain items, more than the window {WINDOW} + run {run} + lookahead {lookahead} + one report interval",
        uncertain.len()
    );
    // ... and the audit report lists every second copy as possibly delivered twice.
    let report = audit_report(&mut bed.client, &plan.plan_id).await?;
    for (id, _) in copies.iter().filter(|(_, n)| **n > 1) {
        let key = format!("o-{}:order.paid", id.trim_start_matches("m-"));
        assert!(
            report.possibly_duplicated_keys.contains(&key),
            "duplicate {key} is in the report's possibly_duplicated_keys"
        );
    }
    pool.close().await;
    bed.finish().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_requests_and_stale_fencing_tokens_are_refused() -> anyhow::Result<()> {
    init_logging();
    let (incident, mut bed) = incident_bed(20).await?;
    let report = precheck(&mut bed.client, &incident.dlq).await?;
    let create = |per_second: f64, burst: u32, rationale: &str| CreatePlanRequest {
        precheck_id: report.precheck_id.clone(),
        rate: Some(Rate {
            per_second,
            burst,
            rationale: rationale.into(),
        }),
        slice_size: 5,
        ..Default::default()
    };
    for (request, field) in [
        (create(0.0, 1, "x"), "rate.per_second"),
        (create(-3.0, 1, "x"), "rate.per_second"),
        (create(1e-300, 1, "x"), "rate.per_second"),
        (create(10.0, 0, "x"), "rate.burst"),
        (create(10.0, 1, "  "), "rate.rationale"),
    ] {
        let error = bed.client.create_plan(request).await.unwrap_err();
        assert_eq!(error.code(), Code::InvalidArgument);
        assert!(
            error.message().contains(field),
            "{} names {field}",
            error.message()
        );
    }
    let empty = bed
        .client
        .run_precheck(RunPrecheckRequest {
            selector: Some(v1::Selector {
                sources: vec![incident.dlq.clone()],
                event_types: vec!["nothing.here".into()],
                ..Default::default()
            }),
            options: None,
        })
        .await?
        .into_inner();
    let error = bed
        .client
        .create_plan(CreatePlanRequest {
            precheck_id: empty.precheck_id,
            ..create(10.0, 1, "x")
        })
        .await
        .unwrap_err();
    assert_eq!(error.code(), Code::FailedPrecondition);
    let error = bed
        .client
        .create_plan(CreatePlanRequest {
            precheck_id: uuid::Uuid::now_v7().to_string(),
            ..create(10.0, 1, "x")
        })
        .await
        .unwrap_err();
    assert_eq!(error.code(), Code::NotFound);
    let plan = bed
        .client
        .create_plan(create(1000.0, 10, "fine"))
        .await?
        .into_inner();
    let wrong = bed
        .client
        .approve_plan(ApprovePlanRequest {
            plan_id: plan.plan_id.clone(),
            digest: "0".repeat(64),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(wrong.code(), Code::FailedPrecondition);
    bed.client
        .approve_plan(ApprovePlanRequest {
            plan_id: plan.plan_id.clone(),
            digest: report.digest.clone(),
            ..Default::default()
        })
        .await?;
    let twice = bed
        .client
        .approve_plan(ApprovePlanRequest {
            plan_id: plan.plan_id.clone(),
            digest: report.digest.clone(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(twice.code(), Code::FailedPrecondition);
    let unknown = bed
        .client
        .get_plan(GetPlanRequest {
            plan_id: uuid::Uuid::now_v7().to_string(),
        })
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), Code::NotFound);

    // Fencing: a lease that expired is ended by the planner's sweep (its
    // unreported items become uncertain) and leased again with a new token.
    let mut coordinator = CoordinatorClient::connect(bed.planner.url()).await?;
    // A claim without write-ahead marks is refused, naming why: reports are
    // accepted only for marked items.
    let unmarked = claimed(&mut coordinator, "old", false).await.unwrap_err();
    let unmarked = unmarked
        .downcast_ref::<tonic::Status>()
        .expect("a gRPC status");
    assert_eq!(unmarked.code(), Code::FailedPrecondition, "{unmarked:?}");
    assert!(
        unmarked.message().contains("marks_publishing"),
        "{unmarked:?}"
    );
    // A holder that marked its whole slice: every unreported item may have
    // been published.
    let first = claimed(&mut coordinator, "old", true).await?;
    mark_through(&mut coordinator, &first, first.items.len() - 1).await?;
    let pool = bed.pool().await?;
    backdate_lease(&pool, &first.slice_id).await?;
    let second = claimed(&mut coordinator, "new", true).await?;
    assert_eq!(second.slice_id, first.slice_id);
    assert!(
        second.fencing_token > first.fencing_token,
        "tokens grow with each lease"
    );
    assert!(
        second.items.iter().all(|item| item.uncertain),
        "a takeover republishes as uncertain"
    );
    let stale = coordinator
        .heartbeat(v1::HeartbeatRequest {
            slice_id: first.slice_id.clone(),
            fencing_token: first.fencing_token,
        })
        .await
        .unwrap_err();
    assert_eq!(stale.code(), Code::FailedPrecondition);
    let watch_stale = coordinator
        .watch_lease(v1::WatchLeaseRequest {
            slice_id: first.slice_id.clone(),
            fencing_token: first.fencing_token,
        })
        .await
        .unwrap_err();
    assert_eq!(watch_stale.code(), Code::FailedPrecondition);
    // Once the sweep ended the lease and the slice was leased again, the
    // old token's reports are refused, even a `sent`: the sweep recorded its
    // marked items `uncertain`, and the new holder publishes them again
    // with the same message id.
    let event = |index: usize, action: v1::AuditAction| v1::AuditEvent {
        dead_letter_id: first.items[index].dead_letter.as_ref().unwrap().id.clone(),
        message_key: first.items[index]
            .dead_letter
            .as_ref()
            .unwrap()
            .message_key
            .clone(),
        action: action.into(),
        executor_id: "old".into(),
        attempt: 1,
        ..Default::default()
    };
    let report = |token: u64, events: Vec<v1::AuditEvent>| {
        let mut coordinator = coordinator.clone();
        let request = v1::ReportOutcomesRequest {
            slice_id: first.slice_id.clone(),
            fencing_token: token,
            events,
        };
        async move {
            let mut responses = coordinator
                .report_outcomes(tokio_stream::iter(vec![request]))
                .await?
                .into_inner();
            responses.message().await
        }
    };
    let slice_id: i64 = first.slice_id.parse()?;
    let item_state = || {
        sqlx::query_scalar::<_, String>(
            "SELECT state FROM plan_items WHERE slice_id = $1 ORDER BY position LIMIT 1",
        )
        .bind(slice_id)
        .fetch_one(&pool)
    };
    let skip = report(
        first.fencing_token,
        vec![event(0, v1::AuditAction::SkippedStale)],
    )
    .await?
    .expect("an answer");
    assert!(skip.lease_lost, "the answer says the lease is lost");
    assert_eq!((skip.accepted, skip.dropped, skip.refused), (0, 1, 1));
    assert_eq!(
        item_state().await?,
        "uncertain",
        "a skip under a lost lease changes nothing"
    );
    let late = report(first.fencing_token, vec![event(0, v1::AuditAction::Sent)])
        .await?
        .expect("an answer");
    assert!(late.lease_lost);
    assert_eq!((late.accepted, late.refused), (0, 1));
    assert_eq!(
        item_state().await?,
        "uncertain",
        "a late sent of a re-leased slice changes nothing: it is republished"
    );
    let refusals: Vec<String> =
        sqlx::query_scalar("SELECT reason FROM refused_outcomes WHERE slice_id = $1 ORDER BY id")
            .bind(slice_id)
            .fetch_all(&pool)
            .await?;
    assert_eq!(refusals, ["stale_token", "stale_token"]);
    let forged = report(
        second.fencing_token + 7,
        vec![event(0, v1::AuditAction::Sent)],
    )
    .await
    .unwrap_err();
    assert_eq!(
        forged.code(),
        Code::FailedPrecondition,
        "a token the slice never had is refused"
    );
    let current = coordinator
        .heartbeat(v1::HeartbeatRequest {
            slice_id: second.slice_id.clone(),
            fencing_token: second.fencing_token,
        })
        .await?
        .into_inner();
    assert!(current.keep_publishing);

    pool.close().await;
    bed.finish().await
}

/// A slice leased to `executor` (waiting up to 10 s for the planner's sweep
/// to end an expired lease), claimed with or without write-ahead marks.
async fn claimed(
    coordinator: &mut CoordinatorClient<Channel>,
    executor: &str,
    marks_publishing: bool,
) -> anyhow::Result<v1::Slice> {
    coordinator
        .claim_slice(v1::ClaimSliceRequest {
            executor_id: executor.into(),
            wait: Some(prost_types::Duration {
                seconds: 10,
                nanos: 0,
            }),
            marks_publishing,
        })
        .await?
        .into_inner()
        .slice
        .with_context(|| format!("no slice for {executor}"))
}

/// Records the write-ahead mark of `slice`'s lease through its item at
/// `index` (as an executor does before it publishes).
async fn mark_through(
    coordinator: &mut CoordinatorClient<Channel>,
    slice: &v1::Slice,
    index: usize,
) -> anyhow::Result<()> {
    coordinator
        .mark_publishing(v1::MarkPublishingRequest {
            slice_id: slice.slice_id.clone(),
            fencing_token: slice.fencing_token,
            through_item_id: slice.items[index].item_id.clone(),
        })
        .await?;
    Ok(())
}

/// Makes the lease of `slice_id` expired a second ago, for the sweep.
async fn backdate_lease(pool: &sqlx::PgPool, slice_id: &str) -> anyhow::Result<()> {
    sqlx::query(
        "UPDATE plan_slices SET lease_expires_at = now() - interval '1 second' WHERE id = $1",
    )
    .bind(slice_id.parse::<i64>()?)
    .execute(pool)
    .await?;
    Ok(())
}

/// Claims are bounded in bytes (docs/api.md, "Limits"): a slice whose
/// bodies total far more than one claim answer may carry is handed out a
/// few items at a time, the rest staying pending for the next claim of the
/// same slice; it completes, every message arrives once and in order, and
/// nothing is uncertain. Capture of the same large bodies commits in several
/// batches (`--capture-batch-bytes`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_slice_of_large_bodies_is_claimed_in_parts_and_arrives_once_in_order()
-> anyhow::Result<()> {
    init_logging();
    const MIB: usize = 1024 * 1024;
    let broker = Broker::connect().await?;
    // 8 × 6 MiB: 48 MiB in one slice, against a 13 MiB claim budget (two
    // items per claim) and a 13 MiB capture batch (three per batch).
    let incident = incident_padded(&broker, 8, "big-", 6 * MIB).await?;
    let mut bed = TestBed::start(broker, |config| {
        capturing(config, &[&incident.dlq]);
        config.claim_max_bytes = 13 * MIB;
        config.capture_batch_bytes = 13 * MIB;
        config.lease_ttl_seconds = 30;
    })
    .await?;
    captured(&mut bed.client, &incident.dlq, 8).await?;
    let pool = bed.pool().await?;
    // One transaction per capture batch: each has its own xmin.
    let batches: i64 =
        sqlx::query_scalar("SELECT count(DISTINCT xmin::text) FROM dead_letters WHERE source = $1")
            .bind(&incident.dlq)
            .fetch_one(&pool)
            .await?;
    assert!(batches >= 3, "captured in {batches} batches");

    let (received, consuming) = consume(bed.broker(), &incident.work).await?;
    let plan = approved_plan_with(&mut bed.client, &incident.dlq, |request| {
        request.slice_size = 50;
        request.canary_fraction = Some(1.0);
        request.rate = Some(Rate {
            per_second: 1000.0,
            burst: 100,
            rationale: "test".into(),
        });
    })
    .await?;
    let executor = ExecutorHandle::start(bed.executor_config());
    let done = wait_completed(&mut bed.client, &plan.plan_id, Duration::from_secs(120)).await?;
    executor.stop().await?;
    let received = drain(&received, consuming, Duration::from_millis(300)).await?;
    assert_eq!(done.counts.unwrap().sent, 8);
    let ids: Vec<&str> = received.iter().map(|r| r.message_id.as_str()).collect();
    let expected: Vec<String> = (0..8).map(|n| format!("big-m-{n}")).collect();
    assert_eq!(ids, expected, "each once, in dead-letter order");
    assert!(
        received.iter().all(|r| r.body.len() > 6 * MIB),
        "whole bodies"
    );
    assert_bed_audit(&bed, &plan.plan_id, &received).await?;
    let plan_id = plan.plan_id.parse::<uuid::Uuid>()?;
    let (slices, leases): (i64, i64) = sqlx::query_as(
        "SELECT count(DISTINCT s.id), count(*) FROM slice_leases l JOIN plan_slices s ON s.id = l.slice_id \
         WHERE s.plan_id = $1",
    )
    .bind(plan_id)
    .fetch_one(&pool)
    .await?;
    assert_eq!(slices, 1, "one slice");
    assert_eq!(leases, 4, "claimed two items at a time");
    let uncertain: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM audit_events WHERE plan_id = $1 AND action <> 'sent'",
    )
    .bind(plan_id)
    .fetch_one(&pool)
    .await?;
    assert_eq!(uncertain, 0, "nothing uncertain, skipped or failed");
    pool.close().await;
    bed.finish().await
}

/// A claim that leaves part of a slice out (its byte budget): its holder
/// marks only what it received, so should its lease expire, only those
/// items become `uncertain`; the others stay pending, without an event, and
/// the next claims hand them out in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_expired_partial_lease_makes_only_what_it_received_uncertain() -> anyhow::Result<()> {
    init_logging();
    let broker = Broker::connect().await?;
    let incident = incident(&broker, 4).await?;
    let mut bed = TestBed::start(broker, |config| {
        capturing(config, &[&incident.dlq]);
        // One item per claim.
        config.claim_max_bytes = 1;
    })
    .await?;
    captured(&mut bed.client, &incident.dlq, 4).await?;
    let plan = approved_plan_with(&mut bed.client, &incident.dlq, |request| {
        request.slice_size = 10;
        request.canary_fraction = Some(1.0);
        request.rate = Some(Rate {
            per_second: 1000.0,
            burst: 10,
            rationale: "test".into(),
        });
    })
    .await?;
    let mut coordinator = CoordinatorClient::connect(bed.planner.url()).await?;
    let pool = bed.pool().await?;
    let first = claimed(&mut coordinator, "old", true).await?;
    assert_eq!(first.items.len(), 1, "one item fits the budget");
    mark_through(&mut coordinator, &first, 0).await?;
    backdate_lease(&pool, &first.slice_id).await?;
    let second = claimed(&mut coordinator, "new", true).await?;
    assert_eq!(second.slice_id, first.slice_id);
    assert_eq!(second.items.len(), 1);
    assert_eq!(second.items[0].item_id, first.items[0].item_id, "in order");
    assert!(
        second.items[0].uncertain,
        "what it received may be published"
    );
    let uncertain: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM audit_events WHERE plan_id = $1 AND action = 'uncertain'",
    )
    .bind(plan.plan_id.parse::<uuid::Uuid>()?)
    .fetch_one(&pool)
    .await?;
    assert_eq!(uncertain, 1, "only the item it received");
    // The rest follow, one claim each, in order, then the plan completes.
    let mut positions = vec![second.items[0].item_id.parse::<i64>()?];
    let mut lease = second;
    loop {
        let item = &lease.items[0];
        mark_through(&mut coordinator, &lease, 0).await?;
        coordinator
            .report_outcomes(futures::stream::iter([v1::ReportOutcomesRequest {
                slice_id: lease.slice_id.clone(),
                fencing_token: lease.fencing_token,
                events: vec![v1::AuditEvent {
                    dead_letter_id: item.dead_letter.as_ref().unwrap().id.clone(),
                    message_key: item.dead_letter.as_ref().unwrap().message_key.clone(),
                    action: v1::AuditAction::Sent.into(),
                    executor_id: "new".into(),
                    attempt: 1,
                    at: Some(std::time::SystemTime::now().into()),
                    ..Default::default()
                }],
            }]))
            .await?
            .into_inner()
            .message()
            .await?
            .context("a report answer")?;
        coordinator
            .complete_slice(v1::CompleteSliceRequest {
                slice_id: lease.slice_id.clone(),
                fencing_token: lease.fencing_token,
                release: false,
            })
            .await?;
        if positions.len() == 4 {
            break;
        }
        lease = claimed(&mut coordinator, "new", true).await?;
        assert_eq!(lease.items.len(), 1);
        assert!(!lease.items[0].uncertain);
        positions.push(lease.items[0].item_id.parse()?);
    }
    assert!(positions.is_sorted(), "{positions:?}");
    wait_completed(&mut bed.client, &plan.plan_id, Duration::from_secs(10)).await?;
    pool.close().await;
    bed.finish().await
}

/// An item larger than any claim answer can carry (here a 64 MiB repaired
/// body, put straight into the database: the API refuses one) fails at the
/// claim with its size, and the claim hands out the others instead of a
/// slice no executor can receive. An audit export of events with long
/// reasons comes in chunks of at most 1 MiB.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_item_too_large_for_a_claim_fails_and_exports_come_in_bounded_chunks()
-> anyhow::Result<()> {
    init_logging();
    let (incident, mut bed) = incident_bed(3).await?;
    let plan = approved_plan_with(&mut bed.client, &incident.dlq, |request| {
        request.slice_size = 10;
        request.canary_fraction = Some(1.0);
        request.rate = Some(Rate {
            per_second: 1000.0,
            burst: 10,
            rationale: "test".into(),
        });
    })
    .await?;
    let plan_id = plan.plan_id.parse::<uuid::Uuid>()?;
    let pool = bed.pool().await?;
    let (big, big_position): (i64, i64) = sqlx::query_as(
        "SELECT dead_letter_id, position FROM plan_items WHERE plan_id = $1 ORDER BY position OFFSET 1 LIMIT 1",
    )
    .bind(plan_id)
    .fetch_one(&pool)
    .await?;
    sqlx::query(
        "INSERT INTO dead_letter_revisions (dead_letter_id, revision, body, body_sha256, actor, reason) \
         VALUES ($1, 1, convert_to(repeat('x', 64 * 1024 * 1024), 'UTF8'), '\\x00', 'test', 'too large')",
    )
    .bind(big)
    .execute(&pool)
    .await?;
    // As RepairDeadLetter does: the dead letter's current revision is the
    // one just added.
    sqlx::query("UPDATE dead_letters SET body_revision = 1 WHERE id = $1")
        .bind(big)
        .execute(&pool)
        .await?;
    let mut coordinator = CoordinatorClient::connect(bed.planner.url()).await?;
    let slice = claimed(&mut coordinator, "executor", true).await?;
    let positions: Vec<i64> = slice
        .items
        .iter()
        .map(|item| item.item_id.parse())
        .collect::<Result<_, _>>()?;
    assert_eq!(positions.len(), 2, "the others are handed out");
    assert!(!positions.contains(&big_position));
    let (state, reason): (String, String) = sqlx::query_as(
        "SELECT i.state, e.reason FROM plan_items i JOIN audit_events e \
            ON e.plan_id = i.plan_id AND e.dead_letter_id = i.dead_letter_id \
         WHERE i.plan_id = $1 AND i.dead_letter_id = $2",
    )
    .bind(plan_id)
    .bind(big)
    .fetch_one(&pool)
    .await?;
    assert_eq!(state, "failed");
    assert!(reason.contains("one claim answer"), "{reason}");

    // Outcomes with a 3 MiB reason each, then the export.
    mark_through(&mut coordinator, &slice, slice.items.len() - 1).await?;
    let long = "r".repeat(3 * 1024 * 1024);
    let mut report = coordinator
        .report_outcomes(futures::stream::iter([v1::ReportOutcomesRequest {
            slice_id: slice.slice_id.clone(),
            fencing_token: slice.fencing_token,
            events: slice
                .items
                .iter()
                .map(|item| v1::AuditEvent {
                    dead_letter_id: item.dead_letter.as_ref().unwrap().id.clone(),
                    message_key: item.dead_letter.as_ref().unwrap().message_key.clone(),
                    action: v1::AuditAction::Sent.into(),
                    reason: long.clone(),
                    executor_id: "executor".into(),
                    attempt: 1,
                    at: Some(std::time::SystemTime::now().into()),
                    ..Default::default()
                })
                .collect(),
        }]))
        .await?
        .into_inner();
    let answer = report.message().await?.context("a report answer")?;
    assert_eq!((answer.accepted, answer.lease_lost), (2, false));
    let mut export = bed
        .client
        .export_audit(v1::ExportAuditRequest {
            plan_id: plan.plan_id.clone(),
            format: v1::ExportFormat::Jsonl.into(),
        })
        .await?
        .into_inner();
    let (mut chunks, mut data) = (0, Vec::new());
    while let Some(chunk) = export.message().await? {
        assert!(chunk.data.len() <= 1024 * 1024, "{}", chunk.data.len());
        chunks += 1;
        data.extend(chunk.data);
    }
    let lines: Vec<serde_json::Value> = data
        .split(|byte| *byte == b'\n')
        .filter(|line| !line.is_empty())
        .map(serde_json::from_slice)
        .collect::<Result<_, _>>()?;
    assert_eq!(lines.len(), 3, "the failure and two sends");
    assert!(chunks >= 6, "{chunks} chunks");
    pool.close().await;
    bed.finish().await
}

/// Precise uncertain items (docs/design.md): a lease that expires makes
/// `uncertain` only the unreported items up to its write-ahead mark; the
/// items past it were never published and stay pending, without an event.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_expired_lease_makes_only_its_marked_items_uncertain() -> anyhow::Result<()> {
    init_logging();
    let (incident, mut bed) = incident_bed(10).await?;
    // One slice of 10: the whole plan is its canary wave.
    let plan = approved_plan_with(&mut bed.client, &incident.dlq, |request| {
        request.slice_size = 10;
        request.canary_fraction = Some(1.0);
        request.rate = Some(Rate {
            per_second: 1000.0,
            burst: 10,
            rationale: "test".into(),
        });
    })
    .await?;
    let mut coordinator = CoordinatorClient::connect(bed.planner.url()).await?;
    let pool = bed.pool().await?;
    let first = claimed(&mut coordinator, "old", true).await?;
    assert_eq!(first.items.len(), 10);
    let mark = |token: u64, through: &str| v1::MarkPublishingRequest {
        slice_id: first.slice_id.clone(),
        fencing_token: token,
        through_item_id: through.to_owned(),
    };
    // Item ids name positions; anything else is refused, naming the field.
    for wrong in ["", "x", "-1", "1.5"] {
        let error = coordinator
            .mark_publishing(mark(first.fencing_token, wrong))
            .await
            .unwrap_err();
        assert_eq!(error.code(), Code::InvalidArgument, "{wrong:?}");
        assert!(
            error.message().contains("through_item_id"),
            "{}",
            error.message()
        );
    }
    // Marks through the second item; a later, lower mark never moves it back.
    coordinator
        .mark_publishing(mark(first.fencing_token, &first.items[1].item_id))
        .await?;
    coordinator
        .mark_publishing(mark(first.fencing_token, &first.items[0].item_id))
        .await?;
    backdate_lease(&pool, &first.slice_id).await?;
    let second = claimed(&mut coordinator, "new", true).await?;
    assert_eq!(second.slice_id, first.slice_id);
    let uncertain: Vec<&str> = second
        .items
        .iter()
        .filter(|item| item.uncertain)
        .map(|item| item.item_id.as_str())
        .collect();
    assert_eq!(
        uncertain,
        vec![
            first.items[0].item_id.as_str(),
            first.items[1].item_id.as_str()
        ],
        "only the marked items are uncertain"
    );
    assert_eq!(second.items.len(), first.items.len(), "nothing is lost");
    let events: Vec<(i64, String)> = sqlx::query_as(
        "SELECT i.position, e.reason FROM audit_events e \
         JOIN plan_items i ON i.plan_id = e.plan_id AND i.dead_letter_id = e.dead_letter_id \
         WHERE e.plan_id = $1 AND e.action = 'uncertain' ORDER BY i.position",
    )
    .bind(plan.plan_id.parse::<uuid::Uuid>()?)
    .fetch_all(&pool)
    .await?;
    assert_eq!(
        events
            .iter()
            .map(|(position, _)| position.to_string())
            .collect::<Vec<_>>(),
        vec![
            first.items[0].item_id.clone(),
            first.items[1].item_id.clone()
        ],
        "an uncertain event for each marked item, none for the others"
    );
    assert!(events[0].1.contains("old"), "{}", events[0].1);
    // The old token can mark nothing any more: typed lease loss.
    let stale = coordinator
        .mark_publishing(mark(first.fencing_token, &first.items[3].item_id))
        .await
        .unwrap_err();
    assert!(redrive_proto::error::is_stale_token(&stale), "{stale:?}");
    // The new holder dies without marking anything: nothing more is uncertain.
    backdate_lease(&pool, &first.slice_id).await?;
    let third = claimed(&mut coordinator, "third", true).await?;
    assert_eq!(
        third.items.iter().filter(|item| item.uncertain).count(),
        2,
        "a holder that marked nothing left nothing uncertain"
    );

    pool.close().await;
    bed.finish().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn publishing_stops_while_redis_is_unreachable_and_resumes() -> anyhow::Result<()> {
    init_logging();
    let (incident, mut bed) = incident_bed(150).await?;
    let prefix = bed.redis.prefix.clone();
    let (received, consuming) = consume(bed.broker(), &incident.work).await?;
    let plan = approved_plan(&mut bed.client, &incident.dlq, 50.0, 5, None).await?;
    let proxy = TcpProxy::start("127.0.0.1:6379".parse()?).await?;
    let redis_via_proxy = format!("redis://{}", proxy.addr());
    let executor = ExecutorHandle::start(ExecutorHandle::config(
        &bed.planner,
        Some((&redis_via_proxy, &prefix)),
    ));
    wait_until("publishing started", Duration::from_secs(20), || {
        let received = received.clone();
        async move { Ok(received.lock().unwrap().len() >= 20) }
    })
    .await?;
    let cut_at = Instant::now();
    proxy.cut();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let restored_at = Instant::now();
    proxy.restore();
    // Fail closed from the first second: what had its tokens before the cut
    // is spent within 250 ms, and nothing after that.
    let during: Vec<Duration> = received
        .lock()
        .unwrap()
        .iter()
        .filter(|r| r.at > cut_at && r.at < restored_at)
        .map(|r| r.at - cut_at)
        .collect();
    assert!(
        during.iter().all(|after| *after < Duration::from_secs(1)),
        "nothing is published without the bucket (fail closed): deliveries {during:?} after the cut"
    );
    let before = received.lock().unwrap().len();
    assert!(
        before < 150,
        "the outage came mid-plan ({before} delivered)"
    );
    let done = wait_completed(&mut bed.client, &plan.plan_id, Duration::from_secs(60)).await?;
    executor.stop().await?;
    let received = drain(&received, consuming, Duration::from_millis(300)).await?;
    assert!(
        received.iter().any(|r| r.at > restored_at),
        "publishing resumed after Redis came back"
    );
    // Exactly once, by identity: 150 deliveries of 150 distinct ids.
    let mut ids: Vec<String> = received.iter().map(|r| r.message_id.clone()).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(
        (received.len(), ids.len()),
        (150, 150),
        "every message arrived once after Redis came back"
    );
    assert_eq!(done.counts.unwrap().sent, 150);
    assert_bed_audit(&bed, &plan.plan_id, &received).await?;
    bed.finish().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unbound_routing_key_in_exchange_mode_is_unroutable_not_sent() -> anyhow::Result<()> {
    init_logging();
    let broker = Broker::connect().await?;
    let incident = incident(&broker, 10).await?;
    // The producers' exchange loses its binding before the replay.
    broker
        .channel
        .queue_unbind(
            incident.work.as_str().into(),
            incident.exchange.as_str().into(),
            "".into(),
            FieldTable::default(),
        )
        .await?;
    broker
        .channel
        .queue_unbind(
            incident.healthy.as_str().into(),
            incident.exchange.as_str().into(),
            "".into(),
            FieldTable::default(),
        )
        .await?;
    let mut bed = bed(broker, &[&incident.dlq], 10).await?;
    let plan = approved_plan(
        &mut bed.client,
        &incident.dlq,
        1000.0,
        10,
        Some(v1::destination::Mode::Exchange(v1::ExchangeDestination {})),
    )
    .await?;
    let executor = ExecutorHandle::start(ExecutorHandle::config(&bed.planner, None));
    // The canary item comes back from the broker: the gate aborts the plan
    // before any main-wave item is published.
    let done = wait_aborted(&mut bed.client, &plan.plan_id).await?;
    executor.stop().await?;
    assert!(
        done.state_reason.contains("gate tripped"),
        "{}",
        done.state_reason
    );
    let counts = done.counts.unwrap();
    assert_eq!(
        (counts.unroutable, counts.sent),
        (1, 0),
        "only the canary item was tried"
    );
    let report = audit_report(&mut bed.client, &plan.plan_id).await?;
    assert!(report.sent_keys.is_empty());
    assert_eq!(report.not_sent.len(), 1);
    assert!(
        report.not_sent[0].reason.contains("NO_ROUTE") || report.not_sent[0].reason.contains("312"),
        "{}",
        report.not_sent[0].reason
    );
    assert_eq!(
        bed.broker().ready_count(&incident.work).await?,
        0,
        "nothing delivered"
    );
    bed.finish().await
}

/// A plan of `messages` dead letters redirected to a queue with room for
/// `room` that nacks the rest (RabbitMQ's `reject-publish` overflow,
/// <https://www.rabbitmq.com/docs/maxlength#overflow-behaviour>), approved
/// at 1,000/s, and an executor that tries each publish twice. Answers the
/// bed, the full queue's name, the plan and the executor.
async fn plan_into_a_full_queue(
    messages: u32,
    room: i32,
) -> anyhow::Result<(TestBed, String, v1::Plan, ExecutorHandle)> {
    let broker = Broker::connect().await?;
    let incident = incident(&broker, messages).await?;
    let full = unique("full");
    broker
        .queue(
            &full,
            amqp_table(vec![
                ("x-max-length", AMQPValue::LongInt(room)),
                ("x-overflow", amqp_text("reject-publish")),
            ]),
        )
        .await?;
    let mut bed = bed(broker, &[&incident.dlq], u64::from(messages)).await?;
    let redirect = v1::destination::Mode::Redirect(v1::RedirectDestination {
        exchange: String::new(),
        routing_key: full.clone(),
    });
    let plan = approved_plan(&mut bed.client, &incident.dlq, 1000.0, 10, Some(redirect)).await?;
    let mut config = ExecutorHandle::config(&bed.planner, None);
    config.max_attempts = 2;
    let executor = ExecutorHandle::start(config);
    Ok((bed, full, plan, executor))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn nacked_publishes_are_retried_then_failed() -> anyhow::Result<()> {
    init_logging();
    // No room at all: every publish is nacked.
    let (mut bed, _full, plan, executor) = plan_into_a_full_queue(5, 0).await?;
    let done = wait_aborted(&mut bed.client, &plan.plan_id).await?;
    executor.stop().await?;
    let counts = done.counts.unwrap();
    assert_eq!(
        (counts.failed, counts.sent),
        (1, 0),
        "the canary item failed; the main wave never started"
    );
    let report = audit_report(&mut bed.client, &plan.plan_id).await?;
    assert!(
        report
            .not_sent
            .iter()
            .all(|event| event.reason.contains("nacked") && event.attempt == 2),
        "{:?}",
        report.not_sent
    );
    bed.finish().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn failures_in_the_last_slice_of_the_main_wave_pause_the_plan() -> anyhow::Result<()> {
    init_logging();
    // Room for three: the broker nacks the other five. They fail in the
    // plan's one main slice, and become final as that slice ends.
    let (mut bed, full, plan, executor) = plan_into_a_full_queue(8, 3).await?;
    let paused = wait_state(
        &mut bed.client,
        &plan.plan_id,
        PlanState::Paused,
        Duration::from_secs(30),
    )
    .await;
    executor.stop().await?;
    let paused = paused?;
    let counts = paused.counts.unwrap();
    assert_eq!(counts.sent, 3, "three fit: {counts:?}");
    assert!(counts.failed >= 1, "{counts:?}");
    assert!(
        paused.state_reason.starts_with(&format!(
            "gate tripped: {} failed or unroutable outcome(s)",
            counts.failed
        )),
        "{}",
        paused.state_reason
    );
    assert_eq!(
        bed.broker().ready_count(&full).await?,
        3,
        "only the sent arrived"
    );
    // Still paused: nothing completes a plan past its gates.
    let again = get_plan(&mut bed.client, &plan.plan_id).await?;
    assert_eq!(again.state(), PlanState::Paused);
    bed.finish().await
}

/// The verdict counts of a fresh precheck over `dlq`.
async fn precheck_counts(
    client: &mut PlannerClient<Channel>,
    dlq: &str,
) -> anyhow::Result<v1::VerdictCounts> {
    Ok(precheck(client, dlq).await?.counts.unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_message_dead_lettered_by_two_fan_out_queues_is_replayed_to_each() -> anyhow::Result<()>
{
    init_logging();
    let broker = Broker::connect().await?;
    // A fan-out exchange to work queues a and b (both dead-lettering to one
    // DLQ) and a healthy subscriber.
    let (exchange, dlx, dlq) = (unique("orders"), unique("dlx"), unique("dlq"));
    let (a, b, healthy) = (unique("a"), unique("b"), unique("healthy"));
    broker
        .exchange(&exchange, lapin::ExchangeKind::Fanout)
        .await?;
    broker.exchange(&dlx, lapin::ExchangeKind::Fanout).await?;
    broker.queue(&dlq, FieldTable::default()).await?;
    broker.bind(&dlq, &dlx, "").await?;
    for queue in [&a, &b] {
        broker
            .queue(
                queue,
                amqp_table(vec![("x-dead-letter-exchange", amqp_text(&dlx))]),
            )
            .await?;
        broker.bind(queue, &exchange, "").await?;
    }
    broker.queue(&healthy, FieldTable::default()).await?;
    broker.bind(&healthy, &exchange, "").await?;
    for index in 0..2 {
        let properties = lapin::BasicProperties::default()
            .with_message_id(format!("m-{index}").into())
            .with_content_type("application/json".into());
        let body = format!(r#"{{"order_id":"o-{index}"}}"#);
        broker
            .publish(&exchange, "", body.as_bytes(), properties)
            .await?;
    }
    // Both consumers fail every message: four dead letters, two per message id.
    for queue in [&a, &b] {
        for _ in 0..2 {
            reject_next(&broker.channel, queue, "the work queue holds the message").await?;
        }
    }
    let mut bed = bed(broker, &[&dlq], 4).await?;

    let counts = precheck_counts(&mut bed.client, &dlq).await?;
    assert_eq!(
        (counts.replayable, counts.duplicate),
        (4, 0),
        "each queue's copy is its own work: {counts:?}"
    );
    let (received_a, consuming_a) = consume(bed.broker(), &a).await?;
    let (received_b, consuming_b) = consume(bed.broker(), &b).await?;
    let plan = approved_plan(&mut bed.client, &dlq, 1000.0, 10, None).await?;
    let executor = ExecutorHandle::start(bed.executor_config());
    let done = wait_completed(&mut bed.client, &plan.plan_id, Duration::from_secs(30)).await;
    executor.stop().await?;
    let done = done?;
    assert_eq!(done.counts.unwrap().sent, 4);
    wait_until(
        "both queues got their copies",
        Duration::from_secs(10),
        || {
            let (a, b) = (received_a.clone(), received_b.clone());
            async move { Ok(a.lock().unwrap().len() >= 2 && b.lock().unwrap().len() >= 2) }
        },
    )
    .await?;
    stop_consuming(consuming_a)?;
    stop_consuming(consuming_b)?;
    let pool = bed.pool().await?;
    for received in [&received_a, &received_b] {
        let received = received.lock().unwrap().clone();
        let mut ids: Vec<&str> = received.iter().map(|r| r.message_id.as_str()).collect();
        ids.sort_unstable();
        assert_eq!(ids, ["m-0", "m-1"], "one copy of each message per queue");
        assert_received_within_audit(&pool, &plan.plan_id, &received).await?;
    }
    assert_eq!(
        bed.broker().ready_count(&healthy).await?,
        2,
        "the healthy subscriber got nothing more"
    );

    let counts = precheck_counts(&mut bed.client, &dlq).await?;
    assert_eq!(
        (counts.already_replayed, counts.replayable),
        (4, 0),
        "both queues' copies were replayed: {counts:?}"
    );
    bed.finish().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_executor_cut_off_from_the_planner_stops_publishing_before_its_lease_expires()
-> anyhow::Result<()> {
    init_logging();
    let (incident, mut bed) = incident_bed(150).await?;
    let prefix = bed.redis.prefix.clone();
    let (received, consuming) = consume(bed.broker(), &incident.work).await?;
    let plan = approved_plan(&mut bed.client, &incident.dlq, 30.0, 3, None).await?;
    // The executor reaches the planner through a proxy the test cuts; its
    // broker and Redis connections stay up (a network split).
    let proxy = TcpProxy::start(bed.planner.addr).await?;
    let mut config = ExecutorHandle::config(&bed.planner, Some((REDIS_URL, &prefix)));
    config.planner = format!("http://{}", proxy.addr());
    config.executor_id = Some("split".to_owned());
    let split = ExecutorHandle::start(config);
    wait_until("publishing started", Duration::from_secs(20), || {
        let received = received.clone();
        async move { Ok(received.lock().unwrap().len() >= 15) }
    })
    .await?;
    let cut_at = Instant::now();
    proxy.cut();
    // The replacement starts at the cut, so the two would overlap if the
    // cut-off one went on publishing: it may only claim once the planner
    // ends the lease (TTL 3 s after the last renewal).
    let mut config = ExecutorHandle::config(&bed.planner, Some((REDIS_URL, &prefix)));
    config.executor_id = Some("survivor".to_owned());
    let survivor = ExecutorHandle::start(config);
    let done = wait_completed(&mut bed.client, &plan.plan_id, Duration::from_secs(60)).await?;
    survivor.stop().await?;
    split.kill();
    let received = drain(&received, consuming, Duration::from_millis(300)).await?;
    let executor_of =
        |delivery: &Received| match delivery.headers.inner().get("redrive-executor-id") {
            Some(AMQPValue::LongString(id)) => String::from_utf8_lossy(id.as_bytes()).into_owned(),
            other => panic!("no executor id header: {other:?}"),
        };
    // The cut-off holder's deadline is its last renewal + 2/3 of the TTL,
    // and its last renewal was before the cut: nothing from it after
    // cut + 2 s. The survivor publishes nothing before the cut.
    let split_last = received
        .iter()
        .filter(|delivery| executor_of(delivery).starts_with("split/"))
        .map(|delivery| delivery.at)
        .max()
        .expect("the split executor published");
    assert!(
        split_last <= cut_at + Duration::from_secs(2),
        "the cut-off executor published {:?} after the cut",
        split_last - cut_at
    );
    let survivor_first = received
        .iter()
        .filter(|delivery| executor_of(delivery).starts_with("survivor/"))
        .map(|delivery| delivery.at)
        .min()
        .expect("the survivor took over");
    assert!(survivor_first > cut_at);
    let copies = copies_by_id(&received);
    assert_eq!(copies.len(), 150, "nothing lost");
    assert_eq!(done.counts.unwrap().sent, 150);
    let pool = bed.pool().await?;
    // Received ⊆ sent ∪ uncertain; a second copy only of an uncertain item.
    assert_received_within_audit(&pool, &plan.plan_id, &received).await?;
    pool.close().await;
    bed.finish().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pause_stops_publishing_within_a_heartbeat_and_resume_finishes_exactly_once()
-> anyhow::Result<()> {
    init_logging();
    let (incident, mut bed) = incident_bed(120).await?;
    let prefix = bed.redis.prefix.clone();
    let (received, consuming) = consume(bed.broker(), &incident.work).await?;
    let plan = approved_plan(&mut bed.client, &incident.dlq, 30.0, 3, None).await?;
    let executor = ExecutorHandle::start(ExecutorHandle::config(
        &bed.planner,
        Some((REDIS_URL, &prefix)),
    ));
    wait_until("publishing started", Duration::from_secs(20), || {
        let received = received.clone();
        async move { Ok(received.lock().unwrap().len() >= 20) }
    })
    .await?;
    let control = |reason: &str| v1::PlanControlRequest {
        plan_id: plan.plan_id.clone(),
        reason: reason.into(),
        ..Default::default()
    };
    let paused = bed
        .client
        .pause_plan(control("downstream latency rising"))
        .await?
        .into_inner();
    let paused_at = Instant::now();
    assert_eq!(paused.state(), PlanState::Paused);
    let again = bed.client.pause_plan(control("twice")).await.unwrap_err();
    assert_eq!(again.code(), Code::FailedPrecondition);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let resuming_at = Instant::now();
    // Stop means stop from the first second (the lease watch pushes the
    // pause): only what was already handed to the broker may still arrive.
    let after_pause: Vec<Duration> = received
        .lock()
        .unwrap()
        .iter()
        .filter(|r| r.at > paused_at && r.at < resuming_at)
        .map(|r| r.at - paused_at)
        .collect();
    assert!(
        after_pause
            .iter()
            .all(|after| *after < Duration::from_secs(1)),
        "nothing published while paused; deliveries {after_pause:?} after the pause returned"
    );
    assert!(received.lock().unwrap().len() < 120);

    let resumed = bed
        .client
        .resume_plan(control("latency back to normal"))
        .await?
        .into_inner();
    assert_eq!(resumed.state(), PlanState::Main);
    let done = wait_completed(&mut bed.client, &plan.plan_id, Duration::from_secs(60)).await?;
    executor.stop().await?;
    let received = drain(&received, consuming, Duration::from_millis(300)).await?;
    let copies = copies_by_id(&received);
    assert_eq!(copies.len(), 120);
    assert!(copies.values().all(|n| *n == 1), "every item exactly once");
    assert_bed_audit(&bed, &plan.plan_id, &received).await?;
    let actions: Vec<(String, String)> = done
        .actions
        .iter()
        .map(|a| (a.action.clone(), a.reason.clone()))
        .collect();
    assert!(
        actions.contains(&("pause".into(), "downstream latency rising".into())),
        "{actions:?}"
    );
    assert!(
        actions.contains(&("resume".into(), "latency back to normal".into())),
        "{actions:?}"
    );
    let cancel_done = bed
        .client
        .cancel_plan(control("too late"))
        .await
        .unwrap_err();
    assert_eq!(
        cancel_done.code(),
        Code::FailedPrecondition,
        "a completed plan cannot be cancelled"
    );

    bed.finish().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_canary_goes_first_and_the_main_wave_waits_for_promotion() -> anyhow::Result<()> {
    init_logging();
    let (incident, mut bed) = incident_bed(300).await?;
    let (received, consuming) = consume(bed.broker(), &incident.work).await?;
    let report = precheck(&mut bed.client, &incident.dlq).await?;
    let plan = bed
        .client
        .create_plan(CreatePlanRequest {
            precheck_id: report.precheck_id.clone(),
            rate: Some(Rate {
                per_second: 1000.0,
                burst: 50,
                rationale: "plenty of headroom".into(),
            }),
            slice_size: 50,
            canary_fraction: Some(0.01),
            observe_for: Some(prost_types::Duration {
                seconds: 600,
                nanos: 0,
            }),
            ..Default::default()
        })
        .await?
        .into_inner();
    assert_eq!(plan.canary_items, 3);
    let approved = bed
        .client
        .approve_plan(ApprovePlanRequest {
            plan_id: plan.plan_id.clone(),
            digest: report.digest,
            ..Default::default()
        })
        .await?
        .into_inner();
    assert_eq!(approved.state(), PlanState::Canary);
    let executor = ExecutorHandle::start(bed.executor_config());
    let observing = wait_state(
        &mut bed.client,
        &plan.plan_id,
        PlanState::Observing,
        Duration::from_secs(30),
    )
    .await?;
    // The plan says when its 600 s window ends (what `plan watch` counts
    // down to).
    let until = observing
        .observing_until
        .as_ref()
        .and_then(redrive_proto::time::from_timestamp)
        .expect("observing_until while observing");
    let left = (until - chrono::Utc::now()).num_seconds();
    assert!((590..=600).contains(&left), "{left} s left of 600");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        received.lock().unwrap().len(),
        3,
        "exactly the canary, nothing else before promotion"
    );
    // While it runs, a precheck over the same queue warns that the two would
    // share its destination.
    let overlapping = precheck(&mut bed.client, &incident.dlq).await?;
    assert!(
        overlapping
            .warnings
            .iter()
            .any(|w| w.contains(&plan.plan_id)),
        "{:?}",
        overlapping.warnings
    );
    let promoted = bed
        .client
        .promote_plan(v1::PlanControlRequest {
            plan_id: plan.plan_id.clone(),
            reason: "canary looks healthy".into(),
            ..Default::default()
        })
        .await?
        .into_inner();
    assert_eq!(promoted.state(), PlanState::Main);
    assert_eq!(promoted.observing_until, None, "only while observing");
    let done = wait_completed(&mut bed.client, &plan.plan_id, Duration::from_secs(60)).await?;
    executor.stop().await?;
    let received = drain(&received, consuming, Duration::from_millis(300)).await?;
    assert_eq!(received.len(), 300);
    assert_bed_audit(&bed, &plan.plan_id, &received).await?;
    assert!(
        done.actions
            .iter()
            .any(|a| a.action == "promote" && a.reason == "canary looks healthy")
    );
    bed.finish().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn re_dead_letters_during_the_canary_abort_the_plan_with_evidence() -> anyhow::Result<()> {
    init_logging();
    let (incident, mut bed) = incident_bed(200).await?;
    // The consumer is still broken: it rejects what is replayed, which dead-letters
    // it again into the captured DLQ with the plan's redrive-plan-id header.
    let (rejected, rejecting) = reject_all(bed.broker(), &incident.work).await?;
    // The observation window is what gives the re-dead-letters time to come
    // back and be captured before the main wave: with none, the plan is
    // promoted at the next gate pass (0.5 s), which a loaded machine's capture
    // can miss (CI saw the main wave go out and the plan pause instead).
    let plan = approved_plan_with(&mut bed.client, &incident.dlq, |request| {
        request.rate = Some(Rate {
            per_second: 1000.0,
            burst: 10,
            rationale: "test downstream takes this easily".into(),
        });
        request.observe_for = Some(prost_types::Duration {
            seconds: 10,
            nanos: 0,
        });
    })
    .await?;
    let executor = ExecutorHandle::start(ExecutorHandle::config(&bed.planner, None));
    let aborted = wait_aborted(&mut bed.client, &plan.plan_id).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    executor.stop().await?;
    rejecting.abort();
    assert!(
        aborted.state_reason.contains("re-dead-letter"),
        "{}",
        aborted.state_reason
    );
    assert!(
        aborted.state_reason.contains("o-0:order.paid"),
        "the evidence names what came back: {}",
        aborted.state_reason
    );
    assert_eq!(
        rejected.load(std::sync::atomic::Ordering::SeqCst),
        2,
        "the two canary items only; no main-wave message"
    );
    assert!(
        aborted
            .actions
            .iter()
            .any(|a| a.action == "abort" && a.actor == "redrive-gate")
    );
    bed.finish().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn four_eyes_refuses_the_creator_as_approver() -> anyhow::Result<()> {
    init_logging();
    let broker = Broker::connect().await?;
    let incident = incident(&broker, 5).await?;
    let mut bed = TestBed::start(broker, |config| {
        config.capture_queues = vec![incident.dlq.clone()];
        config.four_eyes = true;
    })
    .await?;
    captured(&mut bed.client, &incident.dlq, 5).await?;
    let report = precheck(&mut bed.client, &incident.dlq).await?;
    let plan = bed
        .client
        .create_plan(as_actor("alice", plan_request(&report, 10.0, 1)))
        .await?
        .into_inner();
    assert_eq!(plan.created_by, "alice");
    let approve = || ApprovePlanRequest {
        plan_id: plan.plan_id.clone(),
        digest: report.digest.clone(),
        ..Default::default()
    };
    let refused = bed
        .client
        .approve_plan(as_actor("alice", approve()))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied);
    assert!(
        refused.message().contains("four-eyes"),
        "{}",
        refused.message()
    );
    let approved = bed
        .client
        .approve_plan(as_actor("bob", approve()))
        .await?
        .into_inner();
    assert_eq!(approved.approved_by, "bob");
    bed.finish().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_order_cancelled_after_the_precheck_is_skipped_at_send_time() -> anyhow::Result<()> {
    init_logging();
    let broker = Broker::connect().await?;
    let incident = incident(&broker, 20).await?;
    // The planner with the orders hook for order.* events.
    let mut bed = TestBed::start(broker, |config| capturing(config, &[&incident.dlq])).await?;
    let pool = bed.pool().await?;
    redrive_tests::orders_hook::OrdersHook::create_schema(&pool).await?;
    bed.planner.halt().await?;
    let hook_shutdown = tokio_util::sync::CancellationToken::new();
    let hook_url = redrive_tests::orders_hook::spawn(
        redrive_tests::orders_hook::OrdersHook::new(pool.clone()),
        hook_shutdown.clone(),
    )
    .await?;
    bed.restart_planner(|config| {
        config.capture_queues = vec![incident.dlq.clone()];
        config.message_keys = vec!["json:/order_id".to_owned()];
        config.lease_ttl_seconds = 3;
        config.state_checks = vec![format!("order.*={hook_url}")];
    })
    .await?;
    captured(&mut bed.client, &incident.dlq, 20).await?;
    let (received, consuming) = consume(bed.broker(), &incident.work).await?;
    let report = precheck(&mut bed.client, &incident.dlq).await?;
    assert_eq!(report.counts.unwrap().replayable, 20);
    let plan = bed
        .client
        .create_plan(CreatePlanRequest {
            observe_for: Some(prost_types::Duration {
                seconds: 0,
                nanos: 0,
            }),
            ..plan_request(&report, 1000.0, 10)
        })
        .await?
        .into_inner();
    // Meanwhile the customer cancels order o-7, and o-8's stock gets reserved
    // by a manual fix.
    sqlx::query("INSERT INTO orders (order_id, status) VALUES ('o-7', 'CANCELLED')")
        .execute(&pool)
        .await?;
    sqlx::query(
        "INSERT INTO orders (order_id, status, stock_reserved) VALUES ('o-8', 'PAID', true)",
    )
    .execute(&pool)
    .await?;
    bed.client
        .approve_plan(ApprovePlanRequest {
            plan_id: plan.plan_id.clone(),
            digest: report.digest,
            ..Default::default()
        })
        .await?;
    let executor = ExecutorHandle::start(ExecutorHandle::config(&bed.planner, None));
    let done = wait_completed(&mut bed.client, &plan.plan_id, Duration::from_secs(30)).await?;
    executor.stop().await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop_consuming(consuming)?;
    let counts = done.counts.unwrap();
    assert_eq!(
        (counts.sent, counts.skipped_state, counts.needs_compensation),
        (18, 1, 1)
    );
    let received = received.lock().unwrap().clone();
    assert_eq!(received.len(), 18);
    assert!(
        received
            .iter()
            .all(|r| r.message_id != "m-7" && r.message_id != "m-8"),
        "the cancelled order was not revived, the reserved one not replayed"
    );
    assert_received_within_audit(&pool, &plan.plan_id, &received).await?;
    // o-8 is on the plan's compensation list, found at send time.
    let compensations = bed
        .client
        .list_compensations(v1::ListCompensationsRequest {
            plan_id: plan.plan_id.clone(),
            page_size: 0,
            page_token: String::new(),
        })
        .await?
        .into_inner()
        .items;
    assert_eq!(compensations.len(), 1, "{compensations:?}");
    assert_eq!(compensations[0].message_key, "o-8:order.paid");
    assert!(compensations[0].at_send);
    assert!(
        compensations[0]
            .reason
            .contains("release the extra reservation"),
        "{}",
        compensations[0].reason
    );
    let audit = audit_report(&mut bed.client, &plan.plan_id).await?;
    let skipped = &audit.not_sent[0];
    assert_eq!(skipped.action(), v1::AuditAction::SkippedState);
    assert!(
        skipped.reason.contains("would revive a cancelled order"),
        "{}",
        skipped.reason
    );
    bed.planner.halt().await?;
    hook_shutdown.cancel();
    pool.close().await;
    bed.finish().await
}

/// The id of the dead letter of order `order` among `dlq`'s (message key
/// `{order}:{event type}`).
async fn dead_letter_id(
    client: &mut PlannerClient<Channel>,
    dlq: &str,
    order: &str,
) -> anyhow::Result<String> {
    let key = format!("{order}:order.paid");
    let page = dead_letters_of(client, dlq, 1000).await?;
    page.dead_letters
        .into_iter()
        .find(|dead_letter| dead_letter.message_key == key)
        .map(|dead_letter| dead_letter.id)
        .ok_or_else(|| anyhow::anyhow!("no dead letter with key {key}"))
}

fn replay_request(id: &str, wait_ms: u64) -> v1::ReplayDeadLetterRequest {
    v1::ReplayDeadLetterRequest {
        dead_letter_id: id.to_owned(),
        reason: "customer support ticket 4711".into(),
        options: None,
        wait: Some(prost_types::Duration {
            seconds: (wait_ms / 1000) as i64,
            nanos: ((wait_ms % 1000) * 1_000_000) as i32,
        }),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replaying_one_dead_letter_twice_delivers_it_once() -> anyhow::Result<()> {
    use v1::replay_dead_letter_response::Outcome;

    init_logging();
    let (incident, mut bed) = incident_bed(5).await?;
    let (received, consuming) = consume(bed.broker(), &incident.work).await?;
    let two = dead_letter_id(&mut bed.client, &incident.dlq, "o-2").await?;
    let three = dead_letter_id(&mut bed.client, &incident.dlq, "o-3").await?;

    // Bad requests are refused, naming what is wrong.
    let error = bed
        .client
        .replay_dead_letter(v1::ReplayDeadLetterRequest {
            reason: " ".into(),
            ..replay_request(&two, 1000)
        })
        .await
        .unwrap_err();
    assert_eq!(error.code(), Code::InvalidArgument);
    assert!(
        error.message().starts_with("reason:"),
        "{}",
        error.message()
    );
    let error = bed
        .client
        .replay_dead_letter(replay_request("999999999", 1000))
        .await
        .unwrap_err();
    assert_eq!(error.code(), Code::NotFound, "{}", error.message());

    // No executor yet: nobody claims the plan of one, which is cancelled so
    // that it is not published later behind the caller's back.
    let answer = bed
        .client
        .replay_dead_letter(replay_request(&three, 1500))
        .await?
        .into_inner();
    assert_eq!(answer.outcome(), Outcome::NotReplayed);
    assert!(
        answer.reason.contains("no executor claimed it"),
        "{}",
        answer.reason
    );
    let abandoned = get_plan(&mut bed.client, &answer.plan_id).await?;
    assert_eq!(abandoned.state(), PlanState::Cancelled);

    let executor = ExecutorHandle::start(bed.executor_config());
    let first = bed
        .client
        .replay_dead_letter(as_actor("alice", replay_request(&two, 30_000)))
        .await?
        .into_inner();
    assert_eq!(first.outcome(), Outcome::Replayed, "{}", first.reason);
    assert_eq!(first.verdict(), v1::Verdict::Replayable);
    let event = first.event.clone().expect("the sent audit event");
    assert_eq!(event.action(), v1::AuditAction::Sent);
    assert_eq!(event.dead_letter_id, two);
    assert_eq!(event.plan_id, first.plan_id);
    // A plan of one: no canary, created and approved by the caller.
    let plan = wait_completed(&mut bed.client, &first.plan_id, Duration::from_secs(10)).await?;
    assert_eq!((plan.total_items, plan.canary_items), (1, 0));
    assert_eq!(
        (plan.created_by.as_str(), plan.approved_by.as_str()),
        ("alice", "alice")
    );
    assert!(
        plan.rate
            .unwrap()
            .rationale
            .contains("customer support ticket 4711")
    );

    // Again: the precheck finds it already replayed.
    let second = bed
        .client
        .replay_dead_letter(replay_request(&two, 30_000))
        .await?
        .into_inner();
    assert_eq!(second.outcome(), Outcome::NotReplayed);
    assert_eq!(second.verdict(), v1::Verdict::AlreadyReplayed);
    assert!(
        second.reason.contains(&first.plan_id),
        "names the plan that replayed it: {}",
        second.reason
    );
    assert!(second.plan_id.is_empty(), "no plan is made for it");

    // The cancelled plan of one released o-3: it can be replayed now.
    let third = bed
        .client
        .replay_dead_letter(replay_request(&three, 30_000))
        .await?
        .into_inner();
    assert_eq!(third.outcome(), Outcome::Replayed, "{}", third.reason);

    tokio::time::sleep(Duration::from_millis(500)).await;
    stop_consuming(consuming)?;
    executor.stop().await?;
    let received = received.lock().unwrap().clone();
    let ids: Vec<&str> = received.iter().map(|r| r.message_id.as_str()).collect();
    assert_eq!(ids, ["m-2", "m-3"], "each once, nothing else");
    let pool = bed.pool().await?;
    for (plan_id, delivery) in [&first.plan_id, &third.plan_id].into_iter().zip(&received) {
        assert_received_within_audit(&pool, plan_id, std::slice::from_ref(delivery)).await?;
    }
    pool.close().await;
    let plan_header = received[0].headers.inner().get("redrive-plan-id").cloned();
    assert_eq!(
        plan_header,
        Some(amqp_text(&first.plan_id)),
        "the replayed message names its plan"
    );
    bed.finish().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_repaired_body_is_prechecked_and_replayed_and_the_original_is_kept() -> anyhow::Result<()>
{
    use v1::replay_dead_letter_response::Outcome;

    init_logging();
    let (incident, mut bed) = incident_bed(3).await?;
    let one = dead_letter_id(&mut bed.client, &incident.dlq, "o-1").await?;
    let two = dead_letter_id(&mut bed.client, &incident.dlq, "o-2").await?;
    let original = br#"{"order_id":"o-1","n":1}"#.to_vec();
    let repaired = br#"{"order_id":"o-1","n":1,"currency":"EUR"}"#.to_vec();
    let repair = |id: &str, body: &[u8]| v1::RepairDeadLetterRequest {
        dead_letter_id: id.to_owned(),
        new_body: body.to_vec(),
        reason: "currency was missing (bug 981)".into(),
    };

    // The content type says JSON: a body that is not JSON is refused.
    let error = bed
        .client
        .repair_dead_letter(repair(&one, b"{\"order_id\": "))
        .await
        .unwrap_err();
    assert_eq!(error.code(), Code::InvalidArgument);
    assert!(
        error.message().starts_with("new_body:"),
        "{}",
        error.message()
    );
    // The captured body again is no repair.
    let error = bed
        .client
        .repair_dead_letter(repair(&one, &original))
        .await
        .unwrap_err();
    assert_eq!(
        error.code(),
        Code::FailedPrecondition,
        "{}",
        error.message()
    );

    let answer = bed
        .client
        .repair_dead_letter(as_actor("alice", repair(&one, &repaired)))
        .await?
        .into_inner();
    let dead_letter = answer.dead_letter.unwrap();
    assert_eq!(
        dead_letter.body, original,
        "the captured body stays as it was"
    );
    assert_eq!(dead_letter.revisions.len(), 1);
    assert_eq!(dead_letter.revisions[0].body, repaired);
    assert_eq!(dead_letter.revisions[0].actor, "alice");
    assert!(
        answer.body_preview.contains("EUR"),
        "{}",
        answer.body_preview
    );
    let shown = bed
        .client
        .get_dead_letter(v1::GetDeadLetterRequest { id: one.clone() })
        .await?
        .into_inner()
        .dead_letter
        .unwrap();
    assert_eq!(
        (shown.body.as_slice(), shown.revisions[0].body.as_slice()),
        (original.as_slice(), repaired.as_slice()),
        "GetDeadLetter shows both"
    );

    // The precheck reads the latest revision: o-2's repaired body carries an
    // event time three hours old, so it is stale by the body's own clock.
    bed.client
        .repair_dead_letter(repair(
            &two,
            br#"{"order_id":"o-2","n":2,"at":"2020-01-01T00:00:00Z"}"#,
        ))
        .await?;
    let options = v1::PrecheckOptions {
        default_stale_after: Some(prost_types::Duration {
            seconds: 3600,
            nanos: 0,
        }),
        event_time_pointer: "/at".into(),
        ..Default::default()
    };
    let report = bed
        .client
        .run_precheck(RunPrecheckRequest {
            selector: Some(v1::Selector {
                sources: vec![incident.dlq.clone()],
                ..Default::default()
            }),
            options: Some(options),
        })
        .await?
        .into_inner();
    let counts = report.counts.unwrap();
    assert_eq!((counts.replayable, counts.stale), (2, 1));

    // A plan that is still to publish o-0 keeps its body: no repair under it.
    let zero = dead_letter_id(&mut bed.client, &incident.dlq, "o-0").await?;
    let pending = bed
        .client
        .create_plan(plan_request(&report, 10.0, 1))
        .await?
        .into_inner();
    let error = bed
        .client
        .repair_dead_letter(repair(&zero, br#"{"order_id":"o-0"}"#))
        .await
        .unwrap_err();
    assert_eq!(error.code(), Code::FailedPrecondition);
    assert!(
        error.message().contains(&pending.plan_id),
        "{}",
        error.message()
    );
    cancel(&mut bed.client, &pending.plan_id, "repair first").await?;
    bed.client
        .repair_dead_letter(repair(&zero, br#"{"order_id":"o-0"}"#))
        .await?;

    // The replay publishes the repaired body and its audit says so.
    let (received, consuming) = consume(bed.broker(), &incident.work).await?;
    let executor = ExecutorHandle::start(bed.executor_config());
    let replayed = bed
        .client
        .replay_dead_letter(replay_request(&one, 30_000))
        .await?
        .into_inner();
    assert_eq!(replayed.outcome(), Outcome::Replayed, "{}", replayed.reason);
    let event = replayed.event.unwrap();
    assert!(
        event
            .reason
            .contains("repaired body, revision 1 by alice: currency was missing"),
        "{}",
        event.reason
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop_consuming(consuming)?;
    executor.stop().await?;
    let received = received.lock().unwrap().clone();
    assert_eq!(received.len(), 1);
    assert_eq!(
        received[0].body, repaired,
        "the consumer gets the repaired body"
    );
    assert_bed_audit(&bed, &replayed.plan_id, &received).await?;
    bed.finish().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_planner_stops_within_its_grace_period_while_a_watch_stream_is_open() -> anyhow::Result<()>
{
    init_logging();
    let broker = Broker::connect().await?;
    let incident = incident(&broker, 2).await?;
    let mut bed = TestBed::start(broker, |config| {
        config.capture_queues = vec![incident.dlq.clone()];
        config.shutdown_grace_seconds = 1;
    })
    .await?;
    captured(&mut bed.client, &incident.dlq, 2).await?;
    let report = precheck(&mut bed.client, &incident.dlq).await?;
    let plan = bed
        .client
        .create_plan(plan_request(&report, 10.0, 1))
        .await?
        .into_inner();
    // A watcher of a plan awaiting approval: its stream stays open.
    let mut watch = bed
        .client
        .watch_plan(v1::WatchPlanRequest {
            plan_id: plan.plan_id.clone(),
            include_events: false,
        })
        .await?
        .into_inner();
    assert!(watch.message().await?.is_some(), "the first snapshot");
    // SIGTERM: the planner ends the stream after the grace period, not never.
    tokio::time::timeout(Duration::from_secs(20), bed.planner.halt())
        .await
        .map_err(|_| anyhow::anyhow!("the planner did not stop with a watch stream open"))??;
    bed.finish().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_missing_destination_exchange_fails_the_canary_instead_of_retrying_for_ever()
-> anyhow::Result<()> {
    init_logging();
    let (incident, mut bed) = incident_bed(20).await?;
    let missing = unique("no-such-exchange");
    let plan = approved_plan(
        &mut bed.client,
        &incident.dlq,
        100.0,
        5,
        Some(v1::destination::Mode::Redirect(v1::RedirectDestination {
            exchange: missing.clone(),
            routing_key: "orders".into(),
        })),
    )
    .await?;
    let mut config = ExecutorHandle::config(&bed.planner, None);
    config.max_attempts = 2;
    let executor = ExecutorHandle::start(config);
    let aborted = wait_aborted(&mut bed.client, &plan.plan_id).await?;
    executor.stop().await?;
    let counts = aborted.counts.unwrap();
    assert_eq!((counts.sent, counts.failed), (0, 1), "{counts:?}");
    let audit = audit_report(&mut bed.client, &plan.plan_id).await?;
    let failed = audit
        .not_sent
        .iter()
        .find(|event| event.action() == v1::AuditAction::Failed)
        .expect("a failed event");
    assert!(
        failed
            .reason
            .contains("no publisher confirm after 2 attempts")
            && failed.reason.contains(&missing),
        "the reason names the exchange: {}",
        failed.reason
    );
    bed.finish().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_single_replay_cut_short_by_shutdown_is_never_published_later() -> anyhow::Result<()> {
    use v1::replay_dead_letter_response::Outcome;

    init_logging();
    let (incident, mut bed) = incident_bed(2).await?;
    let one = dead_letter_id(&mut bed.client, &incident.dlq, "o-1").await?;
    // No executor: the call waits; the planner is stopped meanwhile.
    let waiting = tokio::spawn({
        let mut client = bed.client.clone();
        let one = one.clone();
        async move {
            client
                .replay_dead_letter(replay_request(&one, 60_000))
                .await
        }
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    bed.planner.halt().await?;
    let answer = waiting.await??.into_inner();
    assert_eq!(answer.outcome(), Outcome::NotReplayed);
    assert!(answer.reason.contains("shutting down"), "{}", answer.reason);

    // After a restart, an executor finds nothing to publish.
    bed.restart_planner(|config| capturing(config, &[&incident.dlq]))
        .await?;
    let plan = get_plan(&mut bed.client, &answer.plan_id).await?;
    assert_eq!(plan.state(), PlanState::Cancelled);
    let (received, consuming) = consume(bed.broker(), &incident.work).await?;
    let executor = ExecutorHandle::start(bed.executor_config());
    tokio::time::sleep(Duration::from_secs(2)).await;
    executor.stop().await?;
    stop_consuming(consuming)?;
    assert!(
        received.lock().unwrap().is_empty(),
        "nothing published behind the caller's back"
    );
    bed.finish().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replay_that_came_back_can_be_repaired_and_replayed_again() -> anyhow::Result<()> {
    use v1::replay_dead_letter_response::Outcome;

    init_logging();
    let (incident, mut bed) = incident_bed(2).await?;
    let one = dead_letter_id(&mut bed.client, &incident.dlq, "o-1").await?;
    let executor = ExecutorHandle::start(bed.executor_config());
    let first = bed
        .client
        .replay_dead_letter(replay_request(&one, 30_000))
        .await?
        .into_inner();
    assert_eq!(first.outcome(), Outcome::Replayed, "{}", first.reason);

    // The consumer still cannot take it: it dead-letters again and is
    // captured as a re-dead-letter of that plan.
    let channel = bed.broker().connection.create_channel().await?;
    reject_next(&channel, &incident.work, "the replayed message").await?;
    captured(&mut bed.client, &incident.dlq, 3).await?;
    let page = dead_letters_of(&mut bed.client, &incident.dlq, 100).await?;
    let back = page
        .dead_letters
        .iter()
        .find(|d| d.redrive_plan_id.as_deref() == Some(first.plan_id.as_str()))
        .expect("the re-dead-letter names its plan")
        .id
        .clone();

    // Repaired, it replays: that earlier replay did not reach the consumer's
    // books, so its replay key does not make this a duplicate.
    let fixed = br#"{"order_id":"o-1","n":1,"fixed":true}"#.to_vec();
    bed.client
        .repair_dead_letter(v1::RepairDeadLetterRequest {
            dead_letter_id: back.clone(),
            new_body: fixed.clone(),
            reason: "the field the consumer needs".into(),
        })
        .await?;
    let again = bed
        .client
        .replay_dead_letter(replay_request(&back, 30_000))
        .await?
        .into_inner();
    assert_eq!(again.outcome(), Outcome::Replayed, "{}", again.reason);
    let delivery = channel
        .basic_get(incident.work.as_str().into(), Default::default())
        .await?
        .expect("the repaired message");
    assert_eq!(delivery.data, fixed);
    channel.close(200, "done".into()).await?;
    executor.stop().await?;
    bed.finish().await
}

/// Issue 17: `ListPlans` tells single replays from bulk plans (`kinds`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn plans_are_listed_by_kind() -> anyhow::Result<()> {
    init_logging();
    let (incident, mut bed) = incident_bed(2).await?;
    let one = dead_letter_id(&mut bed.client, &incident.dlq, "o-1").await?;
    // No executor: the single replay's plan is cancelled unclaimed, but it
    // is a plan of its kind all the same.
    let single = bed
        .client
        .replay_dead_letter(replay_request(&one, 500))
        .await?
        .into_inner();
    let bulk = approved_plan(&mut bed.client, &incident.dlq, 10.0, 1, None).await?;
    let listed = |kinds: Vec<v1::PlanKind>| v1::ListPlansRequest {
        kinds: kinds.into_iter().map(i32::from).collect(),
        ..Default::default()
    };
    let mut ids = Vec::new();
    for kinds in [
        vec![v1::PlanKind::Single],
        vec![v1::PlanKind::Bulk],
        vec![v1::PlanKind::Single, v1::PlanKind::Bulk],
    ] {
        let plans = bed
            .client
            .list_plans(listed(kinds))
            .await?
            .into_inner()
            .plans;
        ids.push(
            plans
                .iter()
                .map(|plan| (plan.plan_id.clone(), plan.kind()))
                .collect::<Vec<_>>(),
        );
    }
    assert_eq!(
        ids,
        [
            vec![(single.plan_id.clone(), v1::PlanKind::Single)],
            vec![(bulk.plan_id.clone(), v1::PlanKind::Bulk)],
            vec![
                (bulk.plan_id.clone(), v1::PlanKind::Bulk),
                (single.plan_id.clone(), v1::PlanKind::Single)
            ],
        ]
    );
    let refused = bed
        .client
        .list_plans(v1::ListPlansRequest {
            kinds: vec![0],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument);
    assert!(
        refused.message().contains("kinds[0]"),
        "{}",
        refused.message()
    );
    bed.finish().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_ordered_plan_delivers_in_dead_letter_order_with_two_executors() -> anyhow::Result<()> {
    init_logging();
    // Twelve messages dead-lettered in order: four orders × created, paid,
    // shipped as a producer would have sent them.
    let (incident, mut bed) = incident_bed(12).await?;
    let (received, consuming) = consume(bed.broker(), &incident.work).await?;
    // Slices of one item, so that two executors would interleave slices if
    // nothing held them to the order.
    let plan = approved_plan_with(&mut bed.client, &incident.dlq, |request| {
        request.slice_size = 1;
        request.ordered = true;
        request.rate = Some(Rate {
            per_second: 500.0,
            burst: 50,
            rationale: "test downstream takes this easily".into(),
        });
    })
    .await?;
    assert!(plan.ordered, "the plan says it is ordered");
    let executor = |id: &str| {
        let mut config = bed.executor_config();
        config.executor_id = Some(id.to_owned());
        ExecutorHandle::start(config)
    };
    let (first, second) = (executor("a"), executor("b"));
    let done = wait_completed(&mut bed.client, &plan.plan_id, Duration::from_secs(60)).await?;
    first.stop().await?;
    second.stop().await?;
    let received = drain(&received, consuming, Duration::from_millis(200)).await?;
    let ids: Vec<&str> = received.iter().map(|r| r.message_id.as_str()).collect();
    let expected: Vec<String> = (0..12).map(|index| format!("m-{index}")).collect();
    assert_eq!(ids, expected, "delivered in dead-letter order, each once");
    assert_eq!(done.counts.unwrap().sent, 12);
    // Both executors took part: the order comes from the planner, not from
    // one executor doing all the work.
    let pool = bed.pool().await?;
    // Executor ids are `NAME/SLOT` (each runs several slices at once).
    let executors: Vec<String> = sqlx::query_scalar(
        "SELECT DISTINCT split_part(executor_id, '/', 1) FROM audit_events WHERE plan_id = $1 ORDER BY 1",
    )
    .bind(plan.plan_id.parse::<uuid::Uuid>()?)
    .fetch_all(&pool)
    .await?;
    pool.close().await;
    assert_eq!(executors, ["a", "b"], "both executors published");
    assert_bed_audit(&bed, &plan.plan_id, &received).await?;
    bed.finish().await
}

/// The ledger is final (docs/design.md, "identity"): a re-dead-letter
/// reopens a delivery only when every copy its plan may have delivered came
/// back. With a second copy out (an attempt whose confirm was lost, then its
/// republish), the one copy that came back says nothing of the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_copy_coming_back_does_not_reopen_a_delivery_of_which_another_may_have_arrived()
-> anyhow::Result<()> {
    use v1::replay_dead_letter_response::Outcome;

    init_logging();
    let (incident, mut bed) = incident_bed(2).await?;
    let one = dead_letter_id(&mut bed.client, &incident.dlq, "o-1").await?;
    let executor = ExecutorHandle::start(bed.executor_config());
    let first = bed
        .client
        .replay_dead_letter(replay_request(&one, 30_000))
        .await?
        .into_inner();
    assert_eq!(first.outcome(), Outcome::Replayed, "{}", first.reason);
    // What the audit records when the first attempt's confirm was lost with
    // its connection and the republish was confirmed: an `uncertain` event
    // beside the `sent` one (written here as the executor's report would).
    let pool = bed.pool().await?;
    let inserted = sqlx::query(
        "INSERT INTO audit_events (plan_id, slice_id, dead_letter_id, message_key, destination, \
             action, reason, wave, executor_id, attempt, message_id) \
         SELECT plan_id, slice_id, dead_letter_id, message_key, destination, 'uncertain', \
             'no publisher confirm: connection lost', wave, executor_id, attempt, message_id \
         FROM audit_events WHERE plan_id = $1 AND action = 'sent'",
    )
    .bind(first.plan_id.parse::<uuid::Uuid>()?)
    .execute(&pool)
    .await?;
    assert_eq!(inserted.rows_affected(), 1);

    // One copy dead-letters again and is captured as a re-dead-letter.
    let channel = bed.broker().connection.create_channel().await?;
    reject_next(&channel, &incident.work, "the replayed message").await?;
    channel.close(200, "done".into()).await?;
    captured(&mut bed.client, &incident.dlq, 3).await?;
    let page = dead_letters_of(&mut bed.client, &incident.dlq, 100).await?;
    let back = page
        .dead_letters
        .iter()
        .find(|d| d.redrive_plan_id.as_deref() == Some(first.plan_id.as_str()))
        .expect("the re-dead-letter names its plan")
        .id
        .clone();

    // The other copy may have reached the consumer's books: not replayable.
    let again = bed
        .client
        .replay_dead_letter(replay_request(&back, 5_000))
        .await?
        .into_inner();
    assert_eq!(again.outcome(), Outcome::NotReplayed, "{}", again.reason);
    assert_eq!(
        again.verdict(),
        v1::Verdict::AlreadyReplayed,
        "{}",
        again.reason
    );
    assert!(
        again.reason.contains(&first.plan_id),
        "names the plan: {}",
        again.reason
    );
    let report = precheck(&mut bed.client, &incident.dlq).await?;
    let counts = report.counts.unwrap_or_default();
    // o-0 was never replayed; o-1 is already replayed, and its re-dead-letter
    // (the same identity, later) is its duplicate: nothing of o-1 replays.
    assert_eq!(
        (counts.replayable, counts.already_replayed, counts.duplicate),
        (1, 1, 1),
        "{counts:?}"
    );
    executor.stop().await?;
    pool.close().await;
    bed.finish().await
}

/// A plan of large slices replays in time when PostgreSQL's statistics
/// know only an earlier plan's slices (`plan_items` analyzed after it, no
/// autovacuum since: a large plan outruns it). Every existing slice is then
/// a most-common value, so a new slice is estimated at one row, and a claim
/// that joined its items to the chosen positions as a semi join re-ran the
/// running byte sum once per item: a slice of 1,000 took 6.5 s a claim, and
/// these two main slices of 2,000 would take about 26 s each. A claim finds
/// its items once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_slices_are_claimed_in_time_when_statistics_know_only_an_earlier_plan()
-> anyhow::Result<()> {
    init_logging();
    let (incident, mut bed) = incident_bed(4000).await?;
    let shape = |request: &mut CreatePlanRequest| {
        request.slice_size = 2000;
        request.rate = Some(Rate {
            per_second: 100_000.0,
            burst: 1000,
            rationale: "test".into(),
        });
    };
    // This test's own database: an earlier plan of the same dead letters,
    // cancelled before it ran, is all the statistics know.
    let earlier = approved_plan_with(&mut bed.client, &incident.dlq, shape).await?;
    cancel(&mut bed.client, &earlier.plan_id, "superseded").await?;
    let pool = bed.pool().await?;
    keep_statistics_of_now(&pool, &["plan_items", "plan_slices"]).await?;
    pool.close().await;

    let (received, consuming) = consume(bed.broker(), &incident.work).await?;
    let plan = approved_plan_with(&mut bed.client, &incident.dlq, shape).await?;
    assert_eq!(plan.total_items, 4000);
    let executor = ExecutorHandle::start(bed.executor_config());
    let done = wait_completed(&mut bed.client, &plan.plan_id, Duration::from_secs(45)).await;
    executor.stop().await?;
    let received = drain(&received, consuming, Duration::from_millis(300)).await?;
    let (sent, _) = assert_bed_audit(&bed, &plan.plan_id, &received).await?;
    done?;
    assert_eq!(sent.len(), 4000, "every item sent");
    assert_eq!(received.len(), 4000, "every message arrived once");
    bed.finish().await
}
