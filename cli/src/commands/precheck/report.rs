//! A precheck report for people, rendered straight from the API's
//! `PrecheckReport` (module docs of [`super`]).

use std::{collections::BTreeMap, io::Write, time::Duration};

use redrive_proto::time::age_text;
use redrive_proto::v1::{self, PrecheckReport, Verdict, VerdictCounts};

use super::VERDICTS;
use crate::output::{self, Column, cell, timestamp_text, write_table};

/// The count of `verdict` in `counts` (0 when there are no counts, and for
/// `Unspecified`).
pub fn verdict_count(counts: Option<&VerdictCounts>, verdict: Verdict) -> u64 {
    let Some(counts) = counts else {
        return 0;
    };
    match verdict {
        Verdict::Unspecified => 0,
        Verdict::Replayable => counts.replayable,
        Verdict::Duplicate => counts.duplicate,
        Verdict::AlreadyReplayed => counts.already_replayed,
        Verdict::Looping => counts.looping,
        Verdict::Stale => counts.stale,
        Verdict::BlockedByState => counts.blocked_by_state,
        Verdict::NeedsCompensation => counts.needs_compensation,
        Verdict::Invalid => counts.invalid,
    }
}

/// Whole seconds of a proto duration (0 for a negative one).
fn seconds(duration: &prost_types::Duration) -> u64 {
    u64::try_from(duration.seconds).unwrap_or_default()
}

/// The options a precheck ran with (the request's merged with the planner's
/// policy) on one line: `stale after payment.*=2h, source orders.dlq=30m,
/// default 1day; replay-key window 7days; max redrives 3`.
pub fn options_summary(options: Option<&v1::PrecheckOptions>) -> String {
    let default = v1::PrecheckOptions::default();
    let options = options.unwrap_or(&default);
    let human = |age: &prost_types::Duration| {
        humantime::format_duration(Duration::from_secs(seconds(age))).to_string()
    };
    let rules = |rules: &BTreeMap<String, prost_types::Duration>, prefix: &str| {
        rules
            .iter()
            .map(|(pattern, age)| format!("{prefix}{pattern}={}", human(age)))
            .collect::<Vec<_>>()
    };
    let mut deadlines = rules(&options.stale_after, "");
    deadlines.extend(rules(&options.stale_after_source, "source "));
    if let Some(age) = &options.default_stale_after {
        deadlines.push(format!("default {}", human(age)));
    }
    let mut parts = vec![if deadlines.is_empty() {
        "no staleness deadline".to_owned()
    } else {
        format!("stale after {}", deadlines.join(", "))
    }];
    if !options.event_time_pointer.is_empty() {
        parts.push(format!("event time at {}", options.event_time_pointer));
    }
    if let Some(window) = &options.replay_key_window {
        parts.push(format!("replay-key window {}", human(window)));
    }
    if options.max_redrives > 0 {
        parts.push(format!("max redrives {}", options.max_redrives));
    }
    parts.join("; ")
}

/// (title, rows) of each breakdown, in the order people read them.
fn breakdowns(report: &PrecheckReport) -> [(&'static str, &[v1::Breakdown]); 6] {
    [
        ("error fingerprint", &report.by_error_group),
        ("reason class", &report.by_reason_class),
        ("destination", &report.by_destination),
        ("event type", &report.by_event_type),
        ("schema version", &report.by_schema_version),
        ("producer", &report.by_producer),
    ]
}

/// The report's key fields: id, actor, time, digest, total, the death times
/// covered, the options, and the policy override's reason when there is one.
fn key_fields(report: &PrecheckReport) -> Vec<(&'static str, String)> {
    let covered = match (
        timestamp_text(report.died_from.as_ref()),
        timestamp_text(report.died_to.as_ref()),
    ) {
        (Some(from), Some(to)) => format!("{from} .. {to}"),
        (Some(from), None) => format!("{from} .. -"),
        (None, Some(to)) => format!("- .. {to}"),
        (None, None) => "- (nothing selected)".to_owned(),
    };
    let mut fields = vec![
        ("precheck id", report.precheck_id.clone()),
        ("actor", cell(&report.actor).to_owned()),
        (
            "created at",
            timestamp_text(report.created_at.as_ref()).unwrap_or_else(|| "-".to_owned()),
        ),
        ("digest", cell(&report.digest).to_owned()),
        ("total", report.total.to_string()),
        ("died", covered),
        ("options", options_summary(report.options.as_ref())),
    ];
    if let Some(window) = &report.arrivals_window {
        // Dead letters still arriving: ApprovePlan refuses while more do.
        fields.insert(
            6,
            (
                "arrivals",
                format!(
                    "{} died in the {} before it",
                    report.recent_arrivals,
                    humantime::format_duration(Duration::from_secs(seconds(window)))
                ),
            ),
        );
    }
    if let Some(options) = &report.options
        && !options.override_reason.is_empty()
    {
        fields.push(("policy override", options.override_reason.clone()));
    }
    fields
}

/// The human rendering of a report (module docs).
pub fn write_report(out: &mut dyn Write, report: &PrecheckReport) -> std::io::Result<()> {
    output::write_fields(out, "", &key_fields(report))?;

    writeln!(out)?;
    let mut counts = output::table(&[Column::keep("verdict"), Column::keep("count")]);
    for verdict in VERDICTS {
        counts.add_row([
            verdict.name().to_owned(),
            verdict_count(report.counts.as_ref(), verdict).to_string(),
        ]);
    }
    write_table(out, &counts)?;

    for (title, rows) in breakdowns(report) {
        if rows.is_empty() {
            continue;
        }
        writeln!(out, "\nby {title}:")?;
        write_table(out, &breakdown_table(rows))?;
    }

    if !report.staleness.is_empty() {
        writeln!(out, "\nstaleness (which deadline applied):")?;
        write_table(out, &staleness_table(&report.staleness))?;
    }

    if !report.warnings.is_empty() {
        writeln!(out)?;
        for warning in &report.warnings {
            output::write_warning(out, warning)?;
        }
    }

    let blocked = report
        .total
        .saturating_sub(verdict_count(report.counts.as_ref(), Verdict::Replayable));
    if !report.sample_blocked.is_empty() {
        writeln!(
            out,
            "\nfirst non-replayable items ({} shown of {blocked} not replayable):",
            report.sample_blocked.len()
        )?;
        let mut table = output::table(&[
            Column::keep("dead_letter_id"),
            Column::shorten("message_key"),
            Column::keep("verdict"),
            Column::shorten("reason"),
        ]);
        for item in &report.sample_blocked {
            table.add_row([
                item.dead_letter_id.clone(),
                output::key_cell(&item.message_key),
                item.verdict().name().to_owned(),
                cell(&item.reason).to_owned(),
            ]);
        }
        write_table(out, &table)?;
    }

    if report.total > 0 {
        writeln!(out, "\nnext: {}", next_hint(report))?;
    }
    Ok(())
}

/// The staleness coverage: event type, rule (`none: never stale`), dead
/// letters, stale, age of the oldest.
fn staleness_table(rows: &[v1::StalenessCoverage]) -> output::Table {
    let mut table = output::table(&[
        Column::shorten("event_type"),
        Column::shorten("rule"),
        Column::keep("count"),
        Column::keep("stale"),
        Column::keep("oldest"),
    ]);
    for row in rows {
        table.add_row([
            if row.event_type.is_empty() {
                "(none)".to_owned()
            } else {
                cell(&row.event_type).to_owned()
            },
            if row.rule.is_empty() {
                "none: never stale".to_owned()
            } else {
                cell(&row.rule).to_owned()
            },
            row.count.to_string(),
            row.stale.to_string(),
            age_text(Duration::from_secs(
                row.oldest_age.as_ref().map(seconds).unwrap_or_default(),
            )),
        ]);
    }
    table
}

/// A breakdown table: value, total, replayable, then one column per other
/// verdict that is not zero in some row.
fn breakdown_table(rows: &[v1::Breakdown]) -> output::Table {
    let count = |row: &v1::Breakdown, verdict| verdict_count(row.counts.as_ref(), verdict);
    let others: Vec<Verdict> = VERDICTS[1..]
        .iter()
        .copied()
        .filter(|verdict| rows.iter().any(|row| count(row, *verdict) > 0))
        .collect();
    let mut columns = vec![
        Column::shorten("value"),
        Column::keep("total"),
        Column::keep("replayable"),
    ];
    columns.extend(others.iter().map(|verdict| Column::keep(verdict.name())));
    let mut table = output::table(&columns);
    for row in rows {
        let mut cells = vec![
            cell(&row.value).to_owned(),
            row.total.to_string(),
            count(row, Verdict::Replayable).to_string(),
        ];
        cells.extend(
            others
                .iter()
                .map(|verdict| count(row, *verdict).to_string()),
        );
        table.add_row(cells);
    }
    table
}

/// The command to read on with: the items of the most common non-replayable
/// verdict (the earlier in precedence on a tie), or all items when every one
/// is replayable.
pub fn next_hint(report: &PrecheckReport) -> String {
    let count = |verdict| verdict_count(report.counts.as_ref(), verdict);
    let mut hint = format!(
        "{} precheck items {}",
        crate::hint::redrivectl(),
        report.precheck_id
    );
    let worst = VERDICTS[1..]
        .iter()
        .copied()
        .filter(|verdict| count(*verdict) > 0)
        .fold(None::<Verdict>, |best, verdict| match best {
            Some(best) if count(best) >= count(verdict) => Some(best),
            _ => Some(verdict),
        });
    if let Some(verdict) = worst {
        hint.push_str(" --verdict ");
        hint.push_str(verdict.name());
    }
    hint
}
