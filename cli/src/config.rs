//! The config file: defaults and named profiles for the planner URL and the
//! actor, so that `--planner` need not be typed on every line.
//!
//! The file is `$XDG_CONFIG_HOME/redrive/config.toml`, else
//! `~/.config/redrive/config.toml`; it may be absent.
//!
//! ```toml
//! # used when no profile is chosen, and under every profile
//! planner = "127.0.0.1:50051"
//! actor = "alice"
//!
//! [profiles.prod]
//! planner = "https://planner.prod.internal:443"
//! ca = "/etc/redrive/prod-ca.pem"
//! token_file = "/home/alice/.config/redrive/prod.token"
//!
//! [profiles.staging]
//! planner = "planner.staging.internal:50051"
//! actor = "alice-staging"
//! ```
//!
//! `--profile NAME` (env `REDRIVE_PROFILE`) chooses a profile; its keys win
//! over the top-level ones. Flags and their environment variables
//! (`--planner`/`REDRIVE_PLANNER`, `--actor`/`REDRIVE_ACTOR`, `--ca`,
//! `--tls-client-cert`, `--tls-client-key`, `--token-file` and the token in
//! `REDRIVE_TOKEN`) win over the file. The credential keys (`ca`,
//! `tls_client_cert`, `tls_client_key`, `token_file`) are paths; the file
//! holds no secret itself. A profile that the file does not have, a file that is not valid
//! TOML, an unknown key or a bad value is a config error (exit 78) naming the
//! file.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use serde::Deserialize;

use crate::{
    client::{DEFAULT_PLANNER, parse_actor, parse_planner_url, resolve_actor},
    error::CliError,
};

/// What the command line says before the file is read: the global flags
/// (with their environment variables) that the file's keys stand in for.
/// `redrivectl`'s parsed command line gives them (`Cli::flags` in
/// `commands`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Flags {
    /// `--planner`, `--actor`, `--ca`, `--tls-client-cert`,
    /// `--tls-client-key` and `--token-file` (and their `REDRIVE_*`
    /// variables), the planner already parsed into a URL.
    pub keys: Profile,
    /// `--profile` / `REDRIVE_PROFILE`.
    pub profile: Option<String>,
}

impl Flags {
    /// The actor sent on every request: `--actor` / `REDRIVE_ACTOR`, else
    /// `profile_actor` (the config file's), else the `USER` environment
    /// variable, else `anonymous`.
    pub fn actor(&self, profile_actor: Option<&str>) -> String {
        let user = std::env::var("USER").ok();
        let flag = self
            .keys
            .actor
            .as_deref()
            .filter(|actor| !actor.is_empty())
            .or(profile_actor);
        resolve_actor(flag, user.as_deref())
    }
}

/// The bearer token in the `REDRIVE_TOKEN` environment variable, if set
/// and not blank.
pub fn token_from_environment() -> Option<String> {
    std::env::var("REDRIVE_TOKEN")
        .ok()
        .map(|token| token.trim().to_owned())
        .filter(|token| !token.is_empty())
}

/// One profile, or the file's top level.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    /// Planner endpoint: `HOST:PORT` or an `http://`/`https://` URL.
    pub planner: Option<String>,
    /// Who is calling (visible ASCII).
    pub actor: Option<String>,
    /// PEM CA bundle for an `https://` planner.
    pub ca: Option<PathBuf>,
    /// PEM client certificate (mutual TLS).
    pub tls_client_cert: Option<PathBuf>,
    /// PEM private key of `tls_client_cert`.
    pub tls_client_key: Option<PathBuf>,
    /// A file holding the bearer token.
    pub token_file: Option<PathBuf>,
}

/// The config file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    /// Planner endpoint used when neither a flag nor the profile names one.
    pub planner: Option<String>,
    /// Actor used when neither a flag nor the profile names one.
    pub actor: Option<String>,
    /// CA bundle used when neither a flag nor the profile names one.
    pub ca: Option<PathBuf>,
    /// Client certificate used when neither a flag nor the profile names one.
    pub tls_client_cert: Option<PathBuf>,
    /// Its key.
    pub tls_client_key: Option<PathBuf>,
    /// Token file used when neither a flag, `REDRIVE_TOKEN` nor the profile
    /// names one.
    pub token_file: Option<PathBuf>,
    /// Named profiles.
    #[serde(default)]
    pub profiles: BTreeMap<String, Profile>,
}

/// Where the config file is: `$XDG_CONFIG_HOME/redrive/config.toml`, else
/// `$HOME/.config/redrive/config.toml`; `None` when neither is set.
pub fn path(xdg_config_home: Option<&str>, home: Option<&str>) -> Option<PathBuf> {
    let base = xdg_config_home
        .filter(|dir| !dir.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            home.filter(|dir| !dir.is_empty())
                .map(|home| Path::new(home).join(".config"))
        })?;
    Some(base.join("redrive").join("config.toml"))
}

/// What a command runs with, once flags, environment and the file are
/// weighed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// The planner URL to dial.
    pub planner: String,
    /// The actor sent with every request.
    pub actor: String,
    /// Whether the actor was named (`--actor`, `REDRIVE_ACTOR` or the
    /// file) rather than taken from `USER`: with credentials only a named
    /// actor is sent (the planner refuses one that differs from the
    /// authenticated caller unless it may delegate).
    pub actor_given: bool,
    /// What is presented to the planner (TLS files, bearer token).
    pub credentials: crate::client::Credentials,
}

impl Settings {
    /// The settings for `flags`, reading the config file from its
    /// usual place.
    ///
    /// # Errors
    /// [`CliError::Config`] as [`Settings::from_file`].
    pub fn resolve(flags: &Flags) -> Result<Self, CliError> {
        let path = path(
            std::env::var("XDG_CONFIG_HOME").ok().as_deref(),
            std::env::var("HOME").ok().as_deref(),
        );
        Self::from_file(flags, path.as_deref())
    }

    /// The settings for `flags` with the config file at `path` (absent is
    /// fine unless a profile is asked for): flags and environment first,
    /// then the chosen profile, then the file's top level, then the
    /// defaults.
    ///
    /// # Errors
    /// [`CliError::Config`] when the file cannot be read or parsed, has an
    /// unknown key or a bad value, or lacks the profile asked for.
    pub fn from_file(flags: &Flags, path: Option<&Path>) -> Result<Self, CliError> {
        let shown = path.map_or_else(
            || "(no config file)".to_owned(),
            |p| p.display().to_string(),
        );
        let problem = |what: String| CliError::Config(format!("{shown}: {what}"));
        let file = match path.map(std::fs::read_to_string) {
            None => ConfigFile::default(),
            Some(Err(error)) if error.kind() == std::io::ErrorKind::NotFound => {
                ConfigFile::default()
            }
            Some(Err(error)) => return Err(problem(format!("cannot read it: {error}"))),
            Some(Ok(text)) => toml::from_str(&text)
                .map_err(|error| problem(error.to_string().trim_end().to_owned()))?,
        };
        let profile = match flags.profile.as_deref().filter(|name| !name.is_empty()) {
            None => Profile::default(),
            Some(name) => file.profiles.get(name).cloned().ok_or_else(|| {
                let known: Vec<&str> = file.profiles.keys().map(String::as_str).collect();
                problem(format!(
                    "no profile {name:?} (--profile or REDRIVE_PROFILE); profiles: {}",
                    if known.is_empty() {
                        "none".to_owned()
                    } else {
                        known.join(", ")
                    }
                ))
            })?,
        };
        let planner = match &flags.keys.planner {
            Some(url) => url.clone(),
            None => match profile.planner.as_ref().or(file.planner.as_ref()) {
                Some(text) => {
                    parse_planner_url(text).map_err(|error| problem(format!("planner: {error}")))?
                }
                None => DEFAULT_PLANNER.to_owned(),
            },
        };
        let file_actor = match profile.actor.as_ref().or(file.actor.as_ref()) {
            Some(text) => {
                Some(parse_actor(text).map_err(|error| problem(format!("actor: {error}")))?)
            }
            None => None,
        };
        let actor_given = flags
            .keys
            .actor
            .as_deref()
            .is_some_and(|actor| !actor.is_empty())
            || file_actor.as_deref().is_some_and(|actor| !actor.is_empty());
        let pick = |flag: &Option<PathBuf>, profile: &Option<PathBuf>, top: &Option<PathBuf>| {
            flag.clone()
                .or_else(|| profile.clone())
                .or_else(|| top.clone())
        };
        let tls = redrive_proto::tls::ClientTlsFiles {
            ca: pick(&flags.keys.ca, &profile.ca, &file.ca),
            client_cert: pick(
                &flags.keys.tls_client_cert,
                &profile.tls_client_cert,
                &file.tls_client_cert,
            ),
            client_key: pick(
                &flags.keys.tls_client_key,
                &profile.tls_client_key,
                &file.tls_client_key,
            ),
        };
        let token = match (&flags.keys.token_file, token_from_environment()) {
            (Some(path), _) => Some(read_token(path)?),
            (None, Some(token)) => Some(token),
            (None, None) => match profile.token_file.as_ref().or(file.token_file.as_ref()) {
                Some(path) => Some(read_token(path)?),
                None => None,
            },
        };
        Ok(Self {
            planner,
            actor: flags.actor(file_actor.as_deref()),
            actor_given,
            credentials: crate::client::Credentials { tls, token },
        })
    }
}

/// The bearer token in `path`, without surrounding whitespace.
///
/// # Errors
/// [`CliError::Usage`] when it cannot be read or is empty (the path is
/// named, never the content).
fn read_token(path: &Path) -> Result<String, CliError> {
    let text = std::fs::read_to_string(path)
        .map_err(|error| CliError::Usage(format!("token file {}: {error}", path.display())))?;
    let token = text.trim();
    if token.is_empty() {
        return Err(CliError::Usage(format!(
            "token file {} is empty",
            path.display()
        )));
    }
    Ok(token.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_path_honours_xdg_config_home() {
        assert_eq!(
            path(Some("/x"), Some("/home/a")).unwrap(),
            Path::new("/x/redrive/config.toml")
        );
        assert_eq!(
            path(Some(""), Some("/home/a")).unwrap(),
            Path::new("/home/a/.config/redrive/config.toml")
        );
        assert_eq!(path(None, None), None);
    }
}
