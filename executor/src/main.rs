//! `redrive-executor`: parses the configuration, starts logging, wires SIGINT
//! and SIGTERM to a cancellation token and runs [`redrive_executor::run`].

use std::process::ExitCode;

use clap::Parser;
use redrive_executor::Config;
use tokio_util::sync::CancellationToken;
use tracing_subscriber::EnvFilter;

/// Exit code for a bad setting (sysexits.h `EX_USAGE`).
const EX_USAGE: u8 = 64;

#[tokio::main]
async fn main() -> ExitCode {
    let config = match Config::try_parse() {
        Ok(config) => config,
        Err(error) if !error.use_stderr() => {
            let _ = error.print();
            return ExitCode::SUCCESS;
        }
        Err(error) => {
            let _ = error.print();
            return ExitCode::from(EX_USAGE);
        }
    };
    if let Err(error) = config.validate() {
        eprintln!("redrive-executor: {error}");
        return ExitCode::from(EX_USAGE);
    }
    let filter = EnvFilter::try_from_env("REDRIVE_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(filter)
        .init();
    let shutdown = CancellationToken::new();
    let signal_shutdown = shutdown.clone();
    tokio::spawn(async move {
        let mut terminate =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                .expect("installing the SIGTERM handler");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = terminate.recv() => {}
        }
        signal_shutdown.cancel();
    });
    match redrive_executor::run(config, shutdown).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("redrive-executor: {error:#}");
            ExitCode::FAILURE
        }
    }
}
