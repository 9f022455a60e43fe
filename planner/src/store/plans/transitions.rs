//! Plan transitions: the one guarded `UPDATE` per event that
//! [`crate::plan::state`]'s table allows, the operator action it records and
//! the notification it sends.

use redrive_proto::v1;
use sqlx::{AssertSqlSafe, Postgres, Transaction};

use super::super::{Effects, Store, StoreError, webhooks::enqueue_plan_events};
use super::PLAN_CHANNEL;
use crate::{
    ids::PlanId,
    plan::state::{self, Event, State, Target},
    webhooks::events_of_move,
};

/// Records an operator action in `transaction`.
pub(crate) async fn record_action(
    transaction: &mut Transaction<'_, Postgres>,
    plan_id: PlanId,
    action: &str,
    actor: &str,
    reason: &str,
) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO operator_actions (plan_id, action, actor, reason) VALUES ($1, $2, $3, $4)",
    )
    .bind(plan_id)
    .bind(action)
    .bind(actor)
    .bind(reason)
    .execute(&mut **transaction)
    .await?;
    Ok(())
}

/// What a transition did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Moved {
    /// The plan moved to this state.
    To(State),
    /// The plan is in this state and stays there: the event is not allowed
    /// from it, or its extra condition does not hold.
    Refused(State),
    /// No such plan.
    NotFound,
}

/// What an event sets besides `state`, `state_reason` and `paused_from`, and
/// its extra condition besides the state (SQL fragments over plan `$1`; `$5`
/// is the actor for an event that [`Event::approves`]).
fn event_sql(event: Event) -> (String, &'static str) {
    let mut set = String::new();
    if event.approves() {
        set.push_str(", approved_by = $5, approved_at = now()");
    }
    if event.resets_gates() {
        set.push_str(", gates_since = now()");
    }
    let condition = match event {
        Event::CanaryDone => {
            set.push_str(", observing_until = now() + observe_for_ms * interval '1 millisecond'");
            " AND NOT EXISTS (SELECT 1 FROM plan_slices s WHERE s.plan_id = $1 AND s.wave = 'canary' \
             AND s.ramp_step = plans.ramp_step AND s.state <> 'completed')"
        }
        Event::NextWave => {
            set.push_str(", ramp_step = ramp_step + 1");
            " AND ramp_step + 1 < cardinality(ramp_items) AND observing_until <= now()"
        }
        Event::ObservationPassed => {
            " AND ramp_step + 1 >= cardinality(ramp_items) AND observing_until <= now()"
        }
        Event::Resume => {
            // Back into an observation: a whole window again, since what
            // happened while paused was not watched by the gates.
            set.push_str(
                ", observing_until = CASE WHEN paused_from = 'observing' \
                 THEN now() + observe_for_ms * interval '1 millisecond' ELSE observing_until END",
            );
            ""
        }
        Event::Complete => {
            set.push_str(", completed_at = now()");
            " AND NOT EXISTS (SELECT 1 FROM plan_slices WHERE plan_id = $1 AND state <> 'completed')"
        }
        Event::CancelUnclaimed => {
            " AND NOT EXISTS (SELECT 1 FROM plan_slices WHERE plan_id = $1 AND fencing_token > 0)"
        }
        Event::Approve
        | Event::StartSingle
        | Event::Promote
        | Event::Pause
        | Event::GatePause
        | Event::Cancel
        | Event::Abort => "",
    };
    (set, condition)
}

/// Executes `event` on plan `plan_id` inside `transaction` (which the caller
/// commits), as [`crate::plan::state`]'s table says, in one guarded
/// `UPDATE plans SET state = $target ... WHERE id = $1 AND state = ANY($allowed)`
/// plus the event's extra condition. A resume's target is the stored
/// `paused_from` (else the rule's fallback); a pause stores the state it
/// paused from. When the plan moved, records the event's operator action (by
/// `actor` with `reason`) and notifies; then the follow-up the table names
/// ([`state::follow_up`]), e.g. a plan landing in `main` with every slice
/// completed is completed too ([`Event::Complete`]). Each move's webhook
/// events ([`events_of_move`]) are written to the outbox in `transaction`.
///
/// # Errors
/// [`StoreError`].
pub(crate) async fn transition_in(
    effects: Effects<'_>,
    transaction: &mut Transaction<'_, Postgres>,
    plan_id: PlanId,
    event: Event,
    actor: &str,
    reason: &str,
) -> Result<Moved, StoreError> {
    let moved = execute(effects, transaction, plan_id, event, actor, reason).await?;
    if let Moved::To(to) = moved
        && let Some(next) = state::follow_up(event, to.get())
    {
        execute(effects, transaction, plan_id, next, actor, "").await?;
    }
    Ok(moved)
}

/// [`transition_in`] without the completion that may follow; counts the
/// move in `effects`' metrics and writes its webhook events.
async fn execute(
    effects: Effects<'_>,
    transaction: &mut Transaction<'_, Postgres>,
    plan_id: PlanId,
    event: Event,
    actor: &str,
    reason: &str,
) -> Result<Moved, StoreError> {
    let rule = event.rule();
    let (target, fallback) = match rule.to {
        Target::To(state) => ("$2", state),
        Target::PausedFrom { otherwise } => ("coalesce(paused_from, $2)", otherwise),
    };
    let paused_from = if rule.to == Target::To(v1::PlanState::Paused) {
        "state"
    } else {
        "NULL"
    };
    let (set, condition) = event_sql(event);
    let sql = format!(
        "UPDATE plans SET state = {target}, state_reason = $3, paused_from = {paused_from}{set} \
         WHERE id = $1 AND state = ANY($4){condition} RETURNING state"
    );
    // The state's reason is kept for the states that need one; every
    // action's reason stays in the operator actions.
    let state_reason = if state::target_keeps_reason(rule.to) {
        reason
    } else {
        ""
    };
    let mut query = sqlx::query_scalar::<_, State>(AssertSqlSafe(sql))
        .bind(plan_id)
        .bind(fallback.name())
        .bind(state_reason)
        .bind(state::names(rule.from));
    if event.approves() {
        query = query.bind(actor);
    }
    let Some(to) = query.fetch_optional(&mut **transaction).await? else {
        let state: Option<State> = sqlx::query_scalar("SELECT state FROM plans WHERE id = $1")
            .bind(plan_id)
            .fetch_optional(&mut **transaction)
            .await?;
        return Ok(state.map_or(Moved::NotFound, Moved::Refused));
    };
    if let Some(action) = event.action() {
        record_action(transaction, plan_id, action, actor, reason).await?;
    }
    notify(transaction, plan_id).await?;
    let events = events_of_move(to, actor);
    if !events.is_empty() {
        enqueue_plan_events(
            transaction,
            effects.planner_webhook,
            plan_id,
            &events,
            actor,
            reason,
        )
        .await?;
    }
    // Counted when executed: a transaction that then fails to commit is
    // counted too (PostgreSQL unreachable at that instant).
    effects.metrics.plan_moved(to.get());
    // An event on the current span (the RPC's, the gates' or a report's).
    tracing::info!(plan.id = %plan_id, plan.state = to.name(), "plan state changed");
    Ok(Moved::To(to))
}

/// Sends the plan-change notification inside `transaction` (delivered on commit).
pub(crate) async fn notify(
    transaction: &mut Transaction<'_, Postgres>,
    plan_id: PlanId,
) -> Result<(), StoreError> {
    sqlx::query("SELECT pg_notify($1, $2)")
        .bind(PLAN_CHANNEL)
        .bind(plan_id.to_string())
        .execute(&mut **transaction)
        .await?;
    Ok(())
}

impl Store {
    /// Executes `event` on a plan in one transaction, as
    /// [`crate::plan::state`]'s table says, in one guarded
    /// `UPDATE plans SET state = $target ... WHERE id = $1 AND state = ANY($allowed)`
    /// plus the event's extra condition; records its operator action by
    /// `actor` with `reason` and notifies when the plan moved; a plan that
    /// lands in `main` with every slice completed is completed too.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn transition_plan(
        &self,
        plan_id: PlanId,
        event: Event,
        actor: &str,
        reason: &str,
    ) -> Result<Moved, StoreError> {
        let mut transaction = self.pool().begin().await?;
        let moved = transition_in(
            self.effects(),
            &mut transaction,
            plan_id,
            event,
            actor,
            reason,
        )
        .await?;
        transaction.commit().await?;
        Ok(moved)
    }
}
