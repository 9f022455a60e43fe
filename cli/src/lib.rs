//! `redrivectl`, Redrive's operator CLI over the planner's `redrive.v1.Planner`
//! gRPC API: capture (`import`) and inspect (`dead-letters list | show |
//! summary`) dead letters; precheck and plan commands come later.
//!
//! ```text
//! redrivectl [--planner URL] [--json] dead-letters list [selector flags] [--page-size N] [--page-token T] [--all]
//! redrivectl [--planner URL] [--json] dead-letters show ID
//! redrivectl [--planner URL] [--json] dead-letters summary [selector flags] [--group-by reason,producer,...]
//! redrivectl [--planner URL] [--json] import FILE --source LABEL [--batch N]
//! ```
//!
//! Global flags (anywhere on the line): `--planner URL` (env `REDRIVE_PLANNER`,
//! default `http://127.0.0.1:50051`) and `--json` (env `REDRIVE_JSON`): one
//! compact JSON document on stdout instead of tables. Diagnostics always go to
//! stderr. Answers up to 64 MiB are accepted.
//!
//! # Exit codes
//! | code | when |
//! | --- | --- |
//! | 0 | success; also `--help` and `--version` |
//! | 1 | the planner answered another gRPC error (`failed_precondition`, `internal`, ...) |
//! | 64 | bad command line (`EX_USAGE`): unknown flag or value, unknown `--group-by` name, bad `--planner` URL |
//! | 65 | refused data (`EX_DATAERR`): the planner said `invalid_argument` or `not_found`; `import` rejected some lines |
//! | 66 | `import` cannot open its file (`EX_NOINPUT`) |
//! | 69 | the planner is unreachable or answered `unavailable` (`EX_UNAVAILABLE`) |
//! | 74 | reading the import file or writing the output failed (`EX_IOERR`) |
//!
//! An unreachable planner reads `redrivectl: cannot reach the planner at URL:
//! <cause> (is redrive-planner running? set --planner or REDRIVE_PLANNER)`; a
//! gRPC error reads `redrivectl: <code>: <message>`, the code in snake case.
//!
//! # JSON shapes
//! - `dead-letters show`: one dead letter ([`output`] lists every field; header
//!   values are typed, see [`headers`]).
//! - `dead-letters list`: `{"dead_letters": [...], "next_page_token": "..."}`
//!   ([`commands::dead_letters`]).
//! - `dead-letters summary`: `{"total": N, "groups": [{"key": {...}, "count": N,
//!   "first_seen": ..., "last_seen": ...}]}` ([`commands::dead_letters`]).
//! - `import`: `{"imported": N, "duplicates": M, "rejected": [{"line": N,
//!   "reason": "..."}]}` ([`commands::import`], which also describes the file
//!   format).
//!
//! # Layout
//! - [`commands`]: the clap command line ([`Cli`]) and dispatch ([`run`]);
//!   [`commands::dead_letters`] and [`commands::import`], one module per
//!   command group.
//! - [`selector`]: the selector flags shared by `list`, `summary` and later
//!   `precheck`, and their conversion to the proto `Selector`.
//! - [`client`]: connecting to the planner.
//! - [`output`]: tables, JSON writing, the stable dead letter JSON shape.
//! - [`headers`]: typed AMQP header values as JSON, both ways.
//! - [`error`]: [`error::CliError`] and the exit codes.

pub mod client;
pub mod commands;
pub mod error;
pub mod headers;
pub mod output;
pub mod selector;

pub use commands::{Cli, Command, run};
