//! Log exports (CSV and JSON Lines) and their offline verification: a
//! small log built here, exported, read back and verified, then tampered
//! with in every way `verify` must notice.

use proptest::prelude::*;
use redrive_tlog::Hash;
use redrive_tlog::checkpoint::{Checkpoint, sign_checkpoint};
use redrive_tlog::export::{
    LOG_COLUMNS, LogExport, LogRow, csv_header, csv_rows, jsonl_checkpoint_line, jsonl_rows,
    read_log_export, spreadsheet_original, spreadsheet_safe,
};
use redrive_tlog::leaf::{ActionLeaf, Entry, EventLeaf};
use redrive_tlog::merkle;
use redrive_tlog::note::Signer;
use redrive_tlog::verify::{Problem, Report, VerifyError, verify};

const PLAN: &str = "0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b";
const ORIGIN: &str = "log.example/redrive-audit";

fn signer() -> Signer {
    Signer::from_seed(ORIGIN, &[7; 32]).unwrap()
}

fn event(id: i64, reason: &str) -> Entry {
    Entry::Event(EventLeaf {
        plan_id: PLAN.into(),
        id,
        at: format!(
            "2025-03-04T05:06:{:02}.{:06}Z",
            id % 60,
            id * 1000 % 1_000_000
        ),
        slice_id: if id % 2 == 0 { Some(id / 2) } else { None },
        dead_letter_id: 1000 + id,
        message_key: format!("key-{id}"),
        message_id: if id == 12 {
            String::new()
        } else {
            format!("msg-{id}")
        },
        destination: "orders.retry".into(),
        action: "replayed".into(),
        reason: reason.into(),
        wave: "canary".into(),
        executor_id: "exec-1".into(),
        attempt: 1,
        confirm_latency_us: 250 * id,
    })
}

fn action(id: i64, action: &str, reason: &str) -> Entry {
    Entry::Action(ActionLeaf {
        plan_id: PLAN.into(),
        id,
        at: format!("2025-03-04T05:07:{:02}.000000Z", id % 60),
        action: action.into(),
        actor: "'alice@example.com".into(),
        reason: reason.into(),
    })
}

/// Eight entries, with reasons a spreadsheet would run as formulas.
fn entries() -> Vec<Entry> {
    vec![
        action(1, "approve", "=HYPERLINK(\"http://x\")"),
        event(10, "'quoted already"),
        event(11, "+1 retry"),
        event(12, "-minus"),
        event(13, "@at, with a comma and \"quotes\"\nand a newline"),
        action(2, "pause", "\ttab first"),
        event(14, "\rcarriage return first"),
        event(15, "plain"),
    ]
}

fn sealed(index: usize, entry: &Entry) -> LogRow {
    LogRow {
        leaf_index: Some(index as u64),
        kind: entry.kind().into(),
        plan_id: entry.plan_id().into(),
        id: entry.id(),
        entry: Some(entry.clone()),
        leaf_hash: Some(entry.leaf_hash()),
        note: String::new(),
    }
}

fn rows_of(entries: &[Entry]) -> Vec<LogRow> {
    entries
        .iter()
        .enumerate()
        .map(|(index, entry)| sealed(index, entry))
        .collect()
}

/// The signed checkpoint of the first `size` rows' leaf hashes.
fn checkpoint_note(signer: &Signer, rows: &[LogRow], size: usize) -> String {
    let hashes: Vec<Hash> = rows[..size]
        .iter()
        .map(|row| row.leaf_hash.unwrap())
        .collect();
    let checkpoint = Checkpoint {
        origin: ORIGIN.into(),
        size: size as u64,
        root: merkle::root(&hashes),
        extensions: vec![],
    };
    sign_checkpoint(signer, &checkpoint).unwrap()
}

fn csv_file(rows: &[LogRow]) -> Vec<u8> {
    let mut file = csv_header();
    file.extend(csv_rows(rows));
    file
}

fn jsonl_file(note: &str, rows: &[LogRow]) -> Vec<u8> {
    let mut file = jsonl_checkpoint_line(note);
    file.extend(jsonl_rows(rows));
    file
}

/// Verifies `rows` through both file formats; the reports must agree.
fn check(rows: &[LogRow], note: &str, witnessed: &[String]) -> Report {
    let key = signer().verifier();
    let from_csv = read_log_export(&csv_file(rows)).unwrap();
    let from_jsonl = read_log_export(&jsonl_file(note, rows)).unwrap();
    assert_eq!(from_jsonl.checkpoint.as_deref(), Some(note));
    assert_eq!(from_csv.checkpoint, None);
    let in_memory = verify(
        &LogExport {
            checkpoint: None,
            rows: rows.to_vec(),
        },
        note,
        &key,
        witnessed,
    )
    .unwrap();
    let csv_report = verify(&from_csv, note, &key, witnessed).unwrap();
    let jsonl_report = verify(&from_jsonl, note, &key, witnessed).unwrap();
    assert_eq!(jsonl_report, in_memory);
    // CSV drops notes only.
    let without_notes = |report: &Report| {
        let mut report = report.clone();
        for problem in &mut report.problems {
            if let Problem::Added { note, .. } = problem {
                note.clear();
            }
        }
        report
    };
    assert_eq!(csv_report, without_notes(&in_memory));
    in_memory
}

#[test]
fn clean_export_verifies_in_both_formats() {
    let rows = rows_of(&entries());
    let note = checkpoint_note(&signer(), &rows, rows.len());
    let report = check(&rows, &note, std::slice::from_ref(&note));
    assert!(report.is_valid(), "{report}");
    assert_eq!(report.tree_size, 8);
    assert_eq!(report.origin, ORIGIN);
    assert_eq!(report.leaves_checked, 8);
    assert_eq!(report.newer_rows, 0);
    assert_eq!(
        report.to_string(),
        "log log.example/redrive-audit at 8 leaves: 8 leaves checked, 0 newer rows, no problems"
    );
}

#[test]
fn rows_round_trip_exactly() {
    let mut rows = rows_of(&entries());
    rows.push(LogRow {
        leaf_index: None,
        kind: "event".into(),
        plan_id: PLAN.into(),
        id: 99,
        entry: Some(event(99, "=not sealed")),
        leaf_hash: None,
        note: "=the planner refused to seal it: no valid MAC".into(),
    });
    rows[3].entry = None;
    let note = checkpoint_note(&signer(), &rows, 8);
    let jsonl = read_log_export(&jsonl_file(&note, &rows)).unwrap();
    assert_eq!(jsonl.rows, rows);
    let csv = read_log_export(&csv_file(&rows)).unwrap();
    rows[8].note.clear();
    assert_eq!(csv.rows, rows);
}

#[test]
fn formula_reasons_are_escaped_and_survive() {
    let rows = rows_of(&entries());
    let csv = String::from_utf8(csv_file(&rows)).unwrap();
    assert!(csv.starts_with(&format!("{}\n", LOG_COLUMNS.join(","))));
    // In the file, no cell starts with a formula character.
    assert!(csv.contains(",\"'=HYPERLINK(\"\"http://x\"\")\","), "{csv}");
    assert!(csv.contains(",''quoted already,"), "{csv}");
    assert!(csv.contains(",'+1 retry,"));
    assert!(csv.contains(",'-minus,"));
    assert!(csv.contains(",''alice@example.com,"));
    let jsonl = String::from_utf8(jsonl_file("n\n\n— x y\n", &rows)).unwrap();
    assert!(
        jsonl.contains(r#""reason":"'=HYPERLINK(\"http://x\")""#),
        "{jsonl}"
    );
    assert!(jsonl.contains(r#""reason":"''quoted already""#));
    // Read back, every reason is the original.
    for data in [csv.into_bytes(), jsonl.into_bytes()] {
        let export = read_log_export(&data).unwrap();
        let reasons: Vec<String> = export
            .rows
            .iter()
            .map(|row| match row.entry.as_ref().unwrap() {
                Entry::Event(event) => event.reason.clone(),
                Entry::Action(action) => action.reason.clone(),
            })
            .collect();
        let expected: Vec<String> = entries()
            .iter()
            .map(|entry| match entry {
                Entry::Event(event) => event.reason.clone(),
                Entry::Action(action) => action.reason.clone(),
            })
            .collect();
        assert_eq!(reasons, expected);
    }
}

#[test]
fn jsonl_shape() {
    let rows = rows_of(&entries());
    let line = String::from_utf8(jsonl_rows(&rows[..1])).unwrap();
    let expected = format!(
        "{{\"leaf_index\":0,\"kind\":\"action\",\"plan_id\":\"{PLAN}\",\"id\":1,\
         \"at\":\"2025-03-04T05:07:01.000000Z\",\"slice_id\":null,\"dead_letter_id\":null,\
         \"message_key\":null,\"message_id\":null,\"destination\":null,\"action\":\"approve\",\
         \"reason\":\"'=HYPERLINK(\\\"http://x\\\")\",\"wave\":null,\"executor_id\":null,\
         \"attempt\":null,\"confirm_latency_us\":null,\"actor\":\"''alice@example.com\",\
         \"leaf_hash\":\"{}\"}}\n",
        hex::encode(entries()[0].leaf_hash())
    );
    assert_eq!(line, expected);
    assert_eq!(
        jsonl_checkpoint_line("o\n1\nr\n\n— k s\n"),
        b"{\"checkpoint\":\"o\\n1\\nr\\n\\n\xe2\x80\x94 k s\\n\"}\n".to_vec()
    );
}

#[test]
fn changed_row_is_named() {
    let mut rows = rows_of(&entries());
    let note = checkpoint_note(&signer(), &rows, rows.len());
    if let Some(Entry::Event(event)) = &mut rows[3].entry {
        event.action = "skipped".into();
    }
    let report = check(&rows, &note, &[]);
    assert_eq!(
        report.problems,
        vec![Problem::Changed {
            leaf_index: 3,
            kind: "event".into(),
            plan_id: PLAN.into(),
            id: 12,
        }]
    );
    assert_eq!(
        report.problems[0].to_string(),
        format!("leaf 3: event 12 of plan {PLAN} changed after it was sealed")
    );
    assert!(!report.is_valid());
}

#[test]
fn changed_identity_is_noticed() {
    let mut rows = rows_of(&entries());
    let note = checkpoint_note(&signer(), &rows, rows.len());
    rows[2].id = 999;
    let key = signer().verifier();
    let export = LogExport {
        checkpoint: None,
        rows,
    };
    let report = verify(&export, &note, &key, &[]).unwrap();
    assert!(matches!(
        report.problems.as_slice(),
        [Problem::Changed {
            leaf_index: 2,
            id: 999,
            ..
        }]
    ));
}

#[test]
fn missing_row_is_a_gap() {
    let mut rows = rows_of(&entries());
    let note = checkpoint_note(&signer(), &rows, rows.len());
    rows.remove(2);
    let report = check(&rows, &note, &[]);
    assert_eq!(report.problems, vec![Problem::Missing { leaf_index: 2 }]);
    assert_eq!(
        report.problems[0].to_string(),
        "leaf 2 is not in the export"
    );
    assert_eq!(report.leaves_checked, 7);
}

#[test]
fn deleted_record_is_named() {
    let mut rows = rows_of(&entries());
    let note = checkpoint_note(&signer(), &rows, rows.len());
    rows[5].entry = None;
    let report = check(&rows, &note, &[]);
    assert_eq!(
        report.problems,
        vec![Problem::Deleted {
            leaf_index: 5,
            kind: "action".into(),
            plan_id: PLAN.into(),
            id: 2,
        }]
    );
    assert_eq!(
        report.problems[0].to_string(),
        format!(
            "leaf 5: action 2 of plan {PLAN} was sealed into the log but is gone from the database"
        )
    );
    // In the CSV file, the gone record's row has only its identity.
    let csv = String::from_utf8(csv_rows(&rows[5..6])).unwrap();
    assert_eq!(
        csv,
        format!(
            "5,action,{PLAN},2,,,,,,,,,,,,,,{}\n",
            hex::encode(rows[5].leaf_hash.unwrap())
        )
    );
}

#[test]
fn unsealed_record_is_added() {
    let mut rows = rows_of(&entries());
    let note = checkpoint_note(&signer(), &rows, rows.len());
    rows.insert(
        4,
        LogRow {
            leaf_index: None,
            kind: "event".into(),
            plan_id: PLAN.into(),
            id: 77,
            entry: Some(event(77, "slipped in")),
            leaf_hash: None,
            note: "the planner refused to seal it: no valid MAC".into(),
        },
    );
    let report = check(&rows, &note, &[]);
    assert_eq!(
        report.problems,
        vec![Problem::Added {
            kind: "event".into(),
            plan_id: PLAN.into(),
            id: 77,
            note: "the planner refused to seal it: no valid MAC".into(),
        }]
    );
    assert_eq!(
        report.problems[0].to_string(),
        format!(
            "event 77 of plan {PLAN} is in the database but was never sealed into the log \
             (the planner refused to seal it: no valid MAC)"
        )
    );
}

#[test]
fn truncated_log_against_a_witness() {
    let rows = rows_of(&entries());
    let witnessed = checkpoint_note(&signer(), &rows, 8);
    // The log was cut back to 5 leaves and re-signed by its own key.
    let note = checkpoint_note(&signer(), &rows, 5);
    let report = check(&rows[..5], &note, &[witnessed]);
    assert_eq!(
        report.problems,
        vec![Problem::Truncated {
            witnessed_size: 8,
            export_size: 5,
        }]
    );
    assert_eq!(
        report.problems[0].to_string(),
        "a witnessed checkpoint has 8 leaves but the export's checkpoint only 5: the log was cut short"
    );
}

#[test]
fn forked_log_against_a_witness() {
    let original = rows_of(&entries());
    let witnessed_small = checkpoint_note(&signer(), &original, 3);
    let witnessed_empty = checkpoint_note(&signer(), &original, 0);
    // The log was rebuilt with another first leaf, rehashed and re-signed.
    let mut forged = entries();
    forged[0] = action(1, "reject", "rewritten");
    let rows = rows_of(&forged);
    let note = checkpoint_note(&signer(), &rows, rows.len());
    let report = check(&rows, &note, &[witnessed_empty, witnessed_small]);
    assert_eq!(report.problems, vec![Problem::Forked { witnessed_size: 3 }]);
    assert!(report.problems[0].to_string().contains("a fork"));
    // Consistent witnesses of every size pass.
    let witnesses: Vec<String> = (0..=8)
        .map(|size| checkpoint_note(&signer(), &original, size))
        .collect();
    let note = checkpoint_note(&signer(), &original, 8);
    assert!(check(&original, &note, &witnesses).is_valid());
}

#[test]
fn rewritten_log_fails_the_root() {
    let mut rows = rows_of(&entries());
    let note = checkpoint_note(&signer(), &rows, rows.len());
    // Change a record and its sealed hash together: only the root notices.
    let changed = event(11, "a new story");
    rows[2] = sealed(2, &changed);
    let report = check(&rows, &note, &[]);
    assert!(matches!(
        report.problems.as_slice(),
        [Problem::RootMismatch { .. }]
    ));
    assert!(report.problems[0].to_string().starts_with(
        "the sealed leaf hashes do not match the signed root: the log itself was rewritten"
    ));
}

#[test]
fn duplicate_leaf_index() {
    let mut rows = rows_of(&entries());
    let note = checkpoint_note(&signer(), &rows, rows.len());
    let copy = rows[1].clone();
    rows.push(copy);
    let report = check(&rows, &note, &[]);
    assert_eq!(
        report.problems,
        vec![Problem::Duplicate {
            leaf_index: 1,
            kind: "event".into(),
            plan_id: PLAN.into(),
            id: 10,
        }]
    );
}

#[test]
fn newer_rows_are_counted_not_checked() {
    let rows = rows_of(&entries());
    let note = checkpoint_note(&signer(), &rows, 5);
    let report = check(&rows, &note, &[]);
    assert!(report.is_valid(), "{report}");
    assert_eq!(report.tree_size, 5);
    assert_eq!(report.leaves_checked, 5);
    assert_eq!(report.newer_rows, 3);
}

#[test]
fn problems_come_in_leaf_order() {
    let mut rows = rows_of(&entries());
    let note = checkpoint_note(&signer(), &rows, rows.len());
    rows.reverse();
    rows.retain(|row| row.leaf_index != Some(6));
    rows[0].entry = None; // leaf 7
    if let Some(Entry::Action(action)) = &mut rows[6].entry {
        action.actor = "mallory".into(); // leaf 0
    }
    let report = check(&rows, &note, &[]);
    let leaves: Vec<String> = report.problems.iter().map(ToString::to_string).collect();
    assert_eq!(leaves.len(), 3, "{leaves:?}");
    assert!(leaves[0].starts_with("leaf 0: action 1"));
    assert!(leaves[1].starts_with("leaf 6 is not"));
    assert!(leaves[2].starts_with("leaf 7: event 15"));
}

#[test]
fn checkpoint_by_another_key_is_refused() {
    let rows = rows_of(&entries());
    let other = Signer::from_seed("other.example/key", &[9; 32]).unwrap();
    let note = checkpoint_note(&other, &rows, rows.len());
    let export = read_log_export(&jsonl_file(&note, &rows)).unwrap();
    let error = verify(&export, &note, &signer().verifier(), &[]).unwrap_err();
    assert!(matches!(error, VerifyError::Signature(_)));
    let message = error.to_string();
    assert!(
        message.contains(&format!(
            "not signed by {ORIGIN}+{:08x} (signed by: other.example/key+{:08x})",
            signer().key_id(),
            other.key_id()
        )),
        "{message}"
    );
    // A witnessed checkpoint by another key is refused too.
    let good = checkpoint_note(&signer(), &rows, rows.len());
    let error = verify(&export, &good, &signer().verifier(), &[note]).unwrap_err();
    assert!(
        matches!(error, VerifyError::Witnessed { number: 1, .. }),
        "{error}"
    );
    assert!(
        error.to_string().contains("signed by: other.example/key"),
        "{error}"
    );
}

#[test]
fn checkpoint_changed_after_signing_is_refused() {
    let rows = rows_of(&entries());
    let note = checkpoint_note(&signer(), &rows, rows.len());
    let changed = note.replacen("\n8\n", "\n7\n", 1);
    let export = LogExport {
        checkpoint: None,
        rows,
    };
    let error = verify(&export, &changed, &signer().verifier(), &[]).unwrap_err();
    assert!(error.to_string().contains("bad signature by"), "{error}");
}

#[test]
fn reader_errors_name_the_place_and_field() {
    let rows = rows_of(&entries());
    let csv = String::from_utf8(csv_file(&rows)).unwrap();
    let error = |data: &str| read_log_export(data.as_bytes()).unwrap_err().to_string();

    let bad_attempt = csv.replacen(",1,2500,", ",one,2500,", 1);
    assert_ne!(bad_attempt, csv);
    let message = error(&bad_attempt);
    assert!(message.contains("field `attempt`"), "{message}");
    assert!(message.starts_with("CSV record 2 (line 3)"), "{message}");

    let bad_time = csv.replacen("2025-03-04T05:06:10.010000Z", "2025-03-04 05:06:10", 1);
    let message = error(&bad_time);
    assert!(message.contains("field `at`"), "{message}");

    let bad_hash = csv.replacen(&hex::encode(rows[0].leaf_hash.unwrap()), "abc", 1);
    let message = error(&bad_hash);
    assert!(
        message.contains("CSV record 1 (line 2), field `leaf_hash`"),
        "{message}"
    );

    let short = format!("{}0,event\n", String::from_utf8(csv_header()).unwrap());
    let message = error(&short);
    assert!(
        message.contains("2 fields, but a log export has 18"),
        "{message}"
    );

    let note = checkpoint_note(&signer(), &rows, 8);
    let jsonl = String::from_utf8(jsonl_file(&note, &rows)).unwrap();
    let bad_kind = jsonl.replacen("\"kind\":\"event\"", "\"kind\":\"evnt\"", 1);
    let message = error(&bad_kind);
    assert!(message.starts_with("line 3, field `kind`"), "{message}");

    let unknown = jsonl.replacen("\"wave\":", "\"wav\":", 1);
    let message = error(&unknown);
    assert!(message.contains("unknown member \"wav\""), "{message}");

    let late_checkpoint = format!(
        "{}{}",
        String::from_utf8(jsonl_rows(&rows)).unwrap(),
        String::from_utf8(jsonl_checkpoint_line(&note)).unwrap()
    );
    let message = error(&late_checkpoint);
    assert!(message.starts_with("line 9"), "{message}");

    let action_with_wave = jsonl.replacen("\"wave\":null", "\"wave\":\"w\"", 1);
    let message = error(&action_with_wave);
    assert!(
        message.contains("line 2, field `wave`: must be empty"),
        "{message}"
    );

    let not_json = "{\"leaf_index\":0,\n";
    assert!(error(not_json).starts_with("line 1: not JSON"));

    let repeated = jsonl.replacen(
        "\"wave\":\"canary\"",
        "\"wave\":\"canary\",\"wave\":\"x\"",
        1,
    );
    let message = error(&repeated);
    assert!(
        message.starts_with("line 3: duplicate field `wave`"),
        "{message}"
    );

    let hash_without_index = jsonl.replacen("\"leaf_index\":0,", "\"leaf_index\":null,", 1);
    let message = error(&hash_without_index);
    assert!(message.contains("field `leaf_index`"), "{message}");
}

#[test]
fn empty_and_blank_exports() {
    assert_eq!(read_log_export(b"").unwrap(), LogExport::default());
    assert_eq!(read_log_export(b"\n\n").unwrap(), LogExport::default());
    assert_eq!(
        read_log_export(&csv_header()).unwrap(),
        LogExport::default()
    );
    // CRLF and a byte order mark, as a spreadsheet may save it.
    let rows = rows_of(&entries());
    let csv = String::from_utf8(csv_file(&rows)).unwrap();
    let crlf = format!("\u{feff}{}", csv.replace('\n', "\r\n"));
    assert_eq!(read_log_export(crlf.as_bytes()).unwrap().rows.len(), 8);
}

proptest! {
    #[test]
    fn spreadsheet_escape_is_reversible(text in any::<String>()) {
        let safe = spreadsheet_safe(&text);
        prop_assert_eq!(spreadsheet_original(&safe), text.clone());
        if let Some(first) = safe.chars().next() {
            prop_assert!(!matches!(first, '=' | '+' | '-' | '@' | '\t' | '\r'));
        }
    }

    #[test]
    fn prefixed_text_is_reversible(
        first in prop::sample::select(vec!['=', '+', '-', '@', '\t', '\r', '\'', 'a']),
        rest in any::<String>(),
    ) {
        let text = format!("{first}{rest}");
        prop_assert_eq!(spreadsheet_original(&spreadsheet_safe(&text)), text);
    }

    /// Any strings in any field survive both formats.
    #[test]
    fn any_event_round_trips(texts in prop::collection::vec(any::<String>(), 8), numbers in any::<(i64, i32, i64, Option<i64>)>()) {
        let entry = Entry::Event(EventLeaf {
            plan_id: format!("p{}", texts[0]),
            id: numbers.0,
            at: "2025-01-02T03:04:05.678901Z".into(),
            slice_id: numbers.3,
            dead_letter_id: numbers.2,
            message_key: texts[1].clone(),
            message_id: texts[2].clone(),
            destination: texts[3].clone(),
            action: texts[4].clone(),
            reason: texts[5].clone(),
            wave: texts[6].clone(),
            executor_id: texts[7].clone(),
            attempt: numbers.1,
            confirm_latency_us: numbers.2,
        });
        let rows = vec![sealed(0, &entry)];
        prop_assert_eq!(read_log_export(&csv_file(&rows)).unwrap().rows, rows.clone());
        prop_assert_eq!(read_log_export(&jsonl_rows(&rows)).unwrap().rows, rows);
    }
}

/// An export large enough to be read and verified in chunks on several
/// threads (when the machine has several cores): the same rows, the same
/// line numbers in errors, the same problems.
#[test]
fn large_export_in_chunks() {
    let entries: Vec<Entry> = (0..40_000)
        .map(|id| {
            if id % 1000 == 0 {
                action(id, "approve", "=chunked")
            } else {
                event(id, "'many")
            }
        })
        .collect();
    let mut rows = rows_of(&entries);
    let note = checkpoint_note(&signer(), &rows, rows.len());
    let jsonl = jsonl_file(&note, &rows);
    assert!(jsonl.len() > 16 << 20, "{} bytes", jsonl.len());
    let export = read_log_export(&jsonl).unwrap();
    assert_eq!(export.rows, rows);
    let report = verify(&export, &note, &signer().verifier(), &[]).unwrap();
    assert!(report.is_valid(), "{report}");
    assert_eq!(report.leaves_checked, 40_000);

    // An error late in the file names its line (the checkpoint is line 1).
    let text = String::from_utf8(jsonl).unwrap();
    let mut lines: Vec<&str> = text.lines().collect();
    let broken = lines[35_002].replacen("\"kind\":\"event\"", "\"kind\":\"evnt\"", 1);
    assert_ne!(broken, lines[35_002]);
    lines[35_002] = &broken;
    let Err(error) = read_log_export(lines.join("\n").as_bytes()) else {
        panic!("a broken line was read");
    };
    let message = error.to_string();
    assert!(message.starts_with("line 35003, field `kind`"), "{message}");

    // Problems far apart are found and ordered.
    rows[39_999].entry = None;
    if let Some(Entry::Event(event)) = &mut rows[17].entry {
        event.attempt = 2;
    }
    let export = read_log_export(&csv_file(&rows)).unwrap();
    let report = verify(&export, &note, &signer().verifier(), &[]).unwrap();
    assert!(matches!(
        report.problems.as_slice(),
        [
            Problem::Changed { leaf_index: 17, .. },
            Problem::Deleted {
                leaf_index: 39_999,
                ..
            }
        ]
    ));
}
