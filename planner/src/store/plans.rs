//! Plans: creation from a precheck (items and slices in one transaction),
//! approval, reads with progress counts, and operator actions.

use chrono::{DateTime, Utc};
use prost::Message;
use redrive_proto::{limits::MAX_PLAN_ACTIONS_SHOWN, time::timestamp, v1};
use sqlx::{AssertSqlSafe, Postgres, Transaction};

use super::{Store, StoreError, Tx};
use crate::{
    ids::{DeadLetterId, PlanId, PrecheckId},
    metrics::PlannerMetrics,
    plan::state::{self, Event, State, Target},
};

/// The NOTIFY channel for plan changes; the payload is the plan id.
pub const PLAN_CHANNEL: &str = "redrive_plans";

/// Where a plan publishes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DestinationMode {
    /// The queue each message died in, through the default exchange.
    Queue,
    /// The exchange and routing key of each message's death.
    Exchange,
    /// A fixed exchange and routing key.
    Redirect {
        /// Exchange ("" is the default exchange).
        exchange: String,
        /// Routing key.
        routing_key: String,
    },
}

/// A plan to create (validated).
#[derive(Debug, Clone)]
pub struct NewPlan {
    /// Its id.
    pub id: PlanId,
    /// The precheck it freezes.
    pub precheck_id: PrecheckId,
    /// Messages per second.
    pub per_second: f64,
    /// Burst.
    pub burst: u32,
    /// Why that rate.
    pub rationale: String,
    /// Destination mode.
    pub destination: DestinationMode,
    /// Items per slice.
    pub slice_size: u32,
    /// Canary share of the items.
    pub canary_fraction: f64,
    /// Observation window after the canary, in milliseconds.
    pub observe_for_ms: i64,
    /// Who creates it.
    pub actor: String,
    /// Published in dead-letter order (one slice at a time).
    pub ordered: bool,
}

/// What creating a plan found.
#[derive(Debug)]
pub enum CreateOutcome {
    /// Created.
    Created,
    /// No such precheck.
    PrecheckNotFound,
    /// The precheck is not done (running or failed).
    PrecheckNotDone,
    /// The precheck has no replayable item.
    NothingReplayable,
    /// Some of its replayable dead letters were archived or deleted
    /// (retention) since the precheck: what changed.
    ChangedSincePrecheck(String),
}

/// The replayable dead letters of precheck `$1` locked `FOR SHARE` (archive
/// and retention lock them `FOR UPDATE`, so neither crosses a plan being
/// created): how many are still stored, how many are archived, and the
/// lowest archived id.
const FROZEN_DEAD_LETTERS_SQL: &str = "WITH held AS (SELECT d.id, d.archived_at FROM dead_letters d \
    JOIN precheck_items i ON i.dead_letter_id = d.id \
    WHERE i.precheck_id = $1 AND i.verdict = 'replayable' FOR SHARE OF d) \
    SELECT count(*) AS stored, count(*) FILTER (WHERE archived_at IS NOT NULL) AS archived, \
    min(id) FILTER (WHERE archived_at IS NOT NULL) AS first_archived FROM held";

/// A row of [`FROZEN_DEAD_LETTERS_SQL`].
#[derive(sqlx::FromRow)]
struct FrozenDeadLettersRow {
    stored: i64,
    archived: i64,
    first_archived: Option<DeadLetterId>,
}

fn destination_columns(
    destination: &DestinationMode,
) -> (&'static str, Option<&str>, Option<&str>) {
    match destination {
        DestinationMode::Queue => ("queue", None, None),
        DestinationMode::Exchange => ("exchange", None, None),
        DestinationMode::Redirect {
            exchange,
            routing_key,
        } => ("redirect", Some(exchange), Some(routing_key)),
    }
}

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
            " AND NOT EXISTS (SELECT 1 FROM plan_slices WHERE plan_id = $1 AND wave = 'canary' \
             AND state <> 'completed')"
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
        | Event::ObservationPassed
        | Event::Promote
        | Event::Pause
        | Event::GatePause
        | Event::Resume
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
/// completed is completed too ([`Event::Complete`]).
///
/// # Errors
/// [`StoreError`].
pub(crate) async fn transition_in(
    metrics: &PlannerMetrics,
    transaction: &mut Transaction<'_, Postgres>,
    plan_id: PlanId,
    event: Event,
    actor: &str,
    reason: &str,
) -> Result<Moved, StoreError> {
    let moved = execute(metrics, transaction, plan_id, event, actor, reason).await?;
    if let Moved::To(to) = moved
        && let Some(next) = state::follow_up(event, to.get())
    {
        execute(metrics, transaction, plan_id, next, actor, "").await?;
    }
    Ok(moved)
}

/// [`transition_in`] without the completion that may follow; counts the
/// move in `metrics`.
async fn execute(
    metrics: &PlannerMetrics,
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
    // Counted when executed: a transaction that then fails to commit is
    // counted too (PostgreSQL unreachable at that instant).
    metrics.plan_moved(to.get());
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
    /// Freezes the precheck's replayable items, in dead-letter order, into a
    /// plan awaiting approval: canary slices first, then main slices.
    ///
    /// # Errors
    /// [`StoreError`]; nothing is created then.
    pub async fn create_plan(&self, plan: &NewPlan) -> Result<CreateOutcome, StoreError> {
        let mut transaction = self.pool().begin().await?;
        let outcome = insert_plan(&mut transaction, plan).await?;
        if matches!(outcome, CreateOutcome::Created) {
            transaction.commit().await?;
        }
        Ok(outcome)
    }
}

/// Inserts the plan, its slices and items and the `create` action in
/// `transaction` (see [`Store::create_plan`]). A `canary_fraction` of 0 makes no
/// canary wave (plans of one, `ReplayDeadLetter`).
pub(crate) async fn insert_plan(
    transaction: &mut Transaction<'_, Postgres>,
    plan: &NewPlan,
) -> Result<CreateOutcome, StoreError> {
    let precheck = sqlx::query_as::<_, FrozenPrecheckRow>(
        "SELECT state, digest, actor, report FROM prechecks WHERE id = $1 FOR SHARE",
    )
    .bind(plan.precheck_id)
    .fetch_optional(&mut **transaction)
    .await?;
    let Some(precheck) = precheck else {
        return Ok(CreateOutcome::PrecheckNotFound);
    };
    if precheck.state != "done" {
        return Ok(CreateOutcome::PrecheckNotDone);
    }
    let digest = precheck.digest.unwrap_or_default();
    let total: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM precheck_items WHERE precheck_id = $1 AND verdict = 'replayable'",
    )
    .bind(plan.precheck_id)
    .fetch_one(&mut **transaction)
    .await?;
    if total == 0 {
        return Ok(CreateOutcome::NothingReplayable);
    }
    let frozen = sqlx::query_as::<_, FrozenDeadLettersRow>(FROZEN_DEAD_LETTERS_SQL)
        .bind(plan.precheck_id)
        .fetch_one(&mut **transaction)
        .await?;
    if let Some(first) = frozen.first_archived {
        return Ok(CreateOutcome::ChangedSincePrecheck(format!(
            "{} of its replayable dead letters (dead letter {first} first) were archived since",
            frozen.archived
        )));
    }
    if frozen.stored < total {
        return Ok(CreateOutcome::ChangedSincePrecheck(format!(
            "{} of its replayable dead letters were deleted by retention since",
            total - frozen.stored
        )));
    }
    let canary = if plan.canary_fraction > 0.0 {
        ((total as f64 * plan.canary_fraction).ceil() as i64).clamp(1, total)
    } else {
        0
    };
    let slice_size = i64::from(plan.slice_size);
    let canary_slices = (canary + slice_size - 1) / slice_size;
    let main_slices = (total - canary + slice_size - 1) / slice_size;
    let (mode, redirect_exchange, redirect_routing_key) = destination_columns(&plan.destination);
    sqlx::query(
            "INSERT INTO plans (id, precheck_id, precheck_digest, state, rate_per_second, rate_burst, \
             rate_rationale, destination_mode, redirect_exchange, redirect_routing_key, slice_size, \
             canary_fraction, observe_for_ms, total_items, canary_items, created_by, ordered) \
             VALUES ($1, $2, $3, 'awaiting_approval', $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16)",
        )
        .bind(plan.id)
        .bind(plan.precheck_id)
        .bind(&digest)
        .bind(plan.per_second)
        .bind(i32::try_from(plan.burst).unwrap_or(i32::MAX))
        .bind(&plan.rationale)
        .bind(mode)
        .bind(redirect_exchange)
        .bind(redirect_routing_key)
        .bind(i32::try_from(plan.slice_size).unwrap_or(i32::MAX))
        .bind(plan.canary_fraction)
        .bind(plan.observe_for_ms)
        .bind(total)
        .bind(canary)
        .bind(&plan.actor)
        .bind(plan.ordered)
        .execute(&mut **transaction)
        .await?;
    sqlx::query(
            "INSERT INTO plan_slices (plan_id, seq, wave) \
             SELECT $1, g, CASE WHEN g < $2 THEN 'canary' ELSE 'main' END FROM generate_series(0, $3 - 1) g",
        )
        .bind(plan.id)
        .bind(canary_slices)
        .bind(canary_slices + main_slices)
        .execute(&mut **transaction)
        .await?;
    // Each item's route and send-time deadline are decided here, once.
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO plan_items (plan_id, position, slice_id, dead_letter_id, message_key, \
                                 exchange, routing_key, stale_at) \
             SELECT $1, r.position, s.id, r.dead_letter_id, r.message_key, \
                    r.exchange, r.routing_key, r.stale_at \
             FROM (SELECT i.dead_letter_id, d.message_key, i.stale_at, \
                          {ITEM_EXCHANGE_SQL} AS exchange, {ITEM_ROUTING_KEY_SQL} AS routing_key, \
                          row_number() OVER (ORDER BY i.dead_letter_id) AS position \
                   FROM precheck_items i JOIN dead_letters d ON d.id = i.dead_letter_id \
                   JOIN plans p ON p.id = $1 \
                   WHERE i.precheck_id = $2 AND i.verdict = 'replayable') r \
             JOIN plan_slices s ON s.plan_id = $1 AND s.seq = CASE \
                 WHEN r.position <= $3 THEN (r.position - 1) / $4 \
                 ELSE $5 + (r.position - $3 - 1) / $4 END"
    )))
    .bind(plan.id)
    .bind(plan.precheck_id)
    .bind(canary)
    .bind(slice_size)
    .bind(canary_slices)
    .execute(&mut **transaction)
    .await?;
    record_action(transaction, plan.id, "create", &plan.actor, &plan.rationale).await?;
    // A precheck that overrode the planner's policy says so in the plan's
    // actions, by whoever overrode it.
    let report = precheck
        .report
        .map(|report| v1::PrecheckReport::decode(report.as_slice()))
        .transpose()
        .map_err(|error| StoreError::Corrupt(error.to_string()))?;
    if let Some(options) = report
        .and_then(|report| report.options)
        .filter(|options| options.override_policy)
    {
        record_action(
            transaction,
            plan.id,
            "override_policy",
            &precheck.actor,
            &format!(
                "precheck {} overrode the planner's precheck policy: {}",
                plan.precheck_id, options.override_reason
            ),
        )
        .await?;
    }
    Ok(CreateOutcome::Created)
}

/// The precheck a plan freezes, as [`insert_plan`] reads it.
#[derive(sqlx::FromRow)]
struct FrozenPrecheckRow {
    state: String,
    digest: Option<String>,
    actor: String,
    report: Option<Vec<u8>>,
}

/// Changes since a precheck listed when an approval is refused for them.
pub const CHANGES_LISTED: usize = 10;

/// The approval check, one query with the plan row locked: the precheck's age
/// in seconds, and what happened to the plan's dead letters since the
/// precheck started, oldest first. Replays are found through the audit's
/// `sent` and `uncertain` events (written with the report of the send, and
/// covering another dead letter with the same key and destination, found by
/// the `audit_events_replayed` index); repairs through
/// `dead_letter_revisions`.
const APPROVE_CHECK_SQL: &str = "SELECT p.state, p.precheck_id, \
    extract(epoch FROM now() - c.created_at)::float8 AS age_seconds, \
    ARRAY(SELECT z.what FROM ( \
        SELECT 'dead letter ' || r.dead_letter_id || ': its message key ' || r.message_key || \
               ' was replayed by plan ' || r.plan_id || ' at ' || \
               to_char(r.at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"') AS what, r.at AS at \
        FROM (SELECT DISTINCT ON (i.dead_letter_id, e.plan_id) i.dead_letter_id, e.message_key, e.plan_id, e.at \
              FROM plan_items i JOIN dead_letters d ON d.id = i.dead_letter_id \
              JOIN audit_events e ON e.message_key = ANY(d.previous_message_keys || d.message_key) \
                AND e.destination = d.destination \
              WHERE i.plan_id = p.id AND e.action IN ('sent', 'uncertain') AND e.at >= c.created_at \
                AND e.plan_id <> p.id \
              ORDER BY i.dead_letter_id, e.plan_id, e.action = 'sent' DESC, e.at DESC) r \
        UNION ALL \
        SELECT 'dead letter ' || v.dead_letter_id || ' was repaired (revision ' || v.revision || ' by ' || \
               v.actor || ' at ' || to_char(v.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"') || ')', \
               v.created_at \
        FROM dead_letter_revisions v JOIN plan_items i ON i.dead_letter_id = v.dead_letter_id AND i.plan_id = p.id \
        WHERE v.created_at >= c.created_at \
        ORDER BY 2 LIMIT $2) z ORDER BY z.at) AS changes \
    FROM plans p JOIN prechecks c ON c.id = p.precheck_id WHERE p.id = $1 FOR UPDATE OF p";

/// A row of [`APPROVE_CHECK_SQL`].
#[derive(sqlx::FromRow)]
struct ApproveCheckRow {
    state: State,
    precheck_id: PrecheckId,
    age_seconds: f64,
    changes: Vec<String>,
}

/// What an approval is judged by ([`Tx::approval_check`]).
#[derive(Debug, Clone, PartialEq)]
pub struct ApprovalCheck {
    /// The plan's state.
    pub state: State,
    /// Its precheck.
    pub precheck_id: PrecheckId,
    /// How long ago its precheck started.
    pub age: std::time::Duration,
    /// Since its precheck started, what happened to its dead letters (a
    /// replay by another plan, or of their message key; a repair), oldest
    /// first: at most [`CHANGES_LISTED`] + 1 lines (one more tells that
    /// there are more).
    pub changes: Vec<String>,
}

impl Tx {
    /// What approving plan `plan_id` is judged by, read with the plan row
    /// locked (one query; `None`: no such plan).
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn approval_check(
        &mut self,
        plan_id: PlanId,
    ) -> Result<Option<ApprovalCheck>, StoreError> {
        let check = sqlx::query_as::<_, ApproveCheckRow>(APPROVE_CHECK_SQL)
            .bind(plan_id)
            .bind(i64::try_from(CHANGES_LISTED + 1).unwrap_or(i64::MAX))
            .fetch_optional(&mut *self.transaction)
            .await?;
        Ok(check.map(|row| ApprovalCheck {
            state: row.state,
            precheck_id: row.precheck_id,
            age: std::time::Duration::from_secs_f64(row.age_seconds.max(0.0)),
            changes: row.changes,
        }))
    }
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
            &self.metrics,
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

    /// The plan with its progress, actions and counts.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn get_plan(&self, plan_id: PlanId) -> Result<Option<v1::Plan>, StoreError> {
        let row = sqlx::query_as::<_, PlanRow>(AssertSqlSafe(format!(
            "SELECT {PLAN_COLUMNS} FROM plans p WHERE p.id = $1"
        )))
        .bind(plan_id)
        .fetch_optional(self.pool())
        .await?;
        let Some(row) = row else { return Ok(None) };
        let mut plan = v1::Plan::from(row);
        // The newest actions, and how many the plan has in all.
        let mut actions = sqlx::query_as::<_, OperatorActionRow>(
            "SELECT action, actor, reason, at, count(*) OVER () AS total \
             FROM operator_actions WHERE plan_id = $1 ORDER BY id DESC LIMIT $2",
        )
        .bind(plan_id)
        .bind(MAX_PLAN_ACTIONS_SHOWN)
        .fetch_all(self.pool())
        .await?;
        actions.reverse();
        let total = actions.first().map_or(0, |row| row.total);
        plan.actions_omitted = u64::try_from(total)
            .unwrap_or(0)
            .saturating_sub(actions.len() as u64);
        plan.actions = actions.into_iter().map(v1::OperatorAction::from).collect();
        Ok(Some(plan))
    }

    /// How many plans are in each state (states with none are absent):
    /// what the `redrive.planner.plans` gauge shows.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn count_plans_by_state(&self) -> Result<Vec<(State, u64)>, StoreError> {
        let rows: Vec<(State, i64)> =
            sqlx::query_as("SELECT state, count(*) FROM plans GROUP BY state")
                .fetch_all(self.pool())
                .await?;
        Ok(rows
            .into_iter()
            .map(|(state, count)| (state, u64::try_from(count).unwrap_or(0)))
            .collect())
    }

    /// Plans, newest first, optionally in some states, after `before` (a
    /// `created_at` + id cursor).
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn list_plans(
        &self,
        states: &[String],
        kinds: &[String],
        before: Option<(DateTime<Utc>, PlanId)>,
        page_size: u32,
    ) -> Result<Vec<v1::Plan>, StoreError> {
        let rows = sqlx::query_as::<_, PlanRow>(AssertSqlSafe(format!(
            "SELECT {PLAN_COLUMNS} FROM plans p \
             WHERE (cardinality($1::text[]) = 0 OR p.state = ANY($1)) \
             AND (cardinality($5::text[]) = 0 OR {PLAN_KIND} = ANY($5)) \
             AND ($2::timestamptz IS NULL OR (p.created_at, p.id) < ($2, $3)) \
             ORDER BY p.created_at DESC, p.id DESC LIMIT $4"
        )))
        .bind(states)
        .bind(before.map(|(at, _)| at))
        .bind(before.map(|(_, id)| id))
        .bind(i64::from(page_size))
        .bind(kinds)
        .fetch_all(self.pool())
        .await?;
        Ok(rows.into_iter().map(v1::Plan::from).collect())
    }
}

/// A plan's kind, `bulk` or `single`: a single replay's plan is the one
/// with a claim deadline (`claim_by`, set by `ReplayDeadLetter`).
const PLAN_KIND: &str = "(CASE WHEN p.claim_by IS NULL THEN 'bulk' ELSE 'single' END)";

/// Plan columns with progress aggregated from its items and slices.
const PLAN_COLUMNS: &str = "p.id, p.precheck_id, p.precheck_digest, p.state, p.state_reason, p.rate_per_second, \
    p.rate_burst, p.rate_rationale, p.destination_mode, p.redirect_exchange, p.redirect_routing_key, \
    p.slice_size, p.canary_fraction, p.observe_for_ms, p.total_items, p.canary_items, p.created_by, \
    p.created_at, p.approved_by, p.approved_at, p.completed_at, p.warnings, \
    p.observing_until, (p.claim_by IS NOT NULL) AS single, p.ordered, \
    (SELECT count(*) FROM plan_slices s WHERE s.plan_id = p.id) AS slices_total, \
    (SELECT count(*) FROM plan_slices s WHERE s.plan_id = p.id AND s.state = 'completed') AS slices_completed, \
    (SELECT coalesce(jsonb_object_agg(c.state, c.n), '{}'::jsonb) FROM \
        (SELECT state, sum(items)::bigint AS n FROM plan_item_counts k WHERE k.plan_id = p.id \
         GROUP BY state HAVING sum(items) <> 0) c) AS item_states";

/// `ActionCounts` from item states (`{"sent": 3, ...}`), and how many are final.
pub fn action_counts(states: &serde_json::Value) -> (v1::ActionCounts, u64) {
    let count = |name: &str| {
        states
            .get(name)
            .and_then(serde_json::Value::as_u64)
            .unwrap_or(0)
    };
    let counts = v1::ActionCounts {
        sent: count("sent"),
        skipped_duplicate: count("skipped_duplicate"),
        skipped_stale: count("skipped_stale"),
        skipped_state: count("skipped_state"),
        needs_compensation: count("needs_compensation"),
        failed: count("failed"),
        unroutable: count("unroutable"),
        uncertain: count("uncertain"),
    };
    let done = counts.sent
        + counts.skipped_duplicate
        + counts.skipped_stale
        + counts.skipped_state
        + counts.needs_compensation
        + counts.failed
        + counts.unroutable;
    (counts, done)
}

/// An operator action as [`Store::get_plan`] reads it.
#[derive(sqlx::FromRow)]
struct OperatorActionRow {
    action: String,
    actor: String,
    reason: String,
    at: DateTime<Utc>,
    /// Actions of the plan in all.
    total: i64,
}

impl From<OperatorActionRow> for v1::OperatorAction {
    fn from(row: OperatorActionRow) -> Self {
        Self {
            action: row.action,
            actor: row.actor,
            reason: row.reason,
            at: Some(timestamp(row.at)),
        }
    }
}

/// A plan's rate columns (`plans` and a claimed slice's plan).
#[derive(sqlx::FromRow)]
pub(super) struct RateRow {
    rate_per_second: f64,
    rate_burst: i32,
    rate_rationale: String,
}

impl From<RateRow> for v1::Rate {
    fn from(row: RateRow) -> Self {
        Self {
            per_second: row.rate_per_second,
            burst: u32::try_from(row.rate_burst).unwrap_or(1),
            rationale: row.rate_rationale,
        }
    }
}

/// A plan's destination columns; an unknown mode reads as `queue`.
#[derive(sqlx::FromRow)]
pub(super) struct DestinationRow {
    destination_mode: String,
    redirect_exchange: Option<String>,
    redirect_routing_key: Option<String>,
}

impl From<DestinationRow> for DestinationMode {
    fn from(row: DestinationRow) -> Self {
        match row.destination_mode.as_str() {
            "exchange" => Self::Exchange,
            "redirect" => Self::Redirect {
                exchange: row.redirect_exchange.unwrap_or_default(),
                routing_key: row.redirect_routing_key.unwrap_or_default(),
            },
            _ => Self::Queue,
        }
    }
}

impl From<DestinationMode> for v1::destination::Mode {
    fn from(mode: DestinationMode) -> Self {
        match mode {
            DestinationMode::Queue => Self::Queue(v1::QueueDestination {}),
            DestinationMode::Exchange => Self::Exchange(v1::ExchangeDestination {}),
            DestinationMode::Redirect {
                exchange,
                routing_key,
            } => Self::Redirect(v1::RedirectDestination {
                exchange,
                routing_key,
            }),
        }
    }
}

/// A row of [`PLAN_COLUMNS`].
#[derive(sqlx::FromRow)]
struct PlanRow {
    id: PlanId,
    precheck_id: PrecheckId,
    precheck_digest: String,
    state: State,
    state_reason: String,
    #[sqlx(flatten)]
    rate: RateRow,
    #[sqlx(flatten)]
    destination: DestinationRow,
    slice_size: i32,
    canary_fraction: f64,
    observe_for_ms: i64,
    total_items: i64,
    canary_items: i64,
    created_by: String,
    created_at: DateTime<Utc>,
    approved_by: Option<String>,
    approved_at: Option<DateTime<Utc>>,
    completed_at: Option<DateTime<Utc>>,
    warnings: Vec<String>,
    observing_until: Option<DateTime<Utc>>,
    single: bool,
    ordered: bool,
    slices_total: i64,
    slices_completed: i64,
    item_states: serde_json::Value,
}

impl From<PlanRow> for v1::Plan {
    fn from(row: PlanRow) -> Self {
        let (counts, items_done) = action_counts(&row.item_states);
        let state = row.state;
        Self {
            plan_id: row.id.to_string(),
            precheck_id: row.precheck_id.to_string(),
            state: state.get().into(),
            rate: Some(row.rate.into()),
            destination: Some(v1::Destination {
                mode: Some(DestinationMode::from(row.destination).into()),
            }),
            slice_size: u32::try_from(row.slice_size).unwrap_or_default(),
            canary_fraction: row.canary_fraction,
            observe_for: Some(redrive_proto::time::duration(
                std::time::Duration::from_millis(
                    u64::try_from(row.observe_for_ms).unwrap_or_default(),
                ),
            )),
            total_items: u64::try_from(row.total_items).unwrap_or_default(),
            canary_items: u64::try_from(row.canary_items).unwrap_or_default(),
            counts: Some(counts),
            created_by: row.created_by,
            created_at: Some(timestamp(row.created_at)),
            state_reason: row.state_reason,
            actions: Vec::new(),
            actions_omitted: 0,
            warnings: row.warnings,
            precheck_digest: row.precheck_digest,
            slices_total: u64::try_from(row.slices_total).unwrap_or_default(),
            slices_completed: u64::try_from(row.slices_completed).unwrap_or_default(),
            approved_by: row.approved_by.unwrap_or_default(),
            approved_at: row.approved_at.map(timestamp),
            completed_at: row.completed_at.map(timestamp),
            items_done,
            kind: if row.single {
                v1::PlanKind::Single
            } else {
                v1::PlanKind::Bulk
            }
            .into(),
            ordered: row.ordered,
            // The end of the observation window, while observing.
            observing_until: row
                .observing_until
                .filter(|_| state == v1::PlanState::Observing)
                .map(timestamp),
        }
    }
}

/// What the gates look at for one plan (a row of [`GATE_READING_SQL`]).
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct GateReading {
    /// The plan.
    pub id: PlanId,
    /// `canary`, `observing` or `main` ([`state::gated`]), or any state
    /// when read for one plan.
    pub state: State,
    /// End of the observation window, when observing.
    pub observing_until: Option<DateTime<Utc>>,
    /// Failed or unroutable outcomes since the gates were last reset.
    pub failures: i64,
    /// Re-dead-letters since the gates were last reset.
    pub redeads: i64,
    /// Up to 10 re-dead-letters: `message key (dead letter id)`.
    pub evidence: Vec<String>,
}

impl Store {
    /// Gate readings of every plan in canary, observation or main.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn gate_readings(&self) -> Result<Vec<GateReading>, StoreError> {
        Ok(sqlx::query_as(AssertSqlSafe(format!(
            "{GATE_READING_SQL} WHERE p.state = ANY($1)"
        )))
        .bind(state::names(&state::gated()))
        .fetch_all(self.pool())
        .await?)
    }
}

/// The gate reading of one plan inside `transaction`, whatever its state
/// (`None`: no such plan).
///
/// # Errors
/// [`StoreError`].
pub(crate) async fn gate_reading_in(
    transaction: &mut Transaction<'_, Postgres>,
    plan_id: PlanId,
) -> Result<Option<GateReading>, StoreError> {
    Ok(
        sqlx::query_as(AssertSqlSafe(format!("{GATE_READING_SQL} WHERE p.id = $1")))
            .bind(plan_id)
            .fetch_optional(&mut **transaction)
            .await?,
    )
}

/// What the gates count, per plan `p` (a `WHERE` over `p` follows): failed
/// and unroutable outcomes and re-dead-letters since the gates were reset.
const GATE_READING_SQL: &str = "SELECT p.id, p.state, p.observing_until, \
    (SELECT count(*) FROM audit_events e WHERE e.plan_id = p.id \
        AND e.action IN ('failed', 'unroutable') \
        AND e.at > coalesce(p.gates_since, '-infinity'::timestamptz)) AS failures, \
    (SELECT count(*) FROM dead_letters d WHERE d.redrive_plan_id = p.id::text \
        AND d.captured_at > coalesce(p.gates_since, '-infinity'::timestamptz)) AS redeads, \
    (SELECT coalesce(array_agg(x), '{}') FROM (SELECT d.message_key || ' (dead letter ' || d.id || ')' AS x \
        FROM dead_letters d WHERE d.redrive_plan_id = p.id::text \
        AND d.captured_at > coalesce(p.gates_since, '-infinity'::timestamptz) ORDER BY d.id LIMIT 10) z) AS evidence \
    FROM plans p";

/// Where a plan item is published, decided once when the plan is created
/// (docs/design.md, "Plan items"): the exchange, by the plan's destination
/// mode (`p.destination_mode`) and the dead letter `d`. Queue mode: the
/// default exchange to the queue it died in, or the `exchange/routing-key`
/// an ingested, imported or exchange-only dead letter names. Exchange mode:
/// the exchange and first routing key of a death the broker recorded (one
/// with an exchange or routing keys; an ingested reason makes a death with
/// neither), else the exchange and key a framework recorded, else the
/// `exchange/routing-key` destination, else the queue through the default
/// exchange. Redirect: the plan's exchange and key.
/// The coordinator reads `plan_items.exchange` and `routing_key`; this SQL
/// is the one place the rule is written.
const ITEM_EXCHANGE_SQL: &str = "CASE p.destination_mode \
    WHEN 'redirect' THEN coalesce(p.redirect_exchange, '') \
    WHEN 'exchange' THEN CASE \
        WHEN coalesce(d.death_exchange, '') <> '' OR coalesce(cardinality(d.death_routing_keys), 0) > 0 \
            THEN coalesce(d.death_exchange, '') \
        WHEN d.original_exchange IS NOT NULL THEN d.original_exchange \
        WHEN strpos(d.destination, '/') > 0 THEN split_part(d.destination, '/', 1) \
        ELSE '' END \
    ELSE CASE WHEN (d.origin <> 'rabbitmq' OR d.exchange_only) AND strpos(d.destination, '/') > 0 \
              THEN split_part(d.destination, '/', 1) ELSE '' END END";

/// The routing key half of [`ITEM_EXCHANGE_SQL`], branch by branch.
const ITEM_ROUTING_KEY_SQL: &str = "CASE p.destination_mode \
    WHEN 'redirect' THEN coalesce(p.redirect_routing_key, '') \
    WHEN 'exchange' THEN CASE \
        WHEN coalesce(d.death_exchange, '') <> '' OR coalesce(cardinality(d.death_routing_keys), 0) > 0 \
            THEN coalesce(d.death_routing_keys[1], '') \
        WHEN d.original_exchange IS NOT NULL THEN coalesce(d.original_routing_key, '') \
        WHEN strpos(d.destination, '/') > 0 \
            THEN substr(d.destination, strpos(d.destination, '/') + 1) \
        ELSE d.destination END \
    ELSE CASE WHEN (d.origin <> 'rabbitmq' OR d.exchange_only) AND strpos(d.destination, '/') > 0 \
              THEN substr(d.destination, strpos(d.destination, '/') + 1) \
              ELSE d.destination END END";

/// Where plan item `i` (of dead letter `d`) lands, as the executors' token
/// bucket keys it (`redrive_executor::outcomes::landing`, branch by branch;
/// docs/replay.md, "Rate"), named as [`landing_name`] names it: `queue q`
/// through the default exchange (the routing key is the queue) or along the
/// death the broker recorded (exchange mode: the queue it died in), else
/// `exchange x routing key k`.
const ITEM_DESTINATION_SQL: &str = "(CASE WHEN i.exchange = '' THEN 'queue ' || i.routing_key \
    WHEN d.origin = 'rabbitmq' AND NOT d.exchange_only AND d.destination <> '' \
        AND coalesce(d.death_queue, '') = d.destination \
        AND coalesce(d.death_exchange, '') = i.exchange \
        AND coalesce(d.death_routing_keys[1], '') = i.routing_key \
        THEN 'queue ' || d.destination \
    ELSE 'exchange ' || i.exchange || ' routing key ' || i.routing_key END)";

/// The name [`ITEM_DESTINATION_SQL`] gives a publish to `exchange` with
/// `routing_key` whose landing queue is not otherwise known: `queue {key}`
/// through the default exchange, else `exchange {x} routing key {key}`.
pub fn landing_name(exchange: &str, routing_key: &str) -> String {
    if exchange.is_empty() {
        format!("queue {routing_key}")
    } else {
        format!("exchange {exchange} routing key {routing_key}")
    }
}

impl Store {
    /// Where dead letter `dead_letter_id` would be published under `mode`:
    /// `(exchange, routing_key)` by the same SQL a plan item's route is
    /// decided with ([`ITEM_EXCHANGE_SQL`]); `None` for an unknown id.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn route_of(
        &self,
        dead_letter_id: DeadLetterId,
        mode: &DestinationMode,
    ) -> Result<Option<(String, String)>, StoreError> {
        let (destination_mode, redirect_exchange, redirect_routing_key) = destination_columns(mode);
        Ok(sqlx::query_as(AssertSqlSafe(format!(
            "SELECT {ITEM_EXCHANGE_SQL} AS exchange, {ITEM_ROUTING_KEY_SQL} AS routing_key \
             FROM dead_letters d, (SELECT $2::text AS destination_mode, $3::text AS redirect_exchange, \
                                          $4::text AS redirect_routing_key) p \
             WHERE d.id = $1"
        )))
        .bind(dead_letter_id)
        .bind(destination_mode)
        .bind(redirect_exchange)
        .bind(redirect_routing_key)
        .fetch_optional(self.pool())
        .await?)
    }
}

/// The replayable items of a precheck whose dead letter knows only an
/// exchange and a routing key (`exchange_only`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, sqlx::FromRow)]
pub struct ExchangeOnlyItems {
    /// How many.
    pub count: i64,
    /// How many of them know no exchange either (only a routing key, such as
    /// a Kafka topic): only a redirect can replay them.
    pub without_exchange: i64,
    /// The lowest dead letter id among them, as an example.
    pub example: Option<DeadLetterId>,
    /// All replayable items of the precheck, these included.
    pub replayable: i64,
}

impl Store {
    /// [`ExchangeOnlyItems`] of precheck `precheck_id`.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn exchange_only_items(
        &self,
        precheck_id: PrecheckId,
    ) -> Result<ExchangeOnlyItems, StoreError> {
        Ok(sqlx::query_as(
            "SELECT count(*) FILTER (WHERE d.exchange_only) AS count, \
                    count(*) FILTER (WHERE d.exchange_only AND d.original_exchange IS NULL) \
                        AS without_exchange, \
                    min(d.id) FILTER (WHERE d.exchange_only) AS example, \
                    count(*) AS replayable \
             FROM precheck_items i JOIN dead_letters d ON d.id = i.dead_letter_id \
             WHERE i.precheck_id = $1 AND i.verdict = 'replayable'",
        )
        .bind(precheck_id)
        .fetch_one(self.pool())
        .await?)
    }

    /// Other running plans (canary, observing, main, paused) that publish to a
    /// destination plan `plan_id` publishes to: `(plan id, destination)`.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn overlapping_plans(
        &self,
        plan_id: PlanId,
    ) -> Result<Vec<(PlanId, String)>, StoreError> {
        let query = format!(
            "WITH mine AS (SELECT DISTINCT {ITEM_DESTINATION_SQL} AS destination \
                 FROM plans p JOIN plan_items i ON i.plan_id = p.id JOIN dead_letters d ON d.id = i.dead_letter_id \
                 WHERE p.id = $1), \
             theirs AS (SELECT DISTINCT p.id, {ITEM_DESTINATION_SQL} AS destination \
                 FROM plans p JOIN plan_items i ON i.plan_id = p.id JOIN dead_letters d ON d.id = i.dead_letter_id \
                 WHERE p.id <> $1 AND p.state = ANY($2)) \
             SELECT theirs.id, theirs.destination FROM theirs JOIN mine USING (destination) ORDER BY 2, 1"
        );
        Ok(sqlx::query_as(AssertSqlSafe(query))
            .bind(plan_id)
            .bind(state::names_where(v1::PlanState::is_running))
            .fetch_all(self.pool())
            .await?)
    }

    /// Replaces a plan's warnings.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn set_plan_warnings(
        &self,
        plan_id: PlanId,
        warnings: &[String],
    ) -> Result<(), StoreError> {
        sqlx::query("UPDATE plans SET warnings = $2 WHERE id = $1")
            .bind(plan_id)
            .bind(warnings)
            .execute(self.pool())
            .await?;
        Ok(())
    }
}

impl Store {
    /// Landing places ([`landing_name`]: `queue q`, or `exchange x routing
    /// key k`) of running plans (canary, observing, main, paused) among
    /// `destinations`: `(plan id, destination)`.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn running_plans_to(
        &self,
        destinations: &[String],
    ) -> Result<Vec<(PlanId, String)>, StoreError> {
        let query = format!(
            "SELECT DISTINCT p.id, {ITEM_DESTINATION_SQL} AS destination \
             FROM plans p JOIN plan_items i ON i.plan_id = p.id JOIN dead_letters d ON d.id = i.dead_letter_id \
             WHERE p.state = ANY($2) \
             AND {ITEM_DESTINATION_SQL} = ANY($1) ORDER BY 2, 1"
        );
        Ok(sqlx::query_as(AssertSqlSafe(query))
            .bind(destinations)
            .bind(state::names_where(v1::PlanState::is_running))
            .fetch_all(self.pool())
            .await?)
    }
}
