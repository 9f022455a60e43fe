//! Prechecks: the candidate stream (with the SQL-side facts: key rank, earlier
//! replays, re-dead-letters), item writes through `COPY`, reports and paging.

use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::{StreamExt, stream::BoxStream};
use prost::Message;
use redrive_proto::v1;
use sqlx::{
    AssertSqlSafe, Postgres, QueryBuilder,
    pool::PoolConnection,
    postgres::{PgCopyIn, PgPoolCopyExt},
};
use tokio::sync::{mpsc, oneshot};

use super::{Store, StoreError, dead_letters::push_selected, webhooks::enqueue_precheck_event};
use crate::{
    dead_letters::selector::Selector,
    ids::{DeadLetterId, PlanId, PrecheckId},
    webhooks::precheck_data,
};

/// A selected dead letter with what PostgreSQL knows about it.
#[derive(Debug, Clone)]
pub struct Candidate {
    /// Dead letter id.
    pub id: DeadLetterId,
    /// Message key.
    pub message_key: String,
    /// Source (DLQ name or import label).
    pub source: String,
    /// Default destination ("" when none).
    pub destination: String,
    /// Over the body limit.
    pub body_oversized: bool,
    /// Why the body cannot be replayed as it is.
    pub body_problem: Option<String>,
    /// Event type.
    pub event_type: Option<String>,
    /// Schema version.
    pub schema_version: Option<String>,
    /// Producer.
    pub producer: Option<String>,
    /// Reason class name.
    pub reason_class: String,
    /// The error fingerprint (`error_group`).
    pub error_group: String,
    /// Original event time (`timestamp` property or ingest field).
    pub occurred_at: Option<DateTime<Utc>>,
    /// When it first died.
    pub first_died_at: DateTime<Utc>,
    /// When it died (the death that counts).
    pub died_at: DateTime<Utc>,
    /// The earliest valid dead letter of the selection with the same key and
    /// destination, when that is not this one (docs/design.md, "Words": identity).
    pub duplicate_of: Option<DeadLetterId>,
    /// The latest successful replay of this key to this destination within the
    /// window: (plan, when).
    pub replayed: Option<(PlanId, DateTime<Utc>)>,
    /// Whether that replay was confirmed (`false`: its outcome is uncertain,
    /// so the key may have been delivered).
    pub replayed_certain: bool,
    /// Replays of this key that came back as re-dead-letters in this
    /// destination.
    pub redrives: i64,
    /// Body, properties and headers (prost-encoded), when asked for.
    pub payload: Option<(Vec<u8>, Vec<u8>, Vec<u8>)>,
    /// It knows only the exchange and routing key it was published with,
    /// not its queue (`exchange_only`).
    pub exchange_only: bool,
    /// It is `exchange_only` and knows no exchange either (only a routing
    /// key).
    pub without_exchange: bool,
}

/// The replay ledger's one exception, for an audit event aliased `e` (a
/// `sent` or `uncertain` row): its delivery does not count when every copy
/// its plan may have delivered of that key to that destination came back as
/// a re-dead-letter of that plan, that is when the plan's re-dead-letters of
/// the key are at least as many as its `sent` and `uncertain` events for it
/// (docs/design.md, "identity": the ledger is final); a re-dead-letter
/// re-keyed since counts under its former keys too. One copy that came back
/// of two that may have arrived reopens nothing. Used by the precheck's
/// already-replayed lookup and by the claim's replay-key check.
pub const CAME_BACK_SQL: &str = "((SELECT count(*) FROM dead_letters x \
    WHERE (x.message_key = e.message_key OR x.previous_message_keys @> ARRAY[e.message_key]) \
    AND x.destination = e.destination \
    AND x.redrive_plan_id = e.plan_id::text) >= (SELECT count(*) FROM audit_events c \
    WHERE c.message_key = e.message_key AND c.destination = e.destination \
    AND c.plan_id = e.plan_id AND c.action IN ('sent', 'uncertain')))";

/// How long the candidate stream's transaction stays open after its last
/// row for its snapshot to be imported ([`SelectionSnapshot`]).
const SNAPSHOT_IMPORT_WAIT: Duration = Duration::from_secs(60);

/// Candidates read ahead of classification.
const CANDIDATE_BUFFER: usize = 2048;

/// The precheck's SQL condition for `invalid` (computed in PostgreSQL so that
/// duplicates are ranked among valid dead letters only).
const INVALID_SQL: &str = "(destination = '' OR body_oversized OR body_problem IS NOT NULL)";

/// The columns of a candidate that decide whether it is invalid
/// ([`INVALID_SQL`]) and its duplicate key. A repaired dead letter is
/// prechecked with its latest revision, which `RepairDeadLetter` validated
/// against the body limit and content type. A problem of the message rather
/// than its body stays: a message the AMQP client could not read (its exact
/// form is in the parking queue) and a `user_id` the broker would refuse
/// (dead_letter.rs starts that text with `user_id `).
const CANDIDATE_CHECKED_COLUMNS: &str = "id, message_key, destination, \
    body_oversized AND body_revision IS NULL AS body_oversized, \
    CASE WHEN body_revision IS NULL OR reason_class = 'unreadable' OR body_problem LIKE 'user_id %' \
         THEN body_problem END AS body_problem";

/// The candidate stream of a precheck ([`Store::stream_candidates`]).
pub struct Candidates {
    /// The selected dead letters in id order; an error ends it. A stream
    /// whose reading task ended without finishing (a panic) ends with
    /// [`StoreError::Interrupted`], never as if the selection were complete.
    pub rows: BoxStream<'static, Result<Candidate, StoreError>>,
    /// The snapshot the rows are read in, once the stream's transaction has
    /// exported it; dropped without a value when the stream failed first.
    pub snapshot: oneshot::Receiver<SelectionSnapshot>,
}

/// The snapshot a precheck's candidates are read in, exported by the
/// stream's transaction (`pg_export_snapshot()`, PostgreSQL docs,
/// "Snapshot Synchronization Functions"). A transaction that imports it
/// (`SET TRANSACTION SNAPSHOT`) sees exactly the dead letters the stream
/// sees, so a second read of the selection beside the stream, on another
/// connection and core, reads the same selection. A snapshot can be
/// imported only while its exporting transaction is open: the stream's
/// transaction stays open after its last row until this is dropped.
#[derive(Debug)]
pub struct SelectionSnapshot {
    /// The id `pg_export_snapshot()` returned (hex digits and dashes).
    id: String,
    /// Dropped once imported (or not wanted): the stream's transaction may end.
    _exporter: oneshot::Sender<()>,
}

/// Whether `id` has the form of a snapshot id (`0000000A-0000001B-1`): it
/// is written into `SET TRANSACTION SNAPSHOT`, which takes no parameters.
fn is_snapshot_id(id: &str) -> bool {
    !id.is_empty() && id.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-')
}

impl Store {
    /// The selected dead letters in id order, streamed through a bounded channel
    /// (PostgreSQL ranks keys and joins replays and re-dead-letters; the planner
    /// holds at most the channel's capacity), read in one `REPEATABLE READ`
    /// transaction whose snapshot is exported ([`SelectionSnapshot`]).
    ///
    /// JIT compilation is off for it: PostgreSQL estimates the per-candidate
    /// lookups of the audit high enough to compile the whole plan, which took
    /// 1.2 s at 100,000 dead letters and 2.6 s at 1,000,000 before the first
    /// candidate, and the rows do not need it (docs/benchmarks.md, "The
    /// precheck's snapshot, its JIT and its closing reads").
    pub fn stream_candidates(
        &self,
        selector: &Selector,
        replay_key_window: Duration,
        with_payload: bool,
    ) -> Candidates {
        let mut builder = QueryBuilder::<Postgres>::new(format!(
            "SELECT d.id, d.message_key, d.source, d.destination, d.body_oversized, d.body_problem, d.event_type, \
             d.schema_version, d.producer, d.reason_class, d.error_group, d.occurred_at, d.first_died_at, d.died_at, \
             d.exchange_only, d.exchange_only AND d.original_exchange IS NULL AS without_exchange, \
             f.first_id, \
             r.plan_id AS replayed_plan, r.replayed_at, coalesce(r.certain, true) AS replayed_certain, coalesce(l.redrives, 0) AS redrives, {} \
             FROM ",
            if with_payload {
                "d.body, d.properties, d.headers"
            } else {
                "NULL::bytea AS body, NULL::bytea AS properties, NULL::bytea AS headers"
            }
        ));
        push_selected(
            &mut builder,
            selector,
            &format!(
                "{CANDIDATE_CHECKED_COLUMNS}, previous_message_keys, source, event_type, schema_version, \
                 producer, reason_class, error_group, occurred_at, first_died_at, died_at, \
                 exchange_only, original_exchange, \
                 CASE WHEN body_revision IS NULL THEN body ELSE (SELECT v.body FROM dead_letter_revisions v \
                     WHERE v.dead_letter_id = dead_letters.id AND v.revision = dead_letters.body_revision) END AS body, \
                 properties, headers"
            ),
        );
        // The first dead letter of each key and destination (the duplicate
        // check) is ranked over narrow rows, the same selection without its
        // bodies, and joined back by id: ranking the wide rows sorted every
        // body (at 1,000,000 dead letters, 1.3 GB of sort files and the first
        // candidate after 6.3 s, against 50 MB and 3.3 s).
        builder.push(format!(
            " d JOIN (SELECT k.id, CASE WHEN {INVALID_SQL} THEN NULL ELSE first_value(k.id) OVER \
             (PARTITION BY {INVALID_SQL}, k.message_key, k.destination ORDER BY k.id) END AS first_id FROM "
        ));
        push_selected(&mut builder, selector, CANDIDATE_CHECKED_COLUMNS);
        builder
            .push(" k) f ON f.id = d.id")
            .push(
                // The key's latest delivery within the window, a confirmed one
                // first, looked up per candidate in `audit_events_replayed`:
                // the cost follows the selection, not the audit's history.
                " LEFT JOIN LATERAL (SELECT e.plan_id, e.at AS replayed_at, e.action = 'sent' AS certain \
                 FROM audit_events e WHERE e.message_key = ANY(d.previous_message_keys || d.message_key) \
                 AND e.destination = d.destination \
                 AND e.action IN ('sent', 'uncertain') AND e.at > now() - ",
            )
            .push_bind(i64::try_from(replay_key_window.as_secs()).unwrap_or(i64::MAX))
            .push(
                // A replay that came back as a re-dead-letter (its consumer did not
                // take it) does not make the key already replayed; looping caps it.
                // Only when every copy that plan may have delivered came back,
                // though: with a second copy out (an uncertain attempt and its
                // republish), one copy dead-lettered again says nothing of the
                // other, and the ledger's delivery stands (`CAME_BACK_SQL`).
                " * interval '1 second' AND NOT ",
            )
            .push(CAME_BACK_SQL)
            .push(
                " \
                 ORDER BY e.action = 'sent' DESC, e.at DESC LIMIT 1) r ON true \
                 LEFT JOIN (SELECT message_key, destination, count(DISTINCT redrive_plan_id) AS redrives FROM dead_letters \
                 WHERE redrive_plan_id IS NOT NULL GROUP BY message_key, destination) l \
                 ON l.message_key = d.message_key AND l.destination = d.destination \
                 ORDER BY d.id",
            );
        let (sender, receiver) = mpsc::channel(CANDIDATE_BUFFER);
        let (snapshot_sender, snapshot) = oneshot::channel();
        let (finished, finished_signal) = oneshot::channel::<()>();
        let pool = self.pool().clone();
        tokio::spawn(async move {
            let exported = async {
                let mut transaction = pool
                    .begin_with("BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                    .await?;
                sqlx::query("SET LOCAL jit = off")
                    .execute(&mut *transaction)
                    .await?;
                let id: String = sqlx::query_scalar("SELECT pg_export_snapshot()")
                    .fetch_one(&mut *transaction)
                    .await?;
                Ok::<_, StoreError>((transaction, id))
            };
            let (mut transaction, id) = match exported.await {
                Ok(exported) => exported,
                Err(error) => {
                    let _ = sender.send(Err(error)).await;
                    let _ = finished.send(());
                    return;
                }
            };
            let (exporter, imported) = oneshot::channel::<()>();
            // Not wanted: the snapshot comes back and is dropped here.
            let _ = snapshot_sender.send(SelectionSnapshot {
                id,
                _exporter: exporter,
            });
            {
                let mut rows = builder
                    .build_query_as::<CandidateRow>()
                    .fetch(&mut *transaction);
                while let Some(row) = rows.next().await {
                    let candidate = row.map(Candidate::from).map_err(StoreError::from);
                    if sender.send(candidate).await.is_err() {
                        break;
                    }
                }
            }
            // The stream ends with its last row; its transaction once the
            // snapshot was imported or dropped, or after a minute in any
            // case: an open transaction holds a connection and PostgreSQL's
            // vacuum horizon.
            let _ = finished.send(());
            drop(sender);
            let _ = tokio::time::timeout(SNAPSHOT_IMPORT_WAIT, imported).await;
            let _ = transaction.rollback().await;
        });
        Candidates {
            rows: crate::task_stream::until_finished(receiver, finished_signal, || {
                StoreError::Interrupted(
                    "the candidate stream's reading task ended before its last row".to_owned(),
                )
            }),
            snapshot,
        }
    }

    /// Starts a precheck record.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn create_precheck(&self, id: PrecheckId, actor: &str) -> Result<(), StoreError> {
        sqlx::query("INSERT INTO prechecks (id, actor, state) VALUES ($1, $2, 'running')")
            .bind(id)
            .bind(actor)
            .execute(self.pool())
            .await?;
        Ok(())
    }

    /// A connection in `COPY precheck_items FROM STDIN` (text format).
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn copy_precheck_items(
        &self,
    ) -> Result<PgCopyIn<PoolConnection<Postgres>>, StoreError> {
        Ok(self
            .pool()
            .copy_in_raw(
                "COPY precheck_items (precheck_id, dead_letter_id, verdict, stale_at, reason) FROM STDIN",
            )
            .await?)
    }

    /// Records the finished report and its `precheck.finished` event.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn finish_precheck(&self, report: &v1::PrecheckReport) -> Result<(), StoreError> {
        let id = uuid::Uuid::parse_str(&report.precheck_id)
            .map(PrecheckId::new)
            .map_err(|e| StoreError::Corrupt(e.to_string()))?;
        let mut transaction = self.pool().begin().await?;
        sqlx::query("UPDATE prechecks SET state = 'done', digest = $2, report = $3 WHERE id = $1")
            .bind(id)
            .bind(&report.digest)
            .bind(report.encode_to_vec())
            .execute(&mut *transaction)
            .await?;
        let data = precheck_data(&report.precheck_id, &report.actor, Ok(report));
        enqueue_precheck_event(&mut transaction, self.effects().planner_webhook, &data).await?;
        transaction.commit().await?;
        Ok(())
    }

    /// Marks a precheck failed with `error`, removes its items and writes
    /// its `precheck.finished` event, in one transaction.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn fail_precheck(&self, id: PrecheckId, error: &str) -> Result<(), StoreError> {
        let mut transaction = self.pool().begin().await?;
        sqlx::query("DELETE FROM precheck_items WHERE precheck_id = $1")
            .bind(id)
            .execute(&mut *transaction)
            .await?;
        let actor: Option<String> = sqlx::query_scalar(
            "UPDATE prechecks SET state = 'failed', error = $2 WHERE id = $1 RETURNING actor",
        )
        .bind(id)
        .bind(error)
        .fetch_optional(&mut *transaction)
        .await?;
        let data = precheck_data(&id.to_string(), &actor.unwrap_or_default(), Err(error));
        enqueue_precheck_event(&mut transaction, self.effects().planner_webhook, &data).await?;
        transaction.commit().await?;
        Ok(())
    }

    /// The stored precheck: `Ok(None)` if unknown, else its state and report.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn get_precheck(&self, id: PrecheckId) -> Result<Option<PrecheckRecord>, StoreError> {
        let row = sqlx::query_as::<_, PrecheckRow>(
            "SELECT state, error, report FROM prechecks WHERE id = $1",
        )
        .bind(id)
        .fetch_optional(self.pool())
        .await?;
        row.map(PrecheckRecord::try_from).transpose()
    }

    /// One page of a precheck's items by dead letter id, optionally of one
    /// verdict. With `plan_id`, that plan's items whose send-time outcome is the
    /// verdict's action (`needs_compensation`) are included too, marked
    /// `at_send` with the reason of their audit event. An item whose dead
    /// letter retention deleted has an empty message key and destination.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn list_precheck_items(
        &self,
        id: PrecheckId,
        verdict: Option<&str>,
        after_id: i64,
        page_size: u32,
        plan_id: Option<PlanId>,
    ) -> Result<Vec<v1::PrecheckItem>, StoreError> {
        let rows = sqlx::query_as::<_, PrecheckItemRow>(
            "SELECT c.dead_letter_id, c.verdict, c.reason, c.at_send, coalesce(d.message_key, '') AS message_key, \
                    coalesce(d.destination, '') AS destination, d.event_type, \
                    coalesce(d.message_id, '') AS message_id \
             FROM (SELECT dead_letter_id, verdict, reason, false AS at_send FROM precheck_items \
                   WHERE precheck_id = $1 AND ($2::text IS NULL OR verdict = $2) AND dead_letter_id > $3 \
                   UNION ALL \
                   SELECT i.dead_letter_id, i.state, coalesce((SELECT e.reason FROM audit_events e \
                       WHERE e.plan_id = i.plan_id AND e.dead_letter_id = i.dead_letter_id AND e.action = i.state \
                       ORDER BY e.id DESC LIMIT 1), ''), true FROM plan_items i \
                   WHERE i.plan_id = $5 AND i.state = $2 AND i.dead_letter_id > $3) c \
             LEFT JOIN dead_letters d ON d.id = c.dead_letter_id \
             ORDER BY c.dead_letter_id LIMIT $4",
        )
        .bind(id)
        .bind(verdict)
        .bind(after_id)
        .bind(i64::from(page_size))
        .bind(plan_id)
        .fetch_all(self.pool())
        .await?;
        Ok(rows.into_iter().map(v1::PrecheckItem::from).collect())
    }
}

/// Which kind of near-duplicate [`Store::near_duplicates`] looks for
/// (docs/replay.md, "Identity": near-duplicates).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NearDuplicateKind {
    /// One message id, bound for one destination, on dead letters with
    /// different bodies (retries of one order with changed bodies, or
    /// different messages that reuse an id).
    SameIdOtherBodies,
    /// One body, bound for one destination, under different message ids
    /// (different commands with the same content, or one message sent again
    /// under fresh ids).
    SameBodyOtherIds,
}

/// Groups of near-duplicates listed as examples, the largest first.
pub const NEAR_DUPLICATE_GROUPS: i64 = 3;
/// Dead letter ids listed per example group, the lowest first.
pub const NEAR_DUPLICATE_IDS: i64 = 4;

/// One group of near-duplicates in a precheck's selection.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct NearDuplicateGroup {
    /// What they share: the message id, or the body's SHA-256 in lowercase
    /// hex (the body as captured).
    pub shared: String,
    /// The destination they are bound for.
    pub destination: String,
    /// How many dead letters of the selection are in the group.
    pub dead_letters: i64,
    /// The lowest of their ids, at most [`NEAR_DUPLICATE_IDS`].
    pub ids: Vec<DeadLetterId>,
    /// How many different bodies (same id) or message ids (same body).
    pub variants: i64,
    /// The first of their message ids in text order, at most three.
    pub message_ids: Vec<String>,
    /// How many different message keys they have: one means all but the
    /// earliest are `duplicate` (or share its replay record).
    pub keys: i64,
}

/// The near-duplicates of one kind in a precheck's selection.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NearDuplicates {
    /// How many groups there are.
    pub groups: i64,
    /// How many dead letters are in them.
    pub dead_letters: i64,
    /// The largest groups, at most [`NEAR_DUPLICATE_GROUPS`].
    pub examples: Vec<NearDuplicateGroup>,
}

/// A row of [`Store::near_duplicates`]: a group and the totals.
#[derive(sqlx::FromRow)]
struct NearDuplicateRow {
    #[sqlx(flatten)]
    group: NearDuplicateGroup,
    groups: i64,
    flagged: i64,
}

/// The part of [`Store::near_duplicates`]' query before the selection;
/// `{shared}` and `{other}` are the column expressions of what a group
/// shares and what differs in it. Groups are found with `min <> max` (a
/// hash aggregate, one pass over a narrow projection of the selection,
/// compared byte-wise with `COLLATE "C"`); only the listed groups' dead
/// letters are read again for their details ([`NEAR_DUPLICATES_AFTER_SQL`]).
const NEAR_DUPLICATES_BEFORE_SQL: &str = "\
    WITH sel AS (SELECT d.id, {shared} COLLATE \"C\" AS shared, {other} COLLATE \"C\" AS other, \
                        d.destination \
                 FROM ";

/// The rest of [`Store::near_duplicates`]' query, after the selection
/// (aliased `d`).
const NEAR_DUPLICATES_AFTER_SQL: &str = " d WHERE d.message_id <> ''), \
    grouped AS (SELECT shared, destination, count(*) AS dead_letters, min(id) AS first FROM sel \
                GROUP BY shared, destination HAVING min(other) <> max(other)), \
    top AS (SELECT shared, destination, dead_letters, first, count(*) OVER () AS groups, \
                   (sum(dead_letters) OVER ())::bigint AS flagged \
            FROM grouped ORDER BY dead_letters DESC, first LIMIT {groups}) \
    SELECT t.shared, t.destination, t.dead_letters, t.groups, t.flagged, \
           (array_agg(s.id ORDER BY s.id))[1:{ids}] AS ids, \
           count(DISTINCT s.other) AS variants, \
           (array_agg(DISTINCT d.message_id))[1:3] AS message_ids, \
           count(DISTINCT d.message_key) AS keys \
    FROM top t JOIN sel s ON s.shared = t.shared AND s.destination = t.destination \
    JOIN dead_letters d ON d.id = s.id \
    GROUP BY t.shared, t.destination, t.dead_letters, t.first, t.groups, t.flagged \
    ORDER BY t.dead_letters DESC, t.first";

/// The near-duplicates of both kinds in one selection.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NearDuplicatesOfBoth {
    /// [`NearDuplicateKind::SameIdOtherBodies`].
    pub same_id: NearDuplicates,
    /// [`NearDuplicateKind::SameBodyOtherIds`].
    pub same_body: NearDuplicates,
}

impl Store {
    /// The near-duplicates of both kinds among the dead letters `selector`
    /// selects in `snapshot` (a precheck's candidates, every verdict): dead
    /// letters bound for one destination that share a message id but not a
    /// body, or a body (as captured) but not a message id. Dead letters
    /// without a message id are left out (their key is their body hash or a
    /// key rule's). Read beside the candidate stream, in its snapshot, on a
    /// connection of their own: at 1,000,000 dead letters, read after the
    /// stream from the precheck's items, they took 7 s at the end of the
    /// precheck. Bounded: one aggregate over the selection per kind, then
    /// [`NEAR_DUPLICATE_GROUPS`] groups read for their ids.
    ///
    /// # Errors
    /// [`StoreError`]; `Corrupt` when the snapshot's id is not one.
    pub async fn near_duplicates(
        &self,
        snapshot: SelectionSnapshot,
        selector: &Selector,
    ) -> Result<NearDuplicatesOfBoth, StoreError> {
        if !is_snapshot_id(&snapshot.id) {
            return Err(StoreError::Corrupt(format!(
                "pg_export_snapshot() returned {:?}",
                snapshot.id
            )));
        }
        let mut transaction = self
            .pool()
            .begin_with("BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            .await?;
        // A new text per snapshot: not kept as a prepared statement.
        sqlx::query(AssertSqlSafe(format!(
            "SET TRANSACTION SNAPSHOT '{}'",
            snapshot.id
        )))
        .persistent(false)
        .execute(&mut *transaction)
        .await?;
        // Imported: the stream's transaction may end.
        drop(snapshot);
        // As for the stream: the estimate of a million-row aggregate is above
        // the JIT's threshold, and compiling took longer than it saved.
        sqlx::query("SET LOCAL jit = off")
            .execute(&mut *transaction)
            .await?;
        let both = NearDuplicatesOfBoth {
            same_id: near_duplicates_of(
                &mut transaction,
                selector,
                NearDuplicateKind::SameIdOtherBodies,
            )
            .await?,
            same_body: near_duplicates_of(
                &mut transaction,
                selector,
                NearDuplicateKind::SameBodyOtherIds,
            )
            .await?,
        };
        // Read only: whatever ends it, nothing is lost.
        let _ = transaction.rollback().await;
        Ok(both)
    }
}

/// The near-duplicates of `kind` among the dead letters `selector` selects,
/// read on `connection` (in the stream's snapshot).
async fn near_duplicates_of(
    connection: &mut sqlx::PgConnection,
    selector: &Selector,
    kind: NearDuplicateKind,
) -> Result<NearDuplicates, StoreError> {
    let (shared, other) = match kind {
        // Text on both sides: PostgreSQL has no min/max over bytea.
        NearDuplicateKind::SameIdOtherBodies => ("d.message_id", "encode(d.body_sha256, 'hex')"),
        NearDuplicateKind::SameBodyOtherIds => ("encode(d.body_sha256, 'hex')", "d.message_id"),
    };
    let mut builder = QueryBuilder::<Postgres>::new(
        NEAR_DUPLICATES_BEFORE_SQL
            .replace("{shared}", shared)
            .replace("{other}", other),
    );
    push_selected(
        &mut builder,
        selector,
        "id, message_id, body_sha256, destination",
    );
    builder.push(
        NEAR_DUPLICATES_AFTER_SQL
            .replace("{groups}", &NEAR_DUPLICATE_GROUPS.to_string())
            .replace("{ids}", &NEAR_DUPLICATE_IDS.to_string()),
    );
    let rows = builder
        .build_query_as::<NearDuplicateRow>()
        .fetch_all(connection)
        .await?;
    Ok(NearDuplicates {
        groups: rows.first().map_or(0, |row| row.groups),
        dead_letters: rows.first().map_or(0, |row| row.flagged),
        examples: rows.into_iter().map(|row| row.group).collect(),
    })
}

/// A precheck item as [`Store::list_precheck_items`] reads it.
#[derive(sqlx::FromRow)]
struct PrecheckItemRow {
    dead_letter_id: DeadLetterId,
    message_key: String,
    verdict: String,
    reason: String,
    destination: String,
    event_type: Option<String>,
    at_send: bool,
    message_id: String,
}

impl From<PrecheckItemRow> for v1::PrecheckItem {
    fn from(row: PrecheckItemRow) -> Self {
        Self {
            dead_letter_id: row.dead_letter_id.to_string(),
            message_key: row.message_key,
            verdict: verdict_from_name(&row.verdict).into(),
            reason: row.reason,
            destination: row.destination,
            event_type: row.event_type,
            at_send: row.at_send,
            message_id: row.message_id,
        }
    }
}

/// A precheck as [`Store::get_precheck`] reads it.
#[derive(sqlx::FromRow)]
struct PrecheckRow {
    state: String,
    error: Option<String>,
    report: Option<Vec<u8>>,
}

impl TryFrom<PrecheckRow> for PrecheckRecord {
    type Error = StoreError;

    /// # Errors
    /// [`StoreError::Corrupt`] when a done precheck's report does not decode.
    fn try_from(row: PrecheckRow) -> Result<Self, StoreError> {
        Ok(match (row.state.as_str(), row.report) {
            ("done", Some(report)) => Self::Done(Box::new(
                v1::PrecheckReport::decode(report.as_slice())
                    .map_err(|e| StoreError::Corrupt(e.to_string()))?,
            )),
            ("failed", _) => Self::Failed(row.error.unwrap_or_default()),
            _ => Self::Running,
        })
    }
}

/// A precheck as stored.
#[derive(Debug, Clone)]
pub enum PrecheckRecord {
    /// Still running (or its planner died while running it).
    Running,
    /// Failed, with the error.
    Failed(String),
    /// Done, with its report.
    Done(Box<v1::PrecheckReport>),
}

/// The verdict named `name` (`replayable`, ...).
pub fn verdict_from_name(name: &str) -> v1::Verdict {
    use v1::Verdict as V;
    [
        V::Replayable,
        V::Duplicate,
        V::AlreadyReplayed,
        V::Looping,
        V::Stale,
        V::BlockedByState,
        V::NeedsCompensation,
        V::Invalid,
    ]
    .into_iter()
    .find(|verdict| verdict.name() == name)
    .unwrap_or(V::Unspecified)
}

/// Appends one item row in `COPY` text format (tab-separated; backslash, tab,
/// newline and carriage return escaped, PostgreSQL docs "COPY", Text Format).
pub fn copy_line(
    buffer: &mut Vec<u8>,
    precheck_id: PrecheckId,
    dead_letter_id: DeadLetterId,
    verdict: &str,
    stale_at: Option<DateTime<Utc>>,
    reason: &str,
) {
    use std::io::Write;
    let _ = write!(buffer, "{precheck_id}\t{dead_letter_id}\t{verdict}\t");
    match stale_at {
        Some(at) => {
            let _ = write!(buffer, "{}\t", at.to_rfc3339());
        }
        // COPY's text format spells NULL `\N`.
        None => buffer.extend_from_slice(b"\\N\t"),
    }
    for byte in reason.bytes() {
        match byte {
            b'\\' => buffer.extend_from_slice(b"\\\\"),
            b'\t' => buffer.extend_from_slice(b"\\t"),
            b'\n' => buffer.extend_from_slice(b"\\n"),
            b'\r' => buffer.extend_from_slice(b"\\r"),
            0 => {}
            other => buffer.push(other),
        }
    }
    buffer.push(b'\n');
}

/// Sends `buffer` into `copy` and clears it.
///
/// # Errors
/// [`StoreError`].
pub async fn send_copy(
    copy: &mut PgCopyIn<PoolConnection<Postgres>>,
    buffer: &mut Vec<u8>,
) -> Result<(), StoreError> {
    if !buffer.is_empty() {
        copy.send(std::mem::take(buffer)).await?;
    }
    Ok(())
}

/// A row of [`Store::stream_candidates`].
#[derive(sqlx::FromRow)]
struct CandidateRow {
    id: DeadLetterId,
    message_key: String,
    source: String,
    destination: String,
    body_oversized: bool,
    body_problem: Option<String>,
    event_type: Option<String>,
    schema_version: Option<String>,
    producer: Option<String>,
    reason_class: String,
    error_group: String,
    occurred_at: Option<DateTime<Utc>>,
    first_died_at: DateTime<Utc>,
    died_at: DateTime<Utc>,
    exchange_only: bool,
    without_exchange: bool,
    first_id: Option<DeadLetterId>,
    replayed_plan: Option<PlanId>,
    replayed_at: Option<DateTime<Utc>>,
    replayed_certain: bool,
    redrives: i64,
    body: Option<Vec<u8>>,
    properties: Option<Vec<u8>>,
    headers: Option<Vec<u8>>,
}

impl From<CandidateRow> for Candidate {
    fn from(row: CandidateRow) -> Self {
        let id = row.id;
        Self {
            id,
            message_key: row.message_key,
            source: row.source,
            destination: row.destination,
            body_oversized: row.body_oversized,
            body_problem: row.body_problem,
            event_type: row.event_type,
            schema_version: row.schema_version,
            producer: row.producer,
            reason_class: row.reason_class,
            error_group: row.error_group,
            occurred_at: row.occurred_at,
            first_died_at: row.first_died_at,
            died_at: row.died_at,
            duplicate_of: row.first_id.filter(|first| *first != id),
            replayed: row.replayed_plan.zip(row.replayed_at),
            replayed_certain: row.replayed_certain,
            redrives: row.redrives,
            payload: match (row.body, row.properties, row.headers) {
                (Some(body), Some(properties), Some(headers)) => Some((body, properties, headers)),
                _ => None,
            },
            exchange_only: row.exchange_only,
            without_exchange: row.without_exchange,
        }
    }
}
