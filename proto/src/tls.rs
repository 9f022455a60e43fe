//! The client side of TLS to the planner (and to state-check hooks): one way
//! for `redrivectl`, the executor and the planner's hook client to turn an
//! `https://` URL, a CA bundle and an optional client certificate into a
//! tonic endpoint.
//!
//! An `https://` URL without a CA bundle trusts the platform's roots
//! (`rustls-native-certs`); with `--ca` it trusts exactly that bundle. A
//! client certificate (PEM chain and its PEM private key) is presented when
//! both files are given: the planner maps its subject to a principal
//! (docs/security.md).

use std::path::{Path, PathBuf};

use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

/// The TLS files a client may be given; all optional.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientTlsFiles {
    /// PEM bundle of the CAs the server's certificate must chain to
    /// (default: the platform's roots).
    pub ca: Option<PathBuf>,
    /// PEM certificate chain presented to the server (mutual TLS).
    pub client_cert: Option<PathBuf>,
    /// PEM private key of `client_cert` (PKCS#8, PKCS#1 or SEC1).
    pub client_key: Option<PathBuf>,
}

/// The flags a client's TLS files are given with, as its errors name them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TlsFlags {
    /// The CA bundle's flag.
    pub ca: &'static str,
    /// The client certificate's flag.
    pub client_cert: &'static str,
    /// The client key's flag.
    pub client_key: &'static str,
}

impl TlsFlags {
    /// A client of the planner (`redrivectl`, `redrive-executor`).
    pub const PLANNER: Self = Self {
        ca: "--ca",
        client_cert: "--tls-client-cert",
        client_key: "--tls-client-key",
    };
}

/// A TLS file setting that is wrong: the flag it was given with (without
/// its dashes, as settings are named) and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFileError {
    /// The flag, e.g. `tls-client-key`.
    pub setting: &'static str,
    /// What is wrong, to be said under the flag (`invalid setting
    /// --tls-client-key: PATH: …`): without the flag.
    pub problem: String,
    /// What is wrong as one sentence, with the flag and the path.
    pub text: String,
}

impl std::fmt::Display for TlsFileError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

impl TlsFileError {
    /// `text` starts with `flag` and a space; the problem is the rest.
    fn new(flag: &'static str, text: String) -> Self {
        let problem = text
            .strip_prefix(flag)
            .and_then(|rest| rest.strip_prefix(' '))
            .unwrap_or(&text)
            .to_owned();
        Self {
            setting: flag.trim_start_matches('-'),
            problem,
            text,
        }
    }
}

impl ClientTlsFiles {
    /// Whether any file is given.
    pub fn any(&self) -> bool {
        self.ca.is_some() || self.client_cert.is_some() || self.client_key.is_some()
    }

    /// Checks that the files go together with `url`: a client certificate
    /// needs its key and the other way round, and TLS files need an
    /// `https://` URL (they would be ignored otherwise).
    ///
    /// # Errors
    /// A sentence saying which flag is missing or misplaced.
    pub fn check(&self, url: &str) -> Result<(), String> {
        self.check_named(url, &TlsFlags::PLANNER)
            .map_err(|error| error.text)
    }

    /// [`ClientTlsFiles::check`] with the files given as `flags` say.
    ///
    /// # Errors
    /// The flag missing or misplaced, named.
    pub fn check_named(&self, url: &str, flags: &TlsFlags) -> Result<(), TlsFileError> {
        match (&self.client_cert, &self.client_key) {
            (Some(_), None) => {
                return Err(TlsFileError::new(
                    flags.client_cert,
                    format!("{} needs {}", flags.client_cert, flags.client_key),
                ));
            }
            (None, Some(_)) => {
                return Err(TlsFileError::new(
                    flags.client_key,
                    format!("{} needs {}", flags.client_key, flags.client_cert),
                ));
            }
            _ => {}
        }
        if self.any() && !url.starts_with("https://") {
            let flag = if self.ca.is_some() {
                flags.ca
            } else {
                flags.client_cert
            };
            return Err(TlsFileError {
                setting: flag.trim_start_matches('-'),
                problem: format!(
                    "a TLS file needs an https:// URL, not {url:?} ({}, {} and {} are for TLS)",
                    flags.ca, flags.client_cert, flags.client_key
                ),
                text: format!(
                    "{} and {}/{} need an https:// URL, not {url:?}",
                    flags.ca, flags.client_cert, flags.client_key
                ),
            });
        }
        Ok(())
    }

    /// The TLS configuration for `url`: `None` for `http://`, else the CA
    /// bundle (or the platform's roots) and the client identity.
    ///
    /// # Errors
    /// A file that cannot be read, named.
    pub fn config_for(&self, url: &str) -> Result<Option<ClientTlsConfig>, String> {
        self.config_named(url, &TlsFlags::PLANNER)
            .map_err(|error| error.text)
    }

    /// [`ClientTlsFiles::config_for`] with the files given as `flags` say.
    /// With the `tls-checks` feature, a client key that does not belong to
    /// the client certificate is refused here
    /// ([`key_fits_certificate`]), not at every handshake.
    ///
    /// # Errors
    /// A file that cannot be read, holds nothing of its kind, or a key
    /// that is not the certificate's, with its flag.
    pub fn config_named(
        &self,
        url: &str,
        flags: &TlsFlags,
    ) -> Result<Option<ClientTlsConfig>, TlsFileError> {
        self.check_named(url, flags)?;
        if !url.starts_with("https://") {
            return Ok(None);
        }
        let mut config = ClientTlsConfig::new();
        config = match &self.ca {
            Some(ca) => config.ca_certificate(Certificate::from_pem(
                read_pem(ca, flags.ca, "CERTIFICATE")
                    .map_err(|text| TlsFileError::new(flags.ca, text))?,
            )),
            None => config.with_enabled_roots(),
        };
        if let (Some(cert), Some(key)) = (&self.client_cert, &self.client_key) {
            let cert_pem = read_pem(cert, flags.client_cert, "CERTIFICATE")
                .map_err(|text| TlsFileError::new(flags.client_cert, text))?;
            let key_pem = read_pem(key, flags.client_key, "PRIVATE KEY")
                .map_err(|text| TlsFileError::new(flags.client_key, text))?;
            #[cfg(feature = "tls-checks")]
            key_fits_certificate(&cert_pem, &key_pem).map_err(|problem| match problem {
                PairProblem::Certificate(_) => TlsFileError::new(
                    flags.client_cert,
                    format!("{} {}: {problem}", flags.client_cert, cert.display()),
                ),
                PairProblem::Key(_) | PairProblem::Mismatch => TlsFileError::new(
                    flags.client_key,
                    format!(
                        "{} {}: {problem} ({} {})",
                        flags.client_key,
                        key.display(),
                        flags.client_cert,
                        cert.display()
                    ),
                ),
            })?;
            config = config.identity(Identity::from_pem(cert_pem, key_pem));
        }
        Ok(Some(config))
    }

    /// `endpoint` with TLS set up for `url` (unchanged for `http://`).
    ///
    /// # Errors
    /// As [`ClientTlsFiles::config_for`], or tonic refusing the configuration.
    pub fn apply(&self, url: &str, endpoint: Endpoint) -> Result<Endpoint, String> {
        self.apply_named(url, endpoint, &TlsFlags::PLANNER)
            .map_err(|error| error.text)
    }

    /// [`ClientTlsFiles::apply`] with the files given as `flags` say.
    ///
    /// # Errors
    /// As [`ClientTlsFiles::config_named`]; tonic refusing the
    /// configuration is filed under the CA's flag.
    pub fn apply_named(
        &self,
        url: &str,
        endpoint: Endpoint,
        flags: &TlsFlags,
    ) -> Result<Endpoint, TlsFileError> {
        match self.config_named(url, flags)? {
            None => Ok(endpoint),
            Some(config) => endpoint.tls_config(config).map_err(|error| {
                TlsFileError::new(flags.ca, format!("TLS configuration for {url}: {error}"))
            }),
        }
    }
}

/// The bytes of the PEM file `path`, which must hold a block labelled
/// `label` (`CERTIFICATE`; `PRIVATE KEY`, which takes PKCS#8 `PRIVATE KEY`,
/// PKCS#1 `RSA PRIVATE KEY` and SEC1 `EC PRIVATE KEY`: RFC 7468): a file of
/// something else would otherwise be taken for an empty CA bundle, and every
/// handshake would fail later instead of the setting now.
///
/// # Errors
/// The file cannot be read or holds no such block, with the flag and path.
pub fn read_pem(path: &Path, flag: &str, label: &str) -> Result<Vec<u8>, String> {
    let bytes = read(path, flag)?;
    let text = String::from_utf8_lossy(&bytes);
    // The labels rustls reads (`rustls-pki-types`' PEM sections): an
    // `ENCRYPTED PRIVATE KEY`, an `OPENSSH PRIVATE KEY` or a `TRUSTED
    // CERTIFICATE` is refused here, named, instead of by the handshake.
    let accepted: &[&str] = match label {
        "PRIVATE KEY" => &["PRIVATE KEY", "RSA PRIVATE KEY", "EC PRIVATE KEY"],
        other => &[other],
    };
    let found = text.lines().any(|line| {
        line.trim()
            .strip_prefix("-----BEGIN ")
            .and_then(|rest| rest.strip_suffix("-----"))
            .is_some_and(|block| accepted.contains(&block))
    });
    // An encrypted key (PKCS#8 `ENCRYPTED PRIVATE KEY`, or OpenSSL's
    // legacy `Proc-Type: 4,ENCRYPTED` header, RFC 1421) cannot be read
    // without its passphrase, which no flag takes.
    if label == "PRIVATE KEY"
        && (text.contains("-----BEGIN ENCRYPTED PRIVATE KEY-----")
            || text.contains("Proc-Type: 4,ENCRYPTED"))
    {
        return Err(format!(
            "{flag} {}: the key is encrypted; give it decrypted (e.g. `openssl pkey -in KEY -out PLAIN.key`) and keep that file private",
            path.display()
        ));
    }
    if !found {
        return Err(format!("{flag} {}: no PEM {label} in it", path.display()));
    }
    Ok(bytes)
}

/// The bytes of `path`, or an error naming `flag` and the file.
///
/// # Errors
/// The I/O error, with the flag and path.
pub fn read(path: &Path, flag: &str) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|error| format!("{flag} {}: {error}", path.display()))
}

/// Checks a planner address (`redrivectl --planner`, `redrive-executor
/// --planner`, `REDRIVE_PLANNER`) and answers the URL to dial: an `http://`
/// or `https://` URL, or `HOST:PORT` alone (as grpcurl takes it), which
/// means `http://HOST:PORT`.
///
/// # Errors
/// A message saying what is wrong (no scheme but http(s), no host, not a URL).
pub fn planner_url(text: &str) -> Result<String, String> {
    let text = text.trim();
    let url = if text.contains("://") {
        if !(text.starts_with("http://") || text.starts_with("https://")) {
            return Err(
                "expected HOST:PORT or an http:// or https:// URL, e.g. 127.0.0.1:50051 or \
                 https://planner.internal:443"
                    .to_owned(),
            );
        }
        text.to_owned()
    } else {
        // HOST:PORT: the port is not left to a default.
        if text
            .rsplit_once(':')
            .is_none_or(|(_, port)| port.contains(']'))
        {
            return Err(format!(
                "no port in {text:?}; expected HOST:PORT (e.g. 127.0.0.1:50051) or an http:// or https:// URL"
            ));
        }
        format!("http://{text}")
    };
    let endpoint = tonic::transport::Endpoint::from_shared(url.clone())
        .map_err(|error| format!("not a valid URL: {error}"))?;
    if endpoint.uri().host().is_none_or(str::is_empty) {
        return Err(format!(
            "no host in {text:?}; expected e.g. 127.0.0.1:50051"
        ));
    }
    let authority = endpoint.uri().authority().map_or("", |a| a.as_str());
    if authority.contains('@') {
        return Err(format!(
            "{text:?} holds a user name or password: the planner takes none in its address (credentials have settings of their own: a token, a client certificate)"
        ));
    }
    if let Some((_, port)) = authority.rsplit_once(':')
        && !port.contains(']')
        && !matches!(port.parse::<u16>(), Ok(1..))
    {
        return Err(format!(
            "port {port:?} in {text:?} is not a TCP port (1-65535)"
        ));
    }
    Ok(url)
}

#[cfg(feature = "tls-checks")]
/// What to change when a call to the planner at `url` failed in the
/// transport with `text` because this client and the planner disagree on
/// TLS; `None` when that is not why. `ca_flag` names how this client is
/// given a CA (`--ca FILE`), and `ca_given` whether it was:
///
/// - plain `http://` to a port that speaks TLS: the HTTP/2 client reads the
///   server's TLS records as garbage (`h2 protocol error`, a bare
///   `transport error`, a reset connection: it varies), so the port is
///   asked once for a TLS handshake ([`speaks_tls`], at most
///   [`PROBE_TIMEOUT`]): `the planner at HOST:PORT speaks TLS: use
///   https://HOST:PORT and --ca FILE`;
/// - `https://` to a port that answers in plain text (rustls: a corrupt
///   message of an invalid content type): say so and name `http://`;
/// - a server certificate not signed by a CA this client trusts
///   (`UnknownIssuer`): say so and name the CA flag.
pub async fn mismatch(url: &str, text: &str, ca_flag: &str, ca_given: bool) -> Option<String> {
    if url.starts_with("http://") {
        // With its port: `http://host` is port 80 (the probe's `https://`
        // alone would ask 443).
        let address = host_and_port(url);
        return speaks_tls(&address).await.then(|| {
            format!(
                "the planner at {address} speaks TLS: use https://{address} and {ca_flag} \
                 (the CA that signed its certificate; see docs/security.md) ({text})"
            )
        });
    }
    if !url.starts_with("https://") {
        return None;
    }
    // `https://` to a port that answers in plain text: rustls reads the
    // answer as a record of an unknown type.
    if text.contains("InvalidContentType") || text.contains("corrupt message") {
        // With its port: `https://host` is port 443, `http://host` would be 80.
        let address = host_and_port(url);
        return Some(format!(
            "the planner at {address} does not speak TLS: use http://{address}, or turn TLS \
             on at the planner (see docs/security.md) ({text})"
        ));
    }
    let untrusted = [
        "UnknownIssuer",
        "unknown issuer",
        "invalid peer certificate",
    ]
    .iter()
    .any(|needle| text.contains(needle));
    untrusted.then(|| {
        if ca_given {
            format!(
                "the planner at {url} presented a certificate that the CA file given with \
                 {ca_flag} did not sign: give the CA that signed the planner's certificate \
                 ({text})"
            )
        } else {
            format!(
                "the planner at {url} presented a certificate that is not signed by a CA this \
                 client trusts: pass the CA that signed it with {ca_flag} ({text})"
            )
        }
    })
}

#[cfg(feature = "tls-checks")]
/// How long [`speaks_tls`] waits for a handshake.
pub const PROBE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

#[cfg(feature = "tls-checks")]
/// Whether `address` (`HOST:PORT`) answers a TLS handshake: it completes,
/// or fails over the certificate or with a TLS alert (a server that speaks
/// TLS), rather than over a peer that does not speak TLS at all. At most
/// [`PROBE_TIMEOUT`].
pub async fn speaks_tls(address: &str) -> bool {
    let Ok(endpoint) = Endpoint::from_shared(format!("https://{address}")) else {
        return false;
    };
    let Ok(endpoint) = endpoint
        .connect_timeout(PROBE_TIMEOUT)
        .tls_config(ClientTlsConfig::new().with_enabled_roots())
    else {
        return false;
    };
    match tokio::time::timeout(PROBE_TIMEOUT, endpoint.connect()).await {
        Ok(Ok(_)) => true,
        Ok(Err(error)) => {
            let chain = crate::settings::error_text(&error);
            // rustls' own words: a certificate it refused, or an alert
            // the server sent (never "Connection reset by peer").
            ["certificate", "Certificate", "alert", "AlertReceived"]
                .iter()
                .any(|needle| chain.contains(needle))
        }
        Err(_) => false,
    }
}

/// `HOST:PORT` of `url`, the scheme's port when it names none (80 for
/// `http://`, 443 for `https://`); `url` without its scheme when it does
/// not parse.
pub fn host_and_port(url: &str) -> String {
    let parsed = url.parse::<tonic::codegen::http::Uri>().ok();
    parsed
        .as_ref()
        .and_then(|uri| {
            let default = if uri.scheme_str() == Some("https") {
                443
            } else {
                80
            };
            let port = uri.port_u16().unwrap_or(default);
            uri.host().map(|host| format!("{host}:{port}"))
        })
        .unwrap_or_else(|| {
            url.trim_start_matches("https://")
                .trim_start_matches("http://")
                .trim_end_matches('/')
                .to_owned()
        })
}

/// Why a certificate and a key do not make a usable pair
/// ([`key_fits_certificate`]).
#[cfg(feature = "tls-checks")]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PairProblem {
    /// The certificate (chain) cannot be read or used: the certificate's flag.
    Certificate(String),
    /// The key cannot be read or used: the key's flag.
    Key(String),
    /// The key is not the certificate's: their public keys differ.
    Mismatch,
}

#[cfg(feature = "tls-checks")]
impl std::fmt::Display for PairProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Certificate(why) => write!(f, "the certificate cannot be used: {why}"),
            Self::Key(why) => write!(f, "the key cannot be used: {why}"),
            Self::Mismatch => {
                f.write_str("the key does not belong to the certificate (their public keys differ)")
            }
        }
    }
}

/// Whether the PEM private key `key_pem` belongs to the first certificate of
/// the PEM chain `cert_pem`: their public keys (SubjectPublicKeyInfo) are
/// the same, as rustls checks a server's own pair (`CertifiedKey::keys_match`).
/// A pair that does not match fails every handshake later, with the peer
/// saying only that the signature is bad.
///
/// # Errors
/// [`PairProblem`]: which file cannot be used, or that they do not match.
#[cfg(feature = "tls-checks")]
pub fn key_fits_certificate(cert_pem: &[u8], key_pem: &[u8]) -> Result<(), PairProblem> {
    use tokio_rustls::rustls::{
        self,
        pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject},
    };
    let chain = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| PairProblem::Certificate(error.to_string()))?;
    if chain.is_empty() {
        return Err(PairProblem::Certificate("no certificate in it".to_owned()));
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem)
        .map_err(|error| PairProblem::Key(error.to_string()))?;
    let provider = rustls::crypto::ring::default_provider();
    let signing = provider
        .key_provider
        .load_private_key(key)
        .map_err(|error| PairProblem::Key(error.to_string()))?;
    match rustls::sign::CertifiedKey::new(chain, signing).keys_match() {
        Ok(()) | Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => Ok(()),
        Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch)) => {
            Err(PairProblem::Mismatch)
        }
        Err(error) => Err(PairProblem::Certificate(certificate_problem(
            &error.to_string(),
        ))),
    }
}

/// rustls' words for a certificate it cannot read, told for people: it
/// calls every certificate it checks a "peer certificate", even one's own,
/// and names webpki's errors by their Rust names.
#[cfg(feature = "tls-checks")]
fn certificate_problem(text: &str) -> String {
    let text = text
        .strip_prefix("invalid peer certificate: ")
        .unwrap_or(text);
    if text.contains("UnsupportedCertVersion") {
        "an X.509 v1 certificate; rustls reads v3 only: issue it again with extensions (e.g. \
         `openssl x509 -req ... -extfile EXT` with a subjectAltName)"
            .to_owned()
    } else if text.contains("BadEncoding") {
        "its PEM block does not hold a DER certificate".to_owned()
    } else {
        text.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::planner_url;

    #[test]
    fn a_planner_address_is_a_url_or_host_and_port() {
        assert_eq!(
            planner_url("127.0.0.1:50051").unwrap(),
            "http://127.0.0.1:50051"
        );
        assert_eq!(planner_url(" [::1]:50051 ").unwrap(), "http://[::1]:50051");
        assert_eq!(
            planner_url("https://planner.internal").unwrap(),
            "https://planner.internal"
        );
        for (bad, says) in [
            ("127.0.0.1:99999", "not a TCP port"),
            ("127.0.0.1:0", "not a TCP port"),
            ("127.0.0.1:http", "not a TCP port"),
            ("ftp://planner:21", "expected HOST:PORT"),
            ("", "no port"),
            ("planner.internal", "no port"),
            ("[::1]", "no port"),
            ("http://user:pw@planner:50051", "user name or password"),
            ("http://bad host", "not a valid URL"),
        ] {
            let error = planner_url(bad).unwrap_err();
            assert!(error.contains(says), "{bad:?}: {error}");
        }
    }

    use super::*;

    #[test]
    fn files_must_go_together_and_with_https() {
        let none = ClientTlsFiles::default();
        assert!(none.check("http://x:1").is_ok());
        assert!(none.config_for("http://x:1").unwrap().is_none());
        assert!(none.config_for("https://x:1").unwrap().is_some());
        let ca = ClientTlsFiles {
            ca: Some("/nonexistent/ca.pem".into()),
            ..Default::default()
        };
        assert!(ca.check("http://x:1").unwrap_err().contains("https://"));
        assert!(
            ca.config_for("https://x:1")
                .unwrap_err()
                .contains("--ca /nonexistent/ca.pem")
        );
        let not_pem = ClientTlsFiles {
            ca: Some("/etc/hostname".into()),
            ..Default::default()
        };
        assert!(
            not_pem
                .config_for("https://x:1")
                .unwrap_err()
                .contains("no PEM CERTIFICATE")
        );
        let half = ClientTlsFiles {
            client_cert: Some("c.pem".into()),
            ..Default::default()
        };
        assert!(
            half.check("https://x:1")
                .unwrap_err()
                .contains("--tls-client-key")
        );
    }
}
