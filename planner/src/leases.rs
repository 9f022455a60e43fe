//! The executors' side of a plan (docs/design.md, "Executor loop and guarantees"):
//! long-polled slice claims under leases with fencing tokens, heartbeats that
//! renew a lease and say whether to keep publishing, fenced outcome reports and
//! slice completion.

pub mod outcomes;

use std::time::Duration;

use chrono::Utc;
use redrive_proto::{
    time::{duration, from_timestamp},
    v1,
};
use tokio::sync::broadcast::error::RecvError;
use tokio_util::sync::CancellationToken;

use std::sync::Arc;

use crate::{
    audit::notifier::Notifier,
    error::Error,
    ids::{DeadLetterId, SliceId},
    plan::state::State,
    precheck::state_check::{StateChecker, StateDecision, StoredStateCheckMessage},
    store::{
        StaleToken, Store, StoreError,
        leases::{LeasedItem, LeasedSlice, Outcome},
    },
};

/// Default lease: 30 s (executors heartbeat at a third of it).
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(30);
pub use redrive_proto::limits::MAX_CLAIM_WAIT;
/// Expired leases are looked for at least this often while a claim waits.
const CLAIM_RECHECK: Duration = Duration::from_secs(1);

/// How often a lease watch looks at its lease without a notification.
pub const LEASE_RECHECK: Duration = Duration::from_millis(500);

/// `text` with NUL characters replaced by U+FFFD: an executor's report carries
/// broker error texts, which PostgreSQL's `text` could refuse, and a refused
/// report would be retried for ever (reports are not length-checked either,
/// see `redrive_proto::limits::STORED_DATA_MESSAGES`).
fn storable(text: String) -> String {
    if text.contains('\0') {
        text.replace('\0', "\u{fffd}")
    } else {
        text
    }
}

/// The signal for a lease in `state` (a plan state, or lost): executors keep
/// publishing while the plan [`v1::PlanState::is_publishing`].
pub(crate) fn lease_signal(state: Result<State, StaleToken>) -> v1::LeaseSignal {
    match state {
        Ok(state) if state.get().is_publishing() => v1::LeaseSignal {
            keep_publishing: true,
            reason: String::new(),
            lease_lost: false,
        },
        Ok(state) => v1::LeaseSignal {
            keep_publishing: false,
            reason: format!("plan is {state}"),
            lease_lost: false,
        },
        Err(stale) => v1::LeaseSignal {
            keep_publishing: false,
            reason: stale.to_string(),
            lease_lost: true,
        },
    }
}

/// Coordinates executors over the store.
#[derive(Debug, Clone)]
pub struct Coordinator {
    store: Store,
    notifier: Notifier,
    lease_ttl: Duration,
    checker: Arc<StateChecker>,
    /// Byte budget of one claim answer (`--claim-max-bytes`).
    claim_max_bytes: usize,
    /// The planner's shutdown: a claim waiting for a slice answers "none"
    /// at once, so that the server's graceful stop does not wait out every
    /// idle executor's long poll.
    shutdown: CancellationToken,
}

impl From<StaleToken> for Error {
    fn from(stale: StaleToken) -> Self {
        Error::StaleToken(stale)
    }
}

fn slice_item(mut item: LeasedItem, checker: &StateChecker) -> v1::SliceItem {
    let state_check = checker
        .route(
            item.dead_letter.event_type.as_deref(),
            &item.dead_letter.destination,
        )
        .is_some();
    // The body travels once: `SliceItem.body` is what gets published.
    item.dead_letter.body = Vec::new();
    v1::SliceItem {
        item_id: item.position.to_string(),
        exchange: item.exchange,
        routing_key: item.routing_key,
        attempts: u32::try_from(item.attempts).unwrap_or_default(),
        uncertain: item.state == "uncertain",
        redrive_count: u32::try_from(item.redrive_count).unwrap_or_default(),
        key_replayed: item.key_replayed,
        body: item.replay_body,
        dead_letter: Some(item.dead_letter),
        state_check,
        stale_at: item.stale_at.map(redrive_proto::time::timestamp),
        came_back_from: item.came_back_from,
    }
}

pub(crate) fn parse_token(token: u64) -> Result<i64, Error> {
    i64::try_from(token).map_err(|_| Error::invalid("fencing_token", "out of range"))
}

impl Coordinator {
    /// A coordinator handing out leases of `lease_ttl`.
    pub fn new(
        store: Store,
        notifier: Notifier,
        lease_ttl: Duration,
        checker: Arc<StateChecker>,
    ) -> Self {
        Self {
            store,
            notifier,
            lease_ttl,
            checker,
            claim_max_bytes: redrive_proto::limits::DEFAULT_CLAIM_MAX_BYTES,
            shutdown: CancellationToken::new(),
        }
    }

    /// This coordinator ending its claims' waits with `shutdown` (a claim
    /// under way is finished; only the wait between tries is cut).
    #[must_use]
    pub fn with_shutdown(mut self, shutdown: CancellationToken) -> Self {
        self.shutdown = shutdown;
        self
    }

    /// This coordinator with a claim answer's byte budget of `max_bytes`
    /// (`--claim-max-bytes`; at least one item is always handed out).
    #[must_use]
    pub fn with_claim_max_bytes(mut self, max_bytes: usize) -> Self {
        self.claim_max_bytes = max_bytes;
        self
    }

    /// The owning services' verdicts on `dead_letter_ids` now, right before
    /// they are published (docs/design.md, "Executor loop": state re-check).
    /// Only for items of the caller's lease: `token` must be the current,
    /// unexpired lease of `slice_id`, held by `caller`, and each id an item
    /// of that slice (and `plan_id`, when not empty, its plan). Messages no
    /// hook covers are `replay`.
    ///
    /// # Errors
    /// `InvalidArgument` for a bad id, a dead letter that is not an item of
    /// the slice (naming `dead_letter_ids[i]`) or another plan's id;
    /// `FailedPrecondition` (STALE_FENCING_TOKEN) when the token is not the
    /// caller's current lease; `Unavailable` when a hook fails (the executor
    /// must not publish then); store errors.
    pub async fn recheck(
        &self,
        plan_id: &str,
        slice_id: SliceId,
        token: u64,
        caller: &str,
        dead_letter_ids: &[String],
    ) -> Result<Vec<v1::StateDecision>, Error> {
        let token = parse_token(token)?;
        let ids = dead_letter_ids
            .iter()
            .enumerate()
            .map(|(index, id)| {
                id.parse::<i64>()
                    .map(DeadLetterId::new)
                    .map_err(|_| Error::invalid(format!("dead_letter_ids[{index}]"), "not an id"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let (slice_plan, members) = self
            .store
            .lease_items(slice_id, token, caller, &ids)
            .await??;
        if !plan_id.is_empty() && plan_id != slice_plan.to_string() {
            return Err(Error::invalid(
                "plan_id",
                format!("{plan_id:?} is not the plan of slice {slice_id} ({slice_plan})"),
            ));
        }
        let members: std::collections::HashSet<DeadLetterId> = members.into_iter().collect();
        if let Some(index) = ids.iter().position(|id| !members.contains(id)) {
            return Err(Error::invalid(
                format!("dead_letter_ids[{index}]"),
                format!(
                    "dead letter {} is not an item of slice {slice_id}; a state re-check \
                     answers only for items of the caller's lease",
                    ids[index]
                ),
            ));
        }
        let dead_letters = self.store.dead_letters_by_id(&ids).await?;
        let mut by_route: std::collections::BTreeMap<usize, Vec<StoredStateCheckMessage>> =
            std::collections::BTreeMap::new();
        let mut decisions = Vec::with_capacity(dead_letters.len());
        for dead_letter in dead_letters {
            match self
                .checker
                .route(dead_letter.event_type.as_deref(), &dead_letter.destination)
            {
                None => decisions.push(v1::StateDecision {
                    dead_letter_id: dead_letter.id.clone(),
                    verdict: v1::StateCheckVerdict::Replay.into(),
                    reason: String::new(),
                }),
                Some(route) => by_route
                    .entry(route)
                    .or_default()
                    .push(StoredStateCheckMessage {
                        dead_letter_id: dead_letter.id.clone(),
                        message_key: dead_letter.message_key.clone(),
                        event_type: dead_letter.event_type.clone(),
                        body: dead_letter.body,
                        properties: dead_letter
                            .properties
                            .map(|properties| prost::Message::encode_to_vec(&properties)),
                        headers: dead_letter
                            .headers
                            .map(|headers| prost::Message::encode_to_vec(&headers)),
                    }),
            }
        }
        for (route, messages) in by_route {
            let answers = self
                .checker
                .check(
                    route,
                    messages,
                    crate::precheck::options::DEFAULT_STATE_CHECK_TIMEOUT,
                )
                .await
                .map_err(|error| {
                    Error::Unavailable(format!(
                        "{error}; not publishing these items until the hook answers"
                    ))
                })?;
            for (dead_letter_id, decision) in answers {
                let (verdict, reason) = match decision {
                    StateDecision::Replay => (v1::StateCheckVerdict::Replay, String::new()),
                    StateDecision::Block(reason) => (v1::StateCheckVerdict::Block, reason),
                    StateDecision::NeedsCompensation(reason) => {
                        (v1::StateCheckVerdict::NeedsCompensation, reason)
                    }
                };
                decisions.push(v1::StateDecision {
                    dead_letter_id,
                    verdict: verdict.into(),
                    reason,
                });
            }
        }
        Ok(decisions)
    }

    /// Leases a slice to `executor_id`, waiting up to `wait` (at most
    /// [`MAX_CLAIM_WAIT`]) for one to become claimable. `Ok(None)`: none came.
    /// `marks_publishing` must be true: the executor promises to call
    /// [`Coordinator::mark_publishing`] before it publishes, and its reports
    /// are accepted only for the items it marked.
    ///
    /// # Errors
    /// `InvalidArgument` for an empty executor id; `FailedPrecondition`
    /// without `marks_publishing`; store errors.
    pub async fn claim(
        &self,
        executor_id: &str,
        caller: &str,
        wait: Duration,
        marks_publishing: bool,
    ) -> Result<Option<v1::Slice>, Error> {
        if executor_id.trim().is_empty() {
            return Err(Error::invalid("executor_id", "must not be empty"));
        }
        if !marks_publishing {
            return Err(Error::FailedPrecondition(
                "marks_publishing is false: the planner accepts outcomes only for items a lease \
                 marked with MarkPublishing, so an executor must mark before it publishes; \
                 upgrade the executor"
                    .to_owned(),
            ));
        }
        // The executor id the lease and the audit record: with
        // authentication, it names the principal too when the id the
        // executor chose does not start with it ("executor-2 as
        // executor-1"), so a claimed name cannot hide who published.
        let recorded = recorded_executor(executor_id, caller);
        let executor_id = recorded.as_str();
        let deadline = tokio::time::Instant::now() + wait.min(MAX_CLAIM_WAIT);
        let mut changes = self.notifier.subscribe();
        loop {
            // A planner that is stopping hands out nothing more.
            if self.shutdown.is_cancelled() {
                return Ok(None);
            }
            if let Some(slice) = self
                .store
                .claim_slice(executor_id, caller, self.lease_ttl, true)
                .await?
            {
                let items = self.hand_out_items(&slice, caller).await?;
                tracing::info!(
                    slice.id = slice.slice_id.get(),
                    plan.id = %slice.plan_id,
                    executor.id = executor_id,
                    items = items.len(),
                    fencing_token = slice.fencing_token,
                    "slice leased"
                );
                return Ok(Some(self.slice_message(&slice, items)));
            }
            let now = tokio::time::Instant::now();
            if now >= deadline {
                return Ok(None);
            }
            let until = deadline.min(now + CLAIM_RECHECK);
            tokio::select! {
                () = self.shutdown.cancelled() => return Ok(None),
                () = tokio::time::sleep_until(until) => {}
                changed = changes.recv() => {
                    if matches!(changed, Err(RecvError::Closed)) {
                        tokio::time::sleep_until(until).await;
                    }
                }
            }
        }
    }

    /// The items slice `slice`, just leased by `caller`, hands out: an item
    /// no claim answer can carry fails at once (it would hold its slice
    /// forever); the rest are handed out as far as the byte budget goes,
    /// the remainder staying pending for the next lease of this slice.
    ///
    /// # Errors
    /// Store errors; the lease is released first (nobody will hold it).
    async fn hand_out_items(
        &self,
        slice: &LeasedSlice,
        caller: &str,
    ) -> Result<Vec<LeasedItem>, Error> {
        match self.load_items(slice).await {
            Ok(loaded) => Ok(loaded),
            Err(error) => {
                // Nobody will hold this lease: give it back now, so
                // that its expiry does not mark items uncertain that
                // were never handed to an executor.
                if let Err(release) = outcomes::end_lease(
                    &self.store,
                    slice.slice_id,
                    slice.fencing_token,
                    caller,
                    true,
                )
                .await
                {
                    tracing::warn!(%release, slice.id = slice.slice_id.get(), "cannot release a slice whose claim failed");
                }
                Err(error.into())
            }
        }
    }

    /// [`Self::hand_out_items`] before its error handling: the window of
    /// items to hand out, the unsendable items failed first when there are
    /// any (then the window again), and the items of the window.
    async fn load_items(&self, slice: &LeasedSlice) -> Result<Vec<LeasedItem>, StoreError> {
        let limit = redrive_proto::limits::MAX_CLAIM_ITEM_BYTES;
        let mut window = self
            .store
            .claim_window(slice.slice_id, self.claim_max_bytes, limit)
            .await?;
        if window.unsendable {
            let failed = self
                .store
                .fail_unsendable(slice.slice_id, slice.fencing_token, limit)
                .await?;
            if failed > 0 {
                tracing::warn!(
                    slice.id = slice.slice_id.get(),
                    failed,
                    limit,
                    "items larger than a claim answer can carry failed"
                );
            }
            window = self
                .store
                .claim_window(slice.slice_id, self.claim_max_bytes, limit)
                .await?;
        }
        match window.through {
            Some(through) => self.store.slice_items(slice.slice_id, through).await,
            None => Ok(Vec::new()),
        }
    }

    /// The claim answer for leased `slice` and its `items`.
    fn slice_message(&self, slice: &LeasedSlice, items: Vec<LeasedItem>) -> v1::Slice {
        v1::Slice {
            slice_id: slice.slice_id.to_string(),
            plan_id: slice.plan_id.to_string(),
            wave: if slice.wave == "canary" {
                v1::Wave::Canary
            } else {
                v1::Wave::Main
            }
            .into(),
            fencing_token: u64::try_from(slice.fencing_token).unwrap_or_default(),
            lease_ttl: Some(duration(self.lease_ttl)),
            rate: Some(slice.rate.clone()),
            ordered: slice.ordered,
            items: items
                .into_iter()
                .map(|item| slice_item(item, &self.checker))
                .collect(),
        }
    }

    /// Renews a lease; says whether to keep publishing.
    ///
    /// # Errors
    /// `FailedPrecondition` for a stale fencing token; store errors.
    pub async fn heartbeat(
        &self,
        slice_id: SliceId,
        token: u64,
        caller: &str,
    ) -> Result<v1::HeartbeatResponse, Error> {
        let state = self
            .store
            .heartbeat(slice_id, parse_token(token)?, caller, self.lease_ttl)
            .await??;
        // The same directive as the lease watch gives.
        let signal = lease_signal(Ok(state));
        Ok(v1::HeartbeatResponse {
            keep_publishing: signal.keep_publishing,
            reason: signal.reason,
        })
    }

    /// Records a batch of outcomes for a slice, each judged by
    /// [`outcomes::judge`]: publish outcomes only for items the lease
    /// marked, under the slice's current token; skip decisions only under
    /// the current, unexpired lease. The rest is refused and recorded with
    /// `caller` ([`outcomes::report_outcomes`]); the answer counts them in
    /// `refused` and says `lease_lost` once the lease expired.
    ///
    /// # Errors
    /// `InvalidArgument` for a malformed event (naming `events[i].field`);
    /// `FailedPrecondition` for a token the slice never had for `caller`;
    /// store errors.
    pub async fn report(
        &self,
        request: v1::ReportOutcomesRequest,
        caller: &str,
    ) -> Result<v1::ReportOutcomesResponse, Error> {
        let slice_id = SliceId::parse("slice_id", &request.slice_id)?;
        let token = parse_token(request.fencing_token)?;
        // Reported events by action (wire number), for the metrics.
        let mut actions = [0_u64; 9];
        let outcomes = request
            .events
            .into_iter()
            .enumerate()
            .map(|(index, event)| {
                let action = v1::AuditAction::try_from(event.action).unwrap_or_default();
                if action == v1::AuditAction::Unspecified {
                    return Err(Error::invalid(
                        format!("events[{index}].action"),
                        "unspecified",
                    ));
                }
                if let Some(count) = usize::try_from(i32::from(action))
                    .ok()
                    .and_then(|index| actions.get_mut(index))
                {
                    *count += 1;
                }
                Ok(Outcome {
                    dead_letter_id: event
                        .dead_letter_id
                        .parse::<i64>()
                        .map(DeadLetterId::new)
                        .map_err(|_| {
                            Error::invalid(format!("events[{index}].dead_letter_id"), "not an id")
                        })?,
                    message_key: storable(event.message_key),
                    action: action.name().to_owned(),
                    reason: storable(event.reason),
                    executor_id: storable(event.executor_id),
                    attempt: i32::try_from(event.attempt.max(1)).unwrap_or(i32::MAX),
                    confirm_latency_us: i64::try_from(event.confirm_latency_us).unwrap_or(i64::MAX),
                    at: event
                        .at
                        .as_ref()
                        .and_then(from_timestamp)
                        .unwrap_or_else(Utc::now),
                })
            })
            .collect::<Result<Vec<_>, Error>>()?;
        let reported =
            outcomes::report_outcomes(&self.store, slice_id, token, caller, &outcomes).await??;
        for (number, count) in actions.into_iter().enumerate() {
            if count > 0
                && let Some(action) = i32::try_from(number)
                    .ok()
                    .and_then(|number| v1::AuditAction::try_from(number).ok())
            {
                self.store.metrics().items_reported(action, count);
            }
        }
        if reported.lease_lost {
            tracing::info!(
                slice.id = slice_id.get(),
                fencing_token = token,
                accepted = reported.accepted,
                refused = reported.refused,
                "outcomes of an expired lease judged"
            );
        }
        Ok(v1::ReportOutcomesResponse {
            accepted: reported.accepted,
            lease_lost: reported.lease_lost,
            // Every event not recorded is refused: the older field says the
            // same for clients that do not know `refused`.
            dropped: reported.refused,
            refused: reported.refused,
        })
    }

    /// Ends a lease (completed, or released for another executor).
    ///
    /// # Errors
    /// `FailedPrecondition` for a stale fencing token; store errors.
    pub async fn complete(
        &self,
        slice_id: SliceId,
        token: u64,
        caller: &str,
        release: bool,
    ) -> Result<(), Error> {
        Ok(
            outcomes::end_lease(&self.store, slice_id, parse_token(token)?, caller, release)
                .await??,
        )
    }

    /// Records a lease's write-ahead mark: its holder may publish items up
    /// to `through_item_id` (a [`v1::SliceItem::item_id`], the item's
    /// position). [`Store::mark_publishing`] says what it changes.
    ///
    /// # Errors
    /// `InvalidArgument` for an item id that is not one; `FailedPrecondition`
    /// (STALE_FENCING_TOKEN) for a stale token or an expired lease; store
    /// errors.
    pub async fn mark_publishing(
        &self,
        slice_id: SliceId,
        token: u64,
        caller: &str,
        through_item_id: &str,
    ) -> Result<(), Error> {
        let position: i64 = through_item_id
            .parse()
            .ok()
            .filter(|position| *position >= 0)
            .ok_or_else(|| {
                Error::invalid(
                    "through_item_id",
                    format!("{through_item_id:?} is not an item id"),
                )
            })?;
        Ok(self
            .store
            .mark_publishing(slice_id, parse_token(token)?, caller, position)
            .await??)
    }
}

/// The executor id recorded for a claim by principal `caller` with
/// `executor_id`: the id itself without authentication (`caller` empty) or
/// when it is the principal's name or starts with it and `/`
/// (`executor-1/0`); else `CALLER as EXECUTOR_ID`.
pub fn recorded_executor(executor_id: &str, caller: &str) -> String {
    let names_caller = caller.is_empty()
        || executor_id == caller
        || executor_id
            .strip_prefix(caller)
            .is_some_and(|rest| rest.starts_with('/'));
    if names_caller {
        executor_id.to_owned()
    } else {
        format!("{caller} as {executor_id}")
    }
}

#[cfg(test)]
mod tests {
    use super::recorded_executor;

    #[test]
    fn a_claimed_executor_id_names_its_principal() {
        assert_eq!(recorded_executor("exec-1", ""), "exec-1");
        assert_eq!(
            recorded_executor("executor-1/0", "executor-1"),
            "executor-1/0"
        );
        assert_eq!(recorded_executor("executor-1", "executor-1"), "executor-1");
        assert_eq!(
            recorded_executor("executor-1/0", "executor-2"),
            "executor-2 as executor-1/0"
        );
        assert_eq!(
            recorded_executor("executor-2/0", "executor"),
            "executor as executor-2/0",
            "a shorter name is not a prefix of someone else's"
        );
    }
}
