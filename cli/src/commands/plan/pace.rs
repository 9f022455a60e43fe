//! The pace of a plan as `plan watch` sees it, computed on the client from
//! the `items_done` of the progress snapshots it receives: the current rate
//! over a sliding window of sending time (time spent observing or paused is
//! left out, so a plan sending 50/s reads 50/s right after its observation
//! window), the time since approval, the time left at that rate, the end of
//! the observation window, and whether the plan has stopped making progress
//! (a stall).
//!
//! Everything here is arithmetic over instants handed in by the caller, so
//! it is tested without clocks or sleeps.

use std::{
    collections::VecDeque,
    time::{Duration, Instant},
};

use chrono::{DateTime, Utc};
use redrive_proto::v1::PlanState;

/// The rate is `items_done` gained over the last this long (or since the
/// first snapshot, when the watch is younger).
pub const RATE_WINDOW: Duration = Duration::from_secs(10);

/// No rate is given over a shorter span than this: two snapshots a few
/// milliseconds apart would give a meaningless figure.
pub const MIN_RATE_SPAN: Duration = Duration::from_secs(1);

/// The `items_done` samples of the last [`RATE_WINDOW`] of sending time
/// (plus the one before it, the baseline), oldest first. Samples are placed
/// on a sending clock that stands still while the plan is not sending
/// (observing, paused), so that time never dilutes the rate.
#[derive(Debug, Clone)]
pub struct RateWindow {
    window: Duration,
    samples: VecDeque<(Instant, u64)>,
    /// Time not sending before the current stretch, in all.
    idle: Duration,
    /// Since when the plan has not been sending, while it is not.
    idle_since: Option<Instant>,
}

impl Default for RateWindow {
    fn default() -> Self {
        Self::new(RATE_WINDOW)
    }
}

impl RateWindow {
    /// An empty window of `window`.
    pub fn new(window: Duration) -> Self {
        Self {
            window,
            samples: VecDeque::new(),
            idle: Duration::ZERO,
            idle_since: None,
        }
    }

    /// `at` on the sending clock: wall time less the time spent not sending
    /// (standing still from the moment sending stopped).
    fn sending_clock(&self, at: Instant) -> Instant {
        let at = match self.idle_since {
            Some(since) if since <= at => since,
            _ => at,
        };
        at.checked_sub(self.idle).unwrap_or(at)
    }

    /// Records that `done` items were done at `at`, the plan `sending`
    /// (`canary` or `main`) or not (observing, paused: that time is left out
    /// of the rate). Calls come in time order. A count that went down (it
    /// should not) starts over from it.
    pub fn record(&mut self, at: Instant, done: u64, sending: bool) {
        match (sending, self.idle_since) {
            (false, None) => self.idle_since = Some(at),
            (true, Some(since)) => {
                self.idle += at.saturating_duration_since(since);
                self.idle_since = None;
            }
            _ => {}
        }
        let at = self.sending_clock(at);
        if self.samples.back().is_some_and(|&(_, last)| done < last) {
            self.samples.clear();
        }
        self.samples.push_back((at, done));
        // Keep the newest sample at or before the window's start: it is the
        // baseline of every later `rate`.
        if let Some(start) = at.checked_sub(self.window) {
            while self.samples.len() > 1 && self.samples[1].0 <= start {
                self.samples.pop_front();
            }
        }
    }

    /// Items per second over the window of sending time ending `now`: the
    /// items done since the window's start (the last sample at or before
    /// it; the first sample when the watch is younger than the window)
    /// divided by the window's span. `None` before two snapshots span
    /// [`MIN_RATE_SPAN`] of sending (too early to tell); `Some(0.0)` when
    /// nothing moved in the window. While the plan is not sending, the rate
    /// of its last sending stretch.
    pub fn rate(&self, now: Instant) -> Option<f64> {
        let now = self.sending_clock(now);
        let &(_, latest) = self.samples.back()?;
        let start = now.checked_sub(self.window);
        let (from, baseline) = match start {
            Some(start) => match self.samples.iter().rev().find(|(at, _)| *at <= start) {
                Some(&(_, done)) => (start, done),
                None => self.samples[0],
            },
            None => self.samples[0],
        };
        let span = now.checked_duration_since(from)?;
        if span < MIN_RATE_SPAN {
            return None;
        }
        #[allow(clippy::cast_precision_loss)] // Item counts far below 2^52.
        Some(latest.saturating_sub(baseline) as f64 / span.as_secs_f64())
    }
}

/// The time left for `remaining` items at `rate` items per second: `None`
/// when there is no rate yet or it is zero (nothing moves, no estimate);
/// zero when nothing remains.
pub fn eta(remaining: u64, rate: Option<f64>) -> Option<Duration> {
    if remaining == 0 {
        return Some(Duration::ZERO);
    }
    let rate = rate.filter(|rate| rate.is_finite() && *rate > 0.0)?;
    #[allow(clippy::cast_precision_loss)] // Item counts far below 2^52.
    Duration::try_from_secs_f64(remaining as f64 / rate).ok()
}

/// `later - earlier` on the wall clock, zero when `later` is earlier (the
/// planner's clock ahead of this machine's).
pub fn wall_span(earlier: DateTime<Utc>, later: DateTime<Utc>) -> Duration {
    (later - earlier).to_std().unwrap_or(Duration::ZERO)
}

/// A duration for a status line, in whole seconds (rounded down): `45s`,
/// `4m05s`, `2h03m` (from an hour on, without the seconds).
pub fn short_duration(duration: Duration) -> String {
    let seconds = duration.as_secs();
    match seconds {
        0..60 => format!("{seconds}s"),
        60..3600 => format!("{}m{:02}s", seconds / 60, seconds % 60),
        _ => format!("{}h{:02}m", seconds / 3600, seconds % 3600 / 60),
    }
}

/// A rate for a status line: `—` when unknown, else items per second with
/// the decimals that matter (`250/s`, `12.5/s`, `0.25/s`).
pub fn rate_text(rate: Option<f64>) -> String {
    match rate {
        None => "—".to_owned(),
        Some(rate) if rate >= 100.0 => format!("{rate:.0}/s"),
        Some(rate) if rate >= 1.0 || rate == 0.0 => format!("{rate:.1}/s"),
        Some(rate) => format!("{rate:.2}/s"),
    }
}

/// Where the elapsed time counts from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Elapsed {
    /// Since the plan's `approved_at`.
    SinceApproval(Duration),
    /// Since the first snapshot of this watch (the plan has no approval time).
    SinceWatching(Duration),
}

/// The pace of a plan at one moment, for the status line.
#[derive(Debug, Clone, PartialEq)]
pub enum Pace {
    /// Nothing to say (awaiting approval, or an unknown state).
    None,
    /// Approved and not final (canary, observing, main, paused).
    Running {
        /// Items per second over the window (`None`: too early to tell).
        rate: Option<f64>,
        /// Time since approval (or since the watch began).
        elapsed: Elapsed,
        /// Time left for the remaining items at `rate` (`None`: no rate).
        eta: Option<Duration>,
        /// When the observation window ends (as every time is written) and
        /// the time left, when observing and the planner says when it ends.
        observing: Option<(String, Duration)>,
    },
    /// Final; how long it took from approval to completion, when both are
    /// known.
    Final {
        /// `completed_at - approved_at`.
        took: Option<Duration>,
    },
}

impl Pace {
    /// The status-line text: `rate 12.5/s  elapsed 4m05s  eta 44s`, with
    /// `  observing until 2024-05-01T12:20:00.000Z (12m50s left)` while
    /// observing; `took 5m03s` for a completed plan; `""` when there is
    /// nothing to say.
    pub fn text(&self) -> String {
        match self {
            Self::None | Self::Final { took: None } => String::new(),
            Self::Final { took: Some(took) } => format!("took {}", short_duration(*took)),
            Self::Running {
                rate,
                elapsed,
                eta,
                observing,
            } => {
                let elapsed = match elapsed {
                    Elapsed::SinceApproval(span) => format!("elapsed {}", short_duration(*span)),
                    Elapsed::SinceWatching(span) => format!("watched {}", short_duration(*span)),
                };
                let eta = eta.map_or_else(|| "—".to_owned(), short_duration);
                let mut text = format!("rate {}  {elapsed}  eta {eta}", rate_text(*rate));
                if let Some((until, left)) = observing {
                    text.push_str(&format!(
                        "  observing until {until} ({} left)",
                        short_duration(*left)
                    ));
                }
                text
            }
        }
    }
}

/// A change in whether a plan is stalled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StallChange {
    /// No progress for this long while sending: warn.
    Stalled(Duration),
    /// Progress again, after this long without.
    Resumed(Duration),
}

/// Notices a plan in `canary` or `main` whose `items_done` has not moved
/// for `after`: reported once per stall, and once more when it moves again.
/// The clock starts over whenever `items_done` or the state changes (a plan
/// just promoted to `main` is not stalled), and at the first snapshot.
#[derive(Debug, Clone)]
pub struct StallWatch {
    after: Duration,
    /// The last state and count seen.
    last: Option<(PlanState, u64)>,
    /// When `last` started.
    since: Option<Instant>,
    /// Whether this stall was reported.
    reported: bool,
}

impl StallWatch {
    /// Reports a stall after `after` without progress.
    pub fn new(after: Duration) -> Self {
        Self {
            after,
            last: None,
            since: None,
            reported: false,
        }
    }

    /// A snapshot of `state` with `done` items done arrived at `now`:
    /// [`StallChange::Resumed`] when a reported stall ended with progress.
    /// A stall that ends because the state changed (paused, final) is not
    /// announced: the progress line shows the new state.
    pub fn observe(&mut self, now: Instant, state: PlanState, done: u64) -> Option<StallChange> {
        let mut change = None;
        if let Some((last_state, last_done)) = self.last {
            if last_state == state && last_done == done {
                return None;
            }
            if self.reported && last_done != done {
                let since = self.since.unwrap_or(now);
                change = Some(StallChange::Resumed(now.saturating_duration_since(since)));
            }
        }
        self.last = Some((state, done));
        self.since = Some(now);
        self.reported = false;
        change
    }

    /// When a stall will be due if nothing changes: `None` when the plan is
    /// not sending (not [`PlanState::is_publishing`]: `canary`, `main`) or the
    /// stall was already reported.
    pub fn deadline(&self) -> Option<Instant> {
        match (self.last, self.since) {
            (Some((state, _)), Some(since)) if state.is_publishing() && !self.reported => {
                since.checked_add(self.after)
            }
            _ => None,
        }
    }

    /// Checks at `now`: [`StallChange::Stalled`] once, when the deadline has
    /// passed.
    pub fn check(&mut self, now: Instant) -> Option<StallChange> {
        let deadline = self.deadline()?;
        if now < deadline {
            return None;
        }
        self.reported = true;
        let since = self.since.unwrap_or(now);
        Some(StallChange::Stalled(now.saturating_duration_since(since)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(seconds: f64) -> Duration {
        Duration::from_secs_f64(seconds)
    }

    #[test]
    fn the_rate_is_items_over_the_window() {
        let t0 = Instant::now();
        let mut window = RateWindow::new(secs(10.0));
        assert_eq!(window.rate(t0), None, "no snapshot yet");
        window.record(t0, 100, true);
        assert_eq!(window.rate(t0), None, "one snapshot: too early");
        window.record(t0 + secs(0.25), 110, true);
        assert_eq!(window.rate(t0 + secs(0.25)), None, "under a second");
        // Younger than the window: since the first snapshot.
        window.record(t0 + secs(2.0), 140, true);
        assert_eq!(window.rate(t0 + secs(2.0)), Some(20.0));
        // A snapshot every second at 10/s; the rate settles at 10/s over
        // the last 10 s even though it started at 20/s.
        for second in 3..=20_u32 {
            window.record(
                t0 + secs(f64::from(second)),
                140 + u64::from(second - 2) * 10,
                true,
            );
        }
        assert_eq!(window.rate(t0 + secs(20.0)), Some(10.0));
        // Between snapshots the count holds: 5 s later, half the items over
        // the same span.
        assert_eq!(window.rate(t0 + secs(25.0)), Some(5.0));
        // Nothing for a whole window: zero.
        assert_eq!(window.rate(t0 + secs(30.0)), Some(0.0));
        assert!(window.samples.len() <= 12, "old samples are dropped");
    }

    #[test]
    fn a_count_that_goes_down_starts_the_window_over() {
        let t0 = Instant::now();
        let mut window = RateWindow::new(secs(10.0));
        window.record(t0, 50, true);
        window.record(t0 + secs(2.0), 10, true);
        window.record(t0 + secs(4.0), 30, true);
        assert_eq!(window.rate(t0 + secs(4.0)), Some(10.0));
    }

    #[test]
    fn time_not_sending_is_left_out_of_the_rate() {
        // The case: a canary at 50/s, a 15-minute observation
        // window, then the main wave at 50/s.
        let t0 = Instant::now();
        let mut window = RateWindow::new(secs(10.0));
        for tenth in 0..=20_u32 {
            window.record(
                t0 + secs(f64::from(tenth) / 10.0),
                u64::from(tenth) * 5,
                true,
            );
        }
        assert_eq!(window.rate(t0 + secs(2.0)), Some(50.0));
        window.record(t0 + secs(2.0), 100, false);
        // Observing: the canary's rate stands, it does not fall towards 0.
        assert_eq!(window.rate(t0 + secs(600.0)), Some(50.0));
        window.record(t0 + secs(800.0), 100, false);
        // Promoted (the planner sends the new state at once): 5 s of main at
        // 50/s read 50/s, not 350 items over 15 minutes.
        let main = t0 + secs(902.0);
        window.record(main, 100, true);
        for tenth in 1..=50_u32 {
            window.record(
                main + secs(f64::from(tenth) / 10.0),
                100 + u64::from(tenth) * 5,
                true,
            );
        }
        assert_eq!(window.rate(main + secs(5.0)), Some(50.0));
        // Paused for a minute, resumed at 20/s: 10 s later, 20/s.
        window.record(main + secs(5.0), 350, false);
        window.record(main + secs(65.0), 350, true);
        for second in 1..=10_u32 {
            window.record(
                main + secs(65.0 + f64::from(second)),
                350 + u64::from(second) * 20,
                true,
            );
        }
        assert_eq!(window.rate(main + secs(75.0)), Some(20.0));
        // A watch begun while observing has no rate until it sees sending.
        let mut late = RateWindow::new(secs(10.0));
        late.record(t0, 100, false);
        assert_eq!(late.rate(t0 + secs(300.0)), None);
    }

    #[test]
    fn the_eta_is_the_remaining_items_at_the_rate() {
        assert_eq!(eta(900, Some(10.0)), Some(secs(90.0)));
        assert_eq!(eta(1, Some(4.0)), Some(secs(0.25)));
        assert_eq!(eta(0, None), Some(Duration::ZERO), "nothing left");
        assert_eq!(eta(900, Some(0.0)), None, "stopped: no estimate");
        assert_eq!(eta(900, None), None, "no rate yet");
        assert_eq!(eta(900, Some(f64::NAN)), None);
        assert_eq!(eta(u64::MAX, Some(f64::MIN_POSITIVE)), None, "too far out");
    }

    #[test]
    fn durations_and_rates_read_short() {
        assert_eq!(short_duration(secs(0.9)), "0s");
        assert_eq!(short_duration(secs(45.0)), "45s");
        assert_eq!(short_duration(secs(245.0)), "4m05s");
        assert_eq!(short_duration(secs(3599.0)), "59m59s");
        assert_eq!(short_duration(secs(7380.0 + 59.0)), "2h03m");
        assert_eq!(rate_text(None), "—");
        assert_eq!(rate_text(Some(0.0)), "0.0/s");
        assert_eq!(rate_text(Some(0.25)), "0.25/s");
        assert_eq!(rate_text(Some(12.54)), "12.5/s");
        assert_eq!(rate_text(Some(249.6)), "250/s");
        let at = |text: &str| text.parse::<DateTime<Utc>>().unwrap();
        assert_eq!(
            wall_span(at("2024-05-01T12:00:00Z"), at("2024-05-01T12:01:30Z")),
            secs(90.0)
        );
        assert_eq!(
            wall_span(at("2024-05-01T12:01:30Z"), at("2024-05-01T12:00:00Z")),
            Duration::ZERO,
            "clock skew never gives a negative span"
        );
    }

    #[test]
    fn the_pace_text_names_each_figure() {
        let running = Pace::Running {
            rate: Some(12.5),
            elapsed: Elapsed::SinceApproval(secs(245.0)),
            eta: eta(550, Some(12.5)),
            observing: None,
        };
        assert_eq!(running.text(), "rate 12.5/s  elapsed 4m05s  eta 44s");
        let observing = Pace::Running {
            rate: Some(0.0),
            elapsed: Elapsed::SinceWatching(secs(12.0)),
            eta: eta(990, Some(0.0)),
            observing: Some(("2024-05-01T12:20:00.000Z".to_owned(), secs(770.0))),
        };
        assert_eq!(
            observing.text(),
            "rate 0.0/s  watched 12s  eta —  observing until 2024-05-01T12:20:00.000Z (12m50s left)"
        );
        assert_eq!(
            Pace::Final {
                took: Some(secs(303.0))
            }
            .text(),
            "took 5m03s"
        );
        assert_eq!(Pace::Final { took: None }.text(), "");
        assert_eq!(Pace::None.text(), "");
    }

    #[test]
    fn a_stall_is_reported_once_and_its_end_once() {
        let t0 = Instant::now();
        let mut stall = StallWatch::new(secs(30.0));
        assert_eq!(stall.deadline(), None, "nothing seen yet");
        assert_eq!(stall.observe(t0, PlanState::Main, 120), None);
        assert_eq!(stall.deadline(), Some(t0 + secs(30.0)));
        assert_eq!(stall.check(t0 + secs(29.0)), None);
        // The same snapshot again (the planner's periodic look) is no progress.
        assert_eq!(stall.observe(t0 + secs(20.0), PlanState::Main, 120), None);
        assert_eq!(
            stall.check(t0 + secs(30.0)),
            Some(StallChange::Stalled(secs(30.0)))
        );
        assert_eq!(stall.check(t0 + secs(60.0)), None, "once per stall");
        assert_eq!(stall.deadline(), None);
        assert_eq!(
            stall.observe(t0 + secs(45.0), PlanState::Main, 121),
            Some(StallChange::Resumed(secs(45.0)))
        );
        // A new stall is a new warning.
        assert_eq!(
            stall.check(t0 + secs(75.0)),
            Some(StallChange::Stalled(secs(30.0)))
        );
    }

    #[test]
    fn only_sending_plans_stall_and_a_new_state_restarts_the_clock() {
        let t0 = Instant::now();
        let mut stall = StallWatch::new(secs(1.0));
        stall.observe(t0, PlanState::Observing, 10);
        assert_eq!(
            stall.check(t0 + secs(600.0)),
            None,
            "observing sends nothing"
        );
        // Promoted: the main wave gets its own full second.
        stall.observe(t0 + secs(600.0), PlanState::Main, 10);
        assert_eq!(stall.check(t0 + secs(600.5)), None);
        assert!(stall.check(t0 + secs(601.0)).is_some());
        // Paused while stalled: no "resumed", no new warning while paused.
        assert_eq!(stall.observe(t0 + secs(602.0), PlanState::Paused, 10), None);
        assert_eq!(stall.check(t0 + secs(700.0)), None);
        for state in [PlanState::AwaitingApproval, PlanState::Completed] {
            let mut stall = StallWatch::new(secs(1.0));
            stall.observe(t0, state, 0);
            assert_eq!(stall.check(t0 + secs(60.0)), None, "{state:?}");
        }
        let mut stall = StallWatch::new(secs(1.0));
        stall.observe(t0, PlanState::Canary, 0);
        assert_eq!(
            stall.check(t0 + secs(2.0)),
            Some(StallChange::Stalled(secs(2.0)))
        );
    }
}
