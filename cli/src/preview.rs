//! The body preview of `dead-letters show` (and `repair`), made here from the
//! body itself when it is not compressed, so that it shows the body as the
//! producer wrote it:
//!
//! - JSON is pretty-printed from its own text ([`pretty_json`]): keys stay in
//!   the body's order, numbers and string escapes as written.
//! - A body that is not UTF-8 (binary) is shown escaped: text runs as they
//!   are, every byte that is not text as `\xNN`, control characters as
//!   [`crate::escape`] writes them, after a `[binary: ...]` note. So is
//!   a text body's control characters, in the JSON `body_preview` too.
//! - Other text is shown as it is.
//!
//! Cut at [`PREVIEW_LIMIT_BYTES`] with a note, as the planner cuts. A body
//! that is or says it is compressed (gzip or zstd magic, a zlib header, a
//! `content_encoding`) keeps the planner's preview, which decompresses it.

use redrive_proto::v1::DeadLetter;

use crate::escape::visible;

/// The most of a body a preview shows (the planner's limit too).
pub const PREVIEW_LIMIT_BYTES: usize = 64 * 1024;

/// The preview of the body replays use (the latest revision, else the
/// captured body); `planner_preview` is the planner's, kept for compressed
/// bodies.
pub fn body_preview(dead_letter: &DeadLetter, planner_preview: &str) -> String {
    let body = dead_letter
        .revisions
        .last()
        .map_or(dead_letter.body.as_slice(), |revision| {
            revision.body.as_slice()
        });
    let declared = dead_letter
        .properties
        .as_ref()
        .and_then(|properties| properties.content_encoding.as_deref())
        .is_some_and(|encoding| !encoding.trim().is_empty());
    if declared || looks_compressed(body) {
        return planner_preview.to_owned();
    }
    preview(body)
}

/// Whether `body` starts like a gzip, zstd or zlib stream.
fn looks_compressed(body: &[u8]) -> bool {
    let zlib = match body {
        [first, second, ..] => {
            first & 0x0f == 8 && (u16::from(*first) << 8 | u16::from(*second)) % 31 == 0
        }
        _ => false,
    };
    body.starts_with(&[0x1f, 0x8b]) || body.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) || zlib
}

/// The preview of an uncompressed body (module docs).
pub fn preview(body: &[u8]) -> String {
    let mut notes = Vec::new();
    let cut = body.len() > PREVIEW_LIMIT_BYTES;
    let text = match std::str::from_utf8(body) {
        Ok(text) if serde_json::from_str::<serde::de::IgnoredAny>(text).is_ok() => {
            pretty_json(text)
        }
        Ok(text) => visible(text),
        Err(_) => {
            notes.push("[binary: not UTF-8; bytes that are not text shown as \\xNN]".to_owned());
            escape_binary(&body[..body.len().min(PREVIEW_LIMIT_BYTES)])
        }
    };
    let mut text = text;
    if text.len() > PREVIEW_LIMIT_BYTES || cut {
        let mut end = text.len().min(PREVIEW_LIMIT_BYTES);
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        notes.push(format!("[cut at {PREVIEW_LIMIT_BYTES} bytes]"));
    }
    if notes.is_empty() {
        text
    } else {
        format!("{}\n{text}", notes.join("\n"))
    }
}

/// `bytes` with its UTF-8 runs kept (control characters escaped) and every
/// other byte as `\xNN`.
fn escape_binary(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 2);
    for chunk in bytes.utf8_chunks() {
        out.push_str(&visible(chunk.valid()));
        for byte in chunk.invalid() {
            out.push_str(&format!("\\x{byte:02x}"));
        }
    }
    out
}

pub use redrive_proto::json::pretty as pretty_json;

#[cfg(test)]
mod tests {
    use redrive_proto::v1::{BodyRevision, MessageProperties};

    use super::*;

    #[test]
    fn binary_bodies_are_escaped() {
        let text = preview(b"ok\x00\x1b[2J\xff\xfe end\n");
        assert_eq!(
            text,
            "[binary: not UTF-8; bytes that are not text shown as \\xNN]\nok\\x00\\x1b[2J\\xff\\xfe end\n"
        );
        assert!(!text.bytes().any(|byte| byte < 0x20 && byte != b'\n'));
        // Text with controls, too.
        assert_eq!(preview(b"a\x07b"), "a\\x07b");
    }

    #[test]
    fn long_bodies_are_cut() {
        let text = preview(&vec![b'a'; PREVIEW_LIMIT_BYTES + 10]);
        assert!(text.starts_with("[cut at 65536 bytes]\n"));
        assert_eq!(
            text.len(),
            PREVIEW_LIMIT_BYTES + "[cut at 65536 bytes]\n".len()
        );
    }

    #[test]
    fn the_latest_revision_is_shown_and_compressed_bodies_keep_the_planners() {
        let mut dead_letter = DeadLetter {
            body: br#"{"b":1,"a":2}"#.to_vec(),
            ..Default::default()
        };
        assert_eq!(
            body_preview(&dead_letter, "planner"),
            "{\n  \"b\": 1,\n  \"a\": 2\n}"
        );
        dead_letter.revisions.push(BodyRevision {
            body: br#"{"fixed":true}"#.to_vec(),
            ..Default::default()
        });
        assert_eq!(
            body_preview(&dead_letter, "planner"),
            "{\n  \"fixed\": true\n}"
        );
        let gzip = DeadLetter {
            body: vec![0x1f, 0x8b, 0x08, 0x00],
            ..Default::default()
        };
        assert_eq!(body_preview(&gzip, "planner"), "planner");
        let declared = DeadLetter {
            body: b"{}".to_vec(),
            properties: Some(MessageProperties {
                content_encoding: Some("deflate".into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(body_preview(&declared, "planner"), "planner");
    }
}
