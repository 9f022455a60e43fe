//! The canary gates (docs/design.md, "Flow" step 6): a plan in its canary wave or
//! observation window is aborted when failed or unroutable outcomes, or
//! re-dead-letters (newly captured dead letters carrying its `redrive-plan-id`),
//! go beyond their threshold (0); in its main wave it is paused instead. An
//! observation window that passes with the gates green promotes the plan to
//! its main wave. Every replica runs this loop; the transitions lock the plan
//! row and check its state, so two replicas never act twice.

use std::time::Duration;

use chrono::Utc;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::{
    plan::state::{self, Event},
    store::{
        Store, StoreError,
        plans::{GateReading, Moved},
    },
};

/// How often the gates are looked at.
pub const GATE_INTERVAL: Duration = Duration::from_millis(500);
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

/// Checks the gates every [`GATE_INTERVAL`] until `shutdown`.
pub async fn run(store: Store, shutdown: CancellationToken) {
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(GATE_INTERVAL) => {}
        }
        if let Err(error) = check(&store).await {
            warn!(%error, "checking plan gates failed");
        }
    }
}

/// One pass over the plans in canary, observation or main; first ends
/// expired leases (their unreported items become uncertain) and cancels plans
/// of one whose claim deadline passed unclaimed.
///
/// # Errors
/// [`StoreError`].
pub async fn check(store: &Store) -> Result<(), StoreError> {
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
    for plan in store.gate_readings().await? {
        if let Some(trip) = decide(&plan) {
            if let Moved::To(_) = store
                .transition_plan(plan.id, trip.event, GATE_ACTOR, &trip.reason)
                .await?
            {
                store.metrics().gate_tripped(trip.action());
                warn!(plan.id = %plan.id, reason = %trip.reason, action = trip.action(), "plan gate tripped");
            }
        } else if Event::ObservationPassed.allows(plan.state.get())
            && plan
                .observing_until
                .is_some_and(|until| until <= Utc::now())
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
    Ok(())
}
