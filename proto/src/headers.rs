//! The names every part shares on the wire: the AMQP headers a replay adds
//! to a message (`redrive-*`, without the `x-` prefix: since RabbitMQ 3.13
//! `x-` headers belong to the broker), the broker's own dead-letter headers
//! (RabbitMQ docs, "Dead Letter Exchanges": `x-death`, `x-first-death-*`,
//! `x-last-death-*`), the W3C `traceparent`, and the gRPC metadata naming
//! the person a call is made for. The planner reads what the executor
//! writes by these names, so each is written once, here.

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
