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
        match (&self.client_cert, &self.client_key) {
            (Some(_), None) => {
                return Err("--tls-client-cert needs --tls-client-key".to_owned());
            }
            (None, Some(_)) => {
                return Err("--tls-client-key needs --tls-client-cert".to_owned());
            }
            _ => {}
        }
        if self.any() && !url.starts_with("https://") {
            return Err(format!(
                "--ca and --tls-client-cert/--tls-client-key need an https:// planner URL, not {url:?}"
            ));
        }
        Ok(())
    }

    /// The TLS configuration for `url`: `None` for `http://`, else the CA
    /// bundle (or the platform's roots) and the client identity.
    ///
    /// # Errors
    /// A file that cannot be read, named.
    pub fn config_for(&self, url: &str) -> Result<Option<ClientTlsConfig>, String> {
        self.check(url)?;
        if !url.starts_with("https://") {
            return Ok(None);
        }
        let mut config = ClientTlsConfig::new();
        config = match &self.ca {
            Some(ca) => {
                config.ca_certificate(Certificate::from_pem(read_pem(ca, "--ca", "CERTIFICATE")?))
            }
            None => config.with_enabled_roots(),
        };
        if let (Some(cert), Some(key)) = (&self.client_cert, &self.client_key) {
            config = config.identity(Identity::from_pem(
                read_pem(cert, "--tls-client-cert", "CERTIFICATE")?,
                read_pem(key, "--tls-client-key", "PRIVATE KEY")?,
            ));
        }
        Ok(Some(config))
    }

    /// `endpoint` with TLS set up for `url` (unchanged for `http://`).
    ///
    /// # Errors
    /// As [`ClientTlsFiles::config_for`], or tonic refusing the configuration.
    pub fn apply(&self, url: &str, endpoint: Endpoint) -> Result<Endpoint, String> {
        match self.config_for(url)? {
            None => Ok(endpoint),
            Some(config) => endpoint
                .tls_config(config)
                .map_err(|error| format!("TLS configuration for {url}: {error}")),
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
