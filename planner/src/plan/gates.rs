//! The canary gates (docs/design.md, "Flow" step 6): a plan in its canary wave or
//! observation window is aborted when failed or unroutable outcomes, or
//! re-dead-letters (newly captured dead letters carrying its `redrive-plan-id`),
//! go beyond their threshold (0); in its main wave it is paused instead. An
//! observation window that passes with the gates green promotes the plan to
//! its main wave. Every replica runs this loop; the transitions lock the plan
//! row and check its state, so two replicas never act twice.

use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::{
    plan::state::{self, Event},
    store::{
        Store, StoreError,
        plans::{GateReading, Moved},
    },
};

/// How long the gates' loop sleeps between passes, unless an observation
/// window ends about as soon or sooner: then it sleeps until just after
/// that end ([`next_pass_in`], at most this plus [`WINDOW_END_SLACK`]).
pub const GATE_INTERVAL: Duration = Duration::from_millis(500);
/// How long after an observation window's end its pass comes. The end is
/// PostgreSQL's time (`now()` plus the window, when the wave completed),
/// compared here with this host's clock, and the promotion checks it again
/// with PostgreSQL's (`observing_until <= now()`): a pass that landed on
/// the end by this host's clock but before it by PostgreSQL's would leave
/// the promotion to the next pass, an interval later.
const WINDOW_END_SLACK: Duration = Duration::from_millis(5);
/// The actor of gate decisions in the audit.
pub const GATE_ACTOR: &str = "redrive-gate";
/// Failed or unroutable outcomes tolerated.
pub const FAILURE_THRESHOLD: i64 = 0;
/// Re-dead-letters tolerated.
pub const REDEAD_THRESHOLD: i64 = 0;
/// Dead letters failing like a plan's own, dying while it runs, tolerated.
pub const ARRIVALS_THRESHOLD: i64 = 0;

/// A tripped gate's decision: the event to execute ([`Event::GatePause`] or
/// [`Event::Abort`], by [`state::gate_trip`]), recorded by [`GATE_ACTOR`]
/// with `reason`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GateTrip {
    /// [`Event::GatePause`] in the main wave; [`Event::Abort`] in the canary
    /// wave or the observation.
    pub event: Event,
    /// "gate tripped: N failed or unroutable outcome(s), M re-dead-letter(s)"
    /// and, with re-dead-letters, "; came back: key (dead letter id), ...".
    pub reason: String,
}

impl GateTrip {
    /// The operator action it is recorded as (`pause` or `abort`).
    pub fn action(&self) -> &'static str {
        self.event.action().unwrap_or_default()
    }
}

/// The gates' one rule, used by this loop: `None` when the gates are green,
/// else the move. Past the outcome gates ([`decide_outcomes`]), a reading
/// in `main` pauses and in any other state aborts; arrivals pause in any
/// wave ([`still_arriving`]).
pub fn decide(plan: &GateReading) -> Option<GateTrip> {
    decide_outcomes(plan).or_else(|| still_arriving(plan))
}

/// The outcome gates alone (failed or unroutable outcomes, re-dead-letters),
/// as the end of a slice judges them: arrivals pause a running plan from
/// the gates' loop, never the completion of its last slice (everything is
/// sent then, nothing is left to hold back).
pub fn decide_outcomes(plan: &GateReading) -> Option<GateTrip> {
    if plan.failures <= FAILURE_THRESHOLD && plan.redeads <= REDEAD_THRESHOLD {
        return None;
    }
    let mut reason = format!(
        "gate tripped: {} failed or unroutable outcome(s), {} re-dead-letter(s)",
        plan.failures, plan.redeads
    );
    if !plan.evidence.is_empty() {
        reason.push_str(&format!("; came back: {}", plan.evidence.join(", ")));
    }
    Some(GateTrip {
        event: state::gate_trip(plan.state.get()),
        reason,
    })
}

/// The arrivals gate (docs/replay.md, "Still arriving"): dead letters failing
/// like the plan's own keep dying while it runs, so its cause is not fixed:
/// the plan pauses, in any wave, with the figures.
fn still_arriving(plan: &GateReading) -> Option<GateTrip> {
    if plan.arrivals <= ARRIVALS_THRESHOLD {
        return None;
    }
    let evidence = plan.arrival_evidence.as_deref().unwrap_or_default();
    Some(GateTrip {
        event: Event::Pause,
        reason: format!(
            "still arriving: {evidence}; the cause may not be fixed: resume once it is (resume with \
             --override-arrivals and a reason to go on regardless)"
        ),
    })
}

/// Checks the gates, sleeping [`GATE_INTERVAL`] between passes or until
/// just after an observation window's end ([`next_pass_in`]), until
/// `shutdown`.
pub async fn run(store: Store, shutdown: CancellationToken) {
    let mut pause = GATE_INTERVAL;
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(pause) => {}
        }
        pause = match check(&store).await {
            Ok(next) => next,
            Err(error) => {
                warn!(%error, "checking plan gates failed");
                GATE_INTERVAL
            }
        };
    }
}

/// How long after a pass the next one comes, at `now`, for a pass that
/// judged the observation windows ending at `windows` against `seen_at`:
/// [`GATE_INTERVAL`], or [`WINDOW_END_SLACK`] after the earliest window
/// still open at `seen_at` that ends within the interval plus the slack
/// (so the pass after it never lands inside the slack), so its plan is
/// promoted when the window passes, not up to an interval later
/// (docs/design.md, "Flow" step 6). A window that ended while the pass ran
/// gets the next pass at once (after the slack).
///
/// A window already ended at `seen_at` never shortens the pause: the pass
/// promoted its plan, or the promotion was refused (another replica
/// promoted it first, or PostgreSQL's clock is behind this host's), and
/// the plan is looked at again an interval later. Each window therefore
/// shortens at most the one pause before it is due, and the loop never
/// spins.
pub fn next_pass_in(
    seen_at: DateTime<Utc>,
    now: DateTime<Utc>,
    windows: impl IntoIterator<Item = DateTime<Utc>>,
) -> Duration {
    windows
        .into_iter()
        .filter(|end| *end > seen_at)
        .map(|end| (end - now).to_std().unwrap_or(Duration::ZERO))
        .filter(|left| *left < GATE_INTERVAL + WINDOW_END_SLACK)
        .map(|left| left + WINDOW_END_SLACK)
        .min()
        .unwrap_or(GATE_INTERVAL)
}

/// One pass over the plans in canary, observation or main; first ends
/// expired leases (their unreported items become uncertain) and cancels plans
/// of one whose claim deadline passed unclaimed. Returns how long until the
/// next pass ([`next_pass_in`]).
///
/// # Errors
/// [`StoreError`].
pub async fn check(store: &Store) -> Result<Duration, StoreError> {
    // A sweep that fails must not keep the gates below from running.
    match store.expire_leases().await {
        Ok(plans) => {
            for plan_id in plans {
                info!(plan.id = %plan_id, "expired leases ended; their unreported items are uncertain");
            }
        }
        Err(error) => warn!(%error, "ending expired leases failed"),
    }
    for plan_id in store.unclaimed_past_deadline().await? {
        if store
            .cancel_unclaimed(
                plan_id,
                "redrive-planner",
                "single replay: no executor claimed it before its caller stopped waiting",
            )
            .await?
        {
            info!(plan.id = %plan_id, "unclaimed plan of one cancelled after its deadline");
        }
    }
    let readings = store.gate_readings().await?;
    // One reading of the clock judges every window of this pass, and the
    // next pause is reckoned from it: a window that ends while the pass
    // runs its transitions is left to the next pass, never forgotten.
    let seen_at = Utc::now();
    for plan in &readings {
        if let Some(trip) = decide(plan) {
            if let Moved::To(_) = store
                .transition_plan(plan.id, trip.event, GATE_ACTOR, &trip.reason)
                .await?
            {
                store.metrics().gate_tripped(trip.action());
                warn!(plan.id = %plan.id, reason = %trip.reason, action = trip.action(), "plan gate tripped");
            }
        } else if Event::ObservationPassed.allows(plan.state.get())
            && plan.observing_until.is_some_and(|until| until <= seen_at)
        {
            // The ramp's next wave if it has one, else the main wave: the
            // two events' conditions exclude each other.
            let reason = "observation window passed with the gates green";
            for (event, what) in [
                (Event::NextWave, "plan promoted to its ramp's next wave"),
                (Event::ObservationPassed, "plan promoted to its main wave"),
            ] {
                if let Moved::To(_) = store
                    .transition_plan(plan.id, event, GATE_ACTOR, reason)
                    .await?
                {
                    info!(plan.id = %plan.id, what);
                    break;
                }
            }
        }
    }
    Ok(next_pass_in(
        seen_at,
        Utc::now(),
        readings
            .iter()
            .filter(|plan| Event::ObservationPassed.allows(plan.state.get()))
            .filter_map(|plan| plan.observing_until),
    ))
}

#[cfg(test)]
mod tests {
    use chrono::TimeDelta;

    use super::*;

    fn at(now: DateTime<Utc>, millis: i64) -> DateTime<Utc> {
        now + TimeDelta::milliseconds(millis)
    }

    #[test]
    fn a_pass_comes_just_after_the_earliest_window_end_within_the_interval() {
        let now = Utc::now();
        assert_eq!(
            next_pass_in(now, now, [at(now, 300), at(now, 120), at(now, 2_000)]),
            Duration::from_millis(120) + WINDOW_END_SLACK
        );
        // Not cut to the interval: the slack is kept whole.
        assert_eq!(
            next_pass_in(now, now, [at(now, 498)]),
            Duration::from_millis(498) + WINDOW_END_SLACK
        );
    }

    #[test]
    fn without_a_window_ending_within_the_interval_the_pass_waits_the_interval() {
        let now = Utc::now();
        assert_eq!(next_pass_in(now, now, []), GATE_INTERVAL);
        assert_eq!(next_pass_in(now, now, [at(now, 505)]), GATE_INTERVAL);
        assert_eq!(next_pass_in(now, now, [at(now, 5_000)]), GATE_INTERVAL);
        // Just beyond the interval, but within the slack of its end: the
        // pass waits for the end and its slack, or it would land inside it.
        assert_eq!(
            next_pass_in(now, now, [at(now, 500)]),
            Duration::from_millis(500) + WINDOW_END_SLACK
        );
    }

    #[test]
    fn a_window_that_ended_while_the_pass_ran_gets_the_next_pass_at_once() {
        // Open when the pass judged it (30 ms ago), ended 10 ms ago while
        // other plans' transitions ran: not promoted by this pass, so the
        // next comes at once, not an interval later.
        let now = Utc::now();
        assert_eq!(
            next_pass_in(at(now, -30), now, [at(now, -10), at(now, 200)]),
            WINDOW_END_SLACK
        );
    }

    #[test]
    fn a_window_already_ended_when_the_pass_judged_it_never_makes_the_loop_spin() {
        // Its promotion was made or refused (another replica, or
        // PostgreSQL's clock behind this host's): it is looked at again an
        // interval later.
        let now = Utc::now();
        assert_eq!(next_pass_in(now, now, [now, at(now, -40)]), GATE_INTERVAL);
        assert_eq!(
            next_pass_in(now, now, [at(now, -40), at(now, 60)]),
            Duration::from_millis(60) + WINDOW_END_SLACK
        );
    }
}
