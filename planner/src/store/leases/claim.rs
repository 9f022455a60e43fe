//! Leasing a slice ([`Store::claim_slice`]) and the items its claim answer
//! carries ([`Store::slice_items`]), within the answer's byte budget
//! ([`Store::claim_window`]; [`Store::fail_unsendable`] fails the items no
//! answer could carry).

use std::time::Duration;

use chrono::{DateTime, Utc};
use redrive_proto::v1;
use sqlx::AssertSqlSafe;

use super::{ITEM_SIZE_SQL, LeasedItem, LeasedSlice, REPLAY_KEY_WINDOW};
use crate::{
    ids::{PlanId, PrecheckId, SliceId},
    store::{
        Store, StoreError,
        audit::lock_plan_audit,
        dead_letters::{DeadLetterRow, columns},
        plans::{DestinationRow, RateRow},
        prechecks::CAME_BACK_SQL,
    },
};

impl Store {
    /// Leases the first claimable slice: a pending slice of a plan in `main`
    /// (or a slice of the current ramp wave of a plan in `canary`), oldest
    /// plan first. Bumps the
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
                WHERE (p.state = $3 OR (p.state = $4 AND s.wave = 'canary' AND s.ramp_step = p.ramp_step)) \
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
    /// Which items of `slice_id` still to publish (pending or uncertain) a
    /// claim hands out, and whether any of them can never be handed out:
    /// the first always, then each next one in position order while the
    /// running sum of their sizes ([`ITEM_SIZE_SQL`]) stays within
    /// `max_bytes` (docs/design.md, "Every input is bounded at the edge");
    /// [`ClaimWindow::unsendable`] when one is larger than
    /// `max_item_bytes`, the most one claim answer can carry
    /// ([`Self::fail_unsendable`] then fails it). Reads sizes only, never
    /// a body: the chosen items are read by [`Self::slice_items`].
    ///
    /// The chosen items are a prefix of the due ones in position order
    /// (every size is positive, so the running sum only grows), so the last
    /// chosen position is all [`Self::slice_items`] needs. Each size is
    /// computed inside its dead letter's lookup (`LATERAL ... OFFSET 0`, one
    /// lookup by key per item, never flattened into a join: as a merge join,
    /// PostgreSQL read the dead-letter table in key order from its first
    /// row up to the slice's last, every dead letter of every earlier slice
    /// again at each claim, slice 6 of a plan: 6,101 rows for 1,000), so the
    /// running sum sorts `(position, size)` pairs, not whole rows with their
    /// bodies (7 of a 1,000-item claim's 14 ms).
    ///
    /// One statement for both answers: the unsendable check used to be a
    /// statement of its own at every claim, computing every size again
    /// under the plan's audit lock (5-12 ms a claim of 1,000, most of it
    /// waiting behind reports) for items that are almost never there.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn claim_window(
        &self,
        slice_id: SliceId,
        max_bytes: usize,
        max_item_bytes: usize,
    ) -> Result<ClaimWindow, StoreError> {
        let query = format!(
            "WITH due AS (SELECT i.position, s.size \
                FROM plan_items i {sized} \
                WHERE i.slice_id = $1 AND i.state IN ('pending', 'uncertain')), \
             running AS (SELECT position, size, sum(size) OVER (ORDER BY position) AS total, \
                row_number() OVER (ORDER BY position) AS n FROM due) \
             SELECT max(position) FILTER (WHERE n = 1 OR total <= $2) AS through, \
                coalesce(bool_or(size > $3), false) AS unsendable \
             FROM running",
            sized = item_size_lateral(),
        );
        // Planned at each claim with its own slice, never from a cached
        // generic plan made while the tables were small.
        let (through, unsendable): (Option<i64>, bool) = sqlx::query_as(AssertSqlSafe(query))
            .persistent(false)
            .bind(slice_id)
            .bind(i64::try_from(max_bytes).unwrap_or(i64::MAX))
            .bind(i64::try_from(max_item_bytes).unwrap_or(i64::MAX))
            .fetch_one(self.pool())
            .await?;
        Ok(ClaimWindow {
            through,
            unsendable,
        })
    }

    /// The items of `slice_id` still to publish (pending or uncertain) up
    /// to position `through` ([`ClaimWindow::through`]), in order, with
    /// their dead letters and what the executor's checks need.
    ///
    /// The items are read as one range of the `(slice_id, position)` index,
    /// never joined as `IN (SELECT position FROM handed)`: planned on
    /// statistics that put one row in a slice, that semi join re-ran the
    /// running sum for every item, slice² rows (a slice of 1,000: 6.5 s and
    /// 1.4 million buffer reads per claim instead of 80 ms;
    /// docs/benchmarks.md, "Pinned"). The body of a repaired dead letter is
    /// its current revision (`body_revision`, the latest:
    /// `RepairDeadLetter` sets it to each revision it adds), read by its
    /// key. An item's replay keys (its key and those a re-key replaced) are
    /// built once per item (`replay_keys`, kept from being inlined by
    /// `OFFSET 0`), not once per audit row a scan of `audit_events` visits:
    /// while the audit is a few pages, PostgreSQL scans it per item (the
    /// first main-wave claims after the canary, 0.5-0.8 s each at 100,000
    /// dead letters). A slice's dead letters are read by key, one lookup
    /// per item (`LATERAL ... OFFSET 0`), as in [`Self::claim_window`].
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn slice_items(
        &self,
        slice_id: SliceId,
        through: i64,
    ) -> Result<Vec<LeasedItem>, StoreError> {
        let query = format!(
            "SELECT d.*, i.position, i.state AS item_state, i.exchange AS item_exchange, \
                i.routing_key AS item_routing_key, i.stale_at AS item_stale_at, i.attempts AS item_attempts, \
                coalesce(rev.body, (SELECT body FROM dead_letters WHERE id = i.dead_letter_id)) AS replay_body, \
                rk.redrive_count, rk.key_replayed, cb.came_back_from \
             FROM plan_items i \
             JOIN LATERAL (SELECT {}, previous_message_keys, first_died_at, body_revision \
                           FROM dead_letters WHERE id = i.dead_letter_id OFFSET 0) d ON true \
             CROSS JOIN LATERAL (SELECT d.previous_message_keys || i.message_key AS replay_keys OFFSET 0) k \
             LEFT JOIN LATERAL (SELECT coalesce(array_agg(DISTINCT x.redrive_plan_id), '{{}}'::text[]) AS came_back_from \
                FROM dead_letters x WHERE x.message_key = i.message_key AND x.destination = d.destination \
                AND x.redrive_plan_id IS NOT NULL) cb ON true \
             LEFT JOIN LATERAL (SELECT count(DISTINCT e.plan_id) FILTER (WHERE e.action = 'sent') AS redrive_count, \
                coalesce(bool_or(e.at > now() - $2 * interval '1 second' \
                                 AND NOT (e.plan_id::text = ANY(cb.came_back_from) AND {came_back}) \
                                 AND (e.action = 'sent' OR e.plan_id <> i.plan_id)), false) AS key_replayed \
                FROM audit_events e WHERE e.message_key = ANY(k.replay_keys) \
                AND e.destination = d.destination \
                AND e.action IN ('sent', 'uncertain')) rk ON true \
             LEFT JOIN dead_letter_revisions rev ON rev.dead_letter_id = i.dead_letter_id \
                AND rev.revision = d.body_revision \
             WHERE i.slice_id = $1 AND i.state IN ('pending', 'uncertain') \
               AND i.position <= $3",
            // The body is read once, as `replay_body`.
            columns(false),
            came_back = CAME_BACK_SQL,
        );
        // Planned at each claim with its own slice, never from a cached
        // generic plan made while the tables were small (the shape that
        // cost d1119e8 its slice² claims).
        let mut rows = sqlx::query_as::<_, LeasedItemRow>(AssertSqlSafe(query))
            .persistent(false)
            .bind(slice_id)
            .bind(i64::try_from(REPLAY_KEY_WINDOW.as_secs()).unwrap_or(i64::MAX))
            .bind(through)
            .fetch_all(self.pool())
            .await?;
        // In position order; sorted here, not by PostgreSQL, which sorted
        // the wide rows, bodies and all (13 of a claim's 46 ms).
        rows.sort_unstable_by_key(|row| row.position);
        rows.into_iter().map(LeasedItem::try_from).collect()
    }

    /// Fails the items of `slice_id` still to publish that are larger
    /// ([`ITEM_SIZE_SQL`]) than `max_bytes`, the most one claim answer can
    /// carry: no executor could ever receive them, so they end `failed` with
    /// an audit event saying why instead of holding the slice forever. Only
    /// while `token` is the slice's current lease. Returns how many. The
    /// dead letters are read by key, one lookup per item, as in
    /// [`Self::claim_window`], which tells when this is needed.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn fail_unsendable(
        &self,
        slice_id: SliceId,
        token: i64,
        max_bytes: usize,
    ) -> Result<u64, StoreError> {
        let query = format!(
            "WITH lease AS (SELECT id, wave, coalesce(lease_owner, '') AS owner FROM plan_slices \
                WHERE id = $1 AND fencing_token = $2 AND state = 'leased'), \
             big AS (SELECT i.plan_id, i.slice_id, i.dead_letter_id, i.message_key, i.attempts, \
                    s.size, l.wave, l.owner, s.destination \
                FROM plan_items i JOIN lease l ON l.id = i.slice_id {sized} \
                WHERE i.slice_id = $1 AND i.state IN ('pending', 'uncertain') AND s.size > $3), \
             failed AS (UPDATE plan_items i SET state = 'failed' FROM big b \
                WHERE i.slice_id = b.slice_id AND i.dead_letter_id = b.dead_letter_id RETURNING i.dead_letter_id), \
             events AS (INSERT INTO audit_events (plan_id, slice_id, dead_letter_id, message_key, destination, action, \
                    reason, wave, executor_id, attempt) \
                SELECT b.plan_id, b.slice_id, b.dead_letter_id, b.message_key, b.destination, 'failed', \
                    format('this item is %s bytes with its body and metadata, above the %s bytes one claim answer \
can carry to an executor; it cannot be replayed', b.size, $3), b.wave, b.owner, greatest(b.attempts, 1) \
                FROM big b) \
             SELECT count(*) FROM failed",
            sized = item_size_lateral(),
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
}

/// Each item's size ([`ITEM_SIZE_SQL`]) and destination, as a lateral `s`
/// beside `plan_items i`: its dead letter read by key, one lookup per item
/// (`OFFSET 0` keeps it from being flattened into a join, which PostgreSQL
/// made a merge join reading the dead-letter table from its first row up
/// to the slice's last). Shared by [`Store::claim_window`] and
/// [`Store::fail_unsendable`], which must agree on every size.
fn item_size_lateral() -> String {
    format!(
        "CROSS JOIN LATERAL (SELECT {ITEM_SIZE_SQL} AS size, x.destination \
            FROM dead_letters x WHERE x.id = i.dead_letter_id OFFSET 0) s"
    )
}

/// A slice as [`Store::claim_slice`] leases it, with its plan's columns.
#[derive(sqlx::FromRow)]
struct LeasedSliceRow {
    id: SliceId,
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

/// What a claim of one slice hands out ([`Store::claim_window`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClaimWindow {
    /// The position of the last item to hand out (all due items up to it);
    /// `None` when no item of the slice is due.
    pub through: Option<i64>,
    /// Some due item is larger than one claim answer can carry.
    pub unsendable: bool,
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
