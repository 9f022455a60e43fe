//! The rows read from `dead_letters` and what the API makes of them: a dead
//! letter with its death and body revisions, a summary group's counts.

use chrono::{DateTime, Utc};
use prost::Message;
use redrive_proto::{
    time::timestamp,
    v1::{self, HeaderTable, MessageProperties, Origin, ReasonClass},
};

use super::compression_from_name;
use crate::{ids::DeadLetterId, store::StoreError};

/// The fixed columns of a summary group (after its keys).
#[derive(sqlx::FromRow)]
pub(super) struct SummaryCountsRow {
    pub(super) count: i64,
    pub(super) first_seen: DateTime<Utc>,
    pub(super) last_seen: DateTime<Utc>,
}

/// A body revision as [`Store::get_dead_letter`] reads it.
#[derive(sqlx::FromRow)]
pub(super) struct RevisionRow {
    revision: i32,
    body: Vec<u8>,
    body_sha256: Vec<u8>,
    actor: String,
    reason: String,
    created_at: DateTime<Utc>,
}

impl From<RevisionRow> for v1::BodyRevision {
    fn from(row: RevisionRow) -> Self {
        Self {
            revision: u32::try_from(row.revision).unwrap_or_default(),
            body: row.body,
            body_sha256: hex::encode(row.body_sha256),
            actor: row.actor,
            reason: row.reason,
            created_at: Some(timestamp(row.created_at)),
        }
    }
}

/// The death columns of a dead letter: a death when `death_reason` is set.
#[derive(sqlx::FromRow)]
struct DeathRow {
    death_reason: Option<String>,
    death_queue: Option<String>,
    death_exchange: Option<String>,
    death_routing_keys: Option<Vec<String>>,
    death_count: Option<i64>,
    death_time: Option<DateTime<Utc>>,
}

impl From<DeathRow> for Option<v1::Death> {
    fn from(row: DeathRow) -> Self {
        Some(v1::Death {
            reason: row.death_reason?,
            queue: row.death_queue.unwrap_or_default(),
            exchange: row.death_exchange.unwrap_or_default(),
            routing_keys: row.death_routing_keys.unwrap_or_default(),
            count: row
                .death_count
                .and_then(|count| u64::try_from(count).ok())
                .unwrap_or_default(),
            time: row.death_time.map(timestamp),
        })
    }
}

/// A row of [`columns`].
#[derive(sqlx::FromRow)]
pub(in crate::store) struct DeadLetterRow {
    id: DeadLetterId,
    source: String,
    origin: String,
    captured_at: DateTime<Utc>,
    message_id: Option<String>,
    message_key: String,
    body: Vec<u8>,
    body_size: i64,
    body_sha256: Vec<u8>,
    body_oversized: bool,
    body_compression: String,
    properties: Vec<u8>,
    headers: Vec<u8>,
    #[sqlx(flatten)]
    death: DeathRow,
    reason_class: String,
    destination: String,
    event_type: Option<String>,
    schema_version: Option<String>,
    producer: Option<String>,
    error_text: Option<String>,
    attempts: Option<i32>,
    died_at: DateTime<Utc>,
    occurred_at: Option<DateTime<Utc>>,
    redrive_plan_id: Option<String>,
    original_exchange: Option<String>,
    original_routing_key: Option<String>,
    capture_notes: Vec<String>,
    body_problem: Option<String>,
    exchange_only: bool,
    raw_content_header: Option<Vec<u8>>,
    #[sqlx(default)]
    error_class: Option<String>,
    #[sqlx(default)]
    error_group: Option<String>,
    /// Housekeeping columns ([`archive_columns`]); absent from executors'
    /// reads.
    #[sqlx(default)]
    status: Option<String>,
    #[sqlx(default)]
    archived_at: Option<DateTime<Utc>>,
    #[sqlx(default)]
    archived_by: Option<String>,
    #[sqlx(default)]
    archive_reason: Option<String>,
    /// Keys before a re-key (migration 0025).
    #[sqlx(default)]
    previous_message_keys: Vec<String>,
}

impl TryFrom<DeadLetterRow> for v1::DeadLetter {
    type Error = StoreError;

    /// # Errors
    /// [`StoreError::Corrupt`] when the stored properties or headers do not
    /// decode.
    fn try_from(row: DeadLetterRow) -> Result<Self, StoreError> {
        let id = row.id;
        let properties = MessageProperties::decode(row.properties.as_slice()).map_err(|error| {
            StoreError::Corrupt(format!("dead letter {id} properties: {error}"))
        })?;
        let headers = HeaderTable::decode(row.headers.as_slice())
            .map_err(|error| StoreError::Corrupt(format!("dead letter {id} headers: {error}")))?;
        let mut capture_notes = row.capture_notes;
        capture_notes.extend(row.body_problem);
        Ok(Self {
            id: id.to_string(),
            source: row.source,
            origin: Origin::from_name(&row.origin).unwrap_or_default().into(),
            captured_at: Some(timestamp(row.captured_at)),
            message_id: row.message_id,
            message_key: row.message_key,
            body: row.body,
            body_size: u64::try_from(row.body_size).unwrap_or_default(),
            body_sha256: hex::encode(row.body_sha256),
            body_oversized: row.body_oversized,
            body_compression: compression_from_name(&row.body_compression).into(),
            properties: Some(properties),
            headers: Some(headers),
            death: row.death.into(),
            reason_class: ReasonClass::from_name(&row.reason_class)
                .unwrap_or_default()
                .into(),
            destination: row.destination,
            event_type: row.event_type,
            schema_version: row.schema_version,
            producer: row.producer,
            error_text: row.error_text,
            error_class: row.error_class,
            error_group: row.error_group.unwrap_or_default(),
            died_at: Some(timestamp(row.died_at)),
            occurred_at: row.occurred_at.map(timestamp),
            redrive_plan_id: row.redrive_plan_id,
            capture_notes,
            original_exchange: row.original_exchange,
            exchange_only: row.exchange_only,
            raw_content_header: row.raw_content_header.unwrap_or_default(),
            original_routing_key: row.original_routing_key,
            attempts: row
                .attempts
                .and_then(|attempts| u32::try_from(attempts).ok()),
            revisions: Vec::new(),
            status: match row.status.as_deref() {
                Some("archived") => v1::DeadLetterStatus::Archived,
                Some("replayed") => v1::DeadLetterStatus::Replayed,
                Some(_) => v1::DeadLetterStatus::Open,
                None => v1::DeadLetterStatus::Unspecified,
            }
            .into(),
            archived: row.archived_at.map(|at| v1::ArchiveRecord {
                action: "archive".to_owned(),
                actor: row.archived_by.unwrap_or_default(),
                reason: row.archive_reason.unwrap_or_default(),
                at: Some(timestamp(at)),
            }),
            archive_history: Vec::new(),
            previous_message_keys: row.previous_message_keys,
        })
    }
}
