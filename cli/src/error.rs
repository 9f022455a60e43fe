//! What can go wrong in `redrivectl`, and the exit code of each (sysexits.h).
//!
//! | code | name | when |
//! | --- | --- | --- |
//! | 0 | | success (also `--help`, `--version`); `plan wait`: the plan completed |
//! | 1 | | the planner answered with another gRPC error (`FAILED_PRECONDITION`, `INTERNAL`, ...); `plan wait`: the plan ended `cancelled` or `aborted`, or completed with `failed` or `unroutable` items; `replay`: `NOT_REPLAYED` (the answer is printed first) |
//! | 64 | `EX_USAGE` | bad command line: unknown flag, bad value, unknown `--group-by` name or `--verdict`, bad or repeated `--stale-after`, an actor that cannot be sent as metadata |
//! | 65 | `EX_DATAERR` | the planner refused the request as wrong (`INVALID_ARGUMENT`) or found nothing (`NOT_FOUND`); `import` rejected some lines |
//! | 66 | `EX_NOINPUT` | `import` cannot open its file, `dead-letters repair` cannot read its `--body-file` |
//! | 69 | `EX_UNAVAILABLE` | the planner cannot be reached, or answered `UNAVAILABLE` (also a precheck whose state-check hook is down) |
//! | 74 | `EX_IOERR` | reading the import file or writing the output failed |
//! | 75 | `EX_TEMPFAIL` | `plan wait --timeout` ran out before the plan was final |
//! | 78 | `EX_CONFIG` | the config file cannot be read or parsed, has a bad value, or lacks the `--profile` asked for |
//!
//! Errors go to stderr as one line, `redrivectl: <what>`; a gRPC error reads
//! `redrivectl: <code>: <message>` with the code in snake case (`not_found`).
//! With `--json` (or `REDRIVE_JSON=1`) stderr gets one JSON object instead,
//! [`error_json`]: `{"error": {"code": "not_found", "message": "dead letter 42
//! not found"}}`, `code` being [`CliError::code`] (`usage` for a bad command
//! line); the exit codes stay the same. Diagnostics on the way (an import
//! line refused, a planner outage waited out) are then
//! [`warning_json`] lines, so that stderr is JSON lines throughout.

use tonic::{Code, Status};

/// Success.
pub const EX_OK: u8 = 0;
/// Any other failure, e.g. a gRPC error without a more precise code.
pub const EX_FAILURE: u8 = 1;
/// Bad command line.
pub const EX_USAGE: u8 = 64;
/// Bad input data.
pub const EX_DATAERR: u8 = 65;
/// An input file cannot be opened.
pub const EX_NOINPUT: u8 = 66;
/// The planner is unreachable.
pub const EX_UNAVAILABLE: u8 = 69;
/// Reading input or writing output failed.
pub const EX_IOERR: u8 = 74;
/// Try again later: `plan wait --timeout` ran out.
pub const EX_TEMPFAIL: u8 = 75;
/// The config file is wrong.
pub const EX_CONFIG: u8 = 78;

/// A failure that ends the command.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The planner could not be connected to.
    #[error(
        "cannot reach the planner at {url}: {cause} (is redrive-planner running? set --planner or REDRIVE_PLANNER)"
    )]
    Unreachable {
        /// The planner URL tried.
        url: String,
        /// Why, from the transport error chain.
        cause: String,
    },

    /// The planner's TLS and this client's settings do not match (plain
    /// `http://` to a TLS port, a certificate from a CA not trusted): the
    /// message says what to change.
    #[error("{message}")]
    Tls {
        /// What is wrong and what to do, whole.
        message: String,
    },

    /// The planner answered with an error status.
    #[error("{}: {}", code_name(.0.code()), .0.message())]
    Grpc(Status),

    /// A command line value the parser could not check on its own.
    #[error("{0}")]
    Usage(String),

    /// An input file could not be opened.
    #[error("cannot open {path}: {source}")]
    NoInput {
        /// The path given.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },

    /// Reading input or writing output failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The I/O error.
        source: std::io::Error,
    },

    /// Some input records were refused; the command already reported them.
    #[error("{0}")]
    Rejected(String),

    /// A plan ended without completing (`cancelled`, `aborted`); the command
    /// already printed it.
    #[error("{0}")]
    NotCompleted(String),

    /// A wait ran out of time.
    #[error("{0}")]
    Timeout(String),

    /// The config file cannot be used ([`crate::config`]).
    #[error("config file {0}")]
    Config(String),
}

impl CliError {
    /// The process exit code (module docs).
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Unreachable { .. } | Self::Tls { .. } => EX_UNAVAILABLE,
            Self::Grpc(status) => match status.code() {
                Code::InvalidArgument | Code::NotFound => EX_DATAERR,
                Code::Unavailable => EX_UNAVAILABLE,
                _ => EX_FAILURE,
            },
            Self::Usage(_) => EX_USAGE,
            Self::NoInput { .. } => EX_NOINPUT,
            Self::Io { .. } => EX_IOERR,
            Self::Rejected(_) => EX_DATAERR,
            Self::NotCompleted(_) => EX_FAILURE,
            Self::Timeout(_) => EX_TEMPFAIL,
            Self::Config(_) => EX_CONFIG,
        }
    }

    /// The stable name of this kind of error, the `code` of the JSON error:
    /// `unreachable`, the gRPC code in snake case (`not_found`), `usage`,
    /// `no_input`, `io`, `rejected`, `not_completed`, `timeout`, `config`.
    pub fn code(&self) -> &'static str {
        match self {
            Self::Unreachable { .. } | Self::Tls { .. } => "unreachable",
            Self::Grpc(status) => code_name(status.code()),
            Self::Usage(_) => "usage",
            Self::NoInput { .. } => "no_input",
            Self::Io { .. } => "io",
            Self::Rejected(_) => "rejected",
            Self::NotCompleted(_) => "not_completed",
            Self::Timeout(_) => "timeout",
            Self::Config(_) => "config",
        }
    }

    /// The message without the code: for a gRPC error the planner's message
    /// alone, else the whole text.
    pub fn message(&self) -> String {
        match self {
            Self::Grpc(status) => status.message().to_owned(),
            other => other.to_string(),
        }
    }

    /// An I/O error with what was being done.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Self::Io {
            context: context.into(),
            source,
        }
    }

    /// Whether this is stdout closed early (`redrivectl ... | head`), which
    /// is not worth a message.
    pub fn is_broken_pipe(&self) -> bool {
        matches!(self, Self::Io { source, .. } if source.kind() == std::io::ErrorKind::BrokenPipe)
    }
}

impl From<Status> for CliError {
    fn from(status: Status) -> Self {
        Self::Grpc(status)
    }
}

/// Writing to stdout failed.
impl From<std::io::Error> for CliError {
    fn from(source: std::io::Error) -> Self {
        Self::io("writing the output", source)
    }
}

/// The JSON form of an error on stderr with `--json`: `{"error": {"code":
/// CODE, "message": MESSAGE}}` on one line.
pub fn error_json(code: &str, message: &str) -> String {
    serde_json::json!({"error": {"code": code, "message": message}}).to_string()
}

/// The JSON form of a diagnostic that is not the end of the command (an
/// import line refused, a planner outage waited out), on stderr with
/// `--json`: `{"warning": {"code": CODE, "message": MESSAGE}}` on one line.
pub fn warning_json(code: &str, message: &str) -> String {
    serde_json::json!({"warning": {"code": code, "message": message}}).to_string()
}

/// The canonical gRPC code name in snake case (`invalid_argument`).
pub fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "ok",
        Code::Cancelled => "cancelled",
        Code::Unknown => "unknown",
        Code::InvalidArgument => "invalid_argument",
        Code::DeadlineExceeded => "deadline_exceeded",
        Code::NotFound => "not_found",
        Code::AlreadyExists => "already_exists",
        Code::PermissionDenied => "permission_denied",
        Code::ResourceExhausted => "resource_exhausted",
        Code::FailedPrecondition => "failed_precondition",
        Code::Aborted => "aborted",
        Code::OutOfRange => "out_of_range",
        Code::Unimplemented => "unimplemented",
        Code::Internal => "internal",
        Code::Unavailable => "unavailable",
        Code::DataLoss => "data_loss",
        Code::Unauthenticated => "unauthenticated",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_errors_read_code_then_message() {
        let error = CliError::from(Status::not_found("dead letter 9 not found"));
        assert_eq!(error.to_string(), "not_found: dead letter 9 not found");
        assert_eq!(error.exit_code(), EX_DATAERR);
        assert_eq!(
            CliError::from(Status::failed_precondition("x")).exit_code(),
            EX_FAILURE
        );
        assert_eq!(
            CliError::from(Status::unavailable("x")).exit_code(),
            EX_UNAVAILABLE
        );
    }

    #[test]
    fn json_errors_carry_code_and_message() {
        let error = CliError::from(Status::not_found("dead letter 9 not found"));
        let json: serde_json::Value =
            serde_json::from_str(&error_json(error.code(), &error.message())).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"error": {"code": "not_found", "message": "dead letter 9 not found"}})
        );
        assert_eq!(CliError::Usage("x".into()).code(), "usage");
        assert_eq!(CliError::Timeout("x".into()).code(), "timeout");
    }

    #[test]
    fn unreachable_says_what_to_do() {
        let error = CliError::Unreachable {
            url: "http://127.0.0.1:50051".into(),
            cause: "connection refused".into(),
        };
        assert_eq!(
            error.to_string(),
            "cannot reach the planner at http://127.0.0.1:50051: connection refused \
             (is redrive-planner running? set --planner or REDRIVE_PLANNER)"
        );
        assert_eq!(error.exit_code(), EX_UNAVAILABLE);
    }
}
