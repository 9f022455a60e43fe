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
    /// [`SourceOverview`] of every source, by name: one grouped scan of the
    /// dead letters, and one of the last hour's (index
    /// `dead_letters_captured_at`).
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn source_overviews(&self) -> Result<Vec<SourceOverview>, StoreError> {
        let totals: Vec<(String, i64, i64, Option<DateTime<Utc>>)> =
            // Open: neither archived nor replayed (as status_sql() says), the
            // replayed ones found by one hashed join, not a probe per row.
            sqlx::query_as(
                "SELECT d.source, count(*), \
                        count(*) FILTER (WHERE d.archived_at IS NULL AND s.dead_letter_id IS NULL), \
                        max(d.captured_at) \
                 FROM dead_letters d \
                 LEFT JOIN (SELECT DISTINCT dead_letter_id FROM plan_items WHERE state = 'sent') s \
                        ON s.dead_letter_id = d.id \
                 GROUP BY d.source ORDER BY d.source",
            )
            .fetch_all(self.pool())
            .await?;
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
            .map(|(source, stored, open, last_arrival)| SourceOverview {
                arrivals_per_minute: arrivals.remove(&source).unwrap_or([0; ARRIVAL_MINUTES]),
                source,
                stored,
                open,
                last_arrival,
            })
            .collect())
    }
}
