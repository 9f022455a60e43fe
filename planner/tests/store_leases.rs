//! The store's lease rules against the real PostgreSQL, without a planner
//! around them: the fencing token, a backdated (expired) lease, the
//! write-ahead mark and what an expiry makes `uncertain`, and plan state
//! transitions executed by the one guarded `UPDATE`; the upgrade that
//! folded the replay ledger into the audit (migration 0021), and the one
//! that made the audit log's writer MAC cheaper (migration 0037).
//!
//! Each test has a database of its own (`redrive_store_<random>`), migrated,
//! with `tests/fixtures/one_slice.sql` loaded, and dropped when the test
//! ends, also when it fails. (Not `#[sqlx::test]`: it takes its server from
//! `DATABASE_URL`, which is also the planner's own `--database-url`
//! variable, so setting it for `cargo test` would point every `cargo run`
//! planner at the test server.)

use std::{path::Path, time::Duration};

use redrive_planner::{
    ids::{DeadLetterId, PlanId, SliceId},
    leases::outcomes,
    plan::state::Event,
    store::{
        StaleToken, Store,
        leases::{LeasedSlice, Outcome},
        plans::Moved,
    },
};
use redrive_test_support::TestDb;
use sqlx::{AssertSqlSafe, Executor, PgPool};
use uuid::Uuid;

const PLAN: PlanId = PlanId::new(Uuid::from_u128(0x0000_0000_0000_7000_8000_0000_0000_0002));
const TTL: Duration = Duration::from_secs(30);

/// A migrated database with the fixture, on a [`TestDb`] (dropped with it).
struct Db {
    pool: PgPool,
    store: Store,
    _db: TestDb,
}

impl Db {
    /// An empty database, not migrated.
    async fn empty() -> Self {
        let db = TestDb::new();
        db.create().await.expect("create the test database");
        let pool = db.pool_with(4).await.expect("connect");
        let store = Store::from_pool(pool.clone());
        Self {
            pool,
            store,
            _db: db,
        }
    }

    async fn new() -> Self {
        let db = Self::empty().await;
        db.store.migrate().await.expect("migrate");
        db.load_fixture().await;
        db
    }

    /// A database migrated by hand up to the migration file `upgrade`
    /// (every file sorting before it, in order), with the fixture: what
    /// an upgrade test starts from.
    async fn before(upgrade: &str) -> Self {
        let db = Self::empty().await;
        db.migrate_before(upgrade).await;
        db.load_fixture().await;
        db
    }

    /// Loads `fixtures/one_slice.sql`.
    async fn load_fixture(&self) {
        self.pool
            .execute(include_str!("fixtures/one_slice.sql"))
            .await
            .expect("load the fixture");
    }

    /// Runs every migration file whose name sorts before `until`, in order.
    async fn migrate_before(&self, until: &str) {
        self.migrate_where(|name| name < until).await;
    }

    /// Runs every migration file whose name sorts after `done`, in order:
    /// the rest of an upgrade test's schema, for code that reads it.
    async fn migrate_after(&self, done: &str) {
        self.migrate_where(|name| name > done).await;
    }

    /// Runs every migration file whose name `wanted` takes, in order.
    async fn migrate_where(&self, wanted: impl Fn(&str) -> bool) {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations");
        let mut files: Vec<_> = std::fs::read_dir(&dir)
            .expect("the migrations folder")
            .map(|entry| entry.expect("an entry").file_name().into_string().unwrap())
            .filter(|name| name.ends_with(".sql") && wanted(name))
            .collect();
        files.sort();
        for file in files {
            self.migrate_only(&file).await;
        }
    }

    /// Runs the migration file `file` alone.
    async fn migrate_only(&self, file: &str) {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("migrations")
            .join(file);
        let sql = std::fs::read_to_string(path).unwrap();
        sqlx::raw_sql(AssertSqlSafe(sql))
            .execute(&self.pool)
            .await
            .unwrap_or_else(|error| panic!("{file}: {error}"));
    }

    /// Leases the pending slice to `executor` (it must be there).
    async fn claim(&self, executor: &str, marks_publishing: bool) -> LeasedSlice {
        self.store
            .claim_slice(executor, "", TTL, marks_publishing)
            .await
            .unwrap()
            .expect("a pending slice")
    }

    /// Records the mark through `position` under `token` (it must be current).
    async fn mark(&self, slice_id: SliceId, token: i64, position: i64) {
        self.store
            .mark_publishing(slice_id, token, "", position)
            .await
            .unwrap()
            .expect("the current lease");
    }

    /// What the two fenced writes that leave the lease held, the heartbeat
    /// and the write-ahead mark (through position 3), answer `token` on
    /// `slice`.
    async fn beat_and_mark(&self, slice_id: SliceId, token: i64) -> [Result<(), StaleToken>; 2] {
        let beat = self
            .store
            .heartbeat(slice_id, token, "", TTL)
            .await
            .unwrap();
        let mark = self.store.mark_publishing(slice_id, token, "", 3).await;
        [beat.map(|_| ()), mark.unwrap()]
    }

    /// Makes the slice's lease expired a second ago.
    async fn backdate(&self, slice_id: SliceId) {
        sqlx::query(
            "UPDATE plan_slices SET lease_expires_at = now() - interval '1 second' WHERE id = $1",
        )
        .bind(slice_id)
        .execute(&self.pool)
        .await
        .expect("backdate");
    }

    /// Item states in position order.
    async fn states(&self) -> Vec<String> {
        sqlx::query_scalar("SELECT state FROM plan_items ORDER BY position")
            .fetch_all(&self.pool)
            .await
            .expect("states")
    }

    /// `uncertain` audit events, as (position, executor).
    async fn uncertain_events(&self) -> Vec<(i64, String)> {
        sqlx::query_as(
            "SELECT i.position, e.executor_id FROM audit_events e \
             JOIN plan_items i ON i.plan_id = e.plan_id AND i.dead_letter_id = e.dead_letter_id \
             WHERE e.action = 'uncertain' ORDER BY e.id",
        )
        .fetch_all(&self.pool)
        .await
        .expect("events")
    }
}

#[tokio::test]
async fn a_stale_fencing_token_is_refused_everywhere() {
    let db = Db::new().await;
    let first = db.claim("old", true).await;
    let token = first.fencing_token;
    assert!(token > 1 << 32, "a random token, not a counter: {token}");
    assert!(
        db.store
            .claim_slice("other", "", TTL, true)
            .await
            .unwrap()
            .is_none(),
        "a leased slice is not leased twice"
    );
    let slice = first.slice_id;
    let stale = StaleToken {
        slice_id: slice,
        token: 0,
    };
    // A token the slice does not hold now is refused by every write.
    assert_eq!(db.beat_and_mark(slice, 0).await, [Err(stale); 2]);
    assert_eq!(
        outcomes::end_lease(&db.store, slice, 0, "", true)
            .await
            .unwrap(),
        Err(stale)
    );
    let beat = db.store.heartbeat(slice, token, "", TTL).await.unwrap();
    assert!(beat.is_ok(), "the holder's own token: {beat:?}");

    // An expired lease is refused too, before and after the sweep ends it.
    db.backdate(slice).await;
    let expired = StaleToken {
        slice_id: slice,
        token,
    };
    assert_eq!(db.beat_and_mark(slice, token).await, [Err(expired); 2]);
    assert_eq!(db.store.expire_leases().await.unwrap(), vec![PLAN]);
    let second = db
        .store
        .claim_slice("new", "", TTL, true)
        .await
        .unwrap()
        .expect("the slice, leased again");
    assert_eq!(second.slice_id, slice);
    assert!(second.fencing_token > token, "tokens grow with each lease");
    assert_eq!(
        outcomes::end_lease(&db.store, slice, token, "", false)
            .await
            .unwrap(),
        Err(expired)
    );
    assert_eq!(
        db.beat_and_mark(slice, second.fencing_token).await,
        [Ok(()); 2]
    );
}

#[tokio::test]
async fn an_expiry_makes_only_marked_unreported_items_uncertain() {
    let db = Db::new().await;
    let lease = db.claim("old", true).await;
    // Marked through position 1; a lower mark later never moves it back.
    db.mark(lease.slice_id, lease.fencing_token, 1).await;
    db.mark(lease.slice_id, lease.fencing_token, 0).await;
    db.backdate(lease.slice_id).await;
    db.store.expire_leases().await.unwrap();
    assert_eq!(
        db.states().await,
        ["uncertain", "uncertain", "pending", "pending"]
    );
    assert_eq!(
        db.uncertain_events().await,
        [(0, "old".to_owned()), (1, "old".to_owned())]
    );

    // A holder that marked nothing adds nothing; one that does not mark at
    // all makes every unreported item uncertain (the rule before marks).
    let quiet = db.claim("quiet", true).await;
    db.backdate(quiet.slice_id).await;
    db.store.expire_leases().await.unwrap();
    assert_eq!(db.uncertain_events().await.len(), 2);
    let unmarked = db.claim("unmarked", false).await;
    // Its marks are ignored: it did not promise to mark before publishing.
    db.mark(unmarked.slice_id, unmarked.fencing_token, 2).await;
    db.backdate(unmarked.slice_id).await;
    db.store.expire_leases().await.unwrap();
    assert_eq!(db.states().await, ["uncertain"; 4]);
    let events = db.uncertain_events().await;
    assert_eq!(events.len(), 4, "{events:?}");
    assert_eq!(
        events[2..],
        [(2, "unmarked".to_owned()), (3, "unmarked".to_owned())]
    );
}

/// Issue 15: a report is accepted only under a token the slice was given:
/// its live lease's, or an earlier lease's (a late report of publishes that
/// happened). A guessed token (the old counter's `1`, or the live token's
/// neighbour) is refused, even for `sent`. What is recorded about an item
/// comes from the plan item, not from the report.
#[tokio::test]
async fn a_report_under_a_token_the_slice_never_had_is_refused() {
    let db = Db::new().await;
    let first = db.claim("old", true).await;
    let slice = first.slice_id;
    let dead_letters: Vec<(DeadLetterId, String)> =
        sqlx::query_as("SELECT dead_letter_id, message_key FROM plan_items ORDER BY position")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    let sent = |index: usize, key: &str| Outcome {
        dead_letter_id: dead_letters[index].0,
        message_key: key.to_owned(),
        action: "sent".to_owned(),
        reason: String::new(),
        executor_id: "x".to_owned(),
        attempt: 1,
        confirm_latency_us: 0,
        at: chrono::Utc::now(),
    };
    for guess in [1, first.fencing_token + 1, first.fencing_token - 1] {
        assert_eq!(
            outcomes::report_outcomes(&db.store, slice, guess, "", &[sent(0, &dead_letters[0].1)])
                .await
                .unwrap()
                .unwrap_err(),
            StaleToken {
                slice_id: slice,
                token: guess
            },
            "guessed token {guess}"
        );
    }
    // The live lease's report of a marked item records the plan item's
    // key, whatever the report names.
    db.mark(slice, first.fencing_token, 1).await;
    let reported = outcomes::report_outcomes(
        &db.store,
        slice,
        first.fencing_token,
        "",
        &[sent(0, "forged-key")],
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!((reported.accepted, reported.lease_lost), (1, false));
    // An earlier lease's late `sent` is refused once the sweep ended the
    // lease: the sweep made the marked, unreported item `uncertain`, and
    // the next lease publishes it again with the same message id.
    db.backdate(slice).await;
    db.store.expire_leases().await.unwrap();
    let second = db.claim("new", true).await;
    let late = outcomes::report_outcomes(
        &db.store,
        slice,
        first.fencing_token,
        "",
        &[sent(1, &dead_letters[1].1)],
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!((late.accepted, late.refused, late.lease_lost), (0, 1, true));
    assert!(second.fencing_token > first.fencing_token);
    let recorded: Vec<(String, String)> = sqlx::query_as(
        "SELECT message_key, action FROM audit_events WHERE action IN ('sent', 'uncertain') ORDER BY id",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        recorded,
        [
            (dead_letters[0].1.clone(), "sent".to_owned()),
            (dead_letters[1].1.clone(), "uncertain".to_owned())
        ]
    );
    // The replay record of a key is its `sent` or `uncertain` event: keyed by
    // the plan's key and the dead letter's destination, never the report's.
    let replayed: Vec<(String, Option<String>, String)> = sqlx::query_as(
        "SELECT e.message_key, e.destination, d.destination FROM audit_events e \
         JOIN dead_letters d ON d.id = e.dead_letter_id \
         WHERE e.action IN ('sent', 'uncertain') ORDER BY e.id",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert!(!replayed.is_empty());
    for (key, destination, dead_letter_destination) in &replayed {
        assert_ne!(key, "forged-key", "the ledger takes keys from the plan");
        assert_eq!(destination.as_ref(), Some(dead_letter_destination));
    }
}

/// Issue 28: a report is judged by its lease's write-ahead mark. A publish
/// outcome needs the item marked and the slice's current token with the
/// slice still leased under it (expired but not yet swept still counts); a
/// skip decision needs the current, unexpired lease; an item outside the
/// slice is refused. Every refusal is one `refused_outcomes` row with the
/// principal and the reason.
#[tokio::test]
async fn a_report_is_judged_by_its_leases_mark() {
    let db = Db::new().await;
    let lease = db
        .store
        .claim_slice("exec-1", "executor-a", TTL, true)
        .await
        .unwrap()
        .expect("the pending slice");
    let (slice, token) = (lease.slice_id, lease.fencing_token);
    let items: Vec<DeadLetterId> =
        sqlx::query_scalar("SELECT dead_letter_id FROM plan_items ORDER BY position")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    let outcome = |index: usize, action: &str| Outcome {
        dead_letter_id: items[index],
        message_key: String::new(),
        action: action.to_owned(),
        reason: String::new(),
        executor_id: "x".to_owned(),
        attempt: 1,
        confirm_latency_us: 0,
        at: chrono::Utc::now(),
    };
    let report = |token: i64, outcomes: Vec<Outcome>| {
        let store = db.store.clone();
        async move {
            outcomes::report_outcomes(&store, slice, token, "executor-a", &outcomes)
                .await
                .unwrap()
                .unwrap()
        }
    };
    let reasons = || async {
        sqlx::query_as::<_, (i64, String, String, String)>(
            "SELECT dead_letter_id, principal, action, reason FROM refused_outcomes ORDER BY id",
        )
        .fetch_all(&db.pool)
        .await
        .unwrap()
        .into_iter()
        .map(|(id, principal, action, reason)| {
            assert_eq!(principal, "executor-a");
            let index = items.iter().position(|item| item.get() == id);
            (index, action, reason)
        })
        .collect::<Vec<_>>()
    };
    // Nothing marked: every publish outcome is refused; a skip decision
    // needs no mark.
    let answer = report(
        token,
        vec![
            outcome(0, "sent"),
            outcome(1, "uncertain"),
            outcome(2, "failed"),
            outcome(3, "skipped_stale"),
        ],
    )
    .await;
    assert_eq!(
        (answer.accepted, answer.refused, answer.lease_lost),
        (1, 3, false)
    );
    // Marked through position 1: those two are accepted, position 2 not.
    db.store
        .mark_publishing(slice, token, "executor-a", 1)
        .await
        .unwrap()
        .unwrap();
    let answer = report(token, vec![outcome(0, "sent"), outcome(2, "unroutable")]).await;
    assert_eq!((answer.accepted, answer.refused), (1, 1));
    // Expired, not swept yet: a marked item's publish outcome still counts,
    // a skip decision does not.
    db.backdate(slice).await;
    let answer = report(token, vec![outcome(1, "sent"), outcome(2, "skipped_stale")]).await;
    assert_eq!(
        (answer.accepted, answer.refused, answer.lease_lost),
        (1, 1, true)
    );
    assert_eq!(
        db.states().await,
        ["sent", "sent", "pending", "skipped_stale"]
    );
    // Swept: the lease ended, its mark with it.
    db.store.expire_leases().await.unwrap();
    let answer = report(token, vec![outcome(1, "sent")]).await;
    assert_eq!((answer.accepted, answer.refused), (0, 1));
    // Leased again: the old token is stale.
    db.store
        .claim_slice("exec-2", "executor-b", TTL, true)
        .await
        .unwrap()
        .expect("the slice again");
    let answer = report(token, vec![outcome(2, "sent")]).await;
    assert_eq!((answer.accepted, answer.refused), (0, 1));
    // A dead letter of no slice item (an id that exists nowhere).
    let mut stranger = outcome(0, "sent");
    stranger.dead_letter_id = DeadLetterId::new(i64::MAX);
    let answer = report(token, vec![stranger]).await;
    assert_eq!((answer.accepted, answer.refused), (0, 1));
    let refused = reasons().await;
    let expected: Vec<(Option<usize>, &str, &str)> = vec![
        (Some(0), "sent", "unmarked"),
        (Some(1), "uncertain", "unmarked"),
        (Some(2), "failed", "unmarked"),
        (Some(2), "unroutable", "unmarked"),
        (Some(2), "skipped_stale", "lease_expired"),
        (Some(1), "sent", "lease_ended"),
        (Some(2), "sent", "stale_token"),
        (None, "sent", "not_in_slice"),
    ];
    assert_eq!(
        refused
            .iter()
            .map(|(index, action, reason)| (*index, action.as_str(), reason.as_str()))
            .collect::<Vec<_>>(),
        expected
    );
}

/// Issue 15: a lease is bound to the principal that claimed it. Another
/// principal holding the slice id and the token (both travel in the clear
/// without TLS) can neither renew, mark, report into, nor end it.
#[tokio::test]
async fn a_lease_refuses_every_write_from_another_principal() {
    let db = Db::new().await;
    let lease = db
        .store
        .claim_slice("exec-1", "executor-a", TTL, true)
        .await
        .unwrap()
        .expect("the pending slice");
    let (slice, token) = (lease.slice_id, lease.fencing_token);
    let stale = StaleToken {
        slice_id: slice,
        token,
    };
    let dead_letter: DeadLetterId =
        sqlx::query_scalar("SELECT dead_letter_id FROM plan_items ORDER BY position LIMIT 1")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    let sent = [Outcome {
        dead_letter_id: dead_letter,
        message_key: String::new(),
        action: "sent".to_owned(),
        reason: String::new(),
        executor_id: "named-in-the-report".to_owned(),
        attempt: 1,
        confirm_latency_us: 0,
        at: chrono::Utc::now(),
    }];
    for intruder in ["executor-b", ""] {
        let store = &db.store;
        assert_eq!(
            store.heartbeat(slice, token, intruder, TTL).await.unwrap(),
            Err(stale)
        );
        assert_eq!(
            store.lease_state(slice, token, intruder).await.unwrap(),
            Err(stale)
        );
        assert_eq!(
            store
                .mark_publishing(slice, token, intruder, 3)
                .await
                .unwrap(),
            Err(stale)
        );
        assert_eq!(
            outcomes::report_outcomes(store, slice, token, intruder, &sent)
                .await
                .unwrap(),
            Err(stale)
        );
        assert_eq!(
            outcomes::end_lease(store, slice, token, intruder, true)
                .await
                .unwrap(),
            Err(stale)
        );
    }
    // The intruder's reports are recorded as refused, with its principal.
    let refused: Vec<(String, String)> =
        sqlx::query_as("SELECT principal, reason FROM refused_outcomes ORDER BY id")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(
        refused,
        [
            ("executor-b".to_owned(), "unknown_lease".to_owned()),
            (String::new(), "unknown_lease".to_owned())
        ]
    );
    // The holder is untouched by all that.
    assert!(
        db.store
            .heartbeat(slice, token, "executor-a", TTL)
            .await
            .unwrap()
            .is_ok()
    );
    db.store
        .mark_publishing(slice, token, "executor-a", 0)
        .await
        .unwrap()
        .unwrap();
    let reported = outcomes::report_outcomes(&db.store, slice, token, "executor-a", &sent)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((reported.accepted, reported.lease_lost), (1, false));
    let leases: Vec<(i64, String, String)> = sqlx::query_as(
        "SELECT fencing_token, principal, executor_id FROM slice_leases WHERE slice_id = $1",
    )
    .bind(slice)
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        leases,
        [(token, "executor-a".to_owned(), "exec-1".to_owned())]
    );
    let recorded: Vec<String> = sqlx::query_scalar("SELECT executor_id FROM audit_events")
        .fetch_all(&db.pool)
        .await
        .unwrap();
    assert_eq!(
        recorded,
        ["exec-1"],
        "the lease's executor, not the report's"
    );
}

#[tokio::test]
async fn transitions_run_only_from_their_allowed_states() {
    let db = Db::new().await;
    let state = |moved: Moved| match moved {
        Moved::To(state) => ("to", state.name()),
        Moved::Refused(state) => ("refused", state.name()),
        Moved::NotFound => ("not found", ""),
    };
    let mut run = Vec::new();
    for event in [
        Event::Approve,
        Event::Pause,
        Event::Pause,
        Event::Promote,
        Event::Resume,
        Event::Complete,
        Event::Cancel,
        Event::Resume,
    ] {
        let moved = db
            .store
            .transition_plan(PLAN, event, "alice", "test")
            .await
            .unwrap();
        run.push(state(moved));
    }
    assert_eq!(
        run,
        [
            ("refused", "main"), // approve: only from awaiting_approval
            ("to", "paused"),    // pause from main
            ("refused", "paused"),
            ("refused", "paused"), // promote: only canary or observing
            ("to", "main"),        // resume into the state it was paused in
            ("refused", "main"),   // complete: its slice is not completed
            ("to", "cancelled"),
            ("refused", "cancelled"), // final
        ]
    );
    assert_eq!(
        state(
            db.store
                .transition_plan(PlanId::new(Uuid::nil()), Event::Pause, "a", "b")
                .await
                .unwrap()
        ),
        ("not found", "")
    );
    // Every move that happened is an operator action with actor and reason.
    let actions: i64 =
        sqlx::query_scalar("SELECT count(*) FROM operator_actions WHERE actor = 'alice'")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(actions, 3);
}

/// A released lease takes its mark with it: the next holder is judged by
/// its own marks, or, if it does not mark (an older executor leased by an
/// older planner replica), by the rule before marks.
#[tokio::test]
async fn a_release_clears_the_mark() {
    let db = Db::new().await;
    let first = db.claim("new", true).await;
    db.mark(first.slice_id, first.fencing_token, 1).await;
    outcomes::end_lease(&db.store, first.slice_id, first.fencing_token, "", true)
        .await
        .unwrap()
        .unwrap();
    let mark: Option<i64> =
        sqlx::query_scalar("SELECT published_through FROM plan_slices WHERE id = $1")
            .bind(first.slice_id)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(mark, None);
    // Leased without marks (as an older planner would: it leaves the column alone).
    sqlx::query(
        "UPDATE plan_slices SET state = 'leased', lease_owner = 'old', fencing_token = 2, \
         lease_expires_at = now() - interval '1 second' WHERE id = $1",
    )
    .bind(first.slice_id)
    .execute(&db.pool)
    .await
    .unwrap();
    db.store.expire_leases().await.unwrap();
    assert_eq!(db.states().await, ["uncertain"; 4], "every unreported item");
}

/// Issue 13: operator actions have no count limit (a plan may be paused and
/// resumed without end), so `GetPlan` shows the newest
/// `MAX_PLAN_ACTIONS_SHOWN` and counts the rest.
#[tokio::test]
async fn a_plan_shows_its_newest_operator_actions_and_counts_the_rest() {
    let db = Db::new().await;
    let shown = usize::try_from(redrive_proto::limits::MAX_PLAN_ACTIONS_SHOWN).unwrap();
    let actions = shown + 11;
    for n in 0..actions {
        let event = if n % 2 == 0 {
            Event::Pause
        } else {
            Event::Resume
        };
        let moved = db
            .store
            .transition_plan(PLAN, event, "alice", &format!("action {n}"))
            .await
            .unwrap();
        assert!(matches!(moved, Moved::To(_)), "{n}: {moved:?}");
    }
    let plan = db.store.get_plan(PLAN).await.unwrap().expect("the plan");
    assert_eq!(plan.actions.len(), shown);
    assert_eq!(plan.actions_omitted, 11);
    assert_eq!(plan.actions[0].reason, "action 11", "oldest shown first");
    assert_eq!(
        plan.actions.last().unwrap().reason,
        format!("action {}", actions - 1),
        "the newest is last"
    );
}

/// The migration that folds the replay ledger (`replayed_keys`) into the audit.
const FOLD: &str = "0021_replay_ledger_in_audit.sql";

/// Migration 0021 folds the replay ledger into the audit: a database upgraded
/// from 0020 still knows every key it had replayed, with its destination,
/// also when retention had deleted the dead letter. Migrated by hand to 0020
/// (each file's SQL in order), given ledger rows, then migrated with 0021.
#[tokio::test]
async fn the_ledger_folded_into_the_audit_keeps_every_replayed_key() {
    // One plan over four dead letters o-0 … o-3, all dead in `work`.
    let db = Db::before(FOLD).await;
    db.pool
        .execute(
            "INSERT INTO audit_events (plan_id, slice_id, dead_letter_id, message_key, action, wave, \
                 executor_id, attempt) \
             SELECT i.plan_id, i.slice_id, i.dead_letter_id, i.message_key, a.action, 'main', 'e', 1 \
             FROM plan_items i JOIN (VALUES (0, 'sent'), (1, 'sent'), (3, 'failed')) AS a(position, action) \
                 ON a.position = i.position; \
             INSERT INTO replayed_keys (message_key, destination, plan_id, dead_letter_id, certain) \
             SELECT i.message_key, 'work', i.plan_id, i.dead_letter_id, i.position < 2 \
             FROM plan_items i WHERE i.position < 3; \
             -- A ledger row of a plan that does not exist: written by hand.
             INSERT INTO replayed_keys (message_key, destination, plan_id, dead_letter_id) \
             VALUES ('o-9:order.paid', 'work', '00000000-0000-7000-8000-00000000ffff', 99); \
             -- Retention deleted o-1's dead letter; its ledger row outlived it.
             DELETE FROM dead_letters WHERE message_key = 'o-1:order.paid';",
        )
        .await
        .unwrap();

    db.migrate_only(FOLD).await;

    let events: Vec<(String, Option<String>, String)> = sqlx::query_as(
        "SELECT message_key, destination, action FROM audit_events ORDER BY message_key, action",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    let work = || Some("work".to_owned());
    assert_eq!(
        events,
        [
            ("o-0:order.paid".to_owned(), work(), "sent".to_owned()),
            // From the ledger: the dead letter is gone.
            ("o-1:order.paid".to_owned(), work(), "sent".to_owned()),
            // The ledger's possibly delivered key, which had no event.
            ("o-2:order.paid".to_owned(), work(), "uncertain".to_owned()),
            ("o-3:order.paid".to_owned(), work(), "failed".to_owned()),
        ]
    );
    let ledger: Option<String> = sqlx::query_scalar("SELECT to_regclass('replayed_keys')::text")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(ledger, None);
    // The ledger's index serves a key lookup; the primary key leads with the plan.
    let indexes: Vec<String> = sqlx::query_scalar(
        "SELECT indexdef FROM pg_indexes WHERE tablename = 'audit_events' ORDER BY indexname",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(indexes.len(), 3, "{indexes:?}");
    assert!(indexes[0].contains("(plan_id, at) WHERE"), "{indexes:?}");
    assert!(indexes[1].contains("(plan_id, id)"), "{indexes:?}");
    assert!(
        indexes[2].contains("(message_key, destination) WHERE"),
        "{indexes:?}"
    );
}

/// A report of thousands of forged events (a lease that never existed)
/// writes at most `MAX_REFUSAL_ROWS_PER_REPORT` rows of evidence; the
/// answer is the same refusal.
#[tokio::test]
async fn a_report_of_thousands_of_forged_events_writes_a_bounded_record() {
    let db = Db::new().await;
    let lease = db.claim("exec-1", true).await;
    let item: DeadLetterId =
        sqlx::query_scalar("SELECT dead_letter_id FROM plan_items ORDER BY position LIMIT 1")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    let forged: Vec<Outcome> = (0..5_000)
        .map(|_| Outcome {
            dead_letter_id: item,
            message_key: String::new(),
            action: "sent".to_owned(),
            reason: String::new(),
            executor_id: "x".to_owned(),
            attempt: 1,
            confirm_latency_us: 0,
            at: chrono::Utc::now(),
        })
        .collect();
    let wrong_token = lease.fencing_token + 1;
    assert!(
        outcomes::report_outcomes(
            &db.store,
            lease.slice_id,
            wrong_token,
            "executor-b",
            &forged
        )
        .await
        .unwrap()
        .is_err(),
        "refused"
    );
    let rows: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM refused_outcomes WHERE principal = 'executor-b' AND reason = 'unknown_lease'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        rows,
        i64::try_from(redrive_planner::leases::outcomes::MAX_REFUSAL_ROWS_PER_REPORT).unwrap()
    );
    let state: String =
        sqlx::query_scalar("SELECT state FROM plan_items WHERE dead_letter_id = $1")
            .bind(item)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(state, "pending", "nothing of the forged report was taken");
}

/// A reader of a plan's audit that moves a cursor (`id > after`, the live
/// feed and the export) misses no event when two reports of one plan
/// overlap: the second report's events get their ids only after the first
/// commits. Report A records its outcome and holds its transaction open;
/// report B records another and commits; a reader reads, A commits, the
/// reader reads on from its cursor. Without the audit lock B's event took
/// the higher id, committed first, moved the cursor past A's, and A's event
/// was never read. The reports are of two slices (two executors): reports of
/// one slice already wait on each other, on the slice's item counts.
#[tokio::test]
async fn a_reader_following_the_audit_misses_no_event_of_overlapping_reports() {
    let db = Db::new().await;
    // Positions 2 and 3 become a second slice.
    db.pool
        .execute(
            "WITH second AS (INSERT INTO plan_slices (plan_id, seq, wave) \
                SELECT plan_id, 1, 'main' FROM plan_slices RETURNING id) \
             UPDATE plan_items SET slice_id = (SELECT id FROM second) WHERE position >= 2",
        )
        .await
        .expect("split the slice");
    let leases = [
        db.claim("exec-1", true).await,
        db.claim("exec-2", true).await,
    ];
    let items: Vec<(DeadLetterId, SliceId, String)> = sqlx::query_as(
        "SELECT dead_letter_id, slice_id, message_key FROM plan_items ORDER BY position",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    let outcome = |index: usize| Outcome {
        dead_letter_id: items[index].0,
        message_key: items[index].2.clone(),
        action: "sent".to_owned(),
        reason: String::new(),
        executor_id: "exec-1".to_owned(),
        attempt: 1,
        confirm_latency_us: 0,
        at: chrono::Utc::now(),
    };
    let record = |index: usize| {
        let store = db.store.clone();
        let outcome = outcome(index);
        let slice = items[index].1;
        let lease = leases
            .iter()
            .find(|lease| lease.slice_id == slice)
            .expect("the item's slice is leased");
        let (slice, token) = (lease.slice_id, lease.fencing_token);
        async move {
            let mut tx = store.begin().await.unwrap();
            let lease = tx
                .report_lease(slice, token, "")
                .await
                .unwrap()
                .expect("the lease");
            let members = tx
                .slice_members(slice, &[outcome.dead_letter_id])
                .await
                .unwrap();
            let item = members[&outcome.dead_letter_id].clone();
            tx.record_outcomes(slice, &lease, &[&outcome], std::slice::from_ref(&item))
                .await
                .unwrap();
            tx
        }
    };
    let first = record(0).await;
    let second = tokio::spawn({
        let record = record(3);
        async move { record.await.commit().await.unwrap() }
    });
    // Until the second report has committed or waits on a lock.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid \
             WHERE a.datname = current_database() AND NOT l.granted",
        )
        .fetch_one(&db.pool)
        .await
        .unwrap();
        if waiting > 0 || second.is_finished() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the second report neither committed nor waited"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut seen = db.store.audit_events(PLAN, 0, 100).await.unwrap();
    let after = seen.last().map_or(0, |(id, _)| *id);
    first.commit().await.unwrap();
    second.await.unwrap();
    seen.extend(db.store.audit_events(PLAN, after, 100).await.unwrap());
    let mut keys: Vec<String> = seen.into_iter().map(|(_, e)| e.message_key).collect();
    keys.sort();
    let mut expected = [items[0].2.clone(), items[3].2.clone()];
    expected.sort();
    assert_eq!(keys, expected, "every event read exactly once");
}

/// A report's item update reads the reported items, not the whole slice,
/// when the statistics know only an earlier plan (docs/benchmarks.md, "The
/// report's item update"). `plan_items` is analyzed while it holds the
/// fixture's four items, then a plan of one 10,000-item slice is added:
/// PostgreSQL estimates that slice at one row. Joined to the reported
/// outcomes, the update then re-read every outcome for every item of the
/// slice: 10,000 × 1,000 rows a report, seconds each; by primary key and
/// array place it reads the 1,000 items. Every item ends `sent`, once.
#[tokio::test]
async fn reports_of_a_large_slice_stay_fast_when_statistics_know_only_an_earlier_plan() {
    const ITEMS: i64 = 10_000;
    const PER_REPORT: usize = 1_000;
    const REPORTS: usize = 5;
    let db = Db::new().await;
    for statement in [
        "ALTER TABLE plan_items SET (autovacuum_enabled = false)",
        "ALTER TABLE plan_slices SET (autovacuum_enabled = false)",
        "ANALYZE plan_items",
        "ANALYZE plan_slices",
        "UPDATE plan_slices SET state = 'completed'",
    ] {
        db.pool.execute(statement).await.expect(statement);
    }
    let large = "00000000-0000-7000-8000-000000000003";
    db.pool
        .execute(AssertSqlSafe(format!(
            "INSERT INTO dead_letters (source, origin, captured_at, capture_fingerprint, message_id, message_key, \
                body, body_size, body_sha256, body_oversized, body_compression, properties, headers, \
                reason_class, destination, died_at, first_died_at) \
             SELECT 'dlq', 'import', now(), sha256(('l-' || n)::bytea), 'l-' || n, 'l-' || n || ':order.paid', \
                '{{}}'::bytea, 2, '\\x00'::bytea, false, 'none', ''::bytea, ''::bytea, \
                'rejected', 'work', now(), now() \
             FROM generate_series(1, {ITEMS}) AS n; \
             INSERT INTO plans (id, precheck_id, precheck_digest, state, rate_per_second, rate_burst, \
                rate_rationale, destination_mode, slice_size, canary_fraction, observe_for_ms, total_items, \
                canary_items, created_by, approved_by, approved_at) \
             VALUES ('{large}', '00000000-0000-7000-8000-000000000001', 'digest', 'main', 100, 10, 'test', \
                'queue', {ITEMS}, 0.01, 0, {ITEMS}, 0, 'alice', 'bob', now()); \
             INSERT INTO plan_slices (plan_id, seq, wave) VALUES ('{large}', 0, 'main'); \
             INSERT INTO plan_items (plan_id, position, slice_id, dead_letter_id, message_key, exchange, routing_key) \
             SELECT '{large}', row_number() OVER (ORDER BY d.id) - 1, s.id, d.id, d.message_key, '', 'work' \
             FROM dead_letters d, plan_slices s WHERE s.plan_id = '{large}' AND d.message_id LIKE 'l-%'"
        )))
        .await
        .expect("the large plan");
    // Generic plans, as a connection's prepared statements get after five
    // runs: the statistics alone decide.
    db.pool
        .execute(AssertSqlSafe(format!(
            "ALTER DATABASE \"{}\" SET plan_cache_mode = force_generic_plan",
            db._db.name
        )))
        .await
        .expect("generic plans");
    let pool = db._db.pool().await.expect("connect");
    let store = Store::from_pool(pool.clone());
    let lease = db.claim("exec-1", true).await;
    db.mark(lease.slice_id, lease.fencing_token, ITEMS - 1)
        .await;
    let items: Vec<(DeadLetterId, String)> = sqlx::query_as(
        "SELECT dead_letter_id, message_key FROM plan_items WHERE slice_id = $1 ORDER BY position",
    )
    .bind(lease.slice_id)
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(items.len() as i64, ITEMS);
    let started = std::time::Instant::now();
    for chunk in items.chunks(PER_REPORT).take(REPORTS) {
        let outcomes: Vec<Outcome> = chunk
            .iter()
            .map(|(id, key)| Outcome {
                dead_letter_id: *id,
                message_key: key.clone(),
                action: "sent".to_owned(),
                reason: String::new(),
                executor_id: "exec-1".to_owned(),
                attempt: 1,
                confirm_latency_us: 0,
                at: chrono::Utc::now(),
            })
            .collect();
        let reported =
            outcomes::report_outcomes(&store, lease.slice_id, lease.fencing_token, "", &outcomes)
                .await
                .unwrap()
                .unwrap();
        assert_eq!(
            (reported.accepted, reported.refused),
            (PER_REPORT as u64, 0)
        );
    }
    let took = started.elapsed();
    let states: Vec<(String, i64)> = sqlx::query_as(
        "SELECT state, count(*) FROM plan_items WHERE slice_id = $1 GROUP BY state ORDER BY state",
    )
    .bind(lease.slice_id)
    .fetch_all(&db.pool)
    .await
    .unwrap();
    let reported = (REPORTS * PER_REPORT) as i64;
    assert_eq!(
        states,
        [
            ("pending".to_owned(), ITEMS - reported),
            ("sent".to_owned(), reported)
        ]
    );
    let events: i64 =
        sqlx::query_scalar("SELECT count(DISTINCT dead_letter_id) FROM audit_events WHERE slice_id = $1 AND action = 'sent'")
            .bind(lease.slice_id)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(events, reported, "one sent event per reported item");
    assert!(
        took < Duration::from_secs(6),
        "{REPORTS} reports of {PER_REPORT} items took {took:?}"
    );
}

const MAC_INLINE: &str = "0037_audit_mac_inline.sql";

/// Writes one audit event for item `position` of the fixture's plan, and
/// one operator action, on a connection carrying the audit MAC key's pads,
/// as the planner's are.
async fn write_keyed_event(pool: &PgPool, pads: &[u8; 128], position: i64) {
    let mut transaction = pool.begin().await.unwrap();
    transaction
        .execute(AssertSqlSafe(format!(
            "SET LOCAL redrive.audit_mac = '{}'",
            hex::encode(pads)
        )))
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO audit_events (plan_id, slice_id, dead_letter_id, message_key, action, wave, \
             executor_id, attempt, destination, message_id, reason, confirm_latency_us) \
         SELECT plan_id, slice_id, dead_letter_id, message_key, 'sent', 'main', 'e-\"1\"', 1, \
             'work', 'm-é\\n', 'quoted \"reason\"', 1234 \
         FROM plan_items WHERE position = $1",
    )
    .bind(position)
    .execute(&mut *transaction)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO operator_actions (plan_id, action, actor, reason) \
         SELECT plan_id, 'pause', 'ops \"on call\"', 'item ' || position FROM plan_items WHERE position = $1",
    )
    .bind(position)
    .execute(&mut *transaction)
    .await
    .unwrap();
    transaction.commit().await.unwrap();
}

/// What a sealing round under the `current` (and `previous`) key's pads
/// makes of every queued row, in order: (it has a MAC, the MAC matches;
/// `mac_ok` is `Some(true)` only for a match). The round is rolled back,
/// and waited for, so the rows stay queued for the next.
async fn judged_by_sealing(
    store: &Store,
    current: &[u8; 128],
    previous: Option<&[u8; 128]>,
) -> Vec<(bool, bool)> {
    let mut sealing = store
        .begin_sealing()
        .await
        .unwrap()
        .expect("the log's state row");
    let taken = sealing
        .take_pending(100, Some(current), previous.map(<[u8; 128]>::as_slice))
        .await
        .unwrap();
    sealing.rollback().await.unwrap();
    taken
        .iter()
        .map(|row| (row.has_mac, row.mac_ok == Some(true)))
        .collect()
}

/// Migration 0037 computes the writer's MAC with the audit functions
/// inlined and the pads read once per statement: a row queued by 0035's
/// trigger before the upgrade and one queued after are both judged by the
/// sequencer as matching (an upgrade mid-replay refuses nothing), a row
/// changed after it was queued still does not match, and neither MAC
/// function stays a per-row function call.
#[tokio::test]
async fn the_writers_mac_is_unchanged_by_the_upgrade_that_inlines_it() {
    let db = Db::before(MAC_INLINE).await;
    let pads = redrive_planner::audit::log::mac_pads("a test audit key");
    write_keyed_event(&db.pool, &pads, 0).await;

    db.migrate_only(MAC_INLINE).await;
    write_keyed_event(&db.pool, &pads, 1).await;
    write_keyed_event(&db.pool, &pads, 2).await;
    // Changed after it was queued: its MAC no longer matches.
    db.pool
        .execute("UPDATE audit_events SET action = 'failed' WHERE dead_letter_id = (SELECT dead_letter_id FROM plan_items WHERE position = 2)")
        .await
        .unwrap();
    // A session without the key queues no MAC.
    db.pool
        .execute(
            "INSERT INTO audit_events (plan_id, slice_id, dead_letter_id, message_key, action, wave, executor_id, attempt) \
             SELECT plan_id, slice_id, dead_letter_id, message_key, 'sent', 'main', 'e', 1 FROM plan_items WHERE position = 3",
        )
        .await
        .unwrap();

    // An event and an action before the upgrade, two after it, an event
    // changed after it was queued and its action, an event written without
    // the key.
    let expected = [
        (true, true),
        (true, true),
        (true, true),
        (true, true),
        (true, false),
        (true, true),
        (false, false),
    ];
    // The later migrations, which the sealing round's code reads (the
    // log's key, migration 0039), change no MAC.
    db.migrate_after(MAC_INLINE).await;
    assert_eq!(judged_by_sealing(&db.store, &pads, None).await, expected);
    // Under a key rotation the previous key's pads are tried too.
    let other = redrive_planner::audit::log::mac_pads("another key");
    assert_eq!(
        judged_by_sealing(&db.store, &other, Some(&pads)).await,
        expected
    );

    for (function, argument) in [
        ("redrive_audit_event_mac_input", "audit_events"),
        ("redrive_audit_action_mac_input", "operator_actions"),
    ] {
        let plan: Vec<String> = sqlx::query_scalar(AssertSqlSafe(format!(
            "EXPLAIN (VERBOSE, COSTS OFF) \
             SELECT redrive_hmac(decode(repeat('ab', 128), 'hex'), {function}(x)) FROM {argument} x"
        )))
        .fetch_all(&db.pool)
        .await
        .unwrap();
        let plan = plan.join("\n");
        assert!(
            !plan.contains(function) && !plan.contains("redrive_hmac"),
            "{function} and redrive_hmac are inlined: {plan}"
        );
    }
}
