//! The planner's configuration: flags with `REDRIVE_…` environment fallbacks,
//! defaults pointing at the local services, validated at start-up.
//!
//! [`Config`] is the flags; its checks and parsing live beside it:
//! `checks` (the one parse of the settings, step by step in flag order),
//! `rules` (the precheck policy and the extraction rules), `transport` (TLS
//! and authentication, the files read) and `settings` ([`Settings`], the
//! parsed values, and the [`ServiceSettings`](redrive_proto::settings::ServiceSettings) hooks).

mod audit_log;
mod checks;
mod rules;
mod settings;
mod transport;
pub(crate) use transport::STATE_CHECK_TLS;
mod webhooks;

use std::{net::SocketAddr, num::NonZeroU32, path::PathBuf, time::Duration};

use redrive_proto::limits::{MAX_AGE, at_most};

use clap::Parser;

use redrive_proto::settings::{AmqpSettings, TelemetrySettings};

pub use self::audit_log::AuditLogSettings;
pub use self::settings::Settings;
pub use self::webhooks::{MAX_WEBHOOK_ATTEMPTS, WebhookSettings};
use crate::edge::auth::{AuthSettings, JwtSettings};

/// Most seconds a deadline setting (`--idle-timeout-seconds`,
/// `--first-request-timeout-seconds`, `--ingest-wait-seconds`) may say: a day.
pub const MAX_DEADLINE_SECONDS: u64 = 24 * 3600;

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

    /// PostgreSQL URL; the database is created if it does not exist. TLS:
    /// `?sslmode=require` (or `verify-full` with `sslrootcert=FILE`).
    #[arg(
        long,
        env = "DATABASE_URL",
        hide_env_values = true,
        default_value = "postgres://postgres@127.0.0.1:5432/redrive"
    )]
    pub database_url: String,

    /// A file holding the PostgreSQL URL (it carries a password): read at
    /// start, surrounding whitespace dropped; overrides --database-url.
    #[arg(long, env = "REDRIVE_DATABASE_URL_FILE", value_name = "FILE")]
    pub database_url_file: Option<PathBuf>,

    /// Most PostgreSQL connections this planner opens.
    #[arg(long, env = "REDRIVE_DATABASE_MAX_CONNECTIONS", default_value_t = 16)]
    pub database_max_connections: u32,

    /// The broker: `--amqp-url`, `--amqp-url-file`.
    #[command(flatten)]
    pub amqp: AmqpSettings,

    /// The name of the broker and virtual host this deployment captures from
    /// and replays to. The database is recorded as that broker's at the first
    /// start, and a planner of another broker is refused on it: the
    /// database's record of what was delivered names queues, not brokers, so
    /// two brokers sharing one database would suppress each other's replays.
    /// Default: the AMQP URL's `host:port/vhost` (`127.0.0.1:5672/%2f`,
    /// never the credentials), as for the executors. Set it when the planner
    /// reaches the same broker another way (another node address, a proxy).
    /// Required when `--amqp-url` lists several node URLs.
    #[arg(long, env = "REDRIVE_BROKER_ID")]
    pub broker_id: Option<String>,

    /// PEM certificate chain the planner serves gRPC over TLS with (needs
    /// --tls-key).
    #[arg(long, env = "REDRIVE_TLS_CERT", value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,

    /// PEM private key of --tls-cert.
    #[arg(long, env = "REDRIVE_TLS_KEY", value_name = "FILE")]
    pub tls_key: Option<PathBuf>,

    /// PEM bundle of the CAs client certificates must chain to: callers
    /// present certificates (required unless --token-file or JWT keys are set
    /// too) and are named by their CN or first DNS name (see --cert-role).
    #[arg(long, env = "REDRIVE_TLS_CLIENT_CA", value_name = "FILE")]
    pub tls_client_ca: Option<PathBuf>,

    /// Roles of client certificates: `NAME=ROLE[,ROLE...]`, NAME a
    /// certificate's name or a prefix ending in `*` (`executor-*=executor`);
    /// first match wins; `delegate` among the roles lets it act for users.
    /// Repeatable; `;`-separated in the environment.
    #[arg(
        long = "cert-role",
        env = "REDRIVE_CERT_ROLES",
        value_delimiter = ';',
        value_name = "NAME=ROLES"
    )]
    pub cert_roles: Vec<String>,

    /// Static bearer tokens: a TOML file of `[[token]]` tables with `name`,
    /// `sha256` (hex SHA-256 of the token) and `roles`.
    #[arg(long, env = "REDRIVE_TOKEN_FILE", value_name = "FILE")]
    pub token_file: Option<PathBuf>,

    /// A PEM public key (RSA, EC or Ed25519) bearer JWTs may be signed with
    /// (repeatable).
    #[arg(
        long = "jwt-public-key",
        env = "REDRIVE_JWT_PUBLIC_KEYS",
        value_delimiter = ',',
        value_name = "FILE"
    )]
    pub jwt_public_keys: Vec<PathBuf>,

    /// A JWKS file (RFC 7517) of the keys bearer JWTs may be signed with.
    #[arg(long, env = "REDRIVE_JWT_JWKS", value_name = "FILE")]
    pub jwt_jwks: Option<PathBuf>,

    /// The `iss` every bearer JWT must carry.
    #[arg(long, env = "REDRIVE_JWT_ISSUER")]
    pub jwt_issuer: Option<String>,

    /// The `aud` every bearer JWT must carry.
    #[arg(long, env = "REDRIVE_JWT_AUDIENCE")]
    pub jwt_audience: Option<String>,

    /// The JWT claim holding the caller's roles (an array of strings, or one
    /// space-separated string).
    #[arg(long, env = "REDRIVE_JWT_ROLES_CLAIM", default_value = "roles")]
    pub jwt_roles_claim: String,

    /// The JWT claim naming the caller.
    #[arg(long, env = "REDRIVE_JWT_NAME_CLAIM", default_value = "sub")]
    pub jwt_name_claim: String,

    /// Health and reflection need credentials too (by default they answer
    /// anyone, for load balancers and grpcurl).
    #[arg(
        long,
        env = "REDRIVE_AUTHENTICATE_HEALTH_AND_REFLECTION",
        default_value_t = false
    )]
    pub authenticate_health_and_reflection: bool,

    /// Let the planner listen on a non-loopback address without TLS or
    /// without authentication (it logs a warning).
    #[arg(long, env = "REDRIVE_INSECURE", default_value_t = false)]
    pub insecure: bool,

    /// Authenticated connections allowed from one peer address; past it a
    /// connection's first request is answered RESOURCE_EXHAUSTED.
    #[arg(long, env = "REDRIVE_MAX_CONNECTIONS_PER_PEER", default_value_t = crate::edge::admission::DEFAULT_MAX_CONNECTIONS_PER_PEER)]
    pub max_connections_per_peer: usize,

    /// Authenticated connections allowed in total (keep it and
    /// --max-unauthenticated-connections together below the process's open
    /// file limit, less the database pool).
    #[arg(long, env = "REDRIVE_MAX_CONNECTIONS", default_value_t = crate::edge::admission::DEFAULT_MAX_CONNECTIONS)]
    pub max_connections: usize,

    /// Open connections not yet authenticated allowed from one peer
    /// address; more are closed at once (and logged).
    #[arg(long, env = "REDRIVE_MAX_UNAUTHENTICATED_CONNECTIONS_PER_PEER", default_value_t = crate::edge::admission::DEFAULT_MAX_UNAUTHENTICATED_PER_PEER)]
    pub max_unauthenticated_connections_per_peer: usize,

    /// Open connections not yet authenticated allowed in total, in a pool
    /// apart from the authenticated ones (--max-connections). When it is
    /// full, a new connection takes the place of the oldest one of the peer
    /// address holding the most, if that peer holds at least two more.
    #[arg(long, env = "REDRIVE_MAX_UNAUTHENTICATED_CONNECTIONS", default_value_t = crate::edge::admission::DEFAULT_MAX_UNAUTHENTICATED)]
    pub max_unauthenticated_connections: usize,

    /// Seconds a connection may send nothing (no request, no answer to the
    /// server's HTTP/2 keepalive ping every 20 s) before it is closed;
    /// at least 45.
    #[arg(long, env = "REDRIVE_IDLE_TIMEOUT_SECONDS", default_value_t = 60)]
    pub idle_timeout_seconds: u64,

    /// Seconds a new connection has to make a request that passes
    /// authentication (its TLS handshake included; health checks do not
    /// count) before it is closed, so that clients without credentials
    /// cannot hold connections.
    #[arg(
        long,
        env = "REDRIVE_FIRST_REQUEST_TIMEOUT_SECONDS",
        default_value_t = crate::edge::admission::DEFAULT_FIRST_REQUEST_TIMEOUT.as_secs()
    )]
    pub first_request_timeout_seconds: u64,

    /// Requests per second allowed per principal (per peer address without
    /// authentication); over it a call gets RESOURCE_EXHAUSTED. A stream
    /// counts once.
    #[arg(long, env = "REDRIVE_REQUESTS_PER_SECOND", default_value_t = crate::edge::admission::DEFAULT_REQUESTS_PER_SECOND)]
    pub requests_per_second: u32,

    /// Requests per principal allowed at once above that rate.
    #[arg(long, env = "REDRIVE_REQUEST_BURST", default_value_t = crate::edge::admission::DEFAULT_REQUEST_BURST)]
    pub request_burst: u32,

    /// Open WatchPlan streams allowed per principal (per peer address
    /// without authentication).
    #[arg(long, env = "REDRIVE_MAX_WATCHES_PER_PRINCIPAL", default_value_t = crate::edge::admission::DEFAULT_WATCHES_PER_PRINCIPAL)]
    pub max_watches_per_principal: usize,

    /// Open WatchPlan streams allowed in total.
    #[arg(long, env = "REDRIVE_MAX_WATCHES", default_value_t = crate::edge::admission::DEFAULT_WATCHES)]
    pub max_watches: usize,

    /// Places among --max-watches kept for a principal's first WatchPlan
    /// stream: one caller's first watch is not refused because others
    /// hold the rest. Less than --max-watches.
    #[arg(long, env = "REDRIVE_RESERVED_WATCHES", default_value_t = crate::edge::admission::DEFAULT_RESERVED_WATCHES)]
    pub reserved_watches: usize,

    /// Open WatchLease streams allowed per principal (an executor watches
    /// each lease it holds once).
    #[arg(long, env = "REDRIVE_MAX_LEASE_WATCHES_PER_PRINCIPAL", default_value_t = crate::edge::admission::DEFAULT_LEASE_WATCHES_PER_PRINCIPAL)]
    pub max_lease_watches_per_principal: usize,

    /// Open WatchLease streams allowed in total.
    #[arg(long, env = "REDRIVE_MAX_LEASE_WATCHES", default_value_t = crate::edge::admission::DEFAULT_LEASE_WATCHES)]
    pub max_lease_watches: usize,

    /// Places among --max-lease-watches kept for a principal's first
    /// WatchLease stream. Less than --max-lease-watches.
    #[arg(long, env = "REDRIVE_RESERVED_LEASE_WATCHES", default_value_t = crate::edge::admission::DEFAULT_RESERVED_LEASE_WATCHES)]
    pub reserved_lease_watches: usize,

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

    /// Bytes of bodies stored per insert: a capture batch is written once its
    /// bodies reach this many bytes, whatever its count (at least one dead
    /// letter per batch).
    #[arg(long, env = "REDRIVE_CAPTURE_BATCH_BYTES", default_value_t = crate::capture::DEFAULT_BATCH_BYTES)]
    pub capture_batch_bytes: usize,

    /// Capture's lapin connection goes through the guard
    /// ([`crate::capture::guard`]). Not a flag: always on in service; the
    /// capture benchmark turns it off to measure what it costs.
    #[arg(skip = true)]
    pub capture_guard: bool,

    /// How long a partial batch waits for more deliveries, in milliseconds.
    #[arg(long, env = "REDRIVE_CAPTURE_BATCH_WAIT_MS", default_value_t = 20)]
    pub capture_batch_wait_ms: u64,

    /// The longest wait before capture reconnects to a DLQ after its session
    /// failed, in milliseconds, before jitter: waits start at 200 ms and
    /// double up to this, each plus up to as much again of random jitter (so
    /// at most twice this), and start over after a session that consumed
    /// for 30 s. From 200 to 600000.
    #[arg(
        long,
        env = "REDRIVE_CAPTURE_RECONNECT_MAX_MS",
        default_value_t = 10_000
    )]
    pub capture_reconnect_max_ms: u64,

    /// Bodies larger than this many bytes are captured but marked oversized
    /// (not replayable).
    #[arg(long, env = "REDRIVE_MAX_BODY_BYTES", default_value_t = 16 * 1024 * 1024)]
    pub max_body_bytes: usize,

    /// Where message keys come from, first match wins (repeatable):
    /// `property:NAME`, `header:NAME` (any scalar header type), `json:/pointer`
    /// (RFC 6901) or `body` (the body's SHA-256). The event type is appended
    /// when known (`order-123:order.paid`). The rules replace the default:
    /// without any, the key is the `message_id` property as it is (`m-50`),
    /// else the body's SHA-256 (the precheck warns). See docs/replay.md,
    /// "Identity".
    #[arg(
        long = "message-key",
        env = "REDRIVE_MESSAGE_KEYS",
        value_delimiter = ','
    )]
    pub message_keys: Vec<String>,

    /// Header naming the event type when the `type` property is absent.
    #[arg(long, env = "REDRIVE_EVENT_TYPE_HEADER", default_value = "event-type")]
    pub event_type_header: String,

    /// Header holding the original event time, preferred to the `timestamp`
    /// property: a timestamp, an integer, a decimal or text (RFC 3339 / ISO
    /// 8601, or a number); numbers in seconds, milliseconds, microseconds or
    /// nanoseconds since 1970, by their range (docs/capture.md, "Event time").
    #[arg(long, env = "REDRIVE_EVENT_TIME_HEADER", value_name = "HEADER")]
    pub event_time_header: Option<String>,

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
        value_delimiter = ',',
        hide_env_values = true
    )]
    pub state_checks: Vec<String>,

    /// PEM bundle of the CAs `https://` state-check hooks' certificates must
    /// chain to (default: the platform's roots).
    #[arg(long, env = "REDRIVE_STATE_CHECK_CA", value_name = "FILE")]
    pub state_check_ca: Option<PathBuf>,

    /// PEM client certificate presented to `https://` state-check hooks
    /// (needs --state-check-client-key).
    #[arg(long, env = "REDRIVE_STATE_CHECK_CLIENT_CERT", value_name = "FILE")]
    pub state_check_client_cert: Option<PathBuf>,

    /// PEM private key of --state-check-client-cert.
    #[arg(long, env = "REDRIVE_STATE_CHECK_CLIENT_KEY", value_name = "FILE")]
    pub state_check_client_key: Option<PathBuf>,

    /// Precheck policy: dead letters of this event type (or a prefix ending
    /// in `*`) older than DURATION are stale, e.g. `payment.*=2h` (repeatable;
    /// the environment variable takes a comma-separated list). Applies to every
    /// precheck and single replay; a request may only shorten it unless it
    /// overrides the policy with a reason.
    #[arg(
        long = "stale-after",
        env = "REDRIVE_STALE_AFTER",
        value_delimiter = ',',
        value_name = "TYPE=DURATION"
    )]
    pub stale_after: Vec<String>,

    /// Precheck policy: dead letters from this source (a DLQ name or import
    /// label, or a prefix ending in `*`) older than DURATION are stale, e.g.
    /// `orders.dlq=30m` (repeatable; comma-separated in the environment).
    #[arg(
        long = "stale-after-source",
        env = "REDRIVE_STALE_AFTER_SOURCE",
        value_delimiter = ',',
        value_name = "SOURCE=DURATION"
    )]
    pub stale_after_source: Vec<String>,

    /// Precheck policy: the maximum age of event types no `--stale-after`
    /// pattern matches (default: none).
    #[arg(long, env = "REDRIVE_DEFAULT_STALE_AFTER", value_name = "DURATION", value_parser = parse_duration)]
    pub default_stale_after: Option<Duration>,

    /// Precheck policy: an earlier successful replay of a message key within
    /// this window makes it already_replayed (a request may lengthen it).
    #[arg(long, env = "REDRIVE_REPLAY_KEY_WINDOW", value_name = "DURATION", default_value = "7days", value_parser = parse_duration)]
    pub replay_key_window: Duration,

    /// Precheck policy: re-dead-letters after which a message key is looping,
    /// at least 1 (a request may lower it).
    #[arg(long, env = "REDRIVE_MAX_REDRIVES", default_value_t = crate::precheck::options::DEFAULT_MAX_REDRIVES)]
    pub max_redrives: u32,

    /// Precheck policy: JSON pointer (RFC 6901) to the original event time in
    /// the body, which the deadlines count from when present.
    #[arg(long, env = "REDRIVE_EVENT_TIME_POINTER", value_name = "POINTER")]
    pub event_time_pointer: Option<String>,

    /// A plan can be approved only while its precheck is at most this old
    /// (measured at approval from the precheck's start).
    #[arg(long, env = "REDRIVE_MAX_PRECHECK_AGE", value_name = "DURATION", default_value = "15m", value_parser = parse_duration)]
    pub max_precheck_age: Duration,

    /// Housekeeping: delete resolved dead letters once resolved longer ago
    /// than this (e.g. `30d`), in batches of 1000, every minute, logging how
    /// many: archived ones counted from their archive, replayed ones from
    /// their `sent` audit event in a plan that has ended. Never an open dead
    /// letter, never an item of a plan that has not ended (default: off).
    #[arg(long, env = "REDRIVE_RETENTION", value_name = "DURATION", value_parser = parse_duration)]
    pub retention: Option<Duration>,

    /// Four-eyes approval: the approver of a plan must not be its creator.
    #[arg(long, env = "REDRIVE_FOUR_EYES", default_value_t = false)]
    pub four_eyes: bool,

    /// Bytes all `IngestDeadLetters` streams together may hold at once
    /// (each item counts twice its size until it is stored); past it a
    /// stream waits, and is refused with RESOURCE_EXHAUSTED after
    /// --ingest-wait-seconds. At least 1 MiB.
    #[arg(long, env = "REDRIVE_INGEST_MEMORY_BYTES", default_value_t = crate::capture::ingest_budget::DEFAULT_INGEST_MEMORY_BYTES)]
    pub ingest_memory_bytes: usize,

    /// Bytes of --ingest-memory-bytes the streams of one principal (one
    /// peer address without authentication) may hold together, so that
    /// one caller cannot hold it all. Default: half of it. At least 1 MiB,
    /// at most --ingest-memory-bytes.
    #[arg(long, env = "REDRIVE_INGEST_MEMORY_PER_PRINCIPAL_BYTES")]
    pub ingest_memory_per_principal_bytes: Option<usize>,

    /// Seconds an ingest stream waits for its share of --ingest-memory-bytes
    /// before it is refused with RESOURCE_EXHAUSTED (what it sent before is
    /// stored).
    #[arg(long, env = "REDRIVE_INGEST_WAIT_SECONDS", default_value_t = crate::capture::ingest_budget::DEFAULT_INGEST_WAIT.as_secs())]
    pub ingest_wait_seconds: u64,

    /// Byte budget of one `ClaimSlice` answer: a slice's items are handed out
    /// while their bodies and metadata fit in it (always at least one); the
    /// rest stay pending for the next claim of the same slice.
    #[arg(long, env = "REDRIVE_CLAIM_MAX_BYTES", default_value_t = redrive_proto::limits::DEFAULT_CLAIM_MAX_BYTES)]
    pub claim_max_bytes: usize,

    /// Seconds a slice lease lasts without a heartbeat (executors renew it at a
    /// third of this).
    #[arg(long, env = "REDRIVE_LEASE_TTL_SECONDS", default_value_t = 30)]
    pub lease_ttl_seconds: u64,

    /// Seconds in-flight work may take to finish after SIGTERM.
    #[arg(long, env = "REDRIVE_SHUTDOWN_GRACE_SECONDS", default_value_t = 10)]
    pub shutdown_grace_seconds: u64,

    /// Webhooks: `--webhook-url`, `--webhook-secret-file`,
    /// `--webhook-attempts`, `--webhook-retry-min`.
    #[command(flatten)]
    pub webhooks: WebhookSettings,

    /// The audit log: `--audit-signing-key`, `--audit-previous-key`,
    /// `--audit-origin`, `--audit-checkpoint-every`,
    /// `--audit-checkpoint-interval`, `--audit-witness-dir`,
    /// `--audit-witness-url`, `--audit-log`.
    #[command(flatten)]
    pub audit_log: AuditLogSettings,

    /// Logging and telemetry: `--log-json`, `--metrics-listen`,
    /// `--otlp-endpoint`.
    #[command(flatten)]
    pub telemetry: TelemetrySettings,
}

impl Config {
    /// The broker this planner's database belongs to: `--broker-id`, else
    /// the AMQP URL's `host:port/vhost`
    /// ([`redrive_proto::settings::broker_id_of`]).
    pub fn broker_id(&self) -> String {
        self.amqp.broker_id(self.broker_id.as_deref())
    }

    /// The defaults, with `database_url` set (tests build configs this way).
    /// Reads no `REDRIVE_*` variable: what the environment of a test run
    /// happens to hold never changes a test's planner.
    pub fn for_database(database_url: impl Into<String>) -> Self {
        let mut config: Self = redrive_proto::settings::defaults_without_env("redrive-planner");
        config.database_url = database_url.into();
        config
    }

    /// The caps on connections ([`crate::edge::admission::admit`]).
    pub fn connection_limits(&self) -> crate::edge::admission::ConnectionLimits {
        crate::edge::admission::ConnectionLimits {
            per_peer: self.max_connections_per_peer,
            total: self.max_connections,
            unauthenticated_per_peer: self.max_unauthenticated_connections_per_peer,
            unauthenticated_total: self.max_unauthenticated_connections,
            idle_timeout: Duration::from_secs(self.idle_timeout_seconds),
            first_request_timeout: Duration::from_secs(self.first_request_timeout_seconds),
        }
    }

    /// The request rate per principal ([`crate::edge::admission::RateLimitLayer`]);
    /// zeros are refused by [`Config::validate`].
    pub fn request_rate(&self) -> crate::edge::admission::RequestRate {
        let at_least_one = |value: u32| NonZeroU32::new(value).unwrap_or(NonZeroU32::MIN);
        crate::edge::admission::RequestRate {
            per_second: at_least_one(self.requests_per_second),
            burst: at_least_one(self.request_burst),
        }
    }

    /// The planner's memory for ingest streams
    /// ([`crate::capture::ingest_budget::IngestBudget`]).
    pub fn ingest_budget(&self) -> crate::capture::ingest_budget::IngestBudget {
        crate::capture::ingest_budget::IngestBudget::new(
            self.ingest_memory_bytes,
            Duration::from_secs(self.ingest_wait_seconds),
            redrive_proto::limits::MAX_GRPC_MESSAGE_BYTES,
        )
        .with_per_caller(
            self.ingest_memory_per_principal_bytes
                .unwrap_or(self.ingest_memory_bytes / 2),
        )
    }

    /// The caps on open `WatchPlan` streams.
    pub fn watch_limits(&self) -> crate::edge::admission::StreamLimits {
        crate::edge::admission::StreamLimits::new(
            "WatchPlan",
            self.max_watches_per_principal,
            self.max_watches,
            self.reserved_watches,
            ["max-watches-per-principal", "max-watches"],
        )
    }

    /// The caps on open `WatchLease` streams.
    pub fn lease_watch_limits(&self) -> crate::edge::admission::StreamLimits {
        crate::edge::admission::StreamLimits::new(
            "WatchLease",
            self.max_lease_watches_per_principal,
            self.max_lease_watches,
            self.reserved_lease_watches,
            ["max-lease-watches-per-principal", "max-lease-watches"],
        )
    }

    /// The TLS files for `https://` state-check hooks.
    pub fn state_check_tls(&self) -> redrive_proto::tls::ClientTlsFiles {
        redrive_proto::tls::ClientTlsFiles {
            ca: self.state_check_ca.clone(),
            client_cert: self.state_check_client_cert.clone(),
            client_key: self.state_check_client_key.clone(),
        }
    }

    /// What authentication these settings ask for.
    pub fn auth_settings(&self) -> AuthSettings {
        AuthSettings {
            token_file: self.token_file.clone(),
            jwt: JwtSettings {
                public_keys: self.jwt_public_keys.clone(),
                jwks: self.jwt_jwks.clone(),
                issuer: self.jwt_issuer.clone(),
                audience: self.jwt_audience.clone(),
                roles_claim: self.jwt_roles_claim.clone(),
                name_claim: self.jwt_name_claim.clone(),
            },
            client_certificates: self.tls_client_ca.is_some(),
            cert_roles: self.cert_roles.clone(),
            protect_open_services: self.authenticate_health_and_reflection,
        }
    }

    /// Whether the planner may serve without TLS or authentication here:
    /// on a loopback address, or with `--insecure`.
    pub fn exposed_without_protection(&self) -> bool {
        !self.listen.ip().is_loopback()
            && (self.tls_cert.is_none() || !self.auth_settings().enabled())
    }

    /// How long a slice lease lasts.
    pub fn lease_ttl(&self) -> Duration {
        Duration::from_secs(self.lease_ttl_seconds)
    }

    /// `--capture-reconnect-max-ms` as a duration.
    pub fn capture_reconnect_max(&self) -> Duration {
        Duration::from_millis(self.capture_reconnect_max_ms)
    }

    /// `--capture-batch-wait-ms` as a duration.
    pub fn capture_batch_wait(&self) -> Duration {
        Duration::from_millis(self.capture_batch_wait_ms)
    }
}

/// Parses a positive humantime duration (`90s`, `30m`, `2h`, `7days`) of at
/// most [`MAX_AGE`] (100 years: every duration setting is an age or window).
///
/// # Errors
/// The parser's complaint, or that it is zero or above the limit (clap names
/// the setting).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let parsed = humantime::parse_duration(text.trim())
        .map_err(|error| format!("{error} (e.g. 90s, 30m, 2h, 7days)"))?;
    if parsed.is_zero() {
        return Err("must be longer than zero".to_owned());
    }
    at_most(parsed, MAX_AGE)
}
#[cfg(test)]
mod tests {
    use super::*;
    use crate::precheck::policy::Policy;
    use clap::CommandFactory;
    use redrive_proto::settings::ServiceSettings;

    fn config(args: &[&str]) -> Result<Config, String> {
        let config =
            Config::try_parse_from(std::iter::once("redrive-planner").chain(args.iter().copied()))
                .map_err(|error| error.to_string())?;
        config.validate().map_err(|error| error.to_string())?;
        Ok(config)
    }

    #[test]
    fn the_policy_comes_from_the_settings() {
        let config = config(&[
            "--stale-after",
            "payment.*=2h",
            "--stale-after",
            "payment.captured=30m",
            "--stale-after-source",
            "orders.dlq=1h",
            "--default-stale-after",
            "1day",
            "--max-redrives",
            "2",
        ])
        .unwrap();
        let max_precheck_age = config.max_precheck_age;
        let policy = Settings::parse(config).unwrap().policy;
        assert_eq!(policy.stale_after[0].0.as_str(), "payment.captured");
        assert_eq!(policy.stale_after[1].1, Duration::from_secs(7200));
        assert_eq!(policy.stale_after_source[0].1, Duration::from_secs(3600));
        assert_eq!(
            policy.default_stale_after,
            Some(Duration::from_secs(86_400))
        );
        assert_eq!(policy.max_redrives, 2);
        assert_eq!(max_precheck_age, Duration::from_secs(15 * 60));
        assert_eq!(
            Settings::parse(Config::for_database("postgres://x/y"))
                .unwrap()
                .policy,
            Policy::default()
        );
    }

    #[test]
    fn bad_policy_settings_are_named() {
        for (args, setting) in [
            (&["--stale-after", "payment.*"][..], "--stale-after"),
            (&["--stale-after", "pay*ment=2h"][..], "--stale-after"),
            (
                &["--stale-after", "a=1h", "--stale-after", "a=2h"][..],
                "--stale-after",
            ),
            (
                &["--stale-after-source", "orders.dlq=soon"][..],
                "--stale-after-source",
            ),
            (&["--max-redrives", "0"][..], "--max-redrives"),
            (&["--event-time-pointer", "at"][..], "--event-time-pointer"),
            (&["--max-precheck-age", "0s"][..], "--max-precheck-age"),
            (
                &["--default-stale-after", "2 fortnights"][..],
                "--default-stale-after",
            ),
        ] {
            let error = config(args).unwrap_err();
            assert!(error.contains(setting), "{args:?}: {error}");
        }
    }

    /// Issue 15: a non-loopback address needs TLS and authentication, or
    /// --insecure.
    #[test]
    fn a_public_address_needs_tls_and_authentication_or_insecure() {
        let error = config(&["--listen", "0.0.0.0:50051"]).unwrap_err();
        assert!(
            error.contains("--listen") && error.contains("--insecure"),
            "{error}"
        );
        let insecure = config(&["--listen", "0.0.0.0:50051", "--insecure"]).unwrap();
        assert!(insecure.exposed_without_protection());
        assert!(!Config::for_database("postgres://x/y").exposed_without_protection());
        // TLS without authentication is still unprotected.
        let mut tls_only = Config::for_database("postgres://x/y");
        tls_only.listen = "0.0.0.0:50051".parse().unwrap();
        tls_only.tls_cert = Some("cert.pem".into());
        tls_only.tls_key = Some("key.pem".into());
        assert!(tls_only.exposed_without_protection());
        for (args, setting) in [
            (&["--tls-cert", "c.pem"][..], "--tls-cert"),
            (&["--tls-client-ca", "ca.pem"][..], "--tls-client-ca"),
            (&["--cert-role", "x=root"][..], "--cert-role"),
            (
                &["--jwt-public-key", "/nonexistent.pem"][..],
                "--jwt-issuer",
            ),
            (&["--token-file", "/nonexistent.toml"][..], "--token-file"),
            (
                &[
                    "--tls-cert",
                    "/nonexistent.pem",
                    "--tls-key",
                    "/nonexistent.key",
                ][..],
                "--tls-cert",
            ),
            (
                &["--tls-cert", "/etc/hostname", "--tls-key", "/etc/hostname"][..],
                "--tls-cert: /etc/hostname: no PEM CERTIFICATE in it",
            ),
        ] {
            let error = config(args).unwrap_err();
            assert!(error.contains(setting), "{args:?}: {error}");
        }
    }

    /// A new user's pass: a TLS file of the wrong kind was refused as "the
    /// certificate, key or client CA is not usable PEM", naming none of the
    /// three. Each file is now checked for a PEM block of its kind and
    /// named with its flag; every such problem is said at once.
    #[test]
    fn a_tls_file_of_the_wrong_kind_is_named_with_its_flag() {
        let dir = tempfile::tempdir().unwrap();
        let pair = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["localhost".to_owned()])
            .unwrap()
            .self_signed(&pair)
            .unwrap();
        let write = |name: &str, text: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            path.display().to_string()
        };
        let cert = write("cert.pem", &cert.pem());
        let key = write("key.pem", &pair.serialize_pem());
        let text = write("notes.txt", "not a certificate\n");
        // A certificate whose body is not DER: the label is right, so only
        // rustls can tell; its error still says which settings to look at.
        let broken = write(
            "broken.pem",
            "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
        );
        // Labels rustls cannot use, refused by name (a review: they passed
        // as "ends in PRIVATE KEY / CERTIFICATE" and failed under
        // --tls-cert whatever the file).
        let encrypted = write(
            "encrypted.pem",
            "-----BEGIN ENCRYPTED PRIVATE KEY-----\nAAAA\n-----END ENCRYPTED PRIVATE KEY-----\n",
        );
        let legacy_encrypted = write(
            "legacy.pem",
            "-----BEGIN RSA PRIVATE KEY-----\nProc-Type: 4,ENCRYPTED\nDEK-Info: AES-128-CBC,00\n\nAAAA\n-----END RSA PRIVATE KEY-----\n",
        );
        let other_key = write(
            "other.key",
            &rcgen::KeyPair::generate().unwrap().serialize_pem(),
        );
        let trusted = write(
            "trusted.pem",
            "-----BEGIN TRUSTED CERTIFICATE-----\nAAAA\n-----END TRUSTED CERTIFICATE-----\n",
        );
        let tls = |cert: &str, key: &str, ca: Option<&str>| {
            let mut args = vec!["--tls-cert", cert, "--tls-key", key];
            if let Some(ca) = ca {
                args.extend(["--tls-client-ca", ca]);
            }
            config(&args)
        };
        assert!(tls(&cert, &key, None).is_ok());
        assert!(tls(&cert, &key, Some(&cert)).is_ok());
        for (cert_file, key_file, ca, expected) in [
            (
                &key,
                &key,
                None,
                vec![format!("--tls-cert: {key}: no PEM CERTIFICATE")],
            ),
            (
                &cert,
                &cert,
                None,
                vec![format!("--tls-key: {cert}: no PEM PRIVATE KEY")],
            ),
            (
                &key,
                &cert,
                None,
                vec![
                    format!("--tls-cert: {key}: no PEM CERTIFICATE"),
                    format!("--tls-key: {cert}: no PEM PRIVATE KEY"),
                ],
            ),
            (
                &cert,
                &key,
                Some(&text),
                vec![format!("--tls-client-ca: {text}: no PEM CERTIFICATE")],
            ),
            (
                &cert,
                &key,
                Some(&key),
                vec![format!("--tls-client-ca: {key}: no PEM CERTIFICATE")],
            ),
            (
                &cert,
                &encrypted,
                None,
                vec![format!("--tls-key: {encrypted}: the key is encrypted")],
            ),
            (
                &cert,
                &legacy_encrypted,
                None,
                vec![format!(
                    "--tls-key: {legacy_encrypted}: the key is encrypted"
                )],
            ),
            // A new user's pass: a key of another certificate read "not
            // usable PEM: transport error".
            (
                &cert,
                &other_key,
                None,
                vec![format!(
                    "--tls-key: {other_key}: the key does not belong to the certificate (their public keys differ) (--tls-cert {cert})"
                )],
            ),
            (
                &cert,
                &key,
                Some(&trusted),
                vec![format!("--tls-client-ca: {trusted}: no PEM CERTIFICATE")],
            ),
            (
                &broken,
                &key,
                None,
                vec![format!(
                    "--tls-cert: {broken}: the certificate cannot be used: "
                )],
            ),
        ] {
            let error = tls(cert_file, key_file, ca.map(String::as_str)).unwrap_err();
            for expected in expected {
                assert!(error.contains(&expected), "{expected} in {error}");
            }
        }
        // The state-check hooks' files, each under its own flag (a new
        // user's pass: a wrong client key was filed under
        // --state-check-ca, and a key of another certificate passed the
        // start and failed every precheck).
        let hook = |ca: &str, client_cert: &str, client_key: &str| {
            config(&[
                "--state-check-ca",
                ca,
                "--state-check-client-cert",
                client_cert,
                "--state-check-client-key",
                client_key,
            ])
        };
        assert!(hook(&cert, &cert, &key).is_ok());
        for (ca, client_cert, client_key, expected) in [
            (
                &cert,
                &cert,
                &other_key,
                format!(
                    "--state-check-client-key: {other_key}: the key does not belong to the certificate"
                ),
            ),
            (
                &cert,
                &cert,
                &cert,
                format!("--state-check-client-key: {cert}: no PEM PRIVATE KEY"),
            ),
            (
                &cert,
                &key,
                &key,
                format!("--state-check-client-cert: {key}: no PEM CERTIFICATE"),
            ),
            (
                &key,
                &cert,
                &key,
                format!("--state-check-ca: {key}: no PEM CERTIFICATE"),
            ),
            (
                &cert,
                &cert,
                &encrypted,
                format!("--state-check-client-key: {encrypted}: the key is encrypted"),
            ),
        ] {
            let error = hook(ca, client_cert, client_key).unwrap_err();
            assert!(error.contains(&expected), "{expected} in {error}");
        }
    }

    /// A key fits its certificate whatever the algorithm, and in a chain
    /// with an intermediate; a key of another certificate does not (the
    /// check must never refuse a good pair).
    #[test]
    fn a_key_fits_its_certificate_of_any_algorithm_and_chain() {
        use redrive_proto::tls::{PairProblem, key_fits_certificate};
        let algorithms = [
            &rcgen::PKCS_ECDSA_P256_SHA256,
            &rcgen::PKCS_ECDSA_P384_SHA384,
            &rcgen::PKCS_ED25519,
        ];
        let pairs: Vec<(String, String)> = algorithms
            .iter()
            .map(|algorithm| {
                let key = rcgen::KeyPair::generate_for(algorithm).unwrap();
                let cert = rcgen::CertificateParams::new(vec!["localhost".to_owned()])
                    .unwrap()
                    .self_signed(&key)
                    .unwrap();
                (cert.pem(), key.serialize_pem())
            })
            .collect();
        for (index, (cert, key)) in pairs.iter().enumerate() {
            assert_eq!(
                key_fits_certificate(cert.as_bytes(), key.as_bytes()),
                Ok(())
            );
            let (_, other) = &pairs[(index + 1) % pairs.len()];
            assert_eq!(
                key_fits_certificate(cert.as_bytes(), other.as_bytes()),
                Err(PairProblem::Mismatch)
            );
        }
        // A leaf signed by a CA, the file holding the leaf then the CA.
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca_cert = ca_params.clone().self_signed(&ca_key).unwrap();
        let issuer = rcgen::Issuer::new(ca_params, ca_key);
        let leaf_key = rcgen::KeyPair::generate().unwrap();
        let leaf = rcgen::CertificateParams::new(vec!["localhost".to_owned()])
            .unwrap()
            .signed_by(&leaf_key, &issuer)
            .unwrap();
        let chain = format!("{}{}", leaf.pem(), ca_cert.pem());
        assert_eq!(
            key_fits_certificate(chain.as_bytes(), leaf_key.serialize_pem().as_bytes()),
            Ok(())
        );
        let (_, other) = &pairs[0];
        assert_eq!(
            key_fits_certificate(chain.as_bytes(), other.as_bytes()),
            Err(PairProblem::Mismatch)
        );
    }

    /// Issue 15: `--help` printed `DATABASE_URL=postgres://u:secret@…`, and a
    /// bad URL's error printed it whole.
    #[test]
    fn secrets_stay_out_of_help_and_errors() {
        let command = Config::command();
        for name in ["database_url", "amqp_url"] {
            let arg = command
                .get_arguments()
                .find(|arg| arg.get_id() == name)
                .unwrap();
            assert!(arg.is_hide_env_values_set(), "{name}");
        }
        let error = config(&["--database-url", "postgres://u:secret@db:notaport/x"]).unwrap_err();
        assert!(
            error.contains("database-url") && !error.contains("secret"),
            "{error}"
        );
        let error = config(&["--database-url", "mysql://u:secret@db/x"]).unwrap_err();
        assert!(
            error.contains("u:***@db") && !error.contains("secret"),
            "{error}"
        );
        let error = config(&["--amqp-url", "amqp://u:secret@h:port/%2f"]).unwrap_err();
        assert!(
            error.contains("amqp-url") && !error.contains("secret"),
            "{error}"
        );
    }

    #[test]
    fn urls_can_come_from_files() {
        let dir = std::env::temp_dir().join(format!("redrive-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("database-url");
        std::fs::write(&path, "postgres://u:secret@db/redrive\n").unwrap();
        let config = Config::try_parse_from([
            "redrive-planner",
            "--database-url-file",
            path.to_str().unwrap(),
        ])
        .unwrap()
        .with_secret_files()
        .unwrap();
        assert_eq!(config.database_url, "postgres://u:secret@db/redrive");
        config.validate().unwrap();
        std::fs::write(&path, "  \n").unwrap();
        let error = Config::try_parse_from([
            "redrive-planner",
            "--database-url-file",
            path.to_str().unwrap(),
        ])
        .unwrap()
        .with_secret_files()
        .unwrap_err()
        .to_string();
        assert!(
            error.contains("database-url-file") && error.contains("empty"),
            "{error}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Test configs read no `REDRIVE_*` variable. The test runs itself as a
    /// child process with `REDRIVE_LEASE_TTL_SECONDS=1` and
    /// `REDRIVE_FOUR_EYES=true` set (setting a variable in this process
    /// would race other tests), and the child checks the defaults.
    #[test]
    fn test_configs_ignore_the_environment() {
        const NAME: &str = "config::tests::test_configs_ignore_the_environment";
        if std::env::var_os("REDRIVE_LEASE_TTL_SECONDS").is_some() {
            let config = Config::for_database("postgres://localhost/x");
            assert_eq!(config.lease_ttl_seconds, 30);
            assert!(!config.four_eyes);
            // ... while the binary's own parse does read them.
            assert_eq!(Config::parse_from(["redrive-planner"]).lease_ttl_seconds, 1);
            return;
        }
        let output = std::process::Command::new(std::env::current_exe().unwrap())
            .args([NAME, "--exact", "--nocapture"])
            .env("REDRIVE_LEASE_TTL_SECONDS", "1")
            .env("REDRIVE_FOUR_EYES", "true")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success() && stdout.contains("1 passed"),
            "the child run: {stdout}{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }

    /// Issue 13: `--default-stale-after 3170000years` made every ClaimSlice
    /// panic on a chrono overflow; every duration setting has a maximum.
    #[test]
    fn durations_and_counts_have_maxima() {
        for (args, setting) in [
            (
                &["--default-stale-after", "3170000years"][..],
                "--default-stale-after",
            ),
            (
                &["--replay-key-window", "100000years"][..],
                "--replay-key-window",
            ),
            (&["--stale-after", "order.*=101years"][..], "--stale-after"),
            (
                &["--stale-after-source", "orders.dlq=101years"][..],
                "--stale-after-source",
            ),
            (
                &["--max-precheck-age", "200years"][..],
                "--max-precheck-age",
            ),
            (&["--max-redrives", "4000000000"][..], "max-redrives"),
            (
                &["--lease-ttl-seconds", "18446744073709551615"][..],
                "lease-ttl-seconds",
            ),
            (
                &["--capture-batch-wait-ms", "18446744073709551615"][..],
                "capture-batch-wait-ms",
            ),
            (
                &["--capture-reconnect-max-ms", "100"][..],
                "capture-reconnect-max-ms",
            ),
            (
                &["--capture-reconnect-max-ms", "18446744073709551615"][..],
                "capture-reconnect-max-ms",
            ),
            // Issue 28: these crashed the planner at its first connection.
            (
                &["--first-request-timeout-seconds", "18446744073709551615"][..],
                "first-request-timeout-seconds",
            ),
            (
                &["--idle-timeout-seconds", "18446744073709551615"][..],
                "idle-timeout-seconds",
            ),
            (
                &["--ingest-wait-seconds", "86401"][..],
                "ingest-wait-seconds",
            ),
        ] {
            let error = config(args).unwrap_err();
            assert!(error.contains(setting), "{args:?}: {error}");
            assert!(
                ["36500 days", "1000", "3600", "60000", "86400"]
                    .iter()
                    .any(|limit| error.contains(limit)),
                "{args:?}: {error}"
            );
        }
        // Built in code (as tests do) rather than parsed: the same checks.
        let mut built = Config::for_database("postgres://localhost/x".to_owned());
        built.default_stale_after = Some(Duration::from_secs(u64::MAX / 4));
        let error = built.validate().unwrap_err().to_string();
        assert!(error.contains("default-stale-after"), "{error}");
        assert!(config(&["--default-stale-after", "100years"]).is_err());
        assert!(config(&["--default-stale-after", "36500days"]).is_ok());
    }

    #[test]
    fn byte_budgets_are_checked() {
        for (args, setting) in [
            (&["--claim-max-bytes", "0"][..], "claim-max-bytes"),
            (&["--claim-max-bytes", "33554433"][..], "claim-max-bytes"),
            (&["--capture-batch-bytes", "0"][..], "capture-batch-bytes"),
            (
                &["--capture-batch-bytes", "268435457"][..],
                "capture-batch-bytes",
            ),
            (
                &["--ingest-memory-per-principal-bytes", "1000"][..],
                "ingest-memory-per-principal-bytes",
            ),
            (
                &[
                    "--ingest-memory-bytes",
                    "2097152",
                    "--ingest-memory-per-principal-bytes",
                    "2097153",
                ][..],
                "ingest-memory-per-principal-bytes",
            ),
        ] {
            let error = config(args).unwrap_err();
            assert!(error.contains(setting), "{args:?}: {error}");
        }
        assert!(config(&["--claim-max-bytes", "33554432"]).is_ok());
        assert!(config(&["--capture-batch-bytes", "1"]).is_ok());
        assert!(config(&["--ingest-memory-per-principal-bytes", "1048576"]).is_ok());
    }
}
