//! `redrive-planner`: parses the configuration, starts logging, wires SIGINT and
//! SIGTERM to a cancellation token and runs [`redrive_planner::run`].

use std::process::ExitCode;

use redrive_planner::Config;
use redrive_proto::settings::{EX_USAGE, parse_or_exit};
use tokio_util::sync::CancellationToken;
use tracing_subscriber::EnvFilter;

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
    let filter = EnvFilter::try_from_env("REDRIVE_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    let tracer = match redrive_proto::telemetry::init_subscriber(
        "redrive-planner",
        filter,
        config.log_json,
        config.otlp_endpoint.as_deref(),
    ) {
        Ok(tracer) => tracer,
        Err(error) => {
            eprintln!("redrive-planner: invalid setting --otlp-endpoint: {error}");
            return ExitCode::from(EX_USAGE);
        }
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
            // A setting found wrong only when used (an address that cannot
            // be bound) is a usage error, as at parsing.
            if error.to_string().starts_with("invalid setting") {
                eprintln!("redrive-planner: {error:#}");
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

async fn cancel_on_signal(shutdown: CancellationToken) {
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("installing the SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate.recv() => {}
    }
    tracing::info!("shutdown requested");
    shutdown.cancel();
}
