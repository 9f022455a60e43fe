//! The selector flags (docs/design.md, "selector"), shared by every command that
//! covers a set of dead letters: `dead-letters list`, `dead-letters summary`
//! and `precheck` (which requires at least one `--source`).
//!
//! | flag | selector field |
//! | --- | --- |
//! | `--source Q` (repeatable) | `sources` |
//! | `--reason R` (repeatable) | `reasons`: a reason class (`rejected`, `expired`, `overflow`, `exhausted`, `poison`, `permanent`, `unknown`) or a raw death reason (`maxlen`, `delivery_limit`) |
//! | `--destination D` (repeatable) | `destinations` |
//! | `--event-type T` (repeatable) | `event_types` |
//! | `--schema-version V` (repeatable) | `schema_versions` |
//! | `--producer P` (repeatable) | `producers` |
//! | `--since DUR` | `died_from` = now − DUR (humantime: `90s`, `2h`, `1day 6h`) |
//! | `--from T`, `--to T` | `died_from`, `died_to` (RFC 3339; `[from, to)`); neither goes with `--since` |
//! | `--limit N` | `limit` |
//! | `--id ID` (repeatable) | `ids`: only these dead letters |
//! | `--status S` | `status`: `open`, `archived`, `replayed` or `all` (default: everything not archived) |
//! | `--error-contains TEXT` | `error_contains`: the error text contains TEXT, case-insensitively |
//! | `--error-group FINGERPRINT` (repeatable) | `error_groups`: exactly this error fingerprint, as the `error` summary column and `dead-letters show` print it |
//! | `--body /POINTER=VALUE` (repeatable) | `body_matches`: the JSON body has VALUE at the RFC 6901 pointer (split at the first `=`) |
//!
//! Repeated values of one flag match any of them; different flags all narrow.
//!
//! Unlike the global flags, these have no `REDRIVE_…` environment fallback on
//! purpose: a variable left set in a shell would silently narrow the selection
//! an operator reads and acts on.

use std::time::Duration;

use chrono::{DateTime, Utc};
use clap::Args;
use redrive_proto::{time::timestamp, v1};

/// Reason names a selector accepts: the reason classes, then the raw death
/// reasons that are not also class names.
pub const REASONS: &[&str] = &[
    "rejected",
    "expired",
    "overflow",
    "exhausted",
    "poison",
    "permanent",
    "unknown",
    "unreadable",
    "maxlen",
    "delivery_limit",
];

/// Which dead letters a command covers.
#[derive(Debug, Clone, Default, PartialEq, Eq, Args)]
pub struct SelectorArgs {
    /// Only dead letters from this source (DLQ name or import label); repeatable.
    #[arg(long = "source", value_name = "SOURCE")]
    pub sources: Vec<String>,

    /// Only this reason class or raw death reason; repeatable.
    #[arg(long = "reason", value_name = "REASON", value_parser = clap::builder::PossibleValuesParser::new(REASONS))]
    pub reasons: Vec<String>,

    /// Only dead letters whose default destination is this queue; repeatable.
    #[arg(long = "destination", value_name = "DESTINATION")]
    pub destinations: Vec<String>,

    /// Only this event type; repeatable.
    #[arg(long = "event-type", value_name = "TYPE")]
    pub event_types: Vec<String>,

    /// Only this schema version; repeatable.
    #[arg(long = "schema-version", value_name = "VERSION")]
    pub schema_versions: Vec<String>,

    /// Only this producer; repeatable.
    #[arg(long = "producer", value_name = "PRODUCER")]
    pub producers: Vec<String>,

    /// Only dead letters that died within this long before now (e.g. `2h`, `30m`).
    #[arg(long, value_name = "DURATION", value_parser = crate::args::parse_positive_duration, conflicts_with_all = ["from", "to"])]
    pub since: Option<Duration>,

    /// Only dead letters that died at or after this time (RFC 3339).
    #[arg(long, value_name = "TIME", value_parser = parse_rfc3339)]
    pub from: Option<DateTime<Utc>>,

    /// Only dead letters that died before this time (RFC 3339).
    #[arg(long, value_name = "TIME", value_parser = parse_rfc3339)]
    pub to: Option<DateTime<Utc>>,

    /// At most this many dead letters, first captured first (at least 1;
    /// leave it out for all).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub limit: Option<u64>,

    /// Only this dead letter id; repeatable.
    #[arg(long = "id", value_name = "ID")]
    pub ids: Vec<String>,

    /// Only dead letters with this status: open (neither archived nor
    /// replayed), archived, replayed, or all (default: all but archived).
    #[arg(long, value_name = "STATUS", value_parser = clap::builder::PossibleValuesParser::new(STATUSES))]
    pub status: Option<String>,

    /// Only dead letters whose error text contains TEXT (case-insensitive).
    #[arg(long, value_name = "TEXT", value_parser = parse_error_contains)]
    pub error_contains: Option<String>,

    /// Only dead letters with this error fingerprint, exactly as `dead-letters
    /// summary --group-by error` prints it (e.g. `rejected: Timeout after <n> ms`);
    /// repeatable.
    #[arg(long = "error-group", value_name = "FINGERPRINT")]
    pub error_groups: Vec<String>,

    /// Only dead letters whose JSON body has VALUE at the JSON pointer
    /// (RFC 6901, e.g. `/order/status=paid`); repeatable, all must match. A
    /// body that is not JSON, or is compressed, does not match.
    #[arg(long = "body", value_name = "/POINTER=VALUE", value_parser = parse_body_match)]
    pub body_matches: Vec<BodyArg>,
}

/// One `--body /POINTER=VALUE`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BodyArg {
    /// The JSON pointer, as given.
    pub pointer: String,
    /// The value required there.
    pub value: String,
}

/// `--status` values.
pub const STATUSES: &[&str] = &["open", "archived", "replayed", "all"];

/// Parses `--body /POINTER=VALUE`, split at the first `=` (the planner checks
/// the pointer).
///
/// # Errors
/// A message saying the expected form when there is no `=`.
pub fn parse_body_match(text: &str) -> Result<BodyArg, String> {
    let (pointer, value) = text.split_once('=').ok_or_else(|| {
        format!("{text:?} has no '=': expected /POINTER=VALUE, e.g. /order/status=paid")
    })?;
    Ok(BodyArg {
        pointer: pointer.to_owned(),
        value: value.to_owned(),
    })
}

/// `--error-contains TEXT`, as given (spaces count), unless blank.
///
/// # Errors
/// When blank.
fn parse_error_contains(text: &str) -> Result<String, String> {
    if text.trim().is_empty() {
        return Err("must not be blank: give the text the error should contain".into());
    }
    Ok(text.to_owned())
}

/// The selector status named `name` (one of [`STATUSES`]).
fn status(name: &str) -> v1::DeadLetterStatus {
    match name {
        "open" => v1::DeadLetterStatus::Open,
        "archived" => v1::DeadLetterStatus::Archived,
        "replayed" => v1::DeadLetterStatus::Replayed,
        "all" => v1::DeadLetterStatus::All,
        _ => v1::DeadLetterStatus::Unspecified,
    }
}

/// Parses an RFC 3339 time (`2024-05-01T12:00:00Z`, `2024-05-01T14:00:00+02:00`).
///
/// # Errors
/// A message saying what the expected form is.
pub fn parse_rfc3339(text: &str) -> Result<DateTime<Utc>, String> {
    DateTime::parse_from_rfc3339(text)
        .map(|at| at.with_timezone(&Utc))
        .map_err(|error| {
            // A local time with no offset is the usual slip: say so, and
            // never guess its zone.
            let trimmed = text.trim();
            if chrono::NaiveDateTime::parse_from_str(trimmed, "%Y-%m-%dT%H:%M:%S%.f").is_ok()
                || chrono::NaiveDateTime::parse_from_str(trimmed, "%Y-%m-%d %H:%M:%S%.f").is_ok()
            {
                return format!(
                    "{text:?} has no UTC offset, so its zone is unknown: write {}Z for UTC, or \
                     the offset it was taken in (e.g. +01:00)",
                    trimmed.replace(' ', "T")
                );
            }
            format!("{error}; expected RFC 3339, e.g. 2024-05-01T12:00:00Z")
        })
}

impl SelectorArgs {
    /// The proto selector, with `--since` counted back from `now`.
    pub fn to_selector(&self, now: DateTime<Utc>) -> v1::Selector {
        let since = self.since.map(|since| {
            chrono::Duration::from_std(since)
                .ok()
                .and_then(|since| now.checked_sub_signed(since))
                .unwrap_or(DateTime::<Utc>::MIN_UTC)
        });
        v1::Selector {
            sources: self.sources.clone(),
            reasons: self.reasons.clone(),
            destinations: self.destinations.clone(),
            event_types: self.event_types.clone(),
            schema_versions: self.schema_versions.clone(),
            producers: self.producers.clone(),
            died_from: since.or(self.from).map(timestamp),
            died_to: self.to.map(timestamp),
            limit: self.limit.unwrap_or(0),
            ids: self.ids.clone(),
            status: self.status.as_deref().map_or(0, |name| status(name).into()),
            error_contains: self.error_contains.clone().unwrap_or_default(),
            error_groups: self.error_groups.clone(),
            body_matches: self
                .body_matches
                .iter()
                .map(|body| v1::BodyMatch {
                    pointer: body.pointer.clone(),
                    value: body.value.clone(),
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct Harness {
        #[command(flatten)]
        selector: SelectorArgs,
    }

    fn parse(args: &[&str]) -> Result<SelectorArgs, clap::Error> {
        Harness::try_parse_from(std::iter::once("test").chain(args.iter().copied()))
            .map(|harness| harness.selector)
    }

    fn now() -> DateTime<Utc> {
        parse_rfc3339("2024-05-01T12:00:00Z").unwrap()
    }

    #[test]
    fn no_flags_select_everything() {
        assert_eq!(
            parse(&[]).unwrap().to_selector(now()),
            v1::Selector::default()
        );
    }

    #[test]
    fn every_flag_lands_in_its_field() {
        let selector = parse(&[
            "--source",
            "orders.dlq",
            "--source",
            "payments.dlq",
            "--reason",
            "rejected",
            "--reason",
            "maxlen",
            "--destination",
            "orders",
            "--event-type",
            "order.paid",
            "--schema-version",
            "2",
            "--producer",
            "checkout",
            "--from",
            "2024-05-01T10:00:00+02:00",
            "--to",
            "2024-05-01T11:00:00Z",
            "--limit",
            "50",
            "--status",
            "archived",
            "--error-contains",
            "Timeout",
            "--error-group",
            "rejected: Timeout after <n> ms",
            "--body",
            "/order/status=paid=yes",
        ])
        .unwrap()
        .to_selector(now());
        assert_eq!(
            selector,
            v1::Selector {
                sources: vec!["orders.dlq".into(), "payments.dlq".into()],
                reasons: vec!["rejected".into(), "maxlen".into()],
                destinations: vec!["orders".into()],
                event_types: vec!["order.paid".into()],
                schema_versions: vec!["2".into()],
                producers: vec!["checkout".into()],
                died_from: Some(timestamp(parse_rfc3339("2024-05-01T08:00:00Z").unwrap())),
                died_to: Some(timestamp(parse_rfc3339("2024-05-01T11:00:00Z").unwrap())),
                limit: 50,
                ids: vec![],
                status: v1::DeadLetterStatus::Archived.into(),
                error_contains: "Timeout".into(),
                error_groups: vec!["rejected: Timeout after <n> ms".into()],
                body_matches: vec![v1::BodyMatch {
                    pointer: "/order/status".into(),
                    value: "paid=yes".into(),
                }],
            }
        );
    }

    #[test]
    fn since_counts_back_from_now() {
        let selector = parse(&["--since", "2h 30m"]).unwrap().to_selector(now());
        assert_eq!(
            selector.died_from,
            Some(timestamp(parse_rfc3339("2024-05-01T09:30:00Z").unwrap()))
        );
        assert_eq!(selector.died_to, None);
    }

    #[test]
    fn bad_flags_are_usage_errors() {
        for args in [
            &["--since", "2h", "--to", "2024-05-01T11:00:00Z"][..],
            &["--since", "2h", "--from", "2024-05-01T11:00:00Z"],
            &["--since", "soon"],
            // "Within no time before now" selects nothing: a mistake.
            &["--since", "0s"],
            &["--from", "yesterday"],
            &["--reason", "exploded"],
            &["--limit", "-1"],
            // 0 read as "no limit" on the wire: a script's 0 took everything.
            &["--limit", "0"],
            &["--body", "/order/status"],
            &["--status", "closed"],
            &["--error-contains", " "],
        ] {
            let error = parse(args).unwrap_err();
            assert!(error.use_stderr(), "{args:?}");
        }
    }
}
