//! The precheck: a dry run over a selector that gives every selected dead letter
//! exactly one verdict, first match wins (docs/design.md, "Flow" step 3):
//! `invalid` → `duplicate` → `already_replayed` → `looping` → `stale` → state
//! check (`blocked_by_state` / `needs_compensation`) → `replayable`.
//!
//! Candidates stream from PostgreSQL in id order (which computes key ranks,
//! earlier replays and re-dead-letters), are classified in chunks, the state
//! check hooks are called in batches with bounded concurrency, and items go back
//! through one `COPY`. Memory is bounded by the chunk, never by the selection.
//! The digest is SHA-256 over the encoded selector and options and then, per
//! item in id order, the dead letter id and verdict name.

pub mod options;
pub mod policy;
pub mod staleness;
pub mod state_check;

use std::{collections::BTreeMap, sync::Arc};

use chrono::{DateTime, Utc};
use futures::StreamExt;
use prost::Message;
use redrive_proto::{
    time::{age_text, timestamp},
    v1::{self, Verdict},
};
use sha2::{Digest, Sha256};
use tracing::{Instrument as _, info};

use crate::{
    dead_letters::inspect::{DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE},
    dead_letters::selector::{Selector, Status},
    error::Error,
    ids::{DeadLetterId, PageToken, PlanId, PrecheckId},
    precheck::options::{Deadline, DeadlineRule, EventBody, PrecheckOptions},
    precheck::policy::Policy,
    precheck::staleness::{Aged, Coverage},
    precheck::state_check::{StateCheckError, StateChecker, StateDecision},
    store::{
        Store, StoreError,
        prechecks::{
            Candidate, NearDuplicateKind, NearDuplicates, PrecheckRecord, copy_line, send_copy,
        },
    },
};

/// Hook batches in flight at once.
const HOOK_CONCURRENCY: usize = 4;
/// Candidates classified per chunk.
const CHUNK: usize = 2000;
/// Non-replayable items listed in the report itself, at most
/// [`SAMPLE_PER_VERDICT`] of each verdict so that every kind shows.
const SAMPLE_BLOCKED: usize = 20;
/// See [`SAMPLE_BLOCKED`].
const SAMPLE_PER_VERDICT: usize = 5;

/// The compression a candidate's message declares (its stored properties
/// and headers, loaded with its body), for reading its body as capture did.
fn declared_encoding(candidate: &Candidate) -> Option<String> {
    let (_, properties, headers) = candidate.payload.as_ref()?;
    let properties = v1::MessageProperties::decode(properties.as_slice()).unwrap_or_default();
    let headers = v1::HeaderTable::decode(headers.as_slice()).unwrap_or_default();
    crate::dead_letters::body::declared_encoding(&properties, &headers)
}

/// A candidate's body for the event time pointer, when loaded.
fn event_body<'a>(candidate: &'a Candidate, declared: Option<&'a str>) -> Option<EventBody<'a>> {
    candidate.payload.as_ref().map(|(body, _, _)| EventBody {
        bytes: body.as_slice(),
        declared_encoding: declared,
    })
}

/// A candidate's deadline under `options` ([`PrecheckOptions::deadline_of`]);
/// `declared`: its declared encoding ([`declared_encoding`]).
fn deadline<'a>(
    candidate: &Candidate,
    declared: Option<&str>,
    options: &'a PrecheckOptions,
) -> Option<Deadline<'a>> {
    options.deadline_of(
        candidate.event_type.as_deref(),
        &candidate.source,
        event_body(candidate, declared),
        candidate.occurred_at,
        candidate.first_died_at,
    )
}

/// What the staleness coverage needs of a candidate.
fn aged<'a>(candidate: &'a Candidate, declared: Option<&'a str>) -> Aged<'a> {
    Aged {
        id: candidate.id,
        event_type: candidate.event_type.as_deref(),
        body: event_body(candidate, declared),
        occurred_at: candidate.occurred_at,
        first_died_at: candidate.first_died_at,
    }
}

/// The verdict of a candidate before the state check, or `None` when it goes
/// on to the state check.
pub fn classify(
    candidate: &Candidate,
    options: &PrecheckOptions,
    now: DateTime<Utc>,
) -> Option<(Verdict, String)> {
    classify_with(
        candidate,
        options,
        deadline(candidate, declared_encoding(candidate).as_deref(), options).as_ref(),
        now,
    )
}

/// [`classify`] with the candidate's deadline already read.
fn classify_with(
    candidate: &Candidate,
    options: &PrecheckOptions,
    deadline: Option<&Deadline<'_>>,
    now: DateTime<Utc>,
) -> Option<(Verdict, String)> {
    if candidate.destination.is_empty() {
        // Extraction says why when it knows (only an exchange and a routing
        // key, which queue mode never publishes as a queue name).
        let reason = candidate.body_problem.as_ref().map_or_else(
            || "no resolvable destination".to_owned(),
            |problem| format!("no resolvable destination: {problem}"),
        );
        return Some((Verdict::Invalid, reason));
    }
    if candidate.body_oversized {
        return Some((
            Verdict::Invalid,
            "body is over the planner's body limit".to_owned(),
        ));
    }
    if let Some(problem) = &candidate.body_problem {
        return Some((Verdict::Invalid, problem.clone()));
    }
    if let Some(first) = candidate.duplicate_of {
        return Some((
            Verdict::Duplicate,
            format!(
                "message key {} bound for {} already appears in dead letter {first}",
                candidate.message_key, candidate.destination
            ),
        ));
    }
    if let Some((plan, at)) = &candidate.replayed {
        let reason = if candidate.replayed_certain {
            format!(
                "replayed by plan {plan} at {}",
                redrive_proto::time::rfc3339(*at)
            )
        } else {
            // Never replayable: it may have reached the consumer.
            format!(
                "possibly delivered by plan {plan} at {}: its publish outcome is uncertain (a confirm lost with the connection, or a lease that expired)",
                redrive_proto::time::rfc3339(*at)
            )
        };
        return Some((Verdict::AlreadyReplayed, reason));
    }
    if candidate.redrives >= i64::from(options.max_redrives) {
        return Some((
            Verdict::Looping,
            format!(
                "came back after {} replays (max_redrives {})",
                candidate.redrives, options.max_redrives
            ),
        ));
    }
    if let Some(&Deadline {
        max_age,
        rule,
        event_time,
        basis,
    }) = deadline
    {
        let age = (now - event_time).to_std().unwrap_or_default();
        if age > max_age {
            let of = match rule {
                DeadlineRule::EventType(_) | DeadlineRule::Default => format!(
                    "event type {}",
                    candidate.event_type.as_deref().unwrap_or("(none)")
                ),
                DeadlineRule::Source(_) => format!("source {}", candidate.source),
            };
            return Some((
                Verdict::Stale,
                format!(
                    "{} old (from its {basis}), past the {} deadline of {of}",
                    age_text(age),
                    age_text(max_age)
                ),
            ));
        }
    }
    None
}

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
struct ReportBuilder {
    overall: Tally,
    by_reason_class: BTreeMap<String, Tally>,
    by_destination: BTreeMap<String, Tally>,
    by_event_type: BTreeMap<String, Tally>,
    by_schema_version: BTreeMap<String, Tally>,
    by_producer: BTreeMap<String, Tally>,
    died_from: Option<DateTime<Utc>>,
    died_to: Option<DateTime<Utc>>,
    hook_checked: u64,
    hook_blocked: u64,
    sample_blocked: Vec<v1::PrecheckItem>,
    digest: Sha256,
}

impl ReportBuilder {
    fn add(&mut self, candidate: &Candidate, verdict: Verdict, reason: &str) {
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

/// Dead letters examples are listed for in a warning.
const WARNING_EXAMPLES: usize = 3;

/// The dead letters of a selection keyed by their body hash because no
/// message id or key rule gave a key (their keys start `sha256:`).
#[derive(Debug, Default)]
struct BodyHashKeys {
    count: u64,
    examples: Vec<DeadLetterId>,
}

impl BodyHashKeys {
    fn add(&mut self, candidate: &Candidate) {
        if candidate.message_key.starts_with("sha256:") {
            self.count += 1;
            if self.examples.len() < WARNING_EXAMPLES {
                self.examples.push(candidate.id);
            }
        }
    }

    /// The report's warning, when any dead letter is keyed by its body hash.
    fn warning(&self, total: u64) -> Option<String> {
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
fn near_duplicate_warning(kind: NearDuplicateKind, found: &NearDuplicates) -> Option<String> {
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

/// Known sources named in the error for a source never seen.
pub const KNOWN_SOURCES_LISTED: usize = 10;

/// Known sources compared with an unknown one for the closest name (a skip
/// scan of the source index: one probe each).
const KNOWN_SOURCES_COMPARED: usize = 1000;

/// Refuses sources no dead letter was ever stored from: a typo would
/// otherwise give an empty answer that reads like "nothing there". The one
/// rule for every request that names sources: `RunPrecheck`,
/// `ListDeadLetters`, `SummarizeDeadLetters`, `ArchiveDeadLetters` and
/// `UnarchiveDeadLetters`.
///
/// # Errors
/// `NotFound` naming each unknown `selector.sources[i]`, the closest known
/// name when one is near (`did you mean "orders.dlq"?`), and up to
/// [`KNOWN_SOURCES_LISTED`] known sources; store errors.
pub async fn check_sources(store: &Store, sources: &[String]) -> Result<(), Error> {
    if sources.is_empty() {
        return Ok(());
    }
    let unknown = store.unknown_sources(sources).await?;
    if unknown.is_empty() {
        return Ok(());
    }
    let known = store.known_sources(KNOWN_SOURCES_COMPARED).await?;
    let named = unknown
        .iter()
        .map(|(index, source)| {
            let mut text = format!("selector.sources[{index}] {source:?}");
            if let Some(close) = closest(source, &known) {
                text.push_str(&format!(" (did you mean {close:?}?)"));
            }
            text
        })
        .collect::<Vec<_>>()
        .join(", ");
    let listed = match known.len() {
        0 => "no dead letter has been stored yet".to_owned(),
        n if n > KNOWN_SOURCES_LISTED => format!(
            "known sources include {}, ...",
            known[..KNOWN_SOURCES_LISTED].join(", ")
        ),
        _ => format!("known sources: {}", known.join(", ")),
    };
    Err(Error::NotFound(format!(
        "{named}: no dead letter from this source has ever been stored (a typo?); {listed}"
    )))
}

/// The known source closest to `unknown` by edit distance, when it is near:
/// at most a third of the name's characters (at least one) apart, or the
/// same name in another case.
fn closest<'a>(unknown: &str, known: &'a [String]) -> Option<&'a str> {
    let limit = (unknown.chars().count() / 3).max(1);
    known
        .iter()
        .map(|name| {
            (
                edit_distance(&unknown.to_lowercase(), &name.to_lowercase()),
                name,
            )
        })
        .filter(|(distance, _)| *distance <= limit)
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, name)| name.as_str())
}

/// Levenshtein distance in characters, with a swap of two neighbours
/// counted as one edit (`nt3` for `n3t`).
fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let mut rows = vec![vec![0_usize; b.len() + 1]; a.len() + 1];
    for (i, row) in rows.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in rows[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut best = (rows[i - 1][j] + 1)
                .min(rows[i][j - 1] + 1)
                .min(rows[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(rows[i - 2][j - 2] + 1);
            }
            rows[i][j] = best;
        }
    }
    rows[a.len()][b.len()]
}

async fn classify_all(
    store: &Store,
    checker: &Arc<StateChecker>,
    precheck_id: PrecheckId,
    request: &PrecheckRequest,
) -> Result<v1::PrecheckReport, Error> {
    let options = &request.options;
    let now = Utc::now();
    let with_payload = !checker.is_empty() || options.event_time_pointer.is_some();
    let mut candidates = store
        .stream_candidates(&request.selector, options.replay_key_window, with_payload)
        .ready_chunks(CHUNK);
    let mut copy = store.copy_precheck_items().await?;
    let mut report = ReportBuilder::default();
    report.digest.update(request.selector_proto.encode_to_vec());
    report.digest.update(request.options_proto.encode_to_vec());
    let mut buffer = Vec::with_capacity(CHUNK * 64);
    let mut body_hash_keys = BodyHashKeys::default();
    let mut coverage = Coverage::default();

    let outcome: Result<(), Error> = async {
        let mut index = 0_u64;
        while let Some(chunk) = candidates.next().await {
            let chunk = chunk
                .into_iter()
                .collect::<Result<Vec<Candidate>, StoreError>>()?;
            // One span per chunk (under the precheck's): classification, the
            // state-check hook calls and the chunk's COPY.
            let span = tracing::info_span!(
                "planner.precheck.chunk",
                precheck.chunk.index = index,
                precheck.chunk.size = chunk.len(),
            );
            index += 1;
            async {
                let declared: Vec<Option<String>> = chunk.iter().map(declared_encoding).collect();
                let deadlines: Vec<Option<Deadline<'_>>> = chunk
                    .iter()
                    .zip(&declared)
                    .map(|(candidate, declared)| deadline(candidate, declared.as_deref(), options))
                    .collect();
                let mut verdicts: Vec<Option<(Verdict, String)>> = chunk
                    .iter()
                    .zip(&deadlines)
                    .map(|(candidate, deadline)| {
                        classify_with(candidate, options, deadline.as_ref(), now)
                    })
                    .collect();
                state_check_chunk(checker, options, &chunk, &mut verdicts, &mut report).await?;
                for (((candidate, verdict), deadline), declared) in
                    chunk.iter().zip(verdicts).zip(&deadlines).zip(&declared)
                {
                    let (verdict, reason) = verdict.unwrap_or((Verdict::Replayable, String::new()));
                    body_hash_keys.add(candidate);
                    report.add(candidate, verdict, &reason);
                    coverage.add(
                        options,
                        aged(candidate, declared.as_deref()),
                        deadline.as_ref(),
                        verdict == Verdict::Stale,
                        now,
                    );
                    let stale_at = deadline.as_ref().and_then(Deadline::at);
                    copy_line(
                        &mut buffer,
                        precheck_id,
                        candidate.id,
                        verdict.name(),
                        stale_at,
                        &reason,
                    );
                }
                send_copy(&mut copy, &mut buffer).await?;
                Ok::<(), Error>(())
            }
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

    let mut warnings = Vec::new();
    warnings.extend(request.override_warning());
    if report.overall.total == 0 {
        warnings.push("the selection is empty: nothing to replay".to_owned());
    }
    warnings.extend(body_hash_keys.warning(report.overall.total));
    for kind in [
        NearDuplicateKind::SameIdOtherBodies,
        NearDuplicateKind::SameBodyOtherIds,
    ] {
        let found = store.near_duplicates(precheck_id, kind).await?;
        warnings.extend(near_duplicate_warning(kind, &found));
    }
    warnings.extend(coverage.warning());
    warnings.extend(coverage.implausible_warning(options.event_time_pointer.as_deref()));
    let exchange_only = store.exchange_only_items(precheck_id).await?;
    if exchange_only.count > 0 {
        warnings.push(format!(
            "{} replayable dead letters (for example {}) know only the exchange and routing key they were published with (framework headers), not their queue: a queue-mode plan refuses them; plan them with destination exchange{}, or a redirect{}",
            exchange_only.count,
            exchange_only.example.map(DeadLetterId::get).unwrap_or_default(),
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
        ));
    }
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
    // Replayed to the queue each died in, the selection would share a running
    // plan's destination (and its rate budget).
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
    for (plan_id, destination) in store.running_plans_to(&queues).await? {
        warnings.push(format!(
            "plan {plan_id} is running to destination {destination}: a replay there would share its rate budget"
        ));
    }
    let digest = hex::encode(std::mem::take(&mut report.digest).finalize());
    Ok(v1::PrecheckReport {
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
        died_from: report.died_from.map(timestamp),
        died_to: report.died_to.map(timestamp),
        warnings,
        digest,
        sample_blocked: report.sample_blocked,
        staleness: coverage.rows(),
    })
}

/// Calls the hooks for the chunk's candidates that reached the state check and
/// fills in their verdicts.
async fn state_check_chunk(
    checker: &Arc<StateChecker>,
    options: &PrecheckOptions,
    chunk: &[Candidate],
    verdicts: &mut [Option<(Verdict, String)>],
    report: &mut ReportBuilder,
) -> Result<(), Error> {
    if checker.is_empty() {
        return Ok(());
    }
    // (route, positions in the chunk), cut into batches.
    let mut by_route: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for (position, candidate) in chunk.iter().enumerate() {
        if verdicts[position].is_none()
            && let Some(route) =
                checker.route(candidate.event_type.as_deref(), &candidate.destination)
        {
            by_route.entry(route).or_default().push(position);
        }
    }
    let batches: Vec<(usize, Vec<usize>)> = by_route
        .into_iter()
        .flat_map(|(route, positions)| {
            positions
                .chunks(options.state_check_batch_size)
                .map(|batch| (route, batch.to_vec()))
                .collect::<Vec<_>>()
        })
        .collect();
    let answers = futures::stream::iter(batches)
        .map(|(route, positions)| {
            let messages = positions
                .iter()
                .map(|&position| state_check_message(&chunk[position]))
                .collect::<Vec<_>>();
            let checker = Arc::clone(checker);
            let timeout = options.state_check_timeout;
            async move { (positions, checker.check(route, messages, timeout).await) }
        })
        .buffered(HOOK_CONCURRENCY)
        .collect::<Vec<_>>()
        .await;
    for (positions, answer) in answers {
        match answer {
            Ok(decisions) => {
                for position in positions {
                    report.hook_checked += 1;
                    let decision = &decisions[&chunk[position].id.to_string()];
                    verdicts[position] = match decision {
                        StateDecision::Replay => None,
                        StateDecision::Block(reason) => {
                            report.hook_blocked += 1;
                            Some((Verdict::BlockedByState, reason.clone()))
                        }
                        StateDecision::NeedsCompensation(reason) => {
                            Some((Verdict::NeedsCompensation, reason.clone()))
                        }
                    };
                }
            }
            Err(error) if options.block_on_state_check_error => {
                for position in positions {
                    verdicts[position] = Some((Verdict::BlockedByState, error.to_string()));
                }
            }
            Err(error) => return Err(hook_failed(error)),
        }
    }
    Ok(())
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
    if page_size > MAX_PAGE_SIZE {
        return Err(Error::invalid(
            "page_size",
            format!("at most {MAX_PAGE_SIZE}"),
        ));
    }
    let page_size = if page_size == 0 {
        DEFAULT_PAGE_SIZE
    } else {
        page_size
    };
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

fn hook_failed(error: StateCheckError) -> Error {
    Error::Unavailable(format!(
        "{error}; the precheck is not complete. Fix the hook, or run the precheck with \
         block_on_state_check_error to mark its messages blocked_by_state"
    ))
}

fn state_check_message(candidate: &Candidate) -> v1::StateCheckMessage {
    let (body, properties, headers) = candidate.payload.clone().unwrap_or_default();
    v1::StateCheckMessage {
        dead_letter_id: candidate.id.to_string(),
        message_key: candidate.message_key.clone(),
        event_type: candidate.event_type.clone(),
        body,
        properties: v1::MessageProperties::decode(properties.as_slice()).ok(),
        headers: v1::HeaderTable::decode(headers.as_slice()).ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::precheck::options::event_time_from_body;
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
            occurred_at: None,
            first_died_at: now - chrono::Duration::hours(3),
            died_at: now,
            duplicate_of: None,
            replayed: None,
            replayed_certain: true,
            redrives: 0,
            payload: None,
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
