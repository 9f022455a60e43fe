//! The planner's audit log flags ([`AuditLogSettings`], flattened into
//! [`super::Config`]) and their one parse into an [`AuditLog`]
//! (docs/audit-log.md, "Running it").

use std::{path::PathBuf, time::Duration};

use redrive_proto::settings::SettingError;
use redrive_tlog::note::Signer;

use super::parse_duration;
use crate::{
    audit::log::{AuditLog, LogOptions},
    webhooks::check_url,
};

/// How the audit log is sealed, signed and witnessed.
#[derive(Clone, Debug, clap::Args)]
#[group(skip)]
pub struct AuditLogSettings {
    /// The key the planner signs the audit log's checkpoints with: a file
    /// holding a C2SP signed-note Ed25519 private key
    /// (`PRIVATE+KEY+<name>+<key id>+<base64>`), as `redrivectl audit keygen`
    /// writes it. Give every replica the same file. Without it the log is
    /// still sealed, but nothing is signed and rows written outside the
    /// planner are sealed too; once a planner with a key has started on a
    /// database (or its log is signed), a planner without it refuses to
    /// start there, and one running stops (unless `--audit-log off`: it
    /// then neither seals nor queues rows for sealing). To add a key, stop
    /// every planner of the database, then start them with it.
    #[arg(
        long = "audit-signing-key",
        env = "REDRIVE_AUDIT_SIGNING_KEY",
        value_name = "FILE"
    )]
    pub signing_key: Option<PathBuf>,

    /// During a key rotation, the key the log took before: rows written
    /// under it are sealed, not refused. Restart each planner with the new
    /// key and this: once the first has started, a planner still on the old
    /// key alone stops at its next sealing round, and one started with it
    /// is refused. A planner moving the log on from this key waits until a
    /// minute after the log took it (a second rotation).
    #[arg(
        long = "audit-previous-key",
        env = "REDRIVE_AUDIT_PREVIOUS_KEY",
        value_name = "FILE"
    )]
    pub previous_key: Option<PathBuf>,

    /// The checkpoints' origin line (a name unique to this log, such as
    /// `redrive.example.com/audit`); the signing key's name by default.
    #[arg(long = "audit-origin", env = "REDRIVE_AUDIT_ORIGIN")]
    pub origin: Option<String>,

    /// A checkpoint is signed once this many new leaves are sealed ...
    #[arg(
        long = "audit-checkpoint-every",
        env = "REDRIVE_AUDIT_CHECKPOINT_EVERY",
        default_value_t = 1000
    )]
    pub checkpoint_every: u64,

    /// ... or once this long has passed since the last one and the log grew.
    #[arg(long = "audit-checkpoint-interval", env = "REDRIVE_AUDIT_CHECKPOINT_INTERVAL",
          value_name = "DURATION", default_value = "10s", value_parser = parse_duration)]
    pub checkpoint_interval: Duration,

    /// A directory (on another disk or machine: a witness) where each new
    /// checkpoint is written as `checkpoint`; a smaller tree never replaces
    /// a larger one there.
    #[arg(
        long = "audit-witness-dir",
        env = "REDRIVE_AUDIT_WITNESS_DIR",
        value_name = "DIR"
    )]
    pub witness_dir: Option<PathBuf>,

    /// A URL each new checkpoint is POSTed to (text/plain, the signed note):
    /// https://, or http:// to a loopback address.
    #[arg(
        long = "audit-witness-url",
        env = "REDRIVE_AUDIT_WITNESS_URL",
        value_name = "URL"
    )]
    pub witness_url: Option<String>,

    /// `off` stops sealing: events written meanwhile are never in the log
    /// (an export lists them as not sealed). For measuring what sealing
    /// costs; `on` by default.
    #[arg(long = "audit-log", env = "REDRIVE_AUDIT_LOG", default_value = "on",
          value_parser = ["on", "off"])]
    pub mode: String,
}

impl Default for AuditLogSettings {
    fn default() -> Self {
        Self {
            signing_key: None,
            previous_key: None,
            origin: None,
            checkpoint_every: 1000,
            checkpoint_interval: Duration::from_secs(10),
            witness_dir: None,
            witness_url: None,
            mode: "on".into(),
        }
    }
}

/// Reads the key file at `path` for `--setting`.
fn read_key(
    setting: &'static str,
    path: &std::path::Path,
    problems: &mut Vec<SettingError>,
) -> Option<(Signer, String)> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(error) => {
            problems.push(SettingError::new(
                setting,
                format!("{}: {error}", path.display()),
            ));
            return None;
        }
    };
    match Signer::from_key_text(&text) {
        Ok(signer) => Some((signer, text.trim().to_owned())),
        Err(error) => {
            problems.push(SettingError::new(
                setting,
                format!(
                    "{} is not a signed-note private key ({error}); `redrivectl audit keygen` makes one",
                    path.display()
                ),
            ));
            None
        }
    }
}

impl AuditLogSettings {
    /// These settings as the log takes them, the key files read; problems
    /// (naming the flag, never quoting a key) go to `problems`.
    pub fn parse(&self, problems: &mut Vec<SettingError>) -> AuditLog {
        let signing = self
            .signing_key
            .as_deref()
            .and_then(|path| read_key("audit-signing-key", path, problems));
        let previous = self
            .previous_key
            .as_deref()
            .and_then(|path| read_key("audit-previous-key", path, problems));
        if let (Some((signing, _)), Some((previous, _))) = (&signing, &previous)
            && signing.verifier().key_text() == previous.verifier().key_text()
        {
            problems.push(SettingError::new(
                "audit-previous-key",
                "is the same key as --audit-signing-key: during a rotation it is the key being \
                 replaced (was the new key's file given twice?)",
            ));
        }
        if self.previous_key.is_some() && self.signing_key.is_none() {
            problems.push(SettingError::new(
                "audit-previous-key",
                "needs --audit-signing-key: the key that replaces it",
            ));
        }
        if self.checkpoint_every == 0 {
            problems.push(SettingError::new(
                "audit-checkpoint-every",
                "must be at least 1",
            ));
        }
        if !(Duration::from_secs(1)..=Duration::from_secs(86_400))
            .contains(&self.checkpoint_interval)
        {
            problems.push(SettingError::new(
                "audit-checkpoint-interval",
                format!("{:?} must be from 1s to 24h", self.checkpoint_interval),
            ));
        }
        let witness_url = self.witness_url.as_deref().and_then(|url| {
            check_url(url)
                .map_err(|text| problems.push(SettingError::new("audit-witness-url", text)))
                .ok()
        });
        if (self.witness_dir.is_some() || witness_url.is_some()) && self.signing_key.is_none() {
            problems.push(SettingError::new(
                "audit-signing-key",
                "needed with --audit-witness-dir or --audit-witness-url: only signed checkpoints are pushed",
            ));
        }
        if let Some(origin) = &self.origin
            && (origin.is_empty() || origin.contains('\n'))
        {
            problems.push(SettingError::new(
                "audit-origin",
                "one non-empty line of text",
            ));
        }
        AuditLog::new(LogOptions {
            origin: self.origin.clone(),
            signing,
            previous_key_text: previous.map(|(_, text)| text),
            checkpoint_every: self.checkpoint_every.max(1),
            checkpoint_interval: self.checkpoint_interval,
            witness_dir: self.witness_dir.clone(),
            witness_url,
            enabled: self.sealing(),
        })
    }

    /// Whether this planner seals the log (`--audit-log` is not `off`).
    pub fn sealing(&self) -> bool {
        self.mode != "off"
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn key_file(dir: &Path, file: &str, name: &str) -> PathBuf {
        let path = dir.join(file);
        let signer = Signer::generate(name).expect("a key");
        std::fs::write(&path, format!("{}\n", signer.key_text())).expect("written");
        path
    }

    fn problems_of(settings: &AuditLogSettings) -> Vec<(&'static str, String)> {
        let mut problems = Vec::new();
        settings.parse(&mut problems);
        problems
            .into_iter()
            .map(|problem| (problem.setting, problem.problem))
            .collect()
    }

    #[test]
    fn the_previous_key_is_another_key_than_the_signing_key() {
        let dir = tempfile::tempdir().expect("a directory");
        let new = key_file(dir.path(), "new.key", "redrive.test/new");
        let old = key_file(dir.path(), "old.key", "redrive.test/old");
        let copy = dir.path().join("copy.key");
        std::fs::copy(&new, &copy).expect("copied");
        let with = |previous: &Path| AuditLogSettings {
            signing_key: Some(new.clone()),
            previous_key: Some(previous.to_path_buf()),
            ..AuditLogSettings::default()
        };
        assert_eq!(problems_of(&with(&old)), Vec::new());
        for same in [&new, &copy] {
            let problems = problems_of(&with(same));
            assert!(
                problems
                    .iter()
                    .any(|(setting, problem)| *setting == "audit-previous-key"
                        && problem.contains("the same key as --audit-signing-key")),
                "{problems:?}"
            );
        }
    }
}
