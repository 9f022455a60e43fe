//! `redrive-executor`: parses the configuration, starts logging, wires SIGINT
//! and SIGTERM to a cancellation token and runs [`redrive_executor::run`].

use std::process::ExitCode;

use redrive_executor::Config;
use redrive_proto::settings::{EX_USAGE, parse_or_exit};
use tokio_util::sync::CancellationToken;
use tracing_subscriber::EnvFilter;

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
    let filter = EnvFilter::try_from_env("REDRIVE_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    let tracer = match redrive_proto::telemetry::init_subscriber(
        "redrive-executor",
        filter,
        config.log_json,
        config.otlp_endpoint.as_deref(),
    ) {
        Ok(tracer) => tracer,
        Err(error) => {
            eprintln!("redrive-executor: invalid setting --otlp-endpoint: {error}");
            return ExitCode::from(EX_USAGE);
        }
    };
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
    let code = match redrive_executor::run(config, shutdown).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("redrive-executor: {error:#}");
            // A setting found wrong only when used (an address that cannot
            // be bound) is a usage error, as at parsing.
            if error.to_string().starts_with("invalid setting") {
                ExitCode::from(EX_USAGE)
            } else {
                ExitCode::FAILURE
            }
        }
    };
    if let Some(tracer) = tracer {
        // The batch processor's last export blocks: off the runtime.
        let _ = tokio::task::spawn_blocking(move || tracer.shutdown()).await;
    }
    code
}
