//! Rendering for people (tables, key/value blocks) and for scripts (JSON).
//!
//! `--json` output is one compact JSON document on stdout followed by a
//! newline (`plan watch --json`: one per line, per update; `plan report
//! --format jsonl|csv` writes the planner's export, see
//! [`crate::commands::plan`]): the planner's answer in the API's canonical
//! proto3 JSON ([`write_message`], [`Listing`]), as grpcurl prints it. Times
//! for people are RFC 3339 in UTC with milliseconds
//! (`2024-05-01T12:00:00.000Z`, [`crate::time`]).
//!
//! [`DeadLetterJson`] is the dead letter as `dead-letters show` prints it for
//! people (times as text, absent values as `None`); it is not printed as
//! JSON any more.

use std::io::{self, Write};

use base64::{Engine, engine::general_purpose::STANDARD};
use chrono::DateTime;
use redrive_proto::v1::{
    ArchiveRecord, BodyCompression, BodyRevision, DeadLetter, Death, MessageProperties,
};
use serde::Serialize;
use serde_json::Value;

use crate::headers;

pub use crate::{
    table::{Column, Table, table, write_table},
    time::{rfc3339, timestamp_text},
};

mod listing;

pub use listing::{Listing, ListingKind, list_pages};

/// Writes one item of a list for people (a header, a capture note, an
/// archive record, a message key) after `indent`; its further lines, when a
/// producer's or an operator's text holds line breaks, hang two columns
/// deeper, so that none of them reads as an item or a heading of its own.
///
/// # Errors
/// When writing to `out` fails.
pub fn write_item(out: &mut dyn Write, indent: &str, text: &str) -> io::Result<()> {
    let mut lines = text.split('\n');
    writeln!(out, "{indent}{}", lines.next().unwrap_or_default())?;
    for line in lines {
        writeln!(out, "{indent}  {line}")?;
    }
    Ok(())
}

/// Writes a block of `name: value` lines after `indent`, the values aligned
/// in one column. A value's further lines (a multi-line reason, rationale or
/// error text) are indented to that column, so that none of them reads as a
/// field of its own (a reason holding `\nstatus: open` cannot pass for the
/// status). Control characters are the writer's to escape
/// ([`crate::escape`]).
///
/// # Errors
/// When writing to `out` fails.
pub fn write_fields(
    out: &mut dyn Write,
    indent: &str,
    fields: &[(&str, String)],
) -> io::Result<()> {
    let width = fields.iter().map(|(name, _)| name.len()).max().unwrap_or(0) + 1;
    for (name, value) in fields {
        let mut lines = value.split('\n');
        let first = lines.next().unwrap_or_default();
        writeln!(out, "{indent}{:<width$}  {first}", format!("{name}:"))?;
        for line in lines {
            writeln!(out, "{indent}{:<width$}  {line}", "")?;
        }
    }
    Ok(())
}

/// Writes `value` as one compact JSON document and a newline.
///
/// # Errors
/// When writing to `out` fails.
pub fn write_json<T: Serialize + ?Sized>(out: &mut dyn Write, value: &T) -> io::Result<()> {
    serde_json::to_writer(&mut *out, value)?;
    out.write_all(b"\n")
}

/// An API message in the API's canonical proto3 JSON, as grpcurl prints it
/// ([`redrive_proto::json::to_canonical_json`]: lowerCamelCase names, enums
/// by name, 64-bit integers as strings, RFC 3339 times, base64 bytes,
/// default values left out).
///
/// # Errors
/// An I/O error of kind `Other` when the message has no descriptor (never
/// for a `redrive.v1` message).
pub fn message_json<M: prost::Message + prost::Name>(message: &M) -> io::Result<Value> {
    redrive_proto::json::to_canonical_json(message).map_err(io::Error::other)
}

/// Writes an API message as its canonical proto3 JSON ([`message_json`]) on
/// one line: what `--json` prints for a command that answers with one API
/// message.
///
/// # Errors
/// When writing to `out` fails ([`message_json`]'s, too).
pub fn write_message<M: prost::Message + prost::Name>(
    out: &mut dyn Write,
    message: &M,
) -> io::Result<()> {
    out.write_all(message_text(message)?.as_bytes())?;
    out.write_all(b"\n")
}

/// [`message_json`] as compact text, the fields in the order of their
/// numbers, as grpcurl prints them.
///
/// # Errors
/// As [`message_json`].
pub fn message_text<M: prost::Message + prost::Name>(message: &M) -> io::Result<String> {
    redrive_proto::json::to_canonical_json_string(message).map_err(io::Error::other)
}

/// The width of the terminal stdout goes to, if it is one and says (a
/// pseudo-terminal without a size reports 0: unknown).
pub fn terminal_width() -> Option<u16> {
    comfy_table::Table::new().width().filter(|width| *width > 0)
}

/// `-` for an empty cell, so columns stay readable.
pub fn cell(text: &str) -> &str {
    if text.is_empty() { "-" } else { text }
}

/// Writes `WARNING: text`, wrapped at the tables' width ([`crate::table`]:
/// 80 columns when not a terminal) between words, the lines after the
/// first indented under the text (a hanging indent); one line with
/// `--wide`. A word longer than a line is kept whole on a line of its own.
///
/// # Errors
/// When writing fails.
pub fn write_warning(out: &mut dyn Write, text: &str) -> std::io::Result<()> {
    for line in wrap_hanging("WARNING: ", text, crate::table::width().map(usize::from)) {
        writeln!(out, "{line}")?;
    }
    Ok(())
}

/// `first` then `text`, wrapped at `width` columns between words (none: one
/// line), the following lines indented by `first`'s width.
pub fn wrap_hanging(first: &str, text: &str, width: Option<usize>) -> Vec<String> {
    use unicode_width::UnicodeWidthStr;
    let Some(width) = width else {
        return vec![format!("{first}{text}")];
    };
    let indent = " ".repeat(first.width());
    let mut lines = Vec::new();
    let mut line = first.to_owned();
    let mut empty = true;
    for word in text.split(' ').filter(|word| !word.is_empty()) {
        if !empty && line.width() + 1 + word.width() > width {
            lines.push(std::mem::replace(&mut line, indent.clone()));
            empty = true;
        }
        if !empty {
            line.push(' ');
        }
        line.push_str(word);
        empty = false;
    }
    lines.push(line);
    lines
}

/// Hex digits of a body-hash key a fitted table shows.
pub const KEY_HASH_SHOWN: usize = 12;

/// A message key for a table cell: [`cell`], and a body-hash key
/// (`sha256:` and 64 hex digits) cut to its first [`KEY_HASH_SHOWN`] digits
/// and `…` unless the tables are `--wide` (the hash names the bytes, people
/// do not read it; the room goes to the reason and the message id).
pub fn key_cell(key: &str) -> String {
    match key.strip_prefix("sha256:") {
        Some(hex) if crate::table::width().is_some() && hex.len() > KEY_HASH_SHOWN => {
            format!(
                "sha256:{}{}",
                &hex[..KEY_HASH_SHOWN],
                crate::table::ELLIPSIS
            )
        }
        _ => cell(key).to_owned(),
    }
}

/// The stable name of a body compression.
pub fn compression_name(compression: BodyCompression) -> &'static str {
    match compression {
        BodyCompression::Unspecified | BodyCompression::None => "none",
        BodyCompression::Gzip => "gzip",
        BodyCompression::Zstd => "zstd",
    }
}

/// One dead letter in its stable JSON shape (module docs).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeadLetterJson {
    /// Decimal id.
    pub id: String,
    /// DLQ name or import label.
    pub source: String,
    /// `rabbitmq`, `ingest`, `import`.
    pub origin: &'static str,
    /// The AMQP message id, if any.
    pub message_id: Option<String>,
    /// Idempotency key.
    pub message_key: String,
    /// The exact captured body; `show` only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub body_base64: Option<String>,
    /// Lowercase hex SHA-256 of the body.
    pub body_sha256: String,
    /// Body size in bytes.
    pub body_size: u64,
    /// Larger than the planner's body limit: kept, not replayable.
    pub body_oversized: bool,
    /// `none`, `gzip`, `zstd`.
    pub body_compression: &'static str,
    /// The set AMQP properties.
    pub properties: PropertiesJson,
    /// Header name → typed value.
    pub headers: Value,
    /// The death that counts, if known.
    pub death: Option<DeathJson>,
    /// Normalized reason class.
    pub reason_class: &'static str,
    /// Default replay destination.
    pub destination: String,
    /// Event type, if known.
    pub event_type: Option<String>,
    /// Schema version, if known.
    pub schema_version: Option<String>,
    /// Producer, if known.
    pub producer: Option<String>,
    /// Error text the producer's framework gave.
    pub error_text: Option<String>,
    /// When it died, RFC 3339.
    pub died_at: Option<String>,
    /// When the planner captured it, RFC 3339.
    pub captured_at: Option<String>,
    /// The original event time, RFC 3339.
    pub occurred_at: Option<String>,
    /// The plan whose replay came back (a re-dead-letter).
    pub redrive_plan_id: Option<String>,
    /// Original exchange named by a framework header.
    pub original_exchange: Option<String>,
    /// Original routing key named by a framework header.
    pub original_routing_key: Option<String>,
    /// Delivery attempts the producer's framework reported.
    pub attempts: Option<u32>,
    /// Oddities found while capturing.
    pub capture_notes: Vec<String>,
    /// Repaired bodies, oldest first.
    pub revisions: Vec<RevisionJson>,
    /// `open`, `archived` or `replayed`.
    pub status: &'static str,
    /// Who archived it, when and why, while archived.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub archived: Option<ArchiveJson>,
    /// Every archive, unarchive and re-key of it, oldest first; `show` only.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub archive_history: Vec<ArchiveJson>,
    /// Its keys before a re-key, oldest first (replays under them count).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub previous_message_keys: Vec<String>,
    /// A readable rendition of the latest body; `show` only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub body_preview: Option<String>,
}

/// The AMQP basic properties; unset ones are left out of the JSON.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[allow(missing_docs)] // AMQP 0-9-1 basic properties, named as in the proto.
pub struct PropertiesJson {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content_type: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content_encoding: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delivery_mode: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub priority: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub correlation_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reply_to: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expiration: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message_id: Option<String>,
    /// Seconds since the Unix epoch.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timestamp: Option<u64>,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub app_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster_id: Option<String>,
}

impl From<&MessageProperties> for PropertiesJson {
    fn from(properties: &MessageProperties) -> Self {
        Self {
            content_type: properties.content_type.clone(),
            content_encoding: properties.content_encoding.clone(),
            delivery_mode: properties.delivery_mode,
            priority: properties.priority,
            correlation_id: properties.correlation_id.clone(),
            reply_to: properties.reply_to.clone(),
            expiration: properties.expiration.clone(),
            message_id: properties.message_id.clone(),
            timestamp: properties.timestamp,
            kind: properties.r#type.clone(),
            user_id: properties.user_id.clone(),
            app_id: properties.app_id.clone(),
            cluster_id: properties.cluster_id.clone(),
        }
    }
}

impl PropertiesJson {
    /// (name, value as text) of every set property, in proto field order.
    pub fn set_fields(&self) -> Vec<(&'static str, String)> {
        let mut fields = Vec::new();
        let mut text = |name: &'static str, value: Option<String>| {
            if let Some(value) = value {
                fields.push((name, value));
            }
        };
        text("content_type", self.content_type.clone());
        text("content_encoding", self.content_encoding.clone());
        text("delivery_mode", self.delivery_mode.map(|v| v.to_string()));
        text("priority", self.priority.map(|v| v.to_string()));
        text("correlation_id", self.correlation_id.clone());
        text("reply_to", self.reply_to.clone());
        text("expiration", self.expiration.clone());
        text("message_id", self.message_id.clone());
        text(
            "timestamp",
            self.timestamp.map(|seconds| {
                i64::try_from(seconds)
                    .ok()
                    .and_then(|seconds| DateTime::from_timestamp(seconds, 0))
                    .map_or_else(
                        || seconds.to_string(),
                        |at| format!("{seconds} ({})", rfc3339(at)),
                    )
            }),
        );
        text("type", self.kind.clone());
        text("user_id", self.user_id.clone());
        text("app_id", self.app_id.clone());
        text("cluster_id", self.cluster_id.clone());
        fields
    }
}

/// The death that counts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeathJson {
    /// `rejected`, `expired`, `maxlen`, `delivery_limit`, or what an importer said.
    pub reason: String,
    /// The queue it died in.
    pub queue: String,
    /// The exchange it was published to.
    pub exchange: String,
    /// Its routing keys.
    pub routing_keys: Vec<String>,
    /// How many times it died this way.
    pub count: u64,
    /// When, RFC 3339.
    pub time: Option<String>,
}

impl From<&Death> for DeathJson {
    fn from(death: &Death) -> Self {
        Self {
            reason: death.reason.clone(),
            queue: death.queue.clone(),
            exchange: death.exchange.clone(),
            routing_keys: death.routing_keys.clone(),
            count: death.count,
            time: timestamp_text(death.time.as_ref()),
        }
    }
}

/// A repaired body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RevisionJson {
    /// 1, 2, ...
    pub revision: u32,
    /// Standard base64 of the repaired body.
    pub body_base64: String,
    /// Lowercase hex SHA-256 of the repaired body.
    pub body_sha256: String,
    /// Who repaired it.
    pub actor: String,
    /// Why.
    pub reason: String,
    /// When, RFC 3339.
    pub created_at: Option<String>,
}

impl From<&BodyRevision> for RevisionJson {
    fn from(revision: &BodyRevision) -> Self {
        Self {
            revision: revision.revision,
            body_base64: STANDARD.encode(&revision.body),
            body_sha256: revision.body_sha256.clone(),
            actor: revision.actor.clone(),
            reason: revision.reason.clone(),
            created_at: timestamp_text(revision.created_at.as_ref()),
        }
    }
}

/// An archive, unarchive or retention delete of a dead letter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ArchiveJson {
    /// `archive`, `unarchive` or `delete`.
    pub action: String,
    /// Who.
    pub actor: String,
    /// Why.
    pub reason: String,
    /// When, RFC 3339.
    pub at: Option<String>,
}

impl From<&ArchiveRecord> for ArchiveJson {
    fn from(record: &ArchiveRecord) -> Self {
        Self {
            action: record.action.clone(),
            actor: record.actor.clone(),
            reason: record.reason.clone(),
            at: timestamp_text(record.at.as_ref()),
        }
    }
}

impl DeadLetterJson {
    /// The list shape: no body, no preview.
    pub fn summary(dead_letter: &DeadLetter) -> Self {
        Self {
            id: dead_letter.id.clone(),
            source: dead_letter.source.clone(),
            origin: dead_letter.origin().name(),
            message_id: dead_letter.message_id.clone(),
            message_key: dead_letter.message_key.clone(),
            body_base64: None,
            body_sha256: dead_letter.body_sha256.clone(),
            body_size: dead_letter.body_size,
            body_oversized: dead_letter.body_oversized,
            body_compression: compression_name(dead_letter.body_compression()),
            properties: dead_letter
                .properties
                .as_ref()
                .map(PropertiesJson::from)
                .unwrap_or_default(),
            headers: dead_letter.headers.as_ref().map_or_else(
                || Value::Object(serde_json::Map::new()),
                headers::table_to_json,
            ),
            death: dead_letter.death.as_ref().map(DeathJson::from),
            reason_class: dead_letter.reason_class().name(),
            destination: dead_letter.destination.clone(),
            event_type: dead_letter.event_type.clone(),
            schema_version: dead_letter.schema_version.clone(),
            producer: dead_letter.producer.clone(),
            error_text: dead_letter.error_text.clone(),
            died_at: timestamp_text(dead_letter.died_at.as_ref()),
            captured_at: timestamp_text(dead_letter.captured_at.as_ref()),
            occurred_at: timestamp_text(dead_letter.occurred_at.as_ref()),
            redrive_plan_id: dead_letter.redrive_plan_id.clone(),
            original_exchange: dead_letter.original_exchange.clone(),
            original_routing_key: dead_letter.original_routing_key.clone(),
            attempts: dead_letter.attempts,
            capture_notes: dead_letter.capture_notes.clone(),
            revisions: dead_letter
                .revisions
                .iter()
                .map(RevisionJson::from)
                .collect(),
            status: dead_letter.status().name(),
            archived: dead_letter.archived.as_ref().map(ArchiveJson::from),
            archive_history: dead_letter
                .archive_history
                .iter()
                .map(ArchiveJson::from)
                .collect(),
            previous_message_keys: dead_letter.previous_message_keys.clone(),
            body_preview: None,
        }
    }

    /// The `show` shape: with the exact body and the preview.
    pub fn full(dead_letter: &DeadLetter, body_preview: &str) -> Self {
        Self {
            body_base64: Some(STANDARD.encode(&dead_letter.body)),
            body_preview: Some(body_preview.to_owned()),
            ..Self::summary(dead_letter)
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn warnings_wrap_at_the_width_with_a_hanging_indent() {
        let text = "2 of 9 items are not replayable and stay out of the plan: 1 stale \
                    (72h0m old, from its timestamp), 1 duplicate; see redrivectl precheck items \
                    0190f3a2-7c1e-7b3a-9d4e-2f6a8b1c0d5e --verdict stale";
        let lines = super::wrap_hanging("WARNING: ", text, Some(80));
        assert_eq!(
            lines,
            [
                "WARNING: 2 of 9 items are not replayable and stay out of the plan: 1 stale",
                "         (72h0m old, from its timestamp), 1 duplicate; see redrivectl precheck",
                "         items 0190f3a2-7c1e-7b3a-9d4e-2f6a8b1c0d5e --verdict stale",
            ]
        );
        assert!(lines.iter().all(|line| line.chars().count() <= 80));
        // --wide: one line; a word longer than the line stays whole.
        assert_eq!(
            super::wrap_hanging("WARNING: ", text, None),
            [format!("WARNING: {text}")]
        );
        let long = "x".repeat(90);
        assert_eq!(
            super::wrap_hanging("WARNING: ", &format!("a {long} b"), Some(80)),
            [
                "WARNING: a".to_owned(),
                format!("         {long}"),
                "         b".to_owned()
            ]
        );
    }

    /// An archive reason (or rationale, or error text) with line breaks
    /// printed them raw: its second line could read as a field of its own.
    #[test]
    fn a_multi_line_value_stays_in_its_column() {
        let mut out = Vec::new();
        let fields = [
            ("archived", "by bob: duplicate\nstatus: open".to_owned()),
            ("status", "archived".to_owned()),
        ];
        super::write_fields(&mut out, "  ", &fields).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "  archived:  by bob: duplicate\n             status: open\n  status:    archived\n"
        );
    }

    #[test]
    fn a_multi_line_item_hangs_below_its_first_line() {
        let mut out = Vec::new();
        super::write_item(&mut out, "  ", "- note\nstatus: open").unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "  - note\n    status: open\n"
        );
    }

    /// A `--json` listing whose first request is refused leaves stdout
    /// empty (the error goes to stderr), not a JSON document cut short.
    #[test]
    fn a_json_listing_writes_nothing_before_its_first_item() {
        let mut out = Vec::new();
        drop(super::Listing::open(&mut out, true, "deadLetters").unwrap());
        assert!(out.is_empty(), "{}", String::from_utf8_lossy(&out));
        // The list response in canonical proto3 JSON: an empty last page is
        // `{}` (an empty list and an empty token are default values).
        let listing = |items: &[v1::DeadLetter], token: &str| {
            let mut out = Vec::new();
            let mut listing = super::Listing::open(&mut out, true, "deadLetters").unwrap();
            for item in items {
                listing.push(item, Vec::new).unwrap();
            }
            listing.finish(token, &[], "none").unwrap();
            String::from_utf8(out).unwrap()
        };
        assert_eq!(listing(&[], ""), "{}\n");
        assert_eq!(listing(&[], "p2"), "{\"nextPageToken\":\"p2\"}\n");
        let item = |id: &str| v1::DeadLetter {
            id: id.into(),
            body_size: 3,
            ..Default::default()
        };
        assert_eq!(
            listing(&[item("1"), item("2")], ""),
            "{\"deadLetters\":[{\"id\":\"1\",\"bodySize\":\"3\"},{\"id\":\"2\",\"bodySize\":\"3\"}]}\n"
        );
        assert_eq!(
            listing(&[item("1")], "p2"),
            "{\"deadLetters\":[{\"id\":\"1\",\"bodySize\":\"3\"}],\"nextPageToken\":\"p2\"}\n"
        );
        // Each page's JSON is the response's own.
        let response = v1::ListDeadLettersResponse {
            dead_letters: vec![item("1")],
            next_page_token: "p2".into(),
        };
        assert_eq!(
            serde_json::from_str::<Value>(&listing(&[item("1")], "p2")).unwrap(),
            super::message_json(&response).unwrap()
        );
    }

    use redrive_proto::{time::timestamp, v1};
    use serde_json::json;

    use redrive_proto::v1::{Origin, ReasonClass};

    use super::*;

    fn at(seconds: i64) -> Option<prost_types::Timestamp> {
        Some(timestamp(DateTime::from_timestamp(seconds, 0).unwrap()))
    }

    #[test]
    fn show_json_has_exactly_the_stable_fields() {
        let dead_letter = DeadLetter {
            id: "7".into(),
            source: "orders.dlq".into(),
            origin: Origin::Rabbitmq.into(),
            captured_at: at(1_700_000_100),
            message_id: Some("m-1".into()),
            message_key: "order-1:pay".into(),
            body: vec![0x1f, 0x8b, 0x08, 0x00],
            body_size: 4,
            body_sha256: "ab".into(),
            body_oversized: false,
            body_compression: BodyCompression::Gzip.into(),
            properties: Some(MessageProperties {
                content_type: Some("application/json".into()),
                delivery_mode: Some(2),
                timestamp: Some(1_700_000_000),
                r#type: Some("order.paid".into()),
                ..Default::default()
            }),
            headers: Some(v1::HeaderTable {
                fields: [(
                    "attempt".to_owned(),
                    v1::HeaderValue {
                        value: Some(v1::header_value::Value::LongInt(3)),
                    },
                )]
                .into_iter()
                .collect(),
            }),
            death: Some(Death {
                reason: "rejected".into(),
                queue: "orders".into(),
                exchange: "shop".into(),
                routing_keys: vec!["order.paid".into()],
                count: 2,
                time: at(1_700_000_050),
            }),
            reason_class: ReasonClass::Rejected.into(),
            destination: "orders".into(),
            event_type: Some("order.paid".into()),
            died_at: at(1_700_000_050),
            capture_notes: vec!["note".into()],
            revisions: vec![BodyRevision {
                revision: 1,
                body: b"{}".to_vec(),
                body_sha256: "cd".into(),
                actor: "ops".into(),
                reason: "fix".into(),
                created_at: at(1_700_000_200),
            }],
            status: v1::DeadLetterStatus::Archived.into(),
            archived: Some(ArchiveRecord {
                action: "archive".into(),
                actor: "alice".into(),
                reason: "settled by hand".into(),
                at: at(1_700_000_300),
            }),
            ..Default::default()
        };
        let json = serde_json::to_value(DeadLetterJson::full(&dead_letter, "preview")).unwrap();
        assert_eq!(
            json,
            json!({
                "id": "7",
                "source": "orders.dlq",
                "origin": "rabbitmq",
                "message_id": "m-1",
                "message_key": "order-1:pay",
                "body_base64": "H4sIAA==",
                "body_sha256": "ab",
                "body_size": 4,
                "body_oversized": false,
                "body_compression": "gzip",
                "properties": {
                    "content_type": "application/json",
                    "delivery_mode": 2,
                    "timestamp": 1_700_000_000,
                    "type": "order.paid",
                },
                "headers": {"attempt": {"type": "i32", "value": 3}},
                "death": {
                    "reason": "rejected",
                    "queue": "orders",
                    "exchange": "shop",
                    "routing_keys": ["order.paid"],
                    "count": 2,
                    "time": "2023-11-14T22:14:10.000Z",
                },
                "reason_class": "rejected",
                "destination": "orders",
                "event_type": "order.paid",
                "schema_version": null,
                "producer": null,
                "error_text": null,
                "died_at": "2023-11-14T22:14:10.000Z",
                "captured_at": "2023-11-14T22:15:00.000Z",
                "occurred_at": null,
                "redrive_plan_id": null,
                "original_exchange": null,
                "original_routing_key": null,
                "attempts": null,
                "capture_notes": ["note"],
                "revisions": [{
                    "revision": 1,
                    "body_base64": "e30=",
                    "body_sha256": "cd",
                    "actor": "ops",
                    "reason": "fix",
                    "created_at": "2023-11-14T22:16:40.000Z",
                }],
                "status": "archived",
                "archived": {
                    "action": "archive",
                    "actor": "alice",
                    "reason": "settled by hand",
                    "at": "2023-11-14T22:18:20.000Z",
                },
                "body_preview": "preview",
            })
        );
        let listed = serde_json::to_value(DeadLetterJson::summary(&dead_letter)).unwrap();
        assert!(listed.get("body_base64").is_none());
        assert!(listed.get("body_preview").is_none());
        assert_eq!(listed["death"]["count"], 2);
    }

    #[test]
    fn absent_death_is_null() {
        let json = serde_json::to_value(DeadLetterJson::summary(&DeadLetter::default())).unwrap();
        assert_eq!(json["death"], Value::Null);
        assert_eq!(json["properties"], json!({}));
        assert_eq!(json["headers"], json!({}));
        assert_eq!(json["body_compression"], "none");
        assert_eq!(json["reason_class"], "unknown");
    }
}
