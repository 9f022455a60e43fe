//! Capture from real RabbitMQ dead-letter queues into a fresh PostgreSQL
//! database, asserted through the public gRPC API.

use std::time::Duration;

use lapin::{
    BasicProperties, ExchangeKind,
    options::{BasicGetOptions, BasicRejectOptions},
    types::{AMQPValue, FieldTable},
};
use redrive_planner::Config;
use redrive_proto::v1::{
    self, GetDeadLetterRequest, ListDeadLettersRequest, ReasonClass, header_value::Value,
};
use redrive_tests::{
    Broker, PlannerHandle, TcpProxy, TestBed, TestDb, amqp_table, amqp_text, init_logging, unique,
    wait_until,
};
use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};

/// All dead letters of `source`, with bodies.
async fn captured(planner: &PlannerHandle, source: &str) -> anyhow::Result<Vec<v1::DeadLetter>> {
    let mut client = planner.client().await?;
    let listed = client
        .list_dead_letters(ListDeadLettersRequest {
            selector: Some(v1::Selector {
                sources: vec![source.to_owned()],
                ..Default::default()
            }),
            page_size: 1000,
            page_token: String::new(),
        })
        .await
        .or_else(|status| match status.code() {
            // Nothing captured from it yet: an unknown source is refused.
            tonic::Code::NotFound => Ok(tonic::Response::new(Default::default())),
            _ => Err(status),
        })?
        .into_inner();
    let mut full = Vec::new();
    for dead_letter in listed.dead_letters {
        let got = client
            .get_dead_letter(GetDeadLetterRequest { id: dead_letter.id })
            .await?
            .into_inner();
        full.push(got.dead_letter.expect("get answers a dead letter"));
    }
    Ok(full)
}

async fn stored_count(db: &TestDb) -> anyhow::Result<i64> {
    let pool = db.pool().await?;
    let count = sqlx::query_scalar("SELECT count(*) FROM dead_letters")
        .fetch_one(&pool)
        .await?;
    pool.close().await;
    Ok(count)
}

/// Publishes `count` orders to `dlq`, in order: bodies
/// `{"order_id":"o-<n>"}`, message ids `message_id(n)`.
async fn publish_orders(
    broker: &Broker,
    dlq: &str,
    count: usize,
    message_id: impl Fn(usize) -> String,
) -> anyhow::Result<()> {
    for index in 0..count {
        let body = format!(r#"{{"order_id":"o-{index}"}}"#);
        broker
            .publish(
                "",
                dlq,
                body.as_bytes(),
                BasicProperties::default().with_message_id(message_id(index).into()),
            )
            .await?;
    }
    Ok(())
}

/// The capture tests' planner settings: capture `dlq`, bodies up to 4 KiB,
/// key by the body's `order_id`.
fn capturing(config: &mut Config, dlq: &str) {
    config.capture_queues = vec![dlq.to_owned()];
    config.capture_batch_size = 50;
    config.capture_prefetch = 200;
    config.max_body_bytes = 4096;
    config.message_keys = vec!["json:/order_id".to_owned()];
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_dead_letters_are_captured_with_their_bytes_headers_and_death() -> anyhow::Result<()>
{
    init_logging();
    let broker = Broker::connect().await?;
    let exchange = unique("orders");
    let dlx = unique("dlx");
    let (work, ttl, bounded, dlq) = (
        unique("work"),
        unique("ttl"),
        unique("bounded"),
        unique("dlq"),
    );
    broker.exchange(&exchange, ExchangeKind::Direct).await?;
    broker.exchange(&dlx, ExchangeKind::Fanout).await?;
    broker.queue(&dlq, FieldTable::default()).await?;
    broker.bind(&dlq, &dlx, "").await?;
    let with_dlx = |extra: Vec<(&str, AMQPValue)>| {
        let mut entries = vec![("x-dead-letter-exchange", amqp_text(&dlx))];
        entries.extend(extra);
        amqp_table(entries)
    };
    broker.queue(&work, with_dlx(vec![])).await?;
    broker
        .queue(
            &ttl,
            with_dlx(vec![("x-message-ttl", AMQPValue::LongInt(10))]),
        )
        .await?;
    broker
        .queue(
            &bounded,
            with_dlx(vec![("x-max-length", AMQPValue::LongInt(1))]),
        )
        .await?;
    for queue in [&work, &ttl, &bounded] {
        broker
            .bind(queue, &exchange, &format!("to.{queue}"))
            .await?;
    }

    let headers = amqp_table(vec![
        ("tenant", amqp_text("acme")),
        ("attempt", AMQPValue::LongInt(3)),
        ("vip", AMQPValue::Boolean(true)),
        (
            "nested",
            AMQPValue::FieldTable(amqp_table(vec![("k", AMQPValue::LongLongInt(-7))])),
        ),
        ("schema-version", amqp_text("2")),
    ]);
    let properties = |id: &str| {
        BasicProperties::default()
            .with_message_id(id.into())
            .with_type("order.paid".into())
            .with_app_id("checkout".into())
            .with_content_type("application/json".into())
            .with_timestamp(1_700_000_000)
            .with_delivery_mode(2)
            .with_headers(headers.clone())
    };
    // Rejected by a consumer.
    broker
        .publish(
            &exchange,
            &format!("to.{work}"),
            br#"{"order_id":"o-1"}"#,
            properties("m-1"),
        )
        .await?;
    let delivery = broker
        .channel
        .basic_get(work.as_str().into(), BasicGetOptions::default())
        .await?
        .expect("the work queue holds the message");
    delivery
        .acker
        .reject(BasicRejectOptions { requeue: false })
        .await?;
    // Expired by TTL.
    broker
        .publish(
            &exchange,
            &format!("to.{ttl}"),
            br#"{"order_id":"o-2"}"#,
            properties("m-2"),
        )
        .await?;
    // Overflow: the older of two is dropped from the head of a max-length-1 queue.
    broker
        .publish(
            &exchange,
            &format!("to.{bounded}"),
            br#"{"order_id":"o-3"}"#,
            properties("m-3"),
        )
        .await?;
    broker
        .publish(
            &exchange,
            &format!("to.{bounded}"),
            br#"{"order_id":"o-4"}"#,
            properties("m-4"),
        )
        .await?;
    // Bad input straight into the DLQ: binary body, malformed x-death, oversized.
    let binary_body: Vec<u8> = vec![0xff, 0x00, 0xfe, 0x10];
    broker
        .publish(
            "",
            &dlq,
            &binary_body,
            BasicProperties::default()
                .with_message_id("m-5".into())
                .with_headers(amqp_table(vec![
                    ("x-death", amqp_text("not an array")),
                    ("x-first-death-reason", amqp_text("rejected")),
                    ("x-first-death-queue", amqp_text("legacy-work")),
                    ("x-first-death-exchange", amqp_text("legacy")),
                ])),
        )
        .await?;
    let big_body = vec![b'x'; 8192];
    broker
        .publish(
            "",
            &dlq,
            &big_body,
            BasicProperties::default().with_message_id("m-6".into()),
        )
        .await?;

    let mut bed = TestBed::start(broker, |config| capturing(config, &dlq)).await?;
    let waited = wait_until(
        "five dead letters stored",
        Duration::from_secs(20),
        || async { Ok(stored_count(&bed.db).await? >= 5) },
    )
    .await;
    if let Err(error) = waited {
        let pool = bed.pool().await?;
        let rows: Vec<(Option<String>, String)> =
            sqlx::query_as("SELECT message_id, reason_class FROM dead_letters")
                .fetch_all(&pool)
                .await?;
        anyhow::bail!("{error}: stored {rows:?}");
    }
    let dead_letters = captured(&bed.planner, &dlq).await?;
    bed.planner.halt().await?;
    assert_eq!(dead_letters.len(), 5, "each dead letter stored once");
    // Nothing is left in the DLQ, acked or not: after the planner is gone, an
    // unacked message would be back to ready.
    assert_eq!(
        bed.broker().ready_count(&dlq).await?,
        0,
        "the DLQ is empty after capture"
    );

    let by_id = |id: &str| {
        dead_letters
            .iter()
            .find(|d| d.message_id.as_deref() == Some(id))
            .unwrap_or_else(|| panic!("dead letter {id} captured"))
    };
    let rejected = by_id("m-1");
    assert_eq!(rejected.body, br#"{"order_id":"o-1"}"#);
    assert_eq!(rejected.reason_class(), ReasonClass::Rejected);
    let death = rejected.death.as_ref().unwrap();
    assert_eq!(
        (death.reason.as_str(), death.queue.as_str()),
        ("rejected", work.as_str())
    );
    assert_eq!(death.exchange, exchange);
    assert_eq!(death.routing_keys, vec![format!("to.{work}")]);
    assert_eq!(death.count, 1);
    assert_eq!(rejected.destination, work);
    assert_eq!(rejected.message_key, "o-1:order.paid");
    assert_eq!(rejected.event_type.as_deref(), Some("order.paid"));
    assert_eq!(rejected.schema_version.as_deref(), Some("2"));
    assert_eq!(rejected.producer.as_deref(), Some("checkout"));
    let properties = rejected.properties.as_ref().unwrap();
    assert_eq!(properties.timestamp, Some(1_700_000_000));
    assert_eq!(properties.delivery_mode, Some(2));
    let fields = &rejected.headers.as_ref().unwrap().fields;
    assert_eq!(fields["attempt"].value, Some(Value::LongInt(3)));
    assert_eq!(fields["vip"].value, Some(Value::Boolean(true)));
    assert_eq!(
        fields["tenant"].value,
        Some(Value::LongString(b"acme".to_vec()))
    );
    let Some(Value::Table(nested)) = &fields["nested"].value else {
        panic!("nested stays a table")
    };
    assert_eq!(nested.fields["k"].value, Some(Value::LongLongInt(-7)));
    assert!(
        fields.contains_key("x-death"),
        "x-death is kept as captured"
    );
    // The captured headers convert back to the same AMQP table for replay.
    let back = redrive_proto::amqp::table_to_amqp(rejected.headers.as_ref().unwrap())?;
    assert_eq!(back.inner().get("nested"), headers.inner().get("nested"));

    let expired = by_id("m-2");
    assert_eq!(expired.reason_class(), ReasonClass::Expired);
    assert_eq!(expired.death.as_ref().unwrap().queue, ttl);
    assert_eq!(expired.destination, ttl);

    let overflow = by_id("m-3");
    assert_eq!(overflow.reason_class(), ReasonClass::Overflow);
    assert_eq!(overflow.death.as_ref().unwrap().reason, "maxlen");
    assert!(
        dead_letters
            .iter()
            .all(|d| d.message_id.as_deref() != Some("m-4")),
        "the newer message stayed in its queue"
    );

    let malformed = by_id("m-5");
    assert_eq!(malformed.body, binary_body);
    assert_eq!(malformed.death.as_ref().unwrap().queue, "legacy-work");
    assert_eq!(malformed.destination, "legacy-work");
    assert!(
        malformed
            .capture_notes
            .iter()
            .any(|n| n.contains("x-death malformed")),
        "{:?}",
        malformed.capture_notes
    );
    assert!(malformed.message_key.starts_with("sha256:"));

    let oversized = by_id("m-6");
    assert!(oversized.body_oversized);
    assert_eq!(
        oversized.body, big_body,
        "an oversized body is still kept whole"
    );
    assert_eq!(oversized.reason_class(), ReasonClass::Unknown);

    bed.finish().await
}

/// Whether the planner's health for `redrive.v1.Planner` is `status`.
async fn planner_health_is(planner: &PlannerHandle, status: ServingStatus) -> anyhow::Result<bool> {
    let channel = tonic::transport::Channel::from_shared(planner.url())?
        .connect()
        .await?;
    let answer = HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: "redrive.v1.Planner".into(),
        })
        .await?
        .into_inner();
    Ok(answer.status() == status)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_stay_in_the_queue_while_postgres_is_unreachable() -> anyhow::Result<()> {
    init_logging();
    let broker = Broker::connect().await?;
    let dlq = unique("dlq");
    broker.queue(&dlq, FieldTable::default()).await?;
    let proxy = TcpProxy::start("127.0.0.1:5432".parse()?).await?;
    let db = TestDb::new();
    let database_url = db.url_via(&proxy);
    let mut bed = TestBed::start_on(db, Some(broker), |config| {
        capturing(config, &dlq);
        config.database_url = database_url;
        // Capture holds at most this many unacked; the rest must stay ready.
        config.capture_prefetch = 50;
    })
    .await?;

    proxy.cut();
    // Health follows PostgreSQL: every Planner call needs it.
    wait_until(
        "health NOT_SERVING while PostgreSQL is cut off",
        Duration::from_secs(20),
        || planner_health_is(&bed.planner, ServingStatus::NotServing),
    )
    .await?;
    publish_orders(bed.broker(), &dlq, 120, |index| format!("m-{index}")).await?;
    // Throughout the outage the messages stay in the queue: nothing is
    // acked, at most the prefetch is held unacked, the rest stays ready.
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let ready = bed.broker().ready_count(&dlq).await?;
        assert!(
            ready >= 120 - 50,
            "{ready} ready during the outage: more than the prefetch was taken"
        );
    }
    assert_eq!(
        stored_count(&bed.db).await?,
        0,
        "nothing can be stored while PostgreSQL is cut off"
    );

    proxy.restore();
    wait_until(
        "health SERVING after PostgreSQL is back",
        Duration::from_secs(20),
        || planner_health_is(&bed.planner, ServingStatus::Serving),
    )
    .await?;
    wait_until(
        "all 120 stored after PostgreSQL is back",
        Duration::from_secs(30),
        || async { Ok(stored_count(&bed.db).await? >= 120) },
    )
    .await?;
    // Give a stray duplicate the chance to show up before counting exactly.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let dead_letters = captured(&bed.planner, &dlq).await?;
    bed.planner.halt().await?;

    assert_eq!(dead_letters.len(), 120, "each message stored exactly once");
    let mut ids: Vec<String> = dead_letters
        .iter()
        .filter_map(|d| d.message_id.clone())
        .collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 120);
    assert_eq!(
        bed.broker().ready_count(&dlq).await?,
        0,
        "every message acked after its commit"
    );
    bed.finish().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_odd_message_never_stalls_its_queue() -> anyhow::Result<()> {
    init_logging();
    let broker = Broker::connect().await?;
    let dlq = unique("dlq");
    broker.queue(&dlq, FieldTable::default()).await?;
    // A death time far outside PostgreSQL's range, then ordinary dead letters.
    let odd_death = AMQPValue::FieldArray(
        vec![AMQPValue::FieldTable(amqp_table(vec![
            ("reason", amqp_text("rejected")),
            ("queue", amqp_text("q")),
            ("time", AMQPValue::LongLongInt(-300_000_000_000)),
        ]))]
        .into(),
    );
    broker
        .publish(
            "",
            &dlq,
            b"odd",
            BasicProperties::default()
                .with_message_id("odd".into())
                .with_headers(amqp_table(vec![("x-death", odd_death)])),
        )
        .await?;
    for index in 0..5 {
        broker
            .publish(
                "",
                &dlq,
                format!("ok-{index}").as_bytes(),
                BasicProperties::default().with_message_id(format!("ok-{index}").into()),
            )
            .await?;
    }
    let mut bed = TestBed::start(broker, |config| capturing(config, &dlq)).await?;
    wait_until("all six stored", Duration::from_secs(20), || async {
        Ok(stored_count(&bed.db).await? == 6)
    })
    .await?;
    let dead_letters = captured(&bed.planner, &dlq).await?;
    bed.planner.halt().await?;
    assert_eq!(bed.broker().ready_count(&dlq).await?, 0);
    let odd = dead_letters
        .iter()
        .find(|d| d.message_id.as_deref() == Some("odd"))
        .unwrap();
    assert_eq!(odd.body, b"odd");
    assert!(
        odd.capture_notes.iter().any(|note| note.contains("time")),
        "{:?}",
        odd.capture_notes
    );
    assert!(
        odd.headers.as_ref().unwrap().fields.contains_key("x-death"),
        "kept as captured"
    );
    bed.finish().await
}

/// A backlog captured in full batches, two stored side by side: the dead
/// letters are stored in the order the queue held them (docs/capture.md,
/// "Identity and order"), each once, every message acked, and every capture
/// batch recorded as acked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_is_stored_in_queue_order_while_batches_are_stored_side_by_side()
-> anyhow::Result<()> {
    init_logging();
    let broker = Broker::connect().await?;
    let dlq = unique("dlq");
    broker.queue(&dlq, FieldTable::default()).await?;
    const MESSAGES: usize = 1500;
    publish_orders(&broker, &dlq, MESSAGES, |index| format!("m-{index:05}")).await?;
    let mut bed = TestBed::start(broker, |config| capturing(config, &dlq)).await?;
    wait_until("the backlog stored", Duration::from_secs(60), || async {
        Ok(stored_count(&bed.db).await? >= MESSAGES as i64)
    })
    .await?;
    let pool = bed.db.pool().await?;
    wait_until(
        "every capture batch recorded as acked",
        Duration::from_secs(20),
        || async {
            let open: i64 =
                sqlx::query_scalar("SELECT count(*) FROM capture_batches WHERE NOT acked")
                    .fetch_one(&pool)
                    .await?;
            Ok(open == 0)
        },
    )
    .await?;
    bed.planner.halt().await?;
    let stored: Vec<Option<String>> =
        sqlx::query_scalar("SELECT message_id FROM dead_letters WHERE source = $1 ORDER BY id")
            .bind(&dlq)
            .fetch_all(&pool)
            .await?;
    let batches: i64 = sqlx::query_scalar("SELECT count(*) FROM capture_batches")
        .fetch_one(&pool)
        .await?;
    pool.close().await;
    let expected: Vec<Option<String>> = (0..MESSAGES)
        .map(|index| Some(format!("m-{index:05}")))
        .collect();
    assert_eq!(stored.len(), MESSAGES, "each message stored once");
    if let Some(first) = stored
        .iter()
        .zip(&expected)
        .position(|(got, want)| got != want)
    {
        panic!(
            "stored out of queue order from position {first}: {:?} where {:?} was expected",
            &stored[first..(first + 5).min(MESSAGES)],
            &expected[first..(first + 5).min(MESSAGES)]
        );
    }
    assert!(
        batches >= (MESSAGES / 50) as i64,
        "{batches} capture batches for {MESSAGES} messages in batches of at most 50"
    );
    assert_eq!(
        bed.broker().ready_count(&dlq).await?,
        0,
        "every message acked after its commit"
    );
    bed.finish().await
}
