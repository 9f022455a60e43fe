//! The precheck's reads of its selection against the real PostgreSQL,
//! without a planner around them: the candidate stream and the
//! near-duplicates read beside it, on another connection, in the snapshot
//! the stream exported. Each test has a database of its own
//! (`redrive_store_<random>`), migrated, dropped when the test ends, also
//! when it fails.

use futures::StreamExt;
use redrive_planner::{dead_letters::selector::Selector, store::Store};
use redrive_test_support::TestDb;
use sqlx::PgPool;

/// A migrated database (dropped with it).
async fn migrated() -> (TestDb, PgPool, Store) {
    let db = TestDb::new();
    db.create().await.expect("create the test database");
    // The stream's connection, the importer's, and one for the test.
    let pool = db.pool_with(4).await.expect("connect");
    let store = Store::from_pool(pool.clone());
    store.migrate().await.expect("migrate");
    (db, pool, store)
}

/// Stores a dead letter of source `dlq` bound for `work` with message id
/// `message_id` and body `body`; its id.
async fn dead_letter(pool: &PgPool, message_id: &str, body: &str) -> i64 {
    dead_letter_of(pool, "dlq", message_id, body).await
}

/// [`dead_letter`] of source `source`.
async fn dead_letter_of(pool: &PgPool, source: &str, message_id: &str, body: &str) -> i64 {
    sqlx::query_scalar(
        "INSERT INTO dead_letters (source, origin, captured_at, capture_fingerprint, message_id, \
             message_key, body, body_size, body_sha256, body_oversized, body_compression, \
             properties, headers, reason_class, destination, died_at, first_died_at) \
         VALUES ($3, 'import', now(), uuid_send(gen_random_uuid()), $1, $1 || ':' || $2, \
             convert_to($2, 'UTF8'), length($2), sha256(convert_to($2, 'UTF8')), false, 'none', \
             ''::bytea, ''::bytea, 'rejected', 'work', now(), now()) \
         RETURNING id",
    )
    .bind(message_id)
    .bind(body)
    .bind(source)
    .fetch_one(pool)
    .await
    .expect("insert a dead letter")
}

fn selection() -> Selector {
    Selector {
        sources: vec!["dlq".to_owned()],
        ..Selector::default()
    }
}

#[tokio::test]
async fn the_near_duplicates_read_the_selection_the_stream_read() {
    let (_db, pool, store) = migrated().await;
    // In the selection: one body under two message ids, and one message id
    // with one body.
    let a = dead_letter(&pool, "m-1", "{\"order\":1}").await;
    let b = dead_letter(&pool, "m-2", "{\"order\":1}").await;
    let c = dead_letter(&pool, "m-3", "{\"order\":3}").await;
    // Outside the selection, each of which would make m-1 a near-duplicate
    // (another body under its id): another source, and an archived one.
    dead_letter_of(&pool, "other", "m-1", "{\"order\":2}").await;
    let archived = dead_letter(&pool, "m-1", "{\"order\":4}").await;
    sqlx::query("UPDATE dead_letters SET archived_at = now() WHERE id = $1")
        .bind(archived)
        .execute(&pool)
        .await
        .expect("archive");

    let candidates =
        store.stream_candidates(&selection(), std::time::Duration::from_secs(3600), false);
    let snapshot = candidates
        .snapshot
        .await
        .expect("the stream exports its snapshot");
    // Committed after the stream's snapshot, before the near-duplicates
    // import it: one message id with two bodies, and a third copy of the
    // shared body. Neither is in the selection.
    let late = [
        dead_letter(&pool, "m-3", "{\"order\":3,\"changed\":true}").await,
        dead_letter(&pool, "m-9", "{\"order\":1}").await,
    ];
    let found = store
        .near_duplicates(snapshot, &selection())
        .await
        .expect("near-duplicates");
    let streamed: Vec<i64> = candidates
        .rows
        .map(|row| row.expect("a candidate").id.get())
        .collect()
        .await;

    assert_eq!(streamed, [a, b, c], "the stream reads its snapshot");
    assert_eq!(
        found.same_id.groups, 0,
        "m-3's second body came after the snapshot: {:?}",
        found.same_id
    );
    assert_eq!(found.same_body.groups, 1, "{:?}", found.same_body);
    assert_eq!(found.same_body.dead_letters, 2, "{:?}", found.same_body);
    let group = &found.same_body.examples[0];
    assert_eq!(
        group.ids.iter().map(|id| id.get()).collect::<Vec<_>>(),
        [a, b]
    );
    assert_eq!(group.message_ids, ["m-1", "m-2"]);

    // Read now, outside the snapshot, the late ones count.
    let candidates =
        store.stream_candidates(&selection(), std::time::Duration::from_secs(3600), false);
    let snapshot = candidates.snapshot.await.expect("the snapshot");
    let found = store
        .near_duplicates(snapshot, &selection())
        .await
        .expect("near-duplicates");
    assert_eq!(candidates.rows.count().await, 5);
    assert_eq!(found.same_id.groups, 1, "{:?}", found.same_id);
    assert_eq!(found.same_body.examples[0].dead_letters, 3);
    assert!(
        found.same_body.examples[0]
            .ids
            .iter()
            .any(|id| id.get() == late[1])
    );
    // A limit keeps the first dead letters: both reads stop at the same one.
    let first_one = Selector {
        limit: Some(1),
        ..selection()
    };
    let candidates =
        store.stream_candidates(&first_one, std::time::Duration::from_secs(3600), false);
    let snapshot = candidates.snapshot.await.expect("the snapshot");
    let found = store
        .near_duplicates(snapshot, &first_one)
        .await
        .expect("near-duplicates");
    assert_eq!(candidates.rows.count().await, 1);
    assert_eq!(found.same_body.groups, 0, "{:?}", found.same_body);
}

#[tokio::test]
async fn the_stream_ends_when_its_snapshot_is_not_wanted() {
    let (_db, pool, store) = migrated().await;
    dead_letter(&pool, "m-1", "{}").await;
    let candidates =
        store.stream_candidates(&selection(), std::time::Duration::from_secs(3600), false);
    drop(candidates.snapshot);
    let rows = tokio::time::timeout(std::time::Duration::from_secs(10), candidates.rows.count())
        .await
        .expect("the stream ends without anyone importing its snapshot");
    assert_eq!(rows, 1);
    // Its transaction ended too: the pool's connections are all back.
    tokio::time::timeout(std::time::Duration::from_secs(10), async {
        while pool.num_idle() < pool.size() as usize {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the stream's connection returns to the pool");
}
