//! Issue 13: one `IngestDeadLetters` stream of 12 × 50 MiB bodies raised the
//! planner to 1.8 GB, because a batch of up to 500 items was held before
//! storing. Now a stream stores every 32 MiB of bodies
//! (`redrive_proto::limits::MAX_INGEST_BATCH_BYTES`) and is read on only
//! then. Its own test binary: the peak memory measured is this process's
//! (client and in-process planner), with no other test running beside it.

use futures::StreamExt;
use redrive_proto::v1::IngestDeadLettersRequest;
use redrive_tests::{TestBed, dead_letters_of, init_logging, unique};

const BODY_BYTES: usize = 50 * 1024 * 1024;
/// More than the 12: the peak of a bounded stream does not grow with
/// its length (about 450 MiB here, client, planner and allocator together),
/// a buffered one holds every body.
const ITEMS: usize = 20;

/// This process's peak resident memory (`VmHWM`), in bytes.
fn peak_resident_bytes() -> anyhow::Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let line = status
        .lines()
        .find(|line| line.starts_with("VmHWM:"))
        .ok_or_else(|| anyhow::anyhow!("no VmHWM in /proc/self/status"))?;
    let kib: u64 = line
        .trim_start_matches("VmHWM:")
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()?;
    Ok(kib * 1024)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_of_large_bodies_is_stored_as_it_comes() -> anyhow::Result<()> {
    init_logging();
    let mut bed = TestBed::without_broker(|_| {}).await?;
    let source = unique("large");
    // Resets the peak to the current resident size (Linux, `clear_refs`).
    std::fs::write("/proc/self/clear_refs", "5")?;
    let before = peak_resident_bytes()?;
    let items = futures::stream::iter(0..ITEMS).map({
        let source = source.clone();
        move |index| IngestDeadLettersRequest {
            source: source.clone(),
            message_id: format!("m-{index}"),
            // Distinct bodies: identical ones would be one dead letter.
            body: vec![b'a' + u8::try_from(index).unwrap_or(0); BODY_BYTES],
            original_destination: "orders".into(),
            reason: "rejected".into(),
            ..Default::default()
        }
    });
    let summary = bed.client.ingest_dead_letters(items).await?.into_inner();
    assert_eq!(summary.accepted, ITEMS as u64, "{summary:?}");
    let grown = peak_resident_bytes()?.saturating_sub(before);
    let total = (ITEMS * BODY_BYTES) as u64;
    eprintln!(
        "peak grew {} MiB for {} MiB of bodies",
        grown / (1024 * 1024),
        total / (1024 * 1024)
    );
    assert!(
        grown < total * 3 / 4,
        "the peak grew {} MiB for {} MiB of bodies: the stream was buffered",
        grown / (1024 * 1024),
        total / (1024 * 1024)
    );
    let listed = dead_letters_of(&mut bed.client, &source, 100).await?;
    assert_eq!(listed.dead_letters.len(), ITEMS);
    bed.finish().await
}
