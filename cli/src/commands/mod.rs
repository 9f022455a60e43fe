//! The command line: global flags, subcommands, and dispatch.
//!
//! Each subcommand lives in its own module, parses its own flags (clap
//! derive), talks to the planner through [`crate::client`] and renders through
//! [`crate::output`]. A new command is a new module and a new [`Command`]
//! variant; selector flags come from [`crate::selector::SelectorArgs`].

pub mod audit;
pub mod dead_letters;
pub mod import;
pub mod plan;
pub mod precheck;
pub mod replay;

use std::io::{IsTerminal, Write};

use clap::{ArgAction, Args, Parser, Subcommand, builder::FalseyValueParser};
use clap_complete::Shell;

use crate::{
    client::{self, parse_actor, parse_idempotency_key, parse_planner_url},
    config,
    error::CliError,
};

/// `redrivectl`: Redrive's operator CLI over the Planner gRPC API.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "redrivectl",
    version,
    about = "Redrive's operator CLI: capture, inspect, precheck and replay dead letters",
    // The exit codes, from the one table (`crate::error::EXIT_CODES`): a
    // line with `-h`, when each with `--help` and in the manual page.
    after_help = crate::error::exit_codes_help(),
    after_long_help = crate::error::exit_codes_long_help()
)]
pub struct Cli {
    /// Planner gRPC endpoint: HOST:PORT (plain http) or an http:// or
    /// https:// URL [default: the profile's, else http://127.0.0.1:50051].
    #[arg(
        long,
        global = true,
        help_heading = "Global options",
        value_name = "URL",
        env = "REDRIVE_PLANNER",
        value_parser = parse_planner_url
    )]
    pub planner: Option<String>,

    /// Print machine-readable JSON on stdout instead of tables, and errors as
    /// JSON on stderr.
    #[arg(
        long,
        global = true,
        help_heading = "Global options",
        env = "REDRIVE_JSON",
        value_parser = FalseyValueParser::new(),
        action = ArgAction::SetTrue
    )]
    pub json: bool,

    /// Tables with every column and full values, however wide (default: fit
    /// the terminal, shortening long values with …).
    #[arg(long, global = true, help_heading = "Global options")]
    pub wide: bool,

    /// Who is calling, sent to the planner as `x-redrive-actor` metadata on
    /// every request [default: the profile's, else $USER, else anonymous].
    #[arg(
        long,
        global = true,
        help_heading = "Global options",
        value_name = "NAME",
        env = "REDRIVE_ACTOR",
        value_parser = parse_actor
    )]
    pub actor: Option<String>,

    /// PEM bundle of the CAs the planner's certificate must chain to, for an
    /// https:// planner [default: the platform's roots].
    #[arg(
        long,
        global = true,
        help_heading = "Global options",
        value_name = "FILE",
        env = "REDRIVE_CA"
    )]
    pub ca: Option<std::path::PathBuf>,

    /// PEM client certificate presented to an https:// planner (mutual TLS;
    /// needs --tls-client-key).
    #[arg(
        long,
        global = true,
        help_heading = "Global options",
        value_name = "FILE",
        env = "REDRIVE_TLS_CLIENT_CERT"
    )]
    pub tls_client_cert: Option<std::path::PathBuf>,

    /// PEM private key of --tls-client-cert.
    #[arg(
        long,
        global = true,
        help_heading = "Global options",
        value_name = "FILE",
        env = "REDRIVE_TLS_CLIENT_KEY"
    )]
    pub tls_client_key: Option<std::path::PathBuf>,

    /// A file holding the bearer token (a static token or a JWT) sent as
    /// `authorization: Bearer TOKEN` [default: $REDRIVE_TOKEN, if set].
    #[arg(
        long,
        global = true,
        help_heading = "Global options",
        value_name = "FILE",
        env = "REDRIVE_TOKEN_FILE"
    )]
    pub token_file: Option<std::path::PathBuf>,

    /// Sent as `idempotency-key` metadata with the command's one call that
    /// creates or changes something (precheck, plan create, approve,
    /// promote, pause, resume and cancel, dead-letters repair, archive,
    /// unarchive and rekey): a retry with the same key and the same
    /// flags within 24 hours gets the first call's answer instead of running
    /// again. 1 to 255 visible ASCII characters; one key per step of a job,
    /// e.g. "$RUN_ID:create".
    #[arg(
        long,
        global = true,
        help_heading = "Global options",
        value_name = "KEY",
        value_parser = parse_idempotency_key
    )]
    pub idempotency_key: Option<String>,

    /// The profile of the config file to use
    /// ($XDG_CONFIG_HOME/redrive/config.toml, else
    /// ~/.config/redrive/config.toml).
    #[arg(
        long,
        global = true,
        help_heading = "Global options",
        value_name = "NAME",
        env = "REDRIVE_PROFILE"
    )]
    pub profile: Option<String>,

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
    /// The audit log: signed checkpoints, proofs of what was replayed and
    /// who approved it, export and offline verification.
    #[command(subcommand)]
    Audit(audit::AuditCommand),
    /// Print a shell completion script: bash, zsh, fish, elvish or
    /// powershell.
    Completion(CompletionArgs),
    /// Print the manual page (roff), e.g. `redrivectl man > redrivectl.1`.
    Man,
    /// Read a bearer token from stdin and print its SHA-256 (hex), the
    /// `sha256` of the planner's `--token-file` entry for it.
    HashToken,
}

/// `completion` arguments.
#[derive(Debug, Clone, Args)]
#[command(after_help = "Install, e.g.:\n  \
    bash: redrivectl completion bash > ~/.local/share/bash-completion/completions/redrivectl\n  \
    zsh:  redrivectl completion zsh > ~/.zfunc/_redrivectl (with fpath+=~/.zfunc before compinit)\n  \
    fish: redrivectl completion fish > ~/.config/fish/completions/redrivectl.fish")]
pub struct CompletionArgs {
    /// The shell to complete for.
    #[arg(value_enum)]
    pub shell: Shell,
}

/// The SHA-256 of a bearer token, lowercase hex: what the planner's token
/// file holds for it (the planner hashes what it receives the same way).
pub fn hash_token(token: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(token.as_bytes()))
}

/// The commands whose call creates or changes something, which is what an
/// idempotency key goes with.
const KEYED_COMMANDS: &str = "it goes with precheck (a run), plan create, approve, promote, \
    pause, resume and cancel, and dead-letters repair, archive, unarchive and rekey";

impl Command {
    /// Why `--idempotency-key` cannot go with this command, if it cannot:
    /// the command changes nothing (reads need no key), `import` (idempotent
    /// per source and message id by itself), `replay` (see below), or a
    /// selector with `--since`,
    /// which each run counts back from its own clock, so that a retry would
    /// be another request under the same key, which the planner refuses
    /// (docs/api.md, "Idempotency keys").
    pub fn idempotency_key_problem(&self) -> Option<String> {
        use dead_letters::DeadLettersCommand as D;
        use plan::PlanCommand as P;
        let since = |selector: &crate::selector::SelectorArgs| {
            selector.since.is_some().then(|| {
                "--since counts back from each run's clock, so a retry would be another request \
                 under the same key (refused): give the window as --from TIME (RFC 3339)"
                    .to_owned()
            })
        };
        let reads = |names: &str| Some(format!("{names} change nothing; {KEYED_COMMANDS}"));
        match self {
            Self::Precheck(args) if args.command.is_none() => since(&args.run.selector),
            Self::Precheck(_) => reads("`precheck show` and `items`"),
            Self::Plan(P::Create(_) | P::Approve(_))
            | Self::Plan(P::Promote(_) | P::Pause(_) | P::Resume(_) | P::Cancel(_))
            | Self::DeadLetters(D::Repair(_)) => None,
            Self::DeadLetters(D::Archive(args) | D::Unarchive(args)) => since(&args.selector),
            Self::DeadLetters(D::Rekey(args)) => since(&args.target.selector),
            // Its call waits for the outcome (`--wait`, up to 10 minutes):
            // the planner lets a retry take over a key whose first call has
            // not answered in 10 minutes, and a kept `NOT_REPLAYED` would be
            // every retry's answer for a day.
            Self::Replay(_) => Some(
                "`replay` needs none: a second replay of a dead letter that was replayed finds \
                 it already replayed and publishes nothing, and a kept NOT_REPLAYED would answer \
                 every retry for 24 hours"
                    .to_owned(),
            ),
            Self::Import(_) => Some(
                "`import` needs none: a dead letter imported again is recognised by its source \
                 and message id and not stored twice"
                    .to_owned(),
            ),
            Self::Plan(_) => reads(
                "`plan status`, `list`, `watch`, `wait`, `report` and `compensations` (reads)",
            ),
            Self::DeadLetters(_) => reads("`dead-letters list`, `show` and `summary` (reads)"),
            Self::Audit(_) => Some(format!(
                "`audit` sends no call that changes something; {KEYED_COMMANDS}"
            )),
            Self::Completion(_) | Self::Man | Self::HashToken => {
                reads("`completion`, `man` and `hash-token`")
            }
        }
    }
}

impl Cli {
    /// The global flags that the config file's keys stand in for.
    pub fn flags(&self) -> config::Flags {
        config::Flags {
            keys: config::Profile {
                planner: self.planner.clone(),
                actor: self.actor.clone(),
                ca: self.ca.clone(),
                tls_client_cert: self.tls_client_cert.clone(),
                tls_client_key: self.tls_client_key.clone(),
                token_file: self.token_file.clone(),
            },
            profile: self.profile.clone(),
        }
    }

    /// The actor sent on every request: `--actor` / `REDRIVE_ACTOR`, else
    /// `profile_actor` (the config file's), else the `USER` environment
    /// variable, else `anonymous` ([`config::Flags::actor`]).
    pub fn actor(&self, profile_actor: Option<&str>) -> String {
        self.flags().actor(profile_actor)
    }
}

/// Writes what needs no planner, `completion`'s script or `man`'s page, and
/// answers whether `command` was one of those.
///
/// # Errors
/// When writing to `out` fails.
pub fn write_generated(command: &Command, out: &mut dyn Write) -> Result<bool, CliError> {
    let cli = || <Cli as clap::CommandFactory>::command();
    // Made in memory first: the generators panic when a write fails (a
    // closed pipe), `out` does not.
    let mut text = Vec::new();
    match command {
        Command::Completion(args) => {
            clap_complete::generate(args.shell, &mut cli(), "redrivectl", &mut text);
        }
        Command::Man => clap_mangen::Man::new(cli()).render(&mut text)?,
        Command::HashToken => {
            let mut token = String::new();
            std::io::stdin().read_line(&mut token)?;
            let token = token.trim();
            if token.is_empty() {
                return Err(CliError::Usage(
                    "hash-token reads the token from stdin, e.g. printf %s \"$TOKEN\" | \
                     redrivectl hash-token"
                        .to_owned(),
                ));
            }
            writeln!(text, "{}", hash_token(token))?;
        }
        _ => return Ok(false),
    }
    out.write_all(&text)?;
    Ok(true)
}

/// Runs the command `cli` names, writing its output to `out`; the `Ok` value is
/// the exit code (0 unless a command says otherwise). `plan watch` draws
/// a progress bar when stdout is a terminal. Tables are laid out for the
/// terminal's width ([`crate::table`]), or in full with `--wide`.
///
/// # Errors
/// Whatever ends the command early; [`CliError::exit_code`] says how to exit.
pub async fn run(cli: Cli, out: &mut dyn Write) -> Result<u8, CliError> {
    if cli.idempotency_key.is_some()
        && let Some(problem) = cli.command.idempotency_key_problem()
    {
        return Err(CliError::Usage(format!("--idempotency-key: {problem}")));
    }
    if write_generated(&cli.command, out)? {
        return Ok(crate::error::EX_OK);
    }
    let settings = config::Settings::resolve(&cli.flags())?;
    let credentials = settings.credentials.clone();
    // With credentials the planner knows who calls: the actor is sent only
    // when named (a delegating portal naming its user), never from $USER.
    let actor = (!credentials.present() || settings.actor_given).then_some(settings.actor);
    let actor = actor.as_deref();
    let planner_url = settings.planner;
    // Human output escapes control characters from dead letters
    // ([`crate::escape`]); only the live progress bar writes its own.
    let tty = std::io::stdout().is_terminal();
    crate::table::set_width(crate::table::width_for(
        cli.wide,
        if tty {
            crate::output::terminal_width()
        } else {
            None
        },
        std::env::var("COLUMNS").ok().as_deref(),
    ));
    let live_bar =
        tty && !cli.json && matches!(&cli.command, Command::Plan(plan::PlanCommand::Watch(_)));
    // `plan report --format jsonl|csv` into a file or pipe is the planner's
    // export byte for byte, whatever `--json` says; on a terminal it is
    // escaped too.
    let export = !tty
        && matches!(
            &cli.command,
            Command::Plan(plan::PlanCommand::Report(plan::ReportArgs {
                format: Some(plan::ReportFormat::Jsonl | plan::ReportFormat::Csv),
                ..
            }))
        );
    // Flags typed on the command line come along in suggested commands; a
    // value from the environment is still there for the next command.
    let typed = |value: &Option<String>, variable: &str, normalize: fn(&str) -> Option<String>| {
        let from_env = std::env::var(variable).ok().and_then(|env| normalize(&env));
        value
            .clone()
            .filter(|value| from_env.as_ref() != Some(value))
    };
    let prefix = crate::hint::prefix(
        typed(&cli.profile, "REDRIVE_PROFILE", |text| {
            Some(text.to_owned())
        })
        .as_deref(),
        typed(&cli.planner, "REDRIVE_PLANNER", |text| {
            parse_planner_url(text).ok()
        })
        .as_deref(),
    );
    let url = planner_url.clone();
    let ca_given = credentials.tls.ca.is_some();
    let result = crate::hint::scope(
        prefix,
        run_command(
            cli,
            out,
            tty,
            live_bar,
            export,
            planner_url,
            actor,
            credentials,
        ),
    )
    .await;
    match result {
        Ok(code) => Ok(code),
        Err(error) => Err(client::explain_tls(error, &url, ca_given).await),
    }
}

/// [`run`] once the settings are known: the command itself.
#[allow(clippy::too_many_arguments)]
async fn run_command(
    cli: Cli,
    out: &mut dyn Write,
    tty: bool,
    live_bar: bool,
    export: bool,
    planner_url: String,
    actor: Option<&str>,
    credentials: client::Credentials,
) -> Result<u8, CliError> {
    let mut escaping;
    let out: &mut dyn Write = if cli.json || live_bar || export {
        out
    } else {
        escaping = crate::escape::Escaping::new(out);
        &mut escaping
    };
    let key = cli.idempotency_key.clone();
    let key = key.as_deref();
    match cli.command {
        Command::DeadLetters(command) => {
            let command = command.read_input()?;
            let mut planner = client::connect(&planner_url, actor, &credentials, key).await?;
            dead_letters::run(&mut planner, command, cli.json, out).await
        }
        Command::Import(args) => {
            // The file first: a typo in its name should not wait on the network.
            let input = import::open(&args.file)?;
            let mut planner = client::connect(&planner_url, actor, &credentials, key).await?;
            import::run(&mut planner, args, input, cli.json, out).await
        }
        Command::Precheck(args) => {
            // Flag checks clap cannot do (a --stale-after pattern given twice)
            // before the network.
            let command = args.into_command()?;
            let mut planner = client::connect(&planner_url, actor, &credentials, key).await?;
            precheck::run(&mut planner, command, cli.json, out).await
        }
        Command::Plan(command) => {
            let mut planner = client::connect(&planner_url, actor, &credentials, key).await?;
            plan::run(&mut planner, command, cli.json, tty, out).await
        }
        Command::Replay(args) => {
            let mut planner = client::connect(&planner_url, actor, &credentials, key).await?;
            replay::run(&mut planner, args, cli.json, out).await
        }
        Command::Audit(command) if command.offline() => audit::run_offline(command, cli.json, out),
        Command::Audit(command) => {
            let mut planner = client::connect(&planner_url, actor, &credentials, key).await?;
            audit::run(&mut planner, command, cli.json, out).await
        }
        Command::Completion(_) | Command::Man | Command::HashToken => Ok(crate::error::EX_OK),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("redrivectl").chain(args.iter().copied()))
    }

    #[test]
    fn tokens_hash_as_sha256sum_does() {
        // printf %s s3cret | sha256sum
        assert_eq!(
            hash_token("s3cret"),
            "1ec1c26b50d5d3c58d9583181af8076655fe00756bf7285940ba3670f99fcba0"
        );
    }

    /// The `redrivectl` command lines in the code spans and blocks of
    /// `text` (markdown): from each `redrivectl` on, up to the end of its
    /// line.
    fn command_lines(text: &str) -> Vec<String> {
        let mut code = Vec::new();
        let mut fenced = false;
        for line in text.lines() {
            if line.trim_start().starts_with("```") {
                fenced = !fenced;
                continue;
            }
            if fenced {
                code.push(line.to_owned());
            } else {
                // Inline spans: every other piece between backticks.
                code.extend(line.split('`').skip(1).step_by(2).map(str::to_owned));
            }
        }
        code.iter()
            .flat_map(|span| {
                span.match_indices("redrivectl ")
                    .map(|(at, _)| span[at..].to_owned())
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    /// The subcommand path a command line names (`["plan", "promote"]`),
    /// each `a|b` alternative spelled out, or what in it is not a command.
    fn command_paths(line: &str) -> Result<Vec<Vec<String>>, String> {
        use clap::CommandFactory;
        let root = Cli::command();
        let mut words = line.split_whitespace().skip(1).peekable();
        let mut paths: Vec<(Vec<String>, clap::Command)> = vec![(Vec::new(), root.clone())];
        while let Some(word) = words.next() {
            if word.starts_with('[') {
                // `[global flags]`: skip to its end.
                let mut word = word;
                while !word.ends_with(']') {
                    match words.next() {
                        Some(next) => word = next,
                        None => break,
                    }
                }
                continue;
            }
            if let Some(flag) = word.strip_prefix("--") {
                let takes_value = root
                    .get_arguments()
                    .find(|arg| arg.get_long() == Some(flag))
                    .is_some_and(|arg| arg.get_action().takes_values());
                if takes_value {
                    words.next();
                }
                continue;
            }
            let is_word = |part: &str| {
                !part.is_empty() && part.chars().all(|c| c.is_ascii_lowercase() || c == '-')
            };
            if !word.split('|').all(is_word) {
                break;
            }
            let mut next = Vec::new();
            for (path, command) in &paths {
                if !command.has_subcommands() {
                    // A positional value (`completion bash`, `import FILE`).
                    next.push((path.clone(), command.clone()));
                    continue;
                }
                for part in word.split('|') {
                    let sub = command
                        .get_subcommands()
                        .find(|sub| {
                            sub.get_name() == part || sub.get_all_aliases().any(|a| a == part)
                        })
                        .ok_or_else(|| format!("`{} {part}` is not a command", path.join(" ")))?;
                    let mut path = path.clone();
                    path.push(part.to_owned());
                    next.push((path, sub.clone()));
                }
            }
            paths = next;
        }
        Ok(paths.into_iter().map(|(path, _)| path).collect())
    }

    /// The pages a reader follows: README.md, cli/USAGE.md and docs/*.md.
    fn doc_pages() -> Vec<std::path::PathBuf> {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut pages = vec![root.join("README.md"), root.join("cli/USAGE.md")];
        pages.extend(
            std::fs::read_dir(root.join("docs"))
                .unwrap()
                .map(|entry| entry.unwrap().path())
                .filter(|path| path.extension().is_some_and(|ext| ext == "md")),
        );
        pages
    }

    /// Every relative link of the docs (README, cli/USAGE.md, docs/*.md)
    /// leads to a file or folder of the repository: a link is resolved from
    /// the page's own folder, so `docs/cli.md` reaches the CLI's manual as
    /// `../cli/USAGE.md`.
    #[test]
    fn every_relative_link_in_the_docs_resolves() {
        let pages = doc_pages();
        let mut checked = 0;
        let mut broken = Vec::new();
        for page in &pages {
            let text = std::fs::read_to_string(page).unwrap();
            let folder = page.parent().unwrap();
            for (at, _) in text.match_indices("](") {
                let rest = &text[at + 2..];
                let Some(end) = rest.find([')', ' ', '\n']) else {
                    continue;
                };
                let target = rest[..end].split('#').next().unwrap_or_default();
                if target.is_empty() || target.contains("://") || target.starts_with("mailto:") {
                    continue;
                }
                checked += 1;
                if !folder.join(target).exists() {
                    broken.push(format!("{}: {target}", page.display()));
                }
            }
        }
        assert!(
            broken.is_empty(),
            "links that lead nowhere:\n{}",
            broken.join("\n")
        );
        assert!(checked > 50, "only {checked} relative links found");
    }

    /// Every command the docs name exists: a reader copying one gets its
    /// help, not "unrecognized subcommand".
    #[test]
    fn every_command_the_docs_name_exists() {
        let pages = doc_pages();
        let mut checked = 0;
        let mut wrong = Vec::new();
        for page in &pages {
            let text = std::fs::read_to_string(page).unwrap();
            for line in command_lines(&text) {
                match command_paths(&line) {
                    Ok(paths) => {
                        for path in paths.into_iter().filter(|path| !path.is_empty()) {
                            let mut args = vec!["redrivectl".to_owned()];
                            args.extend(path.iter().cloned());
                            args.push("--help".to_owned());
                            let error = Cli::try_parse_from(&args).unwrap_err();
                            assert_eq!(
                                error.kind(),
                                clap::error::ErrorKind::DisplayHelp,
                                "{}: {args:?}",
                                page.display()
                            );
                            checked += 1;
                        }
                    }
                    Err(error) => wrong.push(format!("{}: {line}: {error}", page.display())),
                }
            }
        }
        assert!(
            wrong.is_empty(),
            "commands the docs name that do not exist:\n{}",
            wrong.join("\n")
        );
        assert!(checked > 100, "only {checked} command lines found");
        // The check itself catches a command that does not exist.
        assert_eq!(
            command_paths("redrivectl dead-letters replay 42"),
            Err("`dead-letters replay` is not a command".to_owned())
        );
        assert_eq!(
            command_paths("redrivectl --profile prod plan promote|cancel PLAN").unwrap(),
            [vec!["plan", "promote"], vec!["plan", "cancel"]]
        );
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
        assert_eq!(cli.planner.as_deref(), Some("http://p:1"));
        // HOST:PORT alone means plain http, as in grpcurl.
        let cli = parse(&["--planner", "localhost:50051", "dead-letters", "list"]).unwrap();
        assert_eq!(cli.planner.as_deref(), Some("http://localhost:50051"));
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
        assert_eq!(cli.actor(None), "bob");
        assert!(parse(&["plan"]).unwrap_err().use_stderr());
    }

    #[test]
    fn the_actor_flag_wins_over_user() {
        let cli = parse(&["--actor", " alice ", "dead-letters", "list"]).unwrap();
        assert_eq!(cli.actor(Some("carol")), "alice");
    }

    #[test]
    fn usage_errors_are_errors_and_help_is_not() {
        for args in [
            &["dead-letters"][..],
            &["import", "f.jsonl"],
            &["import", "f.jsonl", "--source", "x", "--batch", "0"],
            &["dead-letters", "list", "--page-size", "5000"],
            &["--planner", "ftp://localhost:50051", "dead-letters", "list"],
            &["completion", "tcsh"],
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

    fn cli_flags(args: &[&str]) -> config::Flags {
        Cli::try_parse_from(
            ["redrivectl"]
                .iter()
                .chain(args)
                .chain(&["dead-letters", "list"]),
        )
        .unwrap()
        .flags()
    }

    fn file(text: &str) -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.toml");
        std::fs::write(&path, text).unwrap();
        (dir, path)
    }

    const FILE: &str = r#"
planner = "127.0.0.1:7000"
actor = "alice"

[profiles.prod]
planner = "https://planner.prod:443"

[profiles.staging]
planner = "staging:50051"
actor = "alice-staging"
"#;

    #[test]
    fn profiles_then_top_level_then_defaults() {
        let (_dir, path) = file(FILE);
        let top = config::Settings::from_file(&cli_flags(&[]), Some(&path)).unwrap();
        assert_eq!(top.planner, "http://127.0.0.1:7000");
        assert_eq!(top.actor, "alice");
        let prod =
            config::Settings::from_file(&cli_flags(&["--profile", "prod"]), Some(&path)).unwrap();
        assert_eq!(prod.planner, "https://planner.prod:443");
        assert_eq!(prod.actor, "alice");
        let staging =
            config::Settings::from_file(&cli_flags(&["--profile", "staging"]), Some(&path))
                .unwrap();
        assert_eq!(
            (staging.planner.as_str(), staging.actor.as_str()),
            ("http://staging:50051", "alice-staging")
        );
        let none = config::Settings::from_file(&cli_flags(&[]), None).unwrap();
        assert_eq!(none.planner, client::DEFAULT_PLANNER);
    }

    #[test]
    fn flags_win_over_the_file() {
        let (_dir, path) = file(FILE);
        let settings = config::Settings::from_file(
            &cli_flags(&[
                "--profile",
                "staging",
                "--planner",
                "other:1",
                "--actor",
                "bob",
            ]),
            Some(&path),
        )
        .unwrap();
        assert_eq!(
            (settings.planner.as_str(), settings.actor.as_str()),
            ("http://other:1", "bob")
        );
    }

    #[test]
    fn credentials_come_from_flags_then_the_profile_then_the_top_level() {
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("prod.token");
        std::fs::write(&token, "s3cret\n").unwrap();
        let text = format!(
            "ca = \"/etc/top-ca.pem\"\n\n[profiles.prod]\nplanner = \"https://p:443\"\n\
             token_file = {token:?}\ntls_client_cert = \"/etc/me.pem\"\n\
             tls_client_key = \"/etc/me.key\"\n"
        );
        let (_dir, path) = file(&text);
        let prod =
            config::Settings::from_file(&cli_flags(&["--profile", "prod"]), Some(&path)).unwrap();
        assert_eq!(prod.credentials.token.as_deref(), Some("s3cret"));
        assert_eq!(
            prod.credentials.tls.ca.as_deref(),
            Some(std::path::Path::new("/etc/top-ca.pem"))
        );
        assert_eq!(
            prod.credentials.tls.client_cert.as_deref(),
            Some(std::path::Path::new("/etc/me.pem"))
        );
        assert!(prod.credentials.present());
        let flagged = config::Settings::from_file(
            &cli_flags(&["--profile", "prod", "--ca", "/etc/flag-ca.pem"]),
            Some(&path),
        )
        .unwrap();
        assert_eq!(
            flagged.credentials.tls.ca.as_deref(),
            Some(std::path::Path::new("/etc/flag-ca.pem"))
        );
        let top = config::Settings::from_file(&cli_flags(&[]), Some(&path)).unwrap();
        assert!(!top.credentials.present());
        std::fs::write(&token, " \n").unwrap();
        let error = config::Settings::from_file(&cli_flags(&["--profile", "prod"]), Some(&path))
            .unwrap_err();
        assert!(error.to_string().contains("is empty"), "{error}");
    }

    #[test]
    fn config_errors_name_the_file() {
        let (_dir, path) = file(FILE);
        let error =
            config::Settings::from_file(&cli_flags(&["--profile", "qa"]), Some(&path)).unwrap_err();
        assert_eq!(error.exit_code(), crate::error::EX_CONFIG);
        let text = error.to_string();
        assert!(text.contains("config.toml"), "{text}");
        assert!(text.contains("profiles: prod, staging"), "{text}");

        let (_dir, bad) = file("planner = \"ftp://x:1\"\n");
        let error = config::Settings::from_file(&cli_flags(&[]), Some(&bad)).unwrap_err();
        assert!(error.to_string().contains("planner:"), "{error}");
        let (_dir, unknown) = file("plannr = \"x:1\"\n");
        let error = config::Settings::from_file(&cli_flags(&[]), Some(&unknown)).unwrap_err();
        assert!(error.to_string().contains("plannr"), "{error}");
        // No file is fine, but not when a profile is asked for.
        let missing = std::path::Path::new("/nonexistent/redrive/config.toml");
        assert!(config::Settings::from_file(&cli_flags(&[]), Some(missing)).is_ok());
        assert!(
            config::Settings::from_file(&cli_flags(&["--profile", "prod"]), Some(missing)).is_err()
        );
    }

    #[test]
    fn an_idempotency_key_is_checked_as_the_planner_checks_it() {
        let long = "k".repeat(256);
        for bad in ["", "a b", "clé", long.as_str(), "tab\there"] {
            let error = parse(&[
                "--idempotency-key",
                bad,
                "plan",
                "cancel",
                "p",
                "--reason",
                "r",
            ])
            .expect_err(bad)
            .to_string();
            assert!(error.contains("--idempotency-key"), "{bad:?}: {error}");
        }
        let max = "k".repeat(255);
        for good in ["run-1:create", "a", max.as_str(), "{{run_id}}/approve"] {
            let cli = parse(&[
                "plan",
                "cancel",
                "p",
                "--reason",
                "r",
                "--idempotency-key",
                good,
            ])
            .unwrap();
            assert_eq!(cli.idempotency_key.as_deref(), Some(good));
        }
    }

    #[test]
    fn an_idempotency_key_goes_with_the_commands_that_change_something() {
        let problem = |line: &str| {
            let args: Vec<&str> = line.split(' ').collect();
            parse(&args).unwrap().command.idempotency_key_problem()
        };
        for changes in [
            "precheck --source q --from 2026-12-01T00:00:00Z",
            "plan create --precheck p --rate 1 --burst 1 --rationale r",
            "plan approve p --digest d",
            "plan promote p --reason r",
            "plan pause p --reason r",
            "plan resume p --reason r",
            "plan cancel p --reason r",
            "dead-letters repair 7 --body-file f --reason r",
            "dead-letters archive --source q --reason r",
            "dead-letters rekey --source q --reason r",
        ] {
            assert_eq!(problem(changes), None, "{changes}");
        }
        for (line, says) in [
            ("plan list", "change nothing"),
            ("plan wait p", "change nothing"),
            ("dead-letters list", "change nothing"),
            ("precheck show p", "change nothing"),
            ("man", "change nothing"),
            ("audit checkpoint", "sends no call that changes something"),
            ("replay d --reason r", "`replay` needs none"),
            ("import f.jsonl --source s", "`import` needs none"),
            ("precheck --source q --since 2h", "--from TIME"),
            (
                "dead-letters unarchive --source q --since 2h --reason r",
                "--from TIME",
            ),
            (
                "dead-letters rekey --source q --since 2h --reason r",
                "--from TIME",
            ),
        ] {
            let problem = problem(line).unwrap_or_default();
            assert!(problem.contains(says), "{line}: {problem:?}");
        }
    }
}
