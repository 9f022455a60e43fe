//! [`Broker`]: a RabbitMQ connection for a test's setup and assertions, which
//! deletes what it declared.

use std::sync::Mutex;

use anyhow::Context as _;
use lapin::{
    BasicProperties, Channel, Connection, ConnectionProperties, ExchangeKind,
    options::{
        BasicGetOptions, BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions,
        ExchangeDeleteOptions, QueueBindOptions, QueueDeclareOptions, QueueDeleteOptions,
    },
    types::FieldTable,
};

use crate::{AMQP_URL, block_on_aside};

/// A connection to the local RabbitMQ with a confirming channel.
///
/// Dropped without [`Broker::cleanup`] (a test that failed early), it deletes
/// what it declared over a connection of its own.
pub struct Broker {
    /// The connection.
    pub connection: Connection,
    /// A channel in confirm mode: a publish on it answers with a confirm to
    /// await (or drop).
    pub channel: Channel,
    queues: Mutex<Vec<String>>,
    exchanges: Mutex<Vec<String>>,
    url: String,
}

impl Broker {
    /// Connects to the local RabbitMQ.
    ///
    /// # Errors
    /// When RabbitMQ is unreachable.
    pub async fn connect() -> anyhow::Result<Self> {
        Self::connect_to(AMQP_URL).await
    }

    /// Connects to the RabbitMQ at `url` (e.g. another virtual host of the
    /// local broker).
    ///
    /// # Errors
    /// When RabbitMQ is unreachable.
    pub async fn connect_to(url: &str) -> anyhow::Result<Self> {
        let connection = Connection::connect(url, ConnectionProperties::default())
            .await
            .context("connecting to RabbitMQ")?;
        let channel = connection.create_channel().await?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        Ok(Self {
            connection,
            channel,
            queues: Mutex::new(Vec::new()),
            exchanges: Mutex::new(Vec::new()),
            url: url.to_owned(),
        })
    }

    /// Declares a durable queue with `arguments`, deleted by [`Broker::cleanup`].
    ///
    /// # Errors
    /// Broker errors.
    pub async fn queue(&self, name: &str, arguments: FieldTable) -> anyhow::Result<()> {
        self.channel
            .queue_declare(
                name.into(),
                QueueDeclareOptions {
                    durable: true,
                    ..Default::default()
                },
                arguments,
            )
            .await?;
        self.track_queue(name);
        Ok(())
    }

    /// Declares a durable exchange of `kind`, deleted by [`Broker::cleanup`].
    ///
    /// # Errors
    /// Broker errors.
    pub async fn exchange(&self, name: &str, kind: ExchangeKind) -> anyhow::Result<()> {
        self.channel
            .exchange_declare(
                name.into(),
                kind,
                ExchangeDeclareOptions {
                    durable: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await?;
        self.track_exchange(name);
        Ok(())
    }

    /// Binds `queue` to `exchange` with `routing_key`.
    ///
    /// # Errors
    /// Broker errors.
    pub async fn bind(&self, queue: &str, exchange: &str, routing_key: &str) -> anyhow::Result<()> {
        self.channel
            .queue_bind(
                queue.into(),
                exchange.into(),
                routing_key.into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await?;
        Ok(())
    }

    /// Publishes and waits for the publisher confirm.
    ///
    /// # Errors
    /// Broker errors, or a nack.
    pub async fn publish(
        &self,
        exchange: &str,
        routing_key: &str,
        body: &[u8],
        properties: BasicProperties,
    ) -> anyhow::Result<()> {
        let confirm = self
            .channel
            .basic_publish(
                exchange.into(),
                routing_key.into(),
                BasicPublishOptions::default(),
                body,
                properties,
            )
            .await?
            .await?;
        anyhow::ensure!(
            confirm.is_ack(),
            "publish to {exchange}/{routing_key} was nacked"
        );
        Ok(())
    }

    /// Deletes `queue` in [`Broker::cleanup`] (a queue something else declared).
    pub fn track_queue(&self, queue: &str) {
        self.queues.lock().unwrap().push(queue.to_owned());
    }

    /// Deletes `exchange` in [`Broker::cleanup`] (one something else declared).
    pub fn track_exchange(&self, exchange: &str) {
        self.exchanges.lock().unwrap().push(exchange.to_owned());
    }

    /// Ready messages in `queue` (not counting unacked ones).
    ///
    /// # Errors
    /// Broker errors.
    pub async fn ready_count(&self, queue: &str) -> anyhow::Result<u32> {
        let declared = self
            .channel
            .queue_declare(
                queue.into(),
                QueueDeclareOptions {
                    passive: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await?;
        Ok(declared.message_count())
    }

    /// The bodies ready in `queue`, in queue order, taking them out.
    ///
    /// # Errors
    /// Broker errors.
    pub async fn drain(&self, queue: &str) -> anyhow::Result<Vec<Vec<u8>>> {
        let mut bodies = Vec::new();
        while let Some(message) = self
            .channel
            .basic_get(queue.into(), BasicGetOptions { no_ack: true })
            .await?
        {
            bodies.push(message.delivery.data.clone());
        }
        Ok(bodies)
    }

    /// Deletes every queue and exchange this broker declared or tracks.
    pub async fn cleanup(&self) {
        let (queues, exchanges) = self.take_topology();
        delete_topology(&self.channel, queues, exchanges).await;
    }

    /// What is left to delete, leaving nothing.
    fn take_topology(&self) -> (Vec<String>, Vec<String>) {
        (
            std::mem::take(&mut *self.queues.lock().unwrap()),
            std::mem::take(&mut *self.exchanges.lock().unwrap()),
        )
    }
}

/// Dropped without [`Broker::cleanup`] (a test that failed early), it
/// deletes what it declared over a connection of its own
/// ([`block_on_aside`]).
impl Drop for Broker {
    fn drop(&mut self) {
        let (queues, exchanges) = self.take_topology();
        if queues.is_empty() && exchanges.is_empty() {
            return;
        }
        let url = self.url.clone();
        block_on_aside(move || async move {
            let Ok(connection) = Connection::connect(&url, ConnectionProperties::default()).await
            else {
                return;
            };
            if let Ok(channel) = connection.create_channel().await {
                delete_topology(&channel, queues, exchanges).await;
            }
            let _ = connection.close(200, "test cleanup".into()).await;
        });
    }
}

/// Deletes `queues` and `exchanges`, ignoring errors (already gone).
async fn delete_topology(channel: &Channel, queues: Vec<String>, exchanges: Vec<String>) {
    for queue in queues {
        let _ = channel
            .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
            .await;
    }
    for exchange in exchanges {
        let _ = channel
            .exchange_delete(exchange.as_str().into(), ExchangeDeleteOptions::default())
            .await;
    }
}
