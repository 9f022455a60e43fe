//! `redrivectl`: parses the command line and runs [`redrivectl::run`] on a
//! single-threaded runtime; exit codes are in [`redrivectl::error`].

use std::{
    io::{self, BufWriter, Write},
    process::ExitCode,
};

use clap::Parser;
use redrivectl::{
    Cli,
    error::{CliError, EX_FAILURE, EX_OK, EX_USAGE},
};

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => {
            let _ = error.print();
            // --help and --version are not errors.
            return ExitCode::from(if error.use_stderr() { EX_USAGE } else { EX_OK });
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("redrivectl: cannot start the async runtime: {error}");
            return ExitCode::from(EX_FAILURE);
        }
    };
    let stdout = io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    let result = runtime
        .block_on(redrivectl::run(cli, &mut out))
        .and_then(|code| out.flush().map(|()| code).map_err(CliError::from));
    match result {
        Ok(code) => ExitCode::from(code),
        // `redrivectl ... | head`: the reader has what it wanted.
        Err(error) if error.is_broken_pipe() => ExitCode::from(EX_OK),
        Err(error) => {
            let _ = out.flush();
            eprintln!("redrivectl: {error}");
            ExitCode::from(error.exit_code())
        }
    }
}
