//! Plan rows and their mapping to the API's messages: the plan columns with
//! progress aggregated, operator actions, rates and destinations.

use chrono::{DateTime, Utc};
use redrive_proto::{time::timestamp, v1};

use super::DestinationMode;
use crate::{
    ids::{PlanId, PrecheckId},
    plan::state::State,
};

/// A plan's kind, `bulk` or `single`: a single replay's plan is the one
/// with a claim deadline (`claim_by`, set by `ReplayDeadLetter`).
pub(super) const PLAN_KIND: &str = "(CASE WHEN p.claim_by IS NULL THEN 'bulk' ELSE 'single' END)";

/// Plan columns with progress aggregated from its items and slices.
pub(super) const PLAN_COLUMNS: &str = "p.id, p.precheck_id, p.precheck_digest, p.state, p.state_reason, p.rate_per_second, \
    p.rate_burst, p.rate_rationale, p.destination_mode, p.redirect_exchange, p.redirect_routing_key, \
    p.slice_size, p.canary_fraction, p.observe_for_ms, p.total_items, p.canary_items, p.ramp_items, p.ramp_step, p.created_by, \
    p.created_at, p.approved_by, p.approved_at, p.completed_at, p.warnings, \
    p.observing_until, (p.claim_by IS NOT NULL) AS single, p.ordered, \
    p.webhook_url, (p.webhook_secret IS NOT NULL) AS webhook_secret_set, \
    (SELECT count(*) FROM plan_slices s WHERE s.plan_id = p.id) AS slices_total, \
    (SELECT count(*) FROM dead_letters d WHERE d.redrive_plan_id = p.id::text) AS re_dead_letters, \
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
pub(super) struct OperatorActionRow {
    action: String,
    actor: String,
    reason: String,
    at: DateTime<Utc>,
    /// Actions of the plan in all.
    pub(super) total: i64,
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
pub(in crate::store) struct RateRow {
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
pub(in crate::store) struct DestinationRow {
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
pub(super) struct PlanRow {
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
    ramp_items: Vec<i64>,
    ramp_step: i32,
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
    re_dead_letters: i64,
    item_states: serde_json::Value,
    webhook_url: Option<String>,
    webhook_secret_set: bool,
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
            ramp_items: row
                .ramp_items
                .iter()
                .map(|items| u64::try_from(*items).unwrap_or_default())
                .collect(),
            ramp_step: u32::try_from(row.ramp_step).unwrap_or_default(),
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
            re_dead_letters: u64::try_from(row.re_dead_letters).unwrap_or_default(),
            webhook_url: row.webhook_url.unwrap_or_default(),
            webhook_secret_set: row.webhook_secret_set,
            // The end of the observation window, while observing.
            observing_until: row
                .observing_until
                .filter(|_| state == v1::PlanState::Observing)
                .map(timestamp),
        }
    }
}
