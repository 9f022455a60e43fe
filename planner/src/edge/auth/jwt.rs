//! Bearer JWTs (RFC 7519): [`JwtVerifier`] checks a token's signature
//! against the configured public keys or JWKS, its issuer, audience and
//! times, and reads the principal and roles from its claims.

use std::fmt;

use jsonwebtoken::{Algorithm, DecodingKey, Validation, jwk::JwkSet};
use redrive_proto::settings::SettingError;

use super::Grant;
use crate::edge::roles::{Principal, Source};

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
pub(super) struct JwtVerifier {
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
    pub(super) fn load(settings: &JwtSettings) -> Result<Self, Vec<SettingError>> {
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
    pub(super) fn verify(&self, token: &str) -> Result<Principal, String> {
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::edge::roles::Role;

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
}
