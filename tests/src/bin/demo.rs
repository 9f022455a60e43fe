//! `redrive-demo`: Redrive's main job on this machine's local services, with
//! the real binaries as separate processes.
//!
//! 1. Sets up an order-fulfilment topology in RabbitMQ: exchange
//!    `redrive-demo.orders`, queue `redrive-demo.fulfilment` dead-lettering to
//!    `redrive-demo.fulfilment.dlq`, and a healthy subscriber
//!    `redrive-demo.analytics` on the same exchange; an `orders` table for the
//!    example state-check hook in database `redrive_demo`.
//! 2. Causes an incident: a fulfilment consumer that rejects every schema-2
//!    message, producer retries that repeat order keys, messages that expire,
//!    orders cancelled, fulfilled or half-fulfilled meanwhile, and payments too
//!    old to matter: 2,050 dead letters made by the broker.
//! 3. Starts `redrive-planner` and `redrive-example-orders-hook`, captures the
//!    DLQ, and shows `redrivectl dead-letters summary` and `redrivectl
//!    precheck`.
//! 4. Checks its own result (every dead letter captured once, the DLQ empty,
//!    each verdict count as the incident implies) and exits non-zero when
//!    something is off. It leaves no process running and can run again.

use std::{
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

use anyhow::{Context, bail, ensure};
use futures::StreamExt;
use lapin::{
    BasicProperties, ExchangeKind,
    options::{
        BasicAckOptions, BasicConsumeOptions, BasicRejectOptions, ExchangeDeleteOptions,
        QueueDeleteOptions,
    },
    types::FieldTable,
};
use redrive_proto::v1::{self, planner_client::PlannerClient};
use redrive_tests::{Broker, amqp_table, amqp_text};
use sqlx::{Postgres, migrate::MigrateDatabase};
use tokio::process::{Child, Command};

const PREFIX: &str = "redrive-demo";
const DATABASE_URL: &str = "postgres://postgres@127.0.0.1:5432/redrive_demo";
const PLANNER_ADDR: &str = "127.0.0.1:50151";
const HOOK_ADDR: &str = "127.0.0.1:50161";

/// The incident's shape, and what the precheck must conclude from it.
const REJECTED_ORDERS: u32 = 1500; // o-1..=o-1500, schema 2: rejected by the consumer
const RETRIED: std::ops::RangeInclusive<u32> = 201..=350; // published twice by the producer
const EXPIRED: std::ops::RangeInclusive<u32> = 1501..=1800; // 1 ms TTL, expire before consumption
const STALE_PAYMENTS: std::ops::RangeInclusive<u32> = 1801..=1900; // payments 3 h old
const HEALTHY: std::ops::RangeInclusive<u32> = 1901..=2400; // schema 1: processed fine
const CANCELLED: std::ops::RangeInclusive<u32> = 1..=100;
const FULFILLED: std::ops::RangeInclusive<u32> = 101..=150;
const RESERVED: std::ops::RangeInclusive<u32> = 151..=200;

fn name(suffix: &str) -> String {
    format!("{PREFIX}.{suffix}")
}

fn count(range: &std::ops::RangeInclusive<u32>) -> u64 {
    u64::from(range.end() - range.start() + 1)
}

/// A child process stopped with SIGTERM (then killed) when dropped.
struct Process {
    name: &'static str,
    child: Child,
}

impl Process {
    fn spawn(name: &'static str, program: &Path, args: &[&str]) -> anyhow::Result<Self> {
        let child = Command::new(program)
            .args(args)
            .env("REDRIVE_LOG", "warn")
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", program.display()))?;
        Ok(Self { name, child })
    }

    async fn stop(mut self) -> anyhow::Result<()> {
        if let Some(pid) = self.child.id() {
            let _ = Command::new("kill")
                .arg("-TERM")
                .arg(pid.to_string())
                .status()
                .await;
        }
        match tokio::time::timeout(Duration::from_secs(15), self.child.wait()).await {
            Ok(status) => {
                let status = status?;
                ensure!(status.success(), "{} exited with {status}", self.name);
            }
            Err(_) => {
                self.child.start_kill()?;
                bail!("{} did not stop within 15 s of SIGTERM", self.name);
            }
        }
        Ok(())
    }
}

fn binary(name: &str) -> anyhow::Result<PathBuf> {
    let path = std::env::current_exe()?.with_file_name(name);
    ensure!(
        path.exists(),
        "{} is missing: run `cargo build --bins` first (scripts/demo.sh does)",
        path.display()
    );
    Ok(path)
}

async fn redrivectl(args: &[&str]) -> anyhow::Result<String> {
    let output = Command::new(binary("redrivectl")?)
        .args([
            "--planner",
            &format!("http://{PLANNER_ADDR}"),
            "--actor",
            "demo-operator",
        ])
        .args(args)
        .output()
        .await?;
    ensure!(
        output.status.success(),
        "redrivectl {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(String::from_utf8(output.stdout)?)
}

fn order(order_id: u32, event_type: &str, schema: &str) -> (Vec<u8>, BasicProperties) {
    let body = format!(
        r#"{{"order_id":"o-{order_id}","amount_cents":{},"currency":"EUR"}}"#,
        1000 + order_id
    );
    let properties = BasicProperties::default()
        .with_message_id(format!("msg-{order_id}").into())
        .with_type(event_type.into())
        .with_app_id("checkout".into())
        .with_content_type("application/json".into())
        .with_delivery_mode(2)
        .with_timestamp(chrono::Utc::now().timestamp() as u64)
        .with_headers(amqp_table(vec![("schema-version", amqp_text(schema))]));
    (body.into_bytes(), properties)
}

async fn reset(broker: &Broker) -> anyhow::Result<()> {
    for queue in ["fulfilment", "fulfilment.dlq", "analytics"] {
        let channel = broker.connection.create_channel().await?;
        let _ = channel
            .queue_delete(name(queue).as_str().into(), QueueDeleteOptions::default())
            .await;
    }
    for exchange in ["orders", "dlx"] {
        let channel = broker.connection.create_channel().await?;
        let _ = channel
            .exchange_delete(
                name(exchange).as_str().into(),
                ExchangeDeleteOptions::default(),
            )
            .await;
    }
    if Postgres::database_exists(DATABASE_URL).await? {
        Postgres::force_drop_database(DATABASE_URL).await?;
    }
    Postgres::create_database(DATABASE_URL).await?;
    Ok(())
}

async fn incident(broker: &Broker) -> anyhow::Result<u64> {
    let exchange = name("orders");
    broker.exchange(&exchange, ExchangeKind::Topic).await?;
    broker.exchange(&name("dlx"), ExchangeKind::Fanout).await?;
    broker
        .queue(&name("fulfilment.dlq"), FieldTable::default())
        .await?;
    broker
        .bind(&name("fulfilment.dlq"), &name("dlx"), "")
        .await?;
    broker
        .queue(
            &name("fulfilment"),
            amqp_table(vec![("x-dead-letter-exchange", amqp_text(&name("dlx")))]),
        )
        .await?;
    broker
        .queue(&name("analytics"), FieldTable::default())
        .await?;
    for (queue, key) in [
        ("fulfilment", "order.#"),
        ("fulfilment", "payment.#"),
        ("analytics", "#"),
    ] {
        broker.bind(&name(queue), &exchange, key).await?;
    }

    // Expiring orders go first, while nobody consumes: their 1 ms TTL runs out.
    for order_id in EXPIRED {
        let (body, properties) = order(order_id, "order.paid", "2");
        broker
            .publish(
                &exchange,
                "order.paid",
                &body,
                properties.with_expiration("1".into()),
            )
            .await?;
    }
    // The broken consumer: schema 2 is rejected, without requeue (the bug).
    let channel = broker.connection.create_channel().await?;
    channel.basic_qos(200, Default::default()).await?;
    let mut consumer = channel
        .basic_consume(
            name("fulfilment").as_str().into(),
            "demo-fulfilment".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let consuming = tokio::spawn(async move {
        while let Some(Ok(delivery)) = consumer.next().await {
            let schema = delivery
                .properties
                .headers()
                .as_ref()
                .and_then(|h| h.inner().get("schema-version").cloned());
            if schema == Some(amqp_text("2")) {
                let _ = delivery
                    .acker
                    .reject(BasicRejectOptions { requeue: false })
                    .await;
            } else {
                let _ = delivery.acker.ack(BasicAckOptions::default()).await;
            }
        }
    });
    for order_id in 1..=REJECTED_ORDERS {
        let (body, properties) = order(order_id, "order.paid", "2");
        broker
            .publish(&exchange, "order.paid", &body, properties.clone())
            .await?;
        if RETRIED.contains(&order_id) {
            // The producer timed out waiting and sent the same order again.
            broker
                .publish(&exchange, "order.paid", &body, properties)
                .await?;
        }
    }
    let three_hours_ago = (chrono::Utc::now() - chrono::Duration::hours(3)).timestamp() as u64;
    for order_id in STALE_PAYMENTS {
        let (body, properties) = order(order_id, "payment.captured", "2");
        broker
            .publish(
                &exchange,
                "payment.captured",
                &body,
                properties.with_timestamp(three_hours_ago),
            )
            .await?;
    }
    for order_id in HEALTHY {
        let (body, properties) = order(order_id, "order.paid", "1");
        broker
            .publish(&exchange, "order.paid", &body, properties)
            .await?;
    }
    let expected =
        u64::from(REJECTED_ORDERS) + count(&RETRIED) + count(&EXPIRED) + count(&STALE_PAYMENTS);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while u64::from(broker.ready_count(&name("fulfilment.dlq")).await?) < expected {
        ensure!(
            tokio::time::Instant::now() < deadline,
            "the broker did not dead-letter {expected} messages in 60 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    channel.close(200, "incident made".into()).await?;
    consuming.abort();
    Ok(expected)
}

async fn business_state(pool: &sqlx::PgPool) -> anyhow::Result<()> {
    redrive_tests::orders_hook::OrdersHook::create_schema(pool).await?;
    for (range, status, reserved, fulfilled) in [
        (CANCELLED, "CANCELLED", false, false),
        (FULFILLED, "SHIPPED", true, true),
        (RESERVED, "PAID", true, false),
    ] {
        sqlx::query(
            "INSERT INTO orders (order_id, status, stock_reserved, fulfilled) \
             SELECT 'o-' || g, $3, $4, $5 FROM generate_series($1::int, $2::int) g",
        )
        .bind(*range.start() as i32)
        .bind(*range.end() as i32)
        .bind(status)
        .bind(reserved)
        .bind(fulfilled)
        .execute(pool)
        .await?;
    }
    Ok(())
}

async fn planner_client() -> anyhow::Result<PlannerClient<tonic::transport::Channel>> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        match PlannerClient::connect(format!("http://{PLANNER_ADDR}")).await {
            Ok(client) => return Ok(client),
            Err(error) if tokio::time::Instant::now() >= deadline => {
                bail!("planner did not come up: {error}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let broker = Broker::connect()
        .await
        .context("RabbitMQ on 127.0.0.1:5672 (run scripts/services.sh)")?;
    println!("== 1. topology and business state (database redrive_demo)");
    reset(&broker).await?;
    let pool = sqlx::PgPool::connect(DATABASE_URL).await?;
    business_state(&pool).await?;

    println!("== 2. incident: a fulfilment consumer rejects every schema-2 message");
    let expected = incident(&broker).await?;
    println!(
        "   the broker dead-lettered {expected} messages into {}",
        name("fulfilment.dlq")
    );

    println!("== 3. planner and the orders state-check hook start; capture");
    let hook = Process::spawn(
        "redrive-example-orders-hook",
        &binary("redrive-example-orders-hook")?,
        &["--listen", HOOK_ADDR, "--database-url", DATABASE_URL],
    )?;
    let dlq = name("fulfilment.dlq");
    let planner = Process::spawn(
        "redrive-planner",
        &binary("redrive-planner")?,
        &[
            "--listen",
            PLANNER_ADDR,
            "--database-url",
            DATABASE_URL,
            "--capture-queue",
            &dlq,
            "--message-key",
            "json:/order_id",
            "--state-check",
            &format!("order.*=http://{HOOK_ADDR}"),
        ],
    )?;
    let outcome = run(&broker, &dlq, expected).await;
    let stopped_planner = planner.stop().await;
    let stopped_hook = hook.stop().await;
    pool.close().await;
    broker.cleanup().await;
    outcome?;
    stopped_planner?;
    stopped_hook?;
    println!("== done: every check passed; no process left running");
    Ok(())
}

async fn run(broker: &Broker, dlq: &str, expected: u64) -> anyhow::Result<()> {
    let mut client = planner_client().await?;
    let selector = v1::Selector {
        sources: vec![dlq.to_owned()],
        ..Default::default()
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let summary = client
            .summarize_dead_letters(v1::SummarizeDeadLettersRequest {
                selector: Some(selector.clone()),
                group_by: vec![],
            })
            .await;
        if let Ok(summary) = summary
            && summary.get_ref().total >= expected
        {
            break;
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "capture did not finish within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    println!(
        "{}",
        redrivectl(&[
            "dead-letters",
            "summary",
            "--source",
            dlq,
            "--group-by",
            "reason,event_type"
        ])
        .await?
    );

    println!("== 4. precheck (payments older than 2 h are stale)");
    println!(
        "{}",
        redrivectl(&["precheck", "--source", dlq, "--stale-after", "payment.*=2h"]).await?
    );
    let report: serde_json::Value = serde_json::from_str(
        &redrivectl(&[
            "--json",
            "precheck",
            "--source",
            dlq,
            "--stale-after",
            "payment.*=2h",
        ])
        .await?,
    )?;

    println!("== 5. checks");
    let mut failures = Vec::new();
    let mut check = |what: &str, actual: u64, wanted: u64| {
        let mark = if actual == wanted { "ok  " } else { "FAIL" };
        println!("   {mark} {what}: {actual} (expected {wanted})");
        if actual != wanted {
            failures.push(what.to_owned());
        }
    };
    check(
        "dead letters captured",
        report["total"].as_u64().unwrap_or_default(),
        expected,
    );
    check(
        "left in the DLQ",
        u64::from(broker.ready_count(dlq).await?),
        0,
    );
    let counts = &report["counts"];
    let verdict = |name: &str| counts[name].as_u64().unwrap_or_default();
    let blocked = count(&CANCELLED) + count(&FULFILLED);
    let not_replayable = count(&RETRIED) + count(&STALE_PAYMENTS) + blocked + count(&RESERVED);
    check(
        "duplicate (producer retries)",
        verdict("duplicate"),
        count(&RETRIED),
    );
    check(
        "stale (payments past 2 h)",
        verdict("stale"),
        count(&STALE_PAYMENTS),
    );
    check(
        "blocked_by_state (cancelled or fulfilled)",
        verdict("blocked_by_state"),
        blocked,
    );
    check(
        "needs_compensation (stock reserved)",
        verdict("needs_compensation"),
        count(&RESERVED),
    );
    check(
        "replayable",
        verdict("replayable"),
        expected - not_replayable,
    );
    check("invalid", verdict("invalid"), 0);
    ensure!(
        failures.is_empty(),
        "checks failed: {}",
        failures.join(", ")
    );
    println!(
        "   next: redrivectl plan create --precheck {} --rate 200 --burst 20 --rationale '...', then plan approve with the digest and start redrive-executor",
        report["precheck_id"].as_str().unwrap_or_default()
    );
    Ok(())
}
