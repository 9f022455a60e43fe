//! Stop latency: how long after a cancel (or pause) returns the last replayed
//! message reaches the consumer. Each round makes a small incident, replays it
//! with one in-process executor, cancels (even rounds) or pauses (odd rounds)
//! once publishing is under way, and measures the time to the last delivery
//! of that plan from the moment the call was sent and from the moment it
//! returned (0 when everything arrived before it returned); then p50, p99 and
//! the maximum over all rounds, at a paced rate (200/s) and at full speed.
//!
//! Run: `cargo bench -p redrive-tests --bench stop`
//! (`REDRIVE_BENCH_ROUNDS` rounds per rate, default 10). The promise it
//! measures (DESIGN "Executor loop and guarantees"): within 1 s at p99.

use std::time::Duration;

use redrive_proto::v1::{self, PlanState};
use redrive_tests::{Broker, ExecutorHandle, env_count};
use tokio::time::Instant;

#[path = "../tests/support/mod.rs"]
mod support;
use support::*;

/// One round: the time from the stop call's return to the last delivery.
async fn round(per_second: f64, burst: u32, items: u32, cancel: bool) -> anyhow::Result<Latency> {
    let broker = Broker::connect().await?;
    let incident = incident(&broker, items).await?;
    let mut bed = bed(broker, &[&incident.dlq], u64::from(items)).await?;
    let (received, consuming) = consume(bed.broker(), &incident.work).await?;
    let plan = approved_plan(&mut bed.client, &incident.dlq, per_second, burst, None).await?;
    let executor = ExecutorHandle::start(bed.executor_config());
    let started = received.clone();
    redrive_tests::wait_until("publishing", Duration::from_secs(30), move || {
        let started = started.clone();
        async move { Ok(started.lock().unwrap().len() >= (items / 10) as usize) }
    })
    .await?;
    let request = v1::PlanControlRequest {
        plan_id: plan.plan_id.clone(),
        reason: "stop latency benchmark".into(),
        ..Default::default()
    };
    let called_at = Instant::now();
    let state = if cancel {
        bed.client.cancel_plan(request).await?.into_inner().state()
    } else {
        bed.client.pause_plan(request).await?.into_inner().state()
    };
    let returned_at = Instant::now();
    anyhow::ensure!(
        matches!(state, PlanState::Cancelled | PlanState::Paused),
        "{state:?}"
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    anyhow::ensure!(!consuming.is_finished(), "the consumer stopped");
    let last = received
        .lock()
        .unwrap()
        .iter()
        .map(|delivery| delivery.at)
        .max()
        .unwrap_or(called_at);
    executor.stop().await?;
    consuming.abort();
    let received = received.lock().unwrap().clone();
    let pool = bed.pool().await?;
    assert_received_within_audit(&pool, &plan.plan_id, &received).await?;
    pool.close().await;
    bed.finish().await?;
    Ok(Latency {
        from_call: last.saturating_duration_since(called_at),
        from_return: last.saturating_duration_since(returned_at),
    })
}

/// The last delivery after the stop: from when the call was sent (the
/// pessimistic figure) and from when it returned (the promise's).
struct Latency {
    from_call: Duration,
    from_return: Duration,
}

fn percentile(sorted: &[Duration], fraction: f64) -> Duration {
    let index = ((sorted.len() as f64 * fraction).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[index]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() -> anyhow::Result<()> {
    let rounds = env_count("REDRIVE_BENCH_ROUNDS", 10).max(1) as usize;
    for (label, per_second, burst, items) in [
        ("200 msg/s, burst 20", 200.0, 20, 1_000),
        ("full speed (100,000/s)", 100_000.0, 1_000, 20_000),
    ] {
        let mut from_call = Vec::with_capacity(rounds);
        let mut from_return = Vec::with_capacity(rounds);
        for index in 0..rounds {
            let latency = round(per_second, burst, items, index % 2 == 0).await?;
            from_call.push(latency.from_call);
            from_return.push(latency.from_return);
        }
        for (what, latencies) in [
            ("the call was sent", &mut from_call),
            ("the call returned", &mut from_return),
        ] {
            latencies.sort();
            println!(
                "stop latency at {label}, {rounds} rounds (cancel and pause), last delivery after {what}: p50 {:?}, p99 {:?}, max {:?}",
                percentile(latencies, 0.5),
                percentile(latencies, 0.99),
                latencies[latencies.len() - 1]
            );
        }
    }
    Ok(())
}
