//! PostgreSQL: the planner's only state. Every query lives under this module;
//! `sqlx::Error` is translated by SQLSTATE here, once.
//!
//! # Layout
//! - `mod.rs`: the [`Store`] (the pool and the metrics every part counts
//!   through) and [`StoreError`], `sqlx::Error` translated by SQLSTATE.
//! - [`dead_letters`]: list, get, summarize, the selector's SQL;
//!   `dead_letters/insert.rs` (insert batches: capture, ingest, import),
//!   `dead_letters/rows.rs` (the rows read, mapped to the API's messages).
//! - [`prechecks`]: candidate stream, item `COPY`, reports, item pages.
//! - [`plans`]: plan creation, reads with progress; `plans/transitions.rs`
//!   (the guarded state changes, operator actions, notifications),
//!   `plans/approval.rs` (the approval check), `plans/rows.rs` (plan rows
//!   mapped to the API's messages), `plans/gates.rs` (gate readings),
//!   `plans/routing.rs` (where items are published, destination comparisons).
//! - [`leases`]: slice leases with fencing tokens (the leased slice and
//!   item types); `leases/claim.rs` (the claim and the items its answer
//!   carries), `leases/holder.rs` (a holder's state checks, write-ahead
//!   marks, renewals), `leases/expiry.rs` (the sweep of expired leases),
//!   `leases/report.rs` (the reads and writes of a report and of a lease's
//!   end).
//! - [`audit`]: the audit's events and refusals, written and read.
//! - [`audit_log`]: the audit log (RFC 6962 leaves, interior nodes, signed
//!   checkpoints): a sealing round's reads and writes, proofs' hashes, log
//!   export pages.
//! - [`single`]: plans of one (single replay) and body repairs.
//! - [`sources`]: each source's counts and arrivals for the overview.
//! - [`housekeeping`]: archive, unarchive and their history; retention.
//! - [`freeze`]: the lock that keeps plan creation and changes to the
//!   dead letters it freezes (archive, retention, re-keying, repairs) apart.
//! - [`rekey`]: re-keying stored dead letters in batches, with its audit.
//! - [`webhooks`]: the webhook outbox: events written with their state
//!   change, due deliveries taken by one replica at a time, their outcomes.

pub mod audit;
pub mod audit_log;
pub mod dead_letters;
pub mod freeze;
pub mod housekeeping;
pub mod idempotency;
pub mod leases;
pub mod plans;
pub mod prechecks;
pub mod rekey;
pub mod single;
pub mod sources;
pub mod webhooks;

use std::time::Duration;

use sqlx::{PgPool, Postgres, Transaction, postgres::PgPoolOptions};

use crate::{ids::SliceId, metrics::PlannerMetrics};

/// Errors of the store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// PostgreSQL cannot be reached or is shutting down; retrying can help.
    #[error("PostgreSQL unavailable: {0}")]
    Unavailable(#[source] sqlx::Error),
    /// A transaction lost a serialization race or deadlock; retrying can help.
    #[error("PostgreSQL transaction conflict: {0}")]
    Conflict(#[source] sqlx::Error),
    /// Anything else from PostgreSQL: a bug or a schema mismatch.
    #[error("PostgreSQL error: {0}")]
    Database(#[source] sqlx::Error),
    /// A stored value does not decode (encoded properties or headers).
    #[error("stored data does not decode: {0}")]
    Corrupt(String),
    /// Migrations could not be applied.
    #[error("applying migrations: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// A read ended before its last row without an error of its own (its
    /// task panicked or was cancelled); what it returned is incomplete.
    #[error("read interrupted: {0}")]
    Interrupted(String),
}

impl StoreError {
    /// Whether the same call may succeed later.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::Unavailable(_) | Self::Conflict(_))
    }
}

impl From<sqlx::Error> for StoreError {
    fn from(error: sqlx::Error) -> Self {
        match &error {
            sqlx::Error::Io(_)
            | sqlx::Error::Tls(_)
            | sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::WorkerCrashed => Self::Unavailable(error),
            sqlx::Error::Database(database) => {
                let code = database.code().unwrap_or_default();
                // SQLSTATE classes (PostgreSQL docs, Appendix A): 08 connection
                // exception, 53 insufficient resources, 57 operator intervention
                // (admin shutdown); 40001 serialization failure, 40P01 deadlock.
                if code.starts_with("08") || code.starts_with("53") || code.starts_with("57") {
                    Self::Unavailable(error)
                } else if code == "40001" || code == "40P01" {
                    Self::Conflict(error)
                } else {
                    Self::Database(error)
                }
            }
            _ => Self::Database(error),
        }
    }
}

/// An outcome report rejected for its fencing token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "stale fencing token {token} for slice {slice_id}: not a live lease of the caller (expired and re-leased, released, or claimed by another principal)"
)]
pub struct StaleToken {
    /// The slice.
    pub slice_id: SliceId,
    /// The token presented.
    pub token: i64,
}

/// The planner's handle on PostgreSQL (a connection pool; cheap to clone).
#[derive(Debug, Clone)]
pub struct Store {
    pool: PgPool,
    /// The instruments the store's own events (plan moves, expired leases)
    /// are counted with, and that every part holding the store reaches.
    metrics: PlannerMetrics,
    /// Whether this planner has a webhook (`--webhook-url`): its events are
    /// then written to the outbox for it.
    planner_webhook: bool,
}

/// What a state change does beside itself: counted in the metrics, and
/// written to the webhook outbox for the planner's webhook when it has one
/// (and for the plan's own).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Effects<'a> {
    /// The planner's instruments.
    pub(crate) metrics: &'a PlannerMetrics,
    /// Whether the planner has a webhook (`--webhook-url`).
    pub(crate) planner_webhook: bool,
}

impl Store {
    /// Connects lazily to `database_url` (connections open on first use, so the
    /// planner starts and answers health checks while PostgreSQL is down).
    ///
    /// # Errors
    /// [`StoreError::Database`] when the URL does not parse.
    pub fn connect_lazy(database_url: &str, max_connections: u32) -> Result<Self, StoreError> {
        Self::connect_lazy_with(database_url, max_connections, &[])
    }

    /// [`Store::connect_lazy`] with run-time parameters every connection
    /// sets at startup (`options` of the startup message, as `-c name=value`
    /// would: `redrive.audit_mac`, `redrive.audit_log` for the audit log's
    /// triggers, migration 0035). They are not in `pg_stat_activity`.
    ///
    /// # Errors
    /// [`StoreError::Database`] when the URL does not parse.
    pub fn connect_lazy_with(
        database_url: &str,
        max_connections: u32,
        session: &[(&str, String)],
    ) -> Result<Self, StoreError> {
        let options = database_url
            .parse::<sqlx::postgres::PgConnectOptions>()
            .map_err(StoreError::Database)?
            .options(session.iter().map(|(name, value)| (*name, value.as_str())));
        let pool = PgPoolOptions::new()
            .max_connections(max_connections)
            .acquire_timeout(Duration::from_secs(5))
            .connect_lazy_with(options);
        Ok(Self {
            pool,
            metrics: PlannerMetrics::default(),
            planner_webhook: false,
        })
    }

    /// This store writing every event to the outbox for the planner's own
    /// webhook too (`--webhook-url` set).
    pub fn with_planner_webhook(mut self, enabled: bool) -> Self {
        self.planner_webhook = enabled;
        self
    }

    /// What a state change made through this store does beside itself.
    pub(crate) fn effects(&self) -> Effects<'_> {
        Effects {
            metrics: &self.metrics,
            planner_webhook: self.planner_webhook,
        }
    }

    /// This store counting into `metrics`.
    pub fn with_metrics(mut self, metrics: PlannerMetrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// The planner's metric instruments.
    pub fn metrics(&self) -> &PlannerMetrics {
        &self.metrics
    }

    /// Wraps an existing pool (tests).
    pub fn from_pool(pool: PgPool) -> Self {
        Self {
            pool,
            metrics: PlannerMetrics::default(),
            planner_webhook: false,
        }
    }

    /// Applies `planner/migrations` (idempotent; concurrent planners serialize on
    /// sqlx's advisory lock).
    ///
    /// # Errors
    /// [`StoreError::Migrate`] when PostgreSQL is unreachable or a migration fails.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        sqlx::migrate!("./migrations").run(&self.pool).await?;
        Ok(())
    }

    /// Records `broker_id` as the broker this database belongs to, unless one
    /// is recorded already, and answers the recorded one (the first planner
    /// to start decides; docs/operating.md, "One database per broker").
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn claim_deployment(&self, broker_id: &str) -> Result<String, StoreError> {
        sqlx::query("INSERT INTO deployment (broker_id) VALUES ($1) ON CONFLICT DO NOTHING")
            .bind(broker_id)
            .execute(self.pool())
            .await?;
        Ok(sqlx::query_scalar("SELECT broker_id FROM deployment")
            .fetch_one(self.pool())
            .await?)
    }

    /// Whether PostgreSQL answers a trivial query.
    ///
    /// # Errors
    /// [`StoreError`] when it does not.
    pub async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1").execute(self.pool()).await?;
        Ok(())
    }

    /// The pool, for modules of the store.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Opens a transaction for a domain decision that must see and change
    /// the database at one moment (a report judged against its lease, a
    /// lease's end judged by the gates): the domain reads through the
    /// [`Tx`], decides, writes through it and [`Tx::commit`]s. Dropped
    /// without a commit, everything it wrote is rolled back.
    ///
    /// # Errors
    /// [`StoreError`] when no connection can be had.
    pub async fn begin(&self) -> Result<Tx, StoreError> {
        Ok(Tx {
            transaction: self.pool.begin().await?,
            metrics: self.metrics.clone(),
            planner_webhook: self.planner_webhook,
        })
    }
}

/// One open transaction of the store ([`Store::begin`]). Its methods are
/// the store's reads and writes in that transaction; it decides nothing.
#[derive(Debug)]
pub struct Tx {
    transaction: Transaction<'static, Postgres>,
    metrics: PlannerMetrics,
    /// As the store's ([`Store::with_planner_webhook`]).
    planner_webhook: bool,
}

impl Tx {
    /// Commits every write made through this transaction.
    ///
    /// # Errors
    /// [`StoreError`]; the transaction is then rolled back.
    pub async fn commit(self) -> Result<(), StoreError> {
        self.transaction.commit().await?;
        Ok(())
    }
}
