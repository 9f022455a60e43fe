//! The one table of input limits: every bound a request is checked against,
//! with where it comes from. docs/api.md's "Limits" section is the same table
//! for API users; a change here changes it there.
//!
//! Two layers enforce them:
//! - the wire check ([`crate::codec`]), before a request is decoded: nesting
//!   depth, header tables (depth, values, bytes), the length of every text
//!   field ([`text_limit`]), the number of elements of every repeated field
//!   ([`repeated_limit`]), and NUL characters (PostgreSQL's `text` refuses
//!   them);
//! - the planner's validation of each request's fields (durations, numbers,
//!   timestamps), naming the field and the limit.
//!
//! Either answers `INVALID_ARGUMENT` naming the field and the limit.

use std::time::Duration;

/// Largest gRPC message the planner accepts or sends: a 16 MiB body (the
/// default `--max-body-bytes`) plus headroom. A larger one is refused by
/// tonic before it is buffered (`RESOURCE_EXHAUSTED`).
pub const MAX_GRPC_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

/// Deepest message nesting of any request on the wire (each AMQP table level
/// costs three: value, table, map entry): room for [`MAX_HEADER_NESTING`]
/// levels of headers inside a request. Checked without recursion, before
/// prost (which runs with `no-recursion-limit`, see `Cargo.toml`) decodes.
pub const MAX_MESSAGE_NESTING: usize = 3 * MAX_HEADER_NESTING + 16;

/// Deepest nesting of header tables and arrays (the top-level table is level
/// 1). Real headers nest three levels (`x-death` → entry → `routing-keys`);
/// capture reads no deeper either (`capture/raw.rs`).
pub const MAX_HEADER_NESTING: usize = 64;

/// Most header values (nested ones included) in one request's header table.
pub const MAX_HEADER_VALUES: usize = 10_000;

/// Largest encoded header table of one request: RabbitMQ sends a message's
/// properties and headers in one frame (`frame_max`, 128 KiB by default), so
/// this is far above anything a broker delivers.
pub const MAX_HEADERS_BYTES: usize = 1024 * 1024;

/// Default maximum length of a text field (ids, page tokens, patterns,
/// selector values, URLs), in bytes.
pub const MAX_TEXT_BYTES: usize = 1024;

/// AMQP short strings (queue, exchange and routing key names, message
/// properties, header names) are at most 255 bytes (AMQP 0-9-1 §4.2.5.3).
pub const MAX_SHORT_STRING_BYTES: usize = 255;

/// What makes `name`, a queue, exchange or routing key name, impossible to
/// publish to or with: more than [`MAX_SHORT_STRING_BYTES`] bytes (AMQP 0-9-1
/// §4.2.5.3: they travel as short strings). `what` names it in the answer.
pub fn amqp_name_problem(what: &str, name: &str) -> Option<String> {
    (name.len() > MAX_SHORT_STRING_BYTES).then(|| {
        format!(
            "the {what} is {} bytes, over AMQP's {MAX_SHORT_STRING_BYTES}-byte limit for a name (a short string, AMQP 0-9-1 §4.2.5.3)",
            name.len()
        )
    })
}

/// What makes a dead letter's destination (a queue name, or
/// `exchange/routing-key` when only those are known) impossible to publish
/// to: a queue name, or either part of the pair, over
/// [`MAX_SHORT_STRING_BYTES`] bytes ([`amqp_name_problem`]). A name with a
/// `/` is read as the pair when both parts fit.
pub fn destination_problem(destination: &str) -> Option<String> {
    if destination.len() <= MAX_SHORT_STRING_BYTES {
        return None;
    }
    match destination.split_once('/') {
        Some((exchange, routing_key))
            if exchange.len() <= MAX_SHORT_STRING_BYTES
                && routing_key.len() <= MAX_SHORT_STRING_BYTES =>
        {
            None
        }
        _ => amqp_name_problem("destination queue name", destination),
    }
}

/// Longest free-text reason or rationale a person writes (plan rationale,
/// control, override, replay and repair reasons), in bytes.
pub const MAX_REASON_BYTES: usize = 4096;

/// Longest error text of an ingested dead letter (a stack trace), in bytes.
pub const MAX_ERROR_TEXT_BYTES: usize = 64 * 1024;

/// Default maximum number of elements of a repeated or map field.
pub const MAX_REPEATED: usize = 10_000;

/// Most values in one selector list (`sources`, `reasons`, ...; `ids` may
/// hold [`MAX_REPEATED`]) and most entries in a `stale_after` map.
pub const MAX_SELECTOR_VALUES: usize = 1000;

/// Largest page of a list call (a larger `page_size` is refused).
pub const MAX_PAGE_SIZE: u32 = 1000;

/// Largest `selector.limit`.
pub const MAX_SELECTOR_LIMIT: u64 = 100_000_000;

/// Slowest rate a plan may have: one message every ~17 minutes.
pub const MIN_RATE_PER_SECOND: f64 = 0.001;
/// Fastest rate a plan may have (far above one broker's capacity).
pub const MAX_RATE_PER_SECOND: f64 = 1_000_000.0;
/// Largest burst a plan accepts: the executors' token bucket takes at most
/// this many (`redrive_executor::bucket::MAX_BURST`).
pub const MAX_RATE_BURST: u32 = 1_000_000;
/// Largest slice accepted.
pub const MAX_SLICE_SIZE: u32 = 10_000;
/// Longest observation window after the canary wave.
pub const MAX_OBSERVE_FOR: Duration = Duration::from_secs(7 * 24 * 3600);

/// Longest age rule (`stale_after`, `stale_after_source`,
/// `default_stale_after`) and replay-key window: 100 years (365-day years),
/// far inside every time type's range (chrono, PostgreSQL).
pub const MAX_AGE: Duration = Duration::from_secs(100 * 365 * 24 * 3600);
/// Largest state-check batch size accepted.
pub const MAX_STATE_CHECK_BATCH: usize = 5000;
/// Longest per-batch hook timeout a caller may ask for: a silent hook must
/// not hold a precheck and its database connections longer.
pub const MAX_STATE_CHECK_TIMEOUT: Duration = Duration::from_secs(120);
/// Most re-dead-letters a precheck may allow before a key is looping.
pub const MAX_REDRIVES: u32 = 1000;

/// Longest `ReplayDeadLetter` wait.
pub const MAX_REPLAY_WAIT: Duration = Duration::from_secs(600);
/// Longest `ClaimSlice` long poll.
pub const MAX_CLAIM_WAIT: Duration = Duration::from_secs(30);

/// Longest slice lease (`--lease-ttl-seconds`): a dead executor's slices
/// wait this long before another takes them.
pub const MAX_LEASE_TTL_SECONDS: u64 = 3600;
/// Longest wait of a partial capture batch (`--capture-batch-wait-ms`).
pub const MAX_CAPTURE_BATCH_WAIT_MS: u64 = 60_000;

/// Most operator actions `GetPlan` shows, the newest ones: a plan paused and
/// resumed without end still fits a gRPC message (200 × a 4 KiB reason is
/// under 1 MiB). `Plan.actions_omitted` counts the older ones.
pub const MAX_PLAN_ACTIONS_SHOWN: i64 = 200;

/// Longest webhook URL (`CreatePlanRequest.webhook_url`, `--webhook-url`),
/// in bytes: far above a real endpoint's, below what HTTP servers take in
/// a request line (8 KiB is common).
pub const MAX_WEBHOOK_URL_BYTES: usize = 2048;
/// Longest webhook secret as written (`CreatePlanRequest.webhook_secret`,
/// `--webhook-secret-file`): `whsec_` and the base64 of 64 bytes (the
/// Standard Webhooks maximum) is 94 bytes.
pub const MAX_WEBHOOK_SECRET_BYTES: usize = 128;

/// Most attempts an ingested dead letter may say it had.
pub const MAX_ATTEMPTS: u32 = 1_000_000;

/// Earliest timestamp accepted (0001-01-01T00:00:00Z) and latest
/// (9999-12-31T23:59:59Z): RFC 3339's range, inside PostgreSQL's.
pub const MIN_TIMESTAMP_SECONDS: i64 = -62_135_596_800;
/// See [`MIN_TIMESTAMP_SECONDS`].
pub const MAX_TIMESTAMP_SECONDS: i64 = 253_402_300_799;

/// Most bytes of dead letter bodies an ingest stream holds before storing
/// them: a stream of large bodies is stored every few bodies, and the next
/// ones are read only then (HTTP/2 flow control holds the client back).
pub const MAX_INGEST_BATCH_BYTES: usize = 32 * 1024 * 1024;

/// Default byte budget of one `ClaimSlice` answer (`--claim-max-bytes`):
/// a slice's items are handed out while the sum of their sizes (body to
/// publish, properties, headers, error text, 1 KiB for the rest) stays
/// within it, and always at least one; the rest stay pending for the next
/// claim of the same slice.
pub const DEFAULT_CLAIM_MAX_BYTES: usize = 16 * 1024 * 1024;

/// Largest `--claim-max-bytes`: half of [`MAX_GRPC_MESSAGE_BYTES`], as for
/// a body, so that a claim answer is far below the message limit.
pub const MAX_CLAIM_MAX_BYTES: usize = MAX_GRPC_MESSAGE_BYTES / 2;

/// Largest single slice item a claim answer carries (its body and
/// metadata): [`MAX_GRPC_MESSAGE_BYTES`] less 1 MiB for the answer's other
/// fields. A larger item could never reach an executor; the claim fails it
/// (`failed`, with the sizes in its audit reason) instead of handing out a
/// slice that no executor can receive.
pub const MAX_CLAIM_ITEM_BYTES: usize = MAX_GRPC_MESSAGE_BYTES - 1024 * 1024;

/// Text fields with their own limit: (message, field, bytes). `*` stands for
/// every string field of the message. The rest have [`MAX_TEXT_BYTES`].
const TEXT_LIMITS: &[(&str, &str, usize)] = &[
    // A fingerprint: a reason class, 200 characters of class and 300 of
    // folded text, up to 4 bytes each.
    ("redrive.v1.Selector", "error_groups", 2048),
    ("redrive.v1.Rate", "rationale", MAX_REASON_BYTES),
    ("redrive.v1.PlanControlRequest", "reason", MAX_REASON_BYTES),
    (
        "redrive.v1.CreatePlanRequest",
        "webhook_url",
        MAX_WEBHOOK_URL_BYTES,
    ),
    (
        "redrive.v1.CreatePlanRequest",
        "webhook_secret",
        MAX_WEBHOOK_SECRET_BYTES,
    ),
    (
        "redrive.v1.PrecheckOptions",
        "override_reason",
        MAX_REASON_BYTES,
    ),
    (
        "redrive.v1.ReplayDeadLetterRequest",
        "reason",
        MAX_REASON_BYTES,
    ),
    (
        "redrive.v1.RepairDeadLetterRequest",
        "reason",
        MAX_REASON_BYTES,
    ),
    (
        "redrive.v1.ArchiveDeadLettersRequest",
        "reason",
        MAX_REASON_BYTES,
    ),
    (
        "redrive.v1.RekeyDeadLettersRequest",
        "reason",
        MAX_REASON_BYTES,
    ),
    (
        "redrive.v1.IngestDeadLettersRequest",
        "error_text",
        MAX_ERROR_TEXT_BYTES,
    ),
    (
        "redrive.v1.IngestDeadLettersRequest",
        "reason",
        MAX_SHORT_STRING_BYTES,
    ),
    (
        "redrive.v1.IngestDeadLettersRequest",
        "message_id",
        MAX_SHORT_STRING_BYTES,
    ),
    (
        "redrive.v1.IngestDeadLettersRequest",
        "source",
        MAX_SHORT_STRING_BYTES,
    ),
    // Exchange and routing key, joined by '/'.
    (
        "redrive.v1.IngestDeadLettersRequest",
        "original_destination",
        2 * MAX_SHORT_STRING_BYTES + 1,
    ),
    ("redrive.v1.MessageProperties", "*", MAX_SHORT_STRING_BYTES),
    (
        "redrive.v1.HeaderTable.FieldsEntry",
        "key",
        MAX_SHORT_STRING_BYTES,
    ),
    (
        "redrive.v1.HeaderValue",
        "short_string",
        MAX_SHORT_STRING_BYTES,
    ),
    (
        "redrive.v1.RedirectDestination",
        "*",
        MAX_SHORT_STRING_BYTES,
    ),
    (
        "redrive.v1.ClaimSliceRequest",
        "executor_id",
        MAX_SHORT_STRING_BYTES,
    ),
];

/// Repeated fields with their own limit: (message, field, elements). The rest
/// have [`MAX_REPEATED`].
const REPEATED_LIMITS: &[(&str, &str, usize)] = &[
    ("redrive.v1.Selector", "sources", MAX_SELECTOR_VALUES),
    ("redrive.v1.Selector", "reasons", MAX_SELECTOR_VALUES),
    ("redrive.v1.Selector", "destinations", MAX_SELECTOR_VALUES),
    ("redrive.v1.Selector", "event_types", MAX_SELECTOR_VALUES),
    (
        "redrive.v1.Selector",
        "schema_versions",
        MAX_SELECTOR_VALUES,
    ),
    ("redrive.v1.Selector", "producers", MAX_SELECTOR_VALUES),
    ("redrive.v1.Selector", "error_groups", MAX_SELECTOR_VALUES),
    ("redrive.v1.Selector", "body_matches", 16),
    ("redrive.v1.RekeyDeadLettersRequest", "key_rules", 16),
    (
        "redrive.v1.PrecheckOptions",
        "stale_after",
        MAX_SELECTOR_VALUES,
    ),
    (
        "redrive.v1.PrecheckOptions",
        "stale_after_source",
        MAX_SELECTOR_VALUES,
    ),
    ("redrive.v1.SummarizeDeadLettersRequest", "group_by", 16),
    ("redrive.v1.ListPlansRequest", "states", 16),
    ("redrive.v1.ListPlansRequest", "kinds", 4),
    (
        "redrive.v1.RecheckStateRequest",
        "dead_letter_ids",
        MAX_STATE_CHECK_BATCH,
    ),
];

/// Maximum length in bytes of string field `field` of message `message`
/// (full name, `redrive.v1.Rate`).
pub fn text_limit(message: &str, field: &str) -> usize {
    TEXT_LIMITS
        .iter()
        .find(|(m, f, _)| *m == message && (*f == field || *f == "*"))
        .map_or(MAX_TEXT_BYTES, |(_, _, limit)| *limit)
}

/// Maximum number of elements of repeated or map field `field` of message
/// `message` (full name).
pub fn repeated_limit(message: &str, field: &str) -> usize {
    REPEATED_LIMITS
        .iter()
        .find(|(m, f, _)| *m == message && *f == field)
        .map_or(MAX_REPEATED, |(_, _, limit)| *limit)
}

/// Messages the wire check applies only nesting limits to: they carry what
/// the planner stored (captured keys, headers and broker error texts), not
/// what a person typed, so a length limit could wedge a plan or a precheck.
pub const STORED_DATA_MESSAGES: &[&str] = &[
    "redrive.v1.ReportOutcomesRequest",
    "redrive.v1.StateCheckRequest",
];

/// Streamed messages whose text limits are checked per item by the service
/// (`IngestDeadLetters` rejects one bad item with its index and goes on),
/// while the wire check keeps only nesting (a stream cannot go on after a
/// message it refused).
pub const PER_ITEM_MESSAGES: &[&str] = &["redrive.v1.IngestDeadLettersRequest"];

/// `value` as a duration checked against `max`: `InvalidArgument`-style text
/// (`"at most 7days"`) when above.
///
/// # Errors
/// The problem, for the caller to name its field with.
pub fn at_most(value: Duration, max: Duration) -> Result<Duration, String> {
    if value > max {
        return Err(format!(
            "{} is above the limit of {}",
            humanize(value),
            humanize(max)
        ));
    }
    Ok(value)
}

/// `duration` in whole seconds, or days when a whole number of days.
pub fn humanize(duration: Duration) -> String {
    let seconds = duration.as_secs();
    if seconds >= 86_400 && seconds.is_multiple_of(86_400) && duration.subsec_nanos() == 0 {
        format!("{} days", seconds / 86_400)
    } else if duration.subsec_nanos() == 0 {
        format!("{seconds} s")
    } else {
        format!("{:.3} s", duration.as_secs_f64())
    }
}

#[cfg(test)]
mod tests {
    /// A queue name of 300 bytes was imported, prechecked replayable and
    /// crashed the executor (lapin's short string); an exchange/routing-key
    /// pair is read by its parts.
    #[test]
    fn a_destination_no_publish_can_name_is_told() {
        use super::{amqp_name_problem, destination_problem};
        assert_eq!(destination_problem(&"q".repeat(255)), None);
        let long = destination_problem(&"q".repeat(300)).unwrap();
        assert!(long.contains("300 bytes") && long.contains("255"), "{long}");
        let pair = format!("{}/{}", "x".repeat(200), "k".repeat(200));
        assert_eq!(destination_problem(&pair), None);
        let bad_pair = format!("{}/{}", "x".repeat(300), "k");
        assert!(destination_problem(&bad_pair).is_some());
        assert_eq!(amqp_name_problem("exchange", ""), None);
        assert!(amqp_name_problem("exchange", &"é".repeat(128)).is_some());
    }

    use super::*;

    #[test]
    fn lookups_fall_back_to_the_defaults() {
        assert_eq!(text_limit("redrive.v1.Rate", "rationale"), MAX_REASON_BYTES);
        assert_eq!(
            text_limit("redrive.v1.MessageProperties", "message_id"),
            MAX_SHORT_STRING_BYTES
        );
        assert_eq!(
            text_limit("redrive.v1.GetPlanRequest", "plan_id"),
            MAX_TEXT_BYTES
        );
        assert_eq!(repeated_limit("redrive.v1.Selector", "ids"), MAX_REPEATED);
        assert_eq!(
            repeated_limit("redrive.v1.Selector", "sources"),
            MAX_SELECTOR_VALUES
        );
    }

    #[test]
    fn durations_above_the_limit_are_named() {
        let problem = at_most(Duration::from_secs(8 * 86_400), MAX_OBSERVE_FOR).unwrap_err();
        assert_eq!(problem, "8 days is above the limit of 7 days");
        assert!(at_most(MAX_OBSERVE_FOR, MAX_OBSERVE_FOR).is_ok());
    }
}
