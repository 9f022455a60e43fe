//! The planner's metric instruments, all in one place: names, units,
//! descriptions and attributes (all `redrive.planner.*`: the OpenTelemetry
//! semantic conventions name none of these). Every attribute is of bounded
//! cardinality: sources are the configured capture queues and ingest
//! labels, the rest are enums; never a message, plan or dead letter id.
//!
//! | instrument | kind | unit | attributes |
//! | --- | --- | --- | --- |
//! | `redrive.planner.dead_letters.captured` | counter | `{dead_letter}` | `redrive.source`, `redrive.reason_class` (RabbitMQ capture; new dead letters, not redeliveries) |
//! | `redrive.planner.dead_letters.redead` | counter | `{dead_letter}` | `redrive.source`: captured dead letters carrying `redrive-plan-id` (a replay came back) |
//! | `redrive.planner.dead_letters.quarantined` | counter | `{dead_letter}` | `redrive.source`, `redrive.quarantine` (`parked`: moved byte for byte to `<queue>.unreadable`; `held`: left unacked in the DLQ): messages the AMQP client cannot read |
//! | `redrive.planner.capture.errors` | counter | `{error}` | `redrive.source`, `error.type` (`session`: the consumer's connection or channel ended, not counting the guard's stop at a delivery lapin cannot read (the message is then counted by `captured` or `quarantined`); `store`: a batch could not be written) |
//! | `redrive.planner.precheck.duration` | histogram | `s` | `redrive.outcome` (`done`, `failed`) |
//! | `redrive.planner.precheck.verdicts` | counter | `{dead_letter}` | `redrive.verdict` |
//! | `redrive.planner.items` | counter | `{item}` | `redrive.audit.action`: audit events executors reported |
//! | `redrive.planner.plan.transitions` | counter | `{transition}` | `redrive.plan.state`: the state a plan moved to |
//! | `redrive.planner.plans` | gauge | `{plan}` | `redrive.plan.state`: plans in each state, counted in PostgreSQL every [`PLANS_COUNT_INTERVAL`] (so the figure is shared by every planner of the database) |
//! | `redrive.planner.gate.trips` | counter | `{trip}` | `redrive.gate.action` (`pause`, `abort`) |
//! | `redrive.planner.leases.expired` | counter | `{lease}` | none |
//! | `redrive.planner.source.depth` | gauge | `{message}` | `redrive.source`: messages ready in the capture queue, read by a passive `queue.declare` every [`crate::capture::DEPTH_INTERVAL`] |
//! | `redrive.planner.source.stored` | gauge | `{dead_letter}` | `redrive.source` |
//! | `redrive.planner.source.open` | gauge | `{dead_letter}` | `redrive.source`, `redrive.reason_class`: neither archived nor replayed |
//! | `redrive.planner.source.arrivals` | gauge | `{dead_letter}/s` | `redrive.source`: stored over the last minute, per second |
//! | `redrive.planner.source.oldest_open_age` | gauge | `s` | `redrive.source`: since the oldest open dead letter died (0: none open) |
//! | `redrive.planner.plans.stalled` | gauge | `{plan}` | none: plans publishing without an audit event or operator action for [`STALL_AFTER`] |
//!
//! The `source` gauges and `plans.stalled` are counted in PostgreSQL every
//! [`SOURCES_COUNT_INTERVAL`] (the same figures on every replica); a source
//! or class that empties drops to 0 rather than keeping its last figure.
//! The `source` counts scan every dead letter stored: when one takes longer
//! than a fiftieth of that interval the next waits longer, up to 2 minutes
//! ([`next_sources_count`]), and the gauges keep their last figures (the
//! oldest open age still grows with the clock) until then.
//!
//! | instrument | kind | unit | attributes |
//! | --- | --- | --- | --- |
//! | `redrive.planner.webhooks.deliveries` | counter | `{attempt}` | `redrive.outcome` (`delivered`: a 2xx answer; `retried`: failed, tried again later; `failed`: failed with no attempt left, the row kept as `failed` and logged at WARN) |
//! | `redrive.planner.outcomes.refused` | counter | `{outcome}` | `redrive.refusal.reason` (`unmarked`, `stale_token`, `lease_ended`, `lease_expired`, `not_in_slice`, `unknown_lease`): reported outcomes refused as late or forged |

use std::{collections::HashMap, time::Duration};

use opentelemetry::{
    KeyValue,
    metrics::{Counter, Gauge, Histogram, Meter},
};
use redrive_proto::{
    telemetry::{EnumAttributes, SECONDS_BOUNDARIES},
    v1::{AuditAction, PlanState, ReasonClass, Verdict, VerdictCounts},
};

/// New dead letters captured from RabbitMQ, by source and reason class.
pub const CAPTURED: &str = "redrive.planner.dead_letters.captured";
/// Captured dead letters that are replays coming back.
pub const REDEAD: &str = "redrive.planner.dead_letters.redead";
/// Unreadable messages moved aside or held, by source and where they went.
pub const QUARANTINED: &str = "redrive.planner.dead_letters.quarantined";
/// Capture sessions that ended in an error, and batches not stored.
pub const CAPTURE_ERRORS: &str = "redrive.planner.capture.errors";
/// Seconds a precheck took.
pub const PRECHECK_DURATION: &str = "redrive.planner.precheck.duration";
/// Verdicts of finished prechecks.
pub const PRECHECK_VERDICTS: &str = "redrive.planner.precheck.verdicts";
/// Audit events reported by executors, by action.
pub const ITEMS: &str = "redrive.planner.items";
/// Plan state changes, by the state moved to.
pub const PLAN_TRANSITIONS: &str = "redrive.planner.plan.transitions";
/// Plans in each state (a gauge).
pub const PLANS: &str = "redrive.planner.plans";
/// How often [`PLANS`] is counted in PostgreSQL.
pub const PLANS_COUNT_INTERVAL: Duration = Duration::from_secs(10);
/// Gauge: DLQ depth per capture source.
pub const SOURCE_DEPTH: &str = "redrive.planner.source.depth";
/// Gauge: dead letters stored per source.
pub const SOURCE_STORED: &str = "redrive.planner.source.stored";
/// Gauge: open dead letters per source and reason class.
pub const SOURCE_OPEN: &str = "redrive.planner.source.open";
/// Gauge: dead letters stored per second over the last minute, per source.
pub const SOURCE_ARRIVALS: &str = "redrive.planner.source.arrivals";
/// Gauge: seconds since the oldest open dead letter of a source died.
pub const SOURCE_OLDEST_OPEN_AGE: &str = "redrive.planner.source.oldest_open_age";
/// Gauge: plans publishing that made no progress for [`STALL_AFTER`].
pub const PLANS_STALLED: &str = "redrive.planner.plans.stalled";
/// How often the source gauges and [`PLANS_STALLED`] are counted, at most:
/// the source gauges' count (a scan of every dead letter stored) waits
/// [`SOURCES_COUNT_SPACING`] times its own duration when that is longer.
pub const SOURCES_COUNT_INTERVAL: Duration = Duration::from_secs(10);
/// The source gauges' count is spaced by this many times its duration, so
/// that it keeps one PostgreSQL backend busy at most 1/50 of the time on
/// each planner up to [`SOURCES_COUNT_MAX_SPACING`]: at 1,000,000 dead
/// letters (a scan of 1.1 s) the gauges are counted about once a minute
/// instead of every 10 s. A count every 10 s took, in a replay benchmark's
/// profile, a growing share of PostgreSQL's CPU as the table grew
/// (docs/benchmarks.md, "The source gauges' count").
pub const SOURCES_COUNT_SPACING: u32 = 50;
/// The longest wait between two source counts, however long one takes:
/// well inside the 10-minute windows of the shipped alerts (`deploy/`,
/// `RedriveDLQGrowing`), which need several figures a window. A scan
/// longer than 2.4 s (about 2,000,000 dead letters) then keeps a backend
/// busy more than 1/50 of the time.
pub const SOURCES_COUNT_MAX_SPACING: Duration = Duration::from_secs(120);

/// When the source gauges are counted next, from when the last successful
/// count started and how long its query took: [`SOURCES_COUNT_INTERVAL`]
/// after, or [`SOURCES_COUNT_SPACING`] times its duration when that is
/// longer, at most [`SOURCES_COUNT_MAX_SPACING`].
pub fn next_sources_count(started: std::time::Instant, took: Duration) -> std::time::Instant {
    started
        + took
            .saturating_mul(SOURCES_COUNT_SPACING)
            .clamp(SOURCES_COUNT_INTERVAL, SOURCES_COUNT_MAX_SPACING)
}
/// A plan publishing without an audit event or operator action for this
/// long is stalled.
pub const STALL_AFTER: Duration = Duration::from_secs(300);
/// Gates that paused or aborted a plan.
pub const GATE_TRIPS: &str = "redrive.planner.gate.trips";
/// Leases that expired unreported.
pub const LEASES_EXPIRED: &str = "redrive.planner.leases.expired";
/// Webhook delivery attempts, by `redrive.outcome` (`delivered`,
/// `retried`, `failed`).
pub const WEBHOOK_DELIVERIES: &str = "redrive.planner.webhooks.deliveries";
/// Reported outcomes refused as late or forged, by reason.
pub const OUTCOMES_REFUSED: &str = "redrive.planner.outcomes.refused";
/// Counter: database reads made for open watches, by `redrive.watch.read`:
/// `plan` (a plan's progress and new audit events, one per change of the
/// plan however many watch it), `lease` (a lease's state, one per change
/// however many watch it), `history` (the past audit events one new
/// `WatchPlan` with `include_events` catches up on, its own).
pub const WATCH_READS: &str = "redrive.planner.watch.reads";
/// Counter: server streams refused at their cap, by `redrive.stream.kind`
/// (`WatchPlan`, `WatchLease`) and `redrive.stream.cap` (`per_principal`,
/// `total`).
pub const STREAMS_REFUSED: &str = "redrive.planner.streams.refused";

/// Why capture failed: the `error.type` of [`CAPTURE_ERRORS`].
#[derive(Debug, Clone, Copy)]
pub enum CaptureFailure {
    /// The consumer's session ended (connection or channel lost, queue
    /// deleted).
    Session,
    /// A batch could not be stored (retried, nothing acked).
    Store,
}

/// Where an unreadable message went: the `redrive.quarantine` of
/// [`QUARANTINED`].
#[derive(Debug, Clone, Copy)]
pub enum Quarantine {
    /// Moved byte for byte to `<queue>.unreadable`, then acked.
    Parked,
    /// It cannot be moved aside: left unacked in the DLQ, held by the
    /// planner while it runs.
    Held,
}

impl Quarantine {
    fn name(self) -> &'static str {
        match self {
            Self::Parked => "parked",
            Self::Held => "held",
        }
    }
}

impl CaptureFailure {
    fn name(self) -> &'static str {
        match self {
            Self::Session => "session",
            Self::Store => "store",
        }
    }
}

/// The planner's instruments; cheap to clone (shared instruments).
#[derive(Debug, Clone)]
pub struct PlannerMetrics {
    captured: Counter<u64>,
    redead: Counter<u64>,
    quarantined: Counter<u64>,
    capture_errors: Counter<u64>,
    precheck_duration: Histogram<f64>,
    precheck_verdicts: Counter<u64>,
    items: Counter<u64>,
    plan_transitions: Counter<u64>,
    plans: Gauge<u64>,
    sources: SourceGauges,
    gate_trips: Counter<u64>,
    leases_expired: Counter<u64>,
    outcomes_refused: Counter<u64>,
    watch_reads: Counter<u64>,
    streams_refused: Counter<u64>,
    webhook_deliveries: Counter<u64>,
    /// By `AuditAction`.
    actions: EnumAttributes<9>,
    /// By `PlanState`.
    states: EnumAttributes<9>,
}

impl Default for PlannerMetrics {
    /// Instruments that record nothing.
    fn default() -> Self {
        use opentelemetry::metrics::MeterProvider as _;
        // The API's no-op provider: a built SDK provider would be dropped
        // here, and its shutdown logged at every start.
        Self::new(&opentelemetry::metrics::NoopMeterProvider::new().meter("redrive-planner"))
    }
}

impl PlannerMetrics {
    /// The instruments on `meter`.
    pub fn new(meter: &Meter) -> Self {
        let counter = |name: &'static str, unit: &'static str, description: &'static str| {
            meter
                .u64_counter(name)
                .with_unit(unit)
                .with_description(description)
                .build()
        };
        let actions = EnumAttributes::new("redrive.audit.action", |number| {
            AuditAction::try_from(number)
                .unwrap_or(AuditAction::Unspecified)
                .name()
        });
        let states = EnumAttributes::new("redrive.plan.state", |number| {
            PlanState::try_from(number)
                .unwrap_or(PlanState::Unspecified)
                .name()
        });
        Self {
            captured: counter(
                CAPTURED,
                "{dead_letter}",
                "New dead letters captured from RabbitMQ",
            ),
            redead: counter(
                REDEAD,
                "{dead_letter}",
                "Captured dead letters that are replays coming back",
            ),
            quarantined: counter(
                QUARANTINED,
                "{dead_letter}",
                "Messages the AMQP client cannot read, moved aside or held in the DLQ",
            ),
            capture_errors: counter(
                CAPTURE_ERRORS,
                "{error}",
                "Capture sessions ended by an error and batches not stored",
            ),
            precheck_duration: meter
                .f64_histogram(PRECHECK_DURATION)
                .with_unit("s")
                .with_description("Time a precheck took")
                .with_boundaries(SECONDS_BOUNDARIES.to_vec())
                .build(),
            precheck_verdicts: counter(
                PRECHECK_VERDICTS,
                "{dead_letter}",
                "Verdicts of finished prechecks",
            ),
            items: counter(ITEMS, "{item}", "Audit events reported by executors"),
            plan_transitions: counter(
                PLAN_TRANSITIONS,
                "{transition}",
                "Plan state changes, by the state moved to",
            ),
            plans: meter
                .u64_gauge(PLANS)
                .with_unit("{plan}")
                .with_description("Plans in each state")
                .build(),
            sources: SourceGauges {
                depth: meter
                    .u64_gauge(SOURCE_DEPTH)
                    .with_unit("{message}")
                    .with_description("Messages ready in the capture queue (passive queue.declare)")
                    .build(),
                stored: meter
                    .u64_gauge(SOURCE_STORED)
                    .with_unit("{dead_letter}")
                    .with_description("Dead letters stored from the source")
                    .build(),
                open: meter
                    .u64_gauge(SOURCE_OPEN)
                    .with_unit("{dead_letter}")
                    .with_description("Dead letters neither archived nor replayed, by reason class")
                    .build(),
                arrivals: meter
                    .f64_gauge(SOURCE_ARRIVALS)
                    .with_unit("{dead_letter}/s")
                    .with_description("Dead letters stored per second over the last minute")
                    .build(),
                oldest_open_age: meter
                    .f64_gauge(SOURCE_OLDEST_OPEN_AGE)
                    .with_unit("s")
                    .with_description("Time since the oldest open dead letter died")
                    .build(),
                stalled: meter
                    .u64_gauge(PLANS_STALLED)
                    .with_unit("{plan}")
                    .with_description("Plans publishing that made no progress for 5 minutes")
                    .build(),
                seen: std::sync::Arc::default(),
            },
            gate_trips: counter(GATE_TRIPS, "{trip}", "Gates that paused or aborted a plan"),
            leases_expired: counter(
                LEASES_EXPIRED,
                "{lease}",
                "Slice leases that expired before their executor ended them",
            ),
            outcomes_refused: counter(
                OUTCOMES_REFUSED,
                "{outcome}",
                "Reported outcomes refused as late or forged, by reason",
            ),
            watch_reads: counter(
                WATCH_READS,
                "{read}",
                "Database reads made for open watches, by what was read",
            ),
            streams_refused: counter(
                STREAMS_REFUSED,
                "{stream}",
                "Server streams refused at their cap, by kind and cap",
            ),
            webhook_deliveries: counter(
                WEBHOOK_DELIVERIES,
                "{attempt}",
                "Webhook delivery attempts, by outcome",
            ),
            actions,
            states,
        }
    }

    /// A stored capture batch from `source`: its new dead letters' reason
    /// classes and how many carried `redrive-plan-id`. One measurement per
    /// class present, not per message.
    pub fn captured(
        &self,
        source: &str,
        classes: impl IntoIterator<Item = ReasonClass>,
        redead: u64,
    ) {
        let mut counts: HashMap<ReasonClass, u64> = HashMap::new();
        for class in classes {
            *counts.entry(class).or_default() += 1;
        }
        let source = KeyValue::new("redrive.source", source.to_owned());
        for (class, count) in counts {
            self.captured.add(
                count,
                &[
                    source.clone(),
                    KeyValue::new("redrive.reason_class", class.name()),
                ],
            );
        }
        if redead > 0 {
            self.redead.add(redead, &[source]);
        }
    }

    /// `count` new dead letters of `source` of a batch partly stored before
    /// (a redelivery after a crash): which were new is not known, so they
    /// carry no `redrive.reason_class`.
    pub fn captured_unclassified(&self, source: &str, count: u64) {
        if count > 0 {
            self.captured
                .add(count, &[KeyValue::new("redrive.source", source.to_owned())]);
        }
    }

    /// An unreadable message of `source` was quarantined `how`.
    pub fn quarantined(&self, source: &str, how: Quarantine) {
        self.quarantined.add(
            1,
            &[
                KeyValue::new("redrive.source", source.to_owned()),
                KeyValue::new("redrive.quarantine", how.name()),
            ],
        );
    }

    /// Capture of `source` failed.
    pub fn capture_failed(&self, source: &str, failure: CaptureFailure) {
        self.capture_errors.add(
            1,
            &[
                KeyValue::new("redrive.source", source.to_owned()),
                KeyValue::new("error.type", failure.name()),
            ],
        );
    }

    /// A precheck ended after `took`; its verdict counts when it finished.
    pub fn precheck_ended(&self, took: Duration, counts: Option<&VerdictCounts>) {
        let outcome = if counts.is_some() { "done" } else { "failed" };
        self.precheck_duration.record(
            took.as_secs_f64(),
            &[KeyValue::new("redrive.outcome", outcome)],
        );
        let Some(counts) = counts else { return };
        for (verdict, count) in [
            (Verdict::Replayable, counts.replayable),
            (Verdict::Duplicate, counts.duplicate),
            (Verdict::AlreadyReplayed, counts.already_replayed),
            (Verdict::Looping, counts.looping),
            (Verdict::Stale, counts.stale),
            (Verdict::BlockedByState, counts.blocked_by_state),
            (Verdict::NeedsCompensation, counts.needs_compensation),
            (Verdict::Invalid, counts.invalid),
        ] {
            if count > 0 {
                self.precheck_verdicts
                    .add(count, &[KeyValue::new("redrive.verdict", verdict.name())]);
            }
        }
    }

    /// `count` audit events with `action` were reported.
    pub fn items_reported(&self, action: AuditAction, count: u64) {
        if let Some(attributes) = self.actions.of(action.into()) {
            self.items.add(count, attributes);
        }
    }

    /// A plan moved to `state`.
    pub fn plan_moved(&self, state: PlanState) {
        if let Some(attributes) = self.states.of(state.into()) {
            self.plan_transitions.add(1, attributes);
        }
    }

    /// The number of plans in each state, as counted: every state is
    /// recorded, 0 for one absent from `counts`, so a state that empties
    /// drops to 0 rather than keeping its last figure.
    pub fn plans_counted(&self, counts: &[(PlanState, u64)]) {
        for state in PlanState::ALL {
            let count = counts
                .iter()
                .filter(|(counted, _)| *counted == state)
                .map(|(_, count)| count)
                .sum();
            if let Some(attributes) = self.states.of(state.into()) {
                self.plans.record(count, attributes);
            }
        }
    }

    /// A gate tripped: `action` is `pause` or `abort`.
    pub fn gate_tripped(&self, action: &'static str) {
        self.gate_trips
            .add(1, &[KeyValue::new("redrive.gate.action", action)]);
    }

    /// `count` leases expired.
    pub fn leases_expired(&self, count: u64) {
        if count > 0 {
            self.leases_expired.add(count, &[]);
        }
    }

    /// One database read for open watches: `what` is `plan`, `lease` or
    /// `history` ([`WATCH_READS`]).
    pub fn watch_read(&self, what: &'static str) {
        self.watch_reads
            .add(1, &[KeyValue::new("redrive.watch.read", what)]);
    }

    /// One `kind` stream refused at `cap` ([`STREAMS_REFUSED`]).
    pub fn stream_refused(&self, kind: &'static str, cap: &'static str) {
        self.streams_refused.add(
            1,
            &[
                KeyValue::new("redrive.stream.kind", kind),
                KeyValue::new("redrive.stream.cap", cap),
            ],
        );
    }

    /// `count` reported outcomes were refused for `reason` (a
    /// `leases::outcomes::Refusal` name, a fixed set).
    pub fn outcomes_refused(&self, reason: &'static str, count: u64) {
        if count > 0 {
            self.outcomes_refused
                .add(count, &[KeyValue::new("redrive.refusal.reason", reason)]);
        }
    }

    /// One webhook delivery attempt ended with `outcome` (`delivered`,
    /// `retried` or `failed`: [`WEBHOOK_DELIVERIES`]).
    pub fn webhook_attempted(&self, outcome: &'static str) {
        self.webhook_deliveries
            .add(1, &[KeyValue::new("redrive.outcome", outcome)]);
    }
}

/// The source gauges and [`PLANS_STALLED`]; remembers which series it
/// recorded, so that a series whose source or class is gone drops to 0.
#[derive(Debug, Clone)]
struct SourceGauges {
    depth: Gauge<u64>,
    stored: Gauge<u64>,
    open: Gauge<u64>,
    arrivals: Gauge<f64>,
    oldest_open_age: Gauge<f64>,
    stalled: Gauge<u64>,
    /// (source, reason class) series of `open`, and sources, recorded last.
    seen: std::sync::Arc<std::sync::Mutex<SeenSeries>>,
}

/// The series [`SourceGauges`] recorded at its last count.
#[derive(Debug, Default)]
struct SeenSeries {
    classes: std::collections::BTreeSet<(String, String)>,
    sources: std::collections::BTreeSet<String>,
}

impl PlannerMetrics {
    /// The capture queues, at start: their `captured` and `redead`
    /// counters and `leases.expired` start at 0, so that the first increase
    /// after a start is an increase to Prometheus (`increase()` of a series
    /// that appears at 1 is 0).
    pub fn capture_queues_known(&self, queues: &[String]) {
        for queue in queues {
            let source = [KeyValue::new("redrive.source", queue.clone())];
            self.captured.add(0, &source);
            self.redead.add(0, &source);
        }
        self.leases_expired.add(0, &[]);
    }

    /// Each capture queue's `depths` as capture last read them (`None`: not
    /// read yet, left out).
    pub fn depths_read(&self, depths: &[(String, Option<u64>)]) {
        for (queue, depth) in depths {
            if let Some(depth) = depth {
                self.sources
                    .depth
                    .record(*depth, &[KeyValue::new("redrive.source", queue.clone())]);
            }
        }
    }

    /// One count of the plans publishing without progress
    /// ([`PLANS_STALLED`]).
    pub fn stalled_counted(&self, stalled: u64) {
        self.sources.stalled.record(stalled, &[]);
    }

    /// One count of the sources: `readings` per source and reason class
    /// (`crate::store::sources::SourceReading`), with `now` for the oldest
    /// open age. Series absent from this count but recorded before are set
    /// to 0.
    pub fn sources_counted(
        &self,
        readings: &[crate::store::sources::SourceReading],
        now: chrono::DateTime<chrono::Utc>,
    ) {
        let gauges = &self.sources;
        let mut per_source: std::collections::BTreeMap<
            &str,
            (u64, u64, Option<chrono::DateTime<chrono::Utc>>),
        > = std::collections::BTreeMap::new();
        let mut classes = std::collections::BTreeSet::new();
        for reading in readings {
            let entry = per_source.entry(reading.source.as_str()).or_default();
            entry.0 += reading.stored;
            entry.1 += reading.recent;
            entry.2 = match (entry.2, reading.oldest_open) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            gauges.open.record(
                reading.open,
                &[
                    KeyValue::new("redrive.source", reading.source.clone()),
                    KeyValue::new("redrive.reason_class", reading.reason_class.clone()),
                ],
            );
            classes.insert((reading.source.clone(), reading.reason_class.clone()));
        }
        for (source, (stored, recent, oldest_open)) in &per_source {
            let attributes = [KeyValue::new("redrive.source", (*source).to_owned())];
            gauges.stored.record(*stored, &attributes);
            gauges
                .arrivals
                .record(recent_per_second(*recent), &attributes);
            let age = oldest_open.map_or(0.0, |oldest| {
                (now - oldest).to_std().unwrap_or_default().as_secs_f64()
            });
            gauges.oldest_open_age.record(age, &attributes);
        }
        let sources: std::collections::BTreeSet<String> = per_source
            .keys()
            .map(|source| (*source).to_owned())
            .collect();
        let Ok(mut seen) = gauges.seen.lock() else {
            return;
        };
        for (source, class) in seen.classes.difference(&classes) {
            gauges.open.record(
                0,
                &[
                    KeyValue::new("redrive.source", source.clone()),
                    KeyValue::new("redrive.reason_class", class.clone()),
                ],
            );
        }
        for source in seen.sources.difference(&sources) {
            let attributes = [KeyValue::new("redrive.source", source.clone())];
            gauges.stored.record(0, &attributes);
            gauges.arrivals.record(0.0, &attributes);
            gauges.oldest_open_age.record(0.0, &attributes);
        }
        *seen = SeenSeries { classes, sources };
    }
}

/// Arrivals per second of `recent` dead letters stored in the last
/// [`crate::store::sources::ARRIVALS_WINDOW_SECONDS`].
fn recent_per_second(recent: u64) -> f64 {
    recent as f64 / f64::from(crate::store::sources::ARRIVALS_WINDOW_SECONDS)
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::{SOURCES_COUNT_INTERVAL, SOURCES_COUNT_MAX_SPACING, next_sources_count};

    #[test]
    fn a_long_source_count_spaces_the_next_by_fifty_times_its_duration() {
        let started = Instant::now();
        for (took, after) in [
            (Duration::ZERO, SOURCES_COUNT_INTERVAL),
            (Duration::from_millis(100), SOURCES_COUNT_INTERVAL),
            (Duration::from_millis(200), SOURCES_COUNT_INTERVAL),
            (Duration::from_millis(201), Duration::from_millis(10_050)),
            (Duration::from_millis(1100), Duration::from_secs(55)),
            (Duration::from_millis(2400), SOURCES_COUNT_MAX_SPACING),
            (Duration::from_secs(30), SOURCES_COUNT_MAX_SPACING),
        ] {
            assert_eq!(
                next_sources_count(started, took) - started,
                after,
                "a count of {took:?}"
            );
        }
    }
}
