//! Rendering for people (tables, key/value blocks) and for scripts (JSON).
//!
//! `--json` output is one compact JSON document on stdout followed by a
//! newline (`plan watch --json`: one per line, per update; `plan report
//! --format jsonl|csv` writes the planner's export, see
//! [`crate::commands::plan`]): the planner's answer in the API's canonical
//! proto3 JSON ([`write_message`], [`Listing`]), as grpcurl prints it. Times
//! for people are RFC 3339 in UTC with milliseconds
//! (`2024-05-01T12:00:00.000Z`, [`crate::time`]).

use std::io::{self, Write};

use redrive_proto::v1::BodyCompression;
use serde::Serialize;
use serde_json::Value;

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

#[cfg(test)]
mod tests {
    use redrive_proto::v1;

    use super::Value;

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
}
