//! Publish-with-confirm throughput, side by side in one run: a naive loop
//! (publish, await the confirm, next) against [`Publisher`] with a confirm
//! window of 256.
//!
//! 100,000 persistent 1 KiB messages, each with a message id and 3 headers,
//! to one durable queue on the local RabbitMQ (docs/benchmarks.md).
//! Prints msg/s for each and the process's peak RSS (`VmHWM`); deletes the
//! queue afterwards.
//!
//! `cargo bench -p redrive-executor --bench publish`
//! (`REDRIVE_BENCH_MESSAGES` changes the count, `REDRIVE_AMQP_URL` the broker).

use std::time::{Duration, Instant};

use lapin::{
    BasicProperties, Confirmation, Connection, ConnectionProperties,
    options::{
        BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions, QueueDeleteOptions,
        QueuePurgeOptions,
    },
    types::{AMQPValue, FieldTable, ShortString},
};
use redrive_executor::publisher::{Outgoing, PublishOutcome, Publisher};

const WINDOW: usize = 256;

fn properties(index: usize) -> BasicProperties {
    let mut headers = FieldTable::default();
    headers.insert(
        "redrive-plan-id".into(),
        AMQPValue::LongString("plan-0194f7a2".into()),
    );
    headers.insert("redrive-attempt".into(), AMQPValue::LongInt(1));
    headers.insert(
        "redrive-dead-letter-reason".into(),
        AMQPValue::LongString("rejected".into()),
    );
    BasicProperties::default()
        .with_delivery_mode(2)
        .with_message_id(ShortString::from(format!("bench-{index}")))
        .with_content_type(ShortString::from("application/json"))
        .with_headers(headers)
}

fn body(index: usize) -> Vec<u8> {
    let mut body = format!("{{\"order\":{index},\"pad\":\"").into_bytes();
    body.resize(1022, b'x');
    body.extend_from_slice(b"\"}");
    body
}

/// The process's peak resident set (`VmHWM` in /proc/self/status), in KiB.
fn peak_rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|line| line.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn report(name: &str, messages: usize, elapsed: Duration) {
    let rate = messages as f64 / elapsed.as_secs_f64();
    println!(
        "{name:<40} {messages:>7} messages in {:>7.2} s = {rate:>8.0} msg/s, peak RSS so far {} KiB",
        elapsed.as_secs_f64(),
        peak_rss_kib().map_or_else(|| "?".to_owned(), |kib| kib.to_string())
    );
}

async fn naive(amqp_url: &str, queue: &str, messages: usize) -> anyhow::Result<Duration> {
    let connection = Connection::connect(amqp_url, ConnectionProperties::default()).await?;
    let channel = connection.create_channel().await?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    let started = Instant::now();
    for index in 0..messages {
        let confirmation = channel
            .basic_publish(
                "".into(),
                queue.into(),
                BasicPublishOptions {
                    mandatory: true,
                    immediate: false,
                },
                &body(index),
                properties(index),
            )
            .await?
            .await?;
        anyhow::ensure!(
            matches!(confirmation, Confirmation::Ack(None)),
            "message {index}: {confirmation:?}"
        );
    }
    let elapsed = started.elapsed();
    connection.close(200, "OK".into()).await?;
    Ok(elapsed)
}

async fn windowed(amqp_url: &str, queue: &str, messages: usize) -> anyhow::Result<Duration> {
    let publisher = Publisher::connect(amqp_url, WINDOW).await?;
    // Outcomes are awaited by another task as they come, as the executor
    // does, so the window (not the caller) is what bounds the work in flight.
    let (pendings, mut pendings_received) = tokio::sync::mpsc::channel(WINDOW);
    let outcomes = tokio::spawn(async move {
        let mut sent = 0_usize;
        while let Some(pending) = pendings_received.recv().await {
            match pending.await {
                PublishOutcome::Sent { .. } => sent += 1,
                other => anyhow::bail!("not sent: {other:?}"),
            }
        }
        Ok(sent)
    });
    let started = Instant::now();
    for index in 0..messages {
        let pending = publisher
            .publish(Outgoing {
                exchange: String::new(),
                routing_key: queue.to_owned(),
                body: body(index),
                properties: properties(index),
            })
            .await?;
        pendings.send(pending).await?;
    }
    drop(pendings);
    let sent = outcomes.await??;
    let elapsed = started.elapsed();
    anyhow::ensure!(sent == messages, "{sent} of {messages} sent");
    publisher.close().await?;
    Ok(elapsed)
}

async fn run() -> anyhow::Result<()> {
    let amqp_url = std::env::var("REDRIVE_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned());
    let messages: usize = std::env::var("REDRIVE_BENCH_MESSAGES")
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(100_000);
    let queue = format!(
        "redrive-bench-publish-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    );
    let setup = Connection::connect(&amqp_url, ConnectionProperties::default()).await?;
    let channel = setup.create_channel().await?;
    channel
        .queue_declare(
            queue.as_str().into(),
            QueueDeclareOptions {
                durable: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await?;
    println!(
        "publish + confirm: {messages} persistent 1 KiB messages (message id, 3 headers) to durable queue {queue}"
    );
    println!(
        "peak RSS before publishing: {} KiB",
        peak_rss_kib().map_or_else(|| "?".to_owned(), |kib| kib.to_string())
    );

    let result = async {
        let naive_elapsed = naive(&amqp_url, &queue, messages).await?;
        report(
            "naive (publish, await confirm, next)",
            messages,
            naive_elapsed,
        );
        channel
            .queue_purge(queue.as_str().into(), QueuePurgeOptions::default())
            .await?;
        let windowed_elapsed = windowed(&amqp_url, &queue, messages).await?;
        report(
            &format!("Publisher, window {WINDOW}"),
            messages,
            windowed_elapsed,
        );
        println!(
            "speed-up: {:.1}x",
            naive_elapsed.as_secs_f64() / windowed_elapsed.as_secs_f64()
        );
        anyhow::Ok(())
    }
    .await;

    channel
        .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
        .await?;
    setup.close(200, "OK".into()).await?;
    result
}

fn main() -> anyhow::Result<()> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(run())
}
