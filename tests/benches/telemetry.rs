//! Telemetry cost benchmark (issue "Observability"): the same guarded
//! replay with tracing and metrics on (the default sampler,
//! `parentbased_always_on`: a span per published message) against off,
//! measured pair by pair in one run.
//!
//! Run: `cargo bench -p redrive-tests --bench telemetry`
//! (`REDRIVE_BENCH_MESSAGES`: messages per replay, default 30,000;
//! `REDRIVE_BENCH_PAIRS`: off/on pairs, default 3).
//!
//! - **off**: the executor (release binary) without `--otlp-endpoint` and
//!   `--metrics-listen`; the planner (in this process) exports no spans and
//!   has no metrics endpoint.
//! - **on**: the executor exports its spans over OTLP/gRPC to a receiver in
//!   this process and serves `/metrics`; the planner exports its spans to the
//!   same receiver and serves `/metrics`.
//!
//! Each pair runs the two in turn (the order alternates between pairs, so a
//! drift of the machine's speed does not favour one side), one executor to
//! one durable queue, 1 KiB persistent messages, every guard on. It prints
//! each replay's main-wave rate, the on/off ratio of each pair, their median
//! and the cost (1 − median). The goal is a cost under 5%.

use std::sync::{
    Arc,
    atomic::{AtomicBool, Ordering},
};

use lapin::types::FieldTable;
use redrive_tests::{
    TestBed,
    bench::{generate_dead_letters, measure_replay},
    env_count,
    otlp::OtlpReceiver,
    unique,
};
use tracing_subscriber::{Layer as _, layer::SubscriberExt as _, util::SubscriberInitExt as _};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let messages = env_count("REDRIVE_BENCH_MESSAGES", 30_000);
    let pairs = env_count("REDRIVE_BENCH_PAIRS", 3);
    let receiver = OtlpReceiver::start().await?;

    // The planner runs in this process: its spans go through a layer that
    // a switch turns on for the "on" replays only.
    let exporting = Arc::new(AtomicBool::new(false));
    let provider =
        redrive_proto::telemetry::tracer_provider("redrive-planner", &receiver.endpoint)?;
    let switch = Arc::clone(&exporting);
    tracing_subscriber::registry()
        .with(
            redrive_proto::telemetry::tracing_layer(&provider, "redrive-planner").with_filter(
                tracing_subscriber::filter::filter_fn(move |metadata| {
                    switch.load(Ordering::Relaxed) && *metadata.level() <= tracing::Level::INFO
                }),
            ),
        )
        .init();

    let metrics_listen = {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        listener.local_addr()?
    };
    let off_bed = TestBed::start(redrive_tests::Broker::connect().await?, |config| {
        config.lease_ttl_seconds = 30;
    })
    .await?;
    let on_bed = TestBed::start(redrive_tests::Broker::connect().await?, |config| {
        config.lease_ttl_seconds = 30;
        config.telemetry.metrics_listen = Some(metrics_listen);
    })
    .await?;
    let queue = vec![unique("bench_telemetry")];
    off_bed
        .broker()
        .queue(&queue[0], FieldTable::default())
        .await?;
    let off_pool = off_bed.pool().await?;
    let on_pool = on_bed.pool().await?;
    for pair in 0..pairs {
        generate_dead_letters(&off_pool, &format!("tm-off-{pair}"), messages, &[&queue[0]]).await?;
        generate_dead_letters(&on_pool, &format!("tm-on-{pair}"), messages, &[&queue[0]]).await?;
    }
    sqlx::query("ANALYZE").execute(&off_pool).await?;
    sqlx::query("ANALYZE").execute(&on_pool).await?;
    // The executors' release binary (cargo builds this package's binaries
    // before its benchmarks), found before anything is timed.
    redrive_tests::scenario::Binaries::of_tests()?;

    let on_args = vec![
        "--otlp-endpoint".to_owned(),
        receiver.endpoint.clone(),
        "--metrics-listen".to_owned(),
        "127.0.0.1:0".to_owned(),
    ];
    println!(
        "telemetry cost: {pairs} pair(s) of replays of {messages} × 1 KiB, one executor, one queue"
    );
    let mut ratios = Vec::new();
    for pair in 0..pairs {
        let mut off = None;
        let mut on = None;
        let order = if pair % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        };
        for telemetry in order {
            println!(" telemetry {}:", if telemetry { "on" } else { "off" });
            exporting.store(telemetry, Ordering::Relaxed);
            let figures = if telemetry {
                measure_replay(
                    &on_bed,
                    &on_pool,
                    &format!("tm-on-{pair}"),
                    &queue,
                    1,
                    &on_args,
                )
                .await?
            } else {
                measure_replay(
                    &off_bed,
                    &off_pool,
                    &format!("tm-off-{pair}"),
                    &queue,
                    1,
                    &[],
                )
                .await?
            };
            exporting.store(false, Ordering::Relaxed);
            if telemetry {
                on = Some(figures.main_rate);
            } else {
                off = Some(figures.main_rate);
            }
        }
        if let (Some(off), Some(on)) = (off, on) {
            println!("  pair {pair}: on/off {:.3}", on / off);
            ratios.push(on / off);
        }
    }
    let flushing = provider.clone();
    tokio::task::spawn_blocking(move || flushing.force_flush()).await??;
    ratios.sort_by(f64::total_cmp);
    let middle = ratios.len() / 2;
    let median = match ratios.len() {
        0 => f64::NAN,
        count if count % 2 == 0 => (ratios[middle - 1] + ratios[middle]) / 2.0,
        _ => ratios[middle],
    };
    let spans = receiver.spans();
    let publish_spans = spans
        .iter()
        .filter(|span| span.name.starts_with("publish "))
        .count();
    println!(
        "\nmain wave, telemetry on / off, median of {} pairs: {median:.3} (cost {:.1}%); ratios {ratios:.3?}",
        ratios.len(),
        (1.0 - median) * 100.0
    );
    println!(
        "spans received: {} ({publish_spans} publish spans for {} messages replayed with telemetry on)",
        spans.len(),
        messages * pairs
    );
    off_pool.close().await;
    on_pool.close().await;
    off_bed.finish().await?;
    on_bed.finish().await?;
    Ok(())
}
