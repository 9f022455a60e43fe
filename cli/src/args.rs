//! Command-line values and flag groups that more than one command takes, so
//! that commands do not reach into each other for them.
//!
//! - [`non_blank`]: a required reason (`--reason`, `--override-policy`).
//! - [`parse_positive_duration`]: humantime durations (`90s`, `2h`).
//! - [`OptionsArgs`]: the precheck options of `precheck` and `replay`
//!   (described in [`crate::commands::precheck`]), with their parsers.
//! - [`Paging`]: the paging flags of the listing commands, and the page walk.

use std::{collections::BTreeMap, time::Duration};

use clap::Args;
use redrive_proto::{time::duration, v1};

use crate::error::CliError;

/// A required free-text flag (a reason): trimmed, not blank.
///
/// # Errors
/// When blank, for clap to report as a usage error.
pub fn non_blank(text: &str) -> Result<String, String> {
    let text = text.trim();
    if text.is_empty() {
        return Err("must not be blank: say why".into());
    }
    Ok(text.to_owned())
}

/// Largest `--state-check-batch` the planner accepts.
pub const MAX_STATE_CHECK_BATCH: u32 = redrive_proto::limits::MAX_STATE_CHECK_BATCH as u32;

/// Precheck options (module docs).
#[derive(Debug, Clone, Default, PartialEq, Eq, Args)]
#[command(next_help_heading = "Precheck options")]
pub struct OptionsArgs {
    /// Items of this event type (or prefix ending in `*`) older than DURATION are
    /// stale, e.g. `payment.*=2h`; repeatable. Added to the planner's policy:
    /// the shorter deadline applies; a longer one than the policy's needs
    /// --override-policy.
    #[arg(long = "stale-after", value_name = "TYPE=DURATION", value_parser = parse_stale_after)]
    pub stale_after: Vec<StaleAfter>,

    /// Items from this source (a DLQ name or import label, or a prefix ending
    /// in `*`) older than DURATION are stale, e.g. `orders.dlq=30m`;
    /// repeatable, like --stale-after.
    #[arg(long = "stale-after-source", value_name = "SOURCE=DURATION", value_parser = parse_stale_after_source)]
    pub stale_after_source: Vec<StaleAfter>,

    /// Items of event types no --stale-after matches are stale after this long
    /// (default: the planner's policy, else never).
    #[arg(long, value_name = "DURATION", value_parser = parse_positive_duration)]
    pub default_stale_after: Option<Duration>,

    /// An earlier successful replay of the same message key within this window
    /// makes an item already_replayed (default: the planner's, 7 days unless
    /// set; a shorter one needs --override-policy).
    #[arg(long, value_name = "DURATION", value_parser = parse_positive_duration)]
    pub replay_key_window: Option<Duration>,

    /// Re-dead-letters after which a message key is looping (default: the
    /// planner's, 3 unless set; a higher one needs --override-policy).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_redrives: Option<u32>,

    /// Messages per state-check hook call, 1-5000 (planner default 500).
    #[arg(long = "state-check-batch", value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_STATE_CHECK_BATCH)))]
    pub state_check_batch: Option<u32>,

    /// Timeout of each state-check hook call (planner default 10s).
    #[arg(long, value_name = "DURATION", value_parser = parse_positive_duration)]
    pub state_check_timeout: Option<Duration>,

    /// Mark the items of an unreachable or failing state-check hook
    /// blocked_by_state instead of failing the precheck.
    #[arg(long)]
    pub block_on_state_check_error: bool,

    /// JSON pointer to the original event time in the body (RFC 3339 or epoch
    /// seconds), e.g. `/meta/occurred_at`.
    #[arg(long, value_name = "POINTER", value_parser = parse_json_pointer)]
    pub event_time_pointer: Option<String>,

    /// Let these options be looser than the planner's precheck policy (a
    /// longer deadline, a shorter replay-key window, more redrives, another
    /// event time pointer), saying why. Recorded in the report's warnings and
    /// on every plan made from it.
    #[arg(long, value_name = "REASON", value_parser = non_blank)]
    pub override_policy: Option<String>,
}

/// One `--stale-after TYPE=DURATION`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaleAfter {
    /// An event type, or a prefix ending in `*`.
    pub pattern: String,
    /// Older than this is stale.
    pub max_age: Duration,
}

impl OptionsArgs {
    /// The proto options; unset flags leave the planner's defaults.
    ///
    /// # Errors
    /// [`CliError::Usage`] when a `--stale-after` pattern is given twice.
    pub fn to_options(&self) -> Result<v1::PrecheckOptions, CliError> {
        Ok(v1::PrecheckOptions {
            stale_after: rule_map("--stale-after", "event type", &self.stale_after)?,
            stale_after_source: rule_map(
                "--stale-after-source",
                "source",
                &self.stale_after_source,
            )?,
            default_stale_after: self.default_stale_after.map(duration),
            replay_key_window: self.replay_key_window.map(duration),
            max_redrives: self.max_redrives.unwrap_or(0),
            state_check_batch_size: self.state_check_batch.unwrap_or(0),
            state_check_timeout: self.state_check_timeout.map(duration),
            block_on_state_check_error: self.block_on_state_check_error,
            event_time_pointer: self.event_time_pointer.clone().unwrap_or_default(),
            override_policy: self.override_policy.is_some(),
            override_reason: self.override_policy.clone().unwrap_or_default(),
        })
    }
}

/// The `pattern → duration` map of a repeatable rule flag.
///
/// # Errors
/// [`CliError::Usage`] when a pattern is given twice.
fn rule_map(
    flag: &str,
    what: &str,
    rules: &[StaleAfter],
) -> Result<BTreeMap<String, prost_types::Duration>, CliError> {
    let mut map = BTreeMap::new();
    for StaleAfter { pattern, max_age } in rules {
        if let Some(earlier) = map.insert(pattern.clone(), *max_age) {
            return Err(CliError::Usage(format!(
                "{flag}: {pattern} is given twice ({} and {}); give each {what} pattern once",
                humantime::format_duration(earlier),
                humantime::format_duration(*max_age),
            )));
        }
    }
    Ok(map
        .into_iter()
        .map(|(pattern, max_age)| (pattern, duration(max_age)))
        .collect())
}

const STALE_AFTER_FORM: &str = "expected TYPE=DURATION, e.g. payment.*=2h or order.paid=30m";
const STALE_AFTER_SOURCE_FORM: &str =
    "expected SOURCE=DURATION, e.g. orders.dlq=30m or orders.*=1h";

/// Parses `--stale-after TYPE=DURATION`: an event type, or a prefix ending in
/// `*` (`*` alone matches every type), and a positive humantime duration.
///
/// # Errors
/// A message saying what is wrong and the expected form, for clap (which names
/// the flag).
pub fn parse_stale_after(text: &str) -> Result<StaleAfter, String> {
    parse_rule(text, "event type", STALE_AFTER_FORM)
}

/// Parses `--stale-after-source SOURCE=DURATION`: a source (DLQ name or import
/// label), or a prefix ending in `*`, and a positive humantime duration.
///
/// # Errors
/// As [`parse_stale_after`].
pub fn parse_stale_after_source(text: &str) -> Result<StaleAfter, String> {
    parse_rule(text, "source", STALE_AFTER_SOURCE_FORM)
}

fn parse_rule(text: &str, what: &str, form: &str) -> Result<StaleAfter, String> {
    let Some((pattern, age)) = text.split_once('=') else {
        return Err(format!("no '=' in {text:?}; {form}"));
    };
    let (pattern, age) = (pattern.trim(), age.trim());
    if pattern.is_empty() {
        return Err(format!("the {what} before '=' is empty; {form}"));
    }
    if pattern.strip_suffix('*').unwrap_or(pattern).contains('*') {
        return Err(format!(
            "{pattern:?}: '*' may only end a pattern (a prefix such as payment.*); {form}"
        ));
    }
    if age.is_empty() {
        return Err(format!("no duration after '='; {form}"));
    }
    let max_age = parse_positive_duration(age)
        .map_err(|problem| format!("{pattern}: duration {age:?}: {problem}; {form}"))?;
    Ok(StaleAfter {
        pattern: pattern.to_owned(),
        max_age,
    })
}

/// Parses a positive humantime duration (`90s`, `2h`, `1day 6h`).
///
/// # Errors
/// The parser's complaint, or that it is zero.
pub fn parse_positive_duration(text: &str) -> Result<Duration, String> {
    let parsed = humantime::parse_duration(text.trim())
        .map_err(|error| format!("{error} (e.g. 90s, 30m, 2h, 1day 6h)"))?;
    if parsed.is_zero() {
        return Err("must be longer than zero".to_owned());
    }
    Ok(parsed)
}

/// Checks `--event-time-pointer`: a JSON pointer (RFC 6901) starts with `/`.
///
/// # Errors
/// What is wrong, for clap.
pub fn parse_json_pointer(text: &str) -> Result<String, String> {
    if !text.starts_with('/') {
        return Err("a JSON pointer starts with '/' (RFC 6901), e.g. /meta/occurred_at".to_owned());
    }
    Ok(text.to_owned())
}

/// The paging flags of the listing commands (`dead-letters list`,
/// `precheck items`, `plan list`, `plan compensations`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Args)]
pub struct Paging {
    /// Per page (the planner's default is 100, at most 1000).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub page_size: Option<u32>,

    /// Start at this page (from a previous answer's next page token).
    #[arg(long, value_name = "TOKEN")]
    pub page_token: Option<String>,

    /// Follow page tokens until the last page.
    #[arg(long)]
    pub all: bool,
}

impl Paging {
    /// Walks the pages these flags ask for: `page(page_size, page_token)`
    /// fetches one page (0: the planner's default size), takes its rows and
    /// answers the next page token. One page, or every page with `--all`.
    /// Answers the token after the last page walked (empty at the end).
    ///
    /// # Errors
    /// `page`'s.
    pub async fn walk(
        &self,
        mut page: impl AsyncFnMut(u32, String) -> Result<String, CliError>,
    ) -> Result<String, CliError> {
        let mut page_token = self.page_token.clone().unwrap_or_default();
        loop {
            page_token = page(self.page_size.unwrap_or(0), page_token).await?;
            if !self.all || page_token.is_empty() {
                return Ok(page_token);
            }
        }
    }
}
