//! `plan wait`: polling `GetPlan` until the plan is final, and the errors
//! and output that end it.

use std::{io::Write, time::Duration};

use redrive_proto::v1::{GetPlanRequest, Plan, PlanState};
use tonic::Code;

use super::view::{self, state_text};
use crate::{client::Planner, error::CliError, output::write_message};

/// How a wait ended.
#[derive(Debug)]
pub enum WaitOutcome {
    /// The plan reached a final state.
    Final(Plan),
    /// The timeout ran out; the last plan seen, if any.
    TimedOut(Option<Plan>),
}

/// Polls `GetPlan` every `interval` until the plan is final (`completed`,
/// `cancelled`, `aborted`; `paused` is not) or `timeout` runs out. An
/// `unavailable` answer (a planner restarting) is retried, with a note on
/// stderr (a JSON warning line with `json`), until the timeout.
///
/// # Errors
/// Other gRPC errors (an unknown plan is `not_found`).
pub async fn wait(
    planner: &mut Planner,
    plan_id: &str,
    timeout: Option<Duration>,
    interval: Duration,
    json: bool,
) -> Result<WaitOutcome, CliError> {
    let mut last = None;
    let polling = async {
        let mut outage = false;
        loop {
            match planner
                .get_plan(GetPlanRequest {
                    plan_id: plan_id.to_owned(),
                })
                .await
            {
                Ok(response) => {
                    outage = false;
                    let plan = response.into_inner();
                    let done = plan.state().is_final();
                    last = Some(plan);
                    if done {
                        return Ok(());
                    }
                }
                Err(status) if status.code() == Code::Unavailable => {
                    if !outage {
                        let note = format!(
                            "the planner is unavailable ({}); still waiting",
                            status.message()
                        );
                        if json {
                            eprintln!("{}", crate::error::warning_json("unavailable", &note));
                        } else {
                            eprintln!("redrivectl: {note}");
                        }
                        outage = true;
                    }
                }
                Err(status) => return Err(CliError::from(status)),
            }
            tokio::time::sleep(interval).await;
        }
    };
    let finished = match timeout {
        Some(timeout) => tokio::time::timeout(timeout, polling).await.ok(),
        None => Some(polling.await),
    };
    match finished {
        Some(Ok(())) => Ok(WaitOutcome::Final(last.unwrap_or_default())),
        Some(Err(error)) => Err(error),
        None => Ok(WaitOutcome::TimedOut(last)),
    }
}

/// The error that ends `plan wait` for a plan that is final but not
/// completed, or completed with `failed` or `unroutable` items (exit 1), or
/// `None` when it completed with none.
pub fn not_completed(plan: &Plan) -> Option<CliError> {
    if plan.state() == PlanState::Completed {
        let counts = plan.counts.unwrap_or_default();
        if counts.failed + counts.unroutable == 0 {
            return None;
        }
        return Some(CliError::NotCompleted(format!(
            "plan {} completed, but {} item(s) failed and {} were unroutable: see `{} plan report {}`",
            plan.plan_id,
            counts.failed,
            counts.unroutable,
            crate::hint::redrivectl(),
            plan.plan_id
        )));
    }
    Some(CliError::NotCompleted(format!(
        "plan {} ended {}, not completed",
        plan.plan_id,
        state_text(plan)
    )))
}

/// The error that ends `plan wait` when `timeout` ran out.
pub fn timed_out(plan_id: &str, last: Option<&Plan>, timeout: Duration) -> CliError {
    let timeout = humantime::format_duration(timeout);
    CliError::Timeout(match last {
        Some(plan) => format!(
            "timed out after {timeout}: plan {plan_id} is still {} (--timeout)",
            state_text(plan)
        ),
        None => format!("timed out after {timeout} without an answer about plan {plan_id}"),
    })
}

/// Prints a plan as `plan wait` does: JSON, or the plan for people.
///
/// # Errors
/// When writing fails.
pub fn print_plan(out: &mut dyn Write, plan: &Plan, json: bool) -> std::io::Result<()> {
    if json {
        write_message(out, plan)
    } else {
        view::write_plan(out, plan)
    }
}
