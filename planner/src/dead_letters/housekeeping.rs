//! Dead-letter housekeeping (docs/design.md, "Housekeeping"): archive and
//! unarchive (dead letters resolved without a replay), and retention (the
//! background task that deletes resolved dead letters once they are older
//! than `--retention`).

use std::time::Duration;

use chrono::Utc;
use redrive_proto::v1;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::{
    dead_letters::selector::{Selector, Status},
    error::Error,
    plan::single::required_reason,
    store::{
        Store, StoreError,
        housekeeping::{ArchiveOutcome, IDS_LISTED},
    },
};

/// Dead letters one retention transaction deletes at most.
pub const RETENTION_BATCH: i64 = 1000;

/// How often retention looks for resolved dead letters to delete.
pub const RETENTION_INTERVAL: Duration = Duration::from_secs(60);

/// Archives (`archive`) or unarchives the dead letters `request.selector`
/// covers, as `actor`. The selector's status unspecified means every dead
/// letter here (the already archived ones are counted as unchanged).
///
/// # Errors
/// `InvalidArgument` naming the field: a bad selector, an empty one (it would
/// cover every dead letter), an empty `reason`; `FailedPrecondition` naming
/// the plan when an archive selects an item of a plan that has not ended
/// (nothing is archived then); store errors.
pub async fn set_archived(
    store: &Store,
    actor: &str,
    request: v1::ArchiveDeadLettersRequest,
    archive: bool,
) -> Result<v1::ArchiveDeadLettersResponse, Error> {
    let verb = if archive { "archive" } else { "unarchive" };
    let mut selector = Selector::try_from(request.selector.unwrap_or_default())?;
    if selector.is_unfiltered() {
        return Err(Error::invalid(
            "selector",
            format!(
                "say which dead letters to {verb} (ids or a filter): an empty selector would \
                 cover every dead letter"
            ),
        ));
    }
    crate::precheck::check_sources(store, &selector.sources).await?;
    if selector.status == Status::NotArchived {
        selector.status = Status::All;
    }
    let reason = required_reason(&request.reason, &format!("these dead letters are {verb}d"))?;
    match store
        .set_archived(&selector, archive, actor, &reason)
        .await?
    {
        ArchiveOutcome::Done {
            changed,
            unchanged,
            not_found,
        } => {
            info!(
                actor,
                changed = changed.len(),
                unchanged,
                action = verb,
                "archive or unarchive done"
            );
            Ok(v1::ArchiveDeadLettersResponse {
                changed: changed.len() as u64,
                unchanged,
                dead_letter_ids: changed
                    .iter()
                    .take(IDS_LISTED)
                    .map(ToString::to_string)
                    .collect(),
                not_found_ids: not_found.iter().map(ToString::to_string).collect(),
            })
        }
        ArchiveOutcome::InLivePlan {
            dead_letter_id,
            plan_id,
            state,
        } => Err(Error::FailedPrecondition(format!(
            "dead letter {dead_letter_id} is an item of plan {plan_id} ({state}), which has not \
             ended: archive it once the plan is completed, or cancel the plan first; nothing was \
             archived"
        ))),
    }
}

/// Deletes every dead letter resolved (archived, or replayed by a plan that
/// has ended) before `cutoff`, in transactions of [`RETENTION_BATCH`], and
/// returns how many; then marks the ended plans whose sent dead letters are
/// all gone, so that later passes skip them.
///
/// # Errors
/// [`StoreError`]; the batches before it stay deleted.
pub async fn sweep(store: &Store, cutoff: chrono::DateTime<Utc>) -> Result<u64, StoreError> {
    let mut deleted = 0;
    loop {
        let batch = store.delete_resolved(cutoff, RETENTION_BATCH).await?;
        deleted += batch;
        if batch == 0 {
            break;
        }
    }
    store.mark_retention_swept().await?;
    Ok(deleted)
}

/// The retention task: every [`RETENTION_INTERVAL`] (the first pass at once)
/// deletes the dead letters resolved longer than `retention` ago
/// ([`sweep`]) and logs how many, until `shutdown`. A failed pass is logged
/// and tried again at the next interval.
pub async fn run_retention(store: Store, retention: Duration, shutdown: CancellationToken) {
    let Ok(age) = chrono::Duration::from_std(retention) else {
        warn!(
            ?retention,
            "retention too long to compute a cutoff: not run"
        );
        return;
    };
    loop {
        let cutoff = Utc::now() - age;
        match sweep(&store, cutoff).await {
            Ok(0) => {}
            Ok(deleted) => info!(
                deleted,
                retention = %humantime::format_duration(retention),
                %cutoff,
                "retention deleted resolved dead letters"
            ),
            Err(error) => warn!(%error, "retention pass failed; trying again later"),
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(RETENTION_INTERVAL) => {}
        }
    }
}
