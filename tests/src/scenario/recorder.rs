//! Consumers that record every delivery: the fixed fulfilment consumer and
//! the healthy subscriber.

use std::{
    collections::HashSet,
    sync::{Arc, Mutex},
};

use futures::StreamExt;
use lapin::{Connection, options::BasicConsumeOptions, types::FieldTable};
use tokio::{task::JoinHandle, time::Instant};

use crate::unique;

/// A delivery as a consumer saw it.
#[derive(Debug, Clone)]
pub(super) struct Delivery {
    pub(super) at: Instant,
    pub(super) message_id: String,
    pub(super) order_id: String,
    pub(super) plan_id: Option<String>,
}

/// A consumer (auto-ack) that records every delivery until dropped.
pub(super) struct Recorder {
    pub(super) deliveries: Arc<Mutex<Vec<Delivery>>>,
    pub(super) task: JoinHandle<()>,
}

impl Recorder {
    pub(super) async fn start(connection: &Connection, queue: &str) -> anyhow::Result<Self> {
        let channel = connection.create_channel().await?;
        let mut consumer = channel
            .basic_consume(
                queue.into(),
                unique("recorder").as_str().into(),
                BasicConsumeOptions {
                    no_ack: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await?;
        let deliveries = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&deliveries);
        let task = tokio::spawn(async move {
            let _channel = channel;
            while let Some(Ok(delivery)) = consumer.next().await {
                let order_id = serde_json::from_slice::<serde_json::Value>(&delivery.data)
                    .ok()
                    .and_then(|body| body["order_id"].as_str().map(str::to_owned))
                    .unwrap_or_default();
                let plan_id = delivery
                    .properties
                    .headers()
                    .as_ref()
                    .and_then(|headers| headers.inner().get("redrive-plan-id").cloned())
                    .map(|value| match value {
                        lapin::types::AMQPValue::LongString(text) => text.to_string(),
                        other => format!("{other:?}"),
                    });
                sink.lock().expect("recorder lock").push(Delivery {
                    at: Instant::now(),
                    message_id: delivery
                        .properties
                        .message_id()
                        .as_ref()
                        .map(ToString::to_string)
                        .unwrap_or_default(),
                    order_id,
                    plan_id,
                });
            }
        });
        Ok(Self { deliveries, task })
    }

    pub(super) fn len(&self) -> usize {
        self.deliveries.lock().expect("recorder lock").len()
    }

    pub(super) fn distinct_ids(&self) -> usize {
        self.deliveries
            .lock()
            .expect("recorder lock")
            .iter()
            .map(|delivery| delivery.message_id.as_str())
            .collect::<HashSet<_>>()
            .len()
    }

    pub(super) fn deliveries(&self) -> Vec<Delivery> {
        self.deliveries.lock().expect("recorder lock").clone()
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.task.abort();
    }
}
