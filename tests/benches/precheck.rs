//! Precheck benchmark: 100,000 dead letters with the example orders hook in
//! batches of 500, then 1,000,000 without a hook, each timed end to end through
//! `RunPrecheck` against a fresh PostgreSQL database. Reports the planner
//! process's peak resident memory (VmHWM) after each run.
//!
//! Run: `cargo bench -p redrive-tests --bench precheck`
//! (`REDRIVE_BENCH_HOOKED` and `REDRIVE_BENCH_UNHOOKED` change the sizes).
//! The dead letters are generated in SQL with the shape capture stores (JSON
//! bodies, 5% duplicate keys, the properties and headers of a message the
//! broker dead-lettered, `x-death` among them), since capture has its own
//! benchmark.

use std::time::Instant;

use redrive_proto::v1::{self, PrecheckOptions, RunPrecheckRequest};
use redrive_tests::{
    TestBed,
    bench::dead_lettered_properties_and_headers,
    env_count,
    orders_hook::{self, OrdersHook},
    peak_rss_mib,
};
use tokio_util::sync::CancellationToken;

async fn generate(
    pool: &sqlx::PgPool,
    source: &str,
    count: i64,
    body_padding: i32,
) -> anyhow::Result<()> {
    let distinct_keys = count - count / 20;
    let (properties, headers) =
        dead_lettered_properties_and_headers("orders.fulfil", "orders", "order.paid", "rejected");
    sqlx::query(redrive_tests::insert_dead_letters!(
        r#"
        SELECT $1, 'rabbitmq', now(), sha256(convert_to($1 || g, 'UTF8')), 'm-' || g,
            'o-' || (g % $3) || ':order.paid', b.body, length(b.body), sha256(b.body), false, 'none',
            $5, $6, 'application/json', 'rejected', 'orders.fulfil', 'orders',
            ARRAY['order.paid'], 1, now() - interval '10 minutes', 'rejected', 'orders.fulfil',
            'order.paid', '1', 'checkout', now() - interval '10 minutes', now() - interval '10 minutes', '{}'
        FROM generate_series(1, $2) g,
        LATERAL (SELECT convert_to('{"order_id":"o-' || (g % $3) || '","pad":"' || repeat('x', $4) || '"}', 'UTF8') AS body) b
        "#
    ),
    )
    .bind(source)
    .bind(count)
    .bind(distinct_keys)
    .bind(body_padding)
    .bind(properties)
    .bind(headers)
    .execute(pool)
    .await?;
    sqlx::query("ANALYZE dead_letters").execute(pool).await?;
    Ok(())
}

async fn time_precheck(bed: &TestBed, source: &str) -> anyhow::Result<(f64, v1::PrecheckReport)> {
    let mut client = bed.client.clone();
    let started = Instant::now();
    let report = client
        .run_precheck(RunPrecheckRequest {
            selector: Some(v1::Selector {
                sources: vec![source.to_owned()],
                ..Default::default()
            }),
            options: Some(PrecheckOptions {
                state_check_batch_size: 500,
                ..Default::default()
            }),
        })
        .await?
        .into_inner();
    Ok((started.elapsed().as_secs_f64(), report))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let hooked = env_count("REDRIVE_BENCH_HOOKED", 100_000);
    let unhooked = env_count("REDRIVE_BENCH_UNHOOKED", 1_000_000);
    let mut bed = TestBed::without_broker(|_| {}).await?;
    let pool = bed.pool().await?;
    OrdersHook::create_schema(&pool).await?;
    sqlx::query("INSERT INTO orders (order_id, status) SELECT 'o-' || g, 'CANCELLED' FROM generate_series(1, $1) g")
        .bind(hooked / 10)
        .execute(&pool)
        .await?;
    let started = Instant::now();
    generate(&pool, "bench-hooked", hooked, 980).await?;
    generate(&pool, "bench-unhooked", unhooked, 200).await?;
    println!(
        "generated {hooked} + {unhooked} dead letters in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    bed.planner.halt().await?;

    let hook_shutdown = CancellationToken::new();
    let hook_url = orders_hook::spawn(OrdersHook::new(pool.clone()), hook_shutdown.clone()).await?;
    bed.restart_planner(|config| {
        config.state_checks = vec![format!(
            "{}={hook_url}",
            std::env::var("REDRIVE_BENCH_ROUTE").unwrap_or_else(|_| "order.*".to_owned())
        )];
    })
    .await?;
    let (seconds, report) = time_precheck(&bed, "bench-hooked").await?;
    let counts = report.counts.unwrap_or_default();
    println!(
        "precheck of {} dead letters with the orders hook (batches of 500): {seconds:.2} s ({:.0}/s); \
         replayable {}, duplicate {}, blocked_by_state {}; peak RSS {:.0} MiB",
        report.total,
        report.total as f64 / seconds,
        counts.replayable,
        counts.duplicate,
        counts.blocked_by_state,
        peak_rss_mib()
    );
    bed.planner.halt().await?;
    hook_shutdown.cancel();

    bed.restart_planner(|_| {}).await?;
    let (seconds, report) = time_precheck(&bed, "bench-unhooked").await?;
    let counts = report.counts.unwrap_or_default();
    println!(
        "precheck of {} dead letters without a hook: {seconds:.2} s ({:.0}/s); replayable {}, duplicate {}; peak RSS {:.0} MiB",
        report.total,
        report.total as f64 / seconds,
        counts.replayable,
        counts.duplicate,
        peak_rss_mib()
    );
    pool.close().await;
    bed.finish().await
}
