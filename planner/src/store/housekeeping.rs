//! Dead-letter housekeeping (docs/design.md, "Housekeeping"): archive and
//! unarchive with their history, and retention's batched deletes.

use chrono::{DateTime, Utc};
use redrive_proto::{time::timestamp, v1};
use sqlx::{Postgres, QueryBuilder};

use super::{
    Store, StoreError,
    dead_letters::push_selected,
    freeze::{self, Freeze},
};
use crate::{
    dead_letters::selector::Selector,
    ids::{DeadLetterId, PlanId},
    plan::state,
};

/// The actor retention's deletes are recorded under.
pub const RETENTION_ACTOR: &str = "redrive-retention";

/// Most changed ids an archive or unarchive answer lists.
pub const IDS_LISTED: usize = 1000;

/// What an archive or unarchive did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ArchiveOutcome {
    /// Done: these dead letters changed (id order), the rest of the selection
    /// was already in the asked state.
    Done {
        /// The changed dead letters.
        changed: Vec<DeadLetterId>,
        /// Selected dead letters left as they were.
        unchanged: u64,
        /// Ids the selector names that name no stored dead letter.
        not_found: Vec<DeadLetterId>,
    },
    /// Refused, nothing changed: a selected dead letter is an item of a plan
    /// that has not ended.
    InLivePlan {
        /// The dead letter (the lowest such id).
        dead_letter_id: DeadLetterId,
        /// The plan.
        plan_id: PlanId,
        /// The plan's state name.
        state: String,
    },
}

/// A row of the archive history.
#[derive(sqlx::FromRow)]
struct HistoryRow {
    action: String,
    actor: String,
    reason: String,
    at: DateTime<Utc>,
}

impl Store {
    /// Every archive, unarchive and retention delete of dead letter `id`,
    /// oldest first.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn archive_history(
        &self,
        id: DeadLetterId,
    ) -> Result<Vec<v1::ArchiveRecord>, StoreError> {
        let rows = sqlx::query_as::<_, HistoryRow>(
            "SELECT action, actor, reason, at FROM dead_letter_archive_history \
             WHERE dead_letter_id = $1 ORDER BY id",
        )
        .bind(id)
        .fetch_all(self.pool())
        .await?;
        Ok(rows
            .into_iter()
            .map(|row| v1::ArchiveRecord {
                action: row.action,
                actor: row.actor,
                reason: row.reason,
                at: Some(timestamp(row.at)),
            })
            .collect())
    }

    /// Archives (`archive`) or unarchives the dead letters `selector` covers,
    /// in one transaction, recording `actor` and `reason` per dead letter
    /// changed. The freeze lock is taken exclusive first
    /// ([`super::freeze`]), so that a plan being created and this archive
    /// wait for each other, then the selection is locked (`FOR UPDATE`); an
    /// archive is then refused when a selected dead letter is an item of a
    /// plan that has not ended.
    ///
    /// # Errors
    /// [`StoreError`]; nothing changes then.
    pub async fn set_archived(
        &self,
        selector: &Selector,
        archive: bool,
        actor: &str,
        reason: &str,
    ) -> Result<ArchiveOutcome, StoreError> {
        let mut transaction = self.pool().begin().await?;
        freeze::lock(&mut transaction, Freeze::Exclusive).await?;
        let mut builder =
            QueryBuilder::<Postgres>::new("SELECT d.id FROM dead_letters d WHERE d.id IN ");
        push_selected(&mut builder, selector, "id");
        builder.push(" ORDER BY d.id FOR UPDATE OF d");
        let selected: Vec<DeadLetterId> = builder
            .build_query_scalar()
            .fetch_all(&mut *transaction)
            .await?;
        if archive {
            let live: Option<(DeadLetterId, PlanId, String)> = sqlx::query_as(
                "SELECT i.dead_letter_id, p.id, p.state FROM plan_items i \
                 JOIN plans p ON p.id = i.plan_id \
                 WHERE i.dead_letter_id = ANY($1) AND p.state = ANY($2) \
                 ORDER BY i.dead_letter_id, p.created_at LIMIT 1",
            )
            .bind(&selected)
            .bind(state::names_where(|state| !state.is_final()))
            .fetch_optional(&mut *transaction)
            .await?;
            if let Some((dead_letter_id, plan_id, state)) = live {
                return Ok(ArchiveOutcome::InLivePlan {
                    dead_letter_id,
                    plan_id,
                    state,
                });
            }
        }
        let query = if archive {
            "WITH changed AS (UPDATE dead_letters SET archived_at = now(), archived_by = $2, \
                 archive_reason = $3 WHERE id = ANY($1) AND archived_at IS NULL RETURNING id), \
             history AS (INSERT INTO dead_letter_archive_history (dead_letter_id, action, actor, reason) \
                 SELECT id, 'archive', $2, $3 FROM changed) \
             SELECT id FROM changed ORDER BY id"
        } else {
            "WITH changed AS (UPDATE dead_letters SET archived_at = NULL, archived_by = NULL, \
                 archive_reason = NULL WHERE id = ANY($1) AND archived_at IS NOT NULL RETURNING id), \
             history AS (INSERT INTO dead_letter_archive_history (dead_letter_id, action, actor, reason) \
                 SELECT id, 'unarchive', $2, $3 FROM changed) \
             SELECT id FROM changed ORDER BY id"
        };
        let changed: Vec<DeadLetterId> = sqlx::query_scalar(query)
            .bind(&selected)
            .bind(actor)
            .bind(reason)
            .fetch_all(&mut *transaction)
            .await?;
        let not_found: Vec<DeadLetterId> = if selector.ids.is_empty() {
            Vec::new()
        } else {
            sqlx::query_scalar(
                "SELECT DISTINCT x FROM unnest($1::bigint[]) x \
                 WHERE NOT EXISTS (SELECT 1 FROM dead_letters d WHERE d.id = x) ORDER BY x",
            )
            .bind(&selector.ids)
            .fetch_all(&mut *transaction)
            .await?
        };
        transaction.commit().await?;
        Ok(ArchiveOutcome::Done {
            unchanged: (selected.len() - changed.len()) as u64,
            changed,
            not_found,
        })
    }

    /// Deletes at most `batch` dead letters resolved before `cutoff`, in one
    /// transaction, and returns how many: archived ones (by `archived_at`)
    /// and replayed ones (by the time of their `sent` audit event in a plan
    /// that has ended, `completed`, `cancelled` or `aborted`). Never an open
    /// dead letter, never one that is an item of a plan that has not ended.
    /// Each delete is recorded in the archive history (actor
    /// [`RETENTION_ACTOR`]); its body revisions go with it; plan items,
    /// audit events, precheck items and replayed keys stay (detached).
    ///
    /// # Errors
    /// [`StoreError`]; nothing is deleted then.
    pub async fn delete_resolved(
        &self,
        cutoff: DateTime<Utc>,
        batch: i64,
    ) -> Result<u64, StoreError> {
        let ended = state::names_where(v1::PlanState::is_final);
        let live = state::names_where(|state| !state.is_final());
        let mut transaction = self.pool().begin().await?;
        // No plan is created while this batch deletes ([`super::freeze`]).
        freeze::lock(&mut transaction, Freeze::Exclusive).await?;
        // Candidates, locked (a concurrent unarchive or archive holding one
        // is skipped and met on a later pass). The
        // candidate ids are read once into an array, not as `IN (... LIMIT)`,
        // which a plan made on stale statistics may re-run per dead letter
        // (the audit log's `TAKE_PENDING` met that: 287 s instead of 0.2 s),
        // and the statement is planned at each pass, not cached while the
        // tables were small.
        let locked: Vec<DeadLetterId> = sqlx::query_scalar(
            "SELECT d.id FROM dead_letters d WHERE d.id = ANY (ARRAY( \
                 (SELECT a.id FROM dead_letters a WHERE a.archived_at < $1 \
                  AND NOT EXISTS (SELECT 1 FROM plan_items i JOIN plans q ON q.id = i.plan_id \
                                  WHERE i.dead_letter_id = a.id AND q.state = ANY($4)) \
                  ORDER BY a.archived_at LIMIT $2) \
                 UNION \
                 (SELECT e.dead_letter_id FROM plans p JOIN audit_events e ON e.plan_id = p.id \
                  JOIN dead_letters x ON x.id = e.dead_letter_id \
                  WHERE p.retention_swept_at IS NULL AND p.state = ANY($3) \
                    AND e.action = 'sent' AND e.at < $1 \
                    AND NOT EXISTS (SELECT 1 FROM plan_items i JOIN plans q ON q.id = i.plan_id \
                                    WHERE i.dead_letter_id = x.id AND q.state = ANY($4)) \
                  LIMIT $2))) \
             ORDER BY d.id LIMIT $2 FOR UPDATE OF d SKIP LOCKED",
        )
        .persistent(false)
        .bind(cutoff)
        .bind(batch)
        .bind(&ended)
        .bind(&live)
        .fetch_all(&mut *transaction)
        .await?;
        if locked.is_empty() {
            return Ok(0);
        }
        // Checked again under the locks, with a fresh snapshot: resolved
        // before the cutoff, and in no plan that has not ended.
        let deleted: Vec<DeadLetterId> = sqlx::query_scalar(
            "WITH doomed AS (SELECT d.id, d.source FROM dead_letters d WHERE d.id = ANY($1) \
                 AND (d.archived_at < $2 OR EXISTS (SELECT 1 FROM audit_events e \
                      JOIN plans p ON p.id = e.plan_id \
                      WHERE e.dead_letter_id = d.id AND e.action = 'sent' AND e.at < $2 \
                        AND p.state = ANY($3))) \
                 AND NOT EXISTS (SELECT 1 FROM plan_items i JOIN plans p ON p.id = i.plan_id \
                      WHERE i.dead_letter_id = d.id AND p.state = ANY($4))), \
             revisions AS (DELETE FROM dead_letter_revisions v USING doomed WHERE v.dead_letter_id = doomed.id), \
             history AS (INSERT INTO dead_letter_archive_history (dead_letter_id, action, actor, reason) \
                 SELECT id, 'delete', $5, 'retention: resolved before ' || \
                     to_char($2 AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"') FROM doomed), \
             retired AS (INSERT INTO retired_sources (source) SELECT DISTINCT source FROM doomed \
                 ON CONFLICT (source) DO NOTHING) \
             DELETE FROM dead_letters d USING doomed WHERE d.id = doomed.id RETURNING d.id",
        )
        .bind(&locked)
        .bind(cutoff)
        .bind(&ended)
        .bind(&live)
        .bind(RETENTION_ACTOR)
        .fetch_all(&mut *transaction)
        .await?;
        transaction.commit().await?;
        Ok(deleted.len() as u64)
    }

    /// Marks plans that have ended and none of whose sent dead letters is
    /// still stored as swept: retention does not look at them again.
    /// Returns how many.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn mark_retention_swept(&self) -> Result<u64, StoreError> {
        let result = sqlx::query(
            "UPDATE plans p SET retention_swept_at = now() \
             WHERE p.retention_swept_at IS NULL AND p.state = ANY($1) \
               AND NOT EXISTS (SELECT 1 FROM audit_events e JOIN dead_letters d ON d.id = e.dead_letter_id \
                               WHERE e.plan_id = p.id AND e.action = 'sent')",
        )
        .bind(state::names_where(v1::PlanState::is_final))
        .execute(self.pool())
        .await?;
        Ok(result.rows_affected())
    }
}
