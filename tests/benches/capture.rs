//! Capture benchmark: a backlog of 1 KiB dead letters, made by the broker itself
//! (TTL 0 on a work queue with a dead-letter exchange), captured from the DLQ
//! into a fresh PostgreSQL database by an in-process planner.
//!
//! Run: `cargo bench -p redrive-tests --bench capture` (`REDRIVE_BENCH_MESSAGES`
//! sets the backlog, default 100000). Prints the capture rate in dead letters
//! per second, from the planner's start until every dead letter is stored and
//! the DLQ is empty, and, in the same run, the broker's raw limit: an equal
//! backlog consumed by a bare lapin consumer (same prefetch, one
//! `basic.ack(multiple)` per batch, nothing stored), with the ratio of the
//! two (the broker's speed varies 2× between days; the ratio holds).

use std::time::{Duration, Instant};

use futures::{StreamExt, stream::FuturesUnordered};
use lapin::{
    BasicProperties,
    options::BasicPublishOptions,
    types::{AMQPValue, FieldTable, LongString, ShortString},
};
use redrive_tests::{Broker, TestBed, unique, wait_until};

/// A DLQ holding `messages` dead letters the broker made (TTL 0 on a work
/// queue with a dead-letter exchange).
async fn backlog(broker: &Broker, messages: u32) -> anyhow::Result<String> {
    let (work, dlq) = (unique("bench_work"), unique("bench_dlq"));
    broker.queue(&dlq, FieldTable::default()).await?;
    let mut arguments = FieldTable::default();
    arguments.insert(ShortString::from("x-message-ttl"), AMQPValue::LongInt(0));
    arguments.insert(
        ShortString::from("x-dead-letter-exchange"),
        AMQPValue::LongString(LongString::from("")),
    );
    arguments.insert(
        ShortString::from("x-dead-letter-routing-key"),
        AMQPValue::LongString(LongString::from(dlq.as_str())),
    );
    broker.queue(&work, arguments).await?;

    println!("making a backlog of {messages} dead letters (1 KiB bodies) in {dlq}");
    let started = Instant::now();
    let body_padding = "x".repeat(1000);
    let mut confirms = FuturesUnordered::new();
    for index in 0..messages {
        let body = format!(
            r#"{{"order_id":"o-{index}","pad":"{}"}}"#,
            &body_padding[..1000 - 30]
        );
        let mut headers = FieldTable::default();
        headers.insert(
            ShortString::from("tenant"),
            AMQPValue::LongString(LongString::from("acme")),
        );
        headers.insert(
            ShortString::from("schema-version"),
            AMQPValue::LongString(LongString::from("3")),
        );
        headers.insert(ShortString::from("attempt"), AMQPValue::LongInt(1));
        let properties = BasicProperties::default()
            .with_message_id(format!("m-{index}").into())
            .with_type("order.created".into())
            .with_content_type("application/json".into())
            .with_delivery_mode(2)
            .with_headers(headers);
        let confirm = broker
            .channel
            .basic_publish(
                "".into(),
                work.as_str().into(),
                BasicPublishOptions::default(),
                body.as_bytes(),
                properties,
            )
            .await?;
        confirms.push(confirm);
        while confirms.len() >= 1024 {
            confirms.next().await.transpose()?;
        }
    }
    while confirms.next().await.transpose()?.is_some() {}
    wait_until(
        "the DLQ holds the backlog",
        Duration::from_secs(300),
        || async { Ok(broker.ready_count(&dlq).await? >= messages) },
    )
    .await?;
    println!("backlog ready in {:.1} s", started.elapsed().as_secs_f64());
    Ok(dlq)
}

/// The broker's raw limit on this machine now: `messages` consumed by a bare
/// lapin consumer with capture's default prefetch, one `basic.ack(multiple)`
/// per 1000, nothing stored. Dead letters per second.
async fn raw_consume(broker: &Broker, dlq: &str, messages: u32) -> anyhow::Result<f64> {
    use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicQosOptions};
    let channel = broker.connection.create_channel().await?;
    channel
        .basic_qos(PREFETCH, BasicQosOptions::default())
        .await?;
    let started = Instant::now();
    let mut consumer = channel
        .basic_consume(
            dlq.into(),
            "raw-bench".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let mut seen = 0u32;
    while seen < messages {
        let delivery = consumer
            .next()
            .await
            .ok_or_else(|| anyhow::anyhow!("the raw consumer ended"))??;
        seen += 1;
        if seen.is_multiple_of(1000) || seen == messages {
            delivery
                .acker
                .ack(BasicAckOptions { multiple: true })
                .await?;
        }
    }
    let rate = f64::from(messages) / started.elapsed().as_secs_f64();
    channel.close(200, "done".into()).await?;
    println!(
        "raw limit: a bare consumer took {messages} in {:.2} s: {rate:.0}/s",
        started.elapsed().as_secs_f64()
    );
    Ok(rate)
}

/// Capture's default prefetch (`--capture-prefetch`).
const PREFETCH: u16 = 4000;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let messages: u32 = std::env::var("REDRIVE_BENCH_MESSAGES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    let broker = Broker::connect().await?;
    let dlq = backlog(&broker, messages).await?;
    let unguarded_dlq = backlog(&broker, messages).await?;
    let raw_dlq = backlog(&broker, messages).await?;
    let raw_rate = raw_consume(&broker, &raw_dlq, messages).await?;
    let unguarded = capture(&broker, &unguarded_dlq, messages, false).await?;
    println!(
        "without the capture guard: {unguarded:.0} dead letters/s; {:.2}× the raw limit",
        unguarded / raw_rate
    );
    let guarded = capture(&broker, &dlq, messages, true).await?;
    println!(
        "with the capture guard (as in service): {guarded:.0} dead letters/s; {:.2}× the raw limit, {:.2}× unguarded",
        guarded / raw_rate,
        guarded / unguarded
    );
    broker.cleanup().await;
    Ok(())
}

/// Captures the backlog in `dlq` into a database of its own with a planner
/// in process; dead letters per second.
async fn capture(broker: &Broker, dlq: &str, messages: u32, guard: bool) -> anyhow::Result<f64> {
    // Create the database and schema before timing.
    let mut bed = TestBed::without_broker(|_| {}).await?;
    bed.planner.halt().await?;
    let pool = bed.pool().await?;

    let started = Instant::now();
    bed.restart_planner(|config| {
        config.capture_queues = vec![dlq.to_owned()];
        config.capture_guard = guard;
        config.message_keys = vec!["json:/order_id".to_owned()];
    })
    .await?;
    wait_until(
        "every dead letter stored",
        Duration::from_secs(600),
        || async {
            let stored: i64 = sqlx::query_scalar("SELECT count(*) FROM dead_letters")
                .fetch_one(&pool)
                .await?;
            Ok(stored >= i64::from(messages))
        },
    )
    .await?;
    let elapsed = started.elapsed();
    bed.planner.halt().await?;
    let left = broker.ready_count(dlq).await?;
    let stored: i64 = sqlx::query_scalar("SELECT count(*) FROM dead_letters")
        .fetch_one(&pool)
        .await?;
    let rate = stored as f64 / elapsed.as_secs_f64();
    println!(
        "captured {stored} dead letters in {:.2} s: {rate:.0} dead letters/s ({left} left in the DLQ)",
        elapsed.as_secs_f64(),
    );
    pool.close().await;
    bed.finish().await?;
    anyhow::ensure!(
        stored == i64::from(messages) && left == 0,
        "capture lost or duplicated dead letters"
    );
    Ok(rate)
}
