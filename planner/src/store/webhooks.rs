//! The webhook outbox (`webhook_deliveries`, migration 0031;
//! docs/webhooks.md): events written in the transaction of the state change
//! they report, one row per target; due rows taken by one planner replica
//! at a time (`FOR UPDATE SKIP LOCKED`, then `next_attempt_at` pushed past
//! the attempt as its lease); each attempt's outcome.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::{Postgres, Transaction};

use super::{Store, StoreError, plans::plan_in};
use crate::{
    ids::PlanId,
    webhooks::{self, EventType},
};

/// The targets an event goes to: the planner's webhook when it has one,
/// the plan's own when it has one.
fn targets(planner_webhook: bool, plan_webhook: bool) -> Vec<&'static str> {
    let mut targets = Vec::new();
    if planner_webhook {
        targets.push("planner");
    }
    if plan_webhook {
        targets.push("plan");
    }
    targets
}

/// Writes `events` of plan `plan_id` (as it is now in `transaction`, moved
/// by `actor` for `reason`) to the outbox, a row per event and target.
///
/// # Errors
/// [`StoreError`].
pub(crate) async fn enqueue_plan_events(
    transaction: &mut Transaction<'_, Postgres>,
    planner_webhook: bool,
    plan_id: PlanId,
    events: &[EventType],
    actor: &str,
    reason: &str,
) -> Result<(), StoreError> {
    let Some(plan) = plan_in(&mut **transaction, plan_id).await? else {
        return Ok(());
    };
    let targets = targets(planner_webhook, !plan.webhook_url.is_empty());
    if targets.is_empty() {
        return Ok(());
    }
    let data = webhooks::plan_data(&plan, actor, reason);
    insert(transaction, events, &targets, Some(plan_id), &data).await
}

/// Writes a `precheck.finished` event with `data` for the planner's webhook,
/// when it has one.
///
/// # Errors
/// [`StoreError`].
pub(crate) async fn enqueue_precheck_event(
    transaction: &mut Transaction<'_, Postgres>,
    planner_webhook: bool,
    data: &Value,
) -> Result<(), StoreError> {
    let targets = targets(planner_webhook, false);
    insert(
        transaction,
        &[EventType::PrecheckFinished],
        &targets,
        None,
        data,
    )
    .await
}

/// Inserts a row per event and target, each with a `webhook-id` of its own
/// (`msg_` and a random UUID's 32 hex digits).
async fn insert(
    transaction: &mut Transaction<'_, Postgres>,
    events: &[EventType],
    targets: &[&str],
    plan_id: Option<PlanId>,
    data: &Value,
) -> Result<(), StoreError> {
    for event in events {
        for target in targets {
            sqlx::query(
                "INSERT INTO webhook_deliveries (webhook_id, target, event_type, plan_id, data) \
                 VALUES ($1, $2, $3, $4, $5)",
            )
            .bind(format!("msg_{}", uuid::Uuid::new_v4().simple()))
            .bind(target)
            .bind(event.name())
            .bind(plan_id)
            .bind(data)
            .execute(&mut **transaction)
            .await?;
        }
    }
    Ok(())
}

/// A delivery taken for an attempt ([`Store::take_due_webhooks`]).
#[derive(Debug, sqlx::FromRow)]
pub struct DueWebhook {
    /// The row.
    pub id: i64,
    /// The `webhook-id` header.
    pub webhook_id: String,
    /// `planner` or `plan`.
    pub target: String,
    /// The event's name ([`EventType::name`]).
    pub event_type: String,
    /// The plan it is about, if any.
    pub plan_id: Option<PlanId>,
    /// The payload's `data` as of the state change.
    pub data: Value,
    /// When the state change was made (the payload's `timestamp`).
    pub occurred_at: DateTime<Utc>,
    /// The body, once made (every later attempt sends it unchanged).
    pub body: Option<String>,
    /// Attempts made before this one.
    pub attempts: i32,
    /// A `plan` target's URL.
    pub url: Option<String>,
    /// A `plan` target's secret (`whsec_…`).
    pub secret: Option<String>,
}

/// How an attempt ended, as recorded.
#[derive(Debug, Clone)]
pub enum AttemptOutcome {
    /// A 2xx answer.
    Delivered,
    /// Failed; tried again after the delay.
    Retry(Duration, String),
    /// Failed, and no attempt is left: kept as `failed`.
    Failed(String),
}

impl Store {
    /// Takes up to `limit` due deliveries (`planner` targets only when
    /// `planner_webhook`), oldest due first, skipping rows another replica
    /// holds, and leases them for `lease`: no other replica takes them
    /// until then.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn take_due_webhooks(
        &self,
        limit: i64,
        lease: Duration,
        planner_webhook: bool,
    ) -> Result<Vec<DueWebhook>, StoreError> {
        Ok(sqlx::query_as::<_, DueWebhook>(
            "UPDATE webhook_deliveries w SET next_attempt_at = now() + $2 * interval '1 millisecond' \
             FROM (SELECT id FROM webhook_deliveries WHERE state = 'pending' \
                   AND next_attempt_at <= now() AND (target = 'plan' OR $3) \
                   ORDER BY next_attempt_at, id LIMIT $1 FOR UPDATE SKIP LOCKED) due \
             WHERE w.id = due.id \
             RETURNING w.id, w.webhook_id, w.target, w.event_type, w.plan_id, w.data, \
                       w.occurred_at, w.body, w.attempts, \
                       (SELECT p.webhook_url FROM plans p WHERE p.id = w.plan_id AND w.target = 'plan') AS url, \
                       (SELECT p.webhook_secret FROM plans p WHERE p.id = w.plan_id AND w.target = 'plan') AS secret",
        )
        .bind(limit)
        .bind(i64::try_from(lease.as_millis()).unwrap_or(i64::MAX))
        .bind(planner_webhook)
        .fetch_all(self.pool())
        .await?)
    }

    /// Stores delivery `id`'s body unless it has one, and answers the one
    /// it has: the body every attempt sends.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn freeze_webhook_body(&self, id: i64, body: &str) -> Result<String, StoreError> {
        Ok(sqlx::query_scalar(
            "UPDATE webhook_deliveries SET body = coalesce(body, $2) WHERE id = $1 RETURNING body",
        )
        .bind(id)
        .bind(body)
        .fetch_one(self.pool())
        .await?)
    }

    /// Whether a slice of plan `plan_id` is leased: an executor may still
    /// report outcomes of what it handed to the broker.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn plan_has_leases(&self, plan_id: PlanId) -> Result<bool, StoreError> {
        Ok(sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM plan_slices WHERE plan_id = $1 AND state = 'leased')",
        )
        .bind(plan_id)
        .fetch_one(self.pool())
        .await?)
    }

    /// Leaves delivery `id` for `after` without counting an attempt.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn postpone_webhook(&self, id: i64, after: Duration) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE webhook_deliveries SET next_attempt_at = now() + $2 * interval '1 millisecond' \
             WHERE id = $1",
        )
        .bind(id)
        .bind(i64::try_from(after.as_millis()).unwrap_or(i64::MAX))
        .execute(self.pool())
        .await?;
        Ok(())
    }

    /// Records an attempt of delivery `id` and how it ended.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn record_webhook_attempt(
        &self,
        id: i64,
        outcome: &AttemptOutcome,
    ) -> Result<(), StoreError> {
        let (state, after, error) = match outcome {
            AttemptOutcome::Delivered => ("delivered", Duration::ZERO, None),
            AttemptOutcome::Retry(after, error) => ("pending", *after, Some(error.as_str())),
            AttemptOutcome::Failed(error) => ("failed", Duration::ZERO, Some(error.as_str())),
        };
        sqlx::query(
            "UPDATE webhook_deliveries SET attempts = attempts + 1, state = $2, \
             next_attempt_at = now() + $3 * interval '1 millisecond', last_error = $4, \
             delivered_at = CASE WHEN $2 = 'delivered' THEN now() END WHERE id = $1",
        )
        .bind(id)
        .bind(state)
        .bind(i64::try_from(after.as_millis()).unwrap_or(i64::MAX))
        .bind(error)
        .execute(self.pool())
        .await?;
        Ok(())
    }
}
