//! Slice leases with fencing tokens (docs/design.md, "Executor loop and
//! guarantees": claim in one statement with `FOR UPDATE SKIP LOCKED`; every
//! later write is conditioned on the token), and what a report and a
//! lease's end read and write ([`Tx`]); the rules that judge them are
//! [`crate::leases::outcomes`]'s.

use std::{collections::HashMap, time::Duration};

use chrono::{DateTime, Utc};
use redrive_proto::v1;
use sqlx::AssertSqlSafe;

use super::{
    StaleToken, Store, StoreError, Tx,
    audit::lock_plan_audit,
    dead_letters::{DeadLetterRow, columns},
    plans::{
        DestinationMode, DestinationRow, GateReading, Moved, RateRow, gate_reading_in, notify,
        transition_in,
    },
};
use crate::{
    ids::{DeadLetterId, PlanId, PrecheckId},
    plan::state::{Event, State},
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
        // The plans' audit locks first, in order (see `lock_plan_audit`);
        // only those plans' leases are ended: one that expires meanwhile
        // waits for the next sweep.
        let mut expiring: Vec<PlanId> = sqlx::query_scalar(
            "SELECT DISTINCT plan_id FROM plan_slices WHERE state = 'leased' AND lease_expires_at < now()",
        )
        .fetch_all(&mut *transaction)
        .await?;
        if expiring.is_empty() {
            return Ok(Vec::new());
        }
        expiring.sort_unstable();
        for plan_id in &expiring {
            lock_plan_audit(&mut transaction, *plan_id).await?;
        }
        let plans: Vec<PlanId> = sqlx::query_scalar(
            "WITH expired AS ( \
                SELECT id, plan_id, wave, coalesce(lease_owner, '') AS owner, published_through FROM plan_slices \
                WHERE state = 'leased' AND lease_expires_at < now() AND plan_id = ANY($1) \
                FOR UPDATE SKIP LOCKED), \
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
        .bind(&expiring)
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
        let mut transaction = self.pool().begin().await?;
        let plan_id: Option<PlanId> =
            sqlx::query_scalar("SELECT plan_id FROM plan_slices WHERE id = $1")
                .bind(slice_id)
                .fetch_optional(&mut *transaction)
                .await?;
        let Some(plan_id) = plan_id else {
            return Ok(0);
        };
        lock_plan_audit(&mut transaction, plan_id).await?;
        let failed: i64 = sqlx::query_scalar(AssertSqlSafe(query))
            .bind(slice_id)
            .bind(token)
            .bind(i64::try_from(max_bytes).unwrap_or(i64::MAX))
            .fetch_one(&mut *transaction)
            .await?;
        transaction.commit().await?;
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
}

/// A report's lease as the store finds it ([`Tx::report_lease`]).
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct ReportLease {
    /// The slice's plan.
    pub plan_id: PlanId,
    /// The slice's wave (`canary` or `main`).
    pub wave: String,
    /// The executor id the lease was claimed with: the audit records it,
    /// whatever a report says.
    pub executor_id: String,
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

/// How a lease ended ([`Tx::end_lease`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseEnd {
    /// The slice's plan.
    pub plan_id: PlanId,
    /// The slice is completed (every item final and not released); else it
    /// is pending again, for another lease.
    pub completed: bool,
}

impl Tx {
    /// The lease a report under `token` from `principal` speaks for, read
    /// with the slice row locked `FOR KEY SHARE` (`None`: the slice never
    /// had this token for this principal, or does not exist).
    ///
    /// The lock: the sweep's and a completion's `FOR UPDATE` wait for (or
    /// skip) a report in progress, so neither ends the lease under it; but
    /// the holder's renewals and write-ahead marks, plain `UPDATE`s of
    /// non-key columns, do not wait behind the report's inserts (they would
    /// hold publishing back for as long).
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn report_lease(
        &mut self,
        slice_id: i64,
        token: i64,
        principal: &str,
    ) -> Result<Option<ReportLease>, StoreError> {
        Ok(sqlx::query_as::<_, ReportLease>(
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
        .fetch_optional(&mut *self.transaction)
        .await?)
    }

    /// The items of slice `slice_id` among `ids`: per dead letter, its plan
    /// item's message key and position. What is recorded about an item
    /// comes from these rows, never from a report.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn slice_members(
        &mut self,
        slice_id: i64,
        ids: &[DeadLetterId],
    ) -> Result<HashMap<DeadLetterId, (String, i64)>, StoreError> {
        Ok(sqlx::query_as::<_, (DeadLetterId, String, i64)>(
            "SELECT dead_letter_id, message_key, position FROM plan_items \
             WHERE slice_id = $1 AND dead_letter_id = ANY($2)",
        )
        .bind(slice_id)
        .bind(ids)
        .fetch_all(&mut *self.transaction)
        .await?
        .into_iter()
        .map(|(id, key, position)| (id, (key, position)))
        .collect())
    }

    /// Ends the lease `token` of `principal` on slice `slice_id`: with
    /// `release`, or when items are left unfinished, the slice goes back to
    /// pending for another lease; otherwise it is completed. Completions of
    /// one plan serialize on the plan row, so the last one sees every other
    /// slice completed. The lease's write-ahead mark goes with it: a later
    /// holder that does not mark is judged by the old rule, not by this
    /// lease's mark.
    ///
    /// # Errors
    /// `Ok(None)` for a token that is not the live lease of `principal`;
    /// [`StoreError`].
    pub async fn end_lease(
        &mut self,
        slice_id: i64,
        token: i64,
        principal: &str,
        release: bool,
    ) -> Result<Option<LeaseEnd>, StoreError> {
        sqlx::query("SELECT 1 FROM plans WHERE id = (SELECT plan_id FROM plan_slices WHERE id = $1) FOR NO KEY UPDATE")
            .bind(slice_id)
            .execute(&mut *self.transaction)
            .await?;
        let plan_id: Option<PlanId> = sqlx::query_scalar(
            "SELECT plan_id FROM plan_slices WHERE id = $1 AND fencing_token = $2 AND lease_principal = $3 \
                AND state = 'leased' FOR UPDATE",
        )
        .bind(slice_id)
        .bind(token)
        .bind(principal)
        .fetch_optional(&mut *self.transaction)
        .await?;
        let Some(plan_id) = plan_id else {
            return Ok(None);
        };
        let unfinished: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM plan_items WHERE slice_id = $1 AND NOT (state = ANY($2))",
        )
        .bind(slice_id)
        .bind(FINAL_ITEM_STATES)
        .fetch_one(&mut *self.transaction)
        .await?;
        let completed = !release && unfinished == 0;
        sqlx::query(
            "UPDATE plan_slices SET state = $2, lease_owner = NULL, lease_expires_at = NULL, \
                published_through = NULL WHERE id = $1",
        )
        .bind(slice_id)
        .bind(if completed { "completed" } else { "pending" })
        .execute(&mut *self.transaction)
        .await?;
        Ok(Some(LeaseEnd { plan_id, completed }))
    }

    /// What the gates count for plan `plan_id` now, in this transaction
    /// (`None`: no such plan).
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn gate_reading(
        &mut self,
        plan_id: PlanId,
    ) -> Result<Option<GateReading>, StoreError> {
        gate_reading_in(&mut self.transaction, plan_id).await
    }

    /// Applies `event` to plan `plan_id` by the transition table
    /// ([`crate::plan::state`]), with its follow-ups; counted in the
    /// metrics. See [`Store::transition_plan`].
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn transition(
        &mut self,
        plan_id: PlanId,
        event: Event,
        actor: &str,
        reason: &str,
    ) -> Result<Moved, StoreError> {
        transition_in(
            &self.metrics,
            &mut self.transaction,
            plan_id,
            event,
            actor,
            reason,
        )
        .await
    }

    /// Tells every planner replica that plan `plan_id` changed, when this
    /// transaction commits.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn notify(&mut self, plan_id: PlanId) -> Result<(), StoreError> {
        notify(&mut self.transaction, plan_id).await
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
