//! An executor and the planner's capture given several broker addresses
//! (`--amqp-url` with two node URLs, here two paths to the local broker): the
//! path each uses is cut mid-work and it fails over to the other
//! (docs/operating.md, "Several broker addresses").

use std::{collections::HashSet, time::Duration};

use lapin::{BasicProperties, types::FieldTable};
use redrive_tests::{
    Broker, ExecutorHandle, TcpProxy, TestBed, init_logging, stored_total, unique,
};
use tokio::time::Instant;

mod support;
use support::*;

/// Two proxies to the local broker as two node URLs; the one the executor
/// connected to (the first: nothing has failed yet) is cut for good after
/// 150 deliveries at 100/s, burst 10. The executor reconnects to the other:
/// the plan completes, every delivery is `sent` or `uncertain` in the audit,
/// every `sent` item arrived, every item is sent in the end, and no second
/// holds more than rate + burst (one bucket across the failover).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_executor_fails_over_to_the_next_broker_address_mid_replay() -> anyhow::Result<()> {
    init_logging();
    let broker = Broker::connect().await?;
    let items: u32 = 600;
    let incident = incident(&broker, items).await?;
    let mut bed = bed(broker, &[&incident.dlq], u64::from(items)).await?;
    let (received, consuming) = consume(bed.broker(), &incident.work).await?;
    let (per_second, burst) = (100.0, 10);
    let plan = approved_plan(&mut bed.client, &incident.dlq, per_second, burst, None).await?;
    let first = TcpProxy::start("127.0.0.1:5672".parse()?).await?;
    let second = TcpProxy::start("127.0.0.1:5672".parse()?).await?;
    let mut config = bed.executor_config();
    config.amqp.url = format!(
        "amqp://guest:guest@{}/%2f,amqp://guest:guest@{}/%2f",
        first.addr(),
        second.addr()
    );
    // Several addresses need a broker id (one for the whole cluster).
    config.broker_id = Some("redrive-tests".to_owned());
    config.confirm_timeout_seconds = 2;
    config.amqp_heartbeat_seconds = 2;
    let executor = ExecutorHandle::start(config);
    wait_received(&received, 150, Duration::from_secs(30)).await?;
    assert!(
        first.forwarded() > 0,
        "the executor publishes over the first address"
    );
    assert_eq!(second.forwarded(), 0, "and has not used the second yet");
    let started = Instant::now();
    first.cut();
    eprintln!("first broker address cut at {}", chrono::Utc::now());
    wait_completed(&mut bed.client, &plan.plan_id, Duration::from_secs(90)).await?;
    assert!(
        second.forwarded() > 0,
        "the executor reconnected over the second address"
    );
    executor.stop().await?;
    wait_received(&received, items as usize, Duration::from_secs(10)).await?;
    let received = drain(&received, consuming, Duration::from_millis(500)).await?;

    // The bucket's bound, plus 50 ms of the rate for the jitter between a
    // grant and the consumer's receive time (as the other rate tests).
    let bound = (per_second * 1.05 + f64::from(burst)) as usize;
    let most = most_in_any(&received, Duration::from_secs(1));
    let copies = copies_by_id(&received);
    eprintln!(
        "{} deliveries of {} ids; busiest second {most}",
        received.len(),
        copies.len()
    );
    let busiest = busiest_window_start(&received, Duration::from_secs(1))
        .map(|at| at.saturating_duration_since(started).as_secs_f64());
    assert!(
        most <= bound,
        "{most} deliveries in one second across the failover, bound {bound} (busiest second \
         starts {busiest:?} s after the cut)"
    );
    let (sent, uncertain) = assert_bed_audit(&bed, &plan.plan_id, &received).await?;
    let arrived: HashSet<&str> = received.iter().map(|r| r.message_id.as_str()).collect();
    let missing: Vec<&String> = sent
        .iter()
        .filter(|id| !arrived.contains(id.as_str()))
        .collect();
    assert!(missing.is_empty(), "sent but never arrived: {missing:?}");
    assert_eq!(sent.len(), items as usize, "every item sent in the end");
    eprintln!(
        "{} deliveries, {} uncertain, busiest second {most}",
        received.len(),
        uncertain.len()
    );
    bed.finish().await
}

/// Publishes dead letters `m-{n}` for each `n` of `numbers` straight to `dlq`.
async fn publish(broker: &Broker, dlq: &str, numbers: std::ops::Range<u32>) -> anyhow::Result<()> {
    for n in numbers {
        broker
            .publish(
                "",
                dlq,
                format!(r#"{{"order_id":"o-{n}"}}"#).as_bytes(),
                BasicProperties::default().with_message_id(format!("m-{n}").into()),
            )
            .await?;
    }
    Ok(())
}

/// The planner captures a DLQ over two node URLs (two proxies to the local
/// broker); the path it consumes over (the first) is cut for good after 200
/// of 3,000 dead letters are stored, with most of the backlog still to come.
/// Capture reconnects over the second: every dead letter is stored exactly
/// once (its unacked deliveries came back to the queue and were recognized),
/// and none is left in the DLQ.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn capture_fails_over_to_the_next_broker_address_mid_backlog() -> anyhow::Result<()> {
    init_logging();
    let broker = Broker::connect().await?;
    let dlq = unique("dlq_failover");
    broker.queue(&dlq, FieldTable::default()).await?;
    let first = TcpProxy::start("127.0.0.1:5672".parse()?).await?;
    let second = TcpProxy::start("127.0.0.1:5672".parse()?).await?;
    let urls = format!(
        "amqp://guest:guest@{}/%2f,amqp://guest:guest@{}/%2f",
        first.addr(),
        second.addr()
    );
    let mut bed = TestBed::start(broker, |config| {
        capturing(config, &[&dlq]);
        config.amqp.url = urls;
        // Several addresses need a broker id (one for the whole cluster).
        config.broker_id = Some("redrive-tests".to_owned());
        config.capture_reconnect_max_ms = 1000;
    })
    .await?;
    let total: u32 = 3_000;
    publish(bed.broker(), &dlq, 0..1_000).await?;
    captured(&mut bed.client, &dlq, 200).await?;
    assert!(
        first.forwarded() > 0,
        "capture consumes over the first address"
    );
    assert_eq!(second.forwarded(), 0, "and has not used the second yet");
    first.cut();
    let stored_at_cut = stored_total(&mut bed.client, &dlq).await?;
    publish(bed.broker(), &dlq, 1_000..total).await?;
    captured(&mut bed.client, &dlq, u64::from(total)).await?;
    assert!(
        second.forwarded() > 0,
        "capture reconnected over the second address"
    );
    let pool = bed.pool().await?;
    let (rows, ids): (i64, i64) = sqlx::query_as(
        "SELECT count(*), count(DISTINCT message_id) FROM dead_letters WHERE source = $1",
    )
    .bind(&dlq)
    .fetch_one(&pool)
    .await?;
    pool.close().await;
    eprintln!("{stored_at_cut} stored when the first address was cut; {rows} rows, {ids} ids");
    assert!(
        stored_at_cut < u64::from(total),
        "the cut came mid-backlog ({stored_at_cut} stored)"
    );
    assert_eq!(
        (rows, ids),
        (i64::from(total), i64::from(total)),
        "every dead letter stored exactly once across the failover"
    );
    assert_eq!(
        bed.broker().ready_count(&dlq).await?,
        0,
        "nothing left in the DLQ"
    );
    bed.finish().await
}
