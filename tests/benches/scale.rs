//! Scale benchmark (issue "Scale"): a million dead letters end to end, every
//! stage timed at two or more scales in one run, with its peak memory and the
//! disk PostgreSQL uses per dead letter, so that a stage whose time grows
//! faster than linearly shows.
//!
//! Run: `cargo bench -p redrive-tests --bench scale`
//! (`REDRIVE_BENCH_SCALES`, default `100000,1000000`: the scales, each run in
//! a fresh database; `REDRIVE_BENCH_SCALES=5000,20000` for a quick check).
//!
//! Per scale N, with persistent 1 KiB JSON dead letters
//! (`{"order_id":"o-<i>",...}`):
//! 1. **backlog** (setup, not a stage): two DLQs of N dead letters each that
//!    the broker makes itself (TTL 0 on a work queue with a dead-letter
//!    exchange);
//! 2. **raw**: the first DLQ consumed by a bare lapin consumer (capture's
//!    default prefetch 4,000, one `basic.ack(multiple)` per 1,000, nothing
//!    stored): the broker's limit in the same run;
//! 3. **capture**: the second DLQ captured by the planner in-process, from
//!    its start until every dead letter is stored (and the DLQ is empty); its
//!    ratio to raw (target ≥ 0.8×);
//! 4. **summary**: `SummarizeDeadLetters` of the source by default (reason),
//!    then once by each dimension the API offers;
//! 5. **precheck** with the example orders hook (batches of 500) over every
//!    dead letter; the `orders` table holds 10% of the orders cancelled
//!    (blocked) and 10% with stock reserved (needs compensation), so 80% is
//!    replayable (target < 30 s at 1,000,000);
//! 6. **plan creation**: `CreatePlan` from that precheck, rate 1,000,000/s
//!    burst 1,000, slices of 1,000, canary 1%, 1 s observation (target < 30 s
//!    at 1,000,000);
//! 7. **replay**: approve → completed with one executor process (the release
//!    binary), every guard on (Redis bucket and replay keys, the hook's
//!    re-check, leases, audit), redirected to a queue of its own; then that
//!    queue is read to the end: it must hold exactly as many messages as the
//!    plan's `sent` audit events, every message id received must be one the
//!    audit says was sent (or uncertain) and every id sent must be received.
//!
//! Memory: the planner, the hook and this benchmark's clients run in this
//! process; before each stage its peak RSS (`VmHWM`) is reset
//! (`/proc/self/clear_refs`), and read after it, so a stage's figure is the
//! process's peak during it (memory the allocator kept from an earlier stage
//! counts too). Target: < 500 MiB. The executor is a process of its own,
//! read before it stops (target < 100 MiB).
//!
//! Disk: `pg_database_size` after capture and after the replay (once the
//! audit log has sealed every event) minus the size of the fresh database
//! (schema only), and each large table's `pg_total_relation_size`, per dead
//! letter. `ANALYZE` runs once after capture (not timed), as autovacuum would
//! soon after a backlog that size.
//!
//! Planner replicas (`REDRIVE_BENCH_PLANNER_REPLICAS=2`, default 1): a
//! second planner on the same database runs beside the first from capture
//! on. Both capture the DLQ (competing consumers); the benchmark's own calls
//! (summary, precheck, plan, approve, the wait) go to the first and the
//! executor's claims and reports to the second, as a TCP load balancer in
//! front of both would spread two long-lived HTTP/2 connections. Both run
//! in this process, so the memory figures hold both.
//!
//! At the end a table gives each stage's time at each scale and the growth of
//! its time per dead letter from the smallest scale to the largest (1.0 =
//! linear), and each target met or not.

use std::{
    collections::HashSet,
    time::{Duration, Instant},
};

use futures::StreamExt;
use lapin::{
    options::{BasicAckOptions, BasicConsumeOptions, BasicQosOptions},
    types::FieldTable,
};
use redrive_proto::v1;
use redrive_tests::{
    Broker, ExecutorProcess, TestBed,
    bench::{
        CAPTURE_PREFETCH, approve, dead_letter_backlog, executor_args_for, peak_rss_of,
        raw_consume, wait_captured,
    },
    orders_hook::{self, OrdersHook},
    peak_rss_mib, unique, wait_until,
};
use tokio_util::sync::CancellationToken;

/// A stage's time per dead letter may grow this much from the smallest scale
/// to the largest and still count as linear (the machine's run-to-run noise
/// is about ±10%).
const LINEAR_TOLERANCE: f64 = 1.2;

/// The stages, in order, as the tables name them.
const STAGES: [&str; 7] = [
    "raw consume-and-ack (reference)",
    "capture",
    "summary (default: by reason)",
    "summary (by each dimension, one call each)",
    "precheck with the orders hook",
    "plan creation",
    "replay (approve → completed)",
];

/// The `SummarizeDeadLetters` dimensions.
const DIMENSIONS: [v1::SummaryDimension; 9] = [
    v1::SummaryDimension::Reason,
    v1::SummaryDimension::Destination,
    v1::SummaryDimension::Producer,
    v1::SummaryDimension::SchemaVersion,
    v1::SummaryDimension::EventType,
    v1::SummaryDimension::Hour,
    v1::SummaryDimension::Source,
    v1::SummaryDimension::Error,
    v1::SummaryDimension::Status,
];

/// The tables whose size is reported per dead letter.
const TABLES: [&str; 5] = [
    "dead_letters",
    "precheck_items",
    "plan_items",
    "audit_events",
    "audit_log",
];

/// One stage's figures.
#[derive(Debug, Clone, Copy, Default)]
struct Stage {
    seconds: f64,
    /// This process's peak RSS during the stage, MiB.
    peak_mib: f64,
}

/// What one scale measured.
#[derive(Debug, Clone, Default)]
struct ScaleResult {
    messages: u32,
    /// By [`STAGES`].
    stages: Vec<Stage>,
    backlog_seconds: f64,
    raw_rate: f64,
    capture_rate: f64,
    executor_peak_mib: f64,
    /// Database bytes per dead letter over the fresh database: after
    /// capture, after the replay.
    database_after_capture: f64,
    database_after_replay: f64,
    /// Bytes per dead letter of each of [`TABLES`] after the replay.
    tables: Vec<f64>,
    /// Of `dead_letters`, its indexes' bytes per dead letter.
    dead_letter_indexes: f64,
    replayed: u64,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut scales: Vec<u32> = std::env::var("REDRIVE_BENCH_SCALES")
        .unwrap_or_else(|_| "100000,1000000".to_owned())
        .split(',')
        .map(|scale| scale.trim().replace('_', "").parse::<u32>())
        .collect::<Result<_, _>>()?;
    // Smallest first: memory the allocator keeps after a large scale would
    // count in every stage of a smaller one after it.
    scales.sort_unstable();
    scales.dedup();
    anyhow::ensure!(
        !scales.is_empty() && scales.iter().all(|&n| n >= 100),
        "REDRIVE_BENCH_SCALES: dead letters per scale, at least 100 each"
    );
    let replicas: u32 = std::env::var("REDRIVE_BENCH_PLANNER_REPLICAS")
        .unwrap_or_else(|_| "1".to_owned())
        .trim()
        .parse()
        .ok()
        .filter(|replicas| (1..=2).contains(replicas))
        .ok_or_else(|| anyhow::anyhow!("REDRIVE_BENCH_PLANNER_REPLICAS: 1 or 2"))?;
    // The executor's release binary (cargo builds this package's binaries
    // before its benchmarks), found before anything is timed.
    redrive_tests::scenario::Binaries::of_tests()?;
    println!(
        "planner replicas: {replicas}{}",
        if replicas == 2 {
            " (both capture; the benchmark's calls go to the first, the executor's to the second)"
        } else {
            ""
        }
    );
    println!(
        "scales: {}; memory figures are this process's peak RSS (VmHWM, reset before each stage): the planner, the hook and the benchmark's clients",
        scales
            .iter()
            .map(|&n| thousands(u64::from(n)))
            .collect::<Vec<_>>()
            .join(", ")
    );

    let mut results = Vec::new();
    for &messages in &scales {
        println!("\n## {} dead letters", thousands(u64::from(messages)));
        let outcome = async {
            let mut bed = TestBed::start(Broker::connect().await?, |config| {
                config.lease_ttl_seconds = 30;
            })
            .await?;
            // Each stage's failure still drops the database, deletes the
            // queues and the Redis keys (`finish`, or the bed's guards when
            // even that fails), and kills the executor (its own guard).
            let measured = run_scale(&mut bed, messages, replicas).await;
            let finished = bed.finish().await;
            let result = measured?;
            finished?;
            anyhow::Ok(result)
        }
        .await;
        match outcome {
            Ok(result) => results.push(result),
            Err(error) => {
                if !results.is_empty() {
                    println!("\nthe scales measured before the failure:");
                    report(&results);
                }
                return Err(error.context(format!("the scale of {messages} dead letters")));
            }
        }
    }
    report(&results);
    Ok(())
}

/// Every stage at `messages` dead letters on `bed` (fresh database), with
/// `replicas` planners (1 or 2, see the module docs).
async fn run_scale(bed: &mut TestBed, messages: u32, replicas: u32) -> anyhow::Result<ScaleResult> {
    let n = u64::from(messages);
    let count = i64::from(messages);
    let pool = bed.pool().await?;
    let fresh_size = database_size(&pool).await?;
    println!(
        "fresh database (schema only): {:.1} MiB",
        fresh_size as f64 / MIB
    );
    let mut result = ScaleResult {
        messages,
        ..Default::default()
    };

    // Backlogs (setup): one for the raw reference, one for capture.
    let started = Instant::now();
    let raw_dlq = dead_letter_backlog(bed.broker(), messages).await?;
    let dlq = dead_letter_backlog(bed.broker(), messages).await?;
    result.backlog_seconds = started.elapsed().as_secs_f64();
    println!(
        "backlog: 2 × {} dead letters in {:.1} s (setup, not a stage)",
        thousands(n),
        result.backlog_seconds
    );

    // Raw consume-and-ack.
    let mark = reset_peak();
    let (raw_seconds, raw_rate) = raw_consume(bed.broker(), &raw_dlq, messages).await?;
    let raw = stage("raw consume-and-ack", raw_seconds, mark, n);
    result.raw_rate = raw_rate;

    // Capture: the planner restarted with the DLQ to capture, until every
    // dead letter is stored.
    let mark = reset_peak();
    let started = Instant::now();
    let capturing = |config: &mut redrive_planner::Config| {
        config.capture_queues = vec![dlq.clone()];
        config.message_keys = vec!["json:/order_id".to_owned()];
        config.lease_ttl_seconds = 30;
    };
    bed.restart_planner(capturing).await?;
    let mut capturing_replica = match replicas {
        2 => Some(bed.start_replica(capturing).await?),
        _ => None,
    };
    let timeout = Duration::from_secs(600 + n / 500);
    wait_captured(bed.broker(), &pool, &dlq, count, timeout).await?;
    let capture_seconds = started.elapsed().as_secs_f64();
    bed.planner.halt().await?;
    if let Some(replica) = &mut capturing_replica {
        replica.halt().await?;
    }
    let capture = stage("capture", capture_seconds, mark, n);
    let left = bed.broker().ready_count(&dlq).await?;
    let stored: i64 = sqlx::query_scalar("SELECT count(*) FROM dead_letters")
        .fetch_one(&pool)
        .await?;
    anyhow::ensure!(
        stored == count && left == 0,
        "capture stored {stored} of {messages} dead letters, {left} left in the DLQ"
    );
    result.capture_rate = n as f64 / capture_seconds;
    println!(
        "  capture {:.0}/s against raw {raw_rate:.0}/s: {:.2}× (target ≥ 0.8×)",
        result.capture_rate,
        result.capture_rate / raw_rate
    );
    sqlx::query("ANALYZE").execute(&pool).await?;
    let size = database_size(&pool).await?;
    result.database_after_capture = (size - fresh_size) as f64 / n as f64;
    println!(
        "  disk after capture: database +{:.1} MiB, {:.0} bytes per dead letter; dead_letters {:.0} bytes per dead letter",
        (size - fresh_size) as f64 / MIB,
        result.database_after_capture,
        table_size(&pool, "dead_letters").await? as f64 / n as f64
    );

    // The orders the hook reads (setup): 10% cancelled, 10% with stock
    // reserved; the rest have no order (replay).
    OrdersHook::create_schema(&pool).await?;
    sqlx::query(
        "INSERT INTO orders (order_id, status, stock_reserved) \
         SELECT 'o-' || g, CASE WHEN g % 10 = 0 THEN 'CANCELLED' ELSE 'PAID' END, g % 10 = 5 \
         FROM generate_series(0, $1 - 1) g WHERE g % 10 IN (0, 5)",
    )
    .bind(count)
    .execute(&pool)
    .await?;
    let blocked = n.div_ceil(10);
    let compensation = (n + 4) / 10;
    let replayable = n - blocked - compensation;
    let hook_pool = bed.pool().await?;
    let hook_shutdown = CancellationToken::new();
    let _hook_guard = hook_shutdown.clone().drop_guard();
    let hook_url = orders_hook::spawn(OrdersHook::new(hook_pool.clone()), hook_shutdown).await?;
    // Capture stopped; the hook routed for the orders' events; leases as in
    // the throughput benchmark.
    let serving = |config: &mut redrive_planner::Config| {
        config.message_keys = vec!["json:/order_id".to_owned()];
        config.state_checks = vec![format!("order.*={hook_url}")];
        config.lease_ttl_seconds = 30;
    };
    bed.restart_planner(serving).await?;
    let mut replica = match replicas {
        2 => Some(bed.start_replica(serving).await?),
        _ => None,
    };
    let source_selector = || v1::Selector {
        sources: vec![dlq.clone()],
        ..Default::default()
    };
    let mut client = bed.client.clone();

    // Summary: the default, then each dimension.
    let mark = reset_peak();
    let started = Instant::now();
    let summary = client
        .summarize_dead_letters(v1::SummarizeDeadLettersRequest {
            selector: Some(source_selector()),
            group_by: vec![],
        })
        .await?
        .into_inner();
    let summary_default = stage("summary, default", started.elapsed().as_secs_f64(), mark, n);
    anyhow::ensure!(
        summary.total == n,
        "the summary counts {} dead letters of {n}",
        summary.total
    );
    let mark = reset_peak();
    let mut each = Vec::new();
    let started = Instant::now();
    for dimension in DIMENSIONS {
        let call = Instant::now();
        let summary = client
            .summarize_dead_letters(v1::SummarizeDeadLettersRequest {
                selector: Some(source_selector()),
                group_by: vec![dimension.into()],
            })
            .await?
            .into_inner();
        anyhow::ensure!(summary.total == n, "{dimension:?}: total {}", summary.total);
        each.push(format!(
            "{} {:.2} s ({} groups)",
            dimension
                .as_str_name()
                .trim_start_matches("SUMMARY_DIMENSION_")
                .to_lowercase(),
            call.elapsed().as_secs_f64(),
            summary.groups.len()
        ));
    }
    let summary_each = stage(
        "summary, by each dimension",
        started.elapsed().as_secs_f64(),
        mark,
        n,
    );
    println!("    {}", each.join(", "));

    // Precheck with the hook.
    let mark = reset_peak();
    let started = Instant::now();
    let report = client
        .run_precheck(v1::RunPrecheckRequest {
            selector: Some(source_selector()),
            options: Some(v1::PrecheckOptions {
                state_check_batch_size: 500,
                ..Default::default()
            }),
        })
        .await?
        .into_inner();
    let precheck = stage("precheck", started.elapsed().as_secs_f64(), mark, n);
    let counts = report.counts.unwrap_or_default();
    println!(
        "    replayable {}, blocked_by_state {}, needs_compensation {}, duplicate {}, stale {}, invalid {}",
        counts.replayable,
        counts.blocked_by_state,
        counts.needs_compensation,
        counts.duplicate,
        counts.stale,
        counts.invalid
    );
    anyhow::ensure!(
        report.total == n
            && counts.replayable == replayable
            && counts.blocked_by_state == blocked
            && counts.needs_compensation == compensation,
        "precheck of {} dead letters: expected {replayable} replayable, {blocked} blocked, {compensation} needing compensation: {counts:?}",
        report.total
    );

    // Plan creation.
    let destination = unique("bench_scale_replayed");
    bed.broker()
        .queue(&destination, FieldTable::default())
        .await?;
    let mark = reset_peak();
    let started = Instant::now();
    let plan = client
        .create_plan(v1::CreatePlanRequest {
            precheck_id: report.precheck_id.clone(),
            rate: Some(v1::Rate {
                per_second: 1_000_000.0,
                burst: 1000,
                rationale: "benchmark: far above the machine".into(),
            }),
            destination: Some(v1::Destination {
                mode: Some(v1::destination::Mode::Redirect(v1::RedirectDestination {
                    exchange: String::new(),
                    routing_key: destination.clone(),
                })),
            }),
            slice_size: 1000,
            canary_fraction: Some(0.01),
            observe_for: Some(prost_types::Duration {
                seconds: 1,
                nanos: 0,
            }),
            ..Default::default()
        })
        .await?
        .into_inner();
    let plan_creation = stage("plan creation", started.elapsed().as_secs_f64(), mark, n);
    println!(
        "    {} items in {} slices, canary {}",
        plan.total_items, plan.slices_total, plan.canary_items
    );
    anyhow::ensure!(
        plan.total_items == replayable,
        "the plan holds {} items, the precheck found {replayable} replayable",
        plan.total_items
    );

    // Replay with one executor process.
    let mut args = executor_args_for(bed, "bench-scale");
    if let Some(replica) = &replica
        && let Some(at) = args.iter().position(|arg| arg == "--planner")
    {
        args[at + 1] = replica.url();
    }
    let mut executor = ExecutorProcess::start_quiet(&args).await?;
    let pid = executor
        .id()
        .ok_or_else(|| anyhow::anyhow!("the executor exited at once"))?;
    // Let it connect and start polling for slices.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mark = reset_peak();
    let started = Instant::now();
    approve(&mut client, &plan.plan_id, report.digest.clone()).await?;
    let done = wait_completed(
        &mut client,
        &plan.plan_id,
        Duration::from_secs(600 + n / 200),
    )
    .await?;
    let replay_seconds = started.elapsed().as_secs_f64();
    result.executor_peak_mib = peak_rss_of(pid);
    let replay = stage("replay", replay_seconds, mark, n);
    executor.signal("TERM").await?;
    executor.wait_exit(Duration::from_secs(30)).await?;
    let counts = done.counts.unwrap_or_default();
    let (main_sent, main_seconds): (i64, f64) = sqlx::query_as(
        "SELECT count(*), coalesce(extract(epoch FROM max(at) - min(at))::float8, 0) \
         FROM audit_events WHERE plan_id = $1::uuid AND wave = 'main' AND action = 'sent'",
    )
    .bind(&plan.plan_id)
    .fetch_one(&pool)
    .await?;
    println!(
        "    {} sent in {replay_seconds:.2} s: {:.0} msg/s approve → completed, main wave {:.0} msg/s; executor peak RSS {:.0} MiB (target < 100 MiB)",
        counts.sent,
        counts.sent as f64 / replay_seconds,
        main_sent as f64 / main_seconds.max(1e-3),
        result.executor_peak_mib
    );
    anyhow::ensure!(
        counts.sent == replayable,
        "the plan completed with {} of {replayable} sent: {counts:?}",
        counts.sent
    );
    result.replayed = counts.sent;

    // Disk after the replay, once the audit log has sealed every event.
    let started = Instant::now();
    wait_until(
        "the audit log to seal every event",
        Duration::from_secs(300 + n / 1000),
        || async {
            let pending: i64 = sqlx::query_scalar(
                "SELECT CASE WHEN to_regclass('audit_log_pending') IS NULL THEN 0 \
                 ELSE (SELECT count(*) FROM audit_log_pending) END",
            )
            .fetch_one(&pool)
            .await?;
            Ok(pending == 0)
        },
    )
    .await?;
    let size = database_size(&pool).await?;
    result.database_after_replay = (size - fresh_size) as f64 / n as f64;
    for table in TABLES {
        result
            .tables
            .push(table_size(&pool, table).await? as f64 / n as f64);
    }
    let indexes: i64 = sqlx::query_scalar("SELECT pg_indexes_size('dead_letters')")
        .fetch_one(&pool)
        .await?;
    result.dead_letter_indexes = indexes as f64 / n as f64;
    println!(
        "  disk after the replay (audit sealed {:.1} s after completion): database +{:.1} MiB, {:.0} bytes per dead letter; {}",
        started.elapsed().as_secs_f64(),
        (size - fresh_size) as f64 / MIB,
        result.database_after_replay,
        TABLES
            .iter()
            .zip(&result.tables)
            .map(|(table, bytes)| format!("{table} {bytes:.0}"))
            .collect::<Vec<_>>()
            .join(", ")
    );

    // What arrived against what the audit says was sent.
    let started = Instant::now();
    verify_delivery(bed, &pool, &plan.plan_id, &destination).await?;
    println!(
        "  delivery checked in {:.1} s",
        started.elapsed().as_secs_f64()
    );

    result.stages = vec![
        raw,
        capture,
        summary_default,
        summary_each,
        precheck,
        plan_creation,
        replay,
    ];
    if let Some(replica) = &mut replica {
        replica.halt().await?;
    }
    hook_pool.close().await;
    pool.close().await;
    Ok(result)
}

/// Reads every message the replay put in `destination` and checks it
/// against the audit of plan `plan_id`: as many messages as `sent` events,
/// every message id received sent or uncertain, every id sent received.
async fn verify_delivery(
    bed: &TestBed,
    pool: &sqlx::PgPool,
    plan_id: &str,
    destination: &str,
) -> anyhow::Result<()> {
    let sent_events: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM audit_events WHERE plan_id = $1::uuid AND action = 'sent'",
    )
    .bind(plan_id)
    .fetch_one(pool)
    .await?;
    let audit_ids: Vec<(Option<String>, String)> = sqlx::query_as(
        "SELECT message_id, action FROM audit_events \
         WHERE plan_id = $1::uuid AND action IN ('sent', 'uncertain')",
    )
    .bind(plan_id)
    .fetch_all(pool)
    .await?;
    let mut sent_ids = HashSet::with_capacity(audit_ids.len());
    let mut allowed = HashSet::with_capacity(audit_ids.len());
    let mut without_id = 0u64;
    for (message_id, action) in audit_ids {
        let Some(message_id) = message_id else {
            without_id += 1;
            continue;
        };
        if action == "sent" {
            sent_ids.insert(message_id.clone());
        }
        allowed.insert(message_id);
    }
    anyhow::ensure!(
        without_id == 0,
        "{without_id} audit events without a message id"
    );

    let broker = bed.broker();
    let held = broker.ready_count(destination).await?;
    let channel = broker.connection.create_channel().await?;
    channel
        .basic_qos(CAPTURE_PREFETCH, BasicQosOptions::default())
        .await?;
    let mut consumer = channel
        .basic_consume(
            destination.into(),
            "scale-verify".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let mut received = HashSet::with_capacity(usize::try_from(held)?);
    let (mut duplicates, mut strays, mut without_message_id) = (0u64, 0u64, 0u64);
    let mut seen = 0u32;
    while seen < held {
        let delivery = tokio::time::timeout(Duration::from_secs(30), consumer.next())
            .await
            .map_err(|_| anyhow::anyhow!("no delivery for 30 s after {seen} of {held}"))?
            .ok_or_else(|| anyhow::anyhow!("the verifying consumer ended"))??;
        seen += 1;
        match delivery.properties.message_id() {
            Some(id) => {
                let id = id.as_str();
                if !allowed.contains(id) {
                    strays += 1;
                }
                if !received.insert(id.to_owned()) {
                    duplicates += 1;
                }
            }
            None => without_message_id += 1,
        }
        if seen.is_multiple_of(1000) || seen == held {
            delivery
                .acker
                .ack(BasicAckOptions { multiple: true })
                .await?;
        }
    }
    channel.close(200, "done".into()).await?;
    let left = broker.ready_count(destination).await?;
    let missing = sent_ids.iter().filter(|id| !received.contains(*id)).count();
    println!(
        "    the queue held {held} messages for {sent_events} sent events; {} distinct ids, {duplicates} duplicate(s), {strays} not in the audit, {without_message_id} without an id, {missing} sent but not received, {left} left",
        received.len()
    );
    anyhow::ensure!(
        i64::from(held) == sent_events
            && strays == 0
            && without_message_id == 0
            && missing == 0
            && left == 0,
        "delivery does not match the audit"
    );
    Ok(())
}

/// Waits until plan `plan_id` is completed, polling every 250 ms; the plan
/// then.
async fn wait_completed(
    client: &mut v1::planner_client::PlannerClient<tonic::transport::Channel>,
    plan_id: &str,
    timeout: Duration,
) -> anyhow::Result<v1::Plan> {
    let deadline = Instant::now() + timeout;
    loop {
        let plan = client
            .get_plan(v1::GetPlanRequest {
                plan_id: plan_id.to_owned(),
            })
            .await?
            .into_inner();
        match plan.state() {
            v1::PlanState::Completed => return Ok(plan),
            state @ (v1::PlanState::Paused | v1::PlanState::Cancelled | v1::PlanState::Aborted) => {
                anyhow::bail!("the plan is {}: {}", state.as_str_name(), plan.state_reason)
            }
            _ => {}
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the replay did not complete within {timeout:?}: {:?}",
            plan.counts
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

const MIB: f64 = 1024.0 * 1024.0;

/// Resets this process's peak RSS to its current RSS (Linux: `echo 5 >
/// /proc/self/clear_refs`); the RSS now, in MiB.
fn reset_peak() -> f64 {
    if let Err(error) = std::fs::write("/proc/self/clear_refs", "5") {
        println!("  (could not reset the peak RSS: {error}; peaks are since the start)");
    }
    rss_mib()
}

/// This process's resident memory now (`VmRSS`), MiB.
fn rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|value| {
            value
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<f64>()
                .ok()
        })
        .map_or(0.0, |kib| kib / 1024.0)
}

/// A stage's figures, printed: `seconds` for `messages`, this process's
/// peak RSS since [`reset_peak`] (which found `start_mib`).
fn stage(name: &str, seconds: f64, start_mib: f64, messages: u64) -> Stage {
    let figures = Stage {
        seconds,
        peak_mib: peak_rss_mib(),
    };
    println!(
        "  {name}: {seconds:.2} s ({:.0} dead letters/s); peak RSS {:.0} MiB (RSS at its start {start_mib:.0} MiB)",
        messages as f64 / seconds,
        figures.peak_mib
    );
    figures
}

async fn database_size(pool: &sqlx::PgPool) -> anyhow::Result<i64> {
    Ok(
        sqlx::query_scalar("SELECT pg_database_size(current_database())")
            .fetch_one(pool)
            .await?,
    )
}

/// `pg_total_relation_size` of `table` (with its indexes and TOAST), 0 when
/// there is no such table.
async fn table_size(pool: &sqlx::PgPool, table: &str) -> anyhow::Result<i64> {
    Ok(
        sqlx::query_scalar("SELECT coalesce(pg_total_relation_size(to_regclass($1)), 0)::bigint")
            .bind(table)
            .fetch_one(pool)
            .await?,
    )
}

/// The closing tables: each stage's time at each scale and its growth, the
/// disk per dead letter, and the targets.
fn report(results: &[ScaleResult]) {
    let (Some(smallest), Some(largest)) = (
        results.iter().min_by_key(|r| r.messages),
        results.iter().max_by_key(|r| r.messages),
    ) else {
        return;
    };
    let several = largest.messages > smallest.messages;
    let growth = |index: usize| {
        let per = |r: &ScaleResult| r.stages[index].seconds / f64::from(r.messages);
        per(largest) / per(smallest)
    };
    let header: Vec<String> = results
        .iter()
        .map(|r| thousands(u64::from(r.messages)))
        .collect();

    println!(
        "\n### Stages: time, and this process's peak RSS (planner + hook + client) during each"
    );
    println!(
        "\n| stage | {} | growth per dead letter, {} → {} (1.0 = linear) |",
        header.join(" | "),
        thousands(u64::from(smallest.messages)),
        thousands(u64::from(largest.messages))
    );
    println!("|---|{}---|", "---|".repeat(results.len()));
    for (index, name) in STAGES.iter().enumerate() {
        let cells: Vec<String> = results
            .iter()
            .map(|r| {
                let stage = r.stages[index];
                format!("{:.2} s, {:.0} MiB", stage.seconds, stage.peak_mib)
            })
            .collect();
        let growth = if several {
            format!("{:.2}", growth(index))
        } else {
            "—".to_owned()
        };
        println!("| {name} | {} | {growth} |", cells.join(" | "));
    }
    let row = |name: &str, cell: &dyn Fn(&ScaleResult) -> String| {
        println!(
            "| {name} | {} | |",
            results.iter().map(cell).collect::<Vec<_>>().join(" | ")
        );
    };
    row("capture ÷ raw (rate)", &|r| {
        format!(
            "{:.2}× ({} / {} per s)",
            r.capture_rate / r.raw_rate,
            thousands(r.capture_rate.round() as u64),
            thousands(r.raw_rate.round() as u64)
        )
    });
    row("replay msg/s (approve → completed)", &|r| {
        format!(
            "{} ({} sent)",
            thousands((r.replayed as f64 / r.stages[6].seconds).round() as u64),
            thousands(r.replayed)
        )
    });
    row("executor peak RSS", &|r| {
        format!("{:.0} MiB", r.executor_peak_mib)
    });
    row("backlog of 2 × N (setup)", &|r| {
        format!("{:.1} s", r.backlog_seconds)
    });

    println!("\n### Disk PostgreSQL uses, bytes per dead letter");
    println!("\n| what | {} |", header.join(" | "));
    println!("|---|{}", "---|".repeat(results.len()));
    row_disk(
        results,
        "database after capture (over the fresh one)",
        |r| r.database_after_capture,
    );
    row_disk(
        results,
        "database after the replay (over the fresh one)",
        |r| r.database_after_replay,
    );
    for (index, table) in TABLES.iter().enumerate() {
        row_disk(results, &format!("{table} (with indexes)"), |r| {
            r.tables[index]
        });
        if *table == "dead_letters" {
            row_disk(results, "of which dead_letters' indexes", |r| {
                r.dead_letter_indexes
            });
        }
    }

    println!("\n### Targets");
    let verdict = |met: bool| if met { "met" } else { "NOT met" };
    let worst_ratio = results
        .iter()
        .map(|r| r.capture_rate / r.raw_rate)
        .fold(f64::INFINITY, f64::min);
    println!(
        "- capture ≥ 0.8× raw at every scale: lowest {worst_ratio:.2}×: {}",
        verdict(worst_ratio >= 0.8)
    );
    for (index, name) in [(4, "precheck with the hook"), (5, "plan creation")] {
        let seconds = largest.stages[index].seconds;
        if largest.messages >= 1_000_000 {
            let at_million = seconds * 1e6 / f64::from(largest.messages);
            println!(
                "- {name} < 30 s at 1,000,000: {seconds:.2} s at {} ({at_million:.2} s per million): {}",
                thousands(u64::from(largest.messages)),
                verdict(at_million < 30.0)
            );
        } else {
            let projected = seconds * 1e6 / f64::from(largest.messages);
            println!(
                "- {name} < 30 s at 1,000,000: not measured at 1,000,000; {seconds:.2} s at {} projects linearly to {projected:.1} s: {} (projected)",
                thousands(u64::from(largest.messages)),
                verdict(projected < 30.0)
            );
        }
    }
    // The planner runs from capture to the replay; raw is the bare consumer.
    let planner_peak = results
        .iter()
        .flat_map(|r| r.stages[1..].iter().map(|stage| stage.peak_mib))
        .fold(0.0, f64::max);
    println!(
        "- planner RSS < 500 MiB (this process's peak over the planner's stages): {planner_peak:.0} MiB: {}",
        verdict(planner_peak < 500.0)
    );
    let executor_peak = results
        .iter()
        .map(|r| r.executor_peak_mib)
        .fold(0.0, f64::max);
    println!(
        "- executor RSS < 100 MiB: {executor_peak:.0} MiB: {}",
        verdict(executor_peak < 100.0)
    );
    if several {
        let faster: Vec<String> = STAGES
            .iter()
            .enumerate()
            .filter(|(index, _)| growth(*index) > LINEAR_TOLERANCE)
            .map(|(index, name)| format!("{name} ({:.2})", growth(index)))
            .collect();
        println!(
            "- no stage growing faster than linearly (time per dead letter at most {LINEAR_TOLERANCE}× from {} to {}): {}{}",
            thousands(u64::from(smallest.messages)),
            thousands(u64::from(largest.messages)),
            verdict(faster.is_empty()),
            if faster.is_empty() {
                String::new()
            } else {
                format!(": {}", faster.join(", "))
            }
        );
    } else {
        println!("- growth: one scale only, nothing to compare");
    }
}

fn row_disk(results: &[ScaleResult], name: &str, value: impl Fn(&ScaleResult) -> f64) {
    println!(
        "| {name} | {} |",
        results
            .iter()
            .map(|r| format!("{:.0}", value(r)))
            .collect::<Vec<_>>()
            .join(" | ")
    );
}

/// `1234567` as `1,234,567`.
fn thousands(value: u64) -> String {
    let digits = value.to_string();
    let mut out = String::new();
    for (index, digit) in digits.chars().enumerate() {
        if index > 0 && (digits.len() - index).is_multiple_of(3) {
            out.push(',');
        }
        out.push(digit);
    }
    out
}
