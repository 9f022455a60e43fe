//! `redrive-planner`: parses the configuration, starts logging, wires SIGINT and
//! SIGTERM to a cancellation token ([`start_service`]), binds `--listen` and runs
//! [`redrive_planner::run`].

use std::process::ExitCode;

use redrive_planner::Config;
use redrive_proto::{
    settings::{EX_USAGE, run_failure_code},
    telemetry::start_service,
};

#[tokio::main]
async fn main() -> ExitCode {
    let (config, logging, shutdown) =
        match start_service::<Config>("redrive-planner", std::env::args_os()) {
            Ok(started) => started,
            Err(code) => return code,
        };
    let listener = match redrive_planner::bind(config.listen) {
        Ok(listener) => listener,
        Err(error) => {
            eprintln!(
                "redrive-planner: invalid setting --listen: cannot bind {}: {error}",
                config.listen
            );
            return ExitCode::from(EX_USAGE);
        }
    };
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
