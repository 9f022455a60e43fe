//! Re-keying a stored backlog (`RekeyDeadLetters`; docs/replay.md,
//! "Identity", "Re-keying a stored backlog"): each selected dead letter's
//! message key is recomputed from its stored properties, headers and
//! captured (decoded) body with other `--message-key` rules, in batches,
//! and audited. The ledger is never changed: a dead letter keeps its former
//! keys (`previous_message_keys`), and the precheck, plan approval and the
//! claim match replays recorded under any of them, so a delivered message
//! stays `already_replayed`.

use prost::Message;
use redrive_proto::v1::{self, HeaderTable, MessageProperties};
use tracing::info;

use crate::{
    dead_letters::ExtractionRules,
    dead_letters::body,
    dead_letters::message_key::{self, KeySource},
    dead_letters::selector::{Selector, Status},
    error::Error,
    ids::DeadLetterId,
    plan::single::required_reason,
    store::{
        Store,
        rekey::{BatchOutcome, KeyChange, RekeyInput},
    },
};

/// Dead letters one re-key transaction covers at most (fewer when their
/// bodies pass [`crate::store::rekey::REKEY_BATCH_BYTES`]).
pub const REKEY_BATCH: i64 = 500;

/// Key changes an answer lists as examples.
pub const EXAMPLES: usize = 5;

/// Parses `key_rules` (`--message-key` syntax).
///
/// # Errors
/// `InvalidArgument` naming `key_rules[i]`.
pub fn parse_rules(key_rules: &[String]) -> Result<Vec<KeySource>, Error> {
    key_rules
        .iter()
        .enumerate()
        .map(|(index, rule)| {
            rule.parse::<KeySource>()
                .map_err(|problem| Error::invalid(format!("key_rules[{index}]"), problem))
        })
        .collect()
}

/// The message key of a stored dead letter under `sources` (empty: the
/// default rule), as capture would have computed it: a JSON rule reads the
/// decoded captured body (never an oversized one), a rule's key gets the
/// stored event type appended. A stored value that does not decode keeps
/// the dead letter's key.
pub fn recompute(sources: &[KeySource], max_body_bytes: usize, input: &RekeyInput) -> String {
    let (Ok(properties), Ok(headers)) = (
        MessageProperties::decode(input.properties.as_slice()),
        HeaderTable::decode(input.headers.as_slice()),
    ) else {
        return input.message_key.clone();
    };
    let json = if sources.iter().any(KeySource::needs_json) && !input.body_oversized {
        let declared = body::declared_encoding(&properties, &headers);
        body::decode(&input.body, declared.as_deref(), max_body_bytes)
            .ok()
            .and_then(|(decoded, _)| serde_json::from_slice::<serde_json::Value>(&decoded).ok())
    } else {
        None
    };
    message_key::message_key(
        sources,
        &properties,
        &headers,
        json.as_ref(),
        input.event_type.as_deref(),
        &hex::encode(&input.body_sha256),
    )
    .key
}

/// The rules as written in the audit: `default` when empty.
fn rules_text(sources: &[KeySource]) -> String {
    if sources.is_empty() {
        return "the default rule".to_owned();
    }
    sources
        .iter()
        .map(|source| format!("--message-key {source}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Re-keys the dead letters `request.selector` covers, as `actor`: batches
/// of [`REKEY_BATCH`], one transaction each, so a backlog of a million is
/// never held in memory. Not all-or-nothing: when a batch fails, the batches
/// before it stay re-keyed (and audited); running the same re-key again
/// finishes the work (a dead letter already under its new key is unchanged).
///
/// # Errors
/// `InvalidArgument` naming the field: a bad selector, an empty one, a bad
/// rule (`key_rules[i]`), an empty `reason`; `NotFound` for an unknown
/// source; `FailedPrecondition` naming the plan when a selected dead letter
/// is an item of a plan that has not ended (checked before anything
/// changes); store errors.
pub async fn rekey(
    store: &Store,
    rules: &ExtractionRules,
    actor: &str,
    request: v1::RekeyDeadLettersRequest,
) -> Result<v1::RekeyDeadLettersResponse, Error> {
    let mut selector = Selector::try_from(request.selector.unwrap_or_default())?;
    if selector.is_unfiltered() {
        return Err(Error::invalid(
            "selector",
            "say which dead letters to re-key (sources, ids or a filter): an empty selector \
             would cover every dead letter",
        ));
    }
    let sources = parse_rules(&request.key_rules)?;
    let reason = required_reason(&request.reason, "these dead letters are re-keyed")?;
    crate::precheck::check_sources(store, &selector.sources).await?;
    if selector.status == Status::NotArchived {
        selector.status = Status::All;
    }
    if let Some((dead_letter_id, plan_id, state)) = store.selected_in_live_plan(&selector).await? {
        return Err(in_live_plan(dead_letter_id, &plan_id.to_string(), &state));
    }
    let rules_written = rules_text(&sources);
    let run = store
        .begin_rekey(actor, &reason, &request.key_rules, &format!("{selector:?}"))
        .await?;
    let note = |change: &KeyChange| {
        format!(
            "re-keyed from {} to {} with {rules_written} (rekey {run}): {reason}",
            change.old_key, change.new_key
        )
    };
    let max_body_bytes = rules.max_body_bytes;
    let compute = |input: &RekeyInput| recompute(&sources, max_body_bytes, input);
    let mut after = DeadLetterId::new(0);
    let mut remaining = selector
        .limit
        .map(|limit| i64::try_from(limit).unwrap_or(i64::MAX));
    let (mut rekeyed, mut changed) = (0_u64, 0_u64);
    let mut examples = Vec::new();
    loop {
        let limit = remaining.map_or(REKEY_BATCH, |left| left.min(REKEY_BATCH));
        if limit <= 0 {
            break;
        }
        match store
            .rekey_batch(run, &selector, after, limit, actor, &note, &compute)
            .await?
        {
            BatchOutcome::Done { rekeyed: 0, .. } => break,
            BatchOutcome::Done {
                rekeyed: batch,
                changes,
                last_id,
            } => {
                rekeyed += batch;
                changed += changes.len() as u64;
                examples.extend(
                    changes
                        .into_iter()
                        .take(EXAMPLES.saturating_sub(examples.len()))
                        .map(|change| v1::RekeyExample {
                            dead_letter_id: change.id.to_string(),
                            old_key: change.old_key,
                            new_key: change.new_key,
                        }),
                );
                after = last_id;
                if let Some(left) = remaining.as_mut() {
                    *left -= i64::try_from(batch).unwrap_or(i64::MAX);
                }
            }
            BatchOutcome::InLivePlan {
                dead_letter_id,
                plan_id,
                state,
            } => {
                store.finish_rekey(run).await?;
                return Err(in_live_plan(dead_letter_id, &plan_id.to_string(), &state));
            }
        }
    }
    store.finish_rekey(run).await?;
    let not_found = store.missing_dead_letters(&selector.ids).await?;
    info!(actor, run, rekeyed, changed, rules = %rules_written, "re-key done");
    Ok(v1::RekeyDeadLettersResponse {
        rekeyed,
        changed,
        examples,
        rekey_id: run.to_string(),
        not_found_ids: not_found.iter().map(ToString::to_string).collect(),
    })
}

fn in_live_plan(dead_letter_id: DeadLetterId, plan_id: &str, state: &str) -> Error {
    Error::FailedPrecondition(format!(
        "dead letter {dead_letter_id} is an item of plan {plan_id} ({state}), which has not \
         ended: re-key it once the plan has ended, or cancel the plan first"
    ))
}

#[cfg(test)]
mod tests {
    use sha2::Digest;

    use super::*;

    #[test]
    fn bad_rules_name_their_field() {
        let error = parse_rules(&["header:x".into(), "propety:message_id".into()]).unwrap_err();
        assert!(error.to_string().starts_with("key_rules[1]: "), "{error}");
        assert!(parse_rules(&[]).unwrap().is_empty());
    }

    #[test]
    fn recompute_reads_headers_and_json_with_the_stored_event_type() {
        let body = br#"{"order_id":"o-7"}"#.to_vec();
        let input = RekeyInput {
            id: DeadLetterId::new(1),
            message_key: "sha256:00".into(),
            body_sha256: sha2::Sha256::digest(&body).to_vec(),
            body,
            body_oversized: false,
            properties: MessageProperties::default().encode_to_vec(),
            headers: HeaderTable::default().encode_to_vec(),
            event_type: Some("order.paid".into()),
        };
        let json = parse_rules(&["json:/order_id".into()]).unwrap();
        assert_eq!(recompute(&json, 1 << 20, &input), "o-7:order.paid");
        let header = parse_rules(&["header:missing".into()]).unwrap();
        assert!(recompute(&header, 1 << 20, &input).starts_with("sha256:"));
        let oversized = RekeyInput {
            body_oversized: true,
            ..input
        };
        assert!(recompute(&json, 1 << 20, &oversized).starts_with("sha256:"));
    }
}
