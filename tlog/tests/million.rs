//! The performance target: reading and verifying a 1,000,000-event export
//! in well under 10 s (release build, 2 cores). Ignored by default; run
//! with
//!
//! ```text
//! cargo test -p redrive-tlog --release --test million -- --ignored --nocapture
//! ```

use std::time::Instant;

use redrive_tlog::checkpoint::{Checkpoint, sign_checkpoint};
use redrive_tlog::export::{
    LogRow, csv_header, csv_rows, jsonl_checkpoint_line, jsonl_rows, read_log_export,
};
use redrive_tlog::leaf::{Entry, EventLeaf};
use redrive_tlog::merkle;
use redrive_tlog::note::Signer;
use redrive_tlog::verify::verify;

const ROWS: usize = 1_000_000;

fn rows() -> Vec<LogRow> {
    (0..ROWS)
        .map(|i| {
            let entry = Entry::Event(EventLeaf {
                plan_id: "0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b".into(),
                id: i as i64,
                at: format!(
                    "2025-03-04T05:{:02}:{:02}.{:06}Z",
                    i / 60 % 60,
                    i % 60,
                    i % 1_000_000
                ),
                slice_id: Some((i / 1000) as i64),
                dead_letter_id: 5_000_000 + i as i64,
                message_key: format!("order-{i}"),
                message_id: format!("01HZX{i:021}"),
                destination: "amqp://orders/retry".into(),
                action: "replayed".into(),
                reason: "operator approved replay of the quarantined batch".into(),
                wave: "wave-3".into(),
                executor_id: "executor-7f3a".into(),
                attempt: 1,
                confirm_latency_us: 1234 + (i % 977) as i64,
            });
            LogRow {
                leaf_index: Some(i as u64),
                kind: "event".into(),
                plan_id: entry.plan_id().into(),
                id: entry.id(),
                leaf_hash: Some(entry.leaf_hash()),
                entry: Some(entry),
                note: String::new(),
            }
        })
        .collect()
}

#[test]
#[ignore = "a release-build benchmark: --release -- --ignored"]
fn million_rows_read_and_verify() {
    let signer = Signer::from_seed("log.example/audit", &[1; 32]).unwrap();
    let rows = rows();
    let hashes: Vec<_> = rows.iter().map(|row| row.leaf_hash.unwrap()).collect();
    let checkpoint = Checkpoint {
        origin: "log.example/audit".into(),
        size: ROWS as u64,
        root: merkle::root(&hashes),
        extensions: vec![],
    };
    let note = sign_checkpoint(&signer, &checkpoint).unwrap();
    let witnessed: Vec<String> = [1, 1000, 333_333, 999_999]
        .iter()
        .map(|&size| {
            let checkpoint = Checkpoint {
                origin: "log.example/audit".into(),
                size: size as u64,
                root: merkle::root(&hashes[..size]),
                extensions: vec![],
            };
            sign_checkpoint(&signer, &checkpoint).unwrap()
        })
        .collect();

    let mut jsonl = jsonl_checkpoint_line(&note);
    jsonl.extend(jsonl_rows(&rows));
    let mut csv = csv_header();
    csv.extend(csv_rows(&rows));
    drop(rows);

    for (name, data) in [("JSON Lines", &jsonl), ("CSV", &csv)] {
        let start = Instant::now();
        let export = read_log_export(data).unwrap();
        let read = start.elapsed();
        let report = verify(&export, &note, &signer.verifier(), &witnessed).unwrap();
        let total = start.elapsed();
        assert!(report.is_valid(), "{report}");
        assert_eq!(report.leaves_checked, ROWS as u64);
        println!(
            "{name}: {} MB, read {:.2} s, read + verify {:.2} s",
            data.len() / 1_000_000,
            read.as_secs_f64(),
            total.as_secs_f64()
        );
        assert!(total.as_secs_f64() < 10.0, "{name} took {total:?}");
    }
}
