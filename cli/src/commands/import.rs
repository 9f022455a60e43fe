//! `redrivectl import FILE --source LABEL [--batch N]`: stores dead letters
//! from a JSON Lines file through `IngestDeadLetters` (client streaming, each
//! item marked `imported`).
//!
//! # The file
//! One JSON object per line (`-` reads stdin); blank lines are skipped. Fields:
//!
//! | field | |
//! | --- | --- |
//! | `body` | the body as text (UTF-8) — or — |
//! | `body_base64` | the exact body bytes, standard base64; exactly one of the two. Gzip and zstd bodies are sent byte-exact; the planner recognizes them by their magic bytes |
//! | `original_destination` | required: the queue it was going to, or `exchange/routing-key` |
//! | `message_id` | with the source, makes the line idempotent; without one the body SHA-256 stands in |
//! | `headers` | object of name → value: plain JSON (string → `long_string`, integer → `i64`, other number → `f64`, bool → `bool`, array → `array`, object → `table`, null → `void`) or the typed shape `{"type": ..., "value": ...}` of `dead-letters show --json` ([`crate::headers`]) |
//! | `properties` | object with any of `content_type`, `content_encoding`, `delivery_mode`, `priority`, `correlation_id`, `reply_to`, `expiration`, `message_id`, `timestamp` (epoch seconds or RFC 3339), `type`, `user_id`, `app_id`, `cluster_id` |
//! | `reason` | why it died: `rejected`, `expired`, `maxlen`, `delivery_limit`, or free text |
//! | `attempts` | delivery attempts made, a non-negative integer |
//! | `error_text` | the consumer's error |
//! | `occurred_at` | the original event time, RFC 3339 |
//! | `source` | overrides `--source` for this line |
//!
//! A `null` field counts as absent; any other field name is an error (a typo
//! must not silently drop data).
//!
//! ```json
//! {"message_id":"m-1","body":"{\"order\":123}","headers":{"event-type":"order.paid","retries":{"type":"i32","value":3}},"properties":{"content_type":"application/json"},"reason":"rejected","error_text":"stock service timeout","original_destination":"orders","occurred_at":"2024-05-01T12:00:00Z"}
//! ```
//!
//! # Bad lines
//! A line that cannot be read (not JSON, not an object, neither or both body
//! fields, bad base64, no `original_destination`, a field of the wrong type) is
//! reported on stderr as `line N: <what is wrong>` and the import goes on. Lines
//! the planner refuses come back with the index of the streamed item and are
//! reported the same way, with their line number in the file.
//!
//! # Output and exit code
//! `imported N, already present M, rejected K (lines: 3, 7, ...)`; `--json`:
//! `{"imported": N, "duplicates": M, "rejected": [{"line": 3, "reason": "..."}]}`
//! (line numbers start at 1). The exit code is 0 when no line was rejected and
//! 65 (`EX_DATAERR`) when some were; 66 when the file cannot be opened; 74 when
//! reading it fails midway (the batches sent before stay imported).
//!
//! # Streaming
//! The file is never loaded whole: a blocking reader thread parses lines and
//! feeds a bounded channel that is the request stream. Every `--batch` items
//! (default 1000) the stream ends and a new `IngestDeadLetters` call starts, so
//! a long import is committed in parts. Importing a file again is safe: the
//! planner stores each (source, message id) once and counts the rest as already
//! present.

use std::{
    fs::File,
    io::{self, BufRead, BufReader, Write},
};

use base64::{Engine, engine::general_purpose::STANDARD};
use clap::Args;
use redrive_proto::{
    time::timestamp,
    v1::{IngestDeadLettersRequest, MessageProperties},
};
use serde::Serialize;
use serde_json::{Map, Value};
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;

use crate::{
    client::Planner,
    error::{CliError, EX_DATAERR, EX_OK},
    headers::{self, kind},
    output::write_json,
    selector::parse_rfc3339,
};

/// Parsed items waiting to be streamed, per batch.
const ITEM_QUEUE: usize = 64;

/// `import` arguments.
#[derive(Debug, Clone, Args)]
pub struct ImportArgs {
    /// JSON Lines file, one dead letter per line; `-` reads stdin.
    #[arg(value_name = "FILE")]
    pub file: String,

    /// Source label for the imported dead letters (a line's `source` overrides it).
    #[arg(long, value_name = "LABEL", value_parser = non_empty)]
    pub source: String,

    /// Items per IngestDeadLetters call; each call is committed on its own.
    #[arg(long, value_name = "N", default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..))]
    pub batch: u32,
}

fn non_empty(text: &str) -> Result<String, String> {
    if text.trim().is_empty() {
        return Err("must not be empty".to_owned());
    }
    Ok(text.to_owned())
}

/// A line that was not imported.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Rejection {
    /// Line number in the file, from 1.
    pub line: u64,
    /// What is wrong with it.
    pub reason: String,
}

/// What an import did (`--json` output).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ImportReport {
    /// Newly stored.
    pub imported: u64,
    /// Already stored (same source and message id).
    pub duplicates: u64,
    /// Lines not imported, by line number.
    pub rejected: Vec<Rejection>,
}

impl ImportReport {
    /// `imported N, already present M, rejected K (lines: 3, 7, ...)`; at most
    /// 20 line numbers are listed.
    pub fn summary_line(&self) -> String {
        const LISTED: usize = 20;
        let mut line = format!(
            "imported {}, already present {}, rejected {}",
            self.imported,
            self.duplicates,
            self.rejected.len()
        );
        if !self.rejected.is_empty() {
            let mut numbers: Vec<String> = self
                .rejected
                .iter()
                .take(LISTED)
                .map(|rejection| rejection.line.to_string())
                .collect();
            if self.rejected.len() > LISTED {
                numbers.push(format!("... {} more", self.rejected.len() - LISTED));
            }
            line.push_str(&format!(" (lines: {})", numbers.join(", ")));
        }
        line
    }
}

/// Runs `import` over `input` (from [`open`]).
///
/// # Errors
/// gRPC errors (the batches answered before stay imported; a note on stderr
/// says how far it got); [`CliError::Io`] when reading fails midway.
pub async fn run(
    planner: &mut Planner,
    args: ImportArgs,
    input: Input,
    json: bool,
    out: &mut dyn Write,
) -> Result<u8, CliError> {
    let (batches_tx, mut batches) = mpsc::channel::<Batch>(1);
    let source = args.source.clone();
    let batch_size = u64::from(args.batch);
    let reader = tokio::task::spawn_blocking(move || {
        read_lines(input, &source, batch_size, &batches_tx, |rejection| {
            eprintln!("line {}: {}", rejection.line, rejection.reason);
        })
    });

    let mut report = ImportReport::default();
    let mut last_line_done = 0_u64;
    while let Some(batch) = batches.recv().await {
        let answer = planner
            .ingest_dead_letters(ReceiverStream::new(batch.items))
            .await;
        let answer = match answer {
            Ok(answer) => answer.into_inner(),
            Err(status) => {
                drop(batches);
                let _ = reader.await;
                eprintln!(
                    "redrivectl: import stopped after line {last_line_done} ({}); importing the file again is safe",
                    report.summary_line()
                );
                return Err(status.into());
            }
        };
        let lines = batch.lines.await.unwrap_or_default();
        report.imported += answer.accepted;
        report.duplicates += answer.duplicates;
        for rejection in answer.rejected {
            let line = lines.line(rejection.index).unwrap_or(0);
            eprintln!("line {line}: {}", rejection.reason);
            report.rejected.push(Rejection {
                line,
                reason: rejection.reason,
            });
        }
        last_line_done = lines.last_line().unwrap_or(last_line_done);
    }

    let read = reader
        .await
        .map_err(|error| CliError::io("reading the import file", io::Error::other(error)))?;
    let read_error = match read {
        Ok(bad_lines) => {
            report.rejected.extend(bad_lines);
            None
        }
        Err(ReadError { bad_lines, error }) => {
            report.rejected.extend(bad_lines);
            Some(error)
        }
    };
    report.rejected.sort_by_key(|rejection| rejection.line);

    if json {
        write_json(out, &report)?;
    } else {
        writeln!(out, "{}", report.summary_line())?;
    }
    if let Some(error) = read_error {
        return Err(CliError::io(format!("reading {}", args.file), error));
    }
    Ok(if report.rejected.is_empty() {
        EX_OK
    } else {
        EX_DATAERR
    })
}

/// The import file, read on a blocking thread.
pub type Input = Box<dyn BufRead + Send>;

/// Opens the import file; `-` is stdin.
///
/// # Errors
/// [`CliError::NoInput`] when the file cannot be opened.
pub fn open(path: &str) -> Result<Input, CliError> {
    if path == "-" {
        return Ok(Box::new(BufReader::new(io::stdin())));
    }
    let file = File::open(path).map_err(|source| CliError::NoInput {
        path: path.to_owned(),
        source,
    })?;
    Ok(Box::new(BufReader::with_capacity(256 * 1024, file)))
}

// ---------------------------------------------------------------------------
// Reading the file into batches
// ---------------------------------------------------------------------------

/// One `IngestDeadLetters` call's worth of items, streamed as they are read.
struct Batch {
    items: mpsc::Receiver<IngestDeadLettersRequest>,
    /// Sent when the batch is complete, before its stream ends.
    lines: oneshot::Receiver<LineMap>,
}

/// Which file line each streamed item of a batch came from. Items are
/// consecutive lines except where bad or blank lines were skipped, so only
/// the jumps are kept.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LineMap {
    /// (first item index, its line) of each run of consecutive lines.
    runs: Vec<(u64, u64)>,
    items: u64,
}

impl LineMap {
    /// Records that item `index` (the next one) came from `line`.
    pub fn record(&mut self, index: u64, line: u64) {
        let continues = self
            .runs
            .last()
            .is_some_and(|(first, first_line)| line - first_line == index - first);
        if !continues {
            self.runs.push((index, line));
        }
        self.items = index + 1;
    }

    /// The line item `index` came from.
    pub fn line(&self, index: u64) -> Option<u64> {
        if index >= self.items {
            return None;
        }
        let run = self.runs.partition_point(|(first, _)| *first <= index);
        let (first, first_line) = self.runs.get(run.checked_sub(1)?)?;
        Some(first_line + (index - first))
    }

    /// The line of the last item.
    pub fn last_line(&self) -> Option<u64> {
        self.items.checked_sub(1).and_then(|index| self.line(index))
    }
}

/// Reading stopped on an I/O error; the bad lines seen until then.
struct ReadError {
    bad_lines: Vec<Rejection>,
    error: io::Error,
}

/// Reads `input` line by line, sending each good line's item into a batch
/// of at most `batch_size` and reporting each bad line to `on_bad_line`.
/// Stops early, without error, when the receiving side is gone. Blocking: run
/// it on a blocking thread.
fn read_lines(
    mut input: impl BufRead,
    default_source: &str,
    batch_size: u64,
    batches: &mpsc::Sender<Batch>,
    mut on_bad_line: impl FnMut(&Rejection),
) -> Result<Vec<Rejection>, ReadError> {
    struct Open {
        items: mpsc::Sender<IngestDeadLettersRequest>,
        lines_tx: oneshot::Sender<LineMap>,
        lines: LineMap,
        count: u64,
    }
    fn close(batch: Open) {
        // The line map goes first: the call's answer needs it once the
        // stream has ended.
        let _ = batch.lines_tx.send(batch.lines);
        drop(batch.items);
    }

    let mut bad_lines = Vec::new();
    let mut current: Option<Open> = None;
    let mut buffer = Vec::new();
    let mut line_number = 0_u64;
    loop {
        buffer.clear();
        match input.read_until(b'\n', &mut buffer) {
            Ok(0) => break,
            Ok(_) => {}
            Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
            Err(error) => {
                if let Some(batch) = current.take() {
                    close(batch);
                }
                return Err(ReadError { bad_lines, error });
            }
        }
        line_number += 1;
        let item = match std::str::from_utf8(&buffer) {
            Err(error) => Err(format!("not UTF-8 text: {error}")),
            Ok(text) if text.trim().is_empty() => continue,
            Ok(text) => parse_line(text, default_source),
        };
        let item = match item {
            Ok(item) => item,
            Err(reason) => {
                let rejection = Rejection {
                    line: line_number,
                    reason,
                };
                on_bad_line(&rejection);
                bad_lines.push(rejection);
                continue;
            }
        };
        if current.is_none() {
            let (items, items_rx) = mpsc::channel(ITEM_QUEUE);
            let (lines_tx, lines_rx) = oneshot::channel();
            let batch = Batch {
                items: items_rx,
                lines: lines_rx,
            };
            if batches.blocking_send(batch).is_err() {
                return Ok(bad_lines);
            }
            current = Some(Open {
                items,
                lines_tx,
                lines: LineMap::default(),
                count: 0,
            });
        }
        let Some(batch) = current.as_mut() else {
            continue;
        };
        batch.lines.record(batch.count, line_number);
        batch.count += 1;
        if batch.items.blocking_send(item).is_err() {
            return Ok(bad_lines);
        }
        if batch.count >= batch_size
            && let Some(full) = current.take()
        {
            close(full);
        }
    }
    if let Some(batch) = current.take() {
        close(batch);
    }
    Ok(bad_lines)
}

// ---------------------------------------------------------------------------
// One line
// ---------------------------------------------------------------------------

/// The fields a line may have.
const LINE_FIELDS: &[&str] = &[
    "body",
    "body_base64",
    "message_id",
    "headers",
    "properties",
    "reason",
    "attempts",
    "error_text",
    "original_destination",
    "occurred_at",
    "source",
];

/// The property names a line's `properties` may have.
const PROPERTY_FIELDS: &[&str] = &[
    "content_type",
    "content_encoding",
    "delivery_mode",
    "priority",
    "correlation_id",
    "reply_to",
    "expiration",
    "message_id",
    "timestamp",
    "type",
    "user_id",
    "app_id",
    "cluster_id",
];

/// Reads one line of an import file (module docs) into an ingest item with
/// `imported` set; `default_source` unless the line has its own `source`.
///
/// # Errors
/// What is wrong with the line, naming the field.
pub fn parse_line(text: &str, default_source: &str) -> Result<IngestDeadLettersRequest, String> {
    let value: Value =
        serde_json::from_str(text).map_err(|error| format!("not valid JSON: {error}"))?;
    let Value::Object(fields) = value else {
        return Err(format!("expected a JSON object, got {}", kind(&value)));
    };
    if let Some(unknown) = fields
        .keys()
        .find(|name| !LINE_FIELDS.contains(&name.as_str()))
    {
        return Err(format!(
            "unknown field {unknown:?} (expected {})",
            LINE_FIELDS.join(", ")
        ));
    }
    let body = match (present(&fields, "body"), present(&fields, "body_base64")) {
        (Some(_), Some(_)) => return Err("both body and body_base64 given; use one".to_owned()),
        (None, None) => return Err("no body: give body (text) or body_base64".to_owned()),
        (Some(body), None) => string("body", body)?.as_bytes().to_vec(),
        (None, Some(encoded)) => STANDARD
            .decode(string("body_base64", encoded)?)
            .map_err(|error| format!("body_base64: not valid base64: {error}"))?,
    };
    let original_destination = optional_string(&fields, "original_destination")?
        .filter(|destination| !destination.trim().is_empty())
        .ok_or_else(|| {
            "original_destination: required (a queue name, or exchange/routing-key)".to_owned()
        })?;
    let source = match optional_string(&fields, "source")? {
        Some(source) if source.trim().is_empty() => {
            return Err("source: must not be empty".to_owned());
        }
        Some(source) => source,
        None => default_source.to_owned(),
    };
    let properties = present(&fields, "properties")
        .map(properties_from_json)
        .transpose()?;
    let message_id = optional_string(&fields, "message_id")?;
    if let (Some(top), Some(property)) = (
        &message_id,
        properties.as_ref().and_then(|p| p.message_id.as_ref()),
    ) && top != property
    {
        return Err(format!(
            "message_id {top:?} and properties.message_id {property:?} differ"
        ));
    }
    let headers = present(&fields, "headers")
        .map(|headers| headers::table_from_json("headers", headers))
        .transpose()?;
    let attempts = present(&fields, "attempts")
        .map(|attempts| {
            attempts
                .as_u64()
                .and_then(|attempts| u32::try_from(attempts).ok())
                .ok_or_else(|| format!("attempts: expected a non-negative integer, got {attempts}"))
        })
        .transpose()?;
    let occurred_at = optional_string(&fields, "occurred_at")?
        .map(|at| parse_rfc3339(&at).map_err(|error| format!("occurred_at: {error}")))
        .transpose()?;
    Ok(IngestDeadLettersRequest {
        source,
        message_id: message_id.unwrap_or_default(),
        body,
        properties,
        headers,
        reason: optional_string(&fields, "reason")?.unwrap_or_default(),
        attempts: attempts.unwrap_or(0),
        error_text: optional_string(&fields, "error_text")?.unwrap_or_default(),
        original_destination,
        occurred_at: occurred_at.map(timestamp),
        imported: true,
    })
}

/// The field, unless absent or null.
fn present<'a>(fields: &'a Map<String, Value>, name: &str) -> Option<&'a Value> {
    fields.get(name).filter(|value| !value.is_null())
}

fn string<'a>(name: &str, value: &'a Value) -> Result<&'a str, String> {
    value
        .as_str()
        .ok_or_else(|| format!("{name}: expected a string, got {}", kind(value)))
}

fn optional_string(fields: &Map<String, Value>, name: &str) -> Result<Option<String>, String> {
    present(fields, name)
        .map(|value| string(name, value).map(str::to_owned))
        .transpose()
}

/// Reads a line's `properties` object.
///
/// # Errors
/// An unknown name, a wrong type, or a short string over 255 bytes.
pub fn properties_from_json(value: &Value) -> Result<MessageProperties, String> {
    let Value::Object(fields) = value else {
        return Err(format!(
            "properties: expected an object, got {}",
            kind(value)
        ));
    };
    if let Some(unknown) = fields
        .keys()
        .find(|name| !PROPERTY_FIELDS.contains(&name.as_str()))
    {
        return Err(format!(
            "properties: unknown property {unknown:?} (expected {})",
            PROPERTY_FIELDS.join(", ")
        ));
    }
    let short = |name: &str| -> Result<Option<String>, String> {
        let Some(value) = present(fields, name) else {
            return Ok(None);
        };
        let text = string(&format!("properties.{name}"), value)?;
        if text.len() > 255 {
            return Err(format!(
                "properties.{name}: longer than 255 bytes, the AMQP short-string limit"
            ));
        }
        Ok(Some(text.to_owned()))
    };
    let octet = |name: &str| -> Result<Option<u32>, String> {
        present(fields, name)
            .map(|value| {
                value
                    .as_u64()
                    .filter(|number| *number <= u64::from(u8::MAX))
                    .and_then(|number| u32::try_from(number).ok())
                    .ok_or_else(|| format!("properties.{name}: expected an integer in 0..=255"))
            })
            .transpose()
    };
    let expiration = match present(fields, "expiration") {
        // AMQP keeps the TTL as a string of milliseconds; accept a number too.
        Some(Value::Number(number)) if number.is_u64() => Some(number.to_string()),
        Some(_) => short("expiration")?,
        None => None,
    };
    let timestamp = present(fields, "timestamp")
        .map(|value| match value {
            Value::Number(number) => number.as_u64().ok_or_else(|| {
                "properties.timestamp: expected non-negative epoch seconds".to_owned()
            }),
            Value::String(text) => parse_rfc3339(text)
                .map_err(|error| format!("properties.timestamp: {error}"))
                .and_then(|at| {
                    u64::try_from(at.timestamp())
                        .map_err(|_| "properties.timestamp: before 1970".to_owned())
                }),
            other => Err(format!(
                "properties.timestamp: expected epoch seconds or RFC 3339, got {}",
                kind(other)
            )),
        })
        .transpose()?;
    Ok(MessageProperties {
        content_type: short("content_type")?,
        content_encoding: short("content_encoding")?,
        delivery_mode: octet("delivery_mode")?,
        priority: octet("priority")?,
        correlation_id: short("correlation_id")?,
        reply_to: short("reply_to")?,
        expiration,
        message_id: short("message_id")?,
        timestamp,
        r#type: short("type")?,
        user_id: short("user_id")?,
        app_id: short("app_id")?,
        cluster_id: short("cluster_id")?,
    })
}

#[cfg(test)]
mod tests {
    use std::{io::Cursor, thread};

    use redrive_proto::v1::{HeaderValue, header_value::Value as V};
    use serde_json::json;

    use super::*;

    fn line(value: &Value) -> String {
        value.to_string()
    }

    fn header(item: &IngestDeadLettersRequest, name: &str) -> V {
        item.headers.as_ref().unwrap().fields[name]
            .value
            .clone()
            .unwrap()
    }

    #[test]
    fn a_full_line_becomes_an_imported_item() {
        let item = parse_line(
            &line(&json!({
                "message_id": "m-1",
                "body": "{\"order\":123}",
                "headers": {"event-type": "order.paid", "retries": {"type": "i32", "value": 3}},
                "properties": {"content_type": "application/json", "delivery_mode": 2,
                               "timestamp": "2024-05-01T12:00:00Z", "expiration": 60000},
                "reason": "rejected",
                "attempts": 5,
                "error_text": "stock service timeout",
                "original_destination": "shop/order.paid",
                "occurred_at": "2024-05-01T12:00:00Z",
            })),
            "orders.export",
        )
        .unwrap();
        assert_eq!(item.source, "orders.export");
        assert_eq!(item.message_id, "m-1");
        assert_eq!(item.body, b"{\"order\":123}");
        assert_eq!(item.reason, "rejected");
        assert_eq!(item.attempts, 5);
        assert_eq!(item.error_text, "stock service timeout");
        assert_eq!(item.original_destination, "shop/order.paid");
        assert_eq!(item.occurred_at.unwrap().seconds, 1_714_564_800);
        assert!(item.imported);
        let properties = item.properties.clone().unwrap();
        assert_eq!(properties.content_type.as_deref(), Some("application/json"));
        assert_eq!(properties.delivery_mode, Some(2));
        assert_eq!(properties.timestamp, Some(1_714_564_800));
        assert_eq!(properties.expiration.as_deref(), Some("60000"));
        assert_eq!(
            header(&item, "event-type"),
            V::LongString(b"order.paid".to_vec())
        );
        assert_eq!(header(&item, "retries"), V::LongInt(3));
    }

    #[test]
    fn a_minimal_line_needs_only_a_body_and_a_destination() {
        let item = parse_line(
            r#"{"body":"x","original_destination":"orders","source":"other","message_id":null}"#,
            "default",
        )
        .unwrap();
        assert_eq!(item.source, "other");
        assert_eq!(item.message_id, "");
        assert_eq!(item.properties, None);
        assert_eq!(item.headers, None);
        assert_eq!(item.occurred_at, None);
    }

    #[test]
    fn compressed_bodies_stay_byte_exact() {
        use flate2::{Compression, write::GzEncoder};
        let mut encoder = GzEncoder::new(Vec::new(), Compression::default());
        encoder.write_all(b"{\"order\":123}").unwrap();
        let gzip = encoder.finish().unwrap();
        let zstd_magic = vec![0x28, 0xb5, 0x2f, 0xfd, 0x00, 0xff, 0x80];
        for body in [gzip, zstd_magic] {
            let item = parse_line(
                &line(&json!({"body_base64": STANDARD.encode(&body), "original_destination": "q"})),
                "s",
            )
            .unwrap();
            assert_eq!(item.body, body);
        }
    }

    #[test]
    fn show_json_headers_feed_back_unchanged() {
        let typed = json!({
            "x-death": {"type": "array", "value": [{"type": "table", "value": {
                "count": {"type": "i64", "value": 2},
                "reason": {"type": "long_string", "value": "rejected"},
                "time": {"type": "timestamp", "value": 1_700_000_000},
            }}]},
            "raw": {"type": "byte_array", "base64": "AAE="},
            "short": {"type": "short_string", "value": "s"},
        });
        let item = parse_line(
            &line(&json!({"body": "", "original_destination": "q", "headers": typed})),
            "s",
        )
        .unwrap();
        assert_eq!(
            headers::table_to_json(item.headers.as_ref().unwrap()),
            typed
        );
        assert_eq!(header(&item, "raw"), V::ByteArray(vec![0, 1]));
        let V::Array(deaths) = header(&item, "x-death") else {
            panic!("x-death is not an array");
        };
        let Some(V::Table(death)) = deaths.values[0].value.clone() else {
            panic!("x-death[0] is not a table");
        };
        assert_eq!(
            death.fields["count"],
            HeaderValue {
                value: Some(V::LongLongInt(2))
            }
        );
    }

    #[test]
    fn bad_lines_say_what_is_wrong() {
        let cases: &[(&str, &str)] = &[
            ("{not json", "not valid JSON"),
            ("[1, 2]", "expected a JSON object, got an array"),
            (r#"{"original_destination":"q"}"#, "no body"),
            (
                r#"{"body":"a","body_base64":"YQ==","original_destination":"q"}"#,
                "both body and body_base64",
            ),
            (
                r#"{"body_base64":"%%%","original_destination":"q"}"#,
                "body_base64: not valid base64",
            ),
            (r#"{"body":"a"}"#, "original_destination: required"),
            (
                r#"{"body":"a","original_destination":" "}"#,
                "original_destination: required",
            ),
            (
                r#"{"body":5,"original_destination":"q"}"#,
                "body: expected a string, got a number",
            ),
            (
                r#"{"body":"a","original_destination":"q","attempts":-1}"#,
                "attempts: expected a non-negative integer",
            ),
            (
                r#"{"body":"a","original_destination":"q","attempts":"3"}"#,
                "attempts: expected a non-negative integer",
            ),
            (
                r#"{"body":"a","original_destination":"q","occurred_at":"yesterday"}"#,
                "occurred_at:",
            ),
            (
                r#"{"body":"a","original_destination":"q","headers":[]}"#,
                "headers: expected an object",
            ),
            (
                r#"{"body":"a","original_destination":"q","headers":{"n":{"type":"u8","value":300}}}"#,
                "headers.n: u8 needs an integer",
            ),
            (
                r#"{"body":"a","original_destination":"q","properties":{"colour":"red"}}"#,
                "properties: unknown property \"colour\"",
            ),
            (
                r#"{"body":"a","original_destination":"q","properties":{"priority":"high"}}"#,
                "properties.priority",
            ),
            (
                r#"{"body":"a","original_destination":"q","properties":{"timestamp":-5}}"#,
                "properties.timestamp",
            ),
            (
                r#"{"body":"a","original_destination":"q","source":""}"#,
                "source: must not be empty",
            ),
            (
                r#"{"body":"a","original_destination":"q","bdy":"typo"}"#,
                "unknown field \"bdy\"",
            ),
            (
                r#"{"body":"a","original_destination":"q","message_id":"a","properties":{"message_id":"b"}}"#,
                "differ",
            ),
        ];
        for (text, expected) in cases {
            let error = parse_line(text, "s").unwrap_err();
            assert!(error.contains(expected), "{text}: {error}");
        }
    }

    #[test]
    fn line_maps_skip_over_gaps() {
        let mut map = LineMap::default();
        for (index, line) in [(0, 1), (1, 2), (2, 5), (3, 6), (4, 7), (5, 10)] {
            map.record(index, line);
        }
        let lines: Vec<_> = (0..7).map(|index| map.line(index)).collect();
        assert_eq!(
            lines,
            [Some(1), Some(2), Some(5), Some(6), Some(7), Some(10), None]
        );
        assert_eq!(map.runs.len(), 3);
        assert_eq!(map.last_line(), Some(10));
        assert_eq!(LineMap::default().line(0), None);
    }

    /// Runs the reader on `text` and collects (items with their line, bad lines)
    /// per batch, like the import loop does.
    fn read_all(text: &[u8], batch_size: u64) -> (Vec<Vec<(u64, String)>>, Vec<Rejection>) {
        let (batches_tx, mut batches_rx) = mpsc::channel(1);
        let input = Cursor::new(text.to_vec());
        let reader = thread::spawn(move || {
            read_lines(input, "s", batch_size, &batches_tx, |_| {})
                .unwrap_or_else(|_| panic!("read error"))
        });
        let mut batches = Vec::new();
        while let Some(mut batch) = batches_rx.blocking_recv() {
            let mut items = Vec::new();
            while let Some(item) = batch.items.blocking_recv() {
                items.push(item.message_id);
            }
            let lines = batch.lines.blocking_recv().unwrap();
            batches.push(
                items
                    .into_iter()
                    .enumerate()
                    .map(|(index, id)| (lines.line(index as u64).unwrap(), id))
                    .collect(),
            );
        }
        (batches, reader.join().unwrap())
    }

    #[test]
    fn the_reader_batches_good_lines_and_reports_bad_ones() {
        let good =
            |id: &str| format!(r#"{{"body":"b","original_destination":"q","message_id":"{id}"}}"#);
        let text = [
            good("a"),
            String::new(),
            "garbage".to_owned(),
            good("b"),
            good("c"),
            "  ".to_owned(),
            good("d"),
            r#"{"body":"no destination"}"#.to_owned(),
        ]
        .join("\r\n");
        let (batches, bad) = read_all(text.as_bytes(), 2);
        assert_eq!(
            batches,
            vec![
                vec![(1, "a".to_owned()), (4, "b".to_owned())],
                vec![(5, "c".to_owned()), (7, "d".to_owned())],
            ]
        );
        assert_eq!(bad.iter().map(|r| r.line).collect::<Vec<_>>(), [3, 8]);
        assert!(bad[0].reason.starts_with("not valid JSON"), "{bad:?}");
        assert!(bad[1].reason.contains("original_destination"), "{bad:?}");

        let (batches, bad) = read_all(b"", 10);
        assert!(batches.is_empty() && bad.is_empty());
        let (batches, bad) = read_all(b"\xff\xfe\n", 10);
        assert!(batches.is_empty());
        assert_eq!(bad[0].line, 1);
        assert!(bad[0].reason.starts_with("not UTF-8"), "{bad:?}");
    }

    #[test]
    fn summary_line_lists_rejected_lines() {
        let mut report = ImportReport {
            imported: 5,
            duplicates: 2,
            rejected: Vec::new(),
        };
        assert_eq!(
            report.summary_line(),
            "imported 5, already present 2, rejected 0"
        );
        report.rejected = [3, 7]
            .into_iter()
            .map(|line| Rejection {
                line,
                reason: "bad".into(),
            })
            .collect();
        assert_eq!(
            report.summary_line(),
            "imported 5, already present 2, rejected 2 (lines: 3, 7)"
        );
        assert_eq!(
            serde_json::to_value(&report).unwrap(),
            json!({"imported": 5, "duplicates": 2, "rejected": [
                {"line": 3, "reason": "bad"}, {"line": 7, "reason": "bad"}
            ]})
        );
    }
}
