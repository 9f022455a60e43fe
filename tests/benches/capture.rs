//! Capture benchmark: a backlog of 1 KiB dead letters, made by the broker itself
//! (TTL 0 on a work queue with a dead-letter exchange), captured from the DLQ
//! into a fresh PostgreSQL database by an in-process planner.
//!
//! Run: `cargo bench -p redrive-tests --bench capture` (`REDRIVE_BENCH_MESSAGES`
//! sets the backlog, default 100000). Prints the capture rate in dead letters
//! per second, from the planner's start until every dead letter is stored and
//! the DLQ is empty.

use std::time::{Duration, Instant};

use futures::{StreamExt, stream::FuturesUnordered};
use lapin::{
    BasicProperties,
    options::BasicPublishOptions,
    types::{AMQPValue, FieldTable, LongString, ShortString},
};
use redrive_planner::Config;
use redrive_tests::{AMQP_URL, Broker, PlannerHandle, TestDb, unique, wait_until};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let messages: u32 = std::env::var("REDRIVE_BENCH_MESSAGES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    let db = TestDb::new();
    let broker = Broker::connect().await?;
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

    let mut config = Config::for_database(db.url());
    config.amqp_url = AMQP_URL.to_owned();
    config.capture_queues = vec![dlq.clone()];
    config.message_keys = vec!["json:/order_id".to_owned()];
    // Create the database and schema before timing.
    PlannerHandle::start(Config::for_database(db.url()))
        .await?
        .stop()
        .await?;
    let pool = db.pool().await?;

    let started = Instant::now();
    let planner = PlannerHandle::start(config).await?;
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
    planner.stop().await?;
    let left = broker.ready_count(&dlq).await?;
    let stored: i64 = sqlx::query_scalar("SELECT count(*) FROM dead_letters")
        .fetch_one(&pool)
        .await?;
    println!(
        "captured {stored} dead letters in {:.2} s: {:.0} dead letters/s ({left} left in the DLQ)",
        elapsed.as_secs_f64(),
        stored as f64 / elapsed.as_secs_f64()
    );
    pool.close().await;
    broker.cleanup().await;
    db.drop_database().await;
    anyhow::ensure!(
        stored == i64::from(messages) && left == 0,
        "capture lost or duplicated dead letters"
    );
    Ok(())
}
