//! Offline verification of a large log export (issue "A verifiable audit":
//! 1,000,000 events verified in under 10 s on this machine).
//!
//! Run: `cargo bench -p redrive-tlog --bench verify`
//! (`REDRIVE_BENCH_EVENTS`, default 1,000,000).
//!
//! Builds a log of that many events in memory (leaves, root, a signed
//! checkpoint), writes it as JSON Lines and as CSV exactly as the planner's
//! `ExportAuditLog` writes it, then times what `redrivectl audit verify`
//! does: read the export, recompute every leaf, the root and the
//! signature. The reference, measured in the same run, is the least any
//! verifier must do: one SHA-256 pass over the export's bytes.

use std::time::Instant;

use redrive_tlog::{
    Hash,
    checkpoint::{Checkpoint, sign_checkpoint},
    export::{LogRow, csv_header, csv_rows, jsonl_checkpoint_line, jsonl_rows, read_log_export},
    leaf::{ActionLeaf, Entry, EventLeaf},
    merkle,
    note::Signer,
    verify::verify,
};
use sha2::{Digest, Sha256};

fn entry(index: u64) -> Entry {
    let plan_id = format!("0192f1a4-7c1e-7b3a-9f00-{:012x}", index / 10_000);
    let at = format!(
        "2026-12-03T{:02}:{:02}:{:02}.{:06}Z",
        (index / 3_600_000) % 24,
        (index / 60_000) % 60,
        (index / 1000) % 60,
        index % 1_000_000
    );
    if index.is_multiple_of(10_000) {
        Entry::Action(ActionLeaf {
            plan_id,
            id: i64::try_from(index).unwrap_or_default(),
            at,
            action: "approve".into(),
            actor: "alice".into(),
            reason: "incident 4711: consumer fixed".into(),
        })
    } else {
        Entry::Event(EventLeaf {
            plan_id,
            id: i64::try_from(index).unwrap_or_default(),
            at,
            slice_id: Some(i64::try_from(index / 50).unwrap_or_default()),
            dead_letter_id: i64::try_from(index * 3).unwrap_or_default(),
            message_key: format!("order-{index}"),
            message_id: format!("m-{index:08}"),
            destination: "orders.exchange/orders.created".into(),
            action: "sent".into(),
            reason: String::new(),
            wave: "main".into(),
            executor_id: "executor-1".into(),
            attempt: 1,
            confirm_latency_us: 850,
        })
    }
}

fn main() -> anyhow::Result<()> {
    let events: u64 = std::env::var("REDRIVE_BENCH_EVENTS")
        .ok()
        .and_then(|value| value.replace('_', "").parse().ok())
        .unwrap_or(1_000_000);
    let signer = Signer::generate("bench.redrive/audit")?;
    let rows: Vec<LogRow> = (0..events)
        .map(|index| {
            let entry = entry(index);
            LogRow {
                leaf_index: Some(index),
                kind: entry.kind().to_owned(),
                plan_id: entry.plan_id().to_owned(),
                id: entry.id(),
                leaf_hash: Some(entry.leaf_hash()),
                entry: Some(entry),
                note: String::new(),
            }
        })
        .collect();
    let hashes: Vec<Hash> = rows.iter().filter_map(|row| row.leaf_hash).collect();
    let checkpoint = Checkpoint {
        origin: "bench.redrive/audit".into(),
        size: events,
        root: merkle::root(&hashes),
        extensions: vec!["time 2026-12-03T22:00:00Z".into()],
    };
    let note = sign_checkpoint(&signer, &checkpoint)?;
    let verifier = signer.verifier();
    let mut jsonl = jsonl_checkpoint_line(&note);
    let mut csv = csv_header();
    for chunk in rows.chunks(5000) {
        jsonl.extend(jsonl_rows(chunk));
        csv.extend(csv_rows(chunk));
    }
    drop(rows);
    println!(
        "{events} events: JSON Lines {} MiB, CSV {} MiB",
        jsonl.len() >> 20,
        csv.len() >> 20
    );
    for (name, data) in [("jsonl", &jsonl), ("csv", &csv)] {
        let started = Instant::now();
        let digest = Sha256::digest(data.as_slice());
        let reference = started.elapsed();
        let started = Instant::now();
        let export = read_log_export(data)?;
        let read = started.elapsed();
        let report = verify(&export, &note, &verifier, &[])?;
        let total = started.elapsed();
        anyhow::ensure!(
            report.is_valid(),
            "{:?}",
            report.problems.first().map(ToString::to_string)
        );
        anyhow::ensure!(report.leaves_checked == events);
        println!(
            "{name}: verified {events} events in {:.2} s (reading {:.2} s, checking {:.2} s); \
             one SHA-256 pass over its bytes {:.3} s: {:.1}× that (digest {})",
            total.as_secs_f64(),
            read.as_secs_f64(),
            (total - read).as_secs_f64(),
            reference.as_secs_f64(),
            total.as_secs_f64() / reference.as_secs_f64().max(1e-9),
            &hex::encode(digest)[..8],
        );
    }
    Ok(())
}
