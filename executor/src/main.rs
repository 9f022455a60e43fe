//! `redrive-executor`: parses the configuration, starts logging, wires SIGINT
//! and SIGTERM to a cancellation token ([`start_service`]) and runs
//! [`redrive_executor::run`].

use std::process::ExitCode;

use redrive_executor::Config;
use redrive_proto::{settings::run_failure_code, telemetry::start_service};

#[tokio::main]
async fn main() -> ExitCode {
    let (config, logging, shutdown) =
        match start_service::<Config>("redrive-executor", std::env::args_os()) {
            Ok(started) => started,
            Err(code) => return code,
        };
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
