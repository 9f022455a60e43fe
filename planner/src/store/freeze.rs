//! The freeze lock: one transaction-scoped advisory lock that keeps plan
//! creation and the changes that would make a plan's frozen items wrong from
//! crossing each other.
//!
//! A plan freezes the replayable dead letters of its precheck: their ids,
//! message keys and routes are copied into `plan_items`, and the check that
//! none of them was archived or deleted since the precheck is made in the
//! same statement. Archive, retention, re-keying and body repairs change or
//! remove dead letters. Plan creation takes the lock **shared** (plans are
//! created side by side), the others take it **exclusive**, each as the first
//! thing its transaction does, so each waits for the other's transaction to
//! end. Under `READ COMMITTED` every statement after the lock sees what the
//! other committed (PostgreSQL docs, "Advisory Locks" and "Read Committed
//! Isolation Level").
//!
//! Before this lock, plan creation locked each frozen dead letter
//! `FOR SHARE`: a row lock is written into every tuple, so a plan of 800,000
//! dead letters dirtied the whole `dead_letters` heap and wrote 3.8 GB of WAL
//! (full-page images) before it wrote a single item (docs/benchmarks.md,
//! "Plan creation at a million").

use sqlx::PgConnection;

use super::StoreError;

/// The advisory lock's key: `hashtextextended('redrive-freeze', 0)`, one
/// 64-bit key for the whole database.
const FREEZE_KEY_SQL: &str = "hashtextextended('redrive-freeze', 0)";

/// How a transaction holds the freeze lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Freeze {
    /// Plan creation: many at once, none beside an exclusive holder.
    Shared,
    /// Archive, retention, re-keying, body repairs: alone.
    Exclusive,
}

/// Takes the freeze lock in `mode`, held until the transaction on
/// `connection` ends (commit, rollback or a lost connection); waits while a
/// holder of the other kind, or another exclusive holder, has it.
///
/// # Errors
/// [`StoreError`] (the database).
pub async fn lock(connection: &mut PgConnection, mode: Freeze) -> Result<(), StoreError> {
    let function = match mode {
        Freeze::Shared => "pg_advisory_xact_lock_shared",
        Freeze::Exclusive => "pg_advisory_xact_lock",
    };
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT {function}({FREEZE_KEY_SQL})"
    )))
    .execute(connection)
    .await?;
    Ok(())
}
