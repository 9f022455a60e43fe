//! `plan report --format jsonl|csv`: the planner's audit export, passed on
//! record by record as it streams in, with two changes so that the file is
//! safe to hand around:
//!
//! - Times (the `at` column or key, and any other `*_at`) are written as every
//!   time `redrivectl` prints ([`crate::time`]: `2026-12-01T08:00:00.123Z`).
//! - Text that a spreadsheet would run as a formula is neutralized, as
//!   OWASP's CSV injection advice says: a cell (CSV) or string value (JSONL)
//!   that starts with `=`, `+`, `-`, `@`, a tab or a carriage return gets a
//!   single quote `'` in front (`=HYPERLINK(...)` becomes
//!   `'=HYPERLINK(...)`). Spreadsheets show the quote-prefixed text as
//!   text; to get the original value back, drop one leading `'` from a value
//!   that starts with `'` followed by one of those characters. Numbers in
//!   JSONL stay numbers; the CSV header is left as it is.
//!
//! Everything else is the planner's: columns, keys, quoting, and records
//! ending in `\n`. A CSV record is split off the stream only at a line end
//! outside quotes, so a chunk boundary inside a record, or a line break inside
//! a quoted cell, changes nothing. Bytes that are not UTF-8 are written as
//! they came in CSV, and as U+FFFD in JSONL (which must be UTF-8).

use std::io::{self, Write};

use crate::time;

/// The export formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// One JSON object per line.
    Jsonl,
    /// RFC 4180 CSV with a header record.
    Csv,
}

/// Rewrites an export on its way to `out` (module docs).
pub struct Export<'o> {
    out: &'o mut dyn Write,
    format: Format,
    /// Bytes of a record not complete yet.
    pending: Vec<u8>,
    /// CSV: inside a quoted field at the end of `pending`.
    quoted: bool,
    /// CSV: the header record, once seen (which columns are times).
    header: Option<Vec<bool>>,
}

impl<'o> Export<'o> {
    /// An export in `format` written to `out`.
    pub fn new(out: &'o mut dyn Write, format: Format) -> Self {
        Self {
            out,
            format,
            pending: Vec::new(),
            quoted: false,
            header: None,
        }
    }

    /// Takes the next chunk of the planner's export; writes the records it
    /// completes.
    ///
    /// # Errors
    /// Writing to the output.
    pub fn push(&mut self, chunk: &[u8]) -> io::Result<()> {
        for &byte in chunk {
            self.pending.push(byte);
            match byte {
                b'"' if self.format == Format::Csv => self.quoted = !self.quoted,
                b'\n' if !self.quoted => {
                    let record = std::mem::take(&mut self.pending);
                    self.record(&record)?;
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Writes what is left (a last record without a line end).
    ///
    /// # Errors
    /// Writing to the output.
    pub fn finish(mut self) -> io::Result<()> {
        let record = std::mem::take(&mut self.pending);
        if !record.is_empty() {
            self.record(&record)?;
        }
        self.out.flush()
    }

    fn record(&mut self, record: &[u8]) -> io::Result<()> {
        match self.format {
            Format::Jsonl => self.jsonl(record),
            Format::Csv => self.csv(record),
        }
    }

    fn jsonl(&mut self, line: &[u8]) -> io::Result<()> {
        let text = String::from_utf8_lossy(line);
        match rewrite_json_line(&text) {
            Some(rewritten) => self.out.write_all(rewritten.as_bytes()),
            // Not JSON (the planner never sends that): as it came.
            None => self.out.write_all(line),
        }
    }

    fn csv(&mut self, record: &[u8]) -> io::Result<()> {
        let ending: &[u8] = if record.ends_with(b"\r\n") {
            b"\r\n"
        } else if record.ends_with(b"\n") {
            b"\n"
        } else {
            b""
        };
        let mut reader = csv::ReaderBuilder::new()
            .has_headers(false)
            .flexible(true)
            .from_reader(record);
        let Some(Ok(fields)) = reader.byte_records().next() else {
            // Blank or unreadable: as it came.
            return self.out.write_all(record);
        };
        let Some(times) = &self.header else {
            self.header = Some(
                fields
                    .iter()
                    .map(|name| is_time_name(&String::from_utf8_lossy(name)))
                    .collect(),
            );
            return self.out.write_all(record);
        };
        let cells: Vec<Vec<u8>> = fields
            .iter()
            .enumerate()
            .map(|(index, cell)| {
                let time = times.get(index).copied().unwrap_or(false);
                match std::str::from_utf8(cell) {
                    Ok(text) if time => time::normalize(text)
                        .unwrap_or_else(|| neutralize(text).into_owned())
                        .into_bytes(),
                    Ok(text) => neutralize(text).into_owned().into_bytes(),
                    Err(_) if starts_dangerous(cell) => [b"'".as_slice(), cell].concat(),
                    Err(_) => cell.to_vec(),
                }
            })
            .collect();
        let mut writer = csv::WriterBuilder::new()
            .has_headers(false)
            .terminator(csv::Terminator::Any(b'\n'))
            .from_writer(Vec::new());
        writer.write_record(&cells).map_err(io::Error::other)?;
        let mut data = writer.into_inner().map_err(|error| error.into_error())?;
        data.pop();
        data.extend_from_slice(ending);
        self.out.write_all(&data)
    }
}

/// Whether a column or key holds a time: `at` or `..._at`.
fn is_time_name(name: &str) -> bool {
    name == "at" || name.ends_with("_at")
}

/// Whether a spreadsheet would read text starting so as a formula.
fn starts_dangerous(text: &[u8]) -> bool {
    matches!(
        text.first(),
        Some(b'=' | b'+' | b'-' | b'@' | b'\t' | b'\r')
    )
}

/// `text`, with a `'` in front when it starts like a formula (module docs).
pub fn neutralize(text: &str) -> std::borrow::Cow<'_, str> {
    if starts_dangerous(text.as_bytes()) {
        format!("'{text}").into()
    } else {
        text.into()
    }
}

/// One JSONL line with its string values rewritten (module docs): keys,
/// their order, numbers and spacing as they were. `None` when the line is
/// not valid JSON.
fn rewrite_json_line(line: &str) -> Option<String> {
    let body = line.trim_end_matches(['\n', '\r']);
    if !body.trim().is_empty() && serde_json::from_str::<serde::de::IgnoredAny>(body).is_err() {
        return None;
    }
    let mut out = String::with_capacity(line.len() + 8);
    let mut key: Option<String> = None;
    let mut rest = line;
    while let Some(start) = rest.find('"') {
        out.push_str(&rest[..start]);
        let after = &rest[start + 1..];
        // The closing quote: the first `"` not escaped.
        let mut escaped = false;
        let end = after.char_indices().find_map(|(index, c)| {
            let close = c == '"' && !escaped;
            escaped = c == '\\' && !escaped;
            close.then_some(index)
        })?;
        let token = &rest[start..start + end + 2];
        rest = &rest[start + end + 2..];
        let is_key = rest.trim_start().starts_with(':');
        let text: String = serde_json::from_str(token).ok()?;
        if is_key {
            out.push_str(token);
            key = Some(text);
            continue;
        }
        let time = key
            .as_deref()
            .filter(|key| is_time_name(key))
            .and_then(|_| time::normalize(&text));
        match time {
            Some(time) => out.push_str(&serde_json::to_string(&time).ok()?),
            None if starts_dangerous(text.as_bytes()) => {
                out.push_str(&serde_json::to_string(&neutralize(&text)).ok()?);
            }
            None => out.push_str(token),
        }
    }
    out.push_str(rest);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn export(format: Format, chunks: &[&[u8]]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut export = Export::new(&mut out, format);
        for chunk in chunks {
            export.push(chunk).unwrap();
        }
        export.finish().unwrap();
        out
    }

    #[test]
    fn csv_cells_that_start_a_formula_are_quoted_and_times_rewritten() {
        let out = export(
            Format::Csv,
            &[
                b"at,plan_id,message_key,reason\n2024-05-01T12:00:00.123456+00:00,p-1,=HYPERLINK(\"x\"),ok\n",
                b"2024-05-01T12:00:01+00:00,p-1,\"@SUM(A1:A2)\",\"-2+3\"\n,p-1,\"+1, and\nmore\",\"\tx\"\n",
                b"2024-05-01T12:00:02Z,p-1,bin-\xff,\"\rcr\"",
            ],
        );
        assert_eq!(
            String::from_utf8_lossy(&out),
            "at,plan_id,message_key,reason\n\
             2024-05-01T12:00:00.123Z,p-1,\"'=HYPERLINK(\"\"x\"\")\",ok\n\
             2024-05-01T12:00:01.000Z,p-1,'@SUM(A1:A2),'-2+3\n\
             ,p-1,\"'+1, and\nmore\",'\tx\n\
             2024-05-01T12:00:02.000Z,p-1,bin-\u{fffd},\"'\rcr\""
        );
        // Bytes that are not UTF-8 pass as they came.
        assert!(out.windows(5).any(|window| window == b"bin-\xff"));
    }

    #[test]
    fn a_record_split_across_chunks_is_whole() {
        let out = export(
            Format::Csv,
            &[b"at,message_key\r\n2024-05-01T12:00:00Z,\"key,", b"2\"\r\n"],
        );
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "at,message_key\r\n2024-05-01T12:00:00.000Z,\"key,2\"\r\n"
        );
    }

    #[test]
    fn jsonl_strings_are_neutralized_and_times_rewritten() {
        let out = export(
            Format::Jsonl,
            &[
                b"{\"at\":\"2024-05-01T12:00:00.5+00:00\",\"message_key\":\"=cmd|' /C calc'!A0\",\"attempt\":-1}\n{\"at\":null,",
                b"\"reason\":\"@x\"}\n",
            ],
        );
        // Keys in their order, numbers as they were.
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "{\"at\":\"2024-05-01T12:00:00.500Z\",\"message_key\":\"'=cmd|' /C calc'!A0\",\"attempt\":-1}\n\
             {\"at\":null,\"reason\":\"'@x\"}\n"
        );
        // Escapes in the text stay escapes.
        assert_eq!(
            rewrite_json_line("{\"k\":\"-\\\"q\\\" \\u00e9\", \"n\": \"ok\"}\n").unwrap(),
            "{\"k\":\"'-\\\"q\\\" é\", \"n\": \"ok\"}\n"
        );
        assert_eq!(rewrite_json_line("not json\n"), None);
    }
}
