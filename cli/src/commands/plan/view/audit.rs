//! An audit report for people, rendered straight from the API's
//! `AuditReport` ([`write_audit_report`]).

use std::io::Write;

use redrive_proto::v1::AuditReport;

use super::{write_counts, write_plan_fields};
use crate::{
    output::{self, Column, cell, timestamp_text, write_table},
    views::wave_name,
};

/// How many sent keys the readable report lists.
pub const SENT_KEYS_SHOWN: usize = 20;
/// How many not-sent items the readable report lists.
pub const NOT_SENT_SHOWN: usize = 100;

/// The readable audit report: the plan's key fields, counts per action, the
/// first sent keys, the items not sent with why.
pub fn write_audit_report(
    out: &mut dyn Write,
    plan_id: &str,
    report: &AuditReport,
) -> std::io::Result<()> {
    if let Some(plan) = &report.plan {
        write_plan_fields(out, plan)?;
        writeln!(out)?;
    }
    write_counts(out, &report.counts.unwrap_or_default())?;

    write_keys(out, "sent keys", &report.sent_keys, plan_id, "sent_keys")?;
    if !report.possibly_duplicated_keys.is_empty() {
        write_keys(
            out,
            "possibly delivered twice (uncertain after a lost lease or confirm, then published again with the same message id; counted as sent)",
            &report.possibly_duplicated_keys,
            plan_id,
            "possibly_duplicated_keys",
        )?;
    }

    let not_sent = report.not_sent.len();
    writeln!(out, "\nnot sent: {not_sent}")?;
    if not_sent > 0 {
        let mut table = output::table(&[
            Column::keep("dead_letter_id"),
            Column::shorten("message_key"),
            Column::keep("action"),
            Column::keep("wave"),
            Column::keep("at").optional(),
            Column::shorten("reason"),
        ]);
        for event in report.not_sent.iter().take(NOT_SENT_SHOWN) {
            table.add_row([
                cell(&event.dead_letter_id).to_owned(),
                output::key_cell(&event.message_key),
                event.action().name().to_owned(),
                wave_name(event.wave()).to_owned(),
                timestamp_text(event.at.as_ref()).unwrap_or_else(|| "-".to_owned()),
                cell(&event.reason).to_owned(),
            ]);
        }
        write_table(out, &table)?;
        if not_sent > NOT_SENT_SHOWN {
            writeln!(
                out,
                "... and {} more (every event: {} plan report {plan_id} --format csv)",
                not_sent - NOT_SENT_SHOWN,
                crate::hint::redrivectl()
            )?;
        }
    }
    write_never_attempted(out, plan_id, report)?;
    writeln!(
        out,
        "\nexport for reconciliation: {} plan report {plan_id} --format csv (or jsonl)",
        crate::hint::redrivectl()
    )
}

/// `never attempted: N` (a final plan) or `not attempted yet: N`, and the
/// first [`NOT_SENT_SHOWN`] of them.
fn write_never_attempted(
    out: &mut dyn Write,
    plan_id: &str,
    report: &AuditReport,
) -> std::io::Result<()> {
    let count = report.never_attempted;
    let ended = report
        .plan
        .as_ref()
        .is_some_and(|plan| plan.state().is_final());
    if ended {
        writeln!(
            out,
            "\nnever attempted: {count}{}",
            if count > 0 {
                " (the plan ended before an executor took them: nothing was published; they \
                 stay open for a new precheck and plan)"
            } else {
                ""
            }
        )?;
    } else {
        writeln!(out, "\nnot attempted yet: {count}")?;
    }
    if report.never_attempted_items.is_empty() {
        return Ok(());
    }
    let mut table = output::table(&[
        Column::keep("dead_letter_id"),
        Column::shorten("message_id"),
        Column::shorten("message_key"),
        Column::keep("wave"),
    ]);
    for item in report.never_attempted_items.iter().take(NOT_SENT_SHOWN) {
        table.add_row([
            item.dead_letter_id.clone(),
            cell(&item.message_id).to_owned(),
            output::key_cell(&item.message_key),
            wave_name(item.wave()).to_owned(),
        ]);
    }
    write_table(out, &table)?;
    let listed = report.never_attempted_items.len().min(NOT_SENT_SHOWN);
    let more = usize::try_from(count)
        .unwrap_or(usize::MAX)
        .saturating_sub(listed);
    if more > 0 {
        writeln!(
            out,
            "... and {more} more (every one: {} plan report {plan_id} --format csv)",
            crate::hint::redrivectl()
        )?;
    }
    Ok(())
}

/// `heading: N`, then the first [`SENT_KEYS_SHOWN`] keys and how to get the
/// rest (`field` of the report's JSON).
fn write_keys(
    out: &mut dyn Write,
    heading: &str,
    keys: &[String],
    plan_id: &str,
    field: &str,
) -> std::io::Result<()> {
    writeln!(out, "\n{heading}: {}", keys.len())?;
    for key in keys.iter().take(SENT_KEYS_SHOWN) {
        output::write_item(out, "  ", key)?;
    }
    if keys.len() > SENT_KEYS_SHOWN {
        writeln!(
            out,
            "  ... and {} more (all of them: {} plan report {plan_id} --json | jq -r \
             '.{field}[]')",
            keys.len() - SENT_KEYS_SHOWN,
            crate::hint::redrivectl()
        )?;
    }
    Ok(())
}
