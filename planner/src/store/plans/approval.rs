//! The approval check: the precheck's age and what happened to the plan's
//! dead letters since it started, read with the plan row locked.

use sqlx::AssertSqlSafe;

use super::super::{StoreError, Tx};
use crate::{
    ids::{PlanId, PrecheckId},
    plan::state::State,
};

/// Changes since a precheck listed when an approval is refused for them.
pub const CHANGES_LISTED: usize = 10;

/// The approval check, one query with the plan row locked: the precheck's age
/// in seconds, and what happened to the plan's dead letters since the
/// precheck started, oldest first. Replays are found through the audit's
/// `sent` and `uncertain` events (written with the report of the send, and
/// covering another dead letter with the same key and destination, found by
/// the `audit_events_replayed` index); repairs through
/// `dead_letter_revisions`.
static APPROVE_CHECK_SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "{APPROVE_CHANGES_SQL}, arr.arrivals, arr.arrival_evidence \
         FROM plans p JOIN prechecks c ON c.id = p.precheck_id{} WHERE p.id = $1 FOR UPDATE OF p",
        super::gates::arrivals_join("c.created_at")
    )
});

/// The state, age and changes columns of [`APPROVE_CHECK_SQL`].
const APPROVE_CHANGES_SQL: &str = "SELECT p.state, p.precheck_id, \
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
        ORDER BY 2 LIMIT $2) z ORDER BY z.at) AS changes";

/// A row of [`APPROVE_CHECK_SQL`].
#[derive(sqlx::FromRow)]
struct ApproveCheckRow {
    state: State,
    precheck_id: PrecheckId,
    age_seconds: f64,
    changes: Vec<String>,
    arrivals: i64,
    arrival_evidence: Option<String>,
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
    /// Dead letters failing like the plan's own that died since its
    /// precheck started ([`super::gates::arrivals_join`]), and the figures
    /// (`None` without any).
    pub arrivals: Option<(i64, String)>,
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
        let check = sqlx::query_as::<_, ApproveCheckRow>(AssertSqlSafe(APPROVE_CHECK_SQL.as_str()))
            .bind(plan_id)
            .bind(i64::try_from(CHANGES_LISTED + 1).unwrap_or(i64::MAX))
            .fetch_optional(&mut *self.transaction)
            .await?;
        Ok(check.map(|row| ApprovalCheck {
            state: row.state,
            precheck_id: row.precheck_id,
            age: std::time::Duration::from_secs_f64(row.age_seconds.max(0.0)),
            changes: row.changes,
            arrivals: row
                .arrival_evidence
                .filter(|_| row.arrivals > 0)
                .map(|evidence| (row.arrivals, evidence)),
        }))
    }
}

impl Tx {
    /// Records that `actor` lets plan `plan_id` run although dead letters
    /// failing like its own keep arriving (docs/replay.md, "Still
    /// arriving"): the operator action `override_arrivals` with `reason`, and
    /// the arrivals gate off for the plan.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn override_arrivals(
        &mut self,
        plan_id: PlanId,
        actor: &str,
        reason: &str,
    ) -> Result<(), StoreError> {
        sqlx::query("UPDATE plans SET arrivals_overridden = true WHERE id = $1")
            .bind(plan_id)
            .execute(&mut *self.transaction)
            .await?;
        super::transitions::record_action(
            &mut self.transaction,
            plan_id,
            OVERRIDE_ARRIVALS,
            actor,
            reason,
        )
        .await
    }
}

/// The operator action of [`Tx::override_arrivals`].
pub const OVERRIDE_ARRIVALS: &str = "override_arrivals";
