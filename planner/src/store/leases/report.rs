//! A report's lease ([`Tx::report_lease`]) and the end of a lease
//! ([`Tx::end_lease`]), read and written in the report's transaction, with
//! the plan's gate reading and transitions there.

use std::collections::HashMap;

use super::FINAL_ITEM_STATES;
use crate::{
    ids::{DeadLetterId, PlanId, SliceId},
    plan::state::Event,
    store::{
        StoreError, Tx,
        plans::{GateReading, Moved, gate_reading_in, notify, transition_in},
    },
};

/// A report's lease as the store finds it ([`Tx::report_lease`]).
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct ReportLease {
    /// The slice's plan.
    pub plan_id: PlanId,
    /// The slice's wave (`canary` or `main`).
    pub wave: String,
    /// The executor id the lease was claimed with: the audit records it,
    /// whatever a report says.
    pub executor_id: String,
    /// The token is the slice's fencing token now.
    pub current_token: bool,
    /// ... and the slice is still leased under it (not swept, released or
    /// completed).
    pub held: bool,
    /// ... and the lease has not expired.
    pub unexpired: bool,
    /// The lease's write-ahead mark while it is held (`None`: it marked
    /// nothing it may publish, or it was leased without marks).
    pub mark: Option<i64>,
}

/// How a lease ended ([`Tx::end_lease`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseEnd {
    /// The slice's plan.
    pub plan_id: PlanId,
    /// The slice is completed (every item final and not released); else it
    /// is pending again, for another lease.
    pub completed: bool,
}

impl Tx {
    /// The lease a report under `token` from `principal` speaks for, read
    /// with the slice row locked `FOR KEY SHARE` (`None`: the slice never
    /// had this token for this principal, or does not exist).
    ///
    /// The lock: the sweep's and a completion's `FOR UPDATE` wait for (or
    /// skip) a report in progress, so neither ends the lease under it; but
    /// the holder's renewals and write-ahead marks, plain `UPDATE`s of
    /// non-key columns, do not wait behind the report's inserts (they would
    /// hold publishing back for as long).
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn report_lease(
        &mut self,
        slice_id: SliceId,
        token: i64,
        principal: &str,
    ) -> Result<Option<ReportLease>, StoreError> {
        Ok(sqlx::query_as::<_, ReportLease>(
            "SELECT s.plan_id, s.wave, l.executor_id, s.fencing_token = $2 AS current_token, \
                (s.fencing_token = $2 AND s.state = 'leased') AS held, \
                (s.fencing_token = $2 AND s.state = 'leased' AND s.lease_expires_at > now()) AS unexpired, \
                CASE WHEN s.fencing_token = $2 AND s.state = 'leased' THEN s.published_through END AS mark \
             FROM plan_slices s JOIN slice_leases l \
                ON l.slice_id = s.id AND l.fencing_token = $2 AND l.principal = $3 \
             WHERE s.id = $1 FOR KEY SHARE OF s",
        )
        .bind(slice_id)
        .bind(token)
        .bind(principal)
        .fetch_optional(&mut *self.transaction)
        .await?)
    }

    /// The items of slice `slice_id` among `ids`: per dead letter, its plan
    /// item's message key and position. What is recorded about an item
    /// comes from these rows, never from a report. Read by dead letter, one
    /// index lookup per id (`SLICE_MEMBERS_SQL`).
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn slice_members(
        &mut self,
        slice_id: SliceId,
        ids: &[DeadLetterId],
    ) -> Result<HashMap<DeadLetterId, (String, i64)>, StoreError> {
        Ok(
            sqlx::query_as::<_, (DeadLetterId, String, i64)>(super::SLICE_MEMBERS_SQL)
                .bind(slice_id)
                .bind(ids)
                .fetch_all(&mut *self.transaction)
                .await?
                .into_iter()
                .map(|(id, key, position)| (id, (key, position)))
                .collect(),
        )
    }

    /// Ends the lease `token` of `principal` on slice `slice_id`: with
    /// `release`, or when items are left unfinished, the slice goes back to
    /// pending for another lease; otherwise it is completed. Completions of
    /// one plan serialize on the plan row, so the last one sees every other
    /// slice completed. The lease's write-ahead mark goes with it: a later
    /// holder that does not mark is judged by the old rule, not by this
    /// lease's mark.
    ///
    /// # Errors
    /// `Ok(None)` for a token that is not the live lease of `principal`;
    /// [`StoreError`].
    pub async fn end_lease(
        &mut self,
        slice_id: SliceId,
        token: i64,
        principal: &str,
        release: bool,
    ) -> Result<Option<LeaseEnd>, StoreError> {
        sqlx::query("SELECT 1 FROM plans WHERE id = (SELECT plan_id FROM plan_slices WHERE id = $1) FOR NO KEY UPDATE")
            .bind(slice_id)
            .execute(&mut *self.transaction)
            .await?;
        let plan_id: Option<PlanId> = sqlx::query_scalar(
            "SELECT plan_id FROM plan_slices WHERE id = $1 AND fencing_token = $2 AND lease_principal = $3 \
                AND state = 'leased' FOR UPDATE",
        )
        .bind(slice_id)
        .bind(token)
        .bind(principal)
        .fetch_optional(&mut *self.transaction)
        .await?;
        let Some(plan_id) = plan_id else {
            return Ok(None);
        };
        let unfinished: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM plan_items WHERE slice_id = $1 AND NOT (state = ANY($2))",
        )
        .bind(slice_id)
        .bind(FINAL_ITEM_STATES)
        .fetch_one(&mut *self.transaction)
        .await?;
        let completed = !release && unfinished == 0;
        sqlx::query(
            "UPDATE plan_slices SET state = $2, lease_owner = NULL, lease_expires_at = NULL, \
                published_through = NULL WHERE id = $1",
        )
        .bind(slice_id)
        .bind(if completed { "completed" } else { "pending" })
        .execute(&mut *self.transaction)
        .await?;
        Ok(Some(LeaseEnd { plan_id, completed }))
    }

    /// What the gates count for plan `plan_id` now, in this transaction
    /// (`None`: no such plan).
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn gate_reading(
        &mut self,
        plan_id: PlanId,
    ) -> Result<Option<GateReading>, StoreError> {
        gate_reading_in(&mut self.transaction, plan_id).await
    }

    /// Applies `event` to plan `plan_id` by the transition table
    /// ([`crate::plan::state`]), with its follow-ups; counted in the
    /// metrics. See
    /// [`Store::transition_plan`](crate::store::Store::transition_plan).
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn transition(
        &mut self,
        plan_id: PlanId,
        event: Event,
        actor: &str,
        reason: &str,
    ) -> Result<Moved, StoreError> {
        transition_in(
            crate::store::Effects {
                metrics: &self.metrics,
                planner_webhook: self.planner_webhook,
            },
            &mut self.transaction,
            plan_id,
            event,
            actor,
            reason,
        )
        .await
    }

    /// Tells every planner replica that plan `plan_id` changed, when this
    /// transaction commits.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn notify(&mut self, plan_id: PlanId) -> Result<(), StoreError> {
        notify(&mut self.transaction, plan_id).await
    }
}
