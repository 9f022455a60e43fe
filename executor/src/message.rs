//! The replayed message (DESIGN.md, "The replayed message"): same body bytes,
//! message id, correlation id, content type and encoding, type, app id,
//! timestamp, priority and application headers; persistent; without the
//! broker's death headers; with `redrive-*` headers and a W3C `traceparent`.

use lapin::{
    BasicProperties,
    types::{AMQPValue, FieldTable, LongString, ShortString},
};
use redrive_proto::{amqp, v1};

/// Headers a replay adds (without the `x-` prefix: since RabbitMQ 3.13 `x-`
/// headers belong to the broker).
pub const PLAN_ID_HEADER: &str = "redrive-plan-id";
/// The attempt number of this publish (1-based).
pub const ATTEMPT_HEADER: &str = "redrive-attempt";
/// How many times this message key has been redriven, this replay included.
pub const COUNT_HEADER: &str = "redrive-count";
/// The death reason of the dead letter being replayed.
pub const REASON_HEADER: &str = "redrive-dead-letter-reason";
/// W3C Trace Context header (<https://www.w3.org/TR/trace-context/>).
pub const TRACEPARENT_HEADER: &str = "traceparent";

/// Whether the broker's delivery accounting header `name` must be removed so
/// that it restarts (`x-death`, `x-first-death-*`, `x-last-death-*`).
fn is_death_header(name: &str) -> bool {
    name == "x-death" || name.starts_with("x-first-death-") || name.starts_with("x-last-death-")
}

/// A new W3C `traceparent` for the replay span: version 00, random trace and
/// span ids, sampled.
pub fn traceparent() -> String {
    let trace = uuid::Uuid::new_v4().simple().to_string();
    let span = &uuid::Uuid::new_v4().simple().to_string()[..16];
    format!("00-{trace}-{span}-01")
}

fn text(value: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(value.as_bytes().to_vec()))
}

/// The AMQP properties of the replay of `item`, attempt `attempt` of plan
/// `plan_id`.
///
/// # Errors
/// A stored header or property that AMQP cannot carry (a short string over 255
/// bytes); the item is then reported failed.
pub fn properties(
    plan_id: &str,
    item: &v1::SliceItem,
    attempt: u32,
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
        if !is_death_header(name.as_str()) {
            headers.insert(name.clone(), value.clone());
        }
    }
    headers.insert(ShortString::from(PLAN_ID_HEADER), text(plan_id));
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
    headers.insert(ShortString::from(TRACEPARENT_HEADER), text(&traceparent()));
    let stored_properties = dead_letter.properties.clone().unwrap_or_default();
    let properties =
        amqp::properties_to_amqp(&stored_properties, headers).map_err(|error| error.to_string())?;
    // Persistent, always (DESIGN.md: publish persistent with mandatory).
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
        let properties = properties("plan-1", &item, 2).unwrap();
        let headers = properties.headers().as_ref().unwrap().inner();
        assert!(!headers.contains_key("x-death"));
        assert!(!headers.contains_key("x-first-death-reason"));
        assert!(!headers.contains_key("x-last-death-queue"));
        assert_eq!(headers.get("tenant"), Some(&text("acme")));
        assert_eq!(headers.get("retries"), Some(&AMQPValue::ShortInt(2)));
        assert_eq!(headers.get(PLAN_ID_HEADER), Some(&text("plan-1")));
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
