//! The small set of gRPC status codes Redrive answers with (docs/api.md, the
//! error codes).
//!
//! Each service maps its domain error to one [`ErrorKind`] in a single
//! `From<DomainError> for tonic::Status`; clients can match on the code.

use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

/// What went wrong, as far as a caller can act on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// A request field is wrong; the message names it. Retrying cannot help.
    InvalidArgument,
    /// An id names nothing.
    NotFound,
    /// The request is well-formed but the state forbids it (wrong plan state,
    /// stale fencing token, wrong digest).
    FailedPrecondition,
    /// The thing to create exists already.
    AlreadyExists,
    /// The caller may not do this (four-eyes approval).
    PermissionDenied,
    /// A dependency (PostgreSQL, RabbitMQ, a hook) is unreachable; retry later.
    Unavailable,
    /// The capability is not built yet; the message names it.
    Unimplemented,
    /// The operation did not finish in the time the call allows; the message
    /// says what to follow instead. It may still finish.
    DeadlineExceeded,
    /// A bound on what callers may take of the service (connections,
    /// streams, memory, a rate) is reached; retry later, the message names
    /// the bound.
    ResourceExhausted,
    /// A bug or an unexpected answer; the message says what.
    Internal,
}

impl ErrorKind {
    /// The gRPC code for this kind.
    pub fn code(self) -> Code {
        match self {
            Self::InvalidArgument => Code::InvalidArgument,
            Self::NotFound => Code::NotFound,
            Self::FailedPrecondition => Code::FailedPrecondition,
            Self::AlreadyExists => Code::AlreadyExists,
            Self::PermissionDenied => Code::PermissionDenied,
            Self::Unavailable => Code::Unavailable,
            Self::Unimplemented => Code::Unimplemented,
            Self::DeadlineExceeded => Code::DeadlineExceeded,
            Self::ResourceExhausted => Code::ResourceExhausted,
            Self::Internal => Code::Internal,
        }
    }

    /// A status of this kind with `message`.
    pub fn status(self, message: impl Into<String>) -> Status {
        Status::new(self.code(), message)
    }
}

/// `InvalidArgument` naming the field: `"{field}: {problem}"`.
pub fn invalid_field(field: &str, problem: impl std::fmt::Display) -> Status {
    ErrorKind::InvalidArgument.status(format!("{field}: {problem}"))
}

/// The domain of Redrive's typed error details (`google.rpc.ErrorInfo`).
pub const ERROR_DOMAIN: &str = "redrive.v1";

/// `google.rpc.ErrorInfo.reason` of a coordinator call refused because its
/// fencing token is not the slice's current, unexpired lease: the lease is
/// lost, and the executor must stop publishing for that slice (docs/design.md,
/// "Stopping"). Metadata: `slice_id`, `fencing_token`.
pub const STALE_FENCING_TOKEN: &str = "STALE_FENCING_TOKEN";

/// `FailedPrecondition` carrying [`STALE_FENCING_TOKEN`] in its details
/// (google.rpc.ErrorInfo, AIP-193), so that a client tells a lost lease from
/// any other refusal without reading the message.
pub fn stale_token_status(message: impl Into<String>, slice_id: i64, token: i64) -> Status {
    let metadata: std::collections::HashMap<String, String> = [
        ("slice_id".to_owned(), slice_id.to_string()),
        ("fencing_token".to_owned(), token.to_string()),
    ]
    .into_iter()
    .collect();
    Status::with_error_details(
        Code::FailedPrecondition,
        message,
        ErrorDetails::with_error_info(STALE_FENCING_TOKEN, ERROR_DOMAIN, metadata),
    )
}

/// Whether `status` says the caller's lease is lost ([`stale_token_status`]).
pub fn is_stale_token(status: &Status) -> bool {
    status.code() == Code::FailedPrecondition
        && status
            .get_error_details()
            .error_info()
            .is_some_and(|info| info.reason == STALE_FENCING_TOKEN && info.domain == ERROR_DOMAIN)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stale_token_is_told_by_its_details_not_its_code() {
        let stale = stale_token_status("slice 7: token 3 is not its lease", 7, 3);
        assert_eq!(stale.code(), Code::FailedPrecondition);
        assert!(is_stale_token(&stale));
        let info = stale.get_error_details().error_info().cloned().unwrap();
        assert_eq!(info.metadata.get("slice_id").map(String::as_str), Some("7"));
        assert!(!is_stale_token(
            &ErrorKind::FailedPrecondition.status("plan is paused")
        ));
    }
}
