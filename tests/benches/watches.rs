//! `GetPlan` latency with 2,000 `WatchPlan` streams open (issue 28, item 3:
//! a probe's 2,000 watchers took `GetPlan` p50 from 7 ms to 234 ms, every
//! stream reading the database on every change).
//!
//! One in-process planner, one plan in its canary wave, changing 20 times a
//! second (a `NOTIFY` on the plan channel every 50 ms, as executors'
//! reports cause). `GetPlan` is called `REDRIVE_BENCH_CALLS` times (default
//! 400), one after the other, first with no watcher (the reference, in the
//! same run), then with `REDRIVE_BENCH_WATCHERS` streams (default 2,000,
//! over 40 connections) watching that plan, each consumed. Prints p50 and
//! p95 of both, their ratios, the updates the watchers received and the
//! database reads the watches made (`redrive.planner.watch.reads`).
//!
//! Run: `cargo bench -p redrive-tests --bench watches`. The promise: p50
//! with the watchers within 2× of idle.

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use redrive_proto::v1::{self, planner_client::PlannerClient};
use redrive_tests::{Broker, TestBed, env_count};
use tokio::time::Instant;

#[path = "../tests/support/mod.rs"]
mod support;
use support::*;

/// p50 and p95 of `calls` sequential `GetPlan` calls, in ms.
async fn get_plan_latency(
    client: &mut PlannerClient<tonic::transport::Channel>,
    plan_id: &str,
    calls: usize,
) -> anyhow::Result<(f64, f64)> {
    let mut took = Vec::with_capacity(calls);
    for _ in 0..calls {
        let started = Instant::now();
        client
            .get_plan(v1::GetPlanRequest {
                plan_id: plan_id.to_owned(),
            })
            .await?;
        took.push(started.elapsed().as_secs_f64() * 1000.0);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    took.sort_by(f64::total_cmp);
    let at = |q: f64| took[((took.len() as f64 * q) as usize).min(took.len() - 1)];
    Ok((at(0.50), at(0.95)))
}

fn plan_reads(text: &str) -> f64 {
    metric_total(
        text,
        "redrive_planner_watch_reads_total",
        &[("redrive_watch_read", "plan")],
        &[],
    )
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let watchers = usize::try_from(env_count("REDRIVE_BENCH_WATCHERS", 2_000))?;
    let calls = usize::try_from(env_count("REDRIVE_BENCH_CALLS", 400))?;
    let broker = Broker::connect().await?;
    let incident = incident(&broker, 4).await?;
    let metrics = free_address().await?;
    let mut bed = TestBed::start(broker, |config| {
        capturing(config, &[&incident.dlq]);
        config.telemetry.metrics_listen = Some(metrics);
        // Every watcher comes from this one address: the caps are not
        // what is measured here.
        config.max_watches_per_principal = watchers + 10;
        config.max_watches = watchers + 10;
        config.reserved_watches = 1;
    })
    .await?;
    captured(&mut bed.client, &incident.dlq, 4).await?;
    let plan = approved_plan(&mut bed.client, &incident.dlq, 10.0, 1, None).await?;

    // The plan changes 20 times a second.
    let pool = bed.pool().await?;
    let changing = {
        let pool = pool.clone();
        let plan_id = plan.plan_id.clone();
        tokio::spawn(async move {
            loop {
                let _ = sqlx::query("SELECT pg_notify('redrive_plans', $1)")
                    .bind(&plan_id)
                    .execute(&pool)
                    .await;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };
    // Warm up, then the reference.
    get_plan_latency(&mut bed.client, &plan.plan_id, 50).await?;
    let (idle_p50, idle_p95) = get_plan_latency(&mut bed.client, &plan.plan_id, calls).await?;

    let connections = 40;
    let mut channels = Vec::new();
    for _ in 0..connections {
        channels.push(
            tonic::transport::Endpoint::from_shared(bed.planner.url())?
                .connect()
                .await?,
        );
    }
    let updates = Arc::new(AtomicU64::new(0));
    let mut consumers = Vec::new();
    for index in 0..watchers {
        let mut client = PlannerClient::new(channels[index % connections].clone());
        let mut stream = client
            .watch_plan(v1::WatchPlanRequest {
                plan_id: plan.plan_id.clone(),
                include_events: false,
            })
            .await?
            .into_inner();
        let updates = Arc::clone(&updates);
        consumers.push(tokio::spawn(async move {
            while let Ok(Some(_)) = stream.message().await {
                updates.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = scrape_metrics(metrics).await?;
    let updates_before = updates.load(Ordering::Relaxed);
    let started = Instant::now();
    let (loaded_p50, loaded_p95) = get_plan_latency(&mut bed.client, &plan.plan_id, calls).await?;
    let seconds = started.elapsed().as_secs_f64();
    let after = scrape_metrics(metrics).await?;
    let received = updates.load(Ordering::Relaxed) - updates_before;

    println!(
        "GetPlan, {calls} calls: idle p50 {idle_p50:.2} ms, p95 {idle_p95:.2} ms; with {watchers} \
         watchers p50 {loaded_p50:.2} ms, p95 {loaded_p95:.2} ms"
    );
    println!(
        "ratio with/idle: p50 {:.2}, p95 {:.2} (promise: p50 within 2.00)",
        loaded_p50 / idle_p50,
        loaded_p95 / idle_p95
    );
    println!(
        "during the {seconds:.1} s measured: watchers received {received} updates ({:.0}/s); \
         the watches read the database {:.1} times/s",
        received as f64 / seconds,
        (plan_reads(&after) - plan_reads(&before)) / seconds
    );
    changing.abort();
    for consumer in consumers {
        consumer.abort();
    }
    drop(channels);
    pool.close().await;
    bed.finish().await
}
