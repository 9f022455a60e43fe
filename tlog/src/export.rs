//! A log export: the rows the planner writes (CSV or JSON Lines) and a
//! verifier reads back ([`read_log_export`], then [`crate::verify`]).
//!
//! One row per leaf of the log, and one per record the database has that
//! the log never sealed. The columns, in order, are [`LOG_COLUMNS`]:
//!
//! ```text
//! leaf_index, kind, plan_id, id, at, slice_id, dead_letter_id, message_key,
//! message_id, destination, action, reason, wave, executor_id, attempt,
//! confirm_latency_us, actor, leaf_hash
//! ```
//!
//! - `leaf_index` (the leaf's zero-based position) and `leaf_hash` (the
//!   sealed RFC 6962 leaf hash, 64 lowercase hex digits) are present for a
//!   sealed leaf and empty (CSV) or `null` (JSON) for a record the log
//!   never sealed.
//! - `kind` (`event` or `action`), `plan_id` and `id` name the record, and
//!   are always present.
//! - The content columns (`at` to `actor`) are the record as the database
//!   has it now. A record the log sealed but the database lost has `at`
//!   and every content column empty (`null`). An event leaves `actor`
//!   empty; an action leaves the event-only columns (`slice_id`,
//!   `dead_letter_id`, `message_key`, `message_id`, `destination`, `wave`,
//!   `executor_id`, `attempt`, `confirm_latency_us`) empty. An event's
//!   `slice_id` is empty when it has none.
//!
//! CSV files are RFC 4180 with a header line and `\n` record ends; JSON
//! Lines files have one object per line with the column names as keys
//! (integers as numbers, absent values `null`, and a `"note"` member when a
//! row has one), and start with a `{"checkpoint": …}` line holding the
//! signed checkpoint the export was made at. Every string cell is written
//! through [`spreadsheet_safe`] and read back through
//! [`spreadsheet_original`].

use std::borrow::Cow;

use crate::Hash;
use crate::leaf::{self, ActionLeaf, Entry, EventLeaf};

/// The columns of a log export, in order (the CSV header, the JSON keys).
pub const LOG_COLUMNS: [&str; 18] = [
    "leaf_index",
    "kind",
    "plan_id",
    "id",
    "at",
    "slice_id",
    "dead_letter_id",
    "message_key",
    "message_id",
    "destination",
    "action",
    "reason",
    "wave",
    "executor_id",
    "attempt",
    "confirm_latency_us",
    "actor",
    "leaf_hash",
];

// Column positions in LOG_COLUMNS.
const LEAF_INDEX: usize = 0;
const KIND: usize = 1;
const PLAN_ID: usize = 2;
const ID: usize = 3;
const AT: usize = 4;
const SLICE_ID: usize = 5;
const DEAD_LETTER_ID: usize = 6;
const MESSAGE_KEY: usize = 7;
const MESSAGE_ID: usize = 8;
const DESTINATION: usize = 9;
const ACTION: usize = 10;
const REASON: usize = 11;
const WAVE: usize = 12;
const EXECUTOR_ID: usize = 13;
const ATTEMPT: usize = 14;
const CONFIRM_LATENCY_US: usize = 15;
const ACTOR: usize = 16;
const LEAF_HASH: usize = 17;

/// The columns only an event has.
const EVENT_ONLY: [usize; 9] = [
    SLICE_ID,
    DEAD_LETTER_ID,
    MESSAGE_KEY,
    MESSAGE_ID,
    DESTINATION,
    WAVE,
    EXECUTOR_ID,
    ATTEMPT,
    CONFIRM_LATENCY_US,
];

/// `text` as a spreadsheet will not run it as a formula: text starting
/// with `=`, `+`, `-`, `@`, a tab or a carriage return (OWASP, "CSV
/// Injection") gets one `'` in front, and so does text starting with `'`
/// itself, so that [`spreadsheet_original`] can undo it exactly:
/// `spreadsheet_original(&spreadsheet_safe(x)) == x` for every string.
pub fn spreadsheet_safe(text: &str) -> String {
    match text.as_bytes().first() {
        Some(b'=' | b'+' | b'-' | b'@' | b'\t' | b'\r' | b'\'') => {
            let mut safe = String::with_capacity(text.len() + 1);
            safe.push('\'');
            safe.push_str(text);
            safe
        }
        _ => text.to_owned(),
    }
}

/// The text [`spreadsheet_safe`] was given: `text` without one leading
/// `'`, if it has one.
pub fn spreadsheet_original(text: &str) -> String {
    text.strip_prefix('\'').unwrap_or(text).to_owned()
}

/// [`spreadsheet_original`] without copying when nothing changes.
fn original(text: &str) -> &str {
    text.strip_prefix('\'').unwrap_or(text)
}

/// One row of a log export.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogRow {
    /// The leaf's zero-based index in the log; `None` for a record the log
    /// never sealed.
    pub leaf_index: Option<u64>,
    /// `event` or `action`.
    pub kind: String,
    /// The record's plan.
    pub plan_id: String,
    /// The record's id (the event's or the action's).
    pub id: i64,
    /// The record as the database has it now; `None` when it is gone (the
    /// log sealed it, the database lost it).
    pub entry: Option<Entry>,
    /// The leaf hash the log sealed; `None` exactly when `leaf_index` is.
    pub leaf_hash: Option<Hash>,
    /// Why an unsealed record was not sealed, e.g. "the planner refused to
    /// seal it: no valid MAC"; empty if nothing to say. Written in JSON
    /// Lines only.
    pub note: String,
}

/// A cell of a row, before it is written.
enum Cell<'a> {
    Absent,
    Unsigned(u64),
    Integer(i64),
    Text(Cow<'a, str>),
}

/// A borrowed text cell.
fn text(value: &str) -> Cell<'_> {
    Cell::Text(Cow::Borrowed(value))
}

/// The cells of `row`, in [`LOG_COLUMNS`] order.
fn cells(row: &LogRow) -> [Cell<'_>; 18] {
    let mut cells: [Cell<'_>; 18] = std::array::from_fn(|_| Cell::Absent);
    if let Some(index) = row.leaf_index {
        cells[LEAF_INDEX] = Cell::Unsigned(index);
    }
    cells[KIND] = Cell::Text(Cow::Borrowed(row.kind.as_str()));
    cells[PLAN_ID] = Cell::Text(Cow::Borrowed(row.plan_id.as_str()));
    cells[ID] = Cell::Integer(row.id);
    match &row.entry {
        None => {}
        Some(Entry::Event(event)) => {
            cells[AT] = text(&event.at);
            if let Some(slice) = event.slice_id {
                cells[SLICE_ID] = Cell::Integer(slice);
            }
            cells[DEAD_LETTER_ID] = Cell::Integer(event.dead_letter_id);
            cells[MESSAGE_KEY] = text(&event.message_key);
            cells[MESSAGE_ID] = text(&event.message_id);
            cells[DESTINATION] = text(&event.destination);
            cells[ACTION] = text(&event.action);
            cells[REASON] = text(&event.reason);
            cells[WAVE] = text(&event.wave);
            cells[EXECUTOR_ID] = text(&event.executor_id);
            cells[ATTEMPT] = Cell::Integer(i64::from(event.attempt));
            cells[CONFIRM_LATENCY_US] = Cell::Integer(event.confirm_latency_us);
        }
        Some(Entry::Action(action)) => {
            cells[AT] = text(&action.at);
            cells[ACTION] = text(&action.action);
            cells[REASON] = text(&action.reason);
            cells[ACTOR] = text(&action.actor);
        }
    }
    if let Some(hash) = row.leaf_hash {
        cells[LEAF_HASH] = Cell::Text(Cow::Owned(hex::encode(hash)));
    }
    cells
}

/// A CSV writer for the export's dialect: RFC 4180 quoting, `\n` record
/// ends, no header of its own.
fn csv_writer() -> csv::Writer<Vec<u8>> {
    csv::WriterBuilder::new()
        .has_headers(false)
        .terminator(csv::Terminator::Any(b'\n'))
        .from_writer(Vec::new())
}

/// The bytes written so far by a CSV writer over a `Vec`.
fn csv_bytes(writer: csv::Writer<Vec<u8>>) -> Vec<u8> {
    writer
        .into_inner()
        .unwrap_or_else(|_| unreachable!("flushing into a Vec cannot fail"))
}

/// The CSV header line, [`LOG_COLUMNS`] separated by commas, ending in
/// `\n`.
pub fn csv_header() -> Vec<u8> {
    let mut writer = csv_writer();
    writer
        .write_record(LOG_COLUMNS)
        .expect("writing to a Vec cannot fail");
    csv_bytes(writer)
}

/// The CSV records of `rows` (no header: see [`csv_header`]), RFC 4180
/// quoting where needed, each record ending in `\n`. Every string cell goes
/// through [`spreadsheet_safe`]; integers are plain decimal; absent values
/// are empty. `note` is not written (a CSV export says a row is unsealed by
/// an empty `leaf_index` only).
pub fn csv_rows(rows: &[LogRow]) -> Vec<u8> {
    let mut writer = csv_writer();
    let mut record: Vec<String> = Vec::with_capacity(LOG_COLUMNS.len());
    for row in rows {
        record.clear();
        record.extend(cells(row).iter().map(|cell| match cell {
            Cell::Absent => String::new(),
            Cell::Unsigned(value) => value.to_string(),
            Cell::Integer(value) => value.to_string(),
            Cell::Text(text) => spreadsheet_safe(text),
        }));
        writer
            .write_record(&record)
            .expect("writing to a Vec cannot fail");
    }
    csv_bytes(writer)
}

/// The JSON Lines of `rows`: one object per row and line, ending in `\n`,
/// with the [`LOG_COLUMNS`] as keys in that order, integers as numbers,
/// absent values (`leaf_index`, `slice_id`, a gone record's fields, the
/// other kind's fields) as `null`, every string through
/// [`spreadsheet_safe`], and a last `"note"` member when the row's note is
/// not empty.
pub fn jsonl_rows(rows: &[LogRow]) -> Vec<u8> {
    let mut out = Vec::with_capacity(rows.len() * 400);
    for row in rows {
        out.push(b'{');
        for (column, cell) in LOG_COLUMNS.iter().zip(cells(row).iter()) {
            if *column != LOG_COLUMNS[0] {
                out.push(b',');
            }
            leaf::write_json_string(&mut out, column);
            out.push(b':');
            match cell {
                Cell::Absent => out.extend_from_slice(b"null"),
                Cell::Unsigned(value) => out.extend_from_slice(value.to_string().as_bytes()),
                Cell::Integer(value) => out.extend_from_slice(value.to_string().as_bytes()),
                Cell::Text(text) => leaf::write_json_string(&mut out, &spreadsheet_safe(text)),
            }
        }
        if !row.note.is_empty() {
            out.extend_from_slice(b",\"note\":");
            leaf::write_json_string(&mut out, &spreadsheet_safe(&row.note));
        }
        out.extend_from_slice(b"}\n");
    }
    out
}

/// The first line of a JSON Lines log export: `{"checkpoint":"<note>"}`
/// and `\n`, `note` being the signed checkpoint note the export was made
/// at, as a JSON string (not passed through [`spreadsheet_safe`]).
pub fn jsonl_checkpoint_line(note: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(note.len() + 20);
    out.extend_from_slice(b"{\"checkpoint\":");
    leaf::write_json_string(&mut out, note);
    out.extend_from_slice(b"}\n");
    out
}

/// A log export as read by [`read_log_export`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LogExport {
    /// The signed checkpoint note of a JSON Lines export's first line;
    /// `None` for CSV (which has none) and JSON Lines without one.
    pub checkpoint: Option<String>,
    /// The rows, in file order.
    pub rows: Vec<LogRow>,
}

/// Why a log export could not be read. The location is a CSV record (and
/// its line) or a JSON Lines line, counted from 1.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// A record or line that cannot be read at all.
    #[error("{location}: {message}")]
    Syntax {
        /// Where: `CSV record N (line L)` or `line N`.
        location: String,
        /// What is wrong.
        message: String,
    },
    /// A field with a value it cannot have.
    #[error("{location}, field `{field}`: {message}")]
    Field {
        /// Where: `CSV record N (line L)` or `line N`.
        location: String,
        /// The column.
        field: &'static str,
        /// What is wrong.
        message: String,
    },
}

/// A row's cells as read from a file, before they are judged.
trait RawCells {
    /// The cell's text (still spreadsheet-safe), `None` when absent or
    /// empty; `Err` with a message for a cell that is not text.
    fn text(&self, column: usize) -> Result<Option<&str>, String>;
    /// The cell as an integer, `None` when absent or empty.
    fn integer(&self, column: usize) -> Result<Option<i64>, String>;
    /// The cell as an unsigned integer, `None` when absent or empty.
    fn unsigned(&self, column: usize) -> Result<Option<u64>, String>;
}

/// A CSV record's cells.
struct CsvCells<'a>(&'a csv::StringRecord);

impl RawCells for CsvCells<'_> {
    fn text(&self, column: usize) -> Result<Option<&str>, String> {
        Ok(self.0.get(column).filter(|text| !text.is_empty()))
    }

    fn integer(&self, column: usize) -> Result<Option<i64>, String> {
        match self.text(column)? {
            None => Ok(None),
            Some(text) => parse_integer(text).map(Some),
        }
    }

    fn unsigned(&self, column: usize) -> Result<Option<u64>, String> {
        match self.text(column)? {
            None => Ok(None),
            Some(text) => parse_unsigned(text).map(Some),
        }
    }
}

/// A decimal integer cell.
fn parse_integer(text: &str) -> Result<i64, String> {
    text.parse::<i64>()
        .map_err(|_| format!("{text:?} is not a 64-bit integer"))
}

/// A decimal unsigned integer cell (no sign).
fn parse_unsigned(text: &str) -> Result<u64, String> {
    if !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("{text:?} is not a non-negative integer"));
    }
    text.parse::<u64>()
        .map_err(|_| format!("{text:?} is not a 64-bit non-negative integer"))
}

/// A JSON Lines object's members.
struct JsonCells<'a>(&'a serde_json::Map<String, serde_json::Value>);

impl RawCells for JsonCells<'_> {
    fn text(&self, column: usize) -> Result<Option<&str>, String> {
        match self.0.get(LOG_COLUMNS[column]) {
            None | Some(serde_json::Value::Null) => Ok(None),
            Some(serde_json::Value::String(text)) if text.is_empty() => Ok(None),
            Some(serde_json::Value::String(text)) => Ok(Some(text)),
            Some(other) => Err(format!("{other} is not a string")),
        }
    }

    fn integer(&self, column: usize) -> Result<Option<i64>, String> {
        match self.0.get(LOG_COLUMNS[column]) {
            None | Some(serde_json::Value::Null) => Ok(None),
            Some(value) => value
                .as_i64()
                .map(Some)
                .ok_or_else(|| format!("{value} is not a 64-bit integer")),
        }
    }

    fn unsigned(&self, column: usize) -> Result<Option<u64>, String> {
        match self.0.get(LOG_COLUMNS[column]) {
            None | Some(serde_json::Value::Null) => Ok(None),
            Some(value) => value
                .as_u64()
                .map(Some)
                .ok_or_else(|| format!("{value} is not a 64-bit non-negative integer")),
        }
    }
}

/// A JSON Lines row as serde reads it: the fast path of [`read_jsonl`]
/// (strings borrowed from the line unless they have escapes). A line it
/// refuses is read again through [`JsonCells`] for a precise error.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonRow<'a> {
    #[serde(default)]
    leaf_index: Option<u64>,
    #[serde(default, borrow)]
    kind: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    plan_id: Option<Cow<'a, str>>,
    #[serde(default)]
    id: Option<i64>,
    #[serde(default, borrow)]
    at: Option<Cow<'a, str>>,
    #[serde(default)]
    slice_id: Option<i64>,
    #[serde(default)]
    dead_letter_id: Option<i64>,
    #[serde(default, borrow)]
    message_key: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    message_id: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    destination: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    action: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    reason: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    wave: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    executor_id: Option<Cow<'a, str>>,
    #[serde(default)]
    attempt: Option<i64>,
    #[serde(default)]
    confirm_latency_us: Option<i64>,
    #[serde(default, borrow)]
    actor: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    leaf_hash: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    note: Option<Cow<'a, str>>,
}

impl RawCells for JsonRow<'_> {
    fn text(&self, column: usize) -> Result<Option<&str>, String> {
        let value = match column {
            KIND => &self.kind,
            PLAN_ID => &self.plan_id,
            AT => &self.at,
            MESSAGE_KEY => &self.message_key,
            MESSAGE_ID => &self.message_id,
            DESTINATION => &self.destination,
            ACTION => &self.action,
            REASON => &self.reason,
            WAVE => &self.wave,
            EXECUTOR_ID => &self.executor_id,
            ACTOR => &self.actor,
            LEAF_HASH => &self.leaf_hash,
            _ => unreachable!("column {column} is not text"),
        };
        Ok(value.as_deref().filter(|text| !text.is_empty()))
    }

    fn integer(&self, column: usize) -> Result<Option<i64>, String> {
        Ok(match column {
            ID => self.id,
            SLICE_ID => self.slice_id,
            DEAD_LETTER_ID => self.dead_letter_id,
            ATTEMPT => self.attempt,
            CONFIRM_LATENCY_US => self.confirm_latency_us,
            _ => unreachable!("column {column} is not an integer"),
        })
    }

    fn unsigned(&self, column: usize) -> Result<Option<u64>, String> {
        debug_assert_eq!(column, LEAF_INDEX);
        Ok(self.leaf_index)
    }
}

/// Builds a row from its cells, judging them; errors name `location` and
/// the field.
fn build_row(cells: &impl RawCells, location: &dyn Fn() -> String) -> Result<LogRow, ExportError> {
    let field_error = |column: usize, message: String| ExportError::Field {
        location: location(),
        field: LOG_COLUMNS[column],
        message,
    };
    let text = |column: usize| -> Result<Option<&str>, ExportError> {
        Ok(cells
            .text(column)
            .map_err(|message| field_error(column, message))?
            .map(original)
            .filter(|text| !text.is_empty()))
    };
    let integer = |column: usize| -> Result<Option<i64>, ExportError> {
        cells
            .integer(column)
            .map_err(|message| field_error(column, message))
    };
    let required_integer = |column: usize| -> Result<i64, ExportError> {
        integer(column)?.ok_or_else(|| field_error(column, "is empty".into()))
    };
    let absent = |column: usize, why: &str| -> Result<(), ExportError> {
        let empty = match column {
            SLICE_ID | DEAD_LETTER_ID | ATTEMPT | CONFIRM_LATENCY_US => integer(column)?.is_none(),
            _ => text(column)?.is_none(),
        };
        if empty {
            Ok(())
        } else {
            Err(field_error(column, format!("must be empty: {why}")))
        }
    };

    let leaf_index = cells
        .unsigned(LEAF_INDEX)
        .map_err(|message| field_error(LEAF_INDEX, message))?;
    let kind = text(KIND)?.ok_or_else(|| field_error(KIND, "is empty".into()))?;
    if kind != "event" && kind != "action" {
        return Err(field_error(
            KIND,
            format!("{kind:?} is neither \"event\" nor \"action\""),
        ));
    }
    let plan_id = text(PLAN_ID)?.ok_or_else(|| field_error(PLAN_ID, "is empty".into()))?;
    let id = required_integer(ID)?;
    let leaf_hash = match text(LEAF_HASH)? {
        None => None,
        Some(hex_text) => {
            let mut hash = [0u8; 32];
            hex::decode_to_slice(hex_text, &mut hash).map_err(|_| {
                field_error(
                    LEAF_HASH,
                    format!("{hex_text:?} is not 64 hexadecimal digits"),
                )
            })?;
            Some(hash)
        }
    };
    match (leaf_index.is_some(), leaf_hash.is_some()) {
        (true, false) => {
            return Err(field_error(
                LEAF_HASH,
                "is empty, but the row has a leaf_index (a sealed leaf has both)".into(),
            ));
        }
        (false, true) => {
            return Err(field_error(
                LEAF_INDEX,
                "is empty, but the row has a leaf_hash (a sealed leaf has both)".into(),
            ));
        }
        _ => {}
    }

    let entry = match text(AT)? {
        None => {
            for column in AT + 1..LEAF_HASH {
                absent(
                    column,
                    "a row without `at` is a record the database no longer has",
                )?;
            }
            None
        }
        Some(at) => {
            leaf::check_at(at).map_err(|error| field_error(AT, error.to_string()))?;
            let string = |column: usize| -> Result<String, ExportError> {
                Ok(text(column)?.unwrap_or_default().to_owned())
            };
            if kind == "event" {
                absent(ACTOR, "an event has no actor")?;
                let attempt = required_integer(ATTEMPT)?;
                let attempt = i32::try_from(attempt).map_err(|_| {
                    field_error(ATTEMPT, format!("{attempt} is not a 32-bit integer"))
                })?;
                Some(Entry::Event(EventLeaf {
                    plan_id: plan_id.to_owned(),
                    id,
                    at: at.to_owned(),
                    slice_id: integer(SLICE_ID)?,
                    dead_letter_id: required_integer(DEAD_LETTER_ID)?,
                    message_key: string(MESSAGE_KEY)?,
                    message_id: string(MESSAGE_ID)?,
                    destination: string(DESTINATION)?,
                    action: string(ACTION)?,
                    reason: string(REASON)?,
                    wave: string(WAVE)?,
                    executor_id: string(EXECUTOR_ID)?,
                    attempt,
                    confirm_latency_us: required_integer(CONFIRM_LATENCY_US)?,
                }))
            } else {
                for column in EVENT_ONLY {
                    absent(column, "an action has only at, action, reason and actor")?;
                }
                Some(Entry::Action(ActionLeaf {
                    plan_id: plan_id.to_owned(),
                    id,
                    at: at.to_owned(),
                    action: string(ACTION)?,
                    actor: string(ACTOR)?,
                    reason: string(REASON)?,
                }))
            }
        }
    };
    Ok(LogRow {
        leaf_index,
        kind: kind.to_owned(),
        plan_id: plan_id.to_owned(),
        id,
        entry,
        leaf_hash,
        note: String::new(),
    })
}

/// Reads a log export, CSV or JSON Lines: CSV when its first line (after
/// an optional UTF-8 byte order mark, without a `\r`) is the header
/// [`LOG_COLUMNS`] separated by commas, JSON Lines otherwise. Blank JSON
/// lines are skipped; a `{"checkpoint": "<note>"}` line may only come
/// first. String cells are read back through [`spreadsheet_original`].
///
/// Runs in one pass, O(size of the data).
///
/// # Errors
///
/// [`ExportError::Syntax`] for a record or line that cannot be read (bad
/// quoting, a wrong number of fields, invalid UTF-8 or JSON, a JSON value
/// that is not an object, an unknown member);
/// [`ExportError::Field`] naming the record or line and the field for a
/// value that is not allowed: a `kind` other than `event` and `action`, an
/// empty `plan_id` or `id`, a non-integer where an integer belongs, an
/// `at` that is not `YYYY-MM-DDTHH:MM:SS.ffffffZ` ([`leaf::check_at`]), a
/// `leaf_hash` that is not 64 hex digits, a `leaf_index` without a
/// `leaf_hash` or the reverse, an event without `dead_letter_id`,
/// `attempt` or `confirm_latency_us`, a value in a column the row's kind
/// (or a gone record) leaves empty.
pub fn read_log_export(data: &[u8]) -> Result<LogExport, ExportError> {
    let data = data.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(data);
    let first_line = data.split(|&b| b == b'\n').next().unwrap_or_default();
    let first_line = first_line.strip_suffix(b"\r").unwrap_or(first_line);
    if first_line == LOG_COLUMNS.join(",").as_bytes() {
        read_csv(data)
    } else {
        read_jsonl(data)
    }
}

/// Reads a CSV export (header included).
fn read_csv(data: &[u8]) -> Result<LogExport, ExportError> {
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(false)
        .flexible(false)
        .from_reader(data);
    let mut record = csv::StringRecord::new();
    let csv_error = |error: csv::Error, number: u64| {
        let location = match error.position() {
            Some(position) => format!(
                "CSV record {} (line {})",
                position.record(),
                position.line()
            ),
            None => format!("CSV record {number}"),
        };
        let message = match error.kind() {
            csv::ErrorKind::UnequalLengths { len, .. } => format!(
                "{len} fields, but a log export has {} ({})",
                LOG_COLUMNS.len(),
                LOG_COLUMNS.join(", ")
            ),
            csv::ErrorKind::Utf8 { err, .. } => format!("field {} is not UTF-8", err.field() + 1),
            _ => error.to_string(),
        };
        ExportError::Syntax { location, message }
    };
    // The header, already compared by read_log_export.
    reader
        .read_record(&mut record)
        .map_err(|error| csv_error(error, 0))?;
    let mut rows = Vec::new();
    let mut number = 0u64;
    loop {
        match reader.read_record(&mut record) {
            Ok(true) => {}
            Ok(false) => break,
            Err(error) => return Err(csv_error(error, number + 1)),
        }
        number += 1;
        let line = record.position().map_or(0, |position| position.line());
        let location = || format!("CSV record {number} (line {line})");
        rows.push(build_row(&CsvCells(&record), &location)?);
    }
    Ok(LogExport {
        checkpoint: None,
        rows,
    })
}

/// Reads a JSON Lines export: the first non-blank line (the checkpoint,
/// or a row) here, the rest in chunks of whole lines on several threads
/// when it is large.
fn read_jsonl(data: &[u8]) -> Result<LogExport, ExportError> {
    let mut export = LogExport::default();
    let mut offset = 0;
    let mut number = 0;
    while offset < data.len() {
        let end = data[offset..]
            .iter()
            .position(|&b| b == b'\n')
            .map_or(data.len(), |at| offset + at);
        let line = &data[offset..end];
        number += 1;
        offset = end + 1;
        if !is_blank(line) {
            read_jsonl_line(line, number, true, &mut export)?;
            break;
        }
    }
    let rest = data.get(offset..).unwrap_or_default();

    // Chunks of whole lines, each with the number of its first line.
    let workers = crate::parallel::workers(rest.len(), 4 << 20);
    let mut chunks = Vec::with_capacity(workers);
    let (mut start, mut first_line) = (0, number + 1);
    for worker in 1..=workers {
        let target = rest.len() * worker / workers;
        let end = if worker == workers || target <= start {
            rest.len()
        } else {
            rest[target..]
                .iter()
                .position(|&b| b == b'\n')
                .map_or(rest.len(), |at| target + at + 1)
        };
        if end <= start {
            continue;
        }
        let chunk = &rest[start..end];
        chunks.push((chunk, first_line));
        first_line += chunk.iter().filter(|&&b| b == b'\n').count();
        start = end;
    }
    let parts = crate::parallel::map(&chunks, |&(chunk, first_line)| {
        let mut part = LogExport::default();
        for (index, line) in chunk.split(|&b| b == b'\n').enumerate() {
            read_jsonl_line(line, first_line + index, false, &mut part)?;
        }
        Ok::<_, ExportError>(part.rows)
    });
    for part in parts {
        export.rows.extend(part?);
    }
    Ok(export)
}

/// Whether a line is blank (only ASCII white space).
fn is_blank(line: &[u8]) -> bool {
    line.iter().all(u8::is_ascii_whitespace)
}

/// Reads JSON Lines line `number` (blank lines are skipped) into `export`;
/// `first` for the first non-blank line, which may be the checkpoint.
fn read_jsonl_line(
    line: &[u8],
    number: usize,
    first: bool,
    export: &mut LogExport,
) -> Result<(), ExportError> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    if is_blank(line) {
        return Ok(());
    }
    let location = || format!("line {number}");
    match serde_json::from_slice::<JsonRow<'_>>(line) {
        Ok(raw) => {
            let mut row = build_row(&raw, &location)?;
            if let Some(note) = &raw.note {
                row.note = original(note).to_owned();
            }
            export.rows.push(row);
            Ok(())
        }
        // The checkpoint line, or a line in error: read again as a JSON
        // value, for a precise error.
        Err(error) => read_other_line(line, first, &location, error, export),
    }
}

/// Reads a JSON Lines line that is not a row: the checkpoint line (allowed
/// `first` only), or else the most precise error for it (`error`, serde's,
/// when no other is found: e.g. a repeated member).
fn read_other_line(
    line: &[u8],
    first: bool,
    location: &dyn Fn() -> String,
    error: serde_json::Error,
    export: &mut LogExport,
) -> Result<(), ExportError> {
    let syntax = |message: String| ExportError::Syntax {
        location: location(),
        message,
    };
    let value: serde_json::Value =
        serde_json::from_slice(line).map_err(|error| syntax(format!("not JSON: {error}")))?;
    let serde_json::Value::Object(object) = value else {
        return Err(syntax("not a JSON object".into()));
    };
    if let Some(checkpoint) = object.get("checkpoint") {
        if !first {
            return Err(syntax(
                "a checkpoint line may only be the first line of the export".into(),
            ));
        }
        let serde_json::Value::String(note) = checkpoint else {
            return Err(ExportError::Field {
                location: location(),
                field: "checkpoint",
                message: "is not a string".into(),
            });
        };
        if object.len() != 1 {
            return Err(syntax(
                "a checkpoint line has no other member than \"checkpoint\"".into(),
            ));
        }
        export.checkpoint = Some(note.clone());
        return Ok(());
    }
    if let Some(key) = object
        .keys()
        .find(|key| *key != "note" && !LOG_COLUMNS.contains(&key.as_str()))
    {
        return Err(syntax(format!(
            "unknown member {key:?} (a row has {} and note)",
            LOG_COLUMNS.join(", ")
        )));
    }
    build_row(&JsonCells(&object), location)?;
    if object
        .get("note")
        .is_some_and(|note| !note.is_null() && !note.is_string())
    {
        return Err(ExportError::Field {
            location: location(),
            field: "note",
            message: "is not a string".into(),
        });
    }
    Err(syntax(error.to_string()))
}
