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
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_fields_are_named() {
        let error = Selector::try_from(v1::Selector {
            reasons: vec!["exploded".into()],
            ..Default::default()
        })
        .unwrap_err();
        assert!(error.to_string().contains("selector.reasons"), "{error}");
        let error = Selector::try_from(v1::Selector {
            died_from: Some(prost_types::Timestamp {
                seconds: 10,
                nanos: 0,
            }),
            died_to: Some(prost_types::Timestamp {
                seconds: 5,
                nanos: 0,
            }),
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
