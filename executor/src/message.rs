//! The replayed message (docs/design.md, "The replayed message"): same body
//! bytes, message id, correlation id, content type and encoding, type, app id,
//! timestamp, priority and application headers; persistent; without the
//! fields the broker would act on again ([`BROKER_FIELDS`]: `CC`/`BCC`,
//! `expiration`, the death and delay headers); with `redrive-*` headers and a
//! W3C `traceparent`.

use lapin::{
    BasicProperties,
    types::{AMQPValue, FieldTable, LongString, ShortString},
};
use redrive_proto::{amqp, v1};

/// Headers a replay adds: their one home is [`redrive_proto::headers`].
pub use redrive_proto::headers::{
    ATTEMPT_HEADER, COUNT_HEADER, EXECUTOR_ID_HEADER, PLAN_ID_HEADER, REASON_HEADER,
    TRACEPARENT_HEADER,
};

/// What a replay does with one broker-interpreted field of the captured message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Treatment {
    /// Republished byte-identical.
    Kept,
    /// Not republished.
    Dropped,
}

/// How a field is named in [`BROKER_FIELDS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldName {
    /// An AMQP basic property, by its AMQP 0-9-1 name.
    Property(&'static str),
    /// A header, matched exactly (RabbitMQ compares header names byte-wise).
    Header(&'static str),
    /// Every header whose name starts with this prefix.
    HeaderPrefix(&'static str),
}

/// One row of the replayed-message table: a field RabbitMQ interprets when a
/// message is published, what a replay does with it and why.
#[derive(Debug, Clone, Copy)]
pub struct BrokerField {
    /// The property or header.
    pub name: FieldName,
    /// Kept or dropped.
    pub treatment: Treatment,
    /// Why, with the RabbitMQ documentation section the rule comes from.
    pub why: &'static str,
}

/// THE table of the replayed message (docs/design.md, "The replayed message"):
/// every property and header the broker acts on at publish time. A replay must
/// reach only the queue the message failed in and be accepted by the broker;
/// everything not listed here (message id, correlation id, content type and
/// encoding, type, app id, timestamp, priority, reply-to, cluster id, the
/// application's headers) is republished byte-identical. `delivery_mode` is
/// always 2 (persistent). Redrive adds its own `redrive-*` headers and a
/// `traceparent` (see the constants above).
///
/// The planner's precheck reads the same rules from the captured message:
/// a `user_id` other than the user Redrive publishes as is `invalid` there,
/// since the broker would refuse every attempt.
pub const BROKER_FIELDS: &[BrokerField] = &[
    BrokerField {
        name: FieldName::Header("CC"),
        treatment: Treatment::Dropped,
        why: "sender-selected distribution: the broker routes a copy to every queue the CC \
              routing keys reach, so a replay would hand healthy queues a second copy \
              (rabbitmq.com/docs/sender-selected, \"Sender-selected Distribution\")",
    },
    BrokerField {
        name: FieldName::Header("BCC"),
        treatment: Treatment::Dropped,
        why: "sender-selected distribution, like CC, and removed by the broker before \
              delivery (rabbitmq.com/docs/sender-selected)",
    },
    BrokerField {
        name: FieldName::Property("user_id"),
        treatment: Treatment::Kept,
        why: "validated user-id: the broker refuses a publish whose user_id is not the \
              connection's user (rabbitmq.com/docs/validated-user-id); kept because \
              consumers trust it, and the precheck marks it invalid when it differs \
              from the user Redrive publishes as",
    },
    BrokerField {
        name: FieldName::Property("expiration"),
        treatment: Treatment::Dropped,
        why: "per-message TTL: the broker discards or dead-letters the message when it \
              runs out; RabbitMQ itself removes it when it dead-letters a message so that \
              it does not expire again (rabbitmq.com/docs/ttl, \"Per-Message TTL in \
              Publishers\"; rabbitmq.com/docs/dlx, \"Dead-Lettered Messages\"); the \
              precheck's stale rule decides instead",
    },
    BrokerField {
        name: FieldName::Header(redrive_proto::headers::X_DEATH),
        treatment: Treatment::Dropped,
        why: "the broker's dead-lettering history; it restarts with the replay and \
              RabbitMQ 3.13+ ignores or refuses it from publishers \
              (rabbitmq.com/docs/dlx, \"Dead-Lettered Messages\")",
    },
    BrokerField {
        name: FieldName::HeaderPrefix(redrive_proto::headers::FIRST_DEATH_PREFIX),
        treatment: Treatment::Dropped,
        why: "the broker's dead-lettering history (rabbitmq.com/docs/dlx)",
    },
    BrokerField {
        name: FieldName::HeaderPrefix(redrive_proto::headers::LAST_DEATH_PREFIX),
        treatment: Treatment::Dropped,
        why: "the broker's dead-lettering history (rabbitmq.com/docs/dlx)",
    },
    BrokerField {
        name: FieldName::Header("x-delivery-count"),
        treatment: Treatment::Dropped,
        why: "quorum queues count deliveries in it; a replay is a new message whose count \
              starts again (rabbitmq.com/docs/quorum-queues, \"Poison Message Handling\")",
    },
    BrokerField {
        name: FieldName::Header("x-delay"),
        treatment: Treatment::Dropped,
        why: "the delayed-message exchange plugin holds a message that long before \
              routing it; the delay was served on the first publish \
              (github.com/rabbitmq/rabbitmq-delayed-message-exchange, README \"Usage\")",
    },
    BrokerField {
        name: FieldName::Header("x-received-from"),
        treatment: Treatment::Dropped,
        why: "federation's loop detection: a replay carrying it may be refused by a \
              federated exchange as already seen (rabbitmq.com/docs/federated-exchanges, \
              \"Loop Detection\")",
    },
    BrokerField {
        name: FieldName::Header("x-match"),
        treatment: Treatment::Kept,
        why: "a headers exchange reads x-match from the binding's arguments, never from \
              the message, and ignores x- headers when matching \
              (rabbitmq.com/tutorials/amqp-concepts, \"Headers Exchange\"); kept as an \
              application header",
    },
];

/// Whether the replay drops header `name` ([`BROKER_FIELDS`]).
pub fn drops_header(name: &str) -> bool {
    BROKER_FIELDS.iter().any(|field| {
        field.treatment == Treatment::Dropped
            && match field.name {
                FieldName::Header(header) => header == name,
                FieldName::HeaderPrefix(prefix) => name.starts_with(prefix),
                FieldName::Property(_) => false,
            }
    })
}

/// Whether the replay drops property `name` ([`BROKER_FIELDS`]).
pub fn drops_property(name: &str) -> bool {
    BROKER_FIELDS.iter().any(|field| {
        field.treatment == Treatment::Dropped
            && matches!(field.name, FieldName::Property(property) if property == name)
    })
}

/// A W3C `traceparent` naming no span: version 00, random trace and span
/// ids, sampled. Replays carry it when this executor exports no spans
/// (no `OTEL_EXPORTER_OTLP_ENDPOINT`); with spans on they carry their
/// publish span's ([`publish_span`]).
pub fn traceparent() -> String {
    let trace = uuid::Uuid::new_v4().simple().to_string();
    let span = &uuid::Uuid::new_v4().simple().to_string()[..16];
    format!("00-{trace}-{span}-01")
}

/// The `traceparent` the dead letter carried from its original producer,
/// if any (a text header).
pub fn original_traceparent(item: &v1::SliceItem) -> Option<String> {
    let headers = item.dead_letter.as_ref()?.headers.as_ref()?;
    match headers.fields.get(TRACEPARENT_HEADER)?.value.as_ref()? {
        v1::header_value::Value::LongString(bytes) => String::from_utf8(bytes.clone()).ok(),
        v1::header_value::Value::ShortString(text) => Some(text.clone()),
        _ => None,
    }
}

/// The producer span of one publish, as the OpenTelemetry messaging
/// semantic conventions name it for RabbitMQ: `publish {exchange}` (or
/// `publish amq.default` for the default exchange), kind producer, with
/// `messaging.system`, `messaging.operation.type` / `.name`,
/// `messaging.destination.name` (the exchange, `amq.default` for the
/// default one),
/// `messaging.rabbitmq.destination.routing_key`, `messaging.message.id`,
/// and the plan and slice ids; a child of `parent` (the slice span's
/// context), linked to the dead letter's own `traceparent` when it carried
/// one. It ends at the publish's final outcome ([`end_publish_span`]) or
/// when dropped.
///
/// Made with the OpenTelemetry API directly, by `tracer`, not through
/// `tracing`: a span per message through the `tracing` bridge cost the
/// executor about a third more CPU per message (`cargo bench -p
/// redrive-tests --bench telemetry`).
pub fn publish_span(
    tracer: &opentelemetry::global::BoxedTracer,
    parent: &opentelemetry::Context,
    plan_id: &str,
    slice_id: &str,
    item: &v1::SliceItem,
) -> opentelemetry::global::BoxedSpan {
    use opentelemetry::{
        KeyValue,
        trace::{Link, SpanKind, Tracer as _},
    };
    let exchange = if item.exchange.is_empty() {
        "amq.default"
    } else {
        item.exchange.as_str()
    };
    let message_id = item
        .dead_letter
        .as_ref()
        .and_then(|dead_letter| dead_letter.properties.as_ref())
        .and_then(|properties| properties.message_id.as_deref())
        .unwrap_or_default();
    let mut builder = tracer
        .span_builder(format!("publish {exchange}"))
        .with_kind(SpanKind::Producer)
        .with_attributes([
            KeyValue::new("messaging.system", "rabbitmq"),
            KeyValue::new("messaging.operation.type", "send"),
            KeyValue::new("messaging.operation.name", "publish"),
            KeyValue::new("messaging.destination.name", exchange.to_owned()),
            KeyValue::new(
                "messaging.rabbitmq.destination.routing_key",
                item.routing_key.clone(),
            ),
            KeyValue::new("messaging.message.id", message_id.to_owned()),
            KeyValue::new("redrive.plan.id", plan_id.to_owned()),
            KeyValue::new("redrive.slice.id", slice_id.to_owned()),
        ]);
    if let Some(original) = original_traceparent(item)
        .as_deref()
        .and_then(redrive_proto::telemetry::parse_traceparent)
    {
        builder = builder.with_links(vec![Link::with_context(original)]);
    }
    builder.start_with_context(tracer, parent)
}

/// Ends a publish span at its outcome: with `error` (`nacked`,
/// `unroutable`, `uncertain`) as `error.type` and an error status when the
/// publish was not acked and routed.
pub fn end_publish_span(mut span: opentelemetry::global::BoxedSpan, error: Option<&'static str>) {
    use opentelemetry::trace::{Span as _, Status};
    if let Some(error) = error {
        span.set_attribute(opentelemetry::KeyValue::new("error.type", error));
        span.set_status(Status::error(error));
    }
    span.end();
}

fn text(value: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(value.as_bytes().to_vec()))
}

/// The AMQP properties of the replay of `item`, attempt `attempt` of plan
/// `plan_id`, published by `executor_id`, carrying `traceparent`.
///
/// # Errors
/// A stored header or property that AMQP cannot carry (a short string over 255
/// bytes); the item is then reported failed.
pub fn properties(
    plan_id: &str,
    executor_id: &str,
    item: &v1::SliceItem,
    attempt: u32,
    traceparent: &str,
) -> Result<BasicProperties, String> {
    let dead_letter = item
        .dead_letter
        .as_ref()
        .ok_or("the slice item has no dead letter")?;
    let stored = dead_letter.headers.clone().unwrap_or_default();
    let mut headers = FieldTable::default();
    for (name, value) in amqp::table_to_amqp(&stored)
        .map_err(|error| error.to_string())?
        .inner()
    {
        if !drops_header(name.as_str()) {
            headers.insert(name.clone(), value.clone());
        }
    }
    headers.insert(ShortString::from(PLAN_ID_HEADER), text(plan_id));
    headers.insert(ShortString::from(EXECUTOR_ID_HEADER), text(executor_id));
    headers.insert(
        ShortString::from(ATTEMPT_HEADER),
        AMQPValue::LongInt(i32::try_from(attempt).unwrap_or(i32::MAX)),
    );
    headers.insert(
        ShortString::from(COUNT_HEADER),
        AMQPValue::LongInt(i32::try_from(item.redrive_count.saturating_add(1)).unwrap_or(i32::MAX)),
    );
    if let Some(death) = &dead_letter.death {
        headers.insert(ShortString::from(REASON_HEADER), text(&death.reason));
    }
    headers.insert(ShortString::from(TRACEPARENT_HEADER), text(traceparent));
    let mut stored_properties = dead_letter.properties.clone().unwrap_or_default();
    if drops_property("expiration") {
        stored_properties.expiration = None;
    }
    let properties =
        amqp::properties_to_amqp(&stored_properties, headers).map_err(|error| error.to_string())?;
    // Persistent, always (docs/design.md: publish persistent with mandatory).
    Ok(properties.with_delivery_mode(2))
}

#[cfg(test)]
mod tests {
    use redrive_proto::v1::{HeaderTable, HeaderValue, MessageProperties, header_value::Value};

    use super::*;

    #[test]
    fn death_headers_go_and_redrive_headers_come() {
        let fields = [
            ("x-death", Value::Array(Default::default())),
            (
                "x-first-death-reason",
                Value::LongString(b"rejected".to_vec()),
            ),
            ("x-last-death-queue", Value::LongString(b"q".to_vec())),
            ("tenant", Value::LongString(b"acme".to_vec())),
            ("retries", Value::ShortInt(2)),
            ("CC", Value::Array(Default::default())),
            ("BCC", Value::Array(Default::default())),
            ("x-delay", Value::LongInt(5000)),
            ("x-delivery-count", Value::LongInt(3)),
            ("x-match", Value::LongString(b"all".to_vec())),
        ];
        let item = v1::SliceItem {
            redrive_count: 1,
            dead_letter: Some(v1::DeadLetter {
                headers: Some(HeaderTable {
                    fields: fields
                        .into_iter()
                        .map(|(name, value)| (name.to_owned(), HeaderValue { value: Some(value) }))
                        .collect(),
                }),
                properties: Some(MessageProperties {
                    message_id: Some("m-1".into()),
                    delivery_mode: Some(1),
                    expiration: Some("60000".into()),
                    user_id: Some("guest".into()),
                    ..Default::default()
                }),
                death: Some(v1::Death {
                    reason: "rejected".into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let properties = properties("plan-1", "executor-1", &item, 2, &traceparent()).unwrap();
        let headers = properties.headers().as_ref().unwrap().inner();
        assert!(!headers.contains_key("x-death"));
        assert!(!headers.contains_key("x-first-death-reason"));
        assert!(!headers.contains_key("x-last-death-queue"));
        for dropped in ["CC", "BCC", "x-delay", "x-delivery-count"] {
            assert!(!headers.contains_key(dropped), "{dropped} is republished");
        }
        assert_eq!(headers.get("x-match"), Some(&text("all")));
        assert_eq!(*properties.expiration(), None, "expiration is dropped");
        assert_eq!(
            properties.user_id().as_ref().map(|user| user.as_str()),
            Some("guest")
        );
        assert_eq!(headers.get("tenant"), Some(&text("acme")));
        assert_eq!(headers.get("retries"), Some(&AMQPValue::ShortInt(2)));
        assert_eq!(headers.get(PLAN_ID_HEADER), Some(&text("plan-1")));
        assert_eq!(headers.get(EXECUTOR_ID_HEADER), Some(&text("executor-1")));
        assert_eq!(headers.get(ATTEMPT_HEADER), Some(&AMQPValue::LongInt(2)));
        assert_eq!(headers.get(COUNT_HEADER), Some(&AMQPValue::LongInt(2)));
        assert_eq!(headers.get(REASON_HEADER), Some(&text("rejected")));
        assert_eq!(
            properties.message_id().as_ref().map(|id| id.as_str()),
            Some("m-1")
        );
        assert_eq!(
            *properties.delivery_mode(),
            Some(2),
            "replays are persistent"
        );
        let Some(AMQPValue::LongString(traceparent)) = headers.get(TRACEPARENT_HEADER) else {
            panic!()
        };
        assert_eq!(traceparent.as_bytes().len(), 55);
    }
}
