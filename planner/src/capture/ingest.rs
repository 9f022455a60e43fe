//! `IngestDeadLetters`: dead letters pushed by services that keep their own, and
//! files imported by `redrivectl import`. Idempotent per source and
//! [`crate::dead_letters::dedup_key`] (destination, message id,
//! `redrive-plan-id` and body: a re-sent line is a repeat, another message
//! sharing an id is stored); a bad item is rejected with its index and the
//! stream goes on.

use std::sync::Arc;

use chrono::Utc;
use futures::{Stream, StreamExt};
use prost::{Message, Name};
use redrive_proto::{
    codec::{Scope, check_request},
    limits::{MAX_ATTEMPTS, MAX_INGEST_BATCH_BYTES},
    time::from_timestamp,
    v1::{IngestDeadLettersRequest, IngestRejection, Origin},
};

use crate::{
    capture::ingest_budget::{Reservation, Reservations},
    dead_letters::{ExtractionRules, NewDeadLetter, RawDeadLetter, event_time, extract},
    error::Error,
    store::{Store, dead_letters::InsertOutcome},
};

/// Items stored per statement.
const INGEST_BATCH: usize = 500;
/// How long a batch waits for the stream's next item before it is stored
/// as it is: a stream that pauses holds none of the ingest memory others
/// may wait for (and, waiting for its own next item's share, frees what
/// its batch holds).
const LINGER: std::time::Duration = std::time::Duration::from_millis(50);

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

/// Validates one item into raw material, or says what is wrong with it: the
/// wire limits of every text field, header table and repeated field
/// (`redrive_proto::limits`, checked here per item so that the stream goes
/// on), then the fields' meaning.
fn validate(mut request: IngestDeadLettersRequest) -> Result<RawDeadLetter, String> {
    let body = std::mem::take(&mut request.body);
    check_request(
        &IngestDeadLettersRequest::full_name(),
        &request.encode_to_vec(),
        Scope::All,
    )?;
    request.body = body;
    if request.source.trim().is_empty() {
        return Err("source: must not be empty".to_owned());
    }
    if request.original_destination.trim().is_empty() {
        return Err(
            "original_destination: must not be empty (a queue, or exchange/routing-key)".to_owned(),
        );
    }
    // A queue name over 255 bytes could never be published to: refused at
    // the door, not found out by an executor (a new user's pass).
    if let Some(problem) = redrive_proto::limits::destination_problem(&request.original_destination)
    {
        return Err(format!("original_destination: {problem}"));
    }
    let occurred_at = request
        .occurred_at
        .map(|at| {
            from_timestamp(&at).ok_or_else(|| {
                "occurred_at: not a valid timestamp from 0001-01-01 to 9999-12-31".to_owned()
            })
        })
        .transpose()?;
    let captured_at = Utc::now();
    if let Some(at) = occurred_at {
        // The one rule for event times (`event_time`): a time before 1990
        // is an unset one, and an event cannot happen after it reached us.
        if !event_time::plausible(at) {
            return Err(format!(
                "occurred_at: {} is not a plausible event time: outside 1990-01-01..2200-01-01 \
                 (leave it out when the time is not known)",
                redrive_proto::time::rfc3339(at)
            ));
        }
        event_time::not_after(at, captured_at, "the planner's clock")
            .map_err(|why| format!("occurred_at: {why}"))?;
    }
    if request.attempts > MAX_ATTEMPTS {
        return Err(format!(
            "attempts: {} is above the limit of {MAX_ATTEMPTS}",
            request.attempts
        ));
    }
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
        captured_at,
    })
}

/// Stores every valid item of `items`, in batches of at most
/// [`INGEST_BATCH`] items and about [`MAX_INGEST_BATCH_BYTES`] of bodies: the
/// next item is read from the stream only after a full batch is stored, so a
/// stream of large bodies is held back (HTTP/2 flow control) instead of
/// buffered whole. Each item holds its share of the planner's ingest memory
/// (`reservations`, from [`crate::capture::ingest_budget::IngestBudgetLayer`]) until
/// it is stored; a batch is stored when the next item is [`LINGER`] late,
/// so that a slow or paused stream holds no memory that others wait for.
///
/// # Errors
/// [`Error::Store`] when PostgreSQL fails in a way a retry can help with
/// (unreachable); batches stored before stay stored, and a retry of the whole
/// stream is safe (idempotent). An item PostgreSQL refuses for its content is
/// a rejection with its index, and the stream goes on.
/// [`Error::ResourceExhausted`] when the stream waited too long for its share
/// of the ingest memory, with what was stored before.
pub async fn ingest<S>(
    store: &Store,
    rules: &Arc<ExtractionRules>,
    items: S,
    reservations: Option<Reservations>,
) -> Result<IngestSummary, Error>
where
    S: Stream<Item = Result<IngestDeadLettersRequest, tonic::Status>> + Unpin,
{
    let mut summary = IngestSummary::default();
    let mut batch = Batch::default();
    let mut items = items.enumerate();
    loop {
        let next = match tokio::time::timeout(LINGER, items.next()).await {
            Ok(next) => next,
            Err(_) => {
                flush(store, &mut batch, &mut summary).await?;
                items.next().await
            }
        };
        let Some((index, item)) = next else {
            break;
        };
        let reservation = reservations.as_ref().and_then(Reservations::take);
        let item = match item {
            Ok(item) => item,
            Err(status) => {
                // The stream cannot go on after a message it could not read:
                // what came before is stored, and the answer says how much.
                flush(store, &mut batch, &mut summary).await?;
                let message = format!(
                    "{}; the items before it were handled ({} stored, {} already stored, {} rejected) and the rest were not read",
                    status.message(),
                    summary.accepted,
                    summary.duplicates,
                    summary.rejected.len()
                );
                return Err(if status.code() == tonic::Code::ResourceExhausted {
                    Error::ResourceExhausted(format!("stream item {index}: {message}"))
                } else {
                    Error::invalid(format!("stream item {index}"), message)
                });
            }
        };
        match validate(item) {
            Ok(raw) => {
                let dead_letter = extract(rules, raw).await;
                batch.bytes += dead_letter.body.len();
                batch.indices.push(index as u64);
                batch.items.push(dead_letter);
                batch.reservations.extend(reservation);
            }
            Err(reason) => summary.rejected.push(IngestRejection {
                index: index as u64,
                reason,
            }),
        }
        if batch.items.len() >= INGEST_BATCH || batch.bytes >= MAX_INGEST_BATCH_BYTES {
            flush(store, &mut batch, &mut summary).await?;
        }
    }
    flush(store, &mut batch, &mut summary).await?;
    summary.rejected.sort_by_key(|rejection| rejection.index);
    Ok(summary)
}

/// Items waiting to be stored, with their stream index.
#[derive(Default)]
struct Batch {
    /// Stream index of each of `items`.
    indices: Vec<u64>,
    items: Vec<NewDeadLetter>,
    /// Body bytes of `items`.
    bytes: usize,
    /// The items' shares of the ingest memory, returned once they are
    /// stored.
    reservations: Vec<Reservation>,
}

/// Stores `batch`; when PostgreSQL refuses it for its content, item by item,
/// a refused item degraded to what is always storable (its body, properties and
/// headers exactly), and one refused even so a rejection with its index, so one
/// odd item never stops an import and the summary counts what was stored.
async fn flush(store: &Store, batch: &mut Batch, summary: &mut IngestSummary) -> Result<(), Error> {
    if batch.items.is_empty() {
        return Ok(());
    }
    let outcome = match store.insert_dead_letters(&batch.items).await {
        Err(error) if !error.is_retryable() => {
            tracing::warn!(%error, "an ingest batch was refused; storing its items one by one");
            let mut total = InsertOutcome::default();
            for (index, item) in batch.indices.iter().zip(&batch.items) {
                let outcome = match store.insert_dead_letters(std::slice::from_ref(item)).await {
                    Err(error) if !error.is_retryable() => {
                        match store
                            .insert_dead_letters(&[item.degraded(&error.to_string())])
                            .await
                        {
                            Err(refused) if !refused.is_retryable() => {
                                summary.rejected.push(IngestRejection {
                                    index: *index,
                                    reason: format!("refused by the database: {refused}"),
                                });
                                continue;
                            }
                            other => other?,
                        }
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
    batch.indices.clear();
    batch.items.clear();
    batch.bytes = 0;
    batch.reservations.clear();
    Ok(())
}

#[cfg(test)]
mod tests {
    use redrive_proto::v1::IngestDeadLettersRequest;

    /// A new user's pass: a line whose queue name was 300 bytes was
    /// imported and prechecked replayable, and crashed the executor.
    #[test]
    fn a_destination_no_publish_can_name_is_refused_at_the_door() {
        let request = |destination: String| IngestDeadLettersRequest {
            source: "import".to_owned(),
            original_destination: destination,
            body: b"{}".to_vec(),
            ..Default::default()
        };
        assert!(super::validate(request("orders".to_owned())).is_ok());
        let refused = super::validate(request("q".repeat(300))).unwrap_err();
        assert!(
            refused.starts_with("original_destination: the destination queue name is 300 bytes"),
            "{refused}"
        );
        let pair = format!("{}/{}", "x".repeat(255), "k".repeat(255));
        assert!(super::validate(request(pair)).is_ok());
    }
}
