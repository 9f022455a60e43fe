//! The one parse of the settings: [`Config::parse_all`] runs the checks
//! clap cannot make, step by step in flag order, and gathers every problem.

use redrive_proto::{
    limits::{MAX_CAPTURE_BATCH_WAIT_MS, MAX_LEASE_TTL_SECONDS},
    settings::{SettingError, redact_text, redact_url},
};

use super::{Config, MAX_DEADLINE_SECONDS, settings::Parsed};
use crate::{dead_letters::message_key::KeySource, precheck::state_check::HookRoute};

/// The smallest pool the planner runs with: the `LISTEN` connection, and a
/// precheck's three at once (its candidate stream, its near-duplicates
/// read in the stream's snapshot, its items' `COPY`).
pub const MIN_DATABASE_CONNECTIONS: u32 = 4;

impl Config {
    /// These settings parsed into the values the planner's parts take, or
    /// every problem of them, in flag order: the one parse of the settings
    /// ([`super::Settings::parse`],
    /// [`redrive_proto::settings::ServiceSettings::validate`]).
    pub(super) fn parse_all(&self) -> Result<Parsed, Vec<SettingError>> {
        let mut problems = Vec::new();
        self.database_problems(&mut problems);
        self.capture_problems(&mut problems);
        let key_sources = self.parse_key_sources(&mut problems);
        if let Some(id) = &self.broker_id
            && (id.trim().is_empty() || id.len() > 255 || id.chars().any(char::is_control))
        {
            problems.push(SettingError::new(
                "broker-id",
                format!("{id:?}: 1 to 255 bytes of printable text"),
            ));
        }
        let mut state_checks = Vec::new();
        for spec in &self.state_checks {
            match spec.parse::<HookRoute>() {
                Ok(route) => state_checks.push(route),
                Err(text) => problems.push(SettingError::new("state-check", text)),
            }
        }
        let policy = self.try_policy().map_err(|more| problems.extend(more)).ok();
        let transport = self.parse_transport(&mut problems);
        problems.extend(self.admission_problems());
        self.size_and_time_problems(&mut problems);
        let webhooks = self.webhooks.parse(&mut problems);
        let audit_log = self.audit_log.parse(&mut problems);
        // The telemetry flags come last.
        problems.extend(self.telemetry.check().err());
        match (policy, transport) {
            (Some(policy), Some((authenticator, tls))) if problems.is_empty() => Ok(Parsed {
                policy,
                state_checks,
                extraction: self.extraction_rules(key_sources),
                authenticator,
                tls,
                webhooks,
                audit_log,
            }),
            _ => Err(problems),
        }
    }

    /// Checks `--database-url` (a `postgres://` URL naming a database) and
    /// `--database-max-connections` (at least 4); problems go to `problems`.
    fn database_problems(&self, problems: &mut Vec<SettingError>) {
        let mut problem = |setting, text: String| problems.push(SettingError::new(setting, text));
        let shown_database_url = redact_url(&self.database_url);
        if !self.database_url.starts_with("postgres://")
            && !self.database_url.starts_with("postgresql://")
        {
            problem(
                "database-url",
                format!("{shown_database_url:?} is not a postgres:// URL"),
            );
        } else {
            match self
                .database_url
                .parse::<sqlx::postgres::PgConnectOptions>()
            {
                Err(error) => problem(
                    "database-url",
                    redact_text(&error.to_string(), &self.database_url),
                ),
                // Without a name the server's default database would do,
                // often `postgres`: the planner would migrate into it.
                Ok(options) if options.get_database().is_none_or(str::is_empty) => problem(
                    "database-url",
                    format!(
                        "{shown_database_url:?} names no database (e.g. postgres://host/redrive)"
                    ),
                ),
                Ok(_) => {}
            }
        }
        if self.database_max_connections < MIN_DATABASE_CONNECTIONS {
            problem(
                "database-max-connections",
                format!(
                    "must be at least {MIN_DATABASE_CONNECTIONS} (one is held for LISTEN; a precheck \
                     streams its candidates on one, reads its near-duplicates on a second and writes \
                     its items on a third)"
                ),
            );
        }
    }

    /// Checks the AMQP settings and the capture flags (`--capture-queue`,
    /// `--capture-prefetch`, `--capture-batch-size`, `--capture-batch-bytes`,
    /// `--capture-batch-wait-ms`); problems go to `problems`.
    fn capture_problems(&self, problems: &mut Vec<SettingError>) {
        let mut problem = |setting, text: String| problems.push(SettingError::new(setting, text));
        if let Err(errors) = self.amqp.check(self.broker_id.as_deref()) {
            for error in errors {
                problem(error.setting, error.problem);
            }
        }
        for (index, queue) in self.capture_queues.iter().enumerate() {
            if queue.trim().is_empty() || queue.len() > 255 {
                problem(
                    "capture-queue",
                    format!("{queue:?}: a queue name is 1 to 255 bytes"),
                );
            } else if queue.trim() != queue {
                problem(
                    "capture-queue",
                    format!(
                        "{queue:?}: begins or ends with a space (a list is comma-separated without spaces)"
                    ),
                );
            } else if self.capture_queues[..index].contains(queue) {
                problem("capture-queue", format!("{queue:?} is given twice"));
            }
        }
        if usize::from(self.capture_prefetch) < self.capture_batch_size {
            let (prefetch, size) = (self.capture_prefetch, self.capture_batch_size);
            // The prefetch is AMQP's 16-bit `prefetch-count` (basic.qos).
            let ways = if size <= usize::from(u16::MAX) {
                format!(
                    "raise --capture-prefetch to at least {size}, or lower --capture-batch-size \
                     to at most {prefetch}"
                )
            } else {
                format!(
                    "lower --capture-batch-size to at most {prefetch}: the prefetch is at most {}",
                    u16::MAX
                )
            };
            problem(
                "capture-prefetch",
                format!(
                    "{prefetch} is below --capture-batch-size {size}: a batch could never fill ({ways})"
                ),
            );
        }
        if self.capture_batch_size == 0 {
            problem("capture-batch-size", "must be at least 1".to_owned());
        }
        if !(1..=crate::capture::MAX_BATCH_BYTES).contains(&self.capture_batch_bytes) {
            problem(
                "capture-batch-bytes",
                format!("must be from 1 to {}", crate::capture::MAX_BATCH_BYTES),
            );
        }
        if !(200..=600_000).contains(&self.capture_reconnect_max_ms) {
            problem(
                "capture-reconnect-max-ms",
                "must be from 200 to 600000".to_owned(),
            );
        }
        if self.capture_batch_wait_ms > MAX_CAPTURE_BATCH_WAIT_MS {
            problem(
                "capture-batch-wait-ms",
                format!("at most {MAX_CAPTURE_BATCH_WAIT_MS}"),
            );
        }
    }

    /// Checks the header-name flags and parses `--message-key` into the
    /// message-key sources; problems go to `problems`.
    fn parse_key_sources(&self, problems: &mut Vec<SettingError>) -> Vec<KeySource> {
        let mut key_sources = Vec::new();
        let mut problem = |setting, text: String| problems.push(SettingError::new(setting, text));
        for (setting, header) in [
            ("event-type-header", &self.event_type_header),
            ("schema-version-header", &self.schema_version_header),
            ("error-class-header", &self.error_class_header),
        ] {
            if header.is_empty() || header.len() > 255 {
                problem(setting, "a header name is 1 to 255 bytes".to_owned());
            }
        }
        if let Some(header) = &self.event_time_header
            && (header.is_empty() || header.len() > 255)
        {
            problem(
                "event-time-header",
                "a header name is 1 to 255 bytes".to_owned(),
            );
        }
        for spec in &self.message_keys {
            match spec.parse::<KeySource>() {
                Ok(source) => key_sources.push(source),
                Err(text) => problem("message-key", text),
            }
        }
        key_sources
    }

    /// Checks the byte budgets (`--max-body-bytes`, the ingest memory,
    /// `--claim-max-bytes`) and the grace and lease times; problems go to
    /// `problems`.
    fn size_and_time_problems(&self, problems: &mut Vec<SettingError>) {
        // A body is stored whole and sent in one gRPC message.
        let most_body = redrive_proto::limits::MAX_GRPC_MESSAGE_BYTES / 2;
        if !(1..=most_body).contains(&self.max_body_bytes) {
            problems.push(SettingError::new(
                "max-body-bytes",
                format!("must be from 1 to {most_body}"),
            ));
        }
        if let Some(bytes) = self.ingest_memory_per_principal_bytes
            && !(1024 * 1024..=self.ingest_memory_bytes.max(1024 * 1024)).contains(&bytes)
        {
            problems.push(SettingError::new(
                "ingest-memory-per-principal-bytes",
                format!(
                    "{bytes} must be from 1048576 (1 MiB) to --ingest-memory-bytes ({})",
                    self.ingest_memory_bytes
                ),
            ));
        }
        if self.ingest_memory_bytes < 1024 * 1024 {
            problems.push(SettingError::new(
                "ingest-memory-bytes",
                format!(
                    "{} is below the least of 1048576 (1 MiB)",
                    self.ingest_memory_bytes
                ),
            ));
        }
        let most_claim = redrive_proto::limits::MAX_CLAIM_MAX_BYTES;
        if !(1..=most_claim).contains(&self.claim_max_bytes) {
            problems.push(SettingError::new(
                "claim-max-bytes",
                format!("must be from 1 to {most_claim}"),
            ));
        }
        if self.shutdown_grace_seconds > 600 {
            problems.push(SettingError::new(
                "shutdown-grace-seconds",
                "0 to 600".to_owned(),
            ));
        }
        if !(3..=MAX_LEASE_TTL_SECONDS).contains(&self.lease_ttl_seconds) {
            problems.push(SettingError::new(
                "lease-ttl-seconds",
                format!("must be from 3 to {MAX_LEASE_TTL_SECONDS}"),
            ));
        }
    }

    /// Checks the admission flags: the connection, stream and request-rate
    /// caps (each at least 1, the reserves below their totals) and the
    /// deadlines (at most [`MAX_DEADLINE_SECONDS`], the idle timeout longer
    /// than a keepalive round).
    fn admission_problems(&self) -> Vec<SettingError> {
        let mut problems = Vec::new();
        for (setting, value) in [
            ("max-connections-per-peer", self.max_connections_per_peer),
            ("max-connections", self.max_connections),
            (
                "max-unauthenticated-connections-per-peer",
                self.max_unauthenticated_connections_per_peer,
            ),
            (
                "max-unauthenticated-connections",
                self.max_unauthenticated_connections,
            ),
            (
                "ingest-wait-seconds",
                usize::try_from(self.ingest_wait_seconds).unwrap_or(usize::MAX),
            ),
            ("max-watches-per-principal", self.max_watches_per_principal),
            ("max-watches", self.max_watches),
            (
                "max-lease-watches-per-principal",
                self.max_lease_watches_per_principal,
            ),
            ("max-lease-watches", self.max_lease_watches),
            (
                "first-request-timeout-seconds",
                usize::try_from(self.first_request_timeout_seconds).unwrap_or(usize::MAX),
            ),
        ] {
            if value == 0 {
                problems.push(SettingError::new(setting, "must be at least 1".to_owned()));
            }
        }
        for (setting, reserved, total, total_setting) in [
            (
                "reserved-watches",
                self.reserved_watches,
                self.max_watches,
                "max-watches",
            ),
            (
                "reserved-lease-watches",
                self.reserved_lease_watches,
                self.max_lease_watches,
                "max-lease-watches",
            ),
        ] {
            if reserved >= total {
                problems.push(SettingError::new(
                    setting,
                    format!("{reserved} must be less than --{total_setting} ({total})"),
                ));
            }
        }
        for (setting, value) in [
            ("requests-per-second", self.requests_per_second),
            ("request-burst", self.request_burst),
        ] {
            if value == 0 {
                problems.push(SettingError::new(setting, "must be at least 1".to_owned()));
            }
        }
        // Deadlines are added to the clock: a day is far beyond any use,
        // and far from overflowing it.
        for (setting, seconds) in [
            ("idle-timeout-seconds", self.idle_timeout_seconds),
            (
                "first-request-timeout-seconds",
                self.first_request_timeout_seconds,
            ),
            ("ingest-wait-seconds", self.ingest_wait_seconds),
        ] {
            if seconds > MAX_DEADLINE_SECONDS {
                problems.push(SettingError::new(
                    setting,
                    format!("{seconds} is too long: at most {MAX_DEADLINE_SECONDS} (a day)"),
                ));
            }
        }
        let least =
            crate::edge::admission::KEEPALIVE_INTERVAL + crate::edge::admission::KEEPALIVE_TIMEOUT;
        if self.idle_timeout_seconds < least.as_secs() + 5 {
            problems.push(SettingError::new(
                "idle-timeout-seconds",
                format!(
                    "{} is too short: at least {} (a live client answers the keepalive ping every {} s within {} s)",
                    self.idle_timeout_seconds,
                    least.as_secs() + 5,
                    crate::edge::admission::KEEPALIVE_INTERVAL.as_secs(),
                    crate::edge::admission::KEEPALIVE_TIMEOUT.as_secs()
                ),
            ));
        }
        problems
    }
}
