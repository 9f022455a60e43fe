//! Throughput benchmark (issue "Throughput"): guarded replay side by side
//! with the broker's own publish-confirm limit, measured in the same run.
//!
//! Run: `cargo bench -p redrive-tests --bench throughput`
//! (`REDRIVE_BENCH_MESSAGES` sets the messages per run, default 50,000).
//!
//! In one run, with persistent 1 KiB messages to durable classic queues:
//! 1. **raw**: publish with confirms, 256 unconfirmed at most, one channel
//!    per queue, to one queue and to two queues at once (measured before and
//!    after the replays; the mean is the reference);
//! 2. **Redrive**: dead letters generated in SQL, precheck → plan (rate far
//!    above the machine, canary 1%, 1 s observation, every guard on: Redis
//!    bucket and replay keys, stale and state checks, leases, audit) →
//!    approve → completed, with 1 and 2 executor processes (the release
//!    binary), to one queue and to two queues.
//!
//! For each replay it prints the main wave's rate (its audit events' first to
//! last publish), approve → completed, each rate's ratio to the raw figure
//! for as many queues, CPU microseconds per message of PostgreSQL, RabbitMQ,
//! Redis, the planner (this process) and the executors (from `/proc`),
//! PostgreSQL rows and WAL written per message, and the executors' peak RSS.
//! Every replay checks that the plan sent every item and that the queues hold
//! exactly as many messages.

use std::time::{Duration, Instant};

use lapin::{options::QueuePurgeOptions, types::FieldTable};
use redrive_proto::v1;
use redrive_tests::{
    ExecutorProcess, REDIS_URL, TestBed,
    bench::{
        CpuSample, WriteSample, generate_dead_letters, peak_rss_of, raw_publish_rate,
        unthrottled_plan,
    },
    env_count, unique,
};

/// Unconfirmed publishes at most, raw and per executor slice (the
/// executor's default `--window`).
const IN_FLIGHT: usize = 256;

/// What one replay measured.
struct Figures {
    main_rate: f64,
    end_to_end_rate: f64,
}

async fn purge(bed: &TestBed, queues: &[String]) -> anyhow::Result<u64> {
    let mut total = 0;
    for queue in queues {
        total += u64::from(
            bed.broker()
                .channel
                .queue_purge(queue.as_str().into(), QueuePurgeOptions::default())
                .await?,
        );
    }
    Ok(total)
}

async fn replay(
    bed: &TestBed,
    pool: &sqlx::PgPool,
    source: &str,
    queues: &[String],
    executors: usize,
) -> anyhow::Result<Figures> {
    let mut client = bed.client.clone();
    let (plan, digest) = unthrottled_plan(&mut client, source, 1).await?;
    let mut processes = Vec::new();
    for index in 0..executors {
        let args: Vec<String> = [
            "--planner",
            &bed.planner.url(),
            "--amqp-url",
            redrive_tests::AMQP_URL,
            "--redis-url",
            REDIS_URL,
            "--redis-prefix",
            &bed.redis.prefix,
            "--executor-id",
            &format!("bench-{index}"),
            "--claim-wait-seconds",
            "1",
        ]
        .iter()
        .map(|arg| (*arg).to_owned())
        .collect();
        processes.push(ExecutorProcess::start_quiet(&args).await?);
    }
    let pids: Vec<u32> = processes.iter().filter_map(ExecutorProcess::id).collect();
    // Let the executors connect and start polling for slices, and the
    // statistics of earlier work settle.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let writes_before = WriteSample::now(pool).await?;
    let cpu_before = CpuSample::now(&pids);
    let started = Instant::now();
    client
        .approve_plan(v1::ApprovePlanRequest {
            plan_id: plan.plan_id.clone(),
            digest,
        })
        .await?;
    let total = loop {
        let current = client
            .get_plan(v1::GetPlanRequest {
                plan_id: plan.plan_id.clone(),
            })
            .await?
            .into_inner();
        if current.state() == v1::PlanState::Completed {
            let counts = current.counts.unwrap_or_default();
            anyhow::ensure!(
                counts.sent == current.total_items,
                "not all sent: {counts:?}"
            );
            break current.total_items;
        }
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(600),
            "replay did not finish in 10 minutes"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let seconds = started.elapsed().as_secs_f64();
    let cpu = CpuSample::now(&pids).micros_per_message(&cpu_before, total);
    let rss = pids.iter().map(|pid| peak_rss_of(*pid)).fold(0.0, f64::max);
    for process in &processes {
        process.signal("TERM").await?;
    }
    for mut process in processes {
        process.wait_exit(Duration::from_secs(30)).await?;
    }
    // Backends publish their statistics about once a second when idle.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let writes = WriteSample::now(pool)
        .await?
        .describe(&writes_before, total);
    let (main_items, main_seconds): (i64, f64) = sqlx::query_as(
        "SELECT count(*), coalesce(extract(epoch FROM max(at) - min(at))::float8, 0) \
         FROM audit_events WHERE plan_id = $1::uuid AND wave = 'main' AND action = 'sent'",
    )
    .bind(&plan.plan_id)
    .fetch_one(pool)
    .await?;
    let delivered = purge(bed, queues).await?;
    anyhow::ensure!(
        delivered == total,
        "{delivered} messages in the queues, {total} sent: lost or duplicated messages"
    );
    let figures = Figures {
        main_rate: main_items as f64 / main_seconds.max(1e-3),
        end_to_end_rate: total as f64 / seconds,
    };
    println!(
        "  {executors} executor(s), {} queue(s): main wave {:.0} msg/s; approve → completed {total} in {seconds:.2} s, {:.0} msg/s",
        queues.len(),
        figures.main_rate,
        figures.end_to_end_rate
    );
    println!(
        "    CPU µs per message: {}",
        cpu.iter()
            .map(|(group, micros)| format!("{group} {micros:.0}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!("{writes}");
    println!("    executor peak RSS {rss:.0} MiB");
    Ok(figures)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let messages = env_count("REDRIVE_BENCH_MESSAGES", 50_000);
    let count = u64::try_from(messages)?;
    let bed = TestBed::start(redrive_tests::Broker::connect().await?, |config| {
        config.lease_ttl_seconds = 30;
    })
    .await?;
    let one: Vec<String> = vec![unique("bench_tp_one")];
    let two: Vec<String> = vec![unique("bench_tp_two_a"), unique("bench_tp_two_b")];
    let raw_one = vec![unique("bench_raw_one")];
    let raw_two = vec![unique("bench_raw_two_a"), unique("bench_raw_two_b")];
    for queue in one.iter().chain(&two).chain(&raw_one).chain(&raw_two) {
        bed.broker().queue(queue, FieldTable::default()).await?;
    }
    let pool = bed.pool().await?;
    let names = |queues: &[String]| queues.to_vec();
    let runs: Vec<(String, Vec<String>, usize)> = vec![
        ("tp-one-1".into(), names(&one), 1),
        ("tp-one-2".into(), names(&one), 2),
        ("tp-two-1".into(), names(&two), 1),
        ("tp-two-2".into(), names(&two), 2),
    ];
    for (source, queues, _) in &runs {
        let queues: Vec<&str> = queues.iter().map(String::as_str).collect();
        generate_dead_letters(&pool, source, messages, &queues).await?;
    }
    sqlx::query("ANALYZE").execute(&pool).await?;
    // The executors' release binary, built before anything is timed.
    redrive_tests::scenario::build_binaries().await?;

    let raw = |queues: Vec<String>| async move {
        let rate = raw_publish_rate(&queues, count as usize, IN_FLIGHT).await?;
        anyhow::Ok((rate, queues))
    };
    let (raw_one_before, _) = raw(raw_one.clone()).await?;
    purge(&bed, &raw_one).await?;
    let (raw_two_before, _) = raw(raw_two.clone()).await?;
    purge(&bed, &raw_two).await?;
    println!(
        "raw publish + confirm, {IN_FLIGHT} in flight, {messages} × 1 KiB: one queue {raw_one_before:.0} msg/s, two queues {raw_two_before:.0} msg/s"
    );

    let mut results = Vec::new();
    for (source, queues, executors) in &runs {
        let figures = replay(&bed, &pool, source, queues, *executors).await?;
        results.push((queues.len(), *executors, figures));
    }

    let (raw_one_after, _) = raw(raw_one.clone()).await?;
    purge(&bed, &raw_one).await?;
    let (raw_two_after, _) = raw(raw_two.clone()).await?;
    purge(&bed, &raw_two).await?;
    println!(
        "raw again after the replays: one queue {raw_one_after:.0} msg/s, two queues {raw_two_after:.0} msg/s"
    );
    let reference = |queues: usize| {
        if queues == 1 {
            (raw_one_before + raw_one_after) / 2.0
        } else {
            (raw_two_before + raw_two_after) / 2.0
        }
    };
    println!("\n| run | main wave msg/s | × raw | approve → completed msg/s | × raw |");
    println!("|---|---|---|---|---|");
    println!("| raw, one queue | {:.0} | 1.00 | | |", reference(1));
    println!("| raw, two queues | {:.0} | 1.00 | | |", reference(2));
    for (queues, executors, figures) in &results {
        let raw = reference(*queues);
        println!(
            "| Redrive, {executors} executor(s), {queues} queue(s) | {:.0} | {:.2} | {:.0} | {:.2} |",
            figures.main_rate,
            figures.main_rate / raw,
            figures.end_to_end_rate,
            figures.end_to_end_rate / raw
        );
    }
    pool.close().await;
    bed.finish().await?;
    Ok(())
}
