//! The sources dead letters were stored from, for the overview
//! (`ListSources`).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};

use super::{Store, StoreError};

/// Minutes of arrivals a [`SourceOverview`] counts.
pub const ARRIVAL_MINUTES: usize = 60;

/// One source's counts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceOverview {
    /// The source (a capture queue, or an ingest or import label).
    pub source: String,
    /// Dead letters stored from it.
    pub stored: i64,
    /// Of them, neither archived nor replayed.
    pub open: i64,
    /// Dead letters stored in each of the last [`ARRIVAL_MINUTES`] minutes
    /// (by `captured_at`), oldest first; the last is the current minute.
    pub arrivals_per_minute: [u32; ARRIVAL_MINUTES],
    /// When its newest dead letter was stored.
    pub last_arrival: Option<DateTime<Utc>>,
}

impl Store {
    /// [`SourceOverview`] of every source, by name: the grouped scan of
    /// [`Store::source_readings`], and one of the last hour's (index
    /// `dead_letters_captured_at`).
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn source_overviews(&self) -> Result<Vec<SourceOverview>, StoreError> {
        // Totals per source: the gauges' reading, summed over reason classes.
        let mut totals: BTreeMap<String, (i64, i64, Option<DateTime<Utc>>)> = BTreeMap::new();
        for reading in self.source_readings(ReadingsFor::Caller).await?.0 {
            let total = totals.entry(reading.source).or_default();
            total.0 += i64::try_from(reading.stored).unwrap_or(i64::MAX);
            total.1 += i64::try_from(reading.open).unwrap_or(i64::MAX);
            total.2 = total.2.max(reading.last_arrival);
        }
        let recent: Vec<(String, i32, i64)> = sqlx::query_as(
            "SELECT source, floor(extract(epoch FROM now() - captured_at) / 60)::int AS ago, count(*) \
             FROM dead_letters WHERE captured_at > now() - interval '60 minutes' \
             GROUP BY 1, 2",
        )
        .fetch_all(self.pool())
        .await?;
        let mut arrivals: BTreeMap<String, [u32; ARRIVAL_MINUTES]> = BTreeMap::new();
        for (source, ago, count) in recent {
            let Ok(ago) = usize::try_from(ago) else {
                continue;
            };
            if ago < ARRIVAL_MINUTES {
                arrivals.entry(source).or_insert([0; ARRIVAL_MINUTES])[ARRIVAL_MINUTES - 1 - ago] =
                    u32::try_from(count).unwrap_or(u32::MAX);
            }
        }
        Ok(totals
            .into_iter()
            .map(|(source, (stored, open, last_arrival))| SourceOverview {
                arrivals_per_minute: arrivals.remove(&source).unwrap_or([0; ARRIVAL_MINUTES]),
                source,
                stored,
                open,
                last_arrival,
            })
            .collect())
    }
}

/// What the source gauges of [`crate::metrics`] read, per source and reason
/// class.
#[derive(Debug, Clone, PartialEq)]
pub struct SourceReading {
    /// The source.
    pub source: String,
    /// The reason class (`rejected`, `expired`, ...).
    pub reason_class: String,
    /// Dead letters stored.
    pub stored: u64,
    /// Of them, neither archived nor replayed.
    pub open: u64,
    /// When the oldest open one died.
    pub oldest_open: Option<DateTime<Utc>>,
    /// Stored in the last [`ARRIVALS_WINDOW_SECONDS`].
    pub recent: u64,
    /// When the newest one was stored.
    pub last_arrival: Option<DateTime<Utc>>,
}

/// A row of [`Store::source_readings`]: source, reason class, stored, open,
/// oldest open death, recent, newest stored.
type ReadingRow = (
    String,
    String,
    i64,
    i64,
    Option<DateTime<Utc>>,
    i64,
    Option<DateTime<Utc>>,
);

/// The window of [`SourceReading::recent`]: arrivals per second are
/// `recent / ARRIVALS_WINDOW_SECONDS`.
pub const ARRIVALS_WINDOW_SECONDS: u32 = 60;

/// What [`Store::source_readings`] runs: one grouped scan of the dead
/// letters, with the dead letters replayed (an item `sent`) hashed.
const SOURCE_READINGS: &str = "\
SELECT d.source, d.reason_class, count(*),
       count(*) FILTER (WHERE d.archived_at IS NULL AND s.dead_letter_id IS NULL),
       min(d.died_at) FILTER (WHERE d.archived_at IS NULL AND s.dead_letter_id IS NULL),
       count(*) FILTER (WHERE d.captured_at > now() - make_interval(secs => $1)),
       max(d.captured_at)
FROM dead_letters d
LEFT JOIN (SELECT DISTINCT dead_letter_id FROM plan_items WHERE state = 'sent') s
       ON s.dead_letter_id = d.id
GROUP BY 1, 2";

/// Who asks for [`Store::source_readings`], which decides how much of the
/// server the scan may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadingsFor {
    /// A caller waiting for the answer (`ListSources`, the console's
    /// overview): PostgreSQL may run the scan in parallel workers.
    Caller,
    /// The gauges' periodic count: one backend, no parallel workers, so
    /// that the count takes at most one core of the server however large
    /// the table. At 1,000,000 dead letters the parallel scan took 0.8-1.3 s
    /// of wall time and about three times that in CPU (three processes);
    /// on one backend 1.1 s (docs/benchmarks.md, "The source gauges'
    /// count").
    Gauges,
}

impl Store {
    /// [`SourceReading`]s of every source and reason class: one grouped scan
    /// of the dead letters (open as `ListSources` counts it), with how long
    /// the scan itself took (not the wait for a connection). Its cost grows
    /// with the dead letters stored (about 1.1 s of one core at 1,000,000).
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn source_readings(
        &self,
        runs_for: ReadingsFor,
    ) -> Result<(Vec<SourceReading>, std::time::Duration), StoreError> {
        let mut transaction = self.pool().begin().await?;
        if runs_for == ReadingsFor::Gauges {
            sqlx::query("SET LOCAL max_parallel_workers_per_gather = 0")
                .execute(&mut *transaction)
                .await?;
        }
        let started = std::time::Instant::now();
        let rows: Vec<ReadingRow> = sqlx::query_as(SOURCE_READINGS)
            .bind(f64::from(ARRIVALS_WINDOW_SECONDS))
            .fetch_all(&mut *transaction)
            .await?;
        let took = started.elapsed();
        transaction.commit().await?;
        let count = |value: i64| u64::try_from(value).unwrap_or_default();
        let readings = rows
            .into_iter()
            .map(
                |(source, reason_class, stored, open, oldest_open, recent, last_arrival)| {
                    SourceReading {
                        source,
                        reason_class,
                        stored: count(stored),
                        open: count(open),
                        oldest_open,
                        recent: count(recent),
                        last_arrival,
                    }
                },
            )
            .collect();
        Ok((readings, took))
    }

    /// Plans publishing (in their canary or main wave) whose newest audit
    /// event and newest operator action are both older than `after`: a
    /// stall (no executor claims, or every publish waits).
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn stalled_plans(&self, after: std::time::Duration) -> Result<u64, StoreError> {
        let stalled: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM plans p WHERE p.state IN ('canary', 'main') AND greatest( \
                 (SELECT a.at FROM audit_events a WHERE a.plan_id = p.id ORDER BY a.id DESC LIMIT 1), \
                 (SELECT o.at FROM operator_actions o WHERE o.plan_id = p.id ORDER BY o.id DESC LIMIT 1) \
             ) < now() - make_interval(secs => $1)",
        )
        .bind(after.as_secs_f64())
        .fetch_one(self.pool())
        .await?;
        Ok(u64::try_from(stalled).unwrap_or_default())
    }
}
