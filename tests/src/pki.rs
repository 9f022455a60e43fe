//! Credentials made for one test: a CA, the planner's server certificate
//! (for `127.0.0.1`), client certificates by name, a static token file and a
//! JWT signing key, all in a temporary directory removed on drop.
//! [`Pki::secure`] turns a planner config into a TLS one with every
//! authentication source on.

use std::path::{Path, PathBuf};

use anyhow::Context;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use redrive_planner::{Config, edge::auth::hash_token};
use redrive_proto::tls::ClientTlsFiles;

/// The JWT issuer and audience [`Pki::secure`] configures.
pub const JWT_ISSUER: &str = "https://idp.redrive.test";
/// See [`JWT_ISSUER`].
pub const JWT_AUDIENCE: &str = "redrive-planner";

/// A static token of [`Pki::secure`]'s token file: its secret, principal
/// name and roles.
#[derive(Debug, Clone, Copy)]
pub struct StaticToken {
    /// The bearer token.
    pub token: &'static str,
    /// The principal it authenticates.
    pub name: &'static str,
    /// Its roles (and `delegate`).
    pub roles: &'static [&'static str],
}

/// The tokens [`Pki::secure`] writes: one per role, an operator-approver
/// pair for four-eyes, and a delegating portal.
pub const TOKENS: &[StaticToken] = &[
    StaticToken {
        token: "viewer-secret",
        name: "vera",
        roles: &["viewer"],
    },
    StaticToken {
        token: "alice-secret",
        name: "alice",
        roles: &["viewer", "operator", "approver"],
    },
    StaticToken {
        token: "bob-secret",
        name: "bob",
        roles: &["viewer", "operator", "approver"],
    },
    StaticToken {
        token: "portal-secret",
        name: "portal-x",
        roles: &["viewer", "operator", "approver", "delegate"],
    },
    StaticToken {
        token: "demo-operator-secret",
        name: "demo-operator",
        roles: &["viewer", "operator", "approver"],
    },
    StaticToken {
        token: "admin-secret",
        name: "root-admin",
        roles: &["admin"],
    },
];

/// The bearer token of principal `name` in [`TOKENS`].
///
/// # Panics
/// When `name` is not there.
pub fn token_of(name: &str) -> &'static str {
    TOKENS
        .iter()
        .find(|token| token.name == name)
        .map(|token| token.token)
        .expect("a principal of TOKENS")
}

/// A CA and what it signed, in a directory of the test's own.
#[derive(Debug)]
pub struct Pki {
    dir: tempfile::TempDir,
    ca: Issuer<'static, KeyPair>,
    /// The CA certificate (PEM file).
    pub ca_pem: PathBuf,
    jwt_key: KeyPair,
}

impl Pki {
    /// A new CA with the planner's certificate and a JWT key.
    ///
    /// # Errors
    /// Key generation or writing the files failed.
    pub fn new() -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        let ca_key = KeyPair::generate()?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, "redrive test CA");
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_cert = params.self_signed(&ca_key)?;
        let ca_pem = dir.path().join("ca.pem");
        std::fs::write(&ca_pem, ca_cert.pem())?;
        let pki = Self {
            ca: Issuer::new(params, ca_key),
            ca_pem,
            jwt_key: KeyPair::generate()?,
            dir,
        };
        pki.issue(
            "planner",
            &["127.0.0.1", "localhost"],
            ExtendedKeyUsagePurpose::ServerAuth,
        )?;
        std::fs::write(pki.path("jwt-public.pem"), pki.jwt_key.public_key_pem())?;
        let mut tokens = String::new();
        for token in TOKENS {
            tokens.push_str(&format!(
                "[[token]]\nname = {:?}\nsha256 = {:?}\nroles = {:?}\n\n",
                token.name,
                hash_token(token.token),
                token.roles
            ));
        }
        std::fs::write(pki.path("tokens.toml"), tokens)?;
        Ok(pki)
    }

    /// `name` in the directory.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Writes `NAME.pem` and `NAME.key`: a certificate with common name
    /// `name` and `sans`, signed by the CA for `usage`.
    fn issue(
        &self,
        name: &str,
        sans: &[&str],
        usage: ExtendedKeyUsagePurpose,
    ) -> anyhow::Result<(PathBuf, PathBuf)> {
        let key = KeyPair::generate()?;
        let mut params =
            CertificateParams::new(sans.iter().map(|san| (*san).to_owned()).collect::<Vec<_>>())?;
        params.distinguished_name.push(DnType::CommonName, name);
        params.extended_key_usages = vec![usage];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        let cert = params.signed_by(&key, &self.ca)?;
        let (cert_path, key_path) = (
            self.path(&format!("{name}.pem")),
            self.path(&format!("{name}.key")),
        );
        std::fs::write(&cert_path, cert.pem())?;
        std::fs::write(&key_path, key.serialize_pem())?;
        Ok((cert_path, key_path))
    }

    /// Writes a server certificate named `name` for `127.0.0.1` and
    /// `localhost` and its key (`NAME.pem`, `NAME.key`).
    ///
    /// # Errors
    /// Writing the files failed.
    pub fn server(&self, name: &str) -> anyhow::Result<(PathBuf, PathBuf)> {
        self.issue(
            name,
            &["127.0.0.1", "localhost"],
            ExtendedKeyUsagePurpose::ServerAuth,
        )
    }

    /// A server identity named `name` for `127.0.0.1` and `localhost`,
    /// signed by the CA (a state-check hook's).
    ///
    /// # Errors
    /// Writing or reading the files failed.
    pub fn server_tls(&self, name: &str) -> anyhow::Result<tonic::transport::ServerTlsConfig> {
        let (cert, key) = self.server(name)?;
        Ok(
            tonic::transport::ServerTlsConfig::new().identity(
                tonic::transport::Identity::from_pem(std::fs::read(cert)?, std::fs::read(key)?),
            ),
        )
    }

    /// TLS files for a client presenting a certificate named `name`.
    ///
    /// # Errors
    /// Writing the files failed.
    pub fn client(&self, name: &str) -> anyhow::Result<ClientTlsFiles> {
        let (cert, key) = self.issue(name, &[], ExtendedKeyUsagePurpose::ClientAuth)?;
        Ok(ClientTlsFiles {
            ca: Some(self.ca_pem.clone()),
            client_cert: Some(cert),
            client_key: Some(key),
        })
    }

    /// TLS files for a client without a certificate (it trusts the CA).
    pub fn anonymous(&self) -> ClientTlsFiles {
        ClientTlsFiles {
            ca: Some(self.ca_pem.clone()),
            ..Default::default()
        }
    }

    /// `config` serving TLS with the planner's certificate, client
    /// certificates from this CA (`executor-*` are executors,
    /// `test-admin` is admin), the static [`TOKENS`] and JWTs signed by
    /// [`Pki::jwt`] (issuer [`JWT_ISSUER`], audience [`JWT_AUDIENCE`]).
    pub fn secure(&self, config: &mut Config) {
        config.tls_cert = Some(self.path("planner.pem"));
        config.tls_key = Some(self.path("planner.key"));
        config.tls_client_ca = Some(self.ca_pem.clone());
        config.cert_roles = vec![
            "executor-*=executor".to_owned(),
            "test-admin=admin".to_owned(),
        ];
        config.token_file = Some(self.path("tokens.toml"));
        config.jwt_public_keys = vec![self.path("jwt-public.pem")];
        config.jwt_issuer = Some(JWT_ISSUER.to_owned());
        config.jwt_audience = Some(JWT_AUDIENCE.to_owned());
    }

    /// A JWT (ES256) with `claims`, signed by the key [`Pki::secure`]
    /// trusts.
    ///
    /// # Errors
    /// Signing failed.
    pub fn jwt(&self, claims: &serde_json::Value) -> anyhow::Result<String> {
        let key = jsonwebtoken::EncodingKey::from_ec_pem(self.jwt_key.serialize_pem().as_bytes())
            .context("the JWT key")?;
        Ok(jsonwebtoken::encode(
            &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::ES256),
            claims,
            &key,
        )?)
    }

    /// Writes the bearer token of principal `name` ([`TOKENS`]) to a file
    /// of its own, for `--token-file`.
    ///
    /// # Errors
    /// Writing failed.
    pub fn token_file(&self, name: &str) -> anyhow::Result<PathBuf> {
        let path = self.path(&format!("{name}.token"));
        std::fs::write(&path, format!("{}\n", token_of(name)))?;
        Ok(path)
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}
