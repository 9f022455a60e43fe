//! Redrive's gRPC contract, package `redrive.v1`, shared by the planner, the
//! executor, `redrivectl` and the end-to-end tests.
//!
//! # Layout
//! - [`v1`]: the generated messages, clients and servers (`Planner`,
//!   `Coordinator`, `StateCheck`).
//! - [`FILE_DESCRIPTOR_SET`]: the encoded descriptors, for server reflection.
//! - [`limits`]: the one table of input limits; [`codec`]: the gRPC codec
//!   that checks requests against them on the wire before decoding.
//! - [`error`]: the small set of `tonic::Code`s the services answer with.
//! - [`names`]: the stable lowercase names of the API's enums.
//! - [`time`]: conversions between protobuf and chrono times and durations.
//! - `settings` (feature `settings`): the services' start-up settings, every
//!   bad one reported at once.
//! - [`tls`]: client TLS to the planner and hooks (`https://`, a CA bundle,
//!   an optional client certificate).
//! - `amqp` (feature `amqp`): lossless conversions between the API's header and
//!   property shapes and lapin's AMQP types.

#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod v1 {
    tonic::include_proto!("redrive.v1");
}

#[cfg(feature = "amqp")]
pub mod amqp;
pub mod codec;
pub mod error;
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
}
