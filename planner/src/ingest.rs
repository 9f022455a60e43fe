//! `IngestDeadLetters`: dead letters pushed by services that keep their own, and
//! files imported by `redrivectl import`. Idempotent per source and
//! [`crate::dead_letter::dedup_key`] (destination, message id,
//! `redrive-plan-id` and body: a re-sent line is a repeat, another message
//! sharing an id is stored); a bad item is rejected with its index and the
//! stream goes on.

use std::sync::Arc;

use chrono::Utc;
use futures::{Stream, StreamExt};
use redrive_proto::{
    time::from_timestamp,
    v1::{IngestDeadLettersRequest, IngestRejection, Origin},
};

use crate::{
    dead_letter::{ExtractionRules, NewDeadLetter, RawDeadLetter, extract},
    error::Error,
    store::{Store, dead_letters::InsertOutcome},
};

/// Items stored per statement.
const INGEST_BATCH: usize = 500;

/// What an ingest stream did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct IngestSummary {
    /// Newly stored.
    pub accepted: u64,
    /// Already stored (same source, destination, message id,
    /// `redrive-plan-id` and body).
    pub duplicates: u64,
    /// (zero-based index, reason) of refused items.
    pub rejected: Vec<IngestRejection>,
}

/// Validates one item into raw material, or says what is wrong with it.
fn validate(request: IngestDeadLettersRequest) -> Result<RawDeadLetter, String> {
    if request.source.trim().is_empty() {
        return Err("source: must not be empty".to_owned());
    }
    if request.original_destination.trim().is_empty() {
        return Err(
            "original_destination: must not be empty (a queue, or exchange/routing-key)".to_owned(),
        );
    }
    let occurred_at = request
        .occurred_at
        .map(|at| {
            from_timestamp(&at).ok_or_else(|| "occurred_at: not a valid timestamp".to_owned())
        })
        .transpose()?;
    let mut properties = request.properties.unwrap_or_default();
    if !request.message_id.is_empty() {
        properties.message_id = Some(request.message_id);
    }
    Ok(RawDeadLetter {
        source: request.source,
        origin: if request.imported {
            Origin::Import
        } else {
            Origin::Ingest
        },
        body: request.body,
        properties,
        headers: request.headers.unwrap_or_default(),
        redelivered: false,
        reason: Some(request.reason).filter(|reason| !reason.is_empty()),
        original_destination: Some(request.original_destination),
        error_text: Some(request.error_text).filter(|text| !text.is_empty()),
        attempts: (request.attempts > 0).then_some(request.attempts),
        occurred_at,
        captured_at: Utc::now(),
    })
}

/// Stores every valid item of `items`, in batches.
///
/// # Errors
/// [`Error::Store`] when PostgreSQL fails; batches stored before stay stored,
/// and a retry of the whole stream is safe (idempotent).
pub async fn ingest<S>(
    store: &Store,
    rules: &Arc<ExtractionRules>,
    items: S,
) -> Result<IngestSummary, Error>
where
    S: Stream<Item = Result<IngestDeadLettersRequest, tonic::Status>> + Unpin,
{
    let mut summary = IngestSummary::default();
    let mut batch: Vec<NewDeadLetter> = Vec::with_capacity(INGEST_BATCH);
    let mut items = items.enumerate();
    while let Some((index, item)) = items.next().await {
        let item = item.map_err(|status| Error::invalid("stream", status.message().to_owned()))?;
        match validate(item) {
            Ok(raw) => {
                batch.push(extract(rules, raw).await);
            }
            Err(reason) => summary.rejected.push(IngestRejection {
                index: index as u64,
                reason,
            }),
        }
        if batch.len() >= INGEST_BATCH {
            flush(store, &mut batch, &mut summary).await?;
        }
    }
    flush(store, &mut batch, &mut summary).await?;
    Ok(summary)
}

/// Stores `batch`; when PostgreSQL refuses it for its content, item by item,
/// a refused item degraded to what is always storable (its body, properties and
/// headers exactly), so one odd item never stops an import.
async fn flush(
    store: &Store,
    batch: &mut Vec<NewDeadLetter>,
    summary: &mut IngestSummary,
) -> Result<(), Error> {
    let outcome = match store.insert_dead_letters(batch).await {
        Err(error) if !error.is_retryable() => {
            tracing::warn!(%error, "an ingest batch was refused; storing its items one by one");
            let mut total = InsertOutcome::default();
            for item in batch.iter() {
                let outcome = match store.insert_dead_letters(std::slice::from_ref(item)).await {
                    Err(error) if !error.is_retryable() => {
                        store
                            .insert_dead_letters(&[item.degraded(&error.to_string())])
                            .await?
                    }
                    other => other?,
                };
                total.inserted += outcome.inserted;
                total.already_stored += outcome.already_stored;
            }
            total
        }
        other => other?,
    };
    summary.accepted += outcome.inserted;
    summary.duplicates += outcome.already_stored;
    batch.clear();
    Ok(())
}
