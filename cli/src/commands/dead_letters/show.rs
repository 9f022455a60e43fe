//! `dead-letters show` and `repair`: one dead letter for people (key fields,
//! death, properties, headers, notes, revisions, history, body) or as the
//! API's `GetDeadLetterResponse` in canonical proto3 JSON.

use std::io::Write;

use redrive_proto::v1::{
    ArchiveRecord, DeadLetter, Death, GetDeadLetterResponse, MessageProperties,
};

use crate::{
    error::{CliError, EX_OK},
    headers,
    output::{
        cell, compression_name, rfc3339, timestamp_text, write_fields, write_item, write_message,
    },
};

/// Writes the dead letter of `response` (`--json`: the response itself).
///
/// # Errors
/// A response without a dead letter; output errors.
pub(super) fn write_dead_letter(
    out: &mut dyn Write,
    response: GetDeadLetterResponse,
    json: bool,
) -> Result<u8, CliError> {
    let Some(dead_letter) = response.dead_letter.as_ref() else {
        return Err(CliError::Grpc(tonic::Status::internal(
            "the planner answered without a dead letter",
        )));
    };
    if json {
        write_message(out, &response)?;
    } else {
        let preview = crate::preview::body_preview(dead_letter, &response.body_preview);
        write_show(out, dead_letter, &preview)?;
    }
    Ok(EX_OK)
}

/// The human rendering of one dead letter, `preview` its body preview.
pub(super) fn write_show(
    out: &mut dyn Write,
    dead_letter: &DeadLetter,
    preview: &str,
) -> std::io::Result<()> {
    write_fields(out, "", &key_fields(dead_letter))?;
    write_death(out, dead_letter.death.as_ref())?;
    write_properties(out, dead_letter.properties.as_ref())?;
    write_headers(out, dead_letter)?;
    write_history(out, dead_letter)?;
    write_body(out, dead_letter, preview)
}

/// `value`, or `-` when absent.
fn optional(value: Option<&str>) -> String {
    value.unwrap_or("-").to_owned()
}

/// A time as RFC 3339 ([`crate::time`]), or `-` when absent.
fn time(at: Option<&prost_types::Timestamp>) -> String {
    timestamp_text(at).unwrap_or_else(|| "-".to_owned())
}

/// The first section: ids, keys, classification, times, and the fields a
/// dead letter has only sometimes (attempts, error, archive, plan, original
/// route).
fn key_fields(dead_letter: &DeadLetter) -> Vec<(&'static str, String)> {
    let mut fields: Vec<(&str, String)> = vec![
        ("id", dead_letter.id.clone()),
        ("source", dead_letter.source.clone()),
        ("origin", dead_letter.origin().name().to_owned()),
        ("message id", optional(dead_letter.message_id.as_deref())),
        ("message key", dead_letter.message_key.clone()),
    ];
    if !dead_letter.previous_message_keys.is_empty() {
        fields.push((
            "previous keys",
            dead_letter.previous_message_keys.join(", "),
        ));
    }
    fields.extend([
        ("reason class", dead_letter.reason_class().name().to_owned()),
        ("status", dead_letter.status().name().to_owned()),
        ("destination", cell(&dead_letter.destination).to_owned()),
        ("event type", optional(dead_letter.event_type.as_deref())),
        (
            "schema version",
            optional(dead_letter.schema_version.as_deref()),
        ),
        ("producer", optional(dead_letter.producer.as_deref())),
        ("died at", time(dead_letter.died_at.as_ref())),
        ("captured at", time(dead_letter.captured_at.as_ref())),
        ("occurred at", time(dead_letter.occurred_at.as_ref())),
    ]);
    if let Some(attempts) = dead_letter.attempts {
        fields.push(("attempts", attempts.to_string()));
    }
    if let Some(text) = &dead_letter.error_text {
        fields.push(("error text", text.clone()));
    }
    if let Some(class) = &dead_letter.error_class {
        fields.push(("error class", class.clone()));
    }
    fields.push(("error group", dead_letter.error_group.clone()));
    if let Some(archived) = &dead_letter.archived {
        fields.push(("archived", archive_text(archived)));
    }
    if let Some(plan) = &dead_letter.redrive_plan_id {
        fields.push(("redrive plan", format!("{plan} (a re-dead-letter)")));
    }
    if let Some(exchange) = &dead_letter.original_exchange {
        fields.push(("original exchange", exchange.clone()));
    }
    if let Some(routing_key) = &dead_letter.original_routing_key {
        fields.push(("original routing key", routing_key.clone()));
    }
    fields
}

/// The `death:` section (`(unknown)` without one).
fn write_death(out: &mut dyn Write, death: Option<&Death>) -> std::io::Result<()> {
    writeln!(out, "\ndeath:")?;
    match death {
        Some(death) => write_fields(
            out,
            "  ",
            &[
                ("reason", cell(&death.reason).to_owned()),
                ("queue", cell(&death.queue).to_owned()),
                ("exchange", cell(&death.exchange).to_owned()),
                (
                    "routing keys",
                    cell(&death.routing_keys.join(", ")).to_owned(),
                ),
                ("count", death.count.to_string()),
                ("time", time(death.time.as_ref())),
            ],
        ),
        None => writeln!(out, "  (unknown)"),
    }
}

/// The `properties:` section, the set ones only.
fn write_properties(
    out: &mut dyn Write,
    properties: Option<&MessageProperties>,
) -> std::io::Result<()> {
    writeln!(out, "\nproperties:")?;
    let properties = properties.map(property_fields).unwrap_or_default();
    if properties.is_empty() {
        writeln!(out, "  (none)")?;
    }
    write_fields(out, "  ", &properties)
}

/// (name, value as text) of every set AMQP property, in proto field order
/// (`type` for the proto's `r#type`; `timestamp` as epoch seconds and RFC
/// 3339).
fn property_fields(properties: &MessageProperties) -> Vec<(&'static str, String)> {
    let mut fields = Vec::new();
    let mut text = |name: &'static str, value: Option<String>| {
        if let Some(value) = value {
            fields.push((name, value));
        }
    };
    text("content_type", properties.content_type.clone());
    text("content_encoding", properties.content_encoding.clone());
    text(
        "delivery_mode",
        properties.delivery_mode.map(|v| v.to_string()),
    );
    text("priority", properties.priority.map(|v| v.to_string()));
    text("correlation_id", properties.correlation_id.clone());
    text("reply_to", properties.reply_to.clone());
    text("expiration", properties.expiration.clone());
    text("message_id", properties.message_id.clone());
    text(
        "timestamp",
        // Read by the one rule capture reads it by: in seconds as AMQP
        // specifies, else in the unit its range says (a new user's pass:
        // milliseconds showed as the year 58899).
        properties.timestamp.map(|value| {
            match redrive_proto::time::from_epoch_by_range(i128::from(value)) {
                Some((at, 0)) => format!("{value} ({})", rfc3339(at)),
                Some((at, unit)) => format!(
                    "{value} ({}, read as {} since 1970)",
                    rfc3339(at),
                    redrive_proto::time::EPOCH_UNITS
                        .get(unit)
                        .map_or("another unit", |(name, _)| *name)
                ),
                None => format!("{value} (not a plausible time in any unit)"),
            }
        }),
    );
    text("type", properties.r#type.clone());
    text("user_id", properties.user_id.clone());
    text("app_id", properties.app_id.clone());
    text("cluster_id", properties.cluster_id.clone());
    fields
}

/// The `headers:` section: each header with its AMQP type.
fn write_headers(out: &mut dyn Write, dead_letter: &DeadLetter) -> std::io::Result<()> {
    writeln!(out, "\nheaders:")?;
    match dead_letter
        .headers
        .as_ref()
        .filter(|table| !table.fields.is_empty())
    {
        Some(table) => {
            for (name, value) in &table.fields {
                let text = format!(
                    "{name} ({}): {}",
                    headers::type_name(value),
                    headers::value_to_text(value)
                );
                write_item(out, "  ", &text)?;
            }
            Ok(())
        }
        None => writeln!(out, "  (none)"),
    }
}

/// The sections a dead letter has only sometimes: capture notes, body
/// revisions, and its archive, unarchive and re-key history.
fn write_history(out: &mut dyn Write, dead_letter: &DeadLetter) -> std::io::Result<()> {
    if !dead_letter.capture_notes.is_empty() {
        writeln!(out, "\ncapture notes:")?;
        for note in &dead_letter.capture_notes {
            write_item(out, "  ", &format!("- {note}"))?;
        }
    }
    if !dead_letter.revisions.is_empty() {
        writeln!(out, "\nrevisions:")?;
        for revision in &dead_letter.revisions {
            let text = format!(
                "{}: sha256 {} by {} at {}: {}",
                revision.revision,
                revision.body_sha256,
                revision.actor,
                time(revision.created_at.as_ref()),
                revision.reason
            );
            write_item(out, "  ", &text)?;
        }
    }
    if !dead_letter.archive_history.is_empty() {
        writeln!(out, "\nhistory (archive, unarchive, re-key):")?;
        for record in &dead_letter.archive_history {
            write_item(
                out,
                "  ",
                &format!("{} {}", record.action, archive_text(record)),
            )?;
        }
    }
    Ok(())
}

/// The body line (size, compression, hash; with revisions the latest one,
/// which replays use, and the captured one), then `preview`.
fn write_body(out: &mut dyn Write, dead_letter: &DeadLetter, preview: &str) -> std::io::Result<()> {
    let compression = compression_name(dead_letter.body_compression());
    let mut body = format!(
        "\nbody ({} bytes, {compression}, sha256 {}",
        dead_letter.body_size, dead_letter.body_sha256
    );
    match dead_letter.revisions.last() {
        Some(latest) => {
            // Replays use the latest revision: show that one, name the capture.
            body = format!(
                "\nbody: revision {} ({} bytes, sha256 {}), used by prechecks and replays; captured: {} bytes, {compression}, sha256 {}",
                latest.revision,
                latest.body.len(),
                latest.body_sha256,
                dead_letter.body_size,
                dead_letter.body_sha256
            );
        }
        None if dead_letter.body_oversized => body.push_str(", oversized (not replayable)"),
        None => {}
    }
    writeln!(out, "{body}):")?;
    writeln!(out, "{preview}")?;
    Ok(())
}

/// `by ACTOR at TIME: REASON` of an archive record.
fn archive_text(record: &ArchiveRecord) -> String {
    format!(
        "by {} at {}: {}",
        record.actor,
        time(record.at.as_ref()),
        record.reason
    )
}

#[cfg(test)]
mod tests {
    use redrive_proto::{
        time::timestamp,
        v1::{self, BodyCompression, BodyRevision, Origin, ReasonClass},
    };

    use super::*;
    use chrono::DateTime;

    fn at(seconds: i64) -> Option<prost_types::Timestamp> {
        Some(timestamp(DateTime::from_timestamp(seconds, 0).unwrap()))
    }

    fn show(dead_letter: &DeadLetter, preview: &str) -> String {
        let mut out = Vec::new();
        write_show(&mut out, dead_letter, preview).unwrap();
        String::from_utf8(out).unwrap()
    }

    /// The value of field `name` in the section under `heading` (`""`: the
    /// first section), or `None` when the section has no such field.
    fn field(text: &str, heading: &str, name: &str) -> Option<String> {
        let mut section = "";
        for line in text.lines() {
            if let Some(title) = line.strip_suffix(':')
                && !line.starts_with(' ')
                && !title.contains(": ")
            {
                section = title;
                continue;
            }
            if section == heading
                && let Some(value) = line.trim_start().strip_prefix(&format!("{name}:"))
            {
                return Some(value.trim().to_owned());
            }
        }
        None
    }

    /// Was `show_json_has_exactly_the_stable_fields` (the mirror struct's
    /// JSON, gone: `--json` prints the API's message): every field it
    /// checked, as the text shows it.
    #[test]
    fn show_text_has_every_field() {
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
        let text = show(&dead_letter, "preview");
        let first = |name| field(&text, "", name);
        assert_eq!(first("id").as_deref(), Some("7"));
        assert_eq!(first("source").as_deref(), Some("orders.dlq"));
        assert_eq!(first("origin").as_deref(), Some("rabbitmq"));
        assert_eq!(first("message id").as_deref(), Some("m-1"));
        assert_eq!(first("message key").as_deref(), Some("order-1:pay"));
        assert_eq!(first("reason class").as_deref(), Some("rejected"));
        assert_eq!(first("destination").as_deref(), Some("orders"));
        assert_eq!(first("event type").as_deref(), Some("order.paid"));
        assert_eq!(first("schema version").as_deref(), Some("-"));
        assert_eq!(first("producer").as_deref(), Some("-"));
        assert_eq!(first("error text"), None);
        assert_eq!(
            first("died at").as_deref(),
            Some("2023-11-14T22:14:10.000Z")
        );
        assert_eq!(
            first("captured at").as_deref(),
            Some("2023-11-14T22:15:00.000Z")
        );
        assert_eq!(first("occurred at").as_deref(), Some("-"));
        assert_eq!(first("redrive plan"), None);
        assert_eq!(first("original exchange"), None);
        assert_eq!(first("original routing key"), None);
        assert_eq!(first("attempts"), None);
        assert_eq!(first("previous keys"), None);
        assert_eq!(first("status").as_deref(), Some("archived"));
        assert_eq!(
            first("archived").as_deref(),
            Some("by alice at 2023-11-14T22:18:20.000Z: settled by hand")
        );
        let property = |name| field(&text, "properties", name);
        assert_eq!(
            property("content_type").as_deref(),
            Some("application/json")
        );
        assert_eq!(property("delivery_mode").as_deref(), Some("2"));
        assert_eq!(
            property("timestamp").as_deref(),
            Some("1700000000 (2023-11-14T22:13:20.000Z)")
        );
        for (value, shown) in [
            (
                1_796_529_255_676,
                "1796529255676 (2026-12-06T03:54:15.676Z, read as milliseconds since 1970)",
            ),
            (12_345, "12345 (not a plausible time in any unit)"),
        ] {
            let fields = property_fields(&MessageProperties {
                timestamp: Some(value),
                ..Default::default()
            });
            assert_eq!(fields, vec![("timestamp", shown.to_owned())]);
        }
        assert_eq!(property("type").as_deref(), Some("order.paid"));
        assert_eq!(property("priority"), None);
        assert!(text.contains("\nheaders:\n  attempt (i32): 3\n"), "{text}");
        let death = |name| field(&text, "death", name);
        assert_eq!(death("reason").as_deref(), Some("rejected"));
        assert_eq!(death("queue").as_deref(), Some("orders"));
        assert_eq!(death("exchange").as_deref(), Some("shop"));
        assert_eq!(death("routing keys").as_deref(), Some("order.paid"));
        assert_eq!(death("count").as_deref(), Some("2"));
        assert_eq!(death("time").as_deref(), Some("2023-11-14T22:14:10.000Z"));
        assert!(text.contains("\ncapture notes:\n  - note\n"), "{text}");
        assert!(
            text.contains("\nrevisions:\n  1: sha256 cd by ops at 2023-11-14T22:16:40.000Z: fix\n"),
            "{text}"
        );
        // The latest revision (2 bytes) is the body replays use; the capture
        // (4 bytes, gzip) is named after it.
        assert!(
            text.ends_with(
                "\nbody: revision 1 (2 bytes, sha256 cd), used by prechecks and replays; \
                 captured: 4 bytes, gzip, sha256 ab):\npreview\n"
            ),
            "{text}"
        );
    }

    /// Was `absent_death_is_null`: a dead letter without death, properties
    /// or headers says so, and names the defaults.
    #[test]
    fn absent_sections_say_so() {
        let text = show(&DeadLetter::default(), "");
        assert!(text.contains("\ndeath:\n  (unknown)\n"), "{text}");
        assert!(text.contains("\nproperties:\n  (none)\n"), "{text}");
        assert!(text.contains("\nheaders:\n  (none)\n"), "{text}");
        assert!(
            text.contains("\nbody (0 bytes, none, sha256 ):\n"),
            "{text}"
        );
        assert_eq!(field(&text, "", "reason class").as_deref(), Some("unknown"));
    }
}
