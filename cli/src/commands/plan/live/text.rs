//! The lines `plan watch` writes for people: progress, events, the stall
//! warnings and the observation window's notice, with the pace.

use std::time::Duration;

use redrive_proto::{
    time::from_timestamp,
    v1::{AuditEvent, Plan, PlanState},
};

use super::Now;
use crate::{
    commands::plan::{
        pace::{self, Pace},
        view::{nonzero_text, percent_done},
    },
    output::timestamp_text,
};

/// `no progress for 30s (plan main, 120/1000 done); check ...`: the stall
/// warning, without its `warning: ` prefix.
pub fn stalled_text(plan: &Plan, span: Duration) -> String {
    format!(
        "no progress for {} (plan {}, {}/{} done); check the executors: are any running, what \
         do their logs say? (to stop the plan: {} plan pause {} --reason TEXT)",
        pace::short_duration(span),
        plan.state().name(),
        plan.items_done,
        plan.total_items,
        crate::hint::redrivectl(),
        plan.plan_id
    )
}

/// `progress resumed after 45s stalled (plan main, 121/1000 done)`.
pub fn resumed_text(plan: &Plan, span: Duration) -> String {
    format!(
        "progress resumed after {} stalled (plan {}, {}/{} done)",
        pace::short_duration(span),
        plan.state().name(),
        plan.items_done,
        plan.total_items
    )
}

/// The line printed above the bar when a plan starts observing: `plan ID is
/// observing until T (12m50s left): the planner then starts the main wave
/// if the canary's gates are green; to send the rest now: redrivectl plan
/// promote ID --reason TEXT`.
pub(super) fn observing_notice(plan: &Plan, now: Now) -> String {
    let until = plan
        .observing_until
        .as_ref()
        .and_then(from_timestamp)
        .map(|until| {
            format!(
                " until {} ({} left)",
                crate::time::rfc3339(until),
                pace::short_duration(pace::wall_span(now.wall, until))
            )
        })
        .unwrap_or_default();
    if nothing_left(plan) {
        return format!(
            "plan {} is observing{until}: the canary was every item, so nothing is left to \
             send; the planner completes it when the window ends if the gates are green; to \
             end it now: {} plan promote {} --reason TEXT",
            plan.plan_id,
            crate::hint::redrivectl(),
            plan.plan_id
        );
    }
    format!(
        "plan {} is observing{until}: the planner then starts the main wave if the canary's \
         gates are green; to send the rest now: {} plan promote {} --reason TEXT",
        plan.plan_id,
        crate::hint::redrivectl(),
        plan.plan_id
    )
}

/// Whether the canary wave held every item (a plan of few items), so that
/// promoting it sends nothing more.
pub(super) fn nothing_left(plan: &Plan) -> bool {
    plan.total_items > 0 && plan.canary_items >= plan.total_items
}

/// `line`, then two spaces and the pace's text when it has one; while the
/// plan is observing, how to end the window now (`to send the rest now:
/// redrivectl plan promote ID --reason TEXT`).
pub(super) fn with_pace(mut line: String, pace: &Pace, plan: &Plan) -> String {
    let text = pace.text();
    if !text.is_empty() {
        line.push_str("  ");
        line.push_str(&text);
    }
    if plan.state() == PlanState::Observing {
        let what = if nothing_left(plan) {
            "nothing is left to send; to end the window now"
        } else {
            "to send the rest now"
        };
        line.push_str(&format!(
            "; {what}: {} plan promote {} --reason TEXT",
            crate::hint::redrivectl(),
            plan.plan_id
        ));
    }
    line
}

/// `main  450/1000 45.0%  sent 440  skipped_stale 10`; a plan with a ramp
/// names its wave while before the main one: `canary (wave 2 of 4)  ...`.
pub fn progress_text(plan: &Plan) -> String {
    let wave = if plan.ramp_items.len() > 1
        && matches!(plan.state(), PlanState::Canary | PlanState::Observing)
    {
        format!(
            " (wave {} of {})",
            plan.ramp_step + 1,
            plan.ramp_items.len() + 1
        )
    } else {
        String::new()
    };
    let mut line = format!(
        "{}{wave}  {}/{} {}",
        plan.state().name(),
        plan.items_done,
        plan.total_items,
        percent_done(plan.items_done, plan.total_items)
    );
    let counts = nonzero_text(&plan.counts.unwrap_or_default());
    if !counts.is_empty() {
        line.push_str("  ");
        line.push_str(&counts);
    }
    line
}

/// `2024-05-01T12:00:01.000Z sent order-1:pay` and the reason, if any.
pub fn event_text(event: &AuditEvent) -> String {
    let mut line = format!(
        "{} {} {}",
        timestamp_text(event.at.as_ref()).as_deref().unwrap_or("-"),
        event.action().name(),
        if event.message_key.is_empty() {
            "-"
        } else {
            &event.message_key
        }
    );
    if !event.reason.is_empty() {
        line.push(' ');
        line.push_str(&event.reason);
    }
    line
}
