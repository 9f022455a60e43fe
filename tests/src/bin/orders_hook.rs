//! `redrive-example-orders-hook`: the example `redrive.v1.StateCheck` service
//! backed by an `orders` table (see `redrive_tests::orders_hook`).

use std::process::ExitCode;

use clap::Parser;
use redrive_tests::orders_hook::{self, OrdersHook};
use tokio_util::sync::CancellationToken;

/// Settings.
#[derive(Debug, Parser)]
#[command(
    name = "redrive-example-orders-hook",
    version,
    about = "Example StateCheck hook over an orders table"
)]
struct Args {
    /// Address to listen on.
    #[arg(long, env = "REDRIVE_HOOK_LISTEN", default_value = "127.0.0.1:50061")]
    listen: std::net::SocketAddr,
    /// PostgreSQL URL of the database holding the `orders` table (created if missing).
    #[arg(
        long,
        env = "REDRIVE_HOOK_DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/redrive"
    )]
    database_url: String,
    /// PEM certificate chain to serve TLS with (the planner then calls
    /// `https://HOST:PORT`; needs --tls-key).
    #[arg(long, env = "REDRIVE_HOOK_TLS_CERT", requires = "tls_key")]
    tls_cert: Option<std::path::PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, env = "REDRIVE_HOOK_TLS_KEY", requires = "tls_cert")]
    tls_key: Option<std::path::PathBuf>,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = match Args::try_parse() {
        Ok(args) => args,
        Err(error) if !error.use_stderr() => {
            let _ = error.print();
            return ExitCode::SUCCESS;
        }
        Err(error) => {
            let _ = error.print();
            return ExitCode::from(64);
        }
    };
    let run = async {
        use sqlx::migrate::MigrateDatabase;
        if !sqlx::Postgres::database_exists(&args.database_url).await? {
            sqlx::Postgres::create_database(&args.database_url).await?;
        }
        let pool = sqlx::PgPool::connect(&args.database_url).await?;
        OrdersHook::create_schema(&pool).await?;
        let listener = tokio::net::TcpListener::bind(args.listen).await?;
        let shutdown = CancellationToken::new();
        let signal = shutdown.clone();
        tokio::spawn(async move {
            let mut terminate =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                    .expect("SIGTERM handler");
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = terminate.recv() => {}
            }
            signal.cancel();
        });
        let tls = match (&args.tls_cert, &args.tls_key) {
            (Some(cert), Some(key)) => Some(tonic::transport::ServerTlsConfig::new().identity(
                tonic::transport::Identity::from_pem(std::fs::read(cert)?, std::fs::read(key)?),
            )),
            _ => None,
        };
        eprintln!(
            "orders hook listening on {} ({})",
            args.listen,
            if tls.is_some() { "TLS" } else { "plaintext" }
        );
        orders_hook::serve_with(OrdersHook::new(pool), listener, tls, shutdown).await
    };
    match run.await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("redrive-example-orders-hook: {error:#}");
            ExitCode::FAILURE
        }
    }
}
