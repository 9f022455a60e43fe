//! A dead letter about to be stored: what capture, ingest and import all produce.
//!
//! [`ExtractionRules::extract`] derives everything the planner keeps beside the
//! exact body and headers: the death that counts, the reason class, destination,
//! event type, schema version, producer, message key, body hash and oddities;
//! its steps are in `dead_letters/extract.rs`.

pub mod body;
pub mod death;
pub mod event_time;
mod extract;
pub mod housekeeping;
pub mod inspect;
pub mod message_key;
pub mod rekey;
pub mod selector;

use chrono::{DateTime, Utc};
use redrive_proto::v1::{BodyCompression, HeaderTable, MessageProperties, Origin, ReasonClass};
use sha2::{Digest, Sha256};

use self::{death::Death, message_key::KeySource};

/// Bodies above this size are hashed off the async runtime (a task blocks
/// its worker thread for at most ~500 µs: SHA-256 of 256 KiB takes about that).
pub const BLOCKING_BODY_BYTES: usize = 256 * 1024;

/// Default body limit: 16 MiB.
pub const DEFAULT_MAX_BODY_BYTES: usize = 16 * 1024 * 1024;

/// How the planner reads dead letters (header names are configurable because
/// teams name them differently).
#[derive(Debug, Clone)]
pub struct ExtractionRules {
    /// Header holding the event type when the `type` property is absent.
    pub event_type_header: String,
    /// Header holding the schema version.
    pub schema_version_header: String,
    /// The application's error-class header, which refines `rejected`.
    pub error_class_header: String,
    /// Header holding the original event time (any AMQP type that can hold
    /// a time, read by [`crate::dead_letters::event_time::from_header`]); preferred to the
    /// `timestamp` property. `None`: only the property is read.
    pub event_time_header: Option<String>,
    /// Where message keys come from, first match wins (the `--message-key`
    /// rules); empty: the default, the `message_id` property. Either way the
    /// body's SHA-256 when nothing gives a key ([`message_key::message_key`]).
    pub key_sources: Vec<KeySource>,
    /// Bodies larger than this are kept but marked oversized (not replayable);
    /// also the cap on a decompressed body ([`body::decode`]).
    pub max_body_bytes: usize,
    /// The broker user replays are published as (the planner's `--amqp-url`
    /// user; executors are expected to use the same one). A captured `user_id`
    /// other than this one is refused by RabbitMQ ("Validated User-ID"), so the
    /// dead letter is marked not republishable. `None`: not checked.
    pub publish_user: Option<String>,
}

impl Default for ExtractionRules {
    fn default() -> Self {
        Self {
            event_type_header: "event-type".to_owned(),
            schema_version_header: "schema-version".to_owned(),
            error_class_header: "error-class".to_owned(),
            event_time_header: None,
            key_sources: Vec::new(),
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            publish_user: None,
        }
    }
}

/// How to recognize that a dead letter is already stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Dedup {
    /// A first delivery from RabbitMQ: always new.
    None,
    /// A redelivery from RabbitMQ (`redelivered` set): already stored if a dead
    /// letter of the same source has the same capture fingerprint.
    Fingerprint,
    /// Ingest and import: idempotent per (source, key); the key is
    /// [`dedup_key`] of the destination, message id, re-dead-letter plan and
    /// body.
    Key(String),
}

/// The ingest and import idempotency key (docs/design.md, "Words", identity): a
/// re-sent line (same destination, message id, `redrive-plan-id` and body
/// bytes, within one source) is a repeat; a different message that reuses an
/// id (another body or destination) and a replay that came back (its
/// `redrive-plan-id`) are new dead letters. `v2:` and the hex SHA-256 of the
/// three texts (NUL shown as U+FFFD, as stored), each followed by a NUL byte,
/// then `body_sha256`; migration 0012 computes the same in SQL for rows
/// stored before.
pub fn dedup_key(
    destination: &str,
    message_id: Option<&str>,
    redrive_plan_id: Option<&str>,
    body_sha256: &[u8; 32],
) -> String {
    let mut hasher = Sha256::new();
    for part in [
        destination,
        message_id.unwrap_or(""),
        redrive_plan_id.unwrap_or(""),
    ] {
        hasher.update(part.replace('\0', "\u{fffd}").as_bytes());
        hasher.update([0u8]);
    }
    hasher.update(body_sha256);
    format!("v2:{}", hex::encode(hasher.finalize()))
}

/// The header in which a quorum queue counts a message's returns; it
/// changes with every redelivery, so capture fingerprints leave it out.
pub const DELIVERY_COUNT_HEADER: &str = "x-delivery-count";

/// Raw material of a dead letter, before extraction.
#[derive(Debug, Clone)]
pub struct RawDeadLetter {
    /// DLQ name or import label.
    pub source: String,
    /// Where it came from.
    pub origin: Origin,
    /// Exact body bytes.
    pub body: Vec<u8>,
    /// AMQP properties (without headers).
    pub properties: MessageProperties,
    /// AMQP headers, typed.
    pub headers: HeaderTable,
    /// RabbitMQ's redelivered flag; false for ingest.
    pub redelivered: bool,
    /// Ingest only: the reason the service gave (used when no x-death says more).
    pub reason: Option<String>,
    /// Ingest only: where it was going.
    pub original_destination: Option<String>,
    /// Ingest only: error text.
    pub error_text: Option<String>,
    /// Ingest only: delivery attempts made.
    pub attempts: Option<u32>,
    /// Original event time, when known from outside the message.
    pub occurred_at: Option<DateTime<Utc>>,
    /// When the planner received it.
    pub captured_at: DateTime<Utc>,
}

impl RawDeadLetter {
    /// A dead letter as RabbitMQ delivered it from the DLQ `source`, received
    /// at `captured_at`: none of the facts only an ingest gives.
    pub fn from_queue(
        source: &str,
        body: Vec<u8>,
        properties: MessageProperties,
        headers: HeaderTable,
        redelivered: bool,
        captured_at: DateTime<Utc>,
    ) -> Self {
        Self {
            source: source.to_owned(),
            origin: Origin::Rabbitmq,
            body,
            properties,
            headers,
            redelivered,
            reason: None,
            original_destination: None,
            error_text: None,
            attempts: None,
            occurred_at: None,
            captured_at,
        }
    }
}

/// A dead letter ready to be stored.
#[derive(Debug, Clone)]
pub struct NewDeadLetter {
    /// DLQ name or import label.
    pub source: String,
    /// Where it came from.
    pub origin: Origin,
    /// How a repeat of it is recognized.
    pub dedup: Dedup,
    /// SHA-256 over source, body hash, encoded properties and headers.
    pub fingerprint: [u8; 32],
    /// `message_id` property, if any.
    pub message_id: Option<String>,
    /// Idempotency key.
    pub message_key: String,
    /// Exact body bytes.
    pub body: Vec<u8>,
    /// SHA-256 of the body.
    pub body_sha256: [u8; 32],
    /// Larger than the body limit.
    pub body_oversized: bool,
    /// Why the message cannot be republished as captured, if so: a JSON
    /// content type whose (decoded) body does not parse, a `user_id` the broker
    /// would refuse, an EasyNetQ error wrapper, a message the AMQP client could
    /// not read. The precheck marks it `invalid` with this reason.
    pub body_problem: Option<String>,
    /// Compression recognized by magic bytes.
    pub body_compression: BodyCompression,
    /// Prost-encoded [`MessageProperties`].
    pub properties: Vec<u8>,
    /// Prost-encoded [`HeaderTable`].
    pub headers: Vec<u8>,
    /// The `content_type` property, for SQL.
    pub content_type: Option<String>,
    /// The death that counts, if known.
    pub death: Option<Death>,
    /// Normalized reason class.
    pub reason_class: ReasonClass,
    /// Default replay destination: the queue it failed in; `exchange/routing-key`
    /// when [`Self::exchange_only`]; "" when none can be resolved.
    pub destination: String,
    /// Only the exchange and routing key it was published with are known (a
    /// framework's headers), not its queue: queue mode refuses it, exchange
    /// mode and redirects publish it (docs/design.md, "Destination").
    pub exchange_only: bool,
    /// The exact content header frame payload of a message the AMQP client
    /// could not read (reason class `unreadable`): with the body, the message
    /// byte for byte, kept even if the broker later drops it.
    pub raw_content_header: Option<Vec<u8>>,
    /// Event type (`type` property, else the event-type header).
    pub event_type: Option<String>,
    /// Schema version header.
    pub schema_version: Option<String>,
    /// Producer (`app_id`).
    pub producer: Option<String>,
    /// Error text (ingest field or framework header).
    pub error_text: Option<String>,
    /// Exception or error class a framework header (or the configured
    /// error-class header) names; with the reason class and the error text
    /// it makes the error fingerprint (`error_group`).
    pub error_class: Option<String>,
    /// Delivery attempts reported.
    pub attempts: Option<u32>,
    /// When it died.
    pub died_at: DateTime<Utc>,
    /// When it first died (earliest x-death entry), else `died_at`.
    pub first_died_at: DateTime<Utc>,
    /// Original event time.
    pub occurred_at: Option<DateTime<Utc>>,
    /// When the planner received it.
    pub captured_at: DateTime<Utc>,
    /// The plan whose replay came back (`redrive-plan-id` header).
    pub redrive_plan_id: Option<String>,
    /// Original exchange from a framework header.
    pub original_exchange: Option<String>,
    /// Original routing key from a framework header.
    pub original_routing_key: Option<String>,
    /// Oddities found while capturing.
    pub capture_notes: Vec<String>,
}

/// The header a replay adds to name its plan (docs/design.md, "The replayed message").
pub use redrive_proto::headers::PLAN_ID_HEADER as REDRIVE_PLAN_ID_HEADER;

/// [`ExtractionRules::extract`], on the blocking pool when the body is over
/// [`BLOCKING_BODY_BYTES`], inline otherwise.
pub async fn extract(rules: &std::sync::Arc<ExtractionRules>, raw: RawDeadLetter) -> NewDeadLetter {
    if raw.body.len() <= BLOCKING_BODY_BYTES {
        return rules.extract(raw);
    }
    let rules = std::sync::Arc::clone(rules);
    match tokio::task::spawn_blocking(move || rules.extract(raw)).await {
        Ok(extracted) => extracted,
        // Extraction is a pure function that does not panic on any input
        // (property-tested); were it to, the panic goes on in the caller's
        // task exactly as it would inline.
        Err(error) => std::panic::resume_unwind(error.into_panic()),
    }
}

impl NewDeadLetter {
    /// This dead letter with everything derived dropped, for when PostgreSQL
    /// refuses a derived value (an odd time, a value over a limit): the body,
    /// properties and headers are kept exactly, the death becomes unknown, and
    /// a capture note says why. Nothing is lost; the precheck marks it invalid
    /// when no destination is left.
    pub fn degraded(&self, problem: &str) -> Self {
        let mut degraded = self.clone();
        degraded.death = None;
        // An unreadable placeholder stays one: it must never become replayable.
        let unreadable = self.reason_class == ReasonClass::Unreadable;
        degraded.reason_class = if unreadable {
            ReasonClass::Unreadable
        } else {
            ReasonClass::Unknown
        };
        degraded.event_type = None;
        degraded.schema_version = None;
        degraded.producer = None;
        degraded.error_text = None;
        degraded.error_class = None;
        degraded.attempts = None;
        degraded.occurred_at = None;
        degraded.died_at = self.captured_at;
        degraded.first_died_at = self.captured_at;
        degraded.redrive_plan_id = None;
        degraded.original_exchange = None;
        degraded.original_routing_key = None;
        degraded.content_type = None;
        degraded.body_problem = if unreadable {
            self.body_problem
                .as_ref()
                .map(|p| p.chars().take(2000).collect())
        } else {
            None
        };
        degraded.message_id = self
            .message_id
            .as_ref()
            .map(|id| id.chars().take(255).collect());
        degraded.message_key = self.message_key.chars().take(1024).collect();
        degraded.destination = self.destination.chars().take(255).collect();
        let mut notes: Vec<String> = if unreadable {
            self.capture_notes
                .iter()
                .map(|note| note.chars().take(2000).collect())
                .collect()
        } else {
            Vec::new()
        };
        notes.push(format!(
            "derived fields could not be stored ({}); kept as captured, death unknown",
            problem.chars().take(500).collect::<String>()
        ));
        degraded.capture_notes = notes;
        degraded
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use redrive_proto::v1::{HeaderValue, header_value::Value};

    use super::*;

    fn raw(
        body: Vec<u8>,
        properties: MessageProperties,
        headers: &[(&str, &str)],
    ) -> RawDeadLetter {
        let headers = HeaderTable {
            fields: headers
                .iter()
                .map(|(name, value)| {
                    (
                        (*name).to_owned(),
                        HeaderValue {
                            value: Some(Value::LongString(value.as_bytes().to_vec())),
                        },
                    )
                })
                .collect(),
        };
        RawDeadLetter::from_queue("dlq", body, properties, headers, false, Utc::now())
    }

    fn rules() -> ExtractionRules {
        ExtractionRules {
            key_sources: vec!["json:/order_id".parse().unwrap()],
            publish_user: Some("guest".into()),
            ..ExtractionRules::default()
        }
    }

    #[test]
    fn keys_read_the_decoded_body_of_every_codec() {
        let json = br#"{"order_id":"o-42","n":1}"#;
        let mut gzip = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        gzip.write_all(json).unwrap();
        let mut zlib = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::best());
        zlib.write_all(json).unwrap();
        let zstd = ruzstd::encoding::compress_to_vec(
            &json[..],
            ruzstd::encoding::CompressionLevel::Fastest,
        );
        let json_type = MessageProperties {
            content_type: Some("application/json".into()),
            ..Default::default()
        };
        for (body, encoding) in [
            (gzip.finish().unwrap(), Some("gzip")),
            (zlib.finish().unwrap(), Some("deflate")),
            (zstd, None),
        ] {
            let properties = MessageProperties {
                content_encoding: encoding.map(Into::into),
                ..json_type.clone()
            };
            let extracted = rules().extract(raw(body.clone(), properties, &[]));
            assert_eq!(extracted.message_key, "o-42", "{encoding:?}");
            assert_eq!(extracted.body_problem, None);
            assert_eq!(extracted.body, body, "the captured bytes are kept");
        }
        let unkeyed = ExtractionRules::default().extract(raw(
            br#"{"order_id":"o-42"}"#.to_vec(),
            json_type.clone(),
            &[],
        ));
        assert!(unkeyed.message_key.starts_with("sha256:"));
        assert!(
            unkeyed.capture_notes.iter().any(|n| n.starts_with(
                "message key is the body hash: the message has no message_id property"
            )),
            "the precheck's warning points at this note: {:?}",
            unkeyed.capture_notes
        );
        let fallback =
            rules().extract(raw(b"not json".to_vec(), MessageProperties::default(), &[]));
        assert!(fallback.message_key.starts_with("sha256:"));
        assert!(
            fallback
                .capture_notes
                .iter()
                .any(|n| n.contains("body hash") && n.contains("not JSON")),
            "{:?}",
            fallback.capture_notes
        );
    }

    #[test]
    fn by_default_the_message_id_is_the_key_else_the_body_hash_with_a_note() {
        let defaults = ExtractionRules::default();
        let with_id = MessageProperties {
            message_id: Some("m-50".into()),
            r#type: Some("order.paid".into()),
            ..Default::default()
        };
        let keyed = defaults.extract(raw(br#"{"order_id":"o-1"}"#.to_vec(), with_id, &[]));
        assert_eq!(
            keyed.message_key, "m-50",
            "as the producer wrote it, no suffix"
        );
        assert!(
            !keyed.capture_notes.iter().any(|n| n.contains("body hash")),
            "{:?}",
            keyed.capture_notes
        );
        let body = br#"{"order_id":"o-1"}"#;
        let hashed = defaults.extract(raw(body.to_vec(), MessageProperties::default(), &[]));
        assert_eq!(
            hashed.message_key,
            format!("sha256:{}", hex::encode(Sha256::digest(body)))
        );
        assert!(
            hashed.capture_notes.iter().any(|n| n.starts_with(
                "message key is the body hash: the message has no message_id property"
            )),
            "{:?}",
            hashed.capture_notes
        );
        // A rule whose value cannot be a key says so in the note.
        let by_header = ExtractionRules {
            key_sources: vec!["header:order-id".parse().unwrap()],
            ..ExtractionRules::default()
        };
        let mut flagged = raw(body.to_vec(), MessageProperties::default(), &[]);
        flagged.headers.fields.insert(
            "order-id".into(),
            HeaderValue {
                value: Some(Value::Boolean(true)),
            },
        );
        let flagged = by_header.extract(flagged);
        assert!(flagged.message_key.starts_with("sha256:"));
        assert!(
            flagged.capture_notes.iter().any(|n| n
                == "message key is the body hash: no key from header:order-id: header:order-id is a boolean (true or false cannot tell messages apart)"),
            "{:?}",
            flagged.capture_notes
        );
        let mut numbered = raw(body.to_vec(), MessageProperties::default(), &[]);
        numbered.headers.fields.insert(
            "order-id".into(),
            HeaderValue {
                value: Some(Value::LongLongInt(42)),
            },
        );
        assert_eq!(by_header.extract(numbered).message_key, "42");
    }

    #[test]
    fn a_death_or_event_time_ahead_of_the_capture_is_never_after_it() {
        use redrive_proto::v1::{HeaderArray, HeaderTable as Table};
        let captured_at = DateTime::from_timestamp(1_764_000_000, 0).unwrap();
        let ahead = u64::try_from(captured_at.timestamp() + 3600).unwrap();
        let entry = HeaderValue {
            value: Some(Value::Table(Table {
                fields: [
                    (
                        "reason".to_owned(),
                        HeaderValue {
                            value: Some(Value::LongString(b"rejected".to_vec())),
                        },
                    ),
                    (
                        "queue".to_owned(),
                        HeaderValue {
                            value: Some(Value::LongString(b"work".to_vec())),
                        },
                    ),
                    (
                        "time".to_owned(),
                        HeaderValue {
                            value: Some(Value::Timestamp(ahead)),
                        },
                    ),
                ]
                .into(),
            })),
        };
        let headers = HeaderTable {
            fields: [(
                "x-death".to_owned(),
                HeaderValue {
                    value: Some(Value::Array(HeaderArray {
                        values: vec![entry],
                    })),
                },
            )]
            .into(),
        };
        // A broker (or a service) whose clock runs an hour ahead.
        let extracted = rules().extract(RawDeadLetter::from_queue(
            "dlq",
            b"{}".to_vec(),
            MessageProperties::default(),
            headers,
            false,
            captured_at,
        ));
        assert!(extracted.death.is_some());
        assert_eq!(extracted.died_at, captured_at);
        assert_eq!(extracted.first_died_at, captured_at);
        // An ingested event time a minute ahead (within the skew) is kept,
        // but the death it stands in for is the capture.
        let mut ingested = raw(b"{}".to_vec(), MessageProperties::default(), &[]);
        ingested.captured_at = captured_at;
        ingested.occurred_at = Some(captured_at + chrono::TimeDelta::minutes(1));
        let extracted = rules().extract(ingested);
        assert_eq!(
            extracted.occurred_at,
            Some(captured_at + chrono::TimeDelta::minutes(1))
        );
        assert_eq!(
            (extracted.died_at, extracted.first_died_at),
            (captured_at, captured_at)
        );
    }

    #[test]
    fn the_timestamp_property_and_the_event_time_header_read_every_unit() {
        let at = DateTime::from_timestamp(1_764_670_000, 0).unwrap();
        let stamped = |timestamp: u64| MessageProperties {
            timestamp: Some(timestamp),
            ..Default::default()
        };
        for (timestamp, unit) in [
            (1_764_670_000, None),
            (1_764_670_000_000, Some("milliseconds")),
            (1_764_670_000_000_000, Some("microseconds")),
        ] {
            let extracted = rules().extract(raw(b"{}".to_vec(), stamped(timestamp), &[]));
            assert_eq!(extracted.occurred_at, Some(at), "{timestamp}");
            let noted = extracted
                .capture_notes
                .iter()
                .any(|note| note.contains("timestamp property") && note.contains("read as"));
            assert_eq!(
                noted,
                unit.is_some(),
                "{timestamp}: {:?}",
                extracted.capture_notes
            );
        }
        for implausible in [7_u64, 100_000_000_000, u64::MAX] {
            let extracted = rules().extract(raw(b"{}".to_vec(), stamped(implausible), &[]));
            assert_eq!(extracted.occurred_at, None);
            assert!(
                extracted
                    .capture_notes
                    .iter()
                    .any(|note| note.contains(&format!(
                        "timestamp property not read: {implausible} is not a plausible time"
                    ))),
                "{:?}",
                extracted.capture_notes
            );
        }
        let with_header = ExtractionRules {
            event_time_header: Some("occurred-at".into()),
            ..rules()
        };
        let extracted = with_header.extract(raw(
            b"{}".to_vec(),
            stamped(1_000_000_000),
            &[("occurred-at", "2025-12-02T10:06:40Z")],
        ));
        assert_eq!(extracted.occurred_at, Some(at), "the header comes first");
        let extracted = with_header.extract(raw(
            b"{}".to_vec(),
            stamped(1_764_670_000_000),
            &[("occurred-at", "soon")],
        ));
        assert_eq!(extracted.occurred_at, Some(at), "then the property");
        assert!(
            extracted
                .capture_notes
                .iter()
                .any(|note| note.contains("event time header \"occurred-at\" not read")),
            "{:?}",
            extracted.capture_notes
        );
    }

    #[test]
    fn what_the_broker_would_refuse_or_misroute_is_not_republishable() {
        let foreign_user = MessageProperties {
            user_id: Some("billing-svc".into()),
            ..Default::default()
        };
        let extracted = rules().extract(raw(
            b"{}".to_vec(),
            foreign_user,
            &[
                ("x-last-death-reason", "rejected"),
                ("x-last-death-queue", "work"),
            ],
        ));
        assert!(
            extracted
                .body_problem
                .unwrap()
                .contains("validated-user-id")
        );
        let spring = rules().extract(raw(
            b"{}".to_vec(),
            MessageProperties::default(),
            &[
                ("x-original-exchange", "orders"),
                ("x-original-routingKey", "order.created"),
            ],
        ));
        assert_eq!(
            spring.destination, "orders/order.created",
            "a route, never a routing key taken as a queue name"
        );
        assert!(spring.exchange_only);
        assert_eq!(spring.body_problem, None);
        let note = spring.capture_notes.join("\n");
        assert!(
            note.contains("exchange-mode") && note.contains("Spring AMQP"),
            "{note}"
        );
        let masstransit = rules().extract(raw(
            b"{}".to_vec(),
            MessageProperties::default(),
            &[("MT-Fault-InputAddress", "rabbitmq://localhost/shop/fulfil")],
        ));
        assert_eq!(masstransit.destination, "fulfil");
        assert!(!masstransit.exchange_only);
        assert_eq!(masstransit.body_problem, None);
    }

    use sha2::{Digest, Sha256};

    use super::dedup_key;

    fn body_hash(body: &[u8]) -> [u8; 32] {
        Sha256::digest(body).into()
    }

    #[test]
    fn the_import_key_matches_what_migration_0012_computes() {
        // The value migration 0012's SQL gives a row imported to `orders.a`
        // with message id `m-1`, no `redrive-plan-id` and body `{"a":1}`.
        assert_eq!(
            dedup_key("orders.a", Some("m-1"), None, &body_hash(br#"{"a":1}"#)),
            "v2:5f70f74de21854f94ef043425f4c3e342b25e40f264377795f210d415445b7c0"
        );
    }

    #[test]
    fn the_import_key_tells_destination_id_plan_and_body_apart() {
        let body = body_hash(b"{}");
        let base = dedup_key("a", Some("m-1"), None, &body);
        assert_eq!(base, dedup_key("a", Some("m-1"), None, &body), "a repeat");
        for other in [
            dedup_key("b", Some("m-1"), None, &body),
            dedup_key("a", Some("m-2"), None, &body),
            dedup_key("a", None, None, &body),
            dedup_key("a", Some("m-1"), Some("plan"), &body),
            dedup_key("a", Some("m-1"), None, &body_hash(b"[]")),
            // Field boundaries are kept: moving text across them changes the key.
            dedup_key("am-1", Some(""), None, &body),
        ] {
            assert_ne!(base, other);
        }
    }

    #[test]
    fn a_quorum_queue_redelivery_keeps_its_fingerprint() {
        let first = rules().extract(raw(b"{}".to_vec(), MessageProperties::default(), &[]));
        let again = rules().extract(raw(
            b"{}".to_vec(),
            MessageProperties::default(),
            &[("x-delivery-count", "1")],
        ));
        let other = rules().extract(raw(
            b"{}".to_vec(),
            MessageProperties::default(),
            &[("tenant", "1")],
        ));
        assert_eq!(first.fingerprint, again.fingerprint);
        assert_ne!(first.fingerprint, other.fingerprint);
    }
}
