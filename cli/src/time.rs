//! How times are written: RFC 3339 in UTC. A leaf module, shared by the
//! output and the header rendering.

use chrono::{DateTime, SecondsFormat, Utc};
use redrive_proto::time::from_timestamp;

/// RFC 3339 in UTC, with fractional seconds only when they are not zero.
pub fn rfc3339(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::AutoSi, true)
}

/// [`rfc3339`] of a protobuf timestamp; `None` when absent or out of range.
pub fn timestamp_text(at: Option<&prost_types::Timestamp>) -> Option<String> {
    at.and_then(from_timestamp).map(rfc3339)
}
