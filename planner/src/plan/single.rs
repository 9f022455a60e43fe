//! One dead letter at a time (docs/design.md, "Flow"): `ReplayDeadLetter` replays
//! it as a plan of one through the same path as every plan, and
//! `RepairDeadLetter` stores a corrected body as a new revision.
//!
//! A plan of one has no canary wave and no approval step; everything else is
//! the plan path: the precheck with the planner's policy merged into the
//! options as for `RunPrecheck` (so an already replayed, stale, blocked or
//! looping dead letter is refused with the precheck's reason, whatever options
//! the caller sent, unless it overrides the policy with a reason), executors
//! claiming its slice under a lease, the send-time replay-key, stale and state
//! checks, the destination's shared token bucket, publisher confirms, the
//! replay headers and the audit.

use std::{sync::Arc, time::Duration};

use redrive_proto::{time::from_duration, v1};
use sha2::{Digest, Sha256};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::{
    audit::notifier::Notifier,
    dead_letters::ExtractionRules,
    dead_letters::inspect,
    error::Error,
    ids::{DeadLetterId, PlanId, PrecheckId},
    precheck::policy::Policy,
    precheck::state_check::StateChecker,
    precheck::{self, PrecheckRequest},
    store::{
        Store,
        leases::FINAL_ITEM_STATES,
        plans::{CreateOutcome, DestinationMode, NewPlan},
        single::{RepairOutcome, SingleOutcome, SingleProgress},
    },
};

/// How long `ReplayDeadLetter` waits for an executor's outcome by default.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(30);
/// The longest wait a caller may ask for.
pub use redrive_proto::limits::MAX_REPLAY_WAIT as MAX_WAIT;
/// The rate of a plan of one when no running plan publishes to its
/// destination: one message, at once when the bucket is idle.
const SINGLE_RATE_PER_SECOND: f64 = 1.0;
/// The most body bytes (captured plus every revision) one dead letter may
/// hold: `GetDeadLetter` answers them all, under the 64 MiB gRPC message limit.
pub const MAX_BODIES_BYTES: usize = 48 * 1024 * 1024;
/// Who the planner records as the actor of what it does by itself.
const PLANNER_ACTOR: &str = "redrive-planner";

/// What the planner needs to replay or repair one dead letter.
#[derive(Debug, Clone, Copy)]
pub struct Single<'a> {
    /// PostgreSQL.
    pub store: &'a Store,
    /// State-check hooks (the precheck).
    pub checker: &'a Arc<StateChecker>,
    /// The planner's policy, merged into the options as for every precheck.
    pub policy: &'a Policy,
    /// Plan-change notifications (executor reports wake the wait).
    pub notifier: &'a Notifier,
    /// Body limit and content-type rules (repairs).
    pub rules: &'a ExtractionRules,
    /// The planner's shutdown: a wait ends at once, cancelling its plan of one
    /// when no executor has claimed it.
    pub shutdown: &'a CancellationToken,
}

fn not_replayed(reason: impl Into<String>) -> v1::ReplayDeadLetterResponse {
    v1::ReplayDeadLetterResponse {
        outcome: v1::replay_dead_letter_response::Outcome::NotReplayed.into(),
        reason: reason.into(),
        ..Default::default()
    }
}

/// The wait a replay asks for: [`DEFAULT_WAIT`] when not given.
///
/// # Errors
/// `InvalidArgument` naming `wait` outside (0, [`MAX_WAIT`]].
fn replay_wait(wait: Option<&prost_types::Duration>) -> Result<Duration, Error> {
    match wait {
        None => Ok(DEFAULT_WAIT),
        Some(wait) => from_duration(wait)
            .filter(|wait| !wait.is_zero() && *wait <= MAX_WAIT)
            .ok_or_else(|| Error::invalid("wait", "must be above 0 and at most 10 min")),
    }
}

/// `reason` trimmed; `InvalidArgument` naming `reason` when empty, asking to
/// say why `what` (`this dead letter is replayed`).
pub(crate) fn required_reason(reason: &str, what: &str) -> Result<String, Error> {
    let reason = reason.trim();
    if reason.is_empty() {
        return Err(Error::invalid(
            "reason",
            format!("required: say why {what}"),
        ));
    }
    Ok(reason.to_owned())
}

impl Single<'_> {
    /// Replays dead letter `request.dead_letter_id` as a plan of one and waits
    /// for the executor's outcome (`request.wait`, default [`DEFAULT_WAIT`]).
    ///
    /// Answers `REPLAYED` with the `sent` audit event, or `NOT_REPLAYED` with
    /// why: the precheck's verdict and reason (already replayed, stale,
    /// blocked by state, ...), another plan that still holds it, the
    /// executor's outcome (skipped at send time, failed, unroutable), a plan
    /// cancelled or aborted meanwhile, or no executor claiming it in time (the
    /// plan of one is then cancelled, so nothing is published later).
    ///
    /// # Errors
    /// `InvalidArgument` naming the field (id, empty reason, wait outside
    /// (0, 10 min], options, an option looser than the planner's policy
    /// without `options.override_policy`); `NotFound` for an unknown dead letter;
    /// `DeadlineExceeded` when an executor claimed it but has not reported by
    /// the end of the wait (the message names the plan to follow with
    /// WatchPlan); `Unavailable` when a hook fails; store errors.
    pub async fn replay(
        &self,
        actor: &str,
        request: v1::ReplayDeadLetterRequest,
    ) -> Result<v1::ReplayDeadLetterResponse, Error> {
        let id = DeadLetterId::parse("dead_letter_id", request.dead_letter_id.trim())?;
        let reason = required_reason(&request.reason, "this dead letter is replayed")?;
        let wait = replay_wait(request.wait.as_ref())?;
        let precheck = PrecheckRequest::new(
            actor.to_owned(),
            v1::Selector {
                ids: vec![id.to_string()],
                ..Default::default()
            },
            request.options.unwrap_or_default(),
            self.policy,
        )?;
        let (dead_letter, _) = inspect::get(self.store, id).await?;
        if let Some(archived) = &dead_letter.archived {
            return Err(Error::FailedPrecondition(format!(
                "dead letter {id} is archived (by {}: {}): unarchive it to replay it",
                archived.actor, archived.reason
            )));
        }
        let (report, precheck_id, item) = self.precheck_one(id, precheck).await?;
        let verdict = item.verdict();
        let answered = |mut response: v1::ReplayDeadLetterResponse| {
            response.precheck_id = report.precheck_id.clone();
            response.verdict = verdict.into();
            response.warnings.clone_from(&report.warnings);
            response
        };
        if verdict != v1::Verdict::Replayable {
            return Ok(answered(not_replayed(format!(
                "{}: {}",
                verdict.name(),
                item.reason
            ))));
        }

        if dead_letter.exchange_only {
            return Ok(answered(not_replayed(format!(
                "only the exchange and routing key it was published with are known ({}), not the queue it failed in: a single replay goes to that queue; replay it with a plan in exchange mode or with a redirect",
                dead_letter.destination
            ))));
        }
        let plan = self.plan_of_one(actor, id, precheck_id, &reason).await?;
        // Subscribe before the plan exists so that no report is missed.
        let mut changes = self.notifier.subscribe();
        if let Some(refused) = self.create(&plan, id, wait).await? {
            return Ok(answered(refused));
        }
        let mut response = self.await_outcome(plan.id, id, wait, &mut changes).await?;
        response.plan_id = plan.id.to_string();
        Ok(answered(response))
    }

    /// Runs `precheck` of dead letter `id` alone: its report, its id, and the
    /// dead letter's item (verdict and reason).
    ///
    /// # Errors
    /// `NotFound` when the report has no item for it; the precheck's errors.
    async fn precheck_one(
        &self,
        id: DeadLetterId,
        precheck: PrecheckRequest,
    ) -> Result<(v1::PrecheckReport, PrecheckId, v1::PrecheckItem), Error> {
        let report = precheck::run(self.store, self.checker, precheck).await?;
        let precheck_id = Uuid::parse_str(&report.precheck_id)
            .map(PrecheckId::new)
            .map_err(|error| Error::FailedPrecondition(error.to_string()))?;
        let item = self
            .store
            .list_precheck_items(precheck_id, None, 0, 1, None)
            .await?
            .into_iter()
            .next()
            .ok_or_else(|| Error::NotFound(format!("dead letter {id} not found")))?;
        Ok((report, precheck_id, item))
    }

    /// The plan of one that replays dead letter `id` to the queue it failed
    /// in, from `precheck_id`, at its destination's rate
    /// ([`Self::destination_rate`]).
    ///
    /// # Errors
    /// `NotFound` for an unknown dead letter; store errors.
    async fn plan_of_one(
        &self,
        actor: &str,
        id: DeadLetterId,
        precheck_id: PrecheckId,
        reason: &str,
    ) -> Result<NewPlan, Error> {
        let (exchange, routing_key) = self
            .store
            .route_of(id, &DestinationMode::Queue)
            .await?
            .ok_or_else(|| Error::NotFound(format!("dead letter {id} not found")))?;
        let (per_second, burst) = self
            .destination_rate(&crate::store::plans::landing_name(&exchange, &routing_key))
            .await?;
        Ok(NewPlan {
            id: PlanId::generate(),
            precheck_id,
            per_second,
            burst,
            rationale: format!("single dead letter {id}: {reason}"),
            destination: DestinationMode::Queue,
            slice_size: 1,
            canary_fraction: 0.0,
            ramp: Vec::new(),
            observe_for_ms: 0,
            actor: actor.to_owned(),
            ordered: false,
            webhook: None,
        })
    }

    /// Stores `plan` of dead letter `id` (its slice to be claimed within
    /// `wait`). `Some(answer)`: not created, with why (another running plan
    /// holds it, or nothing was replayable).
    ///
    /// # Errors
    /// `FailedPrecondition` when its precheck cannot make a plan for another
    /// reason; store errors.
    async fn create(
        &self,
        plan: &NewPlan,
        id: DeadLetterId,
        wait: Duration,
    ) -> Result<Option<v1::ReplayDeadLetterResponse>, Error> {
        match self
            .store
            .create_single_plan(
                plan,
                id,
                "single dead letter: no canary or approval step",
                wait,
            )
            .await?
        {
            SingleOutcome::Created => Ok(None),
            SingleOutcome::InPlan(active) => Ok(Some(not_replayed(format!(
                "in another running plan: plan {} ({}) is still to publish it",
                active.plan_id, active.state
            )))),
            SingleOutcome::NotCreated(CreateOutcome::NothingReplayable) => {
                Ok(Some(not_replayed("the precheck left nothing replayable")))
            }
            SingleOutcome::NotCreated(other) => Err(Error::FailedPrecondition(format!(
                "precheck {} cannot make a plan: {other:?}",
                plan.precheck_id
            ))),
        }
    }

    /// The rate of a plan of one: that of the slowest plan publishing to the
    /// same destination now (canary or main wave: it draws from the same
    /// bucket, at that plan's pace), else [`SINGLE_RATE_PER_SECOND`] with a
    /// burst of 1.
    async fn destination_rate(&self, destination: &str) -> Result<(f64, u32), Error> {
        let mut rate = None::<(f64, u32)>;
        for (plan_id, _) in self
            .store
            .running_plans_to(&[destination.to_owned()])
            .await?
        {
            if let Some(plan) = self.store.get_plan(plan_id).await?
                && plan.state().is_publishing()
                && let Some(plan_rate) = plan.rate
                && rate.is_none_or(|(per_second, _)| plan_rate.per_second < per_second)
            {
                rate = Some((plan_rate.per_second, plan_rate.burst.max(1)));
            }
        }
        Ok(rate.unwrap_or((SINGLE_RATE_PER_SECOND, 1)))
    }

    /// Waits until the plan of one's item is final, the plan ends, or `wait`
    /// passes.
    async fn await_outcome(
        &self,
        plan_id: PlanId,
        dead_letter_id: DeadLetterId,
        wait: Duration,
        changes: &mut tokio::sync::broadcast::Receiver<PlanId>,
    ) -> Result<v1::ReplayDeadLetterResponse, Error> {
        let deadline = Instant::now() + wait;
        loop {
            let progress = self
                .store
                .single_progress(plan_id)
                .await?
                .ok_or_else(|| Error::NotFound(format!("plan {plan_id} not found")))?;
            if FINAL_ITEM_STATES.contains(&progress.item_state.as_str()) {
                return self
                    .final_outcome(plan_id, dead_letter_id, &progress.item_state)
                    .await;
            }
            if matches!(
                progress.plan_state.get(),
                v1::PlanState::Cancelled | v1::PlanState::Aborted
            ) {
                return Ok(not_replayed(format!(
                    "plan {plan_id} was {} before publishing it: {}",
                    progress.plan_state, progress.plan_reason
                )));
            }
            let now = Instant::now();
            let shutting_down = self.shutdown.is_cancelled();
            if now >= deadline || shutting_down {
                return self
                    .unfinished(plan_id, dead_letter_id, wait, &progress, shutting_down)
                    .await;
            }
            // Reports notify the plan's channel; the poll covers a lost notification.
            let poll = (deadline - now).min(Duration::from_millis(500));
            tokio::select! {
                _ = changes.recv() => {}
                () = tokio::time::sleep(poll) => {}
                () = self.shutdown.cancelled() => {}
            }
        }
    }

    /// The answer for the final `item_state` of plan `plan_id`'s item, with
    /// its audit event.
    ///
    /// # Errors
    /// Store errors.
    async fn final_outcome(
        &self,
        plan_id: PlanId,
        dead_letter_id: DeadLetterId,
        item_state: &str,
    ) -> Result<v1::ReplayDeadLetterResponse, Error> {
        let event = self
            .store
            .audit_events(plan_id, 0, 1000)
            .await?
            .into_iter()
            .map(|(_, event)| event)
            .rfind(|event| {
                event.dead_letter_id == dead_letter_id.to_string()
                    && event.action().name() == item_state
            });
        let detail = event.as_ref().map(|e| e.reason.clone()).unwrap_or_default();
        let sent = item_state == "sent";
        Ok(v1::ReplayDeadLetterResponse {
            outcome: if sent {
                v1::replay_dead_letter_response::Outcome::Replayed
            } else {
                v1::replay_dead_letter_response::Outcome::NotReplayed
            }
            .into(),
            reason: match (sent, detail.is_empty()) {
                (true, true) => "published and confirmed by the broker".to_owned(),
                (true, false) => format!("published and confirmed by the broker; {detail}"),
                (false, true) => item_state.to_owned(),
                (false, false) => format!("{item_state}: {detail}"),
            },
            event,
            ..Default::default()
        })
    }

    /// The answer when the wait ended (or the planner is `shutting_down`)
    /// before the item was final: the plan of one is cancelled when no
    /// executor claimed it, so it is not published later.
    ///
    /// # Errors
    /// `Unavailable` (shutting down) or `DeadlineExceeded` when an executor
    /// may be publishing it, naming the plan to follow; store errors.
    async fn unfinished(
        &self,
        plan_id: PlanId,
        dead_letter_id: DeadLetterId,
        wait: Duration,
        progress: &SingleProgress,
        shutting_down: bool,
    ) -> Result<v1::ReplayDeadLetterResponse, Error> {
        let why = if shutting_down {
            "the planner is shutting down and no executor had claimed it".to_owned()
        } else {
            format!(
                "no executor claimed it within {}s: is a redrive-executor running and connected to this planner?",
                wait.as_secs_f64()
            )
        };
        if self
            .store
            .cancel_unclaimed(plan_id, PLANNER_ACTOR, &why)
            .await?
        {
            return Ok(not_replayed(format!(
                "{why} (plan of one {plan_id} cancelled, so it will not be published later)"
            )));
        }
        let follow = format!("follow it with `redrivectl plan watch {plan_id}`");
        if shutting_down {
            return Err(Error::Unavailable(format!(
                "the planner is shutting down while an executor publishes dead letter {dead_letter_id} (plan {plan_id}); {follow}"
            )));
        }
        Err(Error::DeadlineExceeded(if progress.claimed {
            format!(
                "an executor is publishing dead letter {dead_letter_id} (plan {plan_id}) but has not reported within {}s; {follow}",
                wait.as_secs_f64()
            )
        } else {
            format!(
                "plan {plan_id} ({}) has not published dead letter {dead_letter_id} within {}s; {follow}",
                progress.plan_state,
                wait.as_secs_f64()
            )
        }))
    }

    /// Stores `request.new_body` as the next revision of the dead letter and
    /// answers it as GetDeadLetter does (both bodies visible). From then on
    /// prechecks and replays use the new body, and the audit event of its
    /// replay names the revision and who repaired it.
    ///
    /// # Errors
    /// `InvalidArgument` naming the field: an empty reason, a body over the
    /// planner's body limit, a body that does not parse as JSON when the dead
    /// letter's content type says JSON; `NotFound`; `FailedPrecondition` when
    /// the body is the one replays use already, the dead letter's bodies would
    /// pass [`MAX_BODIES_BYTES`], or a plan that is not final
    /// still has the dead letter to publish (cancel it or let it finish first);
    /// store errors.
    pub async fn repair(
        &self,
        actor: &str,
        request: v1::RepairDeadLetterRequest,
    ) -> Result<v1::GetDeadLetterResponse, Error> {
        let id = DeadLetterId::parse("dead_letter_id", request.dead_letter_id.trim())?;
        let reason = required_reason(&request.reason, "this dead letter is repaired")?;
        let body = request.new_body;
        if body.len() > self.rules.max_body_bytes {
            return Err(Error::invalid(
                "new_body",
                format!(
                    "{} bytes is over the planner's {}-byte body limit",
                    body.len(),
                    self.rules.max_body_bytes
                ),
            ));
        }
        let (dead_letter, _) = inspect::get(self.store, id).await?;
        let held = dead_letter.body.len()
            + dead_letter
                .revisions
                .iter()
                .map(|revision| revision.body.len())
                .sum::<usize>();
        if held + body.len() > MAX_BODIES_BYTES {
            return Err(Error::FailedPrecondition(format!(
                "dead letter {id} holds {held} bytes of bodies (captured and revisions); with these {} bytes it would pass {MAX_BODIES_BYTES}, the most GetDeadLetter can answer",
                body.len()
            )));
        }
        let content_type = dead_letter
            .properties
            .as_ref()
            .and_then(|properties| properties.content_type.clone())
            .unwrap_or_default();
        if content_type.to_ascii_lowercase().contains("json") {
            // Read as capture reads it: decoded by the codec its magic
            // bytes or the dead letter's declared encoding name.
            let declared = crate::dead_letters::body::declared_encoding(
                &dead_letter.properties.clone().unwrap_or_default(),
                &dead_letter.headers.clone().unwrap_or_default(),
            );
            let decoded = crate::dead_letters::body::decode(
                &body,
                declared.as_deref(),
                self.rules.max_body_bytes,
            )
            .map_err(|error| Error::invalid("new_body", error.to_string()))?;
            if let Err(error) = serde_json::from_slice::<serde_json::Value>(&decoded.0) {
                return Err(Error::invalid(
                    "new_body",
                    format!(
                        "content type {content_type} but the body does not parse as JSON: {error}"
                    ),
                ));
            }
        }
        let sha256: [u8; 32] = Sha256::digest(&body).into();
        match self
            .store
            .repair_dead_letter(id, &body, &sha256, actor, &reason)
            .await?
        {
            RepairOutcome::Repaired(revision) => {
                tracing::info!(
                    dead_letter.id = id.get(),
                    revision,
                    actor,
                    "dead letter repaired"
                );
            }
            RepairOutcome::NotFound => {
                return Err(Error::NotFound(format!("dead letter {id} not found")));
            }
            RepairOutcome::Unchanged => {
                return Err(Error::FailedPrecondition(format!(
                    "new_body is the body dead letter {id} replays with already"
                )));
            }
            RepairOutcome::InPlan(active) => {
                return Err(Error::FailedPrecondition(format!(
                    "dead letter {id} is still to be published by plan {} ({}): cancel that plan or let it finish before repairing",
                    active.plan_id, active.state
                )));
            }
        }
        let (dead_letter, body_preview) = inspect::get(self.store, id).await?;
        Ok(v1::GetDeadLetterResponse {
            dead_letter: Some(dead_letter),
            body_preview,
        })
    }
}
