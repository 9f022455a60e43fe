//! Batch inserts of dead letters: ingest and import (idempotent per source
//! and dedup key) and capture batches (a redelivery absorbed by its stored
//! copy), in one statement over column arrays.

use chrono::{DateTime, Utc};
use sqlx::Postgres;
use uuid::Uuid;

use super::{InsertOutcome, compression_name, text, text_array_literal};
use crate::{
    dead_letters::{Dedup, NewDeadLetter},
    store::{Store, StoreError},
};

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

/// The ids a capture session took for a batch when it cut it
/// ([`Store::take_capture_ids`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaptureIds {
    /// The capture batch's id (`capture_batches.id`), the same for every
    /// attempt to store the batch.
    pub batch: i64,
    /// One dead letter id per dead letter of the batch, ascending.
    pub rows: Vec<i64>,
}

/// The ids to store a captured batch, or one of its dead letters, under
/// ([`Store::insert_captured_as`]), from [`CaptureIds`].
#[derive(Debug, Clone, Copy)]
pub struct TakenIds<'a> {
    /// The capture batch: recorded by the first attempt that commits, and
    /// found again by a retry.
    pub batch: i64,
    /// One per dead letter stored, ascending.
    pub ids: &'a [i64],
    /// Whether an earlier attempt with these ids may have committed some of
    /// them (the batch is being retried).
    pub retry: bool,
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
        let inserted = insert_rows(&mut transaction, batch, None, None).await?;
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
        self.insert_captured_as(session, source, batch, None).await
    }

    /// [`Self::insert_captured`] with the ids to store `batch` under
    /// ([`TakenIds`]; a redelivery absorbed leaves its id unused); `None`
    /// takes the sequences' next. A session stores a batch beside the one
    /// before it and keeps queue order so. When retrying, what an earlier
    /// attempt committed is found under the same ids (a commit whose reply
    /// was lost, or a one by one fallback cut short): a dead letter it
    /// stored counts as inserted, and the stored copy it absorbed for a
    /// redelivery (recorded on the copy as `absorbed_as`, the redelivery's
    /// taken id) absorbs that redelivery again, so nothing is stored twice
    /// and no copy absorbs two redeliveries.
    ///
    /// # Errors
    /// [`StoreError`]; nothing of the batch is stored then.
    pub async fn insert_captured_as(
        &self,
        session: Uuid,
        source: &str,
        batch: &[NewDeadLetter],
        ids: Option<TakenIds<'_>>,
    ) -> Result<(i64, InsertOutcome), StoreError> {
        // By construction: the writer takes as many ids as it has dead letters.
        debug_assert!(ids.is_none_or(|taken| taken.ids.len() == batch.len()));
        let mut connection = self.pool().acquire().await?;
        let mut transaction = sqlx::Connection::begin(&mut *connection).await?;
        let batch_id: i64 =
            match ids {
                Some(taken) => {
                    sqlx::query(
                        "INSERT INTO capture_batches (id, session, source) OVERRIDING SYSTEM VALUE \
                     VALUES ($3, $1, $2) ON CONFLICT (id) DO NOTHING",
                    )
                    .bind(session)
                    .bind(source)
                    .bind(taken.batch)
                    .execute(&mut *transaction)
                    .await?;
                    taken.batch
                }
                None => sqlx::query_scalar(
                    "INSERT INTO capture_batches (session, source) VALUES ($1, $2) RETURNING id",
                )
                .bind(session)
                .bind(source)
                .fetch_one(&mut *transaction)
                .await?,
            };
        // A retry after a commit whose reply was lost, or after the one by
        // one fallback was cut short, finds those rows under their ids.
        let stored_before: std::collections::HashSet<i64> = match ids {
            Some(TakenIds {
                ids, retry: true, ..
            }) => sqlx::query_scalar(
                "UPDATE dead_letters SET capture_batch = $1 WHERE id = ANY($2) RETURNING id",
            )
            .bind(batch_id)
            .bind(ids)
            .fetch_all(&mut *transaction)
            .await?
            .into_iter()
            .collect(),
            _ => std::collections::HashSet::new(),
        };
        let mut fresh = Vec::with_capacity(batch.len());
        let mut fresh_ids = Vec::with_capacity(batch.len());
        let mut absorbed = 0;
        // Stored by an earlier attempt of this batch: new all the same.
        let mut taken_back = 0;
        for (position, dead_letter) in batch.iter().enumerate() {
            if let Some(taken) = ids
                && stored_before.contains(&taken.ids[position])
            {
                taken_back += 1;
                continue;
            }
            if dead_letter.dedup == Dedup::Fingerprint {
                let taken = ids.map(|taken| taken.ids[position]);
                // On a retry, first the copy an earlier attempt of this batch
                // absorbed for this very dead letter (`absorbed_as`, its
                // taken id), waiting for it if another transaction holds it
                // (a repair, an archive): skipped, another copy would be
                // taken and this one left in the batch, a duplicate.
                if let Some(taken) = taken
                    && ids.is_some_and(|ids| ids.retry)
                {
                    let own: Vec<i64> = sqlx::query_scalar(
                        "UPDATE dead_letters SET capture_batch = $3 \
                         WHERE source = $1 AND capture_fingerprint = $2 AND absorbed_as = $4 \
                         RETURNING id",
                    )
                    .bind(&dead_letter.source)
                    .bind(dead_letter.fingerprint.as_slice())
                    .bind(batch_id)
                    .bind(taken)
                    .fetch_all(&mut *transaction)
                    .await?;
                    if own.len() > 1 {
                        // Only if an earlier attempt was still running when
                        // a later one missed its copy: those copies stay
                        // in this batch, each a dead letter stored twice.
                        tracing::warn!(
                            source,
                            copies = ?own,
                            "one redelivery absorbed by several stored copies"
                        );
                    }
                    if !own.is_empty() {
                        absorbed += 1;
                        continue;
                    }
                }
                // Else a copy in a batch an earlier session committed but
                // never acked, marked with the taken id. A copy absorbed is
                // in this session's batch from then on, so no other
                // redelivery takes it.
                let matched: Option<i64> = sqlx::query_scalar(
                    "UPDATE dead_letters d SET capture_batch = $4, absorbed_as = $5 WHERE d.id = ( \
                        SELECT s.id FROM dead_letters s JOIN capture_batches b ON b.id = s.capture_batch \
                        WHERE s.source = $1 AND s.capture_fingerprint = $2 AND NOT b.acked AND b.session <> $3 \
                        ORDER BY s.id LIMIT 1 FOR UPDATE OF s SKIP LOCKED) \
                     RETURNING d.id",
                )
                .bind(&dead_letter.source)
                .bind(dead_letter.fingerprint.as_slice())
                .bind(session)
                .bind(batch_id)
                .bind(taken)
                .fetch_optional(&mut *transaction)
                .await?;
                if matched.is_some() {
                    absorbed += 1;
                    continue;
                }
            }
            fresh.push(dead_letter.clone());
            if let Some(taken) = ids {
                fresh_ids.push(taken.ids[position]);
            }
        }
        let fresh_ids = ids.map(|_| fresh_ids.as_slice());
        let inserted =
            taken_back + insert_rows(&mut transaction, &fresh, Some(batch_id), fresh_ids).await?;
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

    /// Takes a capture batch id and `count` dead letter ids, ascending, in
    /// one statement: a capture session takes a batch's ids when it cuts it,
    /// in queue order, and may then store it beside the batch before it
    /// ([`Self::insert_captured_as`]); every attempt to store the batch uses
    /// the same ids.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn take_capture_ids(&self, count: usize) -> Result<CaptureIds, StoreError> {
        let (batch, mut rows): (i64, Vec<i64>) = sqlx::query_as(
            "WITH s AS (SELECT pg_get_serial_sequence('capture_batches', 'id')::regclass AS batches, \
                               pg_get_serial_sequence('dead_letters', 'id')::regclass AS rows) \
             SELECT nextval(s.batches), ARRAY(SELECT nextval(s.rows) FROM generate_series(1, $1)) FROM s",
        )
        .bind(i64::try_from(count).unwrap_or(i64::MAX))
        .fetch_one(self.pool())
        .await?;
        rows.sort_unstable();
        Ok(CaptureIds { batch, rows })
    }

    /// Records that the broker acked capture batch `batch_id`.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn mark_capture_acked(&self, batch_id: i64) -> Result<(), StoreError> {
        self.mark_captures_acked(&[batch_id]).await
    }

    /// Records that the broker acked capture batches `batch_ids`, in one
    /// statement.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn mark_captures_acked(&self, batch_ids: &[i64]) -> Result<(), StoreError> {
        sqlx::query("UPDATE capture_batches SET acked = true WHERE id = ANY($1)")
            .bind(batch_ids)
            .execute(self.pool())
            .await?;
        Ok(())
    }
}

/// The statement of [`insert_rows`]: one row per element of the `UNNEST`ed
/// column arrays `$1` to `$42` (`$38`: the capture batch, one for all;
/// `$42`: the ids capture took in queue order, `NULL` for the sequence's
/// next), ingest repeats skipped by `ON CONFLICT`; returns the new ids.
const INSERT_ROWS_SQL: &str = r#"
    INSERT INTO dead_letters (
        id, source, origin, dedup_key, capture_fingerprint, captured_at, message_id,
        message_key, body, body_size, body_sha256, body_oversized, body_problem,
        body_compression, properties, headers, content_type, death_reason, death_queue,
        death_exchange, death_routing_keys, death_count, death_time, reason_class,
        destination, event_type, schema_version, producer, error_text, attempts,
        died_at, occurred_at, redrive_plan_id, original_exchange, original_routing_key,
        capture_notes, first_died_at, capture_batch, exchange_only, raw_content_header,
        error_class)
    OVERRIDING SYSTEM VALUE
    SELECT
        COALESCE(u.id, nextval((SELECT pg_get_serial_sequence('dead_letters', 'id'))::regclass)),
        u.source, u.origin, u.dedup_key, u.fingerprint, u.captured_at, u.message_id,
        u.message_key, u.body, u.body_size, u.body_sha256, u.oversized, u.body_problem,
        u.compression, u.properties, u.headers, u.content_type, u.death_reason,
        u.death_queue, u.death_exchange,
        u.routing_keys::text[],
        u.death_count, u.death_time, u.reason_class, u.destination, u.event_type,
        u.schema_version, u.producer, u.error_text, u.attempts, u.died_at,
        u.occurred_at, u.plan_id, u.original_exchange, u.original_routing_key,
        u.notes::text[], u.first_died_at, $38,
        u.exchange_only, u.raw_content_header, u.error_class
    FROM UNNEST(
        $1::text[], $2::text[], $3::text[], $4::bytea[], $5::timestamptz[], $6::text[],
        $7::text[], $8::bytea[], $9::bigint[], $10::bytea[], $11::bool[], $12::text[],
        $13::text[], $14::bytea[], $15::bytea[], $16::text[], $17::text[], $18::text[],
        $19::text[], $20::text[], $21::bigint[], $22::timestamptz[], $23::text[],
        $24::text[], $25::text[], $26::text[], $27::text[], $28::text[], $29::int[],
        $30::timestamptz[], $31::timestamptz[], $32::text[], $33::text[], $34::text[],
        $35::text[], $36::bool[], $37::timestamptz[], $39::bool[], $40::bytea[],
        $41::text[], $42::bigint[]
    ) AS u(source, origin, dedup_key, fingerprint, captured_at, message_id,
           message_key, body, body_size, body_sha256, oversized, body_problem,
           compression, properties, headers, content_type, death_reason, death_queue,
           death_exchange, routing_keys, death_count, death_time, reason_class,
           destination, event_type, schema_version, producer, error_text, attempts,
           died_at, occurred_at, plan_id, original_exchange, original_routing_key,
           notes, redelivered, first_died_at, exchange_only, raw_content_header,
           error_class, id)
    ON CONFLICT (source, dedup_key) WHERE dedup_key IS NOT NULL DO NOTHING
    RETURNING id
    "#;

/// [`INSERT_ROWS_SQL`] while its columns are bound, in parameter order.
type InsertRows<'q> =
    sqlx::query::QueryScalar<'q, Postgres, i64, <Postgres as sqlx::Database>::Arguments>;

/// Inserts `batch` in `transaction` (capture rows with `capture_batch`);
/// returns how many rows were inserted (ingest repeats are skipped).
async fn insert_rows(
    transaction: &mut sqlx::Transaction<'_, Postgres>,
    batch: &[NewDeadLetter],
    capture_batch: Option<i64>,
    ids: Option<&[i64]>,
) -> Result<u64, StoreError> {
    if batch.is_empty() {
        return Ok(0);
    }
    let query = sqlx::query_scalar(INSERT_ROWS_SQL);
    let query = bind_identity(query, batch);
    let query = bind_body(query, batch);
    let query = bind_death(query, batch);
    let query = bind_event(query, batch);
    let query = bind_origin(query, batch, capture_batch);
    let query = query.bind(match ids {
        Some(ids) => ids.iter().copied().map(Some).collect::<Vec<Option<i64>>>(),
        None => vec![None; batch.len()],
    });
    let inserted: Vec<i64> = query.fetch_all(&mut **transaction).await?;
    Ok(inserted.len() as u64)
}

/// A text column of `batch`: `f` of each dead letter, passed through
/// [`text`] (PostgreSQL text cannot hold NUL: every derived string does).
fn text_column(
    batch: &[NewDeadLetter],
    f: impl Fn(&NewDeadLetter) -> Option<String>,
) -> Vec<Option<String>> {
    batch.iter().map(|d| f(d).map(text)).collect()
}

/// Binds `$1` to `$7`, what identifies a dead letter: source, origin, dedup
/// key, capture fingerprint, capture time, message id, message key.
fn bind_identity<'q>(query: InsertRows<'q>, batch: &'q [NewDeadLetter]) -> InsertRows<'q> {
    query
        .bind(text_column(batch, |d| Some(d.source.clone())))
        .bind(text_column(batch, |d| Some(d.origin.name().to_owned())))
        .bind(text_column(batch, |d| match &d.dedup {
            Dedup::Key(key) => Some(key.clone()),
            Dedup::None | Dedup::Fingerprint => None,
        }))
        .bind(
            batch
                .iter()
                .map(|d| d.fingerprint.to_vec())
                .collect::<Vec<Vec<u8>>>(),
        )
        .bind(
            batch
                .iter()
                .map(|d| d.captured_at)
                .collect::<Vec<DateTime<Utc>>>(),
        )
        .bind(text_column(batch, |d| d.message_id.clone()))
        .bind(text_column(batch, |d| Some(d.message_key.clone())))
}

/// Binds `$8` to `$16`, the message: body, its size, hash, oversize,
/// problem and compression, the encoded properties and headers, the
/// content type.
fn bind_body<'q>(query: InsertRows<'q>, batch: &'q [NewDeadLetter]) -> InsertRows<'q> {
    query
        .bind(
            batch
                .iter()
                .map(|d| d.body.as_slice())
                .collect::<Vec<&[u8]>>(),
        )
        .bind(
            batch
                .iter()
                .map(|d| d.body.len() as i64)
                .collect::<Vec<i64>>(),
        )
        .bind(
            batch
                .iter()
                .map(|d| d.body_sha256.to_vec())
                .collect::<Vec<Vec<u8>>>(),
        )
        .bind(
            batch
                .iter()
                .map(|d| d.body_oversized)
                .collect::<Vec<bool>>(),
        )
        .bind(text_column(batch, |d| d.body_problem.clone()))
        .bind(text_column(batch, |d| {
            Some(compression_name(d.body_compression).to_owned())
        }))
        .bind(
            batch
                .iter()
                .map(|d| d.properties.as_slice())
                .collect::<Vec<&[u8]>>(),
        )
        .bind(
            batch
                .iter()
                .map(|d| d.headers.as_slice())
                .collect::<Vec<&[u8]>>(),
        )
        .bind(text_column(batch, |d| d.content_type.clone()))
}

/// Binds `$17` to `$23`, the death that counts: reason, queue, exchange,
/// routing keys (an array literal), count, time, and the reason class.
fn bind_death<'q>(query: InsertRows<'q>, batch: &'q [NewDeadLetter]) -> InsertRows<'q> {
    query
        .bind(text_column(batch, |d| {
            d.death.as_ref().map(|x| x.reason.clone())
        }))
        .bind(text_column(batch, |d| {
            d.death.as_ref().map(|x| x.queue.clone())
        }))
        .bind(text_column(batch, |d| {
            d.death.as_ref().map(|x| x.exchange.clone())
        }))
        .bind(text_column(batch, |d| {
            d.death
                .as_ref()
                .map(|x| text_array_literal(&x.routing_keys))
        }))
        .bind(
            batch
                .iter()
                .map(|d| {
                    d.death
                        .as_ref()
                        .map(|x| i64::try_from(x.count).unwrap_or(i64::MAX))
                })
                .collect::<Vec<Option<i64>>>(),
        )
        .bind(
            batch
                .iter()
                .map(|d| d.death.as_ref().and_then(|x| x.time))
                .collect::<Vec<Option<DateTime<Utc>>>>(),
        )
        .bind(text_column(batch, |d| {
            Some(d.reason_class.name().to_owned())
        }))
}

/// Binds `$24` to `$31`, what was derived of the event: destination, event
/// type, schema version, producer, error text, attempts, when it died and
/// when it occurred.
fn bind_event<'q>(query: InsertRows<'q>, batch: &'q [NewDeadLetter]) -> InsertRows<'q> {
    query
        .bind(text_column(batch, |d| Some(d.destination.clone())))
        .bind(text_column(batch, |d| d.event_type.clone()))
        .bind(text_column(batch, |d| d.schema_version.clone()))
        .bind(text_column(batch, |d| d.producer.clone()))
        .bind(text_column(batch, |d| d.error_text.clone()))
        .bind(
            batch
                .iter()
                .map(|d| d.attempts.and_then(|a| i32::try_from(a).ok()))
                .collect::<Vec<Option<i32>>>(),
        )
        .bind(
            batch
                .iter()
                .map(|d| d.died_at)
                .collect::<Vec<DateTime<Utc>>>(),
        )
        .bind(
            batch
                .iter()
                .map(|d| d.occurred_at)
                .collect::<Vec<Option<DateTime<Utc>>>>(),
        )
}

/// Binds `$32` to `$41`, where it came from and how it was read: the
/// replaying plan's id, the framework's original exchange and routing key,
/// the capture notes, whether it was redelivered, the first death,
/// `capture_batch`, exchange-only, the raw content header and the error
/// class.
fn bind_origin<'q>(
    query: InsertRows<'q>,
    batch: &'q [NewDeadLetter],
    capture_batch: Option<i64>,
) -> InsertRows<'q> {
    query
        .bind(text_column(batch, |d| d.redrive_plan_id.clone()))
        .bind(text_column(batch, |d| d.original_exchange.clone()))
        .bind(text_column(batch, |d| d.original_routing_key.clone()))
        .bind(text_column(batch, |d| {
            Some(text_array_literal(&d.capture_notes))
        }))
        .bind(
            batch
                .iter()
                .map(|d| d.dedup == Dedup::Fingerprint)
                .collect::<Vec<bool>>(),
        )
        .bind(
            batch
                .iter()
                .map(|d| d.first_died_at)
                .collect::<Vec<DateTime<Utc>>>(),
        )
        .bind(capture_batch)
        .bind(batch.iter().map(|d| d.exchange_only).collect::<Vec<bool>>())
        .bind(
            batch
                .iter()
                .map(|d| d.raw_content_header.clone())
                .collect::<Vec<Option<Vec<u8>>>>(),
        )
        .bind(text_column(batch, |d| d.error_class.clone()))
}
