//! [`Settings`]: the settings parsed once into the values the planner's
//! parts take, and the [`ServiceSettings`] hooks of [`Config`].

use std::sync::Arc;

use redrive_proto::settings::{
    ServiceSettings, SettingError, SettingErrors, TelemetrySettings, read_secret_into,
};

use super::Config;
use crate::{
    dead_letters::ExtractionRules,
    edge::auth::Authenticator,
    precheck::{policy::Policy, state_check::HookRoute},
    webhooks::deliver::Delivery,
};

/// What parsing gives beside the flags themselves.
pub(super) struct Parsed {
    pub(super) policy: Policy,
    pub(super) state_checks: Vec<HookRoute>,
    pub(super) extraction: ExtractionRules,
    pub(super) authenticator: Option<Arc<Authenticator>>,
    pub(super) tls: Option<tonic::transport::ServerTlsConfig>,
    pub(super) webhooks: Delivery,
    pub(super) audit_log: crate::audit::log::AuditLog,
}

/// The planner's settings parsed into the values its parts take: the only
/// way to them is [`Settings::parse`], which reports every problem at once,
/// so no part re-reads a flag's text or falls back to a default for a bad
/// one.
pub struct Settings {
    /// The flags as given (clap has typed the plain ones: numbers,
    /// durations, paths, addresses).
    pub config: Config,
    /// The precheck policy (`--stale-after`, `--stale-after-source`,
    /// `--default-stale-after`, `--replay-key-window`, `--max-redrives`,
    /// `--event-time-pointer`).
    pub policy: Policy,
    /// The state-check hook routes (`--state-check`).
    pub state_checks: Vec<HookRoute>,
    /// What capture and ingest derive from a dead letter (`--message-key`,
    /// the `--*-header` flags, `--max-body-bytes`, the AMQP user).
    pub extraction: ExtractionRules,
    /// Who may call (the token, key and JWKS files read); `None` when
    /// authentication is off.
    pub authenticator: Option<Arc<Authenticator>>,
    /// The server's TLS (the certificate files read); `None` without
    /// `--tls-cert`. With `--tls-client-ca`, client certificates are
    /// verified, and required unless bearer tokens are accepted too.
    pub tls: Option<tonic::transport::ServerTlsConfig>,
    /// How webhooks are delivered, with the planner's own target
    /// (`--webhook-url`, the secret file read) when set.
    pub webhooks: Delivery,
    /// The audit log: its keys (the files read), cadence and witness.
    pub audit_log: crate::audit::log::AuditLog,
}

impl Settings {
    /// Parses `config`.
    ///
    /// # Errors
    /// [`SettingErrors`] naming every wrong setting, in flag order.
    pub fn parse(config: Config) -> Result<Self, SettingErrors> {
        let parsed = config.parse_all().map_err(SettingErrors)?;
        Ok(Self {
            config,
            policy: parsed.policy,
            state_checks: parsed.state_checks,
            extraction: parsed.extraction,
            authenticator: parsed.authenticator,
            tls: parsed.tls,
            webhooks: parsed.webhooks,
            audit_log: parsed.audit_log,
        })
    }
}

impl ServiceSettings for Config {
    /// Checks the settings that clap cannot, all of them.
    ///
    /// # Errors
    /// [`SettingErrors`] naming every wrong setting.
    fn validate(&self) -> Result<(), SettingErrors> {
        self.parse_all().map(drop).map_err(SettingErrors)
    }

    /// Reads `--database-url-file`, `--amqp-url-file` and
    /// `--webhook-secret-file` into `database_url`, `amqp.url` and
    /// `webhooks.secret`.
    fn read_secret_files(&mut self, problems: &mut Vec<SettingError>) {
        let file = self.database_url_file.as_deref();
        read_secret_into("database-url-file", file, &mut self.database_url, problems);
        self.amqp.read_secret_file(problems);
        self.webhooks.read_secret_file(problems);
    }

    fn telemetry(&self) -> &TelemetrySettings {
        &self.telemetry
    }
}
