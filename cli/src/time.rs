//! How times are written: the one place that decides it. Every time
//! `redrivectl` prints (tables, key/value blocks, JSON, and the `jsonl`/`csv`
//! exports it passes on) is RFC 3339 in UTC with a `Z` and exactly three
//! fractional digits: `2026-12-01T08:00:00.123Z`. Fixed width, so columns
//! line up and text sorts as time does; milliseconds, since finer digits
//! are noise to an operator and the planner's clocks are not that precise.
//! A leaf module, shared by the output, the header rendering and the exports.

use chrono::{DateTime, NaiveDateTime, Utc};
use redrive_proto::time::from_timestamp;

pub use redrive_proto::time::rfc3339;

/// [`rfc3339`] of a protobuf timestamp; `None` when absent or out of range.
pub fn timestamp_text(at: Option<&prost_types::Timestamp>) -> Option<String> {
    at.and_then(from_timestamp).map(rfc3339)
}

/// A time the planner wrote as text, in [`rfc3339`]'s form: any RFC 3339
/// time (any precision, any offset: `2024-05-01T14:00:00.123456+02:00`), or
/// the `hour` summary key (`2026-11-29T14:00Z`). `None` when `text` is not
/// such a time.
pub fn normalize(text: &str) -> Option<String> {
    if let Ok(at) = DateTime::parse_from_rfc3339(text) {
        return Some(rfc3339(at.with_timezone(&Utc)));
    }
    NaiveDateTime::parse_from_str(text, "%Y-%m-%dT%H:%MZ")
        .ok()
        .map(|at| rfc3339(at.and_utc()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_have_milliseconds_and_z() {
        let at = DateTime::parse_from_rfc3339("2026-12-01T08:00:00.123456789Z")
            .unwrap()
            .with_timezone(&Utc);
        assert_eq!(rfc3339(at), "2026-12-01T08:00:00.123Z");
        let whole = DateTime::from_timestamp(1_700_000_000, 0).unwrap();
        assert_eq!(rfc3339(whole), "2023-11-14T22:13:20.000Z");
        // Cut, not rounded.
        let late = DateTime::parse_from_rfc3339("2026-12-01T08:00:59.9999Z")
            .unwrap()
            .with_timezone(&Utc);
        assert_eq!(rfc3339(late), "2026-12-01T08:00:59.999Z");
        let proto = prost_types::Timestamp {
            seconds: 1_700_000_000,
            nanos: 5_000,
        };
        assert_eq!(
            timestamp_text(Some(&proto)).as_deref(),
            Some("2023-11-14T22:13:20.000Z")
        );
        assert_eq!(timestamp_text(None), None);
    }

    #[test]
    fn planner_texts_are_normalized() {
        for (text, expected) in [
            ("2024-05-01T12:00:00+00:00", "2024-05-01T12:00:00.000Z"),
            (
                "2024-05-01T14:00:00.123456+02:00",
                "2024-05-01T12:00:00.123Z",
            ),
            ("2024-05-01T12:00:00.5Z", "2024-05-01T12:00:00.500Z"),
            ("2026-11-29T14:00Z", "2026-11-29T14:00:00.000Z"),
        ] {
            assert_eq!(normalize(text).as_deref(), Some(expected), "{text}");
        }
        assert_eq!(normalize("orders"), None);
        assert_eq!(normalize(""), None);
    }
}
