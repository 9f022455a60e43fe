//! How a message died: the death that counts, its normalized reason class, and
//! what other frameworks' dead-letter headers say.
//!
//! Rules (docs/design.md, "death reason" and "The replayed message"):
//! - The death that counts is the head of `x-death` (RabbitMQ puts the most
//!   recent death first, <https://www.rabbitmq.com/docs/dlx#effects>). When
//!   `x-death` is missing or malformed, `x-last-death-*` then `x-first-death-*`
//!   stand in (routing keys and time are then unknown).
//! - Reason classes: `delivery_limit` → exhausted, `expired` → expired, `maxlen`
//!   → overflow, `rejected` → rejected unless the application said more in an
//!   error-class header (unparseable → poison, business rule → permanent, retries
//!   used up → exhausted); nothing known → unknown.

use chrono::{DateTime, Utc};
use redrive_proto::v1::{HeaderTable, HeaderValue, ReasonClass, header_value::Value};

/// The death that counts for a dead letter.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Death {
    /// RabbitMQ's reason (`rejected`, `expired`, `maxlen`, `delivery_limit`) or
    /// what an importing service said.
    pub reason: String,
    /// The queue the message died in.
    pub queue: String,
    /// The exchange it had been published to.
    pub exchange: String,
    /// The routing keys it had been published with.
    pub routing_keys: Vec<String>,
    /// How many times it died this way.
    pub count: u64,
    /// When it died, to the second.
    pub time: Option<DateTime<Utc>>,
    /// When it first died: the earliest time of any `x-death` entry.
    pub first_time: Option<DateTime<Utc>>,
}

/// What the headers of a dead letter say about its death.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DeathInfo {
    /// The death that counts, if any header names one.
    pub death: Option<Death>,
    /// Oddities found on the way (malformed `x-death`, ...), for the record.
    pub notes: Vec<String>,
    /// Error text from a framework header (Spring `x-exception-message`, ...).
    pub error_text: Option<String>,
    /// Exception or error class from the application or a framework.
    pub error_class: Option<String>,
    /// The queue the message failed in, from a framework header
    /// ([`FRAMEWORKS`]).
    pub original_queue: Option<String>,
    /// Original exchange from a framework header.
    pub original_exchange: Option<String>,
    /// Original routing key (or Kafka topic) from a framework header: never a
    /// queue name.
    pub original_routing_key: Option<String>,
    /// The frameworks whose headers were found, in [`FRAMEWORKS`] order.
    pub frameworks: Vec<&'static str>,
}

/// Latest second PostgreSQL and operators can reasonably hold: 9999-12-31.
const MAX_EPOCH_SECONDS: i64 = 253_402_300_799;

/// A time from epoch seconds, only within years 1970..=9999 (PostgreSQL's
/// `timestamptz` range is narrower than chrono's; anything outside is not a
/// real death or event time).
pub fn epoch_seconds(seconds: i64) -> Option<DateTime<Utc>> {
    if (0..=MAX_EPOCH_SECONDS).contains(&seconds) {
        DateTime::from_timestamp(seconds, 0)
    } else {
        None
    }
}

/// The text of a string-typed header value (long strings lossily as UTF-8).
pub fn header_text(value: &HeaderValue) -> Option<String> {
    match value.value.as_ref()? {
        Value::LongString(bytes) => Some(String::from_utf8_lossy(bytes).into_owned()),
        Value::ShortString(text) => Some(text.clone()),
        _ => None,
    }
}

fn header_integer(value: &HeaderValue) -> Option<i64> {
    match value.value.as_ref()? {
        Value::ShortShortInt(v) | Value::ShortInt(v) | Value::LongInt(v) => Some(i64::from(*v)),
        Value::ShortShortUint(v) | Value::ShortUint(v) | Value::LongUint(v) => Some(i64::from(*v)),
        Value::LongLongInt(v) => Some(*v),
        Value::Timestamp(v) => i64::try_from(*v).ok(),
        _ => None,
    }
}

/// The text of header `name`, if it is a string.
pub fn text_of(headers: &HeaderTable, name: &str) -> Option<String> {
    headers.fields.get(name).and_then(header_text)
}

/// How a framework writes the queue name in its header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueueForm {
    /// The queue name itself.
    Name,
    /// `name@machine` (NServiceBus): the part before `@`.
    NameAtMachine,
    /// A URI `rabbitmq://host[:port]/[vhost/]queue[?options]` (MassTransit):
    /// the last path segment.
    Address,
}

/// What one framework writes on the messages it moves to its error queue.
#[derive(Debug, Clone, Copy)]
pub struct Framework {
    /// The framework.
    pub name: &'static str,
    /// The header naming the queue the message failed in, and its form.
    pub queue: Option<(&'static str, QueueForm)>,
    /// The header naming the exchange it had been published to.
    pub exchange: Option<&'static str>,
    /// The header naming its routing key (or Kafka topic): never a queue name.
    pub routing_key: Option<&'static str>,
    /// The header with the error text.
    pub error_text: Option<&'static str>,
    /// The header with the exception or error class.
    pub error_class: Option<&'static str>,
}

/// THE table of frameworks' error-queue headers, read in this order (the first
/// framework naming a queue gives the destination). Where each comes from:
/// - MassTransit: `MT-Fault-*` headers on messages moved to `<queue>_error`
///   (masstransit.io, "Exceptions": "Error queues").
/// - NServiceBus: `NServiceBus.FailedQ` and `NServiceBus.ExceptionInfo.*` on
///   messages in `error` (docs.particular.net, "Message headers": "Error
///   forwarding headers").
/// - Rebus: `rbs2-source-queue` and `rbs2-error-details` (Rebus wiki, "Message
///   headers").
/// - Spring AMQP `RepublishMessageRecoverer`: `x-original-exchange`,
///   `x-original-routingKey`, `x-exception-message`, `x-exception-stacktrace`
///   (docs.spring.io/spring-amqp, "Message Listeners and the Asynchronous
///   Case": republishing recoverer). Only an exchange and a routing key: queue
///   mode cannot replay it (a routing key is not a queue name).
/// - Spring Kafka `DeadLetterPublishingRecoverer`: `kafka_dlt-*` (Spring for
///   Apache Kafka, "Publishing Dead-letter Records"); Kafka Connect:
///   `__connect.errors.*` (Kafka Connect, "errors.deadletterqueue.context.
///   headers.enable"). A topic is a routing key here, not a queue.
/// - EasyNetQ wraps the original in its body instead (see [`easynetq_error`]).
pub const FRAMEWORKS: &[Framework] = &[
    Framework {
        name: "MassTransit",
        queue: Some(("MT-Fault-InputAddress", QueueForm::Address)),
        exchange: None,
        routing_key: None,
        error_text: Some("MT-Fault-Message"),
        error_class: Some("MT-Fault-ExceptionType"),
    },
    Framework {
        name: "NServiceBus",
        queue: Some(("NServiceBus.FailedQ", QueueForm::NameAtMachine)),
        exchange: None,
        routing_key: None,
        error_text: Some("NServiceBus.ExceptionInfo.Message"),
        error_class: Some("NServiceBus.ExceptionInfo.ExceptionType"),
    },
    Framework {
        name: "Rebus",
        queue: Some(("rbs2-source-queue", QueueForm::NameAtMachine)),
        exchange: None,
        routing_key: None,
        error_text: Some("rbs2-error-details"),
        error_class: None,
    },
    Framework {
        name: "Spring AMQP",
        queue: None,
        exchange: Some("x-original-exchange"),
        routing_key: Some("x-original-routingKey"),
        error_text: Some("x-exception-message"),
        error_class: None,
    },
    Framework {
        name: "Spring Kafka",
        queue: None,
        exchange: None,
        routing_key: Some("kafka_dlt-original-topic"),
        error_text: Some("kafka_dlt-exception-message"),
        error_class: Some("kafka_dlt-exception-fqcn"),
    },
    Framework {
        name: "Kafka Connect",
        queue: None,
        exchange: None,
        routing_key: Some("__connect.errors.topic"),
        error_text: Some("__connect.errors.exception.message"),
        error_class: Some("__connect.errors.exception.class.name"),
    },
];

/// The queue named by a framework header value of form `form`; `None` when
/// the value is empty or has no queue part.
pub fn queue_from(value: &str, form: QueueForm) -> Option<String> {
    let queue = match form {
        QueueForm::Name => value,
        QueueForm::NameAtMachine => value.split('@').next().unwrap_or_default(),
        QueueForm::Address => {
            let rest = value.split_once("://").map_or(value, |(_, rest)| rest);
            let path = rest.split(['?', '#']).next().unwrap_or_default();
            // Host first, then the vhost (if any), the queue last.
            let (_, path) = path.split_once('/')?;
            path.rsplit('/').next().unwrap_or_default()
        }
    };
    let queue = queue.trim();
    (!queue.is_empty()).then(|| queue.to_owned())
}

/// Spring AMQP's stack trace starts `fully.qualified.Exception: message`.
const SPRING_STACKTRACE_HEADER: &str = "x-exception-stacktrace";

/// What an EasyNetQ error message says: its body is a JSON `Error` object
/// (`RoutingKey`, `Exchange`, `Queue`, `Exception`, `Message` holding the
/// original body, `DateTime`, `BasicProperties`) published to
/// `EasyNetQ_Default_Error_Queue` (EasyNetQ's `DefaultConsumerErrorStrategy`
/// and `EasyNetQ.SystemMessages.Error`). `None` when `json` is not one.
pub fn easynetq_error(json: &serde_json::Value) -> Option<EasyNetQError> {
    let object = json.as_object()?;
    let field = |name: &str| object.get(name).and_then(serde_json::Value::as_str);
    let (queue, message) = (field("Queue")?, field("Message")?);
    field("Exception")?;
    Some(EasyNetQError {
        queue: queue.to_owned(),
        exchange: field("Exchange").unwrap_or_default().to_owned(),
        routing_key: field("RoutingKey").unwrap_or_default().to_owned(),
        error_text: field("Exception").unwrap_or_default().to_owned(),
        inner_body_bytes: message.len(),
    })
}

/// The routing of an EasyNetQ error message ([`easynetq_error`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EasyNetQError {
    /// The queue the message failed in.
    pub queue: String,
    /// The exchange it was published to.
    pub exchange: String,
    /// Its routing key.
    pub routing_key: String,
    /// The exception text.
    pub error_text: String,
    /// Length of the wrapped original body.
    pub inner_body_bytes: usize,
}

/// Reads the death and framework metadata from `headers`.
///
/// `error_class_header` names the application's own error-class header (default
/// `error-class`); it is read before the frameworks' ones.
pub fn analyze(headers: &HeaderTable, error_class_header: &str) -> DeathInfo {
    let mut info = DeathInfo::default();
    info.death = match headers.fields.get(redrive_proto::headers::X_DEATH) {
        None => None,
        Some(value) => match parse_x_death(value) {
            Ok(death) => Some(death),
            Err(problem) => {
                info.notes.push(format!("x-death malformed: {problem}"));
                None
            }
        },
    };
    if info.death.is_none() {
        info.death = fallback_death(headers);
        if info.death.is_some() {
            info.notes
                .push("death taken from x-last-death-* / x-first-death-* headers".to_owned());
        }
    }
    for framework in FRAMEWORKS {
        let queue = framework
            .queue
            .and_then(|(name, form)| text_of(headers, name).and_then(|v| queue_from(&v, form)));
        let exchange = framework.exchange.and_then(|name| text_of(headers, name));
        let routing_key = framework
            .routing_key
            .and_then(|name| text_of(headers, name));
        let error_text = framework.error_text.and_then(|name| text_of(headers, name));
        let error_class = framework
            .error_class
            .and_then(|name| text_of(headers, name));
        if queue.is_none()
            && exchange.is_none()
            && routing_key.is_none()
            && error_text.is_none()
            && error_class.is_none()
        {
            continue;
        }
        info.frameworks.push(framework.name);
        info.original_queue = info.original_queue.take().or(queue);
        info.original_exchange = info.original_exchange.take().or(exchange);
        info.original_routing_key = info.original_routing_key.take().or(routing_key);
        info.error_text = info.error_text.take().or(error_text);
        info.error_class = info.error_class.take().or(error_class);
    }
    if info.error_class.is_none() {
        info.error_class = text_of(headers, SPRING_STACKTRACE_HEADER).and_then(|trace| {
            let head = trace.lines().next()?.split(':').next()?.trim().to_owned();
            (!head.is_empty() && !head.contains(' ')).then_some(head)
        });
    }
    if let Some(own) = text_of(headers, error_class_header) {
        info.error_class = Some(own);
    }
    info
}

/// The head entry of an `x-death` array.
///
/// # Errors
/// A sentence naming what is off: not an array, empty, the head not a table, or
/// a field of the wrong type.
pub fn parse_x_death(value: &HeaderValue) -> Result<Death, String> {
    let Some(Value::Array(entries)) = &value.value else {
        return Err("not an array".to_owned());
    };
    let Some(head) = entries.values.first() else {
        return Err("empty array".to_owned());
    };
    let Some(Value::Table(entry)) = &head.value else {
        return Err("first entry is not a table".to_owned());
    };
    let field_text = |name: &str| -> Result<String, String> {
        match entry.fields.get(name) {
            None => Ok(String::new()),
            Some(value) => header_text(value).ok_or_else(|| format!("{name} is not a string")),
        }
    };
    let reason = field_text("reason")?;
    if reason.is_empty() {
        return Err("first entry has no reason".to_owned());
    }
    let routing_keys = match entry
        .fields
        .get("routing-keys")
        .and_then(|v| v.value.as_ref())
    {
        None => Vec::new(),
        Some(Value::Array(keys)) => keys
            .values
            .iter()
            .map(|key| header_text(key).ok_or_else(|| "routing-keys holds a non-string".to_owned()))
            .collect::<Result<_, _>>()?,
        Some(_) => return Err("routing-keys is not an array".to_owned()),
    };
    let count = match entry.fields.get("count") {
        None => 1,
        Some(value) => header_integer(value)
            .and_then(|count| u64::try_from(count).ok())
            .ok_or_else(|| "count is not a non-negative integer".to_owned())?,
    };
    let time = match entry.fields.get("time") {
        None => None,
        Some(value) => Some(
            header_integer(value)
                .and_then(epoch_seconds)
                .ok_or_else(|| "time is not a timestamp between 1970 and 9999".to_owned())?,
        ),
    };
    let first_time = entries
        .values
        .iter()
        .filter_map(|entry| match &entry.value {
            Some(Value::Table(table)) => table.fields.get("time").and_then(header_integer),
            _ => None,
        })
        .filter_map(epoch_seconds)
        .min()
        .or(time);
    Ok(Death {
        reason,
        queue: field_text("queue")?,
        exchange: field_text("exchange")?,
        routing_keys,
        count,
        time,
        first_time,
    })
}

fn fallback_death(headers: &HeaderTable) -> Option<Death> {
    use redrive_proto::headers::{FIRST_DEATH_PREFIX, LAST_DEATH_PREFIX};
    [LAST_DEATH_PREFIX, FIRST_DEATH_PREFIX]
        .iter()
        .find_map(|prefix| {
            let reason = text_of(headers, &format!("{prefix}reason"))?;
            Some(Death {
                reason,
                queue: text_of(headers, &format!("{prefix}queue")).unwrap_or_default(),
                exchange: text_of(headers, &format!("{prefix}exchange")).unwrap_or_default(),
                routing_keys: Vec::new(),
                count: 1,
                time: None,
                first_time: None,
            })
        })
}

/// The reason class of a death reason, refined by the application's error class.
pub fn reason_class(reason: Option<&str>, error_class: Option<&str>) -> ReasonClass {
    let from_application = error_class.and_then(classify_error_class);
    match reason.map(str::to_ascii_lowercase).as_deref() {
        Some("delivery_limit") => ReasonClass::Exhausted,
        Some("expired") => ReasonClass::Expired,
        Some("maxlen") => ReasonClass::Overflow,
        Some("rejected") => from_application.unwrap_or(ReasonClass::Rejected),
        Some(other) => from_application
            .or_else(|| ReasonClass::from_name(other))
            .or_else(|| classify_error_class(other))
            .unwrap_or(ReasonClass::Unknown),
        None => from_application.unwrap_or(ReasonClass::Unknown),
    }
}

/// What an application's error class (or free-text reason) says, if anything.
fn classify_error_class(error_class: &str) -> Option<ReasonClass> {
    let lowered = error_class.to_ascii_lowercase();
    let says = |words: &[&str]| words.iter().any(|word| lowered.contains(word));
    if says(&[
        "poison",
        "parse",
        "deserializ",
        "unparseable",
        "malformed",
        "format",
        "conversion",
        "decode",
        "json",
        "schema",
    ]) {
        Some(ReasonClass::Poison)
    } else if says(&[
        "retr",
        "exhaust",
        "attempts",
        "delivery_limit",
        "delivery-limit",
        "timeout",
    ]) {
        Some(ReasonClass::Exhausted)
    } else if says(&[
        "business",
        "permanent",
        "rule",
        "validation",
        "invalid",
        "illegalstate",
        "notallowed",
        "forbidden",
    ]) {
        Some(ReasonClass::Permanent)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use redrive_proto::v1::{HeaderArray, HeaderTable};

    use super::*;

    fn text(value: &str) -> HeaderValue {
        HeaderValue {
            value: Some(Value::LongString(value.as_bytes().to_vec())),
        }
    }

    fn table(fields: Vec<(&str, HeaderValue)>) -> HeaderValue {
        HeaderValue {
            value: Some(Value::Table(HeaderTable {
                fields: fields.into_iter().map(|(k, v)| (k.to_owned(), v)).collect(),
            })),
        }
    }

    fn array(values: Vec<HeaderValue>) -> HeaderValue {
        HeaderValue {
            value: Some(Value::Array(HeaderArray { values })),
        }
    }

    fn headers(fields: Vec<(&str, HeaderValue)>) -> HeaderTable {
        HeaderTable {
            fields: fields.into_iter().map(|(k, v)| (k.to_owned(), v)).collect(),
        }
    }

    fn x_death_entry(reason: &str, queue: &str) -> HeaderValue {
        table(vec![
            ("reason", text(reason)),
            ("queue", text(queue)),
            ("exchange", text("orders")),
            ("routing-keys", array(vec![text("order.created")])),
            (
                "count",
                HeaderValue {
                    value: Some(Value::LongLongInt(2)),
                },
            ),
            (
                "time",
                HeaderValue {
                    value: Some(Value::Timestamp(1_700_000_000)),
                },
            ),
        ])
    }

    #[test]
    fn the_head_of_x_death_is_the_death_that_counts() {
        let headers = headers(vec![(
            "x-death",
            array(vec![
                x_death_entry("expired", "retry"),
                x_death_entry("rejected", "work"),
            ]),
        )]);
        let death = analyze(&headers, "error-class").death.unwrap();
        assert_eq!(death.reason, "expired");
        assert_eq!(death.queue, "retry");
        assert_eq!(death.exchange, "orders");
        assert_eq!(death.routing_keys, vec!["order.created"]);
        assert_eq!(death.count, 2);
        assert_eq!(death.time.unwrap().timestamp(), 1_700_000_000);
        assert_eq!(death.first_time.unwrap().timestamp(), 1_700_000_000);
    }

    #[test]
    fn malformed_x_death_falls_back_and_is_noted() {
        let headers = headers(vec![
            ("x-death", text("not an array")),
            ("x-first-death-reason", text("maxlen")),
            ("x-first-death-queue", text("work")),
            ("x-first-death-exchange", text("orders")),
        ]);
        let info = analyze(&headers, "error-class");
        let death = info.death.unwrap();
        assert_eq!(
            (death.reason.as_str(), death.queue.as_str()),
            ("maxlen", "work")
        );
        assert!(info.notes[0].contains("not an array"), "{:?}", info.notes);
    }

    #[test]
    fn times_outside_1970_to_9999_are_malformed() {
        let entry = table(vec![
            ("reason", text("rejected")),
            (
                "time",
                HeaderValue {
                    value: Some(Value::LongLongInt(-300_000_000_000)),
                },
            ),
        ]);
        assert!(
            parse_x_death(&array(vec![entry]))
                .unwrap_err()
                .contains("time")
        );
        assert!(epoch_seconds(i64::MAX).is_none());
        assert!(epoch_seconds(1_700_000_000).is_some());
    }

    #[test]
    fn wrong_field_types_are_malformed_not_a_crash() {
        let entry = table(vec![("reason", text("rejected")), ("count", text("three"))]);
        let error = parse_x_death(&array(vec![entry])).unwrap_err();
        assert!(error.contains("count"), "{error}");
        assert!(parse_x_death(&array(vec![])).is_err());
        assert!(parse_x_death(&array(vec![text("x")])).is_err());
    }

    #[test]
    fn reason_classes_follow_design() {
        assert_eq!(
            reason_class(Some("delivery_limit"), None),
            ReasonClass::Exhausted
        );
        assert_eq!(
            reason_class(Some("expired"), Some("ParseError")),
            ReasonClass::Expired
        );
        assert_eq!(reason_class(Some("maxlen"), None), ReasonClass::Overflow);
        assert_eq!(reason_class(Some("rejected"), None), ReasonClass::Rejected);
        assert_eq!(
            reason_class(Some("rejected"), Some("JsonParseException")),
            ReasonClass::Poison
        );
        assert_eq!(
            reason_class(Some("rejected"), Some("BusinessRuleViolation")),
            ReasonClass::Permanent
        );
        assert_eq!(
            reason_class(Some("rejected"), Some("RetriesExhausted")),
            ReasonClass::Exhausted
        );
        assert_eq!(reason_class(None, None), ReasonClass::Unknown);
        assert_eq!(
            reason_class(Some("something odd"), None),
            ReasonClass::Unknown
        );
    }

    #[test]
    fn framework_headers_are_recognized() {
        let headers = headers(vec![
            ("x-original-exchange", text("orders")),
            ("x-original-routingKey", text("order.created")),
            ("x-exception-message", text("boom")),
            ("MT-Fault-ExceptionType", text("System.FormatException")),
        ]);
        let info = analyze(&headers, "error-class");
        assert_eq!(info.original_exchange.as_deref(), Some("orders"));
        assert_eq!(info.original_routing_key.as_deref(), Some("order.created"));
        assert_eq!(info.error_text.as_deref(), Some("boom"));
        assert_eq!(
            reason_class(Some("rejected"), info.error_class.as_deref()),
            ReasonClass::Poison
        );
    }

    #[test]
    fn each_framework_is_read_as_it_writes_its_error_queue() {
        // MassTransit: `<queue>_error`, no x-death.
        let info = analyze(
            &headers(vec![
                (
                    "MT-Fault-InputAddress",
                    text("rabbitmq://broker:5672/shop/orders-fulfil?temporary=false"),
                ),
                ("MT-Fault-Message", text("Object reference not set")),
                (
                    "MT-Fault-ExceptionType",
                    text("System.NullReferenceException"),
                ),
                ("MT-Reason", text("fault")),
            ]),
            "error-class",
        );
        assert_eq!(info.original_queue.as_deref(), Some("orders-fulfil"));
        assert_eq!(info.error_text.as_deref(), Some("Object reference not set"));
        assert_eq!(info.frameworks, vec!["MassTransit"]);
        assert_eq!(
            queue_from("rabbitmq://localhost/orders", QueueForm::Address).as_deref(),
            Some("orders")
        );
        // NServiceBus: `error` queue, `queue@machine`.
        let info = analyze(
            &headers(vec![
                ("NServiceBus.FailedQ", text("Sales@MACHINE01")),
                ("NServiceBus.ExceptionInfo.Message", text("boom")),
                (
                    "NServiceBus.ExceptionInfo.ExceptionType",
                    text("System.FormatException"),
                ),
            ]),
            "error-class",
        );
        assert_eq!(info.original_queue.as_deref(), Some("Sales"));
        assert_eq!(info.error_class.as_deref(), Some("System.FormatException"));
        // Rebus.
        let info = analyze(
            &headers(vec![
                ("rbs2-source-queue", text("billing")),
                ("rbs2-error-details", text("5 unhandled exceptions")),
            ]),
            "error-class",
        );
        assert_eq!(info.original_queue.as_deref(), Some("billing"));
        assert_eq!(info.error_text.as_deref(), Some("5 unhandled exceptions"));
        // Spring AMQP: an exchange and a routing key, no queue.
        let info = analyze(
            &headers(vec![
                ("x-original-exchange", text("orders")),
                ("x-original-routingKey", text("order.created")),
                ("x-exception-message", text("Listener threw")),
                (
                    "x-exception-stacktrace",
                    text("org.springframework.amqp.AmqpRejectAndDontRequeueException: x\n\tat ..."),
                ),
            ]),
            "error-class",
        );
        assert_eq!(info.original_queue, None, "a routing key is not a queue");
        assert_eq!(info.original_exchange.as_deref(), Some("orders"));
        assert_eq!(info.original_routing_key.as_deref(), Some("order.created"));
        assert_eq!(
            info.error_class.as_deref(),
            Some("org.springframework.amqp.AmqpRejectAndDontRequeueException")
        );
        // Spring Kafka and Kafka Connect: a topic, no queue.
        let info = analyze(
            &headers(vec![
                ("kafka_dlt-original-topic", text("orders")),
                ("kafka_dlt-exception-message", text("bad")),
                (
                    "kafka_dlt-exception-fqcn",
                    text("org.apache.kafka.common.errors.SerializationException"),
                ),
            ]),
            "error-class",
        );
        assert_eq!(
            (info.original_queue, info.original_routing_key.as_deref()),
            (None, Some("orders"))
        );
        assert_eq!(info.frameworks, vec!["Spring Kafka"]);
        let info = analyze(
            &headers(vec![
                ("__connect.errors.topic", text("payments")),
                (
                    "__connect.errors.exception.class.name",
                    text("org.apache.kafka.connect.errors.DataException"),
                ),
                (
                    "__connect.errors.exception.message",
                    text("Converting byte[] failed"),
                ),
            ]),
            "error-class",
        );
        assert_eq!(info.original_routing_key.as_deref(), Some("payments"));
        assert_eq!(info.error_text.as_deref(), Some("Converting byte[] failed"));
        // EasyNetQ: the body wraps the original.
        let body = serde_json::json!({
            "RoutingKey": "order.paid", "Exchange": "Shop.OrderPaid:Shop", "Queue": "Shop.OrderPaid:Shop_billing",
            "Exception": "System.Exception: boom", "Message": "{\"order_id\":\"o-1\"}",
            "DateTime": "2026-11-30T10:00:00Z", "BasicProperties": {}
        });
        let wrapper = easynetq_error(&body).unwrap();
        assert_eq!(wrapper.queue, "Shop.OrderPaid:Shop_billing");
        assert!(easynetq_error(&serde_json::json!({"order_id": "o-1"})).is_none());
    }
}
