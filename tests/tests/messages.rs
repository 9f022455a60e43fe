//! Real-world messages against the real broker: a replay reaches only its
//! destination and keeps every other property byte-identical (CC/BCC dropped),
//! frameworks' error queues give the destination (MassTransit) or say that
//! only an exchange is known (Spring AMQP), compressed bodies are keyed by
//! their decoded content while the consumer gets the exact captured bytes,
//! and the default identity (the message id) replays retries of one message
//! once and different messages with one body each.

use std::{io::Write, time::Duration};

use lapin::{
    BasicProperties,
    types::{AMQPValue, FieldArray, FieldTable},
};
use redrive_proto::v1::{self, Verdict};
use redrive_tests::{
    Broker, DlqTopology, ExecutorHandle, amqp_table, amqp_text, init_logging, plan_request,
    precheck_items, unique, wait_until,
};

mod support;
use support::*;

fn routing_keys(keys: &[&str]) -> AMQPValue {
    AMQPValue::FieldArray(FieldArray::from(
        keys.iter().map(|key| amqp_text(key)).collect::<Vec<_>>(),
    ))
}

async fn items(
    client: &mut redrive_proto::v1::planner_client::PlannerClient<tonic::transport::Channel>,
    source: &str,
) -> anyhow::Result<(v1::PrecheckReport, Vec<v1::PrecheckItem>)> {
    let report = precheck(client, source).await?;
    let items = precheck_items(client, &report.precheck_id, 0, 100)
        .await?
        .items;
    Ok((report, items))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cc_and_bcc_reach_nobody_on_replay_and_kept_properties_are_byte_identical()
-> anyhow::Result<()> {
    init_logging();
    let broker = Broker::connect().await?;
    let topology = DlqTopology::declare(&broker).await?;
    let audit = unique("audit");
    broker.queue(&audit, FieldTable::default()).await?;
    broker.bind(&audit, &topology.exchange, &audit).await?;
    let published: Vec<BasicProperties> = ["CC", "BCC"]
        .iter()
        .enumerate()
        .map(|(index, distribution)| {
            BasicProperties::default()
                .with_message_id(format!("m-{index}").into())
                .with_correlation_id(format!("c-{index}").into())
                .with_content_type("application/json".into())
                .with_content_encoding("identity".into())
                .with_type("order.paid".into())
                .with_app_id("shop".into())
                .with_timestamp(1_764_000_000 + index as u64)
                .with_priority(3)
                .with_user_id("guest".into())
                .with_headers(amqp_table(vec![
                    ("tenant", amqp_text("acme")),
                    ("seq", AMQPValue::LongInt(index as i32)),
                    (distribution, routing_keys(&[&audit])),
                ]))
        })
        .collect();
    for (index, properties) in published.iter().enumerate() {
        let body = format!(r#"{{"order_id":"o-{index}"}}"#);
        topology
            .reject(&broker, body.as_bytes(), properties.clone())
            .await?;
    }
    assert_eq!(
        broker.ready_count(&audit).await?,
        2,
        "the first publish reached audit"
    );
    let mut bed = bed(broker, &[&topology.dlq], 2).await?;
    let (received, consuming) = consume(bed.broker(), &topology.work).await?;
    let plan = approved_plan(&mut bed.client, &topology.dlq, 100.0, 10, None).await?;
    let executor = ExecutorHandle::start(bed.executor_config());
    wait_completed(&mut bed.client, &plan.plan_id, Duration::from_secs(30)).await?;
    executor.stop().await?;
    wait_until("both replays consumed", Duration::from_secs(10), || {
        let received = received.clone();
        async move { Ok(received.lock().unwrap().len() >= 2) }
    })
    .await?;
    stop_consuming(consuming)?;
    assert_eq!(
        bed.broker().ready_count(&audit).await?,
        2,
        "the healthy audit queue got nothing from the replay"
    );
    let received = received.lock().unwrap().clone();
    assert_eq!(received.len(), 2);
    assert_bed_audit(&bed, &plan.plan_id, &received).await?;
    for delivery in &received {
        let index: usize = delivery.message_id.trim_start_matches("m-").parse()?;
        let (sent, got) = (&published[index], &delivery.properties);
        assert_eq!(got.message_id(), sent.message_id());
        assert_eq!(got.correlation_id(), sent.correlation_id());
        assert_eq!(got.content_type(), sent.content_type());
        assert_eq!(got.content_encoding(), sent.content_encoding());
        assert_eq!(got.kind(), sent.kind());
        assert_eq!(got.app_id(), sent.app_id());
        assert_eq!(got.timestamp(), sent.timestamp());
        assert_eq!(got.priority(), sent.priority());
        assert_eq!(got.user_id(), sent.user_id());
        let got_headers = got.headers().clone().unwrap_or_default();
        for (name, value) in sent.headers().as_ref().unwrap().inner() {
            if name.as_str() == "CC" || name.as_str() == "BCC" {
                assert!(
                    !got_headers.inner().contains_key(name.as_str()),
                    "{name} republished"
                );
            } else {
                assert_eq!(
                    got_headers.inner().get(name.as_str()),
                    Some(value),
                    "header {name}"
                );
            }
        }
        assert_eq!(
            delivery.body,
            format!(r#"{{"order_id":"o-{index}"}}"#).as_bytes()
        );
    }
    bed.finish().await
}

/// A message as Spring AMQP's `RepublishMessageRecoverer` moves it: no
/// x-death, the exchange and routing key it was published with.
fn spring_recovered(id: &str, exchange: &str, routing_key: &str) -> BasicProperties {
    BasicProperties::default()
        .with_message_id(id.into())
        .with_headers(amqp_table(vec![
            ("x-original-exchange", amqp_text(exchange)),
            ("x-original-routingKey", amqp_text(routing_key)),
            ("x-exception-message", amqp_text("Listener threw exception")),
            (
                "x-exception-stacktrace",
                amqp_text("org.springframework.amqp.AmqpRejectAndDontRequeueException: x"),
            ),
        ]))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn framework_error_queues_give_the_queue_or_a_route_that_only_exchange_mode_publishes()
-> anyhow::Result<()> {
    init_logging();
    let broker = Broker::connect().await?;
    let error_queue = unique("fulfil_error");
    broker.queue(&error_queue, FieldTable::default()).await?;
    // Where Spring's messages were published: exchange `orders_…` routes
    // `order.created` to the queue `created_…`; no queue is named
    // `order.created`.
    let orders = unique("orders");
    let created = unique("created");
    broker.exchange(&orders, lapin::ExchangeKind::Topic).await?;
    broker.queue(&created, FieldTable::default()).await?;
    broker.bind(&created, &orders, "order.created").await?;
    // As MassTransit moves a fault: no x-death, the input address names the queue.
    broker
        .publish(
            "",
            &error_queue,
            br#"{"order_id":"mt-1"}"#,
            BasicProperties::default()
                .with_message_id("mt-1".into())
                .with_headers(amqp_table(vec![
                    (
                        "MT-Fault-InputAddress",
                        amqp_text("rabbitmq://localhost/shop/fulfil?bind=true"),
                    ),
                    (
                        "MT-Fault-ExceptionType",
                        amqp_text("System.FormatException"),
                    ),
                    ("MT-Fault-Message", amqp_text("bad order")),
                    ("MT-Reason", amqp_text("fault")),
                ])),
        )
        .await?;
    // Spring's message twice: the second copy is a duplicate, exchange-only
    // but not replayable, so the warning below does not count it.
    for _ in 0..2 {
        broker
            .publish(
                "",
                &error_queue,
                br#"{"order_id":"spring-1"}"#,
                spring_recovered("spring-1", &orders, "order.created"),
            )
            .await?;
    }
    // A second error queue with Spring's messages only, to replay them.
    let spring_queue = unique("spring_error");
    broker.queue(&spring_queue, FieldTable::default()).await?;
    for n in 2..5 {
        broker
            .publish(
                "",
                &spring_queue,
                format!(r#"{{"order_id":"spring-{n}"}}"#).as_bytes(),
                spring_recovered(&format!("spring-{n}"), &orders, "order.created"),
            )
            .await?;
    }
    let mut bed = bed(broker, &[&error_queue, &spring_queue], 3).await?;
    captured(&mut bed.client, &spring_queue, 3).await?;
    let (report, items) = items(&mut bed.client, &error_queue).await?;
    assert_eq!(items.len(), 3, "{report:?}");
    let masstransit = items.iter().find(|i| i.message_key == "mt-1").unwrap();
    assert_eq!(
        masstransit.verdict(),
        Verdict::Replayable,
        "{}",
        masstransit.reason
    );
    assert_eq!(masstransit.destination, "fulfil");
    let spring = items.iter().find(|i| i.message_key == "spring-1").unwrap();
    assert_eq!(spring.verdict(), Verdict::Replayable, "{}", spring.reason);
    let copy = items.iter().rfind(|i| i.message_key == "spring-1").unwrap();
    assert_ne!(copy.dead_letter_id, spring.dead_letter_id);
    assert_eq!(copy.verdict(), Verdict::Duplicate, "{}", copy.reason);
    assert_eq!(
        spring.destination,
        format!("{orders}/order.created"),
        "a route: the routing key is not taken as a queue"
    );
    assert!(
        report.warnings.iter().any(|w| w.starts_with(&format!(
            "1 replayable dead letters (for example {}) know only the exchange and routing key",
            spring.dead_letter_id
        ))),
        "the precheck says so, counting the one replayable route and naming it: {:?}",
        report.warnings
    );
    // A queue-mode plan refuses it, naming the way out.
    let refused = bed
        .client
        .create_plan(plan_request(&report, 10.0, 1))
        .await
        .expect_err("queue mode refuses a route");
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
    assert!(
        refused.message().contains("destination exchange"),
        "{}",
        refused.message()
    );
    // So does a single replay (it goes to the queue a dead letter died in).
    let single = bed
        .client
        .replay_dead_letter(v1::ReplayDeadLetterRequest {
            dead_letter_id: spring.dead_letter_id.clone(),
            reason: "test".into(),
            ..Default::default()
        })
        .await?
        .into_inner();
    assert_eq!(
        single.outcome(),
        v1::replay_dead_letter_response::Outcome::NotReplayed,
        "{single:?}"
    );
    assert!(single.reason.contains("exchange mode"), "{}", single.reason);

    // An exchange-mode plan publishes them to the exchange with the key.
    let (received, consuming) = consume(bed.broker(), &created).await?;
    let plan = approved_plan(
        &mut bed.client,
        &spring_queue,
        100.0,
        10,
        Some(v1::destination::Mode::Exchange(v1::ExchangeDestination {})),
    )
    .await?;
    let executor = ExecutorHandle::start(bed.executor_config());
    let done = wait_completed(&mut bed.client, &plan.plan_id, Duration::from_secs(30)).await?;
    executor.stop().await?;
    assert_eq!(done.counts.as_ref().map(|c| c.sent), Some(3));
    wait_until("three replays consumed", Duration::from_secs(10), || {
        let received = received.clone();
        async move { Ok(received.lock().unwrap().len() >= 3) }
    })
    .await?;
    stop_consuming(consuming)?;
    let received = received.lock().unwrap().clone();
    let mut ids: Vec<_> = received.iter().map(|r| r.message_id.clone()).collect();
    ids.sort();
    assert_eq!(ids, ["spring-2", "spring-3", "spring-4"]);
    assert_bed_audit(&bed, &plan.plan_id, &received).await?;

    bed.finish().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn compressed_retries_of_one_order_are_one_key_and_replay_byte_exact() -> anyhow::Result<()> {
    init_logging();
    let broker = Broker::connect().await?;
    let topology = DlqTopology::declare(&broker).await?;
    let json = br#"{"order_id":"o-7","attempt":1}"#;
    let mut gzip = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gzip.write_all(json)?;
    let mut zlib = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
    zlib.write_all(br#"{"order_id":"o-7","attempt":2}"#)?;
    let zstd = ruzstd::encoding::compress_to_vec(
        &br#"{"order_id":"o-7","attempt":3}"#[..],
        ruzstd::encoding::CompressionLevel::Fastest,
    );
    let bodies = [
        (gzip.finish()?, "gzip"),
        (zlib.finish()?, "deflate"),
        (zstd, "zstd"),
    ];
    for (index, (body, encoding)) in bodies.iter().enumerate() {
        topology
            .reject(
                &broker,
                body,
                BasicProperties::default()
                    .with_message_id(format!("m-{index}").into())
                    .with_content_type("application/json".into())
                    .with_content_encoding((*encoding).into()),
            )
            .await?;
    }
    let mut bed = bed(broker, &[&topology.dlq], 3).await?;
    let (report, items) = items(&mut bed.client, &topology.dlq).await?;
    let counts = report.counts.unwrap();
    assert_eq!(
        (counts.replayable, counts.duplicate, counts.invalid),
        (1, 2, 0),
        "{items:?}"
    );
    assert!(
        items.iter().all(|item| item.message_key == "o-7"),
        "{items:?}"
    );
    let (received, consuming) = consume(bed.broker(), &topology.work).await?;
    let plan = approved_plan(&mut bed.client, &topology.dlq, 100.0, 10, None).await?;
    let executor = ExecutorHandle::start(bed.executor_config());
    wait_completed(&mut bed.client, &plan.plan_id, Duration::from_secs(30)).await?;
    executor.stop().await?;
    wait_until("the replay consumed", Duration::from_secs(10), || {
        let received = received.clone();
        async move { Ok(!received.lock().unwrap().is_empty()) }
    })
    .await?;
    stop_consuming(consuming)?;
    let received = received.lock().unwrap().clone();
    assert_eq!(received.len(), 1, "one replay for one order");
    assert_bed_audit(&bed, &plan.plan_id, &received).await?;
    assert_eq!(
        received[0].message_id, "m-0",
        "the first dead letter is replayed"
    );
    assert_eq!(received[0].body, bodies[0].0, "the exact compressed bytes");
    assert_eq!(
        received[0]
            .properties
            .content_encoding()
            .as_ref()
            .map(|e| e.as_str()),
        Some("gzip")
    );
    bed.finish().await
}

/// One DLQ holds a dead letter the broker dead-lettered from `work` (whose
/// exchange also routes its key to a healthy `audit` queue) and a Spring AMQP
/// exchange-only one. Queue mode refuses the Spring one; exchange mode would
/// copy the other to `audit`, so it is refused for this mixed precheck, and
/// the warning says so before anyone tries.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn exchange_mode_is_refused_for_a_precheck_mixing_routes_and_queues() -> anyhow::Result<()> {
    init_logging();
    let broker = Broker::connect().await?;
    let topology = DlqTopology::declare(&broker).await?;
    let audit = unique("audit");
    broker.queue(&audit, FieldTable::default()).await?;
    broker
        .bind(&audit, &topology.exchange, &topology.routing_key())
        .await?;
    topology
        .reject(
            &broker,
            br#"{"order_id":"o-1"}"#,
            BasicProperties::default()
                .with_content_type("application/json".into())
                .with_message_id("o-1".into()),
        )
        .await?;
    broker
        .publish(
            "",
            &topology.dlq,
            br#"{"order_id":"spring-1"}"#,
            spring_recovered("spring-1", &unique("orders"), "order.created"),
        )
        .await?;
    let audit_before = broker.ready_count(&audit).await?;
    let mut bed = bed(broker, &[&topology.dlq], 2).await?;
    let (report, _) = items(&mut bed.client, &topology.dlq).await?;
    assert!(
        report
            .warnings
            .iter()
            .any(|w| w.contains("exchange-only ones on their own")),
        "{:?}",
        report.warnings
    );
    for mode in [
        None,
        Some(v1::destination::Mode::Exchange(v1::ExchangeDestination {})),
    ] {
        let refused = bed
            .client
            .create_plan(v1::CreatePlanRequest {
                destination: mode.map(|mode| v1::Destination { mode: Some(mode) }),
                ..plan_request(&report, 10.0, 1)
            })
            .await
            .expect_err("refused");
        assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
    }
    assert_eq!(bed.broker().ready_count(&audit).await?, audit_before);
    bed.finish().await
}

/// Issue 27 end to end with the default identity (no `--message-key`): four
/// retries of one order under one message id with changed bodies reach the
/// consumer once (the earliest), and four different commands with the same
/// body under four message ids all reach it: none is lost as a duplicate.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_default_identity_replays_one_order_once_and_every_command() -> anyhow::Result<()> {
    init_logging();
    let broker = Broker::connect().await?;
    let topology = DlqTopology::declare(&broker).await?;
    let json = |message_id: &str| {
        BasicProperties::default()
            .with_message_id(message_id.into())
            .with_content_type("application/json".into())
    };
    for attempt in 1..=4 {
        let body = format!(r#"{{"order_id":"o-50","attempt":{attempt}}}"#);
        topology
            .reject(&broker, body.as_bytes(), json("m-50"))
            .await?;
    }
    let command = br#"{"command":"recalculate-prices"}"#;
    for n in 1..=4 {
        topology
            .reject(&broker, command, json(&format!("c-{n}")))
            .await?;
    }
    let dlq = topology.dlq.clone();
    let mut bed = redrive_tests::TestBed::start(broker, |config| {
        capturing(config, &[&dlq]);
        config.message_keys = Vec::new();
    })
    .await?;
    captured(&mut bed.client, &dlq, 8).await?;
    let (received, consuming) = consume(bed.broker(), &topology.work).await?;
    let plan = approved_plan(&mut bed.client, &dlq, 100.0, 10, None).await?;
    assert_eq!(plan.total_items, 5, "one order and four commands");
    let executor = ExecutorHandle::start(bed.executor_config());
    wait_completed(&mut bed.client, &plan.plan_id, Duration::from_secs(30)).await?;
    executor.stop().await?;
    wait_until("the replay consumed", Duration::from_secs(10), || {
        let received = received.clone();
        async move { Ok(received.lock().unwrap().len() >= 5) }
    })
    .await?;
    stop_consuming(consuming)?;
    let received = received.lock().unwrap().clone();
    assert_bed_audit(&bed, &plan.plan_id, &received).await?;
    let mut got: Vec<(String, String)> = received
        .iter()
        .map(|r| {
            (
                r.message_id.clone(),
                String::from_utf8_lossy(&r.body).into_owned(),
            )
        })
        .collect();
    got.sort();
    let command = String::from_utf8_lossy(command).into_owned();
    assert_eq!(
        got,
        [
            ("c-1".to_owned(), command.clone()),
            ("c-2".to_owned(), command.clone()),
            ("c-3".to_owned(), command.clone()),
            ("c-4".to_owned(), command),
            (
                "m-50".to_owned(),
                r#"{"order_id":"o-50","attempt":1}"#.to_owned()
            ),
        ],
        "each command once, the order once with its earliest body"
    );
    bed.finish().await
}
