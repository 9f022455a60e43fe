//! The `dead_letters` table: batch inserts, listing, lookups and summaries.

use chrono::{DateTime, Utc};
use prost::Message;
use redrive_proto::{
    time::timestamp,
    v1::{self, BodyCompression, HeaderTable, MessageProperties, Origin, ReasonClass},
};
use sqlx::{AssertSqlSafe, FromRow, Postgres, QueryBuilder, Row};
use uuid::Uuid;

use super::{Store, StoreError};
use crate::{
    dead_letters::selector::{Selector, Status},
    dead_letters::{Dedup, NewDeadLetter},
    ids::DeadLetterId,
};

/// What a batch insert did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct InsertOutcome {
    /// Rows newly stored.
    pub inserted: u64,
    /// Items recognized as already stored.
    pub already_stored: u64,
}

/// A dimension to group dead letters by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dimension {
    /// Reason class.
    Reason,
    /// Default replay destination.
    Destination,
    /// Producer (`app_id`).
    Producer,
    /// Schema version.
    SchemaVersion,
    /// Event type.
    EventType,
    /// Hour of `died_at`, UTC (`2026-11-29T14:00Z`).
    Hour,
    /// Source.
    Source,
    /// Error group: the error text normalized by `redrive_error_group`
    /// (migration 0020).
    Error,
    /// `open`, `archived` or `replayed`.
    Status,
}

impl Dimension {
    /// The key name in `SummaryGroup.key`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Reason => "reason",
            Self::Destination => "destination",
            Self::Producer => "producer",
            Self::SchemaVersion => "schema_version",
            Self::EventType => "event_type",
            Self::Hour => "hour",
            Self::Source => "source",
            Self::Error => "error",
            Self::Status => "status",
        }
    }

    fn sql(self) -> &'static str {
        match self {
            Self::Reason => "reason_class",
            Self::Destination => "destination",
            Self::Producer => "coalesce(producer, '')",
            Self::SchemaVersion => "coalesce(schema_version, '')",
            Self::EventType => "coalesce(event_type, '')",
            Self::Hour => {
                "to_char(date_trunc('hour', died_at AT TIME ZONE 'UTC'), 'YYYY-MM-DD\"T\"HH24\":00Z\"')"
            }
            Self::Source => "source",
            Self::Error => "redrive_error_group(error_text)",
            Self::Status => "status",
        }
    }
}

/// Whether dead letter `dead_letters` (the table, unaliased) was sent by a
/// plan: a plan item of it is `sent`.
pub(crate) const REPLAYED_SQL: &str = "EXISTS (SELECT 1 FROM plan_items sent \
    WHERE sent.dead_letter_id = dead_letters.id AND sent.state = 'sent')";

/// The status of dead letter `dead_letters` (unaliased): `archived`,
/// `replayed` or `open` (docs/design.md, "Housekeeping").
fn status_sql() -> String {
    format!(
        "CASE WHEN dead_letters.archived_at IS NOT NULL THEN 'archived' \
         WHEN {REPLAYED_SQL} THEN 'replayed' ELSE 'open' END"
    )
}

/// The housekeeping columns of a dead letter read beside [`columns`] by
/// listings and lookups (not by executors' reads): its status and archive.
fn archive_columns() -> String {
    format!(
        "{} AS status, dead_letters.archived_at, dead_letters.archived_by, \
         dead_letters.archive_reason, dead_letters.previous_message_keys",
        status_sql()
    )
}

/// The summary counts by status of a selection.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, sqlx::FromRow)]
pub struct StatusCounts {
    /// Neither archived nor replayed.
    pub open: i64,
    /// Archived.
    pub archived: i64,
    /// Replayed, not archived.
    pub replayed: i64,
}

/// One group of a summary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SummaryGroup {
    /// (dimension name, value) in the requested order.
    pub key: Vec<(&'static str, String)>,
    /// Dead letters in the group.
    pub count: u64,
    /// Earliest `died_at`.
    pub first_seen: DateTime<Utc>,
    /// Latest `died_at`.
    pub last_seen: DateTime<Utc>,
}

fn compression_name(compression: BodyCompression) -> &'static str {
    match compression {
        BodyCompression::Gzip => "gzip",
        BodyCompression::Zstd => "zstd",
        BodyCompression::None | BodyCompression::Unspecified => "none",
    }
}

fn compression_from_name(name: &str) -> BodyCompression {
    match name {
        "gzip" => BodyCompression::Gzip,
        "zstd" => BodyCompression::Zstd,
        _ => BodyCompression::None,
    }
}

/// `value` with NUL characters (which PostgreSQL text cannot hold) replaced by
/// U+FFFD.
fn text(value: String) -> String {
    if value.contains('\0') {
        value.replace('\0', "\u{fffd}")
    } else {
        value
    }
}

/// A JSON array of NUL-free strings, unpacked by `jsonb_array_elements_text`.
fn json_text_array(values: &[String]) -> String {
    let cleaned: Vec<String> = values.iter().cloned().map(text).collect();
    serde_json::to_string(&cleaned).unwrap_or_else(|_| "[]".to_owned())
}

/// Columns read for a dead letter; `body` only when asked.
pub(crate) fn columns(with_body: bool) -> String {
    format!(
        "id, source, origin, captured_at, message_id, message_key, {}, body_size, body_sha256, \
         body_oversized, body_compression, properties, headers, death_reason, death_queue, \
         death_exchange, death_routing_keys, death_count, death_time, reason_class, destination, \
         event_type, schema_version, producer, error_text, attempts, died_at, occurred_at, \
         redrive_plan_id, original_exchange, original_routing_key, capture_notes, body_problem, \
         exchange_only, raw_content_header",
        if with_body {
            "body"
        } else {
            "''::bytea AS body"
        }
    )
}

/// Pushes ` WHERE …` for `selector` (without its limit).
pub(crate) fn push_conditions(builder: &mut QueryBuilder<Postgres>, selector: &Selector) {
    builder.push(" WHERE TRUE");
    let lists: [(&str, &Vec<String>); 5] = [
        ("source", &selector.sources),
        ("destination", &selector.destinations),
        ("event_type", &selector.event_types),
        ("schema_version", &selector.schema_versions),
        ("producer", &selector.producers),
    ];
    for (column, values) in lists {
        if !values.is_empty() {
            builder
                .push(format!(" AND {column} = ANY("))
                .push_bind(values.clone())
                .push(")");
        }
    }
    if !selector.reasons.is_empty() {
        builder
            .push(" AND (reason_class = ANY(")
            .push_bind(selector.reasons.clone())
            .push(") OR death_reason = ANY(")
            .push_bind(selector.reasons.clone())
            .push("))");
    }
    if !selector.ids.is_empty() {
        builder
            .push(" AND id = ANY(")
            .push_bind(selector.ids.clone())
            .push(")");
    }
    if let Some(from) = selector.died_from {
        builder.push(" AND died_at >= ").push_bind(from);
    }
    if let Some(to) = selector.died_to {
        builder.push(" AND died_at < ").push_bind(to);
    }
    match selector.status {
        Status::NotArchived => {
            builder.push(" AND dead_letters.archived_at IS NULL");
        }
        Status::Open => {
            builder.push(format!(
                " AND dead_letters.archived_at IS NULL AND NOT {REPLAYED_SQL}"
            ));
        }
        Status::Archived => {
            builder.push(" AND dead_letters.archived_at IS NOT NULL");
        }
        Status::Replayed => {
            builder.push(format!(
                " AND dead_letters.archived_at IS NULL AND {REPLAYED_SQL}"
            ));
        }
        Status::All => {}
    }
    if let Some(text) = &selector.error_contains {
        builder
            .push(" AND strpos(lower(dead_letters.error_text), lower(")
            .push_bind(text.clone())
            .push(")) > 0");
    }
    // The latest body: a repaired body's revision, else the captured one.
    for body_match in &selector.body_matches {
        builder
            .push(
                " AND redrive_body_value(CASE WHEN dead_letters.body_revision IS NULL \
                 THEN dead_letters.body ELSE (SELECT v.body FROM dead_letter_revisions v \
                 WHERE v.dead_letter_id = dead_letters.id AND v.revision = dead_letters.body_revision) END, ",
            )
            .push_bind(body_match.path.clone())
            .push("::text[]) = ")
            .push_bind(body_match.value.clone());
    }
}

/// Pushes a sub-select of the selected dead letters' `columns`, honouring the
/// selector's limit (first captured first).
pub(crate) fn push_selected(
    builder: &mut QueryBuilder<Postgres>,
    selector: &Selector,
    columns: &str,
) {
    builder.push(format!("(SELECT {columns} FROM dead_letters"));
    push_conditions(builder, selector);
    builder.push(" ORDER BY id");
    if let Some(limit) = selector.limit {
        builder
            .push(" LIMIT ")
            .push_bind(i64::try_from(limit).unwrap_or(i64::MAX));
    }
    builder.push(")");
}

/// Bodies in one statement above which its connection gives its buffers
/// back afterwards: 1 MiB.
const SHRINK_AFTER_BYTES: usize = 1024 * 1024;

/// Gives `connection`'s buffers back to the allocator after it stored
/// `batch`, when the batch's bodies were large: sqlx keeps a connection's
/// buffers as large as its largest statement (`Connection::shrink_buffers`),
/// so every connection of the pool that once stored a 50 MiB body would
/// keep 50 MiB and more, outside the ingest budget, for its whole life.
fn shrink_after(connection: &mut sqlx::PgConnection, batch: &[NewDeadLetter]) {
    let bytes: usize = batch.iter().map(|item| item.body.len()).sum();
    if bytes > SHRINK_AFTER_BYTES {
        sqlx::Connection::shrink_buffers(connection);
    }
}

impl Store {
    /// Stores `batch` (ingest and import: idempotent per source and dedup key)
    /// in one statement.
    ///
    /// # Errors
    /// [`StoreError`]; nothing of the batch is stored then.
    pub async fn insert_dead_letters(
        &self,
        batch: &[NewDeadLetter],
    ) -> Result<InsertOutcome, StoreError> {
        let mut connection = self.pool().acquire().await?;
        let mut transaction = sqlx::Connection::begin(&mut *connection).await?;
        let inserted = insert_rows(&mut transaction, batch, None).await?;
        transaction.commit().await?;
        shrink_after(&mut connection, batch);
        Ok(InsertOutcome {
            inserted,
            already_stored: batch.len() as u64 - inserted,
        })
    }

    /// Stores a batch captured from RabbitMQ as capture batch of `session`, in
    /// one transaction, and returns the batch id to mark acked after the
    /// broker ack. A redelivered dead letter first looks for a stored copy (same
    /// source and fingerprint) in a batch an earlier session committed but never
    /// acked; a match is moved into this batch instead of stored again (each
    /// stored row absorbs at most one redelivery).
    ///
    /// # Errors
    /// [`StoreError`]; nothing of the batch is stored then.
    pub async fn insert_captured(
        &self,
        session: Uuid,
        source: &str,
        batch: &[NewDeadLetter],
    ) -> Result<(i64, InsertOutcome), StoreError> {
        let mut connection = self.pool().acquire().await?;
        let mut transaction = sqlx::Connection::begin(&mut *connection).await?;
        let batch_id: i64 = sqlx::query_scalar(
            "INSERT INTO capture_batches (session, source) VALUES ($1, $2) RETURNING id",
        )
        .bind(session)
        .bind(source)
        .fetch_one(&mut *transaction)
        .await?;
        let mut fresh = Vec::with_capacity(batch.len());
        let mut absorbed = 0;
        for dead_letter in batch {
            if dead_letter.dedup == Dedup::Fingerprint {
                let matched: Option<i64> = sqlx::query_scalar(
                    "UPDATE dead_letters d SET capture_batch = $4 WHERE d.id = ( \
                        SELECT s.id FROM dead_letters s JOIN capture_batches b ON b.id = s.capture_batch \
                        WHERE s.source = $1 AND s.capture_fingerprint = $2 AND NOT b.acked AND b.session <> $3 \
                        ORDER BY s.id LIMIT 1 FOR UPDATE OF s SKIP LOCKED) \
                     RETURNING d.id",
                )
                .bind(&dead_letter.source)
                .bind(dead_letter.fingerprint.as_slice())
                .bind(session)
                .bind(batch_id)
                .fetch_optional(&mut *transaction)
                .await?;
                if matched.is_some() {
                    absorbed += 1;
                    continue;
                }
            }
            fresh.push(dead_letter.clone());
        }
        let inserted = insert_rows(&mut transaction, &fresh, Some(batch_id)).await?;
        transaction.commit().await?;
        shrink_after(&mut connection, batch);
        Ok((
            batch_id,
            InsertOutcome {
                inserted,
                already_stored: absorbed,
            },
        ))
    }

    /// Records that the broker acked capture batch `batch_id`.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn mark_capture_acked(&self, batch_id: i64) -> Result<(), StoreError> {
        sqlx::query("UPDATE capture_batches SET acked = true WHERE id = $1")
            .bind(batch_id)
            .execute(self.pool())
            .await?;
        Ok(())
    }
}

/// Inserts `batch` in `transaction` (capture rows with `capture_batch`);
/// returns how many rows were inserted (ingest repeats are skipped).
async fn insert_rows(
    transaction: &mut sqlx::Transaction<'_, Postgres>,
    batch: &[NewDeadLetter],
    capture_batch: Option<i64>,
) -> Result<u64, StoreError> {
    if batch.is_empty() {
        return Ok(0);
    }
    // PostgreSQL text cannot hold NUL: every derived string passes `text`.
    let column = |f: &dyn Fn(&NewDeadLetter) -> Option<String>| {
        batch.iter().map(|d| f(d).map(text)).collect::<Vec<_>>()
    };
    let sources = column(&|d| Some(d.source.clone()));
    let origins = column(&|d| Some(d.origin.name().to_owned()));
    let redelivered: Vec<bool> = batch
        .iter()
        .map(|d| d.dedup == Dedup::Fingerprint)
        .collect();
    let dedup_keys = column(&|d| match &d.dedup {
        Dedup::Key(key) => Some(key.clone()),
        Dedup::None | Dedup::Fingerprint => None,
    });
    let fingerprints: Vec<Vec<u8>> = batch.iter().map(|d| d.fingerprint.to_vec()).collect();
    let captured_at: Vec<DateTime<Utc>> = batch.iter().map(|d| d.captured_at).collect();
    let message_ids = column(&|d| d.message_id.clone());
    let message_keys = column(&|d| Some(d.message_key.clone()));
    let bodies: Vec<&[u8]> = batch.iter().map(|d| d.body.as_slice()).collect();
    let body_sizes: Vec<i64> = batch.iter().map(|d| d.body.len() as i64).collect();
    let body_hashes: Vec<Vec<u8>> = batch.iter().map(|d| d.body_sha256.to_vec()).collect();
    let oversized: Vec<bool> = batch.iter().map(|d| d.body_oversized).collect();
    let body_problems = column(&|d| d.body_problem.clone());
    let compressions = column(&|d| Some(compression_name(d.body_compression).to_owned()));
    let properties: Vec<&[u8]> = batch.iter().map(|d| d.properties.as_slice()).collect();
    let headers: Vec<&[u8]> = batch.iter().map(|d| d.headers.as_slice()).collect();
    let content_types = column(&|d| d.content_type.clone());
    let death_reasons = column(&|d| d.death.as_ref().map(|x| x.reason.clone()));
    let death_queues = column(&|d| d.death.as_ref().map(|x| x.queue.clone()));
    let death_exchanges = column(&|d| d.death.as_ref().map(|x| x.exchange.clone()));
    let death_routing_keys =
        column(&|d| d.death.as_ref().map(|x| json_text_array(&x.routing_keys)));
    let death_counts: Vec<Option<i64>> = batch
        .iter()
        .map(|d| {
            d.death
                .as_ref()
                .map(|x| i64::try_from(x.count).unwrap_or(i64::MAX))
        })
        .collect();
    let death_times: Vec<Option<DateTime<Utc>>> = batch
        .iter()
        .map(|d| d.death.as_ref().and_then(|x| x.time))
        .collect();
    let reason_classes = column(&|d| Some(d.reason_class.name().to_owned()));
    let destinations = column(&|d| Some(d.destination.clone()));
    let event_types = column(&|d| d.event_type.clone());
    let schema_versions = column(&|d| d.schema_version.clone());
    let producers = column(&|d| d.producer.clone());
    let error_texts = column(&|d| d.error_text.clone());
    let attempts: Vec<Option<i32>> = batch
        .iter()
        .map(|d| d.attempts.and_then(|a| i32::try_from(a).ok()))
        .collect();
    let died_at: Vec<DateTime<Utc>> = batch.iter().map(|d| d.died_at).collect();
    let first_died_at: Vec<DateTime<Utc>> = batch.iter().map(|d| d.first_died_at).collect();
    let occurred_at: Vec<Option<DateTime<Utc>>> = batch.iter().map(|d| d.occurred_at).collect();
    let plan_ids = column(&|d| d.redrive_plan_id.clone());
    let original_exchanges = column(&|d| d.original_exchange.clone());
    let original_routing_keys = column(&|d| d.original_routing_key.clone());
    let notes = column(&|d| Some(json_text_array(&d.capture_notes)));
    let exchange_only: Vec<bool> = batch.iter().map(|d| d.exchange_only).collect();
    let raw_headers: Vec<Option<Vec<u8>>> =
        batch.iter().map(|d| d.raw_content_header.clone()).collect();

    let inserted: Vec<i64> = sqlx::query_scalar(
        r#"
            INSERT INTO dead_letters (
                source, origin, dedup_key, capture_fingerprint, captured_at, message_id,
                message_key, body, body_size, body_sha256, body_oversized, body_problem,
                body_compression, properties, headers, content_type, death_reason, death_queue,
                death_exchange, death_routing_keys, death_count, death_time, reason_class,
                destination, event_type, schema_version, producer, error_text, attempts,
                died_at, occurred_at, redrive_plan_id, original_exchange, original_routing_key,
                capture_notes, first_died_at, capture_batch, exchange_only, raw_content_header)
            SELECT
                u.source, u.origin, u.dedup_key, u.fingerprint, u.captured_at, u.message_id,
                u.message_key, u.body, u.body_size, u.body_sha256, u.oversized, u.body_problem,
                u.compression, u.properties, u.headers, u.content_type, u.death_reason,
                u.death_queue, u.death_exchange,
                CASE WHEN u.routing_keys IS NULL THEN NULL
                     ELSE ARRAY(SELECT jsonb_array_elements_text(u.routing_keys::jsonb)) END,
                u.death_count, u.death_time, u.reason_class, u.destination, u.event_type,
                u.schema_version, u.producer, u.error_text, u.attempts, u.died_at,
                u.occurred_at, u.plan_id, u.original_exchange, u.original_routing_key,
                ARRAY(SELECT jsonb_array_elements_text(u.notes::jsonb)), u.first_died_at, $38,
                u.exchange_only, u.raw_content_header
            FROM UNNEST(
                $1::text[], $2::text[], $3::text[], $4::bytea[], $5::timestamptz[], $6::text[],
                $7::text[], $8::bytea[], $9::bigint[], $10::bytea[], $11::bool[], $12::text[],
                $13::text[], $14::bytea[], $15::bytea[], $16::text[], $17::text[], $18::text[],
                $19::text[], $20::text[], $21::bigint[], $22::timestamptz[], $23::text[],
                $24::text[], $25::text[], $26::text[], $27::text[], $28::text[], $29::int[],
                $30::timestamptz[], $31::timestamptz[], $32::text[], $33::text[], $34::text[],
                $35::text[], $36::bool[], $37::timestamptz[], $39::bool[], $40::bytea[]
            ) AS u(source, origin, dedup_key, fingerprint, captured_at, message_id,
                   message_key, body, body_size, body_sha256, oversized, body_problem,
                   compression, properties, headers, content_type, death_reason, death_queue,
                   death_exchange, routing_keys, death_count, death_time, reason_class,
                   destination, event_type, schema_version, producer, error_text, attempts,
                   died_at, occurred_at, plan_id, original_exchange, original_routing_key,
                   notes, redelivered, first_died_at, exchange_only, raw_content_header)
            ON CONFLICT (source, dedup_key) WHERE dedup_key IS NOT NULL DO NOTHING
            RETURNING id
            "#,
    )
    .bind(&sources)
    .bind(&origins)
    .bind(&dedup_keys)
    .bind(&fingerprints)
    .bind(&captured_at)
    .bind(&message_ids)
    .bind(&message_keys)
    .bind(&bodies)
    .bind(&body_sizes)
    .bind(&body_hashes)
    .bind(&oversized)
    .bind(&body_problems)
    .bind(&compressions)
    .bind(&properties)
    .bind(&headers)
    .bind(&content_types)
    .bind(&death_reasons)
    .bind(&death_queues)
    .bind(&death_exchanges)
    .bind(&death_routing_keys)
    .bind(&death_counts)
    .bind(&death_times)
    .bind(&reason_classes)
    .bind(&destinations)
    .bind(&event_types)
    .bind(&schema_versions)
    .bind(&producers)
    .bind(&error_texts)
    .bind(&attempts)
    .bind(&died_at)
    .bind(&occurred_at)
    .bind(&plan_ids)
    .bind(&original_exchanges)
    .bind(&original_routing_keys)
    .bind(&notes)
    .bind(&redelivered)
    .bind(&first_died_at)
    .bind(capture_batch)
    .bind(&exchange_only)
    .bind(&raw_headers)
    .fetch_all(&mut **transaction)
    .await?;
    Ok(inserted.len() as u64)
}

impl Store {
    /// One page of selected dead letters (without bodies), by id, after
    /// `after_id`, at most `page_size`.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn list_dead_letters(
        &self,
        selector: &Selector,
        after_id: i64,
        page_size: u32,
    ) -> Result<Vec<v1::DeadLetter>, StoreError> {
        let mut builder = QueryBuilder::new(format!(
            "SELECT {}, {} FROM dead_letters",
            columns(false),
            archive_columns()
        ));
        push_conditions(&mut builder, selector);
        builder
            .push(" AND id > ")
            .push_bind(after_id)
            .push(" ORDER BY id LIMIT ")
            .push_bind(i64::from(page_size));
        let rows = builder
            .build_query_as::<DeadLetterRow>()
            .fetch_all(self.pool())
            .await?;
        rows.into_iter().map(v1::DeadLetter::try_from).collect()
    }

    /// The dead letter `id` with its body and revisions, if stored.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn get_dead_letter(
        &self,
        id: DeadLetterId,
    ) -> Result<Option<v1::DeadLetter>, StoreError> {
        let query = format!(
            "SELECT {}, {} FROM dead_letters WHERE id = $1",
            columns(true),
            archive_columns()
        );
        let Some(row) = sqlx::query_as::<_, DeadLetterRow>(AssertSqlSafe(query))
            .bind(id)
            .fetch_optional(self.pool())
            .await?
        else {
            return Ok(None);
        };
        let mut dead_letter = v1::DeadLetter::try_from(row)?;
        let revisions = sqlx::query_as::<_, RevisionRow>(
            "SELECT revision, body, body_sha256, actor, reason, created_at \
             FROM dead_letter_revisions WHERE dead_letter_id = $1 ORDER BY revision",
        )
        .bind(id)
        .fetch_all(self.pool())
        .await?;
        dead_letter.revisions = revisions.into_iter().map(v1::BodyRevision::from).collect();
        dead_letter.archive_history = self.archive_history(id).await?;
        Ok(Some(dead_letter))
    }

    /// Counts of the selected dead letters grouped by `dimensions`, largest first.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn summarize_dead_letters(
        &self,
        selector: &Selector,
        dimensions: &[Dimension],
    ) -> Result<Vec<SummaryGroup>, StoreError> {
        let keys: Vec<String> = dimensions
            .iter()
            .enumerate()
            .map(|(index, dimension)| format!("{} AS k{index}", dimension.sql()))
            .collect();
        let mut builder = QueryBuilder::new(format!(
            "SELECT {}, count(*) AS count, min(died_at) AS first_seen, max(died_at) AS last_seen FROM ",
            keys.join(", ")
        ));
        push_selected(
            &mut builder,
            selector,
            &format!(
                "reason_class, destination, producer, schema_version, event_type, died_at, source, \
                 error_text, {} AS status",
                status_sql()
            ),
        );
        let positions: Vec<String> = (1..=dimensions.len()).map(|p| p.to_string()).collect();
        builder.push(format!(
            " d GROUP BY {} ORDER BY count DESC, {}",
            positions.join(", "),
            positions.join(", ")
        ));
        let rows = builder.build().fetch_all(self.pool()).await?;
        rows.iter()
            .map(|row| {
                // The key columns (`k0`, `k1`, ...) are as many as the
                // dimensions asked for: the one row shape read by position.
                let key = dimensions
                    .iter()
                    .enumerate()
                    .map(|(index, dimension)| {
                        Ok((dimension.name(), row.try_get::<String, _>(index)?))
                    })
                    .collect::<Result<_, sqlx::Error>>()?;
                let counted = SummaryCountsRow::from_row(row)?;
                Ok(SummaryGroup {
                    key,
                    count: u64::try_from(counted.count).unwrap_or_default(),
                    first_seen: counted.first_seen,
                    last_seen: counted.last_seen,
                })
            })
            .collect()
    }
}

impl Store {
    /// How many of the selected dead letters (whatever the selector's
    /// status) are open, archived and replayed.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn status_counts(&self, selector: &Selector) -> Result<StatusCounts, StoreError> {
        let every = Selector {
            status: Status::All,
            ..selector.clone()
        };
        let mut builder = QueryBuilder::new(
            "SELECT count(*) FILTER (WHERE status = 'open') AS open, \
             count(*) FILTER (WHERE status = 'archived') AS archived, \
             count(*) FILTER (WHERE status = 'replayed') AS replayed FROM ",
        );
        push_selected(&mut builder, &every, &format!("{} AS status", status_sql()));
        builder.push(" d");
        Ok(builder
            .build_query_as::<StatusCounts>()
            .fetch_one(self.pool())
            .await?)
    }
}

/// The fixed columns of a summary group (after its keys).
#[derive(sqlx::FromRow)]
struct SummaryCountsRow {
    count: i64,
    first_seen: DateTime<Utc>,
    last_seen: DateTime<Utc>,
}

/// A body revision as [`Store::get_dead_letter`] reads it.
#[derive(sqlx::FromRow)]
struct RevisionRow {
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
pub(super) struct DeadLetterRow {
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

impl Store {
    /// The sources among `sources` that no stored dead letter has and that
    /// retention never deleted one of (`retired_sources`), as `(index in
    /// sources, source)` in their order (one index probe each on
    /// `dead_letters_source_id`).
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn unknown_sources(
        &self,
        sources: &[String],
    ) -> Result<Vec<(usize, String)>, StoreError> {
        let rows: Vec<(i64, String)> = sqlx::query_as(
            "SELECT u.n, u.source FROM unnest($1::text[]) WITH ORDINALITY AS u(source, n) \
             WHERE NOT EXISTS (SELECT 1 FROM dead_letters d WHERE d.source = u.source) \
               AND NOT EXISTS (SELECT 1 FROM retired_sources r WHERE r.source = u.source) ORDER BY u.n",
        )
        .bind(sources)
        .fetch_all(self.pool())
        .await?;
        Ok(rows
            .into_iter()
            .map(|(n, source)| (usize::try_from(n - 1).unwrap_or_default(), source))
            .collect())
    }

    /// Up to `limit` distinct sources of stored dead letters, in name order. A
    /// skip scan over `dead_letters_source_id` (one probe per source), so it
    /// costs the same with a hundred or a hundred million dead letters.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn known_sources(&self, limit: usize) -> Result<Vec<String>, StoreError> {
        Ok(sqlx::query_scalar(
            "WITH RECURSIVE s(source) AS ( \
                 (SELECT source FROM dead_letters ORDER BY source LIMIT 1) \
                 UNION ALL \
                 SELECT (SELECT d.source FROM dead_letters d WHERE d.source > s.source ORDER BY d.source LIMIT 1) \
                 FROM s WHERE s.source IS NOT NULL) \
             SELECT source FROM s WHERE source IS NOT NULL LIMIT $1",
        )
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .fetch_all(self.pool())
        .await?)
    }
}
