//! The audit record of a plan (docs/design.md, "Flow" step 7): the report with the
//! reconciliation list of sent keys and the export as JSON Lines or CSV (the
//! live watch stream is [`crate::audit::watch_hub`]'s).

pub mod log;
pub mod notifier;
pub mod watch_hub;

use futures::stream::BoxStream;
use redrive_proto::{time::from_timestamp, v1};
use tonic::Status;

use crate::{error::Error, ids::PlanId, plan, store::Store};

/// Audit events read per page while exporting or watching.
pub(crate) const PAGE: i64 = 1000;

/// Most bytes of one `ExportAuditChunk` (docs/api.md, "Limits").
pub const CHUNK_BYTES: usize = 1024 * 1024;

/// The audit report of a plan.
///
/// # Errors
/// `NotFound`; store errors.
pub async fn report(store: &Store, plan_id: PlanId) -> Result<v1::AuditReport, Error> {
    let plan = plan::get(store, plan_id).await?;
    Ok(v1::AuditReport {
        counts: plan.counts,
        sent_keys: store.sent_keys(plan_id).await?,
        not_sent: store.not_sent_events(plan_id).await?,
        possibly_duplicated_keys: store.possibly_duplicated_keys(plan_id).await?,
        never_attempted: store.never_attempted_count(plan_id).await?,
        never_attempted_items: store
            .never_attempted_items(plan_id, -1, NEVER_ATTEMPTED_LISTED)
            .await?
            .into_iter()
            .map(|(_, item)| item)
            .collect(),
        plan: Some(plan),
    })
}

/// Items never attempted that the report lists (the count has them all;
/// the export of a final plan has a row for each).
pub const NEVER_ATTEMPTED_LISTED: i64 = 1000;

/// The `action` of an export row for an item of a final plan that no
/// executor attempted (no audit event has it).
pub const NEVER_ATTEMPTED: &str = "never_attempted";

/// CSV columns of the export, in order. `message_id` is the dead letter's
/// AMQP message id (for reconciliation with the producer's records).
pub const CSV_COLUMNS: [&str; 13] = [
    "at",
    "plan_id",
    "slice_id",
    "dead_letter_id",
    "message_key",
    "message_id",
    "action",
    "reason",
    "wave",
    "executor_id",
    "attempt",
    "confirm_latency_us",
    "event_id",
];

/// A CSV writer into memory (RFC 4180 through the `csv` crate: a field holding a
/// comma, quote or line break is quoted with its quotes doubled; records end in
/// `\n`). Writing into a `Vec` cannot fail, so its results are ignored.
fn csv_writer(data: &mut Vec<u8>) -> csv::Writer<&mut Vec<u8>> {
    csv::WriterBuilder::new()
        .has_headers(false)
        .from_writer(data)
}

/// An export cell (CSV) or string value (JSON Lines) made safe to open in a
/// spreadsheet ([`redrive_tlog::export::spreadsheet_safe`]): text that
/// starts like a formula (`=`, `+`, `-`, `@`, a tab or a carriage return,
/// OWASP "CSV injection") or with a `'` gets a `'` in front. To get the
/// original back, drop one leading `'`
/// ([`redrive_tlog::export::spreadsheet_original`]).
pub fn spreadsheet_safe(text: &str) -> String {
    redrive_tlog::export::spreadsheet_safe(text)
}

/// An export row as JSON with its string values made
/// [`spreadsheet_safe`]; numbers stay numbers.
fn safe_json(mut row: serde_json::Value) -> serde_json::Value {
    if let Some(fields) = row.as_object_mut() {
        for value in fields.values_mut() {
            if let serde_json::Value::String(text) = value {
                *text = spreadsheet_safe(text);
            }
        }
    }
    row
}

/// One audit event as a JSON object (the export's and the CLI's shape).
pub fn event_json(event: &v1::AuditEvent) -> serde_json::Value {
    serde_json::json!({
        "at": event.at.as_ref().and_then(from_timestamp).map(redrive_proto::time::rfc3339),
        "plan_id": event.plan_id,
        "slice_id": event.slice_id,
        "dead_letter_id": event.dead_letter_id,
        "message_key": event.message_key,
        "action": event.action().name(),
        "reason": event.reason,
        "wave": if event.wave() == v1::Wave::Canary { "canary" } else { "main" },
        "executor_id": event.executor_id,
        "attempt": event.attempt,
        "confirm_latency_us": event.confirm_latency_us,
    })
}

/// One exported audit event as a JSON object: [`event_json`] with the dead
/// letter's `message_id` and the event's id (the `id` of its row in the
/// audit log's export, `kind` `event`), its strings [`spreadsheet_safe`].
/// Nothing in it changes once written, so that an export's digest stays.
fn export_json(event_id: i64, event: &v1::AuditEvent, message_id: &str) -> serde_json::Value {
    let mut json = event_json(event);
    json["message_id"] = serde_json::Value::from(message_id);
    json["event_id"] = serde_json::Value::from(event_id);
    safe_json(json)
}

/// An export row for an item no executor attempted, as JSON (the shape of
/// [`export_json`]: no time, executor or attempt), its strings
/// [`spreadsheet_safe`].
fn unattempted_json(plan_id: PlanId, item: &v1::UnattemptedItem) -> serde_json::Value {
    safe_json(serde_json::json!({
        "at": null,
        "plan_id": plan_id.to_string(),
        "slice_id": "",
        "dead_letter_id": item.dead_letter_id,
        "message_key": item.message_key,
        "message_id": item.message_id,
        "action": NEVER_ATTEMPTED,
        "reason": "no executor attempted it before the plan ended",
        "wave": if item.wave() == v1::Wave::Canary { "canary" } else { "main" },
        "executor_id": "",
        "attempt": 0,
        "confirm_latency_us": 0,
        "event_id": null,
    }))
}

/// Export rows for items no executor attempted, as CSV records, every cell
/// [`spreadsheet_safe`].
fn unattempted_csv(plan_id: PlanId, items: &[(i64, v1::UnattemptedItem)]) -> Vec<u8> {
    let mut data = Vec::new();
    let mut writer = csv_writer(&mut data);
    let plan_id = plan_id.to_string();
    for (_, item) in items {
        let wave = if item.wave() == v1::Wave::Canary {
            "canary"
        } else {
            "main"
        };
        let _ = writer.write_record(
            [
                "",
                plan_id.as_str(),
                "",
                &item.dead_letter_id,
                &item.message_key,
                &item.message_id,
                NEVER_ATTEMPTED,
                "no executor attempted it before the plan ended",
                wave,
                "",
                "0",
                "0",
                "",
            ]
            .map(spreadsheet_safe),
        );
    }
    let _ = writer.flush();
    drop(writer);
    data
}

/// One exported event: its id, the event and its dead letter's message id.
type ExportedEvent<'a> = (i64, &'a v1::AuditEvent, &'a str);

/// Writes audit events as CSV records, in [`CSV_COLUMNS`] order, every cell
/// [`spreadsheet_safe`].
fn events_csv<'a>(events: impl IntoIterator<Item = ExportedEvent<'a>>) -> Vec<u8> {
    let mut data = Vec::new();
    let mut writer = csv_writer(&mut data);
    for (event_id, event, message_id) in events {
        let at = event
            .at
            .as_ref()
            .and_then(from_timestamp)
            .map(redrive_proto::time::rfc3339)
            .unwrap_or_default();
        let wave = if event.wave() == v1::Wave::Canary {
            "canary"
        } else {
            "main"
        };
        let attempt = event.attempt.to_string();
        let confirm_latency_us = event.confirm_latency_us.to_string();
        let event_id = event_id.to_string();
        let _ = writer.write_record(
            [
                at.as_str(),
                &event.plan_id,
                &event.slice_id,
                &event.dead_letter_id,
                &event.message_key,
                message_id,
                event.action().name(),
                &event.reason,
                wave,
                &event.executor_id,
                &attempt,
                &confirm_latency_us,
                &event_id,
            ]
            .map(spreadsheet_safe),
        );
    }
    let _ = writer.flush();
    drop(writer);
    data
}

/// The CSV header record, [`CSV_COLUMNS`].
fn csv_header() -> Vec<u8> {
    let mut data = Vec::new();
    let mut writer = csv_writer(&mut data);
    let _ = writer.write_record(CSV_COLUMNS);
    let _ = writer.flush();
    drop(writer);
    data
}

/// The last item of an audit export whose task died before its last row
/// (a panic: a defect, in the planner's log): `INTERNAL`, so that a cut
/// export never ends with `OK`.
fn export_interrupted() -> Status {
    Status::internal("the audit export ended before its last row (a planner defect; see its log)")
}

/// Every audit event of a plan, in order, as JSON Lines or CSV chunks (one per
/// page of events), streamed.
///
/// # Errors
/// `NotFound` for an unknown plan, `InvalidArgument` for an unspecified format.
pub async fn export(
    store: &Store,
    plan_id: PlanId,
    format: v1::ExportFormat,
) -> Result<BoxStream<'static, Result<v1::ExportAuditChunk, Status>>, Error> {
    if format == v1::ExportFormat::Unspecified {
        return Err(Error::invalid(
            "format",
            "EXPORT_FORMAT_JSONL or EXPORT_FORMAT_CSV",
        ));
    }
    let ended = plan::get(store, plan_id).await?.state().is_final();
    // The latest signed checkpoint of the audit log goes first (its own
    // chunk, no data): each row's `event_id` is the `id` of its leaf in the
    // log export, which proves it.
    let checkpoint = store
        .audit_checkpoint(None)
        .await?
        .map(|row| row.note)
        .unwrap_or_default();
    let store = store.clone();
    let stream = crate::task_stream::spawn_stream(
        4,
        move |sender| async move {
            let csv = format == v1::ExportFormat::Csv;
            if !checkpoint.is_empty() {
                let chunk = v1::ExportAuditChunk {
                    data: Vec::new(),
                    checkpoint,
                };
                if sender.send(Ok(chunk)).await.is_err() {
                    return;
                }
            }
            // Data is sent in chunks of at most `CHUNK_BYTES`: events whose
            // reasons are long must not make a message above the gRPC limit
            // (clients join chunks; records may span them).
            let send = async |data: Vec<u8>| {
                for piece in data.chunks(CHUNK_BYTES) {
                    let chunk = v1::ExportAuditChunk {
                        data: piece.to_vec(),
                        checkpoint: String::new(),
                    };
                    if sender.send(Ok(chunk)).await.is_err() {
                        return false;
                    }
                }
                true
            };
            if csv && !send(csv_header()).await {
                return;
            }
            let mut after = 0;
            loop {
                let Some(page) = crate::task_stream::or_send_error(
                    store
                        .audit_events_with_message_ids(plan_id, after, PAGE)
                        .await,
                    &sender,
                )
                .await
                else {
                    return;
                };
                let Some((last, ..)) = page.last() else {
                    break;
                };
                after = *last;
                let data = if csv {
                    events_csv(
                        page.iter()
                            .map(|(id, event, message_id)| (*id, event, message_id.as_str())),
                    )
                } else {
                    let mut data = String::new();
                    for (id, event, message_id) in &page {
                        data.push_str(&export_json(*id, event, message_id).to_string());
                        data.push('\n');
                    }
                    data.into_bytes()
                };
                if !send(data).await {
                    return;
                }
            }
            // A final plan's items that no executor attempted have no event:
            // a row each, so that the export accounts for every item.
            if !ended {
                return;
            }
            let mut after = -1;
            loop {
                let Some(items) = crate::task_stream::or_send_error(
                    store.never_attempted_items(plan_id, after, PAGE).await,
                    &sender,
                )
                .await
                else {
                    return;
                };
                let Some((last, _)) = items.last() else {
                    return;
                };
                after = *last;
                let data = if csv {
                    unattempted_csv(plan_id, &items)
                } else {
                    let mut data = String::new();
                    for (_, item) in &items {
                        data.push_str(&unattempted_json(plan_id, item).to_string());
                        data.push('\n');
                    }
                    data.into_bytes()
                };
                if !send(data).await {
                    return;
                }
            }
        },
        export_interrupted,
    );
    Ok(stream)
}

/// One page of plan `plan_id`'s audit events (`ListAuditEvents`), only
/// `actions` unless empty, and the next page's token (empty on the last).
///
/// # Errors
/// `InvalidArgument` for a page size over the maximum or a bad token;
/// `NotFound` for an unknown plan; store errors.
pub async fn events(
    store: &Store,
    plan_id: PlanId,
    actions: &[String],
    page_size: u32,
    token: &str,
) -> Result<v1::ListAuditEventsResponse, Error> {
    let page_size = crate::ids::page_size(page_size)?;
    let token = crate::ids::PageToken::parse(token)?;
    // NotFound for a plan that does not exist, rather than an empty page.
    crate::plan::get(store, plan_id).await?;
    let rows = store
        .audit_events_page(plan_id, actions, token.after_id, i64::from(page_size) + 1)
        .await?;
    let (rows, more) = crate::ids::page_of(rows, page_size);
    let next_page_token = match rows.last() {
        Some((last, _)) if more => crate::ids::PageToken {
            after_id: *last,
            returned: token.returned + rows.len() as u64,
        }
        .encode(),
        _ => String::new(),
    };
    Ok(v1::ListAuditEventsResponse {
        events: rows.into_iter().map(|(_, event)| event).collect(),
        next_page_token,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An event of slice `s-1`, dead letter `d-1`: `plan_id`, `(action,
    /// wave)`, `(attempt, confirm_latency_us)`, `at` as `(seconds, nanos)`
    /// and `[message_key, reason, executor_id]`.
    fn audit_event(
        plan_id: &str,
        (action, wave): (v1::AuditAction, v1::Wave),
        (attempt, confirm_latency_us): (u32, u64),
        (seconds, nanos): (i64, i32),
        [message_key, reason, executor_id]: [&str; 3],
    ) -> v1::AuditEvent {
        v1::AuditEvent {
            plan_id: plan_id.into(),
            slice_id: "s-1".into(),
            dead_letter_id: "d-1".into(),
            message_key: message_key.into(),
            action: action.into(),
            reason: reason.into(),
            wave: wave.into(),
            executor_id: executor_id.into(),
            attempt,
            confirm_latency_us,
            at: Some(prost_types::Timestamp { seconds, nanos }),
            message_id: String::new(),
        }
    }

    #[test]
    fn csv_fields_are_quoted_per_rfc_4180() {
        assert_eq!(
            String::from_utf8(csv_header()).unwrap(),
            "at,plan_id,slice_id,dead_letter_id,message_key,message_id,action,reason,wave,executor_id,attempt,confirm_latency_us,event_id\n"
        );
        let event = |message_key: &str, reason: &str, executor_id: &str| {
            audit_event(
                "p-1",
                (v1::AuditAction::Sent, v1::Wave::Canary),
                (2, 1500),
                (1_714_564_800, 0),
                [message_key, reason, executor_id],
            )
        };
        let events = [
            event("plain", "", "exec-1"),
            event("a,b", "say \"hi\"", "line\nbreak"),
            event("cr\rlf\r\n", "\"", ","),
        ];
        let data = String::from_utf8(events_csv(
            events
                .iter()
                .enumerate()
                .map(|(index, event)| (7 + index as i64, event, "m-1")),
        ))
        .unwrap();
        let sent = v1::AuditAction::Sent.name();
        assert_eq!(
            data,
            format!(
                "2024-05-01T12:00:00.000Z,p-1,s-1,d-1,plain,m-1,{sent},,canary,exec-1,2,1500,7\n\
                 2024-05-01T12:00:00.000Z,p-1,s-1,d-1,\"a,b\",m-1,{sent},\"say \"\"hi\"\"\",canary,\"line\nbreak\",2,1500,8\n\
                 2024-05-01T12:00:00.000Z,p-1,s-1,d-1,\"cr\rlf\r\n\",m-1,{sent},\"\"\"\",canary,\",\",2,1500,9\n"
            )
        );
        // A CSV reader gets every field back as it was.
        let mut reader = csv::ReaderBuilder::new()
            .has_headers(false)
            .from_reader(data.as_bytes());
        let records: Vec<csv::StringRecord> = reader.records().map(Result::unwrap).collect();
        assert_eq!(records.len(), events.len());
        for (record, event) in records.iter().zip(&events) {
            assert_eq!(record.len(), CSV_COLUMNS.len());
            assert_eq!(&record[4], event.message_key);
            assert_eq!(&record[5], "m-1");
            assert_eq!(&record[7], event.reason);
            assert_eq!(&record[9], event.executor_id);
        }
    }

    /// Cells and string values that a spreadsheet would run as formulas
    /// get a `'` in front (as the CLI's export did before it passed the
    /// planner's export through as it comes).
    #[test]
    fn export_rows_are_safe_in_a_spreadsheet() {
        let event = |message_key: &str, reason: &str, executor_id: &str| {
            audit_event(
                "plan-formula",
                (v1::AuditAction::Failed, v1::Wave::Main),
                (1, 0),
                (1_714_565_400, 500_123_000),
                [message_key, reason, executor_id],
            )
        };
        let events = [
            event("=HYPERLINK(\"http://x\",\"y\")", "+1 nack", "ok"),
            event("@SUM(A1)", "-2", "e"),
            event("\tkey", "\rcr", "plain"),
        ];
        let data = events_csv(events.iter().map(|event| (1, event, "-m")));
        let mut reader = csv::ReaderBuilder::new()
            .has_headers(false)
            .from_reader(data.as_slice());
        let rows: Vec<Vec<String>> = reader
            .records()
            .map(|record| {
                let record = record.unwrap();
                [0, 4, 5, 7, 9]
                    .iter()
                    .map(|&at| record[at].to_owned())
                    .collect()
            })
            .collect();
        assert_eq!(
            rows,
            [
                [
                    "2024-05-01T12:10:00.500Z",
                    "'=HYPERLINK(\"http://x\",\"y\")",
                    "'-m",
                    "'+1 nack",
                    "ok"
                ],
                ["2024-05-01T12:10:00.500Z", "'@SUM(A1)", "'-m", "'-2", "e"],
                [
                    "2024-05-01T12:10:00.500Z",
                    "'\tkey",
                    "'-m",
                    "'\rcr",
                    "plain"
                ],
            ]
        );
        let json = export_json(5, &event("=cmd|' /C calc'!A0", "@x", "e"), "m-1");
        assert_eq!(json["message_key"], "'=cmd|' /C calc'!A0");
        assert_eq!(json["event_id"], 5);
        // A leading quote is doubled, so that dropping one gives it back.
        let quoted = export_json(5, &event("'quoted", "plain", "e"), "m-1");
        assert_eq!(quoted["message_key"], "''quoted");
        assert_eq!(json["reason"], "'@x");
        assert_eq!(json["message_id"], "m-1");
        assert_eq!(json["at"], "2024-05-01T12:10:00.500Z");
        // Numbers stay numbers.
        assert_eq!(json["attempt"], 1);
        let item = v1::UnattemptedItem {
            dead_letter_id: "d-2".into(),
            message_key: "-k".into(),
            message_id: "+m".into(),
            ..Default::default()
        };
        let plan_id = PlanId::parse("plan_id", "0190f3a2-7c1e-7b3a-9d4e-2f6a8b1c0d5e").unwrap();
        let json = unattempted_json(plan_id, &item);
        assert_eq!(
            (&json["message_key"], &json["message_id"]),
            (&"'-k".into(), &"'+m".into())
        );
        let csv = String::from_utf8(unattempted_csv(plan_id, &[(1, item)])).unwrap();
        assert!(csv.contains(",d-2,'-k,'+m,never_attempted,"), "{csv}");
    }
}
