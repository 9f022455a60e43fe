//! Following a running plan: `plan watch` (the `WatchPlan` stream, drawn as a
//! progress bar, as lines, or as JSON lines, with the pace and stall
//! warnings of [`super::pace`]); `plan wait` is [`super::wait`].

use std::{
    io::{self, Write},
    sync::Mutex,
    time::{Duration, Instant},
};

use chrono::{DateTime, Utc};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use redrive_proto::{
    time::from_timestamp,
    v1::{
        AuditEvent, GetPlanRequest, Plan, PlanState, WatchPlanRequest, WatchPlanResponse,
        watch_plan_response::{self, Update},
    },
};
use serde::Serialize;
use tokio_stream::StreamExt;

use super::{
    pace::{self, Elapsed, Pace, RateWindow, StallChange, StallWatch},
    view::state_text,
};
use crate::{
    client::Planner,
    error::{CliError, EX_OK},
    output::{write_json, write_message},
};

mod bar;
mod text;

use bar::{BAR_TEMPLATE, BarTerm};
pub use text::{event_text, progress_text, resumed_text, stalled_text};
use text::{observing_notice, with_pace};

// ---------------------------------------------------------------------------
// watch
// ---------------------------------------------------------------------------

/// How `plan watch` shows what comes in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatchMode {
    /// `{"progress": plan}` / `{"event": event}` / `{"stalled": stall}` /
    /// `{"resumed": stall}`, one per line.
    Json,
    /// One line per progress change, per event and per stall warning, and
    /// the status line again every [`LINES_HEARTBEAT`] while nothing
    /// changes: for logs and pipes.
    Lines,
    /// A single progress line drawn by `indicatif` and redrawn every
    /// [`TICK`], its text cut to fit the width; events and warnings are
    /// printed above it: for a terminal.
    Bar {
        /// Terminal columns; the line's text is cut to fit.
        width: usize,
    },
}

/// How often `plan watch` looks at its own clock (the planner sends nothing
/// while a plan stands still): the bar is redrawn, the line heartbeat and
/// the stall deadline are checked.
pub const TICK: Duration = Duration::from_secs(1);

/// In [`WatchMode::Lines`], the status line is printed again (with a fresh
/// rate, elapsed time, ETA and observation countdown) when nothing changed
/// for this long, and no more often, so a pipe is not flooded.
pub const LINES_HEARTBEAT: Duration = Duration::from_secs(10);

/// A JSON line of `plan watch --json` that the CLI makes itself (no API
/// message says it): `{"stalled": stall}` or `{"resumed": stall}`. The
/// planner's updates are printed as the API's `WatchPlanResponse`s
/// (`{"progress": plan}`, `{"event": audit event}`, canonical JSON).
#[derive(Debug, Serialize)]
#[serde(rename_all = "snake_case")]
enum WatchLine<'a> {
    Stalled(&'a StallJson),
    Resumed(&'a StallJson),
}

/// The body of the `{"stalled": ...}` and `{"resumed": ...}` lines of
/// `plan watch --json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StallJson {
    /// The plan.
    pub plan_id: String,
    /// Its state (`canary` or `main` for a stall; for `resumed`, the state
    /// progress resumed in).
    pub state: &'static str,
    /// Items done when the line was written.
    pub items_done: u64,
    /// Items in the plan.
    pub total_items: u64,
    /// Whole seconds without progress: so far (`stalled`), or in all
    /// (`resumed`).
    pub no_progress_seconds: u64,
    /// The line people get, without its `warning: ` prefix.
    pub message: String,
}

impl StallJson {
    fn new(plan: &Plan, change: StallChange) -> Self {
        let (span, message) = match change {
            StallChange::Stalled(span) => (span, stalled_text(plan, span)),
            StallChange::Resumed(span) => (span, resumed_text(plan, span)),
        };
        Self {
            plan_id: plan.plan_id.clone(),
            state: plan.state().name(),
            items_done: plan.items_done,
            total_items: plan.total_items,
            no_progress_seconds: span.as_secs(),
            message,
        }
    }
}

/// A moment on both clocks: the monotonic one for the rate, the heartbeat
/// and stalls; the wall clock against the planner's timestamps (approval,
/// end of the observation window).
#[derive(Debug, Clone, Copy)]
pub struct Now {
    /// Monotonic.
    pub at: Instant,
    /// Wall clock.
    pub wall: DateTime<Utc>,
}

impl Now {
    /// This moment.
    pub fn current() -> Self {
        Self {
            at: Instant::now(),
            wall: Utc::now(),
        }
    }
}

/// Renders `plan watch` updates to `out` (flushing after each, so a pipe or
/// terminal sees them at once), with the plan's pace and stall warnings.
pub struct Watcher<'a> {
    out: &'a mut dyn Write,
    mode: WatchMode,
    /// Bar: the progress bar, drawn on its own writer (stdout).
    bar: Option<ProgressBar>,
    /// Lines: the progress part of the last line printed (the pace part
    /// changes every second; a change of this part is printed at once).
    last_progress: Option<String>,
    /// Lines: when the last status line was printed.
    last_printed: Option<Instant>,
    /// The latest progress snapshot.
    last_plan: Option<Plan>,
    /// When the first snapshot came.
    started: Option<Instant>,
    rate: RateWindow,
    stall: StallWatch,
    /// Bar: the state of the last snapshot (a plan entering `observing` gets
    /// a line above the bar saying until when and how to promote it, which
    /// the bar's line, cut to the terminal's width, may not have room for).
    last_state: Option<PlanState>,
}

impl<'a> Watcher<'a> {
    /// A watcher writing to `out` in `mode`, warning after `stall_after`
    /// without progress in `canary` or `main`; the bar of
    /// [`WatchMode::Bar`] is drawn on stdout (`out` gets the final line).
    pub fn new(out: &'a mut dyn Write, mode: WatchMode, stall_after: Duration) -> Self {
        Self::with_bar_output(out, mode, stall_after, Box::new(io::stdout()))
    }

    /// [`Watcher::new`] with the bar drawn on `bar_output` (ignored in the
    /// other modes).
    pub fn with_bar_output(
        out: &'a mut dyn Write,
        mode: WatchMode,
        stall_after: Duration,
        bar_output: Box<dyn Write + Send>,
    ) -> Self {
        let bar = match mode {
            WatchMode::Bar { width } => {
                let term = BarTerm {
                    width: u16::try_from(width).unwrap_or(u16::MAX),
                    out: Mutex::new(bar_output),
                };
                let bar = ProgressBar::with_draw_target(
                    Some(0),
                    ProgressDrawTarget::term_like(Box::new(term)),
                );
                if let Ok(style) = ProgressStyle::with_template(BAR_TEMPLATE) {
                    bar.set_style(style.progress_chars("#-"));
                }
                Some(bar)
            }
            WatchMode::Json | WatchMode::Lines => None,
        };
        Self {
            out,
            mode,
            bar,
            last_progress: None,
            last_printed: None,
            last_plan: None,
            started: None,
            rate: RateWindow::default(),
            stall: StallWatch::new(stall_after),
            last_state: None,
        }
    }

    /// The latest progress snapshot seen.
    pub fn last_plan(&self) -> Option<&Plan> {
        self.last_plan.as_ref()
    }

    /// When [`Watcher::tick`] must run next to report a stall on time, if
    /// one can come.
    pub fn stall_deadline(&self) -> Option<Instant> {
        self.stall.deadline()
    }

    /// Shows a progress snapshot that arrived at `now` (and `progress
    /// resumed ...` first, when it ends a reported stall).
    ///
    /// # Errors
    /// When writing fails.
    pub fn progress(&mut self, plan: &Plan, now: Now) -> std::io::Result<()> {
        self.started.get_or_insert(now.at);
        self.rate
            .record(now.at, plan.items_done, plan.state().is_publishing());
        self.last_plan = Some(plan.clone());
        if let Some(change) = self.stall.observe(now.at, plan.state(), plan.items_done) {
            self.stall_line(plan, change)?;
        }
        let before = self.last_state.replace(plan.state());
        let entered_observing =
            plan.state() == PlanState::Observing && before != Some(PlanState::Observing);
        if entered_observing && matches!(self.mode, WatchMode::Bar { .. }) {
            self.above_bar(&observing_notice(plan, now));
        }
        match self.mode {
            WatchMode::Json => write_message(
                self.out,
                &WatchPlanResponse {
                    update: Some(watch_plan_response::Update::Progress(plan.clone())),
                },
            )?,
            WatchMode::Lines => {
                if self.last_progress.as_deref() != Some(progress_text(plan).as_str()) {
                    self.print_line(plan, now)?;
                }
            }
            WatchMode::Bar { .. } => self.draw_bar(plan, now),
        }
        self.out.flush()
    }

    /// Shows an audit event.
    ///
    /// # Errors
    /// When writing fails.
    pub fn event(&mut self, event: &AuditEvent) -> std::io::Result<()> {
        match self.mode {
            WatchMode::Json => write_message(
                self.out,
                &WatchPlanResponse {
                    update: Some(watch_plan_response::Update::Event(event.clone())),
                },
            )?,
            WatchMode::Lines => writeln!(self.out, "{}", event_text(event))?,
            WatchMode::Bar { .. } => self.above_bar(&event_text(event)),
        }
        self.out.flush()
    }

    /// The clock moved on to `now` with nothing from the planner: warns of a
    /// stall that is due; redraws the bar; in lines, prints the status line
    /// again when [`LINES_HEARTBEAT`] passed since the last one.
    ///
    /// # Errors
    /// When writing fails.
    pub fn tick(&mut self, now: Now) -> std::io::Result<()> {
        let Some(plan) = self.last_plan.clone() else {
            return Ok(());
        };
        if let Some(change) = self.stall.check(now.at) {
            self.stall_line(&plan, change)?;
        }
        match self.mode {
            WatchMode::Json => {}
            WatchMode::Lines => {
                let due = self.last_printed.is_some_and(|printed| {
                    now.at.saturating_duration_since(printed) >= LINES_HEARTBEAT
                });
                if due && !plan.state().is_final() {
                    self.print_line(&plan, now)?;
                }
            }
            WatchMode::Bar { .. } => self.draw_bar(&plan, now),
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
    pub fn finish(&mut self, plan: &Plan, now: Now) -> std::io::Result<()> {
        if self.last_plan.as_ref() != Some(plan) {
            self.progress(plan, now)?;
        }
        if self.mode == WatchMode::Json {
            return Ok(());
        }
        if let Some(bar) = &self.bar {
            // Left drawn; the cursor is past its end, so what follows starts
            // on the next line.
            bar.finish();
        }
        writeln!(self.out, "plan {} {}", plan.plan_id, state_text(plan))?;
        self.out.flush()
    }

    /// The pace of `plan` at `now` (module [`super::pace`]).
    pub fn pace(&self, plan: &Plan, now: Now) -> Pace {
        let state = plan.state();
        let wall = |at: Option<&prost_types::Timestamp>| at.and_then(from_timestamp);
        if state.is_final() {
            let took = wall(plan.approved_at.as_ref())
                .zip(wall(plan.completed_at.as_ref()))
                .map(|(approved, completed)| pace::wall_span(approved, completed));
            return Pace::Final { took };
        }
        if matches!(state, PlanState::AwaitingApproval | PlanState::Unspecified) {
            return Pace::None;
        }
        let rate = self.rate.rate(now.at);
        let elapsed = match wall(plan.approved_at.as_ref()) {
            Some(approved) => Elapsed::SinceApproval(pace::wall_span(approved, now.wall)),
            None => Elapsed::SinceWatching(
                now.at
                    .saturating_duration_since(self.started.unwrap_or(now.at)),
            ),
        };
        let observing = if state == PlanState::Observing {
            wall(plan.observing_until.as_ref()).map(|until| {
                (
                    crate::time::rfc3339(until),
                    pace::wall_span(now.wall, until),
                )
            })
        } else {
            None
        };
        Pace::Running {
            rate,
            elapsed,
            eta: pace::eta(plan.total_items.saturating_sub(plan.items_done), rate),
            observing,
        }
    }

    /// Lines: prints the status line of `plan` at `now`.
    fn print_line(&mut self, plan: &Plan, now: Now) -> std::io::Result<()> {
        let progress = progress_text(plan);
        let line = with_pace(progress.clone(), &self.pace(plan, now), plan);
        writeln!(self.out, "{line}")?;
        self.last_progress = Some(progress);
        self.last_printed = Some(now.at);
        Ok(())
    }

    /// Bar: redraws the line of `plan` at `now` in place.
    fn draw_bar(&mut self, plan: &Plan, now: Now) {
        let Some(bar) = &self.bar else {
            return;
        };
        bar.set_message(with_pace(progress_text(plan), &self.pace(plan, now), plan));
        bar.update(|state| {
            state.set_len(plan.total_items);
            state.set_pos(plan.items_done.min(plan.total_items));
        });
        // indicatif skips draws coming faster than its refresh rate; the
        // latest state is drawn now.
        bar.force_draw();
    }

    /// Bar: `text` on a line of its own above the bar (whole: a finished line
    /// may wrap), then the bar again.
    fn above_bar(&self, text: &str) {
        if let Some(bar) = &self.bar {
            // The text carries dead letters' keys and reasons: their control
            // characters are shown, not obeyed.
            bar.println(crate::escape::visible(text));
        }
    }

    /// A stall warning or its end, in the mode's form.
    fn stall_line(&mut self, plan: &Plan, change: StallChange) -> std::io::Result<()> {
        let stall = StallJson::new(plan, change);
        let text = match change {
            StallChange::Stalled(_) => format!("warning: {}", stall.message),
            StallChange::Resumed(_) => stall.message.clone(),
        };
        match (self.mode, change) {
            (WatchMode::Json, StallChange::Stalled(_)) => {
                write_json(self.out, &WatchLine::Stalled(&stall))
            }
            (WatchMode::Json, StallChange::Resumed(_)) => {
                write_json(self.out, &WatchLine::Resumed(&stall))
            }
            (WatchMode::Lines, _) => writeln!(self.out, "{text}"),
            (WatchMode::Bar { .. }, _) => {
                self.above_bar(&text);
                Ok(())
            }
        }
    }
}

/// Sleeps until `deadline`, or for ever without one.
async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline.into()).await,
        None => std::future::pending().await,
    }
}

/// Runs `plan watch`: the stream until it ends, then the final state. Its
/// own clock ([`TICK`], and the stall deadline) keeps the pace current and
/// notices a stall while the planner sends nothing.
///
/// # Errors
/// gRPC errors; the stream ending before the plan is final (`unavailable`,
/// watch again); output errors.
pub async fn watch(
    planner: &mut Planner,
    plan_id: String,
    include_events: bool,
    mode: WatchMode,
    stall_after: Duration,
    out: &mut dyn Write,
) -> Result<u8, CliError> {
    let mut stream = planner
        .watch_plan(WatchPlanRequest {
            plan_id: plan_id.clone(),
            include_events,
        })
        .await?
        .into_inner();
    let mut watcher = Watcher::new(out, mode, stall_after);
    let mut ticks = tokio::time::interval(TICK);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let stall_deadline = watcher.stall_deadline();
        tokio::select! {
            // `next` is cancel-safe: a message is never lost to a tick.
            update = stream.next() => match update.transpose()? {
                Some(update) => match update.update {
                    Some(Update::Progress(plan)) => watcher.progress(&plan, Now::current())?,
                    Some(Update::Event(event)) => watcher.event(&event)?,
                    None => {}
                },
                None => break,
            },
            _ = ticks.tick() => watcher.tick(Now::current())?,
            () = sleep_until(stall_deadline) => watcher.tick(Now::current())?,
        }
    }
    // The planner ends the stream when the plan is final; ask once more to be
    // sure (and to have a state when no snapshot came).
    let plan = match watcher.last_plan() {
        Some(plan) if plan.state().is_final() => plan.clone(),
        _ => planner
            .get_plan(GetPlanRequest {
                plan_id: plan_id.clone(),
            })
            .await?
            .into_inner(),
    };
    if !plan.state().is_final() {
        return Err(tonic::Status::unavailable(format!(
            "the watch stream ended while plan {plan_id} is still {}; run `{} plan watch \
             {plan_id}` again",
            plan.state().name(),
            crate::hint::redrivectl()
        ))
        .into());
    }
    watcher.finish(&plan, Now::current())?;
    Ok(EX_OK)
}

#[cfg(test)]
mod tests {
    use redrive_proto::v1::{self, AuditAction, Wave};

    use std::sync::Arc;

    use super::*;
    use crate::commands::plan::wait::{not_completed, timed_out};

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

    /// 2024-05-01T12:05:00Z, and `seconds` later.
    struct Clock(Instant);

    impl Clock {
        fn new() -> Self {
            Self(Instant::now())
        }

        fn at(&self, seconds: f64) -> Now {
            let span = Duration::from_secs_f64(seconds);
            Now {
                at: self.0 + span,
                wall: "2024-05-01T12:05:00Z".parse::<DateTime<Utc>>().unwrap()
                    + chrono::Duration::from_std(span).unwrap(),
            }
        }
    }

    /// A plan of 1000 items approved at 12:00:00, `done` of them sent.
    fn approved(state: PlanState, done: u64) -> Plan {
        Plan {
            total_items: 1000,
            approved_at: Some(prost_types::Timestamp {
                seconds: 1_714_564_800,
                nanos: 0,
            }),
            ..plan(state, done)
        }
    }

    fn render(mode: WatchMode, run: impl FnOnce(&mut Watcher<'_>, &Clock)) -> String {
        let mut out = Vec::new();
        run(
            &mut Watcher::new(&mut out, mode, Duration::from_secs(30)),
            &Clock::new(),
        );
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn lines_print_each_change_and_the_final_state() {
        let text = render(WatchMode::Lines, |watcher, clock| {
            watcher
                .progress(&plan(PlanState::Main, 10), clock.at(0.0))
                .unwrap();
            watcher
                .progress(&plan(PlanState::Main, 10), clock.at(0.1))
                .unwrap();
            watcher.event(&event()).unwrap();
            watcher
                .progress(&plan(PlanState::Completed, 100), clock.at(0.2))
                .unwrap();
            watcher
                .finish(&plan(PlanState::Completed, 100), clock.at(0.2))
                .unwrap();
        });
        assert_eq!(
            text,
            "main  10/100 10.0%  sent 10  rate —  watched 0s  eta —\n\
             - failed order-1:pay nack\n\
             completed  100/100 100.0%  sent 100\n\
             plan p-1 completed\n"
        );
    }

    #[test]
    fn lines_show_rate_elapsed_and_eta_and_repeat_only_every_ten_seconds() {
        let text = render(WatchMode::Lines, |watcher, clock| {
            watcher
                .progress(&approved(PlanState::Main, 100), clock.at(0.0))
                .unwrap();
            watcher
                .progress(&approved(PlanState::Main, 120), clock.at(2.0))
                .unwrap();
            // Ticks with nothing new: quiet until 10 s after the last line.
            for second in 3..=11 {
                watcher.tick(clock.at(f64::from(second))).unwrap();
            }
            watcher.tick(clock.at(12.0)).unwrap();
            watcher.tick(clock.at(13.0)).unwrap();
            let mut done = approved(PlanState::Completed, 1000);
            done.completed_at = Some(prost_types::Timestamp {
                seconds: 1_714_564_800 + 303,
                nanos: 0,
            });
            watcher.finish(&done, clock.at(14.0)).unwrap();
            // Final: no heartbeat any more.
            watcher.tick(clock.at(60.0)).unwrap();
        });
        assert_eq!(
            text,
            "main  100/1000 10.0%  sent 100  rate —  elapsed 5m00s  eta —\n\
             main  120/1000 12.0%  sent 120  rate 10.0/s  elapsed 5m02s  eta 1m28s\n\
             main  120/1000 12.0%  sent 120  rate 0.0/s  elapsed 5m12s  eta —\n\
             completed  1000/1000 100.0%  sent 1000  took 5m03s\n\
             plan p-1 completed\n"
        );
    }

    #[test]
    fn observing_counts_down_to_the_end_of_the_window() {
        let text = render(WatchMode::Lines, |watcher, clock| {
            let mut observing = approved(PlanState::Observing, 10);
            // 12:05:02 + 12m50s.
            observing.observing_until = Some(prost_types::Timestamp {
                seconds: 1_714_564_800 + 302 + 770,
                nanos: 0,
            });
            let mut canary = approved(PlanState::Canary, 0);
            canary.observing_until = None;
            // The canary sends 10 items in 2 s; the window opens.
            watcher.progress(&canary, clock.at(0.0)).unwrap();
            watcher.progress(&observing, clock.at(2.0)).unwrap();
            // Observing sends nothing: no stall warning, however long, and
            // the rate stays the canary's (sending time only).
            watcher.tick(clock.at(702.0)).unwrap();
        });
        let hint = "; to send the rest now: redrivectl plan promote p-1 --reason TEXT";
        assert_eq!(
            text,
            format!(
                "canary  0/1000 0.0%  rate —  elapsed 5m00s  eta —\n\
                 observing  10/1000 1.0%  sent 10  rate 5.0/s  elapsed 5m02s  eta 3m18s  \
                 observing until 2024-05-01T12:17:52.000Z (12m50s left){hint}\n\
                 observing  10/1000 1.0%  sent 10  rate 5.0/s  elapsed 16m42s  eta 3m18s  \
                 observing until 2024-05-01T12:17:52.000Z (1m10s left){hint}\n"
            )
        );
    }

    #[test]
    fn a_plan_whose_canary_was_every_item_says_nothing_is_left_to_send() {
        let mut observing = approved(PlanState::Observing, 1);
        observing.total_items = 1;
        observing.canary_items = 1;
        let notice = observing_notice(&observing, Clock::new().at(0.0));
        assert!(
            notice.contains("nothing is left to send") && !notice.contains("send the rest"),
            "{notice}"
        );
        let line = with_pace(String::new(), &Pace::None, &observing);
        assert!(
            line.contains("; nothing is left to send; to end the window now: "),
            "{line}"
        );
        observing.total_items = 100;
        let line = with_pace(String::new(), &Pace::None, &observing);
        assert!(line.contains("; to send the rest now: "), "{line}");
    }

    #[test]
    fn a_stall_is_warned_once_and_its_end_said() {
        let text = render(WatchMode::Lines, |watcher, clock| {
            watcher
                .progress(&approved(PlanState::Main, 120), clock.at(0.0))
                .unwrap();
            assert_eq!(watcher.stall_deadline(), Some(clock.at(30.0).at));
            watcher.tick(clock.at(29.0)).unwrap();
            watcher.tick(clock.at(30.0)).unwrap();
            watcher.tick(clock.at(31.0)).unwrap();
            assert_eq!(watcher.stall_deadline(), None);
            watcher
                .progress(&approved(PlanState::Main, 121), clock.at(45.0))
                .unwrap();
        });
        let warning = "warning: no progress for 30s (plan main, 120/1000 done); check the \
                       executors: are any running, what do their logs say? (to stop the plan: \
                       redrivectl plan pause p-1 --reason TEXT)";
        assert_eq!(
            text,
            format!(
                "main  120/1000 12.0%  sent 120  rate —  elapsed 5m00s  eta —\n\
                 main  120/1000 12.0%  sent 120  rate 0.0/s  elapsed 5m29s  eta —\n\
                 {warning}\n\
                 progress resumed after 45s stalled (plan main, 121/1000 done)\n\
                 main  121/1000 12.1%  sent 121  rate 0.10/s  elapsed 5m45s  eta 2h26m\n"
            )
        );
    }

    /// A writer the bar's terminal and the test share.
    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<Vec<u8>>>);

    impl Write for Shared {
        fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    /// (what went to `out`, what indicatif drew on the bar's terminal).
    fn render_bar(width: usize, run: impl FnOnce(&mut Watcher<'_>, &Clock)) -> (String, String) {
        let mut out = Vec::new();
        let screen = Shared::default();
        run(
            &mut Watcher::with_bar_output(
                &mut out,
                WatchMode::Bar { width },
                Duration::from_secs(30),
                Box::new(screen.clone()),
            ),
            &Clock::new(),
        );
        let drawn = String::from_utf8(screen.0.lock().unwrap().clone()).unwrap();
        (String::from_utf8(out).unwrap(), drawn)
    }

    /// Where `needle` first is in `haystack`, after `from`.
    fn position(haystack: &str, needle: &str, from: usize) -> usize {
        haystack[from..]
            .find(needle)
            .map(|at| from + at)
            .unwrap_or_else(|| panic!("{needle:?} not after {from} in {haystack:?}"))
    }

    #[test]
    fn the_bar_redraws_in_place_and_events_go_above_it() {
        let (out, drawn) = render_bar(120, |watcher, clock| {
            watcher
                .progress(&plan(PlanState::Canary, 25), clock.at(0.0))
                .unwrap();
            watcher.event(&event()).unwrap();
            watcher.tick(clock.at(1.0)).unwrap();
            watcher
                .finish(&plan(PlanState::Completed, 100), clock.at(1.5))
                .unwrap();
        });
        let bar =
            "[######------------------] canary  25/100 25.0%  sent 25  rate —  watched 0s  eta —";
        let ticked = "[######------------------] canary  25/100 25.0%  sent 25  rate 0.0/s  watched 1s  eta —";
        let done = "[########################] completed  100/100 100.0%  sent 100";
        // The bar, the event on a line of its own with the bar drawn again
        // under it, the pace a second later, the final state left drawn.
        let first = position(&drawn, bar, 0);
        let event_at = position(&drawn, "- failed order-1:pay nack", first);
        let again = position(&drawn, bar, event_at);
        let ticked_at = position(&drawn, ticked, again);
        position(&drawn, done, ticked_at);
        // The bar's lines are padded to the width, never longer.
        assert!(
            drawn.contains(&format!("{bar}{}", " ".repeat(120 - bar.chars().count()))),
            "{drawn:?}"
        );
        // People's output gets the final state only.
        assert_eq!(out, "plan p-1 completed\n");

        // Entering the observation window is said above the bar in full:
        // the bar's line may be cut before the promote hint.
        let (_, observing) = render_bar(80, |watcher, clock| {
            watcher
                .progress(&plan(PlanState::Canary, 1), clock.at(0.0))
                .unwrap();
            let mut observing = plan(PlanState::Observing, 1);
            // 12:05:00 + 15 minutes.
            observing.observing_until = Some(prost_types::Timestamp {
                seconds: 1_714_564_800 + 300 + 900,
                nanos: 0,
            });
            watcher.progress(&observing, clock.at(0.0)).unwrap();
            watcher.tick(clock.at(1.0)).unwrap();
        });
        let notice = "plan p-1 is observing until 2024-05-01T12:20:00.000Z (15m00s left): the \
                      planner then starts the main wave if the canary's gates are green; to send \
                      the rest now: redrivectl plan promote p-1 --reason TEXT";
        assert_eq!(observing.matches(notice).count(), 1, "once: {observing:?}");

        // A narrow terminal gets the text cut, the bar whole.
        let (_, narrow) = render_bar(40, |watcher, clock| {
            watcher
                .progress(&plan(PlanState::Main, 50), clock.at(0.0))
                .unwrap();
        });
        assert!(
            narrow.contains("[############------------] main  50/100 "),
            "{narrow:?}"
        );
        assert!(!narrow.contains("50.0%"), "{narrow:?}");

        // A stall warning goes above the bar too, and so do dead letters'
        // control characters, escaped.
        let (_, stalled) = render_bar(120, |watcher, clock| {
            watcher
                .progress(&plan(PlanState::Main, 50), clock.at(0.0))
                .unwrap();
            watcher.tick(clock.at(30.0)).unwrap();
            watcher
                .event(&AuditEvent {
                    message_key: "order-1\x1b]52;c;aGk=\x07".into(),
                    ..event()
                })
                .unwrap();
        });
        let warning = position(
            &stalled,
            "warning: no progress for 30s (plan main, 50/100 done);",
            0,
        );
        let redrawn = position(&stalled, "[############------------] main  50/100", warning);
        position(
            &stalled,
            r"- failed order-1\x1b]52;c;aGk=\x07 nack",
            redrawn,
        );
        assert!(!stalled.contains("\x1b]52"), "{stalled:?}");
    }

    #[test]
    fn json_lines_tag_progress_events_and_stalls() {
        let text = render(WatchMode::Json, |watcher, clock| {
            watcher
                .progress(&plan(PlanState::Main, 10), clock.at(0.0))
                .unwrap();
            watcher.event(&event()).unwrap();
            watcher.tick(clock.at(30.0)).unwrap();
            watcher
                .progress(&plan(PlanState::Main, 11), clock.at(40.0))
                .unwrap();
            watcher
                .finish(&plan(PlanState::Aborted, 11), clock.at(41.0))
                .unwrap();
        });
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|line| serde_json::from_str(line).unwrap())
            .collect();
        assert_eq!(lines.len(), 6, "{text}");
        // The planner's updates as the API's WatchPlanResponse, canonical
        // proto3 JSON (a zero count left out); stalls in the CLI's shape.
        assert_eq!(lines[0]["progress"]["state"], "PLAN_STATE_MAIN");
        assert_eq!(lines[0]["progress"]["counts"].get("uncertain"), None);
        assert_eq!(lines[1]["event"]["action"], "AUDIT_ACTION_FAILED");
        assert_eq!(
            lines[2],
            serde_json::json!({"stalled": {
                "plan_id": "p-1", "state": "main", "items_done": 10, "total_items": 100,
                "no_progress_seconds": 30,
                "message": "no progress for 30s (plan main, 10/100 done); check the executors: \
                            are any running, what do their logs say? (to stop the plan: \
                            redrivectl plan pause p-1 --reason TEXT)",
            }})
        );
        assert_eq!(
            lines[3],
            serde_json::json!({"resumed": {
                "plan_id": "p-1", "state": "main", "items_done": 11, "total_items": 100,
                "no_progress_seconds": 40,
                "message": "progress resumed after 40s stalled (plan main, 11/100 done)",
            }})
        );
        assert_eq!(lines[4]["progress"]["itemsDone"], "11");
        // The final state came from GetPlan, not the stream: it is added.
        assert_eq!(lines[5]["progress"]["state"], "PLAN_STATE_ABORTED");
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
        assert!(PlanState::Aborted.is_final());
        assert!(!PlanState::Paused.is_final());
        assert!(!PlanState::AwaitingApproval.is_final());
    }
}
