//! The planner's precheck policy (docs/replay.md, "Precheck" → "The planner's policy"):
//! staleness rules and precheck defaults set on the planner
//! (`--stale-after`, `--stale-after-source`, `--default-stale-after`,
//! `--replay-key-window`, `--max-redrives`, `--event-time-pointer`), the floor
//! under every precheck and every single replay, whatever the caller sends.
//!
//! # Merge rule
//! A request's options may make the policy stricter freely: its rules are
//! added, and where the policy and the request both give a deadline the
//! shorter applies (the effective deadline of any dead letter is the shorter
//! of the two), the longer replay-key window and the lower `max_redrives`
//! apply. A looser value, judged rule by rule against what the policy gives in
//! that rule's own scope (a longer maximum age for a pattern or the default, a
//! shorter replay-key window, more redrives, another event time pointer than
//! the policy's), is refused with `INVALID_ARGUMENT` naming the field unless
//! the request sets `override_policy` with an `override_reason`. With the
//! override, each looser value replaces the policy's in its place (the same
//! pattern, the default, the window, ...) and the policy's other rules still
//! apply; the override and what it loosened are recorded in the precheck's
//! report.
//!
//! A dead letter's deadline is the shorter of its event type's (the most
//! specific matching event type pattern, else the default) and its source's
//! (the most specific matching source pattern). The two dimensions are
//! independent, so the merge is exact: without an override, the merged
//! options give every dead letter the shorter of the policy's and the
//! request's deadline, never a longer one than the policy's.

use std::time::Duration;

use redrive_proto::v1;

use crate::{
    error::Error,
    precheck::options::{PrecheckOptions, sort_rules},
    precheck::state_check::Pattern,
};

/// The planner's policy: the floor of every precheck's options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// Event type pattern → maximum age (`--stale-after`).
    pub stale_after: Vec<(Pattern, Duration)>,
    /// Source pattern → maximum age (`--stale-after-source`).
    pub stale_after_source: Vec<(Pattern, Duration)>,
    /// Maximum age of event types no pattern matches (`--default-stale-after`).
    pub default_stale_after: Option<Duration>,
    /// Earlier replays within this window make a key already_replayed
    /// (`--replay-key-window`; a request may lengthen it).
    pub replay_key_window: Duration,
    /// Re-dead-letters after which a key is looping (`--max-redrives`; a
    /// request may lower it).
    pub max_redrives: u32,
    /// JSON pointer to the event time in the body (`--event-time-pointer`).
    pub event_time_pointer: Option<String>,
}

impl Default for Policy {
    /// No staleness rule, a 7-day replay-key window, 3 redrives, no event time
    /// pointer: what a precheck without options had before policies.
    fn default() -> Self {
        // The same defaults a precheck's options have.
        let options = PrecheckOptions::default();
        Self {
            stale_after: options.stale_after,
            stale_after_source: options.stale_after_source,
            default_stale_after: options.default_stale_after,
            replay_key_window: options.replay_key_window,
            max_redrives: options.max_redrives,
            event_time_pointer: options.event_time_pointer,
        }
    }
}

/// A request's options merged with the policy.
#[derive(Debug, Clone, PartialEq)]
pub struct Effective {
    /// What the precheck runs with (and its report shows).
    pub options: PrecheckOptions,
    /// With an override: each value looser than the policy, as
    /// `field: value (policy: value)`. Empty without an override.
    pub loosened: Vec<String>,
}

/// Pattern → maximum age rules.
type Rules = Vec<(Pattern, Duration)>;

/// One request value looser than the policy.
struct Loose {
    field: String,
    what: String,
}

/// The maximum age of the most specific rule covering all of `scope`.
fn covering(rules: &[(Pattern, Duration)], scope: &Pattern) -> Option<Duration> {
    rules
        .iter()
        .filter(|(pattern, _)| pattern.covers(scope))
        .max_by_key(|(pattern, _)| pattern.specificity())
        .map(|(_, age)| *age)
}

fn shorter(a: Option<Duration>, b: Option<Duration>) -> Option<Duration> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

fn text(duration: Duration) -> String {
    humantime::format_duration(duration).to_string()
}

/// Rules from `floor` and `extra` (with their defaults), each pattern of either
/// with the shorter of the two deadlines in its scope.
fn merge_rules(
    floor: &[(Pattern, Duration)],
    floor_default: Option<Duration>,
    extra: &[(Pattern, Duration)],
    extra_default: Option<Duration>,
) -> Vec<(Pattern, Duration)> {
    let mut patterns: Vec<&Pattern> = floor.iter().chain(extra).map(|(p, _)| p).collect();
    patterns.sort_by(|a, b| a.as_str().cmp(b.as_str()));
    patterns.dedup();
    patterns
        .into_iter()
        .filter_map(|pattern| {
            shorter(
                covering(floor, pattern).or(floor_default),
                covering(extra, pattern).or(extra_default),
            )
            .map(|age| (pattern.clone(), age))
        })
        .collect()
}

/// Puts each rule of `over` in place of the rule of the same pattern.
fn overlay(rules: &mut Vec<(Pattern, Duration)>, over: Vec<(Pattern, Duration)>) {
    for (pattern, age) in over {
        match rules.iter_mut().find(|(existing, _)| *existing == pattern) {
            Some(rule) => rule.1 = age,
            None => rules.push((pattern, age)),
        }
    }
}

/// Splits `rules` into those within `floor` (its deadline in their scope, or
/// `floor_default` where no floor pattern covers them) and the looser ones.
fn split_rules(
    field: &str,
    what: &str,
    rules: &[(Pattern, Duration)],
    floor: &[(Pattern, Duration)],
    floor_default: Option<Duration>,
    loose: &mut Vec<Loose>,
) -> (Rules, Rules) {
    let (mut within, mut looser) = (Vec::new(), Vec::new());
    for (pattern, age) in rules {
        match covering(floor, pattern)
            .or(floor_default)
            .filter(|limit| age > limit)
        {
            Some(limit) => {
                loose.push(Loose {
                    field: format!("{field}[{:?}]", pattern.as_str()),
                    what: format!(
                        "{} for {what} {} is longer than the planner's policy there ({})",
                        text(*age),
                        pattern.as_str(),
                        text(limit)
                    ),
                });
                looser.push((pattern.clone(), *age));
            }
            None => within.push((pattern.clone(), *age)),
        }
    }
    (within, looser)
}

impl Policy {
    /// Sorts the rules most specific first (call after filling them in).
    pub fn sorted(mut self) -> Self {
        sort_rules(&mut self.stale_after);
        sort_rules(&mut self.stale_after_source);
        self
    }

    /// Whether any staleness rule is set.
    fn has_deadlines(&self) -> bool {
        !self.stale_after.is_empty()
            || !self.stale_after_source.is_empty()
            || self.default_stale_after.is_some()
    }

    /// Merges a request's options with the policy (module docs).
    ///
    /// # Errors
    /// `InvalidArgument` naming the field: the option problems of
    /// [`PrecheckOptions::try_from`], `options.override_reason` missing with
    /// `override_policy`, or the first value looser than the policy when
    /// `override_policy` is not set (the message lists the others).
    pub fn apply(&self, request: v1::PrecheckOptions) -> Result<Effective, Error> {
        let window_given = request.replay_key_window.is_some();
        let redrives_given = request.max_redrives != 0;
        let requested = PrecheckOptions::try_from(request)?;
        let mut loose = Vec::new();

        let (types, loose_types) = split_rules(
            "options.stale_after",
            "event type",
            &requested.stale_after,
            &self.stale_after,
            self.default_stale_after,
            &mut loose,
        );
        let (default, loose_default) =
            self.default_deadline(requested.default_stale_after, &mut loose);
        let (sources, loose_sources) = split_rules(
            "options.stale_after_source",
            "source",
            &requested.stale_after_source,
            &self.stale_after_source,
            None,
            &mut loose,
        );
        let replay_key_window = if window_given {
            self.check_window(requested.replay_key_window, &mut loose)
        } else {
            self.replay_key_window
        };
        let max_redrives = if redrives_given {
            self.check_redrives(requested.max_redrives, &mut loose)
        } else {
            self.max_redrives
        };
        let event_time_pointer =
            self.event_time_pointer(requested.event_time_pointer.as_ref(), &mut loose);

        if requested.policy_override.is_none()
            && let Some(refusal) = refusal(&loose)
        {
            return Err(refusal);
        }

        let mut stale_after =
            merge_rules(&self.stale_after, self.default_stale_after, &types, default);
        overlay(&mut stale_after, loose_types);
        sort_rules(&mut stale_after);
        let mut stale_after_source = merge_rules(&self.stale_after_source, None, &sources, None);
        overlay(&mut stale_after_source, loose_sources);
        sort_rules(&mut stale_after_source);
        Ok(Effective {
            options: PrecheckOptions {
                stale_after,
                stale_after_source,
                default_stale_after: loose_default
                    .or_else(|| shorter(self.default_stale_after, default)),
                replay_key_window,
                max_redrives,
                event_time_pointer,
                ..requested
            },
            loosened: loose
                .into_iter()
                .map(|loose| format!("{}: {}", loose.field, loose.what))
                .collect(),
        })
    }

    /// The request's default deadline `asked` against the policy's:
    /// `(within, looser)`, the looser one named in `loose`.
    fn default_deadline(
        &self,
        asked: Option<Duration>,
        loose: &mut Vec<Loose>,
    ) -> (Option<Duration>, Option<Duration>) {
        match (asked, self.default_stale_after) {
            (Some(asked), Some(limit)) if asked > limit => {
                loose.push(Loose {
                    field: "options.default_stale_after".to_owned(),
                    what: format!(
                        "{} is longer than the planner's default ({})",
                        text(asked),
                        text(limit)
                    ),
                });
                (None, Some(asked))
            }
            (asked, _) => (asked, None),
        }
    }

    /// The requested replay-key window `asked`; one shorter than the
    /// policy's is named in `loose`.
    fn check_window(&self, asked: Duration, loose: &mut Vec<Loose>) -> Duration {
        if asked < self.replay_key_window {
            loose.push(Loose {
                field: "options.replay_key_window".to_owned(),
                what: format!(
                    "{} is shorter than the planner's window ({})",
                    text(asked),
                    text(self.replay_key_window)
                ),
            });
        }
        asked
    }

    /// The requested most redrives `asked`; more than the policy's is named
    /// in `loose`.
    fn check_redrives(&self, asked: u32, loose: &mut Vec<Loose>) -> u32 {
        if asked > self.max_redrives {
            loose.push(Loose {
                field: "options.max_redrives".to_owned(),
                what: format!("{} is more than the planner's {}", asked, self.max_redrives),
            });
        }
        asked
    }

    /// The event-time pointer: the requested one, else the policy's; one
    /// other than the policy's while the policy has deadlines (they count
    /// from it) is named in `loose`.
    fn event_time_pointer(&self, asked: Option<&String>, loose: &mut Vec<Loose>) -> Option<String> {
        match (asked, &self.event_time_pointer) {
            (Some(asked), Some(policy)) if asked != policy && self.has_deadlines() => {
                loose.push(Loose {
                    field: "options.event_time_pointer".to_owned(),
                    what: format!(
                        "{asked} is not the planner's {policy}: the policy's deadlines count from it"
                    ),
                });
                Some(asked.clone())
            }
            (asked, policy) => asked.cloned().or_else(|| policy.clone()),
        }
    }
}

/// The refusal of options looser than the policy without an override:
/// `InvalidArgument` naming the first looser field, the others listed
/// (`None`: nothing is looser).
fn refusal(loose: &[Loose]) -> Option<Error> {
    let (first, others) = loose.split_first()?;
    let others = others
        .iter()
        .map(|other| other.field.as_str())
        .collect::<Vec<_>>();
    let also = if others.is_empty() {
        String::new()
    } else {
        format!(" (also looser: {})", others.join(", "))
    };
    Some(Error::invalid(
        &first.field,
        format!(
            "{}{also}; loosening the planner's policy needs options.override_policy with options.override_reason",
            first.what
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn hours(n: u64) -> Duration {
        Duration::from_secs(n * 3600)
    }

    fn rules(list: &[(&str, u64)]) -> Vec<(Pattern, Duration)> {
        list.iter()
            .map(|(pattern, h)| (Pattern::parse(pattern).unwrap(), hours(*h)))
            .collect()
    }

    fn proto_rules(
        list: &[(&str, u64)],
    ) -> std::collections::BTreeMap<String, prost_types::Duration> {
        list.iter()
            .map(|(pattern, h)| {
                (
                    (*pattern).to_owned(),
                    redrive_proto::time::duration(hours(*h)),
                )
            })
            .collect()
    }

    fn payments_policy() -> Policy {
        Policy {
            stale_after: rules(&[("payment.*", 2)]),
            stale_after_source: rules(&[("orders.dlq", 1)]),
            ..Policy::default()
        }
        .sorted()
    }

    #[test]
    fn without_options_the_policy_is_what_runs() {
        let policy = payments_policy();
        let effective = policy.apply(v1::PrecheckOptions::default()).unwrap();
        assert!(effective.loosened.is_empty());
        let options = effective.options;
        assert_eq!(options.stale_after, policy.stale_after);
        assert_eq!(options.stale_after_source, policy.stale_after_source);
        assert_eq!(
            options.max_age_for(Some("payment.captured"), Some("payments.dlq")),
            Some(hours(2))
        );
        assert_eq!(
            options.max_age_for(Some("payment.captured"), Some("orders.dlq")),
            Some(hours(1))
        );
        assert_eq!(options.max_age_for(Some("order.paid"), Some("x")), None);
        assert_eq!(options.policy_override, None);
        let proto = options.to_proto();
        assert_eq!(
            proto.stale_after.keys().collect::<Vec<_>>(),
            vec!["payment.*"]
        );
        assert!(!proto.override_policy);
    }

    #[test]
    fn stricter_rules_are_added_and_the_shorter_deadline_applies() {
        let policy = payments_policy();
        let options = policy
            .apply(v1::PrecheckOptions {
                stale_after: proto_rules(&[("payment.refunded", 1)]),
                // Longer than nothing the policy says about other types.
                default_stale_after: Some(redrive_proto::time::duration(hours(5))),
                max_redrives: 2,
                replay_key_window: Some(redrive_proto::time::duration(hours(24 * 30))),
                ..Default::default()
            })
            .unwrap()
            .options;
        assert_eq!(options.max_age(Some("payment.refunded")), Some(hours(1)));
        assert_eq!(options.max_age(Some("payment.captured")), Some(hours(2)));
        assert_eq!(options.max_age(Some("order.paid")), Some(hours(5)));
        assert_eq!(options.max_redrives, 2);
        assert_eq!(options.replay_key_window, hours(24 * 30));
    }

    #[test]
    fn a_looser_value_without_override_is_refused_naming_the_field() {
        let policy = Policy {
            default_stale_after: Some(hours(3)),
            event_time_pointer: Some("/at".into()),
            ..payments_policy()
        };
        let refused = |options: v1::PrecheckOptions, field: &str| {
            let error = policy.apply(options).unwrap_err();
            let text = error.to_string();
            assert!(matches!(error, Error::InvalidArgument { .. }), "{text}");
            assert!(text.starts_with(field), "{text} names {field}");
            assert!(text.contains("override_policy"), "{text}");
        };
        // A more specific pattern is looser when it is longer than its scope's deadline.
        refused(
            v1::PrecheckOptions {
                stale_after: proto_rules(&[("payment.captured", 5)]),
                ..Default::default()
            },
            "options.stale_after[\"payment.captured\"]",
        );
        // No pattern covers order.*: the policy's default is its floor.
        refused(
            v1::PrecheckOptions {
                stale_after: proto_rules(&[("order.*", 4)]),
                ..Default::default()
            },
            "options.stale_after[\"order.*\"]",
        );
        refused(
            v1::PrecheckOptions {
                default_stale_after: Some(redrive_proto::time::duration(hours(4))),
                ..Default::default()
            },
            "options.default_stale_after",
        );
        refused(
            v1::PrecheckOptions {
                stale_after_source: proto_rules(&[("orders.dlq", 2)]),
                ..Default::default()
            },
            "options.stale_after_source[\"orders.dlq\"]",
        );
        // A wider source rule is no looser: orders.dlq keeps the policy's hour.
        let wider = policy
            .apply(v1::PrecheckOptions {
                stale_after_source: proto_rules(&[("orders.*", 2)]),
                ..Default::default()
            })
            .unwrap()
            .options;
        assert_eq!(wider.max_age_for(None, Some("orders.dlq")), Some(hours(1)));
        assert_eq!(
            wider.max_age_for(None, Some("orders.retry")),
            Some(hours(2))
        );
        refused(
            v1::PrecheckOptions {
                replay_key_window: Some(redrive_proto::time::duration(hours(1))),
                ..Default::default()
            },
            "options.replay_key_window",
        );
        refused(
            v1::PrecheckOptions {
                max_redrives: 9,
                ..Default::default()
            },
            "options.max_redrives",
        );
        refused(
            v1::PrecheckOptions {
                event_time_pointer: "/other".into(),
                ..Default::default()
            },
            "options.event_time_pointer",
        );
        let error = policy
            .apply(v1::PrecheckOptions {
                override_policy: true,
                override_reason: "  ".into(),
                ..Default::default()
            })
            .unwrap_err();
        assert!(
            error.to_string().starts_with("options.override_reason"),
            "{error}"
        );
    }

    #[test]
    fn an_override_puts_each_looser_value_in_its_place_and_says_so() {
        let policy = Policy {
            stale_after: rules(&[("payment.*", 2), ("payment.refunded", 1)]),
            ..Policy::default()
        }
        .sorted();
        let effective = policy
            .apply(v1::PrecheckOptions {
                stale_after: proto_rules(&[("payment.*", 6)]),
                max_redrives: 5,
                override_policy: true,
                override_reason: "INC-42: the ledger accepts late captures".into(),
                ..Default::default()
            })
            .unwrap();
        let options = &effective.options;
        assert_eq!(options.max_age(Some("payment.captured")), Some(hours(6)));
        // The policy's more specific rule still applies.
        assert_eq!(options.max_age(Some("payment.refunded")), Some(hours(1)));
        assert_eq!(options.max_redrives, 5);
        assert_eq!(
            options.policy_override.as_deref(),
            Some("INC-42: the ledger accepts late captures")
        );
        assert_eq!(effective.loosened.len(), 2, "{:?}", effective.loosened);
        assert!(
            effective.loosened[0].starts_with("options.stale_after[\"payment.*\"]: 6h"),
            "{:?}",
            effective.loosened
        );
        let proto = options.to_proto();
        assert!(proto.override_policy);
        assert_eq!(
            PrecheckOptions::try_from(proto).unwrap(),
            effective.options,
            "the report's options read back as what ran"
        );
    }

    const PATTERNS: &[&str] = &["*", "a*", "ab*", "a", "ab", "abc", "b", "b*"];
    const VALUES: &[&str] = &["a", "ab", "abc", "abd", "b", "c"];

    fn rule_set() -> impl Strategy<Value = Vec<(usize, u64)>> {
        proptest::collection::vec((0..PATTERNS.len(), 1u64..6), 0..4)
    }

    fn to_rules(picked: &[(usize, u64)]) -> Vec<(&'static str, u64)> {
        let mut seen = std::collections::BTreeMap::new();
        for (index, h) in picked {
            seen.insert(PATTERNS[*index], *h);
        }
        seen.into_iter().collect()
    }

    proptest! {
        /// Without an override the merged options give every dead letter
        /// exactly the shorter of the policy's and the request's deadline.
        #[test]
        fn the_merge_is_the_shorter_of_both_deadlines(
            policy_types in rule_set(),
            policy_sources in rule_set(),
            policy_default in proptest::option::of(1u64..6),
            request_types in rule_set(),
            request_sources in rule_set(),
            request_default in proptest::option::of(1u64..6),
        ) {
            let policy = Policy {
                stale_after: rules(&to_rules(&policy_types)),
                stale_after_source: rules(&to_rules(&policy_sources)),
                default_stale_after: policy_default.map(hours),
                ..Policy::default()
            }
            .sorted();
            let request = v1::PrecheckOptions {
                stale_after: proto_rules(&to_rules(&request_types)),
                stale_after_source: proto_rules(&to_rules(&request_sources)),
                default_stale_after: request_default.map(|h| redrive_proto::time::duration(hours(h))),
                ..Default::default()
            };
            let alone = PrecheckOptions::try_from(request.clone()).unwrap();
            let floor = PrecheckOptions {
                stale_after: policy.stale_after.clone(),
                stale_after_source: policy.stale_after_source.clone(),
                default_stale_after: policy.default_stale_after,
                ..PrecheckOptions::default()
            };
            let Ok(effective) = policy.apply(request) else {
                // Looser somewhere: refused, nothing to compare.
                return Ok(());
            };
            for event_type in VALUES.iter().copied().map(Some).chain([None]) {
                for source in VALUES.iter().copied().map(Some) {
                    prop_assert_eq!(
                        effective.options.max_age_for(event_type, source),
                        shorter(
                            floor.max_age_for(event_type, source),
                            alone.max_age_for(event_type, source)
                        ),
                        "event type {:?}, source {:?}", event_type, source
                    );
                }
            }
        }

        /// Whatever a request without an override asks, no dead letter gets a
        /// longer deadline than the policy's.
        #[test]
        fn never_looser_than_the_policy_without_override(
            policy_types in rule_set(),
            policy_default in proptest::option::of(1u64..6),
            request_types in rule_set(),
            request_default in proptest::option::of(1u64..6),
        ) {
            let policy = Policy {
                stale_after: rules(&to_rules(&policy_types)),
                default_stale_after: policy_default.map(hours),
                ..Policy::default()
            }
            .sorted();
            let floor = PrecheckOptions {
                stale_after: policy.stale_after.clone(),
                default_stale_after: policy.default_stale_after,
                ..PrecheckOptions::default()
            };
            let request = v1::PrecheckOptions {
                stale_after: proto_rules(&to_rules(&request_types)),
                default_stale_after: request_default.map(|h| redrive_proto::time::duration(hours(h))),
                ..Default::default()
            };
            if let Ok(effective) = policy.apply(request) {
                for event_type in VALUES.iter().copied().map(Some).chain([None]) {
                    if let Some(limit) = floor.max_age(event_type) {
                        let age = effective.options.max_age(event_type);
                        prop_assert!(age.is_some_and(|age| age <= limit), "{:?}: {:?} over {:?}", event_type, age, limit);
                    }
                }
            }
        }
    }
}
