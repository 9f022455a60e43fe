//! The audit's SQL: the events a report writes (`audit_events`), the
//! refusals it records (`refused_outcomes`), and every read of them (a
//! plan's report, export and live feed).

use super::{
    Store, StoreError, Tx,
    leases::{FINAL_ITEM_STATES, Outcome, ReportLease},
};
use crate::ids::{DeadLetterId, PlanId, SliceId};
use chrono::{DateTime, Utc};
use redrive_proto::{time::timestamp, v1};
use sqlx::PgConnection;

/// Takes the transaction-scoped advisory lock on `plan_id`'s audit, held
/// until the transaction ends. Every transaction that appends to a plan's
/// `audit_events` takes it before its `INSERT`, so the `bigserial` ids of one
/// plan's events are drawn in the order their transactions commit. The live
/// feed and the exports read a plan's events by `id > after` (a cursor): were
/// two writers to draw ids 7 and 8 and commit 8 first, a reader between the
/// commits would move its cursor to 8 and never see 7. (A sequence hands out
/// numbers at `INSERT`, not at commit: PostgreSQL docs, "Sequence
/// Manipulation Functions".) Writers of several plans lock them in sorted
/// order, so two of them never wait on each other.
///
/// # Errors
/// [`StoreError`].
pub(crate) async fn lock_plan_audit(
    connection: &mut PgConnection,
    plan_id: PlanId,
) -> Result<(), StoreError> {
    sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended('redrive-audit:' || $1::text, 0))")
        .bind(plan_id)
        .execute(connection)
        .await?;
    Ok(())
}

/// The message keys `sql` selects for plan `plan_id` (its `$1`), in the
/// order it gives.
async fn plan_keys(
    pool: &sqlx::PgPool,
    sql: &'static str,
    plan_id: PlanId,
) -> Result<Vec<String>, StoreError> {
    let keys = sqlx::query_scalar(sql).bind(plan_id).fetch_all(pool);
    keys.await.map_err(StoreError::from)
}

/// One page of a plan's rows that `sql` selects: `$1` the plan, `$2` the
/// cursor (the last id or position of the page before), `$3` the most rows.
async fn plan_page<R>(
    pool: &sqlx::PgPool,
    sql: &'static str,
    plan_id: PlanId,
    after: i64,
    limit: i64,
) -> Result<Vec<R>, StoreError>
where
    R: for<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow> + Send + Unpin,
{
    let rows = sqlx::query_as::<_, R>(sql)
        .bind(plan_id)
        .bind(after)
        .bind(limit)
        .fetch_all(pool);
    rows.await.map_err(StoreError::from)
}

impl Store {
    /// The id of a plan's latest audit event (0 when it has none): where a
    /// live feed of its new events starts.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn last_audit_event_id(&self, plan_id: PlanId) -> Result<i64, StoreError> {
        Ok(sqlx::query_scalar(
            "SELECT coalesce(max(id), 0)::bigint FROM audit_events WHERE plan_id = $1",
        )
        .bind(plan_id)
        .fetch_one(self.pool())
        .await?)
    }

    /// The audit events of a plan after `after_id`, at most `limit`.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn audit_events(
        &self,
        plan_id: PlanId,
        after_id: i64,
        limit: i64,
    ) -> Result<Vec<(i64, v1::AuditEvent)>, StoreError> {
        let page = self
            .audit_events_with_message_ids(plan_id, after_id, limit)
            .await?;
        Ok(page
            .into_iter()
            .map(|(id, event, _message_id)| (id, event))
            .collect())
    }
}

impl Tx {
    /// Appends one `refused_outcomes` row per refused outcome of a report:
    /// `(dead letter, action, reason)` each, with the slice, the token and
    /// the reporting principal. The caller bounds how many
    /// ([`crate::leases::outcomes::MAX_REFUSAL_ROWS_PER_REPORT`]).
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn record_refusals(
        &mut self,
        slice_id: SliceId,
        token: i64,
        principal: &str,
        refused: &[(DeadLetterId, &str, &str)],
    ) -> Result<(), StoreError> {
        if refused.is_empty() {
            return Ok(());
        }
        let ids: Vec<DeadLetterId> = refused.iter().map(|(id, _, _)| *id).collect();
        let actions: Vec<&str> = refused.iter().map(|(_, action, _)| *action).collect();
        let reasons: Vec<&str> = refused.iter().map(|(_, _, reason)| *reason).collect();
        sqlx::query(
            "INSERT INTO refused_outcomes (slice_id, fencing_token, principal, dead_letter_id, action, reason) \
             SELECT $1, $2, $3, u.id, u.action, u.reason \
             FROM UNNEST($4::bigint[], $5::text[], $6::text[]) AS u(id, action, reason)",
        )
        .bind(slice_id)
        .bind(token)
        .bind(principal)
        .bind(&ids)
        .bind(&actions)
        .bind(&reasons)
        .execute(&mut *self.transaction)
        .await?;
        Ok(())
    }

    /// Records the accepted outcomes of a report under `lease`: their audit
    /// events (with `items`, each outcome's plan item as the store knows it:
    /// its message key and position; each event with its dead letter's
    /// destination: a `sent` or `uncertain` event is also the replay record
    /// of its key, docs/design.md, "What a report writes") and their items'
    /// states and attempts.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn record_outcomes(
        &mut self,
        slice_id: SliceId,
        lease: &ReportLease,
        outcomes: &[&Outcome],
        items: &[(String, i64)],
    ) -> Result<(), StoreError> {
        let transaction = &mut self.transaction;
        let column =
            |f: &dyn Fn(&Outcome) -> String| outcomes.iter().map(|o| f(o)).collect::<Vec<_>>();
        let ids: Vec<DeadLetterId> = outcomes.iter().map(|o| o.dead_letter_id).collect();
        let keys: Vec<&str> = items.iter().map(|(key, _)| key.as_str()).collect();
        let actions = column(&|o| o.action.clone());
        let reasons = column(&|o| o.reason.replace('\0', ""));
        // The executor is the one that claimed the lease, whatever the
        // report says.
        let executors = column(&|_| lease.executor_id.clone());
        let attempts: Vec<i32> = outcomes.iter().map(|o| o.attempt).collect();
        let latencies: Vec<i64> = outcomes.iter().map(|o| o.confirm_latency_us).collect();
        let at: Vec<DateTime<Utc>> = outcomes.iter().map(|o| o.at).collect();
        let decided = item_outcomes(outcomes, items);
        // The last outcome of an item wins, except that `sent` is never undone
        // (a confirmed publish was delivered, whatever came after) and a final
        // state never goes back to uncertain (a late report of an earlier
        // attempt). Under an expired lease only `sent`, and `uncertain` of a
        // pending item, change the state.
        //
        // The items are found by primary key (plan, position: the caller
        // took the positions from this slice's items), within the range of
        // the report's positions (a report is mostly a run of neighbours),
        // and each one's outcome by its place in the arrays, with no join:
        // whatever the statistics say of a new plan's items, the statement
        // reads about the reported items and nothing else. (Joined to the
        // outcomes, a new plan's slice was estimated at one row and
        // PostgreSQL re-read the sorted outcomes for every item of the
        // slice: docs/benchmarks.md, "The report's item update".)
        sqlx::query(
            "UPDATE plan_items i SET (state, attempts) = ( \
                SELECT CASE \
                    WHEN i.state = 'sent' THEN i.state \
                    WHEN u.action = 'sent' THEN 'sent' \
                    WHEN u.action = 'uncertain' AND i.state = ANY($5) THEN i.state \
                    WHEN $6 THEN u.action \
                    WHEN u.action = 'uncertain' AND i.state = 'pending' THEN 'uncertain' \
                    ELSE i.state END, \
                    greatest(i.attempts, u.attempt) \
                FROM (SELECT ($3::text[])[k] AS action, ($4::int[])[k] AS attempt \
                      FROM array_position($2::bigint[], i.position) AS k) u) \
             WHERE i.plan_id = $1 AND i.position BETWEEN $7 AND $8 AND i.position = ANY($2)",
        )
        .bind(lease.plan_id)
        .bind(&decided.positions)
        .bind(&decided.actions)
        .bind(&decided.attempts)
        .bind(FINAL_ITEM_STATES)
        .bind(lease.unexpired)
        .bind(decided.positions.first())
        .bind(decided.positions.last())
        .execute(&mut **transaction)
        .await?;
        // The audit lock last, right before the events' ids are drawn: it
        // is held until the commit, and the items' update (the longer
        // statement) runs before it, so reports of other slices of the plan
        // wait for less (docs/benchmarks.md, pg_stat_statements).
        lock_plan_audit(transaction, lease.plan_id).await?;
        sqlx::query(
        "INSERT INTO audit_events (plan_id, slice_id, dead_letter_id, message_key, destination, action, reason, \
            wave, executor_id, attempt, confirm_latency_us, at, message_id) \
         SELECT $1, $2, u.id, u.key, d.destination, u.action, \
            CASE WHEN u.action = 'sent' AND v.revision IS NOT NULL THEN concat_ws('; ', nullif(u.reason, ''), \
                format('published the repaired body, revision %s by %s: %s', v.revision, v.actor, v.reason)) \
            ELSE u.reason END, \
            $3, u.executor, u.attempt, u.latency, u.at, d.message_id \
         FROM UNNEST($4::bigint[], $5::text[], $6::text[], $7::text[], $8::text[], $9::int[], $10::bigint[], \
                     $11::timestamptz[]) WITH ORDINALITY AS u(id, key, action, reason, executor, attempt, latency, at, n) \
         JOIN dead_letters d ON d.id = u.id \
         LEFT JOIN dead_letter_revisions v ON v.dead_letter_id = d.id AND v.revision = d.body_revision \
         ORDER BY u.n",
    )
    .bind(lease.plan_id)
    .bind(slice_id)
    .bind(&lease.wave)
    .bind(&ids)
    .bind(&keys)
    .bind(&actions)
    .bind(&reasons)
    .bind(&executors)
    .bind(&attempts)
    .bind(&latencies)
    .bind(&at)
    .execute(&mut **transaction)
    .await?;
        Ok(())
    }
}

/// What a report decides for its items ([`item_outcomes`]): one entry per
/// item, in position order, as three parallel arrays.
#[derive(Debug, Default, PartialEq, Eq)]
struct ItemOutcomes {
    /// Each item's position in its plan.
    positions: Vec<i64>,
    /// The outcome that decides its state.
    actions: Vec<String>,
    /// That outcome's attempt.
    attempts: Vec<i32>,
}

/// The one outcome per item that decides its state, of `outcomes` (each
/// with its item's key and position in `items`, the same length): an
/// item's last `sent` outcome if it has one (a confirmed publish is never
/// undone by a later line of the same report), else its last outcome.
fn item_outcomes(outcomes: &[&Outcome], items: &[(String, i64)]) -> ItemOutcomes {
    let mut decided: std::collections::BTreeMap<i64, &Outcome> = std::collections::BTreeMap::new();
    for (outcome, (_, position)) in outcomes.iter().zip(items) {
        decided
            .entry(*position)
            .and_modify(|kept| {
                if outcome.action == "sent" || kept.action != "sent" {
                    *kept = outcome;
                }
            })
            .or_insert(outcome);
    }
    let mut result = ItemOutcomes::default();
    for (position, outcome) in decided {
        result.positions.push(position);
        result.actions.push(outcome.action.clone());
        result.attempts.push(outcome.attempt);
    }
    result
}

/// The audit action named `name`.
pub fn audit_action(name: &str) -> v1::AuditAction {
    use v1::AuditAction as A;
    [
        A::Sent,
        A::SkippedDuplicate,
        A::SkippedStale,
        A::SkippedState,
        A::NeedsCompensation,
        A::Failed,
        A::Unroutable,
        A::Uncertain,
    ]
    .into_iter()
    .find(|action| action.name() == name)
    .unwrap_or(A::Unspecified)
}

/// An audit event row with its dead letter's message id.
#[derive(sqlx::FromRow)]
struct ExportedEventRow {
    #[sqlx(flatten)]
    event: AuditEventRow,
    message_id: Option<String>,
}

/// An audit event row (columns of [`Store::audit_events`]).
#[derive(sqlx::FromRow)]
struct AuditEventRow {
    id: i64,
    slice_id: Option<i64>,
    dead_letter_id: DeadLetterId,
    message_key: String,
    action: String,
    reason: String,
    wave: String,
    executor_id: String,
    attempt: i32,
    confirm_latency_us: i64,
    at: DateTime<Utc>,
}

impl AuditEventRow {
    /// The event of plan `plan_id` in the API shape.
    fn into_event(self, plan_id: PlanId) -> v1::AuditEvent {
        v1::AuditEvent {
            plan_id: plan_id.to_string(),
            slice_id: self.slice_id.map(|id| id.to_string()).unwrap_or_default(),
            dead_letter_id: self.dead_letter_id.to_string(),
            message_key: self.message_key,
            action: audit_action(&self.action).into(),
            reason: self.reason,
            wave: if self.wave == "canary" {
                v1::Wave::Canary
            } else {
                v1::Wave::Main
            }
            .into(),
            executor_id: self.executor_id,
            attempt: u32::try_from(self.attempt).unwrap_or_default(),
            confirm_latency_us: u64::try_from(self.confirm_latency_us).unwrap_or_default(),
            at: Some(timestamp(self.at)),
            message_id: String::new(),
        }
    }
}

impl Store {
    /// How many items of the plan no executor attempted (still `pending`:
    /// no outcome, nothing published).
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn never_attempted_count(&self, plan_id: PlanId) -> Result<u64, StoreError> {
        // From the per-slice counts the triggers of migration 0017 keep (as
        // the plan's progress is), not a scan of the plan's items.
        let count: i64 = sqlx::query_scalar(
            "SELECT coalesce(sum(items), 0)::bigint FROM plan_item_counts \
             WHERE plan_id = $1 AND state = 'pending'",
        )
        .bind(plan_id)
        .fetch_one(self.pool())
        .await?;
        Ok(u64::try_from(count).unwrap_or_default())
    }

    /// Up to `limit` items of the plan no executor attempted, after plan
    /// position `after` (-1: from the start), in plan order, each with its
    /// position, its dead letter's message id and its wave.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn never_attempted_items(
        &self,
        plan_id: PlanId,
        after: i64,
        limit: i64,
    ) -> Result<Vec<(i64, v1::UnattemptedItem)>, StoreError> {
        let rows: Vec<(i64, DeadLetterId, String, Option<String>, String)> = plan_page(
            self.pool(),
            "SELECT i.position, i.dead_letter_id, i.message_key, d.message_id, s.wave \
             FROM plan_items i JOIN plan_slices s ON s.id = i.slice_id \
             LEFT JOIN dead_letters d ON d.id = i.dead_letter_id \
             WHERE i.plan_id = $1 AND i.state = 'pending' AND i.position > $2 \
             ORDER BY i.position LIMIT $3",
            plan_id,
            after,
            limit,
        )
        .await?;
        Ok(rows
            .into_iter()
            .map(
                |(position, dead_letter_id, message_key, message_id, wave)| {
                    (
                        position,
                        v1::UnattemptedItem {
                            dead_letter_id: dead_letter_id.to_string(),
                            message_key,
                            message_id: message_id.unwrap_or_default(),
                            wave: if wave == "canary" {
                                v1::Wave::Canary
                            } else {
                                v1::Wave::Main
                            }
                            .into(),
                        },
                    )
                },
            )
            .collect())
    }

    /// [`Store::audit_events`] with each event's dead letter's message id
    /// (`""` when none; written with the event, so the same after retention
    /// deleted the dead letter), for the export.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn audit_events_with_message_ids(
        &self,
        plan_id: PlanId,
        after_id: i64,
        limit: i64,
    ) -> Result<Vec<(i64, v1::AuditEvent, String)>, StoreError> {
        let rows: Vec<ExportedEventRow> = plan_page(
            self.pool(),
            "SELECT id, slice_id, dead_letter_id, message_key, action, reason, wave, executor_id, attempt, \
                confirm_latency_us, at, message_id FROM audit_events \
             WHERE plan_id = $1 AND id > $2 ORDER BY id LIMIT $3",
            plan_id,
            after_id,
            limit,
        )
        .await?;
        Ok(rows
            .into_iter()
            .map(|row| {
                (
                    row.event.id,
                    row.event.into_event(plan_id),
                    row.message_id.unwrap_or_default(),
                )
            })
            .collect())
    }

    /// Up to `limit` events of plan `plan_id` after event `after_id`, in id
    /// (commit) order, only `actions` (their names) unless empty, each with
    /// its `message_id` set.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn audit_events_page(
        &self,
        plan_id: PlanId,
        actions: &[String],
        after_id: i64,
        limit: i64,
    ) -> Result<Vec<(i64, v1::AuditEvent)>, StoreError> {
        let rows: Vec<ExportedEventRow> = sqlx::query_as(
            "SELECT id, slice_id, dead_letter_id, message_key, action, reason, wave, executor_id, attempt, \
                confirm_latency_us, at, message_id FROM audit_events \
             WHERE plan_id = $1 AND id > $2 AND (cardinality($4::text[]) = 0 OR action = ANY($4)) \
             ORDER BY id LIMIT $3",
        )
        .bind(plan_id)
        .bind(after_id)
        .bind(limit)
        .bind(actions)
        .fetch_all(self.pool())
        .await?;
        Ok(rows
            .into_iter()
            .map(|row| {
                let id = row.event.id;
                let mut event = row.event.into_event(plan_id);
                event.message_id = row.message_id.unwrap_or_default();
                (id, event)
            })
            .collect())
    }

    /// Message keys the plan sent, in plan order: the reconciliation list.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn sent_keys(&self, plan_id: PlanId) -> Result<Vec<String>, StoreError> {
        plan_keys(
            self.pool(),
            "SELECT message_key FROM plan_items WHERE plan_id = $1 AND state = 'sent' ORDER BY position",
            plan_id,
        )
        .await
    }

    /// Message keys of sent items with an `uncertain` event: published again
    /// after a lost lease or confirm, so possibly delivered twice. Plan order.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn possibly_duplicated_keys(
        &self,
        plan_id: PlanId,
    ) -> Result<Vec<String>, StoreError> {
        plan_keys(
            self.pool(),
            // One pass over the plan's uncertain events, not one per item.
            "SELECT i.message_key FROM plan_items i \
             JOIN (SELECT DISTINCT dead_letter_id FROM audit_events WHERE plan_id = $1 AND action = 'uncertain') u \
               ON u.dead_letter_id = i.dead_letter_id \
             WHERE i.plan_id = $1 AND i.state = 'sent' ORDER BY i.position",
            plan_id,
        )
        .await
    }

    /// The latest audit event of every item that was not sent (skipped, failed,
    /// unroutable, or still uncertain) that agrees with its state (a `failed`
    /// after its last `uncertain` attempt is the one shown), in plan order.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn not_sent_events(
        &self,
        plan_id: PlanId,
    ) -> Result<Vec<v1::AuditEvent>, StoreError> {
        let rows = sqlx::query_as::<_, AuditEventRow>(
            "SELECT * FROM (SELECT DISTINCT ON (e.dead_letter_id) e.id, e.slice_id, e.dead_letter_id, e.message_key, \
                e.action, e.reason, e.wave, e.executor_id, e.attempt, e.confirm_latency_us, e.at, i.position \
             FROM audit_events e JOIN plan_items i ON i.plan_id = e.plan_id AND i.dead_letter_id = e.dead_letter_id \
             WHERE e.plan_id = $1 AND i.state <> 'sent' \
             ORDER BY e.dead_letter_id, (e.action = i.state) DESC, e.id DESC) last ORDER BY position",
        )
        .bind(plan_id)
        .fetch_all(self.pool())
        .await?;
        Ok(rows
            .into_iter()
            .map(|row| row.into_event(plan_id))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::{ItemOutcomes, item_outcomes};
    use crate::{ids::DeadLetterId, store::leases::Outcome};

    fn outcome(id: i64, action: &str, attempt: i32) -> Outcome {
        Outcome {
            dead_letter_id: DeadLetterId::new(id),
            message_key: format!("k{id}"),
            action: action.to_owned(),
            reason: String::new(),
            executor_id: "x".to_owned(),
            attempt,
            confirm_latency_us: 0,
            at: chrono::Utc::now(),
        }
    }

    #[test]
    fn one_outcome_per_item_in_position_order_sent_never_undone() {
        let outcomes = [
            outcome(7, "uncertain", 1),
            outcome(3, "failed", 1),
            outcome(7, "sent", 2),
            outcome(7, "failed", 3),
            outcome(3, "uncertain", 2),
            outcome(9, "sent", 1),
            outcome(9, "sent", 4),
        ];
        let refs: Vec<&Outcome> = outcomes.iter().collect();
        let items: Vec<(String, i64)> = outcomes
            .iter()
            .map(|o| (o.message_key.clone(), o.dead_letter_id.get() * 10))
            .collect();
        assert_eq!(
            item_outcomes(&refs, &items),
            ItemOutcomes {
                positions: vec![30, 70, 90],
                actions: vec!["uncertain".into(), "sent".into(), "sent".into()],
                attempts: vec![2, 2, 4],
            }
        );
        assert_eq!(item_outcomes(&[], &[]), ItemOutcomes::default());
    }
}
