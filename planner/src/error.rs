//! The planner's domain error and its one mapping to `tonic::Status`.

use redrive_proto::error::ErrorKind;
use tonic::Status;

use crate::store::StoreError;

/// What a planner operation can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A request field is wrong.
    #[error("{field}: {problem}")]
    InvalidArgument {
        /// The field path, e.g. `selector.died_to`.
        field: String,
        /// What is wrong with it.
        problem: String,
    },
    /// An id names nothing.
    #[error("{0}")]
    NotFound(String),
    /// The state forbids the request.
    #[error("{0}")]
    FailedPrecondition(String),
    /// A coordinator call's fencing token is not the slice's current lease:
    /// `FailedPrecondition` with [`redrive_proto::error::STALE_FENCING_TOKEN`]
    /// in its details.
    #[error("{0}")]
    StaleToken(crate::store::StaleToken),
    /// The caller may not do this (four-eyes approval).
    #[error("{0}")]
    PermissionDenied(String),
    /// A dependency other than PostgreSQL (a state-check hook) failed.
    #[error("{0}")]
    Unavailable(String),
    /// The operation did not finish within the call's wait; it may still
    /// finish (the message names what to follow).
    #[error("{0}")]
    DeadlineExceeded(String),
    /// A capability later work delivers.
    #[error("{0} is not implemented yet")]
    Unimplemented(&'static str),
    /// PostgreSQL failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl Error {
    /// An `InvalidArgument` naming `field`.
    pub fn invalid(field: impl Into<String>, problem: impl Into<String>) -> Self {
        Self::InvalidArgument {
            field: field.into(),
            problem: problem.into(),
        }
    }

    /// Whether retrying the same call can help.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Store(store) => store.is_retryable(),
            Self::Unavailable(_) => true,
            _ => false,
        }
    }

    fn kind(&self) -> ErrorKind {
        match self {
            Self::InvalidArgument { .. } => ErrorKind::InvalidArgument,
            Self::NotFound(_) => ErrorKind::NotFound,
            Self::FailedPrecondition(_) | Self::StaleToken(_) => ErrorKind::FailedPrecondition,
            Self::Unimplemented(_) => ErrorKind::Unimplemented,
            Self::Unavailable(_) => ErrorKind::Unavailable,
            Self::PermissionDenied(_) => ErrorKind::PermissionDenied,
            Self::DeadlineExceeded(_) => ErrorKind::DeadlineExceeded,
            Self::Store(store) if store.is_retryable() => ErrorKind::Unavailable,
            Self::Store(_) => ErrorKind::Internal,
        }
    }
}

impl From<Error> for Status {
    fn from(error: Error) -> Self {
        if let Error::StaleToken(stale) = &error {
            return redrive_proto::error::stale_token_status(
                error.to_string(),
                stale.slice_id,
                stale.token,
            );
        }
        let kind = error.kind();
        if kind == ErrorKind::Internal {
            tracing::error!(%error, "internal error");
        }
        kind.status(error.to_string())
    }
}
