//! An executor given several broker addresses (`--amqp-url` with two node
//! URLs, here two paths to the local broker): the path it publishes over is
//! cut mid-replay and it fails over to the other (docs/operating.md,
//! "Several broker addresses").

use std::{collections::HashSet, time::Duration};

use redrive_tests::{Broker, ExecutorHandle, TcpProxy, init_logging};
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
