//! `redrivectl`, Redrive's operator CLI over the planner's `redrive.v1.Planner`
//! gRPC API: capture (`import`), inspect (`dead-letters list | show |
//! summary`) and precheck (`precheck`, `precheck show | items`) dead letters,
//! then replay them under a plan (`plan create | approve | status | list |
//! watch | wait | report | promote | pause | resume | cancel |
//! compensations`).
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
//! redrivectl [global flags] plan create --precheck ID --rate N --burst N --rationale TEXT
//!            [--destination queue|exchange|redirect:EXCHANGE/ROUTING_KEY] [--slice-size N]
//!            [--canary-fraction F] [--observe DUR]
//! redrivectl [global flags] plan approve ID --digest D
//! redrivectl [global flags] plan status ID                  (alias: plan show)
//! redrivectl [global flags] plan list [--state S]... [--page-size N] [--page-token T] [--all]
//! redrivectl [global flags] plan watch ID [--events]
//! redrivectl [global flags] plan wait ID [--timeout DUR] [--interval DUR]
//! redrivectl [global flags] plan report ID [--format text|json|jsonl|csv]
//! redrivectl [global flags] plan promote|pause|resume|cancel ID [--reason TEXT]
//! redrivectl [global flags] plan compensations ID [--page-size N] [--page-token T] [--all]
//! redrivectl completion bash|zsh|fish|elvish|powershell
//! redrivectl man
//! redrivectl hash-token < token.txt
//! ```
//!
//! Global flags (anywhere on the line): `--planner URL` (env `REDRIVE_PLANNER`,
//! `HOST:PORT` or an `http://`/`https://` URL, default the profile's, else
//! `http://127.0.0.1:50051`), `--json` (env `REDRIVE_JSON`): one
//! compact JSON document on stdout instead of tables (`plan watch`: one per
//! line, per update) and errors as JSON on stderr
//! ([`error::error_json`]), `--wide`: tables in full ([`table`]),
//! `--profile NAME` (env `REDRIVE_PROFILE`): a profile of the config file
//! ([`config`]), and `--actor NAME` (env
//! `REDRIVE_ACTOR`, default the `USER` environment variable, else
//! `anonymous`): who is calling, sent as the `x-redrive-actor` gRPC metadata on
//! every request (visible ASCII; the planner records it as the actor of what
//! the request creates, e.g. a precheck's `actor`). Credentials for a planner
//! with TLS and authentication: `--ca FILE` (env `REDRIVE_CA`),
//! `--tls-client-cert FILE` and `--tls-client-key FILE`, `--token-file FILE`
//! (env `REDRIVE_TOKEN_FILE`, else the token in `REDRIVE_TOKEN`); with
//! credentials the actor is sent only when given ([`client`]).
//! `redrivectl hash-token` prints the SHA-256 of a token read from stdin.
//! Diagnostics always go to stderr. Answers up to 64 MiB are accepted.
//!
//! # Exit codes
//! One table, [`error::EXIT_CODES`], says every exit code and when: the code
//! returns them, `redrivectl --help` prints them and `cli/USAGE.md`'s table
//! is checked against it.
//!
//! An unreachable planner reads `redrivectl: cannot reach the planner at URL:
//! <cause> (is redrive-planner running? set --planner or REDRIVE_PLANNER)`; a
//! gRPC error reads `redrivectl: <code>: <message>`, the code in snake case.
//!
//! # JSON output
//! `--json` prints the planner's answer in the API's canonical proto3 JSON
//! (as grpcurl shows it: lowerCamelCase names, enums by name, 64-bit
//! integers as strings, RFC 3339 times, base64 bytes, default values left
//! out), through [`output::write_message`]: `dead-letters list` a
//! `ListDeadLettersResponse` (every page walked in one), `show` and
//! `repair` a `GetDeadLetterResponse`, `summary` a
//! `SummarizeDeadLettersResponse`, `archive | unarchive` an
//! `ArchiveDeadLettersResponse`, `rekey` a `RekeyDeadLettersResponse`,
//! `precheck` and `precheck show` a `PrecheckReport`, `precheck items` and
//! `plan compensations` a `ListPrecheckItemsResponse` /
//! `ListCompensationsResponse`, `plan create | approve | status | wait |
//! promote | pause | resume | cancel` a `Plan`, `plan list` a
//! `ListPlansResponse`, `plan watch` one `WatchPlanResponse` per line (plus
//! the CLI's own `{"stalled": ...}` / `{"resumed": ...}` lines,
//! [`commands::plan::live::StallJson`]), `plan report` an `AuditReport`,
//! `replay` a `ReplayDeadLetterResponse`. Only `import`, which sums many
//! `IngestDeadLetters` calls, prints a shape of its own
//! ([`commands::import`]). `cli/USAGE.md`, "JSON output", has the table and
//! a before/after.
//!
//! Suggested commands (`next:` hints, the watch line's `plan promote`) keep
//! the `--profile` and `--planner` typed ([`hint`]).
//! - `plan compensations`: `{"items": [precheck item], "next_page_token":
//!   "..."}`.
//!
//! # Layout
//! - `lib.rs`: this page; `entry.rs`: the binary's body
//!   ([`main_with_args`]: parse, run on a single-threaded runtime, exit
//!   codes), which `main.rs` calls.
//! - [`commands`] (`commands/mod.rs`): the clap command line ([`Cli`]) and
//!   dispatch ([`run`]); one module per command group:
//!   - [`commands::dead_letters`]: `dead-letters list | show | summary |
//!     repair | archive | unarchive`;
//!   - [`commands::import`]: `import`, the JSON Lines file format;
//!   - [`commands::precheck`]: `precheck`, `precheck show | items`;
//!   - [`commands::replay`]: `replay`, one dead letter now;
//!   - [`commands::plan`] (`commands/plan/mod.rs`): `plan create | approve |
//!     list | report | ...`;
//!   - [`commands::plan::view`]: the plan views and their renderings for people;
//!   - [`commands::plan::live`]: `plan watch`;
//!   - [`commands::plan::wait`]: `plan wait`;
//!   - [`commands::plan::pace`]: a watched plan's pace and stalls.
//! - [`selector`]: the selector flags shared by `list`, `summary` and
//!   `precheck`, and their conversion to the proto `Selector`.
//! - [`args`]: flag values and groups taken by more than one command
//!   (paging, reasons, durations, the precheck options).
//! - [`views`]: views, table rows and listings printed by more than one
//!   command (precheck items, audit events); commands import views and
//!   arguments from here, never from each other.
//! - [`client`]: connecting to the planner; the actor interceptor.
//! - [`config`]: the config file's defaults and profiles (planner, actor,
//!   credentials), weighed against the flags.
//! - [`output`]: JSON writing (the API's canonical JSON), paged listings,
//!   the dead letter view for people; it imports nothing from [`commands`].
//! - [`table`]: tables for people, fitted to the terminal (`--wide`: full
//!   values).
//! - [`headers`]: typed AMQP header values as JSON, both ways.
//! - [`escape`]: producers' control characters kept off the terminal.
//! - [`preview`]: the body preview of `dead-letters show` (key order kept,
//!   binary escaped).
//! - [`time`]: how times are written (RFC 3339, UTC).
//! - [`error`]: [`error::CliError`] and the exit codes.

pub mod args;
pub mod client;
pub mod commands;
pub mod config;
mod entry;
pub mod error;
pub mod escape;
pub mod headers;
pub mod hint;
pub mod output;
pub mod preview;
pub mod selector;
pub mod table;
pub mod time;
pub mod views;

pub use commands::{Cli, Command, run};
pub use entry::main_with_args;
