//! The planner's configuration: flags with `REDRIVE_…` environment fallbacks,
//! defaults pointing at the local services, validated at start-up.

use std::{net::SocketAddr, time::Duration};

use clap::Parser;

use crate::{dead_letter::ExtractionRules, message_key::KeySource, state_check::HookRoute};

/// `redrive-planner` settings.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "redrive-planner",
    version,
    about = "Redrive planner: captures dead letters, prechecks, plans and coordinates replays"
)]
pub struct Config {
    /// Address the gRPC server listens on.
    #[arg(long, env = "REDRIVE_LISTEN", default_value = "127.0.0.1:50051")]
    pub listen: SocketAddr,

    /// PostgreSQL URL; the database is created if it does not exist.
    #[arg(
        long,
        env = "DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/redrive"
    )]
    pub database_url: String,

    /// Most PostgreSQL connections this planner opens.
    #[arg(long, env = "REDRIVE_DATABASE_MAX_CONNECTIONS", default_value_t = 16)]
    pub database_max_connections: u32,

    /// AMQP URL of the RabbitMQ broker.
    #[arg(
        long,
        env = "REDRIVE_AMQP_URL",
        default_value = "amqp://guest:guest@127.0.0.1:5672/%2f"
    )]
    pub amqp_url: String,

    /// A dead-letter queue to capture (repeatable; the environment variable
    /// takes a comma-separated list). The queue must exist.
    #[arg(
        long = "capture-queue",
        env = "REDRIVE_CAPTURE_QUEUES",
        value_delimiter = ','
    )]
    pub capture_queues: Vec<String>,

    /// Unacked deliveries the broker may push per captured queue (basic.qos).
    #[arg(long, env = "REDRIVE_CAPTURE_PREFETCH", default_value_t = 4000)]
    pub capture_prefetch: u16,

    /// Dead letters stored per insert.
    #[arg(long, env = "REDRIVE_CAPTURE_BATCH_SIZE", default_value_t = 1000)]
    pub capture_batch_size: usize,

    /// How long a partial batch waits for more deliveries, in milliseconds.
    #[arg(long, env = "REDRIVE_CAPTURE_BATCH_WAIT_MS", default_value_t = 20)]
    pub capture_batch_wait_ms: u64,

    /// Bodies larger than this many bytes are captured but marked oversized
    /// (not replayable).
    #[arg(long, env = "REDRIVE_MAX_BODY_BYTES", default_value_t = 16 * 1024 * 1024)]
    pub max_body_bytes: usize,

    /// Where message keys come from, first match wins (repeatable):
    /// `property:message_id`, `header:NAME` or `json:/pointer` (RFC 6901). The
    /// event type is appended when known. Without one: the body's SHA-256.
    #[arg(
        long = "message-key",
        env = "REDRIVE_MESSAGE_KEYS",
        value_delimiter = ','
    )]
    pub message_keys: Vec<String>,

    /// Header naming the event type when the `type` property is absent.
    #[arg(long, env = "REDRIVE_EVENT_TYPE_HEADER", default_value = "event-type")]
    pub event_type_header: String,

    /// Header naming the schema version.
    #[arg(
        long,
        env = "REDRIVE_SCHEMA_VERSION_HEADER",
        default_value = "schema-version"
    )]
    pub schema_version_header: String,

    /// The application's error-class header, which refines the `rejected` reason
    /// class into poison, permanent or exhausted.
    #[arg(
        long,
        env = "REDRIVE_ERROR_CLASS_HEADER",
        default_value = "error-class"
    )]
    pub error_class_header: String,

    /// A state-check hook route (repeatable, first match wins):
    /// `event-type:PATTERN=URL` (`order.*`), `destination:QUEUE=URL`, or
    /// `PATTERN=URL`. The hook implements `redrive.v1.StateCheck`.
    #[arg(
        long = "state-check",
        env = "REDRIVE_STATE_CHECKS",
        value_delimiter = ','
    )]
    pub state_checks: Vec<String>,

    /// Four-eyes approval: the approver of a plan must not be its creator.
    #[arg(long, env = "REDRIVE_FOUR_EYES", default_value_t = false)]
    pub four_eyes: bool,

    /// Seconds a slice lease lasts without a heartbeat (executors renew it at a
    /// third of this).
    #[arg(long, env = "REDRIVE_LEASE_TTL_SECONDS", default_value_t = 30)]
    pub lease_ttl_seconds: u64,

    /// Seconds in-flight work may take to finish after SIGTERM.
    #[arg(long, env = "REDRIVE_SHUTDOWN_GRACE_SECONDS", default_value_t = 10)]
    pub shutdown_grace_seconds: u64,

    /// Log as JSON lines instead of text.
    #[arg(long, env = "REDRIVE_LOG_JSON", default_value_t = false)]
    pub log_json: bool,
}

/// A setting that is wrong, named.
#[derive(Debug, thiserror::Error)]
#[error("invalid setting --{setting}: {problem}")]
pub struct ConfigError {
    /// The flag name, without dashes.
    pub setting: &'static str,
    /// What is wrong.
    pub problem: String,
}

impl Config {
    /// The defaults, with `database_url` set (tests build configs this way).
    pub fn for_database(database_url: impl Into<String>) -> Self {
        let mut config = Self::parse_from(["redrive-planner"]);
        config.database_url = database_url.into();
        config
    }

    /// Checks the settings that clap cannot.
    ///
    /// # Errors
    /// [`ConfigError`] naming the first wrong setting.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let error = |setting, problem: String| Err(ConfigError { setting, problem });
        if !self.database_url.starts_with("postgres://")
            && !self.database_url.starts_with("postgresql://")
        {
            return error(
                "database-url",
                format!("{:?} is not a postgres:// URL", self.database_url),
            );
        }
        if !self.amqp_url.starts_with("amqp://") && !self.amqp_url.starts_with("amqps://") {
            return error(
                "amqp-url",
                format!("{:?} is not an amqp:// URL", self.amqp_url),
            );
        }
        if let Some(queue) = self
            .capture_queues
            .iter()
            .find(|q| q.trim().is_empty() || q.len() > 255)
        {
            return error(
                "capture-queue",
                format!("{queue:?}: a queue name is 1 to 255 bytes"),
            );
        }
        if self.capture_batch_size == 0 {
            return error("capture-batch-size", "must be at least 1".to_owned());
        }
        if usize::from(self.capture_prefetch) < self.capture_batch_size {
            return error(
                "capture-prefetch",
                format!(
                    "{} is below --capture-batch-size {}: a batch could never fill",
                    self.capture_prefetch, self.capture_batch_size
                ),
            );
        }
        if self.lease_ttl_seconds < 3 {
            return error("lease-ttl-seconds", "must be at least 3".to_owned());
        }
        if self.database_max_connections < 2 {
            return error(
                "database-max-connections",
                "must be at least 2 (a precheck reads with one connection and writes with another)"
                    .to_owned(),
            );
        }
        for spec in &self.message_keys {
            if let Err(problem) = spec.parse::<KeySource>() {
                return error("message-key", problem);
            }
        }
        for spec in &self.state_checks {
            if let Err(problem) = spec.parse::<HookRoute>() {
                return error("state-check", problem);
            }
        }
        Ok(())
    }

    /// The state-check routes (call after `validate`).
    pub fn state_check_routes(&self) -> Vec<HookRoute> {
        self.state_checks
            .iter()
            .filter_map(|spec| spec.parse().ok())
            .collect()
    }

    /// The extraction rules these settings describe (call after `validate`).
    pub fn extraction_rules(&self) -> ExtractionRules {
        ExtractionRules {
            event_type_header: self.event_type_header.clone(),
            schema_version_header: self.schema_version_header.clone(),
            error_class_header: self.error_class_header.clone(),
            key_sources: self
                .message_keys
                .iter()
                .filter_map(|spec| spec.parse().ok())
                .collect(),
            max_body_bytes: self.max_body_bytes,
        }
    }

    /// How long a slice lease lasts.
    pub fn lease_ttl(&self) -> Duration {
        Duration::from_secs(self.lease_ttl_seconds)
    }

    /// How long a partial capture batch waits.
    pub fn capture_batch_wait(&self) -> Duration {
        Duration::from_millis(self.capture_batch_wait_ms)
    }
}
