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

use std::{
    collections::{BTreeSet, HashMap},
    fmt,
    path::Path,
    sync::Arc,
    task::{Context, Poll},
};

use futures::future::{Either, Ready, ready};
use jsonwebtoken::{Algorithm, DecodingKey, Validation, jwk::JwkSet};
use redrive_proto::settings::SettingError;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use tonic::{
    Status,
    codegen::http,
    transport::server::{TcpConnectInfo, TlsConnectInfo},
};
use tower::{Layer, Service};
use tracing::warn;

use crate::edge::roles::{self, DELEGATE, Principal, Role, Source};

/// Request metadata naming the person or system a call is made for.
pub use redrive_proto::headers::ACTOR_METADATA;

/// How an [`Actor`] acting for a user is recorded: `portal-x for alice`.
pub const DELEGATION_SEPARATOR: &str = " for ";

/// Longest delegated user name, in bytes.
pub const MAX_USER_BYTES: usize = 255;

/// Who a call is recorded under (plans' `created_by`/`approved_by`,
/// operator actions, prechecks' `actor`, repairs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Actor {
    /// The authenticated principal's name (or, without authentication, the
    /// `x-redrive-actor` header).
    pub principal: String,
    /// The user a delegating principal acts for.
    pub on_behalf_of: Option<String>,
}

impl Actor {
    /// The person four-eyes compares: the user acted for, else the principal.
    pub fn user(&self) -> &str {
        self.on_behalf_of.as_deref().unwrap_or(&self.principal)
    }
}

impl fmt::Display for Actor {
    /// `alice`, or `portal-x for alice` when delegated.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.on_behalf_of {
            Some(user) => write!(f, "{}{DELEGATION_SEPARATOR}{user}", self.principal),
            None => f.write_str(&self.principal),
        }
    }
}

/// The user of a recorded actor string (`portal-x for alice` → `alice`,
/// `alice` → `alice`): what four-eyes compares. Parsing from the right, a
/// principal whose own name contains ` for ` can only be taken for someone
/// else's user, never two people for one; a delegated user name cannot
/// contain it ([`Authenticator::actor`]).
pub fn recorded_user(recorded: &str) -> &str {
    recorded
        .rsplit_once(DELEGATION_SEPARATOR)
        .map_or(recorded, |(_, user)| user)
}

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

/// A `--cert-role NAME=ROLE,ROLE` rule: certificates named NAME (or with
/// the prefix before a final `*`) get those roles.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertRole {
    pattern: String,
    grant: Grant,
}

impl CertRole {
    fn matches(&self, name: &str) -> bool {
        match self.pattern.strip_suffix('*') {
            Some(prefix) => name.starts_with(prefix),
            None => name == self.pattern,
        }
    }
}

impl std::str::FromStr for CertRole {
    type Err = String;

    /// `NAME=ROLE[,ROLE...]`, e.g. `executor-*=executor` or
    /// `portal-x=operator,approver,delegate`.
    fn from_str(spec: &str) -> Result<Self, Self::Err> {
        let (pattern, roles) = spec
            .split_once('=')
            .ok_or_else(|| format!("{spec:?}: expected NAME=ROLE[,ROLE...]"))?;
        let pattern = pattern.trim();
        if pattern.is_empty() || pattern[..pattern.len() - 1].contains('*') {
            return Err(format!(
                "{spec:?}: NAME is a certificate name, or a prefix ending in *"
            ));
        }
        Ok(CertRole {
            pattern: pattern.to_owned(),
            grant: Grant::parse(roles.split(',')).map_err(|error| format!("{spec:?}: {error}"))?,
        })
    }
}

/// One entry of the static token file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenEntry {
    name: String,
    sha256: String,
    roles: Vec<String>,
}

/// The static token file: TOML, one `[[token]]` table a token.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenFile {
    #[serde(default)]
    token: Vec<TokenEntry>,
}

/// The SHA-256 of a static token, lowercase hex: what the token file holds
/// (`printf %s "$TOKEN" | sha256sum` gives the same).
pub fn hash_token(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// How bearer JWTs are verified.
#[derive(Debug, Clone)]
pub struct JwtSettings {
    /// PEM public keys (RSA, EC P-256/P-384 or Ed25519).
    pub public_keys: Vec<std::path::PathBuf>,
    /// A JWKS file (RFC 7517 `{"keys": [...]}`).
    pub jwks: Option<std::path::PathBuf>,
    /// Accepted `iss`.
    pub issuer: Option<String>,
    /// Accepted `aud`.
    pub audience: Option<String>,
    /// The claim holding the roles: an array of strings or one
    /// space-separated string.
    pub roles_claim: String,
    /// The claim naming the principal.
    pub name_claim: String,
}

/// A verification key of a JWT.
#[derive(Clone)]
struct JwtKey {
    key_id: Option<String>,
    key: DecodingKey,
}

/// Verifies bearer JWTs.
#[derive(Clone)]
struct JwtVerifier {
    keys: Vec<JwtKey>,
    issuer: String,
    audience: String,
    roles_claim: String,
    name_claim: String,
}

impl fmt::Debug for JwtVerifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JwtVerifier")
            .field("keys", &self.keys.len())
            .field("issuer", &self.issuer)
            .field("audience", &self.audience)
            .finish_non_exhaustive()
    }
}

/// The asymmetric algorithms accepted (never HMAC: the keys are public).
const JWT_ALGORITHMS: [Algorithm; 9] = [
    Algorithm::RS256,
    Algorithm::RS384,
    Algorithm::RS512,
    Algorithm::PS256,
    Algorithm::PS384,
    Algorithm::PS512,
    Algorithm::ES256,
    Algorithm::ES384,
    Algorithm::EdDSA,
];

impl JwtVerifier {
    fn load(settings: &JwtSettings) -> Result<Self, Vec<SettingError>> {
        let mut problems = Vec::new();
        let mut keys = Vec::new();
        for path in &settings.public_keys {
            match std::fs::read(path) {
                Err(error) => problems.push(SettingError::new(
                    "jwt-public-key",
                    format!("cannot read {}: {error}", path.display()),
                )),
                Ok(pem) => match DecodingKey::from_rsa_pem(&pem)
                    .or_else(|_| DecodingKey::from_ec_pem(&pem))
                    .or_else(|_| DecodingKey::from_ed_pem(&pem))
                {
                    Ok(key) => keys.push(JwtKey { key_id: None, key }),
                    Err(error) => problems.push(SettingError::new(
                        "jwt-public-key",
                        format!(
                            "{}: not a PEM RSA, EC or Ed25519 public key ({error})",
                            path.display()
                        ),
                    )),
                },
            }
        }
        if let Some(path) = &settings.jwks {
            let set = std::fs::read(path)
                .map_err(|error| format!("cannot read {}: {error}", path.display()))
                .and_then(|bytes| {
                    serde_json::from_slice::<JwkSet>(&bytes).map_err(|error| {
                        format!("{}: not a JWKS (RFC 7517): {error}", path.display())
                    })
                });
            match set {
                Err(text) => problems.push(SettingError::new("jwt-jwks", text)),
                Ok(set) => {
                    for jwk in &set.keys {
                        match DecodingKey::from_jwk(jwk) {
                            Ok(key) => keys.push(JwtKey {
                                key_id: jwk.common.key_id.clone(),
                                key,
                            }),
                            Err(error) => problems.push(SettingError::new(
                                "jwt-jwks",
                                format!("{}: key {:?}: {error}", path.display(), jwk.common.key_id),
                            )),
                        }
                    }
                }
            }
        }
        let issuer = settings.issuer.clone().unwrap_or_default();
        let audience = settings.audience.clone().unwrap_or_default();
        if issuer.is_empty() {
            problems.push(SettingError::new(
                "jwt-issuer",
                "required with --jwt-public-key or --jwt-jwks (the iss every token must carry)",
            ));
        }
        if audience.is_empty() {
            problems.push(SettingError::new(
                "jwt-audience",
                "required with --jwt-public-key or --jwt-jwks (the aud every token must carry)",
            ));
        }
        if keys
            .iter()
            .any(|key| key.key.family() == jsonwebtoken::AlgorithmFamily::Hmac)
        {
            problems.push(SettingError::new(
                "jwt-jwks",
                "symmetric (oct) keys are not accepted: only public keys",
            ));
        }
        if !problems.is_empty() {
            return Err(problems);
        }
        Ok(Self {
            keys,
            issuer,
            audience,
            roles_claim: settings.roles_claim.clone(),
            name_claim: settings.name_claim.clone(),
        })
    }

    /// The principal of a valid token.
    fn verify(&self, token: &str) -> Result<Principal, String> {
        let header = jsonwebtoken::decode_header(token).map_err(|error| error.to_string())?;
        if !JWT_ALGORITHMS.contains(&header.alg) {
            return Err(format!("algorithm {:?} is not accepted", header.alg));
        }
        let mut validation = Validation::new(header.alg);
        validation.set_issuer(&[&self.issuer]);
        validation.set_audience(&[&self.audience]);
        validation.set_required_spec_claims(&["exp", "iss", "aud"]);
        // A token not yet valid (`nbf`, RFC 7519 section 4.1.5) is refused too.
        validation.validate_nbf = true;
        let candidates = self.keys.iter().filter(|key| {
            key.key.family() == header.alg.family()
                && (header.kid.is_none() || key.key_id.is_none() || key.key_id == header.kid)
        });
        let mut last = "no configured key fits the token's algorithm and kid".to_owned();
        for candidate in candidates {
            match jsonwebtoken::decode::<serde_json::Value>(token, &candidate.key, &validation) {
                Ok(data) => return self.principal(&data.claims),
                Err(error) => {
                    let expired = matches!(
                        error.kind(),
                        jsonwebtoken::errors::ErrorKind::ExpiredSignature
                            | jsonwebtoken::errors::ErrorKind::InvalidIssuer
                            | jsonwebtoken::errors::ErrorKind::InvalidAudience
                            | jsonwebtoken::errors::ErrorKind::ImmatureSignature
                            | jsonwebtoken::errors::ErrorKind::MissingRequiredClaim(_)
                    );
                    last = error.to_string();
                    // The signature matched this key: another key will not
                    // make the claims valid.
                    if expired {
                        break;
                    }
                }
            }
        }
        Err(last)
    }

    fn principal(&self, claims: &serde_json::Value) -> Result<Principal, String> {
        let name = claims
            .get(&self.name_claim)
            .and_then(serde_json::Value::as_str)
            .map(str::trim)
            .filter(|name| !name.is_empty())
            .ok_or_else(|| format!("no {:?} claim naming the caller", self.name_claim))?;
        let grant = match claims.get(&self.roles_claim) {
            Some(serde_json::Value::Array(values)) => {
                Grant::lenient(values.iter().filter_map(serde_json::Value::as_str))
            }
            Some(serde_json::Value::String(text)) => Grant::lenient(text.split_whitespace()),
            _ => Grant::default(),
        };
        Ok(grant.principal(name.to_owned(), Source::Jwt))
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

    /// The actor of a call by `principal` carrying `header` (the
    /// `x-redrive-actor` value, if any).
    ///
    /// # Errors
    /// `PERMISSION_DENIED` when the header names someone else and the
    /// principal lacks the `delegate` permission; `INVALID_ARGUMENT` for a
    /// delegated name that is empty, too long, or contains ` for `.
    pub fn actor(principal: &Principal, header: Option<&str>) -> Result<Actor, Status> {
        let named = header.map(str::trim).filter(|name| !name.is_empty());
        let Some(user) = named.filter(|name| *name != principal.name) else {
            return Ok(Actor {
                principal: principal.name.clone(),
                on_behalf_of: None,
            });
        };
        if !principal.can_delegate {
            return Err(Status::permission_denied(format!(
                "{} may not act for {user:?} ({ACTOR_METADATA}): it needs the delegate permission",
                principal.name
            )));
        }
        if user.len() > MAX_USER_BYTES || user.contains(DELEGATION_SEPARATOR) {
            return Err(Status::invalid_argument(format!(
                "{ACTOR_METADATA}: a user name is at most {MAX_USER_BYTES} bytes and does not \
                 contain {DELEGATION_SEPARATOR:?}"
            )));
        }
        Ok(Actor {
            principal: principal.name.clone(),
            on_behalf_of: Some(user.to_owned()),
        })
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

/// Reads the token file.
fn load_tokens(path: &Path) -> Result<HashMap<String, Principal>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|error| format!("cannot read {}: {error}", path.display()))?;
    let file: TokenFile = toml::from_str(&text)
        .map_err(|error| format!("{}: {}", path.display(), error.to_string().trim_end()))?;
    let mut tokens = HashMap::new();
    for (index, entry) in file.token.into_iter().enumerate() {
        let at = format!("{}: token {} ({:?})", path.display(), index + 1, entry.name);
        let hash = entry.sha256.trim().to_ascii_lowercase();
        if hash.len() != 64 || !hash.bytes().all(|byte| byte.is_ascii_hexdigit()) {
            return Err(format!(
                "{at}: sha256 must be 64 hex digits (redrivectl hash-token, or sha256sum)"
            ));
        }
        if entry.name.trim().is_empty() {
            return Err(format!("{at}: name is empty"));
        }
        let grant = Grant::parse(entry.roles.iter().map(String::as_str))
            .map_err(|error| format!("{at}: {error}"))?;
        if tokens
            .insert(
                hash,
                grant.principal(entry.name.trim().to_owned(), Source::StaticToken),
            )
            .is_some()
        {
            return Err(format!("{at}: the same token hash is given twice"));
        }
    }
    Ok(tokens)
}

/// The name in the verified client certificate of the connection: its
/// subject's common name, else its first DNS SAN; `None` without one.
///
/// # Errors
/// `UNAUTHENTICATED` for a certificate that names nobody.
fn client_certificate_name(extensions: &http::Extensions) -> Result<Option<String>, Status> {
    let Some(certificates) = extensions
        .get::<TlsConnectInfo<TcpConnectInfo>>()
        .and_then(TlsConnectInfo::peer_certs)
    else {
        return Ok(None);
    };
    let Some(leaf) = certificates.first() else {
        return Ok(None);
    };
    let (_, certificate) = x509_parser::parse_x509_certificate(leaf.as_ref()).map_err(|error| {
        Status::unauthenticated(format!("unreadable client certificate: {error}"))
    })?;
    let common_name = certificate
        .subject()
        .iter_common_name()
        .next()
        .and_then(|name| name.as_str().ok())
        .map(str::trim)
        .filter(|name| !name.is_empty())
        .map(str::to_owned);
    let dns_name = || {
        certificate
            .subject_alternative_name()
            .ok()
            .flatten()
            .and_then(|extension| {
                extension
                    .value
                    .general_names
                    .iter()
                    .find_map(|name| match name {
                        x509_parser::extensions::GeneralName::DNSName(dns) => {
                            Some((*dns).to_owned())
                        }
                        _ => None,
                    })
            })
    };
    common_name
        .or_else(dns_name)
        .map(Some)
        .ok_or_else(|| Status::unauthenticated("the client certificate has no CN and no DNS name"))
}

/// The tower layer: every request passes [`Authenticator::admit`] first.
/// With `None` (authentication off) it lets everything through.
#[derive(Debug, Clone)]
pub struct AuthLayer {
    authenticator: Option<Arc<Authenticator>>,
}

impl AuthLayer {
    /// A layer checking with `authenticator`, or a pass-through.
    pub fn new(authenticator: Option<Arc<Authenticator>>) -> Self {
        Self { authenticator }
    }
}

impl<S> Layer<S> for AuthLayer {
    type Service = AuthService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        AuthService {
            inner,
            authenticator: self.authenticator.clone(),
        }
    }
}

/// [`AuthLayer`]'s service.
#[derive(Debug, Clone)]
pub struct AuthService<S> {
    inner: S,
    authenticator: Option<Arc<Authenticator>>,
}

impl<S, RequestBody, ResponseBody> Service<http::Request<RequestBody>> for AuthService<S>
where
    S: Service<http::Request<RequestBody>, Response = http::Response<ResponseBody>>,
    ResponseBody: Default,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Either<S::Future, Ready<Result<S::Response, S::Error>>>;

    fn poll_ready(&mut self, context: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(context)
    }

    fn call(&mut self, mut request: http::Request<RequestBody>) -> Self::Future {
        if let Some(authenticator) = &self.authenticator {
            let path = request.uri().path().to_owned();
            let (parts, body) = request.into_parts();
            let mut parts = parts;
            if let Err(status) = authenticator.admit(&path, &parts.headers, &mut parts.extensions) {
                return Either::Right(ready(Ok(status.into_http())));
            }
            request = http::Request::from_parts(parts, body);
        }
        Either::Left(self.inner.call(request))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn principal(name: &str, can_delegate: bool) -> Principal {
        Principal {
            name: name.to_owned(),
            roles: BTreeSet::from([Role::Approver]),
            can_delegate,
            source: Source::StaticToken,
        }
    }

    #[test]
    fn the_header_names_a_user_only_with_delegate() {
        let plain = principal("alice", false);
        assert_eq!(
            Authenticator::actor(&plain, None).unwrap().to_string(),
            "alice"
        );
        assert_eq!(
            Authenticator::actor(&plain, Some("alice"))
                .unwrap()
                .to_string(),
            "alice"
        );
        let refused = Authenticator::actor(&plain, Some("bob")).unwrap_err();
        assert_eq!(refused.code(), tonic::Code::PermissionDenied);
        let portal = principal("portal-x", true);
        let actor = Authenticator::actor(&portal, Some("alice")).unwrap();
        assert_eq!(actor.to_string(), "portal-x for alice");
        assert_eq!(actor.user(), "alice");
        assert_eq!(recorded_user("portal-x for alice"), "alice");
        assert_eq!(recorded_user("alice"), "alice");
        assert!(Authenticator::actor(&portal, Some("bob for alice")).is_err());
    }

    /// A JWKS (RFC 7517) with two keys: the token's `kid` picks its key;
    /// roles come from the configured claim; HMAC is refused.
    #[test]
    fn jwts_verify_against_a_jwks() {
        let dir = std::env::temp_dir().join(format!("redrive-jwks-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut keys = Vec::new();
        let mut signing = Vec::new();
        for kid in ["old", "new"] {
            let pair = rcgen::KeyPair::generate().unwrap();
            let encoding =
                jsonwebtoken::EncodingKey::from_ec_pem(pair.serialize_pem().as_bytes()).unwrap();
            let mut jwk =
                jsonwebtoken::jwk::Jwk::from_encoding_key(&encoding, Algorithm::ES256).unwrap();
            jwk.common.key_id = Some(kid.to_owned());
            keys.push(jwk);
            signing.push(encoding);
        }
        let path = dir.join("jwks.json");
        std::fs::write(&path, serde_json::to_vec(&JwkSet { keys }).unwrap()).unwrap();
        let verifier = JwtVerifier::load(&JwtSettings {
            public_keys: Vec::new(),
            jwks: Some(path),
            issuer: Some("idp".to_owned()),
            audience: Some("redrive".to_owned()),
            roles_claim: "groups".to_owned(),
            name_claim: "email".to_owned(),
        })
        .unwrap();
        let claims = serde_json::json!({
            "email": "dave@example.com", "iss": "idp", "aud": "redrive",
            "exp": jsonwebtoken::get_current_timestamp() + 600,
            "groups": "approver delegate sales",
        });
        let mut header = jsonwebtoken::Header::new(Algorithm::ES256);
        header.kid = Some("new".to_owned());
        let token = jsonwebtoken::encode(&header, &claims, &signing[1]).unwrap();
        let principal = verifier.verify(&token).unwrap();
        assert_eq!(principal.name, "dave@example.com");
        assert_eq!(principal.roles, BTreeSet::from([Role::Approver]));
        assert!(principal.can_delegate);
        // Signed by "old" but claiming to be "new": refused.
        let forged = jsonwebtoken::encode(&header, &claims, &signing[0]).unwrap();
        assert!(verifier.verify(&forged).is_err());
        // HS256 with any key: refused before any key is tried.
        let hmac = jsonwebtoken::encode(
            &jsonwebtoken::Header::new(Algorithm::HS256),
            &claims,
            &jsonwebtoken::EncodingKey::from_secret(b"public key bytes").unwrap(),
        )
        .unwrap();
        assert!(verifier.verify(&hmac).unwrap_err().contains("not accepted"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

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
    fn cert_roles_parse_and_match() {
        let rule: CertRole = "executor-*=executor".parse().unwrap();
        assert!(rule.matches("executor-7"));
        assert!(!rule.matches("portal"));
        let rule: CertRole = "portal-x=operator,approver,delegate".parse().unwrap();
        assert!(rule.grant.can_delegate);
        assert_eq!(rule.grant.roles.len(), 2);
        assert!("x=root".parse::<CertRole>().is_err());
        assert!("a*b=viewer".parse::<CertRole>().is_err());
        assert!("viewer".parse::<CertRole>().is_err());
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
