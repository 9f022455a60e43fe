//! One line of an import file (the module docs of [`super`]) read into an
//! ingest item: serde with unknown fields denied, then the rules serde
//! cannot say (one body, a destination, the planner's limits).

use std::{fmt, marker::PhantomData};

use base64::{Engine, engine::general_purpose::STANDARD};
use redrive_proto::{
    time::timestamp,
    v1::{IngestDeadLettersRequest, MessageProperties},
};
use serde::{Deserialize, Deserializer, de};
use serde_json::Value;

use crate::{
    headers::{self, kind},
    selector::parse_rfc3339,
};

/// One line of an import file (module docs), as read by serde: a `null`
/// field is `None` like an absent one, and any other field name is refused
/// (`unknown field ...`) so that a typo does not silently drop data.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Line {
    body: Option<String>,
    body_base64: Option<String>,
    message_id: Option<String>,
    /// Plain or typed values, read by [`headers::table_from_json`]: the typed
    /// shape depends on the `type` inside each value.
    headers: Option<Value>,
    properties: Option<Object<LineProperties>>,
    reason: Option<String>,
    attempts: Option<u32>,
    error_text: Option<String>,
    original_destination: Option<String>,
    occurred_at: Option<String>,
    source: Option<String>,
}

/// A line's `properties` object: AMQP basic properties by name.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct LineProperties {
    content_type: Option<String>,
    content_encoding: Option<String>,
    delivery_mode: Option<u8>,
    priority: Option<u8>,
    correlation_id: Option<String>,
    reply_to: Option<String>,
    expiration: Option<Expiration>,
    message_id: Option<String>,
    timestamp: Option<EpochSeconds>,
    #[serde(rename = "type")]
    message_type: Option<String>,
    user_id: Option<String>,
    app_id: Option<String>,
    cluster_id: Option<String>,
}

/// A struct read from a JSON object only: a derived `Deserialize` also takes an
/// array, fields by position, which no import line means.
#[derive(Debug)]
struct Object<T>(T);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Object<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor<T>(PhantomData<T>);
        impl<'de, T: Deserialize<'de>> de::Visitor<'de> for Visitor<T> {
            type Value = Object<T>;
            fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
                formatter.write_str("a JSON object")
            }
            fn visit_map<A: de::MapAccess<'de>>(self, map: A) -> Result<Object<T>, A::Error> {
                T::deserialize(de::value::MapAccessDeserializer::new(map)).map(Object)
            }
        }
        deserializer.deserialize_map(Visitor(PhantomData))
    }
}

/// `properties.expiration`: AMQP keeps the TTL as a string of milliseconds; a
/// non-negative integer is accepted too.
#[derive(Debug)]
struct Expiration(String);

impl<'de> Deserialize<'de> for Expiration {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl de::Visitor<'_> for Visitor {
            type Value = Expiration;
            fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
                formatter.write_str("a string or a non-negative integer of milliseconds")
            }
            fn visit_u64<E: de::Error>(self, millis: u64) -> Result<Expiration, E> {
                Ok(Expiration(millis.to_string()))
            }
            fn visit_str<E: de::Error>(self, text: &str) -> Result<Expiration, E> {
                Ok(Expiration(text.to_owned()))
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

/// `properties.timestamp`: epoch seconds, or an RFC 3339 time (not before 1970).
#[derive(Debug)]
struct EpochSeconds(u64);

impl<'de> Deserialize<'de> for EpochSeconds {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl de::Visitor<'_> for Visitor {
            type Value = EpochSeconds;
            fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
                formatter.write_str("non-negative epoch seconds or an RFC 3339 time")
            }
            fn visit_u64<E: de::Error>(self, seconds: u64) -> Result<EpochSeconds, E> {
                Ok(EpochSeconds(seconds))
            }
            fn visit_str<E: de::Error>(self, text: &str) -> Result<EpochSeconds, E> {
                let at = parse_rfc3339(text).map_err(E::custom)?;
                u64::try_from(at.timestamp())
                    .map(EpochSeconds)
                    .map_err(|_| E::custom("before 1970"))
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

impl TryFrom<LineProperties> for MessageProperties {
    type Error = String;

    /// # Errors
    /// A short string over 255 bytes, the AMQP short-string limit.
    fn try_from(properties: LineProperties) -> Result<Self, String> {
        let short = |name: &str, value: Option<String>| -> Result<Option<String>, String> {
            match value {
                Some(text) if text.len() > 255 => Err(format!(
                    "properties.{name}: longer than 255 bytes, the AMQP short-string limit"
                )),
                other => Ok(other),
            }
        };
        Ok(MessageProperties {
            content_type: short("content_type", properties.content_type)?,
            content_encoding: short("content_encoding", properties.content_encoding)?,
            delivery_mode: properties.delivery_mode.map(u32::from),
            priority: properties.priority.map(u32::from),
            correlation_id: short("correlation_id", properties.correlation_id)?,
            reply_to: short("reply_to", properties.reply_to)?,
            expiration: short(
                "expiration",
                properties.expiration.map(|expiration| expiration.0),
            )?,
            message_id: short("message_id", properties.message_id)?,
            timestamp: properties.timestamp.map(|timestamp| timestamp.0),
            r#type: short("type", properties.message_type)?,
            user_id: short("user_id", properties.user_id)?,
            app_id: short("app_id", properties.app_id)?,
            cluster_id: short("cluster_id", properties.cluster_id)?,
        })
    }
}

/// Reads one line of an import file (module docs) into an ingest item with
/// `imported` set; `default_source` unless the line has its own `source`.
///
/// # Errors
/// What is wrong with the line, naming the field: `not valid JSON: ...`,
/// `expected a JSON object, got ...`, `unknown field `name`, expected one of
/// ...` (also `properties: unknown field ...`), `FIELD: invalid type: ...`,
/// and the rules of the module docs (one body, a destination, ...).
pub fn parse_line(text: &str, default_source: &str) -> Result<IngestDeadLettersRequest, String> {
    let line = read_line(text)?;
    let body = match (line.body, line.body_base64) {
        (Some(_), Some(_)) => return Err("both body and body_base64 given; use one".to_owned()),
        (None, None) => return Err("no body: give body (text) or body_base64".to_owned()),
        (Some(body), None) => body.into_bytes(),
        (None, Some(encoded)) => STANDARD
            .decode(encoded)
            .map_err(|error| format!("body_base64: not valid base64: {error}"))?,
    };
    let original_destination = line
        .original_destination
        .filter(|destination| !destination.trim().is_empty())
        .ok_or_else(|| {
            "original_destination: required (a queue name, or exchange/routing-key)".to_owned()
        })?;
    let source = match line.source {
        Some(source) if source.trim().is_empty() => {
            return Err("source: must not be empty".to_owned());
        }
        Some(source) => source,
        None => default_source.to_owned(),
    };
    let properties = line
        .properties
        .map(|Object(properties)| MessageProperties::try_from(properties))
        .transpose()?;
    if let (Some(top), Some(property)) = (
        &line.message_id,
        properties.as_ref().and_then(|p| p.message_id.as_ref()),
    ) && top != property
    {
        return Err(format!(
            "message_id {top:?} and properties.message_id {property:?} differ"
        ));
    }
    let headers = line
        .headers
        .map(|headers| headers::table_from_json("headers", &headers))
        .transpose()?;
    let occurred_at = line
        .occurred_at
        .map(|at| parse_rfc3339(&at).map_err(|error| format!("occurred_at: {error}")))
        .transpose()?;
    let mut item = IngestDeadLettersRequest {
        source,
        message_id: line.message_id.unwrap_or_default(),
        body: Vec::new(),
        properties,
        headers,
        reason: line.reason.unwrap_or_default(),
        attempts: line.attempts.unwrap_or(0),
        error_text: line.error_text.unwrap_or_default(),
        original_destination,
        occurred_at: occurred_at.map(timestamp),
        imported: true,
    };
    // The planner's limits (text lengths, header nesting and size), here so
    // that a line over them is this line's rejection: a message the planner's
    // wire check refuses would end the whole stream.
    redrive_proto::codec::check_request(
        &<IngestDeadLettersRequest as prost::Name>::full_name(),
        &prost::Message::encode_to_vec(&item),
        redrive_proto::codec::Scope::All,
    )?;
    item.body = body;
    Ok(item)
}

/// `not valid JSON at column 2: expected ident`: serde_json's "line 1"
/// is within the one line, beside the file's own line number.
fn syntax_error(error: &serde_json::Error) -> String {
    let message = error.to_string();
    let position = format!(" at line {} column {}", error.line(), error.column());
    let message = message.strip_suffix(&position).unwrap_or(&message);
    format!("not valid JSON at column {}: {message}", error.column())
}

/// Deserializes a [`Line`]; errors name the field's path (`properties.priority:
/// ...`) and leave out serde_json's position inside the line.
fn read_line(text: &str) -> Result<Line, String> {
    // A file written on Windows often starts with a UTF-8 byte-order mark
    // (U+FEFF), which JSON does not allow (RFC 8259 §8.1): not part of the
    // line.
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    // A derived struct also accepts a JSON array (fields by position): only an
    // object is a line.
    if !text.trim_start().starts_with('{') {
        let value: Value = serde_json::from_str(text).map_err(|error| syntax_error(&error))?;
        return Err(format!("expected a JSON object, got {}", kind(&value)));
    }
    let mut deserializer = serde_json::Deserializer::from_str(text);
    let line = serde_path_to_error::deserialize(&mut deserializer).map_err(|error| {
        let mut path: Vec<String> = error.path().iter().map(ToString::to_string).collect();
        let error = error.into_inner();
        if error.is_syntax() || error.is_eof() {
            return syntax_error(&error);
        }
        let message = error.to_string();
        let position = format!(" at line {} column {}", error.line(), error.column());
        let message = message.strip_suffix(&position).unwrap_or(&message);
        // The path of an unknown field ends in its name, which the message
        // gives already: name the object it is in.
        if message.starts_with("unknown field") {
            path.pop();
        }
        if path.is_empty() {
            message.to_owned()
        } else {
            format!("{}: {message}", path.join("."))
        }
    })?;
    deserializer.end().map_err(|error| syntax_error(&error))?;
    Ok(line)
}
