//! Plans and audit reports as their renderings for people read them
//! ([`PlanJson`], [`AuditReportJson`]), and those renderings; `--json`
//! prints the API's `Plan` and `AuditReport` themselves (canonical proto3
//! JSON, [`crate::output::write_message`]). The audit event view is
//! [`crate::views::EventJson`].

use std::{fmt, io::Write};

use redrive_proto::{
    time::from_duration,
    v1::{self, AuditAction, Plan, PlanKind, PlanState},
};
use serde::Serialize;

use crate::output::{self, Column, cell, timestamp_text, write_table};

mod audit;

pub use audit::{
    AuditReportJson, NOT_SENT_SHOWN, SENT_KEYS_SHOWN, UnattemptedJson, write_audit_report,
};

/// The audit actions, in the order of every count table and JSON `counts`
/// object: sent first, then why the others were not.
pub const ACTIONS: [AuditAction; 8] = [
    AuditAction::Sent,
    AuditAction::SkippedDuplicate,
    AuditAction::SkippedStale,
    AuditAction::SkippedState,
    AuditAction::NeedsCompensation,
    AuditAction::Failed,
    AuditAction::Unroutable,
    AuditAction::Uncertain,
];

// ---------------------------------------------------------------------------
// Destination
// ---------------------------------------------------------------------------

/// Where a plan publishes (docs/design.md, "destination"). Serializes as
/// `"queue"`, `"exchange"` or `{"redirect": {"exchange", "routing_key"}}`;
/// displays as the `--destination` syntax (`redirect:EXCHANGE/ROUTING_KEY`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Destination {
    /// The queue each message died in, through the default exchange.
    #[default]
    Queue,
    /// The exchange and routing keys of each message's death.
    Exchange,
    /// An explicit exchange and routing key.
    Redirect {
        /// The exchange (`""` is the default exchange).
        exchange: String,
        /// The routing key (may be empty).
        routing_key: String,
    },
}

impl Destination {
    /// The proto form.
    pub fn to_proto(&self) -> v1::Destination {
        use v1::destination::Mode;
        let mode = match self {
            Self::Queue => Mode::Queue(v1::QueueDestination {}),
            Self::Exchange => Mode::Exchange(v1::ExchangeDestination {}),
            Self::Redirect {
                exchange,
                routing_key,
            } => Mode::Redirect(v1::RedirectDestination {
                exchange: exchange.clone(),
                routing_key: routing_key.clone(),
            }),
        };
        v1::Destination { mode: Some(mode) }
    }

    /// From the proto form; an absent destination is the default, `queue`.
    pub fn from_proto(destination: Option<&v1::Destination>) -> Self {
        use v1::destination::Mode;
        match destination.and_then(|destination| destination.mode.as_ref()) {
            None | Some(Mode::Queue(_)) => Self::Queue,
            Some(Mode::Exchange(_)) => Self::Exchange,
            Some(Mode::Redirect(redirect)) => Self::Redirect {
                exchange: redirect.exchange.clone(),
                routing_key: redirect.routing_key.clone(),
            },
        }
    }
}

impl fmt::Display for Destination {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Queue => f.write_str("queue"),
            Self::Exchange => f.write_str("exchange"),
            Self::Redirect {
                exchange,
                routing_key,
            } => write!(f, "redirect:{exchange}/{routing_key}"),
        }
    }
}

// ---------------------------------------------------------------------------
// JSON shapes
// ---------------------------------------------------------------------------

/// Count per audit action; all eight fields always present, in [`ACTIONS`]
/// order.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[allow(missing_docs)] // One field per action, named as AuditAction::name.
pub struct ActionCountsJson {
    pub sent: u64,
    pub skipped_duplicate: u64,
    pub skipped_stale: u64,
    pub skipped_state: u64,
    pub needs_compensation: u64,
    pub failed: u64,
    pub unroutable: u64,
    pub uncertain: u64,
}

impl From<Option<&v1::ActionCounts>> for ActionCountsJson {
    fn from(counts: Option<&v1::ActionCounts>) -> Self {
        let counts = counts.copied().unwrap_or_default();
        Self {
            sent: counts.sent,
            skipped_duplicate: counts.skipped_duplicate,
            skipped_stale: counts.skipped_stale,
            skipped_state: counts.skipped_state,
            needs_compensation: counts.needs_compensation,
            failed: counts.failed,
            unroutable: counts.unroutable,
            uncertain: counts.uncertain,
        }
    }
}

impl ActionCountsJson {
    /// The count of `action` (0 for `Unspecified`).
    pub fn get(&self, action: AuditAction) -> u64 {
        match action {
            AuditAction::Unspecified => 0,
            AuditAction::Sent => self.sent,
            AuditAction::SkippedDuplicate => self.skipped_duplicate,
            AuditAction::SkippedStale => self.skipped_stale,
            AuditAction::SkippedState => self.skipped_state,
            AuditAction::NeedsCompensation => self.needs_compensation,
            AuditAction::Failed => self.failed,
            AuditAction::Unroutable => self.unroutable,
            AuditAction::Uncertain => self.uncertain,
        }
    }

    /// `sent 40  skipped_stale 5`: the counts that are not zero, in
    /// [`ACTIONS`] order; `""` when all are.
    pub fn nonzero_text(&self) -> String {
        ACTIONS
            .iter()
            .filter(|action| self.get(**action) > 0)
            .map(|action| format!("{} {}", action.name(), self.get(*action)))
            .collect::<Vec<_>>()
            .join("  ")
    }
}

/// The replay rate.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct RateJson {
    /// Sustained messages per second.
    pub per_second: f64,
    /// Messages that may go at once.
    pub burst: u32,
    /// How the figure follows from the downstream's capacity.
    pub rationale: String,
}

/// One operator action on a plan (approve, promote, pause, ...).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ActionJson {
    /// What was done.
    pub action: String,
    /// Who did it.
    pub actor: String,
    /// Why.
    pub reason: String,
    /// When, RFC 3339.
    pub at: Option<String>,
}

/// A plan in its stable JSON shape (module docs).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[allow(missing_docs)] // Named as the proto fields; the module docs describe them.
pub struct PlanJson {
    pub plan_id: String,
    pub precheck_id: String,
    pub precheck_digest: String,
    pub state: &'static str,
    /// `bulk` (made from a precheck) or `single` (`redrivectl replay`).
    pub kind: &'static str,
    pub state_reason: String,
    pub rate: RateJson,
    pub destination: Destination,
    pub slice_size: u32,
    pub canary_fraction: f64,
    pub observe_for_seconds: Option<serde_json::Number>,
    /// Published in dead-letter order (`plan create --ordered`).
    pub ordered: bool,
    pub total_items: u64,
    pub canary_items: u64,
    pub items_done: u64,
    pub slices_total: u64,
    pub slices_completed: u64,
    pub counts: ActionCountsJson,
    pub created_by: String,
    pub created_at: Option<String>,
    pub approved_by: String,
    pub approved_at: Option<String>,
    pub completed_at: Option<String>,
    pub observing_until: Option<String>,
    pub actions: Vec<ActionJson>,
    /// Older operator actions the planner did not send (it sends the newest
    /// 200).
    pub actions_omitted: u64,
    pub warnings: Vec<String>,
}

/// Seconds as a JSON number: an integer when whole, else fractional.
fn seconds_number(duration: std::time::Duration) -> Option<serde_json::Number> {
    if duration.subsec_nanos() == 0 {
        Some(duration.as_secs().into())
    } else {
        serde_json::Number::from_f64(duration.as_secs_f64())
    }
}

impl From<&Plan> for PlanJson {
    fn from(plan: &Plan) -> Self {
        let rate = plan.rate.clone().unwrap_or_default();
        Self {
            plan_id: plan.plan_id.clone(),
            precheck_id: plan.precheck_id.clone(),
            precheck_digest: plan.precheck_digest.clone(),
            state: plan.state().name(),
            kind: kind_name(plan.kind()),
            state_reason: plan.state_reason.clone(),
            rate: RateJson {
                per_second: rate.per_second,
                burst: rate.burst,
                rationale: rate.rationale,
            },
            destination: Destination::from_proto(plan.destination.as_ref()),
            slice_size: plan.slice_size,
            canary_fraction: plan.canary_fraction,
            observe_for_seconds: plan
                .observe_for
                .as_ref()
                .and_then(from_duration)
                .and_then(seconds_number),
            ordered: plan.ordered,
            total_items: plan.total_items,
            canary_items: plan.canary_items,
            items_done: plan.items_done,
            slices_total: plan.slices_total,
            slices_completed: plan.slices_completed,
            counts: ActionCountsJson::from(plan.counts.as_ref()),
            created_by: plan.created_by.clone(),
            created_at: timestamp_text(plan.created_at.as_ref()),
            approved_by: plan.approved_by.clone(),
            approved_at: timestamp_text(plan.approved_at.as_ref()),
            completed_at: timestamp_text(plan.completed_at.as_ref()),
            observing_until: timestamp_text(plan.observing_until.as_ref()),
            actions: plan
                .actions
                .iter()
                .map(|action| ActionJson {
                    action: action.action.clone(),
                    actor: action.actor.clone(),
                    reason: action.reason.clone(),
                    at: timestamp_text(action.at.as_ref()),
                })
                .collect(),
            actions_omitted: plan.actions_omitted,
            warnings: plan.warnings.clone(),
        }
    }
}

// ---------------------------------------------------------------------------
// For people
// ---------------------------------------------------------------------------

/// `45.0%` of `done` in `total`; `-` when `total` is zero.
pub fn percent_done(done: u64, total: u64) -> String {
    if total == 0 {
        return "-".to_owned();
    }
    #[allow(clippy::cast_precision_loss)] // A percentage to one decimal.
    let percent = done as f64 * 100.0 / total as f64;
    format!("{percent:.1}%")
}

/// A fraction as a percentage with at most two decimals (`0.015` → `1.5%`).
fn fraction_percent(fraction: f64) -> String {
    let percent = (fraction * 10_000.0).round() / 100.0;
    format!("{percent}%")
}

/// `canary (reason)` or just the state.
pub fn state_text(plan: &PlanJson) -> String {
    if plan.state_reason.is_empty() {
        plan.state.to_owned()
    } else {
        format!("{} ({})", plan.state, plan.state_reason)
    }
}

/// `50/s, burst 10`.
pub fn rate_text(rate: &RateJson) -> String {
    format!("{}/s, burst {}", rate.per_second, rate.burst)
}

/// The human rendering of a plan: key fields, counts per action, operator
/// actions, warnings, and a `next:` hint.
pub fn write_plan(out: &mut dyn Write, plan: &PlanJson) -> std::io::Result<()> {
    write_plan_fields(out, plan)?;
    writeln!(out)?;
    write_counts(out, &plan.counts)?;
    if !plan.actions.is_empty() {
        writeln!(out, "\noperator actions:")?;
        if plan.actions_omitted > 0 {
            let older = plan.actions_omitted;
            let noun = if older == 1 { "action" } else { "actions" };
            writeln!(out, "({older} older {noun} not shown)")?;
        }
        let mut table = output::table(&[
            Column::keep("at"),
            Column::keep("action"),
            Column::shorten("actor"),
            Column::shorten("reason"),
        ]);
        for action in &plan.actions {
            table.add_row([
                action.at.clone().unwrap_or_else(|| "-".to_owned()),
                cell(&action.action).to_owned(),
                cell(&action.actor).to_owned(),
                cell(&action.reason).to_owned(),
            ]);
        }
        write_table(out, &table)?;
    }
    if !plan.warnings.is_empty() {
        writeln!(out)?;
        for warning in &plan.warnings {
            output::write_warning(out, warning)?;
        }
    }
    if let Some(hint) = next_hint(plan) {
        writeln!(out, "\nnext: {hint}")?;
    }
    Ok(())
}

/// The key/value block at the top of a plan.
pub(super) fn write_plan_fields(out: &mut dyn Write, plan: &PlanJson) -> std::io::Result<()> {
    let when_by = |at: &Option<String>, by: &str| match (at, by.is_empty()) {
        (None, true) => "-".to_owned(),
        (None, false) => format!("by {by}"),
        (Some(at), true) => at.clone(),
        (Some(at), false) => format!("{at} by {by}"),
    };
    let observe = plan
        .observe_for_seconds
        .as_ref()
        .and_then(serde_json::Number::as_f64)
        .and_then(|seconds| std::time::Duration::try_from_secs_f64(seconds).ok())
        .map_or_else(
            || "-".to_owned(),
            |duration| humantime::format_duration(duration).to_string(),
        );
    let observe = match &plan.observing_until {
        Some(until) => format!("{observe} (observing until {until})"),
        None => observe,
    };
    let fields = [
        ("plan id", plan.plan_id.clone()),
        ("state", state_text(plan)),
        ("precheck", cell(&plan.precheck_id).to_owned()),
        ("digest", cell(&plan.precheck_digest).to_owned()),
        ("rate", rate_text(&plan.rate)),
        ("rationale", cell(&plan.rate.rationale).to_owned()),
        ("destination", plan.destination.to_string()),
        (
            "items",
            format!(
                "{} total, {} in the canary ({} of the items)",
                plan.total_items,
                plan.canary_items,
                fraction_percent(plan.canary_fraction)
            ),
        ),
        (
            "done",
            format!(
                "{} of {} ({})",
                plan.items_done,
                plan.total_items,
                percent_done(plan.items_done, plan.total_items)
            ),
        ),
        (
            "slices",
            format!(
                "{} of {} completed, {} items each{}",
                plan.slices_completed,
                plan.slices_total,
                plan.slice_size,
                if plan.ordered {
                    ", in dead-letter order (one at a time)"
                } else {
                    ""
                }
            ),
        ),
        ("observe for", observe),
        ("created", when_by(&plan.created_at, &plan.created_by)),
        ("approved", when_by(&plan.approved_at, &plan.approved_by)),
        ("completed", when_by(&plan.completed_at, "")),
    ];
    output::write_fields(out, "", &fields)?;
    Ok(())
}

/// The table of all eight counts, in [`ACTIONS`] order.
pub fn write_counts(out: &mut dyn Write, counts: &ActionCountsJson) -> std::io::Result<()> {
    let mut table = output::table(&[Column::keep("action"), Column::keep("count")]);
    for action in ACTIONS {
        table.add_row([action.name().to_owned(), counts.get(action).to_string()]);
    }
    write_table(out, &table)
}

/// The command to go on with, by state.
pub fn next_hint(plan: &PlanJson) -> Option<String> {
    let id = &plan.plan_id;
    let state = PlanState::from_name(plan.state)?;
    let redrivectl = crate::hint::redrivectl();
    Some(match state {
        PlanState::AwaitingApproval => format!(
            "{redrivectl} plan approve {id} --digest {}",
            cell(&plan.precheck_digest)
        ),
        PlanState::Canary | PlanState::Main => format!("{redrivectl} plan watch {id}"),
        PlanState::Observing => format!(
            "{redrivectl} plan watch {id} (or end the observation early: {redrivectl} plan \
             promote {id} --reason TEXT)"
        ),
        PlanState::Paused => format!("{redrivectl} plan resume {id} --reason TEXT"),
        PlanState::Completed | PlanState::Cancelled | PlanState::Aborted => {
            format!("{redrivectl} plan report {id}")
        }
        PlanState::Unspecified => return None,
    })
}

/// The `plan list` columns.
pub const LIST_COLUMNS: &[Column] = &[
    Column::keep("plan_id"),
    Column::keep("state"),
    Column::keep("kind").optional(),
    Column::keep("done"),
    Column::keep("rate").optional(),
    Column::shorten("destination").optional(),
    Column::shorten("created_by").optional(),
    Column::keep("created_at").optional(),
];

/// The name of `kind` in tables, JSON and `--kind`: `bulk` or `single`
/// (`unknown` from a planner that does not say).
pub fn kind_name(kind: PlanKind) -> &'static str {
    match kind {
        PlanKind::Bulk => "bulk",
        PlanKind::Single => "single",
        PlanKind::Unspecified => "unknown",
    }
}

/// One `plan list` row, in [`LIST_COLUMNS`] order.
pub fn list_row(plan: &PlanJson) -> Vec<String> {
    vec![
        plan.plan_id.clone(),
        plan.state.to_owned(),
        plan.kind.to_owned(),
        format!(
            "{}/{} ({})",
            plan.items_done,
            plan.total_items,
            percent_done(plan.items_done, plan.total_items)
        ),
        format!("{}/s", plan.rate.per_second),
        plan.destination.to_string(),
        cell(&plan.created_by).to_owned(),
        plan.created_at.clone().unwrap_or_else(|| "-".to_owned()),
    ]
}

#[cfg(test)]
mod tests {
    use redrive_proto::{
        time::{duration, timestamp},
        v1::{AuditEvent, Wave},
    };
    use serde_json::json;

    use super::*;
    use crate::selector::parse_rfc3339;
    use crate::views::EventJson;

    fn at(text: &str) -> Option<prost_types::Timestamp> {
        Some(timestamp(parse_rfc3339(text).unwrap()))
    }

    pub(crate) fn plan() -> Plan {
        Plan {
            plan_id: "0190f3b0-0000-7000-8000-000000000001".into(),
            precheck_id: "0190f3a2-7c1e-7b3a-9d4e-2f6a8b1c0d5e".into(),
            state: PlanState::Paused.into(),
            rate: Some(v1::Rate {
                per_second: 50.0,
                burst: 10,
                rationale: "payments-api sustains 300/s, peak traffic 200/s".into(),
            }),
            destination: Some(
                Destination::Redirect {
                    exchange: "quarantine".into(),
                    routing_key: String::new(),
                }
                .to_proto(),
            ),
            slice_size: 100,
            canary_fraction: 0.01,
            observe_for: Some(duration(std::time::Duration::from_secs(900))),
            ordered: false,
            total_items: 1000,
            canary_items: 10,
            counts: Some(v1::ActionCounts {
                sent: 440,
                skipped_stale: 10,
                ..Default::default()
            }),
            created_by: "alice".into(),
            created_at: at("2024-05-01T12:00:00Z"),
            state_reason: "main gate: 3 re-dead-letters".into(),
            actions: vec![v1::OperatorAction {
                action: "approve".into(),
                actor: "bob".into(),
                reason: String::new(),
                at: at("2024-05-01T12:05:00Z"),
            }],
            warnings: vec!["2 destinations".into()],
            precheck_digest: "9f86d081".into(),
            slices_total: 10,
            slices_completed: 4,
            approved_by: "bob".into(),
            approved_at: at("2024-05-01T12:05:00Z"),
            completed_at: None,
            items_done: 450,
            kind: PlanKind::Bulk.into(),
            observing_until: None,
            actions_omitted: 3,
        }
    }

    fn zero_counts() -> serde_json::Value {
        json!({
            "sent": 0, "skipped_duplicate": 0, "skipped_stale": 0, "skipped_state": 0,
            "needs_compensation": 0, "failed": 0, "unroutable": 0, "uncertain": 0,
        })
    }

    #[test]
    fn plan_json_has_exactly_the_stable_fields() {
        let json = serde_json::to_value(PlanJson::from(&plan())).unwrap();
        assert_eq!(
            json,
            json!({
                "plan_id": "0190f3b0-0000-7000-8000-000000000001",
                "precheck_id": "0190f3a2-7c1e-7b3a-9d4e-2f6a8b1c0d5e",
                "precheck_digest": "9f86d081",
                "state": "paused",
                "state_reason": "main gate: 3 re-dead-letters",
                "rate": {
                    "per_second": 50.0,
                    "burst": 10,
                    "rationale": "payments-api sustains 300/s, peak traffic 200/s",
                },
                "destination": {"redirect": {"exchange": "quarantine", "routing_key": ""}},
                "slice_size": 100,
                "canary_fraction": 0.01,
                "observe_for_seconds": 900,
                "ordered": false,
                "total_items": 1000,
                "canary_items": 10,
                "items_done": 450,
                "kind": "bulk",
                "slices_total": 10,
                "slices_completed": 4,
                "counts": {
                    "sent": 440, "skipped_duplicate": 0, "skipped_stale": 10,
                    "skipped_state": 0, "needs_compensation": 0, "failed": 0,
                    "unroutable": 0, "uncertain": 0,
                },
                "created_by": "alice",
                "created_at": "2024-05-01T12:00:00.000Z",
                "approved_by": "bob",
                "approved_at": "2024-05-01T12:05:00.000Z",
                "completed_at": null,
                "observing_until": null,
                "actions": [{
                    "action": "approve", "actor": "bob", "reason": "",
                    "at": "2024-05-01T12:05:00.000Z",
                }],
                "actions_omitted": 3,
                "warnings": ["2 destinations"],
            })
        );
    }

    #[test]
    fn an_empty_plan_still_has_every_count_and_key() {
        let json = serde_json::to_value(PlanJson::from(&Plan::default())).unwrap();
        assert_eq!(json["counts"], zero_counts());
        assert_eq!(json["destination"], "queue");
        assert_eq!(json["state"], "unspecified");
        assert_eq!(json["observe_for_seconds"], serde_json::Value::Null);
        assert_eq!(json["created_at"], serde_json::Value::Null);
        assert_eq!(
            json["rate"],
            json!({"per_second": 0.0, "burst": 0, "rationale": ""})
        );
        assert_eq!(json["observing_until"], serde_json::Value::Null);
        assert_eq!(json["actions_omitted"], 0);
        assert_eq!(json["kind"], "unknown");
        assert_eq!(json["ordered"], false);
        assert_eq!(json.as_object().unwrap().len(), 27);
    }

    #[test]
    fn destinations_serialize_as_documented() {
        assert_eq!(serde_json::to_value(Destination::Queue).unwrap(), "queue");
        assert_eq!(
            serde_json::to_value(Destination::Exchange).unwrap(),
            "exchange"
        );
        let redirect = Destination::Redirect {
            exchange: "ops".into(),
            routing_key: "orders/retry".into(),
        };
        assert_eq!(redirect.to_string(), "redirect:ops/orders/retry");
        assert_eq!(
            Destination::from_proto(Some(&redirect.to_proto())),
            redirect
        );
        assert_eq!(
            Destination::from_proto(Some(&Destination::Exchange.to_proto())),
            Destination::Exchange
        );
        assert_eq!(Destination::from_proto(None), Destination::Queue);
    }

    #[test]
    fn fractional_observation_windows_stay_fractional() {
        let mut plan = plan();
        plan.observe_for = Some(prost_types::Duration {
            seconds: 1,
            nanos: 500_000_000,
        });
        let json = serde_json::to_value(PlanJson::from(&plan)).unwrap();
        assert_eq!(json["observe_for_seconds"], 1.5);
    }

    #[test]
    fn an_observing_plan_says_when_its_window_ends() {
        let mut plan = plan();
        plan.state = PlanState::Observing.into();
        plan.observing_until = at("2024-05-01T12:20:00Z");
        let view = PlanJson::from(&plan);
        assert_eq!(
            serde_json::to_value(&view).unwrap()["observing_until"],
            "2024-05-01T12:20:00.000Z"
        );
        let mut out = Vec::new();
        write_plan(&mut out, &view).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.contains("observe for:  15m (observing until 2024-05-01T12:20:00.000Z)\n"),
            "{text}"
        );
    }

    #[test]
    fn event_json_has_the_stable_fields() {
        let event = AuditEvent {
            plan_id: "p".into(),
            slice_id: "s-3".into(),
            dead_letter_id: "41".into(),
            message_key: "order-9:capture".into(),
            action: AuditAction::Unroutable.into(),
            reason: "NO_ROUTE".into(),
            wave: Wave::Canary.into(),
            executor_id: "executor-1".into(),
            attempt: 2,
            confirm_latency_us: 1200,
            at: at("2024-05-01T12:10:00.5Z"),
        };
        assert_eq!(
            serde_json::to_value(EventJson::from(&event)).unwrap(),
            json!({
                "plan_id": "p", "slice_id": "s-3", "dead_letter_id": "41",
                "message_key": "order-9:capture", "action": "unroutable", "reason": "NO_ROUTE",
                "wave": "canary", "executor_id": "executor-1", "attempt": 2,
                "confirm_latency_us": 1200, "at": "2024-05-01T12:10:00.500Z",
            })
        );
    }

    #[test]
    fn report_json_nests_plan_counts_keys_and_events() {
        let report = v1::AuditReport {
            plan: None,
            counts: None,
            sent_keys: vec!["a".into()],
            not_sent: vec![AuditEvent::default()],
            possibly_duplicated_keys: vec!["a".into()],
            never_attempted: 65,
            never_attempted_items: vec![v1::UnattemptedItem {
                dead_letter_id: "7".into(),
                message_key: "order-7:pay".into(),
                message_id: "m-7".into(),
                wave: Wave::Main.into(),
            }],
        };
        let json = serde_json::to_value(AuditReportJson::from(&report)).unwrap();
        assert_eq!(json["never_attempted"], 65);
        assert_eq!(
            json["never_attempted_items"],
            json!([{"dead_letter_id": "7", "message_key": "order-7:pay", "message_id": "m-7", "wave": "main"}])
        );
        assert_eq!(json["possibly_duplicated_keys"], json!(["a"]));
        assert_eq!(json["plan"], serde_json::Value::Null);
        assert_eq!(json["counts"], zero_counts());
        assert_eq!(json["sent_keys"], json!(["a"]));
        assert_eq!(json["not_sent"][0]["action"], "unspecified");
        assert_eq!(json["not_sent"][0]["wave"], "unspecified");
    }

    #[test]
    fn plan_text_reads_top_to_bottom() {
        let mut out = Vec::new();
        write_plan(&mut out, &PlanJson::from(&plan())).unwrap();
        let text = String::from_utf8(out).unwrap();
        let mut from = 0;
        for expected in [
            "plan id:      0190f3b0-0000-7000-8000-000000000001",
            "state:        paused (main gate: 3 re-dead-letters)",
            "precheck:     0190f3a2-7c1e-7b3a-9d4e-2f6a8b1c0d5e",
            "digest:       9f86d081",
            "rate:         50/s, burst 10",
            "rationale:    payments-api sustains 300/s, peak traffic 200/s",
            "destination:  redirect:quarantine/",
            "items:        1000 total, 10 in the canary (1% of the items)",
            "done:         450 of 1000 (45.0%)",
            "slices:       4 of 10 completed, 100 items each",
            "observe for:  15m",
            "created:      2024-05-01T12:00:00.000Z by alice",
            "approved:     2024-05-01T12:05:00.000Z by bob",
            "completed:    -",
            "ACTION              COUNT",
            "sent                440",
            "uncertain           0",
            "operator actions:",
            "(3 older actions not shown)",
            "2024-05-01T12:05:00.000Z  approve  bob",
            "WARNING: 2 destinations",
            "next: redrivectl plan resume 0190f3b0-0000-7000-8000-000000000001 --reason TEXT",
        ] {
            let found = text[from..]
                .find(expected)
                .unwrap_or_else(|| panic!("{expected:?} after byte {from} in:\n{text}"));
            from += found + expected.len();
        }
    }

    #[test]
    fn hints_follow_the_state() {
        let mut view = PlanJson::from(&plan());
        let mut hint = |state: PlanState| {
            view.state = state.name();
            next_hint(&view)
        };
        assert_eq!(
            hint(PlanState::AwaitingApproval).unwrap(),
            "redrivectl plan approve 0190f3b0-0000-7000-8000-000000000001 --digest 9f86d081"
        );
        assert!(hint(PlanState::Canary).unwrap().contains("plan watch"));
        assert!(hint(PlanState::Observing).unwrap().contains("plan promote"));
        assert!(hint(PlanState::Aborted).unwrap().contains("plan report"));
        assert_eq!(hint(PlanState::Unspecified), None);
    }

    #[test]
    fn the_readable_report_lists_keys_and_reasons() {
        let report = AuditReportJson {
            plan: Some(PlanJson::from(&plan())),
            counts: ActionCountsJson {
                sent: 25,
                skipped_stale: 1,
                ..Default::default()
            },
            sent_keys: (0..25).map(|n| format!("order-{n}:pay")).collect(),
            not_sent: vec![EventJson::from(&AuditEvent {
                dead_letter_id: "41".into(),
                message_key: "order-9:capture".into(),
                action: AuditAction::SkippedStale.into(),
                reason: "older than 2h".into(),
                wave: Wave::Main.into(),
                ..Default::default()
            })],
            possibly_duplicated_keys: vec!["order-3:pay".into()],
            never_attempted: 0,
            never_attempted_items: vec![],
        };
        let mut out = Vec::new();
        write_audit_report(&mut out, "P", &report).unwrap();
        let text = String::from_utf8(out).unwrap();
        for expected in [
            "plan id:      0190f3b0",
            "sent                25",
            "skipped_stale       1",
            "\nsent keys: 25\n  order-0:pay\n",
            "  order-19:pay\n  ... and 5 more",
            "possibly delivered twice (published again with the same message id after a lost lease or confirm): 1\n  order-3:pay\n",
            "not sent: 1",
            "41              order-9:capture  skipped_stale  main  -   older than 2h",
            "redrivectl plan report P --format csv",
        ] {
            assert!(text.contains(expected), "{expected:?} in:\n{text}");
        }
        assert!(!text.contains("order-20:pay"), "{text}");
    }

    #[test]
    fn nonzero_counts_read_in_action_order() {
        let counts = ActionCountsJson {
            uncertain: 1,
            sent: 40,
            skipped_stale: 5,
            ..Default::default()
        };
        assert_eq!(
            counts.nonzero_text(),
            "sent 40  skipped_stale 5  uncertain 1"
        );
        assert_eq!(ActionCountsJson::default().nonzero_text(), "");
        assert_eq!(percent_done(1, 3), "33.3%");
        assert_eq!(percent_done(0, 0), "-");
        assert_eq!(fraction_percent(0.015), "1.5%");
    }
}
