//! `redrivectl replay DEAD_LETTER_ID --reason TEXT [--wait DURATION] [precheck options]`:
//! replays one dead letter (`ReplayDeadLetter`) through the same path as a plan
//! (a plan of one, no canary, no approval step) and waits for the executor's
//! outcome.
//!
//! Prints `REPLAYED` or `NOT_REPLAYED` with the reason, then the plan, the
//! precheck and its verdict, and the audit event when an executor reported one.
//! `--json`: the API's `ReplayDeadLetterResponse` in canonical proto3 JSON
//! (`{"outcome": "OUTCOME_REPLAYED" | "OUTCOME_NOT_REPLAYED", "reason",
//! "event", "planId", "precheckId", "verdict", "warnings"}`, defaults left
//! out; `warnings` what the precheck of this dead letter warned of, for
//! example that no staleness rule covers it).
//!
//! Exit codes: 0 `REPLAYED`; 1 `NOT_REPLAYED` (the reason is printed; the
//! answer is still on stdout), or an executor that claimed it and has not
//! reported by the end of `--wait` (DEADLINE_EXCEEDED: follow the plan it
//! names with `plan watch`); 65 an unknown id or a bad flag value the planner
//! refused.

use std::{io::Write, time::Duration};

use clap::Args;
use redrive_proto::{
    time::duration,
    v1::{ReplayDeadLetterRequest, ReplayDeadLetterResponse, Verdict, replay_dead_letter_response},
};

use crate::{
    args::{OptionsArgs, parse_positive_duration},
    client::Planner,
    error::{CliError, EX_FAILURE, EX_OK},
    output::{timestamp_text, write_message},
};

/// `replay` arguments.
#[derive(Debug, Clone, Args)]
pub struct ReplayArgs {
    /// The dead letter id.
    pub dead_letter_id: String,

    /// Why it is replayed (recorded as the plan's rationale and actions).
    #[arg(long, value_name = "TEXT", value_parser = crate::args::non_blank)]
    pub reason: String,

    /// How long the planner waits for an executor's outcome (planner default
    /// 30s, at most 10m). When no executor claims it by then, the plan of one
    /// is cancelled and the answer is NOT_REPLAYED.
    #[arg(long, value_name = "DURATION", value_parser = parse_positive_duration)]
    pub wait: Option<Duration>,

    #[command(flatten)]
    #[allow(missing_docs)]
    pub options: OptionsArgs,
}

/// `REPLAYED` or `NOT_REPLAYED`: the answer's outcome as the text names it.
fn outcome_name(response: &ReplayDeadLetterResponse) -> &'static str {
    match response.outcome() {
        replay_dead_letter_response::Outcome::Replayed => "REPLAYED",
        _ => "NOT_REPLAYED",
    }
}

/// Replays the dead letter and prints the answer.
///
/// # Errors
/// [`CliError::Usage`] for a `--stale-after` pattern given twice; gRPC errors;
/// Exit 1 (not an error: nothing more on stderr) after printing a
/// `NOT_REPLAYED` answer.
pub async fn run(
    planner: &mut Planner,
    args: ReplayArgs,
    json: bool,
    out: &mut dyn Write,
) -> Result<u8, CliError> {
    let options = args.options.to_options()?;
    let response = planner
        .replay_dead_letter(ReplayDeadLetterRequest {
            dead_letter_id: args.dead_letter_id.clone(),
            reason: args.reason,
            options: Some(options),
            wait: args.wait.map(duration),
        })
        .await?
        .into_inner();
    if json {
        write_message(out, &response)?;
    } else {
        write_text(out, args.dead_letter_id.trim(), &response)
            .map_err(|error| CliError::io("writing the answer", error))?;
    }
    // NOT_REPLAYED and its reason are printed once, on stdout, above: the
    // exit code says it to scripts, nothing is repeated on stderr.
    Ok(if outcome_name(&response) == "REPLAYED" {
        EX_OK
    } else {
        EX_FAILURE
    })
}

/// The answer for people: the outcome line, then the precheck, the plan of
/// one and the executor's audit event when there are, then the warnings.
fn write_text(
    out: &mut dyn Write,
    dead_letter_id: &str,
    response: &ReplayDeadLetterResponse,
) -> std::io::Result<()> {
    // The reason may quote a state-check hook's text, line breaks included.
    crate::output::write_item(
        out,
        "",
        &format!(
            "{}: dead letter {dead_letter_id}: {}",
            outcome_name(response),
            response.reason
        ),
    )?;
    if response.verdict() != Verdict::Unspecified {
        writeln!(
            out,
            "  precheck {}: {}",
            if response.precheck_id.is_empty() {
                "-"
            } else {
                &response.precheck_id
            },
            response.verdict().name()
        )?;
    }
    if !response.plan_id.is_empty() {
        writeln!(out, "  plan of one {}", response.plan_id)?;
    }
    if let Some(event) = &response.event {
        writeln!(
            out,
            "  audit: {} at {} by executor {} (attempt {}, confirm {:.1} ms)",
            event.action().name(),
            timestamp_text(event.at.as_ref()).as_deref().unwrap_or("-"),
            event.executor_id,
            event.attempt,
            event.confirm_latency_us as f64 / 1000.0
        )?;
    }
    for warning in &response.warnings {
        crate::output::write_item(out, "", &format!("WARNING: {warning}"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use redrive_proto::v1::{AuditAction, AuditEvent};

    fn render(response: &ReplayDeadLetterResponse) -> String {
        let mut out = Vec::new();
        write_text(&mut out, "42", response).unwrap();
        String::from_utf8(out).unwrap()
    }

    /// Was a check of the old JSON view: the outcome, reason, verdict and
    /// the absent plan and event, as the text says them.
    #[test]
    fn text_names_the_outcome_and_reason() {
        let response = ReplayDeadLetterResponse {
            outcome: replay_dead_letter_response::Outcome::NotReplayed.into(),
            reason: "already_replayed: replayed by plan p at t".into(),
            precheck_id: "c".into(),
            verdict: Verdict::AlreadyReplayed.into(),
            ..Default::default()
        };
        let text = render(&response);
        assert_eq!(
            text,
            "NOT_REPLAYED: dead letter 42: already_replayed: replayed by plan p at t\n  \
             precheck c: already_replayed\n"
        );
        // No plan of one, no audit event: no line for either.
        assert!(!text.contains("plan of one"), "{text}");
        assert!(!text.contains("audit:"), "{text}");

        let response = ReplayDeadLetterResponse {
            outcome: replay_dead_letter_response::Outcome::Replayed.into(),
            reason: "published and confirmed by the broker".into(),
            plan_id: "p".into(),
            event: Some(AuditEvent {
                action: AuditAction::Sent.into(),
                executor_id: "e-1".into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(outcome_name(&response), "REPLAYED");
        let text = render(&response);
        assert!(text.starts_with("REPLAYED: dead letter 42"), "{text}");
        assert!(text.contains("audit: sent"), "{text}");
    }
}
