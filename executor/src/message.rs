//! The replayed message (docs/design.md, "The replayed message"): same body
//! bytes, message id, correlation id, content type and encoding, type, app id,
//! timestamp, priority and application headers; persistent; without the
//! fields the broker would act on again ([`BROKER_FIELDS`]: `CC`/`BCC`,
//! `expiration`, the death and delay headers); with `redrive-*` headers and a
//! W3C `traceparent`.

use lapin::BasicProperties;
use redrive_proto::{amqp, v1};

use crate::item::LeasedItem;

/// Headers a replay adds and the replayed message's table: their one home
/// is [`redrive_proto::headers`].
pub use redrive_proto::headers::{
    ATTEMPT_HEADER, BROKER_FIELDS, BrokerField, COUNT_HEADER, EXECUTOR_ID_HEADER, FieldName,
    PLAN_ID_HEADER, REASON_HEADER, TRACEPARENT_HEADER, Treatment, drops_header, drops_property,
};

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
pub fn original_traceparent(item: &LeasedItem) -> Option<String> {
    let headers = item.dead_letter.headers.as_ref()?;
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
    item: &LeasedItem,
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
        .properties
        .as_ref()
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

/// The AMQP properties of the replay of `item`, attempt `attempt` of plan
/// `plan_id`, published by `executor_id`, carrying `traceparent`.
///
/// # Errors
/// A stored header or property that AMQP cannot carry (a short string over 255
/// bytes); the item is then reported failed.
pub fn properties(
    plan_id: &str,
    executor_id: &str,
    item: &LeasedItem,
    attempt: u32,
    traceparent: &str,
) -> Result<BasicProperties, String> {
    let dead_letter = &item.dead_letter;
    let headers = redrive_proto::headers::replay_headers(
        &dead_letter.headers.clone().unwrap_or_default(),
        &redrive_proto::headers::ReplayStamp {
            plan_id,
            executor_id,
            attempt,
            count: item.redrive_count.saturating_add(1),
            reason: dead_letter
                .death
                .as_ref()
                .map(|death| death.reason.as_str()),
            traceparent,
        },
    );
    let headers = amqp::table_to_amqp(&headers).map_err(|error| error.to_string())?;
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
    use lapin::types::{AMQPValue, LongString};
    use redrive_proto::v1::{HeaderTable, HeaderValue, MessageProperties, header_value::Value};

    use super::*;

    fn text(value: &str) -> AMQPValue {
        AMQPValue::LongString(LongString::from(value.as_bytes().to_vec()))
    }

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
        let item = LeasedItem {
            redrive_count: 1,
            dead_letter: v1::DeadLetter {
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
            },
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
