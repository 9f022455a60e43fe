//! The brakes (docs/design.md "Executor loop and guarantees"): cancel, pause, a
//! lost lease and SIGTERM stop publishing within a second; the rate bound
//! holds across a broker reset and a stall; rates whose emission interval is
//! not a whole number complete; the audit has every delivery. Real RabbitMQ,
//! Redis and PostgreSQL; executors in-process or as real processes.

use std::time::Duration;

use redrive_proto::v1::{self, PlanState};
use redrive_tests::{Broker, ExecutorHandle, ExecutorProcess, TcpProxy, TestBed, init_logging};
use tokio::time::Instant;

mod support;
use support::*;

/// Deliveries later than this after a stop was acknowledged break the
/// promise (the 1 s at p99; the consumer's own latency included).
const STOP_WITHIN: Duration = Duration::from_secs(1);

fn control(plan_id: &str, reason: &str) -> v1::PlanControlRequest {
    v1::PlanControlRequest {
        plan_id: plan_id.to_owned(),
        reason: reason.to_owned(),
        ..Default::default()
    }
}

/// Message ids the consumer got that a new precheck over `dlq` calls
/// replayable (must be none: a delivered key is never replayable).
async fn delivered_but_replayable(
    client: &mut v1::planner_client::PlannerClient<tonic::transport::Channel>,
    pool: &sqlx::PgPool,
    dlq: &str,
    received: &[Received],
) -> anyhow::Result<Vec<String>> {
    let report = precheck(client, dlq).await?;
    let replayable: Vec<String> = sqlx::query_scalar(
        "SELECT d.message_id FROM precheck_items p JOIN dead_letters d ON d.id = p.dead_letter_id \
         WHERE p.precheck_id = $1 AND p.verdict = 'replayable' AND d.message_id IS NOT NULL",
    )
    .bind(report.precheck_id.parse::<uuid::Uuid>()?)
    .fetch_all(pool)
    .await?;
    Ok(received
        .iter()
        .map(|r| r.message_id.clone())
        .filter(|id| replayable.contains(id))
        .collect())
}

/// A plan at `per_second`/`burst` over `items` dead letters is cancelled (or
/// paused) after `stop_after` deliveries: nothing arrives later than a
/// second after the call returned, the audit has every delivery, and a new
/// precheck calls none of the delivered keys replayable.
async fn stop_within_a_second(
    items: u32,
    per_second: f64,
    burst: u32,
    stop_after: usize,
    cancel: bool,
) -> anyhow::Result<()> {
    init_logging();
    let (incident, mut bed) = incident_bed(items).await?;
    let (received, consuming) = consume(bed.broker(), &incident.work).await?;
    let plan = approved_plan(&mut bed.client, &incident.dlq, per_second, burst, None).await?;
    let executor = ExecutorHandle::start(bed.executor_config());
    wait_received(&received, stop_after, Duration::from_secs(30)).await?;
    let request = control(&plan.plan_id, "downstream is struggling again");
    let state = if cancel {
        bed.client.cancel_plan(request).await?.into_inner().state()
    } else {
        bed.client.pause_plan(request).await?.into_inner().state()
    };
    let stopped_at = Instant::now();
    assert_eq!(
        state,
        if cancel {
            PlanState::Cancelled
        } else {
            PlanState::Paused
        }
    );
    tokio::time::sleep(STOP_WITHIN + Duration::from_secs(2)).await;
    assert_consuming(&consuming)?;
    let received = received.lock().unwrap().clone();
    let late: Vec<&Received> = received
        .iter()
        .filter(|r| r.at > stopped_at + STOP_WITHIN)
        .collect();
    assert!(
        late.is_empty(),
        "{} of {} deliveries came more than {STOP_WITHIN:?} after the stop (the last {:?} after)",
        late.len(),
        received.len(),
        late.last().map(|r| r.at.duration_since(stopped_at))
    );
    assert!(
        received.len() < items as usize,
        "the stop came before the plan's end"
    );
    // The executor reports what was confirmed after the stop too.
    executor.stop().await?;
    let pool = bed.pool().await?;
    let (sent, uncertain) = assert_received_within_audit(&pool, &plan.plan_id, &received).await?;
    assert!(sent.len() + uncertain.len() >= received.len());
    let replayable =
        delivered_but_replayable(&mut bed.client, &pool, &incident.dlq, &received).await?;
    assert!(
        replayable.is_empty(),
        "a precheck after the stop calls delivered keys replayable: {replayable:?}"
    );
    stop_consuming(consuming)?;
    pool.close().await;
    bed.finish().await
}

/// A plan cancelled a tenth of the way: its report counts and lists the
/// items no executor attempted (not `not sent: 0`), `redrivectl plan
/// report` says so, and the CSV export has a row for each (action
/// `never_attempted`) and every row the dead letter's AMQP message id.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cancelled_plans_report_counts_and_lists_the_items_never_attempted() -> anyhow::Result<()>
{
    use clap::Parser;
    init_logging();
    let items = 100;
    let (incident, mut bed) = incident_bed(items).await?;
    let (received, consuming) = consume(bed.broker(), &incident.work).await?;
    let plan = approved_plan(&mut bed.client, &incident.dlq, 20.0, 5, None).await?;
    let executor = ExecutorHandle::start(bed.executor_config());
    wait_received(&received, 10, Duration::from_secs(30)).await?;
    bed.client
        .cancel_plan(control(&plan.plan_id, "downstream is struggling again"))
        .await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    executor.stop().await?;
    stop_consuming(consuming)?;
    let received = received.lock().unwrap().clone();

    let report = bed
        .client
        .get_audit_report(v1::GetAuditReportRequest {
            plan_id: plan.plan_id.clone(),
        })
        .await?
        .into_inner();
    let with_outcome = report.sent_keys.len() + report.not_sent.len();
    let never = usize::try_from(report.never_attempted)?;
    assert!(
        never > 0 && never < items as usize,
        "{never} never attempted"
    );
    assert_eq!(
        with_outcome + never,
        items as usize,
        "every item is accounted for"
    );
    assert_eq!(report.never_attempted_items.len(), never);
    let delivered: std::collections::HashSet<&str> =
        received.iter().map(|r| r.message_id.as_str()).collect();
    for item in &report.never_attempted_items {
        assert!(!item.message_id.is_empty(), "{item:?}");
        assert!(
            !delivered.contains(item.message_id.as_str()),
            "never attempted, yet delivered: {item:?}"
        );
    }

    // What a person reads.
    let cli = redrivectl::Cli::try_parse_from([
        "redrivectl",
        "--planner",
        &bed.planner.url(),
        "plan",
        "report",
        &plan.plan_id,
    ])?;
    let mut out = Vec::new();
    assert_eq!(redrivectl::run(cli, &mut out).await.ok(), Some(0));
    let text = String::from_utf8(out)?;
    assert!(
        text.contains(&format!(
            "\nnever attempted: {never} (the plan ended before an executor took them"
        )),
        "{text}"
    );
    let first = &report.never_attempted_items[0];
    assert!(
        text.lines().any(|line| line.starts_with(&first.dead_letter_id)
            && line.contains(&first.message_id)),
        "{text}"
    );

    // The reconciliation file: a message id on every row, a row per item
    // never attempted.
    let mut export = bed
        .client
        .export_audit(v1::ExportAuditRequest {
            plan_id: plan.plan_id.clone(),
            format: v1::ExportFormat::Csv.into(),
        })
        .await?
        .into_inner();
    let mut csv = Vec::new();
    while let Some(chunk) = export.message().await? {
        csv.extend_from_slice(&chunk.data);
    }
    let mut reader = csv::Reader::from_reader(csv.as_slice());
    let header = reader.headers()?.clone();
    assert_eq!(&header[5], "message_id", "{header:?}");
    let rows: Vec<csv::StringRecord> = reader.records().collect::<Result<_, _>>()?;
    let never_rows: Vec<&csv::StringRecord> = rows
        .iter()
        .filter(|row| &row[6] == "never_attempted")
        .collect();
    assert_eq!(never_rows.len(), never);
    assert!(
        rows.iter().all(|row| !row[5].is_empty()),
        "a message id on every row"
    );
    for row in rows.iter().filter(|row| &row[6] == "sent") {
        assert!(delivered.contains(&row[5]), "sent {row:?} was not received");
    }
    bed.finish().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cancel_at_20_per_second_stops_within_a_second_and_the_audit_has_every_delivery()
-> anyhow::Result<()> {
    stop_within_a_second(200, 20.0, 5, 30, true).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cancel_at_full_speed_stops_within_a_second_and_the_audit_has_every_delivery()
-> anyhow::Result<()> {
    stop_within_a_second(4000, 100_000.0, 1000, 300, true).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pause_at_full_speed_stops_within_a_second_and_the_audit_has_every_delivery()
-> anyhow::Result<()> {
    stop_within_a_second(4000, 100_000.0, 1000, 300, false).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pause_stops_publishing_within_a_second_and_resume_delivers_the_rest_once()
-> anyhow::Result<()> {
    init_logging();
    let (incident, mut bed) = incident_bed(150).await?;
    let (received, consuming) = consume(bed.broker(), &incident.work).await?;
    let plan = approved_plan(&mut bed.client, &incident.dlq, 20.0, 5, None).await?;
    let executor = ExecutorHandle::start(bed.executor_config());
    wait_received(&received, 25, Duration::from_secs(30)).await?;
    let paused = bed
        .client
        .pause_plan(control(&plan.plan_id, "latency rising"))
        .await?
        .into_inner();
    let paused_at = Instant::now();
    assert_eq!(paused.state(), PlanState::Paused);
    tokio::time::sleep(STOP_WITHIN + Duration::from_secs(2)).await;
    assert_consuming(&consuming)?;
    let during = received.lock().unwrap().clone();
    let late = during
        .iter()
        .filter(|r| r.at > paused_at + STOP_WITHIN)
        .count();
    assert_eq!(
        late, 0,
        "deliveries more than {STOP_WITHIN:?} after the pause"
    );
    bed.client
        .resume_plan(control(&plan.plan_id, "latency back to normal"))
        .await?;
    wait_completed(&mut bed.client, &plan.plan_id, Duration::from_secs(60)).await?;
    executor.stop().await?;
    wait_received(&received, 150, Duration::from_secs(10)).await?;
    let received = drain(&received, consuming, Duration::from_millis(300)).await?;
    let pool = bed.pool().await?;
    let (sent, _) = assert_received_within_audit(&pool, &plan.plan_id, &received).await?;
    assert_eq!(sent.len(), 150, "every item sent once the plan resumed");
    pool.close().await;
    bed.finish().await
}

/// Rates whose emission interval is not a whole number of microseconds
/// (15/5 and 30/10 stalled for good before) complete, at their rate.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn plans_at_15_30_7_and_half_a_message_per_second_complete_at_their_rate()
-> anyhow::Result<()> {
    init_logging();
    let broker = Broker::connect().await?;
    // (rate, burst, items): each runs about two seconds (0.5/s: four).
    let cases: [(f64, u32, u32); 4] = [(15.0, 5, 36), (30.0, 10, 70), (7.0, 3, 17), (0.5, 1, 3)];
    let mut incidents = Vec::new();
    for (index, (_, _, items)) in cases.iter().enumerate() {
        incidents.push(incident_named(&broker, *items, &format!("r{index}-")).await?);
    }
    let dlqs: Vec<&str> = incidents.iter().map(|i| i.dlq.as_str()).collect();
    let mut bed = TestBed::start(broker, |config| capturing(config, &dlqs)).await?;
    let mut consumers = Vec::new();
    let mut plans = Vec::new();
    for (incident, (per_second, burst, items)) in incidents.iter().zip(cases) {
        captured(&mut bed.client, &incident.dlq, u64::from(items)).await?;
        consumers.push(consume(bed.broker(), &incident.work).await?);
        plans.push(approved_plan(&mut bed.client, &incident.dlq, per_second, burst, None).await?);
    }
    let mut config = bed.executor_config();
    config.concurrent_slices = 8;
    let executor = ExecutorHandle::start(config);
    let pool = bed.pool().await?;
    for ((plan, (received, consuming)), (per_second, burst, items)) in
        plans.iter().zip(&consumers).zip(cases)
    {
        wait_completed(&mut bed.client, &plan.plan_id, Duration::from_secs(60)).await?;
        wait_received(received, items as usize, Duration::from_secs(5)).await?;
        assert_consuming(consuming)?;
        let received = received.lock().unwrap().clone();
        assert_eq!(received.len(), items as usize, "rate {per_second}");
        assert_received_within_audit(&pool, &plan.plan_id, &received).await?;
        let bound = (per_second + f64::from(burst)).ceil() as usize;
        let most = most_in_any(&received, Duration::from_secs(1));
        assert!(
            most <= bound,
            "rate {per_second}/burst {burst}: {most} deliveries in one second, bound {bound}"
        );
        // Not slower than the rate either (the canary's observation window
        // is 0 s): the span from first to last delivery is about
        // (items - burst) / rate, plus the canary and promotion.
        let mut times: Vec<Instant> = received.iter().map(|r| r.at).collect();
        times.sort();
        let span = times[times.len() - 1]
            .duration_since(times[0])
            .as_secs_f64();
        let expected = (f64::from(items) - f64::from(burst) - 1.0).max(0.0) / per_second;
        assert!(
            span <= expected * 1.5 + 2.0,
            "rate {per_second}: {items} items took {span:.2} s, expected about {expected:.2} s"
        );
    }
    executor.stop().await?;
    for (_, consuming) in consumers {
        stop_consuming(consuming)?;
    }
    pool.close().await;
    bed.finish().await
}

/// SIGTERM while the executor waits for tokens (1/s) ends it at once: it
/// stops publishing, reports, releases the slice and exits, well inside its
/// grace period.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_during_a_token_wait_exits_at_once() -> anyhow::Result<()> {
    init_logging();
    let (incident, mut bed) = incident_bed(20).await?;
    let (received, consuming) = consume(bed.broker(), &incident.work).await?;
    let plan = approved_plan(&mut bed.client, &incident.dlq, 1.0, 1, None).await?;
    let mut executor = ExecutorProcess::start(&executor_args(
        &bed.planner.url(),
        redrive_tests::AMQP_URL,
        &bed.redis.prefix,
    ))
    .await?;
    wait_received(&received, 3, Duration::from_secs(30)).await?;
    executor.signal("TERM").await?;
    let signalled = Instant::now();
    let status = executor.wait_exit(Duration::from_secs(4)).await?;
    let took = signalled.elapsed();
    assert!(status.success(), "exit status {status}");
    assert!(
        took < Duration::from_secs(2),
        "exited {took:?} after SIGTERM (grace 5 s)"
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_consuming(&consuming)?;
    let received = received.lock().unwrap().clone();
    assert!(
        received.iter().all(|r| r.at <= signalled + STOP_WITHIN),
        "nothing published after SIGTERM"
    );
    let pool = bed.pool().await?;
    assert_received_within_audit(&pool, &plan.plan_id, &received).await?;
    // Released, not left leased: another executor can take it at once.
    let leased: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM plan_slices WHERE plan_id = $1 AND state = 'leased'",
    )
    .bind(plan.plan_id.parse::<uuid::Uuid>()?)
    .fetch_one(&pool)
    .await?;
    assert_eq!(leased, 0, "the slice was released on SIGTERM");
    stop_consuming(consuming)?;
    pool.close().await;
    bed.finish().await
}

/// An executor SIGSTOPped past its lease TTL, whose link to the planner is
/// stalled, publishes nothing after SIGCONT: its own deadline has passed.
/// The slice is leased again and the plan completes; the audit covers every
/// delivery.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_executor_paused_past_its_lease_publishes_nothing_when_it_resumes() -> anyhow::Result<()>
{
    init_logging();
    let broker = Broker::connect().await?;
    let incident = incident(&broker, 300).await?;
    let mut bed = bed(broker, &[&incident.dlq], 300).await?; // lease TTL 3 s
    let (received, consuming) = consume(bed.broker(), &incident.work).await?;
    let plan = approved_plan(&mut bed.client, &incident.dlq, 40.0, 4, None).await?;
    let link = TcpProxy::start(bed.planner.addr).await?;
    let executor = ExecutorProcess::start(&executor_args(
        &format!("http://{}", link.addr()),
        redrive_tests::AMQP_URL,
        &bed.redis.prefix,
    ))
    .await?;
    wait_received(&received, 40, Duration::from_secs(30)).await?;
    link.stall();
    executor.signal("STOP").await?;
    // Past the TTL: the planner's sweep ends the lease.
    tokio::time::sleep(Duration::from_secs(5)).await;
    executor.signal("CONT").await?;
    let resumed = Instant::now();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_consuming(&consuming)?;
    let after_resume: Vec<Duration> = received
        .lock()
        .unwrap()
        .iter()
        .filter(|r| r.at > resumed + Duration::from_millis(100))
        .map(|r| r.at.duration_since(resumed))
        .collect();
    assert!(
        after_resume.is_empty(),
        "{} deliveries after SIGCONT, at {after_resume:?}",
        after_resume.len()
    );
    // The link heals: the plan completes (this executor or a new one).
    link.heal();
    let survivor = ExecutorHandle::start(bed.executor_config());
    wait_completed(&mut bed.client, &plan.plan_id, Duration::from_secs(60)).await?;
    survivor.stop().await?;
    drop(executor);
    let received = drain(&received, consuming, Duration::from_millis(300)).await?;
    let pool = bed.pool().await?;
    let (sent, _) = assert_received_within_audit(&pool, &plan.plan_id, &received).await?;
    assert_eq!(sent.len(), 300, "every item sent in the end");
    pool.close().await;
    bed.finish().await
}

/// The broker connection is reset for 3 s, then stalled for 4 s (a
/// half-open path), mid-wave at 100/s, burst 10: the consumer never sees
/// more than rate + burst in any second, and nothing is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_rate_bound_holds_across_a_broker_reset_and_a_stall() -> anyhow::Result<()> {
    init_logging();
    let broker = Broker::connect().await?;
    let items = 1200;
    let incident = incident(&broker, items).await?;
    let mut bed = bed(broker, &[&incident.dlq], u64::from(items)).await?;
    let (received, consuming) = consume(bed.broker(), &incident.work).await?;
    let (per_second, burst) = (100.0, 10);
    let plan = approved_plan(&mut bed.client, &incident.dlq, per_second, burst, None).await?;
    let rabbit = TcpProxy::start("127.0.0.1:5672".parse()?).await?;
    let mut config = bed.executor_config();
    config.amqp.url = format!("amqp://guest:guest@{}/%2f", rabbit.addr());
    config.confirm_timeout_seconds = 2;
    config.amqp_heartbeat_seconds = 2;
    let executor = ExecutorHandle::start(config);
    wait_received(&received, 150, Duration::from_secs(30)).await?;
    let started = Instant::now();
    rabbit.cut();
    tokio::time::sleep(Duration::from_secs(3)).await;
    rabbit.restore();
    let restored = Instant::now();
    let count = received.lock().unwrap().len();
    wait_received(&received, count + 150, Duration::from_secs(30)).await?;
    let stalled = Instant::now();
    rabbit.stall();
    eprintln!("broker path stalled at {}", chrono::Utc::now());
    tokio::time::sleep(Duration::from_secs(4)).await;
    rabbit.heal();
    let healed = Instant::now();
    eprintln!("broker path healed at {}", chrono::Utc::now());
    wait_completed(&mut bed.client, &plan.plan_id, Duration::from_secs(90)).await?;
    executor.stop().await?;
    wait_received(&received, items as usize, Duration::from_secs(10)).await?;
    let received = drain(&received, consuming, Duration::from_millis(500)).await?;
    // The bucket's bound, plus 50 ms of the rate for the jitter between a
    // grant and the consumer's receive time.
    let bound = (per_second * 1.05 + f64::from(burst)) as usize;
    let most = most_in_any(&received, Duration::from_secs(1));
    let busiest = busiest_window_start(&received, Duration::from_secs(1))
        .map(|at| at.duration_since(started).as_secs_f64());
    let at = |instant: Instant| instant.duration_since(started).as_secs_f64();
    let histogram: Vec<usize> = busiest_window_start(&received, Duration::from_secs(1))
        .map(|start| {
            (0..15)
                .map(|tenth| {
                    let from = start + Duration::from_millis(100 * tenth);
                    let to = from + Duration::from_millis(100);
                    received
                        .iter()
                        .filter(|r| r.at >= from && r.at < to)
                        .count()
                })
                .collect()
        })
        .unwrap_or_default();
    eprintln!("deliveries per 100 ms from the busiest second: {histogram:?}");
    assert!(
        most <= bound,
        "{most} deliveries in one second across the faults, bound {bound}; the busiest second \
         starts at {busiest:?} s after the cut (restored at {:.2}, stalled at {:.2}, healed at {:.2})",
        at(restored),
        at(stalled),
        at(healed)
    );
    let pool = bed.pool().await?;
    let (sent, _) = assert_received_within_audit(&pool, &plan.plan_id, &received).await?;
    assert_eq!(sent.len(), items as usize, "nothing lost");
    pool.close().await;
    bed.finish().await
}

/// A plan paused during its canary whose last canary slice completes while
/// it is paused (an executor finishing its slice) goes on to the
/// observation when resumed, instead of sitting in `canary` with nothing
/// left to claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_plan_resumed_after_its_canary_finished_goes_on_to_the_observation() -> anyhow::Result<()>
{
    init_logging();
    let (incident, mut bed) = incident_bed(20).await?;
    let plan = approved_plan(&mut bed.client, &incident.dlq, 10.0, 1, None).await?;
    assert_eq!(plan.state(), v1::PlanState::Canary);
    let control = |reason: &str| v1::PlanControlRequest {
        plan_id: plan.plan_id.clone(),
        reason: reason.to_owned(),
        ..Default::default()
    };
    bed.client
        .pause_plan(control("looking at the canary"))
        .await?;
    // No executor: the canary slice completes "while paused" by hand.
    let pool = bed.pool().await?;
    let plan_id: uuid::Uuid = plan.plan_id.parse()?;
    sqlx::query(
        "UPDATE plan_slices SET state = 'completed' WHERE plan_id = $1 AND wave = 'canary'",
    )
    .bind(plan_id)
    .execute(&pool)
    .await?;
    let resumed = bed
        .client
        .resume_plan(control("canary looked fine"))
        .await?
        .into_inner();
    assert_eq!(resumed.state(), v1::PlanState::Observing);
    bed.finish().await
}
