//! The rules the settings describe: the precheck [`Policy`] (its
//! `PATTERN=DURATION` specs parsed) and the [`ExtractionRules`] of capture and
//! ingest.

use std::time::Duration;

use redrive_proto::{
    limits::{MAX_AGE, MAX_REDRIVES, at_most},
    settings::SettingError,
};

use super::{Config, parse_duration};
use crate::{
    dead_letters::{ExtractionRules, message_key::KeySource},
    precheck::{policy::Policy, state_check::Pattern},
};

impl Config {
    /// The policy, or every problem of its settings.
    pub(super) fn try_policy(&self) -> Result<Policy, Vec<SettingError>> {
        let mut problems = Vec::new();
        let stale_after = policy_rules("stale-after", "TYPE", &self.stale_after, &mut problems);
        let stale_after_source = policy_rules(
            "stale-after-source",
            "SOURCE",
            &self.stale_after_source,
            &mut problems,
        );
        for (setting, duration) in [
            ("default-stale-after", self.default_stale_after),
            ("replay-key-window", Some(self.replay_key_window)),
            ("max-precheck-age", Some(self.max_precheck_age)),
        ] {
            if let Some(Err(text)) = duration.map(|duration| at_most(duration, MAX_AGE)) {
                problems.push(SettingError::new(setting, text));
            }
        }
        if !(1..=MAX_REDRIVES).contains(&self.max_redrives) {
            problems.push(SettingError::new(
                "max-redrives",
                format!("{} is not from 1 to {MAX_REDRIVES}", self.max_redrives),
            ));
        }
        if let Some(pointer) = &self.event_time_pointer
            && !pointer.starts_with('/')
        {
            problems.push(SettingError::new(
                "event-time-pointer",
                format!("{pointer:?}: a JSON pointer starts with '/' (RFC 6901)"),
            ));
        }
        if !problems.is_empty() {
            return Err(problems);
        }
        Ok(Policy {
            stale_after,
            stale_after_source,
            default_stale_after: self.default_stale_after,
            replay_key_window: self.replay_key_window,
            max_redrives: self.max_redrives,
            event_time_pointer: self.event_time_pointer.clone(),
        }
        .sorted())
    }

    /// The extraction rules these settings describe, with the message-key
    /// sources parsed from `--message-key`.
    pub(super) fn extraction_rules(&self, key_sources: Vec<KeySource>) -> ExtractionRules {
        ExtractionRules {
            event_type_header: self.event_type_header.clone(),
            schema_version_header: self.schema_version_header.clone(),
            error_class_header: self.error_class_header.clone(),
            event_time_header: self.event_time_header.clone(),
            key_sources,
            max_body_bytes: self.max_body_bytes,
            // The AMQP URI's user (default `guest`, as AMQP URIs define it);
            // with several node URLs, the first one's.
            publish_user: self
                .amqp
                .urls()
                .first()
                .and_then(|url| url.parse::<lapin::uri::AMQPUri>().ok())
                .map(|uri| uri.authority.userinfo.username),
        }
    }
}

/// Parses `PATTERN=DURATION` specs, each pattern at most once; a bad spec
/// is added to `problems` and left out.
fn policy_rules(
    setting: &'static str,
    what: &str,
    specs: &[String],
    problems: &mut Vec<SettingError>,
) -> Vec<(Pattern, Duration)> {
    let mut rules: Vec<(Pattern, Duration)> = Vec::with_capacity(specs.len());
    for spec in specs {
        let rule = spec
            .split_once('=')
            .ok_or_else(|| "no '='".to_owned())
            .and_then(|(pattern, age)| {
                let pattern = Pattern::parse(pattern.trim())?;
                if rules.iter().any(|(existing, _)| *existing == pattern) {
                    return Err(format!("{} is given twice", pattern.as_str()));
                }
                Ok((pattern, parse_duration(age)?))
            });
        match rule {
            Ok(rule) => rules.push(rule),
            Err(text) => problems.push(SettingError::new(
                setting,
                format!("{spec:?}: {text}; expected {what}=DURATION, e.g. payment.*=2h"),
            )),
        }
    }
    rules
}
