//! The precheck: a dry run over a selector that gives every selected dead letter
//! exactly one verdict, first match wins (docs/design.md, "Flow" step 3):
//! `invalid` → `duplicate` → `already_replayed` → `looping` → `stale` → state
//! check (`blocked_by_state` / `needs_compensation`) → `replayable`.
//!
//! Candidates stream from PostgreSQL in id order (which computes key ranks,
//! earlier replays and re-dead-letters), are classified in chunks, the state
//! check hooks are called in batches with bounded concurrency, a few chunks
//! ahead of the one being recorded, and items go back through one `COPY`.
//! Memory is bounded by those few chunks, never by the selection.
//! The digest is SHA-256 over the encoded selector and options and then, per
//! item in id order, the dead letter id and verdict name.

mod classify;
pub mod options;
pub mod policy;
mod report;
mod sources;
pub mod staleness;
pub mod state_check;

pub use self::{
    classify::classify,
    sources::{KNOWN_SOURCES_LISTED, check_sources},
};

use std::sync::Arc;

use chrono::Utc;
use futures::{FutureExt as _, StreamExt};
use redrive_proto::v1::{self, Verdict};
use tracing::{Instrument as _, info};

use self::report::Classified;
use crate::{
    dead_letters::selector::{Selector, Status},
    error::Error,
    ids::{PageToken, PlanId, PrecheckId},
    precheck::options::PrecheckOptions,
    precheck::policy::Policy,
    precheck::state_check::StateChecker,
    store::{
        Store, StoreError,
        prechecks::{Candidate, PrecheckRecord, send_copy},
    },
};

/// Candidates classified per chunk.
const CHUNK: usize = 2000;

/// Chunks judged at once: the one being recorded and the next ones, whose
/// hook calls run meanwhile (all chunks' calls together at most
/// `classify::HOOK_CONCURRENCY` batches at a time).
const CHUNKS_AHEAD: usize = 3;

/// Everything a precheck run needs.
#[derive(Debug)]
pub struct PrecheckRequest {
    /// Who runs it (request metadata).
    pub actor: String,
    /// The selector as sent (for the report and digest).
    pub selector_proto: v1::Selector,
    /// The selector, validated.
    pub selector: Selector,
    /// The effective options (the request's merged with the planner's
    /// policy) as the report shows them and the digest covers them.
    pub options_proto: v1::PrecheckOptions,
    /// The effective options, validated.
    pub options: PrecheckOptions,
    /// With an override of the policy: what it loosened
    /// ([`crate::precheck::policy::Effective::loosened`]).
    pub loosened: Vec<String>,
}

impl PrecheckRequest {
    /// A precheck of `selector` by `actor` with `options` merged with `policy`
    /// (see [`crate::precheck::policy`]).
    ///
    /// # Errors
    /// `InvalidArgument` naming the field of the selector or options (a value
    /// looser than the policy without `override_policy` included).
    pub fn new(
        actor: String,
        selector: v1::Selector,
        options: v1::PrecheckOptions,
        policy: &Policy,
    ) -> Result<Self, Error> {
        let validated = Selector::try_from(selector.clone())?;
        if matches!(validated.status, Status::Archived | Status::All) {
            return Err(Error::invalid(
                "selector.status",
                "a precheck never covers archived dead letters: select open or replayed ones \
                 (or leave it unspecified), and unarchive the archived ones to replay them",
            ));
        }
        let effective = policy.apply(options)?;
        Ok(Self {
            actor,
            selector_proto: selector,
            selector: validated,
            options_proto: effective.options.to_proto(),
            options: effective.options,
            loosened: effective.loosened,
        })
    }

    /// The report's warning line for an override of the policy, if any.
    fn override_warning(&self) -> Option<String> {
        let reason = self.options.policy_override.as_deref()?;
        let loosened = if self.loosened.is_empty() {
            "no option is looser than the policy".to_owned()
        } else {
            format!("looser than the policy: {}", self.loosened.join("; "))
        };
        Some(format!(
            "the planner's precheck policy is overridden by {}: {reason} ({loosened})",
            self.actor
        ))
    }
}

/// Runs a precheck and stores its items and report. A selector naming a
/// source no dead letter was ever stored from is refused before anything is
/// stored.
///
/// # Errors
/// `NotFound` naming `selector.sources[i]` and up to [`KNOWN_SOURCES_LISTED`]
/// known sources, for a source never seen; [`Error::Unavailable`] when a hook
/// fails and the options do not say to block instead (the precheck is
/// recorded as failed); store errors.
#[tracing::instrument(name = "planner.precheck", skip_all, fields(precheck.id = tracing::field::Empty, precheck.total = tracing::field::Empty))]
pub async fn run(
    store: &Store,
    checker: &Arc<StateChecker>,
    request: PrecheckRequest,
) -> Result<v1::PrecheckReport, Error> {
    check_sources(store, &request.selector.sources).await?;
    let precheck_id = PrecheckId::generate();
    tracing::Span::current().record("precheck.id", tracing::field::display(precheck_id));
    store.create_precheck(precheck_id, &request.actor).await?;
    // The precheck row is committed `running`: whatever happens next, even a
    // panic, it ends `done` or `failed`.
    let started = std::time::Instant::now();
    match crate::error::caught(classify_all(store, checker, precheck_id, &request)).await {
        Ok(report) => {
            store.finish_precheck(&report).await?;
            tracing::Span::current().record("precheck.total", report.total);
            store
                .metrics()
                .precheck_ended(started.elapsed(), report.counts.as_ref());
            info!(
                precheck.id = %precheck_id,
                total = report.total,
                replayable = report.counts.as_ref().map_or(0, |c| c.replayable),
                policy_override = request.options.policy_override.is_some(),
                "precheck done"
            );
            Ok(report)
        }
        Err(error) => {
            store.metrics().precheck_ended(started.elapsed(), None);
            let _ = store.fail_precheck(precheck_id, &error.to_string()).await;
            Err(error)
        }
    }
}

/// Classifies every selected candidate, chunk by chunk (one span each), and
/// writes the items through one `COPY` (aborted on an error); then builds
/// the report with its warnings and digest.
async fn classify_all(
    store: &Store,
    checker: &Arc<StateChecker>,
    precheck_id: PrecheckId,
    request: &PrecheckRequest,
) -> Result<v1::PrecheckReport, Error> {
    let options = &request.options;
    let now = Utc::now();
    let with_payload = !checker.is_empty() || options.event_time_pointer.is_some();
    let mut copy = store.copy_precheck_items().await?;
    let mut classified = Classified::new(request, CHUNK * 64);
    let hook_slots = classify::hook_slots();
    // Chunks are judged (rules and hooks) up to `CHUNKS_AHEAD` ahead of the
    // one being recorded, in order: a chunk's hook calls overlap PostgreSQL
    // streaming the next candidates and taking the previous `COPY` lines.
    // One span per chunk (under the precheck's): its judging, its
    // state-check hook calls and its `COPY`.
    let candidates =
        store.stream_candidates(&request.selector, options.replay_key_window, with_payload);
    // The near-duplicates are read beside the stream, in its snapshot, on
    // their own connection (a task: it runs on the other core; dropped with
    // this function, it is cancelled).
    let (near_duplicates, near_duplicates_read) = {
        let store = store.clone();
        let selector = request.selector.clone();
        let snapshot = candidates.snapshot;
        async move {
            match snapshot.await {
                Ok(snapshot) => store.near_duplicates(snapshot, &selector).await,
                // The stream failed before its snapshot; its rows say why.
                Err(_) => Ok(Default::default()),
            }
        }
        .in_current_span()
        .remote_handle()
    };
    tokio::spawn(near_duplicates);
    let mut judged = candidates
        .rows
        .ready_chunks(CHUNK)
        .enumerate()
        .map(|(index, chunk)| judge_chunk(checker, &hook_slots, options, chunk, index, now))
        .buffered(CHUNKS_AHEAD);

    let outcome: Result<(), Error> = async {
        while let Some(next) = judged.next().await {
            let (judged, span) = next?;
            classified.add_judged(options, precheck_id, judged, now);
            send_copy(&mut copy, &mut classified.buffer)
                .instrument(span)
                .await?;
        }
        Ok(())
    }
    .await;
    if let Err(error) = outcome {
        let _ = copy.abort(error.to_string()).await;
        return Err(error);
    }
    copy.finish().await.map_err(StoreError::from)?;

    let near_duplicates = near_duplicates_read.await?;
    let warnings = classified
        .warnings(store, request, &near_duplicates)
        .await?;
    Ok(classified.into_report(precheck_id, request, now, warnings))
}

/// Judges chunk `index` ([`classify::judge`]) in its span, which it returns
/// for the chunk's `COPY`.
async fn judge_chunk<'a>(
    checker: &StateChecker,
    hook_slots: &tokio::sync::Semaphore,
    options: &'a PrecheckOptions,
    chunk: Vec<Result<Candidate, StoreError>>,
    index: usize,
    now: chrono::DateTime<Utc>,
) -> Result<(classify::Judged<'a>, tracing::Span), Error> {
    let span = tracing::info_span!(
        "planner.precheck.chunk",
        precheck.chunk.index = index,
        precheck.chunk.size = chunk.len(),
    );
    let judged = async {
        let chunk = chunk
            .into_iter()
            .collect::<Result<Vec<Candidate>, StoreError>>()?;
        classify::judge(checker, hook_slots, options, chunk, now).await
    }
    .instrument(span.clone())
    .await?;
    Ok((judged, span))
}

/// The report of a finished precheck.
///
/// # Errors
/// `NotFound` for an unknown id; `FailedPrecondition` when it is still running
/// or failed (with its error).
pub async fn get(store: &Store, id: PrecheckId) -> Result<v1::PrecheckReport, Error> {
    match store.get_precheck(id).await? {
        None => Err(Error::NotFound(format!("precheck {id} not found"))),
        Some(PrecheckRecord::Running) => Err(Error::FailedPrecondition(format!(
            "precheck {id} is still running"
        ))),
        Some(PrecheckRecord::Failed(error)) => Err(Error::FailedPrecondition(format!(
            "precheck {id} failed: {error}"
        ))),
        Some(PrecheckRecord::Done(report)) => Ok(*report),
    }
}

/// One page of a precheck's items, optionally of one verdict; with `plan_id`,
/// also that plan's items whose send-time outcome is that verdict (see
/// [`Store::list_precheck_items`]).
///
/// # Errors
/// As [`get`], and `InvalidArgument` for a page size over 1000.
pub async fn list_items(
    store: &Store,
    id: PrecheckId,
    verdict: Option<Verdict>,
    page_size: u32,
    token: PageToken,
    plan_id: Option<PlanId>,
) -> Result<(Vec<v1::PrecheckItem>, String), Error> {
    get(store, id).await?;
    let page_size = crate::ids::page_size(page_size)?;
    let rows = store
        .list_precheck_items(
            id,
            verdict.map(Verdict::name),
            token.after_id,
            page_size + 1,
            plan_id,
        )
        .await?;
    let (items, more) = crate::ids::page_of(rows, page_size);
    let next = match items.last() {
        Some(last) if more => PageToken {
            after_id: last.dead_letter_id.parse().unwrap_or(i64::MAX),
            returned: token.returned + items.len() as u64,
        }
        .encode(),
        _ => String::new(),
    };
    Ok((items, next))
}

#[cfg(test)]
mod tests {
    use super::{
        report::{BodyHashKeys, near_duplicate_warning},
        sources::{closest, edit_distance},
        *,
    };
    use crate::precheck::options::event_time_from_body;
    use crate::{
        ids::DeadLetterId,
        store::prechecks::{NearDuplicateKind, NearDuplicates},
    };
    use chrono::DateTime;
    use std::time::Duration;

    #[test]
    fn an_unknown_source_is_matched_to_the_closest_known_name() {
        let known = ["nt3_orders.dlq", "orders.dlq", "payments.dlq"].map(String::from);
        // A swap of two letters, a missing letter, another case.
        assert_eq!(closest("n3t_orders.dlq", &known), Some("nt3_orders.dlq"));
        assert_eq!(closest("orders.dq", &known), Some("orders.dlq"));
        assert_eq!(closest("Payments.DLQ", &known), Some("payments.dlq"));
        // Nothing near: no guess.
        assert_eq!(closest("invoices", &known), None);
        assert_eq!(closest("x", &known), None);
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
    }

    fn candidate() -> Candidate {
        let now = Utc::now();
        Candidate {
            id: DeadLetterId::new(7),
            message_key: "o-1:order.paid".into(),
            source: "orders.dlq".into(),
            destination: "orders".into(),
            body_oversized: false,
            body_problem: None,
            event_type: Some("payment.captured".into()),
            schema_version: None,
            producer: None,
            reason_class: "rejected".into(),
            error_group: "rejected".into(),
            occurred_at: None,
            first_died_at: now - chrono::Duration::hours(3),
            died_at: now,
            duplicate_of: None,
            replayed: None,
            replayed_certain: true,
            redrives: 0,
            payload: None,
            exchange_only: false,
            without_exchange: false,
        }
    }

    fn options(stale: &[(&str, u64)]) -> PrecheckOptions {
        PrecheckOptions::try_from(v1::PrecheckOptions {
            stale_after: stale
                .iter()
                .map(|(pattern, seconds)| {
                    (
                        (*pattern).to_owned(),
                        prost_types::Duration {
                            seconds: *seconds as i64,
                            nanos: 0,
                        },
                    )
                })
                .collect(),
            ..Default::default()
        })
        .unwrap()
    }

    #[test]
    fn precedence_is_first_match_wins() {
        let now = Utc::now();
        let options = options(&[("payment.*", 3600)]);
        let mut item = candidate();
        item.destination = String::new();
        item.duplicate_of = Some(DeadLetterId::new(1));
        assert_eq!(classify(&item, &options, now).unwrap().0, Verdict::Invalid);
        item.destination = "orders".into();
        assert_eq!(
            classify(&item, &options, now).unwrap().0,
            Verdict::Duplicate
        );
        item.duplicate_of = None;
        item.replayed = Some((PlanId::new(uuid::Uuid::nil()), now));
        item.redrives = 5;
        assert_eq!(
            classify(&item, &options, now).unwrap().0,
            Verdict::AlreadyReplayed
        );
        item.replayed = None;
        assert_eq!(classify(&item, &options, now).unwrap().0, Verdict::Looping);
        item.redrives = 2;
        let (verdict, reason) = classify(&item, &options, now).unwrap();
        assert_eq!(verdict, Verdict::Stale);
        assert!(reason.contains("first death"), "{reason}");
        item.first_died_at = now - chrono::Duration::minutes(5);
        assert_eq!(classify(&item, &options, now), None);
    }

    #[test]
    fn replay_reasons_write_times_as_everything_else_does() {
        // One time format everywhere (issue 17): UTC, `Z`, milliseconds.
        let at = DateTime::parse_from_rfc3339("2026-12-01T08:00:00.123456+02:00")
            .unwrap()
            .with_timezone(&Utc);
        let mut item = candidate();
        item.replayed = Some((PlanId::new(uuid::Uuid::nil()), at));
        for certain in [true, false] {
            item.replayed_certain = certain;
            let (_, reason) = classify(&item, &options(&[]), at).unwrap();
            assert!(reason.contains(" at 2026-12-01T06:00:00.123Z"), "{reason}");
        }
    }

    #[test]
    fn the_most_specific_deadline_applies_and_event_time_counts_first() {
        let now = Utc::now();
        let options = PrecheckOptions {
            event_time_pointer: Some("/at".into()),
            ..options(&[("payment.*", 3600), ("payment.captured", 60), ("*", 10)])
        };
        assert_eq!(
            options.max_age(Some("payment.captured")),
            Some(Duration::from_secs(60))
        );
        assert_eq!(
            options.max_age(Some("payment.refunded")),
            Some(Duration::from_secs(3600))
        );
        assert_eq!(
            options.max_age(Some("order.paid")),
            Some(Duration::from_secs(10))
        );
        let mut item = candidate();
        item.first_died_at = now;
        let at = (now - chrono::Duration::minutes(2)).to_rfc3339();
        item.payload = Some((
            format!(r#"{{"at":"{at}"}}"#).into_bytes(),
            Vec::new(),
            Vec::new(),
        ));
        let (verdict, reason) = classify(&item, &options, now).unwrap();
        assert_eq!(verdict, Verdict::Stale);
        assert!(reason.contains("event time in the body"), "{reason}");
    }

    #[test]
    fn bad_options_name_the_field() {
        let error = PrecheckOptions::try_from(v1::PrecheckOptions {
            stale_after: [(
                "a*b".to_owned(),
                prost_types::Duration {
                    seconds: 1,
                    nanos: 0,
                },
            )]
            .into(),
            ..Default::default()
        })
        .unwrap_err();
        assert!(error.to_string().contains("options.stale_after"), "{error}");
        let error = PrecheckOptions::try_from(v1::PrecheckOptions {
            default_stale_after: Some(prost_types::Duration {
                seconds: -5,
                nanos: 0,
            }),
            ..Default::default()
        })
        .unwrap_err();
        assert!(
            error.to_string().contains("options.default_stale_after"),
            "{error}"
        );
        assert!(event_time_from_body(br#"{"at":1700000000000}"#, "/at").is_some());
    }

    /// A body's event time after the message's first death is not taken
    /// (beyond the clock skew), and the basis says why, apart from a value
    /// that is not a time at all.
    #[test]
    fn a_body_time_after_the_death_is_not_the_age_basis() {
        use crate::precheck::options::{EventBody, body_time_implausible, event_time};
        let options = PrecheckOptions {
            event_time_pointer: Some("/at".to_owned()),
            ..Default::default()
        };
        let death = chrono::DateTime::from_timestamp(1_764_000_000, 0).unwrap();
        let captured = death - chrono::TimeDelta::hours(5);
        let basis = |body: &[u8], occurred_at| {
            event_time(
                &options,
                Some(EventBody {
                    bytes: body,
                    declared_encoding: None,
                }),
                occurred_at,
                death,
            )
        };
        let later = format!(r#"{{"at":{}}}"#, death.timestamp() + 3600);
        let (at, why) = basis(later.as_bytes(), Some(captured));
        assert_eq!(at, captured);
        assert_eq!(
            why,
            "event time at capture; the event time in the body is after its first death"
        );
        assert!(body_time_implausible(why));
        let (at, why) = basis(later.as_bytes(), None);
        assert_eq!(
            (at, why),
            (
                death,
                "first death; the event time in the body is after its first death"
            )
        );
        let (_, why) = basis(br#"{"at":"soon"}"#, None);
        assert_eq!(
            why,
            "first death; the event time in the body is not a plausible time"
        );
        let skewed = format!(r#"{{"at":{}}}"#, death.timestamp() + 120);
        let (at, why) = basis(skewed.as_bytes(), None);
        assert_eq!(
            (at.timestamp(), why),
            (death.timestamp() + 120, "event time in the body")
        );
    }

    #[test]
    fn the_body_hash_warning_counts_and_names_examples() {
        let mut keys = BodyHashKeys::default();
        assert_eq!(keys.warning(3), None, "no warning without body-hash keys");
        for (id, key) in [
            (3, "m-1"),
            (4, "sha256:ab"),
            (9, "sha256:cd"),
            (10, "sha256:ef"),
        ] {
            let mut item = candidate();
            item.id = DeadLetterId::new(id);
            item.message_key = key.into();
            keys.add(&item);
        }
        let mut fifth = candidate();
        fifth.id = DeadLetterId::new(11);
        fifth.message_key = "sha256:01".into();
        keys.add(&fifth);
        let warning = keys.warning(5).unwrap();
        assert!(
            warning.starts_with(
                "4 of 5 dead letters are keyed by their body hash (for example dead letters 4, 9, 10, ...): only byte-identical bodies are duplicates"
            ),
            "{warning}"
        );
        let mut one = BodyHashKeys::default();
        one.add(&fifth);
        assert!(
            one.warning(1)
                .unwrap()
                .contains("(for example dead letter 11)"),
            "{:?}",
            one.warning(1)
        );
    }

    fn group(
        shared: &str,
        ids: &[i64],
        dead_letters: i64,
        variants: i64,
        message_ids: &[&str],
        keys: i64,
    ) -> crate::store::prechecks::NearDuplicateGroup {
        crate::store::prechecks::NearDuplicateGroup {
            shared: shared.into(),
            destination: "orders".into(),
            dead_letters,
            ids: ids.iter().copied().map(DeadLetterId::new).collect(),
            variants,
            message_ids: message_ids.iter().map(|id| (*id).to_owned()).collect(),
            keys,
        }
    }

    #[test]
    fn near_duplicate_warnings_name_groups_ids_and_what_redrive_does() {
        let none = NearDuplicates::default();
        assert_eq!(
            near_duplicate_warning(NearDuplicateKind::SameIdOtherBodies, &none),
            None
        );
        assert_eq!(
            near_duplicate_warning(NearDuplicateKind::SameBodyOtherIds, &none),
            None
        );

        let retries = NearDuplicates {
            groups: 2,
            dead_letters: 6,
            examples: vec![
                group("m-50", &[12, 13, 14, 15], 4, 4, &["m-50"], 1),
                group("m-7\nverdict: replayable", &[20, 21], 2, 2, &["m-7"], 2),
            ],
        };
        let warning =
            near_duplicate_warning(NearDuplicateKind::SameIdOtherBodies, &retries).unwrap();
        assert!(
            warning.starts_with(
                "near-duplicates, same message id with different bodies: 2 message ids on 6 dead letters, \
                 for example message id \"m-50\" to \"orders\": dead letters 12, 13, 14, 15 (4 bodies, one message key); \
                 message id \"m-7\\nverdict: replayable\" to \"orders\": dead letters 20, 21 (2 bodies, 2 message keys). "
            ),
            "a producer's id is quoted and escaped: {warning}"
        );
        assert!(
            warning.contains("all but the earliest are duplicate"),
            "{warning}"
        );

        let commands = NearDuplicates {
            groups: 4,
            dead_letters: 9,
            examples: vec![group(
                "0a1b2c3d4e5f66778899",
                &[30, 31, 32, 33],
                5,
                5,
                &["c-1", "c-2", "c-3"],
                5,
            )],
        };
        let warning =
            near_duplicate_warning(NearDuplicateKind::SameBodyOtherIds, &commands).unwrap();
        assert!(
            warning.starts_with(
                "near-duplicates, same body under different message ids: 4 bodies on 9 dead letters, \
                 for example body sha256:0a1b2c3d4e5f... to \"orders\": dead letters 30, 31, 32, 33, ... \
                 under message ids \"c-1\", \"c-2\", \"c-3\", ... (5 ids, 5 message keys); ...."
            ),
            "{warning}"
        );
        assert!(warning.contains("each is replayed"), "{warning}");
    }
}
