//! The message key: the idempotency key of a dead letter (docs/design.md,
//! "message key"; docs/replay.md, "Identity").
//!
//! The rule, first match wins:
//! - With `--message-key` rules ([`KeySource`]), the first rule that gives a
//!   value, with `:{event_type}` appended when the event type is known
//!   (`order-123:order.paid`: one business key serves several events). The
//!   rules replace the default: list `property:message_id` among them to keep
//!   it, or end with `body` to key the rest by their body on purpose.
//! - Without rules (the default), the AMQP `message_id` property, as the
//!   producer wrote it and with nothing appended (`m-50`): a message id already
//!   names one message.
//! - Else `sha256:{hex of the body}`, the fallback the precheck warns about.
//!
//! Header values of every AMQP field type a producer uses give a key
//! ([`header_key_text`]): strings, integers of every width, timestamps,
//! decimals, floats, byte arrays. Booleans, arrays and tables do not: they
//! cannot tell messages apart.

use std::{fmt, str::FromStr};

use redrive_proto::v1::{HeaderTable, HeaderValue, MessageProperties, header_value::Value};

/// Where a message key comes from. Parsed from `property:NAME`, `header:NAME`,
/// `json:/pointer` (RFC 6901) or `body`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySource {
    /// An AMQP property: `message_id`, `correlation_id`, `type`, `app_id`,
    /// `user_id`, `reply_to`.
    Property(String),
    /// A header of any scalar AMQP type ([`header_key_text`]).
    Header(String),
    /// A JSON pointer into a JSON body; strings and numbers count.
    JsonPointer(String),
    /// The body's SHA-256 (`sha256:{hex}`), chosen on purpose: for producers
    /// that set a fresh message id on every retry. Always gives a value, so
    /// rules after it are never reached.
    Body,
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

/// What `--message-key` accepts, for error messages.
const SPEC_FORMS: &str = "expected property:NAME, header:NAME, json:/pointer or body";

impl FromStr for KeySource {
    type Err = String;

    fn from_str(spec: &str) -> Result<Self, Self::Err> {
        if spec == "body" {
            return Ok(Self::Body);
        }
        let (kind, name) = spec
            .split_once(':')
            .ok_or_else(|| format!("{spec:?}: {SPEC_FORMS}"))?;
        match kind {
            "property" if KEY_PROPERTIES.contains(&name) => Ok(Self::Property(name.to_owned())),
            "property" => Err(format!(
                "{spec:?}: property must be one of {}",
                KEY_PROPERTIES.join(", ")
            )),
            "header" if !name.is_empty() && name.len() <= 255 => Ok(Self::Header(name.to_owned())),
            "header" => Err(format!(
                "{spec:?}: a header name is 1 to 255 bytes (an AMQP short string)"
            )),
            "json" if name.starts_with('/') => Ok(Self::JsonPointer(name.to_owned())),
            "json" => Err(format!(
                "{spec:?}: a JSON pointer starts with '/' (RFC 6901)"
            )),
            _ => Err(format!("{spec:?}: {SPEC_FORMS}")),
        }
    }
}

impl fmt::Display for KeySource {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Property(name) => write!(formatter, "property:{name}"),
            Self::Header(name) => write!(formatter, "header:{name}"),
            Self::JsonPointer(pointer) => write!(formatter, "json:{pointer}"),
            Self::Body => formatter.write_str("body"),
        }
    }
}

/// What one rule finds in a message.
enum Found {
    /// A usable key.
    Value(String),
    /// Nothing there (absent, empty, void, JSON null).
    Absent,
    /// A value that cannot be a key, and why (`a boolean ...`).
    Unusable(String),
}

impl KeySource {
    /// Whether this source needs the body parsed as JSON.
    pub fn needs_json(&self) -> bool {
        matches!(self, Self::JsonPointer(_))
    }

    fn find(
        &self,
        properties: &MessageProperties,
        headers: &HeaderTable,
        json: Option<&serde_json::Value>,
        body_sha256_hex: &str,
    ) -> Found {
        let text = |value: Option<&String>| match value.filter(|value| !value.is_empty()) {
            Some(value) => Found::Value(value.clone()),
            None => Found::Absent,
        };
        match self {
            Self::Property(name) => text(match name.as_str() {
                "message_id" => properties.message_id.as_ref(),
                "correlation_id" => properties.correlation_id.as_ref(),
                "type" => properties.r#type.as_ref(),
                "app_id" => properties.app_id.as_ref(),
                "user_id" => properties.user_id.as_ref(),
                "reply_to" => properties.reply_to.as_ref(),
                _ => None,
            }),
            Self::Header(name) => match headers.fields.get(name).map(header_key_text) {
                None | Some(Ok(None)) => Found::Absent,
                Some(Ok(Some(value))) if value.is_empty() => Found::Absent,
                Some(Ok(Some(value))) => Found::Value(value),
                Some(Err(why)) => Found::Unusable(why),
            },
            Self::JsonPointer(pointer) => match json.and_then(|json| json.pointer(pointer)) {
                None | Some(serde_json::Value::Null) => Found::Absent,
                Some(serde_json::Value::String(value)) => text(Some(value)),
                Some(serde_json::Value::Number(number)) => Found::Value(number.to_string()),
                Some(serde_json::Value::Bool(_)) => Found::Unusable(
                    "a boolean (true or false cannot tell messages apart)".to_owned(),
                ),
                Some(serde_json::Value::Array(_) | serde_json::Value::Object(_)) => {
                    Found::Unusable("not a single value (an array or an object)".to_owned())
                }
            },
            Self::Body => Found::Value(format!("sha256:{body_sha256_hex}")),
        }
    }
}

/// The key text of one AMQP header value (AMQP 0-9-1 field types with
/// RabbitMQ's extensions, <https://www.rabbitmq.com/amqp-0-9-1-errata.html#section_3>):
///
/// - strings (`S`, `s`) and byte arrays (`x`): the text when the bytes are
///   UTF-8, else `0x` and their lowercase hex (never lossy, so two different
///   binary ids never share a key);
/// - integers of every width, signed and unsigned (`b B s u I i l`):
///   the decimal number (`42`);
/// - timestamps (`T`): the number of seconds as sent (`1764000000`);
/// - decimals (`D`, value / 10^scale): the exact decimal with `scale` digits
///   after the point (value 12345, scale 2: `123.45`);
/// - floats (`f`, `d`): the shortest text that reads back as the same number
///   (`42`, `1.5`).
///
/// `Ok(None)` for void (`V`) and an unset value. `Err` naming the type for
/// what cannot tell messages apart: booleans, arrays, tables, and floats that
/// are not finite.
pub fn header_key_text(value: &HeaderValue) -> Result<Option<String>, String> {
    let Some(value) = &value.value else {
        return Ok(None);
    };
    Ok(Some(match value {
        Value::ShortString(text) => text.clone(),
        Value::LongString(bytes) | Value::ByteArray(bytes) => match std::str::from_utf8(bytes) {
            Ok(text) => text.to_owned(),
            Err(_) => format!("0x{}", hex::encode(bytes)),
        },
        Value::ShortShortInt(v) | Value::ShortInt(v) | Value::LongInt(v) => v.to_string(),
        Value::ShortShortUint(v) | Value::ShortUint(v) | Value::LongUint(v) => v.to_string(),
        Value::LongLongInt(v) => v.to_string(),
        Value::Timestamp(v) => v.to_string(),
        Value::Decimal(decimal) => match u8::try_from(decimal.scale) {
            Ok(scale) => decimal_text(decimal.value, usize::from(scale)),
            Err(_) => {
                return Err(format!(
                    "a decimal with scale {}, over the AMQP octet's 255",
                    decimal.scale
                ));
            }
        },
        Value::Float(v) if v.is_finite() => v.to_string(),
        Value::Double(v) if v.is_finite() => v.to_string(),
        Value::Float(_) | Value::Double(_) => {
            return Err("a float that is not a finite number".to_owned());
        }
        Value::Boolean(_) => {
            return Err("a boolean (true or false cannot tell messages apart)".to_owned());
        }
        Value::Array(_) => return Err("an array, not a single value".to_owned()),
        Value::Table(_) => return Err("a table, not a single value".to_owned()),
        Value::Void(_) => return Ok(None),
    }))
}

/// `value / 10^scale` written exactly: `scale` digits after the point, a
/// leading `0` before it when needed (12345, 2 → `123.45`; 5, 3 → `0.005`).
fn decimal_text(value: u32, scale: usize) -> String {
    if scale == 0 {
        return value.to_string();
    }
    // At least one digit before the point.
    let padded = format!("{value:0>width$}", width = scale + 1);
    let (whole, fraction) = padded.split_at(padded.len() - scale);
    format!("{whole}.{fraction}")
}

/// Where a dead letter's message key came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyOrigin {
    /// The `--message-key` rule at this position (from 0) gave it.
    Rule(usize),
    /// The default, without rules: the `message_id` property.
    MessageId,
    /// Nothing gave a value: the body hash fallback.
    BodyHash,
}

/// A dead letter's message key and how it was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MessageKey {
    /// The key as stored and shown (`m-50`, `order-123:order.paid`,
    /// `sha256:…`).
    pub key: String,
    /// Where it came from.
    pub origin: KeyOrigin,
    /// Rules whose value was there but cannot be a key, in rule order
    /// (`header:flag is a boolean (...)`), for the capture notes.
    pub unusable: Vec<String>,
}

impl MessageKey {
    /// Whether the key is the body hash because nothing else gave one (not
    /// because a `body` rule chose it).
    pub fn is_fallback(&self) -> bool {
        self.origin == KeyOrigin::BodyHash
    }
}

/// The message key of a dead letter (see the module documentation for the
/// rule): with `sources`, the first one that yields a value, with
/// `:{event_type}` appended when the event type is known (never to a `body`
/// rule's hash); without `sources`, the `message_id` property as it is; else
/// `sha256:{body_sha256_hex}`.
pub fn message_key(
    sources: &[KeySource],
    properties: &MessageProperties,
    headers: &HeaderTable,
    json: Option<&serde_json::Value>,
    event_type: Option<&str>,
    body_sha256_hex: &str,
) -> MessageKey {
    let mut unusable = Vec::new();
    if sources.is_empty()
        && let Some(id) = properties.message_id.as_ref().filter(|id| !id.is_empty())
    {
        return MessageKey {
            key: id.clone(),
            origin: KeyOrigin::MessageId,
            unusable,
        };
    }
    for (position, source) in sources.iter().enumerate() {
        match source.find(properties, headers, json, body_sha256_hex) {
            Found::Value(key) => {
                let key = match event_type {
                    Some(event_type) if *source != KeySource::Body => {
                        format!("{key}:{event_type}")
                    }
                    _ => key,
                };
                return MessageKey {
                    key,
                    origin: KeyOrigin::Rule(position),
                    unusable,
                };
            }
            Found::Absent => {}
            Found::Unusable(why) => unusable.push(format!("{source} is {why}")),
        }
    }
    MessageKey {
        key: format!("sha256:{body_sha256_hex}"),
        origin: KeyOrigin::BodyHash,
        unusable,
    }
}

#[cfg(test)]
mod tests {
    use redrive_proto::v1::DecimalValue;

    use super::*;

    fn header(name: &str, value: Value) -> HeaderTable {
        HeaderTable {
            fields: [(name.to_owned(), HeaderValue { value: Some(value) })].into(),
        }
    }

    fn with_id(message_id: &str) -> MessageProperties {
        MessageProperties {
            message_id: Some(message_id.into()),
            ..Default::default()
        }
    }

    fn key_of(
        sources: &[KeySource],
        properties: &MessageProperties,
        headers: &HeaderTable,
    ) -> MessageKey {
        message_key(
            sources,
            properties,
            headers,
            None,
            Some("order.paid"),
            "ab12",
        )
    }

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
        assert_eq!("body".parse(), Ok(KeySource::Body));
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
        assert!(
            "header:"
                .parse::<KeySource>()
                .unwrap_err()
                .contains("1 to 255 bytes")
        );
        let unknown = "order_id".parse::<KeySource>().unwrap_err();
        assert!(
            unknown.contains("\"order_id\"") && unknown.contains("json:/pointer or body"),
            "{unknown}"
        );
        for spec in [
            "property:message_id",
            "header:order-id",
            "json:/a/b",
            "body",
        ] {
            assert_eq!(spec.parse::<KeySource>().unwrap().to_string(), spec);
        }
    }

    #[test]
    fn without_rules_the_message_id_is_the_key_as_the_producer_wrote_it() {
        let key = key_of(&[], &with_id("m-50"), &HeaderTable::default());
        assert_eq!(key.key, "m-50", "no event type suffix on a message id");
        assert_eq!(key.origin, KeyOrigin::MessageId);
        assert!(!key.is_fallback());
        // No message id (or an empty one): the body hash.
        for properties in [MessageProperties::default(), with_id("")] {
            let key = key_of(&[], &properties, &HeaderTable::default());
            assert_eq!(key.key, "sha256:ab12");
            assert!(key.is_fallback());
        }
    }

    #[test]
    fn rules_replace_the_default_and_get_the_event_type() {
        let rules: Vec<KeySource> = vec!["header:order-id".parse().unwrap()];
        let order = header("order-id", Value::LongString(b"order-123".to_vec()));
        let key = key_of(&rules, &with_id("m-50"), &order);
        assert_eq!(key.key, "order-123:order.paid");
        assert_eq!(key.origin, KeyOrigin::Rule(0));
        // The rules replace the default: without the header, the body hash,
        // not the message id.
        let key = key_of(&rules, &with_id("m-50"), &HeaderTable::default());
        assert_eq!(key.key, "sha256:ab12");
        assert!(key.is_fallback());
        // Listed explicitly, the message id is a rule like any other.
        let rules: Vec<KeySource> = vec![
            "header:order-id".parse().unwrap(),
            "property:message_id".parse().unwrap(),
        ];
        let key = key_of(&rules, &with_id("m-50"), &HeaderTable::default());
        assert_eq!(key.key, "m-50:order.paid");
        assert_eq!(key.origin, KeyOrigin::Rule(1));
        // `body` keys by the body on purpose: no suffix, not a fallback.
        let rules: Vec<KeySource> = vec!["header:order-id".parse().unwrap(), KeySource::Body];
        let key = key_of(&rules, &with_id("m-50"), &HeaderTable::default());
        assert_eq!(key.key, "sha256:ab12");
        assert_eq!(key.origin, KeyOrigin::Rule(1));
        assert!(!key.is_fallback());
    }

    #[test]
    fn first_source_with_a_value_wins_and_json_numbers_count() {
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
        assert_eq!(key.key, "order-123:order.paid");
        let numeric = serde_json::json!({"order_id": 42});
        let key = message_key(
            &sources,
            &MessageProperties::default(),
            &HeaderTable::default(),
            Some(&numeric),
            None,
            "ab",
        );
        assert_eq!(key.key, "42");
        let flag = serde_json::json!({"order_id": true});
        let key = message_key(
            &sources,
            &MessageProperties::default(),
            &HeaderTable::default(),
            Some(&flag),
            None,
            "ab",
        );
        assert_eq!(key.key, "sha256:ab");
        assert_eq!(
            key.unusable,
            ["json:/order_id is a boolean (true or false cannot tell messages apart)"]
        );
    }

    /// Every AMQP field type a producer writes a key in: the key is the value
    /// as people know it, never the body hash.
    #[test]
    fn header_keys_are_read_from_every_scalar_field_type() {
        let rules: Vec<KeySource> = vec!["header:order-id".parse().unwrap()];
        let cases: Vec<(&str, Value, &str)> = vec![
            ("long string", Value::LongString(b"o-42".to_vec()), "o-42"),
            ("short string", Value::ShortString("o-42".into()), "o-42"),
            ("byte array", Value::ByteArray(b"o-42".to_vec()), "o-42"),
            (
                "binary bytes",
                Value::ByteArray(vec![0xde, 0xad, 0xbe, 0xef]),
                "0xdeadbeef",
            ),
            (
                "non-UTF-8 string",
                Value::LongString(vec![b'o', 0xff]),
                "0x6fff",
            ),
            ("i8", Value::ShortShortInt(-42), "-42"),
            ("u8", Value::ShortShortUint(255), "255"),
            ("i16", Value::ShortInt(-32_768), "-32768"),
            ("u16", Value::ShortUint(65_535), "65535"),
            ("i32", Value::LongInt(42), "42"),
            ("u32", Value::LongUint(4_294_967_295), "4294967295"),
            (
                "i64",
                Value::LongLongInt(-9_223_372_036_854_775_808),
                "-9223372036854775808",
            ),
            (
                "i64 order id",
                Value::LongLongInt(9_007_199_254_740_993),
                "9007199254740993",
            ),
            ("timestamp", Value::Timestamp(1_764_000_000), "1764000000"),
            (
                "timestamp u64",
                Value::Timestamp(u64::MAX),
                "18446744073709551615",
            ),
            (
                "decimal",
                Value::Decimal(DecimalValue {
                    scale: 2,
                    value: 12_345,
                }),
                "123.45",
            ),
            (
                "small decimal",
                Value::Decimal(DecimalValue { scale: 3, value: 5 }),
                "0.005",
            ),
            (
                "whole decimal",
                Value::Decimal(DecimalValue { scale: 0, value: 7 }),
                "7",
            ),
            (
                "trailing zero",
                Value::Decimal(DecimalValue {
                    scale: 2,
                    value: 150,
                }),
                "1.50",
            ),
            ("double", Value::Double(42.0), "42"),
            ("fractional double", Value::Double(1.5), "1.5"),
            ("float", Value::Float(0.25), "0.25"),
        ];
        for (what, value, expected) in cases {
            let key = key_of(&rules, &with_id("m-1"), &header("order-id", value));
            assert_eq!(key.key, format!("{expected}:order.paid"), "{what}");
            assert_eq!(key.origin, KeyOrigin::Rule(0), "{what}");
        }
    }

    #[test]
    fn values_that_cannot_tell_messages_apart_fall_back_and_say_why() {
        let rules: Vec<KeySource> = vec!["header:order-id".parse().unwrap()];
        let cases: Vec<(Value, &str)> = vec![
            (Value::Boolean(true), "a boolean"),
            (Value::Double(f64::NAN), "not a finite number"),
            (Value::Float(f32::INFINITY), "not a finite number"),
            (Value::Array(Default::default()), "an array"),
            (Value::Table(Default::default()), "a table"),
            (
                Value::Decimal(DecimalValue {
                    scale: 256,
                    value: 1,
                }),
                "scale 256",
            ),
        ];
        for (value, why) in cases {
            let key = key_of(&rules, &with_id("m-1"), &header("order-id", value.clone()));
            assert_eq!(key.key, "sha256:ab12", "{value:?}");
            assert!(key.is_fallback());
            assert_eq!(key.unusable.len(), 1, "{value:?}");
            assert!(
                key.unusable[0].starts_with("header:order-id is ") && key.unusable[0].contains(why),
                "{:?}",
                key.unusable
            );
        }
        // Void and empty strings are absent, not unusable.
        for value in [
            Value::Void(Default::default()),
            Value::LongString(Vec::new()),
        ] {
            let key = key_of(&rules, &with_id("m-1"), &header("order-id", value));
            assert!(key.is_fallback() && key.unusable.is_empty(), "{key:?}");
        }
    }
}
