//! Plans and audit reports for people, rendered straight from the API's
//! `Plan` and `AuditReport`; `--json` prints those messages themselves
//! (canonical proto3 JSON, [`crate::output::write_message`]).

use std::{fmt, io::Write};

use redrive_proto::{
    time::from_duration,
    v1::{self, AuditAction, Plan, PlanKind, PlanState},
};

use crate::output::{self, Column, cell, timestamp_text, write_table};

mod audit;

pub use audit::{NOT_SENT_SHOWN, SENT_KEYS_SHOWN, write_audit_report};

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

/// Where a plan publishes (docs/design.md, "destination"); displays as the
/// `--destination` syntax (`queue`, `exchange`,
/// `redirect:EXCHANGE/ROUTING_KEY`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
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
// Counts
// ---------------------------------------------------------------------------

/// The count of `action` in `counts` (0 for `Unspecified`).
pub fn action_count(counts: &v1::ActionCounts, action: AuditAction) -> u64 {
    match action {
        AuditAction::Unspecified => 0,
        AuditAction::Sent => counts.sent,
        AuditAction::SkippedDuplicate => counts.skipped_duplicate,
        AuditAction::SkippedStale => counts.skipped_stale,
        AuditAction::SkippedState => counts.skipped_state,
        AuditAction::NeedsCompensation => counts.needs_compensation,
        AuditAction::Failed => counts.failed,
        AuditAction::Unroutable => counts.unroutable,
        AuditAction::Uncertain => counts.uncertain,
    }
}

/// `sent 40  skipped_stale 5`: the counts that are not zero, in [`ACTIONS`]
/// order; `""` when all are.
pub fn nonzero_text(counts: &v1::ActionCounts) -> String {
    ACTIONS
        .iter()
        .filter(|action| action_count(counts, **action) > 0)
        .map(|action| format!("{} {}", action.name(), action_count(counts, *action)))
        .collect::<Vec<_>>()
        .join("  ")
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

/// `40 total, 1 in the canary (2.5% of the items; asked 1%, rounded up to
/// whole items)`: the
/// canary's true share, and the fraction asked for when the rounding up to
/// whole items (at least one) made it another (a new user's pass: a plan of
/// 4 items showed "1 in the canary (1% of the items)").
fn canary_text(plan: &Plan) -> String {
    let asked = fraction_percent(plan.canary_fraction);
    let share = if plan.total_items == 0 {
        asked.clone()
    } else {
        #[allow(clippy::cast_precision_loss)] // A share to two decimals.
        let fraction = plan.canary_items as f64 / plan.total_items as f64;
        fraction_percent(fraction)
    };
    if share == asked {
        format!(
            "{} total, {} in the canary ({share} of the items)",
            plan.total_items, plan.canary_items
        )
    } else {
        format!(
            "{} total, {} in the canary ({share} of the items; asked {asked}, rounded up to whole items)",
            plan.total_items, plan.canary_items
        )
    }
}

/// A fraction as a percentage with at most two decimals (`0.015` → `1.5%`);
/// one above zero that rounds to none is `<0.01%`, not `0%`.
fn fraction_percent(fraction: f64) -> String {
    let percent = (fraction * 10_000.0).round() / 100.0;
    if percent == 0.0 && fraction > 0.0 {
        return "<0.01%".to_owned();
    }
    format!("{percent}%")
}

/// `canary (reason)` or just the state.
pub fn state_text(plan: &Plan) -> String {
    let state = plan.state().name();
    if plan.state_reason.is_empty() {
        state.to_owned()
    } else {
        format!("{state} ({})", plan.state_reason)
    }
}

/// `50/s, burst 10`.
pub fn rate_text(rate: &v1::Rate) -> String {
    format!("{}/s, burst {}", rate.per_second, rate.burst)
}

/// The human rendering of a plan: key fields, counts per action, operator
/// actions, warnings, and a `next:` hint.
pub fn write_plan(out: &mut dyn Write, plan: &Plan) -> std::io::Result<()> {
    write_plan_fields(out, plan)?;
    writeln!(out)?;
    write_counts(out, &plan.counts.unwrap_or_default())?;
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
                timestamp_text(action.at.as_ref()).unwrap_or_else(|| "-".to_owned()),
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

/// The plan's waves and the current one: `canary to 4, then to 16, then the
/// rest (main); now wave 2 of 3` (cumulative item counts, `CreatePlanRequest.ramp`).
fn waves_text(plan: &Plan) -> String {
    let mut waves: Vec<String> = plan
        .ramp_items
        .iter()
        .enumerate()
        .map(|(step, items)| {
            if step == 0 {
                format!("canary to {items}")
            } else {
                format!("to {items}")
            }
        })
        .collect();
    // A canary of every item (`--canary-fraction 1`, or one item of one)
    // leaves the main wave nothing to publish.
    let all_canary = plan.ramp_items.last().copied() == Some(plan.total_items);
    if all_canary {
        waves.push("nothing more (main)".to_owned());
    } else {
        waves.push("the rest (main)".to_owned());
    }
    let count = waves.len();
    let now = match PlanState::try_from(plan.state) {
        Ok(PlanState::Canary | PlanState::Observing) => {
            format!("; now wave {} of {count}", plan.ramp_step + 1)
        }
        Ok(PlanState::Main) => format!("; now wave {count} of {count}"),
        _ => String::new(),
    };
    format!("{}{now}", waves.join(", then "))
}

/// The key/value block at the top of a plan.
pub(super) fn write_plan_fields(out: &mut dyn Write, plan: &Plan) -> std::io::Result<()> {
    let when_by =
        |at: Option<&prost_types::Timestamp>, by: &str| match (timestamp_text(at), by.is_empty()) {
            (None, true) => "-".to_owned(),
            (None, false) => format!("by {by}"),
            (Some(at), true) => at,
            (Some(at), false) => format!("{at} by {by}"),
        };
    let observe = plan
        .observe_for
        .as_ref()
        .and_then(from_duration)
        .map_or_else(
            || "-".to_owned(),
            |duration| humantime::format_duration(duration).to_string(),
        );
    let observe = match timestamp_text(plan.observing_until.as_ref()) {
        Some(until) => format!("{observe} (observing until {until})"),
        None => observe,
    };
    let rate = plan.rate.clone().unwrap_or_default();
    let mut fields = vec![
        ("plan id", plan.plan_id.clone()),
        ("state", state_text(plan)),
        ("precheck", cell(&plan.precheck_id).to_owned()),
        ("digest", cell(&plan.precheck_digest).to_owned()),
        ("rate", rate_text(&rate)),
        ("rationale", cell(&rate.rationale).to_owned()),
        (
            "destination",
            Destination::from_proto(plan.destination.as_ref()).to_string(),
        ),
        ("items", canary_text(plan)),
        ("waves", waves_text(plan)),
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
                "{} of {} completed, up to {} items each{}",
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
        (
            "created",
            when_by(plan.created_at.as_ref(), &plan.created_by),
        ),
        (
            "approved",
            when_by(plan.approved_at.as_ref(), &plan.approved_by),
        ),
        ("completed", when_by(plan.completed_at.as_ref(), "")),
    ];
    if !plan.webhook_url.is_empty() {
        // The secret is never shown by the planner: only whether it is set.
        let signed = if plan.webhook_secret_set {
            "signed"
        } else {
            "no secret"
        };
        fields.push(("webhook", format!("{} ({signed})", plan.webhook_url)));
    }
    output::write_fields(out, "", &fields)?;
    Ok(())
}

/// The table of all eight counts, in [`ACTIONS`] order.
pub fn write_counts(out: &mut dyn Write, counts: &v1::ActionCounts) -> std::io::Result<()> {
    let mut table = output::table(&[Column::keep("action"), Column::keep("count")]);
    for action in ACTIONS {
        table.add_row([
            action.name().to_owned(),
            action_count(counts, action).to_string(),
        ]);
    }
    write_table(out, &table)
}

/// The command to go on with, by state.
pub fn next_hint(plan: &Plan) -> Option<String> {
    let id = &plan.plan_id;
    let state = plan.state();
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
pub fn list_row(plan: &Plan) -> Vec<String> {
    vec![
        plan.plan_id.clone(),
        plan.state().name().to_owned(),
        kind_name(plan.kind()).to_owned(),
        format!(
            "{}/{} ({})",
            plan.items_done,
            plan.total_items,
            percent_done(plan.items_done, plan.total_items)
        ),
        format!(
            "{}/s",
            plan.rate.as_ref().map_or(0.0, |rate| rate.per_second)
        ),
        Destination::from_proto(plan.destination.as_ref()).to_string(),
        cell(&plan.created_by).to_owned(),
        timestamp_text(plan.created_at.as_ref()).unwrap_or_else(|| "-".to_owned()),
    ]
}

#[cfg(test)]
mod tests {
    use redrive_proto::{
        time::{duration, timestamp},
        v1::{AuditEvent, Wave},
    };

    use super::*;
    use crate::selector::parse_rfc3339;

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
            re_dead_letters: 0,
            webhook_url: String::new(),
            webhook_secret_set: false,
            total_items: 1000,
            canary_items: 10,
            ramp_items: vec![10],
            ramp_step: 0,
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

    fn text(plan: &Plan) -> String {
        let mut out = Vec::new();
        write_plan(&mut out, plan).unwrap();
        String::from_utf8(out).unwrap()
    }

    /// The value of field `name` in `text` (`name:` then aligned blanks).
    fn field<'t>(text: &'t str, name: &str) -> Option<&'t str> {
        text.lines()
            .find_map(|line| line.strip_prefix(&format!("{name}:")))
            .map(str::trim)
    }

    /// The (action, count) rows of the count table in `text`.
    fn count_rows(text: &str) -> Vec<(String, String)> {
        text.lines()
            .skip_while(|line| !line.starts_with("ACTION"))
            .skip(1)
            .take(ACTIONS.len())
            .map(|line| {
                let mut cells = line.split_whitespace().map(str::to_owned);
                (
                    cells.next().unwrap_or_default(),
                    cells.next().unwrap_or_default(),
                )
            })
            .collect()
    }

    fn counts_of(counts: [u64; 8]) -> Vec<(String, String)> {
        ACTIONS
            .iter()
            .zip(counts)
            .map(|(action, count)| (action.name().to_owned(), count.to_string()))
            .collect()
    }

    /// Was `plan_json_has_exactly_the_stable_fields` (the old JSON view,
    /// gone: `--json` prints the API's message): what it checked that
    /// `plan_text_reads_top_to_bottom` does not, as the text and the list
    /// row show it.
    #[test]
    fn plan_text_has_every_count_and_the_list_row_the_rest() {
        let text = text(&plan());
        assert_eq!(count_rows(&text), counts_of([440, 0, 10, 0, 0, 0, 0, 0]));
        // Not ordered, no observation window running.
        assert_eq!(
            field(&text, "slices"),
            Some("4 of 10 completed, up to 100 items each")
        );
        assert_eq!(field(&text, "observe for"), Some("15m"));
        assert_eq!(
            list_row(&plan()),
            [
                "0190f3b0-0000-7000-8000-000000000001",
                "paused",
                "bulk",
                "450/1000 (45.0%)",
                "50/s",
                "redirect:quarantine/",
                "alice",
                "2024-05-01T12:00:00.000Z",
            ]
        );
    }

    #[test]
    fn an_empty_plan_still_has_every_count_and_key() {
        let text = text(&Plan::default());
        assert_eq!(count_rows(&text), counts_of([0; 8]));
        assert_eq!(field(&text, "destination"), Some("queue"));
        assert_eq!(field(&text, "state"), Some("unspecified"));
        assert_eq!(field(&text, "observe for"), Some("-"));
        assert_eq!(field(&text, "created"), Some("-"));
        assert_eq!(field(&text, "rate"), Some("0/s, burst 0"));
        assert_eq!(field(&text, "rationale"), Some("-"));
        assert!(!text.contains("operator actions:"), "{text}");
        assert_eq!(
            field(&text, "slices"),
            Some("0 of 0 completed, up to 0 items each")
        );
        assert_eq!(list_row(&Plan::default())[2], "unknown");
    }

    #[test]
    fn destinations_display_as_documented() {
        assert_eq!(Destination::Queue.to_string(), "queue");
        assert_eq!(Destination::Exchange.to_string(), "exchange");
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
        assert_eq!(field(&text(&plan), "observe for"), Some("1s 500ms"));
    }

    #[test]
    fn an_observing_plan_says_when_its_window_ends() {
        let mut plan = plan();
        plan.state = PlanState::Observing.into();
        plan.observing_until = at("2024-05-01T12:20:00Z");
        let text = text(&plan);
        assert!(
            text.contains("observe for:  15m (observing until 2024-05-01T12:20:00.000Z)\n"),
            "{text}"
        );
    }

    /// Was `event_json_has_the_stable_fields`: the event as `plan watch
    /// --events` prints it (time, action, key, reason).
    #[test]
    fn event_text_has_the_time_action_key_and_reason() {
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
            message_id: String::new(),
        };
        assert_eq!(
            crate::commands::plan::live::event_text(&event),
            "2024-05-01T12:10:00.500Z unroutable order-9:capture NO_ROUTE"
        );
    }

    /// Was `report_json_nests_plan_counts_keys_and_events`: the same report
    /// as its text says it.
    #[test]
    fn report_text_has_counts_keys_events_and_unattempted_items() {
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
        let mut out = Vec::new();
        write_audit_report(&mut out, "P", &report).unwrap();
        let text = String::from_utf8(out).unwrap();
        // No plan: no plan fields; every count, zero.
        assert!(text.starts_with("ACTION"), "{text}");
        assert_eq!(count_rows(&text), counts_of([0; 8]));
        assert!(text.contains("\nsent keys: 1\n  a\n"), "{text}");
        assert!(text.contains("counted as sent): 1\n  a\n"), "{text}");
        let not_sent: Vec<Vec<&str>> = text
            .lines()
            .skip_while(|line| !line.starts_with("not sent: 1"))
            .skip(2)
            .take(1)
            .map(|line| line.split_whitespace().collect())
            .collect();
        assert_eq!(
            not_sent,
            [["-", "-", "unspecified", "unspecified", "-", "-"]]
        );
        assert!(text.contains("\nnot attempted yet: 65\n"), "{text}");
        let unattempted: Vec<Vec<&str>> = text
            .lines()
            .skip_while(|line| !line.starts_with("not attempted yet"))
            .skip(2)
            .take(1)
            .map(|line| line.split_whitespace().collect())
            .collect();
        assert_eq!(unattempted, [["7", "m-7", "order-7:pay", "main"]]);
        assert!(text.contains("... and 64 more"), "{text}");
    }

    /// A new user's pass: a plan of 4 items said "1 in the canary (1% of
    /// the items)", and one all canary said "then the rest (main)".
    #[test]
    fn a_small_plan_tells_its_true_canary_share_and_an_empty_main_wave() {
        let small = Plan {
            total_items: 4,
            canary_items: 1,
            canary_fraction: 0.01,
            ramp_items: vec![1],
            ..plan()
        };
        assert_eq!(
            canary_text(&small),
            "4 total, 1 in the canary (25% of the items; asked 1%, rounded up to whole items)"
        );
        assert_eq!(waves_text(&small), "canary to 1, then the rest (main)");
        let all = Plan {
            total_items: 4,
            canary_items: 4,
            canary_fraction: 1.0,
            ramp_items: vec![4],
            state: PlanState::AwaitingApproval.into(),
            ..plan()
        };
        assert_eq!(
            canary_text(&all),
            "4 total, 4 in the canary (100% of the items)"
        );
        assert_eq!(waves_text(&all), "canary to 4, then nothing more (main)");
    }

    #[test]
    fn plan_text_reads_top_to_bottom() {
        let mut out = Vec::new();
        write_plan(&mut out, &plan()).unwrap();
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
            "slices:       4 of 10 completed, up to 100 items each",
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
        let mut plan = plan();
        let mut hint = |state: PlanState| {
            plan.state = state.into();
            next_hint(&plan)
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
        let report = v1::AuditReport {
            plan: Some(plan()),
            counts: Some(v1::ActionCounts {
                sent: 25,
                skipped_stale: 1,
                ..Default::default()
            }),
            sent_keys: (0..25).map(|n| format!("order-{n}:pay")).collect(),
            not_sent: vec![AuditEvent {
                dead_letter_id: "41".into(),
                message_key: "order-9:capture".into(),
                action: AuditAction::SkippedStale.into(),
                reason: "older than 2h".into(),
                wave: Wave::Main.into(),
                ..Default::default()
            }],
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
            "possibly delivered twice (uncertain after a lost lease or confirm, then published again with the same message id; counted as sent): 1\n  order-3:pay\n",
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
        let counts = v1::ActionCounts {
            uncertain: 1,
            sent: 40,
            skipped_stale: 5,
            ..Default::default()
        };
        assert_eq!(
            nonzero_text(&counts),
            "sent 40  skipped_stale 5  uncertain 1"
        );
        assert_eq!(nonzero_text(&v1::ActionCounts::default()), "");
        assert_eq!(percent_done(1, 3), "33.3%");
        assert_eq!(percent_done(0, 0), "-");
        assert_eq!(fraction_percent(0.015), "1.5%");
        // A new user's pass: `--canary-fraction 1e-300` showed "0%".
        assert_eq!(fraction_percent(1e-300), "<0.01%");
        assert_eq!(fraction_percent(0.00005), "0.01%");
    }
}
