//! What sealing the audit log costs a replay (issue "A verifiable audit":
//! no measurable difference in replay throughput).
//!
//! Run: `cargo bench -p redrive-tests --bench sealing`
//! (`REDRIVE_BENCH_MESSAGES`, default 20,000 per replay;
//! `REDRIVE_BENCH_PAIRS`, default 3).
//!
//! Each pair replays the same number of 1 KiB dead letters (generated in
//! SQL; precheck → plan → approve → completed, one executor process, the
//! throughput benchmark's `measure_replay`) twice on one planner restarted
//! in between: once with the audit log sealing and signing (a key, a
//! checkpoint every 1,000 leaves or 10 s) and once with `--audit-log off`
//! (no queueing trigger work, no sequencer), the order alternating from
//! pair to pair. The raw publish-confirm rate to the same queue is measured
//! at the start of each pair, the reference of both. It prints each
//! replay's main-wave rate, its ratio to raw, the on/off ratio per pair
//! and their median, and how long after the plan completed the log had
//! sealed every event of it.

use std::time::{Duration, Instant};

use lapin::types::FieldTable;
use redrive_planner::config::AuditLogSettings;
use redrive_tests::{
    TestBed,
    bench::{IN_FLIGHT, generate_dead_letters, measure_replay, purge_queues, raw_publish_rate},
    env_count, unique,
};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let messages = env_count("REDRIVE_BENCH_MESSAGES", 20_000);
    let pairs = env_count("REDRIVE_BENCH_PAIRS", 3);
    let keys = tempfile::tempdir()?;
    let key_file = keys.path().join("audit.key");
    let signer = redrive_tlog::note::Signer::generate("bench.redrive/audit")?;
    std::fs::write(&key_file, signer.key_text())?;
    let sealing = |on: bool| AuditLogSettings {
        signing_key: Some(key_file.clone()),
        mode: if on { "on" } else { "off" }.into(),
        ..Default::default()
    };
    let mut bed = TestBed::start(redrive_tests::Broker::connect().await?, |config| {
        config.lease_ttl_seconds = 30;
        config.audit_log = sealing(true);
    })
    .await?;
    let queue = vec![unique("bench_seal")];
    let raw_queue = vec![unique("bench_seal_raw")];
    for name in queue.iter().chain(&raw_queue) {
        bed.broker().queue(name, FieldTable::default()).await?;
    }
    redrive_tests::scenario::Binaries::of_tests()?;
    let pool = bed.pool().await?;
    let mut ratios = Vec::new();
    println!(
        "| pair | raw msg/s | sealing on msg/s (× raw) | off msg/s (× raw) | on ÷ off | sealed after completion |"
    );
    println!("|---|---|---|---|---|---|");
    for pair in 0..pairs {
        let raw = raw_publish_rate(&raw_queue, usize::try_from(messages)?, IN_FLIGHT).await?;
        purge_queues(&bed, &raw_queue).await?;
        let order = if pair % 2 == 0 {
            [true, false]
        } else {
            [false, true]
        };
        let mut on_rate = 0.0;
        let mut off_rate = 0.0;
        let mut lag = Duration::ZERO;
        for on in order {
            let settings = sealing(on);
            bed.restart_planner(|config| {
                config.lease_ttl_seconds = 30;
                config.audit_log = settings;
            })
            .await?;
            let source = unique(if on { "seal-on" } else { "seal-off" });
            let targets: Vec<&str> = queue.iter().map(String::as_str).collect();
            generate_dead_letters(&pool, &source, messages, &targets).await?;
            sqlx::query("ANALYZE").execute(&pool).await?;
            let figures = measure_replay(&bed, &pool, &source, &queue, 1, &[]).await?;
            if on {
                on_rate = figures.main_rate;
                let completed = Instant::now();
                loop {
                    let pending: i64 = sqlx::query_scalar("SELECT count(*) FROM audit_log_pending")
                        .fetch_one(&pool)
                        .await?;
                    if pending == 0 {
                        break;
                    }
                    anyhow::ensure!(
                        completed.elapsed() < Duration::from_secs(300),
                        "{pending} rows still unsealed after 5 minutes"
                    );
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                lag = completed.elapsed();
            } else {
                off_rate = figures.main_rate;
            }
        }
        let ratio = on_rate / off_rate;
        ratios.push(ratio);
        println!(
            "| {} | {raw:.0} | {on_rate:.0} ({:.2}) | {off_rate:.0} ({:.2}) | {ratio:.2} | {:.1} s |",
            pair + 1,
            on_rate / raw,
            off_rate / raw,
            lag.as_secs_f64()
        );
    }
    ratios.sort_by(f64::total_cmp);
    println!(
        "\nmedian on ÷ off: {:.2} over {pairs} pairs (pairwise {:.2}–{:.2})",
        ratios[ratios.len() / 2],
        ratios.first().copied().unwrap_or_default(),
        ratios.last().copied().unwrap_or_default()
    );
    pool.close().await;
    bed.finish().await?;
    Ok(())
}
