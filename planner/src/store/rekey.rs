//! Re-keying stored dead letters (`RekeyDeadLetters`; docs/replay.md,
//! "Identity"): batches of the selection locked in id order, their new keys
//! written with the former ones kept in `previous_message_keys`, and the
//! audit of the run (`dead_letter_rekeys`) and of each changed dead letter
//! (a `rekey` line of `dead_letter_archive_history`). Migration 0025.

use sqlx::{PgConnection, Postgres, QueryBuilder};

use super::{
    Store, StoreError,
    dead_letters::push_conditions,
    freeze::{self, Freeze},
};
use crate::{
    dead_letters::selector::Selector,
    ids::{DeadLetterId, PlanId},
    plan::state,
};

/// Most bytes of bodies one batch reads (at least one dead letter is read
/// whatever its size): a backlog of large bodies is re-keyed in small
/// batches, never held whole.
pub const REKEY_BATCH_BYTES: i64 = 32 * 1024 * 1024;

/// What a dead letter's key is recomputed from.
#[derive(Debug, sqlx::FromRow)]
pub struct RekeyInput {
    /// The dead letter.
    pub id: DeadLetterId,
    /// Its current key.
    pub message_key: String,
    /// The body as captured (a repair never changes identity).
    pub body: Vec<u8>,
    /// SHA-256 of `body`.
    pub body_sha256: Vec<u8>,
    /// Over the body limit at capture: its body is not parsed.
    pub body_oversized: bool,
    /// Encoded `MessageProperties`.
    pub properties: Vec<u8>,
    /// Encoded `HeaderTable`.
    pub headers: Vec<u8>,
    /// The event type found at capture (appended to a rule's key).
    pub event_type: Option<String>,
}

/// One key change of a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyChange {
    /// The dead letter.
    pub id: DeadLetterId,
    /// Its key before.
    pub old_key: String,
    /// Its key now.
    pub new_key: String,
}

/// What one batch did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BatchOutcome {
    /// Done: `rekeyed` dead letters had their key recomputed, the `changes`
    /// got a new one; the next batch starts after `last_id`. `rekeyed` 0:
    /// the selection is exhausted.
    Done {
        /// Dead letters recomputed.
        rekeyed: u64,
        /// The changed ones, in id order.
        changes: Vec<KeyChange>,
        /// The last id of the batch.
        last_id: DeadLetterId,
    },
    /// Refused, nothing of this batch changed: a dead letter of it is an
    /// item of a plan that has not ended.
    InLivePlan {
        /// The dead letter.
        dead_letter_id: DeadLetterId,
        /// The plan.
        plan_id: PlanId,
        /// The plan's state name.
        state: String,
    },
}

impl Store {
    /// Records the start of a re-key run and returns its id.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn begin_rekey(
        &self,
        actor: &str,
        reason: &str,
        key_rules: &[String],
        selector: &str,
    ) -> Result<i64, StoreError> {
        Ok(sqlx::query_scalar(
            "INSERT INTO dead_letter_rekeys (actor, reason, key_rules, selector) \
             VALUES ($1, $2, $3, $4) RETURNING id",
        )
        .bind(actor)
        .bind(reason)
        .bind(key_rules)
        .bind(selector)
        .fetch_one(self.pool())
        .await?)
    }

    /// Marks re-key run `id` finished.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn finish_rekey(&self, id: i64) -> Result<(), StoreError> {
        sqlx::query("UPDATE dead_letter_rekeys SET finished_at = now() WHERE id = $1")
            .bind(id)
            .execute(self.pool())
            .await?;
        Ok(())
    }

    /// The first selected dead letter that is an item of a plan that has
    /// not ended, if any (checked before a re-key starts, so that a refused
    /// re-key changes nothing).
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn selected_in_live_plan(
        &self,
        selector: &Selector,
    ) -> Result<Option<(DeadLetterId, PlanId, String)>, StoreError> {
        let mut builder = QueryBuilder::<Postgres>::new(
            "SELECT i.dead_letter_id, p.id, p.state FROM plan_items i \
             JOIN plans p ON p.id = i.plan_id WHERE p.state = ANY(",
        );
        builder
            .push_bind(state::names_where(|state| !state.is_final()))
            .push(") AND i.dead_letter_id IN (SELECT id FROM dead_letters");
        push_conditions(&mut builder, selector);
        builder.push(") ORDER BY i.dead_letter_id LIMIT 1");
        Ok(builder
            .build_query_as::<(DeadLetterId, PlanId, String)>()
            .fetch_optional(self.pool())
            .await?)
    }

    /// Re-keys the next batch of the selection after `after_id` (at most
    /// `limit` dead letters and [`REKEY_BATCH_BYTES`] of bodies), in one
    /// transaction: the freeze lock is taken exclusive ([`super::freeze`], so
    /// a plan created meanwhile waits, and this batch for it) and the batch
    /// is locked (`FOR UPDATE`), `compute` gives each its key, and every changed dead
    /// letter gets the new key, its former one appended to
    /// `previous_message_keys`, and a `rekey` history line; the run's counts
    /// grow. Audit events are never touched.
    ///
    /// # Errors
    /// [`StoreError`]; nothing of this batch changes then.
    #[allow(clippy::too_many_arguments)]
    pub async fn rekey_batch(
        &self,
        run: i64,
        selector: &Selector,
        after_id: DeadLetterId,
        limit: i64,
        actor: &str,
        note: &(dyn Fn(&KeyChange) -> String + Sync),
        compute: &(dyn Fn(&RekeyInput) -> String + Sync),
    ) -> Result<BatchOutcome, StoreError> {
        let ids = self.batch_ids(selector, after_id, limit).await?;
        let Some(&last_id) = ids.last() else {
            return Ok(BatchOutcome::Done {
                rekeyed: 0,
                changes: Vec::new(),
                last_id: after_id,
            });
        };
        let mut transaction = self.pool().begin().await?;
        freeze::lock(&mut transaction, Freeze::Exclusive).await?;
        let rows: Vec<RekeyInput> = sqlx::query_as(
            "SELECT id, message_key, body, body_sha256, body_oversized, properties, headers, \
             event_type FROM dead_letters WHERE id = ANY($1) ORDER BY id FOR UPDATE",
        )
        .bind(&ids)
        .fetch_all(&mut *transaction)
        .await?;
        if let Some((dead_letter_id, plan_id, state)) = live_item(&mut transaction, &ids).await? {
            return Ok(BatchOutcome::InLivePlan {
                dead_letter_id,
                plan_id,
                state,
            });
        }
        let changes: Vec<KeyChange> = rows
            .iter()
            .filter_map(|row| {
                let new_key = compute(row);
                (new_key != row.message_key).then(|| KeyChange {
                    id: row.id,
                    old_key: row.message_key.clone(),
                    new_key,
                })
            })
            .collect();
        write_changes(&mut transaction, &changes, actor, note).await?;
        sqlx::query(
            "UPDATE dead_letter_rekeys SET rekeyed = rekeyed + $2, changed = changed + $3 WHERE id = $1",
        )
        .bind(run)
        .bind(rows.len() as i64)
        .bind(changes.len() as i64)
        .execute(&mut *transaction)
        .await?;
        transaction.commit().await?;
        Ok(BatchOutcome::Done {
            rekeyed: rows.len() as u64,
            changes,
            last_id,
        })
    }

    /// The ids of the next batch of the selection after `after_id`: at most
    /// `limit`, cut where their bodies pass [`REKEY_BATCH_BYTES`] (the
    /// first always in), in id order.
    ///
    /// # Errors
    /// [`StoreError`].
    async fn batch_ids(
        &self,
        selector: &Selector,
        after_id: DeadLetterId,
        limit: i64,
    ) -> Result<Vec<DeadLetterId>, StoreError> {
        let mut builder = QueryBuilder::<Postgres>::new(
            "SELECT id FROM (SELECT id, body_size, sum(body_size) OVER (ORDER BY id) AS running \
             FROM (SELECT id, body_size FROM dead_letters",
        );
        push_conditions(&mut builder, selector);
        builder
            .push(" AND id > ")
            .push_bind(after_id)
            .push(" ORDER BY id LIMIT ")
            .push_bind(limit)
            .push(") s) t WHERE running - body_size < ")
            .push_bind(REKEY_BATCH_BYTES)
            .push(" ORDER BY id");
        Ok(builder.build_query_scalar().fetch_all(self.pool()).await?)
    }

    /// Ids among `ids` that name no stored dead letter, in order.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn missing_dead_letters(
        &self,
        ids: &[DeadLetterId],
    ) -> Result<Vec<DeadLetterId>, StoreError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        Ok(sqlx::query_scalar(
            "SELECT DISTINCT x FROM unnest($1::bigint[]) x \
             WHERE NOT EXISTS (SELECT 1 FROM dead_letters d WHERE d.id = x) ORDER BY x",
        )
        .bind(ids)
        .fetch_all(self.pool())
        .await?)
    }
}

/// The first of `ids` that is an item of a plan that has not ended: the
/// dead letter, the plan and its state name.
///
/// # Errors
/// [`StoreError`].
async fn live_item(
    connection: &mut PgConnection,
    ids: &[DeadLetterId],
) -> Result<Option<(DeadLetterId, PlanId, String)>, StoreError> {
    Ok(sqlx::query_as(
        "SELECT i.dead_letter_id, p.id, p.state FROM plan_items i \
         JOIN plans p ON p.id = i.plan_id \
         WHERE i.dead_letter_id = ANY($1) AND p.state = ANY($2) \
         ORDER BY i.dead_letter_id LIMIT 1",
    )
    .bind(ids)
    .bind(state::names_where(|state| !state.is_final()))
    .fetch_optional(connection)
    .await?)
}

/// Writes `changes`: each dead letter's new key, its former one appended to
/// `previous_message_keys`, and a `rekey` history line by `actor` with the
/// `note` of its change.
///
/// # Errors
/// [`StoreError`].
async fn write_changes(
    connection: &mut PgConnection,
    changes: &[KeyChange],
    actor: &str,
    note: &(dyn Fn(&KeyChange) -> String + Sync),
) -> Result<(), StoreError> {
    if changes.is_empty() {
        return Ok(());
    }
    let changed_ids: Vec<DeadLetterId> = changes.iter().map(|c| c.id).collect();
    let new_keys: Vec<String> = changes.iter().map(|c| c.new_key.clone()).collect();
    let notes: Vec<String> = changes.iter().map(note).collect();
    sqlx::query(
        "UPDATE dead_letters d SET message_key = u.new_key, \
             previous_message_keys = array_remove(CASE WHEN d.message_key = ANY(d.previous_message_keys) \
                 THEN d.previous_message_keys \
                 ELSE d.previous_message_keys || d.message_key END, u.new_key) \
         FROM unnest($1::bigint[], $2::text[]) AS u(id, new_key) WHERE d.id = u.id",
    )
    .bind(&changed_ids)
    .bind(&new_keys)
    .execute(&mut *connection)
    .await?;
    sqlx::query(
        "INSERT INTO dead_letter_archive_history (dead_letter_id, action, actor, reason) \
         SELECT u.id, 'rekey', $3, u.note FROM unnest($1::bigint[], $2::text[]) AS u(id, note)",
    )
    .bind(&changed_ids)
    .bind(&notes)
    .bind(actor)
    .execute(&mut *connection)
    .await?;
    Ok(())
}
