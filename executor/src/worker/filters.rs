//! The pipeline's first and third steps: what is decided without
//! publishing (stale items, the owning services' verdicts, keys already
//! replayed).

use std::{collections::HashMap, time::Duration};

use redrive_proto::{backoff::Backoff, v1};
use tracing::{info, warn};

use super::{Worker, slice::SliceRun};

/// The replay keys' failures in [`LoopFailures`](crate::loop_failures::LoopFailures).
const REPLAY_KEYS: &str = "replay keys";
use crate::{lease::Lease, outcomes::Work, publisher::Connect};

impl<C: Connect> Worker<C> {
    /// The owning services' verdicts now, for items a hook covers
    /// (`skipped_state` / `needs_compensation`); `None` when publishing
    /// stopped while the planner did not answer.
    pub(super) async fn recheck_state(
        &self,
        lease: &Lease,
        run: &mut SliceRun,
        items: Vec<Work>,
    ) -> Option<Vec<Work>> {
        let to_check: Vec<String> = items
            .iter()
            .filter(|work| work.item.state_check)
            .map(|work| work.dead_letter_id().to_owned())
            .collect();
        if to_check.is_empty() {
            return Some(items);
        }
        run.progress.waiting_for("the state re-check");
        let mut backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(5));
        let decisions = loop {
            let mut coordinator = self.coordinator.clone();
            let request = v1::RecheckStateRequest {
                plan_id: run.context.plan_id.clone(),
                dead_letter_ids: to_check.clone(),
                slice_id: lease.slice_id().to_owned(),
                fencing_token: lease.token(),
            };
            let answer = tokio::select! {
                () = lease.stopped() => {
                    run.requeue(items);
                    return None;
                }
                answer = coordinator.recheck_state(request) => answer,
            };
            match answer {
                Ok(answer) => break answer.into_inner().decisions,
                Err(status) => {
                    warn!(code = ?status.code(), grpc_message = status.message(), "state re-check failed: not publishing these items until it answers");
                    tokio::select! {
                        () = lease.stopped() => {
                            run.requeue(items);
                            return None;
                        }
                        () = tokio::time::sleep(backoff.next_delay()) => {}
                    }
                }
            }
        };
        let decisions: HashMap<String, v1::StateDecision> = decisions
            .into_iter()
            .map(|decision| (decision.dead_letter_id.clone(), decision))
            .collect();
        let mut allowed = Vec::with_capacity(items.len());
        for work in items {
            match decisions.get(work.dead_letter_id()) {
                Some(decision) if decision.verdict() == v1::StateCheckVerdict::Block => {
                    let reason = decision.reason.clone();
                    run.finish(&work, v1::AuditAction::SkippedState, &reason)
                        .await;
                }
                Some(decision)
                    if decision.verdict() == v1::StateCheckVerdict::NeedsCompensation =>
                {
                    let reason = decision.reason.clone();
                    run.finish(&work, v1::AuditAction::NeedsCompensation, &reason)
                        .await;
                }
                _ => allowed.push(work),
            }
        }
        Some(allowed)
    }

    /// Drops items whose key Redis says was sent (by an earlier lease of this
    /// plan: `sent`; by another plan: `skipped_duplicate`); `None` when
    /// publishing stopped while Redis did not answer (fail closed).
    pub(super) async fn drop_replayed(
        &self,
        lease: &Lease,
        run: &mut SliceRun,
        items: Vec<Work>,
    ) -> Option<Vec<Work>> {
        let Some(replay_keys) = &self.replay_keys else {
            return Some(items);
        };
        let keys: Vec<String> = items.iter().map(Work::replay_identity).collect();
        let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(2));
        let sent = loop {
            let answer = tokio::select! {
                () = lease.stopped() => {
                    run.requeue(items);
                    return None;
                }
                answer = replay_keys.sent_by(&keys) => answer,
            };
            match answer {
                Ok(sent) => {
                    if self
                        .settings
                        .failures
                        .mended(REPLAY_KEYS, tokio::time::Instant::now())
                    {
                        info!(redis = %self.settings.redis, "replay keys reachable again: publishing (said once for all slice loops)");
                    }
                    break sent;
                }
                Err(error) => {
                    let delay = backoff.next_delay();
                    if self.settings.failures.to_say(
                        REPLAY_KEYS,
                        &error.to_string(),
                        tokio::time::Instant::now(),
                        delay,
                    ) {
                        warn!(redis = %self.settings.redis, %error, retry_in_ms = delay.as_millis() as u64,
                            "replay keys unreachable: not publishing until Redis is back (fail closed; said once for all slice loops)");
                    }
                    tokio::select! {
                        () = lease.stopped() => {
                            run.requeue(items);
                            return None;
                        }
                        () = tokio::time::sleep(delay) => {}
                    }
                }
            }
        };
        let mut unsent = Vec::with_capacity(items.len());
        for (work, sent_by) in items.into_iter().zip(sent) {
            match sent_by {
                None => unsent.push(work),
                // An earlier lease of this plan had it confirmed and marked,
                // then died before reporting: it is sent.
                Some(plan) if plan == run.context.plan_id => {
                    let reason = "confirmed under an earlier lease of this plan (Redis replay key); not published again";
                    run.finish(&work, v1::AuditAction::Sent, reason).await;
                }
                // That replay came back as a re-dead-letter: not a duplicate.
                Some(plan) if work.item.came_back_from.contains(&plan) => unsent.push(work),
                Some(plan) => {
                    let reason =
                        format!("message key already replayed by plan {plan} (Redis replay keys)");
                    run.finish(&work, v1::AuditAction::SkippedDuplicate, &reason)
                        .await;
                }
            }
        }
        Some(unsent)
    }
}

/// Items past their deadline now are `skipped_stale`; the rest go on.
pub(super) async fn drop_stale(run: &mut SliceRun, items: Vec<Work>) -> Vec<Work> {
    let now = chrono::Utc::now();
    let mut fresh = Vec::with_capacity(items.len());
    for work in items {
        let stale = work.item.stale_at.is_some_and(|at| at <= now);
        if stale {
            let reason = "past its event type's deadline at send time";
            run.finish(&work, v1::AuditAction::SkippedStale, reason)
                .await;
        } else {
            fresh.push(work);
        }
    }
    fresh
}
