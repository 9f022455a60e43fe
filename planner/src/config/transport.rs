//! The transport settings: the server's TLS and who may call, the files
//! read and parsed at start-up so a bad one is a bad setting.

use std::{path::PathBuf, sync::Arc};

use redrive_proto::settings::{SettingError, SettingErrors};

use super::Config;
use crate::edge::auth::Authenticator;

/// The authenticator (`None`: authentication is off) and the server's TLS
/// (`None`: plaintext).
pub(super) type Transport = (
    Option<Arc<Authenticator>>,
    Option<tonic::transport::ServerTlsConfig>,
);

/// The flags of the state-check hooks' TLS files.
pub(crate) const STATE_CHECK_TLS: redrive_proto::tls::TlsFlags = redrive_proto::tls::TlsFlags {
    ca: "--state-check-ca",
    client_cert: "--state-check-client-cert",
    client_key: "--state-check-client-key",
};

impl Config {
    /// The server's TLS configuration (reads the files); `None` without
    /// `--tls-cert`. With `--tls-client-ca`, client certificates are
    /// verified against it, and required unless bearer tokens are accepted
    /// too (`client_certificates_optional`).
    ///
    /// # Errors
    /// Each file that cannot be read or holds no PEM block of its kind
    /// (`CERTIFICATE`, `PRIVATE KEY`), named with its setting.
    fn server_tls(
        &self,
        client_certificates_optional: bool,
    ) -> Result<Option<tonic::transport::ServerTlsConfig>, SettingErrors> {
        use tonic::transport::{Certificate, Identity, ServerTlsConfig};
        let (Some(cert), Some(key)) = (&self.tls_cert, &self.tls_key) else {
            return Ok(None);
        };
        // Each file is read and must hold a PEM block of its kind (RFC
        // 7468), so that a problem names the file: rustls' own error only
        // says the identity as a whole was not usable.
        let mut problems = Vec::new();
        let mut read = |setting: &'static str, path: &PathBuf, label: &str| {
            redrive_proto::tls::read_pem(path, &format!("--{setting}"), label)
                .map_err(|text| {
                    let text = text
                        .strip_prefix(&format!("--{setting} "))
                        .unwrap_or(&text)
                        .to_owned();
                    problems.push(SettingError::new(setting, text));
                })
                .ok()
        };
        let (cert_path, key_path) = (cert, key);
        let cert = read("tls-cert", cert, "CERTIFICATE");
        let key = read("tls-key", key, "PRIVATE KEY");
        let ca = self
            .tls_client_ca
            .as_ref()
            .map(|ca| read("tls-client-ca", ca, "CERTIFICATE"));
        let (Some(cert), Some(key), None | Some(Some(_))) = (cert, key, &ca) else {
            return Err(SettingErrors(problems));
        };
        // A key of another certificate fails every handshake, with the
        // client told only of a bad signature.
        if let Err(problem) = redrive_proto::tls::key_fits_certificate(&cert, &key) {
            let error = match problem {
                redrive_proto::tls::PairProblem::Certificate(_) => {
                    SettingError::new("tls-cert", format!("{}: {problem}", cert_path.display()))
                }
                _ => SettingError::new(
                    "tls-key",
                    format!(
                        "{}: {problem} (--tls-cert {})",
                        key_path.display(),
                        cert_path.display()
                    ),
                ),
            };
            return Err(SettingErrors(vec![error]));
        }
        let mut config = ServerTlsConfig::new().identity(Identity::from_pem(cert, key));
        if let Some(Some(ca)) = ca {
            config = config
                .client_ca_root(Certificate::from_pem(ca))
                .client_auth_optional(client_certificates_optional);
        }
        Ok(Some(config))
    }

    /// The TLS and authentication settings parsed (the files read): the
    /// authenticator (`None`: authentication is off) and the server's TLS
    /// (`None`: plaintext); their problems go to `problems`.
    pub(super) fn parse_transport(&self, problems: &mut Vec<SettingError>) -> Option<Transport> {
        let before = problems.len();
        match (&self.tls_cert, &self.tls_key) {
            (Some(_), None) => problems.push(SettingError::new("tls-cert", "needs --tls-key")),
            (None, Some(_)) => problems.push(SettingError::new("tls-key", "needs --tls-cert")),
            _ => {}
        }
        if self.tls_client_ca.is_some() && self.tls_cert.is_none() {
            problems.push(SettingError::new(
                "tls-client-ca",
                "needs --tls-cert and --tls-key (client certificates come with TLS)",
            ));
        }
        let hook_tls = self.state_check_tls();
        if hook_tls.any()
            && let Err(error) = hook_tls.config_named("https://hook", &STATE_CHECK_TLS)
        {
            // Filed under the flag of the file that is wrong.
            problems.push(SettingError::new(error.setting, error.problem));
        }
        let authenticator = Authenticator::load(&self.auth_settings())
            .map_err(|more| problems.extend(more))
            .ok()
            .flatten()
            .map(Arc::new);
        // Client certificates are optional where bearer tokens are accepted.
        let bearer = authenticator
            .as_ref()
            .is_some_and(|authenticator| authenticator.accepts_bearer_tokens());
        // The files are read and parsed now, so that a missing or malformed
        // certificate or key is a bad setting (exit 64), not a failed start.
        let tls = match self.server_tls(bearer) {
            Err(more) => {
                problems.extend(more.0);
                None
            }
            Ok(Some(tls)) => {
                if let Err(error) = tonic::transport::Server::builder().tls_config(tls.clone()) {
                    problems.push(SettingError::new(
                        "tls-cert",
                        format!(
                            "the certificate, key or client CA is not usable PEM: {}",
                            redrive_proto::settings::error_text(&error)
                        ),
                    ));
                }
                Some(tls)
            }
            Ok(None) => None,
        };
        if self.exposed_without_protection() && !self.insecure {
            problems.push(SettingError::new(
                "listen",
                format!(
                    "{} is not a loopback address: serving it needs TLS (--tls-cert, --tls-key) and \
                     authentication (--tls-client-ca, --token-file or --jwt-public-key/--jwt-jwks), \
                     or --insecure to serve it unprotected anyway",
                    self.listen
                ),
            ));
        }
        (problems.len() == before).then_some((authenticator, tls))
    }
}
