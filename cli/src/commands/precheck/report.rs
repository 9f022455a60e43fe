//! A precheck report for people: the report's fields in the shapes the text
//! is written from (counts per verdict, breakdowns, options, staleness), and
//! the rendering itself (module docs of [`super`]).

use std::{collections::BTreeMap, io::Write, time::Duration};

use redrive_proto::time::age_text;
use redrive_proto::v1::{self, PrecheckReport, Verdict};
use serde::Serialize;

use super::VERDICTS;
use crate::{
    output::{self, Column, cell, timestamp_text, write_table},
    views::ItemJson,
};

// ---------------------------------------------------------------------------
// Shapes
// ---------------------------------------------------------------------------

/// Count per verdict; all eight fields always present, in [`VERDICTS`] order.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[allow(missing_docs)] // One field per verdict, named as Verdict::name.
pub struct CountsJson {
    pub replayable: u64,
    pub duplicate: u64,
    pub already_replayed: u64,
    pub looping: u64,
    pub stale: u64,
    pub blocked_by_state: u64,
    pub needs_compensation: u64,
    pub invalid: u64,
}

impl From<Option<&v1::VerdictCounts>> for CountsJson {
    fn from(counts: Option<&v1::VerdictCounts>) -> Self {
        let counts = counts.cloned().unwrap_or_default();
        Self {
            replayable: counts.replayable,
            duplicate: counts.duplicate,
            already_replayed: counts.already_replayed,
            looping: counts.looping,
            stale: counts.stale,
            blocked_by_state: counts.blocked_by_state,
            needs_compensation: counts.needs_compensation,
            invalid: counts.invalid,
        }
    }
}

impl CountsJson {
    /// The count of `verdict` (0 for `Unspecified`).
    pub fn get(&self, verdict: Verdict) -> u64 {
        match verdict {
            Verdict::Unspecified => 0,
            Verdict::Replayable => self.replayable,
            Verdict::Duplicate => self.duplicate,
            Verdict::AlreadyReplayed => self.already_replayed,
            Verdict::Looping => self.looping,
            Verdict::Stale => self.stale,
            Verdict::BlockedByState => self.blocked_by_state,
            Verdict::NeedsCompensation => self.needs_compensation,
            Verdict::Invalid => self.invalid,
        }
    }
}

/// One row of a breakdown.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BreakdownJson {
    /// The grouping value; `""` when absent.
    pub value: String,
    /// Items with this value.
    pub total: u64,
    /// Their verdicts.
    pub counts: CountsJson,
}

impl From<&v1::Breakdown> for BreakdownJson {
    fn from(breakdown: &v1::Breakdown) -> Self {
        Self {
            value: breakdown.value.clone(),
            total: breakdown.total,
            counts: CountsJson::from(breakdown.counts.as_ref()),
        }
    }
}

/// The five breakdowns, in the order people read them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[allow(missing_docs)] // Named as the dimension.
pub struct BreakdownsJson {
    pub reason_class: Vec<BreakdownJson>,
    pub destination: Vec<BreakdownJson>,
    pub event_type: Vec<BreakdownJson>,
    pub schema_version: Vec<BreakdownJson>,
    pub producer: Vec<BreakdownJson>,
}

impl BreakdownsJson {
    /// (title, rows) of each breakdown.
    fn tables(&self) -> [(&'static str, &[BreakdownJson]); 5] {
        [
            ("reason class", &self.reason_class),
            ("destination", &self.destination),
            ("event type", &self.event_type),
            ("schema version", &self.schema_version),
            ("producer", &self.producer),
        ]
    }
}

/// The options a precheck ran with: the request's merged with the planner's
/// policy (module docs). Durations are whole seconds.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct OptionsJson {
    /// Event type pattern → maximum age.
    pub stale_after_seconds: BTreeMap<String, u64>,
    /// Source pattern → maximum age.
    pub stale_after_source_seconds: BTreeMap<String, u64>,
    /// Maximum age of event types no pattern matches.
    pub default_stale_after_seconds: Option<u64>,
    /// Window of earlier replays that make a key already_replayed.
    pub replay_key_window_seconds: Option<u64>,
    /// Re-dead-letters after which a key is looping (0: the planner's default).
    pub max_redrives: u32,
    /// JSON pointer to the event time in the body.
    pub event_time_pointer: Option<String>,
    /// Whether the request overrode the planner's policy.
    pub override_policy: bool,
    /// Why, with `override_policy`.
    pub override_reason: Option<String>,
}

fn seconds(duration: &prost_types::Duration) -> u64 {
    u64::try_from(duration.seconds).unwrap_or_default()
}

impl From<Option<&v1::PrecheckOptions>> for OptionsJson {
    fn from(options: Option<&v1::PrecheckOptions>) -> Self {
        let Some(options) = options else {
            return Self::default();
        };
        let map = |rules: &BTreeMap<String, prost_types::Duration>| {
            rules
                .iter()
                .map(|(pattern, age)| (pattern.clone(), seconds(age)))
                .collect()
        };
        let text = |text: &str| Some(text.to_owned()).filter(|text| !text.is_empty());
        Self {
            stale_after_seconds: map(&options.stale_after),
            stale_after_source_seconds: map(&options.stale_after_source),
            default_stale_after_seconds: options.default_stale_after.as_ref().map(seconds),
            replay_key_window_seconds: options.replay_key_window.as_ref().map(seconds),
            max_redrives: options.max_redrives,
            event_time_pointer: text(&options.event_time_pointer),
            override_policy: options.override_policy,
            override_reason: text(&options.override_reason),
        }
    }
}

impl OptionsJson {
    /// One line for people: `stale after payment.*=2h, source orders.dlq=30m,
    /// default 1day; replay-key window 7days; max redrives 3`.
    pub fn summary(&self) -> String {
        let human =
            |seconds: u64| humantime::format_duration(Duration::from_secs(seconds)).to_string();
        let mut deadlines: Vec<String> = self
            .stale_after_seconds
            .iter()
            .map(|(pattern, age)| format!("{pattern}={}", human(*age)))
            .collect();
        deadlines.extend(
            self.stale_after_source_seconds
                .iter()
                .map(|(pattern, age)| format!("source {pattern}={}", human(*age))),
        );
        if let Some(age) = self.default_stale_after_seconds {
            deadlines.push(format!("default {}", human(age)));
        }
        let mut parts = vec![if deadlines.is_empty() {
            "no staleness deadline".to_owned()
        } else {
            format!("stale after {}", deadlines.join(", "))
        }];
        if let Some(pointer) = &self.event_time_pointer {
            parts.push(format!("event time at {pointer}"));
        }
        if let Some(window) = self.replay_key_window_seconds {
            parts.push(format!("replay-key window {}", human(window)));
        }
        if self.max_redrives > 0 {
            parts.push(format!("max redrives {}", self.max_redrives));
        }
        parts.join("; ")
    }
}

/// A precheck report in its stable JSON shape (module docs).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReportJson {
    /// The precheck id (a UUID).
    pub precheck_id: String,
    /// Who ran it.
    pub actor: String,
    /// When, RFC 3339.
    pub created_at: Option<String>,
    /// Lowercase hex SHA-256 an approval must quote.
    pub digest: String,
    /// Items covered.
    pub total: u64,
    /// The options it ran with (the planner's policy merged).
    pub options: OptionsJson,
    /// Count per verdict.
    pub counts: CountsJson,
    /// Counts per reason class, destination, event type, schema version, producer.
    pub breakdowns: BreakdownsJson,
    /// Earliest death time covered, RFC 3339.
    pub died_from: Option<String>,
    /// Latest death time covered, RFC 3339.
    pub died_to: Option<String>,
    /// What the planner thinks an operator should know.
    pub warnings: Vec<String>,
    /// The first non-replayable items.
    pub sample_blocked: Vec<ItemJson>,
    /// Which staleness rule applied, per event type.
    pub staleness: Vec<StalenessJson>,
}

/// One row of the report's staleness coverage: the dead letters of one event
/// type that one rule applied to (`rule` null: no rule covers them).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StalenessJson {
    /// The event type (`""` when none).
    pub event_type: String,
    /// The rule as written (`stale_after payment.*=2h0m`), or null.
    pub rule: Option<String>,
    /// The rule's maximum age in seconds, or null.
    pub max_age_seconds: Option<u64>,
    /// Dead letters of this event type under this rule.
    pub count: u64,
    /// How many of them are stale.
    pub stale: u64,
    /// The age of the oldest, in seconds, at the precheck.
    pub oldest_age_seconds: u64,
}

impl From<&v1::StalenessCoverage> for StalenessJson {
    fn from(row: &v1::StalenessCoverage) -> Self {
        Self {
            event_type: row.event_type.clone(),
            rule: Some(row.rule.clone()).filter(|rule| !rule.is_empty()),
            max_age_seconds: row.max_age.as_ref().map(seconds),
            count: row.count,
            stale: row.stale,
            oldest_age_seconds: row.oldest_age.as_ref().map(seconds).unwrap_or_default(),
        }
    }
}

impl From<&PrecheckReport> for ReportJson {
    fn from(report: &PrecheckReport) -> Self {
        let rows = |rows: &[v1::Breakdown]| rows.iter().map(BreakdownJson::from).collect();
        Self {
            precheck_id: report.precheck_id.clone(),
            actor: report.actor.clone(),
            created_at: timestamp_text(report.created_at.as_ref()),
            digest: report.digest.clone(),
            total: report.total,
            options: OptionsJson::from(report.options.as_ref()),
            counts: CountsJson::from(report.counts.as_ref()),
            breakdowns: BreakdownsJson {
                reason_class: rows(&report.by_reason_class),
                destination: rows(&report.by_destination),
                event_type: rows(&report.by_event_type),
                schema_version: rows(&report.by_schema_version),
                producer: rows(&report.by_producer),
            },
            died_from: timestamp_text(report.died_from.as_ref()),
            died_to: timestamp_text(report.died_to.as_ref()),
            warnings: report.warnings.clone(),
            sample_blocked: report.sample_blocked.iter().map(ItemJson::from).collect(),
            staleness: report.staleness.iter().map(StalenessJson::from).collect(),
        }
    }
}

// ---------------------------------------------------------------------------
// Rendering
// ---------------------------------------------------------------------------

/// The human rendering of a report (module docs).
pub fn write_report(out: &mut dyn Write, report: &ReportJson) -> std::io::Result<()> {
    let covered = match (&report.died_from, &report.died_to) {
        (Some(from), Some(to)) => format!("{from} .. {to}"),
        (Some(from), None) => format!("{from} .. -"),
        (None, Some(to)) => format!("- .. {to}"),
        (None, None) => "- (nothing selected)".to_owned(),
    };
    let fields = [
        ("precheck id", report.precheck_id.clone()),
        ("actor", cell(&report.actor).to_owned()),
        (
            "created at",
            report.created_at.clone().unwrap_or_else(|| "-".to_owned()),
        ),
        ("digest", cell(&report.digest).to_owned()),
        ("total", report.total.to_string()),
        ("died", covered),
        ("options", report.options.summary()),
    ];
    let mut fields = fields.to_vec();
    if let Some(reason) = &report.options.override_reason {
        fields.push(("policy override", reason.clone()));
    }
    output::write_fields(out, "", &fields)?;

    writeln!(out)?;
    let mut counts = output::table(&[Column::keep("verdict"), Column::keep("count")]);
    for verdict in VERDICTS {
        counts.add_row([
            verdict.name().to_owned(),
            report.counts.get(verdict).to_string(),
        ]);
    }
    write_table(out, &counts)?;

    for (title, rows) in report.breakdowns.tables() {
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

    let blocked = report.total.saturating_sub(report.counts.replayable);
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
                item.verdict.to_owned(),
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
fn staleness_table(rows: &[StalenessJson]) -> output::Table {
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
            row.rule.as_deref().map_or_else(
                || "none: never stale".to_owned(),
                |rule| cell(rule).to_owned(),
            ),
            row.count.to_string(),
            row.stale.to_string(),
            age_text(Duration::from_secs(row.oldest_age_seconds)),
        ]);
    }
    table
}

/// A breakdown table: value, total, replayable, then one column per other
/// verdict that is not zero in some row.
fn breakdown_table(rows: &[BreakdownJson]) -> output::Table {
    let others: Vec<Verdict> = VERDICTS[1..]
        .iter()
        .copied()
        .filter(|verdict| rows.iter().any(|row| row.counts.get(*verdict) > 0))
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
            row.counts.replayable.to_string(),
        ];
        cells.extend(
            others
                .iter()
                .map(|verdict| row.counts.get(*verdict).to_string()),
        );
        table.add_row(cells);
    }
    table
}

/// The command to read on with: the items of the most common non-replayable
/// verdict (the earlier in precedence on a tie), or all items when every one
/// is replayable.
pub fn next_hint(report: &ReportJson) -> String {
    let mut hint = format!(
        "{} precheck items {}",
        crate::hint::redrivectl(),
        report.precheck_id
    );
    let worst = VERDICTS[1..]
        .iter()
        .copied()
        .filter(|verdict| report.counts.get(*verdict) > 0)
        .fold(None::<Verdict>, |best, verdict| match best {
            Some(best) if report.counts.get(best) >= report.counts.get(verdict) => Some(best),
            _ => Some(verdict),
        });
    if let Some(verdict) = worst {
        hint.push_str(" --verdict ");
        hint.push_str(verdict.name());
    }
    hint
}
