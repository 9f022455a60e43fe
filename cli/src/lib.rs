//! `redrivectl`, Redrive's operator CLI over the planner's `redrive.v1.Planner`
//! gRPC API: capture (`import`), inspect (`dead-letters list | show |
//! summary`) and precheck (`precheck`, `precheck show | items`) dead letters;
//! plan commands come later.
//!
//! ```text
//! redrivectl [global flags] dead-letters list [selector flags] [--page-size N] [--page-token T] [--all]
//! redrivectl [global flags] dead-letters show ID
//! redrivectl [global flags] dead-letters summary [selector flags] [--group-by reason,producer,...]
//! redrivectl [global flags] import FILE --source LABEL [--batch N]
//! redrivectl [global flags] precheck --source Q [selector flags] [--stale-after TYPE=DUR]... [--default-stale-after DUR]
//!            [--replay-key-window DUR] [--max-redrives N] [--state-check-batch N] [--state-check-timeout DUR]
//!            [--block-on-state-check-error] [--event-time-pointer /json/pointer]
//! redrivectl [global flags] precheck show ID
//! redrivectl [global flags] precheck items ID [--verdict V] [--page-size N] [--page-token T] [--all]
//! ```
//!
//! Global flags (anywhere on the line): `--planner URL` (env `REDRIVE_PLANNER`,
//! default `http://127.0.0.1:50051`), `--json` (env `REDRIVE_JSON`): one
//! compact JSON document on stdout instead of tables, and `--actor NAME` (env
//! `REDRIVE_ACTOR`, default the `USER` environment variable, else
//! `anonymous`): who is calling, sent as the `x-redrive-actor` gRPC metadata on
//! every request (visible ASCII; the planner records it as the actor of what
//! the request creates, e.g. a precheck's `actor`). Diagnostics always go to stderr. Answers up to 64 MiB
//! are accepted.
//!
//! # Exit codes
//! | code | when |
//! | --- | --- |
//! | 0 | success; also `--help` and `--version` |
//! | 1 | the planner answered another gRPC error (`failed_precondition`, `internal`, ...) |
//! | 64 | bad command line (`EX_USAGE`): unknown flag or value, unknown `--group-by` name or `--verdict`, bad `--stale-after`, a `--stale-after` pattern given twice, bad `--planner` URL, an actor that is not visible ASCII |
//! | 65 | refused data (`EX_DATAERR`): the planner said `invalid_argument` or `not_found`; `import` rejected some lines |
//! | 66 | `import` cannot open its file (`EX_NOINPUT`) |
//! | 69 | the planner is unreachable or answered `unavailable` (`EX_UNAVAILABLE`), e.g. a precheck whose state-check hook is down (without `--block-on-state-check-error`) |
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
//! - `precheck` and `precheck show`: one report ([`commands::precheck`]),
//!   `{"precheck_id", "actor", "created_at", "digest", "total", "counts":
//!   {"replayable", "duplicate", "already_replayed", "looping", "stale",
//!   "blocked_by_state", "needs_compensation", "invalid"}, "breakdowns":
//!   {"reason_class", "destination", "event_type", "schema_version",
//!   "producer"}, "died_from", "died_to", "warnings", "sample_blocked"}`. All
//!   eight counts are always present, as integers (also in each breakdown row
//!   `{"value", "total", "counts"}`); `created_at`, `died_from`, `died_to` are
//!   RFC 3339 or null.
//! - `precheck items`: `{"items": [{"dead_letter_id", "message_key",
//!   "verdict", "reason", "destination", "event_type"}], "next_page_token":
//!   "..."}`; `sample_blocked` items have the same shape. `event_type` is a
//!   string or null.
//!
//! # Layout
//! - [`commands`]: the clap command line ([`Cli`]) and dispatch ([`run`]);
//!   [`commands::dead_letters`], [`commands::import`] and
//!   [`commands::precheck`], one module per command group.
//! - [`selector`]: the selector flags shared by `list`, `summary` and
//!   `precheck`, and their conversion to the proto `Selector`.
//! - [`client`]: connecting to the planner; the actor interceptor.
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
