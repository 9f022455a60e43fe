//! The command line: global flags, subcommands, and dispatch.
//!
//! Each subcommand lives in its own module, parses its own flags (clap
//! derive), talks to the planner through [`crate::client`] and renders through
//! [`crate::output`]. A new command is a new module and a new [`Command`]
//! variant; selector flags come from [`crate::selector::SelectorArgs`].

pub mod dead_letters;
pub mod import;
pub mod plan;
pub mod precheck;
pub mod replay;

use std::io::{IsTerminal, Write};

use clap::{Parser, Subcommand};

use crate::{
    client::{self, DEFAULT_PLANNER, parse_actor, parse_planner_url, resolve_actor},
    error::CliError,
};

/// `redrivectl`: Redrive's operator CLI over the Planner gRPC API.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "redrivectl",
    version,
    about = "Redrive's operator CLI: capture, inspect, precheck and replay dead letters",
    after_help = "Exit codes: 0 ok, 1 other gRPC error (and `plan wait`: the plan was cancelled, \
                  aborted or completed with failed items; `replay`: NOT_REPLAYED), 64 bad usage, 65 refused input (invalid argument, not found, \
                  rejected import lines), 66 input file missing, 69 planner unreachable or \
                  unavailable, 74 I/O error, 75 `plan wait --timeout` ran out."
)]
pub struct Cli {
    /// Planner gRPC endpoint.
    #[arg(
        long,
        global = true,
        help_heading = "Global options",
        value_name = "URL",
        env = "REDRIVE_PLANNER",
        default_value = DEFAULT_PLANNER,
        value_parser = parse_planner_url
    )]
    pub planner: String,

    /// Print machine-readable JSON on stdout instead of tables.
    #[arg(
        long,
        global = true,
        help_heading = "Global options",
        env = "REDRIVE_JSON"
    )]
    pub json: bool,

    /// Who is calling, sent to the planner as `x-redrive-actor` metadata on
    /// every request [default: $USER, else anonymous].
    #[arg(
        long,
        global = true,
        help_heading = "Global options",
        value_name = "NAME",
        env = "REDRIVE_ACTOR",
        value_parser = parse_actor
    )]
    pub actor: Option<String>,

    #[command(subcommand)]
    #[allow(missing_docs)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Clone, Subcommand)]
pub enum Command {
    /// Inspect captured dead letters: list, show, summary.
    #[command(subcommand)]
    DeadLetters(dead_letters::DeadLettersCommand),
    /// Import dead letters from a JSON Lines file (one dead letter per line).
    Import(import::ImportArgs),
    /// Dry-run a replay: give every selected dead letter a verdict (or show a
    /// stored precheck, or list its items).
    Precheck(precheck::PrecheckArgs),
    /// Replay plans: create, approve, watch, wait, control, report.
    #[command(subcommand)]
    Plan(plan::PlanCommand),
    /// Replay one dead letter now (a plan of one: precheck, no canary, no
    /// approval step) and wait for the outcome: REPLAYED or NOT_REPLAYED.
    Replay(replay::ReplayArgs),
}

impl Cli {
    /// The actor sent on every request: `--actor` / `REDRIVE_ACTOR`, else the
    /// `USER` environment variable, else `anonymous`.
    pub fn actor(&self) -> String {
        let user = std::env::var("USER").ok();
        resolve_actor(self.actor.as_deref(), user.as_deref())
    }
}

/// Runs the command `cli` names, writing its output to `out`; the `Ok` value is
/// the exit code (0, or 65 when an import rejected lines). `plan watch` draws
/// a progress bar when stdout is a terminal.
///
/// # Errors
/// Whatever ends the command early; [`CliError::exit_code`] says how to exit.
pub async fn run(cli: Cli, out: &mut dyn Write) -> Result<u8, CliError> {
    let actor = cli.actor();
    // Human output escapes control characters from dead letters
    // ([`crate::escape`]); only the live progress bar writes its own, and an
    // export that goes to a file is left as it is.
    let tty = std::io::stdout().is_terminal();
    let live_bar =
        tty && !cli.json && matches!(&cli.command, Command::Plan(plan::PlanCommand::Watch(_)));
    // `plan report --format jsonl|csv` into a file or pipe is the planner's
    // export byte for byte (a CSV record ends in CRLF when the planner's does).
    let raw_export = !tty
        && matches!(
            &cli.command,
            Command::Plan(plan::PlanCommand::Report(plan::ReportArgs {
                format: Some(plan::ReportFormat::Jsonl | plan::ReportFormat::Csv),
                ..
            }))
        );
    let mut escaping;
    let out: &mut dyn Write = if cli.json || live_bar || raw_export {
        out
    } else {
        escaping = crate::escape::Escaping::new(out);
        &mut escaping
    };
    match cli.command {
        Command::DeadLetters(command) => {
            let command = command.read_input()?;
            let mut planner = client::connect(&cli.planner, &actor).await?;
            dead_letters::run(&mut planner, command, cli.json, out).await
        }
        Command::Import(args) => {
            // The file first: a typo in its name should not wait on the network.
            let input = import::open(&args.file)?;
            let mut planner = client::connect(&cli.planner, &actor).await?;
            import::run(&mut planner, args, input, cli.json, out).await
        }
        Command::Precheck(args) => {
            // Flag checks clap cannot do (a --stale-after pattern given twice)
            // before the network.
            let command = args.into_command()?;
            let mut planner = client::connect(&cli.planner, &actor).await?;
            precheck::run(&mut planner, command, cli.json, out).await
        }
        Command::Plan(command) => {
            let mut planner = client::connect(&cli.planner, &actor).await?;
            plan::run(&mut planner, command, cli.json, tty, out).await
        }
        Command::Replay(args) => {
            let mut planner = client::connect(&cli.planner, &actor).await?;
            replay::run(&mut planner, args, cli.json, out).await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("redrivectl").chain(args.iter().copied()))
    }

    #[test]
    fn the_command_line_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    #[test]
    fn global_flags_go_anywhere() {
        let cli = parse(&[
            "dead-letters",
            "show",
            "7",
            "--json",
            "--planner",
            "http://p:1",
        ])
        .unwrap();
        assert!(cli.json);
        assert_eq!(cli.planner, "http://p:1");
        let cli = parse(&["--json", "import", "-", "--source", "x"]).unwrap();
        let Command::Import(args) = cli.command else {
            panic!("not import");
        };
        assert_eq!(
            (args.file.as_str(), args.source.as_str(), args.batch),
            ("-", "x", 1000)
        );
    }

    fn precheck(args: &[&str]) -> Result<precheck::PrecheckCommand, CliError> {
        let cli = parse(args).map_err(|error| CliError::Usage(error.to_string()))?;
        let Command::Precheck(args) = cli.command else {
            panic!("not precheck");
        };
        args.into_command()
    }

    #[test]
    fn precheck_runs_bare_and_shows_or_lists_as_subcommands() {
        use precheck::PrecheckCommand;

        let Ok(PrecheckCommand::Run { selector, options }) = precheck(&[
            "precheck",
            "--source",
            "orders.dlq",
            "--source",
            "payments.dlq",
            "--since",
            "2h",
            "--stale-after",
            "payment.*=2h",
            "--json",
        ]) else {
            panic!("not a run");
        };
        assert_eq!(selector.sources, ["orders.dlq", "payments.dlq"]);
        assert_eq!(options.stale_after.len(), 1);

        assert_eq!(
            precheck(&["precheck", "show", "p-1"]).unwrap(),
            PrecheckCommand::Show("p-1".into())
        );
        // Global flags still go anywhere, even between precheck and show.
        let cli = parse(&["precheck", "--json", "--actor", "bob", "show", "p-1"]).unwrap();
        assert!(cli.json);
        assert_eq!(cli.actor.as_deref(), Some("bob"));
        assert_eq!(
            precheck(&[
                "precheck",
                "items",
                "p-1",
                "--verdict",
                "blocked_by_state",
                "--all"
            ])
            .unwrap(),
            PrecheckCommand::Items {
                id: "p-1".into(),
                verdict: Some(redrive_proto::v1::Verdict::BlockedByState),
                page: crate::args::Paging {
                    all: true,
                    ..Default::default()
                },
            }
        );
    }

    #[test]
    fn precheck_usage_errors() {
        for args in [
            &["precheck"][..],
            &["precheck", "--reason", "rejected"],
            &["precheck", "--source", "q", "--stale-after", "payment"],
            &["precheck", "--source", "q", "show", "p-1"],
            &["precheck", "--stale-after", "a=1h", "items", "p-1"],
            &["precheck", "items", "p-1", "--verdict", "blocked"],
            &["precheck", "show"],
            &[
                "precheck",
                "--source",
                "q",
                "--stale-after",
                "a=1h",
                "--stale-after",
                "a=2h",
            ],
            &["precheck", "--actor", "José", "show", "p-1"],
        ] {
            let error = precheck(args)
                .err()
                .unwrap_or_else(|| panic!("{args:?} parsed"));
            assert_eq!(error.exit_code(), crate::error::EX_USAGE, "{args:?}");
        }
    }

    #[test]
    fn plan_commands_take_global_flags_anywhere() {
        let cli = parse(&["plan", "--json", "wait", "p-1", "--timeout", "1m"]).unwrap();
        assert!(cli.json);
        let Command::Plan(plan::PlanCommand::Wait(args)) = cli.command else {
            panic!("not plan wait");
        };
        assert_eq!(args.timeout, Some(std::time::Duration::from_secs(60)));
        let cli = parse(&["plan", "show", "p-1", "--actor", "bob"]).unwrap();
        assert!(matches!(
            cli.command,
            Command::Plan(plan::PlanCommand::Status(_))
        ));
        assert_eq!(cli.actor(), "bob");
        assert!(parse(&["plan"]).unwrap_err().use_stderr());
    }

    #[test]
    fn the_actor_flag_wins_over_user() {
        let cli = parse(&["--actor", " alice ", "dead-letters", "list"]).unwrap();
        assert_eq!(cli.actor(), "alice");
    }

    #[test]
    fn usage_errors_are_errors_and_help_is_not() {
        for args in [
            &["dead-letters"][..],
            &["import", "f.jsonl"],
            &["import", "f.jsonl", "--source", "x", "--batch", "0"],
            &["dead-letters", "list", "--page-size", "5000"],
            &["--planner", "localhost:50051", "dead-letters", "list"],
            &["dead-letters", "summary", "--group-by", "reason,colour"],
            &["replay", "42"],
            &["replay", "42", "--reason", "  "],
            &["replay", "42", "--reason", "fixed", "--wait", "0s"],
            &["dead-letters", "repair", "42", "--reason", "fixed"],
            &["dead-letters", "repair", "42", "--body-file", "b.json"],
        ] {
            assert!(parse(args).unwrap_err().use_stderr(), "{args:?}");
        }
        assert!(!parse(&["--help"]).unwrap_err().use_stderr());
        assert!(!parse(&["--version"]).unwrap_err().use_stderr());
    }
}
