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
    /// Dead letters failing like the plan's own that died since the gates
    /// were reset (else since its precheck started): the cause still active
    /// ([`arrivals_join`]). 0 for a plan of one or one whose operator
    /// overrode the arrivals.
    pub arrivals: i64,
    /// With arrivals, the figures: how many, since when, the first and the
    /// newest, and the newest one's error.
    pub arrival_evidence: Option<String>,
}

impl Store {
    /// Gate readings of every plan in canary, observation or main.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn gate_readings(&self) -> Result<Vec<GateReading>, StoreError> {
        Ok(sqlx::query_as(AssertSqlSafe(format!(
            "{} WHERE p.state = ANY($1)",
            *GATE_READING_SQL
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
    Ok(sqlx::query_as(AssertSqlSafe(format!(
        "{} WHERE p.id = $1",
        *GATE_READING_SQL
    )))
    .bind(plan_id)
    .fetch_optional(&mut **transaction)
    .await?)
}

/// An RFC 3339 UTC second in SQL's `to_char`.
const SQL_TIME_FORMAT: &str = r#"'YYYY-MM-DD"T"HH24:MI:SS"Z"'"#;

/// `LEFT JOIN LATERAL (...) arr ON true` over plan `p`: the dead letters
/// that failed the way its own did (one of its `plan_groups`: same source,
/// error fingerprint and destination, the queue they failed in) stored after
/// `since` (an SQL expression; the storing time, since a DLX retry loop keeps
/// a message's first `x-death` time), none for a plan of one or one whose
/// operator overrode the arrivals, neither its items
/// nor its own re-dead-letters (those are the re-dead-letter gate's), as
/// `arr.arrivals` (a count) and `arr.arrival_evidence` (`N dead letter(s)
/// failing like this plan's died since T (first at T1, newest at T2):
/// newest dead letter ID from SOURCE: ERROR`, NULL without any). Read
/// through the index `dead_letters_error_group` (source, fingerprint,
/// capture time): one range per group.
pub(crate) fn arrivals_join(since: &str) -> String {
    let time = |column: &str| format!("to_char({column} AT TIME ZONE 'UTC', {SQL_TIME_FORMAT})");
    format!(
        " LEFT JOIN LATERAL (SELECT count(*) AS arrivals, CASE WHEN count(*) = 0 THEN NULL ELSE \
            count(*) || ' dead letter(s) failing like this plan''s died since ' || {since_text} || \
            ' (first at ' || {first} || ', newest at ' || {newest} || '): newest dead letter ' || \
            (array_agg(a.id ORDER BY a.died_at DESC, a.id DESC))[1] || ' from ' || \
            (array_agg(a.source || ': ' || left(coalesce(nullif(a.error_text, ''), a.error_group), 200) \
                ORDER BY a.died_at DESC, a.id DESC))[1] END AS arrival_evidence \
          FROM (SELECT d.id, d.source, d.died_at, d.error_text, d.error_group \
                FROM plan_groups g JOIN dead_letters d ON d.source = g.source \
                 AND d.error_group = g.error_group AND d.destination = g.destination \
                 AND d.captured_at > {since} \
                WHERE g.plan_id = p.id AND NOT p.arrivals_overridden AND p.claim_by IS NULL \
                  AND d.redrive_plan_id IS DISTINCT FROM p.id::text \
                  AND NOT EXISTS (SELECT 1 FROM plan_items i WHERE i.plan_id = p.id AND i.dead_letter_id = d.id)) a \
         ) arr ON true",
        since_text = time(since),
        first = time("min(a.died_at)"),
        newest = time("max(a.died_at)"),
    )
}

/// What the gates count, per plan `p` (a `WHERE` over `p` follows): failed
/// and unroutable outcomes and re-dead-letters since the gates were reset,
/// and the arrivals since then (else since the precheck started), none for a
/// plan of one or one whose operator overrode them.
static GATE_READING_SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "{GATE_COUNTS_SQL}, \
         arr.arrivals, arr.arrival_evidence \
         FROM plans p JOIN prechecks c ON c.id = p.precheck_id{}",
        arrivals_join("coalesce(p.gates_since, c.created_at)")
    )
});

/// The failure and re-dead-letter columns of [`GATE_READING_SQL`].
const GATE_COUNTS_SQL: &str = "SELECT p.id, p.state, p.observing_until, \
    (SELECT count(*) FROM audit_events e WHERE e.plan_id = p.id \
        AND e.action IN ('failed', 'unroutable') \
        AND e.at > coalesce(p.gates_since, '-infinity'::timestamptz)) AS failures, \
    (SELECT count(*) FROM dead_letters d WHERE d.redrive_plan_id = p.id::text \
        AND d.captured_at > coalesce(p.gates_since, '-infinity'::timestamptz)) AS redeads, \
    (SELECT coalesce(array_agg(x), '{}') FROM (SELECT d.message_key || ' (dead letter ' || d.id || ')' AS x \
        FROM dead_letters d WHERE d.redrive_plan_id = p.id::text \
        AND d.captured_at > coalesce(p.gates_since, '-infinity'::timestamptz) ORDER BY d.id LIMIT 10) z) AS evidence";
