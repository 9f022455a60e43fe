//! Redrive's gRPC contract, package `redrive.v1`, shared by the planner, the
//! executor, `redrivectl` and the end-to-end tests.
//!
//! # Layout
//! - `lib.rs`: [`v1`], the generated messages, clients and servers
//!   (`Planner`, `Coordinator`, `StateCheck`); [`FILE_DESCRIPTOR_SET`] for
//!   server reflection; [`time`] (protobuf ↔ chrono times and durations) and
//!   [`json`] (JSON text as Redrive shows it: body previews).
//! - `build.rs`: compiles the `.proto` files and writes the descriptor set.
//! - `redrive/v1/messages.proto`, `planner.proto`, `coordinator.proto`,
//!   `state_check.proto`: the wire contract (shared messages, the operators'
//!   API, the executors' API, the owning services' hook).
//! - `src/limits.rs` ([`limits`]): the one table of input limits.
//! - `src/codec.rs` ([`codec`]): the gRPC codec that checks requests against
//!   the limits on the wire before decoding.
//! - `src/error.rs` ([`error`]): the small set of `tonic::Code`s the services
//!   answer with.
//! - `src/names.rs` ([`names`]): the stable lowercase names of the API's enums.
//! - `src/tls.rs` ([`tls`]): client TLS to the planner and hooks (`https://`, a
//!   CA bundle, an optional client certificate).
//! - `src/settings.rs` (`settings`, feature `settings`): the services' start-up
//!   settings, every bad one reported at once, secret files read.
//! - `src/telemetry/` (`telemetry`, feature `telemetry`): metrics and the
//!   services' shared start-up (`start_service`) in `mod.rs`, span export and
//!   trace propagation in `traces.rs`, logging in `logs.rs`.
//! - `src/amqp.rs` (`amqp`, feature `amqp`): lossless conversions between the
//!   API's header and property shapes and lapin's AMQP types.
//! - `src/amqp_nodes.rs` (`amqp_nodes`, feature `amqp`): the nodes of one
//!   broker a service connects to, round robin.
//! - `src/backoff.rs` (`backoff`, feature `backoff`): the services' one
//!   jittered retry delay.

#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod v1 {
    tonic::include_proto!("redrive.v1");
}

#[cfg(feature = "amqp")]
pub mod amqp;
#[cfg(feature = "amqp")]
pub mod amqp_nodes;
#[cfg(feature = "backoff")]
pub mod backoff;
pub mod codec;
pub mod error;
pub mod headers;
pub mod limits;
pub mod names;
#[cfg(feature = "settings")]
pub mod settings;
#[cfg(feature = "telemetry")]
pub mod telemetry;
pub mod tls;

/// Encoded `FileDescriptorSet` of every `redrive.v1` file, for
/// `tonic_reflection::server::Builder::register_encoded_file_descriptor_set`.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/redrive_descriptor.bin"));

/// Conversions between `google.protobuf.Timestamp` / `Duration` and chrono / std.
pub mod time {
    use chrono::{DateTime, Utc};

    /// The protobuf form of `at`.
    pub fn timestamp(at: DateTime<Utc>) -> prost_types::Timestamp {
        prost_types::Timestamp {
            seconds: at.timestamp(),
            nanos: i32::try_from(at.timestamp_subsec_nanos()).unwrap_or(0),
        }
    }

    /// The earliest plausible event time: 1990-01-01T00:00:00Z, in epoch
    /// seconds. Earlier values are counters, durations or zero, not times.
    pub const PLAUSIBLE_FROM: i64 = 631_152_000;
    /// The end of plausible event times: 2200-01-01T00:00:00Z, in epoch
    /// seconds (exclusive). Later values are another unit or not a time.
    pub const PLAUSIBLE_UNTIL: i64 = 7_258_118_400;

    /// The units a count since 1970 is read in, and how many of each make
    /// a second: AMQP 0-9-1 (§4.2.5.4) holds a `timestamp` in seconds, but
    /// producers write milliseconds there (ruby-amqp/bunny #455, gmr/pamqp
    /// #35), some microseconds or nanoseconds.
    pub const EPOCH_UNITS: [(&str, i128); 4] = [
        ("seconds", 1),
        ("milliseconds", 1_000),
        ("microseconds", 1_000_000),
        ("nanoseconds", 1_000_000_000),
    ];

    /// A count since 1970-01-01T00:00:00Z read in the unit of
    /// [`EPOCH_UNITS`] that puts it in
    /// [`PLAUSIBLE_FROM`]..[`PLAUSIBLE_UNTIL`] (the four ranges do not
    /// overlap), with that unit's index; `None` when no unit does. The one
    /// rule for a number a producer wrote as a time, wherever it is read
    /// (capture, the precheck, `redrivectl dead-letters show`).
    pub fn from_epoch_by_range(value: i128) -> Option<(DateTime<Utc>, usize)> {
        EPOCH_UNITS
            .iter()
            .enumerate()
            .find_map(|(index, &(_, per))| {
                if !(i128::from(PLAUSIBLE_FROM) * per..i128::from(PLAUSIBLE_UNTIL) * per)
                    .contains(&value)
                {
                    return None;
                }
                let seconds = i64::try_from(value.div_euclid(per)).ok()?;
                let nanos = u32::try_from(value.rem_euclid(per) * (1_000_000_000 / per)).ok()?;
                DateTime::from_timestamp(seconds, nanos).map(|at| (at, index))
            })
    }

    /// The chrono form of `at`, `None` outside years 1 to 9999
    /// ([`crate::limits::MIN_TIMESTAMP_SECONDS`], the range of RFC 3339 and
    /// well inside PostgreSQL's) or with nanos outside `0..1e9`.
    pub fn from_timestamp(at: &prost_types::Timestamp) -> Option<DateTime<Utc>> {
        if !(crate::limits::MIN_TIMESTAMP_SECONDS..=crate::limits::MAX_TIMESTAMP_SECONDS)
            .contains(&at.seconds)
        {
            return None;
        }
        let nanos = u32::try_from(at.nanos).ok()?;
        DateTime::from_timestamp(at.seconds, nanos)
    }

    /// How Redrive writes a time as text, everywhere (the CLI's tables,
    /// JSON and exports, the planner's reasons and audit exports): RFC 3339
    /// in UTC with a `Z` and exactly three fractional digits
    /// (`2026-12-01T08:00:00.123Z`). Fixed width, so text sorts as time
    /// does; finer digits are cut, not rounded, so a time never moves into
    /// the next second.
    pub fn rfc3339(at: DateTime<Utc>) -> String {
        at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
    }

    /// An age or a deadline as people say it, two units at most, cut (not
    /// rounded): `3d2h`, `5h10m`, `4m30s`, `12s`. The planner's reasons
    /// (a `stale` verdict) and `redrivectl`'s tables write ages this way.
    pub fn age_text(age: std::time::Duration) -> String {
        let seconds = age.as_secs();
        if seconds >= 86_400 {
            format!("{}d{}h", seconds / 86_400, (seconds % 86_400) / 3600)
        } else if seconds >= 3600 {
            format!("{}h{}m", seconds / 3600, (seconds % 3600) / 60)
        } else if seconds >= 60 {
            format!("{}m{}s", seconds / 60, seconds % 60)
        } else {
            format!("{seconds}s")
        }
    }

    /// The protobuf form of `duration`.
    pub fn duration(duration: std::time::Duration) -> prost_types::Duration {
        prost_types::Duration {
            seconds: i64::try_from(duration.as_secs()).unwrap_or(i64::MAX),
            nanos: i32::try_from(duration.subsec_nanos()).unwrap_or(0),
        }
    }

    /// The std form of `duration`, `None` when negative.
    pub fn from_duration(duration: &prost_types::Duration) -> Option<std::time::Duration> {
        let seconds = u64::try_from(duration.seconds).ok()?;
        let nanos = u32::try_from(duration.nanos).ok()?;
        Some(std::time::Duration::new(seconds, nanos))
    }

    #[cfg(test)]
    mod tests {
        use std::time::Duration;

        #[test]
        fn ages_read_as_people_say_them() {
            assert_eq!(super::age_text(Duration::from_secs(72 * 3600)), "3d0h");
            assert_eq!(
                super::age_text(Duration::from_secs(2 * 3600 + 600)),
                "2h10m"
            );
            assert_eq!(super::age_text(Duration::from_secs(90)), "1m30s");
            assert_eq!(super::age_text(Duration::from_millis(9_900)), "9s");
        }
    }
}

/// JSON text as Redrive shows it (body previews in the planner's answers and
/// in `redrivectl`) and, with feature `json`, the API's canonical proto3 JSON
/// of any `redrive.v1` message ([`json::to_canonical_json`]).
pub mod json {
    /// Why a message has no canonical JSON: never for a message of this
    /// crate (their descriptors are in [`crate::FILE_DESCRIPTOR_SET`]).
    #[cfg(feature = "json")]
    #[derive(Debug, thiserror::Error)]
    pub enum CanonicalJsonError {
        /// The descriptor set does not decode, or has no message of this
        /// full name (`redrive.v1.Plan`).
        #[error("no descriptor for message {0}")]
        UnknownMessage(String),
        /// The message's own encoding did not decode as its descriptor says.
        #[error("message {name} does not decode by its descriptor: {source}")]
        Decode {
            /// The message's full name.
            name: String,
            /// prost's complaint.
            source: prost::DecodeError,
        },
        /// serde_json refused the value (not expected for protobuf data).
        #[error("message {name} cannot be written as JSON: {source}")]
        Serialize {
            /// The message's full name.
            name: String,
            /// serde_json's complaint.
            source: serde_json::Error,
        },
    }

    /// `message` in the protobuf JSON mapping of proto3, exactly as grpcurl
    /// and the other gRPC tools print it: field names in lowerCamelCase,
    /// enums by their names (`PLAN_STATE_COMPLETED`), 64-bit integers as
    /// strings, `Timestamp`s as RFC 3339 in UTC (`2024-05-01T12:00:00Z`, with
    /// 3, 6 or 9 fractional digits when there are any), `Duration`s as
    /// `"1.5s"`, bytes as standard base64, and fields at their default
    /// value (0, `""`, `false`, empty lists and maps, the zero enum) left
    /// out. Made from the message's encoding and its descriptor in
    /// [`crate::FILE_DESCRIPTOR_SET`] (prost-reflect's serializer).
    ///
    /// # Errors
    /// [`CanonicalJsonError`] when `M` is not a message of the descriptor
    /// set (never for `redrive.v1` and the well-known types it uses).
    #[cfg(feature = "json")]
    pub fn to_canonical_json<M: prost::Message + prost::Name>(
        message: &M,
    ) -> Result<serde_json::Value, CanonicalJsonError> {
        let (name, dynamic) = dynamic(message)?;
        serde_json::to_value(&dynamic)
            .map_err(|source| CanonicalJsonError::Serialize { name, source })
    }

    /// [`to_canonical_json`] as compact text, the fields in the order of
    /// their numbers (as grpcurl prints them; a `serde_json::Value` sorts
    /// them by name).
    ///
    /// # Errors
    /// As [`to_canonical_json`].
    #[cfg(feature = "json")]
    pub fn to_canonical_json_string<M: prost::Message + prost::Name>(
        message: &M,
    ) -> Result<String, CanonicalJsonError> {
        let (name, dynamic) = dynamic(message)?;
        serde_json::to_string(&dynamic)
            .map_err(|source| CanonicalJsonError::Serialize { name, source })
    }

    /// `message` as a `DynamicMessage` of its descriptor, with its full name.
    #[cfg(feature = "json")]
    fn dynamic<M: prost::Message + prost::Name>(
        message: &M,
    ) -> Result<(String, prost_reflect::DynamicMessage), CanonicalJsonError> {
        let name = M::full_name();
        let descriptor = crate::codec::descriptor_pool()
            .and_then(|pool| pool.get_message_by_name(&name))
            .ok_or_else(|| CanonicalJsonError::UnknownMessage(name.clone()))?;
        let dynamic =
            prost_reflect::DynamicMessage::decode(descriptor, message.encode_to_vec().as_slice())
                .map_err(|source| CanonicalJsonError::Decode {
                name: name.clone(),
                source,
            })?;
        Ok((name, dynamic))
    }

    /// Valid JSON `text` re-indented as `serde_json`'s pretty printer would
    /// (two spaces, `"key": value`), from its own tokens: nothing is parsed into
    /// a map, so keys keep their order and numbers and escapes their spelling.
    pub fn pretty(text: &str) -> String {
        let mut out = String::with_capacity(text.len() * 2);
        let mut depth = 0usize;
        let mut in_string = false;
        let mut escaped = false;
        let mut chars = text.chars().peekable();
        let newline = |out: &mut String, depth: usize| {
            out.push('\n');
            for _ in 0..depth {
                out.push_str("  ");
            }
        };
        while let Some(c) = chars.next() {
            if in_string {
                out.push(c);
                if escaped {
                    escaped = false;
                } else if c == '\\' {
                    escaped = true;
                } else if c == '"' {
                    in_string = false;
                }
                continue;
            }
            match c {
                '"' => {
                    in_string = true;
                    out.push(c);
                }
                '{' | '[' => {
                    out.push(c);
                    // `{}` and `[]` stay on one line.
                    while chars.peek().is_some_and(|next| next.is_whitespace()) {
                        chars.next();
                    }
                    if chars.peek().is_some_and(|next| matches!(next, '}' | ']')) {
                        out.push(chars.next().unwrap_or_default());
                    } else {
                        depth += 1;
                        newline(&mut out, depth);
                    }
                }
                '}' | ']' => {
                    depth = depth.saturating_sub(1);
                    newline(&mut out, depth);
                    out.push(c);
                }
                ',' => {
                    out.push(c);
                    newline(&mut out, depth);
                }
                ':' => out.push_str(": "),
                c if c.is_whitespace() => {}
                c => out.push(c),
            }
        }
        // Control characters inside strings are JSON escapes already; a text
        // with raw ones is not valid JSON and does not get here.
        out
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        /// The proto3 JSON mapping, as grpcurl prints it.
        #[cfg(feature = "json")]
        #[test]
        fn messages_are_written_in_the_proto3_json_mapping() {
            use crate::v1;
            let plan = v1::Plan {
                plan_id: "p-1".into(),
                state: v1::PlanState::Completed.into(),
                total_items: 12,
                canary_fraction: 0.5,
                counts: Some(v1::ActionCounts {
                    sent: 3,
                    ..Default::default()
                }),
                created_at: Some(prost_types::Timestamp {
                    seconds: 1_714_564_800,
                    nanos: 0,
                }),
                approved_at: Some(prost_types::Timestamp {
                    seconds: 1_714_564_800,
                    nanos: 123_000_000,
                }),
                observe_for: Some(prost_types::Duration {
                    seconds: 90,
                    nanos: 500_000_000,
                }),
                ..Default::default()
            };
            assert_eq!(
                to_canonical_json(&plan).unwrap(),
                serde_json::json!({
                    "planId": "p-1",
                    "state": "PLAN_STATE_COMPLETED",
                    "totalItems": "12",
                    "canaryFraction": 0.5,
                    "counts": {"sent": "3"},
                    "createdAt": "2024-05-01T12:00:00Z",
                    "approvedAt": "2024-05-01T12:00:00.123Z",
                    "observeFor": "90.500s",
                })
            );
            let chunk = v1::ExportAuditChunk {
                data: b"\xff\x00a".to_vec(),
                ..Default::default()
            };
            assert_eq!(
                to_canonical_json(&chunk).unwrap(),
                serde_json::json!({"data": "/wBh"})
            );
            assert_eq!(
                to_canonical_json(&v1::Plan::default()).unwrap(),
                serde_json::json!({})
            );
            // As text: fields in the order of their numbers.
            assert_eq!(
                to_canonical_json_string(&plan).unwrap(),
                r#"{"planId":"p-1","state":"PLAN_STATE_COMPLETED","canaryFraction":0.5,"observeFor":"90.500s","totalItems":"12","counts":{"sent":"3"},"createdAt":"2024-05-01T12:00:00Z","approvedAt":"2024-05-01T12:00:00.123Z"}"#
            );
        }

        #[test]
        fn json_keeps_its_key_order_and_spelling() {
            let body = r#"{"zeta":1,"alpha":{"b":[1, 2.50,{}],"a":[]},"m":"x\"y\u00e9","big":12345678901234567890}"#;
            assert_eq!(
                pretty(body),
                "{\n  \"zeta\": 1,\n  \"alpha\": {\n    \"b\": [\n      1,\n      2.50,\n      {}\n    ],\n    \"a\": []\n  },\n  \"m\": \"x\\\"y\\u00e9\",\n  \"big\": 12345678901234567890\n}"
            );
            // Same layout as serde_json's pretty printer where both apply.
            let sorted = r#"{"a":"t", "b":[1,{"c":null}], "d":{}}"#;
            let value: serde_json::Value = serde_json::from_str(sorted).unwrap();
            assert_eq!(
                pretty(sorted),
                serde_json::to_string_pretty(&value).unwrap()
            );
        }
    }
}
