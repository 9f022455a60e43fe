//! Slice leases with fencing tokens (docs/design.md, "Executor loop and
//! guarantees": claim in one statement with `FOR UPDATE SKIP LOCKED`; every
//! later write is conditioned on the token), and outcome reports.

use std::{collections::HashMap, time::Duration};

use chrono::{DateTime, Utc};
use redrive_proto::{time::timestamp, v1};
use sqlx::{AssertSqlSafe, Postgres, Transaction};

use super::{
    StaleToken, Store, StoreError,
    dead_letters::{DeadLetterRow, columns},
    plans::{DestinationMode, DestinationRow, RateRow, gate_reading_in, notify, transition_in},
};
use crate::{
    gates,
    ids::{DeadLetterId, PlanId, PrecheckId},
    plan_state::{Event, State},
};

/// A slice just leased.
#[derive(Debug, Clone)]
pub struct LeasedSlice {
    /// Slice id.
    pub slice_id: i64,
    /// Its plan.
    pub plan_id: PlanId,
    /// `canary` or `main`.
    pub wave: String,
    /// The token every report must carry.
    pub fencing_token: i64,
    /// The plan's rate.
    pub rate: v1::Rate,
    /// The plan's destination mode.
    pub destination: DestinationMode,
    /// The precheck the plan was made from (its options decide staleness).
    pub precheck_id: PrecheckId,
    /// The plan is ordered (no retry after later items).
    pub ordered: bool,
}

/// A slice item to publish, with its dead letter.
#[derive(Debug, Clone)]
pub struct LeasedItem {
    /// Position in the plan.
    pub position: i64,
    /// The dead letter (captured body in `body`).
    pub dead_letter: v1::DeadLetter,
    /// The body to publish (latest revision, else captured).
    pub replay_body: Vec<u8>,
    /// `pending` or `uncertain`.
    pub state: String,
    /// Attempts made by earlier leases.
    pub attempts: i32,
    /// The key was replayed successfully to this dead letter's destination
    /// within the replay-key window (and that replay did not come back as a
    /// re-dead-letter).
    pub key_replayed: bool,
    /// Plans that replayed this key to this destination before.
    pub redrive_count: i64,
    /// When it first died (the last basis of its age, as the precheck's).
    pub first_died_at: DateTime<Utc>,
    /// Plans (ids as the re-dead-letters' `redrive-plan-id` header says)
    /// whose replay of this key came back as a re-dead-letter in this
    /// destination.
    pub came_back_from: Vec<String>,
    /// Where it is published, decided when the plan was created.
    pub exchange: String,
    /// See [`LeasedItem::exchange`].
    pub routing_key: String,
    /// When it turns stale, decided by its precheck (`None`: no deadline).
    pub stale_at: Option<DateTime<Utc>>,
}

/// An outcome to record.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// Dead letter.
    pub dead_letter_id: DeadLetterId,
    /// Message key.
    pub message_key: String,
    /// Action name (`sent`, ...).
    pub action: String,
    /// Why.
    pub reason: String,
    /// Executor, as the report names it; the audit records the executor id
    /// the lease was claimed with instead.
    pub executor_id: String,
    /// Attempt number (1-based).
    pub attempt: i32,
    /// Publish to confirm, µs.
    pub confirm_latency_us: i64,
    /// When.
    pub at: DateTime<Utc>,
}

/// What [`Store::report_outcomes`] did with a report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reported {
    /// Events recorded.
    pub accepted: u64,
    /// Events refused as late or forged ([`Refusal`]), each recorded in
    /// `refused_outcomes` with the reporting principal.
    pub refused: u64,
    /// The token was not the slice's current, unexpired lease.
    pub lease_lost: bool,
}

/// Why a reported outcome was refused (docs/design.md, "Reports need
/// marks"): the `reason` of a `refused_outcomes` row and the
/// `redrive.refusal.reason` of the `redrive.planner.outcomes.refused`
/// metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Refusal {
    /// A publish outcome ([`PUBLISH_OUTCOMES`]) for an item past the
    /// lease's write-ahead mark: the lease never said it might publish it.
    Unmarked,
    /// The token was a lease of the slice, but not its current one: the
    /// slice was leased again since.
    StaleToken,
    /// The token is the slice's last lease, but that lease ended (the sweep
    /// expired it, or it was released or completed): its mark is gone, and
    /// the sweep already recorded its marked, unreported items `uncertain`.
    LeaseEnded,
    /// A skip decision under a lease that expired but was not swept yet:
    /// skip decisions need the current, unexpired lease.
    LeaseExpired,
    /// The dead letter is not an item of the slice.
    NotInSlice,
    /// The slice never had this token for this principal (a guess, another
    /// principal's lease, or no such slice): the whole report is refused.
    UnknownLease,
}

impl Refusal {
    /// Every reason, in a fixed order.
    pub const ALL: [Self; 6] = [
        Self::Unmarked,
        Self::StaleToken,
        Self::LeaseEnded,
        Self::LeaseExpired,
        Self::NotInSlice,
        Self::UnknownLease,
    ];

    /// The stored and measured name (`unmarked`, `stale_token`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Self::Unmarked => "unmarked",
            Self::StaleToken => "stale_token",
            Self::LeaseEnded => "lease_ended",
            Self::LeaseExpired => "lease_expired",
            Self::NotInSlice => "not_in_slice",
            Self::UnknownLease => "unknown_lease",
        }
    }
}

/// What a report's lease is, as [`Store::report_outcomes`] judges each
/// outcome by it ([`judge`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseStanding {
    /// The token is the slice's fencing token now.
    pub current_token: bool,
    /// ... and the slice is still leased under it (not swept, released or
    /// completed).
    pub held: bool,
    /// ... and the lease has not expired.
    pub unexpired: bool,
    /// The lease's write-ahead mark while it is held (`None`: it marked
    /// nothing it may publish, or it was leased without marks).
    pub mark: Option<i64>,
}

/// Whether an outcome `action` for the slice item at `position` (`None`:
/// not an item of the slice) is accepted under a lease standing as
/// `lease`, or why it is refused. A publish outcome ([`PUBLISH_OUTCOMES`])
/// needs the slice's current token, the lease still held (expired but not
/// swept is fine: its mark still stands) and the item marked; a skip
/// decision needs the current, unexpired lease.
pub fn judge(lease: LeaseStanding, action: &str, position: Option<i64>) -> Option<Refusal> {
    let Some(position) = position else {
        return Some(Refusal::NotInSlice);
    };
    if !lease.current_token {
        return Some(Refusal::StaleToken);
    }
    if !lease.held {
        return Some(Refusal::LeaseEnded);
    }
    if PUBLISH_OUTCOMES.contains(&action) {
        let marked = lease.mark.is_some_and(|mark| position <= mark);
        (!marked).then_some(Refusal::Unmarked)
    } else {
        (!lease.unexpired).then_some(Refusal::LeaseExpired)
    }
}

/// Actions that say what happened to a publish: recorded only for items the
/// reporting lease marked, and also from a lease that expired but was not
/// swept yet ([`judge`]), so the audit never misses a message the broker
/// took.
pub const PUBLISH_OUTCOMES: &[&str] = &["sent", "uncertain", "failed", "unroutable"];

/// Item states that end an item.
pub const FINAL_ITEM_STATES: &[&str] = &[
    "sent",
    "skipped_duplicate",
    "skipped_stale",
    "skipped_state",
    "needs_compensation",
    "failed",
    "unroutable",
];

/// What one slice item weighs in a claim answer, in bytes (SQL over
/// `plan_items i` joined with its dead letter `x`): the body it publishes
/// (the latest repair, else the captured body; `octet_length` reads the
/// stored length without reading the body), its properties, headers, error
/// text and raw content header, and 1 KiB for the rest (ids, keys, names).
pub const ITEM_SIZE_SQL: &str = "(coalesce((SELECT octet_length(v.body) FROM dead_letter_revisions v \
    WHERE v.dead_letter_id = i.dead_letter_id ORDER BY v.revision DESC LIMIT 1), octet_length(x.body)) \
    + octet_length(x.properties) + octet_length(x.headers) + coalesce(octet_length(x.error_text), 0) \
    + coalesce(octet_length(x.raw_content_header), 0) + 1024)::bigint";

/// How long a sent key counts as replayed (docs/design.md: replay keys, 7 days).
pub const REPLAY_KEY_WINDOW: Duration = Duration::from_secs(7 * 24 * 3600);

impl Store {
    /// Leases the first claimable slice: a pending slice of a plan in `main`
    /// (or a canary slice of a plan in `canary`), oldest plan first. Bumps the
    /// fencing token. A lease that expired is not taken over here: the
    /// planner's sweep ([`Store::expire_leases`]) first records what its
    /// holder may have published, then makes the slice pending again.
    /// With `marks_publishing` the lease starts with an empty write-ahead
    /// mark; without it (what a planner from before marks did; the
    /// coordinator refuses such claims) its expiry judges every unreported
    /// item.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn claim_slice(
        &self,
        executor_id: &str,
        principal: &str,
        ttl: Duration,
        marks_publishing: bool,
    ) -> Result<Option<LeasedSlice>, StoreError> {
        let row = sqlx::query_as::<_, LeasedSliceRow>(
            "WITH candidate AS ( \
                SELECT s.id FROM plan_slices s JOIN plans p ON p.id = s.plan_id \
                WHERE (p.state = $3 OR (p.state = $4 AND s.wave = 'canary')) \
                  AND s.state = 'pending' \
                  AND (p.claim_by IS NULL OR p.claim_by > now() OR s.fencing_token > 0) \
                  AND (NOT p.ordered OR NOT EXISTS (SELECT 1 FROM plan_slices e \
                       WHERE e.plan_id = s.plan_id AND e.seq < s.seq AND e.state <> 'completed')) \
                ORDER BY p.approved_at, p.id, s.seq \
                LIMIT 1 FOR UPDATE OF s SKIP LOCKED), \
             leased AS (UPDATE plan_slices s SET state = 'leased', lease_owner = $1, lease_principal = $6, \
                lease_expires_at = now() + $2 * interval '1 millisecond', \
                fencing_token = redrive_next_fencing_token(s.fencing_token), \
                published_through = CASE WHEN $5 THEN -1 END \
             FROM candidate, plans p WHERE s.id = candidate.id AND p.id = s.plan_id \
             RETURNING s.id, s.plan_id, s.wave, s.fencing_token, p.rate_per_second, p.rate_burst, \
                p.rate_rationale, p.destination_mode, p.redirect_exchange, p.redirect_routing_key, p.precheck_id, \
                p.ordered), \
             recorded AS (INSERT INTO slice_leases (slice_id, fencing_token, principal, executor_id) \
                SELECT id, fencing_token, $6, $1 FROM leased) \
             SELECT * FROM leased",
        )
        .bind(executor_id)
        .bind(i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX))
        .bind(v1::PlanState::Main.name())
        .bind(v1::PlanState::Canary.name())
        .bind(marks_publishing)
        .bind(principal)
        .fetch_optional(self.pool())
        .await?;
        Ok(row.map(LeasedSlice::from))
    }

    /// Ends every lease that expired: the items its holder had not reported
    /// and may have published become `uncertain` (an audit event each, which
    /// records the key as possibly delivered), and the slice is pending
    /// again for the next claim, which publishes them again with the same
    /// message id. "May have published": up to the lease's write-ahead mark
    /// ([`Store::mark_publishing`]) when its holder marks; every unreported
    /// item when it does not. Items past the mark stay pending, without an
    /// event: nobody published them. Runs in every planner's sweep; `SKIP
    /// LOCKED` keeps two replicas from ending one lease twice. Returns the
    /// plans touched.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn expire_leases(&self) -> Result<Vec<PlanId>, StoreError> {
        let mut transaction = self.pool().begin().await?;
        let plans: Vec<PlanId> = sqlx::query_scalar(
            "WITH expired AS ( \
                SELECT id, plan_id, wave, coalesce(lease_owner, '') AS owner, published_through FROM plan_slices \
                WHERE state = 'leased' AND lease_expires_at < now() FOR UPDATE SKIP LOCKED), \
             released AS ( \
                UPDATE plan_slices s SET state = 'pending', lease_owner = NULL, lease_expires_at = NULL, \
                    published_through = NULL \
                FROM expired e WHERE s.id = e.id RETURNING e.id, e.plan_id, e.wave, e.owner, e.published_through), \
             taken AS ( \
                UPDATE plan_items i SET state = 'uncertain' FROM released r \
                WHERE i.slice_id = r.id AND i.state = 'pending' \
                  AND (r.published_through IS NULL OR i.position <= r.published_through) \
                RETURNING i.plan_id, i.slice_id, i.dead_letter_id, i.message_key, i.attempts, r.wave, r.owner), \
             events AS ( \
                INSERT INTO audit_events (plan_id, slice_id, dead_letter_id, message_key, destination, action, \
                    reason, wave, executor_id, attempt, message_id) \
                SELECT t.plan_id, t.slice_id, t.dead_letter_id, t.message_key, d.destination, 'uncertain', \
                    'the lease of ' || t.owner || ' expired after it may have published this item and before \
it reported it; the next lease publishes it again with the same message id', t.wave, t.owner, \
                    greatest(t.attempts, 1), d.message_id \
                FROM taken t LEFT JOIN dead_letters d ON d.id = t.dead_letter_id) \
             SELECT plan_id FROM released",
        )
        .fetch_all(&mut *transaction)
        .await?;
        // One row per expired lease: counted, then one per plan.
        let expired = u64::try_from(plans.len()).unwrap_or(u64::MAX);
        let plans: Vec<PlanId> = {
            let mut seen = std::collections::HashSet::new();
            plans
                .into_iter()
                .filter(|plan| seen.insert(*plan))
                .collect()
        };
        for plan_id in &plans {
            notify(&mut transaction, *plan_id).await?;
        }
        transaction.commit().await?;
        self.metrics.leases_expired(expired);
        Ok(plans)
    }

    /// The plan a lease publishes for and its state, while `token` is the
    /// slice's current, unexpired lease; [`StaleToken`] otherwise.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn lease_state(
        &self,
        slice_id: i64,
        token: i64,
        principal: &str,
    ) -> Result<Result<(PlanId, State), StaleToken>, StoreError> {
        let state: Option<(PlanId, State)> = sqlx::query_as(
            "SELECT p.id, p.state FROM plan_slices s JOIN plans p ON p.id = s.plan_id \
             WHERE s.id = $1 AND s.fencing_token = $2 AND s.lease_principal = $3 AND s.state = 'leased' \
               AND s.lease_expires_at > now()",
        )
        .bind(slice_id)
        .bind(token)
        .bind(principal)
        .fetch_optional(self.pool())
        .await?;
        Ok(state.ok_or(StaleToken { slice_id, token }))
    }

    /// Records the write-ahead mark of a lease: its holder may publish the
    /// slice's items up to `position` (docs/design.md, "Precise uncertain
    /// items"). A mark never moves back. Only while `token` is the slice's
    /// current, unexpired lease: the `UPDATE` re-reads the row after a
    /// concurrent [`Store::expire_leases`], so a mark is either recorded
    /// before the lease ends (and its items judged by it) or refused.
    ///
    /// # Errors
    /// `Ok(Err(StaleToken))` for a stale token or an expired lease;
    /// [`StoreError`].
    pub async fn mark_publishing(
        &self,
        slice_id: i64,
        token: i64,
        principal: &str,
        position: i64,
    ) -> Result<Result<(), StaleToken>, StoreError> {
        let marked = sqlx::query(
            // NULL stays NULL: a holder that did not claim with marks is
            // judged by the old rule whatever it sends.
            "UPDATE plan_slices SET published_through = CASE WHEN published_through IS NULL THEN NULL \
                ELSE greatest(published_through, $3) END \
             WHERE id = $1 AND fencing_token = $2 AND lease_principal = $4 AND state = 'leased' \
               AND lease_expires_at > now()",
        )
        .bind(slice_id)
        .bind(token)
        .bind(position)
        .bind(principal)
        .execute(self.pool())
        .await?
        .rows_affected();
        Ok(if marked == 1 {
            Ok(())
        } else {
            Err(StaleToken { slice_id, token })
        })
    }

    /// The items of `slice_id` still to publish (pending or uncertain), in
    /// order, as many as fit in `max_bytes` (docs/design.md, "Every input is
    /// bounded at the edge"): the first one always, then each next one while
    /// the running sum of their sizes ([`ITEM_SIZE_SQL`]) stays within the
    /// budget. Only the chosen rows' bodies are read; the rest stay pending
    /// for the next lease of the slice.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn slice_items(
        &self,
        slice_id: i64,
        max_bytes: usize,
    ) -> Result<Vec<LeasedItem>, StoreError> {
        let query = format!(
            "WITH due AS (SELECT i.position, {ITEM_SIZE_SQL} AS size \
                FROM plan_items i JOIN dead_letters x ON x.id = i.dead_letter_id \
                WHERE i.slice_id = $1 AND i.state IN ('pending', 'uncertain')), \
             running AS (SELECT position, sum(size) OVER (ORDER BY position) AS total, \
                row_number() OVER (ORDER BY position) AS n FROM due), \
             handed AS (SELECT position FROM running WHERE n = 1 OR total <= $3) \
             SELECT d.*, i.position, i.state AS item_state, i.exchange AS item_exchange, \
                i.routing_key AS item_routing_key, i.stale_at AS item_stale_at, \
                (SELECT first_died_at FROM dead_letters WHERE id = i.dead_letter_id) AS first_died_at, i.attempts AS item_attempts, \
                coalesce(rev.body, (SELECT body FROM dead_letters WHERE id = i.dead_letter_id)) AS replay_body, \
                rk.redrive_count, rk.key_replayed, cb.came_back_from \
             FROM plan_items i \
             JOIN LATERAL (SELECT {}, previous_message_keys FROM dead_letters WHERE id = i.dead_letter_id) d ON true \
             LEFT JOIN LATERAL (SELECT coalesce(array_agg(DISTINCT x.redrive_plan_id), '{{}}'::text[]) AS came_back_from \
                FROM dead_letters x WHERE x.message_key = i.message_key AND x.destination = d.destination \
                AND x.redrive_plan_id IS NOT NULL) cb ON true \
             LEFT JOIN LATERAL (SELECT count(DISTINCT e.plan_id) FILTER (WHERE e.action = 'sent') AS redrive_count, \
                coalesce(bool_or(e.at > now() - $2 * interval '1 second' \
                                 AND NOT (e.plan_id::text = ANY(cb.came_back_from) AND {came_back}) \
                                 AND (e.action = 'sent' OR e.plan_id <> i.plan_id)), false) AS key_replayed \
                FROM audit_events e WHERE e.message_key = ANY(d.previous_message_keys || i.message_key) \
                AND e.destination = d.destination \
                AND e.action IN ('sent', 'uncertain')) rk ON true \
             LEFT JOIN LATERAL (SELECT body FROM dead_letter_revisions v WHERE v.dead_letter_id = i.dead_letter_id \
                                ORDER BY revision DESC LIMIT 1) rev ON true \
             WHERE i.slice_id = $1 AND i.state IN ('pending', 'uncertain') \
               AND i.position IN (SELECT position FROM handed) ORDER BY i.position",
            // The body is read once, as `replay_body`.
            columns(false),
            came_back = super::prechecks::CAME_BACK_SQL,
        );
        let rows = sqlx::query_as::<_, LeasedItemRow>(AssertSqlSafe(query))
            .bind(slice_id)
            .bind(i64::try_from(REPLAY_KEY_WINDOW.as_secs()).unwrap_or(i64::MAX))
            .bind(i64::try_from(max_bytes).unwrap_or(i64::MAX))
            .fetch_all(self.pool())
            .await?;
        rows.into_iter().map(LeasedItem::try_from).collect()
    }

    /// Which of `ids` are items of `slice_id`, and the slice's plan, while
    /// `token` is the slice's current, unexpired lease held by `principal`
    /// (the test of [`Store::lease_state`]): what a state re-check may ask
    /// about.
    ///
    /// # Errors
    /// `Ok(Err(StaleToken))` when the token is not that lease; [`StoreError`].
    pub async fn lease_items(
        &self,
        slice_id: i64,
        token: i64,
        principal: &str,
        ids: &[DeadLetterId],
    ) -> Result<Result<(PlanId, Vec<DeadLetterId>), StaleToken>, StoreError> {
        let plan_id: Option<PlanId> = sqlx::query_scalar(
            "SELECT plan_id FROM plan_slices WHERE id = $1 AND fencing_token = $2 AND lease_principal = $3 \
               AND state = 'leased' AND lease_expires_at > now()",
        )
        .bind(slice_id)
        .bind(token)
        .bind(principal)
        .fetch_optional(self.pool())
        .await?;
        let Some(plan_id) = plan_id else {
            return Ok(Err(StaleToken { slice_id, token }));
        };
        let members: Vec<DeadLetterId> = sqlx::query_scalar(
            "SELECT dead_letter_id FROM plan_items WHERE slice_id = $1 AND dead_letter_id = ANY($2)",
        )
        .bind(slice_id)
        .bind(ids)
        .fetch_all(self.pool())
        .await?;
        Ok(Ok((plan_id, members)))
    }

    /// Fails the items of `slice_id` still to publish that are larger
    /// ([`ITEM_SIZE_SQL`]) than `max_bytes`, the most one claim answer can
    /// carry: no executor could ever receive them, so they end `failed` with
    /// an audit event saying why instead of holding the slice forever. Only
    /// while `token` is the slice's current lease. Returns how many.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn fail_unsendable(
        &self,
        slice_id: i64,
        token: i64,
        max_bytes: usize,
    ) -> Result<u64, StoreError> {
        let query = format!(
            "WITH lease AS (SELECT id, wave, coalesce(lease_owner, '') AS owner FROM plan_slices \
                WHERE id = $1 AND fencing_token = $2 AND state = 'leased'), \
             big AS (SELECT i.plan_id, i.slice_id, i.dead_letter_id, i.message_key, i.attempts, \
                    {ITEM_SIZE_SQL} AS size, l.wave, l.owner, x.destination \
                FROM plan_items i JOIN dead_letters x ON x.id = i.dead_letter_id JOIN lease l ON l.id = i.slice_id \
                WHERE i.slice_id = $1 AND i.state IN ('pending', 'uncertain') AND {ITEM_SIZE_SQL} > $3), \
             failed AS (UPDATE plan_items i SET state = 'failed' FROM big b \
                WHERE i.slice_id = b.slice_id AND i.dead_letter_id = b.dead_letter_id RETURNING i.dead_letter_id), \
             events AS (INSERT INTO audit_events (plan_id, slice_id, dead_letter_id, message_key, destination, action, \
                    reason, wave, executor_id, attempt) \
                SELECT b.plan_id, b.slice_id, b.dead_letter_id, b.message_key, b.destination, 'failed', \
                    format('this item is %s bytes with its body and metadata, above the %s bytes one claim answer \
can carry to an executor; it cannot be replayed', b.size, $3), b.wave, b.owner, greatest(b.attempts, 1) \
                FROM big b) \
             SELECT count(*) FROM failed"
        );
        let failed: i64 = sqlx::query_scalar(AssertSqlSafe(query))
            .bind(slice_id)
            .bind(token)
            .bind(i64::try_from(max_bytes).unwrap_or(i64::MAX))
            .fetch_one(self.pool())
            .await?;
        Ok(u64::try_from(failed).unwrap_or_default())
    }

    /// Renews the lease while it has not expired (the same test as
    /// [`Store::lease_state`] and a report's current lease); answers the
    /// plan's state.
    ///
    /// # Errors
    /// `Ok(Err(StaleToken))` when the token is not the slice's current lease.
    pub async fn heartbeat(
        &self,
        slice_id: i64,
        token: i64,
        principal: &str,
        ttl: Duration,
    ) -> Result<Result<State, StaleToken>, StoreError> {
        let state: Option<State> = sqlx::query_scalar(
            "UPDATE plan_slices s SET lease_expires_at = now() + $3 * interval '1 millisecond' \
             FROM plans p WHERE s.id = $1 AND s.fencing_token = $2 AND s.lease_principal = $4 \
               AND s.state = 'leased' AND s.lease_expires_at > now() AND p.id = s.plan_id \
             RETURNING p.state",
        )
        .bind(slice_id)
        .bind(token)
        .bind(i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX))
        .bind(principal)
        .fetch_optional(self.pool())
        .await?;
        Ok(state.ok_or(StaleToken { slice_id, token }))
    }

    /// Records outcomes of a slice in one transaction: audit events appended
    /// (each with its dead letter's destination: a `sent` or `uncertain`
    /// event is also the replay record of its key, docs/design.md, "What a
    /// report writes"), item states and attempts updated.
    ///
    /// Each outcome is judged by [`judge`] (docs/design.md, "Reports need
    /// marks"): a publish outcome ([`PUBLISH_OUTCOMES`]) is recorded only
    /// for an item the reporting lease marked as publishing, and only while
    /// `token` is the slice's current token and the slice still leased
    /// under it (an expired lease the sweep has not ended yet still counts);
    /// a skip decision only under the current, unexpired lease. Under an
    /// expired lease the answer says the lease is lost, and failures do not
    /// end their items (the next holder retries them). Every other outcome
    /// is refused: one `refused_outcomes` row each, with `principal` and the
    /// [`Refusal`], counted in the `redrive.planner.outcomes.refused`
    /// metric. The slice row is locked while checking, so neither a re-lease
    /// nor the sweep can interleave.
    ///
    /// # Errors
    /// `Ok(Err(StaleToken))` for a slice that does not exist or a token it
    /// never had for `principal` (its outcomes are recorded as refused,
    /// [`Refusal::UnknownLease`]); [`StoreError`].
    pub async fn report_outcomes(
        &self,
        slice_id: i64,
        token: i64,
        principal: &str,
        outcomes: &[Outcome],
    ) -> Result<Result<Reported, StaleToken>, StoreError> {
        let mut transaction = self.pool().begin().await?;
        // `FOR KEY SHARE`: the sweep's and a completion's `FOR UPDATE` wait
        // for (or skip) a report in progress, so neither ends the lease
        // under it; but the holder's renewals and write-ahead marks, plain
        // `UPDATE`s of non-key columns, do not wait behind the report's
        // inserts (they would hold publishing back for as long).
        let lease = sqlx::query_as::<_, LeaseRow>(
            "SELECT s.plan_id, s.wave, l.executor_id, s.fencing_token = $2 AS current_token, \
                (s.fencing_token = $2 AND s.state = 'leased') AS held, \
                (s.fencing_token = $2 AND s.state = 'leased' AND s.lease_expires_at > now()) AS unexpired, \
                CASE WHEN s.fencing_token = $2 AND s.state = 'leased' THEN s.published_through END AS mark \
             FROM plan_slices s JOIN slice_leases l \
                ON l.slice_id = s.id AND l.fencing_token = $2 AND l.principal = $3 \
             WHERE s.id = $1 FOR KEY SHARE OF s",
        )
        .bind(slice_id)
        .bind(token)
        .bind(principal)
        .fetch_optional(&mut *transaction)
        .await?;
        let Some(lease) = lease else {
            let refused: Vec<(&Outcome, Refusal)> = outcomes
                .iter()
                .map(|outcome| (outcome, Refusal::UnknownLease))
                .collect();
            record_refusals(&mut transaction, slice_id, token, principal, &refused).await?;
            transaction.commit().await?;
            self.count_refusals(&refused);
            if !refused.is_empty() {
                tracing::warn!(
                    slice.id = slice_id,
                    fencing_token = token,
                    principal,
                    refused = refused.len(),
                    "outcomes refused: a token the slice never had for this principal"
                );
            }
            return Ok(Err(StaleToken { slice_id, token }));
        };
        let standing = LeaseStanding {
            current_token: lease.current_token,
            held: lease.held,
            unexpired: lease.unexpired,
            mark: lease.mark,
        };
        // What is recorded about an item (its message key; its destination,
        // below) comes from the plan's own rows, never from the report: a
        // report says only which item had which outcome.
        let ids: Vec<DeadLetterId> = outcomes.iter().map(|o| o.dead_letter_id).collect();
        let members: HashMap<DeadLetterId, (String, i64)> =
            sqlx::query_as::<_, (DeadLetterId, String, i64)>(
                "SELECT dead_letter_id, message_key, position FROM plan_items \
                 WHERE slice_id = $1 AND dead_letter_id = ANY($2)",
            )
            .bind(slice_id)
            .bind(&ids)
            .fetch_all(&mut *transaction)
            .await?
            .into_iter()
            .map(|(id, key, position)| (id, (key, position)))
            .collect();
        let mut accepted: Vec<&Outcome> = Vec::with_capacity(outcomes.len());
        let mut refused: Vec<(&Outcome, Refusal)> = Vec::new();
        for outcome in outcomes {
            let position = members.get(&outcome.dead_letter_id).map(|(_, p)| *p);
            match judge(standing, &outcome.action, position) {
                None => accepted.push(outcome),
                Some(refusal) => refused.push((outcome, refusal)),
            }
        }
        record_refusals(&mut transaction, slice_id, token, principal, &refused).await?;
        let misnamed = accepted
            .iter()
            .filter(|o| members.get(&o.dead_letter_id).map(|(key, _)| key) != Some(&o.message_key))
            .count();
        if misnamed > 0 {
            tracing::warn!(
                slice.id = slice_id,
                misnamed,
                "outcomes named another message key than their plan item's; the plan item's is recorded"
            );
        }
        if !refused.is_empty() {
            let first = refused.first().map_or("", |(_, refusal)| refusal.name());
            tracing::warn!(
                slice.id = slice_id,
                fencing_token = token,
                principal,
                refused = refused.len(),
                first_reason = first,
                current_lease = lease.unexpired,
                "outcomes refused: late, unmarked or outside the slice"
            );
        }
        let reported = Reported {
            accepted: accepted.len() as u64,
            refused: refused.len() as u64,
            lease_lost: !lease.unexpired,
        };
        if !accepted.is_empty() {
            let keys: Vec<String> = accepted
                .iter()
                .map(|o| members[&o.dead_letter_id].0.clone())
                .collect();
            record_accepted(&mut transaction, slice_id, &lease, &accepted, &keys).await?;
            notify(&mut transaction, lease.plan_id).await?;
        }
        transaction.commit().await?;
        self.count_refusals(&refused);
        Ok(Ok(reported))
    }

    /// Counts `refused` in the `redrive.planner.outcomes.refused` metric,
    /// one measurement per reason present.
    fn count_refusals(&self, refused: &[(&Outcome, Refusal)]) {
        for reason in Refusal::ALL {
            let count = refused.iter().filter(|(_, r)| *r == reason).count();
            self.metrics.outcomes_refused(reason.name(), count as u64);
        }
    }

    /// Ends a lease. With `release`, or when items are left unfinished, the
    /// slice goes back to pending for another lease; otherwise it is completed,
    /// and then the gates are judged at once ([`gates::decide`]): past their
    /// threshold a plan in `main` is paused and one in `canary` aborted;
    /// otherwise the canary wave's last slice starts the observation and the
    /// plan's last slice completes the plan.
    ///
    /// # Errors
    /// `Ok(Err(StaleToken))` for a stale token; [`StoreError`].
    pub async fn complete_slice(
        &self,
        slice_id: i64,
        token: i64,
        principal: &str,
        release: bool,
    ) -> Result<Result<(), StaleToken>, StoreError> {
        let mut transaction = self.pool().begin().await?;
        // Completions of one plan serialize on the plan row, so the last one
        // sees every other slice completed and completes the plan.
        sqlx::query("SELECT 1 FROM plans WHERE id = (SELECT plan_id FROM plan_slices WHERE id = $1) FOR NO KEY UPDATE")
            .bind(slice_id)
            .execute(&mut *transaction)
            .await?;
        let plan_id: Option<PlanId> = sqlx::query_scalar(
            "SELECT plan_id FROM plan_slices WHERE id = $1 AND fencing_token = $2 AND lease_principal = $3 \
                AND state = 'leased' FOR UPDATE",
        )
        .bind(slice_id)
        .bind(token)
        .bind(principal)
        .fetch_optional(&mut *transaction)
        .await?;
        let Some(plan_id) = plan_id else {
            return Ok(Err(StaleToken { slice_id, token }));
        };
        let unfinished: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM plan_items WHERE slice_id = $1 AND NOT (state = ANY($2))",
        )
        .bind(slice_id)
        .bind(FINAL_ITEM_STATES)
        .fetch_one(&mut *transaction)
        .await?;
        let next = if release || unfinished > 0 {
            "pending"
        } else {
            "completed"
        };
        // The mark belongs to this lease: a later holder that does not mark
        // (an older executor, leased by an older planner replica) must be
        // judged by the old rule, not by this lease's mark.
        sqlx::query(
            "UPDATE plan_slices SET state = $2, lease_owner = NULL, lease_expires_at = NULL, \
                published_through = NULL WHERE id = $1",
        )
        .bind(slice_id)
        .bind(next)
        .execute(&mut *transaction)
        .await?;
        // Failures that became final in this slice are judged here, before
        // the plan advances: the gates' decision (pause in main, abort in the
        // canary wave) replaces the completion, so a plan never completes, nor
        // a canary wave ends, past its gates.
        let trip = if next == "completed" {
            gate_reading_in(&mut transaction, plan_id)
                .await?
                .filter(|reading| reading.state.get().is_publishing())
                .and_then(|reading| gates::decide(&reading))
        } else {
            None
        };
        if let Some(trip) = trip {
            transition_in(
                &self.metrics,
                &mut transaction,
                plan_id,
                trip.event,
                gates::GATE_ACTOR,
                &trip.reason,
            )
            .await?;
            self.metrics.gate_tripped(trip.action());
            tracing::warn!(plan.id = %plan_id, reason = %trip.reason, action = trip.action(), "plan gate tripped at the end of a slice");
        } else if next == "completed" {
            // The canary wave done: observe for the plan's window; the plan's
            // last slice done: the plan is complete.
            for event in [Event::CanaryDone, Event::Complete] {
                transition_in(&self.metrics, &mut transaction, plan_id, event, "", "").await?;
            }
        }
        notify(&mut transaction, plan_id).await?;
        transaction.commit().await?;
        Ok(Ok(()))
    }

    /// The id of a plan's latest audit event (0 when it has none): where a
    /// live feed of its new events starts.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn last_audit_event_id(&self, plan_id: PlanId) -> Result<i64, StoreError> {
        Ok(sqlx::query_scalar(
            "SELECT coalesce(max(id), 0)::bigint FROM audit_events WHERE plan_id = $1",
        )
        .bind(plan_id)
        .fetch_one(self.pool())
        .await?)
    }

    /// The audit events of a plan after `after_id`, at most `limit`.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn audit_events(
        &self,
        plan_id: PlanId,
        after_id: i64,
        limit: i64,
    ) -> Result<Vec<(i64, v1::AuditEvent)>, StoreError> {
        let rows = sqlx::query_as::<_, AuditEventRow>(
            "SELECT id, slice_id, dead_letter_id, message_key, action, reason, wave, executor_id, attempt, \
                confirm_latency_us, at FROM audit_events WHERE plan_id = $1 AND id > $2 ORDER BY id LIMIT $3",
        )
        .bind(plan_id)
        .bind(after_id)
        .bind(limit)
        .fetch_all(self.pool())
        .await?;
        Ok(rows
            .into_iter()
            .map(|row| (row.id, row.into_event(plan_id)))
            .collect())
    }
}

/// Most `refused_outcomes` rows one report writes: a report may carry
/// thousands of forged events, and the rows are evidence of who sent
/// them, not a copy of each (the metric and the WARN line count them all).
pub const MAX_REFUSAL_ROWS_PER_REPORT: usize = 64;

/// Appends one `refused_outcomes` row per refused outcome of a report
/// ([`Store::report_outcomes`]), with the reporting principal: the first
/// [`MAX_REFUSAL_ROWS_PER_REPORT`].
async fn record_refusals(
    transaction: &mut Transaction<'_, Postgres>,
    slice_id: i64,
    token: i64,
    principal: &str,
    refused: &[(&Outcome, Refusal)],
) -> Result<(), StoreError> {
    let refused = &refused[..refused.len().min(MAX_REFUSAL_ROWS_PER_REPORT)];
    if refused.is_empty() {
        return Ok(());
    }
    let ids: Vec<DeadLetterId> = refused.iter().map(|(o, _)| o.dead_letter_id).collect();
    let actions: Vec<&str> = refused.iter().map(|(o, _)| o.action.as_str()).collect();
    let reasons: Vec<&str> = refused.iter().map(|(_, r)| r.name()).collect();
    sqlx::query(
        "INSERT INTO refused_outcomes (slice_id, fencing_token, principal, dead_letter_id, action, reason) \
         SELECT $1, $2, $3, u.id, u.action, u.reason \
         FROM UNNEST($4::bigint[], $5::text[], $6::text[]) AS u(id, action, reason)",
    )
    .bind(slice_id)
    .bind(token)
    .bind(principal)
    .bind(&ids)
    .bind(&actions)
    .bind(&reasons)
    .execute(&mut **transaction)
    .await?;
    Ok(())
}

/// Records the accepted outcomes of a report under `lease`: their audit
/// events (with `keys`, the plan items' message keys, one per outcome) and
/// their items' states ([`Store::report_outcomes`]).
async fn record_accepted(
    transaction: &mut Transaction<'_, Postgres>,
    slice_id: i64,
    lease: &LeaseRow,
    outcomes: &[&Outcome],
    keys: &[String],
) -> Result<(), StoreError> {
    let column = |f: &dyn Fn(&Outcome) -> String| outcomes.iter().map(|o| f(o)).collect::<Vec<_>>();
    let ids: Vec<DeadLetterId> = outcomes.iter().map(|o| o.dead_letter_id).collect();
    let actions = column(&|o| o.action.clone());
    let reasons = column(&|o| o.reason.replace('\0', ""));
    // The executor is the one that claimed the lease, whatever the
    // report says.
    let executors = column(&|_| lease.executor_id.clone());
    let attempts: Vec<i32> = outcomes.iter().map(|o| o.attempt).collect();
    let latencies: Vec<i64> = outcomes.iter().map(|o| o.confirm_latency_us).collect();
    let at: Vec<DateTime<Utc>> = outcomes.iter().map(|o| o.at).collect();
    sqlx::query(
        "INSERT INTO audit_events (plan_id, slice_id, dead_letter_id, message_key, destination, action, reason, \
            wave, executor_id, attempt, confirm_latency_us, at, message_id) \
         SELECT $1, $2, u.id, u.key, d.destination, u.action, \
            CASE WHEN u.action = 'sent' AND v.revision IS NOT NULL THEN concat_ws('; ', nullif(u.reason, ''), \
                format('published the repaired body, revision %s by %s: %s', v.revision, v.actor, v.reason)) \
            ELSE u.reason END, \
            $3, u.executor, u.attempt, u.latency, u.at, d.message_id \
         FROM UNNEST($4::bigint[], $5::text[], $6::text[], $7::text[], $8::text[], $9::int[], $10::bigint[], \
                     $11::timestamptz[]) WITH ORDINALITY AS u(id, key, action, reason, executor, attempt, latency, at, n) \
         JOIN dead_letters d ON d.id = u.id \
         LEFT JOIN dead_letter_revisions v ON v.dead_letter_id = d.id AND v.revision = d.body_revision \
         ORDER BY u.n",
    )
    .bind(lease.plan_id)
    .bind(slice_id)
    .bind(&lease.wave)
    .bind(&ids)
    .bind(keys)
    .bind(&actions)
    .bind(&reasons)
    .bind(&executors)
    .bind(&attempts)
    .bind(&latencies)
    .bind(&at)
    .execute(&mut **transaction)
    .await?;
    // The last outcome of an item wins, except that `sent` is never undone
    // (a confirmed publish was delivered, whatever came after) and a final
    // state never goes back to uncertain (a late report of an earlier
    // attempt). Under an expired lease only `sent`, and `uncertain` of a
    // pending item, change the state.
    sqlx::query(
        "UPDATE plan_items i SET state = CASE \
            WHEN i.state = 'sent' THEN i.state \
            WHEN u.action = 'sent' THEN 'sent' \
            WHEN u.action = 'uncertain' AND i.state = ANY($5) THEN i.state \
            WHEN $7 THEN u.action \
            WHEN u.action = 'uncertain' AND i.state = 'pending' THEN 'uncertain' \
            ELSE i.state END, \
            attempts = greatest(i.attempts, u.attempt) \
         FROM (SELECT DISTINCT ON (id) id, action, attempt FROM \
               UNNEST($2::bigint[], $3::text[], $4::int[]) WITH ORDINALITY AS x(id, action, attempt, n) \
               ORDER BY id, (action = 'sent') DESC, n DESC) u \
         WHERE i.plan_id = $1 AND i.slice_id = $6 AND i.dead_letter_id = u.id",
    )
    .bind(lease.plan_id)
    .bind(&ids)
    .bind(&actions)
    .bind(&attempts)
    .bind(FINAL_ITEM_STATES)
    .bind(slice_id)
    .bind(lease.unexpired)
    .execute(&mut **transaction)
    .await?;
    Ok(())
}

/// The audit action named `name`.
pub fn audit_action(name: &str) -> v1::AuditAction {
    use v1::AuditAction as A;
    [
        A::Sent,
        A::SkippedDuplicate,
        A::SkippedStale,
        A::SkippedState,
        A::NeedsCompensation,
        A::Failed,
        A::Unroutable,
        A::Uncertain,
    ]
    .into_iter()
    .find(|action| action.name() == name)
    .unwrap_or(A::Unspecified)
}

/// An audit event row with its dead letter's message id.
#[derive(sqlx::FromRow)]
struct ExportedEventRow {
    #[sqlx(flatten)]
    event: AuditEventRow,
    message_id: Option<String>,
}

/// An audit event row (columns of [`Store::audit_events`]).
#[derive(sqlx::FromRow)]
struct AuditEventRow {
    id: i64,
    slice_id: Option<i64>,
    dead_letter_id: DeadLetterId,
    message_key: String,
    action: String,
    reason: String,
    wave: String,
    executor_id: String,
    attempt: i32,
    confirm_latency_us: i64,
    at: DateTime<Utc>,
}

impl AuditEventRow {
    /// The event of plan `plan_id` in the API shape.
    fn into_event(self, plan_id: PlanId) -> v1::AuditEvent {
        v1::AuditEvent {
            plan_id: plan_id.to_string(),
            slice_id: self.slice_id.map(|id| id.to_string()).unwrap_or_default(),
            dead_letter_id: self.dead_letter_id.to_string(),
            message_key: self.message_key,
            action: audit_action(&self.action).into(),
            reason: self.reason,
            wave: if self.wave == "canary" {
                v1::Wave::Canary
            } else {
                v1::Wave::Main
            }
            .into(),
            executor_id: self.executor_id,
            attempt: u32::try_from(self.attempt).unwrap_or_default(),
            confirm_latency_us: u64::try_from(self.confirm_latency_us).unwrap_or_default(),
            at: Some(timestamp(self.at)),
        }
    }
}

/// A slice as [`Store::claim_slice`] leases it, with its plan's columns.
#[derive(sqlx::FromRow)]
struct LeasedSliceRow {
    id: i64,
    plan_id: PlanId,
    wave: String,
    fencing_token: i64,
    #[sqlx(flatten)]
    rate: RateRow,
    #[sqlx(flatten)]
    destination: DestinationRow,
    precheck_id: PrecheckId,
    ordered: bool,
}

impl From<LeasedSliceRow> for LeasedSlice {
    fn from(row: LeasedSliceRow) -> Self {
        Self {
            slice_id: row.id,
            plan_id: row.plan_id,
            wave: row.wave,
            fencing_token: row.fencing_token,
            rate: row.rate.into(),
            destination: row.destination.into(),
            precheck_id: row.precheck_id,
            ordered: row.ordered,
        }
    }
}

/// The lease a report is checked against ([`Store::report_outcomes`]).
#[derive(sqlx::FromRow)]
struct LeaseRow {
    plan_id: PlanId,
    wave: String,
    /// The executor id the lease was claimed with.
    executor_id: String,
    /// See [`LeaseStanding`].
    current_token: bool,
    /// See [`LeaseStanding`].
    held: bool,
    /// See [`LeaseStanding`].
    unexpired: bool,
    /// See [`LeaseStanding`].
    mark: Option<i64>,
}

/// A row of [`Store::slice_items`]: the dead letter's columns and its item's.
#[derive(sqlx::FromRow)]
struct LeasedItemRow {
    #[sqlx(flatten)]
    dead_letter: DeadLetterRow,
    position: i64,
    replay_body: Vec<u8>,
    item_state: String,
    item_attempts: i32,
    key_replayed: bool,
    redrive_count: i64,
    came_back_from: Vec<String>,
    first_died_at: DateTime<Utc>,
    item_exchange: Option<String>,
    item_routing_key: Option<String>,
    item_stale_at: Option<DateTime<Utc>>,
}

impl TryFrom<LeasedItemRow> for LeasedItem {
    type Error = StoreError;

    /// # Errors
    /// [`StoreError::Corrupt`] when the dead letter does not decode.
    fn try_from(row: LeasedItemRow) -> Result<Self, StoreError> {
        Ok(Self {
            position: row.position,
            dead_letter: row.dead_letter.try_into()?,
            replay_body: row.replay_body,
            state: row.item_state,
            attempts: row.item_attempts,
            key_replayed: row.key_replayed,
            redrive_count: row.redrive_count,
            came_back_from: row.came_back_from,
            first_died_at: row.first_died_at,
            exchange: row.item_exchange.unwrap_or_default(),
            routing_key: row.item_routing_key.unwrap_or_default(),
            stale_at: row.item_stale_at,
        })
    }
}

/// A dead letter with the body a replay publishes ([`Store::dead_letters_by_id`]).
#[derive(sqlx::FromRow)]
struct ReplayedDeadLetterRow {
    #[sqlx(flatten)]
    dead_letter: DeadLetterRow,
    replay_body: Vec<u8>,
}

impl Store {
    /// How many items of the plan no executor attempted (still `pending`:
    /// no outcome, nothing published).
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn never_attempted_count(&self, plan_id: PlanId) -> Result<u64, StoreError> {
        // From the per-slice counts the triggers of migration 0017 keep (as
        // the plan's progress is), not a scan of the plan's items.
        let count: i64 = sqlx::query_scalar(
            "SELECT coalesce(sum(items), 0)::bigint FROM plan_item_counts \
             WHERE plan_id = $1 AND state = 'pending'",
        )
        .bind(plan_id)
        .fetch_one(self.pool())
        .await?;
        Ok(u64::try_from(count).unwrap_or_default())
    }

    /// Up to `limit` items of the plan no executor attempted, after plan
    /// position `after` (-1: from the start), in plan order, each with its
    /// position, its dead letter's message id and its wave.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn never_attempted_items(
        &self,
        plan_id: PlanId,
        after: i64,
        limit: i64,
    ) -> Result<Vec<(i64, v1::UnattemptedItem)>, StoreError> {
        let rows: Vec<(i64, DeadLetterId, String, Option<String>, String)> = sqlx::query_as(
            "SELECT i.position, i.dead_letter_id, i.message_key, d.message_id, s.wave \
             FROM plan_items i JOIN plan_slices s ON s.id = i.slice_id \
             LEFT JOIN dead_letters d ON d.id = i.dead_letter_id \
             WHERE i.plan_id = $1 AND i.state = 'pending' AND i.position > $2 \
             ORDER BY i.position LIMIT $3",
        )
        .bind(plan_id)
        .bind(after)
        .bind(limit)
        .fetch_all(self.pool())
        .await?;
        Ok(rows
            .into_iter()
            .map(
                |(position, dead_letter_id, message_key, message_id, wave)| {
                    (
                        position,
                        v1::UnattemptedItem {
                            dead_letter_id: dead_letter_id.to_string(),
                            message_key,
                            message_id: message_id.unwrap_or_default(),
                            wave: if wave == "canary" {
                                v1::Wave::Canary
                            } else {
                                v1::Wave::Main
                            }
                            .into(),
                        },
                    )
                },
            )
            .collect())
    }

    /// [`Store::audit_events`] with each event's dead letter's message id
    /// (`""` when none; written with the event, so the same after retention
    /// deleted the dead letter), for the export.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn audit_events_with_message_ids(
        &self,
        plan_id: PlanId,
        after_id: i64,
        limit: i64,
    ) -> Result<Vec<(i64, v1::AuditEvent, String)>, StoreError> {
        let rows = sqlx::query_as::<_, ExportedEventRow>(
            "SELECT id, slice_id, dead_letter_id, message_key, action, reason, wave, executor_id, attempt, \
                confirm_latency_us, at, message_id FROM audit_events \
             WHERE plan_id = $1 AND id > $2 ORDER BY id LIMIT $3",
        )
        .bind(plan_id)
        .bind(after_id)
        .bind(limit)
        .fetch_all(self.pool())
        .await?;
        Ok(rows
            .into_iter()
            .map(|row| {
                (
                    row.event.id,
                    row.event.into_event(plan_id),
                    row.message_id.unwrap_or_default(),
                )
            })
            .collect())
    }

    /// Message keys the plan sent, in plan order: the reconciliation list.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn sent_keys(&self, plan_id: PlanId) -> Result<Vec<String>, StoreError> {
        Ok(sqlx::query_scalar("SELECT message_key FROM plan_items WHERE plan_id = $1 AND state = 'sent' ORDER BY position")
            .bind(plan_id)
            .fetch_all(self.pool())
            .await?)
    }

    /// Message keys of sent items with an `uncertain` event: published again
    /// after a lost lease or confirm, so possibly delivered twice. Plan order.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn possibly_duplicated_keys(
        &self,
        plan_id: PlanId,
    ) -> Result<Vec<String>, StoreError> {
        Ok(sqlx::query_scalar(
            // One pass over the plan's uncertain events, not one per item.
            "SELECT i.message_key FROM plan_items i \
             JOIN (SELECT DISTINCT dead_letter_id FROM audit_events WHERE plan_id = $1 AND action = 'uncertain') u \
               ON u.dead_letter_id = i.dead_letter_id \
             WHERE i.plan_id = $1 AND i.state = 'sent' ORDER BY i.position",
        )
        .bind(plan_id)
        .fetch_all(self.pool())
        .await?)
    }

    /// The latest audit event of every item that was not sent (skipped, failed,
    /// unroutable, or still uncertain) that agrees with its state (a `failed`
    /// after its last `uncertain` attempt is the one shown), in plan order.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn not_sent_events(
        &self,
        plan_id: PlanId,
    ) -> Result<Vec<v1::AuditEvent>, StoreError> {
        let rows = sqlx::query_as::<_, AuditEventRow>(
            "SELECT * FROM (SELECT DISTINCT ON (e.dead_letter_id) e.id, e.slice_id, e.dead_letter_id, e.message_key, \
                e.action, e.reason, e.wave, e.executor_id, e.attempt, e.confirm_latency_us, e.at, i.position \
             FROM audit_events e JOIN plan_items i ON i.plan_id = e.plan_id AND i.dead_letter_id = e.dead_letter_id \
             WHERE e.plan_id = $1 AND i.state <> 'sent' \
             ORDER BY e.dead_letter_id, (e.action = i.state) DESC, e.id DESC) last ORDER BY position",
        )
        .bind(plan_id)
        .fetch_all(self.pool())
        .await?;
        Ok(rows
            .into_iter()
            .map(|row| row.into_event(plan_id))
            .collect())
    }
}

impl Store {
    /// The dead letters `ids` with their latest body (repairs) in `body`.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn dead_letters_by_id(
        &self,
        ids: &[DeadLetterId],
    ) -> Result<Vec<v1::DeadLetter>, StoreError> {
        let query = format!(
            "SELECT d.*, coalesce(rev.body, d.body) AS replay_body FROM (SELECT {} FROM dead_letters WHERE id = ANY($1)) d \
             LEFT JOIN LATERAL (SELECT body FROM dead_letter_revisions v WHERE v.dead_letter_id = d.id \
                                ORDER BY revision DESC LIMIT 1) rev ON true",
            columns(true)
        );
        let rows = sqlx::query_as::<_, ReplayedDeadLetterRow>(AssertSqlSafe(query))
            .bind(ids)
            .fetch_all(self.pool())
            .await?;
        rows.into_iter()
            .map(|row| {
                let mut dead_letter = v1::DeadLetter::try_from(row.dead_letter)?;
                dead_letter.body = row.replay_body;
                Ok(dead_letter)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::{LeaseStanding, Refusal, judge};

    const HELD: LeaseStanding = LeaseStanding {
        current_token: true,
        held: true,
        unexpired: true,
        mark: Some(5),
    };

    #[test]
    fn publish_outcomes_need_a_mark_and_skips_an_unexpired_lease() {
        for action in ["sent", "uncertain", "failed", "unroutable"] {
            assert_eq!(judge(HELD, action, Some(5)), None, "{action}");
            assert_eq!(judge(HELD, action, Some(6)), Some(Refusal::Unmarked));
            let unmarked = LeaseStanding { mark: None, ..HELD };
            assert_eq!(judge(unmarked, action, Some(0)), Some(Refusal::Unmarked));
            // Expired but not swept: the mark still stands.
            let expired = LeaseStanding {
                unexpired: false,
                ..HELD
            };
            assert_eq!(judge(expired, action, Some(5)), None);
        }
        for action in [
            "skipped_duplicate",
            "skipped_stale",
            "skipped_state",
            "needs_compensation",
        ] {
            assert_eq!(judge(HELD, action, Some(9)), None, "no mark needed");
            let expired = LeaseStanding {
                unexpired: false,
                ..HELD
            };
            assert_eq!(judge(expired, action, Some(0)), Some(Refusal::LeaseExpired));
        }
    }

    #[test]
    fn an_ended_or_replaced_lease_and_a_stranger_are_refused() {
        let ended = LeaseStanding {
            held: false,
            unexpired: false,
            mark: None,
            ..HELD
        };
        assert_eq!(judge(ended, "sent", Some(0)), Some(Refusal::LeaseEnded));
        let replaced = LeaseStanding {
            current_token: false,
            ..ended
        };
        assert_eq!(judge(replaced, "sent", Some(0)), Some(Refusal::StaleToken));
        assert_eq!(judge(HELD, "sent", None), Some(Refusal::NotInSlice));
        let names: std::collections::HashSet<_> =
            Refusal::ALL.iter().map(|refusal| refusal.name()).collect();
        assert_eq!(names.len(), Refusal::ALL.len(), "distinct names");
    }
}
