//! Slice leases with fencing tokens (docs/design.md, "Executor loop and
//! guarantees": claim in one statement with `FOR UPDATE SKIP LOCKED`; every
//! later write is conditioned on the token), and what a report and a
//! lease's end read and write ([`Tx`](super::Tx)); the rules that judge
//! them are [`crate::leases::outcomes`]'s.
//!
//! - `claim.rs`: leasing a slice and the items its claim answer carries
//!   (within a byte budget; items no answer could carry are failed).
//! - `holder.rs`: what a lease's holder asks while it holds it: the plan's
//!   state, write-ahead marks, renewals, the items a state re-check covers.
//! - `expiry.rs`: the sweep that ends expired leases.
//! - `report.rs`: a report's lease and the end of a lease, in a
//!   [`Tx`](super::Tx).

mod claim;
mod expiry;
mod holder;
mod report;

use std::time::Duration;

use chrono::{DateTime, Utc};
use redrive_proto::v1;

pub use self::claim::ClaimWindow;
pub use self::report::{LeaseEnd, ReportLease};
use super::plans::DestinationMode;
use crate::ids::{DeadLetterId, PlanId, PrecheckId, SliceId};

/// A slice just leased.
#[derive(Debug, Clone)]
pub struct LeasedSlice {
    /// Slice id.
    pub slice_id: SliceId,
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

/// The items of slice `$1` among the dead letters `$2`: their dead-letter
/// id, message key and position. `slice_id + 0` keeps the slice's index out
/// of the choice, so the items are found by `plan_items_dead_letter`, one
/// lookup per id. On the slice's index, with the ids a filter, a generic
/// plan compares every item of the slice with every id (no hashing for a
/// parameter's array): 10,000 items × 1,000 ids, about 90 ms a report
/// (docs/benchmarks.md, "The report's item update").
const SLICE_MEMBERS_SQL: &str = "SELECT dead_letter_id, message_key, position FROM plan_items \
     WHERE dead_letter_id = ANY($2) AND slice_id + 0 = $1";

/// What one slice item weighs in a claim answer, in bytes (SQL over
/// `plan_items i` joined with its dead letter `x`): the body it publishes
/// (the latest repair, else the captured body; `octet_length` reads the
/// stored length without reading the body), its properties, headers, error
/// text and raw content header, and 1 KiB for the rest (ids, keys, names).
pub const ITEM_SIZE_SQL: &str = "(coalesce((SELECT octet_length(v.body) FROM dead_letter_revisions v \
    WHERE v.dead_letter_id = i.dead_letter_id AND v.revision = x.body_revision), octet_length(x.body)) \
    + octet_length(x.properties) + octet_length(x.headers) + coalesce(octet_length(x.error_text), 0) \
    + coalesce(octet_length(x.raw_content_header), 0) + 1024)::bigint";

/// How long a sent key counts as replayed (docs/design.md: replay keys, 7 days).
pub const REPLAY_KEY_WINDOW: Duration = Duration::from_secs(7 * 24 * 3600);
