//! The `dead_letters` table: listing, lookups and summaries, and the
//! selector's SQL. Beside it: `insert` (batch inserts) and `rows` (the rows
//! read and their mapping to the API's messages).

mod insert;

pub use insert::{CaptureIds, TakenIds};
mod rows;

pub(in crate::store) use self::rows::DeadLetterRow;
use self::rows::{RevisionRow, SummaryCountsRow};

use chrono::{DateTime, Utc};
use redrive_proto::v1::{self, BodyCompression};
use sqlx::{AssertSqlSafe, FromRow, Postgres, QueryBuilder, Row};

use super::{Store, StoreError};
use crate::{
    dead_letters::selector::{Selector, Status},
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
            Self::Error => "error_group",
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

/// A PostgreSQL array literal of `values` (NUL replaced by U+FFFD, as
/// [`text`] does), read by a `::text[]`
/// cast: `{"a","b \"c\""}`. Every element is double-quoted, with `"` and
/// `\` escaped by a backslash (PostgreSQL docs, "Arrays", "Array Input and
/// Output Syntax"), so a comma, a brace, white space, an empty string or
/// the word `NULL` reads back as itself. One literal per row binds a list
/// per row in a column of arrays, which PostgreSQL cannot take as a ragged
/// two-dimensional array; the cast costs less than unpacking JSON.
fn text_array_literal(values: &[String]) -> String {
    let mut literal = String::with_capacity(2 + values.iter().map(|v| v.len() + 3).sum::<usize>());
    literal.push('{');
    for (position, value) in values.iter().enumerate() {
        if position > 0 {
            literal.push(',');
        }
        literal.push('"');
        for character in value.chars() {
            match character {
                '"' | '\\' => {
                    literal.push('\\');
                    literal.push(character);
                }
                '\0' => literal.push('\u{fffd}'),
                _ => literal.push(character),
            }
        }
        literal.push('"');
    }
    literal.push('}');
    literal
}

/// Columns read for a dead letter; `body` only when asked.
pub(crate) fn columns(with_body: bool) -> String {
    format!(
        "id, source, origin, captured_at, message_id, message_key, {}, body_size, body_sha256, \
         body_oversized, body_compression, properties, headers, death_reason, death_queue, \
         death_exchange, death_routing_keys, death_count, death_time, reason_class, destination, \
         event_type, schema_version, producer, error_text, attempts, died_at, occurred_at, \
         redrive_plan_id, original_exchange, original_routing_key, capture_notes, body_problem, \
         exchange_only, raw_content_header, error_class, error_group",
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
    let lists: [(&str, &Vec<String>); 6] = [
        ("source", &selector.sources),
        ("destination", &selector.destinations),
        ("event_type", &selector.event_types),
        ("schema_version", &selector.schema_versions),
        ("producer", &selector.producers),
        ("error_group", &selector.error_groups),
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
    // The order decides which dead letters a limit keeps; without a limit
    // the sub-select has none, so that PostgreSQL can pull it up into the
    // query around it (a sorted sub-select is planned on its own, every
    // row sorted first: a summary of 100,000 dead letters took twice as
    // long).
    if let Some(limit) = selector.limit {
        builder
            .push(" ORDER BY id LIMIT ")
            .push_bind(i64::try_from(limit).unwrap_or(i64::MAX));
    }
    builder.push(")");
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
                 error_group, {} AS status",
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
        // The statuses of status_sql(), with the replayed ones found by one
        // join (hashed) instead of a probe per dead letter.
        let mut builder = QueryBuilder::new(
            "SELECT count(*) FILTER (WHERE d.archived_at IS NULL AND s.dead_letter_id IS NULL) AS open, \
             count(*) FILTER (WHERE d.archived_at IS NOT NULL) AS archived, \
             count(*) FILTER (WHERE d.archived_at IS NULL AND s.dead_letter_id IS NOT NULL) AS replayed FROM ",
        );
        push_selected(&mut builder, &every, "id, archived_at");
        builder.push(
            " d LEFT JOIN (SELECT DISTINCT dead_letter_id FROM plan_items WHERE state = 'sent') s \
             ON s.dead_letter_id = d.id",
        );
        Ok(builder
            .build_query_as::<StatusCounts>()
            .fetch_one(self.pool())
            .await?)
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
