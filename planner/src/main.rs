//! `redrive-planner`: parses the configuration, starts logging, wires SIGINT and
//! SIGTERM to a cancellation token and runs [`redrive_planner::run`].

use std::process::ExitCode;

use redrive_planner::Config;
use redrive_proto::{
    settings::{EX_USAGE, parse_or_exit, run_failure_code},
    telemetry::{Logging, cancel_on_signal},
};
use tokio_util::sync::CancellationToken;

#[tokio::main]
async fn main() -> ExitCode {
    let config = match parse_or_exit::<Config>("redrive-planner", std::env::args_os(), |config| {
        config.clone().with_secret_files()?.validate()
    }) {
        Ok(config) => config,
        Err(code) => return code,
    };
    // Checked above: the files were readable a moment ago.
    let config = match config.with_secret_files() {
        Ok(config) => config,
        Err(problems) => {
            eprintln!("redrive-planner: {problems}");
            return ExitCode::from(EX_USAGE);
        }
    };
    let logging = match Logging::start(
        "redrive-planner",
        config.log_json,
        config.otlp_endpoint.as_deref(),
    ) {
        Ok(logging) => logging,
        Err(code) => return code,
    };

    let listener = match tokio::net::TcpListener::bind(config.listen).await {
        Ok(listener) => listener,
        Err(error) => {
            eprintln!(
                "redrive-planner: invalid setting --listen: cannot bind {}: {error}",
                config.listen
            );
            return ExitCode::from(EX_USAGE);
        }
    };
    let shutdown = CancellationToken::new();
    tokio::spawn(cancel_on_signal(shutdown.clone()));
    let code = match redrive_planner::run(config, listener, shutdown).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!(error = format!("{error:#}"), "planner failed");
            let code = run_failure_code(&error);
            if code == ExitCode::from(EX_USAGE) {
                // A usage error goes where the parsing ones go, too.
                eprintln!("redrive-planner: {error:#}");
            }
            code
        }
    };
    logging.finish().await;
    code
}
