//! [`Actor`]: who a call is recorded under, the principal or a user it acts
//! for with the `delegate` permission ([`Authenticator::actor`]).

use std::fmt;

use tonic::Status;

use super::{ACTOR_METADATA, Authenticator};
use crate::edge::roles::Principal;

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

impl Authenticator {
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
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::edge::roles::{Role, Source};

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
}
