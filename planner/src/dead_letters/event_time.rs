//! Event time: the one rule for reading a time a producer wrote, wherever it
//! wrote it (the AMQP `timestamp` property, a header of any AMQP type that
//! can hold a time, a JSON value at the `--event-time-pointer`).
//!
//! AMQP 0-9-1 (§4.2.5.4, "Field types") holds timestamps "in the 64-bit POSIX
//! time_t format with an accuracy of one second", but producers write
//! milliseconds (ruby-amqp/bunny #455, gmr/pamqp #35), some microseconds or
//! nanoseconds. So a number is read by its plausible range, never by its
//! declared type: it is taken as seconds, milliseconds, microseconds or
//! nanoseconds since 1970-01-01T00:00:00Z, whichever puts it in
//! [`PLAUSIBLE_FROM`]..[`PLAUSIBLE_UNTIL`] (the four ranges do not overlap).
//! Text is RFC 3339 / ISO 8601 (an offset, `Z`, or none: then UTC) or a
//! number as above. A value no rule reads as a plausible time is an
//! [`Implausible`] error that says why; callers note it, never drop it
//! silently.

use chrono::{DateTime, NaiveDateTime, Utc};
use redrive_proto::v1::{HeaderValue, header_value::Value};

pub use redrive_proto::time::{PLAUSIBLE_FROM, PLAUSIBLE_UNTIL};

/// The unit a number was read in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// Seconds since 1970 (what AMQP 0-9-1 specifies).
    Seconds,
    /// Milliseconds since 1970.
    Milliseconds,
    /// Microseconds since 1970.
    Microseconds,
    /// Nanoseconds since 1970.
    Nanoseconds,
    /// RFC 3339 / ISO 8601 text.
    Text,
}

impl Unit {
    /// Its name and how many of it make a second, from
    /// [`redrive_proto::time::EPOCH_UNITS`] (the one table of them);
    /// `None` for [`Unit::Text`].
    fn epoch_unit(self) -> Option<(&'static str, i128)> {
        NUMBER_UNITS
            .iter()
            .position(|&unit| unit == self)
            .and_then(|index| redrive_proto::time::EPOCH_UNITS.get(index).copied())
    }

    /// The unit's name, as capture notes print it.
    pub fn name(self) -> &'static str {
        self.epoch_unit().map_or("ISO 8601 text", |(name, _)| name)
    }

    /// How many of this unit make a second (1 for [`Unit::Text`]).
    fn per_second(self) -> i128 {
        self.epoch_unit().map_or(1, |(_, per)| per)
    }
}

/// A time read by this module's rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventTime {
    /// The time, UTC.
    pub at: DateTime<Utc>,
    /// How the value was read.
    pub unit: Unit,
}

/// Why a value is not read as a time: a sentence naming the value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Implausible(pub String);

/// The number units, in the order of [`redrive_proto::time::EPOCH_UNITS`].
const NUMBER_UNITS: [Unit; 4] = [
    Unit::Seconds,
    Unit::Milliseconds,
    Unit::Microseconds,
    Unit::Nanoseconds,
];

fn implausible_number(value: &dyn std::fmt::Display) -> Implausible {
    Implausible(format!(
        "{value} is not a plausible time: as seconds, milliseconds, microseconds or nanoseconds since 1970 it falls outside 1990-01-01..2200-01-01"
    ))
}

/// Whether `at` is within [`PLAUSIBLE_FROM`]..[`PLAUSIBLE_UNTIL`].
pub fn plausible(at: DateTime<Utc>) -> bool {
    (PLAUSIBLE_FROM..PLAUSIBLE_UNTIL).contains(&at.timestamp())
}

/// An integer count since 1970, in the unit its range says.
///
/// # Errors
/// [`Implausible`] when no unit puts it between 1990 and 2200.
pub fn from_epoch(value: i128) -> Result<EventTime, Implausible> {
    redrive_proto::time::from_epoch_by_range(value)
        .and_then(|(at, index)| NUMBER_UNITS.get(index).map(|&unit| EventTime { at, unit }))
        .ok_or_else(|| implausible_number(&value))
}

/// A number with a fraction (a JSON float, an AMQP float, double or
/// decimal), in the unit its range says.
///
/// # Errors
/// [`Implausible`] when it is not finite or no unit puts it between 1990
/// and 2200.
pub fn from_epoch_float(value: f64) -> Result<EventTime, Implausible> {
    if value.is_finite() {
        for unit in NUMBER_UNITS {
            let per = unit.per_second() as f64;
            if value >= PLAUSIBLE_FROM as f64 * per && value < PLAUSIBLE_UNTIL as f64 * per {
                let seconds = value / per;
                let whole = seconds.floor();
                let nanos = ((seconds - whole) * 1e9).round().min(999_999_999.0);
                // In range by the check above: both casts are exact enough.
                #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                if let Some(at) = DateTime::from_timestamp(whole as i64, nanos as u32) {
                    return Ok(EventTime { at, unit });
                }
            }
        }
    }
    // `{:?}`: 1e308 in five characters, not 309 digits.
    Err(implausible_number(&format_args!("{value:?}")))
}

/// Text: RFC 3339 (`2026-12-02T10:00:00Z`, `…+01:00`), ISO 8601 with a
/// `+hhmm` offset or none (then UTC; a space may stand for `T`), or a
/// number as [`from_epoch`] / [`from_epoch_float`] read it.
///
/// # Errors
/// [`Implausible`] naming the text when it is none of these, or a time
/// outside 1990..2200.
pub fn from_text(text: &str) -> Result<EventTime, Implausible> {
    let trimmed = text.trim();
    if let Ok(number) = trimmed.parse::<i128>() {
        return from_epoch(number);
    }
    if trimmed.contains(['.', 'e', 'E'])
        && trimmed
            .chars()
            .all(|c| c.is_ascii_digit() || "+-.eE".contains(c))
        && let Ok(number) = trimmed.parse::<f64>()
    {
        return from_epoch_float(number);
    }
    let parsed = DateTime::parse_from_rfc3339(trimmed)
        .or_else(|_| DateTime::parse_from_str(trimmed, "%Y-%m-%dT%H:%M:%S%.f%z"))
        .or_else(|_| DateTime::parse_from_str(trimmed, "%Y-%m-%d %H:%M:%S%.f%z"))
        .map(|at| at.with_timezone(&Utc))
        .or_else(|_| {
            NaiveDateTime::parse_from_str(trimmed, "%Y-%m-%dT%H:%M:%S%.f")
                .or_else(|_| NaiveDateTime::parse_from_str(trimmed, "%Y-%m-%d %H:%M:%S%.f"))
                .map(|naive| naive.and_utc())
        });
    let shown: String = trimmed.chars().take(64).collect();
    match parsed {
        Ok(at) if plausible(at) => Ok(EventTime {
            at,
            unit: Unit::Text,
        }),
        Ok(_) => Err(Implausible(format!(
            "{shown:?} is not a plausible time: outside 1990-01-01..2200-01-01"
        ))),
        Err(_) => Err(Implausible(format!(
            "{shown:?} is neither an RFC 3339 / ISO 8601 time nor a number"
        ))),
    }
}

/// How far an event time may lie after the moment it cannot be later than
/// (its message's first death, or its arrival at the planner) and still be
/// taken as the time the event happened: 5 minutes, far beyond what clocks
/// kept by NTP differ by. It catches a placeholder year, a producer clock
/// well ahead, and a local time east of UTC written as UTC when the message
/// died within less than its offset; a local time west of UTC reads as
/// older, which no bound can tell.
pub const CLOCK_SKEW: chrono::TimeDelta = chrono::TimeDelta::minutes(5);

/// `at`, unless it is more than [`CLOCK_SKEW`] after `bound`, the moment
/// named by `bound_name` (`its first death`, `the planner's clock`) that
/// an event cannot have happened after: a message is made before it dies.
/// Counted from a later time, a dead letter's age would be short or
/// negative and a stale message would pass for a recent one.
///
/// # Errors
/// [`Implausible`] naming the time, how far after `bound` it is, and the
/// usual causes.
pub fn not_after(
    at: DateTime<Utc>,
    bound: DateTime<Utc>,
    bound_name: &str,
) -> Result<DateTime<Utc>, Implausible> {
    let ahead = at - bound;
    if ahead <= CLOCK_SKEW {
        return Ok(at);
    }
    Err(Implausible(format!(
        "{} is {} after {bound_name} ({}): an event cannot happen after that (a producer's \
         clock ahead, a local time written as UTC, or a placeholder)",
        redrive_proto::time::rfc3339(at),
        redrive_proto::time::age_text(ahead.to_std().unwrap_or_default()),
        redrive_proto::time::rfc3339(bound),
    )))
}

/// A JSON value: a string ([`from_text`]) or a number ([`from_epoch`],
/// [`from_epoch_float`]).
///
/// # Errors
/// [`Implausible`] for other JSON types and for values the rules refuse.
pub fn from_json(value: &serde_json::Value) -> Result<EventTime, Implausible> {
    match value {
        serde_json::Value::String(text) => from_text(text),
        serde_json::Value::Number(number) => match (number.as_i64(), number.as_u64()) {
            (Some(value), _) => from_epoch(i128::from(value)),
            (None, Some(value)) => from_epoch(i128::from(value)),
            (None, None) => from_epoch_float(number.as_f64().unwrap_or(f64::NAN)),
        },
        other => Err(Implausible(format!(
            "a JSON {} is not a time",
            match other {
                serde_json::Value::Null => "null",
                serde_json::Value::Bool(_) => "boolean",
                serde_json::Value::Array(_) => "array",
                _ => "object",
            }
        ))),
    }
}

/// An AMQP header value of any type that can hold a time: a timestamp
/// (`T`, read by its range like any number, since producers write
/// milliseconds there too), an integer of any width, a float, double or
/// decimal, a string or byte array holding text ([`from_text`]).
///
/// # Errors
/// [`Implausible`] for booleans, tables, arrays and void, and for values the
/// rules refuse.
pub fn from_header(value: &HeaderValue) -> Result<EventTime, Implausible> {
    match value.value.as_ref() {
        Some(Value::Timestamp(v)) => from_epoch(i128::from(*v)),
        Some(Value::ShortShortInt(v) | Value::ShortInt(v) | Value::LongInt(v)) => {
            from_epoch(i128::from(*v))
        }
        Some(Value::ShortShortUint(v) | Value::ShortUint(v) | Value::LongUint(v)) => {
            from_epoch(i128::from(*v))
        }
        Some(Value::LongLongInt(v)) => from_epoch(i128::from(*v)),
        Some(Value::Float(v)) => from_epoch_float(f64::from(*v)),
        Some(Value::Double(v)) => from_epoch_float(*v),
        Some(Value::Decimal(decimal)) => {
            from_epoch_float(f64::from(decimal.value) / 10_f64.powi(decimal.scale.min(255) as i32))
        }
        Some(Value::ShortString(text)) => from_text(text),
        Some(Value::LongString(bytes) | Value::ByteArray(bytes)) => {
            match std::str::from_utf8(bytes) {
                Ok(text) => from_text(text),
                Err(_) => Err(Implausible(
                    "a value that is not UTF-8 text is not a time".to_owned(),
                )),
            }
        }
        Some(Value::Boolean(_)) => Err(Implausible("a boolean is not a time".to_owned())),
        Some(Value::Array(_)) => Err(Implausible("an array is not a time".to_owned())),
        Some(Value::Table(_)) => Err(Implausible("a table is not a time".to_owned())),
        Some(Value::Void(_)) | None => Err(Implausible("an empty value is not a time".to_owned())),
    }
}

#[cfg(test)]
mod tests {
    use redrive_proto::v1::DecimalValue;

    use super::*;

    #[test]
    fn units_take_their_names_and_sizes_from_the_one_table() {
        assert_eq!(Unit::Seconds.name(), "seconds");
        assert_eq!(Unit::Milliseconds.name(), "milliseconds");
        assert_eq!(Unit::Microseconds.per_second(), 1_000_000);
        assert_eq!(Unit::Nanoseconds.per_second(), 1_000_000_000);
        assert_eq!(Unit::Text.name(), "ISO 8601 text");
        assert_eq!(Unit::Text.per_second(), 1);
    }

    const AT: i64 = 1_764_670_000; // 2025-12-02T10:06:40Z

    fn at(seconds: i64, nanos: u32) -> DateTime<Utc> {
        DateTime::from_timestamp(seconds, nanos).unwrap()
    }

    #[test]
    fn an_event_time_after_its_bound_is_refused_beyond_the_clock_skew() {
        let death = at(1_764_000_000, 0);
        assert_eq!(not_after(death, death, "its first death"), Ok(death));
        let skewed = death + CLOCK_SKEW;
        assert_eq!(not_after(skewed, death, "its first death"), Ok(skewed));
        let earlier = death - chrono::TimeDelta::days(400);
        assert_eq!(not_after(earlier, death, "its first death"), Ok(earlier));
        // A local time in UTC+01:00 written as UTC, a placeholder year.
        for (ahead, said) in [
            (chrono::TimeDelta::hours(1), "1h0m after its first death"),
            (
                chrono::TimeDelta::seconds(301),
                "5m1s after its first death",
            ),
            (
                chrono::TimeDelta::days(365 * 73),
                "26645d0h after its first death",
            ),
        ] {
            let Implausible(text) = not_after(death + ahead, death, "its first death").unwrap_err();
            assert!(text.contains(said), "{text}");
            assert!(text.contains("a producer's clock ahead"), "{text}");
        }
    }

    /// A review: an event time of `1e308` in a header or a body was quoted
    /// in the capture note and the precheck warning as 309 digits.
    #[test]
    fn an_implausible_float_is_quoted_short() {
        for (value, shown) in [(1e308, "1e308"), (-1e-300, "-1e-300"), (12.5, "12.5")] {
            let Implausible(text) = from_epoch_float(value).unwrap_err();
            assert!(text.starts_with(shown), "{text}");
            assert!(text.len() < 200, "{text}");
        }
    }

    #[test]
    fn numbers_are_read_in_the_unit_their_range_says() {
        let seconds = i128::from(AT);
        for (value, unit) in [
            (seconds, Unit::Seconds),
            (seconds * 1_000 + 250, Unit::Milliseconds),
            (seconds * 1_000_000 + 250_000, Unit::Microseconds),
            (seconds * 1_000_000_000 + 250_000_000, Unit::Nanoseconds),
        ] {
            let read = from_epoch(value).unwrap();
            assert_eq!(read.unit, unit, "{value}");
            let nanos = if unit == Unit::Seconds {
                0
            } else {
                250_000_000
            };
            assert_eq!(read.at, at(AT, nanos), "{value}");
        }
        assert_eq!(
            from_epoch_float(AT as f64 + 0.5).unwrap().at,
            at(AT, 500_000_000)
        );
        assert_eq!(
            from_epoch_float(AT as f64 * 1000.0).unwrap().unit,
            Unit::Milliseconds
        );
    }

    #[test]
    fn implausible_numbers_are_refused_with_the_value() {
        for value in [
            0_i128,
            1,
            42_000,
            -1_764_670_000,
            // 1973 in milliseconds or year 5138 in seconds: neither.
            100_000_000_000,
            i128::from(u64::MAX),
            i128::from(PLAUSIBLE_UNTIL),
        ] {
            let error = from_epoch(value).unwrap_err();
            assert!(error.0.contains(&value.to_string()), "{error}");
            assert!(error.0.contains("not a plausible time"), "{error}");
        }
        assert!(from_epoch_float(f64::NAN).is_err());
        assert!(from_epoch_float(12.5).is_err());
        assert!(from_epoch(i128::from(PLAUSIBLE_FROM)).is_ok());
    }

    #[test]
    fn text_is_rfc_3339_iso_8601_or_a_number() {
        for text in [
            "2025-12-02T10:06:40Z",
            "2025-12-02T11:06:40+01:00",
            "2025-12-02T11:06:40+0100",
            "2025-12-02T10:06:40",
            "2025-12-02 10:06:40",
            "2025-12-02T10:06:40.000Z",
            " 1764670000 ",
            "1764670000000",
            "1764670000.0",
        ] {
            assert_eq!(from_text(text).unwrap().at, at(AT, 0), "{text}");
        }
        assert_eq!(from_text("2025-12-02T10:06:40Z").unwrap().unit, Unit::Text);
        for (text, why) in [
            ("yesterday", "neither"),
            ("1889-01-01T00:00:00Z", "outside"),
            ("12", "not a plausible time"),
            ("", "neither"),
        ] {
            let error = from_text(text).unwrap_err();
            assert!(error.0.contains(why), "{text}: {error}");
        }
    }

    #[test]
    fn json_values_follow_the_same_rule() {
        let ms = serde_json::json!(AT * 1000);
        assert_eq!(from_json(&ms).unwrap().unit, Unit::Milliseconds);
        assert_eq!(
            from_json(&serde_json::json!("2025-12-02T10:06:40Z"))
                .unwrap()
                .at,
            at(AT, 0)
        );
        assert_eq!(
            from_json(&serde_json::json!(AT as f64 + 0.25)).unwrap().at,
            at(AT, 250_000_000)
        );
        assert!(from_json(&serde_json::json!(true)).is_err());
        assert!(from_json(&serde_json::json!(7)).is_err());
    }

    #[test]
    fn every_header_type_that_can_hold_a_time_is_read() {
        let header = |value| HeaderValue { value: Some(value) };
        let ms = AT * 1000;
        for value in [
            Value::Timestamp(u64::try_from(AT).unwrap()),
            Value::Timestamp(u64::try_from(ms).unwrap()),
            Value::LongLongInt(ms),
            Value::LongUint(u32::try_from(AT).unwrap()),
            Value::LongInt(i32::try_from(AT).unwrap()),
            Value::Double(AT as f64),
            Value::Decimal(DecimalValue {
                scale: 0,
                value: u32::try_from(AT).unwrap(),
            }),
            Value::ShortString("2025-12-02T10:06:40Z".into()),
            Value::LongString(b"2025-12-02T10:06:40Z".to_vec()),
            Value::ByteArray(ms.to_string().into_bytes()),
        ] {
            assert_eq!(
                from_header(&header(value.clone())).unwrap().at,
                at(AT, 0),
                "{value:?}"
            );
        }
        for value in [
            Value::Boolean(true),
            Value::ShortShortInt(7),
            Value::LongString(vec![0xff, 0xfe]),
            Value::Timestamp(3),
        ] {
            assert!(from_header(&header(value.clone())).is_err(), "{value:?}");
        }
    }
}
