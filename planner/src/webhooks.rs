//! Webhooks (docs/webhooks.md): what happened, told to the caller without
//! polling, by the [Standard Webhooks](https://www.standardwebhooks.com/)
//! specification. This file holds the events (which state change reports
//! what, and each event's `data`), the secret and the target URL as a
//! request or a flag gives them, and the signature; `webhooks/deliver.rs`
//! the deliverer every replica runs over the outbox (`store/webhooks.rs`),
//! `webhooks/http.rs` the HTTP client it posts with.

pub mod deliver;
pub(crate) mod http;

use base64::{Engine as _, engine::general_purpose::STANDARD as BASE64};
use hmac::{Hmac, Mac};
use redrive_proto::{
    limits::{MAX_WEBHOOK_SECRET_BYTES, MAX_WEBHOOK_URL_BYTES},
    v1,
};
use serde_json::{Value, json};
use sha2::Sha256;

use crate::plan::{gates::GATE_ACTOR, state::State};

/// What happened: the payload's `type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    /// A precheck finished, `done` or `failed`.
    PrecheckFinished,
    /// A plan was created and awaits approval.
    PlanCreated,
    /// A canary gate paused or aborted a plan (actor `redrive-gate`).
    PlanGateTripped,
    /// A plan was paused (by anyone).
    PlanPaused,
    /// A plan reached a final state: completed, cancelled or aborted.
    PlanEnded,
}

impl EventType {
    /// Its name, as sent (`precheck.finished`, `plan.created`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Self::PrecheckFinished => "precheck.finished",
            Self::PlanCreated => "plan.created",
            Self::PlanGateTripped => "plan.gate_tripped",
            Self::PlanPaused => "plan.paused",
            Self::PlanEnded => "plan.ended",
        }
    }

    /// The event named `name`, if any.
    pub fn from_name(name: &str) -> Option<Self> {
        [
            Self::PrecheckFinished,
            Self::PlanCreated,
            Self::PlanGateTripped,
            Self::PlanPaused,
            Self::PlanEnded,
        ]
        .into_iter()
        .find(|event| event.name() == name)
    }
}

/// The events a plan reaching state `to` by `actor` reports: a pause is
/// `plan.paused`, a final state `plan.ended`, and either of them decided by
/// the gates ([`GATE_ACTOR`]) is `plan.gate_tripped` too.
pub fn events_of_move(to: State, actor: &str) -> Vec<EventType> {
    let state = to.get();
    let mut events = Vec::new();
    let paused = state == v1::PlanState::Paused;
    if actor == GATE_ACTOR && (paused || state == v1::PlanState::Aborted) {
        events.push(EventType::PlanGateTripped);
    }
    if paused {
        events.push(EventType::PlanPaused);
    }
    if state.is_final() {
        events.push(EventType::PlanEnded);
    }
    events
}

/// A plan event's `data`: the plan's id, state, kind, item totals and
/// counts per audit action (as `GetPlan` gives them, every action present),
/// and the actor and reason of the change ("" when there is none).
pub fn plan_data(plan: &v1::Plan, actor: &str, reason: &str) -> Value {
    let counts = plan.counts.unwrap_or_default();
    json!({
        "plan_id": plan.plan_id,
        "precheck_id": plan.precheck_id,
        "state": plan.state().name(),
        "kind": if plan.kind() == v1::PlanKind::Single { "single" } else { "bulk" },
        "total_items": plan.total_items,
        "items_done": plan.items_done,
        "counts": {
            "sent": counts.sent,
            "skipped_duplicate": counts.skipped_duplicate,
            "skipped_stale": counts.skipped_stale,
            "skipped_state": counts.skipped_state,
            "needs_compensation": counts.needs_compensation,
            "failed": counts.failed,
            "unroutable": counts.unroutable,
            "uncertain": counts.uncertain,
        },
        "actor": actor,
        "reason": reason,
    })
}

/// A finished precheck's `data`: its id, state (`done` or `failed`), its
/// actor, and for `done` its report's digest, total and verdict counts; for
/// `failed` the error.
pub fn precheck_data(
    precheck_id: &str,
    actor: &str,
    report: Result<&v1::PrecheckReport, &str>,
) -> Value {
    match report {
        Ok(report) => {
            let counts = report.counts.unwrap_or_default();
            json!({
                "precheck_id": precheck_id,
                "state": "done",
                "actor": actor,
                "digest": report.digest,
                "total": report.total,
                "counts": {
                    "replayable": counts.replayable,
                    "duplicate": counts.duplicate,
                    "already_replayed": counts.already_replayed,
                    "looping": counts.looping,
                    "stale": counts.stale,
                    "blocked_by_state": counts.blocked_by_state,
                    "needs_compensation": counts.needs_compensation,
                    "invalid": counts.invalid,
                },
            })
        }
        Err(error) => json!({
            "precheck_id": precheck_id,
            "state": "failed",
            "actor": actor,
            "error": error,
        }),
    }
}

/// The body sent: `{"type": ..., "timestamp": ..., "data": ...}`, the
/// timestamp being when the event happened (RFC 3339, UTC, milliseconds),
/// not when it is sent.
pub fn body(event: &str, occurred_at: chrono::DateTime<chrono::Utc>, data: &Value) -> String {
    json!({
        "type": event,
        "timestamp": redrive_proto::time::rfc3339(occurred_at),
        "data": data,
    })
    .to_string()
}

/// A signing secret: `whsec_` and the base64 of 24 to 64 random bytes (the
/// specification's "Symmetric" row). Its `Debug` shows no byte of it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Vec<u8>);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(***)")
    }
}

impl Secret {
    /// Reads `text` (`whsec_<base64>`).
    ///
    /// # Errors
    /// What is wrong with it, never quoting it: longer than
    /// [`MAX_WEBHOOK_SECRET_BYTES`], no `whsec_` prefix, not base64, or
    /// fewer than 24 or more than 64 bytes.
    pub fn parse(text: &str) -> Result<Self, String> {
        if text.len() > MAX_WEBHOOK_SECRET_BYTES {
            return Err(format!(
                "{} bytes, at most {MAX_WEBHOOK_SECRET_BYTES}",
                text.len()
            ));
        }
        let Some(encoded) = text.strip_prefix("whsec_") else {
            return Err("not a `whsec_<base64>` secret (the Standard Webhooks form)".to_owned());
        };
        let bytes = BASE64
            .decode(encoded)
            .map_err(|_| "the part after `whsec_` is not standard base64".to_owned())?;
        if !(24..=64).contains(&bytes.len()) {
            return Err(format!(
                "{} bytes after base64 decoding: a secret is 24 to 64 random bytes",
                bytes.len()
            ));
        }
        Ok(Self(bytes))
    }

    /// The `webhook-signature` value of `body` sent as message `id` at
    /// `timestamp` (Unix seconds): `v1,` and the base64 HMAC-SHA256 of
    /// `{id}.{timestamp}.{body}` keyed with the secret's bytes.
    pub fn sign(&self, id: &str, timestamp: i64, body: &str) -> String {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes any key length");
        mac.update(format!("{id}.{timestamp}.{body}").as_bytes());
        format!("v1,{}", BASE64.encode(mac.finalize().into_bytes()))
    }
}

/// Checks a target URL: at most [`MAX_WEBHOOK_URL_BYTES`], `https://`, or
/// `http://` to a loopback host only (what is sent is signed, not
/// encrypted), with a host and without credentials (GetPlan shows the URL).
///
/// # Errors
/// What is wrong, naming the URL without any credentials in it.
pub fn check_url(text: &str) -> Result<hyper::Uri, String> {
    if text.len() > MAX_WEBHOOK_URL_BYTES {
        return Err(format!(
            "{} bytes, at most {MAX_WEBHOOK_URL_BYTES}",
            text.len()
        ));
    }
    let uri: hyper::Uri = text
        .parse()
        .map_err(|_| "not a URL (https://host[:port]/path)".to_owned())?;
    if uri.authority().is_some_and(|a| a.as_str().contains('@')) {
        return Err("must not carry credentials (user:password@): it is shown by GetPlan".into());
    }
    let host = uri.host().unwrap_or_default();
    if host.is_empty() {
        return Err("needs a host (https://host[:port]/path)".to_owned());
    }
    match uri.scheme_str() {
        Some("https") => Ok(uri),
        Some("http") if is_loopback(host) => Ok(uri),
        Some("http") => Err(format!(
            "http://{host} is not a loopback address: use https:// (webhooks are signed, not encrypted)"
        )),
        _ => Err("the scheme must be https:// (or http:// to a loopback address)".to_owned()),
    }
}

/// Whether `host` (as a URL gives it, IPv6 in brackets) is `localhost` or
/// a loopback address.
fn is_loopback(host: &str) -> bool {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    bare.eq_ignore_ascii_case("localhost")
        || bare
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The specification's published test vector (its Rust library's
    /// `test_sign`, standard-webhooks/standard-webhooks).
    #[test]
    fn signatures_match_the_specification_test_vector() {
        let secret = Secret::parse("whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD").unwrap();
        assert_eq!(
            secret.sign(
                "msg_27UH4WbU6Z5A5EzD8u03UvzRbpk",
                1_649_367_553,
                r#"{"email":"test@example.com","username":"test_user"}"#
            ),
            "v1,tZ1I4/hDygAJgO5TYxiSd6Sd0kDW6hPenDe+bTa3Kkw="
        );
    }

    #[test]
    fn bad_secrets_are_named_without_being_quoted() {
        for (text, expected) in [
            ("C2FVsBQIhrscChlQIMV+b5sSYspob7oD", "whsec_"),
            ("whsec_not base64!", "base64"),
            ("whsec_c2hvcnQ=", "24 to 64"),
        ] {
            let problem = Secret::parse(text).unwrap_err();
            assert!(problem.contains(expected), "{problem}");
            assert!(!problem.contains(text), "{problem}");
        }
        assert_eq!(
            format!(
                "{:?}",
                Secret::parse("whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD")
            ),
            "Ok(Secret(***))"
        );
    }

    #[test]
    fn urls_are_https_or_loopback_http() {
        assert!(check_url("https://hooks.example.com/redrive").is_ok());
        assert!(check_url("http://127.0.0.1:8080/hook").is_ok());
        assert!(check_url("http://[::1]:8080/hook").is_ok());
        assert!(check_url("http://localhost/hook").is_ok());
        let problem = check_url("http://hooks.example.com/x").unwrap_err();
        assert!(problem.contains("https://"), "{problem}");
        assert!(check_url("ftp://127.0.0.1/x").is_err());
        let problem = check_url("https://user:pw@hooks.example.com/").unwrap_err();
        assert!(problem.contains("credentials") && !problem.contains("pw"));
        assert!(check_url(&format!("https://h/{}", "a".repeat(3000))).is_err());
    }

    #[test]
    fn gate_decisions_report_a_trip_beside_the_state() {
        let state = |s| State::new(s).unwrap();
        assert_eq!(
            events_of_move(state(v1::PlanState::Paused), GATE_ACTOR),
            [EventType::PlanGateTripped, EventType::PlanPaused]
        );
        assert_eq!(
            events_of_move(state(v1::PlanState::Aborted), GATE_ACTOR),
            [EventType::PlanGateTripped, EventType::PlanEnded]
        );
        assert_eq!(
            events_of_move(state(v1::PlanState::Paused), "alice"),
            [EventType::PlanPaused]
        );
        assert!(events_of_move(state(v1::PlanState::Main), "alice").is_empty());
        assert_eq!(
            EventType::from_name("plan.ended"),
            Some(EventType::PlanEnded)
        );
    }
}
