//! The canonical bytes of a log entry: what a leaf of the log hashes.
//!
//! An entry is one audit event (a replayed message) or one operator action.
//! Its bytes are one JSON object, serialized as RFC 8785 (JSON
//! Canonicalization Scheme, JCS) serializes an object of strings, integers
//! and `null`: keys sorted by their UTF-16 code units (all keys here are
//! ASCII, so by byte), no whitespace, strings with the shortest escapes
//! (`\"`, `\\`, `\b`, `\f`, `\n`, `\r`, `\t`, `\u00xx` with lowercase hex
//! for the other control characters, everything else as UTF-8), integers in
//! plain decimal. A `"kind"` member, `"event"` or `"action"`, tells the two
//! apart. The leaf hash is RFC 6962's `SHA-256(0x00 || bytes)`
//! ([`crate::merkle::leaf_hash`]).
//!
//! An event:
//!
//! ```text
//! {"action":…,"at":…,"attempt":…,"confirm_latency_us":…,"dead_letter_id":…,
//!  "destination":…,"executor_id":…,"id":…,"kind":"event","message_id":…,
//!  "message_key":…,"plan_id":…,"reason":…,"slice_id":…|null,"wave":…}
//! ```
//!
//! An action:
//!
//! ```text
//! {"action":…,"actor":…,"at":…,"id":…,"kind":"action","plan_id":…,"reason":…}
//! ```
//!
//! (shown wrapped; the bytes have no whitespace). JCS writes numbers as
//! IEEE 754 doubles would print; the integers here are written exactly in
//! decimal, which is the same for magnitudes up to 2^53 (every id, attempt
//! and latency the planner stores).
//!
//! `at`, the time the record was written, is RFC 3339 in UTC with exactly
//! six fractional digits and `Z`: `YYYY-MM-DDTHH:MM:SS.ffffffZ` (the planner
//! formats it; [`check_at`] checks it).

use std::io::Write as _;

use crate::Hash;
use crate::merkle;

/// A log entry: an audit event or an operator action.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Entry {
    /// One replayed message's audit event (`"kind":"event"`).
    Event(EventLeaf),
    /// One operator action, such as "approve" (`"kind":"action"`).
    Action(ActionLeaf),
}

/// The fields of an audit event's leaf (the planner's `audit_events` row).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventLeaf {
    /// The plan it belongs to (its id's text, a UUID).
    pub plan_id: String,
    /// The event's id within the audit events.
    pub id: i64,
    /// When it was written: RFC 3339, UTC, 6 fractional digits, `Z`.
    pub at: String,
    /// The plan slice it was replayed in, if any (`null` when `None`).
    pub slice_id: Option<i64>,
    /// The dead letter replayed.
    pub dead_letter_id: i64,
    /// The message's key.
    pub message_key: String,
    /// The message's id.
    pub message_id: String,
    /// Where it was replayed to.
    pub destination: String,
    /// What happened to it (the event's action).
    pub action: String,
    /// Why.
    pub reason: String,
    /// The plan wave.
    pub wave: String,
    /// The executor that replayed it.
    pub executor_id: String,
    /// The delivery attempt, from 1.
    pub attempt: i32,
    /// The time the destination took to confirm, in microseconds.
    pub confirm_latency_us: i64,
}

/// The fields of an operator action's leaf (the planner's
/// `operator_actions` row).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ActionLeaf {
    /// The plan it acted on (its id's text, a UUID).
    pub plan_id: String,
    /// The action's id within the operator actions.
    pub id: i64,
    /// When it was written: RFC 3339, UTC, 6 fractional digits, `Z`.
    pub at: String,
    /// What was done, e.g. `approve`.
    pub action: String,
    /// Who did it.
    pub actor: String,
    /// Why.
    pub reason: String,
}

/// The keys of an event's object, in canonical (byte) order.
pub(crate) const EVENT_KEYS: [&str; 15] = [
    "action",
    "at",
    "attempt",
    "confirm_latency_us",
    "dead_letter_id",
    "destination",
    "executor_id",
    "id",
    "kind",
    "message_id",
    "message_key",
    "plan_id",
    "reason",
    "slice_id",
    "wave",
];

/// The keys of an action's object, in canonical (byte) order.
pub(crate) const ACTION_KEYS: [&str; 7] =
    ["action", "actor", "at", "id", "kind", "plan_id", "reason"];

/// Writes a JSON object's members, in the order they are given.
struct ObjectWriter {
    out: Vec<u8>,
    first: bool,
}

impl ObjectWriter {
    fn new() -> ObjectWriter {
        let mut out = Vec::with_capacity(384);
        out.push(b'{');
        ObjectWriter { out, first: true }
    }

    fn key(&mut self, key: &str) {
        if !self.first {
            self.out.push(b',');
        }
        self.first = false;
        write_json_string(&mut self.out, key);
        self.out.push(b':');
    }

    fn string(&mut self, key: &str, value: &str) {
        self.key(key);
        write_json_string(&mut self.out, value);
    }

    fn integer(&mut self, key: &str, value: i64) {
        self.key(key);
        write!(self.out, "{value}").expect("writing to a Vec cannot fail");
    }

    fn optional_integer(&mut self, key: &str, value: Option<i64>) {
        match value {
            Some(value) => self.integer(key, value),
            None => {
                self.key(key);
                self.out.extend_from_slice(b"null");
            }
        }
    }

    fn finish(mut self) -> Vec<u8> {
        self.out.push(b'}');
        self.out
    }
}

/// Appends `value` as a JSON string: serde_json's escaping, which is
/// RFC 8785's (§3.2.2.2) for strings.
pub(crate) fn write_json_string(out: &mut Vec<u8>, value: &str) {
    serde_json::to_writer(&mut *out, value).expect("writing to a Vec cannot fail");
}

impl Entry {
    /// The entry's canonical bytes, one RFC 8785 JSON object (see the
    /// module documentation for the keys). The keys are written in a fixed
    /// sorted order here, whatever serde_json's features.
    pub fn canonical_bytes(&self) -> Vec<u8> {
        let mut object = ObjectWriter::new();
        match self {
            Entry::Event(event) => {
                object.string("action", &event.action);
                object.string("at", &event.at);
                object.integer("attempt", i64::from(event.attempt));
                object.integer("confirm_latency_us", event.confirm_latency_us);
                object.integer("dead_letter_id", event.dead_letter_id);
                object.string("destination", &event.destination);
                object.string("executor_id", &event.executor_id);
                object.integer("id", event.id);
                object.string("kind", "event");
                object.string("message_id", &event.message_id);
                object.string("message_key", &event.message_key);
                object.string("plan_id", &event.plan_id);
                object.string("reason", &event.reason);
                object.optional_integer("slice_id", event.slice_id);
                object.string("wave", &event.wave);
            }
            Entry::Action(action) => {
                object.string("action", &action.action);
                object.string("actor", &action.actor);
                object.string("at", &action.at);
                object.integer("id", action.id);
                object.string("kind", "action");
                object.string("plan_id", &action.plan_id);
                object.string("reason", &action.reason);
            }
        }
        object.finish()
    }

    /// The entry's RFC 6962 leaf hash: SHA-256(0x00 ||
    /// [`Entry::canonical_bytes`]).
    pub fn leaf_hash(&self) -> Hash {
        merkle::leaf_hash(&self.canonical_bytes())
    }

    /// Reads an entry from its canonical bytes, strictly: the bytes must be
    /// exactly what [`Entry::canonical_bytes`] writes for the entry they
    /// describe (sorted keys, no whitespace, no other escapes, no unknown,
    /// missing or repeated keys, integers in range) and `at` must pass
    /// [`check_at`].
    ///
    /// # Errors
    ///
    /// [`LeafError`] naming the field at fault, or
    /// [`LeafError::NotCanonical`] when the bytes describe an entry but are
    /// not its canonical form.
    pub fn from_canonical(bytes: &[u8]) -> Result<Entry, LeafError> {
        let value: serde_json::Value =
            serde_json::from_slice(bytes).map_err(|error| LeafError::Json(error.to_string()))?;
        let object = value.as_object().ok_or(LeafError::NotObject)?;
        let kind = string_field(object, "kind")?;
        let (entry, keys): (Entry, &[&str]) = match kind {
            "event" => (
                Entry::Event(EventLeaf {
                    plan_id: string_field(object, "plan_id")?.to_owned(),
                    id: integer_field(object, "id")?,
                    at: string_field(object, "at")?.to_owned(),
                    slice_id: match object.get("slice_id") {
                        None => return Err(LeafError::MissingField("slice_id")),
                        Some(serde_json::Value::Null) => None,
                        Some(_) => Some(integer_field(object, "slice_id")?),
                    },
                    dead_letter_id: integer_field(object, "dead_letter_id")?,
                    message_key: string_field(object, "message_key")?.to_owned(),
                    message_id: string_field(object, "message_id")?.to_owned(),
                    destination: string_field(object, "destination")?.to_owned(),
                    action: string_field(object, "action")?.to_owned(),
                    reason: string_field(object, "reason")?.to_owned(),
                    wave: string_field(object, "wave")?.to_owned(),
                    executor_id: string_field(object, "executor_id")?.to_owned(),
                    attempt: i32::try_from(integer_field(object, "attempt")?).map_err(|_| {
                        LeafError::WrongType {
                            field: "attempt",
                            expected: "a 32-bit integer",
                        }
                    })?,
                    confirm_latency_us: integer_field(object, "confirm_latency_us")?,
                }),
                &EVENT_KEYS,
            ),
            "action" => (
                Entry::Action(ActionLeaf {
                    plan_id: string_field(object, "plan_id")?.to_owned(),
                    id: integer_field(object, "id")?,
                    at: string_field(object, "at")?.to_owned(),
                    action: string_field(object, "action")?.to_owned(),
                    actor: string_field(object, "actor")?.to_owned(),
                    reason: string_field(object, "reason")?.to_owned(),
                }),
                &ACTION_KEYS,
            ),
            other => return Err(LeafError::UnknownKind(other.to_owned())),
        };
        if let Some(key) = object.keys().find(|key| !keys.contains(&key.as_str())) {
            return Err(LeafError::UnexpectedField(key.clone()));
        }
        check_at(entry.at())?;
        if entry.canonical_bytes() != bytes {
            return Err(LeafError::NotCanonical);
        }
        Ok(entry)
    }

    /// `"event"` or `"action"`, the entry's `kind` member.
    pub fn kind(&self) -> &'static str {
        match self {
            Entry::Event(_) => "event",
            Entry::Action(_) => "action",
        }
    }

    /// The plan the entry belongs to.
    pub fn plan_id(&self) -> &str {
        match self {
            Entry::Event(event) => &event.plan_id,
            Entry::Action(action) => &action.plan_id,
        }
    }

    /// The entry's id: the event's id or the action's.
    pub fn id(&self) -> i64 {
        match self {
            Entry::Event(event) => event.id,
            Entry::Action(action) => action.id,
        }
    }

    /// When the entry was written (RFC 3339, UTC, 6 fractional digits,
    /// `Z`).
    pub fn at(&self) -> &str {
        match self {
            Entry::Event(event) => &event.at,
            Entry::Action(action) => &action.at,
        }
    }
}

/// A string member, for [`Entry::from_canonical`].
fn string_field<'a>(
    object: &'a serde_json::Map<String, serde_json::Value>,
    field: &'static str,
) -> Result<&'a str, LeafError> {
    match object.get(field) {
        None => Err(LeafError::MissingField(field)),
        Some(value) => value.as_str().ok_or(LeafError::WrongType {
            field,
            expected: "a string",
        }),
    }
}

/// An integer member, for [`Entry::from_canonical`].
fn integer_field(
    object: &serde_json::Map<String, serde_json::Value>,
    field: &'static str,
) -> Result<i64, LeafError> {
    match object.get(field) {
        None => Err(LeafError::MissingField(field)),
        Some(value) => value.as_i64().ok_or(LeafError::WrongType {
            field,
            expected: "a 64-bit integer",
        }),
    }
}

/// Checks that `at` is an RFC 3339 time in UTC with exactly six fractional
/// digits and `Z`, `YYYY-MM-DDTHH:MM:SS.ffffffZ` (27 ASCII characters;
/// RFC 3339 §5.6, with the `T` and `Z` upper case, a real calendar date and
/// a second of 00 to 60).
///
/// # Errors
///
/// [`LeafError::BadTime`] saying what is wrong.
pub fn check_at(at: &str) -> Result<(), LeafError> {
    let bad = |reason: &'static str| LeafError::BadTime {
        at: at.to_owned(),
        reason,
    };
    let b = at.as_bytes();
    if b.len() != 27 {
        return Err(bad("it is not 27 characters long"));
    }
    let layout = b"dddd-dd-ddTdd:dd:dd.ddddddZ";
    for (byte, expected) in b.iter().zip(layout) {
        let ok = match expected {
            b'd' => byte.is_ascii_digit(),
            other => byte == other,
        };
        if !ok {
            return Err(bad("it is not of the form YYYY-MM-DDTHH:MM:SS.ffffffZ"));
        }
    }
    let number = |range: std::ops::Range<usize>| {
        b[range]
            .iter()
            .fold(0u32, |value, digit| value * 10 + u32::from(digit - b'0'))
    };
    let (year, month, day) = (number(0..4), number(5..7), number(8..10));
    let (hour, minute, second) = (number(11..13), number(14..16), number(17..19));
    if !(1..=12).contains(&month) {
        return Err(bad("the month is not 01 to 12"));
    }
    let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
    let days = match month {
        2 if leap => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    };
    if day < 1 || day > days {
        return Err(bad("the day is not in the month"));
    }
    if hour > 23 {
        return Err(bad("the hour is not 00 to 23"));
    }
    if minute > 59 {
        return Err(bad("the minute is not 00 to 59"));
    }
    if second > 60 {
        return Err(bad("the second is not 00 to 60"));
    }
    Ok(())
}

/// Why bytes are not a log entry's canonical bytes, or a time is not a
/// leaf's.
#[derive(Debug, thiserror::Error)]
pub enum LeafError {
    /// Not JSON at all.
    #[error("not JSON: {0}")]
    Json(String),
    /// JSON, but not an object.
    #[error("not a JSON object")]
    NotObject,
    /// A `kind` other than `event` and `action`.
    #[error("kind {0:?} is neither \"event\" nor \"action\"")]
    UnknownKind(String),
    /// A member the entry must have.
    #[error("the field `{0}` is missing")]
    MissingField(&'static str),
    /// A member the entry must not have.
    #[error("the field `{0}` is not a field of this kind of entry")]
    UnexpectedField(String),
    /// A member of the wrong JSON type or range.
    #[error("the field `{field}` is not {expected}")]
    WrongType {
        /// The member.
        field: &'static str,
        /// What it must be.
        expected: &'static str,
    },
    /// An `at` that is not `YYYY-MM-DDTHH:MM:SS.ffffffZ`.
    #[error(
        "the time {at:?} is not RFC 3339 UTC with 6 fractional digits (YYYY-MM-DDTHH:MM:SS.ffffffZ): {reason}"
    )]
    BadTime {
        /// The time's text.
        at: String,
        /// What is wrong.
        reason: &'static str,
    },
    /// Valid fields, but not written as [`Entry::canonical_bytes`] writes
    /// them.
    #[error(
        "not canonical: the bytes describe an entry but are not its RFC 8785 form (sorted keys, no whitespace, shortest escapes, plain integers)"
    )]
    NotCanonical,
}
