//! Capture benchmark: a backlog of 1 KiB dead letters, made by the broker itself
//! (TTL 0 on a work queue with a dead-letter exchange), captured from the DLQ
//! into a fresh PostgreSQL database by an in-process planner.
//!
//! Run: `cargo bench -p redrive-tests --bench capture` (`REDRIVE_BENCH_MESSAGES`
//! sets the backlog, default 100000). Prints the capture rate in dead letters
//! per second, from the planner's start until every dead letter is stored and
//! the DLQ is empty (asking the broker until the DLQ is drained, and only
//! then counting rows, so that the waiting does not load PostgreSQL), and, in the same run, the broker's raw limit: an equal
//! backlog consumed by a bare lapin consumer (same prefetch, one
//! `basic.ack(multiple)` per batch, nothing stored), with the ratio of the
//! two (the broker's speed varies 2× between days; the ratio holds).

use std::time::{Duration, Instant};

use redrive_tests::{
    Broker, TestBed,
    bench::{dead_letter_backlog, raw_consume, wait_captured},
};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let messages: u32 = std::env::var("REDRIVE_BENCH_MESSAGES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    let broker = Broker::connect().await?;
    let dlq = dead_letter_backlog(&broker, messages).await?;
    let unguarded_dlq = dead_letter_backlog(&broker, messages).await?;
    let raw_dlq = dead_letter_backlog(&broker, messages).await?;
    let (raw_seconds, raw_rate) = raw_consume(&broker, &raw_dlq, messages).await?;
    println!("raw limit: a bare consumer took {messages} in {raw_seconds:.2} s: {raw_rate:.0}/s");
    let unguarded = capture(&broker, &unguarded_dlq, messages, false).await?;
    println!(
        "without the capture guard: {unguarded:.0} dead letters/s; {:.2}× the raw limit",
        unguarded / raw_rate
    );
    let guarded = capture(&broker, &dlq, messages, true).await?;
    println!(
        "with the capture guard (as in service): {guarded:.0} dead letters/s; {:.2}× the raw limit, {:.2}× unguarded",
        guarded / raw_rate,
        guarded / unguarded
    );
    broker.cleanup().await;
    Ok(())
}

/// Captures the backlog in `dlq` into a database of its own with a planner
/// in process; dead letters per second.
async fn capture(broker: &Broker, dlq: &str, messages: u32, guard: bool) -> anyhow::Result<f64> {
    // Create the database and schema before timing.
    let mut bed = TestBed::without_broker(|_| {}).await?;
    bed.planner.halt().await?;
    let pool = bed.pool().await?;

    let started = Instant::now();
    bed.restart_planner(|config| {
        config.capture_queues = vec![dlq.to_owned()];
        config.capture_guard = guard;
        config.message_keys = vec!["json:/order_id".to_owned()];
    })
    .await?;
    wait_captured(
        broker,
        &pool,
        dlq,
        i64::from(messages),
        Duration::from_secs(600),
    )
    .await?;
    let elapsed = started.elapsed();
    bed.planner.halt().await?;
    let left = broker.ready_count(dlq).await?;
    let stored: i64 = sqlx::query_scalar("SELECT count(*) FROM dead_letters")
        .fetch_one(&pool)
        .await?;
    let rate = stored as f64 / elapsed.as_secs_f64();
    println!(
        "captured {stored} dead letters in {:.2} s: {rate:.0} dead letters/s ({left} left in the DLQ)",
        elapsed.as_secs_f64(),
    );
    pool.close().await;
    bed.finish().await?;
    anyhow::ensure!(
        stored == i64::from(messages) && left == 0,
        "capture lost or duplicated dead letters"
    );
    Ok(rate)
}
