//! `dead-letters show` and `repair`: one dead letter for people (key fields,
//! death, properties, headers, notes, revisions, history, body) or as the
//! API's `GetDeadLetterResponse` in canonical proto3 JSON.

use std::io::Write;

use redrive_proto::v1::{DeadLetter, GetDeadLetterResponse};

use crate::{
    error::{CliError, EX_OK},
    headers,
    output::{ArchiveJson, DeadLetterJson, cell, write_fields, write_item, write_message},
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
    let view = DeadLetterJson::summary(dead_letter);
    write_fields(out, "", &key_fields(&view))?;
    write_death(out, &view)?;
    write_properties(out, &view)?;
    write_headers(out, dead_letter)?;
    write_history(out, &view)?;
    write_body(out, dead_letter, &view, preview)
}

/// `value`, or `-` when absent.
fn optional(value: &Option<String>) -> String {
    value.clone().unwrap_or_else(|| "-".to_owned())
}

/// The first section: ids, keys, classification, times, and the fields a
/// dead letter has only sometimes (attempts, error, archive, plan, original
/// route).
fn key_fields(view: &DeadLetterJson) -> Vec<(&'static str, String)> {
    let mut fields: Vec<(&str, String)> = vec![
        ("id", view.id.clone()),
        ("source", view.source.clone()),
        ("origin", view.origin.to_owned()),
        ("message id", optional(&view.message_id)),
        ("message key", view.message_key.clone()),
    ];
    if !view.previous_message_keys.is_empty() {
        fields.push(("previous keys", view.previous_message_keys.join(", ")));
    }
    fields.extend([
        ("reason class", view.reason_class.to_owned()),
        ("status", view.status.to_owned()),
        ("destination", cell(&view.destination).to_owned()),
        ("event type", optional(&view.event_type)),
        ("schema version", optional(&view.schema_version)),
        ("producer", optional(&view.producer)),
        ("died at", optional(&view.died_at)),
        ("captured at", optional(&view.captured_at)),
        ("occurred at", optional(&view.occurred_at)),
    ]);
    if let Some(attempts) = view.attempts {
        fields.push(("attempts", attempts.to_string()));
    }
    if let Some(text) = &view.error_text {
        fields.push(("error text", text.clone()));
    }
    if let Some(archived) = &view.archived {
        fields.push(("archived", archive_text(archived)));
    }
    if let Some(plan) = &view.redrive_plan_id {
        fields.push(("redrive plan", format!("{plan} (a re-dead-letter)")));
    }
    if let Some(exchange) = &view.original_exchange {
        fields.push(("original exchange", exchange.clone()));
    }
    if let Some(routing_key) = &view.original_routing_key {
        fields.push(("original routing key", routing_key.clone()));
    }
    fields
}

/// The `death:` section (`(unknown)` without one).
fn write_death(out: &mut dyn Write, view: &DeadLetterJson) -> std::io::Result<()> {
    writeln!(out, "\ndeath:")?;
    match &view.death {
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
                ("time", optional(&death.time)),
            ],
        ),
        None => writeln!(out, "  (unknown)"),
    }
}

/// The `properties:` section, the set ones only.
fn write_properties(out: &mut dyn Write, view: &DeadLetterJson) -> std::io::Result<()> {
    writeln!(out, "\nproperties:")?;
    let properties = view.properties.set_fields();
    if properties.is_empty() {
        writeln!(out, "  (none)")?;
    }
    write_fields(out, "  ", &properties)
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
fn write_history(out: &mut dyn Write, view: &DeadLetterJson) -> std::io::Result<()> {
    if !view.capture_notes.is_empty() {
        writeln!(out, "\ncapture notes:")?;
        for note in &view.capture_notes {
            write_item(out, "  ", &format!("- {note}"))?;
        }
    }
    if !view.revisions.is_empty() {
        writeln!(out, "\nrevisions:")?;
        for revision in &view.revisions {
            let text = format!(
                "{}: sha256 {} by {} at {}: {}",
                revision.revision,
                revision.body_sha256,
                revision.actor,
                revision.created_at.as_deref().unwrap_or("-"),
                revision.reason
            );
            write_item(out, "  ", &text)?;
        }
    }
    if !view.archive_history.is_empty() {
        writeln!(out, "\nhistory (archive, unarchive, re-key):")?;
        for record in &view.archive_history {
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
fn write_body(
    out: &mut dyn Write,
    dead_letter: &DeadLetter,
    view: &DeadLetterJson,
    preview: &str,
) -> std::io::Result<()> {
    let mut body = format!(
        "\nbody ({} bytes, {}, sha256 {}",
        view.body_size, view.body_compression, view.body_sha256
    );
    match (dead_letter.revisions.last(), view.revisions.last()) {
        (Some(latest), Some(latest_view)) => {
            // Replays use the latest revision: show that one, name the capture.
            body = format!(
                "\nbody: revision {} ({} bytes, sha256 {}), used by prechecks and replays; captured: {} bytes, {}, sha256 {}",
                latest_view.revision,
                latest.body.len(),
                latest_view.body_sha256,
                view.body_size,
                view.body_compression,
                view.body_sha256
            );
        }
        _ if view.body_oversized => body.push_str(", oversized (not replayable)"),
        _ => {}
    }
    writeln!(out, "{body}):")?;
    writeln!(out, "{preview}")?;
    Ok(())
}

/// `by ACTOR at TIME: REASON` of an archive record.
fn archive_text(record: &ArchiveJson) -> String {
    format!(
        "by {} at {}: {}",
        record.actor,
        record.at.as_deref().unwrap_or("-"),
        record.reason
    )
}
