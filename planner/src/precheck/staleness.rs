//! Which staleness rule a precheck applied, per event type, and the warning for
//! the dead letters no rule covers (docs/replay.md, "Staleness").
//!
//! A zombie revival (docs/design.md, the third classic accident) happens when a
//! dead letter past its business deadline is replayed. A deadline exists only
//! where a rule says so, so the report states, for every event type of the
//! selection, the rule that applied and how old its oldest dead letter is, and
//! warns with the ages when dead letters are covered by none.

use std::{collections::BTreeMap, time::Duration};

use chrono::{DateTime, Utc};
use redrive_proto::{
    time::{age_text, duration},
    v1,
};

use crate::{
    ids::DeadLetterId,
    precheck::options::{
        Deadline, DeadlineRule, EventBody, PrecheckOptions, body_time_implausible, event_time,
    },
};

/// Event types named in the warning before it says "and N more".
const TYPES_NAMED: usize = 5;

/// One row under construction: (event type, rule text) → counts.
#[derive(Debug, Default)]
struct Row {
    max_age: Option<Duration>,
    count: u64,
    stale: u64,
    oldest_age: Duration,
}

/// Dead letters named as examples in a warning.
const EXAMPLES: usize = 5;

/// The staleness coverage of a precheck, added to per dead letter.
#[derive(Debug, Default)]
pub struct Coverage {
    rows: BTreeMap<(String, String), Row>,
    /// Dead letters whose body holds a value at the event time pointer that
    /// is not a plausible time: how many, and the first few.
    implausible: u64,
    implausible_examples: Vec<DeadLetterId>,
}

/// The rule as the operator wrote it (`stale_after payment.*=2h`).
fn rule_text(rule: DeadlineRule<'_>, max_age: Duration) -> String {
    let age = age_text(max_age);
    match rule {
        DeadlineRule::EventType(pattern) => format!("stale_after {}={age}", pattern.as_str()),
        DeadlineRule::Default => format!("default_stale_after {age}"),
        DeadlineRule::Source(pattern) => {
            format!("stale_after_source {}={age}", pattern.as_str())
        }
    }
}

/// What [`Coverage::add`] needs to know of one dead letter.
#[derive(Debug, Clone, Copy)]
pub struct Aged<'a> {
    /// Its id.
    pub id: DeadLetterId,
    /// Its event type.
    pub event_type: Option<&'a str>,
    /// Its body, when the precheck loaded it (for the event time pointer).
    pub body: Option<EventBody<'a>>,
    /// Its `timestamp` property (or ingest field).
    pub occurred_at: Option<DateTime<Utc>>,
    /// When it first died.
    pub first_died_at: DateTime<Utc>,
}

impl Coverage {
    /// Counts one dead letter: under its `deadline` (the rule that applied,
    /// from [`PrecheckOptions::deadline_of`]) or, when `None`, under no rule,
    /// with its age at `now` from its event time.
    pub fn add(
        &mut self,
        options: &PrecheckOptions,
        dead_letter: Aged<'_>,
        deadline: Option<&Deadline<'_>>,
        stale: bool,
        now: DateTime<Utc>,
    ) {
        let (rule, max_age, at, basis) = match deadline {
            Some(deadline) => (
                rule_text(deadline.rule, deadline.max_age),
                Some(deadline.max_age),
                deadline.event_time,
                deadline.basis,
            ),
            None => {
                let (at, basis) = event_time(
                    options,
                    dead_letter.body,
                    dead_letter.occurred_at,
                    dead_letter.first_died_at,
                );
                (String::new(), None, at, basis)
            }
        };
        if body_time_implausible(basis) {
            self.implausible += 1;
            if self.implausible_examples.len() < EXAMPLES {
                self.implausible_examples.push(dead_letter.id);
            }
        }
        let age = (now - at).to_std().unwrap_or_default();
        let row = self
            .rows
            .entry((dead_letter.event_type.unwrap_or_default().to_owned(), rule))
            .or_default();
        row.max_age = max_age;
        row.count += 1;
        row.stale += u64::from(stale);
        row.oldest_age = row.oldest_age.max(age);
    }

    /// The report's rows, in event type order.
    pub fn rows(&self) -> Vec<v1::StalenessCoverage> {
        self.rows
            .iter()
            .map(|((event_type, rule), row)| v1::StalenessCoverage {
                event_type: event_type.clone(),
                rule: rule.clone(),
                max_age: row.max_age.map(duration),
                count: row.count,
                stale: row.stale,
                oldest_age: Some(duration(row.oldest_age)),
            })
            .collect()
    }

    /// The warning for the dead letters whose body has a value at the event
    /// time pointer that is not a plausible time (`"last week"`, `99`): their
    /// age counts from the event time at capture or their first death
    /// instead. `None` when there are none.
    pub fn implausible_warning(&self, pointer: Option<&str>) -> Option<String> {
        if self.implausible == 0 {
            return None;
        }
        let examples: Vec<String> = self
            .implausible_examples
            .iter()
            .map(ToString::to_string)
            .collect();
        Some(format!(
            "{} dead letters have a value at the event time pointer {} that is not a plausible time, or is after the message's first death (for example dead letters {}): their age counts from the event time at capture, else their first death, instead (see each one's body with redrivectl dead-letters show ID)",
            self.implausible,
            pointer.unwrap_or("-"),
            examples.join(", ")
        ))
    }

    /// The warning for the dead letters no rule covers, with their event types
    /// and ages, the oldest first (each age said once); `None` when every
    /// one is covered.
    pub fn warning(&self) -> Option<String> {
        let mut uncovered: Vec<(&str, &Row)> = self
            .rows
            .iter()
            .filter(|((_, rule), _)| rule.is_empty())
            .map(|((event_type, _), row)| (event_type.as_str(), row))
            .collect();
        if uncovered.is_empty() {
            return None;
        }
        // Stable: equal ages keep event type order.
        uncovered.sort_by_key(|(_, row)| std::cmp::Reverse(row.oldest_age));
        let count: u64 = uncovered.iter().map(|(_, row)| row.count).sum();
        let mut types: Vec<String> = uncovered
            .iter()
            .take(TYPES_NAMED)
            .map(|(event_type, row)| {
                format!(
                    "{} ({}, oldest {})",
                    type_name(event_type),
                    row.count,
                    age_text(row.oldest_age)
                )
            })
            .collect();
        if uncovered.len() > TYPES_NAMED {
            types.push(format!("and {} more", uncovered.len() - TYPES_NAMED));
        }
        let (letters, none_can) = if count == 1 {
            ("dead letter", "it cannot")
        } else {
            ("dead letters", "none of them can")
        };
        Some(format!(
            "no staleness rule covers {count} {letters}, so {none_can} turn stale however old: {}. Set a deadline in the planner's policy (--stale-after TYPE=AGE, --default-stale-after AGE), which every precheck and single replay then applies, or on this precheck (--stale-after)",
            types.join(", "),
        ))
    }
}

fn type_name(event_type: &str) -> &str {
    if event_type.is_empty() {
        "no event type"
    } else {
        event_type
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(rules: &[(&str, u64)], default: Option<u64>) -> PrecheckOptions {
        let request = v1::PrecheckOptions {
            stale_after: rules
                .iter()
                .map(|(pattern, seconds)| {
                    (
                        (*pattern).to_owned(),
                        duration(Duration::from_secs(*seconds)),
                    )
                })
                .collect(),
            default_stale_after: default.map(|seconds| duration(Duration::from_secs(seconds))),
            ..Default::default()
        };
        PrecheckOptions::try_from(request).unwrap()
    }

    fn aged(event_type: Option<&str>, hours_ago: i64, now: DateTime<Utc>) -> Aged<'_> {
        Aged {
            id: DeadLetterId::new(1),
            event_type,
            body: None,
            occurred_at: Some(now - chrono::Duration::hours(hours_ago)),
            first_died_at: now,
        }
    }

    fn add(coverage: &mut Coverage, options: &PrecheckOptions, dead_letter: Aged<'_>) {
        let deadline = options.deadline_of(
            dead_letter.event_type,
            "orders.dlq",
            None,
            dead_letter.occurred_at,
            dead_letter.first_died_at,
        );
        let now = Utc::now();
        let stale = deadline
            .as_ref()
            .is_some_and(|deadline| deadline.at().is_some_and(|at| at < now));
        coverage.add(options, dead_letter, deadline.as_ref(), stale, now);
    }

    #[test]
    fn every_event_type_names_its_rule_and_the_uncovered_ones_are_warned_of_with_ages() {
        let now = Utc::now();
        let options = options(&[("payment.*", 7200)], None);
        let mut coverage = Coverage::default();
        add(
            &mut coverage,
            &options,
            aged(Some("payment.captured"), 3, now),
        );
        add(
            &mut coverage,
            &options,
            aged(Some("payment.captured"), 1, now),
        );
        add(
            &mut coverage,
            &options,
            aged(Some("order.created"), 72, now),
        );
        add(&mut coverage, &options, aged(None, 5, now));
        let rows = coverage.rows();
        let row = |event_type: &str| {
            rows.iter()
                .find(|row| row.event_type == event_type)
                .unwrap()
                .clone()
        };
        let payment = row("payment.captured");
        assert_eq!(payment.rule, "stale_after payment.*=2h0m");
        assert_eq!((payment.count, payment.stale), (2, 1));
        assert_eq!(payment.oldest_age.unwrap().seconds / 3600, 3);
        let order = row("order.created");
        assert_eq!(order.rule, "");
        assert_eq!(order.max_age, None);
        let warning = coverage.warning().unwrap();
        assert!(
            warning.contains("no staleness rule covers 2 dead letters"),
            "{warning}"
        );
        assert!(
            warning.contains("order.created (1, oldest 3d0h)"),
            "{warning}"
        );
        assert!(
            warning.contains("no event type (1, oldest 5h0m)"),
            "{warning}"
        );
        assert!(
            warning.contains(
                "however old: order.created (1, oldest 3d0h), no event type (1, oldest 5h0m). Set"
            ),
            "the oldest first, each age once: {warning}"
        );
        assert!(!warning.contains("payment"), "{warning}");
    }

    #[test]
    fn a_body_time_that_is_not_a_time_is_warned_of_with_the_dead_letters() {
        let now = Utc::now();
        let mut request = v1::PrecheckOptions {
            event_time_pointer: "/at".into(),
            ..Default::default()
        };
        request.default_stale_after = Some(duration(Duration::from_secs(86_400)));
        let options = PrecheckOptions::try_from(request).unwrap();
        let mut coverage = Coverage::default();
        for (id, body) in [
            (7, br#"{"at":"last week"}"#.as_slice()),
            (8, br#"{"at":99}"#.as_slice()),
            (9, br#"{"at":"2026-12-01T00:00:00Z"}"#.as_slice()),
            (10, br#"{"other":1}"#.as_slice()),
        ] {
            let dead_letter = Aged {
                id: DeadLetterId::new(id),
                body: Some(EventBody {
                    bytes: body,
                    declared_encoding: None,
                }),
                ..aged(Some("order.created"), 1, now)
            };
            let deadline = options.deadline_of(
                dead_letter.event_type,
                "orders.dlq",
                dead_letter.body,
                dead_letter.occurred_at,
                dead_letter.first_died_at,
            );
            coverage.add(&options, dead_letter, deadline.as_ref(), false, now);
        }
        let warning = coverage.implausible_warning(Some("/at")).unwrap();
        assert!(
            warning.starts_with(
                "2 dead letters have a value at the event time pointer /at that is not a plausible time, or is after the message's first death (for example dead letters 7, 8)"
            ),
            "{warning}"
        );
        assert_eq!(Coverage::default().implausible_warning(Some("/at")), None);
    }

    #[test]
    fn a_default_deadline_covers_everything_and_nothing_is_warned_of() {
        let now = Utc::now();
        let options = options(&[("payment.*", 7200)], Some(86_400));
        let mut coverage = Coverage::default();
        add(
            &mut coverage,
            &options,
            aged(Some("order.created"), 72, now),
        );
        add(&mut coverage, &options, aged(None, 1, now));
        assert_eq!(coverage.warning(), None);
        let rows = coverage.rows();
        assert!(
            rows.iter()
                .all(|row| row.rule == "default_stale_after 1d0h"),
            "{rows:?}"
        );
        assert_eq!(rows.iter().map(|row| row.stale).sum::<u64>(), 1);
    }
}
