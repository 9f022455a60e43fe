//! The executor's metric instruments, all in one place: names, units,
//! descriptions and attributes. Names follow the OpenTelemetry messaging
//! semantic conventions where one exists (`messaging.client.*`, v1.27+);
//! the others are `redrive.executor.*`. Every attribute is of bounded
//! cardinality (no message, plan or slice ids). Every attribute set is
//! built once here, so recording per message allocates nothing; the bucket
//! instruments, recorded once per run of messages, name the destination:
//! one series per exchange and routing key replayed to, as many as the
//! token buckets themselves.
//!
//! | instrument | kind | unit | attributes |
//! | --- | --- | --- | --- |
//! | `messaging.client.sent.messages` | counter | `{message}` | `messaging.system`, `messaging.operation.name`, `error.type` (absent when acked and routed) |
//! | `messaging.client.operation.duration` | histogram | `s` | `messaging.system`, `messaging.operation.name`: publish → publisher confirm of acked publishes |
//! | `redrive.executor.items` | counter | `{item}` | `redrive.audit.action`: every audit event the executor reports |
//! | `redrive.executor.publish.nacks` | counter | `{message}` | none: `basic.nack`s |
//! | `redrive.executor.publish.returns` | counter | `{message}` | none: `basic.return`s (unroutable) |
//! | `redrive.executor.bucket.wait` | histogram | `s` | `messaging.destination.name` (the exchange), `messaging.rabbitmq.destination.routing_key`: time a run waited for its tokens |
//! | `redrive.executor.bucket.tokens` | counter | `{token}` | the destination, as above: tokens granted by the shared bucket; its rate is the destination's replay rate through this executor |
//! | `redrive.executor.bucket.rate` | gauge | `{token}/s` | the destination, as above: the sustained rate of the destination's bucket the last run was granted under |
//! | `redrive.executor.leases.held` | up-down counter | `{lease}` | none |
//! | `redrive.executor.leases.claimed` | counter | `{lease}` | none |
//! | `redrive.executor.leases.lost` | counter | `{lease}` | none: leases that ended lost (expired, fenced, cancelled) |

use std::time::Duration;

use opentelemetry::{
    KeyValue,
    metrics::{Counter, Gauge, Histogram, Meter, UpDownCounter},
};
use redrive_proto::{
    telemetry::{EnumAttributes, SECONDS_BOUNDARIES},
    v1::AuditAction,
};

/// `messaging.client.sent.messages` (OpenTelemetry messaging semantic
/// conventions): publish attempts, by `error.type` when not acked and routed.
pub const SENT_MESSAGES: &str = "messaging.client.sent.messages";
/// `messaging.client.operation.duration` (semantic conventions), seconds:
/// from the publish to its publisher confirm.
pub const OPERATION_DURATION: &str = "messaging.client.operation.duration";
/// Audit events reported, by `redrive.audit.action`.
pub const ITEMS: &str = "redrive.executor.items";
/// Publishes the broker nacked.
pub const NACKS: &str = "redrive.executor.publish.nacks";
/// Publishes the broker returned (no queue bound).
pub const RETURNS: &str = "redrive.executor.publish.returns";
/// Seconds a run waited for its tokens from the shared bucket.
pub const BUCKET_WAIT: &str = "redrive.executor.bucket.wait";
/// Tokens granted by the shared bucket, by destination.
pub const BUCKET_TOKENS: &str = "redrive.executor.bucket.tokens";
/// The sustained rate (tokens per second) of a destination's bucket.
pub const BUCKET_RATE: &str = "redrive.executor.bucket.rate";
/// Leases held now.
pub const LEASES_HELD: &str = "redrive.executor.leases.held";
/// Leases taken (slices claimed).
pub const LEASES_CLAIMED: &str = "redrive.executor.leases.claimed";
/// Leases lost before the slice was done.
pub const LEASES_LOST: &str = "redrive.executor.leases.lost";

/// Why a publish attempt did not end acked and routed: the `error.type`
/// attribute of [`SENT_MESSAGES`].
#[derive(Debug, Clone, Copy)]
pub enum PublishFailure {
    /// `basic.nack`.
    Nacked,
    /// Acked with a `basic.return`: no queue bound.
    Unroutable,
    /// No confirm: the connection or channel was lost, or the confirm timed
    /// out.
    Uncertain,
}

/// The executor's instruments (one set per running executor, shared by its
/// slice loops).
#[derive(Debug, Clone)]
pub struct ExecutorMetrics {
    sent_messages: Counter<u64>,
    operation_duration: Histogram<f64>,
    items: Counter<u64>,
    nacks: Counter<u64>,
    returns: Counter<u64>,
    bucket_wait: Histogram<f64>,
    bucket_tokens: Counter<u64>,
    bucket_rate: Gauge<f64>,
    leases_held: UpDownCounter<i64>,
    leases_claimed: Counter<u64>,
    leases_lost: Counter<u64>,
    publish_ok: [KeyValue; 2],
    /// By [`PublishFailure`] as index.
    publish_errors: [[KeyValue; 3]; 3],
    /// By `AuditAction`.
    actions: EnumAttributes<9>,
}

impl ExecutorMetrics {
    /// The instruments on `meter`.
    pub fn new(meter: &Meter) -> Self {
        let base = [
            KeyValue::new("messaging.system", "rabbitmq"),
            KeyValue::new("messaging.operation.name", "publish"),
        ];
        let with_error = |error: &'static str| {
            [
                base[0].clone(),
                base[1].clone(),
                KeyValue::new("error.type", error),
            ]
        };
        let actions = EnumAttributes::new("redrive.audit.action", |number| {
            AuditAction::try_from(number)
                .unwrap_or(AuditAction::Unspecified)
                .name()
        });
        Self {
            sent_messages: meter
                .u64_counter(SENT_MESSAGES)
                .with_unit("{message}")
                .with_description("Publish attempts; error.type set when not acked and routed")
                .build(),
            operation_duration: meter
                .f64_histogram(OPERATION_DURATION)
                .with_unit("s")
                .with_description("Publish to publisher confirm of acked publishes")
                .with_boundaries(SECONDS_BOUNDARIES.to_vec())
                .build(),
            items: meter
                .u64_counter(ITEMS)
                .with_unit("{item}")
                .with_description("Audit events reported, by action")
                .build(),
            nacks: meter
                .u64_counter(NACKS)
                .with_unit("{message}")
                .with_description("Publishes the broker nacked")
                .build(),
            returns: meter
                .u64_counter(RETURNS)
                .with_unit("{message}")
                .with_description("Publishes the broker returned as unroutable")
                .build(),
            bucket_wait: meter
                .f64_histogram(BUCKET_WAIT)
                .with_unit("s")
                .with_description("Time a run waited for its tokens from the shared bucket")
                .with_boundaries(SECONDS_BOUNDARIES.to_vec())
                .build(),
            bucket_tokens: meter
                .u64_counter(BUCKET_TOKENS)
                .with_unit("{token}")
                .with_description("Tokens granted by the shared bucket, by destination")
                .build(),
            bucket_rate: meter
                .f64_gauge(BUCKET_RATE)
                .with_unit("{token}/s")
                .with_description("Sustained rate of the destination's shared bucket")
                .build(),
            leases_held: meter
                .i64_up_down_counter(LEASES_HELD)
                .with_unit("{lease}")
                .with_description("Slice leases held now")
                .build(),
            leases_claimed: meter
                .u64_counter(LEASES_CLAIMED)
                .with_unit("{lease}")
                .with_description("Slice leases taken")
                .build(),
            leases_lost: meter
                .u64_counter(LEASES_LOST)
                .with_unit("{lease}")
                .with_description("Slice leases lost before the slice was done")
                .build(),
            publish_errors: [
                with_error("nacked"),
                with_error("unroutable"),
                with_error("uncertain"),
            ],
            publish_ok: base,
            actions,
        }
    }

    /// An acked, routed publish confirmed after `latency`.
    pub fn published(&self, latency: Duration) {
        self.sent_messages.add(1, &self.publish_ok);
        self.operation_duration
            .record(latency.as_secs_f64(), &self.publish_ok);
    }

    /// A publish attempt that was not acked and routed.
    pub fn publish_failed(&self, error: PublishFailure) {
        self.sent_messages
            .add(1, &self.publish_errors[error as usize]);
        match error {
            PublishFailure::Nacked => self.nacks.add(1, &[]),
            PublishFailure::Unroutable => self.returns.add(1, &[]),
            PublishFailure::Uncertain => {}
        }
    }

    /// An audit event with `action` reported.
    pub fn item(&self, action: AuditAction) {
        if let Some(attributes) = self.actions.of(action.into()) {
            self.items.add(1, attributes);
        }
    }

    /// A run to `exchange` with `routing_key` was granted `tokens` after
    /// waiting `waited`, under a bucket of `per_second` tokens a second.
    pub fn tokens_granted(
        &self,
        exchange: &str,
        routing_key: &str,
        tokens: u32,
        waited: Duration,
        per_second: f64,
    ) {
        let destination = [
            KeyValue::new("messaging.destination.name", exchange.to_owned()),
            KeyValue::new(
                "messaging.rabbitmq.destination.routing_key",
                routing_key.to_owned(),
            ),
        ];
        self.bucket_wait.record(waited.as_secs_f64(), &destination);
        self.bucket_tokens.add(u64::from(tokens), &destination);
        self.bucket_rate.record(per_second, &destination);
    }

    /// A lease was taken.
    pub fn lease_claimed(&self) {
        self.leases_claimed.add(1, &[]);
        self.leases_held.add(1, &[]);
    }

    /// A lease ended; `lost` when it was lost before the slice was done.
    pub fn lease_ended(&self, lost: bool) {
        self.leases_held.add(-1, &[]);
        if lost {
            self.leases_lost.add(1, &[]);
        }
    }
}
