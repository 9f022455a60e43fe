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
use serde::Serialize;

use crate::{
    args::{OptionsArgs, parse_positive_duration},
    client::Planner,
    error::{CliError, EX_FAILURE, EX_OK},
    output::write_message,
    views::EventJson,
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

/// The answer as the text rendering reads it (`--json` prints the API's
/// response itself).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReplayJson {
    /// `REPLAYED` or `NOT_REPLAYED`.
    pub outcome: &'static str,
    /// Why (or how it went).
    pub reason: String,
    /// The dead letter.
    pub dead_letter_id: String,
    /// The plan of one, when one was made.
    pub plan_id: Option<String>,
    /// The precheck, when one ran.
    pub precheck_id: Option<String>,
    /// The precheck's verdict, when one ran.
    pub verdict: Option<&'static str>,
    /// The executor's audit event, when it reported.
    pub event: Option<EventJson>,
    /// What the precheck of this dead letter warned of.
    pub warnings: Vec<String>,
}

impl ReplayJson {
    /// The JSON view of `response` for `dead_letter_id`.
    pub fn new(dead_letter_id: &str, response: &ReplayDeadLetterResponse) -> Self {
        let some = |text: &str| Some(text.to_owned()).filter(|text| !text.is_empty());
        Self {
            outcome: match response.outcome() {
                replay_dead_letter_response::Outcome::Replayed => "REPLAYED",
                _ => "NOT_REPLAYED",
            },
            reason: response.reason.clone(),
            dead_letter_id: dead_letter_id.to_owned(),
            plan_id: some(&response.plan_id),
            precheck_id: some(&response.precheck_id),
            verdict: (response.verdict() != Verdict::Unspecified)
                .then(|| response.verdict().name()),
            event: response.event.as_ref().map(EventJson::from),
            warnings: response.warnings.clone(),
        }
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
    let view = ReplayJson::new(args.dead_letter_id.trim(), &response);
    if json {
        write_message(out, &response)?;
    } else {
        write_text(out, &view).map_err(|error| CliError::io("writing the answer", error))?;
    }
    // NOT_REPLAYED and its reason are printed once, on stdout, above: the
    // exit code says it to scripts, nothing is repeated on stderr.
    Ok(if view.outcome == "REPLAYED" {
        EX_OK
    } else {
        EX_FAILURE
    })
}

fn write_text(out: &mut dyn Write, view: &ReplayJson) -> std::io::Result<()> {
    // The reason may quote a state-check hook's text, line breaks included.
    crate::output::write_item(
        out,
        "",
        &format!(
            "{}: dead letter {}: {}",
            view.outcome, view.dead_letter_id, view.reason
        ),
    )?;
    if let Some(verdict) = view.verdict {
        writeln!(
            out,
            "  precheck {}: {verdict}",
            view.precheck_id.as_deref().unwrap_or("-")
        )?;
    }
    if let Some(plan_id) = &view.plan_id {
        writeln!(out, "  plan of one {plan_id}")?;
    }
    if let Some(event) = &view.event {
        writeln!(
            out,
            "  audit: {} at {} by executor {} (attempt {}, confirm {:.1} ms)",
            event.action,
            event.at.as_deref().unwrap_or("-"),
            event.executor_id,
            event.attempt,
            event.confirm_latency_us as f64 / 1000.0
        )?;
    }
    for warning in &view.warnings {
        crate::output::write_item(out, "", &format!("WARNING: {warning}"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use redrive_proto::v1::{AuditAction, AuditEvent};

    #[test]
    fn json_shape_names_the_outcome_and_reason() {
        let response = ReplayDeadLetterResponse {
            outcome: replay_dead_letter_response::Outcome::NotReplayed.into(),
            reason: "already_replayed: replayed by plan p at t".into(),
            precheck_id: "c".into(),
            verdict: Verdict::AlreadyReplayed.into(),
            ..Default::default()
        };
        let view = serde_json::to_value(ReplayJson::new("42", &response)).unwrap();
        assert_eq!(view["outcome"], "NOT_REPLAYED");
        assert_eq!(view["reason"], "already_replayed: replayed by plan p at t");
        assert_eq!(view["verdict"], "already_replayed");
        assert_eq!(view["plan_id"], serde_json::Value::Null);
        assert_eq!(view["event"], serde_json::Value::Null);

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
        let view = ReplayJson::new("42", &response);
        assert_eq!(view.outcome, "REPLAYED");
        let mut text = Vec::new();
        write_text(&mut text, &view).unwrap();
        let text = String::from_utf8(text).unwrap();
        assert!(text.starts_with("REPLAYED: dead letter 42"), "{text}");
        assert!(text.contains("audit: sent"), "{text}");
    }
}
