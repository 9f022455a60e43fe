//! The small set of gRPC status codes Redrive answers with (STYLE.md, "Errors").
//!
//! Each service maps its domain error to one [`ErrorKind`] in a single
//! `From<DomainError> for tonic::Status`; clients can match on the code.

use tonic::{Code, Status};

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
