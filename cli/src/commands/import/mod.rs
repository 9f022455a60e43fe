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
//! | `headers` | object of name → value: plain JSON (string → `long_string`, integer → `i64`, other number → `f64`, bool → `bool`, array → `array`, object → `table`, null → `void`) or the typed shape `{"type": ..., "value": ...}` ([`crate::headers`]) |
//! | `properties` | object with any of `content_type`, `content_encoding`, `delivery_mode`, `priority`, `correlation_id`, `reply_to`, `expiration`, `message_id`, `timestamp` (epoch seconds or RFC 3339), `type`, `user_id`, `app_id`, `cluster_id` |
//! | `reason` | why it died: `rejected`, `expired`, `maxlen`, `delivery_limit`, or free text |
//! | `attempts` | delivery attempts made, a non-negative integer |
//! | `error_text` | the consumer's error |
//! | `occurred_at` | the original event time, RFC 3339 |
//! | `source` | overrides `--source` for this line |
//!
//! A `null` field counts as absent; any other field name is an error (a typo
//! must not silently drop data), and so is a field given twice. The line is
//! read by serde into a struct that denies unknown fields (`properties`
//! too); an error names the field's path (`properties.priority: invalid
//! type: ...`).
//!
//! ```json
//! {"message_id":"m-1","body":"{\"order\":123}","headers":{"event-type":"order.paid","retries":{"type":"i32","value":3}},"properties":{"content_type":"application/json"},"reason":"rejected","error_text":"stock service timeout","original_destination":"orders","occurred_at":"2024-05-01T12:00:00Z"}
//! ```
//!
//! # Bad lines
//! A line that cannot be read (not JSON, not an object, an unknown field,
//! neither or both body fields, bad base64, no `original_destination`, a field
//! of the wrong type) is reported on stderr as `line N: <what is wrong>`
//! (`line 7: unknown field `bdy`, expected one of ...`) and the import goes on. Lines
//! the planner refuses come back with the index of the streamed item and are
//! reported the same way, with their line number in the file.
//!
//! # Output and exit code
//! `imported N, already present M, rejected K (lines: 3, 7, ...)`; `--json`:
//! `{"imported": N, "duplicates": M, "rejected": [{"line": 3, "reason": "..."}]}`
//! (line numbers start at 1). The exit code is 0 when no line was rejected and
//! 65 (`EX_DATAERR`, after the summary, with the error `rejected` on stderr)
//! when some were; 66 when the file cannot be opened; 74 when
//! reading it fails midway (the batches sent before stay imported).
//!
//! # Streaming
//! The file is never loaded whole: a blocking reader thread parses lines and
//! feeds a bounded channel that is the request stream. Every `--batch` items
//! (default 1000), or sooner when one more item would take the call's
//! encoded items past `--batch-bytes` (default 64 MiB), the stream ends and a new
//! `IngestDeadLetters` call starts, so a long import of large bodies is
//! committed in parts too. A line whose item alone is larger than a gRPC
//! message may be ([`MAX_GRPC_MESSAGE_BYTES`]) is rejected with its size: it
//! would end the whole call. Importing a file again is safe: the
//! planner stores each (source, message id) once and counts the rest as already
//! present.

use std::{
    fs::File,
    io::{self, BufRead, BufReader, Write},
};

use clap::Args;
use prost::Message as _;
use redrive_proto::{limits::MAX_GRPC_MESSAGE_BYTES, v1::IngestDeadLettersRequest};
use serde::Serialize;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;

use crate::{
    client::Planner,
    error::{CliError, EX_OK},
    output::write_json,
};

mod line;

pub use line::parse_line;

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

    /// Bytes of encoded items per IngestDeadLetters call: a call ends before
    /// an item that would take it past this many bytes, whatever its count
    /// (at least one item per call).
    #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_BATCH_BYTES, value_parser = clap::value_parser!(u64).range(1..))]
    pub batch_bytes: u64,
}

/// Default `--batch-bytes`.
pub const DEFAULT_BATCH_BYTES: u64 = 64 * 1024 * 1024;

/// Largest item one line may make: a request message the planner accepts,
/// less room for the message's framing.
const MAX_ITEM_BYTES: usize = MAX_GRPC_MESSAGE_BYTES - 1024;

/// How much one `IngestDeadLetters` call carries at most.
#[derive(Debug, Clone, Copy)]
struct BatchLimit {
    items: u64,
    bytes: u64,
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

/// Says on stderr that a line was refused: `line N: why`, or with `--json`
/// a [`warning_json`](crate::error::warning_json) line of code `rejected`.
fn report_rejection(json: bool, line: u64, reason: &str) {
    if json {
        eprintln!(
            "{}",
            crate::error::warning_json("rejected", &format!("line {line}: {reason}"))
        );
    } else {
        eprintln!("line {line}: {reason}");
    }
}

/// Runs `import` over `input` (from [`open`]).
///
/// # Errors
/// gRPC errors (the batches answered before stay imported; a note on stderr
/// says how far it got); [`CliError::Io`] when reading fails midway;
/// [`CliError::Rejected`] (exit 65) after the summary when lines were
/// rejected.
pub async fn run(
    planner: &mut Planner,
    args: ImportArgs,
    input: Input,
    json: bool,
    out: &mut dyn Write,
) -> Result<u8, CliError> {
    let (batches_tx, mut batches) = mpsc::channel::<Batch>(1);
    let source = args.source.clone();
    let limit = BatchLimit {
        items: u64::from(args.batch),
        bytes: args.batch_bytes,
    };
    let reader = tokio::task::spawn_blocking(move || {
        read_lines(input, &source, limit, &batches_tx, |rejection| {
            report_rejection(json, rejection.line, &rejection.reason);
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
                let note = format!(
                    "import stopped after line {last_line_done} ({}); importing the file again is safe",
                    report.summary_line()
                );
                if json {
                    // One JSON error: the note goes into its message.
                    return Err(tonic::Status::new(
                        status.code(),
                        format!("{}; {note}", status.message()),
                    )
                    .into());
                }
                eprintln!("redrivectl: {note}");
                return Err(status.into());
            }
        };
        let lines = batch.lines.await.unwrap_or_default();
        report.imported += answer.accepted;
        report.duplicates += answer.duplicates;
        for rejection in answer.rejected {
            let line = lines.line(rejection.index).unwrap_or(0);
            report_rejection(json, line, &rejection.reason);
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
    if report.rejected.is_empty() {
        return Ok(EX_OK);
    }
    // The summary is printed; the error line (a `rejected` error object
    // with `--json`) ends stderr, as every failure's does.
    Err(CliError::Rejected(format!(
        "{} line(s) rejected (see above); the other lines were imported or already present",
        report.rejected.len()
    )))
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
    // A directory opens on Unix and fails only at the first read, after the
    // summary was begun (a new user's pass: exit 74 and a summary on
    // stdout): refused here, as a file that cannot be opened.
    if file.metadata().is_ok_and(|metadata| metadata.is_dir()) {
        return Err(CliError::NoInput {
            path: path.to_owned(),
            source: io::Error::new(io::ErrorKind::IsADirectory, "is a directory, not a file"),
        });
    }
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
/// within `limit` and reporting each bad line to `on_bad_line`.
/// Stops early, without error, when the receiving side is gone. Blocking: run
/// it on a blocking thread.
fn read_lines(
    mut input: impl BufRead,
    default_source: &str,
    limit: BatchLimit,
    batches: &mpsc::Sender<Batch>,
    mut on_bad_line: impl FnMut(&Rejection),
) -> Result<Vec<Rejection>, ReadError> {
    let mut bad_lines = Vec::new();
    let mut batcher = Batcher {
        batches,
        limit,
        current: None,
    };
    let mut buffer = Vec::new();
    let mut line_number = 0_u64;
    loop {
        buffer.clear();
        match input.read_until(b'\n', &mut buffer) {
            Ok(0) => break,
            Ok(_) => {}
            Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
            Err(error) => {
                batcher.finish();
                return Err(ReadError { bad_lines, error });
            }
        }
        line_number += 1;
        let item = match item_of_line(&buffer, default_source) {
            None => continue,
            Some(Ok(item)) => item,
            Some(Err(reason)) => {
                let rejection = Rejection {
                    line: line_number,
                    reason,
                };
                on_bad_line(&rejection);
                bad_lines.push(rejection);
                continue;
            }
        };
        if !batcher.send(item, line_number) {
            return Ok(bad_lines);
        }
    }
    batcher.finish();
    Ok(bad_lines)
}

/// The ingest item of one line's bytes (`None`: a blank line, skipped).
///
/// # Errors
/// Not UTF-8, what [`parse_line`] finds, or an item larger than one request
/// message may carry ([`MAX_ITEM_BYTES`]).
fn item_of_line(
    bytes: &[u8],
    default_source: &str,
) -> Option<Result<IngestDeadLettersRequest, String>> {
    match std::str::from_utf8(bytes) {
        Err(error) => Some(Err(format!("not UTF-8 text: {error}"))),
        Ok(text) if text.trim().is_empty() => None,
        Ok(text) => Some(parse_line(text, default_source).and_then(|item| {
            let size = item.encoded_len();
            if size > MAX_ITEM_BYTES {
                Err(format!(
                    "the dead letter is {size} bytes encoded, above the {MAX_ITEM_BYTES} bytes one \
                     request message may carry"
                ))
            } else {
                Ok(item)
            }
        })),
    }
}

/// Cuts the items [`read_lines`] reads into batches within a limit, each
/// sent to `batches` when it opens and streamed item by item.
struct Batcher<'a> {
    batches: &'a mpsc::Sender<Batch>,
    limit: BatchLimit,
    /// The batch being streamed, if any.
    current: Option<OpenBatch>,
}

/// The sending side of a [`Batch`] being streamed.
struct OpenBatch {
    items: mpsc::Sender<IngestDeadLettersRequest>,
    lines_tx: oneshot::Sender<LineMap>,
    lines: LineMap,
    /// Items sent so far.
    count: u64,
    /// Their encoded bytes.
    bytes: u64,
}

impl OpenBatch {
    /// Ends the batch: its line map, then the end of its stream.
    fn close(self) {
        // The line map goes first: the call's answer needs it once the
        // stream has ended.
        let _ = self.lines_tx.send(self.lines);
        drop(self.items);
    }
}

impl Batcher<'_> {
    /// Streams `item` (read from line `line_number`) in the open batch, or
    /// a new one when it would take the open one past `--batch-bytes`;
    /// closes the batch when it is full. `false` when the receiving side is
    /// gone.
    fn send(&mut self, item: IngestDeadLettersRequest, line_number: u64) -> bool {
        // A call never goes past `--batch-bytes` with a second item: the
        // one that would is the first of the next call.
        let size = item.encoded_len() as u64;
        let limit = self.limit;
        if self
            .current
            .as_ref()
            .is_some_and(|batch| batch.count > 0 && batch.bytes + size > limit.bytes)
        {
            self.finish();
        }
        if self.current.is_none() && !self.open() {
            return false;
        }
        let Some(batch) = self.current.as_mut() else {
            return true;
        };
        batch.lines.record(batch.count, line_number);
        batch.count += 1;
        batch.bytes += size;
        if batch.items.blocking_send(item).is_err() {
            return false;
        }
        if batch.count >= limit.items || batch.bytes >= limit.bytes {
            self.finish();
        }
        true
    }

    /// Opens a new batch and sends it; `false` when the receiving side is
    /// gone.
    fn open(&mut self) -> bool {
        let (items, items_rx) = mpsc::channel(ITEM_QUEUE);
        let (lines_tx, lines_rx) = oneshot::channel();
        let batch = Batch {
            items: items_rx,
            lines: lines_rx,
        };
        if self.batches.blocking_send(batch).is_err() {
            return false;
        }
        self.current = Some(OpenBatch {
            items,
            lines_tx,
            lines: LineMap::default(),
            count: 0,
            bytes: 0,
        });
        true
    }

    /// Closes the open batch, if any.
    fn finish(&mut self) {
        if let Some(batch) = self.current.take() {
            batch.close();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::{io::Cursor, thread};

    use base64::{Engine, engine::general_purpose::STANDARD};
    use redrive_proto::v1::{HeaderValue, MessageProperties, header_value::Value as V};
    use serde_json::{Value, json};

    use super::*;
    use crate::headers;

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
                "body: invalid type: integer `5`, expected a string",
            ),
            (
                r#"{"body":"a","original_destination":"q","attempts":-1}"#,
                "attempts: invalid value: integer `-1`, expected u32",
            ),
            (
                r#"{"body":"a","original_destination":"q","attempts":"3"}"#,
                "attempts: invalid type: string \"3\", expected u32",
            ),
            (
                r#"{"body":"a","original_destination":"q","attempts":1.5}"#,
                "attempts: invalid type: floating point",
            ),
            (
                r#"{"body":"a","body":"b","original_destination":"q"}"#,
                "duplicate field `body`",
            ),
            (
                r#"{"body":"a"} {}"#,
                "not valid JSON at column 14: trailing characters",
            ),
            // A new user's pass: the parser's own "line 1" beside the file's.
            (
                r#"{"body":"a",nope}"#,
                "not valid JSON at column 13: key must be a string",
            ),
            // A byte-order mark before the first line is not part of it.
            (
                "\u{feff}{\"body\":\"a\",\"original_destination\":\"q\",\"attempts\":\"3\"}",
                "attempts: invalid type: string \"3\", expected u32",
            ),
            (
                r#"{"body":"a","original_destination":"q","occurred_at":"yesterday"}"#,
                "occurred_at:",
            ),
            (
                r#"{"body":"a","original_destination":"q","occurred_at":"2026-12-06T06:10:00"}"#,
                "occurred_at: \"2026-12-06T06:10:00\" has no UTC offset, so its zone is unknown: write 2026-12-06T06:10:00Z for UTC",
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
                "properties: unknown field `colour`, expected one of `content_type`",
            ),
            (
                r#"{"body":"a","original_destination":"q","properties":{"priority":"high"}}"#,
                "properties.priority: invalid type: string \"high\", expected u8",
            ),
            (
                r#"{"body":"a","original_destination":"q","properties":{"priority":256}}"#,
                "properties.priority: invalid value: integer `256`, expected u8",
            ),
            (
                r#"{"body":"a","original_destination":"q","properties":{"timestamp":-5}}"#,
                "properties.timestamp: invalid type: integer `-5`, expected non-negative epoch seconds",
            ),
            (
                r#"{"body":"a","original_destination":"q","properties":{"timestamp":"1969-12-31T23:59:59Z"}}"#,
                "properties.timestamp: before 1970",
            ),
            (
                r#"{"body":"a","original_destination":"q","properties":{"timestamp":"noon"}}"#,
                "properties.timestamp: premature end of input; expected RFC 3339",
            ),
            (
                r#"{"body":"a","original_destination":"q","properties":{"expiration":true}}"#,
                "properties.expiration: invalid type: boolean `true`, expected a string or a non-negative integer",
            ),
            (
                r#"{"body":"a","original_destination":"q","properties":["text/plain"]}"#,
                "properties: invalid type: sequence, expected a JSON object",
            ),
            (
                r#"{"body":"a","original_destination":"q","source":""}"#,
                "source: must not be empty",
            ),
            (
                r#"{"body":"a","original_destination":"q","bdy":"typo"}"#,
                "unknown field `bdy`, expected one of `body`, `body_base64`",
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
    fn null_fields_count_as_absent() {
        let item = parse_line(
            &line(&json!({
                "body": null, "body_base64": "eA==", "original_destination": "q",
                "message_id": null, "headers": null, "properties": null, "reason": null,
                "attempts": null, "error_text": null, "occurred_at": null, "source": null,
            })),
            "default",
        )
        .unwrap();
        assert_eq!(item.body, b"x");
        assert_eq!(item.source, "default");
        assert_eq!(item.message_id, "");
        assert_eq!((item.properties, item.headers), (None, None));
        assert_eq!((item.reason.as_str(), item.attempts), ("", 0));
        assert_eq!((item.error_text.as_str(), item.occurred_at), ("", None));

        let item = parse_line(
            r#"{"body":"x","original_destination":"q","properties":{"content_type":null,"priority":null,"timestamp":null,"expiration":null}}"#,
            "s",
        )
        .unwrap();
        assert_eq!(item.properties, Some(MessageProperties::default()));
    }

    #[test]
    fn every_property_is_read_in_each_accepted_shape() {
        let item = parse_line(
            &line(
                &json!({"body": "", "original_destination": "q", "message_id": "m-1",
                "properties": {
                    "content_type": "application/json", "content_encoding": "gzip",
                    "delivery_mode": 2, "priority": 255, "correlation_id": "c-1",
                    "reply_to": "replies", "expiration": "60000", "message_id": "m-1",
                    "timestamp": 1_714_564_800, "type": "order.paid", "user_id": "guest",
                    "app_id": "shop", "cluster_id": "eu",
                }}),
            ),
            "s",
        )
        .unwrap();
        assert_eq!(
            item.properties,
            Some(MessageProperties {
                content_type: Some("application/json".into()),
                content_encoding: Some("gzip".into()),
                delivery_mode: Some(2),
                priority: Some(255),
                correlation_id: Some("c-1".into()),
                reply_to: Some("replies".into()),
                expiration: Some("60000".into()),
                message_id: Some("m-1".into()),
                timestamp: Some(1_714_564_800),
                r#type: Some("order.paid".into()),
                user_id: Some("guest".into()),
                app_id: Some("shop".into()),
                cluster_id: Some("eu".into()),
            })
        );
        // The timestamp as RFC 3339 (any offset) and the expiration as a number.
        let item = parse_line(
            r#"{"body":"","original_destination":"q","properties":{"timestamp":"2024-05-01T14:00:00+02:00","expiration":60000}}"#,
            "s",
        )
        .unwrap();
        let properties = item.properties.unwrap();
        assert_eq!(properties.timestamp, Some(1_714_564_800));
        assert_eq!(properties.expiration.as_deref(), Some("60000"));

        let long = "x".repeat(256);
        let error = parse_line(
            &line(
                &json!({"body": "", "original_destination": "q", "properties": {"app_id": long}}),
            ),
            "s",
        )
        .unwrap_err();
        assert!(
            error.contains("properties.app_id: longer than 255 bytes"),
            "{error}"
        );
    }

    #[test]
    fn plain_json_headers_map_to_amqp_types() {
        let item = parse_line(
            &line(
                &json!({"body": "", "original_destination": "q", "headers": {
                    "text": "a", "count": -3, "ratio": 0.5, "flag": true, "nothing": null,
                    "list": ["a", 1], "table": {"inner": "b"},
                }}),
            ),
            "s",
        )
        .unwrap();
        assert_eq!(header(&item, "text"), V::LongString(b"a".to_vec()));
        assert_eq!(header(&item, "count"), V::LongLongInt(-3));
        assert_eq!(header(&item, "ratio"), V::Double(0.5));
        assert_eq!(header(&item, "flag"), V::Boolean(true));
        assert!(matches!(header(&item, "nothing"), V::Void(_)));
        let V::Array(list) = header(&item, "list") else {
            panic!("list is not an array");
        };
        assert_eq!(list.values.len(), 2);
        let V::Table(table) = header(&item, "table") else {
            panic!("table is not a table");
        };
        assert_eq!(
            table.fields["inner"].value,
            Some(V::LongString(b"b".to_vec()))
        );
    }

    #[test]
    fn an_unknown_field_rejects_its_line_and_names_it() {
        let text = [
            r#"{"body":"b","original_destination":"q","message_id":"a"}"#,
            r#"{"body":"b","original_destination":"q","message_id":"b","occured_at":"2024-05-01T12:00:00Z"}"#,
            r#"{"body":"b","original_destination":"q","message_id":"c","properties":{"contentType":"text/plain"}}"#,
            r#"{"body":"b","original_destination":"q","message_id":"d"}"#,
        ]
        .join("\n");
        let (batches, bad) = read_all(text.as_bytes(), 10);
        assert_eq!(
            batches,
            vec![vec![(1, "a".to_owned()), (4, "d".to_owned())]]
        );
        assert_eq!(bad.iter().map(|r| r.line).collect::<Vec<_>>(), [2, 3]);
        assert!(
            bad[0]
                .reason
                .starts_with("unknown field `occured_at`, expected one of"),
            "{bad:?}"
        );
        assert!(
            bad[1]
                .reason
                .starts_with("properties: unknown field `contentType`, expected one of"),
            "{bad:?}"
        );
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
        read_within(
            text,
            BatchLimit {
                items: batch_size,
                bytes: u64::MAX,
            },
        )
    }

    /// [`read_all`] with batches cut by `limit`.
    fn read_within(text: &[u8], limit: BatchLimit) -> (Vec<Vec<(u64, String)>>, Vec<Rejection>) {
        let (batches_tx, mut batches_rx) = mpsc::channel(1);
        let input = Cursor::new(text.to_vec());
        let reader = thread::spawn(move || {
            read_lines(input, "s", limit, &batches_tx, |_| {})
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
    fn batches_are_cut_by_bytes_as_well_as_by_count() {
        let body = "x".repeat(1000);
        let line = |id: usize| {
            format!(r#"{{"body":"{body}","original_destination":"q","message_id":"m-{id}"}}"#)
        };
        let text = (0..7).map(line).collect::<Vec<_>>().join("\n");
        // Each item is a little over 1000 bytes: a third would pass 2500.
        let (batches, bad) = read_within(
            text.as_bytes(),
            BatchLimit {
                items: 1000,
                bytes: 2500,
            },
        );
        assert!(bad.is_empty());
        let sizes: Vec<usize> = batches.iter().map(Vec::len).collect();
        assert_eq!(sizes, [2, 2, 2, 1]);
        assert_eq!(batches[3], [(7, "m-6".to_owned())]);
        // A budget below one item still sends every item, one per call.
        let (batches, _) = read_within(
            text.as_bytes(),
            BatchLimit {
                items: 1000,
                bytes: 1,
            },
        );
        assert_eq!(batches.len(), 7);
    }

    #[test]
    fn a_line_larger_than_a_request_message_is_rejected_with_its_size() {
        let body = "x".repeat(MAX_ITEM_BYTES + 1);
        let text = format!(
            "{{\"body\":\"{body}\",\"original_destination\":\"q\",\"message_id\":\"big\"}}\n\
             {{\"body\":\"b\",\"original_destination\":\"q\",\"message_id\":\"small\"}}\n"
        );
        let (batches, bad) = read_all(text.as_bytes(), 10);
        assert_eq!(batches, [vec![(2, "small".to_owned())]]);
        assert_eq!(bad.len(), 1);
        assert_eq!(bad[0].line, 1);
        assert!(
            bad[0].reason.contains("bytes encoded, above the"),
            "{}",
            bad[0].reason
        );
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

    /// Issue 13: one 4,000-character message id aborted a whole import; a
    /// line over the planner's limits is now that line's rejection.
    #[test]
    fn lines_over_the_planners_limits_are_rejected_here() {
        let long_id = format!(
            r#"{{"body":"a","original_destination":"q","message_id":"{}"}}"#,
            "m".repeat(4000)
        );
        let error = parse_line(&long_id, "src").unwrap_err();
        assert_eq!(error, "message_id: 4000 bytes, at most 255");
        let mut headers = "true".to_owned();
        for _ in 0..100 {
            headers = format!(r#"{{"n":{headers}}}"#);
        }
        let deep = format!(r#"{{"body":"a","original_destination":"q","headers":{headers}}}"#);
        let error = parse_line(&deep, "src").unwrap_err();
        assert!(error.contains("deeper than 64 levels"), "{error}");
        let nul = r#"{"body":"a","original_destination":"q","error_text":"x\u0000y"}"#;
        let error = parse_line(nul, "src").unwrap_err();
        assert!(error.starts_with("error_text: contains a NUL"), "{error}");
        // The body is not a text field: any bytes, any size.
        let big_body = format!(
            r#"{{"body":"{}","original_destination":"q"}}"#,
            "b".repeat(100_000)
        );
        assert_eq!(parse_line(&big_body, "src").unwrap().body.len(), 100_000);
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
