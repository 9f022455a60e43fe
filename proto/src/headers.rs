//! The header rules every part shares: the replayed message's table
//! ([`BROKER_FIELDS`]: which properties and headers the broker acts on
//! again, and what a replay does with each), the headers of a replay
//! ([`replay_headers`]), and the names every part shares on the wire: the
//! AMQP headers a replay adds to a message (`redrive-*`, without the `x-` prefix: since RabbitMQ 3.13
//! `x-` headers belong to the broker), the broker's own dead-letter headers
//! (RabbitMQ docs, "Dead Letter Exchanges": `x-death`, `x-first-death-*`,
//! `x-last-death-*`), the W3C `traceparent`, and the gRPC metadata naming
//! the person a call is made for. The planner reads what the executor
//! writes by these names, so each is written once, here.

use crate::v1;

/// The plan a replayed copy belongs to (docs/design.md, "The replayed
/// message"): a copy that dies again is a re-dead-letter of that plan.
pub const PLAN_ID_HEADER: &str = "redrive-plan-id";
/// The attempt number of this publish (1-based).
pub const ATTEMPT_HEADER: &str = "redrive-attempt";
/// How many times this message key has been redriven, this replay included.
pub const COUNT_HEADER: &str = "redrive-count";
/// The death reason of the dead letter being replayed.
pub const REASON_HEADER: &str = "redrive-dead-letter-reason";
/// The executor that published this copy (its `--executor-id`, as in the
/// audit): two copies of one message id from two executors are a lease
/// takeover, and the audit's `uncertain` says why.
pub const EXECUTOR_ID_HEADER: &str = "redrive-executor-id";
/// W3C Trace Context (<https://www.w3.org/TR/trace-context/>).
pub const TRACEPARENT_HEADER: &str = "traceparent";

/// The broker's death history, an array of tables, newest first.
pub const X_DEATH: &str = "x-death";
/// The broker's first death, flattened (`x-first-death-reason`, `-queue`,
/// `-exchange`), RabbitMQ 3.8+.
pub const FIRST_DEATH_PREFIX: &str = "x-first-death-";
/// The broker's last death, flattened, RabbitMQ 3.13+.
pub const LAST_DEATH_PREFIX: &str = "x-last-death-";

/// gRPC request metadata naming the person or system a call is made for:
/// the actor itself without authentication; with it, the user a principal
/// with the `delegate` permission acts for.
pub const ACTOR_METADATA: &str = "x-redrive-actor";

/// What a replay does with one broker-interpreted field of the captured message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Treatment {
    /// Republished byte-identical.
    Kept,
    /// Not republished.
    Dropped,
}

/// How a field is named in [`BROKER_FIELDS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldName {
    /// An AMQP basic property, by its AMQP 0-9-1 name.
    Property(&'static str),
    /// A header, matched exactly (RabbitMQ compares header names byte-wise).
    Header(&'static str),
    /// Every header whose name starts with this prefix.
    HeaderPrefix(&'static str),
}

/// One row of the replayed-message table: a field RabbitMQ interprets when a
/// message is published, what a replay does with it and why.
#[derive(Debug, Clone, Copy)]
pub struct BrokerField {
    /// The property or header.
    pub name: FieldName,
    /// Kept or dropped.
    pub treatment: Treatment,
    /// Why, with the RabbitMQ documentation section the rule comes from.
    pub why: &'static str,
}

/// THE table of the replayed message (docs/design.md, "The replayed message"):
/// every property and header the broker acts on at publish time. A replay must
/// reach only the queue the message failed in and be accepted by the broker;
/// everything not listed here (message id, correlation id, content type and
/// encoding, type, app id, timestamp, priority, reply-to, cluster id, the
/// application's headers) is republished byte-identical. `delivery_mode` is
/// always 2 (persistent). Redrive adds its own `redrive-*` headers and a
/// `traceparent` (see the constants above).
///
/// The planner's precheck reads the same rules from the captured message:
/// a `user_id` other than the user Redrive publishes as is `invalid` there,
/// since the broker would refuse every attempt.
pub const BROKER_FIELDS: &[BrokerField] = &[
    BrokerField {
        name: FieldName::Header("CC"),
        treatment: Treatment::Dropped,
        why: "sender-selected distribution: the broker routes a copy to every queue the CC \
              routing keys reach, so a replay would hand healthy queues a second copy \
              (rabbitmq.com/docs/sender-selected, \"Sender-selected Distribution\")",
    },
    BrokerField {
        name: FieldName::Header("BCC"),
        treatment: Treatment::Dropped,
        why: "sender-selected distribution, like CC, and removed by the broker before \
              delivery (rabbitmq.com/docs/sender-selected)",
    },
    BrokerField {
        name: FieldName::Property("user_id"),
        treatment: Treatment::Kept,
        why: "validated user-id: the broker refuses a publish whose user_id is not the \
              connection's user (rabbitmq.com/docs/validated-user-id); kept because \
              consumers trust it, and the precheck marks it invalid when it differs \
              from the user Redrive publishes as",
    },
    BrokerField {
        name: FieldName::Property("expiration"),
        treatment: Treatment::Dropped,
        why: "per-message TTL: the broker discards or dead-letters the message when it \
              runs out; RabbitMQ itself removes it when it dead-letters a message so that \
              it does not expire again (rabbitmq.com/docs/ttl, \"Per-Message TTL in \
              Publishers\"; rabbitmq.com/docs/dlx, \"Dead-Lettered Messages\"); the \
              precheck's stale rule decides instead",
    },
    BrokerField {
        name: FieldName::Header(X_DEATH),
        treatment: Treatment::Dropped,
        why: "the broker's dead-lettering history; it restarts with the replay and \
              RabbitMQ 3.13+ ignores or refuses it from publishers \
              (rabbitmq.com/docs/dlx, \"Dead-Lettered Messages\")",
    },
    BrokerField {
        name: FieldName::HeaderPrefix(FIRST_DEATH_PREFIX),
        treatment: Treatment::Dropped,
        why: "the broker's dead-lettering history (rabbitmq.com/docs/dlx)",
    },
    BrokerField {
        name: FieldName::HeaderPrefix(LAST_DEATH_PREFIX),
        treatment: Treatment::Dropped,
        why: "the broker's dead-lettering history (rabbitmq.com/docs/dlx)",
    },
    BrokerField {
        name: FieldName::Header("x-delivery-count"),
        treatment: Treatment::Dropped,
        why: "quorum queues count deliveries in it; a replay is a new message whose count \
              starts again (rabbitmq.com/docs/quorum-queues, \"Poison Message Handling\")",
    },
    BrokerField {
        name: FieldName::Header("x-delay"),
        treatment: Treatment::Dropped,
        why: "the delayed-message exchange plugin holds a message that long before \
              routing it; the delay was served on the first publish \
              (github.com/rabbitmq/rabbitmq-delayed-message-exchange, README \"Usage\")",
    },
    BrokerField {
        name: FieldName::Header("x-received-from"),
        treatment: Treatment::Dropped,
        why: "federation's loop detection: a replay carrying it may be refused by a \
              federated exchange as already seen (rabbitmq.com/docs/federated-exchanges, \
              \"Loop Detection\")",
    },
    BrokerField {
        name: FieldName::Header("x-match"),
        treatment: Treatment::Kept,
        why: "a headers exchange reads x-match from the binding's arguments, never from \
              the message, and ignores x- headers when matching \
              (rabbitmq.com/tutorials/amqp-concepts, \"Headers Exchange\"); kept as an \
              application header",
    },
];

/// Whether the replay drops header `name` ([`BROKER_FIELDS`]).
pub fn drops_header(name: &str) -> bool {
    BROKER_FIELDS.iter().any(|field| {
        field.treatment == Treatment::Dropped
            && match field.name {
                FieldName::Header(header) => header == name,
                FieldName::HeaderPrefix(prefix) => name.starts_with(prefix),
                FieldName::Property(_) => false,
            }
    })
}

/// Whether the replay drops property `name` ([`BROKER_FIELDS`]).
pub fn drops_property(name: &str) -> bool {
    BROKER_FIELDS.iter().any(|field| {
        field.treatment == Treatment::Dropped
            && matches!(field.name, FieldName::Property(property) if property == name)
    })
}

/// What a replay adds to the headers it keeps ([`replay_headers`]).
#[derive(Debug, Clone, Copy)]
pub struct ReplayStamp<'a> {
    /// The plan's id ([`PLAN_ID_HEADER`]).
    pub plan_id: &'a str,
    /// The publishing executor's `--executor-id` ([`EXECUTOR_ID_HEADER`]).
    pub executor_id: &'a str,
    /// This publish's attempt, 1-based ([`ATTEMPT_HEADER`]).
    pub attempt: u32,
    /// How many times the message key has been redriven, this replay
    /// included ([`COUNT_HEADER`]).
    pub count: u32,
    /// The dead letter's death reason, when it has a death
    /// ([`REASON_HEADER`]).
    pub reason: Option<&'a str>,
    /// The W3C `traceparent` the copy carries ([`TRACEPARENT_HEADER`]).
    pub traceparent: &'a str,
}

/// The headers of the replay of a message captured with `stored`: each
/// header [`BROKER_FIELDS`] does not drop, as captured, then the headers of
/// `stamp` (replacing any the captured message carried under those names).
/// Integers go as AMQP `long-int` (i32, saturating), text as `long-string`.
/// The one rule for what a replay publishes: the executor publishes this,
/// and a preview of a plan shows it.
pub fn replay_headers(stored: &v1::HeaderTable, stamp: &ReplayStamp<'_>) -> v1::HeaderTable {
    use v1::{HeaderValue, header_value::Value};
    let text = |value: &str| HeaderValue {
        value: Some(Value::LongString(value.as_bytes().to_vec())),
    };
    let integer = |value: u32| HeaderValue {
        value: Some(Value::LongInt(i32::try_from(value).unwrap_or(i32::MAX))),
    };
    let mut fields: std::collections::BTreeMap<String, HeaderValue> = stored
        .fields
        .iter()
        .filter(|(name, _)| !drops_header(name))
        .map(|(name, value)| (name.clone(), value.clone()))
        .collect();
    fields.insert(PLAN_ID_HEADER.to_owned(), text(stamp.plan_id));
    fields.insert(EXECUTOR_ID_HEADER.to_owned(), text(stamp.executor_id));
    fields.insert(ATTEMPT_HEADER.to_owned(), integer(stamp.attempt));
    fields.insert(COUNT_HEADER.to_owned(), integer(stamp.count));
    if let Some(reason) = stamp.reason {
        fields.insert(REASON_HEADER.to_owned(), text(reason));
    }
    fields.insert(TRACEPARENT_HEADER.to_owned(), text(stamp.traceparent));
    v1::HeaderTable { fields }
}

#[cfg(test)]
mod tests {
    use super::*;
    use v1::{HeaderValue, header_value::Value};

    fn table(fields: &[(&str, Value)]) -> v1::HeaderTable {
        v1::HeaderTable {
            fields: fields
                .iter()
                .map(|(name, value)| {
                    (
                        (*name).to_owned(),
                        HeaderValue {
                            value: Some(value.clone()),
                        },
                    )
                })
                .collect(),
        }
    }

    /// Every header the table drops is gone, by name and by prefix; the
    /// application's headers stay as captured; the stamp replaces a
    /// `redrive-*` header the captured message carried (a re-dead-letter of
    /// an earlier replay).
    #[test]
    fn a_replay_keeps_the_applications_headers_and_stamps_its_own() {
        let stored = table(&[
            (X_DEATH, Value::Array(Default::default())),
            ("x-first-death-queue", Value::LongString(b"q".to_vec())),
            (
                "x-last-death-reason",
                Value::LongString(b"expired".to_vec()),
            ),
            ("CC", Value::Array(Default::default())),
            ("x-delivery-count", Value::LongInt(4)),
            ("x-match", Value::LongString(b"any".to_vec())),
            ("tenant", Value::LongString(b"acme".to_vec())),
            (PLAN_ID_HEADER, Value::LongString(b"an-older-plan".to_vec())),
            (COUNT_HEADER, Value::LongInt(1)),
        ]);
        let headers = replay_headers(
            &stored,
            &ReplayStamp {
                plan_id: "p-2",
                executor_id: "e-1",
                attempt: 3,
                count: u32::MAX,
                reason: None,
                traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            },
        );
        let names: Vec<&str> = headers.fields.keys().map(String::as_str).collect();
        assert_eq!(
            names,
            [
                "redrive-attempt",
                "redrive-count",
                "redrive-executor-id",
                "redrive-plan-id",
                "tenant",
                "traceparent",
                "x-match"
            ]
        );
        let value = |name: &str| headers.fields[name].value.clone().unwrap();
        assert_eq!(value(PLAN_ID_HEADER), Value::LongString(b"p-2".to_vec()));
        assert_eq!(value(COUNT_HEADER), Value::LongInt(i32::MAX), "saturates");
        assert_eq!(value(ATTEMPT_HEADER), Value::LongInt(3));
        assert_eq!(value("tenant"), Value::LongString(b"acme".to_vec()));
        assert!(drops_property("expiration"));
        assert!(!drops_property("user_id"));
    }
}
