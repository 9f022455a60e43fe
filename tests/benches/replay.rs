//! Replay benchmark: 100,000 1 KiB dead letters replayed end to end (precheck →
//! plan → approve → executors claim, publish with confirms, report → plan
//! completed) with one executor, then another 100,000 with two executors, side
//! by side with a naive loop that publishes and awaits each confirm in turn.
//! The rate is set far above what the machine can do; Redis holds the bucket.
//!
//! Run: `cargo bench -p redrive-tests --bench replay`
//! (`REDRIVE_BENCH_MESSAGES` sets the count per run, `REDRIVE_BENCH_NAIVE` the
//! naive loop's, default 10,000: at ~1,000 msg/s it would take minutes more).
//! The dead letters are generated in SQL with the shape capture stores, bound
//! for two queues alternately (one queue's ceiling on this machine is ~7,000
//! msg/s, docs/benchmarks.md). Reports the process's peak RSS, which holds the
//! planner and the executors together: an upper bound for one executor.

use std::time::{Duration, Instant};

use lapin::types::FieldTable;
use redrive_tests::{
    Broker, ExecutorHandle, TestBed,
    bench::{approve, generate_dead_letters, raw_publish_rate, unthrottled_plan, wait_all_sent},
    env_count, peak_rss_mib, unique,
};

async fn replay(bed: &TestBed, source: &str, executors: usize) -> anyhow::Result<f64> {
    let mut client = bed.client.clone();
    let (plan, digest) = unthrottled_plan(&mut client, source, 0).await?;
    let mut config = bed.executor_config();
    config.claim_wait_seconds = 1;
    let started = Instant::now();
    approve(&mut client, &plan.plan_id, digest).await?;
    let handles: Vec<ExecutorHandle> = (0..executors)
        .map(|_| ExecutorHandle::start(config.clone()))
        .collect();
    wait_all_sent(
        &mut client,
        &plan.plan_id,
        started,
        Duration::from_millis(50),
    )
    .await?;
    let seconds = started.elapsed().as_secs_f64();
    for handle in handles {
        handle.stop().await?;
    }
    Ok(seconds)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let messages = env_count("REDRIVE_BENCH_MESSAGES", 100_000);
    let naive_messages = env_count("REDRIVE_BENCH_NAIVE", 10_000);
    let broker = Broker::connect().await?;
    let queues: Vec<String> = (0..4).map(|_| unique("bench_replay")).collect();
    for queue in &queues {
        broker.queue(queue, FieldTable::default()).await?;
    }
    let mut bed = TestBed::start(broker, |_| {}).await?;
    let pool = bed.pool().await?;
    generate_dead_letters(&pool, "bench-one", messages, &[&queues[0], &queues[1]]).await?;
    generate_dead_letters(&pool, "bench-two", messages, &[&queues[2], &queues[3]]).await?;
    sqlx::query("ANALYZE dead_letters").execute(&pool).await?;
    bed.planner.halt().await?;

    // The naive loop: publish, await the confirm, next (the raw limit with
    // one message in flight).
    let broker = bed.broker();
    let naive_queue = unique("bench_naive");
    broker.queue(&naive_queue, FieldTable::default()).await?;
    let naive = raw_publish_rate(&[naive_queue], usize::try_from(naive_messages)?, 1).await?;
    println!(
        "naive loop (publish, await confirm, next): {naive_messages} messages, {naive:.0} msg/s"
    );

    bed.restart_planner(|config| config.lease_ttl_seconds = 30)
        .await?;
    let one = replay(&bed, "bench-one", 1).await?;
    println!(
        "one executor: {messages} dead letters replayed end to end in {one:.2} s: {:.0} msg/s; peak RSS {:.0} MiB",
        messages as f64 / one,
        peak_rss_mib()
    );
    let two = replay(&bed, "bench-two", 2).await?;
    println!(
        "two executors: {messages} dead letters replayed end to end in {two:.2} s: {:.0} msg/s; peak RSS {:.0} MiB",
        messages as f64 / two,
        peak_rss_mib()
    );
    let delivered: u32 = {
        let mut total = 0;
        for queue in &queues {
            total += bed.broker().ready_count(queue).await?;
        }
        total
    };
    println!(
        "delivered {delivered} messages in all (expected {})",
        2 * messages
    );
    pool.close().await;
    bed.finish().await?;
    anyhow::ensure!(
        i64::from(delivered) == 2 * messages,
        "lost or duplicated messages"
    );
    Ok(())
}
