//! What a lease's holder asks while it holds the lease: the plan's state
//! ([`Store::lease_state`]), write-ahead marks, renewals, and the items and
//! dead letters a state re-check covers.

use std::time::Duration;

use redrive_proto::v1;
use sqlx::AssertSqlSafe;

use crate::{
    ids::{DeadLetterId, PlanId, SliceId},
    plan::state::State,
    store::{
        StaleToken, Store, StoreError,
        dead_letters::{DeadLetterRow, columns},
    },
};

impl Store {
    /// The plan a lease publishes for and its state, while `token` is the
    /// slice's current, unexpired lease; [`StaleToken`] otherwise.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn lease_state(
        &self,
        slice_id: SliceId,
        token: i64,
        principal: &str,
    ) -> Result<Result<(PlanId, State), StaleToken>, StoreError> {
        let state: Option<(PlanId, State)> = sqlx::query_as(
            "SELECT p.id, p.state FROM plan_slices s JOIN plans p ON p.id = s.plan_id \
             WHERE s.id = $1 AND s.fencing_token = $2 AND s.lease_principal = $3 AND s.state = 'leased' \
               AND s.lease_expires_at > now()",
        )
        .bind(slice_id)
        .bind(token)
        .bind(principal)
        .fetch_optional(self.pool())
        .await?;
        Ok(state.ok_or(StaleToken { slice_id, token }))
    }
    /// Records the write-ahead mark of a lease: its holder may publish the
    /// slice's items up to `position` (docs/design.md, "Precise uncertain
    /// items"). A mark never moves back. Only while `token` is the slice's
    /// current, unexpired lease: the `UPDATE` re-reads the row after a
    /// concurrent [`Store::expire_leases`], so a mark is either recorded
    /// before the lease ends (and its items judged by it) or refused.
    ///
    /// # Errors
    /// `Ok(Err(StaleToken))` for a stale token or an expired lease;
    /// [`StoreError`].
    pub async fn mark_publishing(
        &self,
        slice_id: SliceId,
        token: i64,
        principal: &str,
        position: i64,
    ) -> Result<Result<(), StaleToken>, StoreError> {
        let marked = sqlx::query(
            // NULL stays NULL: a holder that did not claim with marks is
            // judged by the old rule whatever it sends.
            "UPDATE plan_slices SET published_through = CASE WHEN published_through IS NULL THEN NULL \
                ELSE greatest(published_through, $3) END \
             WHERE id = $1 AND fencing_token = $2 AND lease_principal = $4 AND state = 'leased' \
               AND lease_expires_at > now()",
        )
        .bind(slice_id)
        .bind(token)
        .bind(position)
        .bind(principal)
        .execute(self.pool())
        .await?
        .rows_affected();
        Ok(if marked == 1 {
            Ok(())
        } else {
            Err(StaleToken { slice_id, token })
        })
    }
    /// Renews the lease while it has not expired (the same test as
    /// [`Store::lease_state`] and a report's current lease); answers the
    /// plan's state.
    ///
    /// # Errors
    /// `Ok(Err(StaleToken))` when the token is not the slice's current lease.
    pub async fn heartbeat(
        &self,
        slice_id: SliceId,
        token: i64,
        principal: &str,
        ttl: Duration,
    ) -> Result<Result<State, StaleToken>, StoreError> {
        let state: Option<State> = sqlx::query_scalar(
            "UPDATE plan_slices s SET lease_expires_at = now() + $3 * interval '1 millisecond' \
             FROM plans p WHERE s.id = $1 AND s.fencing_token = $2 AND s.lease_principal = $4 \
               AND s.state = 'leased' AND s.lease_expires_at > now() AND p.id = s.plan_id \
             RETURNING p.state",
        )
        .bind(slice_id)
        .bind(token)
        .bind(i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX))
        .bind(principal)
        .fetch_optional(self.pool())
        .await?;
        Ok(state.ok_or(StaleToken { slice_id, token }))
    }
    /// Which of `ids` are items of `slice_id`, and the slice's plan, while
    /// `token` is the slice's current, unexpired lease held by `principal`
    /// (the test of [`Store::lease_state`]): what a state re-check may ask
    /// about.
    ///
    /// # Errors
    /// `Ok(Err(StaleToken))` when the token is not that lease; [`StoreError`].
    pub async fn lease_items(
        &self,
        slice_id: SliceId,
        token: i64,
        principal: &str,
        ids: &[DeadLetterId],
    ) -> Result<Result<(PlanId, Vec<DeadLetterId>), StaleToken>, StoreError> {
        let plan_id: Option<PlanId> = sqlx::query_scalar(
            "SELECT plan_id FROM plan_slices WHERE id = $1 AND fencing_token = $2 AND lease_principal = $3 \
               AND state = 'leased' AND lease_expires_at > now()",
        )
        .bind(slice_id)
        .bind(token)
        .bind(principal)
        .fetch_optional(self.pool())
        .await?;
        let Some(plan_id) = plan_id else {
            return Ok(Err(StaleToken { slice_id, token }));
        };
        let members: Vec<(DeadLetterId, String, i64)> = sqlx::query_as(super::SLICE_MEMBERS_SQL)
            .bind(slice_id)
            .bind(ids)
            .fetch_all(self.pool())
            .await?;
        Ok(Ok((
            plan_id,
            members.into_iter().map(|(id, _, _)| id).collect(),
        )))
    }
    /// The dead letters `ids` with their latest body (repairs) in `body`.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn dead_letters_by_id(
        &self,
        ids: &[DeadLetterId],
    ) -> Result<Vec<v1::DeadLetter>, StoreError> {
        let query = format!(
            "SELECT d.*, coalesce(rev.body, d.body) AS replay_body \
             FROM (SELECT {}, body_revision FROM dead_letters WHERE id = ANY($1)) d \
             LEFT JOIN dead_letter_revisions rev ON rev.dead_letter_id = d.id AND rev.revision = d.body_revision",
            columns(true)
        );
        let rows = sqlx::query_as::<_, ReplayedDeadLetterRow>(AssertSqlSafe(query))
            .bind(ids)
            .fetch_all(self.pool())
            .await?;
        rows.into_iter()
            .map(|row| {
                let mut dead_letter = v1::DeadLetter::try_from(row.dead_letter)?;
                dead_letter.body = row.replay_body;
                Ok(dead_letter)
            })
            .collect()
    }
}

/// A dead letter with the body a replay publishes ([`Store::dead_letters_by_id`]).
#[derive(sqlx::FromRow)]
struct ReplayedDeadLetterRow {
    #[sqlx(flatten)]
    dead_letter: DeadLetterRow,
    replay_body: Vec<u8>,
}
