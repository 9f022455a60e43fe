//! `redrive-demo`: Redrive's main job on this machine's local services, with
//! the real binaries as separate processes (run by `scripts/demo.sh`).
//!
//! It sets up an order-fulfilment topology and business state, makes a real
//! incident (2,050 dead letters made by RabbitMQ), starts the planner, two
//! executors and the example state-check hook, captures and prechecks, then
//! replays: plan at 200/s with its rationale, approval with the digest, the
//! canary wave, a 5 s observation, the main wave with a live progress view,
//! and the audit report. It checks its own result (see
//! [`redrive_tests::scenario`]) and exits 1 when a check fails, leaves no
//! process running and can run again.

use std::process::ExitCode;

use clap::Parser;
use redrive_tests::scenario::{self, ScenarioConfig, Shape};

/// Flags.
#[derive(Debug, Parser)]
#[command(
    name = "redrive-demo",
    about = "Redrive's main job: a dead-letter incident replayed end to end"
)]
struct Args {
    /// The end-to-end test's smaller incident (345 dead letters) instead of
    /// the full one (2,050).
    #[arg(long)]
    small: bool,
    /// SIGKILL one executor a third into the main wave and start another (the
    /// audit then marks what it held `uncertain`).
    #[arg(long)]
    kill_executor: bool,
    /// After the run, keep the planner up and print the operator console's
    /// address and two sign-in tokens (an operator, an approver); Ctrl-C stops
    #[arg(long)]
    console: bool,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    let started = std::time::Instant::now();
    let bin_dir = match scenario::profile_dir() {
        Ok(dir) => dir,
        Err(error) => {
            eprintln!("redrive-demo: {error:#}");
            return ExitCode::FAILURE;
        }
    };
    let mut config = ScenarioConfig::demo(scenario::Binaries::in_dir(&bin_dir));
    // TLS and authentication on, as in production: a CA, certificates and
    // tokens made for this run.
    match redrive_tests::pki::Pki::new() {
        Ok(pki) => config.pki = Some(std::sync::Arc::new(pki)),
        Err(error) => {
            eprintln!("redrive-demo: making the run's certificates: {error:#}");
            return ExitCode::FAILURE;
        }
    }
    if args.small {
        config.shape = Shape::SMALL;
    }
    config.kill_executor = args.kill_executor;
    config.console = args.console;
    if args.kill_executor {
        // A short lease, so the killed executor's slices are taken over soon.
        config.lease_ttl_seconds = 3;
    }
    // An interrupt drops the run, and with it every child process (killed
    // when its handle drops): none is left behind.
    // With --console the run itself waits for Ctrl-C and then stops cleanly.
    let outcome = tokio::select! {
        outcome = scenario::run(&config) => outcome,
        () = interrupted(), if !config.console => {
            eprintln!("redrive-demo: interrupted; its processes are killed");
            return ExitCode::from(130);
        }
    };
    match outcome {
        Ok(outcome) if outcome.failures().is_empty() => {
            println!(
                "== done in {:.0} s: every check passed; no process left running",
                started.elapsed().as_secs_f64()
            );
            ExitCode::SUCCESS
        }
        Ok(outcome) => {
            let failed: Vec<&str> = outcome
                .failures()
                .iter()
                .map(|check| check.what.as_str())
                .collect();
            eprintln!("redrive-demo: checks failed: {}", failed.join("; "));
            ExitCode::FAILURE
        }
        Err(error) => {
            eprintln!("redrive-demo: {error:#}");
            ExitCode::FAILURE
        }
    }
}

/// SIGINT or SIGTERM.
async fn interrupted() {
    let Ok(mut terminate) =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
    else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate.recv() => {}
    }
}
