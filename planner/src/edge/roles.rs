//! Who may call what: the authenticated caller ([`Principal`]), the one
//! table from RPC to the role it needs
//! ([`RPC_ROLES`]), and the check the authentication layer
//! ([`crate::edge::auth`]) runs on every request once the caller is known.
//!
//! | role | may call |
//! | --- | --- |
//! | any principal | `GetCaller` (who it is, its roles) |
//! | `viewer` | listings, lookups, summaries, sources, prechecks' reports and items, plans and their previews, compensations, the audit and its events, `WatchPlan` |
//! | `operator` | `IngestDeadLetters`, `ArchiveDeadLetters`, `UnarchiveDeadLetters`, `RekeyDeadLetters`, `RunPrecheck`, `CreatePlan`, `PausePlan`, `ResumePlan`, `CancelPlan`, `ReplayDeadLetter`, `RepairDeadLetter` |
//! | `approver` | `ApprovePlan`, `PromotePlan` |
//! | `executor` | the `redrive.v1.Coordinator` service, and nothing else |
//! | `admin` | every `redrive.v1.Planner` RPC (not the `Coordinator`: an admin credential cannot forge executors' reports) |
//!
//! Roles do not imply each other (give an operator `viewer` too), except
//! `admin`. `delegate` is a permission, not a role: its holder may name
//! the user it acts for in `x-redrive-actor` ([`crate::edge::auth`]).

use std::{collections::BTreeSet, fmt, str::FromStr};

use tonic::Status;

/// Where a principal's identity came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// A client certificate verified by TLS.
    ClientCertificate,
    /// A bearer JWT (RFC 7519).
    Jwt,
    /// A bearer token of the static token file.
    StaticToken,
}

/// An authenticated caller, in the request's extensions of every call that
/// passed authentication (`request.extensions().get::<Principal>()`, or
/// [`Principal::of`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// The caller's name: a certificate's common name (or first DNS SAN), a
    /// JWT's name claim (default `sub`), a static token's `name`.
    pub name: String,
    /// The roles it holds ([`crate::edge::roles`]).
    pub roles: BTreeSet<Role>,
    /// Whether it may name the user it acts for in `x-redrive-actor`.
    pub can_delegate: bool,
    /// How it authenticated.
    pub source: Source,
}

impl Principal {
    /// Whether it holds `role`.
    pub fn has(&self, role: Role) -> bool {
        self.roles.contains(&role)
    }

    /// The principal of `request`, `None` when authentication is off.
    pub fn of<T>(request: &tonic::Request<T>) -> Option<&Principal> {
        request.extensions().get::<Principal>()
    }
}

/// A role a principal holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Role {
    /// Reads dead letters, prechecks, plans and the audit.
    Viewer,
    /// Captures, prechecks, creates and steers plans, replays and repairs.
    Operator,
    /// Approves and promotes plans.
    Approver,
    /// Claims slices and reports outcomes (`redrive.v1.Coordinator` only).
    Executor,
    /// Every `redrive.v1.Planner` RPC.
    Admin,
}

impl Role {
    /// Every role, in table order.
    pub const ALL: [Role; 5] = [
        Role::Viewer,
        Role::Operator,
        Role::Approver,
        Role::Executor,
        Role::Admin,
    ];

    /// The role's name in settings, tokens and messages.
    pub fn name(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Operator => "operator",
            Role::Approver => "approver",
            Role::Executor => "executor",
            Role::Admin => "admin",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Role {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Role::ALL
            .into_iter()
            .find(|role| role.name() == text.trim())
            .ok_or_else(|| {
                format!(
                    "{text:?} is not a role (viewer, operator, approver, executor, admin; or the \
                     delegate permission)"
                )
            })
    }
}

/// The permission that lets a principal name the user it acts for.
pub const DELEGATE: &str = "delegate";

/// Services every caller may use without credentials unless the planner is
/// told otherwise (`--authenticate-health-and-reflection`): load balancers
/// probe health, and reflection describes only the public API.
pub const OPEN_SERVICES: [&str; 3] = [
    "/grpc.health.v1.Health/",
    "/grpc.reflection.v1.ServerReflection/",
    "/grpc.reflection.v1alpha.ServerReflection/",
];

/// The `Coordinator` service: executors only.
pub const COORDINATOR: &str = "/redrive.v1.Coordinator/";

/// The role each RPC needs, by its gRPC path (`/package.Service/Method`).
/// Every RPC of `redrive.v1.Planner` and `redrive.v1.Coordinator` is here (a
/// test fails when one is missing); a path not in it is refused to everyone
/// but `admin` (who then gets `UNIMPLEMENTED`).
pub const RPC_ROLES: &[(&str, Role)] = &[
    ("/redrive.v1.Planner/IngestDeadLetters", Role::Operator),
    ("/redrive.v1.Planner/ListDeadLetters", Role::Viewer),
    ("/redrive.v1.Planner/GetDeadLetter", Role::Viewer),
    ("/redrive.v1.Planner/SummarizeDeadLetters", Role::Viewer),
    ("/redrive.v1.Planner/ArchiveDeadLetters", Role::Operator),
    ("/redrive.v1.Planner/UnarchiveDeadLetters", Role::Operator),
    ("/redrive.v1.Planner/RekeyDeadLetters", Role::Operator),
    ("/redrive.v1.Planner/RunPrecheck", Role::Operator),
    ("/redrive.v1.Planner/GetPrecheck", Role::Viewer),
    ("/redrive.v1.Planner/ListPrecheckItems", Role::Viewer),
    ("/redrive.v1.Planner/CreatePlan", Role::Operator),
    ("/redrive.v1.Planner/ApprovePlan", Role::Approver),
    ("/redrive.v1.Planner/GetPlan", Role::Viewer),
    ("/redrive.v1.Planner/ListPlans", Role::Viewer),
    ("/redrive.v1.Planner/PromotePlan", Role::Approver),
    ("/redrive.v1.Planner/PausePlan", Role::Operator),
    ("/redrive.v1.Planner/ResumePlan", Role::Operator),
    ("/redrive.v1.Planner/CancelPlan", Role::Operator),
    ("/redrive.v1.Planner/ListCompensations", Role::Viewer),
    ("/redrive.v1.Planner/WatchPlan", Role::Viewer),
    ("/redrive.v1.Planner/GetAuditReport", Role::Viewer),
    ("/redrive.v1.Planner/ExportAudit", Role::Viewer),
    ("/redrive.v1.Planner/ReplayDeadLetter", Role::Operator),
    ("/redrive.v1.Planner/RepairDeadLetter", Role::Operator),
    ("/redrive.v1.Planner/ListSources", Role::Viewer),
    ("/redrive.v1.Planner/PreviewPlan", Role::Viewer),
    ("/redrive.v1.Planner/ListAuditEvents", Role::Viewer),
    ("/redrive.v1.Planner/GetAuditCheckpoint", Role::Viewer),
    ("/redrive.v1.Planner/ProveAuditInclusion", Role::Viewer),
    ("/redrive.v1.Planner/ProveAuditConsistency", Role::Viewer),
    ("/redrive.v1.Planner/ExportAuditLog", Role::Viewer),
    ("/redrive.v1.Coordinator/ClaimSlice", Role::Executor),
    ("/redrive.v1.Coordinator/Heartbeat", Role::Executor),
    ("/redrive.v1.Coordinator/WatchLease", Role::Executor),
    ("/redrive.v1.Coordinator/ReportOutcomes", Role::Executor),
    ("/redrive.v1.Coordinator/CompleteSlice", Role::Executor),
    ("/redrive.v1.Coordinator/RecheckState", Role::Executor),
    ("/redrive.v1.Coordinator/MarkPublishing", Role::Executor),
];

/// RPCs any authenticated principal may call, whatever its roles: who it is.
pub const ANY_PRINCIPAL: &[&str] = &["/redrive.v1.Planner/GetCaller"];

/// Whether `path` is a health or reflection call.
pub fn is_open(path: &str) -> bool {
    OPEN_SERVICES.iter().any(|prefix| path.starts_with(prefix))
}

/// The role `path` needs, `None` for a path not in [`RPC_ROLES`].
pub fn required_role(path: &str) -> Option<Role> {
    RPC_ROLES
        .iter()
        .find(|(rpc, _)| *rpc == path)
        .map(|(_, role)| *role)
}

/// Whether `principal` may call `path`: it holds the role [`RPC_ROLES`]
/// names, or `admin` for a `Planner` RPC. The `Coordinator` takes the
/// `executor` role only.
///
/// # Errors
/// `PERMISSION_DENIED` naming the principal, the RPC and the missing role.
pub fn authorize(principal: &Principal, path: &str) -> Result<(), Status> {
    let method = path.rsplit('/').next().unwrap_or(path);
    if ANY_PRINCIPAL.contains(&path) {
        return Ok(());
    }
    let Some(role) = required_role(path) else {
        if principal.has(Role::Admin) && !path.starts_with(COORDINATOR) {
            return Ok(());
        }
        return Err(Status::permission_denied(format!(
            "{} may not call {path}: no role grants it",
            principal.name
        )));
    };
    if principal.has(role) || (role != Role::Executor && principal.has(Role::Admin)) {
        return Ok(());
    }
    let missing = if role == Role::Executor {
        "the executor role (the Coordinator serves executors only)".to_owned()
    } else {
        format!("the {role} role (or admin)")
    };
    Err(Status::permission_denied(format!(
        "{} may not call {method}: it needs {missing}",
        principal.name
    )))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use prost::Message;

    use super::*;

    fn principal(roles: &[Role]) -> Principal {
        Principal {
            name: "p".to_owned(),
            roles: roles.iter().copied().collect::<BTreeSet<_>>(),
            can_delegate: false,
            source: Source::StaticToken,
        }
    }

    /// Every RPC the planner serves is in the table, and the table names
    /// nothing else: a new RPC without a role fails here.
    #[test]
    fn every_rpc_has_a_role() {
        let set =
            prost_types::FileDescriptorSet::decode(redrive_proto::FILE_DESCRIPTOR_SET).unwrap();
        let mut served = Vec::new();
        for file in &set.file {
            for service in &file.service {
                let service_name = service.name();
                if service_name != "Planner" && service_name != "Coordinator" {
                    continue;
                }
                for method in &service.method {
                    served.push(format!(
                        "/{}.{service_name}/{}",
                        file.package(),
                        method.name()
                    ));
                }
            }
        }
        assert!(served.len() > 20, "{served:?}");
        for path in &served {
            assert!(
                required_role(path).is_some() || ANY_PRINCIPAL.contains(&path.as_str()),
                "{path} has no role in RPC_ROLES"
            );
        }
        for (path, _) in RPC_ROLES {
            assert!(served.contains(&(*path).to_owned()), "{path} is not served");
        }
    }

    #[test]
    fn roles_grant_their_rpcs_only() {
        let viewer = principal(&[Role::Viewer]);
        assert!(authorize(&viewer, "/redrive.v1.Planner/GetPlan").is_ok());
        let denied = authorize(&viewer, "/redrive.v1.Planner/ApprovePlan").unwrap_err();
        assert_eq!(denied.code(), tonic::Code::PermissionDenied);
        assert!(
            denied.message().contains("approver"),
            "{}",
            denied.message()
        );
        let admin = principal(&[Role::Admin]);
        assert!(authorize(&admin, "/redrive.v1.Planner/ApprovePlan").is_ok());
        assert!(authorize(&admin, "/redrive.v1.Planner/NotYetThere").is_ok());
        let denied = authorize(&admin, "/redrive.v1.Coordinator/ClaimSlice").unwrap_err();
        assert!(
            denied.message().contains("executor"),
            "{}",
            denied.message()
        );
        let executor = principal(&[Role::Executor]);
        assert!(authorize(&executor, "/redrive.v1.Coordinator/ReportOutcomes").is_ok());
        assert!(
            authorize(&executor, "/redrive.v1.Planner/GetCaller").is_ok(),
            "anyone may ask who it is"
        );
        assert!(authorize(&executor, "/redrive.v1.Planner/GetPlan").is_err());
        assert!(authorize(&viewer, "/redrive.v1.Planner/NotYetThere").is_err());
        assert!(is_open("/grpc.health.v1.Health/Check"));
        assert!(!is_open("/redrive.v1.Planner/GetPlan"));
    }

    #[test]
    fn role_names_parse() {
        for role in Role::ALL {
            assert_eq!(role.name().parse::<Role>().unwrap(), role);
        }
        assert!("root".parse::<Role>().is_err());
    }
}
