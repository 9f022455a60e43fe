//! The deliverer every planner replica runs ([`run`]): it takes due rows of
//! the outbox (one replica per row: `FOR UPDATE SKIP LOCKED` and a lease),
//! makes each body once (a final state's waits until the plan's audit is
//! closed, then carries its digest), signs and posts it, and records the
//! outcome: 2xx delivered; anything else, or no answer within
//! [`ATTEMPT_TIMEOUT`], tried again after the project's jittered backoff
//! until [`Delivery::attempts`] are spent, then kept as `failed`.

use std::time::Duration;

use anyhow::Context as _;
use futures::StreamExt as _;
use hyper::Uri;
use redrive_proto::{backoff::Backoff, v1};
use sha2::{Digest as _, Sha256};
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::{EventType, Secret, http::Client};
use crate::{
    ids::PlanId,
    store::{
        Store,
        webhooks::{AttemptOutcome, DueWebhook},
    },
};

/// How long one attempt may take: connection, TLS, request and the
/// answer's status line.
pub const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(10);
/// How often a replica looks for due deliveries when it found none.
pub const POLL_INTERVAL: Duration = Duration::from_millis(500);
/// Deliveries one replica takes at once (attempted concurrently).
pub const BATCH: i64 = 16;
/// How long a taken delivery is held from other replicas: longer than an
/// attempt and the making of a body. A replica that dies holding one
/// leaves it to the others after this.
pub const LEASE: Duration = Duration::from_secs(60);
/// The longest delay between two attempts (before jitter, which may double it).
pub const RETRY_MAX: Duration = Duration::from_secs(3600);
/// How soon a final state's event looks again whether its plan's audit
/// is closed (no slice leased).
pub const AUDIT_RECHECK: Duration = Duration::from_secs(1);
/// Default attempts of a delivery (`--webhook-attempts`).
pub const DEFAULT_ATTEMPTS: u32 = 15;
/// Default first retry delay (`--webhook-retry-min`).
pub const DEFAULT_RETRY_MIN: Duration = Duration::from_secs(5);

/// A webhook target: where events are posted and the secret they are
/// signed with.
#[derive(Debug, Clone)]
pub struct Target {
    /// The URL ([`super::check_url`]).
    pub url: Uri,
    /// The signing secret.
    pub secret: Secret,
}

/// How this replica delivers.
#[derive(Debug, Clone)]
pub struct Delivery {
    /// The planner's own target (`--webhook-url`, `--webhook-secret-file`).
    pub target: Option<Target>,
    /// Attempts before a delivery is kept as `failed` (`--webhook-attempts`).
    pub attempts: u32,
    /// The first retry's delay, doubling to [`RETRY_MAX`] (`--webhook-retry-min`).
    pub retry_min: Duration,
}

/// Delivers due webhooks until `shutdown`; attempts under way then end
/// within [`ATTEMPT_TIMEOUT`].
pub(crate) async fn run(store: Store, delivery: Delivery, shutdown: CancellationToken) {
    let client = Client::new();
    loop {
        let due = match store
            .take_due_webhooks(BATCH, LEASE, delivery.target.is_some())
            .await
        {
            Ok(due) => due,
            Err(error) => {
                debug!(%error, "taking due webhook deliveries failed");
                Vec::new()
            }
        };
        let found = !due.is_empty();
        futures::future::join_all(due.into_iter().map(|row| {
            let (store, client, delivery) = (&store, &client, &delivery);
            async move {
                let id = row.webhook_id.clone();
                if let Err(error) = attempt(store, client, delivery, row).await {
                    debug!(
                        webhook.id = id,
                        error = format!("{error:#}"),
                        "webhook attempt not recorded"
                    );
                }
            }
        }))
        .await;
        if shutdown.is_cancelled() {
            return;
        }
        if !found {
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(POLL_INTERVAL) => {}
            }
        }
    }
}

/// One attempt of `row`: its body (made once), signed, posted; the outcome
/// recorded and counted.
async fn attempt(
    store: &Store,
    client: &Client,
    delivery: &Delivery,
    row: DueWebhook,
) -> anyhow::Result<()> {
    let Some(target) = target_of(delivery, &row) else {
        let outcome = AttemptOutcome::Failed("the target is gone or invalid".into());
        store.metrics().webhook_attempted("failed");
        return Ok(store.record_webhook_attempt(row.id, &outcome).await?);
    };
    let body = match row.body.clone() {
        Some(body) => body,
        None => match make_body(store, &row).await? {
            Some(body) => store.freeze_webhook_body(row.id, &body).await?,
            None => return Ok(store.postpone_webhook(row.id, AUDIT_RECHECK).await?),
        },
    };
    let timestamp = chrono::Utc::now().timestamp();
    let headers = [
        ("webhook-id", row.webhook_id.clone()),
        ("webhook-timestamp", timestamp.to_string()),
        (
            "webhook-signature",
            target.secret.sign(&row.webhook_id, timestamp, &body),
        ),
    ];
    let failure = match tokio::time::timeout(
        ATTEMPT_TIMEOUT,
        client.post(&target.url, "application/json", &headers, body),
    )
    .await
    {
        Ok(Ok(status)) if status.is_success() => None,
        Ok(Ok(status)) => Some(format!("answered {status}")),
        Ok(Err(error)) => Some(error),
        Err(_) => Some(format!("no answer within {ATTEMPT_TIMEOUT:?}")),
    };
    let attempts = u32::try_from(row.attempts).unwrap_or(0) + 1;
    let (outcome, name) = match failure {
        None => (AttemptOutcome::Delivered, "delivered"),
        Some(error) if attempts >= delivery.attempts => {
            warn!(
                webhook.id = row.webhook_id,
                webhook.event = row.event_type,
                webhook.url = %target.url,
                attempts,
                error,
                "webhook not delivered after its last attempt: kept as failed"
            );
            (AttemptOutcome::Failed(error), "failed")
        }
        Some(error) => {
            let after = Backoff::nth_delay(delivery.retry_min, RETRY_MAX, attempts);
            debug!(
                webhook.id = row.webhook_id,
                attempts,
                error,
                retry_in_ms = after.as_millis() as u64,
                "webhook attempt failed"
            );
            (AttemptOutcome::Retry(after, error), "retried")
        }
    };
    store.metrics().webhook_attempted(name);
    Ok(store.record_webhook_attempt(row.id, &outcome).await?)
}

/// Where `row` goes: the planner's target, or its plan's (`None`: the
/// planner has none, or the stored one no longer reads).
fn target_of(delivery: &Delivery, row: &DueWebhook) -> Option<Target> {
    if row.target == "planner" {
        return delivery.target.clone();
    }
    Some(Target {
        url: super::check_url(row.url.as_deref()?).ok()?,
        secret: Secret::parse(row.secret.as_deref()?).ok()?,
    })
}

/// The body of `row`: its event, time and data, a `plan.ended` event's with
/// the plan's `report_digest` ([`report_digest`]) once its audit is closed;
/// `None` while a slice of the plan is still leased (an executor may yet
/// report what it handed to the broker).
///
/// # Errors
/// Reading the plan or its audit failed.
async fn make_body(store: &Store, row: &DueWebhook) -> anyhow::Result<Option<String>> {
    let mut data = row.data.clone();
    if EventType::from_name(&row.event_type) == Some(EventType::PlanEnded)
        && let Some(plan_id) = row.plan_id
    {
        if store.plan_has_leases(plan_id).await? {
            return Ok(None);
        }
        data["report_digest"] = report_digest(store, plan_id).await?.into();
    }
    Ok(Some(super::body(&row.event_type, row.occurred_at, &data)))
}

/// The plan's reconciliation report digest: the hex SHA-256 of its audit
/// export in JSON Lines exactly as `ExportAudit` (format
/// `EXPORT_FORMAT_JSONL`) streams it, chunks joined; the same bytes as
/// `redrivectl plan report PLAN --format jsonl` writes.
///
/// # Errors
/// No such plan; reading the audit failed.
pub async fn report_digest(store: &Store, plan_id: PlanId) -> anyhow::Result<String> {
    let mut chunks = crate::audit::export(store, plan_id, v1::ExportFormat::Jsonl)
        .await
        .map_err(|error| anyhow::anyhow!("{error}"))?;
    let mut hasher = Sha256::new();
    while let Some(chunk) = chunks.next().await {
        hasher.update(chunk.context("reading the audit export")?.data);
    }
    Ok(hex::encode(hasher.finalize()))
}
