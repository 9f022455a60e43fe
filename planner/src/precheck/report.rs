//! The precheck report under construction: tallies per verdict and per
//! breakdown, the sample of blocked items, the digest, and the warnings a
//! finished classification gives.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use prost::Message;
use redrive_proto::{
    time::timestamp,
    v1::{self, Verdict},
};
use sha2::{Digest, Sha256};

use super::PrecheckRequest;
use crate::{
    dead_letters::inspect::STILL_ARRIVING_WITHIN as ARRIVALS_WINDOW,
    error::Error,
    ids::{DeadLetterId, PrecheckId},
    precheck::staleness::Coverage,
    store::{
        Store,
        plans::ExchangeOnlyItems,
        prechecks::{Candidate, NearDuplicateKind, NearDuplicates, NearDuplicatesOfBoth},
    },
};

/// Non-replayable items listed in the report itself, at most
/// [`SAMPLE_PER_VERDICT`] of each verdict so that every kind shows.
const SAMPLE_BLOCKED: usize = 20;
/// See [`SAMPLE_BLOCKED`].
const SAMPLE_PER_VERDICT: usize = 5;

/// Running totals of a report, kept per verdict.
#[derive(Debug, Default)]
struct Tally {
    total: u64,
    counts: v1::VerdictCounts,
}

impl Tally {
    fn add(&mut self, verdict: Verdict) {
        self.total += 1;
        let counts = &mut self.counts;
        let slot = match verdict {
            Verdict::Replayable => &mut counts.replayable,
            Verdict::Duplicate => &mut counts.duplicate,
            Verdict::AlreadyReplayed => &mut counts.already_replayed,
            Verdict::Looping => &mut counts.looping,
            Verdict::Stale => &mut counts.stale,
            Verdict::BlockedByState => &mut counts.blocked_by_state,
            Verdict::NeedsCompensation => &mut counts.needs_compensation,
            Verdict::Invalid | Verdict::Unspecified => &mut counts.invalid,
        };
        *slot += 1;
    }
}

/// The report under construction.
#[derive(Debug, Default)]
pub(super) struct ReportBuilder {
    overall: Tally,
    by_reason_class: BTreeMap<String, Tally>,
    by_destination: BTreeMap<String, Tally>,
    by_event_type: BTreeMap<String, Tally>,
    by_schema_version: BTreeMap<String, Tally>,
    by_producer: BTreeMap<String, Tally>,
    by_error_group: BTreeMap<String, Tally>,
    /// Candidates that died after this ([`Self::recent_arrivals`]).
    recent_since: Option<DateTime<Utc>>,
    /// Candidates that died within the arrivals window before the precheck.
    recent_arrivals: u64,
    died_from: Option<DateTime<Utc>>,
    died_to: Option<DateTime<Utc>>,
    pub(super) hook_checked: u64,
    pub(super) hook_blocked: u64,
    sample_blocked: Vec<v1::PrecheckItem>,
    digest: Sha256,
}

impl ReportBuilder {
    pub(super) fn add(&mut self, candidate: &Candidate, verdict: Verdict, reason: &str) {
        self.overall.add(verdict);
        let text = |value: &Option<String>| value.clone().unwrap_or_default();
        self.by_reason_class
            .entry(candidate.reason_class.clone())
            .or_default()
            .add(verdict);
        self.by_destination
            .entry(candidate.destination.clone())
            .or_default()
            .add(verdict);
        self.by_event_type
            .entry(text(&candidate.event_type))
            .or_default()
            .add(verdict);
        self.by_schema_version
            .entry(text(&candidate.schema_version))
            .or_default()
            .add(verdict);
        self.by_producer
            .entry(text(&candidate.producer))
            .or_default()
            .add(verdict);
        self.by_error_group
            .entry(candidate.error_group.clone())
            .or_default()
            .add(verdict);
        if self
            .recent_since
            .is_some_and(|since| candidate.died_at > since)
        {
            self.recent_arrivals += 1;
        }
        self.died_from = Some(
            self.died_from
                .map_or(candidate.died_at, |at| at.min(candidate.died_at)),
        );
        self.died_to = Some(
            self.died_to
                .map_or(candidate.died_at, |at| at.max(candidate.died_at)),
        );
        self.digest.update(candidate.id.get().to_be_bytes());
        self.digest.update(verdict.name().as_bytes());
        self.digest.update(b"\n");
        let of_this_verdict = self
            .sample_blocked
            .iter()
            .filter(|item| item.verdict == verdict as i32)
            .count();
        if verdict != Verdict::Replayable
            && self.sample_blocked.len() < SAMPLE_BLOCKED
            && of_this_verdict < SAMPLE_PER_VERDICT
        {
            self.sample_blocked.push(v1::PrecheckItem {
                dead_letter_id: candidate.id.to_string(),
                message_key: candidate.message_key.clone(),
                verdict: verdict.into(),
                reason: reason.to_owned(),
                destination: candidate.destination.clone(),
                event_type: candidate.event_type.clone(),
                at_send: false,
                message_id: String::new(),
            });
        }
    }
}

/// The warning for a selection spread over several `what`:
/// `heterogeneous selection: N what (a, b, ...)`.
fn heterogeneous<'a>(what: &str, names: impl Iterator<Item = &'a str>) -> String {
    let names: Vec<&str> = names.collect();
    format!(
        "heterogeneous selection: {} {what} ({})",
        names.len(),
        names.join(", ")
    )
}

fn breakdown(map: BTreeMap<String, Tally>) -> Vec<v1::Breakdown> {
    let mut rows: Vec<v1::Breakdown> = map
        .into_iter()
        .map(|(value, tally)| v1::Breakdown {
            value,
            total: tally.total,
            counts: Some(tally.counts),
        })
        .collect();
    rows.sort_by(|a, b| b.total.cmp(&a.total).then_with(|| a.value.cmp(&b.value)));
    rows
}

/// Rows of `PrecheckReport.by_error_group`: the largest groups (a report
/// stays small however badly free error texts fold).
pub const MAX_ERROR_GROUP_ROWS: usize = 100;

/// Dead letters examples are listed for in a warning.
const WARNING_EXAMPLES: usize = 3;

/// The dead letters of a selection keyed by their body hash because no
/// message id or key rule gave a key (their keys start `sha256:`).
#[derive(Debug, Default)]
pub(super) struct BodyHashKeys {
    count: u64,
    examples: Vec<DeadLetterId>,
}

impl BodyHashKeys {
    pub(super) fn add(&mut self, candidate: &Candidate) {
        if candidate.message_key.starts_with("sha256:") {
            self.count += 1;
            if self.examples.len() < WARNING_EXAMPLES {
                self.examples.push(candidate.id);
            }
        }
    }

    /// The report's warning, when any dead letter is keyed by its body hash.
    pub(super) fn warning(&self, total: u64) -> Option<String> {
        (self.count > 0).then(|| {
            format!(
                "{} of {total} dead letters are keyed by their body hash (for example {}): \
                 only byte-identical bodies are duplicates, so a retry with a changed body is \
                 replayed again; each one's capture notes say why (no message_id property, no \
                 value for the --message-key rules) unless a `body` rule chose it",
                self.count,
                dead_letter_list(&self.examples, self.count)
            )
        })
    }
}

/// `dead letter 7`, `dead letters 7, 8, 9`, `dead letters 7, 8, 9, ...`
/// (`ids` of `of` in all).
fn dead_letter_list(ids: &[DeadLetterId], of: u64) -> String {
    let listed = ids
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    let more = if of > ids.len() as u64 { ", ..." } else { "" };
    if of == 1 {
        format!("dead letter {listed}")
    } else {
        format!("dead letters {listed}{more}")
    }
}

/// A message id as a warning quotes it: escaped (no producer text passes
/// for a field) and at most 64 characters.
fn quoted(text: &str) -> String {
    const MOST: usize = 64;
    if text.chars().count() > MOST {
        format!("{:?}...", text.chars().take(MOST).collect::<String>())
    } else {
        format!("{text:?}")
    }
}

/// The report's warning for near-duplicates of `kind`, if there are any
/// (docs/replay.md, "Identity"): how many groups and dead letters, the
/// largest groups with their ids, and what Redrive does with them. Facts for
/// the operator: verdicts do not change.
pub(super) fn near_duplicate_warning(
    kind: NearDuplicateKind,
    found: &NearDuplicates,
) -> Option<String> {
    if found.groups == 0 {
        return None;
    }
    let keys = |keys: i64| {
        if keys == 1 {
            "one message key".to_owned()
        } else {
            format!("{keys} message keys")
        }
    };
    let examples = found
        .examples
        .iter()
        .map(|group| {
            let ids = dead_letter_list(&group.ids, group.dead_letters.unsigned_abs());
            match kind {
                NearDuplicateKind::SameIdOtherBodies => format!(
                    "message id {} to {}: {ids} ({} bodies, {})",
                    quoted(&group.shared),
                    quoted(&group.destination),
                    group.variants,
                    keys(group.keys)
                ),
                NearDuplicateKind::SameBodyOtherIds => {
                    let mut ids_shown: Vec<String> =
                        group.message_ids.iter().map(|id| quoted(id)).collect();
                    if group.variants > ids_shown.len() as i64 {
                        ids_shown.push("...".to_owned());
                    }
                    format!(
                        "body sha256:{}... to {}: {ids} under message ids {} ({} ids, {})",
                        group.shared.get(..12).unwrap_or(&group.shared),
                        quoted(&group.destination),
                        ids_shown.join(", "),
                        group.variants,
                        keys(group.keys)
                    )
                }
            }
        })
        .collect::<Vec<_>>()
        .join("; ");
    let more = if found.groups > found.examples.len() as i64 {
        "; ..."
    } else {
        ""
    };
    Some(match kind {
        NearDuplicateKind::SameIdOtherBodies => format!(
            "near-duplicates, same message id with different bodies: {} message id{} on {} dead \
             letters, for example {examples}{more}. Under one message key all but the earliest \
             are duplicate: right for retries of one message; if they are different messages \
             that reuse an id, key them by a body field (--message-key)",
            found.groups,
            if found.groups == 1 { "" } else { "s" },
            found.dead_letters
        ),
        NearDuplicateKind::SameBodyOtherIds => format!(
            "near-duplicates, same body under different message ids: {} bod{} on {} dead \
             letters, for example {examples}{more}. Under different message keys each is \
             replayed: right for different messages with the same content; if they are one \
             message sent again under fresh ids, key them by a body field or the body \
             (--message-key)",
            found.groups,
            if found.groups == 1 { "y" } else { "ies" },
            found.dead_letters
        ),
    })
}

/// A precheck being classified: its report, the body-hash keys and the
/// staleness coverage so far, and the `COPY` lines of the current chunk.
pub(super) struct Classified {
    pub(super) report: ReportBuilder,
    pub(super) body_hash_keys: BodyHashKeys,
    pub(super) coverage: Coverage,
    /// The replayable dead letters that know only an exchange, counted as
    /// they are classified.
    pub(super) exchange_only: ExchangeOnlyItems,
    /// The chunk's `COPY` lines, sent and emptied after each chunk.
    pub(super) buffer: Vec<u8>,
}

impl Classified {
    /// Nothing classified yet; the digest starts with the encoded selector
    /// and options; the buffer holds `buffer_bytes`.
    pub(super) fn new(request: &PrecheckRequest, buffer_bytes: usize) -> Self {
        let mut report = ReportBuilder {
            recent_since: Some(Utc::now() - ARRIVALS_WINDOW),
            ..ReportBuilder::default()
        };
        report.digest.update(request.selector_proto.encode_to_vec());
        report.digest.update(request.options_proto.encode_to_vec());
        Self {
            report,
            body_hash_keys: BodyHashKeys::default(),
            coverage: Coverage::default(),
            exchange_only: ExchangeOnlyItems::default(),
            buffer: Vec::with_capacity(buffer_bytes),
        }
    }

    /// The report's warnings, in this order: an override, an empty
    /// selection, body-hash keys, near duplicates, staleness coverage and
    /// implausible event times, exchange-only dead letters, mixed
    /// destinations or schema versions, hooks that blocked most, and running
    /// plans to the same destination.
    ///
    /// # Errors
    /// Store errors.
    pub(super) async fn warnings(
        &self,
        store: &Store,
        request: &PrecheckRequest,
        near_duplicates: &NearDuplicatesOfBoth,
    ) -> Result<Vec<String>, Error> {
        let report = &self.report;
        let mut warnings = Vec::new();
        warnings.extend(request.override_warning());
        if report.overall.total == 0 {
            warnings.push("the selection is empty: nothing to replay".to_owned());
        }
        warnings.extend(self.body_hash_keys.warning(report.overall.total));
        warnings.extend(near_duplicate_warning(
            NearDuplicateKind::SameIdOtherBodies,
            &near_duplicates.same_id,
        ));
        warnings.extend(near_duplicate_warning(
            NearDuplicateKind::SameBodyOtherIds,
            &near_duplicates.same_body,
        ));
        warnings.extend(self.coverage.warning());
        warnings.extend(
            self.coverage
                .implausible_warning(request.options.event_time_pointer.as_deref()),
        );
        warnings.extend(exchange_only_warning(&self.exchange_only));
        if report.by_destination.len() > 1 {
            let destinations = report.by_destination.keys().map(String::as_str);
            warnings.push(format!(
                "{}; consider one precheck per destination",
                heterogeneous("destinations", destinations)
            ));
        }
        if report.by_schema_version.len() > 1 {
            let versions = report
                .by_schema_version
                .keys()
                .map(|v| if v.is_empty() { "(none)" } else { v });
            warnings.push(heterogeneous("schema versions", versions));
        }
        if report.hook_checked > 0 && report.hook_blocked * 2 > report.hook_checked {
            warnings.push(format!(
                "state check hooks blocked {} of the {} messages they checked: is the owning service's state what you expect?",
                report.hook_blocked, report.hook_checked
            ));
        }
        warnings.extend(running_plan_warnings(store, report).await?);
        Ok(warnings)
    }

    /// The finished report: the tallies and breakdowns, the sample, the
    /// staleness rows, `warnings` and the digest.
    pub(super) fn into_report(
        self,
        precheck_id: PrecheckId,
        request: &PrecheckRequest,
        now: DateTime<Utc>,
        warnings: Vec<String>,
    ) -> v1::PrecheckReport {
        let report = self.report;
        let digest = hex::encode(report.digest.finalize());
        v1::PrecheckReport {
            precheck_id: precheck_id.to_string(),
            actor: request.actor.clone(),
            created_at: Some(timestamp(now)),
            selector: Some(request.selector_proto.clone()),
            options: Some(request.options_proto.clone()),
            total: report.overall.total,
            counts: Some(report.overall.counts),
            by_reason_class: breakdown(report.by_reason_class),
            by_destination: breakdown(report.by_destination),
            by_event_type: breakdown(report.by_event_type),
            by_schema_version: breakdown(report.by_schema_version),
            by_producer: breakdown(report.by_producer),
            by_error_group: {
                // Free text that folds badly makes many groups: the largest.
                let mut rows = breakdown(report.by_error_group);
                rows.truncate(MAX_ERROR_GROUP_ROWS);
                rows
            },
            recent_arrivals: report.recent_arrivals,
            arrivals_window: Some(redrive_proto::time::duration(
                ARRIVALS_WINDOW.to_std().unwrap_or_default(),
            )),
            died_from: report.died_from.map(timestamp),
            died_to: report.died_to.map(timestamp),
            warnings,
            digest,
            sample_blocked: report.sample_blocked,
            staleness: self.coverage.rows(),
        }
    }
}

/// The warning about replayable dead letters that know only the exchange
/// and routing key they were published with, not their queue; `None`
/// without any.
fn exchange_only_warning(exchange_only: &ExchangeOnlyItems) -> Option<String> {
    if exchange_only.count == 0 {
        return None;
    }
    Some(format!(
        "{} replayable dead letters (for example {}) know only the exchange and routing key they were published with (framework headers), not their queue: a queue-mode plan refuses them; plan them with destination exchange{}, or a redirect{}",
        exchange_only.count,
        exchange_only
            .example
            .map(DeadLetterId::get)
            .unwrap_or_default(),
        if exchange_only.without_exchange > 0 {
            format!(
                " ({} know no exchange either: a redirect only)",
                exchange_only.without_exchange
            )
        } else {
            String::new()
        },
        if exchange_only.replayable > exchange_only.count {
            "; this selection also holds dead letters whose queue is known, which exchange mode would copy to every queue bound to their exchange, so CreatePlan refuses exchange mode for it: precheck the exchange-only ones on their own (for example by source)"
        } else {
            ""
        }
    ))
}

/// One warning per running plan to a destination of the selection:
/// replayed to the queue each died in, the selection would share that
/// plan's destination (and its rate budget).
///
/// # Errors
/// Store errors.
async fn running_plan_warnings(
    store: &Store,
    report: &ReportBuilder,
) -> Result<Vec<String>, Error> {
    let queues: Vec<String> = report
        .by_destination
        .keys()
        .filter(|d| !d.is_empty())
        // `exchange/routing-key` (ingested) or a queue via the default
        // exchange, named as the bucket keys it (where it lands).
        .map(|d| match d.split_once('/') {
            Some((exchange, routing_key)) => {
                crate::store::plans::landing_name(exchange, routing_key)
            }
            None => crate::store::plans::landing_name("", d),
        })
        .collect();
    Ok(store
        .running_plans_to(&queues)
        .await?
        .into_iter()
        .map(|(plan_id, destination)| {
            format!(
                "plan {plan_id} is running to destination {destination}: a replay there would share its rate budget"
            )
        })
        .collect())
}
