//! The static token file (`--token-file`): TOML entries naming each
//! token's SHA-256 ([`hash_token`]), its principal and roles.

use std::{collections::HashMap, path::Path};

use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::Grant;
use crate::edge::roles::{Principal, Source};

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

/// Reads the token file.
pub(super) fn load_tokens(path: &Path) -> Result<HashMap<String, Principal>, String> {
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
