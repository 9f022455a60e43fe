//! The `redrivectl` binary's body ([`main_with_args`]): parse, run on a
//! single-threaded runtime, exit codes; `main.rs` calls it.

use std::{
    ffi::OsString,
    io::{self, BufWriter, Write},
    process::ExitCode,
};

use clap::Parser;

use crate::{
    Cli,
    error::{CliError, EX_FAILURE, EX_OK, EX_USAGE, error_json},
};

/// The `redrivectl` binary: parses `args` (as [`std::env::args_os`] gives
/// them, the program's name first) and runs [`crate::run`] on a
/// single-threaded runtime, writing to stdout; exit codes are in
/// [`crate::error`]. With `--json` (or `REDRIVE_JSON`) errors go to stderr as
/// JSON ([`error_json`]), usage errors included; otherwise they read
/// `redrivectl: ...`.
pub fn main_with_args(args: impl IntoIterator<Item = OsString>) -> ExitCode {
    let args: Vec<OsString> = args.into_iter().collect();
    let cli = match Cli::try_parse_from(&args) {
        Ok(cli) => cli,
        Err(error) => {
            // --help and --version are not errors.
            if !error.use_stderr() {
                let _ = error.print();
                return ExitCode::from(EX_OK);
            }
            let json = wants_json(
                args.into_iter().skip(1),
                std::env::var("REDRIVE_JSON").ok().as_deref(),
            );
            if json {
                eprintln!("{}", error_json("usage", &usage_message(&error)));
            } else {
                eprint!("{}", without_global_flags(&error.render().to_string()));
            }
            return ExitCode::from(EX_USAGE);
        }
    };
    let json = cli.json;
    let report = |error: &CliError| {
        if json {
            eprintln!("{}", error_json(error.code(), &error.message()));
        } else {
            eprintln!("redrivectl: {error}");
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            report(&CliError::io("cannot start the async runtime", error));
            return ExitCode::from(EX_FAILURE);
        }
    };
    let stdout = io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    let result = runtime
        .block_on(crate::run(cli, &mut out))
        .and_then(|code| out.flush().map(|()| code).map_err(CliError::from));
    match result {
        Ok(code) => ExitCode::from(code),
        // `redrivectl ... | head`: the reader has what it wanted.
        Err(error) if error.is_broken_pipe() => ExitCode::from(EX_OK),
        Err(error) => {
            let _ = out.flush();
            report(&error);
            ExitCode::from(error.exit_code())
        }
    }
}

/// Whether a command line clap refused asked for JSON: `--json` among the
/// arguments (before a `--`), or `REDRIVE_JSON` set, as clap reads it, to
/// anything but empty, `0`, `false`, `no`, `off`, `n` or `f`.
fn wants_json(args: impl Iterator<Item = OsString>, env: Option<&str>) -> bool {
    let flag = args
        .take_while(|arg| arg != "--")
        .any(|arg| arg == "--json" || arg == "--json=true");
    let env = env.is_some_and(|value| {
        !matches!(
            value.trim().to_ascii_lowercase().as_str(),
            "" | "0" | "false" | "no" | "off" | "n" | "f"
        )
    });
    flag || env
}

/// The global flags as clap writes them in a usage line.
const GLOBAL_FLAGS: [&str; 10] = [
    " --planner <URL>",
    " --actor <NAME>",
    " --ca <FILE>",
    " --tls-client-cert <FILE>",
    " --tls-client-key <FILE>",
    " --token-file <FILE>",
    " --profile <NAME>",
    " --idempotency-key <KEY>",
    " --json",
    " --wide",
];

/// A usage error's text with the global flags left out of its `Usage:` line:
/// clap lists every flag that has a value there, so `--planner <URL>` from
/// `REDRIVE_PLANNER` read as if the command needed it.
fn without_global_flags(text: &str) -> String {
    text.split_inclusive('\n')
        .map(|line| {
            if line.starts_with("Usage: ") {
                GLOBAL_FLAGS
                    .iter()
                    .fold(line.to_owned(), |line, flag| line.replace(flag, ""))
            } else {
                line.to_owned()
            }
        })
        .collect()
}

/// Clap's complaint without `error: ` and without the usage and help lines
/// that follow it.
fn usage_message(error: &clap::Error) -> String {
    let text = without_global_flags(&error.render().to_string());
    let first = text.split("\n\n").next().unwrap_or_default();
    first
        .strip_prefix("error: ")
        .unwrap_or(first)
        .trim()
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_lines_leave_out_the_global_flags() {
        assert_eq!(
            without_global_flags(
                "error: missing\n\nUsage: redrivectl plan approve --digest <DIGEST> --planner <URL> --json <ID>\n"
            ),
            "error: missing\n\nUsage: redrivectl plan approve --digest <DIGEST> <ID>\n"
        );
    }

    #[test]
    fn json_is_asked_for_by_flag_or_environment() {
        let args = |list: &[&str]| {
            list.iter()
                .map(OsString::from)
                .collect::<Vec<_>>()
                .into_iter()
        };
        assert!(wants_json(args(&["plan", "--json"]), None));
        assert!(!wants_json(args(&["plan", "--", "--json"]), None));
        assert!(wants_json(args(&["plan"]), Some("1")));
        assert!(!wants_json(args(&["plan"]), Some("0")));
        assert!(!wants_json(args(&["plan"]), Some("")));
        assert!(wants_json(args(&["plan"]), Some("yes")));
        assert!(!wants_json(args(&["plan"]), None));
    }
}
