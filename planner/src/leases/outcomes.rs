//! The rules of a lease's report and of its end (docs/design.md, "Reports
//! need marks" and "Gates"): which reported outcomes are recorded, which
//! refused and why, and what the gates decide when a slice completes. They
//! decide; [`Tx`] reads and writes, in one transaction each.

use std::collections::HashMap;

use crate::{
    ids::{DeadLetterId, SliceId},
    plan::{gates, state::Event},
    store::{
        StaleToken, Store, StoreError, Tx,
        leases::{Outcome, ReportLease},
    },
};

/// What [`report_outcomes`] did with a report.
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

/// What a report's lease is, as [`report_outcomes`] judges each outcome
/// by it ([`judge`]).
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

/// Most `refused_outcomes` rows one report writes: a report may carry
/// thousands of forged events, and the rows are evidence of who sent
/// them, not a copy of each (the metric and the WARN line count them all).
pub const MAX_REFUSAL_ROWS_PER_REPORT: usize = 64;

impl From<&ReportLease> for LeaseStanding {
    fn from(lease: &ReportLease) -> Self {
        Self {
            current_token: lease.current_token,
            held: lease.held,
            unexpired: lease.unexpired,
            mark: lease.mark,
        }
    }
}

/// Records outcomes of a slice in one transaction: audit events appended
/// (each with its dead letter's destination: a `sent` or `uncertain`
/// event is also the replay record of its key, docs/design.md, "What a
/// report writes"), item states and attempts updated.
///
/// Each outcome is judged by [`judge`] (docs/design.md, "Reports need
/// marks"): a publish outcome ([`PUBLISH_OUTCOMES`]) is recorded only for
/// an item the reporting lease marked as publishing, and only while `token`
/// is the slice's current token and the slice still leased under it (an
/// expired lease the sweep has not ended yet still counts); a skip decision
/// only under the current, unexpired lease. Under an expired lease the
/// answer says the lease is lost, and failures do not end their items (the
/// next holder retries them). Every other outcome is refused: a
/// `refused_outcomes` row each (at most [`MAX_REFUSAL_ROWS_PER_REPORT`]),
/// with `principal` and the [`Refusal`], counted in the
/// `redrive.planner.outcomes.refused` metric. The slice row is locked while
/// checking ([`Tx::report_lease`]), so neither a re-lease nor the sweep can
/// interleave.
///
/// # Errors
/// `Ok(Err(StaleToken))` for a slice that does not exist or a token it
/// never had for `principal` (its outcomes are recorded as refused,
/// [`Refusal::UnknownLease`]); [`StoreError`].
pub async fn report_outcomes(
    store: &Store,
    slice_id: SliceId,
    token: i64,
    principal: &str,
    outcomes: &[Outcome],
) -> Result<Result<Reported, StaleToken>, StoreError> {
    let mut tx = store.begin().await?;
    let Some(lease) = tx.report_lease(slice_id, token, principal).await? else {
        let refused: Vec<(&Outcome, Refusal)> = outcomes
            .iter()
            .map(|outcome| (outcome, Refusal::UnknownLease))
            .collect();
        record_refusals(&mut tx, slice_id, token, principal, &refused).await?;
        tx.commit().await?;
        count_refusals(store, &refused);
        if !refused.is_empty() {
            tracing::warn!(
                slice.id = slice_id.get(),
                fencing_token = token,
                principal,
                refused = refused.len(),
                "outcomes refused: a token the slice never had for this principal"
            );
        }
        return Ok(Err(StaleToken { slice_id, token }));
    };
    let standing = LeaseStanding::from(&lease);
    // What is recorded about an item (its message key; its destination)
    // comes from the plan's own rows, never from the report: a report says
    // only which item had which outcome.
    let ids: Vec<DeadLetterId> = outcomes.iter().map(|o| o.dead_letter_id).collect();
    let members: HashMap<DeadLetterId, (String, i64)> = tx.slice_members(slice_id, &ids).await?;
    let mut accepted: Vec<&Outcome> = Vec::with_capacity(outcomes.len());
    let mut refused: Vec<(&Outcome, Refusal)> = Vec::new();
    for outcome in outcomes {
        let position = members.get(&outcome.dead_letter_id).map(|(_, p)| *p);
        match judge(standing, &outcome.action, position) {
            None => accepted.push(outcome),
            Some(refusal) => refused.push((outcome, refusal)),
        }
    }
    record_refusals(&mut tx, slice_id, token, principal, &refused).await?;
    let misnamed = accepted
        .iter()
        .filter(|o| members.get(&o.dead_letter_id).map(|(key, _)| key) != Some(&o.message_key))
        .count();
    if misnamed > 0 {
        tracing::warn!(
            slice.id = slice_id.get(),
            misnamed,
            "outcomes named another message key than their plan item's; the plan item's is recorded"
        );
    }
    if !refused.is_empty() {
        let first = refused.first().map_or("", |(_, refusal)| refusal.name());
        tracing::warn!(
            slice.id = slice_id.get(),
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
        let items: Vec<(String, i64)> = accepted
            .iter()
            .map(|o| members[&o.dead_letter_id].clone())
            .collect();
        tx.record_outcomes(slice_id, &lease, &accepted, &items)
            .await?;
        tx.notify(lease.plan_id).await?;
    }
    tx.commit().await?;
    count_refusals(store, &refused);
    Ok(Ok(reported))
}

/// Records the first [`MAX_REFUSAL_ROWS_PER_REPORT`] of `refused` in `tx`.
async fn record_refusals(
    tx: &mut Tx,
    slice_id: SliceId,
    token: i64,
    principal: &str,
    refused: &[(&Outcome, Refusal)],
) -> Result<(), StoreError> {
    let rows: Vec<(DeadLetterId, &str, &str)> = refused
        .iter()
        .take(MAX_REFUSAL_ROWS_PER_REPORT)
        .map(|(outcome, refusal)| {
            (
                outcome.dead_letter_id,
                outcome.action.as_str(),
                refusal.name(),
            )
        })
        .collect();
    tx.record_refusals(slice_id, token, principal, &rows).await
}

/// Counts `refused` in the `redrive.planner.outcomes.refused` metric, one
/// measurement per reason present.
fn count_refusals(store: &Store, refused: &[(&Outcome, Refusal)]) {
    for reason in Refusal::ALL {
        let count = refused.iter().filter(|(_, r)| *r == reason).count();
        store
            .metrics()
            .outcomes_refused(reason.name(), count as u64);
    }
}

/// Ends a lease. With `release`, or when items are left unfinished, the
/// slice goes back to pending for another lease; otherwise it is completed,
/// and then the gates are judged at once ([`gates::decide_outcomes`]): past their
/// threshold a plan in `main` is paused and one in `canary` aborted;
/// otherwise the canary wave's last slice starts the observation and the
/// plan's last slice completes the plan. All in one transaction.
///
/// # Errors
/// `Ok(Err(StaleToken))` for a stale token; [`StoreError`].
pub async fn end_lease(
    store: &Store,
    slice_id: SliceId,
    token: i64,
    principal: &str,
    release: bool,
) -> Result<Result<(), StaleToken>, StoreError> {
    let mut tx = store.begin().await?;
    let Some(end) = tx.end_lease(slice_id, token, principal, release).await? else {
        return Ok(Err(StaleToken { slice_id, token }));
    };
    if end.completed {
        // Failures that became final in this slice are judged here, before
        // the plan advances: the gates' decision (pause in main, abort in
        // the canary wave) replaces the completion, so a plan never
        // completes, nor a canary wave ends, past its gates.
        let trip = tx
            .gate_reading(end.plan_id)
            .await?
            .filter(|reading| reading.state.get().is_publishing())
            .and_then(|reading| gates::decide_outcomes(&reading));
        if let Some(trip) = trip {
            tx.transition(end.plan_id, trip.event, gates::GATE_ACTOR, &trip.reason)
                .await?;
            store.metrics().gate_tripped(trip.action());
            tracing::warn!(plan.id = %end.plan_id, reason = %trip.reason, action = trip.action(), "plan gate tripped at the end of a slice");
        } else {
            // The canary wave done: observe for the plan's window; the
            // plan's last slice done: the plan is complete.
            for event in [Event::CanaryDone, Event::Complete] {
                tx.transition(end.plan_id, event, "", "").await?;
            }
        }
    }
    tx.notify(end.plan_id).await?;
    tx.commit().await?;
    Ok(Ok(()))
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
