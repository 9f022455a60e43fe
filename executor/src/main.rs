//! `redrive-executor`: parses the configuration, starts logging, wires SIGINT
//! and SIGTERM to a cancellation token and runs [`redrive_executor::run`].

use std::process::ExitCode;

use redrive_executor::Config;
use redrive_proto::{
    settings::{EX_USAGE, parse_or_exit, run_failure_code},
    telemetry::{Logging, cancel_on_signal},
};
use tokio_util::sync::CancellationToken;

#[tokio::main]
async fn main() -> ExitCode {
    let config = match parse_or_exit::<Config>("redrive-executor", std::env::args_os(), |config| {
        config.clone().with_secret_files()?.validate()
    }) {
        Ok(config) => config,
        Err(code) => return code,
    };
    // Checked above: the files were readable a moment ago.
    let config = match config.with_secret_files() {
        Ok(config) => config,
        Err(problems) => {
            eprintln!("redrive-executor: {problems}");
            return ExitCode::from(EX_USAGE);
        }
    };
    let logging = match Logging::start(
        "redrive-executor",
        config.log_json,
        config.otlp_endpoint.as_deref(),
    ) {
        Ok(logging) => logging,
        Err(code) => return code,
    };
    let shutdown = CancellationToken::new();
    tokio::spawn(cancel_on_signal(shutdown.clone()));
    let code = match redrive_executor::run(config, shutdown).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("redrive-executor: {error:#}");
            run_failure_code(&error)
        }
    };
    logging.finish().await;
    code
}
