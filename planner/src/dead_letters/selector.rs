//! The selector: which dead letters a call covers (docs/design.md, "selector"),
//! validated at the edge.

use chrono::{DateTime, Utc};
use redrive_proto::{limits::MAX_SELECTOR_LIMIT, time::from_timestamp, v1};

use crate::error::Error;

/// Raw death reasons a selector may name besides the reason classes.
const RAW_REASONS: &[&str] = &["rejected", "expired", "maxlen", "delivery_limit"];

/// A validated selector. Empty lists match everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selector {
    /// Source names.
    pub sources: Vec<String>,
    /// Reason classes or raw death reasons.
    pub reasons: Vec<String>,
    /// Destinations.
    pub destinations: Vec<String>,
    /// Event types.
    pub event_types: Vec<String>,
    /// Schema versions.
    pub schema_versions: Vec<String>,
    /// Producers.
    pub producers: Vec<String>,
    /// Inclusive lower bound on `died_at`.
    pub died_from: Option<DateTime<Utc>>,
    /// Exclusive upper bound on `died_at`.
    pub died_to: Option<DateTime<Utc>>,
    /// At most this many dead letters, first captured first.
    pub limit: Option<u64>,
    /// Only these dead letter ids (empty: any).
    pub ids: Vec<crate::ids::DeadLetterId>,
    /// Which dead letters by status (default: not archived).
    pub status: Status,
    /// Only error texts containing this, case-insensitively.
    pub error_contains: Option<String>,
    /// Only these error fingerprints (`error_group`), exactly.
    pub error_groups: Vec<String>,
    /// Only bodies with all these values.
    pub body_matches: Vec<BodyMatch>,
}

/// A selector's status filter (`Selector.status`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Status {
    /// Open and replayed: everything not archived (`UNSPECIFIED`).
    #[default]
    NotArchived,
    /// Neither archived nor replayed.
    Open,
    /// Archived.
    Archived,
    /// Not archived, sent by a plan.
    Replayed,
    /// Every dead letter.
    All,
}

impl Status {
    /// The filter of `status`; `None` for a number no value has.
    pub fn from_proto(status: i32) -> Option<Self> {
        use v1::DeadLetterStatus as S;
        Some(match S::try_from(status).ok()? {
            S::Unspecified => Self::NotArchived,
            S::Open => Self::Open,
            S::Archived => Self::Archived,
            S::Replayed => Self::Replayed,
            S::All => Self::All,
        })
    }
}

/// A body value a selector requires (`Selector.body_matches`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BodyMatch {
    /// The pointer as given (for messages).
    pub pointer: String,
    /// Its reference tokens, unescaped: the jsonb path.
    pub path: Vec<String>,
    /// The value required there.
    pub value: String,
}

/// The reference tokens of RFC 6901 JSON pointer `pointer`, unescaped (`~1`
/// is `/`, `~0` is `~`); "" (the whole document) has none.
///
/// # Errors
/// What is wrong: no leading `/`, or a `~` not followed by `0` or `1`.
pub fn pointer_tokens(pointer: &str) -> Result<Vec<String>, String> {
    if pointer.is_empty() {
        return Ok(Vec::new());
    }
    let Some(rest) = pointer.strip_prefix('/') else {
        return Err(format!(
            "{pointer:?} is not a JSON pointer: a pointer starts with '/' (RFC 6901), e.g. /order/id"
        ));
    };
    rest.split('/')
        .map(|token| {
            let mut unescaped = String::with_capacity(token.len());
            let mut chars = token.chars();
            while let Some(c) = chars.next() {
                if c != '~' {
                    unescaped.push(c);
                    continue;
                }
                match chars.next() {
                    Some('0') => unescaped.push('~'),
                    Some('1') => unescaped.push('/'),
                    _ => {
                        return Err(format!(
                            "{pointer:?} is not a JSON pointer: '~' must be followed by 0 or 1 \
                             (~0 is '~', ~1 is '/'; RFC 6901)"
                        ));
                    }
                }
            }
            Ok(unescaped)
        })
        .collect()
}

fn non_empty(field: &str, values: Vec<String>) -> Result<Vec<String>, Error> {
    if let Some(position) = values.iter().position(|value| value.trim().is_empty()) {
        return Err(Error::invalid(
            format!("{field}[{position}]"),
            "must not be empty",
        ));
    }
    Ok(values)
}

impl TryFrom<v1::Selector> for Selector {
    type Error = Error;

    fn try_from(selector: v1::Selector) -> Result<Self, Error> {
        let reasons = non_empty("selector.reasons", selector.reasons)?;
        if let Some(bad) = reasons.iter().find(|reason| {
            v1::ReasonClass::from_name(reason).is_none() && !RAW_REASONS.contains(&reason.as_str())
        }) {
            return Err(Error::invalid(
                "selector.reasons",
                format!(
                    "{bad:?} is neither a reason class (rejected, expired, overflow, exhausted, poison, permanent, unknown) nor a death reason (maxlen, delivery_limit)"
                ),
            ));
        }
        let time = |field: &str, at: Option<prost_types::Timestamp>| -> Result<_, Error> {
            at.map(|at| {
                from_timestamp(&at).ok_or_else(|| {
                    Error::invalid(
                        field,
                        "not a valid timestamp from 0001-01-01 to 9999-12-31 (nanos 0 to 999999999)",
                    )
                })
            })
            .transpose()
        };
        let died_from = time("selector.died_from", selector.died_from)?;
        let died_to = time("selector.died_to", selector.died_to)?;
        if let (Some(from), Some(to)) = (died_from, died_to)
            && from >= to
        {
            return Err(Error::invalid(
                "selector.died_to",
                "must be after selector.died_from",
            ));
        }
        let ids = selector
            .ids
            .iter()
            .enumerate()
            .map(|(index, id)| {
                crate::ids::DeadLetterId::parse(&format!("selector.ids[{index}]"), id.trim())
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            sources: non_empty("selector.sources", selector.sources)?,
            reasons,
            destinations: non_empty("selector.destinations", selector.destinations)?,
            event_types: non_empty("selector.event_types", selector.event_types)?,
            schema_versions: non_empty("selector.schema_versions", selector.schema_versions)?,
            producers: non_empty("selector.producers", selector.producers)?,
            error_groups: non_empty("selector.error_groups", selector.error_groups)?,
            died_from,
            died_to,
            limit: match selector.limit {
                0 => None,
                limit if limit > MAX_SELECTOR_LIMIT => {
                    return Err(Error::invalid(
                        "selector.limit",
                        format!("{limit} is above the limit of {MAX_SELECTOR_LIMIT}"),
                    ));
                }
                limit => Some(limit),
            },
            ids,
            status: Status::from_proto(selector.status).ok_or_else(|| {
                Error::invalid(
                    "selector.status",
                    format!(
                        "{} is not a status (open, archived, replayed, all)",
                        selector.status
                    ),
                )
            })?,
            error_contains: Some(selector.error_contains)
                .filter(|text| !text.is_empty())
                .map(|text| {
                    if text.trim().is_empty() {
                        Err(Error::invalid(
                            "selector.error_contains",
                            "must not be only white space",
                        ))
                    } else {
                        Ok(text)
                    }
                })
                .transpose()?,
            body_matches: selector
                .body_matches
                .into_iter()
                .enumerate()
                .map(|(index, body_match)| {
                    let path = pointer_tokens(&body_match.pointer).map_err(|problem| {
                        Error::invalid(format!("selector.body_matches[{index}].pointer"), problem)
                    })?;
                    Ok(BodyMatch {
                        pointer: body_match.pointer,
                        path,
                        value: body_match.value,
                    })
                })
                .collect::<Result<_, Error>>()?,
        })
    }
}

impl Selector {
    /// Whether nothing narrows it by what the dead letters are (no list,
    /// window, text or body filter); the status and the limit aside: a
    /// limit alone picks the first dead letters by id, whatever they are.
    pub fn is_unfiltered(&self) -> bool {
        self.sources.is_empty()
            && self.reasons.is_empty()
            && self.destinations.is_empty()
            && self.event_types.is_empty()
            && self.schema_versions.is_empty()
            && self.producers.is_empty()
            && self.died_from.is_none()
            && self.died_to.is_none()
            && self.ids.is_empty()
            && self.error_contains.is_none()
            && self.error_groups.is_empty()
            && self.body_matches.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `seconds` after the epoch.
    fn at_second(seconds: i64) -> prost_types::Timestamp {
        prost_types::Timestamp { seconds, nanos: 0 }
    }

    #[test]
    fn bad_fields_are_named() {
        let error = Selector::try_from(v1::Selector {
            reasons: vec!["exploded".into()],
            ..Default::default()
        })
        .unwrap_err();
        assert!(error.to_string().contains("selector.reasons"), "{error}");
        let error = Selector::try_from(v1::Selector {
            died_from: Some(at_second(10)),
            died_to: Some(at_second(5)),
            ..Default::default()
        })
        .unwrap_err();
        assert!(error.to_string().contains("selector.died_to"), "{error}");
        let error = Selector::try_from(v1::Selector {
            sources: vec![" ".into()],
            ..Default::default()
        })
        .unwrap_err();
        assert!(error.to_string().contains("selector.sources[0]"), "{error}");
        let error = Selector::try_from(v1::Selector {
            ids: vec!["12".into(), "+1".into()],
            ..Default::default()
        })
        .unwrap_err();
        assert!(error.to_string().contains("selector.ids[1]"), "{error}");
    }

    #[test]
    fn json_pointers_follow_rfc_6901() {
        assert_eq!(pointer_tokens("").unwrap(), Vec::<String>::new());
        assert_eq!(pointer_tokens("/a/0").unwrap(), ["a", "0"]);
        assert_eq!(pointer_tokens("/a~1b/m~0n").unwrap(), ["a/b", "m~n"]);
        assert_eq!(pointer_tokens("/").unwrap(), [""]);
        assert!(
            pointer_tokens("a/b")
                .unwrap_err()
                .contains("starts with '/'")
        );
        assert!(pointer_tokens("/a~2").unwrap_err().contains("~0 is '~'"));
        assert!(pointer_tokens("/a~").is_err());
        let error = Selector::try_from(v1::Selector {
            body_matches: vec![
                v1::BodyMatch {
                    pointer: "/ok".into(),
                    value: "1".into(),
                },
                v1::BodyMatch {
                    pointer: "order.id".into(),
                    value: "1".into(),
                },
            ],
            ..Default::default()
        })
        .unwrap_err();
        assert!(
            error
                .to_string()
                .contains("selector.body_matches[1].pointer"),
            "{error}"
        );
        let error = Selector::try_from(v1::Selector {
            status: 99,
            ..Default::default()
        })
        .unwrap_err();
        assert!(error.to_string().contains("selector.status"), "{error}");
    }

    #[test]
    fn reason_classes_and_raw_reasons_are_accepted() {
        let selector = Selector::try_from(v1::Selector {
            reasons: vec!["poison".into(), "maxlen".into()],
            limit: 5,
            ..Default::default()
        })
        .unwrap();
        assert_eq!(selector.limit, Some(5));
    }
}
