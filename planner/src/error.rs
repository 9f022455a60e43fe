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
    /// A bound on what callers may take of the planner is reached (the
    /// message names it and what was done before); retry later.
    #[error("{0}")]
    ResourceExhausted(String),
    /// PostgreSQL failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A defect in the planner: a panic caught where work that commits in
    /// steps records how it ended (see [`caught`]). `INTERNAL`.
    #[error("internal error: {0}")]
    Defect(String),
}

/// Runs `work` and turns a panic inside it into [`Error::Defect`] naming
/// the panic's message, so that the caller can record the end of work it
/// committed in steps (a precheck marked `failed`, not left `running`).
/// Work that commits once needs no such care: a panic drops its open
/// transaction, which rolls back.
///
/// # Errors
/// `work`'s error, or the caught panic.
pub async fn caught<T>(
    work: impl std::future::Future<Output = Result<T, Error>>,
) -> Result<T, Error> {
    use futures::FutureExt;
    std::panic::AssertUnwindSafe(work)
        .catch_unwind()
        .await
        .unwrap_or_else(|panic| {
            let message = panic
                .downcast_ref::<&str>()
                .map(|text| (*text).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic without a message".to_owned());
            tracing::error!(panic = %message, "caught a panic");
            Err(Error::Defect(message))
        })
}

impl From<crate::ids::InvalidId> for Error {
    fn from(error: crate::ids::InvalidId) -> Self {
        Self::InvalidArgument {
            field: error.field,
            problem: error.problem,
        }
    }
}

impl From<crate::ids::InvalidId> for tonic::Status {
    fn from(error: crate::ids::InvalidId) -> Self {
        Error::from(error).into()
    }
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
            Self::Unavailable(_) => ErrorKind::Unavailable,
            Self::PermissionDenied(_) => ErrorKind::PermissionDenied,
            Self::DeadlineExceeded(_) => ErrorKind::DeadlineExceeded,
            Self::ResourceExhausted(_) => ErrorKind::ResourceExhausted,
            Self::Store(store) if store.is_retryable() => ErrorKind::Unavailable,
            Self::Store(_) | Self::Defect(_) => ErrorKind::Internal,
        }
    }
}

impl From<Error> for Status {
    fn from(error: Error) -> Self {
        if let Error::StaleToken(stale) = &error {
            return redrive_proto::error::stale_token_status(
                error.to_string(),
                stale.slice_id.get(),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_panic_becomes_a_defect_with_its_message() {
        let answer: Result<(), Error> = caught(async { panic!("index out of bounds") }).await;
        match answer {
            Err(Error::Defect(message)) => assert_eq!(message, "index out of bounds"),
            other => panic!("{other:?}"),
        }
        assert_eq!(caught(async { Ok(7) }).await.ok(), Some(7));
        let status = Status::from(Error::Defect("x".into()));
        assert_eq!(status.code(), tonic::Code::Internal);
    }
}
