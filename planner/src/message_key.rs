//! The message key: the idempotency key of a dead letter (docs/design.md, "message
//! key"), from a property, a header or a JSON pointer into the body, plus the
//! event type when one is known (`order-123:order.paid`); else `sha256:<hex of
//! the body>`.

use std::{fmt, str::FromStr};

use redrive_proto::v1::{HeaderTable, MessageProperties};

use crate::death::text_of;

/// Where a message key comes from. Parsed from `property:NAME`, `header:NAME` or
/// `json:/pointer` (RFC 6901).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySource {
    /// An AMQP property: `message_id`, `correlation_id`, `type`, `app_id`,
    /// `user_id`, `reply_to`.
    Property(String),
    /// A string header.
    Header(String),
    /// A JSON pointer into a JSON body; strings and numbers count.
    JsonPointer(String),
}

/// Properties a key may come from.
const KEY_PROPERTIES: &[&str] = &[
    "message_id",
    "correlation_id",
    "type",
    "app_id",
    "user_id",
    "reply_to",
];

impl FromStr for KeySource {
    type Err = String;

    fn from_str(spec: &str) -> Result<Self, Self::Err> {
        let (kind, name) = spec.split_once(':').ok_or_else(|| {
            format!("{spec:?}: expected property:NAME, header:NAME or json:/pointer")
        })?;
        match kind {
            "property" if KEY_PROPERTIES.contains(&name) => Ok(Self::Property(name.to_owned())),
            "property" => Err(format!(
                "{spec:?}: property must be one of {}",
                KEY_PROPERTIES.join(", ")
            )),
            "header" if !name.is_empty() => Ok(Self::Header(name.to_owned())),
            "json" if name.starts_with('/') => Ok(Self::JsonPointer(name.to_owned())),
            "json" => Err(format!(
                "{spec:?}: a JSON pointer starts with '/' (RFC 6901)"
            )),
            _ => Err(format!(
                "{spec:?}: expected property:NAME, header:NAME or json:/pointer"
            )),
        }
    }
}

impl fmt::Display for KeySource {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Property(name) => write!(formatter, "property:{name}"),
            Self::Header(name) => write!(formatter, "header:{name}"),
            Self::JsonPointer(pointer) => write!(formatter, "json:{pointer}"),
        }
    }
}

impl KeySource {
    /// Whether this source needs the body parsed as JSON.
    pub fn needs_json(&self) -> bool {
        matches!(self, Self::JsonPointer(_))
    }

    fn value(
        &self,
        properties: &MessageProperties,
        headers: &HeaderTable,
        json: Option<&serde_json::Value>,
    ) -> Option<String> {
        let value = match self {
            Self::Property(name) => match name.as_str() {
                "message_id" => properties.message_id.clone(),
                "correlation_id" => properties.correlation_id.clone(),
                "type" => properties.r#type.clone(),
                "app_id" => properties.app_id.clone(),
                "user_id" => properties.user_id.clone(),
                "reply_to" => properties.reply_to.clone(),
                _ => None,
            },
            Self::Header(name) => text_of(headers, name),
            Self::JsonPointer(pointer) => match json?.pointer(pointer)? {
                serde_json::Value::String(text) => Some(text.clone()),
                serde_json::Value::Number(number) => Some(number.to_string()),
                _ => None,
            },
        };
        value.filter(|value| !value.is_empty())
    }
}

/// The message key of a dead letter: the first `sources` entry that yields a
/// value, with `:{event_type}` appended when the event type is known; else
/// `sha256:{body_sha256_hex}`.
pub fn message_key(
    sources: &[KeySource],
    properties: &MessageProperties,
    headers: &HeaderTable,
    json: Option<&serde_json::Value>,
    event_type: Option<&str>,
    body_sha256_hex: &str,
) -> String {
    let business_key = sources
        .iter()
        .find_map(|source| source.value(properties, headers, json));
    match (business_key, event_type) {
        (Some(key), Some(event_type)) => format!("{key}:{event_type}"),
        (Some(key), None) => key,
        (None, _) => format!("sha256:{body_sha256_hex}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_and_bad_ones_say_why() {
        assert_eq!(
            "json:/order_id".parse(),
            Ok(KeySource::JsonPointer("/order_id".into()))
        );
        assert_eq!(
            "header:order-id".parse(),
            Ok(KeySource::Header("order-id".into()))
        );
        assert_eq!(
            "property:message_id".parse(),
            Ok(KeySource::Property("message_id".into()))
        );
        assert!(
            "json:order_id"
                .parse::<KeySource>()
                .unwrap_err()
                .contains("RFC 6901")
        );
        assert!(
            "property:colour"
                .parse::<KeySource>()
                .unwrap_err()
                .contains("message_id")
        );
        assert!("order_id".parse::<KeySource>().is_err());
    }

    #[test]
    fn first_source_with_a_value_wins_and_the_event_type_is_appended() {
        let sources: Vec<KeySource> = vec![
            "json:/missing".parse().unwrap(),
            "json:/order_id".parse().unwrap(),
        ];
        let json = serde_json::json!({"order_id": "order-123"});
        let key = message_key(
            &sources,
            &MessageProperties::default(),
            &HeaderTable::default(),
            Some(&json),
            Some("order.paid"),
            "ab",
        );
        assert_eq!(key, "order-123:order.paid");
        let numeric = serde_json::json!({"order_id": 42});
        let key = message_key(
            &sources,
            &MessageProperties::default(),
            &HeaderTable::default(),
            Some(&numeric),
            None,
            "ab",
        );
        assert_eq!(key, "42");
    }

    #[test]
    fn without_a_value_the_body_hash_is_the_key() {
        let sources: Vec<KeySource> = vec!["json:/order_id".parse().unwrap()];
        let key = message_key(
            &sources,
            &MessageProperties::default(),
            &HeaderTable::default(),
            None,
            Some("t"),
            "ab12",
        );
        assert_eq!(key, "sha256:ab12");
    }
}
