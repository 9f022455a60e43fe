//! Precheck options: what a precheck runs with (validated from the API's
//! `PrecheckOptions`, merged with the planner's policy), and the one rule for
//! a dead letter's age ([`event_time`]), used at precheck and at send time.
//! A leaf: the precheck and the policy both build on it.

use std::{collections::BTreeMap, time::Duration};

use chrono::{DateTime, Utc};
use redrive_proto::{
    time::{duration, from_duration},
    v1,
};

use crate::{error::Error, precheck::state_check::Pattern};

/// Default replay-key window: 7 days.
pub const DEFAULT_REPLAY_KEY_WINDOW: Duration = Duration::from_secs(7 * 24 * 3600);
/// Default re-dead-letters after which a key is looping.
pub const DEFAULT_MAX_REDRIVES: u32 = 3;
/// Default state-check batch size.
pub const DEFAULT_STATE_CHECK_BATCH: usize = 500;
pub use redrive_proto::limits::MAX_STATE_CHECK_BATCH;
use redrive_proto::limits::{MAX_AGE, MAX_REDRIVES, MAX_STATE_CHECK_TIMEOUT, at_most};
/// Default per-batch hook timeout.
pub const DEFAULT_STATE_CHECK_TIMEOUT: Duration = Duration::from_secs(10);

/// Validated precheck options. Once merged with the planner's policy
/// ([`crate::precheck::policy::Policy::apply`]) these are the effective options a
/// precheck runs with and its report shows.
#[derive(Debug, Clone, PartialEq)]
pub struct PrecheckOptions {
    /// Event type pattern → maximum age, most specific first.
    pub stale_after: Vec<(Pattern, Duration)>,
    /// Source pattern → maximum age, most specific first.
    pub stale_after_source: Vec<(Pattern, Duration)>,
    /// Maximum age when no event type pattern matches.
    pub default_stale_after: Option<Duration>,
    /// Window of earlier replays that make a key already_replayed.
    pub replay_key_window: Duration,
    /// Re-dead-letters after which a key is looping.
    pub max_redrives: u32,
    /// Messages per hook call.
    pub state_check_batch_size: usize,
    /// Per-call hook timeout.
    pub state_check_timeout: Duration,
    /// Mark items of a failing hook blocked_by_state instead of failing.
    pub block_on_state_check_error: bool,
    /// JSON pointer to the original event time in the body.
    pub event_time_pointer: Option<String>,
    /// Why these options override the planner's policy (`override_policy`
    /// with `override_reason`); `None` when they do not.
    pub policy_override: Option<String>,
}

impl Default for PrecheckOptions {
    /// No staleness rule, the default window, redrives and hook settings.
    fn default() -> Self {
        Self {
            stale_after: Vec::new(),
            stale_after_source: Vec::new(),
            default_stale_after: None,
            replay_key_window: DEFAULT_REPLAY_KEY_WINDOW,
            max_redrives: DEFAULT_MAX_REDRIVES,
            state_check_batch_size: DEFAULT_STATE_CHECK_BATCH,
            state_check_timeout: DEFAULT_STATE_CHECK_TIMEOUT,
            block_on_state_check_error: false,
            event_time_pointer: None,
            policy_override: None,
        }
    }
}

/// A duration above zero and at most `max`.
fn positive_duration(
    field: &str,
    value: &prost_types::Duration,
    max: Duration,
) -> Result<Duration, Error> {
    let duration = from_duration(value)
        .filter(|duration| !duration.is_zero())
        .ok_or_else(|| Error::invalid(field, "must be a positive duration"))?;
    at_most(duration, max).map_err(|problem| Error::invalid(field, problem))
}

/// Parses a `pattern → duration` map field (`options.stale_after`,
/// `options.stale_after_source`), most specific pattern first.
fn rules(
    field: &str,
    map: &BTreeMap<String, prost_types::Duration>,
) -> Result<Vec<(Pattern, Duration)>, Error> {
    let mut rules = Vec::with_capacity(map.len());
    for (pattern, max_age) in map {
        let field = format!("{field}[{pattern:?}]");
        let parsed = Pattern::parse(pattern).map_err(|problem| Error::invalid(&field, problem))?;
        rules.push((parsed, positive_duration(&field, max_age, MAX_AGE)?));
    }
    sort_rules(&mut rules);
    Ok(rules)
}

/// Orders rules most specific first (the order lookups rely on).
pub(crate) fn sort_rules(rules: &mut [(Pattern, Duration)]) {
    rules.sort_by(|(a, _), (b, _)| {
        b.specificity()
            .cmp(&a.specificity())
            .then_with(|| a.as_str().cmp(b.as_str()))
    });
}

/// The maximum age of the most specific rule matching `value`.
fn lookup<'a>(rules: &'a [(Pattern, Duration)], value: &str) -> Option<(Duration, &'a Pattern)> {
    rules
        .iter()
        .find(|(pattern, _)| pattern.matches(value))
        .map(|(pattern, age)| (*age, pattern))
}

impl TryFrom<v1::PrecheckOptions> for PrecheckOptions {
    type Error = Error;

    fn try_from(options: v1::PrecheckOptions) -> Result<Self, Error> {
        let stale_after = rules("options.stale_after", &options.stale_after)?;
        let stale_after_source = rules("options.stale_after_source", &options.stale_after_source)?;
        let batch = match options.state_check_batch_size as usize {
            0 => DEFAULT_STATE_CHECK_BATCH,
            size if size > MAX_STATE_CHECK_BATCH => {
                return Err(Error::invalid(
                    "options.state_check_batch_size",
                    format!("at most {MAX_STATE_CHECK_BATCH}"),
                ));
            }
            size => size,
        };
        let pointer = Some(options.event_time_pointer).filter(|pointer| !pointer.is_empty());
        if let Some(pointer) = &pointer
            && !pointer.starts_with('/')
        {
            return Err(Error::invalid(
                "options.event_time_pointer",
                "a JSON pointer starts with '/' (RFC 6901)",
            ));
        }
        let override_reason = options.override_reason.trim();
        let policy_override = match (options.override_policy, override_reason.is_empty()) {
            (true, true) => {
                return Err(Error::invalid(
                    "options.override_reason",
                    "required with options.override_policy: say why the planner's policy is overridden",
                ));
            }
            (true, false) => Some(override_reason.to_owned()),
            (false, true) => None,
            (false, false) => {
                return Err(Error::invalid(
                    "options.override_policy",
                    "options.override_reason is given but override_policy is not set",
                ));
            }
        };
        Ok(Self {
            stale_after,
            stale_after_source,
            default_stale_after: options
                .default_stale_after
                .as_ref()
                .map(|d| positive_duration("options.default_stale_after", d, MAX_AGE))
                .transpose()?,
            replay_key_window: options
                .replay_key_window
                .as_ref()
                .map(|d| positive_duration("options.replay_key_window", d, MAX_AGE))
                .transpose()?
                .unwrap_or(DEFAULT_REPLAY_KEY_WINDOW),
            max_redrives: match options.max_redrives {
                0 => DEFAULT_MAX_REDRIVES,
                redrives if redrives > MAX_REDRIVES => {
                    return Err(Error::invalid(
                        "options.max_redrives",
                        format!("{redrives} is above the limit of {MAX_REDRIVES}"),
                    ));
                }
                redrives => redrives,
            },
            state_check_batch_size: batch,
            state_check_timeout: options
                .state_check_timeout
                .as_ref()
                .map(|d| {
                    positive_duration("options.state_check_timeout", d, MAX_STATE_CHECK_TIMEOUT)
                })
                .transpose()?
                .unwrap_or(DEFAULT_STATE_CHECK_TIMEOUT),
            block_on_state_check_error: options.block_on_state_check_error,
            event_time_pointer: pointer,
            policy_override,
        })
    }
}

/// A stored body as the event time pointer reads it: the captured bytes and
/// the compression the message declares ([`crate::dead_letters::body::declared_encoding`]),
/// so that a raw deflate body labelled `deflate`, which has no magic bytes,
/// is read decoded as capture read it.
#[derive(Debug, Clone, Copy)]
pub struct EventBody<'a> {
    /// The captured bytes (or the latest repair).
    pub bytes: &'a [u8],
    /// The declared encoding, if any.
    pub declared_encoding: Option<&'a str>,
}

/// A dead letter's deadline ([`PrecheckOptions::deadline_of`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadline<'a> {
    /// How old it may be.
    pub max_age: Duration,
    /// Which rule set `max_age`.
    pub rule: DeadlineRule<'a>,
    /// What its age counts from.
    pub event_time: DateTime<Utc>,
    /// What `event_time` is (`event time in the body`, `timestamp property`,
    /// `first death`).
    pub basis: &'static str,
}

impl Deadline<'_> {
    /// When it turns stale; `None` beyond what a timestamp holds.
    pub fn at(&self) -> Option<DateTime<Utc>> {
        self.event_time
            .checked_add_signed(chrono::Duration::from_std(self.max_age).ok()?)
    }
}

/// Where a dead letter's deadline comes from (for the `stale` reason).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeadlineRule<'a> {
    /// A `stale_after` pattern matching its event type.
    EventType(&'a Pattern),
    /// `default_stale_after` (no event type pattern matches).
    Default,
    /// A `stale_after_source` pattern matching its source.
    Source(&'a Pattern),
}

impl PrecheckOptions {
    /// The deadline of `event_type` alone: its most specific `stale_after`
    /// pattern, else `default_stale_after` (source rules are not consulted;
    /// see [`PrecheckOptions::max_age_for`]).
    pub fn max_age(&self, event_type: Option<&str>) -> Option<Duration> {
        event_type
            .and_then(|event_type| lookup(&self.stale_after, event_type))
            .map(|(age, _)| age)
            .or(self.default_stale_after)
    }

    /// The deadline of a dead letter of `event_type` from `source`: the shorter
    /// of its event type's ([`PrecheckOptions::max_age`]) and its source's (the
    /// most specific matching `stale_after_source` pattern), with the rule it
    /// comes from. `None`: it never turns stale.
    pub fn deadline(
        &self,
        event_type: Option<&str>,
        source: Option<&str>,
    ) -> Option<(Duration, DeadlineRule<'_>)> {
        let by_type = match event_type.and_then(|event_type| lookup(&self.stale_after, event_type))
        {
            Some((age, pattern)) => Some((age, DeadlineRule::EventType(pattern))),
            None => self
                .default_stale_after
                .map(|age| (age, DeadlineRule::Default)),
        };
        let by_source = source
            .and_then(|source| lookup(&self.stale_after_source, source))
            .map(|(age, pattern)| (age, DeadlineRule::Source(pattern)));
        match (by_type, by_source) {
            (Some(a), Some(b)) => Some(if b.0 < a.0 { b } else { a }),
            (a, b) => a.or(b),
        }
    }

    /// A dead letter's deadline under these options: the rule that applies
    /// to its event type and source ([`PrecheckOptions::deadline`]) and the
    /// [`event_time`] its age counts from; `None` when no rule applies. The
    /// precheck reads it once per dead letter, for the `stale` verdict and
    /// for the `stale_at` it records (which the executor checks right before
    /// publishing): one rule, decided once.
    pub fn deadline_of(
        &self,
        event_type: Option<&str>,
        source: &str,
        body: Option<EventBody<'_>>,
        occurred_at: Option<DateTime<Utc>>,
        first_died_at: DateTime<Utc>,
    ) -> Option<Deadline<'_>> {
        let (max_age, rule) = self.deadline(event_type, Some(source))?;
        let (event_time, basis) = event_time(self, body, occurred_at, first_died_at);
        Some(Deadline {
            max_age,
            rule,
            event_time,
            basis,
        })
    }

    /// [`PrecheckOptions::deadline`] without the rule.
    pub fn max_age_for(&self, event_type: Option<&str>, source: Option<&str>) -> Option<Duration> {
        self.deadline(event_type, source).map(|(age, _)| age)
    }

    /// The options as a request or report carries them (every default filled
    /// in; maps in pattern order).
    pub fn to_proto(&self) -> v1::PrecheckOptions {
        let map = |rules: &[(Pattern, Duration)]| {
            rules
                .iter()
                .map(|(pattern, age)| (pattern.as_str().to_owned(), duration(*age)))
                .collect()
        };
        v1::PrecheckOptions {
            stale_after: map(&self.stale_after),
            default_stale_after: self.default_stale_after.map(duration),
            replay_key_window: Some(duration(self.replay_key_window)),
            max_redrives: self.max_redrives,
            state_check_batch_size: u32::try_from(self.state_check_batch_size).unwrap_or(u32::MAX),
            state_check_timeout: Some(duration(self.state_check_timeout)),
            block_on_state_check_error: self.block_on_state_check_error,
            event_time_pointer: self.event_time_pointer.clone().unwrap_or_default(),
            stale_after_source: map(&self.stale_after_source),
            override_policy: self.policy_override.is_some(),
            override_reason: self.policy_override.clone().unwrap_or_default(),
        }
    }
}

/// [`event_time`]'s basis when the body's event time is not a plausible time
/// and capture read one.
const AT_CAPTURE_BODY_IMPLAUSIBLE: &str =
    "event time at capture; the event time in the body is not a plausible time";
/// [`event_time`]'s basis when the body's event time is not a plausible time
/// and capture read none.
const FIRST_DEATH_BODY_IMPLAUSIBLE: &str =
    "first death; the event time in the body is not a plausible time";

/// [`event_time`]'s basis when the body's event time is after the
/// message's first death and capture read one.
const AT_CAPTURE_BODY_AFTER_DEATH: &str =
    "event time at capture; the event time in the body is after its first death";
/// [`event_time`]'s basis when the body's event time is after the
/// message's first death and capture read none.
const FIRST_DEATH_BODY_AFTER_DEATH: &str =
    "first death; the event time in the body is after its first death";
/// Why a body's value was not taken as its event time.
enum BodyTimeRefused {
    /// Not a plausible time.
    NotATime,
    /// A time after the message's first death.
    AfterDeath,
}

/// Whether an [`event_time`] basis says the body's event time was there but
/// not taken: not a plausible time, or one after the message's first death
/// (so the age counts from something else).
pub fn body_time_implausible(basis: &str) -> bool {
    [
        AT_CAPTURE_BODY_IMPLAUSIBLE,
        FIRST_DEATH_BODY_IMPLAUSIBLE,
        AT_CAPTURE_BODY_AFTER_DEATH,
        FIRST_DEATH_BODY_AFTER_DEATH,
    ]
    .contains(&basis)
}

/// The time a dead letter's age counts from, and what it is: the event
/// time in the body at the options' `event_time_pointer`, else the
/// `timestamp` property or event-time header as capture read it
/// (`occurred_at`), else its first death. The one rule for staleness, at
/// precheck and at send time. A pointer whose value is not a plausible time
/// ([`crate::dead_letters::event_time`]), or is one after the message's
/// first death ([`crate::dead_letters::event_time::not_after`]), falls back,
/// and the basis says so.
pub fn event_time(
    options: &PrecheckOptions,
    body: Option<EventBody<'_>>,
    occurred_at: Option<DateTime<Utc>>,
    first_died_at: DateTime<Utc>,
) -> (DateTime<Utc>, &'static str) {
    let from_body = options
        .event_time_pointer
        .as_deref()
        .zip(body)
        .and_then(|(pointer, body)| read_event_time_from_body(body, pointer))
        .map(|read| match read {
            Ok(at) => {
                crate::dead_letters::event_time::not_after(at, first_died_at, "its first death")
                    .map_err(|_| BodyTimeRefused::AfterDeath)
            }
            Err(_) => Err(BodyTimeRefused::NotATime),
        });
    match (from_body, occurred_at) {
        (Some(Ok(at)), _) => (at, "event time in the body"),
        (Some(Err(BodyTimeRefused::NotATime)), Some(at)) => (at, AT_CAPTURE_BODY_IMPLAUSIBLE),
        (Some(Err(BodyTimeRefused::NotATime)), None) => {
            (first_died_at, FIRST_DEATH_BODY_IMPLAUSIBLE)
        }
        (Some(Err(BodyTimeRefused::AfterDeath)), Some(at)) => (at, AT_CAPTURE_BODY_AFTER_DEATH),
        (Some(Err(BodyTimeRefused::AfterDeath)), None) => {
            (first_died_at, FIRST_DEATH_BODY_AFTER_DEATH)
        }
        // The `--event-time-header` when it was read, else the `timestamp`
        // property: capture stored whichever it read as `occurred_at`.
        (None, Some(at)) => (at, "event time at capture"),
        (None, None) => (first_died_at, "first death"),
    }
}

/// The original event time named by `pointer` in a JSON body, read by
/// [`crate::dead_letters::event_time::from_json`] (RFC 3339 / ISO 8601 text, or epoch
/// seconds, milliseconds, microseconds or nanoseconds by range). A gzip,
/// zstd, zlib or bzip2 body (by its magic bytes) is read decoded, capped at
/// [`crate::dead_letters::DEFAULT_MAX_BODY_BYTES`].
pub fn event_time_from_body(body: &[u8], pointer: &str) -> Option<DateTime<Utc>> {
    let body = EventBody {
        bytes: body,
        declared_encoding: None,
    };
    read_event_time_from_body(body, pointer)?.ok()
}

/// [`event_time_from_body`]: `None` when the body has no value there (or is
/// not JSON), `Err` when the value is not a plausible time.
pub fn read_event_time_from_body(
    body: EventBody<'_>,
    pointer: &str,
) -> Option<Result<DateTime<Utc>, crate::dead_letters::event_time::Implausible>> {
    let (decoded, _) = crate::dead_letters::body::decode(
        body.bytes,
        body.declared_encoding,
        crate::dead_letters::DEFAULT_MAX_BODY_BYTES,
    )
    .ok()?;
    let json: serde_json::Value = serde_json::from_slice(&decoded).ok()?;
    Some(crate::dead_letters::event_time::from_json(json.pointer(pointer)?).map(|read| read.at))
}
