//! Single dead letters: plans of one (`ReplayDeadLetter`) and body repairs
//! (`RepairDeadLetter`).
//!
//! Both take a transaction-scoped advisory lock on the dead letter, so that two
//! calls for the same dead letter (on any planner replica) run one after the
//! other: a second replay sees the first one's plan, and a repair never lands
//! under a plan that is about to publish the old body.

use std::time::Duration;

use sqlx::{Postgres, Transaction};

use super::{
    Store, StoreError,
    freeze::{self, Freeze},
    plans::{CreateOutcome, Moved, NewPlan, insert_plan, transition_in},
};
use crate::{
    ids::{DeadLetterId, PlanId},
    plan::state::{self, Event, State},
};

/// A plan that may still publish a dead letter: its id and state.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct ActivePlan {
    /// The plan.
    #[sqlx(rename = "id")]
    pub plan_id: PlanId,
    /// Its state: any state not final (`awaiting_approval`, `canary`,
    /// `observing`, `main`, `paused`).
    pub state: State,
}

/// What creating a plan of one found.
#[derive(Debug)]
pub enum SingleOutcome {
    /// Created, approved and in `main`.
    Created,
    /// The dead letter is an unfinished item of another plan.
    InPlan(ActivePlan),
    /// The precheck did not make it replayable (or is missing).
    NotCreated(CreateOutcome),
}

/// What a repair found.
#[derive(Debug, PartialEq, Eq)]
pub enum RepairOutcome {
    /// Stored as this revision (1 for the first repair).
    Repaired(u32),
    /// No such dead letter.
    NotFound,
    /// The new body is the body replays use now.
    Unchanged,
    /// The dead letter is an unfinished item of a plan.
    InPlan(ActivePlan),
}

/// Where a plan of one stands, for the caller waiting on it.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct SingleProgress {
    /// The plan's state.
    #[sqlx(rename = "state")]
    pub plan_state: State,
    /// Why it is in that state (cancel or abort reason).
    #[sqlx(rename = "state_reason")]
    pub plan_reason: String,
    /// The item's state (`pending`, `uncertain` or a final action).
    pub item_state: String,
    /// Whether an executor ever leased the slice.
    pub claimed: bool,
}

/// Serializes work on one dead letter until `transaction` ends.
async fn lock_dead_letter(
    transaction: &mut Transaction<'_, Postgres>,
    dead_letter_id: DeadLetterId,
) -> Result<(), StoreError> {
    sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended('redrive-dead-letter:' || $1, 0))")
        .bind(dead_letter_id)
        .execute(&mut **transaction)
        .await?;
    Ok(())
}

/// A plan in which `dead_letter_id` is still to be published, if any: one in
/// a state not final, with the dead letter's item pending or uncertain.
async fn active_plan_of(
    transaction: &mut Transaction<'_, Postgres>,
    dead_letter_id: DeadLetterId,
) -> Result<Option<ActivePlan>, StoreError> {
    Ok(sqlx::query_as(
        "SELECT p.id, p.state FROM plan_items i JOIN plans p ON p.id = i.plan_id \
         WHERE i.dead_letter_id = $1 AND i.state IN ('pending', 'uncertain') AND p.state = ANY($2) \
         ORDER BY p.created_at LIMIT 1",
    )
    .bind(dead_letter_id)
    .bind(state::names_where(|state| !state.is_final()))
    .fetch_optional(&mut **transaction)
    .await?)
}

impl Store {
    /// Creates the plan of one for `dead_letter_id` from `plan.precheck_id` and
    /// approves it straight into `main` (no canary: `plan.canary_fraction` must
    /// be 0), recording `create` and `approve` by `plan.actor` with `reason`,
    /// unless the dead letter is still to be published by another plan. No
    /// executor can start it after `claim_within` (see [`Store::cancel_unclaimed`]).
    ///
    /// # Errors
    /// [`StoreError`]; nothing is created then.
    pub async fn create_single_plan(
        &self,
        plan: &NewPlan,
        dead_letter_id: DeadLetterId,
        reason: &str,
        claim_within: Duration,
    ) -> Result<SingleOutcome, StoreError> {
        let mut transaction = self.pool().begin().await?;
        lock_dead_letter(&mut transaction, dead_letter_id).await?;
        if let Some(active) = active_plan_of(&mut transaction, dead_letter_id).await? {
            return Ok(SingleOutcome::InPlan(active));
        }
        match insert_plan(&mut transaction, plan).await? {
            CreateOutcome::Created => {}
            other => return Ok(SingleOutcome::NotCreated(other)),
        }
        sqlx::query(
            "UPDATE plans SET claim_by = now() + $2 * interval '1 millisecond' WHERE id = $1",
        )
        .bind(plan.id)
        .bind(i64::try_from(claim_within.as_millis()).unwrap_or(i64::MAX))
        .execute(&mut *transaction)
        .await?;
        match transition_in(
            self.effects(),
            &mut transaction,
            plan.id,
            Event::StartSingle,
            &plan.actor,
            reason,
        )
        .await?
        {
            Moved::To(_) => {}
            moved => {
                return Err(StoreError::Corrupt(format!(
                    "plan of one {} could not start: {moved:?}",
                    plan.id
                )));
            }
        }
        transaction.commit().await?;
        Ok(SingleOutcome::Created)
    }

    /// The plan of one's state and its item's, or `None` for an unknown plan.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn single_progress(
        &self,
        plan_id: PlanId,
    ) -> Result<Option<SingleProgress>, StoreError> {
        Ok(sqlx::query_as(
            "SELECT p.state, p.state_reason, i.state AS item_state, s.fencing_token > 0 AS claimed \
             FROM plans p JOIN plan_items i ON i.plan_id = p.id JOIN plan_slices s ON s.id = i.slice_id \
             WHERE p.id = $1 LIMIT 1",
        )
        .bind(plan_id)
        .fetch_optional(self.pool())
        .await?)
    }

    /// Cancels a plan in `main` or `paused` whose slices no executor has leased
    /// yet, recording `cancel` by `actor` with `reason`; `false` when a slice
    /// was leased (an executor may be publishing) or the plan is in another
    /// state. Claims skip slices locked here, so none can start in between.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn cancel_unclaimed(
        &self,
        plan_id: PlanId,
        actor: &str,
        reason: &str,
    ) -> Result<bool, StoreError> {
        let mut transaction = self.pool().begin().await?;
        // Lock the slices: claims skip them until this ends.
        sqlx::query("SELECT 1 FROM plan_slices WHERE plan_id = $1 FOR UPDATE")
            .bind(plan_id)
            .execute(&mut *transaction)
            .await?;
        let cancelled = matches!(
            transition_in(
                self.effects(),
                &mut transaction,
                plan_id,
                Event::CancelUnclaimed,
                actor,
                reason
            )
            .await?,
            Moved::To(_)
        );
        if cancelled {
            transaction.commit().await?;
        }
        Ok(cancelled)
    }

    /// Plans of one whose claim deadline passed with no slice ever leased (their
    /// caller was told NOT_REPLAYED, or its planner stopped while waiting).
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn unclaimed_past_deadline(&self) -> Result<Vec<PlanId>, StoreError> {
        Ok(sqlx::query_scalar(
            "SELECT p.id FROM plans p WHERE p.claim_by < now() AND p.state = ANY($1) \
             AND NOT EXISTS (SELECT 1 FROM plan_slices s WHERE s.plan_id = p.id AND s.fencing_token > 0)",
        )
        .bind(state::names(Event::CancelUnclaimed.allowed()))
        .fetch_all(self.pool())
        .await?)
    }

    /// Stores `body` as the next revision of `dead_letter_id` and makes it the
    /// body prechecks and replays use, unless a plan is still to publish the
    /// dead letter or the body is the one in use already.
    ///
    /// # Errors
    /// [`StoreError`]; nothing is stored then.
    pub async fn repair_dead_letter(
        &self,
        dead_letter_id: DeadLetterId,
        body: &[u8],
        body_sha256: &[u8; 32],
        actor: &str,
        reason: &str,
    ) -> Result<RepairOutcome, StoreError> {
        let mut transaction = self.pool().begin().await?;
        lock_dead_letter(&mut transaction, dead_letter_id).await?;
        // A plan being created (of this dead letter or not) ends first, so
        // the check below sees it ([`super::freeze`]).
        freeze::lock(&mut transaction, Freeze::Exclusive).await?;
        let current: Option<(Option<i32>, Vec<u8>)> = sqlx::query_as(
            "SELECT d.body_revision, coalesce(v.body_sha256, d.body_sha256) FROM dead_letters d \
             LEFT JOIN dead_letter_revisions v ON v.dead_letter_id = d.id AND v.revision = d.body_revision \
             WHERE d.id = $1 FOR UPDATE OF d",
        )
        .bind(dead_letter_id)
        .fetch_optional(&mut *transaction)
        .await?;
        let Some((revision, current_sha256)) = current else {
            return Ok(RepairOutcome::NotFound);
        };
        if current_sha256 == body_sha256 {
            return Ok(RepairOutcome::Unchanged);
        }
        if let Some(active) = active_plan_of(&mut transaction, dead_letter_id).await? {
            return Ok(RepairOutcome::InPlan(active));
        }
        let next = revision.unwrap_or(0) + 1;
        sqlx::query(
            "INSERT INTO dead_letter_revisions (dead_letter_id, revision, body, body_sha256, actor, reason) \
             VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind(dead_letter_id)
        .bind(next)
        .bind(body)
        .bind(&body_sha256[..])
        .bind(actor)
        .bind(reason)
        .execute(&mut *transaction)
        .await?;
        sqlx::query("UPDATE dead_letters SET body_revision = $2 WHERE id = $1")
            .bind(dead_letter_id)
            .bind(next)
            .execute(&mut *transaction)
            .await?;
        transaction.commit().await?;
        Ok(RepairOutcome::Repaired(
            u32::try_from(next).unwrap_or_default(),
        ))
    }
}
