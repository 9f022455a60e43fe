//! The audit log's SQL (migration 0035, docs/audit-log.md): a sealing
//! round's reads and writes under the log's one state row, the signed
//! checkpoints, the stored hashes a proof is made of, and the pages of a log
//! export. What the log decides (leaf bytes, the tree, when to sign) is in
//! [`crate::audit::log`].

use chrono::{DateTime, Utc};
use redrive_tlog::{
    Hash,
    leaf::{ActionLeaf, Entry, EventLeaf},
};
use sqlx::{Postgres, Transaction};

use super::{Store, StoreError};
use crate::ids::PlanId;

/// What [`Store::audit_subject`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditSubject {
    /// The plan's state (`completed`, `cancelled`, ...), `None` when there
    /// is no such plan.
    pub plan_state: Option<String>,
    /// Whether the dead letter exists (false when none was asked of).
    pub dead_letter_exists: bool,
    /// The dead letter's state as an item of the plan, `None` when it is
    /// not one of the plan's items.
    pub item_state: Option<String>,
    /// The plan's audit events of the dead letter.
    pub events: u64,
    /// Of those, how many a newer checkpoint will hold: sealed at or above
    /// the tree size asked of, or queued for sealing.
    pub coming_events: u64,
    /// Of those, how many the log refused to seal (`audit_log_refused`:
    /// no MAC, a MAC that does not match).
    pub refused_events: u64,
    /// One refusal's reason, when any was refused.
    pub refusal: Option<String>,
}

/// The columns of an event's or action's record, as the sealing round and
/// the export read them (`kind`, `plan_id`, `ref_id` from the log or the
/// queue; the rest from `audit_events` or `operator_actions`, NULL when the
/// record is gone).
const RECORD_COLUMNS: &str = "coalesce(e.at, a.at) AS at, \
     e.slice_id, e.dead_letter_id, e.message_key, e.message_id, e.destination, \
     coalesce(e.action, a.action) AS action, coalesce(e.reason, a.reason) AS reason, \
     e.wave, e.executor_id, e.attempt, e.confirm_latency_us, a.actor";

/// The joins [`RECORD_COLUMNS`] read through, from a row `t` with `kind`,
/// `plan_id` and `ref_id`, for statements that read a whole plan's leaves
/// (or every unsealed row), where hashing the records is the right plan: a
/// plan's leaves of one dead letter among 400,000 took 0.18-0.22 s so,
/// 0.62-0.65 s as [`RECORD_LOOKUPS`].
const RECORD_JOINS: &str = "LEFT JOIN audit_events e \
       ON t.kind = 'event' AND e.plan_id = t.plan_id AND e.id = t.ref_id \
     LEFT JOIN operator_actions a \
       ON t.kind = 'action' AND a.plan_id = t.plan_id AND a.id = t.ref_id";

/// [`RECORD_JOINS`] as lookups by key, one per row `t` (`LATERAL ...
/// OFFSET 0`, never flattened into a join), for statements that read a
/// bounded run of rows (a page of the log, a leaf, a sealing round): as
/// joins PostgreSQL hashed the whole audit table for each run, a cost
/// growing with the table and not the run. An export page of 5,000 leaves
/// among 400,000 events: 62-77 ms as joins, 7-12 ms as lookups; a sealing
/// round of 5,177 rows spent 90 of its 177 ms hashing 38,000 events. `e`
/// and `a` also carry the row as a whole (`whole`, of the table's type,
/// for the MAC functions).
const RECORD_LOOKUPS: &str = "LEFT JOIN LATERAL (SELECT x.*, x AS whole FROM audit_events x \
       WHERE t.kind = 'event' AND x.plan_id = t.plan_id AND x.id = t.ref_id OFFSET 0) e ON true \
     LEFT JOIN LATERAL (SELECT x.*, x AS whole FROM operator_actions x \
       WHERE t.kind = 'action' AND x.plan_id = t.plan_id AND x.id = t.ref_id OFFSET 0) a ON true";

/// An audit event's or operator action's record as stored now.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Record {
    /// `event` or `action`.
    pub kind: String,
    /// The plan it belongs to.
    pub plan_id: PlanId,
    /// The event's id (`audit_events.id`) or the action's
    /// (`operator_actions.id`).
    pub ref_id: i64,
    /// When it was written; `None` when the record is gone.
    pub at: Option<DateTime<Utc>>,
    slice_id: Option<i64>,
    dead_letter_id: Option<i64>,
    message_key: Option<String>,
    message_id: Option<String>,
    destination: Option<String>,
    action: Option<String>,
    reason: Option<String>,
    wave: Option<String>,
    executor_id: Option<String>,
    attempt: Option<i32>,
    confirm_latency_us: Option<i64>,
    actor: Option<String>,
}

/// A time as a leaf writes it: RFC 3339, UTC, microseconds, `Z`.
pub fn leaf_time(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
}

impl Record {
    /// The log entry this record is (the leaf's fields; absent strings are
    /// empty), or `None` when the record is gone.
    pub fn entry(&self) -> Option<Entry> {
        let at = leaf_time(self.at?);
        let text = |value: &Option<String>| value.clone().unwrap_or_default();
        Some(if self.kind == "event" {
            Entry::Event(EventLeaf {
                plan_id: self.plan_id.to_string(),
                id: self.ref_id,
                at,
                slice_id: self.slice_id,
                dead_letter_id: self.dead_letter_id.unwrap_or_default(),
                message_key: text(&self.message_key),
                message_id: text(&self.message_id),
                destination: text(&self.destination),
                action: text(&self.action),
                reason: text(&self.reason),
                wave: text(&self.wave),
                executor_id: text(&self.executor_id),
                attempt: self.attempt.unwrap_or_default(),
                confirm_latency_us: self.confirm_latency_us.unwrap_or_default(),
            })
        } else {
            Entry::Action(ActionLeaf {
                plan_id: self.plan_id.to_string(),
                id: self.ref_id,
                at,
                action: text(&self.action),
                actor: text(&self.actor),
                reason: text(&self.reason),
            })
        })
    }

    /// The dead letter of an event (`None` for an action).
    pub fn dead_letter_id(&self) -> Option<i64> {
        self.dead_letter_id
    }
}

/// One row taken from the queue by a sealing round, judged.
#[derive(Debug, sqlx::FromRow)]
pub struct Pending {
    /// Its place in the queue.
    pub seq: i64,
    /// Queued by migration 0035 for a row written before the log existed
    /// (sealed without a MAC).
    pub history: bool,
    /// Its writer's MAC, if it had one.
    pub has_mac: bool,
    /// Whether the MAC is the one the current or the previous audit key
    /// gives the record as stored now.
    pub mac_ok: Option<bool>,
    /// Already a leaf of the log (queued twice).
    pub sealed: bool,
    /// The record.
    #[sqlx(flatten)]
    pub record: Record,
}

/// The log's state row, locked by the round that read it.
#[derive(Debug, Clone)]
pub struct LogState {
    /// Leaves sealed.
    pub tree_size: u64,
    /// The hashes of the perfect subtrees the tree's right edge decomposes
    /// into, largest first.
    pub frontier: Vec<Hash>,
    /// Pending rows up to this `seq` are the history (no MAC).
    pub history_seq: i64,
    /// The key the log takes now (migration 0039), `name+hash`; `None`
    /// until a keyed planner started.
    pub signing_key: Option<String>,
}

/// What [`Store::take_audit_signing_key`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyTaking {
    /// The log takes the planner's key (or no key, for a planner without
    /// one, as before).
    Taken,
    /// The log takes this other key.
    Other(String),
    /// The log took the planner's previous key less than the settling time
    /// ago: try again after this long.
    Settling(std::time::Duration),
}

/// A leaf a round appends.
#[derive(Debug, Clone)]
pub struct NewLeaf {
    /// Its index.
    pub leaf_index: u64,
    /// `event` or `action`.
    pub kind: String,
    /// Its plan.
    pub plan_id: PlanId,
    /// The record's id.
    pub ref_id: i64,
    /// Its RFC 6962 leaf hash.
    pub leaf_hash: Hash,
}

/// A stored signed checkpoint.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct CheckpointRow {
    /// The tree size it signs.
    pub tree_size: i64,
    /// The root it signs.
    pub root_hash: Vec<u8>,
    /// The C2SP signed note.
    pub note: String,
    /// When the planner signed it.
    pub signed_at: DateTime<Utc>,
}

/// A sealing round: the transaction holding the log's state row.
pub struct Sealing {
    transaction: Transaction<'static, Postgres>,
    /// The state as the round found it.
    pub state: LogState,
}

fn to_hash(bytes: &[u8]) -> Result<Hash, StoreError> {
    bytes
        .try_into()
        .map_err(|_| StoreError::Corrupt(format!("a stored hash of {} bytes", bytes.len())))
}

fn as_u64(value: i64) -> u64 {
    u64::try_from(value).unwrap_or_default()
}

fn as_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

impl Store {
    /// Starts a sealing round: locks the log's state row, or answers `None`
    /// when another planner's round holds it (`SKIP LOCKED`: that round
    /// seals what is queued).
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn begin_sealing(&self) -> Result<Option<Sealing>, StoreError> {
        let mut transaction = self.pool().begin().await?;
        /// `tree_size`, `frontier`, `history_seq`, `signing_key`.
        type StateRow = (i64, Vec<Vec<u8>>, i64, Option<String>);
        let row: Option<StateRow> = sqlx::query_as(
            "SELECT tree_size, frontier, history_seq, signing_key FROM audit_log_state \
             FOR UPDATE SKIP LOCKED",
        )
        .fetch_optional(&mut *transaction)
        .await?;
        let Some((tree_size, frontier, history_seq, signing_key)) = row else {
            return Ok(None);
        };
        let frontier = frontier
            .iter()
            .map(|hash| to_hash(hash))
            .collect::<Result<_, _>>()?;
        Ok(Some(Sealing {
            transaction,
            state: LogState {
                tree_size: as_u64(tree_size),
                frontier,
                history_seq,
                signing_key,
            },
        }))
    }

    /// The key the log takes (migration 0039), read without a lock; `None`
    /// when it takes none yet.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn audit_signing_key(&self) -> Result<Option<String>, StoreError> {
        let key: Option<Option<String>> =
            sqlx::query_scalar("SELECT signing_key FROM audit_log_state")
                .fetch_optional(self.pool())
                .await?;
        Ok(key.flatten())
    }

    /// Makes `current` the key the log takes (migration 0039) under the
    /// state row's lock, waiting for a sealing round that holds it, when the
    /// log takes no key yet, `current` already, or `previous` (the rotation
    /// from `--audit-previous-key` to `--audit-signing-key` is taken here,
    /// once `settle` has passed since the log took `previous`, unless the
    /// log took `previous` from `current`, a rollback: migration 0040).
    /// `current` is `None` for a planner without a key: nothing is
    /// written. When the log takes its first key and was never signed, the
    /// rows queued so far are the log's history, sealed without a MAC as a
    /// planner without a key would have sealed them (a keyless planner
    /// killed before it sealed its last rows leaves them queued).
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn take_audit_signing_key(
        &self,
        current: Option<&str>,
        previous: Option<&str>,
        settle: std::time::Duration,
    ) -> Result<KeyTaking, StoreError> {
        let mut transaction = self.pool().begin().await?;
        let found: Option<(Option<String>, Option<f64>, Option<String>)> = sqlx::query_as(
            "SELECT signing_key, \
                extract(epoch FROM clock_timestamp() - signing_key_taken_at)::float8, \
                signing_key_from \
             FROM audit_log_state FOR UPDATE",
        )
        .fetch_optional(&mut *transaction)
        .await?;
        let Some((found, taken_ago, taken_from)) = found else {
            transaction.rollback().await?;
            return Ok(KeyTaking::Taken);
        };
        let Some(current) = current else {
            transaction.rollback().await?;
            return Ok(found.map_or(KeyTaking::Taken, KeyTaking::Other));
        };
        match found {
            Some(key) if key != current && Some(key.as_str()) != previous => {
                transaction.rollback().await?;
                Ok(KeyTaking::Other(key))
            }
            Some(key) if key == current => {
                transaction.rollback().await?;
                Ok(KeyTaking::Taken)
            }
            // A rollback (this planner's key is the one the log moved
            // from) checks the rows still on their way itself: no wait.
            Some(_)
                if taken_ago.is_some_and(|ago| ago < settle.as_secs_f64())
                    && taken_from.as_deref() != Some(current) =>
            {
                transaction.rollback().await?;
                let ago = std::time::Duration::from_secs_f64(taken_ago.unwrap_or(0.0).max(0.0));
                Ok(KeyTaking::Settling(settle.saturating_sub(ago)))
            }
            found => {
                // The moment counts only for a rotation (taken from a
                // previous key): a first key has no planners of a key
                // before it whose rows could still be on their way.
                sqlx::query(
                    "UPDATE audit_log_state SET signing_key = $1, \
                        signing_key_taken_at = CASE WHEN $2 THEN NULL ELSE clock_timestamp() END, \
                        signing_key_from = CASE WHEN $2 THEN NULL ELSE signing_key END, \
                        history_seq = CASE WHEN $2 AND NOT EXISTS (SELECT 1 FROM audit_checkpoints) \
                            THEN greatest(history_seq, coalesce(pg_sequence_last_value( \
                                pg_get_serial_sequence('audit_log_pending', 'seq')::regclass), 0)) \
                            ELSE history_seq END",
                )
                .bind(current)
                .bind(found.is_none())
                .execute(&mut *transaction)
                .await?;
                transaction.commit().await?;
                Ok(KeyTaking::Taken)
            }
        }
    }

    /// The signed checkpoint of `tree_size`, or the latest one for `None`.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn audit_checkpoint(
        &self,
        tree_size: Option<u64>,
    ) -> Result<Option<CheckpointRow>, StoreError> {
        let query = match tree_size {
            Some(size) => sqlx::query_as(
                "SELECT tree_size, root_hash, note, signed_at FROM audit_checkpoints WHERE tree_size = $1",
            )
            .bind(as_i64(size)),
            None => sqlx::query_as(
                "SELECT tree_size, root_hash, note, signed_at FROM audit_checkpoints \
                 ORDER BY tree_size DESC LIMIT 1",
            ),
        };
        Ok(query.fetch_optional(self.pool()).await?)
    }

    /// How many leaves the log has sealed.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn audit_log_size(&self) -> Result<u64, StoreError> {
        let size: i64 = sqlx::query_scalar("SELECT tree_size FROM audit_log_state")
            .fetch_one(self.pool())
            .await?;
        Ok(as_u64(size))
    }

    /// How many rows wait to be sealed.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn audit_log_pending(&self) -> Result<u64, StoreError> {
        let count: i64 = sqlx::query_scalar("SELECT count(*) FROM audit_log_pending")
            .fetch_one(self.pool())
            .await?;
        Ok(as_u64(count))
    }

    /// The stored hashes at `level` (0: leaves; else a multiple of 4) with
    /// indices `[start, end)`, in order. Fewer than asked means the log's
    /// stored hashes are incomplete.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn audit_log_hashes(
        &self,
        level: u8,
        start: u64,
        end: u64,
    ) -> Result<Vec<Hash>, StoreError> {
        let rows: Vec<Vec<u8>> = if level == 0 {
            sqlx::query_scalar(
                "SELECT leaf_hash FROM audit_log WHERE leaf_index >= $1 AND leaf_index < $2 \
                 ORDER BY leaf_index",
            )
            .bind(as_i64(start))
            .bind(as_i64(end))
            .fetch_all(self.pool())
            .await?
        } else {
            sqlx::query_scalar(
                "SELECT hash FROM audit_log_nodes WHERE level = $1 AND idx >= $2 AND idx < $3 \
                 ORDER BY idx",
            )
            .bind(i16::from(level))
            .bind(as_i64(start))
            .bind(as_i64(end))
            .fetch_all(self.pool())
            .await?
        };
        rows.iter().map(|hash| to_hash(hash)).collect()
    }

    /// The leaves of plan `plan_id` (every operator action; and the events
    /// of dead letter `dead_letter_id` when given, or of none) below
    /// `tree_size`, each with its record as stored now.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn audit_log_leaves_of(
        &self,
        plan_id: PlanId,
        dead_letter_id: Option<i64>,
        tree_size: u64,
    ) -> Result<Vec<(u64, Hash, Record)>, StoreError> {
        let sql = format!(
            "SELECT t.leaf_index, t.leaf_hash, t.kind, t.plan_id, t.ref_id, {RECORD_COLUMNS} \
             FROM audit_log t {RECORD_JOINS} \
             WHERE t.plan_id = $1 AND t.leaf_index < $3 \
               AND (t.kind = 'action' OR e.dead_letter_id = $2) \
             ORDER BY t.leaf_index"
        );
        self.leaf_rows(
            sqlx::query_as(sqlx::AssertSqlSafe(sql))
                .bind(plan_id)
                .bind(dead_letter_id)
                .bind(as_i64(tree_size)),
        )
        .await
    }

    /// Why a proof of plan `plan_id` (and of its events of dead letter
    /// `dead_letter_id`) found nothing to prove below `tree_size`: the
    /// plan's state, whether the dead letter exists and is one of the
    /// plan's items (its state), and how many of the plan's events of it
    /// there are, will be sealed (above `tree_size`, or queued) and were
    /// refused.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn audit_subject(
        &self,
        plan_id: PlanId,
        dead_letter_id: Option<i64>,
        tree_size: u64,
    ) -> Result<AuditSubject, StoreError> {
        type Row = (
            Option<String>,
            bool,
            Option<String>,
            i64,
            i64,
            i64,
            Option<String>,
        );
        let row: Row = sqlx::query_as(
            "SELECT (SELECT state FROM plans WHERE id = $1), \
                    EXISTS (SELECT 1 FROM dead_letters WHERE id = $2), \
                    (SELECT state FROM plan_items \
                      WHERE plan_id = $1 AND dead_letter_id = $2 LIMIT 1), \
                    count(e.id), \
                    count(e.id) FILTER (WHERE l.leaf_index >= $3 OR EXISTS \
                      (SELECT 1 FROM audit_log_pending p \
                        WHERE p.kind = 'event' AND p.plan_id = e.plan_id AND p.ref_id = e.id)), \
                    count(r.ref_id), min(r.reason) \
             FROM audit_events e \
             LEFT JOIN audit_log l \
               ON l.kind = 'event' AND l.plan_id = e.plan_id AND l.ref_id = e.id \
             LEFT JOIN audit_log_refused r \
               ON r.kind = 'event' AND r.plan_id = e.plan_id AND r.ref_id = e.id \
             WHERE e.plan_id = $1 AND e.dead_letter_id = $2",
        )
        .bind(plan_id)
        .bind(dead_letter_id)
        .bind(as_i64(tree_size))
        .fetch_one(self.pool())
        .await?;
        Ok(AuditSubject {
            plan_state: row.0,
            dead_letter_exists: row.1,
            item_state: row.2,
            events: as_u64(row.3),
            coming_events: as_u64(row.4),
            refused_events: as_u64(row.5),
            refusal: row.6,
        })
    }

    /// Plan `plan_id`'s operator actions: how many there are, how many a
    /// newer checkpoint than the one of `tree_size` leaves will hold
    /// (sealed at or above it, or queued), how many the log refused, and
    /// one refusal's reason.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn audit_actions_of(
        &self,
        plan_id: PlanId,
        tree_size: u64,
    ) -> Result<(u64, u64, u64, Option<String>), StoreError> {
        let row: (i64, i64, i64, Option<String>) = sqlx::query_as(
            "SELECT count(a.id), \
                    count(a.id) FILTER (WHERE l.leaf_index >= $2 OR EXISTS \
                      (SELECT 1 FROM audit_log_pending p \
                        WHERE p.kind = 'action' AND p.plan_id = a.plan_id AND p.ref_id = a.id)), \
                    count(r.ref_id), min(r.reason) \
             FROM operator_actions a \
             LEFT JOIN audit_log l \
               ON l.kind = 'action' AND l.plan_id = a.plan_id AND l.ref_id = a.id \
             LEFT JOIN audit_log_refused r \
               ON r.kind = 'action' AND r.plan_id = a.plan_id AND r.ref_id = a.id \
             WHERE a.plan_id = $1",
        )
        .bind(plan_id)
        .bind(as_i64(tree_size))
        .fetch_one(self.pool())
        .await?;
        Ok((as_u64(row.0), as_u64(row.1), as_u64(row.2), row.3))
    }

    /// Leaf `leaf_index` with its record as stored now, if sealed.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn audit_log_leaf(
        &self,
        leaf_index: u64,
    ) -> Result<Option<(u64, Hash, Record)>, StoreError> {
        let sql = format!(
            "SELECT t.leaf_index, t.leaf_hash, t.kind, t.plan_id, t.ref_id, {RECORD_COLUMNS} \
             FROM audit_log t {RECORD_LOOKUPS} WHERE t.leaf_index = $1"
        );
        let rows = self
            .leaf_rows(sqlx::query_as(sqlx::AssertSqlSafe(sql)).bind(as_i64(leaf_index)))
            .await?;
        Ok(rows.into_iter().next())
    }

    /// One page of the log in leaf order: leaves `[after, until)`, at most
    /// `limit`, each with its record as stored now (a gap in the indices
    /// is a leaf whose row is gone).
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn audit_log_page(
        &self,
        after: u64,
        until: u64,
        limit: i64,
    ) -> Result<Vec<(u64, Hash, Record)>, StoreError> {
        let sql = format!(
            "SELECT t.leaf_index, t.leaf_hash, t.kind, t.plan_id, t.ref_id, {RECORD_COLUMNS} \
             FROM (SELECT * FROM audit_log WHERE leaf_index >= $1 AND leaf_index < $2 \
                   ORDER BY leaf_index LIMIT $3) t {RECORD_LOOKUPS} \
             ORDER BY t.leaf_index"
        );
        self.leaf_rows(
            sqlx::query_as(sqlx::AssertSqlSafe(sql))
                .bind(as_i64(after))
                .bind(as_i64(until))
                .bind(limit),
        )
        .await
    }

    async fn leaf_rows<'q>(
        &self,
        query: sqlx::query::QueryAs<'q, Postgres, LeafRow, <Postgres as sqlx::Database>::Arguments>,
    ) -> Result<Vec<(u64, Hash, Record)>, StoreError> {
        let rows = query.fetch_all(self.pool()).await?;
        rows.into_iter()
            .map(|row| Ok((as_u64(row.leaf_index), to_hash(&row.leaf_hash)?, row.record)))
            .collect()
    }

    /// Every event and operator action in the database that is not a leaf
    /// of the log and not waiting to be sealed, each with why the planner
    /// refused it when it did: what an export lists as not in the log.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn audit_log_unsealed(&self) -> Result<Vec<(Record, Option<String>)>, StoreError> {
        let sql = format!(
            "SELECT t.kind, t.plan_id, t.ref_id, r.reason AS refused, {RECORD_COLUMNS} FROM ( \
                 SELECT 'event' AS kind, x.plan_id, x.id AS ref_id FROM audit_events x \
                 WHERE NOT EXISTS (SELECT 1 FROM audit_log l \
                                   WHERE l.kind = 'event' AND l.ref_id = x.id AND l.plan_id = x.plan_id) \
                 UNION ALL \
                 SELECT 'action', x.plan_id, x.id FROM operator_actions x \
                 WHERE NOT EXISTS (SELECT 1 FROM audit_log l \
                                   WHERE l.kind = 'action' AND l.ref_id = x.id AND l.plan_id = x.plan_id) \
             ) t {RECORD_JOINS} \
             LEFT JOIN audit_log_refused r \
               ON r.kind = t.kind AND r.ref_id = t.ref_id AND r.plan_id = t.plan_id \
             WHERE NOT EXISTS (SELECT 1 FROM audit_log_pending p \
                               WHERE p.kind = t.kind AND p.ref_id = t.ref_id AND p.plan_id = t.plan_id) \
             ORDER BY t.kind, t.ref_id"
        );
        let rows: Vec<UnsealedRow> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .fetch_all(self.pool())
            .await?;
        Ok(rows
            .into_iter()
            .map(|row| (row.record, row.refused))
            .collect())
    }
}

#[derive(sqlx::FromRow)]
struct LeafRow {
    leaf_index: i64,
    leaf_hash: Vec<u8>,
    #[sqlx(flatten)]
    record: Record,
}

#[derive(sqlx::FromRow)]
struct UnsealedRow {
    refused: Option<String>,
    #[sqlx(flatten)]
    record: Record,
}

/// The queue's rows a round takes, oldest first, at most `$1`, judged: the
/// history (`seq <= $2`), the MAC against the record as stored now under
/// the current (`$3`) and previous (`$4`) audit keys' pads, and whether the
/// record is a leaf already.
///
/// The rows taken are the `$1` oldest the statement sees, found as every
/// row up to the last of them: that seq is read once (an init plan), and
/// the rows by a range of the primary key. The same rows in the same
/// snapshot, since a row the statement cannot see is skipped by both.
/// Never `IN (SELECT ... LIMIT $1)`: that form let a plan made while the
/// queue was small (a cached generic plan, or statistics from before a
/// replay) re-run the `LIMIT` subquery for every queued row, queue × batch
/// row visits: a backlog of 80,000 took 287 s a round instead of 0.2 s
/// (docs/benchmarks.md, "A million dead letters"). Nor `= ANY (ARRAY(...))`
/// of the seqs: PostgreSQL hashes an `= ANY` array only when it is a
/// constant, so where it scanned the queue (as it did in a replay's
/// profile, the queue's statistics taken while it was small) each queued
/// row was compared with every taken seq, queue × batch comparisons: 2.3
/// of a round's 10 ms at 1,146 rows; 10,000 of a queue of 20,010 in 323 ms
/// against 6 ms for the range (docs/benchmarks.md, "The claim's window and
/// the sequencer's round").
///
/// Each taken row's record and leaf are read by key, one lookup each
/// ([`RECORD_LOOKUPS`], [`TAKE_PENDING_SEALED`]).
const TAKE_PENDING: &str = "\
WITH taken AS (
    DELETE FROM audit_log_pending
    WHERE seq <= (SELECT max(seq) FROM (SELECT seq FROM audit_log_pending ORDER BY seq LIMIT $1) oldest)
    RETURNING seq, kind, plan_id, ref_id, mac)
SELECT t.seq, t.kind, t.plan_id, t.ref_id,
       t.seq <= $2 AS history,
       t.mac IS NOT NULL AS has_mac,
       CASE WHEN t.kind = 'event'
            THEN t.mac IN (redrive_hmac($3, redrive_audit_event_mac_input(e.whole)),
                           redrive_hmac($4, redrive_audit_event_mac_input(e.whole)))
            ELSE t.mac IN (redrive_hmac($3, redrive_audit_action_mac_input(a.whole)),
                           redrive_hmac($4, redrive_audit_action_mac_input(a.whole))) END AS mac_ok,
       s.leaf_index IS NOT NULL AS sealed,
       ";

/// The leaf already holding a taken row, if any, read by its key as
/// [`RECORD_LOOKUPS`] reads the record: as a join, PostgreSQL scanned the
/// whole log for it.
const TAKE_PENDING_SEALED: &str = "LEFT JOIN LATERAL (SELECT l.leaf_index FROM audit_log l \
       WHERE l.kind = t.kind AND l.ref_id = t.ref_id AND l.plan_id = t.plan_id OFFSET 0) s ON true";

impl Sealing {
    /// Takes at most `limit` queued rows, oldest first, judged against the
    /// MAC pads of the current and previous audit keys (128 bytes each;
    /// `None`: no key).
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn take_pending(
        &mut self,
        limit: i64,
        current_pads: Option<&[u8]>,
        previous_pads: Option<&[u8]>,
    ) -> Result<Vec<Pending>, StoreError> {
        let sql = format!(
            "{TAKE_PENDING}{RECORD_COLUMNS} FROM taken t {RECORD_LOOKUPS} {TAKE_PENDING_SEALED} \
             ORDER BY t.seq"
        );
        // Planned at each round (an unnamed statement), never from a plan
        // cached while the log was small: such a plan checked `sealed` by
        // scanning the whole log per taken row, a round growing with the
        // log (12.6 s, then 25.6 s, for a backlog of 60,000).
        Ok(sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .persistent(false)
            .bind(limit)
            .bind(self.state.history_seq)
            .bind(current_pads)
            .bind(previous_pads)
            .fetch_all(&mut *self.transaction)
            .await?)
    }

    /// Appends `leaves`, the interior nodes they completed (`(level, index,
    /// hash)`, levels multiples of 4), the refusals (`(kind, plan, id,
    /// reason)`) and the new state.
    ///
    /// # Errors
    /// [`StoreError`]; a unique violation means a leaf was sealed twice,
    /// which the state row's lock rules out.
    pub async fn append(
        &mut self,
        leaves: &[NewLeaf],
        nodes: &[(u8, u64, Hash)],
        refused: &[(String, PlanId, i64, String)],
        frontier: &[Hash],
        root: &Hash,
    ) -> Result<(), StoreError> {
        if !leaves.is_empty() {
            sqlx::query(
                "INSERT INTO audit_log (leaf_index, kind, plan_id, ref_id, leaf_hash) \
                 SELECT * FROM UNNEST($1::bigint[], $2::text[], $3::uuid[], $4::bigint[], $5::bytea[])",
            )
            .bind(leaves.iter().map(|leaf| as_i64(leaf.leaf_index)).collect::<Vec<_>>())
            .bind(leaves.iter().map(|leaf| leaf.kind.as_str()).collect::<Vec<_>>())
            .bind(leaves.iter().map(|leaf| leaf.plan_id.get()).collect::<Vec<_>>())
            .bind(leaves.iter().map(|leaf| leaf.ref_id).collect::<Vec<_>>())
            .bind(leaves.iter().map(|leaf| leaf.leaf_hash.to_vec()).collect::<Vec<_>>())
            .execute(&mut *self.transaction)
            .await?;
        }
        if !nodes.is_empty() {
            sqlx::query(
                "INSERT INTO audit_log_nodes (level, idx, hash) \
                 SELECT * FROM UNNEST($1::smallint[], $2::bigint[], $3::bytea[])",
            )
            .bind(
                nodes
                    .iter()
                    .map(|(level, _, _)| i16::from(*level))
                    .collect::<Vec<_>>(),
            )
            .bind(
                nodes
                    .iter()
                    .map(|(_, index, _)| as_i64(*index))
                    .collect::<Vec<_>>(),
            )
            .bind(
                nodes
                    .iter()
                    .map(|(_, _, hash)| hash.to_vec())
                    .collect::<Vec<_>>(),
            )
            .execute(&mut *self.transaction)
            .await?;
        }
        if !refused.is_empty() {
            sqlx::query(
                "INSERT INTO audit_log_refused (kind, plan_id, ref_id, reason) \
                 SELECT * FROM UNNEST($1::text[], $2::uuid[], $3::bigint[], $4::text[]) \
                 ON CONFLICT DO NOTHING",
            )
            .bind(
                refused
                    .iter()
                    .map(|(kind, ..)| kind.as_str())
                    .collect::<Vec<_>>(),
            )
            .bind(
                refused
                    .iter()
                    .map(|(_, plan, ..)| plan.get())
                    .collect::<Vec<_>>(),
            )
            .bind(refused.iter().map(|(_, _, id, _)| *id).collect::<Vec<_>>())
            .bind(
                refused
                    .iter()
                    .map(|(.., reason)| reason.as_str())
                    .collect::<Vec<_>>(),
            )
            .execute(&mut *self.transaction)
            .await?;
        }
        let size = self.state.tree_size + leaves.len() as u64;
        sqlx::query(
            "UPDATE audit_log_state SET tree_size = $1, frontier = $2, root_hash = $3, sealed_at = now()",
        )
        .bind(as_i64(size))
        .bind(frontier.iter().map(|hash| hash.to_vec()).collect::<Vec<_>>())
        .bind(root.to_vec())
        .execute(&mut *self.transaction)
        .await?;
        self.state.tree_size = size;
        self.state.frontier = frontier.to_vec();
        Ok(())
    }

    /// The latest stored checkpoint's tree size and signing time.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn latest_checkpoint(&mut self) -> Result<Option<(u64, DateTime<Utc>)>, StoreError> {
        let row: Option<(i64, DateTime<Utc>)> = sqlx::query_as(
            "SELECT tree_size, signed_at FROM audit_checkpoints ORDER BY tree_size DESC LIMIT 1",
        )
        .fetch_optional(&mut *self.transaction)
        .await?;
        Ok(row.map(|(size, at)| (as_u64(size), at)))
    }

    /// The latest signed checkpoint's note, if any, read in the round.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn latest_checkpoint_note(&mut self) -> Result<Option<String>, StoreError> {
        Ok(
            sqlx::query_scalar(
                "SELECT note FROM audit_checkpoints ORDER BY tree_size DESC LIMIT 1",
            )
            .fetch_optional(&mut *self.transaction)
            .await?,
        )
    }

    /// The database's clock.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn now(&mut self) -> Result<DateTime<Utc>, StoreError> {
        Ok(sqlx::query_scalar("SELECT now()")
            .fetch_one(&mut *self.transaction)
            .await?)
    }

    /// Stores a signed checkpoint of the tree as it now is.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn record_checkpoint(
        &mut self,
        root: &Hash,
        note: &str,
        signed_at: DateTime<Utc>,
    ) -> Result<CheckpointRow, StoreError> {
        Ok(sqlx::query_as(
            "INSERT INTO audit_checkpoints (tree_size, root_hash, note, signed_at) \
             VALUES ($1, $2, $3, $4) RETURNING tree_size, root_hash, note, signed_at",
        )
        .bind(as_i64(self.state.tree_size))
        .bind(root.to_vec())
        .bind(note)
        .bind(signed_at)
        .fetch_one(&mut *self.transaction)
        .await?)
    }

    /// Replaces the note of the checkpoint of `tree_size` by `cosigned`,
    /// the same note with one more signature, when it is still `note`.
    /// `None` when it is not (another round changed it).
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn cosign_checkpoint(
        &mut self,
        tree_size: u64,
        note: &str,
        cosigned: &str,
    ) -> Result<Option<CheckpointRow>, StoreError> {
        Ok(sqlx::query_as(
            "UPDATE audit_checkpoints SET note = $3 WHERE tree_size = $1 AND note = $2 \
             RETURNING tree_size, root_hash, note, signed_at",
        )
        .bind(as_i64(tree_size))
        .bind(note)
        .bind(cosigned)
        .fetch_optional(&mut *self.transaction)
        .await?)
    }

    /// Commits the round.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn commit(self) -> Result<(), StoreError> {
        self.transaction.commit().await?;
        Ok(())
    }

    /// Rolls the round back and waits for it: the rows it took stay queued
    /// and the log's state row is free for the next round when this
    /// returns (a round merely dropped is rolled back later, when its
    /// connection is next used).
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn rollback(self) -> Result<(), StoreError> {
        self.transaction.rollback().await?;
        Ok(())
    }
}
