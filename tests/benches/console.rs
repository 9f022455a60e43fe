//! The console's speed in a real headless Chromium (issue 30): with
//! `REDRIVE_BENCH_DEAD_LETTERS` dead letters stored (default 100,000),
//! how long the overview and the first page of dead letters take to render,
//! and how long after its report a live plan shows an audit event.
//!
//! - **Overview and first page**: from navigation to the rows on screen,
//!   `REDRIVE_BENCH_RUNS` times (default 5); the reference, measured in the
//!   same run, is the same RPCs called from Rust (what the page waits for).
//!   The promise: under 1 s each.
//! - **Live event**: a plan replays a RabbitMQ incident at 2 messages per
//!   second with the page open on it; a Rust `WatchPlan` stream (the
//!   reference) and the page's live count are watched side by side, and for
//!   each `sent` event the page's delay behind the stream is recorded
//!   (polled every 20 ms). The promise: the page within 1 s.
//! - **JavaScript shipped**: `console/dist/app.js` gzipped (level 9). The
//!   promise: under 300 KB.
//!
//! Run alone: `cargo bench -p redrive-tests --bench console`.

use std::{io::Write, time::Duration};

use redrive_proto::v1;
use redrive_tests::{Broker, ExecutorHandle, TestBed, bench, browser::Browser, env_count};
use tokio::time::Instant;

#[path = "../tests/support/mod.rs"]
mod support;
use support::*;

/// p50 and max of `samples`, ms.
fn summary(samples: &mut [f64]) -> (f64, f64) {
    samples.sort_by(f64::total_cmp);
    (samples[samples.len() / 2], samples[samples.len() - 1])
}

/// Milliseconds from opening `route` until `ready` holds on the page.
async fn render(
    browser: &Browser,
    url: &str,
    route: &str,
    id: &str,
    count: usize,
) -> anyhow::Result<f64> {
    browser.open(&format!("{url}/#/plans")).await?;
    browser.find("nav-overview").await?;
    let started = Instant::now();
    browser.open(&format!("{url}/#{route}")).await?;
    browser.at_least(id, count).await?;
    let took = started.elapsed().as_secs_f64() * 1000.0;
    if std::env::var("REDRIVE_BENCH_TRACE").is_ok() {
        let calls = browser
            .run(
                "arguments[0](performance.getEntriesByType('resource').slice(-6).map(e => [e.name.split('/').pop(), Math.round(e.startTime), Math.round(e.duration)]));",
                vec![],
            )
            .await?;
        println!("  {route}: {took:.0} ms; last calls [name, start, duration] {calls}");
    }
    Ok(took)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let dead_letters = env_count("REDRIVE_BENCH_DEAD_LETTERS", 100_000);
    let runs = usize::try_from(env_count("REDRIVE_BENCH_RUNS", 5))?;
    let broker = Broker::connect().await?;
    let incident = incident(&broker, 40).await?;
    let mut bed = TestBed::start(broker, |config| capturing(config, &[&incident.dlq])).await?;
    captured(&mut bed.client, &incident.dlq, 40).await?;
    let pool = bed.pool().await?;
    let backlog = format!("bench-backlog-{}", uuid::Uuid::new_v4().simple());
    bench::generate_dead_letters(&pool, &backlog, dead_letters, &["orders"]).await?;
    sqlx::query("ANALYZE dead_letters").execute(&pool).await?;
    let url = bed.planner.url();
    let browser = Browser::start().await?;
    browser.open(&url).await?;
    // Authentication is off: sign in with no token.
    browser.click("signin-submit").await?;
    browser.find("caller").await?;

    let (mut overview, mut overview_rpc, mut first_page, mut first_page_rpc) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut list_sources = Vec::new();
    for _ in 0..runs {
        overview.push(render(&browser, &url, "/", "group-row", 2).await?);
        let started = Instant::now();
        let sources = bed
            .client
            .list_sources(v1::ListSourcesRequest {})
            .await?
            .into_inner();
        list_sources.push(started.elapsed().as_secs_f64() * 1000.0);
        for source in &sources.sources {
            bed.client
                .summarize_dead_letters(v1::SummarizeDeadLettersRequest {
                    selector: Some(v1::Selector {
                        sources: vec![source.source.clone()],
                        ..Default::default()
                    }),
                    group_by: vec![
                        v1::SummaryDimension::Reason as i32,
                        v1::SummaryDimension::Producer as i32,
                        v1::SummaryDimension::SchemaVersion as i32,
                        v1::SummaryDimension::Error as i32,
                    ],
                })
                .await?;
        }
        overview_rpc.push(started.elapsed().as_secs_f64() * 1000.0);
        first_page.push(render(&browser, &url, "/dead-letters", "dl-row", 50).await?);
        let started = Instant::now();
        bed.client
            .list_dead_letters(v1::ListDeadLettersRequest {
                page_size: 50,
                ..Default::default()
            })
            .await?;
        bed.client
            .summarize_dead_letters(v1::SummarizeDeadLettersRequest::default())
            .await?;
        first_page_rpc.push(started.elapsed().as_secs_f64() * 1000.0);
    }

    // A live plan: the page against a Rust WatchPlan stream.
    let (_received, consuming) = consume(bed.broker(), &incident.work).await?;
    let plan = approved_plan(&mut bed.client, &incident.dlq, 2.0, 1, None).await?;
    browser
        .open(&format!("{url}/#/plans/{}", plan.plan_id))
        .await?;
    browser.find("rate-chart").await?;
    let mut watch = bed
        .client
        .watch_plan(v1::WatchPlanRequest {
            plan_id: plan.plan_id.clone(),
            include_events: true,
        })
        .await?
        .into_inner();
    let (seen_tx, mut seen_rx) = tokio::sync::mpsc::unbounded_channel::<Instant>();
    let watcher = tokio::spawn(async move {
        while let Ok(Some(update)) = watch.message().await {
            if let Some(v1::watch_plan_response::Update::Event(event)) = update.update
                && event.action() == v1::AuditAction::Sent
            {
                let _ = seen_tx.send(Instant::now());
            }
        }
    });
    let executor = ExecutorHandle::start(bed.executor_config());
    let mut streamed: Vec<Instant> = Vec::new();
    let mut delays = Vec::new();
    let mut shown = 0_usize;
    let deadline = Instant::now() + Duration::from_secs(60);
    while shown < 30 && Instant::now() < deadline {
        while let Ok(at) = seen_rx.try_recv() {
            streamed.push(at);
        }
        let chart = browser.find("rate-chart").await?;
        let now_shown: usize = chart
            .attr("data-sent-total")
            .await?
            .unwrap_or_default()
            .parse()
            .unwrap_or(0);
        let now = Instant::now();
        while shown < now_shown {
            shown += 1;
            if let Some(at) = streamed.get(shown - 1) {
                delays.push(now.saturating_duration_since(*at).as_secs_f64() * 1000.0);
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    anyhow::ensure!(!delays.is_empty(), "the page showed no event");
    executor.stop().await?;
    watcher.abort();
    stop_consuming(consuming)?;

    let js = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../console/dist/app.js"
    ))?;
    let mut gzip = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    gzip.write_all(&js)?;
    let gzipped = gzip.finish()?.len();

    let (overview_p50, overview_max) = summary(&mut overview);
    let (overview_rpc_p50, _) = summary(&mut overview_rpc);
    let (list_sources_p50, _) = summary(&mut list_sources);
    let (page_p50, page_max) = summary(&mut first_page);
    let (page_rpc_p50, _) = summary(&mut first_page_rpc);
    let (delay_p50, delay_max) = summary(&mut delays);
    println!("console with {dead_letters} dead letters stored, {runs} runs:");
    println!(
        "  overview rendered: p50 {overview_p50:.0} ms, max {overview_max:.0} ms (its RPCs from Rust: p50 {overview_rpc_p50:.0} ms, ListSources {list_sources_p50:.0} ms of it; ratio {:.1}x)",
        overview_p50 / overview_rpc_p50
    );
    println!(
        "  first page of dead letters rendered: p50 {page_p50:.0} ms, max {page_max:.0} ms (its RPCs from Rust: p50 {page_rpc_p50:.0} ms; ratio {:.1}x)",
        page_p50 / page_rpc_p50
    );
    println!(
        "  live plan: {} sent events, the page behind a Rust WatchPlan stream by p50 {delay_p50:.0} ms, max {delay_max:.0} ms",
        delays.len()
    );
    println!(
        "  JavaScript shipped: {} bytes, {gzipped} gzipped (limit 300 KB)",
        js.len()
    );
    browser.close().await?;
    pool.close().await;
    bed.finish().await
}
