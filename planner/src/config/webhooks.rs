//! The planner's webhook flags ([`WebhookSettings`], flattened into
//! [`super::Config`]) and their one parse into a [`Delivery`]
//! (docs/webhooks.md, "Configuration").

use std::{path::PathBuf, time::Duration};

use redrive_proto::settings::{SettingError, read_secret_into};

use super::parse_duration;
use crate::webhooks::{
    Secret, check_url,
    deliver::{DEFAULT_ATTEMPTS, DEFAULT_RETRY_MIN, Delivery, RETRY_MAX, Target},
};

/// Most attempts of one delivery `--webhook-attempts` accepts.
pub const MAX_WEBHOOK_ATTEMPTS: u32 = 100;

/// Where the planner posts every event, and how deliveries are retried.
#[derive(Clone, clap::Args)]
#[group(skip)]
pub struct WebhookSettings {
    /// Where every event (prechecks finished, plans created, paused, ended,
    /// gate trips) is posted, signed by the Standard Webhooks scheme:
    /// https://, or http:// to a loopback address; needs
    /// --webhook-secret-file. A plan may name one of its own as well
    /// (`plan create --webhook-url`). Give every replica the same.
    #[arg(long = "webhook-url", env = "REDRIVE_WEBHOOK_URL", value_name = "URL")]
    pub url: Option<String>,

    /// A file holding the secret --webhook-url's events are signed with:
    /// `whsec_` and the base64 of 24 to 64 random bytes; read at start,
    /// surrounding whitespace dropped.
    #[arg(
        long = "webhook-secret-file",
        env = "REDRIVE_WEBHOOK_SECRET_FILE",
        value_name = "FILE"
    )]
    pub secret_file: Option<PathBuf>,

    /// The secret read from --webhook-secret-file (never a flag: a secret
    /// on the command line shows in `ps`).
    #[arg(skip)]
    pub secret: Option<String>,

    /// Attempts of one delivery before it is kept as `failed` (logged at
    /// WARN, counted in redrive.planner.webhooks.deliveries), 1 to 100.
    #[arg(long = "webhook-attempts", env = "REDRIVE_WEBHOOK_ATTEMPTS", default_value_t = DEFAULT_ATTEMPTS)]
    pub attempts: u32,

    /// Delay before the first retry; each next one doubles, up to 1 h, with
    /// jitter (up to twice as long). From 100ms to 1h.
    #[arg(long = "webhook-retry-min", env = "REDRIVE_WEBHOOK_RETRY_MIN", value_name = "DURATION",
          default_value = "5s", value_parser = parse_duration)]
    pub retry_min: Duration,
}

impl std::fmt::Debug for WebhookSettings {
    /// The settings without the secret's text (`Config` is `Debug`).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookSettings")
            .field("url", &self.url)
            .field("secret_file", &self.secret_file)
            .field("secret", &self.secret.as_ref().map(|_| "***"))
            .field("attempts", &self.attempts)
            .field("retry_min", &self.retry_min)
            .finish()
    }
}

impl Default for WebhookSettings {
    fn default() -> Self {
        Self {
            url: None,
            secret_file: None,
            secret: None,
            attempts: DEFAULT_ATTEMPTS,
            retry_min: DEFAULT_RETRY_MIN,
        }
    }
}

impl WebhookSettings {
    /// Reads `--webhook-secret-file` into `secret`.
    pub fn read_secret_file(&mut self, problems: &mut Vec<SettingError>) {
        let file = self.secret_file.clone();
        read_secret_into(
            "webhook-secret-file",
            file.as_deref(),
            &mut self.secret,
            problems,
        );
    }

    /// These settings as the deliverer takes them; problems (naming the
    /// flag, never quoting the secret) go to `problems`.
    pub fn parse(&self, problems: &mut Vec<SettingError>) -> Delivery {
        let mut problem = |setting, text: String| problems.push(SettingError::new(setting, text));
        if !(1..=MAX_WEBHOOK_ATTEMPTS).contains(&self.attempts) {
            problem(
                "webhook-attempts",
                format!("{} must be from 1 to {MAX_WEBHOOK_ATTEMPTS}", self.attempts),
            );
        }
        if !(Duration::from_millis(100)..=RETRY_MAX).contains(&self.retry_min) {
            problem(
                "webhook-retry-min",
                format!("{:?} must be from 100ms to 1h", self.retry_min),
            );
        }
        let target = match (&self.url, &self.secret) {
            (None, None) => None,
            (Some(_), None) => {
                problem(
                    "webhook-secret-file",
                    "required with --webhook-url: the file of the secret its events are signed with"
                        .into(),
                );
                None
            }
            (None, Some(_)) => {
                problem(
                    "webhook-url",
                    "required with --webhook-secret-file: where the events are posted".into(),
                );
                None
            }
            (Some(url), Some(secret)) => {
                let url = check_url(url).map_err(|text| problem("webhook-url", text));
                let secret = Secret::parse(secret).map_err(|text| {
                    problem(
                        "webhook-secret-file",
                        format!("the file's secret is wrong: {text}"),
                    );
                });
                match (url, secret) {
                    (Ok(url), Ok(secret)) => Some(Target { url, secret }),
                    _ => None,
                }
            }
        };
        Delivery {
            target,
            attempts: self.attempts,
            retry_min: self.retry_min,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_webhook_settings_are_named_and_the_secret_never_shown() {
        let mut settings = WebhookSettings {
            url: Some("http://hooks.example.com/x".into()),
            secret: Some("hunter2-not-whsec".into()),
            attempts: 0,
            ..WebhookSettings::default()
        };
        let mut problems = Vec::new();
        let delivery = settings.parse(&mut problems);
        assert!(delivery.target.is_none());
        let text: Vec<String> = problems.iter().map(ToString::to_string).collect();
        assert_eq!(text.len(), 3, "{text:?}");
        assert!(
            text.iter().all(|line| !line.contains("hunter2")),
            "{text:?}"
        );
        assert!(text[0].contains("webhook-attempts"), "{text:?}");
        assert!(text[1].contains("webhook-url"), "{text:?}");
        assert!(text[2].contains("webhook-secret-file"), "{text:?}");
        settings.url = Some("https://hooks.example.com/x".into());
        settings.secret = Some("whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD".into());
        settings.attempts = 3;
        let mut problems = Vec::new();
        assert!(settings.parse(&mut problems).target.is_some());
        assert!(problems.is_empty());
        assert!(
            !format!("{settings:?}").contains("C2FV"),
            "Debug hides the secret"
        );
    }
}
