//! Replay plans (docs/design.md, "Flow" steps 4–5): created from a precheck with a
//! rate and its rationale, approved with the digest of the precheck the
//! approver read.

pub mod gates;
pub mod preview;
pub mod single;
pub mod state;

use std::time::Duration;

use redrive_proto::{time::from_duration, v1};

use crate::{
    error::Error,
    ids::{DeadLetterId, PlanId, PrecheckId},
    plan::state::Event,
    store::{
        Store,
        plans::{CHANGES_LISTED, CreateOutcome, DestinationMode, Moved, NewPlan},
    },
    webhooks,
};

pub use redrive_proto::limits::{
    MAX_OBSERVE_FOR, MAX_RATE_BURST, MAX_RATE_PER_SECOND, MAX_SLICE_SIZE, MIN_RATE_PER_SECOND,
};

/// Default items per slice.
pub const DEFAULT_SLICE_SIZE: u32 = 100;
/// Default canary share: 1% (at least one item).
pub const DEFAULT_CANARY_FRACTION: f64 = 0.01;
/// Default observation window after the canary.
pub const DEFAULT_OBSERVE_FOR: Duration = Duration::from_secs(15 * 60);

/// Validates a `CreatePlanRequest` into a plan to store.
///
/// # Errors
/// `InvalidArgument` naming the field: a rate of 0 or below (or not finite), a
/// burst below 1, an empty rationale, a slice size over [`MAX_SLICE_SIZE`], a
/// canary fraction outside (0, 1], a redirect without exchange or routing key.
pub fn validate_create(request: v1::CreatePlanRequest, actor: String) -> Result<NewPlan, Error> {
    let precheck_id = PrecheckId::parse("precheck_id", &request.precheck_id)?;
    let rate = request
        .rate
        .ok_or_else(|| Error::invalid("rate", "required: per_second, burst and rationale"))?;
    if !(rate.per_second.is_finite()
        && (MIN_RATE_PER_SECOND..=MAX_RATE_PER_SECOND).contains(&rate.per_second))
    {
        return Err(Error::invalid(
            "rate.per_second",
            format!(
                // `{:?}`: 1e308 in five characters, not 309 digits.
                "{:?} is not a rate from {MIN_RATE_PER_SECOND} to {MAX_RATE_PER_SECOND} messages per second",
                rate.per_second
            ),
        ));
    }
    if !(1..=MAX_RATE_BURST).contains(&rate.burst) {
        return Err(Error::invalid(
            "rate.burst",
            format!("{} is not a burst from 1 to {MAX_RATE_BURST}", rate.burst),
        ));
    }
    if rate.rationale.trim().is_empty() {
        return Err(Error::invalid(
            "rate.rationale",
            "required: say how the rate follows from the downstream's capacity",
        ));
    }
    let destination = match request.destination.and_then(|destination| destination.mode) {
        None | Some(v1::destination::Mode::Queue(_)) => DestinationMode::Queue,
        Some(v1::destination::Mode::Exchange(_)) => DestinationMode::Exchange,
        Some(v1::destination::Mode::Redirect(redirect)) => {
            if redirect.exchange.is_empty() && redirect.routing_key.is_empty() {
                return Err(Error::invalid(
                    "destination.redirect",
                    "needs an exchange, or a routing key (a queue name) for the default exchange",
                ));
            }
            DestinationMode::Redirect {
                exchange: redirect.exchange,
                routing_key: redirect.routing_key,
            }
        }
    };
    let slice_size = match request.slice_size {
        0 => DEFAULT_SLICE_SIZE,
        size if size > MAX_SLICE_SIZE => {
            return Err(Error::invalid(
                "slice_size",
                format!("at most {MAX_SLICE_SIZE}"),
            ));
        }
        size => size,
    };
    let canary_fraction = request.canary_fraction.unwrap_or(DEFAULT_CANARY_FRACTION);
    if !(canary_fraction > 0.0 && canary_fraction <= 1.0) {
        return Err(Error::invalid(
            "canary_fraction",
            "must be above 0 and at most 1",
        ));
    }
    let ramp = ramp_of(&request.ramp, canary_fraction)?;
    let observe_for = match request.observe_for {
        None => DEFAULT_OBSERVE_FOR,
        Some(duration) => from_duration(&duration)
            .ok_or_else(|| Error::invalid("observe_for", "must not be negative"))
            .and_then(|observe_for| {
                // Kept in milliseconds: a shorter window would be none.
                if !observe_for.is_zero() && observe_for < Duration::from_millis(1) {
                    return Err(Error::invalid(
                        "observe_for",
                        "must be 0 or at least 1 ms (the window is kept in milliseconds)",
                    ));
                }
                redrive_proto::limits::at_most(observe_for, MAX_OBSERVE_FOR)
                    .map_err(|problem| Error::invalid("observe_for", problem))
            })?,
    };
    Ok(NewPlan {
        id: PlanId::generate(),
        precheck_id,
        per_second: rate.per_second,
        burst: rate.burst,
        rationale: rate.rationale.trim().to_owned(),
        destination,
        slice_size,
        canary_fraction,
        ramp,
        observe_for_ms: i64::try_from(observe_for.as_millis()).unwrap_or(i64::MAX),
        actor,
        ordered: request.ordered,
        webhook: plan_webhook(request.webhook_url, request.webhook_secret)?,
    })
}

/// Most waves a ramp may add between the canary and the main wave.
pub const MAX_RAMP_WAVES: usize = 8;

/// The waves a ramp adds after the canary (docs/replay.md, "Ramps"):
/// cumulative fractions of the items, each above the one before (the first
/// above `canary_fraction`) and below 1 (the main wave takes the rest).
///
/// # Errors
/// `InvalidArgument` naming `ramp[i]`.
fn ramp_of(ramp: &[f64], canary_fraction: f64) -> Result<Vec<f64>, Error> {
    if ramp.len() > MAX_RAMP_WAVES {
        return Err(Error::invalid(
            "ramp",
            format!("at most {MAX_RAMP_WAVES} waves between the canary and the main wave"),
        ));
    }
    let mut before = canary_fraction;
    for (index, &fraction) in ramp.iter().enumerate() {
        if !(fraction.is_finite() && fraction > before && fraction < 1.0) {
            return Err(Error::invalid(
                format!("ramp[{index}]"),
                format!(
                    "{fraction:?} must be a cumulative fraction of the items above {before:?} (the \
                     wave before it) and below 1 (the main wave takes the rest)"
                ),
            ));
        }
        before = fraction;
    }
    Ok(ramp.to_vec())
}

/// A plan's own webhook target (`webhook_url` with `webhook_secret`), both
/// or neither, checked ([`webhooks::check_url`], [`webhooks::Secret::parse`]).
///
/// # Errors
/// `InvalidArgument` naming the field; the secret is never quoted.
fn plan_webhook(url: String, secret: String) -> Result<Option<(String, String)>, Error> {
    match (url.is_empty(), secret.is_empty()) {
        (true, true) => Ok(None),
        (false, true) => Err(Error::invalid(
            "webhook_secret",
            "required with webhook_url: the secret its events are signed with (whsec_<base64>)",
        )),
        (true, false) => Err(Error::invalid(
            "webhook_url",
            "required with webhook_secret: where the events are posted",
        )),
        (false, false) => {
            webhooks::check_url(&url).map_err(|problem| Error::invalid("webhook_url", problem))?;
            webhooks::Secret::parse(&secret)
                .map_err(|problem| Error::invalid("webhook_secret", problem))?;
            Ok(Some((url, secret)))
        }
    }
}

/// Creates a plan awaiting approval.
///
/// # Errors
/// `NotFound` for an unknown precheck; `FailedPrecondition` when the precheck is
/// not done or has no replayable item; store errors.
pub async fn create(store: &Store, plan: NewPlan) -> Result<v1::Plan, Error> {
    refuse_unroutable(store, &plan).await?;
    match store.create_plan(&plan).await? {
        CreateOutcome::Created => {
            // Allowed, but said: plans to one destination share its bucket.
            let overlaps = store.overlapping_plans(plan.id).await?;
            if !overlaps.is_empty() {
                let warnings: Vec<String> = overlaps
                    .iter()
                    .map(|(other, destination)| {
                        format!(
                            "plan {other} is also running to destination {destination}: the two share its rate budget"
                        )
                    })
                    .collect();
                store.set_plan_warnings(plan.id, &warnings).await?;
            }
            get(store, plan.id).await
        }
        CreateOutcome::PrecheckNotFound => Err(Error::NotFound(format!(
            "precheck {} not found",
            plan.precheck_id
        ))),
        CreateOutcome::PrecheckNotDone => Err(Error::FailedPrecondition(format!(
            "precheck {} is not done (still running, or failed)",
            plan.precheck_id
        ))),
        CreateOutcome::NothingReplayable => Err(Error::FailedPrecondition(format!(
            "precheck {} has no replayable item: there is nothing to plan",
            plan.precheck_id
        ))),
        CreateOutcome::ChangedSincePrecheck(what) => Err(Error::FailedPrecondition(format!(
            "precheck {}: {what}; run the precheck again",
            plan.precheck_id
        ))),
    }
}

/// Queue mode never publishes a routing key as a queue name: a precheck with
/// replayable dead letters whose queue is unknown (`exchange_only`) needs
/// exchange mode, or a redirect when not even the exchange is known.
///
/// # Errors
/// `FailedPrecondition` naming how many, an example and the mode to use.
async fn refuse_unroutable(store: &Store, plan: &NewPlan) -> Result<(), Error> {
    let only = store.exchange_only_items(plan.precheck_id).await?;
    let example = only.example.map(DeadLetterId::get).unwrap_or_default();
    match plan.destination {
        DestinationMode::Queue if only.count > 0 => Err(Error::FailedPrecondition(format!(
            "{} replayable dead letters of precheck {} (for example {example}) know only the exchange and routing key they were published with, not the queue they failed in; queue mode would take a routing key for a queue name: create the plan with destination exchange, or a redirect{}",
            only.count,
            plan.precheck_id,
            if only.without_exchange > 0 {
                format!(
                    " ({} of them know no exchange: only a redirect)",
                    only.without_exchange
                )
            } else {
                String::new()
            }
        ))),
        DestinationMode::Exchange if only.count > 0 && only.replayable > only.count => {
            Err(Error::FailedPrecondition(format!(
                "precheck {} mixes {} dead letters that know only an exchange and routing key with {} whose queue is known: exchange mode would republish those {} through their exchange, to every queue bound there, not only the queue that failed them; precheck the exchange-only ones on their own (for example by source) and plan them in exchange mode",
                plan.precheck_id,
                only.count,
                only.replayable - only.count,
                only.replayable - only.count
            )))
        }
        DestinationMode::Exchange if only.without_exchange > 0 => {
            Err(Error::FailedPrecondition(format!(
                "{} replayable dead letters of precheck {} know only a routing key (no exchange, as Spring Kafka and Kafka Connect record a topic): only a redirect can replay them",
                only.without_exchange, plan.precheck_id
            )))
        }
        _ => Ok(()),
    }
}

/// The plan `plan_id`.
///
/// # Errors
/// `NotFound`; store errors.
pub async fn get(store: &Store, plan_id: PlanId) -> Result<v1::Plan, Error> {
    store
        .get_plan(plan_id)
        .await?
        .ok_or_else(|| Error::NotFound(format!("plan {plan_id} not found")))
}

/// Approves a plan awaiting approval when `digest` is its precheck's digest
/// and what the precheck found still holds; executors may then claim its
/// slices.
///
/// # Errors
/// `NotFound`; `FailedPrecondition` for a wrong digest, a plan not awaiting
/// approval (approving twice), a precheck that started more than
/// `max_precheck_age` ago (the planner's `--max-precheck-age`), dead letters
/// of the plan replayed by another plan or repaired since its precheck (each
/// message says to run the precheck again), or, without `override_arrivals`
/// (its reason), dead letters failing like the plan's own that died since its
/// precheck (docs/replay.md, "Still arriving": the message gives how many,
/// since when and the newest one's error); `PermissionDenied` when
/// `four_eyes` is on and the approver created the plan (the users compared,
/// [`crate::edge::auth::recorded_user`]: a delegated `portal-x for alice` is
/// alice); store errors.
pub async fn approve(
    store: &Store,
    plan_id: PlanId,
    digest: &str,
    actor: &str,
    four_eyes: bool,
    max_precheck_age: Duration,
    override_arrivals: Option<&str>,
) -> Result<v1::Plan, Error> {
    let plan = get(store, plan_id).await?;
    // The people, not the principals: `portal-x for alice` is alice.
    let approver = crate::edge::auth::recorded_user(actor);
    if four_eyes && approver == crate::edge::auth::recorded_user(&plan.created_by) {
        return Err(Error::PermissionDenied(format!(
            "four-eyes approval is on: {approver} created plan {plan_id} (as {}), so someone else \
             must approve it",
            plan.created_by
        )));
    }
    if digest.trim() != plan.precheck_digest {
        return Err(Error::FailedPrecondition(format!(
            "digest {digest:?} is not the digest of precheck {}: read that precheck's report and approve with its digest",
            plan.precheck_id
        )));
    }
    let again = "run the precheck again (redrivectl precheck ...), create a plan from the new \
                 precheck and approve that one";
    // The checks and the approval in one transaction, with the plan row
    // locked: nothing can be replayed or repaired between them.
    let mut tx = store.begin().await?;
    let not_awaiting = |state| {
        Error::FailedPrecondition(format!(
            "plan {plan_id} is {state}, not awaiting_approval: it can be approved once"
        ))
    };
    let Some(check) = tx.approval_check(plan_id).await? else {
        return Err(Error::NotFound(format!("plan {plan_id} not found")));
    };
    let precheck_id = check.precheck_id;
    if !Event::Approve.allows(check.state.get()) {
        return Err(not_awaiting(check.state));
    }
    if check.age > max_precheck_age {
        return Err(Error::FailedPrecondition(format!(
            "precheck {precheck_id} of plan {plan_id} is {} old, older than the planner's \
             --max-precheck-age of {}: what it found may no longer hold; {again}",
            humantime::format_duration(Duration::from_secs(check.age.as_secs())),
            humantime::format_duration(max_precheck_age)
        )));
    }
    if !check.changes.is_empty() {
        let mut changes = check.changes;
        if changes.len() > CHANGES_LISTED {
            changes.truncate(CHANGES_LISTED);
            changes.push("...".to_owned());
        }
        return Err(Error::FailedPrecondition(format!(
            "dead letters of plan {plan_id} changed since its precheck {precheck_id}: {}; {again}",
            changes.join("; ")
        )));
    }
    match (&check.arrivals, override_arrivals) {
        (Some((_, evidence)), None) => {
            return Err(Error::FailedPrecondition(format!(
                "still arriving: {evidence}; the cause of these failures may not be fixed: fix \
                 it, then {again} (the new precheck takes the new dead letters in); or approve \
                 with override_arrivals and a reason (redrivectl plan approve --override-arrivals \
                 --reason ...) to replay regardless"
            )));
        }
        (arrivals, Some(reason)) => {
            let figures = arrivals
                .as_ref()
                .map_or_else(|| "none yet".to_owned(), |(_, evidence)| evidence.clone());
            tx.override_arrivals(plan_id, actor, &format!("{reason} (arrivals: {figures})"))
                .await?;
        }
        (None, None) => {}
    }
    match tx.transition(plan_id, Event::Approve, actor, "").await? {
        Moved::To(_) => {}
        Moved::Refused(state) => return Err(not_awaiting(state)),
        Moved::NotFound => return Err(Error::NotFound(format!("plan {plan_id} not found"))),
    }
    tx.commit().await?;
    get(store, plan_id).await
}

/// A page of plans, newest first, optionally in some states. The page token is
/// `"{created_at RFC 3339}|{plan id}"` of the last plan of the previous page.
///
/// # Errors
/// `InvalidArgument` for a bad page token or a page size over 1000; store
/// errors.
pub async fn list(
    store: &Store,
    states: &[String],
    kinds: &[String],
    page_token: &str,
    page_size: u32,
) -> Result<(Vec<v1::Plan>, String), Error> {
    let before =
        if page_token.is_empty() {
            None
        } else {
            let parsed = page_token.split_once('|').and_then(|(at, id)| {
                Some((
                    chrono::DateTime::parse_from_rfc3339(at)
                        .ok()?
                        .with_timezone(&chrono::Utc),
                    PlanId::parse("page_token", id).ok()?,
                ))
            });
            Some(parsed.ok_or_else(|| {
                Error::invalid("page_token", "not a token from a previous answer")
            })?)
        };
    let page_size = crate::ids::page_size(page_size)?;
    let rows = store
        .list_plans(states, kinds, before, page_size + 1)
        .await?;
    let (plans, more) = crate::ids::page_of(rows, page_size);
    let next = match plans.last() {
        Some(last) if more => {
            let at = last
                .created_at
                .as_ref()
                .and_then(redrive_proto::time::from_timestamp)
                .map(|at| at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true))
                .unwrap_or_default();
            format!("{at}|{}", last.plan_id)
        }
        _ => String::new(),
    };
    Ok((plans, next))
}

/// An operator control of a running plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Control {
    /// Stop handing out slices; executors stop publishing within a heartbeat
    /// interval, at an item boundary, finishing confirms already in flight.
    Pause,
    /// Continue a paused plan in the state it was paused in.
    Resume,
    /// Stop for good (final). Unsent items stay replayable for later prechecks.
    Cancel,
    /// End the canary or its observation now and start the main wave.
    Promote,
}

impl Control {
    /// Its RPC: `PromotePlan`, `PausePlan`, `ResumePlan`, `CancelPlan`.
    pub fn method(self) -> &'static str {
        match self {
            Self::Pause => "PausePlan",
            Self::Resume => "ResumePlan",
            Self::Cancel => "CancelPlan",
            Self::Promote => "PromotePlan",
        }
    }

    /// Its event in the plan state machine ([`crate::plan::state`]).
    pub fn event(self) -> Event {
        match self {
            Self::Pause => Event::Pause,
            Self::Resume => Event::Resume,
            Self::Cancel => Event::Cancel,
            Self::Promote => Event::Promote,
        }
    }
}

/// Applies `control` to a plan, recording the actor and reason; a resume
/// with `override_arrivals` also turns the plan's arrivals gate off
/// (operator action `override_arrivals`).
///
/// # Errors
/// `NotFound`; `FailedPrecondition` when the plan's state does not allow it
/// (naming the state); `InvalidArgument` for `override_arrivals` on another
/// control or without a reason; store errors.
pub async fn control(
    store: &Store,
    plan_id: PlanId,
    control: Control,
    actor: &str,
    reason: &str,
    override_arrivals: bool,
) -> Result<v1::Plan, Error> {
    let event = control.event();
    if override_arrivals {
        if control != Control::Resume {
            return Err(Error::invalid(
                "override_arrivals",
                "only a resume can override the arrivals",
            ));
        }
        if reason.trim().is_empty() {
            return Err(Error::invalid(
                "reason",
                "required with override_arrivals: why the plan may go on while such dead letters keep arriving",
            ));
        }
    }
    let mut tx = store.begin().await?;
    let moved = tx.transition(plan_id, event, actor, reason).await?;
    if override_arrivals && matches!(moved, Moved::To(_)) {
        tx.override_arrivals(plan_id, actor, reason).await?;
    }
    tx.commit().await?;
    match moved {
        Moved::NotFound => Err(Error::NotFound(format!("plan {plan_id} not found"))),
        Moved::To(_) => get(store, plan_id).await,
        Moved::Refused(state) => Err(Error::FailedPrecondition(format!(
            "plan {plan_id} is {state}: it cannot {} from there (allowed from {})",
            event.action().unwrap_or_default(),
            state::names(event.allowed()).join(", ")
        ))),
    }
}

/// One page of the plan's items that need compensation, never replayed by
/// the plan and listed for people to handle: those of its precheck, and those
/// the state re-check right before publishing found (`at_send`).
///
/// # Errors
/// `NotFound` for an unknown plan; `InvalidArgument` for a bad page token or
/// size; store errors.
pub async fn compensations(
    store: &Store,
    plan_id: PlanId,
    page_size: u32,
    token: crate::ids::PageToken,
) -> Result<(Vec<v1::PrecheckItem>, String), Error> {
    let plan = get(store, plan_id).await?;
    let precheck_id = uuid::Uuid::parse_str(&plan.precheck_id)
        .map(PrecheckId::new)
        .map_err(|error| Error::Store(crate::store::StoreError::Corrupt(error.to_string())))?;
    crate::precheck::list_items(
        store,
        precheck_id,
        Some(v1::Verdict::NeedsCompensation),
        page_size,
        token,
        Some(plan_id),
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(per_second: f64, ramp: Vec<f64>) -> v1::CreatePlanRequest {
        v1::CreatePlanRequest {
            precheck_id: PrecheckId::generate().to_string(),
            rate: Some(v1::Rate {
                per_second,
                burst: 1,
                rationale: "the downstream sustains 300/s".into(),
            }),
            ramp,
            ..Default::default()
        }
    }

    /// A new user's pass: `--rate 1e308` came back as 309 digits. Refused
    /// numbers are echoed in their short form (`{:?}`), rates and ramp
    /// shares alike.
    #[test]
    fn refused_numbers_are_echoed_short() {
        assert!(validate_create(request(50.0, vec![0.5]), "a".into()).is_ok());
        for (request, field, shown) in [
            (request(1e308, vec![]), "rate.per_second", "1e308"),
            (request(1e-300, vec![]), "rate.per_second", "1e-300"),
            (request(50.0, vec![1e-300]), "ramp[0]", "1e-300"),
        ] {
            let status = tonic::Status::from(validate_create(request, "a".into()).unwrap_err());
            let message = status.message();
            assert!(message.contains(field), "{message}");
            assert!(message.contains(shown), "{message}");
            assert!(message.len() < 200, "{message}");
        }
    }
}
