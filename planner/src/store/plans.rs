//! Plans: creation from a precheck (items and slices in one transaction)
//! and reads with progress counts. Beside it: `transitions` (the guarded
//! state changes, operator actions, notifications), `approval` (the approval
//! check), `rows` (plan rows mapped to the API's messages), `gates` (the
//! gate readings) and `routing` (where items are published, destination
//! comparisons).

mod approval;
mod gates;
mod routing;
mod rows;
mod transitions;

use chrono::{DateTime, Utc};
use prost::Message;
use redrive_proto::{limits::MAX_PLAN_ACTIONS_SHOWN, v1};
use sqlx::{AssertSqlSafe, Postgres, Transaction};

pub(in crate::store) use self::rows::{DestinationRow, RateRow};
pub use self::{
    approval::{ApprovalCheck, CHANGES_LISTED},
    gates::GateReading,
    routing::{ExchangeOnlyItems, PreviewRoute, landing_name},
    rows::action_counts,
    transitions::Moved,
};
pub(crate) use self::{
    gates::gate_reading_in,
    transitions::{notify, record_action, transition_in},
};
use self::{
    routing::{ITEM_EXCHANGE_SQL, ITEM_ROUTING_KEY_SQL},
    rows::{OperatorActionRow, PLAN_COLUMNS, PLAN_KIND, PlanRow},
};
use super::{
    Store, StoreError,
    freeze::{self, Freeze},
};
use crate::{
    ids::{DeadLetterId, PlanId, PrecheckId},
    plan::state::State,
    webhooks::EventType,
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
    /// Waves after the canary and before the main wave, as cumulative
    /// fractions of the items, increasing, each above `canary_fraction` and
    /// below 1 (docs/replay.md, "Ramps"); empty: canary, then main.
    pub ramp: Vec<f64>,
    /// Observation window after the canary, in milliseconds.
    pub observe_for_ms: i64,
    /// Who creates it.
    pub actor: String,
    /// Published in dead-letter order (one slice at a time).
    pub ordered: bool,
    /// The plan's own webhook target: URL and secret (`whsec_…`), checked.
    pub webhook: Option<(String, String)>,
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

/// Why some of precheck `$1`'s replayable dead letters cannot be frozen:
/// how many it has, how many are still stored, how many of those are
/// archived, and the lowest archived id. Read only when plan creation froze
/// fewer items than the precheck has replayable ones.
const UNFROZEN_SQL: &str = "SELECT count(*) AS total, count(d.id) AS stored, count(d.archived_at) AS archived, \
    min(d.id) FILTER (WHERE d.archived_at IS NOT NULL) AS first_archived \
    FROM precheck_items i LEFT JOIN dead_letters d ON d.id = i.dead_letter_id \
    WHERE i.precheck_id = $1 AND i.verdict = 'replayable'";

/// A row of [`UNFROZEN_SQL`].
#[derive(sqlx::FromRow)]
struct UnfrozenRow {
    total: i64,
    stored: i64,
    archived: i64,
    first_archived: Option<DeadLetterId>,
}

pub(super) fn destination_columns(
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

impl Store {
    /// Freezes the precheck's replayable items, in dead-letter order, into a
    /// plan awaiting approval: canary slices first, then main slices; its
    /// `plan.created` webhook event is written in the same transaction.
    ///
    /// # Errors
    /// [`StoreError`]; nothing is created then.
    pub async fn create_plan(&self, plan: &NewPlan) -> Result<CreateOutcome, StoreError> {
        let mut transaction = self.pool().begin().await?;
        let outcome = insert_plan(&mut transaction, plan).await?;
        if matches!(outcome, CreateOutcome::Created) {
            super::webhooks::enqueue_plan_events(
                &mut transaction,
                self.effects().planner_webhook,
                plan.id,
                &[EventType::PlanCreated],
                &plan.actor,
                &plan.rationale,
            )
            .await?;
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
    let (precheck, total) = match frozen_precheck(transaction, plan).await? {
        Ok(frozen) => frozen,
        Err(refused) => return Ok(refused),
    };
    let waves = Waves::of(plan, total);
    insert_plan_row(transaction, plan, precheck.digest.as_deref(), total, &waves).await?;
    let frozen = insert_slices_and_items(transaction, plan, &waves).await?;
    if frozen < total {
        // Some were archived or deleted since the precheck; the caller
        // drops the transaction, so nothing of the plan stays.
        return unfrozen(transaction, plan).await;
    }
    record_action(transaction, plan.id, "create", &plan.actor, &plan.rationale).await?;
    record_policy_override(transaction, plan, &precheck).await?;
    Ok(CreateOutcome::Created)
}

/// The precheck `plan` freezes, locked `FOR SHARE`, and its count of
/// replayable items, under the freeze lock held shared (see
/// [`super::freeze`]: archive, retention, re-keying and repairs wait for this
/// transaction, and it for theirs); or why no plan can be made of it
/// (`Err`): not found, not done, nothing replayable.
///
/// # Errors
/// [`StoreError`].
async fn frozen_precheck(
    transaction: &mut Transaction<'_, Postgres>,
    plan: &NewPlan,
) -> Result<Result<(FrozenPrecheckRow, i64), CreateOutcome>, StoreError> {
    freeze::lock(transaction, Freeze::Shared).await?;
    let precheck = sqlx::query_as::<_, FrozenPrecheckRow>(
        "SELECT state, digest, actor, report FROM prechecks WHERE id = $1 FOR SHARE",
    )
    .bind(plan.precheck_id)
    .fetch_optional(&mut **transaction)
    .await?;
    let Some(precheck) = precheck else {
        return Ok(Err(CreateOutcome::PrecheckNotFound));
    };
    if precheck.state != "done" {
        return Ok(Err(CreateOutcome::PrecheckNotDone));
    }
    let total: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM precheck_items WHERE precheck_id = $1 AND verdict = 'replayable'",
    )
    .bind(plan.precheck_id)
    .fetch_one(&mut **transaction)
    .await?;
    if total == 0 {
        return Ok(Err(CreateOutcome::NothingReplayable));
    }
    Ok(Ok((precheck, total)))
}

/// Why plan creation froze fewer items than precheck `plan.precheck_id` has
/// replayable ones: some of its dead letters were archived, or deleted by
/// retention, since the precheck.
///
/// # Errors
/// [`StoreError`].
async fn unfrozen(
    transaction: &mut Transaction<'_, Postgres>,
    plan: &NewPlan,
) -> Result<CreateOutcome, StoreError> {
    let found = sqlx::query_as::<_, UnfrozenRow>(UNFROZEN_SQL)
        .bind(plan.precheck_id)
        .fetch_one(&mut **transaction)
        .await?;
    Ok(CreateOutcome::ChangedSincePrecheck(
        match found.first_archived {
            Some(first) => format!(
                "{} of its replayable dead letters (dead letter {first} first) were archived since",
                found.archived
            ),
            None => format!(
                "{} of its replayable dead letters were deleted by retention since",
                found.total - found.stored
            ),
        },
    ))
}

/// How a plan's items fall into slices: the first `canary` items (the
/// canary fraction of the total, rounded up, at least one unless the
/// fraction is 0) in canary slices, the rest in main slices.
struct Waves {
    /// Items of the canary wave (`plans.canary_items`).
    canary: i64,
    slice_size: i64,
    /// Cumulative item count at the end of each wave, the main wave last
    /// (the total).
    bounds: Vec<i64>,
}

impl Waves {
    /// The waves of `plan` over `total` items: the canary (`canary_fraction`,
    /// at least one item; none for a plan of one), each wave of the ramp that
    /// adds items and leaves some for the main wave, then the main wave.
    fn of(plan: &NewPlan, total: i64) -> Self {
        let bounds = wave_bounds(total, plan.canary_fraction, &plan.ramp);
        Self {
            canary: bounds[0],
            slice_size: i64::from(plan.slice_size),
            bounds,
        }
    }

    /// Per wave: its first item position minus one, its last item position,
    /// its first slice's `seq` and its slice count.
    fn layout(&self) -> Vec<(i64, i64, i64, i64)> {
        let mut layout = Vec::with_capacity(self.bounds.len());
        let (mut low, mut seq) = (0, 0);
        for &high in &self.bounds {
            let slices = (high - low + self.slice_size - 1) / self.slice_size;
            layout.push((low, high, seq, slices));
            (low, seq) = (high, seq + slices);
        }
        layout
    }

    /// The cumulative item counts of the waves before the main one
    /// (`plans.ramp_items`).
    fn ramp_items(&self) -> &[i64] {
        &self.bounds[..self.bounds.len() - 1]
    }
}

/// The cumulative item count at the end of each wave of a plan of `total`
/// items, the main wave last (`total`): the canary (`canary_fraction`, at
/// least one item; none without a canary), each wave of `ramp` that adds
/// items and leaves some for the main wave, then the main wave.
fn wave_bounds(total: i64, canary_fraction: f64, ramp: &[f64]) -> Vec<i64> {
    let canary = if canary_fraction > 0.0 {
        ((total as f64 * canary_fraction).ceil() as i64).clamp(1, total)
    } else {
        0
    };
    let mut bounds = vec![canary];
    for fraction in ramp {
        let end = ((total as f64 * fraction).ceil() as i64).clamp(canary, total);
        // A ramp wave that would take every item left would leave the
        // main wave empty (a new user's pass: a ramp on 4 items): those
        // items are the main wave's.
        if end > *bounds.last().unwrap_or(&0) && end < total {
            bounds.push(end);
        }
    }
    bounds.push(total);
    bounds
}

/// Inserts the `plans` row, `awaiting_approval`, with the precheck's
/// `digest`, `total` items of which `canary` in the canary wave.
///
/// # Errors
/// [`StoreError`].
async fn insert_plan_row(
    transaction: &mut Transaction<'_, Postgres>,
    plan: &NewPlan,
    digest: Option<&str>,
    total: i64,
    waves: &Waves,
) -> Result<(), StoreError> {
    let (canary, ramp_items) = (waves.canary, waves.ramp_items());
    let (mode, redirect_exchange, redirect_routing_key) = destination_columns(&plan.destination);
    sqlx::query(
            "INSERT INTO plans (id, precheck_id, precheck_digest, state, rate_per_second, rate_burst, \
             rate_rationale, destination_mode, redirect_exchange, redirect_routing_key, slice_size, \
             canary_fraction, observe_for_ms, total_items, canary_items, created_by, ordered, \
             webhook_url, webhook_secret, ramp_items) \
             VALUES ($1, $2, $3, 'awaiting_approval', $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, \
             $17, $18, $19)",
        )
        .bind(plan.id)
        .bind(plan.precheck_id)
        .bind(digest.unwrap_or_default())
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
        .bind(plan.webhook.as_ref().map(|(url, _)| url))
        .bind(plan.webhook.as_ref().map(|(_, secret)| secret))
        .bind(ramp_items)
        .execute(&mut **transaction)
        .await?;
    Ok(())
}

/// Inserts the plan's slices (canary first, then main), its items in
/// dead-letter order, and its error groups; returns how many items it froze.
/// Each item's route and send-time deadline are decided here, once. A dead
/// letter archived or deleted since the precheck is left out, so fewer items
/// than the precheck's replayable count means the plan must not be made
/// (the caller holds the freeze lock, [`super::freeze`]).
///
/// # Errors
/// [`StoreError`].
async fn insert_slices_and_items(
    transaction: &mut Transaction<'_, Postgres>,
    plan: &NewPlan,
    waves: &Waves,
) -> Result<i64, StoreError> {
    let layout = waves.layout();
    let main = layout.len() - 1;
    let (mut seqs, mut kinds, mut steps) = (Vec::new(), Vec::new(), Vec::new());
    for (step, &(_, _, first, slices)) in layout.iter().enumerate() {
        for seq in first..first + slices {
            seqs.push(i32::try_from(seq).unwrap_or(i32::MAX));
            kinds.push(if step == main { "main" } else { "canary" });
            steps.push(i32::try_from(step).unwrap_or(i32::MAX));
        }
    }
    sqlx::query(
        "INSERT INTO plan_slices (plan_id, seq, wave, ramp_step) \
         SELECT $1, s.seq, s.wave, s.step FROM UNNEST($2::int[], $3::text[], $4::int[]) AS s(seq, wave, step)",
    )
    .bind(plan.id)
    .bind(seqs)
    .bind(kinds)
    .bind(steps)
    .execute(&mut **transaction)
    .await?;
    let column =
        |pick: fn(&(i64, i64, i64, i64)) -> i64| layout.iter().map(pick).collect::<Vec<i64>>();
    // One pass over the dead letters (`frozen`, materialized) feeds both the
    // items and the error groups: what its dead letters failed with, so that
    // dead letters failing the same way later stop its approval and pause it
    // (docs/replay.md, "Still arriving"). An item at position p (1-based,
    // dead-letter order) is in the wave whose (low, high] holds p, in slice
    // first + (p - low - 1) / size. The slice number is computed per item
    // first and then joined: a join condition with the subquery in it was
    // evaluated per item and slice, so plan creation grew with items ×
    // slices (100,000 items: 26 s).
    let frozen: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
        "WITH frozen AS MATERIALIZED ( \
             SELECT i.dead_letter_id, d.message_key, i.stale_at, \
                    {ITEM_EXCHANGE_SQL} AS exchange, {ITEM_ROUTING_KEY_SQL} AS routing_key, \
                    d.source, d.error_group, d.destination, \
                    row_number() OVER (ORDER BY i.dead_letter_id) AS position \
             FROM precheck_items i JOIN dead_letters d ON d.id = i.dead_letter_id \
             JOIN plans p ON p.id = $1 \
             WHERE i.precheck_id = $2 AND i.verdict = 'replayable' AND d.archived_at IS NULL), \
         items AS (INSERT INTO plan_items (plan_id, position, slice_id, dead_letter_id, message_key, \
                                           exchange, routing_key, stale_at) \
             SELECT $1, r.position, s.id, r.dead_letter_id, r.message_key, \
                    r.exchange, r.routing_key, r.stale_at \
             FROM frozen r \
             CROSS JOIN LATERAL (SELECT w.first + (r.position - w.low - 1) / $6 AS seq \
                 FROM UNNEST($3::bigint[], $4::bigint[], $5::bigint[]) AS w(low, high, first) \
                 WHERE r.position > w.low AND r.position <= w.high) q \
             JOIN plan_slices s ON s.plan_id = $1 AND s.seq = q.seq), \
         groups AS (INSERT INTO plan_groups (plan_id, source, error_group, destination) \
             SELECT DISTINCT $1::uuid, source, error_group, destination FROM frozen) \
         SELECT count(*) FROM frozen"
    )))
    .bind(plan.id)
    .bind(plan.precheck_id)
    .bind(column(|wave| wave.0))
    .bind(column(|wave| wave.1))
    .bind(column(|wave| wave.2))
    .bind(waves.slice_size)
    .fetch_one(&mut **transaction)
    .await?;
    Ok(frozen)
}

/// A precheck that overrode the planner's policy says so in the plan's
/// actions (`override_policy`), by whoever overrode it.
///
/// # Errors
/// [`StoreError`]; `Corrupt` for a stored report that does not decode.
async fn record_policy_override(
    transaction: &mut Transaction<'_, Postgres>,
    plan: &NewPlan,
    precheck: &FrozenPrecheckRow,
) -> Result<(), StoreError> {
    let report = precheck
        .report
        .as_deref()
        .map(v1::PrecheckReport::decode)
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
    Ok(())
}

/// The plan with its progress and counts, without its actions, read
/// through `executor` (the pool, or a transaction that changed it).
///
/// # Errors
/// [`StoreError`].
pub(crate) async fn plan_in(
    executor: impl sqlx::PgExecutor<'_>,
    plan_id: PlanId,
) -> Result<Option<v1::Plan>, StoreError> {
    let row = sqlx::query_as::<_, PlanRow>(AssertSqlSafe(format!(
        "SELECT {PLAN_COLUMNS} FROM plans p WHERE p.id = $1"
    )))
    .bind(plan_id)
    .fetch_optional(executor)
    .await?;
    Ok(row.map(v1::Plan::from))
}

/// The precheck a plan freezes, as [`insert_plan`] reads it.
#[derive(sqlx::FromRow)]
struct FrozenPrecheckRow {
    state: String,
    digest: Option<String>,
    actor: String,
    report: Option<Vec<u8>>,
}

impl Store {
    /// The plan with its progress, actions and counts.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn get_plan(&self, plan_id: PlanId) -> Result<Option<v1::Plan>, StoreError> {
        let Some(mut plan) = plan_in(self.pool(), plan_id).await? else {
            return Ok(None);
        };
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

#[cfg(test)]
mod tests {
    use super::wave_bounds as waves;

    /// Every wave adds items, and the main wave is never empty when there
    /// is more than the canary (a new user's pass: `--ramp 90%` on 4 items
    /// left a main wave of none).
    #[test]
    fn no_wave_is_empty() {
        assert_eq!(waves(4, 0.01, &[0.9]), vec![1, 4]);
        assert_eq!(waves(4, 0.01, &[0.5, 0.75, 0.99]), vec![1, 2, 3, 4]);
        assert_eq!(waves(4, 0.5, &[0.5, 0.6]), vec![2, 3, 4]);
        assert_eq!(waves(1000, 0.01, &[0.1, 0.5]), vec![10, 100, 500, 1000]);
        assert_eq!(waves(1, 0.01, &[0.5]), vec![1, 1]);
        for total in 1..40 {
            for ramp in [&[0.3, 0.6, 0.9][..], &[0.99], &[0.02, 0.03]] {
                let bounds = waves(total, 0.05, ramp);
                let waves_after_canary = bounds.windows(2).map(|pair| pair[1] - pair[0]);
                let sizes: Vec<i64> = waves_after_canary.collect();
                // Only the main wave of a plan all canary is empty.
                let all_canary = bounds[0] == total;
                for (index, size) in sizes.iter().enumerate() {
                    assert!(
                        *size > 0 || (all_canary && index == sizes.len() - 1),
                        "{total} {ramp:?}: {bounds:?}"
                    );
                }
            }
        }
    }
}
