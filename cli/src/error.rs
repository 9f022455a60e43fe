//! What can go wrong in `redrivectl`, and the exit code of each (sysexits.h).
//!
//! The exit codes are [`EXIT_CODES`], the one table that the code
//! ([`CliError::exit_code`]), `--help` ([`exit_codes_help`]) and
//! `cli/USAGE.md` (checked by a test) take them from.
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

/// Every exit code of `redrivectl`: `(code, sysexits.h name or "", short
/// label, when)`, in order. The one table: [`CliError::exit_code`] and the
/// commands return only these codes, `--help` prints them
/// ([`exit_codes_help`], [`exit_codes_long_help`]) and `cli/USAGE.md`'s
/// "Exit codes" table is [`exit_codes_markdown`] (a test checks it). The
/// `when` texts are markdown (code in backticks) without `|`.
pub const EXIT_CODES: &[(u8, &str, &str, &str)] = &[
    (
        EX_OK,
        "",
        "ok",
        "success; also `--help`, `--version`, and stdout closed early by its reader \
         (`head`); `plan wait`: the plan completed with no `failed` or `unroutable` item; \
         `replay`: `REPLAYED`",
    ),
    (
        EX_FAILURE,
        "",
        "other gRPC error, plan not completed, not replayed",
        "the planner answered another gRPC error (`failed_precondition`, \
         `deadline_exceeded`, `permission_denied`, `internal`, ...); `plan wait`: the plan \
         ended `cancelled` or `aborted`, or completed with `failed` or `unroutable` items; \
         `replay`: `NOT_REPLAYED` (the answer is printed first); the async runtime cannot \
         start",
    ),
    (
        EX_USAGE,
        "EX_USAGE",
        "bad usage",
        "bad command line: unknown flag or value, unknown `--group-by` name, `--verdict` \
         or `--state`, bad or repeated `--stale-after` or `--stale-after-source`, a blank \
         `--override-policy`, `precheck` without `--source`, a bad `plan create` value, \
         bad `--planner` URL, an actor or bearer token that cannot be sent as metadata, a \
         token file that cannot be read or is empty, a token to an `http://` planner that \
         is not on loopback, `hash-token` with nothing on stdin, `--idempotency-key` \
         where it cannot help (a read, `import`, `replay`, `--since`)",
    ),
    (
        EX_DATAERR,
        "EX_DATAERR",
        "refused input",
        "the planner refused the request as wrong (`invalid_argument`) or found nothing \
         (`not_found`); `import` rejected some lines; `dead-letters archive`, `unarchive` \
         or `rekey`: some ids named nothing (`not_found_ids`, the answer is printed first); \
         `audit prove`, `consistency` or `verify`: a proof, signature or export that does not \
         verify (what is wrong is printed)",
    ),
    (
        EX_NOINPUT,
        "EX_NOINPUT",
        "input file missing",
        "`import` cannot open its file; `dead-letters repair` cannot read its `--body-file`; \
         `audit verify`, `prove` or `consistency` cannot read an export, key or checkpoint file",
    ),
    (
        EX_UNAVAILABLE,
        "EX_UNAVAILABLE",
        "planner unreachable or unavailable",
        "the planner cannot be reached (within 5 s), stopped answering (no HTTP/2 PING \
         acknowledged within about 20 s, also mid-call), its TLS does not match this \
         client's settings, or it answered `unavailable` (e.g. a precheck whose state-check hook is down); `plan \
         watch`: the stream ended before the plan was final",
    ),
    (
        EX_IOERR,
        "EX_IOERR",
        "I/O error",
        "reading the import file or writing the output failed",
    ),
    (
        EX_TEMPFAIL,
        "EX_TEMPFAIL",
        "`plan wait --timeout` ran out",
        "`plan wait --timeout` ran out before the plan was final",
    ),
    (
        EX_CONFIG,
        "EX_CONFIG",
        "bad config file",
        "the config file cannot be read or parsed, has an unknown key or a bad value, or \
         lacks the `--profile` asked for",
    ),
];

/// The exit codes in one paragraph for `-h`: `Exit codes: 0 ok; 1 ...; 78
/// bad config file (--help: when each).`, from [`EXIT_CODES`].
pub fn exit_codes_help() -> String {
    let codes: Vec<String> = EXIT_CODES
        .iter()
        .map(|(code, _, label, _)| format!("{code} {label}"))
        .collect();
    format!("Exit codes: {} (--help: when each).", codes.join("; "))
}

/// The exit codes for `--help` and the manual page: one line per code, its
/// name and when, from [`EXIT_CODES`].
pub fn exit_codes_long_help() -> String {
    let mut text = String::from("Exit codes:\n");
    for (code, name, _, when) in EXIT_CODES {
        let name = if name.is_empty() {
            String::new()
        } else {
            format!(" ({name})")
        };
        text.push_str(&format!("  {code:>2}{name}: {when}\n"));
    }
    text
}

/// [`EXIT_CODES`] as the markdown table of `cli/USAGE.md`: a header row
/// `| code | name | when |`, then a row per code.
pub fn exit_codes_markdown() -> String {
    let mut text = String::from("| code | name | when |\n| --- | --- | --- |\n");
    for (code, name, _, when) in EXIT_CODES {
        let name = if name.is_empty() {
            String::new()
        } else {
            format!("`{name}`")
        };
        text.push_str(&format!("| {code} | {name} | {when} |\n"));
    }
    text
}

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

    /// An audit log proof, signature or export does not verify (`audit
    /// ...`); what is wrong was printed or is the message.
    #[error("{0}")]
    Unverified(String),

    /// SIGINT or SIGTERM ended a command that cleans up after itself
    /// (`audit export`): the message says what was left; the exit code is
    /// 128 + the signal's number, as a shell reports it.
    #[error("{what}")]
    Interrupted {
        /// What was interrupted and what was left.
        what: String,
        /// 130 (SIGINT) or 143 (SIGTERM).
        code: u8,
    },
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
            Self::Unverified(_) => EX_DATAERR,
            Self::Interrupted { code, .. } => *code,
        }
    }

    /// The stable name of this kind of error, the `code` of the JSON error:
    /// `unreachable`, the gRPC code in snake case (`not_found`), `usage`,
    /// `no_input`, `io`, `rejected`, `not_completed`, `timeout`, `config`,
    /// `unverified`, `interrupted`.
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
            Self::Unverified(_) => "unverified",
            Self::Interrupted { .. } => "interrupted",
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

    /// `cli/USAGE.md`'s "Exit codes" table is [`EXIT_CODES`], row for row.
    #[test]
    fn usage_md_has_the_exit_code_table() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("USAGE.md");
        let usage = std::fs::read_to_string(path).unwrap();
        let section = usage
            .split_once("\n## Exit codes\n")
            .expect("USAGE.md has an \"Exit codes\" section")
            .1;
        let table: String = section
            .lines()
            .skip_while(|line| !line.starts_with('|'))
            .take_while(|line| line.starts_with('|'))
            .map(|line| format!("{line}\n"))
            .collect();
        assert_eq!(
            table,
            exit_codes_markdown(),
            "USAGE.md's exit code table differs from error::EXIT_CODES"
        );
    }

    /// Every code an error exits with is in the table, and the table's codes
    /// are distinct and without `|` (it would split a markdown cell).
    #[test]
    fn every_exit_code_is_in_the_table() {
        let codes: Vec<u8> = EXIT_CODES.iter().map(|(code, ..)| *code).collect();
        let mut distinct = codes.clone();
        distinct.dedup();
        assert_eq!(distinct, codes);
        assert!(
            EXIT_CODES
                .iter()
                .all(|(_, _, label, when)| !when.contains('|') && !label.contains('|'))
        );
        let io = || std::io::Error::other("x");
        for error in [
            CliError::Unreachable {
                url: String::new(),
                cause: String::new(),
            },
            CliError::Tls {
                message: String::new(),
            },
            CliError::Grpc(Status::internal("x")),
            CliError::Grpc(Status::not_found("x")),
            CliError::Grpc(Status::unavailable("x")),
            CliError::Usage(String::new()),
            CliError::NoInput {
                path: String::new(),
                source: io(),
            },
            CliError::io("x", io()),
            CliError::Rejected(String::new()),
            CliError::NotCompleted(String::new()),
            CliError::Timeout(String::new()),
            CliError::Config(String::new()),
        ] {
            assert!(codes.contains(&error.exit_code()), "{error:?}");
        }
        let help = exit_codes_help();
        assert!(help.starts_with("Exit codes: 0 ok; 1 "), "{help}");
        assert!(help.contains("78 bad config file"), "{help}");
        assert!(
            exit_codes_long_help().contains("  75 (EX_TEMPFAIL): `plan wait --timeout` ran out")
        );
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
