//! Who is calling: the authentication layer in front of every service. It
//! turns a request's credentials into a [`Principal`] (put into the request's
//! extensions, where handlers read it with [`Principal::of`]), checks the
//! principal's roles against the RPC ([`crate::edge::roles`]), and settles the
//! [`Actor`] recorded for the call (the principal, or a user it names with
//! the `delegate` permission).
//!
//! Credentials, in this order:
//! - `authorization: Bearer TOKEN` metadata: a JWT (RFC 7519, a token with
//!   two dots) verified against `--jwt-public-key` PEM files or a
//!   `--jwt-jwks` file (RFC 7517) when either is configured, with issuer,
//!   audience and expiry checked; else a static token looked up by its
//!   SHA-256 in `--token-file`;
//! - a client certificate verified by TLS against `--tls-client-ca`: the
//!   principal is its subject's common name, else its first DNS subject
//!   alternative name, with the roles `--cert-role` gives that name.
//!
//! Authentication is on when any of `--token-file`, `--jwt-public-key`,
//! `--jwt-jwks` or `--tls-client-ca` is set. Off (local development), every
//! call goes through and `x-redrive-actor` names the actor as before.
//!
//! - `actor.rs`: [`Actor`], the one a call is recorded under, and
//!   [`Authenticator::actor`] (delegation).
//! - `tokens.rs`: the static token file, [`hash_token`].
//! - `jwt.rs`: bearer JWTs verified against public keys ([`JwtSettings`]).
//! - `certificates.rs`: client certificates' names and their roles
//!   ([`CertRole`]).
//! - `layer.rs`: [`AuthLayer`], the tower layer every request passes.
//! - here: the [`Authenticator`] built from [`AuthSettings`], trying the
//!   credentials in order and admitting a call.

mod actor;
mod certificates;
mod jwt;
mod layer;
mod tokens;

use std::{
    collections::{BTreeSet, HashMap},
    sync::Arc,
};

use redrive_proto::settings::SettingError;
use tonic::{Status, codegen::http};
use tracing::warn;

pub use self::{
    actor::{Actor, DELEGATION_SEPARATOR, MAX_USER_BYTES, recorded_user},
    certificates::CertRole,
    jwt::JwtSettings,
    layer::{AuthLayer, AuthService},
    tokens::hash_token,
};
use self::{certificates::client_certificate_name, jwt::JwtVerifier, tokens::load_tokens};
use crate::edge::roles::{self, DELEGATE, Principal, Role, Source};

/// Request metadata naming the person or system a call is made for.
pub use redrive_proto::headers::ACTOR_METADATA;

/// Roles and the delegate permission, as settings give them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Grant {
    roles: BTreeSet<Role>,
    can_delegate: bool,
}

impl Grant {
    /// Parses role names and `delegate`.
    fn parse<'a>(names: impl IntoIterator<Item = &'a str>) -> Result<Self, String> {
        let mut grant = Grant::default();
        for name in names {
            let name = name.trim();
            if name == DELEGATE {
                grant.can_delegate = true;
            } else {
                grant.roles.insert(name.parse()?);
            }
        }
        Ok(grant)
    }

    /// Roles from a JWT's claim: names that are no Redrive role (an
    /// identity provider's other groups) are left out.
    fn lenient<'a>(names: impl IntoIterator<Item = &'a str>) -> Self {
        let mut grant = Grant::default();
        for name in names {
            if name == DELEGATE {
                grant.can_delegate = true;
            } else if let Ok(role) = name.parse() {
                grant.roles.insert(role);
            }
        }
        grant
    }

    fn principal(self, name: String, source: Source) -> Principal {
        Principal {
            name,
            roles: self.roles,
            can_delegate: self.can_delegate,
            source,
        }
    }
}

/// What the planner authenticates with, read from the settings at start.
#[derive(Debug, Clone)]
pub struct AuthSettings {
    /// `--token-file`.
    pub token_file: Option<std::path::PathBuf>,
    /// `--jwt-*`.
    pub jwt: JwtSettings,
    /// `--tls-client-ca` is set: client certificates identify callers.
    pub client_certificates: bool,
    /// `--cert-role` rules.
    pub cert_roles: Vec<String>,
    /// `--authenticate-health-and-reflection`.
    pub protect_open_services: bool,
}

impl AuthSettings {
    /// Whether any credential source is configured (authentication is on).
    pub fn enabled(&self) -> bool {
        self.token_file.is_some()
            || !self.jwt.public_keys.is_empty()
            || self.jwt.jwks.is_some()
            || self.client_certificates
    }
}

/// Checks credentials and roles; built once at start.
#[derive(Debug, Clone)]
pub struct Authenticator {
    tokens: HashMap<String, Principal>,
    jwt: Option<JwtVerifier>,
    cert_roles: Vec<CertRole>,
    client_certificates: bool,
    protect_open_services: bool,
    /// Refusals are logged at most every 10 s with their count, so that a
    /// flood of bad credentials cannot flood the log.
    refused: Arc<crate::edge::admission::Throttled>,
}

impl Authenticator {
    /// The authenticator `settings` describe; `Ok(None)` when authentication
    /// is off (no credential source configured).
    ///
    /// # Errors
    /// Every problem: unreadable or malformed files, unknown roles.
    pub fn load(settings: &AuthSettings) -> Result<Option<Self>, Vec<SettingError>> {
        let mut problems = Vec::new();
        let mut cert_roles = Vec::new();
        for spec in &settings.cert_roles {
            match spec.parse::<CertRole>() {
                Ok(rule) => cert_roles.push(rule),
                Err(text) => problems.push(SettingError::new("cert-role", text)),
            }
        }
        if !settings.enabled() {
            if !cert_roles.is_empty() {
                problems.push(SettingError::new(
                    "cert-role",
                    "needs --tls-client-ca (no client certificate is asked for without it)",
                ));
            }
            return if problems.is_empty() {
                Ok(None)
            } else {
                Err(problems)
            };
        }
        let tokens = match &settings.token_file {
            None => HashMap::new(),
            Some(path) => match load_tokens(path) {
                Ok(tokens) => tokens,
                Err(text) => {
                    problems.push(SettingError::new("token-file", text));
                    HashMap::new()
                }
            },
        };
        let jwt = if settings.jwt.public_keys.is_empty() && settings.jwt.jwks.is_none() {
            None
        } else {
            match JwtVerifier::load(&settings.jwt) {
                Ok(verifier) => Some(verifier),
                Err(more) => {
                    problems.extend(more);
                    None
                }
            }
        };
        if !problems.is_empty() {
            return Err(problems);
        }
        Ok(Some(Self {
            tokens,
            jwt,
            cert_roles,
            client_certificates: settings.client_certificates,
            protect_open_services: settings.protect_open_services,
            refused: Arc::default(),
        }))
    }

    /// Whether callers may also come without a client certificate (tokens or
    /// JWTs are configured next to `--tls-client-ca`): then TLS asks for a
    /// certificate but does not require one.
    pub fn accepts_bearer_tokens(&self) -> bool {
        !self.tokens.is_empty() || self.jwt.is_some()
    }

    /// The principal of a request: its bearer token, else its client
    /// certificate.
    ///
    /// # Errors
    /// `UNAUTHENTICATED` for a missing, malformed, unknown or invalid
    /// credential (the message says which, never the token).
    pub fn authenticate(
        &self,
        headers: &http::HeaderMap,
        extensions: &http::Extensions,
    ) -> Result<Principal, Status> {
        if let Some(value) = headers.get(http::header::AUTHORIZATION) {
            let token = value
                .to_str()
                .ok()
                .and_then(|text| {
                    text.strip_prefix("Bearer ")
                        .or_else(|| text.strip_prefix("bearer "))
                })
                .map(str::trim)
                .filter(|token| !token.is_empty())
                .ok_or_else(|| {
                    Status::unauthenticated("the authorization metadata is not `Bearer TOKEN`")
                })?;
            return self.bearer(token);
        }
        if self.client_certificates
            && let Some(name) = client_certificate_name(extensions)?
        {
            let grant = self
                .cert_roles
                .iter()
                .find(|rule| rule.matches(&name))
                .map(|rule| rule.grant.clone())
                .unwrap_or_default();
            return Ok(grant.principal(name, Source::ClientCertificate));
        }
        Err(Status::unauthenticated(
            "no credentials: present a client certificate or `authorization: Bearer TOKEN` metadata",
        ))
    }

    fn bearer(&self, token: &str) -> Result<Principal, Status> {
        if let Some(jwt) = &self.jwt
            && token.matches('.').count() == 2
        {
            return jwt.verify(token).map_err(|reason| {
                Status::unauthenticated(format!("invalid bearer JWT: {reason}"))
            });
        }
        self.tokens
            .get(&hash_token(token))
            .cloned()
            .ok_or_else(|| Status::unauthenticated("unknown bearer token"))
    }
    /// Authenticates and authorizes a request to `path`, putting its
    /// [`Principal`] and [`Actor`] into `extensions`. Health and reflection
    /// pass without credentials unless protected.
    ///
    /// # Errors
    /// `UNAUTHENTICATED` or `PERMISSION_DENIED` (logged with the principal).
    pub fn admit(
        &self,
        path: &str,
        headers: &http::HeaderMap,
        extensions: &mut http::Extensions,
    ) -> Result<(), Status> {
        if roles::is_open(path) && !self.protect_open_services {
            return Ok(());
        }
        let principal = self
            .authenticate(headers, extensions)
            .inspect_err(|status| {
                if let Some(refused) = self.refused.count() {
                    warn!(
                        rpc = path,
                        reason = status.message(),
                        refused,
                        "unauthenticated calls refused (the first shown; counted since the last line)"
                    );
                }
            })?;
        let denied = |principal: &Principal, status: &Status| {
            if let Some(refused) = self.refused.count() {
                warn!(principal = %principal.name, rpc = path, reason = status.message(), refused, "permission denied (the first shown; calls refused since the last line)");
            }
        };
        if !(roles::is_open(path)) {
            roles::authorize(&principal, path).inspect_err(|status| denied(&principal, status))?;
        }
        // A header that is not visible ASCII is refused, not ignored: a
        // portal's user must not silently become the portal.
        let header = headers
            .get(ACTOR_METADATA)
            .map(|value| {
                value.to_str().map_err(|_| {
                    Status::invalid_argument(format!(
                        "{ACTOR_METADATA} must be visible ASCII text (gRPC ASCII metadata); \
                         name the user by an ASCII id"
                    ))
                })
            })
            .transpose()
            .inspect_err(|status| denied(&principal, status))?;
        let actor =
            Self::actor(&principal, header).inspect_err(|status| denied(&principal, status))?;
        extensions.insert(actor);
        extensions.insert(principal);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn token_settings(path: &Path, protect_open_services: bool) -> AuthSettings {
        AuthSettings {
            token_file: Some(path.to_owned()),
            jwt: JwtSettings {
                public_keys: Vec::new(),
                jwks: None,
                issuer: None,
                audience: None,
                roles_claim: "roles".to_owned(),
                name_claim: "sub".to_owned(),
            },
            client_certificates: false,
            cert_roles: Vec::new(),
            protect_open_services,
        }
    }

    /// Health and reflection answer anyone unless protected; everything
    /// else needs credentials and a role; an admitted call carries its
    /// principal and actor.
    #[test]
    fn admission_puts_the_principal_and_actor_into_the_request() {
        let dir = std::env::temp_dir().join(format!("redrive-admit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("tokens.toml");
        std::fs::write(
            &path,
            format!(
                "[[token]]\nname = \"portal\"\nsha256 = \"{}\"\nroles = [\"viewer\", \"delegate\"]\n",
                hash_token("t")
            ),
        )
        .unwrap();
        let open = Authenticator::load(&token_settings(&path, false))
            .unwrap()
            .unwrap();
        let protected = Authenticator::load(&token_settings(&path, true))
            .unwrap()
            .unwrap();
        let health = "/grpc.health.v1.Health/Check";
        let mut extensions = http::Extensions::new();
        open.admit(health, &http::HeaderMap::new(), &mut extensions)
            .unwrap();
        assert!(extensions.get::<Principal>().is_none());
        let refused = protected
            .admit(
                health,
                &http::HeaderMap::new(),
                &mut http::Extensions::new(),
            )
            .unwrap_err();
        assert_eq!(refused.code(), tonic::Code::Unauthenticated);
        let mut headers = http::HeaderMap::new();
        headers.insert("authorization", "Bearer t".parse().unwrap());
        protected
            .admit(health, &headers, &mut http::Extensions::new())
            .unwrap();
        headers.insert(ACTOR_METADATA, "alice".parse().unwrap());
        let mut extensions = http::Extensions::new();
        open.admit("/redrive.v1.Planner/GetPlan", &headers, &mut extensions)
            .unwrap();
        assert_eq!(extensions.get::<Principal>().unwrap().name, "portal");
        assert_eq!(
            extensions.get::<Actor>().unwrap().to_string(),
            "portal for alice"
        );
        // A user name that is not ASCII (Cyrillic а) is refused, never
        // dropped: the portal's user must not silently become the portal.
        let mut cyrillic = headers.clone();
        cyrillic.insert(
            ACTOR_METADATA,
            http::HeaderValue::from_bytes("аlice".as_bytes()).unwrap(),
        );
        let refused = open
            .admit(
                "/redrive.v1.Planner/GetPlan",
                &cyrillic,
                &mut http::Extensions::new(),
            )
            .unwrap_err();
        assert_eq!(refused.code(), tonic::Code::InvalidArgument);
        assert!(refused.message().contains(ACTOR_METADATA), "{refused:?}");
        let refused = open
            .admit(
                "/redrive.v1.Planner/CancelPlan",
                &headers,
                &mut http::Extensions::new(),
            )
            .unwrap_err();
        assert_eq!(refused.code(), tonic::Code::PermissionDenied);
        assert!(refused.message().contains("operator"), "{refused:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn static_tokens_are_found_by_hash() {
        let dir = std::env::temp_dir().join(format!("redrive-tokens-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("tokens.toml");
        std::fs::write(
            &path,
            format!(
                "[[token]]\nname = \"alice\"\nsha256 = \"{}\"\nroles = [\"viewer\", \"operator\"]\n",
                hash_token("s3cret")
            ),
        )
        .unwrap();
        let settings = token_settings(&path, false);
        let authenticator = Authenticator::load(&settings).unwrap().unwrap();
        let mut headers = http::HeaderMap::new();
        headers.insert("authorization", "Bearer s3cret".parse().unwrap());
        let found = authenticator
            .authenticate(&headers, &http::Extensions::new())
            .unwrap();
        assert_eq!(found.name, "alice");
        assert!(found.has(Role::Operator) && !found.has(Role::Approver));
        headers.insert("authorization", "Bearer wrong".parse().unwrap());
        let refused = authenticator
            .authenticate(&headers, &http::Extensions::new())
            .unwrap_err();
        assert_eq!(refused.code(), tonic::Code::Unauthenticated);
        assert!(!refused.message().contains("wrong"));
        let refused = authenticator
            .authenticate(&http::HeaderMap::new(), &http::Extensions::new())
            .unwrap_err();
        assert_eq!(refused.code(), tonic::Code::Unauthenticated);
        std::fs::write(
            &path,
            "[[token]]\nname = \"a\"\nsha256 = \"xyz\"\nroles = []\n",
        )
        .unwrap();
        let problems = Authenticator::load(&settings).unwrap_err();
        assert!(problems[0].to_string().contains("64 hex"), "{problems:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
