//! Observability as an operator sees it: the Prometheus `/metrics` of the
//! executor and the planner after a replay, against the audit; the
//! executor's `grpc.health.v1` readiness and liveness with Redis cut; the
//! planner's readiness with its capture consumer's broker cut.

use std::{net::SocketAddr, time::Duration};

use anyhow::Context;
use lapin::types::FieldTable;
use redrive_tests::{
    AMQP_URL, Broker, ExecutorHandle, TcpProxy, TestBed, init_logging, unique, wait_until,
};
use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};

mod support;
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn scraped_metrics_match_the_audit() -> anyhow::Result<()> {
    init_logging();
    let broker = Broker::connect().await?;
    let incident = incident(&broker, 60).await?;
    let planner_metrics = free_address().await?;
    let dlq = incident.dlq.clone();
    let mut bed = TestBed::start(broker, |config| {
        capturing(config, &[&dlq]);
        config.telemetry.metrics_listen = Some(planner_metrics);
    })
    .await?;
    captured(&mut bed.client, &incident.dlq, 60).await?;
    let (received, consuming) = consume(bed.broker(), &incident.work).await?;

    let plan = approved_plan(&mut bed.client, &incident.dlq, 1000.0, 50, None).await?;
    let executor_metrics = free_address().await?;
    let mut config = bed.executor_config();
    config.telemetry.metrics_listen = Some(executor_metrics);
    let executor = ExecutorHandle::start(config);
    let done = wait_completed(&mut bed.client, &plan.plan_id, Duration::from_secs(60)).await?;
    let counts = done.counts.context("the plan's counts")?;
    let report = audit_report(&mut bed.client, &plan.plan_id).await?;
    assert_eq!(counts.sent, 60, "every replayable message sent");
    assert_eq!(report.sent_keys.len(), 60);

    // Scraped while the executor still runs, as Prometheus would.
    let text = scrape_metrics(executor_metrics).await?;
    let sent_events = metric_total(
        &text,
        "redrive_executor_items_total",
        &[("redrive_audit_action", "sent")],
        &[],
    );
    let acked = metric_total(
        &text,
        "messaging_client_sent_messages_total",
        &[
            ("messaging_system", "rabbitmq"),
            ("messaging_operation_name", "publish"),
        ],
        &["error_type"],
    );
    assert_eq!(
        sent_events, counts.sent as f64,
        "the executor's sent items are the audit's sent count:\n{text}"
    );
    assert_eq!(
        acked, counts.sent as f64,
        "acked publishes (no error.type) are the audit's sent count"
    );
    let confirms = metric_total(
        &text,
        "messaging_client_operation_duration_seconds_count",
        &[("messaging_system", "rabbitmq")],
        &[],
    );
    assert_eq!(
        confirms, counts.sent as f64,
        "one publisher-confirm latency per acked publish"
    );
    assert!(
        metric_total(&text, "redrive_executor_leases_claimed_total", &[], &[]) >= 1.0,
        "leases taken are counted"
    );
    assert!(
        metric_total(
            &text,
            "redrive_executor_bucket_wait_seconds_count",
            &[],
            &[]
        ) >= 1.0,
        "token waits are measured"
    );
    // The bucket, per destination (queue mode: the default exchange, the
    // queue's name as routing key): one token per message sent, under the
    // plan's rate.
    let work_queue = [
        ("messaging_destination_name", ""),
        (
            "messaging_rabbitmq_destination_routing_key",
            incident.work.as_str(),
        ),
    ];
    assert_eq!(
        metric_total(
            &text,
            "redrive_executor_bucket_tokens_total",
            &work_queue,
            &[]
        ),
        counts.sent as f64,
        "one token per message sent, by destination:\n{text}"
    );
    assert_eq!(
        metric_total(
            &text,
            "redrive_executor_bucket_rate_per_second",
            &work_queue,
            &[]
        ),
        1000.0,
        "the destination's bucket rate:\n{text}"
    );
    assert!(
        !text.contains(&plan.plan_id),
        "no plan id in any label (bounded cardinality)"
    );

    let text = scrape_metrics(planner_metrics).await?;
    assert_eq!(
        metric_total(
            &text,
            "redrive_planner_dead_letters_captured_total",
            &[("redrive_source", &incident.dlq)],
            &[]
        ),
        60.0,
        "every captured dead letter counted by source:\n{text}"
    );
    assert_eq!(
        metric_total(
            &text,
            "redrive_planner_precheck_verdicts_total",
            &[("redrive_verdict", "replayable")],
            &[]
        ),
        60.0
    );
    assert!(
        metric_total(
            &text,
            "redrive_planner_precheck_duration_seconds_count",
            &[],
            &[]
        ) >= 1.0
    );
    assert_eq!(
        metric_total(
            &text,
            "redrive_planner_items_total",
            &[("redrive_audit_action", "sent")],
            &[]
        ),
        counts.sent as f64,
        "the planner counts the sent outcomes reported"
    );
    assert_eq!(
        metric_total(
            &text,
            "redrive_planner_plan_transitions_total",
            &[("redrive_plan_state", "completed")],
            &[]
        ),
        1.0,
        "one plan completed"
    );
    // Plans by state, counted in PostgreSQL every 10 s.
    let mut text = text;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while metric_total(
        &text,
        "redrive_planner_plans",
        &[("redrive_plan_state", "completed")],
        &[],
    ) != 1.0
    {
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "the plans gauge never counted the completed plan:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
        text = scrape_metrics(planner_metrics).await?;
    }
    assert_eq!(
        metric_total(
            &text,
            "redrive_planner_plans",
            &[("redrive_plan_state", "canary")],
            &[]
        ),
        0.0,
        "a state without plans shows 0"
    );
    assert!(
        text.contains("redrive_planner_plans{") && text.contains("redrive_plan_state=\"canary\""),
        "every state is a series, also at 0:\n{text}"
    );

    executor.stop().await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop_consuming(consuming)?;
    assert_eq!(received.lock().unwrap().len(), 60);
    bed.finish().await
}

/// The health status of `service` at `address` (`None`: no answer).
async fn health(address: SocketAddr, service: &str) -> Option<ServingStatus> {
    let channel = tonic::transport::Channel::from_shared(format!("http://{address}"))
        .ok()?
        .connect_timeout(Duration::from_secs(2))
        .connect()
        .await
        .ok()?;
    let answer = tokio::time::timeout(
        Duration::from_secs(3),
        HealthClient::new(channel).check(HealthCheckRequest {
            service: service.to_owned(),
        }),
    )
    .await
    .ok()?
    .ok()?;
    Some(answer.into_inner().status())
}

async fn wait_health(
    address: SocketAddr,
    service: &str,
    status: ServingStatus,
) -> anyhow::Result<()> {
    wait_until(
        &format!("health of {service:?} {status:?}"),
        Duration::from_secs(30),
        || async move { Ok(health(address, service).await == Some(status)) },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn executor_readiness_follows_redis_and_liveness_its_loops() -> anyhow::Result<()> {
    init_logging();
    let broker = Broker::connect().await?;
    let bed = TestBed::start(broker, |_| {}).await?;
    let redis_proxy = TcpProxy::start("127.0.0.1:6379".parse()?).await?;
    let health_address = free_address().await?;
    let mut config = bed.executor_config();
    config.redis_url = Some(format!("redis://{}", redis_proxy.addr()));
    config.health_listen = Some(health_address);
    let executor = ExecutorHandle::start(config);

    wait_health(health_address, "", ServingStatus::Serving).await?;
    assert_eq!(
        health(health_address, "readiness").await,
        Some(ServingStatus::Serving)
    );
    assert_eq!(
        health(health_address, "liveness").await,
        Some(ServingStatus::Serving)
    );

    // Redis unreachable: not ready, still live (the loops wait, not wedged).
    redis_proxy.cut();
    wait_health(health_address, "", ServingStatus::NotServing).await?;
    assert_eq!(
        health(health_address, "readiness").await,
        Some(ServingStatus::NotServing)
    );
    assert_eq!(
        health(health_address, "liveness").await,
        Some(ServingStatus::Serving)
    );

    redis_proxy.restore();
    wait_health(health_address, "", ServingStatus::Serving).await?;

    executor.stop().await?;
    bed.finish().await
}

/// Redis down when the executor starts: health answers at once (a probe
/// gets NOT_SERVING readiness, SERVING liveness, not a refused connection
/// that an orchestrator would take for a dead process), and readiness
/// follows once Redis is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn executor_health_answers_while_redis_is_down_at_start() -> anyhow::Result<()> {
    init_logging();
    let broker = Broker::connect().await?;
    let bed = TestBed::start(broker, |_| {}).await?;
    let redis_proxy = TcpProxy::start("127.0.0.1:6379".parse()?).await?;
    redis_proxy.cut();
    let health_address = free_address().await?;
    let mut config = bed.executor_config();
    config.redis_url = Some(format!("redis://{}", redis_proxy.addr()));
    config.health_listen = Some(health_address);
    let executor = ExecutorHandle::start(config);

    wait_health(health_address, "liveness", ServingStatus::Serving).await?;
    assert_eq!(
        health(health_address, "readiness").await,
        Some(ServingStatus::NotServing),
        "not ready without Redis"
    );
    redis_proxy.restore();
    wait_health(health_address, "readiness", ServingStatus::Serving).await?;
    assert_eq!(
        health(health_address, "liveness").await,
        Some(ServingStatus::Serving)
    );

    executor.stop().await?;
    bed.finish().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn executor_is_not_ready_without_its_planner() -> anyhow::Result<()> {
    init_logging();
    let broker = Broker::connect().await?;
    let bed = TestBed::start(broker, |_| {}).await?;
    let planner_proxy = TcpProxy::start(bed.planner.addr).await?;
    let health_address = free_address().await?;
    let mut config = bed.executor_config();
    config.planner = format!("http://{}", planner_proxy.addr());
    config.health_listen = Some(health_address);
    let executor = ExecutorHandle::start(config);

    wait_health(health_address, "readiness", ServingStatus::Serving).await?;
    planner_proxy.cut();
    wait_health(health_address, "readiness", ServingStatus::NotServing).await?;
    planner_proxy.restore();
    wait_health(health_address, "readiness", ServingStatus::Serving).await?;

    executor.stop().await?;
    bed.finish().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn planner_readiness_requires_every_capture_consumer() -> anyhow::Result<()> {
    init_logging();
    let broker = Broker::connect().await?;
    let dlq = unique("dlq");
    broker.queue(&dlq, FieldTable::default()).await?;
    let amqp_proxy = TcpProxy::start("127.0.0.1:5672".parse()?).await?;
    let proxied_amqp = AMQP_URL.replace("127.0.0.1:5672", &amqp_proxy.addr().to_string());
    let capture_queue = dlq.clone();
    let bed = TestBed::start(broker, |config| {
        config.capture_queues = vec![capture_queue];
        config.amqp.url = proxied_amqp;
    })
    .await?;
    let planner = bed.planner.addr;

    wait_health(planner, "", ServingStatus::Serving).await?;
    amqp_proxy.cut();
    wait_health(planner, "", ServingStatus::NotServing).await?;
    assert_eq!(
        health(planner, "redrive.v1.Planner").await,
        Some(ServingStatus::Serving),
        "the API itself still serves: only capture is down"
    );
    amqp_proxy.restore();
    wait_health(planner, "", ServingStatus::Serving).await?;

    bed.finish().await
}

/// The gauges of one source, as scraped: (depth, stored, open as rejected,
/// arrivals per second, oldest open age in seconds).
fn source_gauges(text: &str, source: &str) -> (f64, f64, f64, f64, f64) {
    let of = |name: &str, with: &[(&str, &str)]| {
        let mut labels = vec![("redrive_source", source)];
        labels.extend_from_slice(with);
        metric_total(text, name, &labels, &[])
    };
    (
        of("redrive_planner_source_depth", &[]),
        of("redrive_planner_source_stored", &[]),
        of(
            "redrive_planner_source_open",
            &[("redrive_reason_class", "rejected")],
        ),
        of("redrive_planner_source_arrivals_per_second", &[]),
        of("redrive_planner_source_oldest_open_age_seconds", &[]),
    )
}

/// The alerting gauges (deploy/prometheus): a DLQ that grows while capture
/// cannot store (PostgreSQL cut off) shows in the broker's depth, recorded
/// even while the counts in PostgreSQL fail; once PostgreSQL is back it
/// moves into stored and open dead letters, with arrivals and the oldest
/// one's age.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_depth_gauge_follows_a_dlq_that_grows_and_is_captured() -> anyhow::Result<()> {
    init_logging();
    let broker = Broker::connect().await?;
    let incident = incident(&broker, 0).await?;
    let metrics = free_address().await?;
    let dlq = incident.dlq.clone();
    let proxy = TcpProxy::start("127.0.0.1:5432".parse()?).await?;
    let db = redrive_tests::TestDb::new();
    let database_url = db.url_via(&proxy);
    let mut bed = TestBed::start_on(db, Some(broker), |config| {
        capturing(config, &[&dlq]);
        config.database_url = database_url;
        // Capture holds at most 10 unacked: the rest waits in the DLQ, ready,
        // where the passive declare counts it.
        config.capture_prefetch = 10;
        config.capture_batch_size = 10;
        config.telemetry.metrics_listen = Some(metrics);
    })
    .await?;
    let gauges =
        || async { Ok::<_, anyhow::Error>(source_gauges(&scrape_metrics(metrics).await?, &dlq)) };
    let depth_line = format!("redrive_planner_source_depth{{redrive_source=\"{dlq}\"");
    wait_until("the empty DLQ's depth", Duration::from_secs(20), || async {
        Ok(scrape_metrics(metrics).await?.contains(&depth_line))
    })
    .await?;
    assert_eq!(gauges().await?.0, 0.0, "an empty DLQ");

    // PostgreSQL away, 40 messages die: the DLQ grows.
    proxy.cut();
    let channel = bed.broker().connection.create_channel().await?;
    for index in 0..40 {
        channel
            .basic_publish(
                incident.exchange.as_str().into(),
                "".into(),
                Default::default(),
                format!(r#"{{"order_id":"late-{index}"}}"#).as_bytes(),
                lapin::BasicProperties::default().with_message_id(format!("late-{index}").into()),
            )
            .await?
            .await?;
        reject_next(&channel, &incident.work, "the message just published").await?;
    }
    wait_until(
        "the depth to show the grown DLQ",
        Duration::from_secs(30),
        || async { Ok(gauges().await?.0 >= 30.0) },
    )
    .await?;

    // PostgreSQL back: capture stores them, the depth falls to 0.
    proxy.restore();
    wait_until(
        "capture to store all 40",
        Duration::from_secs(60),
        || async {
            let (depth, stored, ..) = gauges().await?;
            Ok(stored == 40.0 && depth == 0.0)
        },
    )
    .await?;
    let (depth, stored, open, arrivals, oldest) = gauges().await?;
    assert_eq!((depth, stored, open), (0.0, 40.0, 40.0));
    assert!(
        (40.0 / 60.0 - arrivals).abs() < 1e-9,
        "40 stored within the last minute: {arrivals}/s"
    );
    assert!(
        oldest > 0.0 && oldest < 120.0,
        "the oldest died just now: {oldest} s"
    );
    assert_eq!(
        redrive_tests::stored_total(&mut bed.client, &dlq).await?,
        40
    );
    channel.close(200, "done".into()).await?;
    bed.finish().await
}
