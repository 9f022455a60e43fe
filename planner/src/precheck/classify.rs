//! The verdict of each candidate: the rules before the state check
//! ([`classify`]), then the owning services' hooks for the rest, a chunk at
//! a time.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use futures::StreamExt;
use redrive_proto::{time::age_text, v1::Verdict};

use super::report::Classified;
use crate::{
    error::Error,
    ids::PrecheckId,
    precheck::options::{Deadline, DeadlineRule, EventBody, PrecheckOptions},
    precheck::staleness::Aged,
    precheck::state_check::{
        StateCheckError, StateChecker, StateDecision, StoredStateCheckMessage,
    },
    store::prechecks::{Candidate, copy_line},
};

/// Hook batches in flight at once, over all the chunks being judged
/// (docs/replay.md: "four batches in flight"): the permits of one
/// semaphore per precheck ([`hook_slots`]).
const HOOK_CONCURRENCY: usize = 4;

/// The permits a precheck's hook calls share ([`HOOK_CONCURRENCY`]): chunks
/// judged ahead overlap their hook calls with reading and `COPY`, never
/// with more calls to the owning service.
pub(super) fn hook_slots() -> tokio::sync::Semaphore {
    tokio::sync::Semaphore::new(HOOK_CONCURRENCY)
}

/// The compression a candidate's message declares (its stored properties
/// and headers, loaded with its body), for reading its body as capture did.
fn declared_encoding(candidate: &Candidate) -> Option<String> {
    let (_, properties, headers) = candidate.payload.as_ref()?;
    crate::dead_letters::body::declared_encoding_of_stored(properties, headers)
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
    // Stored before the ingest checked it, or captured from a header: a
    // destination no publish can name.
    if let Some(problem) = redrive_proto::limits::destination_problem(&candidate.destination) {
        return Some((Verdict::Invalid, problem));
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

/// A chunk of candidates with what the rules and the state-check hooks
/// decided of each ([`judge`]); [`Classified::add_judged`] records it.
pub(super) struct Judged<'a> {
    /// The candidates, in id order.
    chunk: Vec<Candidate>,
    /// Each one's declared body encoding ([`declared_encoding`]).
    declared: Vec<Option<String>>,
    /// Each one's deadline under the options.
    deadlines: Vec<Option<Deadline<'a>>>,
    /// Each one's verdict and reason; `None`: replayable.
    verdicts: Vec<Option<(Verdict, String)>>,
    /// How many the hooks checked, and how many of those they blocked.
    hook_checked: u64,
    hook_blocked: u64,
}

/// Judges one chunk: the rules first ([`classify`], each candidate's
/// deadline read once), then the state-check hooks for the candidates that
/// reached them. Chunks are judged ahead of the one being recorded
/// (`precheck::classify_all`), so the hooks of one overlap the reading and
/// the `COPY` of the others.
///
/// # Errors
/// A hook that fails while the options do not say to block instead.
pub(super) async fn judge<'a>(
    checker: &StateChecker,
    hook_slots: &tokio::sync::Semaphore,
    options: &'a PrecheckOptions,
    chunk: Vec<Candidate>,
    now: DateTime<Utc>,
) -> Result<Judged<'a>, Error> {
    let declared: Vec<Option<String>> = chunk.iter().map(declared_encoding).collect();
    let deadlines: Vec<Option<Deadline<'a>>> = chunk
        .iter()
        .zip(&declared)
        .map(|(candidate, declared)| deadline(candidate, declared.as_deref(), options))
        .collect();
    let mut verdicts: Vec<Option<(Verdict, String)>> = chunk
        .iter()
        .zip(&deadlines)
        .map(|(candidate, deadline)| classify_with(candidate, options, deadline.as_ref(), now))
        .collect();
    let (hook_checked, hook_blocked) =
        state_check_chunk(checker, hook_slots, options, &chunk, &mut verdicts).await?;
    Ok(Judged {
        chunk,
        declared,
        deadlines,
        verdicts,
        hook_checked,
        hook_blocked,
    })
}

impl Classified {
    /// Records one judged chunk, in id order: counts each verdict into the
    /// report, the body-hash keys and the staleness coverage, and writes its
    /// `COPY` line into the buffer.
    pub(super) fn add_judged(
        &mut self,
        options: &PrecheckOptions,
        precheck_id: PrecheckId,
        judged: Judged<'_>,
        now: DateTime<Utc>,
    ) {
        self.report.hook_checked += judged.hook_checked;
        self.report.hook_blocked += judged.hook_blocked;
        for (((candidate, verdict), deadline), declared) in judged
            .chunk
            .iter()
            .zip(judged.verdicts)
            .zip(&judged.deadlines)
            .zip(&judged.declared)
        {
            let (verdict, reason) = verdict.unwrap_or((Verdict::Replayable, String::new()));
            self.body_hash_keys.add(candidate);
            if verdict == Verdict::Replayable {
                self.exchange_only.add(candidate);
            }
            self.report.add(candidate, verdict, &reason);
            self.coverage.add(
                options,
                aged(candidate, declared.as_deref()),
                deadline.as_ref(),
                verdict == Verdict::Stale,
                now,
            );
            let stale_at = deadline.as_ref().and_then(Deadline::at);
            copy_line(
                &mut self.buffer,
                precheck_id,
                candidate.id,
                verdict.name(),
                stale_at,
                &reason,
            );
        }
    }
}

/// Calls the hooks for the chunk's candidates that reached the state check and
/// fills in their verdicts; returns how many the hooks checked and how many
/// of those they blocked.
async fn state_check_chunk(
    checker: &StateChecker,
    hook_slots: &tokio::sync::Semaphore,
    options: &PrecheckOptions,
    chunk: &[Candidate],
    verdicts: &mut [Option<(Verdict, String)>],
) -> Result<(u64, u64), Error> {
    let (mut checked, mut blocked) = (0, 0);
    if checker.is_empty() {
        return Ok((checked, blocked));
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
            let timeout = options.state_check_timeout;
            async move {
                // Never closed; a closed one would only lift the bound.
                let _slot = hook_slots.acquire().await.ok();
                (positions, checker.check(route, messages, timeout).await)
            }
        })
        .buffered(HOOK_CONCURRENCY)
        .collect::<Vec<_>>()
        .await;
    for (positions, answer) in answers {
        match answer {
            Ok(decisions) => {
                for position in positions {
                    checked += 1;
                    let decision = &decisions[&chunk[position].id.to_string()];
                    verdicts[position] = match decision {
                        StateDecision::Replay => None,
                        StateDecision::Block(reason) => {
                            blocked += 1;
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
    Ok((checked, blocked))
}

/// The error of a precheck whose state-check hook failed: what to do about it.
fn hook_failed(error: StateCheckError) -> Error {
    Error::Unavailable(format!(
        "{error}; the precheck is not complete. Fix the hook, or run the precheck with \
         block_on_state_check_error to mark its messages blocked_by_state"
    ))
}

/// What a state-check hook is sent of one candidate: its id, key, event
/// type, body, and its properties and headers as stored.
fn state_check_message(candidate: &Candidate) -> StoredStateCheckMessage {
    let (body, properties, headers) = candidate.payload.clone().unwrap_or_default();
    StoredStateCheckMessage {
        dead_letter_id: candidate.id.to_string(),
        message_key: candidate.message_key.clone(),
        event_type: candidate.event_type.clone(),
        body,
        properties: Some(properties),
        headers: Some(headers),
    }
}
