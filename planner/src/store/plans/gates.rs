//! Gate readings: what the canary gates count per plan (failed and
//! unroutable outcomes and re-dead-letters since the gates were reset).

use chrono::{DateTime, Utc};
use sqlx::{AssertSqlSafe, Postgres, Transaction};

use super::super::{Store, StoreError};
use crate::{
    ids::PlanId,
    plan::state::{self, State},
};

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
