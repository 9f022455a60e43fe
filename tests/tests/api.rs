//! The Planner API for dead letters pushed by services and imported from files:
//! ingest idempotency, rejections, listing, lookups, summaries, and the errors a
//! client gets for bad requests.

use std::io::Write;

use redrive_planner::{
    dead_letters::{ExtractionRules, RawDeadLetter},
    store::{Store, dead_letters::TakenIds},
};
use redrive_proto::v1::{
    self, GetDeadLetterRequest, HeaderTable, HeaderValue, IngestDeadLettersRequest,
    ListDeadLettersRequest, MessageProperties, Origin, ReasonClass, SummarizeDeadLettersRequest,
    SummaryDimension, header_value::Value,
};
use redrive_tests::{TestBed, TestDb, init_logging, precheck_items, unique};
use tonic::Code;

fn item(
    source: &str,
    message_id: &str,
    body: &[u8],
    reason: &str,
    producer: &str,
) -> IngestDeadLettersRequest {
    IngestDeadLettersRequest {
        source: source.to_owned(),
        message_id: message_id.to_owned(),
        body: body.to_vec(),
        properties: Some(MessageProperties {
            app_id: Some(producer.to_owned()),
            r#type: Some("order.created".to_owned()),
            ..Default::default()
        }),
        headers: Some(HeaderTable {
            fields: [(
                "retries".to_owned(),
                HeaderValue {
                    value: Some(Value::ShortInt(-2)),
                },
            )]
            .into(),
        }),
        reason: reason.to_owned(),
        attempts: 5,
        error_text: "stock service timed out".to_owned(),
        original_destination: "orders.fulfil".to_owned(),
        occurred_at: Some(prost_types::Timestamp {
            seconds: 1_764_000_000,
            nanos: 0,
        }),
        imported: false,
    }
}

fn gzip(text: &str) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    encoder.write_all(text.as_bytes()).unwrap();
    encoder.finish().unwrap()
}

/// Pushes `items` through IngestDeadLetters in one stream; the answer.
async fn ingest(
    client: &mut v1::planner_client::PlannerClient<tonic::transport::Channel>,
    items: Vec<IngestDeadLettersRequest>,
) -> anyhow::Result<v1::IngestDeadLettersResponse> {
    Ok(client
        .ingest_dead_letters(tokio_stream::iter(items))
        .await?
        .into_inner())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingest_is_idempotent_rejects_bad_items_and_is_inspectable() -> anyhow::Result<()> {
    init_logging();
    let mut bed = TestBed::without_broker(|_| {}).await?;
    let source = unique("svc");
    let compressed = gzip(r#"{"order_id":"o-9"}"#);
    let mut bad = item(&source, "m-bad", b"{}", "rejected", "shop");
    bad.original_destination = String::new();
    let items = vec![
        item(
            &source,
            "m-1",
            br#"{"order_id":"o-1"}"#,
            "delivery_limit",
            "shop",
        ),
        bad,
        item(&source, "m-2", &compressed, "rejected", "shop"),
        item(&source, "m-3", b"plain", "expired", "billing"),
    ];

    let first = ingest(&mut bed.client, items.clone()).await?;
    assert_eq!(first.accepted, 3);
    assert_eq!(first.duplicates, 0);
    assert_eq!(first.rejected.len(), 1);
    assert_eq!(first.rejected[0].index, 1);
    assert!(
        first.rejected[0].reason.contains("original_destination"),
        "{:?}",
        first.rejected
    );

    let again = ingest(&mut bed.client, items).await?;
    assert_eq!(
        (again.accepted, again.duplicates),
        (0, 3),
        "a second push stores nothing new"
    );

    // Listing pages through exactly what was stored, honouring the limit.
    let selector = v1::Selector {
        sources: vec![source.clone()],
        ..Default::default()
    };
    let page = bed
        .client
        .list_dead_letters(ListDeadLettersRequest {
            selector: Some(selector.clone()),
            page_size: 2,
            page_token: String::new(),
        })
        .await?
        .into_inner();
    assert_eq!(page.dead_letters.len(), 2);
    assert!(
        page.dead_letters.iter().all(|d| d.body.is_empty()),
        "list answers carry no bodies"
    );
    let rest = bed
        .client
        .list_dead_letters(ListDeadLettersRequest {
            selector: Some(selector.clone()),
            page_size: 2,
            page_token: page.next_page_token.clone(),
        })
        .await?
        .into_inner();
    assert_eq!(rest.dead_letters.len(), 1);
    assert!(rest.next_page_token.is_empty());
    let limited = bed
        .client
        .list_dead_letters(ListDeadLettersRequest {
            selector: Some(v1::Selector {
                limit: 2,
                ..selector.clone()
            }),
            page_size: 2,
            page_token: page.next_page_token,
        })
        .await?
        .into_inner();
    assert!(
        limited.dead_letters.is_empty(),
        "the limit holds across pages"
    );
    // A full last page says there is no next one (no empty page to fetch),
    // also when the limit ends the listing.
    for (page_size, limit) in [(3, 0), (2, 2)] {
        let full = bed
            .client
            .list_dead_letters(ListDeadLettersRequest {
                selector: Some(v1::Selector {
                    limit,
                    ..selector.clone()
                }),
                page_size,
                page_token: String::new(),
            })
            .await?
            .into_inner();
        assert_eq!(full.dead_letters.len(), page_size as usize);
        assert_eq!(
            full.next_page_token, "",
            "page size {page_size}, limit {limit}"
        );
    }

    // Get: exact bytes, typed headers, reason class, preview decompressed.
    let m2 = page
        .dead_letters
        .iter()
        .find(|d| d.message_id.as_deref() == Some("m-2"))
        .unwrap();
    let got = bed
        .client
        .get_dead_letter(GetDeadLetterRequest { id: m2.id.clone() })
        .await?
        .into_inner();
    let dead_letter = got.dead_letter.unwrap();
    assert_eq!(
        dead_letter.body, compressed,
        "the compressed body is kept byte-exact"
    );
    assert_eq!(dead_letter.body_compression(), v1::BodyCompression::Gzip);
    assert!(
        got.body_preview.contains("\"order_id\": \"o-9\""),
        "{}",
        got.body_preview
    );
    assert_eq!(dead_letter.origin(), Origin::Ingest);
    assert_eq!(dead_letter.destination, "orders.fulfil");
    assert_eq!(dead_letter.attempts, Some(5));
    assert_eq!(
        dead_letter.error_text.as_deref(),
        Some("stock service timed out")
    );
    assert_eq!(
        dead_letter.headers.unwrap().fields["retries"].value,
        Some(Value::ShortInt(-2))
    );
    assert_eq!(dead_letter.died_at.unwrap().seconds, 1_764_000_000);
    let m1 = page
        .dead_letters
        .iter()
        .find(|d| d.message_id.as_deref() == Some("m-1"))
        .unwrap();
    assert_eq!(m1.reason_class(), ReasonClass::Exhausted);

    // Summary by reason and producer.
    let summary = bed
        .client
        .summarize_dead_letters(SummarizeDeadLettersRequest {
            selector: Some(selector.clone()),
            group_by: vec![
                SummaryDimension::Producer as i32,
                SummaryDimension::Reason as i32,
            ],
        })
        .await?
        .into_inner();
    assert_eq!(summary.total, 3);
    assert_eq!(summary.groups.len(), 3);
    let billing = summary
        .groups
        .iter()
        .find(|g| g.key["producer"] == "billing")
        .unwrap();
    assert_eq!(
        (billing.key["reason"].as_str(), billing.count),
        ("expired", 1)
    );
    let by_hour = bed
        .client
        .summarize_dead_letters(SummarizeDeadLettersRequest {
            selector: Some(selector.clone()),
            group_by: vec![SummaryDimension::Hour as i32],
        })
        .await?
        .into_inner();
    assert_eq!(by_hour.groups.len(), 1);
    assert_eq!(by_hour.groups[0].key["hour"], "2025-11-24T16:00Z");

    // Errors name the field, the id, or the missing capability.
    let bad_reason = bed
        .client
        .list_dead_letters(ListDeadLettersRequest {
            selector: Some(v1::Selector {
                reasons: vec!["exploded".into()],
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(bad_reason.code(), Code::InvalidArgument);
    assert!(
        bad_reason.message().contains("selector.reasons"),
        "{}",
        bad_reason.message()
    );
    let bad_token = bed
        .client
        .list_dead_letters(ListDeadLettersRequest {
            page_token: "zz".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert!(bad_token.message().contains("page_token"));
    let missing = bed
        .client
        .get_dead_letter(GetDeadLetterRequest {
            id: "999999999".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(missing.code(), Code::NotFound);
    let not_an_id = bed
        .client
        .get_dead_letter(GetDeadLetterRequest { id: "abc".into() })
        .await
        .unwrap_err();
    assert_eq!(not_an_id.code(), Code::InvalidArgument);
    let no_id = bed
        .client
        .replay_dead_letter(v1::ReplayDeadLetterRequest::default())
        .await
        .unwrap_err();
    assert_eq!(no_id.code(), Code::InvalidArgument);
    assert!(
        no_id.message().starts_with("dead_letter_id:"),
        "{}",
        no_id.message()
    );
    let no_body = bed
        .client
        .repair_dead_letter(v1::RepairDeadLetterRequest {
            dead_letter_id: "1".into(),
            new_body: vec![],
            reason: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(no_body.code(), Code::InvalidArgument);
    assert!(
        no_body.message().starts_with("reason:"),
        "{}",
        no_body.message()
    );

    bed.finish().await
}

/// A dead letter as captured from queue `q`: `body`, no properties or
/// headers, `redelivered` as the broker flagged it.
fn raw(body: &[u8], redelivered: bool) -> RawDeadLetter {
    RawDeadLetter::from_queue(
        "q",
        body.to_vec(),
        MessageProperties::default(),
        HeaderTable::default(),
        redelivered,
        chrono::Utc::now(),
    )
}

/// A redelivered message (planner died between commit and ack) is stored once;
/// identical dead letters stay distinct, redelivered or not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redeliveries_are_matched_once_against_unacked_batches_of_earlier_sessions()
-> anyhow::Result<()> {
    let bed = TestBed::without_broker(|_| {}).await?;
    let store = Store::from_pool(bed.pool().await?);
    let rules = ExtractionRules::default();
    let (crashed, acked) = (uuid::Uuid::new_v4(), uuid::Uuid::new_v4());
    // Session 1 stores "same" and "twin" but dies before acking; session 2
    // stores "done" and acks it.
    store
        .insert_captured(
            crashed,
            "q",
            &[
                rules.extract(raw(b"same", false)),
                rules.extract(raw(b"twin", false)),
            ],
        )
        .await?;
    let (done_batch, _) = store
        .insert_captured(acked, "q", &[rules.extract(raw(b"done", false))])
        .await?;
    store.mark_capture_acked(done_batch).await?;

    // Session 3 gets the redeliveries, plus an identical copy of "same" that is
    // a distinct dead letter, plus a redelivered copy of the acked "done".
    let next = uuid::Uuid::new_v4();
    let (_, outcome) = store
        .insert_captured(
            next,
            "q",
            &[
                rules.extract(raw(b"same", true)),
                rules.extract(raw(b"same", true)),
                rules.extract(raw(b"done", true)),
                rules.extract(raw(b"twin", true)),
            ],
        )
        .await?;
    assert_eq!(
        outcome.already_stored, 2,
        "one redelivery each of the two unacked rows"
    );
    assert_eq!(
        outcome.inserted, 2,
        "the second copy of same and the copy of the acked done are new"
    );
    let pool = bed.pool().await?;
    let count = |body: &'static [u8]| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>("SELECT count(*) FROM dead_letters WHERE body = $1")
                .bind(body)
                .fetch_one(&pool)
                .await
        }
    };
    assert_eq!(count(b"same").await?, 2);
    assert_eq!(count(b"twin").await?, 1);
    assert_eq!(count(b"done").await?, 2);
    pool.close().await;
    bed.finish().await
}

/// A batch retried under the ids its session took for it (a commit whose
/// reply was lost, or the one by one fallback cut short) takes the rows an
/// earlier attempt stored under them into the new batch: each dead letter
/// is stored once, in queue order, and nothing is refused for its id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_retried_under_its_ids_is_stored_once() -> anyhow::Result<()> {
    let bed = TestBed::without_broker(|_| {}).await?;
    let store = Store::from_pool(bed.pool().await?);
    let rules = ExtractionRules::default();
    let session = uuid::Uuid::new_v4();
    let batch: Vec<_> = [b"a", b"b", b"c"]
        .iter()
        .map(|body| rules.extract(raw(&body[..], false)))
        .collect();
    let taken = store.take_capture_ids(batch.len()).await?;
    let ids = &taken.rows;
    assert!(ids.windows(2).all(|pair| pair[0] < pair[1]), "{ids:?}");
    // The first attempt committed "a" alone (as the one by one fallback
    // does), then failed.
    store
        .insert_captured_as(
            session,
            "q",
            &batch[..1],
            Some(TakenIds {
                batch: taken.batch,
                ids: &ids[..1],
                retry: false,
            }),
        )
        .await?;
    // The retry of the whole batch.
    let (batch_id, outcome) = store
        .insert_captured_as(
            session,
            "q",
            &batch,
            Some(TakenIds {
                batch: taken.batch,
                ids,
                retry: true,
            }),
        )
        .await?;
    // "a" is new to the capture all the same: not a redelivery.
    assert_eq!((outcome.inserted, outcome.already_stored), (3, 0));
    assert_eq!(batch_id, taken.batch, "every attempt records the one batch");
    let pool = bed.pool().await?;
    let stored: Vec<(i64, Vec<u8>, i64)> =
        sqlx::query_as("SELECT id, body, capture_batch FROM dead_letters ORDER BY id")
            .fetch_all(&pool)
            .await?;
    assert_eq!(
        stored,
        vec![
            (ids[0], b"a".to_vec(), batch_id),
            (ids[1], b"b".to_vec(), batch_id),
            (ids[2], b"c".to_vec(), batch_id),
        ],
        "each once, under its id, in the batch the retry recorded"
    );
    // Ingest keeps taking the sequence's next ids.
    store
        .insert_dead_letters(&[rules.extract(raw(b"ingested", false))])
        .await?;
    let last: i64 = sqlx::query_scalar("SELECT max(id) FROM dead_letters")
        .fetch_one(&pool)
        .await?;
    assert!(last > ids[2], "{last} after {}", ids[2]);
    pool.close().await;
    bed.finish().await
}

/// What a capture session left that stored two identical dead letters
/// `body` and died before acking: the batch holding both copies.
async fn crashed_with_copies(
    store: &Store,
    rules: &ExtractionRules,
    body: &[u8],
) -> anyhow::Result<i64> {
    let (batch, _) = store
        .insert_captured(
            uuid::Uuid::new_v4(),
            "q",
            &[
                rules.extract(raw(body, false)),
                rules.extract(raw(body, false)),
            ],
        )
        .await?;
    Ok(batch)
}

/// A batch whose first attempt committed but whose commit reply was lost
/// is retried: the stored copy its redelivery absorbed the first time
/// absorbs it again, rather than the redelivery being stored a second time;
/// another session's unacked copy stays where it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_batch_absorbs_its_redelivery_once() -> anyhow::Result<()> {
    let bed = TestBed::without_broker(|_| {}).await?;
    let store = Store::from_pool(bed.pool().await?);
    let rules = ExtractionRules::default();
    // Two copies of "x", each absorbs one redelivery.
    let crashed_batch = crashed_with_copies(&store, &rules, b"x").await?;
    // The next session gets one of them redelivered, between two new ones.
    let session = uuid::Uuid::new_v4();
    let batch = vec![
        rules.extract(raw(b"a", false)),
        rules.extract(raw(b"x", true)),
        rules.extract(raw(b"b", false)),
    ];
    let taken = store.take_capture_ids(batch.len()).await?;
    let attempt = |retry| TakenIds {
        batch: taken.batch,
        ids: &taken.rows,
        retry,
    };
    let (_, first) = store
        .insert_captured_as(session, "q", &batch, Some(attempt(false)))
        .await?;
    assert_eq!((first.inserted, first.already_stored), (2, 1));
    // Its commit reply was lost: the writer retries the whole batch.
    let (batch_id, retried) = store
        .insert_captured_as(session, "q", &batch, Some(attempt(true)))
        .await?;
    assert_eq!(
        (retried.inserted, retried.already_stored),
        (2, 1),
        "the retry counts what the first attempt did"
    );
    let pool = bed.pool().await?;
    let stored: Vec<(Vec<u8>, i64)> =
        sqlx::query_as("SELECT body, capture_batch FROM dead_letters ORDER BY body, capture_batch")
            .fetch_all(&pool)
            .await?;
    assert_eq!(
        stored,
        vec![
            (b"a".to_vec(), batch_id),
            (b"b".to_vec(), batch_id),
            (b"x".to_vec(), crashed_batch),
            (b"x".to_vec(), batch_id),
        ],
        "x stored twice (its two copies), not three times; the second copy \
         still waits for its own redelivery"
    );
    let batches: i64 =
        sqlx::query_scalar("SELECT count(*) FROM capture_batches WHERE session = $1")
            .bind(session)
            .fetch_one(&pool)
            .await?;
    assert_eq!(batches, 1, "both attempts recorded one capture batch");
    pool.close().await;
    bed.finish().await
}

/// The one by one fallback stores a batch's dead letters in single
/// transactions under the batch's ids (one capture batch). A redelivery
/// there absorbs a copy only from an earlier session, never a row another
/// dead letter of the batch stored or a copy another redelivery of it
/// absorbed; retried, each absorbs the copy it absorbed before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redeliveries_stored_one_by_one_absorb_one_copy_each() -> anyhow::Result<()> {
    let bed = TestBed::without_broker(|_| {}).await?;
    let store = Store::from_pool(bed.pool().await?);
    let rules = ExtractionRules::default();
    let crashed_batch = crashed_with_copies(&store, &rules, b"c").await?;
    // The next session's batch: "x" twice redelivered with no stored copy
    // (its first session died before it committed), then both "c".
    let session = uuid::Uuid::new_v4();
    let batch: Vec<_> = [b"x", b"x", b"c", b"c"]
        .iter()
        .map(|body| rules.extract(raw(&body[..], true)))
        .collect();
    let taken = store.take_capture_ids(batch.len()).await?;
    let one_by_one = |retry| {
        let (store, batch, taken) = (&store, &batch, &taken);
        async move {
            let mut total = (0, 0);
            for (position, dead_letter) in batch.iter().enumerate() {
                let (batch_id, outcome) = store
                    .insert_captured_as(
                        session,
                        "q",
                        std::slice::from_ref(dead_letter),
                        Some(TakenIds {
                            batch: taken.batch,
                            ids: &taken.rows[position..=position],
                            retry,
                        }),
                    )
                    .await?;
                assert_eq!(batch_id, taken.batch);
                total.0 += outcome.inserted;
                total.1 += outcome.already_stored;
            }
            anyhow::Ok(total)
        }
    };
    assert_eq!(
        one_by_one(false).await?,
        (2, 2),
        "both x stored, both c absorbed"
    );
    let pool = bed.pool().await?;
    let stored = || {
        let pool = pool.clone();
        async move {
            sqlx::query_as::<_, (Vec<u8>, i64)>(
                "SELECT body, capture_batch FROM dead_letters ORDER BY body, id",
            )
            .fetch_all(&pool)
            .await
        }
    };
    let expected = vec![
        (b"c".to_vec(), taken.batch),
        (b"c".to_vec(), taken.batch),
        (b"x".to_vec(), taken.batch),
        (b"x".to_vec(), taken.batch),
    ];
    assert_eq!(
        stored().await?,
        expected,
        "x twice, and each copy of c in the new batch (none left in {crashed_batch})"
    );
    // Retried (its last commit's reply lost): the same.
    assert_eq!(one_by_one(true).await?, (2, 2));
    assert_eq!(stored().await?, expected, "nothing more after the retry");
    pool.close().await;
    bed.finish().await
}

/// A retry absorbs the copy its first attempt absorbed even when that is
/// not the first copy, and waits for it while another transaction holds it
/// (a body repair, an archive) rather than taking the other copy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_absorbs_its_own_copy_even_while_it_is_locked() -> anyhow::Result<()> {
    let bed = TestBed::without_broker(|_| {}).await?;
    let store = Store::from_pool(bed.pool().await?);
    let rules = ExtractionRules::default();
    let crashed_batch = crashed_with_copies(&store, &rules, b"x").await?;
    let pool = bed.pool().await?;
    let copies: Vec<i64> = sqlx::query_scalar("SELECT id FROM dead_letters ORDER BY id")
        .fetch_all(&pool)
        .await?;
    let lock = |copy: i64| {
        let pool = pool.clone();
        async move {
            let mut holder = pool.begin().await?;
            sqlx::query("SELECT id FROM dead_letters WHERE id = $1 FOR UPDATE")
                .bind(copy)
                .execute(&mut *holder)
                .await?;
            anyhow::Ok(holder)
        }
    };
    let session = uuid::Uuid::new_v4();
    let batch = [rules.extract(raw(b"x", true))];
    let taken = store.take_capture_ids(1).await?;
    let attempt = |retry| TakenIds {
        batch: taken.batch,
        ids: &taken.rows,
        retry,
    };
    // The first copy is held while the first attempt runs: it absorbs the
    // second, and commits (its reply lost).
    let holder = lock(copies[0]).await?;
    let (_, first) = store
        .insert_captured_as(session, "q", &batch, Some(attempt(false)))
        .await?;
    assert_eq!((first.inserted, first.already_stored), (0, 1));
    holder.rollback().await?;
    // The retry runs while the second copy is held: it waits for it (a
    // backend of this database waits for a lock), and takes it once let go.
    let holder = lock(copies[1]).await?;
    let retry = store.insert_captured_as(session, "q", &batch, Some(attempt(true)));
    let release = async {
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let waiting: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity \
                 WHERE datname = current_database() AND wait_event_type = 'Lock'",
            )
            .fetch_one(&pool)
            .await?;
            if waiting > 0 {
                break;
            }
            anyhow::ensure!(
                tokio::time::Instant::now() < deadline,
                "the retry never waited for its own copy"
            );
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        holder.rollback().await?;
        anyhow::Ok(())
    };
    let (retried, released) = tokio::join!(retry, release);
    released?;
    let (batch_id, retried) = retried?;
    assert_eq!((retried.inserted, retried.already_stored), (0, 1));
    let stored: Vec<(i64, i64)> =
        sqlx::query_as("SELECT id, capture_batch FROM dead_letters ORDER BY id")
            .fetch_all(&pool)
            .await?;
    assert_eq!(
        stored,
        vec![(copies[0], crashed_batch), (copies[1], batch_id)],
        "the retry took its own copy again; the other still waits for its redelivery"
    );
    pool.close().await;
    bed.finish().await
}

/// Routing keys and capture notes are stored as the lists they are, for
/// any text: separators, braces, quotes, backslashes, white space, an empty
/// string, the word NULL, non-ASCII, and NUL (stored as U+FFFD); through
/// capture and through ingest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routing_keys_and_notes_are_stored_as_given() -> anyhow::Result<()> {
    let bed = TestBed::without_broker(|_| {}).await?;
    let store = Store::from_pool(bed.pool().await?);
    let rules = ExtractionRules::default();
    let odd: Vec<String> = [
        "orders.created",
        "a,b",
        "{x}",
        "say \"hi\"",
        "back\\slash\\",
        " padded ",
        "",
        "NULL",
        "null",
        "Grüße ✓",
        "nul\0here",
        "}\",{\"",
    ]
    .iter()
    .map(|key| (*key).to_owned())
    .collect();
    let with_lists = |body: &[u8], keys: Vec<String>| {
        let mut dead_letter = rules.extract(raw(body, false));
        dead_letter.death = Some(redrive_planner::dead_letters::death::Death {
            reason: "rejected".to_owned(),
            queue: "q".to_owned(),
            routing_keys: keys.clone(),
            count: 1,
            ..Default::default()
        });
        dead_letter.capture_notes = keys;
        dead_letter
    };
    let cases = [
        (b"captured".as_slice(), odd.clone()),
        (b"none", Vec::new()),
        (b"one empty", vec![String::new()]),
    ];
    let session = uuid::Uuid::new_v4();
    store
        .insert_captured(
            session,
            "q",
            &cases
                .iter()
                .map(|(body, keys)| with_lists(body, keys.clone()))
                .collect::<Vec<_>>(),
        )
        .await?;
    store
        .insert_dead_letters(&[with_lists(b"ingested", odd.clone())])
        .await?;
    let expected: Vec<String> = odd
        .iter()
        .map(|key| key.replace('\0', "\u{fffd}"))
        .collect();
    let pool = bed.pool().await?;
    for (body, keys) in cases
        .iter()
        .map(|(body, keys)| (*body, keys))
        .chain([(b"ingested".as_slice(), &odd)])
    {
        let (routing_keys, notes): (Vec<String>, Vec<String>) = sqlx::query_as(
            "SELECT death_routing_keys, capture_notes FROM dead_letters WHERE body = $1",
        )
        .bind(body)
        .fetch_one(&pool)
        .await?;
        let want: Vec<String> = if keys == &odd {
            expected.clone()
        } else {
            keys.clone()
        };
        assert_eq!(routing_keys, want, "{}", String::from_utf8_lossy(body));
        assert_eq!(notes, want, "{}", String::from_utf8_lossy(body));
    }
    pool.close().await;
    bed.finish().await
}

/// Whether `queue` exists on the local RabbitMQ (a passive declare).
async fn queue_exists(queue: &str) -> anyhow::Result<bool> {
    let checker = redrive_tests::Broker::connect().await?;
    let passive = checker
        .connection
        .create_channel()
        .await?
        .queue_declare(
            queue.into(),
            lapin::options::QueueDeclareOptions {
                passive: true,
                ..Default::default()
            },
            lapin::types::FieldTable::default(),
        )
        .await;
    Ok(passive.is_ok())
}

/// The test helpers clean up after a test that fails early (drop guards).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_test_that_fails_early_leaves_no_database_or_queue_behind() -> anyhow::Result<()> {
    use sqlx::{Postgres, migrate::MigrateDatabase};

    let db = TestDb::new();
    let url = db.url();
    Postgres::create_database(&url).await?;
    drop(db);
    assert!(!Postgres::database_exists(&url).await?, "database dropped");

    let broker = redrive_tests::Broker::connect().await?;
    let queue = unique("left-behind");
    broker
        .queue(&queue, lapin::types::FieldTable::default())
        .await?;
    drop(broker);
    assert!(!queue_exists(&queue).await?, "queue {queue} deleted");
    Ok(())
}

/// A test bed dropped mid-test (a failed test) leaves no database, queue or
/// Redis key behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_test_bed_dropped_mid_test_leaves_nothing_behind() -> anyhow::Result<()> {
    use sqlx::{Postgres, migrate::MigrateDatabase};

    let bed = TestBed::start(redrive_tests::Broker::connect().await?, |_| {}).await?;
    let url = bed.db.url();
    let queue = unique("left-behind");
    bed.broker()
        .queue(&queue, lapin::types::FieldTable::default())
        .await?;
    let key = format!("{}probe", bed.redis.prefix);
    let mut redis = redis::Client::open(redrive_tests::REDIS_URL)?
        .get_multiplexed_async_connection()
        .await?;
    let _: () = redis::cmd("SET")
        .arg(&key)
        .arg(1)
        .query_async(&mut redis)
        .await?;
    assert!(
        Postgres::database_exists(&url).await?,
        "the planner made it"
    );
    assert!(queue_exists(&queue).await?, "queue {queue} declared");

    drop(bed);
    assert!(!Postgres::database_exists(&url).await?, "database dropped");
    assert!(!queue_exists(&queue).await?, "queue {queue} deleted");
    let left: i64 = redis::cmd("EXISTS")
        .arg(&key)
        .query_async(&mut redis)
        .await?;
    assert_eq!(left, 0, "Redis key {key} deleted");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_import_tells_a_re_sent_line_from_another_message_sharing_its_id() -> anyhow::Result<()>
{
    init_logging();
    let mut bed = TestBed::without_broker(|_| {}).await?;
    let source = unique("import");
    let line = |message_id: &str, body: &[u8], destination: &str| {
        let mut line = item(&source, message_id, body, "rejected", "shop");
        line.original_destination = destination.to_owned();
        line.imported = true;
        line
    };
    let mut came_back = line("m-1", br#"{"order_id":"o-1"}"#, "orders.a");
    came_back.headers.get_or_insert_default().fields.insert(
        "redrive-plan-id".to_owned(),
        HeaderValue {
            value: Some(Value::LongString(
                b"55555555-5555-7555-8555-555555555555".to_vec(),
            )),
        },
    );
    let items = vec![
        line("m-1", br#"{"order_id":"o-1"}"#, "orders.a"),
        // The same line sent twice: a repeat.
        line("m-1", br#"{"order_id":"o-1"}"#, "orders.a"),
        // The fan-out copy that died in another queue: other work.
        line("m-1", br#"{"order_id":"o-1"}"#, "orders.b"),
        // Another message reusing the id: stored.
        line("m-1", br#"{"order_id":"o-2"}"#, "orders.a"),
        // A replay of m-1 that came back: a re-dead-letter.
        came_back,
    ];
    let first = ingest(&mut bed.client, items.clone()).await?;
    assert_eq!(
        (first.accepted, first.duplicates),
        (4, 1),
        "only the re-sent line is a repeat"
    );
    let again = ingest(&mut bed.client, items).await?;
    assert_eq!(
        (again.accepted, again.duplicates),
        (0, 5),
        "importing the file again stores nothing"
    );
    let seen: Vec<(String, String, String)> = sqlx::query_as(
        "SELECT destination, convert_from(body, 'UTF8'), coalesce(redrive_plan_id, '') \
         FROM dead_letters WHERE source = $1 ORDER BY 1, 2, 3",
    )
    .bind(&source)
    .fetch_all(&bed.pool().await?)
    .await?;
    assert_eq!(
        seen,
        vec![
            (
                "orders.a".into(),
                r#"{"order_id":"o-1"}"#.into(),
                String::new()
            ),
            (
                "orders.a".into(),
                r#"{"order_id":"o-1"}"#.into(),
                "55555555-5555-7555-8555-555555555555".into()
            ),
            (
                "orders.a".into(),
                r#"{"order_id":"o-2"}"#.into(),
                String::new()
            ),
            (
                "orders.b".into(),
                r#"{"order_id":"o-1"}"#.into(),
                String::new()
            ),
        ]
    );
    bed.finish().await
}

/// A repair replaces the body; it cannot mend a problem of the message
/// itself: a `user_id` the broker would refuse stays `invalid`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repair_does_not_make_a_message_with_a_foreign_user_id_replayable() -> anyhow::Result<()>
{
    init_logging();
    // The bed's planner has the local broker's URL.
    let mut bed = TestBed::without_broker(|_| {}).await?;
    let source = unique("svc");
    let mut foreign = item(&source, "m-1", br#"{"order_id":"o-1"}"#, "rejected", "shop");
    foreign.properties.as_mut().unwrap().user_id = Some("billing-svc".to_owned());
    let stored = ingest(&mut bed.client, vec![foreign]).await?;
    assert_eq!(stored.accepted, 1);
    let precheck = |client: &mut redrive_proto::v1::planner_client::PlannerClient<_>| {
        let mut client = client.clone();
        let source = source.clone();
        async move {
            let report = client
                .run_precheck(redrive_proto::v1::RunPrecheckRequest {
                    selector: Some(redrive_proto::v1::Selector {
                        sources: vec![source],
                        ..Default::default()
                    }),
                    options: None,
                })
                .await?
                .into_inner();
            let items = precheck_items(&mut client, &report.precheck_id, 0, 10)
                .await?
                .items;
            anyhow::Ok(items)
        }
    };
    let before = precheck(&mut bed.client).await?;
    assert_eq!(before.len(), 1);
    assert_eq!(before[0].verdict(), redrive_proto::v1::Verdict::Invalid);
    assert!(before[0].reason.contains("user_id"), "{}", before[0].reason);
    bed.client
        .repair_dead_letter(redrive_proto::v1::RepairDeadLetterRequest {
            dead_letter_id: before[0].dead_letter_id.clone(),
            new_body: br#"{"order_id":"o-1","fixed":true}"#.to_vec(),
            reason: "test".into(),
        })
        .await?;
    let after = precheck(&mut bed.client).await?;
    assert_eq!(
        after[0].verdict(),
        redrive_proto::v1::Verdict::Invalid,
        "{}",
        after[0].reason
    );
    assert!(after[0].reason.contains("user_id"), "{}", after[0].reason);
    bed.finish().await
}

/// One database is one broker's deployment: the record of what was delivered
/// names queues, not brokers, so a planner of another broker (or vhost) is
/// refused on a database that already belongs to one, naming both and never
/// a credential; the same broker starts again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_planner_of_another_broker_is_refused_on_a_database_that_belongs_to_one()
-> anyhow::Result<()> {
    init_logging();
    let db = TestDb::new();
    let config = |amqp_url: &str| {
        let mut config = redrive_planner::Config::for_database(db.url());
        config.amqp.url = amqp_url.to_owned();
        config
    };
    let first = config("amqp://guest:guest@127.0.0.1:5672/%2f");
    let mut planner = redrive_tests::PlannerHandle::start(first.clone()).await?;
    planner.halt().await?;

    // Another vhost on the same host: another broker's record.
    let other = config("amqp://guest:secret-pw@127.0.0.1:5672/orders-eu");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let shutdown = tokio_util::sync::CancellationToken::new();
    let refused = tokio::time::timeout(
        std::time::Duration::from_secs(30),
        redrive_planner::run(other.clone(), listener, shutdown),
    )
    .await?
    .expect_err("a planner of another broker is refused");
    let text = format!("{refused:#}");
    assert!(
        text.contains(
            "this database belongs to the deployment of broker \"127.0.0.1:5672/%2f\", and this planner's is \"127.0.0.1:5672/orders-eu\""
        ),
        "{text}"
    );
    assert!(
        text.contains("--broker-id \"127.0.0.1:5672/%2f\""),
        "{text}"
    );
    assert!(
        !text.contains("secret-pw") && !text.contains("guest"),
        "{text}"
    );

    // The same broker reached another way, named so: it starts.
    let mut renamed = other;
    renamed.broker_id = Some("127.0.0.1:5672/%2f".to_owned());
    let mut planner = redrive_tests::PlannerHandle::start(renamed).await?;
    planner.halt().await?;
    let mut planner = redrive_tests::PlannerHandle::start(first).await?;
    planner.halt().await?;
    db.drop_database().await;
    Ok(())
}
