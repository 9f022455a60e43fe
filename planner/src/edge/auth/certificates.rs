//! Client certificates: the name a verified certificate gives its caller
//! ([`client_certificate_name`]) and the roles `--cert-role` rules give that
//! name ([`CertRole`]).

use tonic::{
    Status,
    codegen::http,
    transport::server::{TcpConnectInfo, TlsConnectInfo},
};

use super::Grant;

/// A `--cert-role NAME=ROLE,ROLE` rule: certificates named NAME (or with
/// the prefix before a final `*`) get those roles.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertRole {
    pattern: String,
    pub(super) grant: Grant,
}

impl CertRole {
    pub(super) fn matches(&self, name: &str) -> bool {
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

/// The name in the verified client certificate of the connection: its
/// subject's common name, else its first DNS SAN; `None` without one.
///
/// # Errors
/// `UNAUTHENTICATED` for a certificate that names nobody.
pub(super) fn client_certificate_name(
    extensions: &http::Extensions,
) -> Result<Option<String>, Status> {
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
