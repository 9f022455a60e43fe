//! [`TestDb`]: a PostgreSQL database of a test's own, the one database
//! fixture of every test in the workspace.

use sqlx::{Postgres, migrate::MigrateDatabase};

use crate::{block_on_aside, unique};

/// The local PostgreSQL (`scripts/services.sh`); RabbitMQ's and Redis's URLs are
/// [`crate::AMQP_URL`] and [`crate::REDIS_URL`].
pub const POSTGRES_URL: &str = "postgres://postgres@127.0.0.1:5432";

/// A database of the test's own on the local PostgreSQL.
///
/// Dropped without [`TestDb::drop_database`] (a test that failed early), it
/// drops the database itself, so failing tests leave nothing behind.
#[derive(Debug)]
pub struct TestDb {
    /// Its name.
    pub name: String,
    dropped: std::sync::atomic::AtomicBool,
}

impl Drop for TestDb {
    fn drop(&mut self) {
        if !self.dropped.load(std::sync::atomic::Ordering::SeqCst) {
            let url = self.url();
            block_on_aside(move || async move {
                let _ = Postgres::force_drop_database(&url).await;
            });
        }
    }
}

impl TestDb {
    /// A new name; the planner creates the database on start.
    pub fn new() -> Self {
        Self {
            name: unique("redrive_test"),
            dropped: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// URL on the real server: [`POSTGRES_URL`], or the server named by
    /// `REDRIVE_TEST_POSTGRES_URL` (a URL without a database; for profiling
    /// on a private server with `pg_stat_statements`).
    pub fn url(&self) -> String {
        let server =
            std::env::var("REDRIVE_TEST_POSTGRES_URL").unwrap_or_else(|_| POSTGRES_URL.to_owned());
        format!("{}/{}", server.trim_end_matches('/'), self.name)
    }

    /// URL through `proxy`.
    pub fn url_via(&self, proxy: &crate::TcpProxy) -> String {
        format!("postgres://postgres@{}/{}", proxy.addr(), self.name)
    }

    /// A pool of two connections on the real server (for assertions).
    ///
    /// # Errors
    /// When PostgreSQL is unreachable.
    pub async fn pool(&self) -> anyhow::Result<sqlx::PgPool> {
        self.pool_with(2).await
    }

    /// A pool of at most `max_connections` on the real server: for a test
    /// that drives the store directly and needs several connections at once.
    ///
    /// # Errors
    /// When PostgreSQL is unreachable.
    pub async fn pool_with(&self, max_connections: u32) -> anyhow::Result<sqlx::PgPool> {
        Ok(sqlx::postgres::PgPoolOptions::new()
            .max_connections(max_connections)
            .connect(&self.url())
            .await?)
    }

    /// Drops the database, closing other sessions on it.
    pub async fn drop_database(&self) {
        let _ = Postgres::force_drop_database(&self.url()).await;
        self.dropped
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Default for TestDb {
    fn default() -> Self {
        Self::new()
    }
}

impl TestDb {
    /// Creates the database (the planner creates it on start; a test of the
    /// store alone creates it here).
    ///
    /// # Errors
    /// When PostgreSQL is unreachable or refuses.
    pub async fn create(&self) -> anyhow::Result<()> {
        Postgres::create_database(&self.url()).await?;
        Ok(())
    }
}
