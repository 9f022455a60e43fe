//! Throughput benchmark (issue "Throughput"): guarded replay side by side
//! with the broker's own publish-confirm limit, measured in the same run.
//!
//! Run: `cargo bench -p redrive-tests --bench throughput`
//! (`REDRIVE_BENCH_MESSAGES` sets the messages per run, default 50,000;
//! `REDRIVE_BENCH_AUDIT_LOG=off` runs the planner without sealing;
//! `REDRIVE_BENCH_PASSES=2` runs the four replays twice, the second pass in
//! the reverse order, and reports each figure as the mean of its passes, so
//! that what grows during a run (the database, the broker's files) weighs
//! on every replay alike).
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
//!
//! **Pinned** (issue "Scale"): `scripts/bench-pinned.sh throughput` runs it
//! with RabbitMQ on CPU 0 and PostgreSQL, Redis, this process and the
//! executors on CPU 1, as production gives the broker hosts of its own, and
//! restores the affinities afterwards. The run prints the CPUs each group
//! was allowed at its start and end, and checks the Scale targets: main
//! wave ≥ 0.9× raw and approve → completed ≥ 0.8× (one queue, 1 and 2
//! executors), planner + PostgreSQL ≤ 60 µs and executors ≤ 40 µs of CPU
//! per message, and a second executor never slower than one. For each
//! replay it also prints what 0.9× raw leaves the stack's one core a
//! message (1 / (0.9 × raw) seconds) against what the stack spent.

use lapin::types::FieldTable;
use redrive_tests::{
    TestBed,
    bench::{
        IN_FLIGHT, OBSERVE_SECONDS, ReplayFigures, affinities, generate_dead_letters,
        measure_replay, purge_queues, raw_publish_rate,
    },
    env_count, unique,
};

/// The mean of several passes' figures (the largest executor RSS).
fn mean_figures(passes: &[&ReplayFigures]) -> ReplayFigures {
    let n = passes.len().max(1) as f64;
    let mean = |value: &dyn Fn(&ReplayFigures) -> f64| {
        passes.iter().map(|figures| value(figures)).sum::<f64>() / n
    };
    let mut cpu = std::collections::BTreeMap::new();
    for figures in passes {
        for (group, micros) in &figures.cpu {
            *cpu.entry(group.clone()).or_insert(0.0) += micros / n;
        }
    }
    ReplayFigures {
        main_rate: mean(&|figures| figures.main_rate),
        end_to_end_rate: mean(&|figures| figures.end_to_end_rate),
        end_to_end_less_window_rate: mean(&|figures| figures.end_to_end_less_window_rate),
        cpu,
        executor_rss: passes
            .iter()
            .map(|figures| figures.executor_rss)
            .fold(0.0, f64::max),
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let messages = env_count("REDRIVE_BENCH_MESSAGES", 50_000);
    let count = u64::try_from(messages)?;
    let pinned = std::env::var("REDRIVE_BENCH_PINNED").is_ok();
    println!(
        "CPU affinity at the start ({}): {}",
        std::env::var("REDRIVE_BENCH_PINNED").map_or_else(
            |_| "not pinned".to_owned(),
            |pins| format!("pinned, {pins}")
        ),
        affinities()
    );
    let bed = TestBed::start(redrive_tests::Broker::connect().await?, |config| {
        config.lease_ttl_seconds = 30;
        // `REDRIVE_BENCH_AUDIT_LOG=off`: the planner with `--audit-log off`
        // (no sealing), to tell the log's cost from the rest.
        if let Ok(mode) = std::env::var("REDRIVE_BENCH_AUDIT_LOG") {
            config.audit_log.mode = mode;
        }
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
    let passes = env_count("REDRIVE_BENCH_PASSES", 1).clamp(1, 4);
    let configurations: Vec<(&str, Vec<String>, usize)> = vec![
        ("tp-one-1", names(&one), 1),
        ("tp-one-2", names(&one), 2),
        ("tp-two-1", names(&two), 1),
        ("tp-two-2", names(&two), 2),
    ];
    // Each pass its own dead letters (a replayed key would be skipped the
    // second time); every other pass in the reverse order.
    let mut runs: Vec<(String, Vec<String>, usize)> = Vec::new();
    for pass in 0..passes {
        let mut order: Vec<_> = configurations.iter().collect();
        if pass % 2 == 1 {
            order.reverse();
        }
        runs.extend(order.into_iter().map(|(name, queues, executors)| {
            (format!("{name}-p{pass}"), queues.clone(), *executors)
        }));
    }
    println!(
        "{passes} pass(es) of the four replays: {}",
        runs.iter()
            .map(|(source, _, _)| source.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    );
    for (source, queues, _) in &runs {
        let queues: Vec<&str> = queues.iter().map(String::as_str).collect();
        generate_dead_letters(&pool, source, messages, &queues).await?;
    }
    sqlx::query("ANALYZE").execute(&pool).await?;
    // The executors' release binary (cargo builds this package's binaries
    // before its benchmarks), found before anything is timed.
    redrive_tests::scenario::Binaries::of_tests()?;

    let raw = |queues: Vec<String>| async move {
        let rate = raw_publish_rate(&queues, count as usize, IN_FLIGHT).await?;
        anyhow::Ok((rate, queues))
    };
    let (raw_one_before, _) = raw(raw_one.clone()).await?;
    purge_queues(&bed, &raw_one).await?;
    let (raw_two_before, _) = raw(raw_two.clone()).await?;
    purge_queues(&bed, &raw_two).await?;
    println!(
        "raw publish + confirm, {IN_FLIGHT} in flight, {messages} × 1 KiB: one queue {raw_one_before:.0} msg/s, two queues {raw_two_before:.0} msg/s"
    );

    let mut measured = Vec::new();
    for (source, queues, executors) in &runs {
        let figures = measure_replay(&bed, &pool, source, queues, *executors, &[]).await?;
        measured.push((queues.len(), *executors, figures));
    }
    // One row per configuration: the mean of its passes.
    let results: Vec<(usize, usize, ReplayFigures)> = configurations
        .iter()
        .map(|(_, queues, executors)| {
            let of: Vec<&ReplayFigures> = measured
                .iter()
                .filter(|(q, e, _)| *q == queues.len() && e == executors)
                .map(|(_, _, figures)| figures)
                .collect();
            (queues.len(), *executors, mean_figures(&of))
        })
        .collect();
    if passes > 1 {
        for (queues, executors, _) in &results {
            let rates: Vec<String> = measured
                .iter()
                .filter(|(q, e, _)| q == queues && e == executors)
                .map(|(_, _, figures)| format!("{:.0}", figures.main_rate))
                .collect();
            println!(
                "  {executors} executor(s), {queues} queue(s): main wave by pass {} msg/s",
                rates.join(", ")
            );
        }
    }

    let (raw_one_after, _) = raw(raw_one.clone()).await?;
    purge_queues(&bed, &raw_one).await?;
    let (raw_two_after, _) = raw(raw_two.clone()).await?;
    purge_queues(&bed, &raw_two).await?;
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
    println!("CPU affinity at the end: {}", affinities());
    println!(
        "\n| run | main wave msg/s | × raw | approve → completed msg/s | × raw | CPU µs/msg: PostgreSQL / planner / executors / Redis / RabbitMQ | executor peak RSS MiB |"
    );
    println!("|---|---|---|---|---|---|---|");
    println!("| raw, one queue | {:.0} | 1.00 | | | | |", reference(1));
    println!("| raw, two queues | {:.0} | 1.00 | | | | |", reference(2));
    let micros = |figures: &redrive_tests::bench::ReplayFigures, group: &str| {
        figures.cpu.get(group).copied().unwrap_or_default()
    };
    for (queues, executors, figures) in &results {
        let raw = reference(*queues);
        println!(
            "| Redrive, {executors} executor(s), {queues} queue(s) | {:.0} | {:.2} | {:.0} | {:.2} | {:.0} / {:.0} / {:.0} / {:.0} / {:.0} | {:.0} |",
            figures.main_rate,
            figures.main_rate / raw,
            figures.end_to_end_rate,
            figures.end_to_end_rate / raw,
            micros(figures, "postgresql"),
            micros(figures, "planner"),
            micros(figures, "executor"),
            micros(figures, "redis"),
            micros(figures, "rabbitmq"),
            figures.executor_rss,
        );
    }
    // The Scale issue's targets, judged on this run's figures.
    let verdict = |met: bool| if met { "met" } else { "NOT met" };
    println!("\ntargets (issue \"Scale\"), this run:");
    for (queues, executors, figures) in &results {
        let raw = reference(*queues);
        let central = micros(figures, "planner") + micros(figures, "postgresql");
        let executor = micros(figures, "executor");
        println!(
            "  {executors} executor(s), {queues} queue(s): main wave {:.2}× raw (≥ 0.90: {}); approve → completed {:.2}× (≥ 0.80: {}), {:.2}× less the {OBSERVE_SECONDS} s observation window; planner + PostgreSQL {central:.0} µs/msg (≤ 60: {}); executors {executor:.0} µs/msg (≤ 40: {})",
            figures.main_rate / raw,
            verdict(figures.main_rate / raw >= 0.9),
            figures.end_to_end_rate / raw,
            verdict(figures.end_to_end_rate / raw >= 0.8),
            figures.end_to_end_less_window_rate / raw,
            verdict(central <= 60.0),
            verdict(executor <= 40.0),
        );
        // Pinned, everything but the broker shares one core: at 0.9× raw
        // it has 1 / (0.9 × raw) of a second a message for all of it
        // (docs/benchmarks.md, "12-06, evening").
        if pinned {
            let budget = 1e6 / (0.9 * raw);
            let beside = executor + micros(figures, "redis") + micros(figures, "planner");
            println!(
                "    0.9× raw leaves the stack's core {budget:.0} µs/msg; it spent {:.0}: executors + Redis + planner {beside:.0}, PostgreSQL {:.0}",
                beside + micros(figures, "postgresql"),
                micros(figures, "postgresql"),
            );
        }
    }
    for queues in [1, 2] {
        let rate = |executors: usize| {
            results
                .iter()
                .find(|(q, e, _)| *q == queues && *e == executors)
                .map_or(0.0, |(_, _, figures)| figures.main_rate)
        };
        println!(
            "  {queues} queue(s): 2 executors ÷ 1 executor {:.2} (never slower, ≥ 1.00 within noise: {})",
            rate(2) / rate(1),
            verdict(rate(2) >= rate(1) * 0.95)
        );
    }
    pool.close().await;
    bed.finish().await?;
    Ok(())
}
