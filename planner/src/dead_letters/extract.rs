//! [`ExtractionRules::extract`], step by step: read the body, find what
//! would make a replay go wrong, the death and destination, the message key,
//! the times, and the identity by which a copy is found again.

use chrono::{DateTime, Utc};
use prost::Message;
use redrive_proto::v1::{BodyCompression, HeaderTable, MessageProperties, Origin};
use sha2::{Digest, Sha256};

use super::{
    DELIVERY_COUNT_HEADER, Dedup, ExtractionRules, NewDeadLetter, REDRIVE_PLAN_ID_HEADER,
    RawDeadLetter, body, death, death::Death, dedup_key, event_time, message_key,
    message_key::KeySource,
};

impl ExtractionRules {
    /// The capture note of a dead letter keyed by its body hash because no
    /// rule gave a key: which rules were tried and why none gave one.
    fn body_hash_note(
        &self,
        key: &message_key::MessageKey,
        unreadable: Option<&str>,
        json_error: Option<&str>,
    ) -> String {
        if self.key_sources.is_empty() {
            return "message key is the body hash: the message has no message_id property \
                    (the default key); without one, only byte-identical bodies are duplicates \
                    (--message-key can key by a header or a body field)"
                .to_owned();
        }
        let sources = self
            .key_sources
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ");
        let why = if let Some(error) = unreadable {
            format!("the body could not be decoded ({error})")
        } else if let Some(error) =
            json_error.filter(|_| self.key_sources.iter().any(KeySource::needs_json))
        {
            format!("the body is not JSON ({error})")
        } else if !key.unusable.is_empty() {
            key.unusable.join("; ")
        } else {
            "none of them has a value in this message".to_owned()
        };
        format!("message key is the body hash: no key from {sources}: {why}")
    }

    /// Derives a storable dead letter from `raw`. Never fails: anything odd is
    /// kept and noted. Costs a SHA-256 of the body and, when a key source or a
    /// JSON content type asks for it, a JSON parse; call it from
    /// `spawn_blocking` for bodies over
    /// [`BLOCKING_BODY_BYTES`](super::BLOCKING_BODY_BYTES).
    pub fn extract(&self, raw: RawDeadLetter) -> NewDeadLetter {
        let body_sha256: [u8; 32] = Sha256::digest(&raw.body).into();
        let body_sha256_hex = hex::encode(body_sha256);
        let mut info = death::analyze(&raw.headers, &self.error_class_header);
        let mut notes = std::mem::take(&mut info.notes);
        let reading = self.read_body(&raw, &mut notes);
        let easynetq = reading.json.as_ref().and_then(death::easynetq_error);
        let body_problem = self.body_problem(&raw, &reading, easynetq.as_ref(), &mut info);

        let event_type = raw
            .properties
            .r#type
            .clone()
            .or_else(|| death::text_of(&raw.headers, &self.event_type_header))
            .filter(|value| !value.is_empty());
        let schema_version = death::text_of(&raw.headers, &self.schema_version_header);
        let producer = raw.properties.app_id.clone();
        let message_key = message_key::message_key(
            &self.key_sources,
            &raw.properties,
            &raw.headers,
            reading.json.as_ref(),
            event_type.as_deref(),
            &body_sha256_hex,
        );

        let death = info.death.take().or_else(|| {
            raw.reason.as_ref().map(|reason| Death {
                reason: reason.clone(),
                queue: raw.original_destination.clone().unwrap_or_default(),
                count: u64::from(raw.attempts.unwrap_or(1)),
                ..Death::default()
            })
        });
        let reason_class = death::reason_class(
            death.as_ref().map(|death| death.reason.as_str()),
            info.error_class.as_deref(),
        );
        let (destination, exchange_only) =
            destination_of(&raw, death.as_ref(), &info, easynetq.as_ref(), &mut notes);
        if !info.frameworks.is_empty() {
            notes.push(format!("read as {}", info.frameworks.join(", ")));
        }
        if message_key.is_fallback() {
            notes.push(self.body_hash_note(
                &message_key,
                reading.unreadable.as_deref(),
                reading.json_error.as_deref(),
            ));
        }
        let times = self.times(&raw, death.as_ref(), &mut notes);
        let properties = raw.properties.encode_to_vec();
        let headers = raw.headers.encode_to_vec();
        let fingerprint = fingerprint(&raw, &body_sha256, &properties, &headers);
        let redrive_plan_id = death::text_of(&raw.headers, REDRIVE_PLAN_ID_HEADER);
        let dedup = dedup_of(&raw, &destination, redrive_plan_id.as_deref(), &body_sha256);

        NewDeadLetter {
            redrive_plan_id,
            source: raw.source,
            origin: raw.origin,
            dedup,
            fingerprint,
            message_id: raw.properties.message_id.clone(),
            message_key: message_key.key,
            body_sha256,
            body_oversized: reading.oversized,
            body_problem,
            body_compression: reading.compression,
            content_type: raw.properties.content_type.clone(),
            properties,
            headers,
            death,
            reason_class,
            destination,
            exchange_only,
            raw_content_header: None,
            event_type,
            schema_version,
            producer,
            error_text: raw.error_text.or(info.error_text),
            error_class: info.error_class,
            attempts: raw.attempts,
            first_died_at: times.first_died_at,
            died_at: times.died_at,
            occurred_at: times.occurred_at,
            captured_at: raw.captured_at,
            original_exchange: info.original_exchange,
            original_routing_key: info.original_routing_key,
            capture_notes: notes,
            body: raw.body,
        }
    }

    /// Reads the body as far as the rules need: its size against
    /// [`ExtractionRules::max_body_bytes`], its compression, and, when the
    /// content type says JSON or a key source needs it, the decoded body
    /// parsed as JSON. Keys, checks and event times read the decoded body;
    /// the stored and replayed bytes stay the captured ones. An oversized
    /// or undecodable body is noted in `notes`.
    fn read_body(&self, raw: &RawDeadLetter, notes: &mut Vec<String>) -> BodyReading {
        let oversized = raw.body.len() > self.max_body_bytes;
        if oversized {
            notes.push(format!(
                "body of {} bytes is over the {}-byte limit: kept, not replayable",
                raw.body.len(),
                self.max_body_bytes
            ));
        }
        let declares_json = raw
            .properties
            .content_type
            .as_deref()
            .is_some_and(|content_type| content_type.to_ascii_lowercase().contains("json"));
        let wants_json = declares_json || self.key_sources.iter().any(KeySource::needs_json);
        let compression = body::sniff(&raw.body);
        let declared = body::declared_encoding(&raw.properties, &raw.headers);
        let mut unreadable: Option<String> = None;
        let (json, json_error) = if wants_json && !oversized {
            match body::decode(&raw.body, declared.as_deref(), self.max_body_bytes) {
                Ok((decoded, _)) => match serde_json::from_slice::<serde_json::Value>(&decoded) {
                    Ok(json) => (Some(json), None),
                    Err(error) => (None, Some(error.to_string())),
                },
                Err(error) => {
                    notes.push(format!("body not read: {error}"));
                    unreadable = Some(error.to_string());
                    (None, None)
                }
            }
        } else {
            (None, None)
        };
        BodyReading {
            oversized,
            declares_json,
            compression,
            json,
            json_error,
            unreadable,
        }
    }

    /// Why a replay of this body would go wrong, the first that applies: a
    /// JSON content type whose body does not parse, a `user_id` RabbitMQ
    /// would refuse from Redrive's user, or an EasyNetQ error wrapper (which
    /// also marks `info` as read as EasyNetQ and takes its error text).
    fn body_problem(
        &self,
        raw: &RawDeadLetter,
        reading: &BodyReading,
        easynetq: Option<&death::EasyNetQError>,
        info: &mut death::DeathInfo,
    ) -> Option<String> {
        let mut body_problem = match (reading.declares_json, &reading.json_error) {
            (true, Some(error)) => Some(format!(
                "content type {} but the body does not parse as JSON: {error}",
                raw.properties.content_type.as_deref().unwrap_or_default()
            )),
            _ => None,
        };
        if let (Some(user), Some(publisher)) = (
            raw.properties.user_id.as_deref().filter(|u| !u.is_empty()),
            self.publish_user.as_deref(),
        ) && user != publisher
        {
            body_problem.get_or_insert_with(|| {
                format!(
                    "user_id {user:?} is not the user Redrive publishes as ({publisher:?}): RabbitMQ would refuse the replay (rabbitmq.com/docs/validated-user-id)"
                )
            });
        }
        if let Some(wrapper) = easynetq {
            info.frameworks.push("EasyNetQ");
            info.error_text
                .get_or_insert_with(|| wrapper.error_text.clone());
            body_problem.get_or_insert_with(|| {
                format!(
                    "EasyNetQ error wrapper: the original body ({} bytes) is inside its Message field; republishing the wrapper would hand the consumer an error record (replay it with EasyNetQ's tools or import the inner message)",
                    wrapper.inner_body_bytes
                )
            });
        }
        body_problem
    }

    /// When the message was made, died last and died first: the event time
    /// the capture gave or [`ExtractionRules::event_time`] reads, the death's
    /// times, falling back to the event time and then to the capture time.
    fn times(&self, raw: &RawDeadLetter, death: Option<&Death>, notes: &mut Vec<String>) -> Times {
        // The event cannot have happened after the message first died, nor
        // (a death unknown) after it reached the planner.
        let bound = match death.and_then(|death| death.first_time.or(death.time)) {
            Some(first_death) => (first_death, "its first death"),
            None => (raw.captured_at, "its capture"),
        };
        let occurred_at = raw
            .occurred_at
            .or_else(|| self.event_time(&raw.properties, &raw.headers, bound, notes));
        // Without a death, the event time stands in. Neither is ever later
        // than the capture (an event time within the clock skew allowed, a
        // broker or a service whose clock runs ahead): a message that
        // reached the planner died no later than that.
        let died_at = death
            .and_then(|death| death.time)
            .or(occurred_at)
            .map_or(raw.captured_at, |at| at.min(raw.captured_at));
        let first_died_at = death
            .and_then(|death| death.first_time)
            .map_or(died_at, |at| at.min(died_at));
        Times {
            occurred_at,
            died_at,
            first_died_at,
        }
    }

    /// The original event time a message carries: the
    /// [`ExtractionRules::event_time_header`] when present, else the
    /// `timestamp` property, each read by [`event_time`]'s one rule
    /// (seconds, milliseconds, microseconds or nanoseconds by range; text
    /// as RFC 3339 / ISO 8601). A value that is not a plausible time, or a
    /// number read in a unit other than the seconds AMQP 0-9-1 specifies
    /// (§4.2.5.4), is noted in `notes`; so is a time more than
    /// [`event_time::CLOCK_SKEW`] after `bound` (`(time, its name)`: the
    /// message's first death, else its capture), which is not read.
    pub fn event_time(
        &self,
        properties: &MessageProperties,
        headers: &HeaderTable,
        bound: (DateTime<Utc>, &str),
        notes: &mut Vec<String>,
    ) -> Option<DateTime<Utc>> {
        if let Some(name) = self.event_time_header.as_deref()
            && let Some(value) = headers.fields.get(name)
        {
            match event_time::from_header(value)
                .and_then(|read| event_time::not_after(read.at, bound.0, bound.1))
            {
                Ok(at) => return Some(at),
                Err(why) => notes.push(format!(
                    "event time header {name:?} not read: {why}; the timestamp property or the first death counts instead"
                )),
            }
        }
        let timestamp = properties.timestamp?;
        let read = event_time::from_epoch(i128::from(timestamp))
            .and_then(|read| event_time::not_after(read.at, bound.0, bound.1).map(|_| read));
        match read {
            Ok(read) => {
                if read.unit != event_time::Unit::Seconds {
                    notes.push(format!(
                        "timestamp property {timestamp} read as {} since 1970 (AMQP 0-9-1 specifies seconds)",
                        read.unit.name()
                    ));
                }
                Some(read.at)
            }
            Err(why) => {
                notes.push(format!(
                    "timestamp property not read: {why}; the first death counts as its event time"
                ));
                None
            }
        }
    }
}

/// What [`ExtractionRules::extract`] read of a body.
struct BodyReading {
    /// Over [`ExtractionRules::max_body_bytes`]: kept, never parsed.
    oversized: bool,
    /// The content type says JSON.
    declares_json: bool,
    /// The compression the bytes show.
    compression: BodyCompression,
    /// The decoded body as JSON, when it was read and parses.
    json: Option<serde_json::Value>,
    /// Why the decoded body does not parse as JSON.
    json_error: Option<String>,
    /// Why the body could not be decoded.
    unreadable: Option<String>,
}

/// A dead letter's times ([`ExtractionRules::times`]).
struct Times {
    occurred_at: Option<DateTime<Utc>>,
    died_at: DateTime<Utc>,
    first_died_at: DateTime<Utc>,
}

/// The queue a dead letter failed in, and whether only an exchange and
/// routing key are known instead (then `exchange/routing-key`, noted in
/// `notes`). A queue, never a routing key (a routing key is not a queue
/// name): the capture's original destination, the death's queue, a
/// framework header's queue, an EasyNetQ wrapper's queue.
fn destination_of(
    raw: &RawDeadLetter,
    death: Option<&Death>,
    info: &death::DeathInfo,
    easynetq: Option<&death::EasyNetQError>,
    notes: &mut Vec<String>,
) -> (String, bool) {
    let destination = raw
        .original_destination
        .clone()
        .or_else(|| death.map(|death| death.queue.clone()))
        .filter(|queue| !queue.is_empty())
        .or_else(|| info.original_queue.clone())
        .or_else(|| easynetq.map(|wrapper| wrapper.queue.clone()))
        .filter(|queue| !queue.is_empty())
        .unwrap_or_default();
    if !destination.is_empty() {
        return (destination, false);
    }
    if info.original_exchange.is_none() && info.original_routing_key.is_none() {
        notes.push("no destination: neither x-death nor a framework header names one".to_owned());
        return (destination, false);
    }
    let exchange = info.original_exchange.as_deref().unwrap_or_default();
    let routing_key = info.original_routing_key.as_deref().unwrap_or_default();
    notes.push(format!(
        "only exchange {exchange:?} and routing key {routing_key:?} are known (from {} headers), not the queue it failed in: a routing key is not a queue name, so a queue-mode plan refuses it; replay it with {}",
        info.frameworks.join(", "),
        if info.original_exchange.is_some() {
            "an exchange-mode plan or a redirect"
        } else {
            "a redirect (no exchange is known)"
        }
    ));
    (format!("{exchange}/{routing_key}"), true)
}

/// The identity of a delivery: SHA-256 over the source, the body hash, the
/// encoded properties and the encoded headers, each length-prefixed. A
/// quorum queue counts each return in `x-delivery-count` (RabbitMQ, "Quorum
/// Queues", poison message handling): a redelivery must still match its
/// stored copy, so that header is not part of the identity.
fn fingerprint(
    raw: &RawDeadLetter,
    body_sha256: &[u8; 32],
    properties: &[u8],
    headers: &[u8],
) -> [u8; 32] {
    let fingerprinted_headers = if raw.headers.fields.contains_key(DELIVERY_COUNT_HEADER) {
        let mut headers = raw.headers.clone();
        headers.fields.remove(DELIVERY_COUNT_HEADER);
        headers.encode_to_vec()
    } else {
        headers.to_vec()
    };
    let mut hasher = Sha256::new();
    for part in [
        raw.source.as_bytes(),
        body_sha256,
        properties,
        &fingerprinted_headers,
    ] {
        hasher.update((part.len() as u64).to_be_bytes());
        hasher.update(part);
    }
    hasher.finalize().into()
}

/// How a stored copy of this dead letter is found again: a redelivery from
/// RabbitMQ by its fingerprint, an ingested or imported one by its
/// [`dedup_key`], a first delivery not at all.
fn dedup_of(
    raw: &RawDeadLetter,
    destination: &str,
    redrive_plan_id: Option<&str>,
    body_sha256: &[u8; 32],
) -> Dedup {
    match raw.origin {
        Origin::Rabbitmq if raw.redelivered => Dedup::Fingerprint,
        Origin::Rabbitmq | Origin::Unspecified => Dedup::None,
        Origin::Ingest | Origin::Import => Dedup::Key(dedup_key(
            destination,
            raw.properties.message_id.as_deref(),
            redrive_plan_id,
            body_sha256,
        )),
    }
}
