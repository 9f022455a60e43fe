//! The incident: its shape, the topology, the business state, and the
//! messages the broker dead-letters.

use std::{ops::RangeInclusive, time::Duration};

use anyhow::{Context, ensure};
use futures::StreamExt;
use lapin::{
    BasicProperties, ExchangeKind,
    options::{
        BasicAckOptions, BasicConsumeOptions, BasicRejectOptions, ExchangeDeleteOptions,
        QueueDeleteOptions,
    },
    types::FieldTable,
};
use sqlx::{Postgres, migrate::MigrateDatabase};
use tokio::time::Instant;

use super::{ScenarioConfig, recorder::Recorder};
use crate::{Broker, amqp_table, amqp_text, redis_cleanup};

/// How many orders of each kind the incident has. Orders are numbered from 1:
/// the rejected ones first (of which the first are cancelled, then fulfilled,
/// then with stock reserved, then retried by the producer), then the expired
/// ones, the stale payments and the healthy traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    /// Schema-2 `order.paid` messages the broken consumer rejects.
    pub rejected: u32,
    /// Of the rejected, orders cancelled meanwhile (`blocked_by_state`).
    pub cancelled: u32,
    /// Of the rejected, orders fulfilled meanwhile (`blocked_by_state`).
    pub fulfilled: u32,
    /// Of the rejected, orders with stock reserved but not fulfilled
    /// (`needs_compensation`).
    pub reserved: u32,
    /// Of the rejected (after the three above), orders the producer sent twice,
    /// the second time with a new message id (`duplicate`).
    pub retried: u32,
    /// `order.paid` messages with a 1 ms TTL that expire in the queue.
    pub expired: u32,
    /// `payment.captured` messages 3 h old, past their 2 h deadline (`stale`).
    pub stale_payments: u32,
    /// Schema-1 messages the consumer processes fine (never dead).
    pub healthy: u32,
}

impl Shape {
    /// The demo's incident: 2,050 dead letters, 1,600 of them replayable.
    pub const FULL: Self = Self {
        rejected: 1500,
        cancelled: 100,
        fulfilled: 50,
        reserved: 50,
        retried: 150,
        expired: 300,
        stale_payments: 100,
        healthy: 500,
    };

    /// The end-to-end test's incident: 345 dead letters, 265 replayable.
    pub const SMALL: Self = Self {
        rejected: 240,
        cancelled: 15,
        fulfilled: 10,
        reserved: 10,
        retried: 25,
        expired: 60,
        stale_payments: 20,
        healthy: 50,
    };

    pub(super) fn cancelled_orders(&self) -> RangeInclusive<u32> {
        1..=self.cancelled
    }

    pub(super) fn fulfilled_orders(&self) -> RangeInclusive<u32> {
        let start = self.cancelled + 1;
        start..=start + self.fulfilled - 1
    }

    pub(super) fn reserved_orders(&self) -> RangeInclusive<u32> {
        let start = self.cancelled + self.fulfilled + 1;
        start..=start + self.reserved - 1
    }

    pub(super) fn retried_orders(&self) -> RangeInclusive<u32> {
        let start = self.cancelled + self.fulfilled + self.reserved + 1;
        start..=start + self.retried - 1
    }

    pub(super) fn rejected_orders(&self) -> RangeInclusive<u32> {
        1..=self.rejected
    }

    pub(super) fn expired_orders(&self) -> RangeInclusive<u32> {
        let start = self.rejected + 1;
        start..=start + self.expired - 1
    }

    pub(super) fn stale_orders(&self) -> RangeInclusive<u32> {
        let start = self.rejected + self.expired + 1;
        start..=start + self.stale_payments - 1
    }

    pub(super) fn healthy_orders(&self) -> RangeInclusive<u32> {
        let start = self.rejected + self.expired + self.stale_payments + 1;
        start..=start + self.healthy - 1
    }

    /// Dead letters the broker makes.
    pub fn dead_letters(&self) -> u64 {
        u64::from(self.rejected + self.retried + self.expired + self.stale_payments)
    }

    /// Orders whose dead letter is replayable: rejected and not blocked, plus
    /// the expired ones.
    pub(super) fn replayable_orders(&self) -> impl Iterator<Item = u32> + use<> {
        let first_open = self.cancelled + self.fulfilled + self.reserved + 1;
        (first_open..=self.rejected).chain(self.expired_orders())
    }

    /// Replayable dead letters.
    pub fn replayable(&self) -> u64 {
        u64::from(self.rejected - self.cancelled - self.fulfilled - self.reserved + self.expired)
    }

    /// Messages the healthy subscriber gets from the producer (all but the
    /// expired ones, which expire there too).
    pub(super) fn analytics_traffic(&self) -> usize {
        (self.rejected + self.retried + self.stale_payments + self.healthy) as usize
    }

    pub(super) fn check(&self) -> anyhow::Result<()> {
        ensure!(
            self.cancelled + self.fulfilled + self.reserved + self.retried <= self.rejected,
            "the cancelled, fulfilled, reserved and retried orders are among the rejected ones"
        );
        ensure!(
            self.cancelled > 0
                && self.fulfilled > 0
                && self.reserved > 0
                && self.retried > 0
                && self.expired > 0
                && self.stale_payments > 0
                && self.healthy > 0,
            "every kind of order is in the incident"
        );
        Ok(())
    }
}

pub(super) fn count(range: &RangeInclusive<u32>) -> u64 {
    u64::from(range.end() - range.start() + 1)
}

pub(super) fn message_id(order: u32) -> String {
    format!("msg-{order}")
}

/// The producer's second attempt gets a new message id: only the message key
/// (the order id and event type) says it is the same order.
pub(super) fn retry_message_id(order: u32) -> String {
    format!("msg-{order}-retry")
}

pub(super) async fn reset(config: &ScenarioConfig, broker: &Broker) -> anyhow::Result<()> {
    for queue in ["fulfilment", "fulfilment.dlq", "analytics"] {
        let channel = broker.connection.create_channel().await?;
        let _ = channel
            .queue_delete(
                config.name(queue).as_str().into(),
                QueueDeleteOptions::default(),
            )
            .await;
    }
    for exchange in ["orders", "dlx"] {
        let channel = broker.connection.create_channel().await?;
        let _ = channel
            .exchange_delete(
                config.name(exchange).as_str().into(),
                ExchangeDeleteOptions::default(),
            )
            .await;
    }
    if Postgres::database_exists(&config.database_url).await? {
        Postgres::force_drop_database(&config.database_url).await?;
    }
    Postgres::create_database(&config.database_url).await?;
    redis_cleanup(&config.redis_prefix)
        .await
        .context("Redis on 127.0.0.1:6379 (run scripts/services.sh)")?;
    Ok(())
}

pub(super) async fn business_state(pool: &sqlx::PgPool, shape: &Shape) -> anyhow::Result<()> {
    crate::orders_hook::OrdersHook::create_schema(pool).await?;
    for (range, status, reserved, fulfilled) in [
        (shape.cancelled_orders(), "CANCELLED", false, false),
        (shape.fulfilled_orders(), "SHIPPED", true, true),
        (shape.reserved_orders(), "PAID", true, false),
    ] {
        sqlx::query(
            "INSERT INTO orders (order_id, status, stock_reserved, fulfilled) \
             SELECT 'o-' || g, $3, $4, $5 FROM generate_series($1::int, $2::int) g",
        )
        .bind(i32::try_from(*range.start())?)
        .bind(i32::try_from(*range.end())?)
        .bind(status)
        .bind(reserved)
        .bind(fulfilled)
        .execute(pool)
        .await?;
    }
    Ok(())
}

pub(super) fn order(order_id: u32, event_type: &str, schema: &str) -> (Vec<u8>, BasicProperties) {
    let body = format!(
        r#"{{"order_id":"o-{order_id}","amount_cents":{},"currency":"EUR"}}"#,
        1000 + order_id
    );
    let properties = BasicProperties::default()
        .with_message_id(message_id(order_id).into())
        .with_type(event_type.into())
        .with_app_id("checkout".into())
        .with_content_type("application/json".into())
        .with_delivery_mode(2)
        .with_timestamp(u64::try_from(chrono::Utc::now().timestamp()).unwrap_or_default())
        .with_headers(amqp_table(vec![("schema-version", amqp_text(schema))]));
    (body.into_bytes(), properties)
}

/// Declares the topology and makes the incident; returns the healthy
/// subscriber's recorder, which has received all of the producer's traffic.
pub(super) async fn incident(config: &ScenarioConfig, broker: &Broker) -> anyhow::Result<Recorder> {
    let shape = &config.shape;
    let exchange = config.name("orders");
    let dlx = config.name("dlx");
    let dlq = config.name("fulfilment.dlq");
    let fulfilment = config.name("fulfilment");
    let analytics = config.name("analytics");
    broker.exchange(&exchange, ExchangeKind::Topic).await?;
    broker.exchange(&dlx, ExchangeKind::Fanout).await?;
    broker.queue(&dlq, FieldTable::default()).await?;
    broker.bind(&dlq, &dlx, "").await?;
    broker
        .queue(
            &fulfilment,
            amqp_table(vec![("x-dead-letter-exchange", amqp_text(&dlx))]),
        )
        .await?;
    broker.queue(&analytics, FieldTable::default()).await?;
    for (queue, key) in [
        (&fulfilment, "order.#"),
        (&fulfilment, "payment.#"),
        (&analytics, "#"),
    ] {
        broker.bind(queue, &exchange, key).await?;
    }

    // Expiring orders go first, while nobody consumes: their 1 ms TTL runs out
    // (in the analytics queue too, which has no dead-letter exchange).
    for order_id in shape.expired_orders() {
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
    tokio::time::sleep(Duration::from_millis(50)).await;
    let analytics_recorder = Recorder::start(&broker.connection, &analytics).await?;
    // The broken consumer: schema 2 is rejected, without requeue (the bug).
    let channel = broker.connection.create_channel().await?;
    channel.basic_qos(200, Default::default()).await?;
    let mut consumer = channel
        .basic_consume(
            fulfilment.as_str().into(),
            "broken-fulfilment".into(),
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
                .and_then(|headers| headers.inner().get("schema-version").cloned());
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
    let retried = shape.retried_orders();
    for order_id in shape.rejected_orders() {
        let (body, properties) = order(order_id, "order.paid", "2");
        broker
            .publish(&exchange, "order.paid", &body, properties.clone())
            .await?;
        if retried.contains(&order_id) {
            // The producer timed out waiting for the confirm and sent the
            // order again, with a new message id.
            broker
                .publish(
                    &exchange,
                    "order.paid",
                    &body,
                    properties.with_message_id(retry_message_id(order_id).into()),
                )
                .await?;
        }
    }
    let three_hours_ago = (chrono::Utc::now() - chrono::Duration::hours(3)).timestamp();
    for order_id in shape.stale_orders() {
        let (body, properties) = order(order_id, "payment.captured", "2");
        broker
            .publish(
                &exchange,
                "payment.captured",
                &body,
                properties.with_timestamp(u64::try_from(three_hours_ago).unwrap_or_default()),
            )
            .await?;
    }
    for order_id in shape.healthy_orders() {
        let (body, properties) = order(order_id, "order.paid", "1");
        broker
            .publish(&exchange, "order.paid", &body, properties)
            .await?;
    }
    let expected = shape.dead_letters();
    let deadline = Instant::now() + Duration::from_secs(60);
    while u64::from(broker.ready_count(&dlq).await?) < expected {
        ensure!(
            Instant::now() < deadline,
            "the broker did not dead-letter {expected} messages in 60 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    channel.close(200, "incident made".into()).await?;
    consuming.abort();
    let traffic = shape.analytics_traffic();
    while analytics_recorder.len() < traffic {
        ensure!(
            Instant::now() < deadline,
            "the healthy subscriber got {} of {traffic} messages in 60 s",
            analytics_recorder.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!(
        "   the broker dead-lettered {expected} messages into {dlq}; the healthy subscriber \
         {analytics} processed the {traffic} messages it got\n   the fix for schema 2 is deployed"
    );
    Ok(analytics_recorder)
}
