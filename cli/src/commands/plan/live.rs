//! Following a running plan: `plan watch` (the `WatchPlan` stream, drawn as a
//! progress bar, as lines, or as JSON lines) and `plan wait` (polling
//! `GetPlan` until the plan is final, with an exit code).

use std::{io::Write, time::Duration};

use redrive_proto::v1::{
    AuditEvent, GetPlanRequest, Plan, PlanState, WatchPlanRequest, watch_plan_response::Update,
};
use serde::Serialize;
use tonic::Code;

use super::view::{self, EventJson, PlanJson, is_final, percent_done, state_text};
use crate::{
    client::Planner,
    error::{CliError, EX_OK},
    output::write_json,
};

// ---------------------------------------------------------------------------
// watch
// ---------------------------------------------------------------------------

/// How `plan watch` shows what comes in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatchMode {
    /// `{"progress": plan}` / `{"event": event}`, one per line.
    Json,
    /// One line per progress update (consecutive repeats left out) and per
    /// event: for logs and pipes.
    Lines,
    /// A single progress line redrawn in place (`\r`), cut to fit so it
    /// never wraps, events printed above it: for a terminal.
    Bar {
        /// Terminal columns; the line is cut to fit.
        width: usize,
    },
}

/// A JSON line of `plan watch --json`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "snake_case")]
enum WatchLine<'a> {
    Progress(&'a PlanJson),
    Event(&'a EventJson),
}

/// Cells of the bar's `[####----]`.
const BAR_CELLS: u64 = 24;

/// Renders `plan watch` updates to `out` (flushing after each, so a pipe or
/// terminal sees them at once).
pub struct Watcher<'a> {
    out: &'a mut dyn Write,
    mode: WatchMode,
    /// The last progress line drawn (bar) or printed (lines).
    last_line: Option<String>,
    /// The latest progress snapshot.
    last_plan: Option<Plan>,
}

impl<'a> Watcher<'a> {
    /// A watcher writing to `out` in `mode`.
    pub fn new(out: &'a mut dyn Write, mode: WatchMode) -> Self {
        Self {
            out,
            mode,
            last_line: None,
            last_plan: None,
        }
    }

    /// The latest progress snapshot seen.
    pub fn last_plan(&self) -> Option<&Plan> {
        self.last_plan.as_ref()
    }

    /// Shows a progress snapshot.
    ///
    /// # Errors
    /// When writing fails.
    pub fn progress(&mut self, plan: &Plan) -> std::io::Result<()> {
        let view = PlanJson::from(plan);
        self.last_plan = Some(plan.clone());
        match self.mode {
            WatchMode::Json => write_json(self.out, &WatchLine::Progress(&view))?,
            WatchMode::Lines => {
                let line = progress_text(&view);
                if self.last_line.as_deref() != Some(line.as_str()) {
                    writeln!(self.out, "{line}")?;
                    self.last_line = Some(line);
                }
            }
            WatchMode::Bar { width } => {
                let line = fit(&bar_text(&view), width);
                write!(self.out, "\r{line}\x1b[K")?;
                self.last_line = Some(line);
            }
        }
        self.out.flush()
    }

    /// Shows an audit event.
    ///
    /// # Errors
    /// When writing fails.
    pub fn event(&mut self, event: &AuditEvent) -> std::io::Result<()> {
        let view = EventJson::from(event);
        match self.mode {
            WatchMode::Json => write_json(self.out, &WatchLine::Event(&view))?,
            WatchMode::Lines => writeln!(self.out, "{}", event_text(&view))?,
            WatchMode::Bar { .. } => {
                // Above the bar: clear it, print the event (whole: a finished
                // line may wrap), draw the bar again.
                write!(self.out, "\r\x1b[K{}\n", event_text(&view))?;
                if let Some(line) = &self.last_line {
                    write!(self.out, "{line}\x1b[K")?;
                }
            }
        }
        self.out.flush()
    }

    /// Ends the display with the final state of `plan`: the bar is left
    /// drawn and ended with a newline; people get `plan ID STATE`; the JSON
    /// lines get `plan` as a last progress line unless it was the last
    /// progress seen.
    ///
    /// # Errors
    /// When writing fails.
    pub fn finish(&mut self, plan: &Plan) -> std::io::Result<()> {
        if self.last_plan.as_ref() != Some(plan) {
            self.progress(plan)?;
        }
        if self.mode == WatchMode::Json {
            return Ok(());
        }
        if matches!(self.mode, WatchMode::Bar { .. }) && self.last_line.is_some() {
            writeln!(self.out)?;
        }
        let view = PlanJson::from(plan);
        writeln!(self.out, "plan {} {}", view.plan_id, state_text(&view))?;
        self.out.flush()
    }
}

/// `main  450/1000 45.0%  sent 440  skipped_stale 10`.
pub fn progress_text(plan: &PlanJson) -> String {
    let mut line = format!(
        "{}  {}/{} {}",
        plan.state,
        plan.items_done,
        plan.total_items,
        percent_done(plan.items_done, plan.total_items)
    );
    let counts = plan.counts.nonzero_text();
    if !counts.is_empty() {
        line.push_str("  ");
        line.push_str(&counts);
    }
    line
}

/// `[#########---------------] ` then [`progress_text`].
pub fn bar_text(plan: &PlanJson) -> String {
    let filled = (plan.items_done.min(plan.total_items) * BAR_CELLS)
        .checked_div(plan.total_items)
        .unwrap_or(0);
    let filled = usize::try_from(filled).unwrap_or(0);
    let cells = usize::try_from(BAR_CELLS).unwrap_or(0);
    format!(
        "[{}{}] {}",
        "#".repeat(filled),
        "-".repeat(cells - filled),
        progress_text(plan)
    )
}

/// `2024-05-01T12:00:01Z sent order-1:pay` and the reason, if any.
pub fn event_text(event: &EventJson) -> String {
    let mut line = format!(
        "{} {} {}",
        event.at.as_deref().unwrap_or("-"),
        event.action,
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

/// `line` cut to `width - 1` characters (the last column stays free, so the
/// terminal does not wrap).
fn fit(line: &str, width: usize) -> String {
    line.chars().take(width.saturating_sub(1).max(1)).collect()
}

/// Runs `plan watch`: the stream until it ends, then the final state.
///
/// # Errors
/// gRPC errors; the stream ending before the plan is final (`unavailable`,
/// watch again); output errors.
pub async fn watch(
    planner: &mut Planner,
    plan_id: String,
    include_events: bool,
    mode: WatchMode,
    out: &mut dyn Write,
) -> Result<u8, CliError> {
    let mut stream = planner
        .watch_plan(WatchPlanRequest {
            plan_id: plan_id.clone(),
            include_events,
        })
        .await?
        .into_inner();
    let mut watcher = Watcher::new(out, mode);
    while let Some(update) = stream.message().await? {
        match update.update {
            Some(Update::Progress(plan)) => watcher.progress(&plan)?,
            Some(Update::Event(event)) => watcher.event(&event)?,
            None => {}
        }
    }
    // The planner ends the stream when the plan is final; ask once more to be
    // sure (and to have a state when no snapshot came).
    let plan = match watcher.last_plan() {
        Some(plan) if is_final(plan.state()) => plan.clone(),
        _ => planner
            .get_plan(GetPlanRequest {
                plan_id: plan_id.clone(),
            })
            .await?
            .into_inner(),
    };
    if !is_final(plan.state()) {
        return Err(tonic::Status::unavailable(format!(
            "the watch stream ended while plan {plan_id} is still {}; run `redrivectl plan \
             watch {plan_id}` again",
            plan.state().name()
        ))
        .into());
    }
    watcher.finish(&plan)?;
    Ok(EX_OK)
}

// ---------------------------------------------------------------------------
// wait
// ---------------------------------------------------------------------------

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
/// stderr, until the timeout.
///
/// # Errors
/// Other gRPC errors (an unknown plan is `not_found`).
pub async fn wait(
    planner: &mut Planner,
    plan_id: &str,
    timeout: Option<Duration>,
    interval: Duration,
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
                    let done = is_final(plan.state());
                    last = Some(plan);
                    if done {
                        return Ok(());
                    }
                }
                Err(status) if status.code() == Code::Unavailable => {
                    if !outage {
                        eprintln!(
                            "redrivectl: the planner is unavailable ({}); still waiting",
                            status.message()
                        );
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
    let view = PlanJson::from(plan);
    if plan.state() == PlanState::Completed {
        let counts = plan.counts.unwrap_or_default();
        if counts.failed + counts.unroutable == 0 {
            return None;
        }
        return Some(CliError::NotCompleted(format!(
            "plan {} completed, but {} item(s) failed and {} were unroutable: see `redrivectl plan report {}`",
            view.plan_id, counts.failed, counts.unroutable, view.plan_id
        )));
    }
    Some(CliError::NotCompleted(format!(
        "plan {} ended {}, not completed",
        view.plan_id,
        state_text(&view)
    )))
}

/// The error that ends `plan wait` when `timeout` ran out.
pub fn timed_out(plan_id: &str, last: Option<&Plan>, timeout: Duration) -> CliError {
    let timeout = humantime::format_duration(timeout);
    CliError::Timeout(match last {
        Some(plan) => format!(
            "timed out after {timeout}: plan {plan_id} is still {} (--timeout)",
            state_text(&PlanJson::from(plan))
        ),
        None => format!("timed out after {timeout} without an answer about plan {plan_id}"),
    })
}

/// Prints a plan as `plan wait` does: JSON, or the plan for people.
///
/// # Errors
/// When writing fails.
pub fn print_plan(out: &mut dyn Write, plan: &Plan, json: bool) -> std::io::Result<()> {
    let view = PlanJson::from(plan);
    if json {
        write_json(out, &view)
    } else {
        view::write_plan(out, &view)
    }
}

#[cfg(test)]
mod tests {
    use redrive_proto::v1::{self, AuditAction, Wave};

    use super::*;

    fn plan(state: PlanState, done: u64) -> Plan {
        Plan {
            plan_id: "p-1".into(),
            state: state.into(),
            total_items: 100,
            items_done: done,
            counts: Some(v1::ActionCounts {
                sent: done,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn event() -> AuditEvent {
        AuditEvent {
            message_key: "order-1:pay".into(),
            action: AuditAction::Failed.into(),
            reason: "nack".into(),
            wave: Wave::Main.into(),
            ..Default::default()
        }
    }

    fn render(mode: WatchMode, run: impl FnOnce(&mut Watcher<'_>)) -> String {
        let mut out = Vec::new();
        run(&mut Watcher::new(&mut out, mode));
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn lines_print_each_change_and_the_final_state() {
        let text = render(WatchMode::Lines, |watcher| {
            watcher.progress(&plan(PlanState::Main, 10)).unwrap();
            watcher.progress(&plan(PlanState::Main, 10)).unwrap();
            watcher.event(&event()).unwrap();
            watcher.progress(&plan(PlanState::Completed, 100)).unwrap();
            watcher.finish(&plan(PlanState::Completed, 100)).unwrap();
        });
        assert_eq!(
            text,
            "main  10/100 10.0%  sent 10\n\
             - failed order-1:pay nack\n\
             completed  100/100 100.0%  sent 100\n\
             plan p-1 completed\n"
        );
    }

    #[test]
    fn the_bar_redraws_in_place_and_events_go_above_it() {
        let text = render(WatchMode::Bar { width: 80 }, |watcher| {
            watcher.progress(&plan(PlanState::Canary, 25)).unwrap();
            watcher.event(&event()).unwrap();
            watcher.finish(&plan(PlanState::Completed, 100)).unwrap();
        });
        let bar = "[######------------------] canary  25/100 25.0%  sent 25";
        let done = "[########################] completed  100/100 100.0%  sent 100";
        assert_eq!(
            text,
            format!(
                "\r{bar}\x1b[K\r\x1b[K- failed order-1:pay nack\n{bar}\x1b[K\r{done}\x1b[K\n\
                 plan p-1 completed\n"
            )
        );
        // A narrow terminal gets a cut line, never a wrapped one.
        let narrow = render(WatchMode::Bar { width: 20 }, |watcher| {
            watcher.progress(&plan(PlanState::Main, 50)).unwrap();
        });
        assert_eq!(narrow, "\r[############------\x1b[K");
    }

    #[test]
    fn json_lines_tag_progress_and_events() {
        let text = render(WatchMode::Json, |watcher| {
            watcher.progress(&plan(PlanState::Main, 10)).unwrap();
            watcher.event(&event()).unwrap();
            watcher.finish(&plan(PlanState::Aborted, 10)).unwrap();
        });
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|line| serde_json::from_str(line).unwrap())
            .collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert_eq!(lines[0]["progress"]["state"], "main");
        assert_eq!(lines[0]["progress"]["counts"]["uncertain"], 0);
        assert_eq!(lines[1]["event"]["action"], "failed");
        // The final state came from GetPlan, not the stream: it is added.
        assert_eq!(lines[2]["progress"]["state"], "aborted");
    }

    #[test]
    fn only_completed_exits_zero() {
        assert!(not_completed(&plan(PlanState::Completed, 100)).is_none());
        let mut with_failures = plan(PlanState::Completed, 100);
        with_failures.counts = Some(v1::ActionCounts {
            sent: 98,
            failed: 1,
            unroutable: 1,
            ..Default::default()
        });
        let error = not_completed(&with_failures).unwrap();
        assert_eq!(error.exit_code(), 1);
        assert!(
            error
                .to_string()
                .starts_with("plan p-1 completed, but 1 item(s) failed and 1 were unroutable"),
            "{error}"
        );
        let mut cancelled = plan(PlanState::Cancelled, 5);
        cancelled.state_reason = "wrong selection".into();
        let error = not_completed(&cancelled).unwrap();
        assert_eq!(error.exit_code(), 1);
        assert_eq!(
            error.to_string(),
            "plan p-1 ended cancelled (wrong selection), not completed"
        );
        let error = timed_out(
            "p-1",
            Some(&plan(PlanState::Paused, 5)),
            Duration::from_secs(90),
        );
        assert_eq!(error.exit_code(), 75);
        assert_eq!(
            error.to_string(),
            "timed out after 1m 30s: plan p-1 is still paused (--timeout)"
        );
        assert!(is_final(PlanState::Aborted));
        assert!(!is_final(PlanState::Paused));
        assert!(!is_final(PlanState::AwaitingApproval));
    }
}
