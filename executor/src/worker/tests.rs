//! The slice loop's unit tests.

use std::collections::VecDeque;

use super::{
    run_size,
    slice::{requeue_unpublished, take_run},
};
use crate::{bucket::Rate, item::LeasedItem, outcomes::Work};

/// A new user's pass: with the planner down, each of the four slice loops
/// said "claim failed" every round, and a wrong broker password three lines
/// a loop a round. One line a round says each for all loops.
#[test]
fn a_shared_failure_is_said_once_a_round_for_all_loops() {
    use super::LoopFailures;
    use std::time::Duration;
    let failures = LoopFailures::default();
    let loops: Vec<_> = (0..4).map(|_| failures.clone()).collect();
    let start = tokio::time::Instant::now();
    let ms = Duration::from_millis;
    // Each loop retries after `delay` (ms), about together.
    let round = |at: u64, what: &'static str, reason: &str, delay: u64| {
        loops
            .iter()
            .filter(|failures| failures.to_say(what, reason, start + ms(at), ms(delay)))
            .count()
    };
    assert_eq!(round(0, "claim", "Unavailable", 6_000), 1);
    assert_eq!(round(5, "claim", "Unavailable", 8_000), 0);
    // Another kind of failure is its own.
    assert_eq!(round(6, "connect", "ACCESS_REFUSED", 200), 1);
    // The next round, when the retry said is due, although the delays
    // grew meanwhile (a review: comparing with the next delay kept rounds
    // silent while the backoff grew).
    assert_eq!(round(6_000, "claim", "Unavailable", 12_000), 1);
    assert_eq!(round(12_000, "claim", "Unavailable", 12_000), 0);
    assert_eq!(round(18_000, "claim", "Unavailable", 12_000), 1);
    // Another reason is said at once.
    assert_eq!(round(18_010, "claim", "PermissionDenied", 200), 1);
    // Loops whose attempts take long and whose retries come soon (a fresh
    // backoff after a reconnect mid-slice, 200 ms) say it at most once in
    // `LEAST_GAP` (a new user's pass: four lines in four seconds).
    for at in [18_300, 19_500, 20_700, 21_900] {
        assert_eq!(round(at, "claim", "PermissionDenied", 200), 0, "{at}");
    }
    assert_eq!(round(23_010, "claim", "PermissionDenied", 200), 1);
    // Back once no loop has met the failure for a whole retry gap (the
    // longest announced, 12 s): not while another loop still fails.
    let mended = |at: u64, what: &str| {
        loops
            .iter()
            .filter(|failures| failures.mended(what, start + ms(at)))
            .count()
    };
    assert_eq!(mended(24_000, "claim"), 0);
    assert_eq!(mended(35_010, "claim"), 1);
    assert_eq!(mended(35_020, "claim"), 0);
    // A failure after that is said at once, with the gap of a new one.
    assert_eq!(round(36_000, "claim", "PermissionDenied", 200), 1);
    assert_eq!(round(40_000, "claim", "PermissionDenied", 200), 0);
    assert_eq!(round(41_000, "claim", "PermissionDenied", 200), 1);
    // Loops failing with different texts at once do not make each
    // other's lines due (a review: one reason kept per failure did).
    assert_eq!(round(50_000, "token bucket", "refused", 500), 1);
    assert_eq!(round(50_001, "token bucket", "reset", 500), 1);
    assert_eq!(round(50_600, "token bucket", "refused", 500), 0);
    assert_eq!(round(50_601, "token bucket", "reset", 500), 0);
    // A partial outage: one loop's success while another failed within
    // the gap says nothing yet.
    assert_eq!(mended(53_000, "token bucket"), 0);
    assert_eq!(mended(55_601, "token bucket"), 1);
    // A lasting success (a connection): back when its attempt started
    // after the last failure met.
    assert!(!failures.mended_since("connect", start + ms(5)));
    assert!(failures.mended_since("connect", start + ms(7)));
    assert!(!loops[1].mended_since("connect", start + ms(8)));
    assert!(!failures.mended("replay keys", start + ms(90_000)));
}

#[test]
fn a_refused_login_is_told_from_an_outage() {
    let advice = super::connect_advice;
    // The texts lapin gives for RabbitMQ's refusals.
    let login = "cannot connect to the broker: 127.0.0.1:5672: protocol error: AMQP soft \
                 error: ACCESS-REFUSED: ACCESS_REFUSED - Login was refused using authentication \
                 mechanism PLAIN";
    assert!(advice(login).contains("check the user and password"));
    let vhost = "cannot connect to the broker: 127.0.0.1:5672: protocol error: AMQP hard error: \
                 NOT-ALLOWED: NOT_ALLOWED - vhost nowhere not found";
    assert!(advice(vhost).contains("virtual host"), "{}", advice(vhost));
    let permission = "broker closed the channel: 403 ACCESS_REFUSED - access to queue 'q' in \
                      vhost '/' refused for user 'u'";
    assert!(
        advice(permission).contains("permissions"),
        "{}",
        advice(permission)
    );
    let outage = "cannot connect to the broker: 127.0.0.1:5672: Connection refused (os error 111)";
    assert_eq!(advice(outage), "cannot connect to the broker");
}

#[test]
fn runs_take_about_a_twentieth_of_a_second_of_the_rate() {
    let rate = |per_second, burst| Rate::new(per_second, burst).unwrap();
    assert_eq!(run_size(rate(15.0, 5), 256), 1);
    assert_eq!(run_size(rate(0.5, 1), 256), 1);
    assert_eq!(run_size(rate(400.0, 40), 256), 20);
    assert_eq!(run_size(rate(200.0, 5), 256), 5);
    assert_eq!(run_size(rate(1e6, 1000), 256), 64);
    assert_eq!(run_size(rate(1e6, 1000), 8), 8);
}

fn work(id: u64, routing_key: &str, retry: bool) -> Work {
    Work {
        item: LeasedItem {
            position: id,
            routing_key: routing_key.to_owned(),
            ..Default::default()
        },
        attempt: 1,
        not_before: retry.then(tokio::time::Instant::now),
    }
}

fn ids(works: &[Work]) -> Vec<u64> {
    works.iter().map(Work::position).collect()
}

#[tokio::test]
async fn a_run_takes_one_destination_across_interleaved_items_and_keeps_the_rest_in_order() {
    // A fan-out's dead letters: destinations alternate, one is a retry.
    let mut queue: VecDeque<Work> = [
        work(2, "b", false),
        work(3, "a", false),
        work(4, "b", false),
        work(5, "a", true),
        work(6, "a", false),
        work(7, "a", false),
        work(8, "b", false),
    ]
    .into();
    let run = take_run(&mut queue, work(1, "a", false), 3);
    assert_eq!(
        ids(&run),
        [1, 3, 6],
        "at most the chunk, in order, no retry"
    );
    assert_eq!(ids(queue.make_contiguous()), [2, 4, 5, 7, 8]);
    let run = take_run(&mut queue.split_off(0), work(9, "c", false), 64);
    assert_eq!(ids(&run), [9], "nothing else for c");
}

#[tokio::test]
async fn a_run_of_one_destination_is_taken_from_the_front() {
    let mut queue: VecDeque<Work> = (2..=6).map(|id| work(id, "a", false)).collect();
    let run = take_run(&mut queue, work(1, "a", false), 4);
    assert_eq!(ids(&run), [1, 2, 3, 4]);
    assert_eq!(ids(queue.make_contiguous()), [5, 6]);
    let run = take_run(&mut queue, work(0, "a", false), 1);
    assert_eq!(ids(&run), [0], "a chunk of one takes only the first");
    assert_eq!(ids(queue.make_contiguous()), [5, 6]);
}

/// Messages never written go back before the later items still queued,
/// in order, also when several come back one after another; retries stay
/// at the end.
#[tokio::test]
async fn an_unpublished_item_goes_back_before_the_later_items() {
    let mut queue: VecDeque<Work> = [
        work(9, "a", false),
        work(10, "a", false),
        work(2, "a", true),
    ]
    .into();
    for id in [6, 7, 8] {
        requeue_unpublished(&mut queue, work(id, "a", false));
    }
    assert_eq!(ids(queue.make_contiguous()), [6, 7, 8, 9, 10, 2]);
    let mut empty = VecDeque::new();
    requeue_unpublished(&mut empty, work(3, "a", false));
    assert_eq!(ids(empty.make_contiguous()), [3]);
}

/// The pipeline, claim to report, against a fake planner and broker.
mod pipeline {
    use std::{collections::HashMap, sync::Arc, time::Duration};

    use redrive_proto::v1;
    use tokio::time::Instant;
    use tokio_util::sync::CancellationToken;

    use crate::{
        bucket::{Bucket, LocalBucket},
        fakes::{Answer, Answers, FakeBroker, FakeConnect, FakePlanner},
        health::Heartbeat,
        metrics::ExecutorMetrics,
        outcomes::TokenDebt,
        publisher::{Handoff, PublisherOptions},
        worker::{LoopFailures, Worker, WorkerSettings},
    };

    /// A slice loop publishing to `broker` and reporting to `planner`.
    fn worker(planner: &FakePlanner, broker: &Arc<FakeBroker>) -> Worker<FakeConnect> {
        Worker {
            settings: WorkerSettings {
                executor_id: "executor-test/0".to_owned(),
                amqp: redrive_proto::amqp_nodes::AmqpNodes::single("amqp://fake"),
                publisher: PublisherOptions::with_window(8),
                max_attempts: 2,
                claim_wait: Duration::from_secs(1),
                planner: "http://fake".to_owned(),
                redis: "in-process".to_owned(),
                failures: LoopFailures::default(),
                ca_given: false,
            },
            connect: FakeConnect(Arc::clone(broker)),
            publisher: None,
            retired: tokio::task::JoinSet::new(),
            coordinator: planner.client.clone(),
            bucket: Arc::new(Bucket::Local(LocalBucket::new())),
            replay_keys: None,
            debt: TokenDebt::default(),
            metrics: ExecutorMetrics::new(&opentelemetry::global::meter("test")),
            heartbeat: Heartbeat::new(Instant::now()),
        }
    }

    /// Item `position` of the plan: its body is its position.
    fn item(position: u64) -> v1::SliceItem {
        v1::SliceItem {
            item_id: position.to_string(),
            dead_letter: Some(v1::DeadLetter {
                id: format!("dl-{position}"),
                message_key: format!("key-{position}"),
                destination: "orders".to_owned(),
                ..Default::default()
            }),
            routing_key: "orders".to_owned(),
            body: position.to_string().into_bytes(),
            ..Default::default()
        }
    }

    fn slice(items: Vec<v1::SliceItem>, per_second: f64, burst: u32) -> v1::Slice {
        v1::Slice {
            slice_id: "slice-1".to_owned(),
            plan_id: "plan-1".to_owned(),
            fencing_token: 7,
            lease_ttl: Some(redrive_proto::time::duration(Duration::from_secs(30))),
            rate: Some(v1::Rate {
                per_second,
                burst,
                ..Default::default()
            }),
            items,
            ..Default::default()
        }
    }

    /// Each item's reported actions, in report order.
    fn actions(planner: &FakePlanner) -> HashMap<String, Vec<v1::AuditAction>> {
        let mut actions: HashMap<String, Vec<v1::AuditAction>> = HashMap::new();
        for event in &planner.calls().reported {
            actions
                .entry(event.dead_letter_id.clone())
                .or_default()
                .push(event.action());
        }
        actions
    }

    /// Items go out in order; what the filters decide (the planner's record
    /// of a replayed key, a deadline passed, the owning service's block) is
    /// reported without a publish; a nack is retried, then `failed`; a
    /// publish never confirmed is `uncertain` and published again; every
    /// item ends up in the report, and the slice is completed.
    #[tokio::test]
    async fn a_slice_is_published_in_order_and_every_item_reported() {
        let mut blocked = HashMap::new();
        blocked.insert("dl-4".to_owned(), "order shipped".to_owned());
        let planner = FakePlanner::start(Answers {
            blocked,
            ..Answers::default()
        });
        let broker = FakeBroker::new(8);
        broker.answer("5", &[Answer::Nack, Answer::Nack]);
        broker.answer("6", &[Answer::Never, Answer::Ack]);
        let mut items: Vec<_> = (1..=8).map(item).collect();
        items[1].key_replayed = true;
        items[2].stale_at = Some(redrive_proto::time::timestamp(
            chrono::Utc::now() - chrono::Duration::hours(1),
        ));
        items[3].state_check = true;
        let shutdown = CancellationToken::new();
        let mut worker = worker(&planner, &broker);

        tokio::time::timeout(
            Duration::from_secs(20),
            worker.replay_slice(slice(items, 1000.0, 100), &shutdown),
        )
        .await
        .expect("the slice ends");

        let published = broker.published();
        let first: Vec<&str> = published.iter().map(String::as_str).take(5).collect();
        assert_eq!(
            first,
            ["1", "5", "6", "7", "8"],
            "in order, filtered ones not"
        );
        let mut retried: Vec<&str> = published.iter().map(String::as_str).skip(5).collect();
        retried.sort_unstable();
        assert_eq!(retried, ["5", "6"], "the nacked and the unconfirmed again");
        use v1::AuditAction::{
            Failed, Sent, SkippedDuplicate, SkippedStale, SkippedState, Uncertain,
        };
        let actions = actions(&planner);
        let expected: HashMap<String, Vec<v1::AuditAction>> = [
            ("dl-1", vec![Sent]),
            ("dl-2", vec![SkippedDuplicate]),
            ("dl-3", vec![SkippedStale]),
            ("dl-4", vec![SkippedState]),
            ("dl-5", vec![Failed]),
            ("dl-6", vec![Uncertain, Sent]),
            ("dl-7", vec![Sent]),
            ("dl-8", vec![Sent]),
        ]
        .into_iter()
        .map(|(id, actions)| (id.to_owned(), actions))
        .collect();
        assert_eq!(actions, expected, "every item reported, once finally");
        let calls = planner.calls();
        assert_eq!(calls.rechecks, [vec!["dl-4".to_owned()]]);
        assert!(
            calls.marks.iter().any(|&mark| mark >= 8),
            "marked before publishing: {:?}",
            calls.marks
        );
        assert_eq!(calls.completed, [false], "completed, not released");
    }

    /// A new user's pass: an imported queue name of 300 bytes reached the
    /// executor, and lapin's short string panicked the publisher once a
    /// second while the plan never ended. Such an item fails, named; the
    /// others go out.
    #[tokio::test]
    async fn a_name_over_the_amqp_limit_fails_its_item_and_publishes_the_rest() {
        let planner = FakePlanner::start(Answers::default());
        let broker = FakeBroker::new(8);
        let mut items: Vec<_> = (1..=3).map(item).collect();
        items[1].routing_key = "q".repeat(300);
        items[2].exchange = "x".repeat(256);
        let shutdown = CancellationToken::new();
        let mut worker = worker(&planner, &broker);
        tokio::time::timeout(
            Duration::from_secs(20),
            worker.replay_slice(slice(items, 1000.0, 100), &shutdown),
        )
        .await
        .expect("the slice ends");
        assert_eq!(broker.published(), ["1"]);
        let calls = planner.calls();
        let failed: Vec<(&str, &str)> = calls
            .reported
            .iter()
            .filter(|event| event.action() == v1::AuditAction::Failed)
            .map(|event| (event.dead_letter_id.as_str(), event.reason.as_str()))
            .collect();
        assert_eq!(failed.len(), 2, "{failed:?}");
        assert!(
            failed[0].1.contains("routing key is 300 bytes"),
            "{failed:?}"
        );
        assert!(failed[1].1.contains("exchange is 256 bytes"), "{failed:?}");
    }

    /// A publish whose frames were never written (the connection lost
    /// first) is published again as the same attempt, with nothing
    /// audited: here twice, with two attempts allowed, and the item still
    /// ends `sent` on its first attempt. Slices of an ordered plan ask for
    /// the write before a publish returns; others only for the handoff.
    #[tokio::test]
    async fn an_unwritten_publish_is_published_again_as_the_same_attempt() {
        for ordered in [false, true] {
            let planner = FakePlanner::start(Answers::default());
            let broker = FakeBroker::new(8);
            broker.answer("2", &[Answer::Unwritten, Answer::Unwritten]);
            let items = (1..=4).map(item).collect();
            let shutdown = CancellationToken::new();
            let slice = v1::Slice {
                ordered,
                ..slice(items, 1000.0, 100)
            };
            tokio::time::timeout(
                Duration::from_secs(20),
                worker(&planner, &broker).replay_slice(slice, &shutdown),
            )
            .await
            .expect("the slice ends");
            let published = broker.published();
            assert_eq!(
                published.iter().filter(|body| *body == "2").count(),
                3,
                "published again until written: {published:?}"
            );
            let calls = planner.calls();
            let reported: Vec<(&str, v1::AuditAction, u32)> = calls
                .reported
                .iter()
                .map(|event| (event.dead_letter_id.as_str(), event.action(), event.attempt))
                .filter(|(id, _, _)| *id == "dl-2")
                .collect();
            assert_eq!(
                reported,
                [("dl-2", v1::AuditAction::Sent, 1)],
                "nothing audited for the unwritten publishes"
            );
            assert_eq!(calls.reported.len(), 4, "every item reported once");
            assert_eq!(calls.completed, [false], "completed");
            let expected = if ordered {
                Handoff::Written
            } else {
                Handoff::Queued
            };
            assert!(
                broker.handoffs().iter().all(|handoff| *handoff == expected),
                "ordered {ordered}: {:?}",
                broker.handoffs()
            );
        }
    }

    /// A slice with an item this executor cannot replay (an id that is no
    /// position, an item without its dead letter) is given back whole,
    /// before anything is published or reported.
    #[tokio::test]
    async fn a_slice_with_an_item_that_cannot_be_replayed_is_released_unpublished() {
        for spoil in [
            (|item: &mut v1::SliceItem| item.item_id = "three".to_owned()) as fn(&mut _),
            |item: &mut v1::SliceItem| item.dead_letter = None,
        ] {
            let planner = FakePlanner::start(Answers::default());
            let broker = FakeBroker::new(8);
            let mut items: Vec<_> = (1..=4).map(item).collect();
            spoil(&mut items[2]);
            let shutdown = CancellationToken::new();
            tokio::time::timeout(
                Duration::from_secs(20),
                worker(&planner, &broker).replay_slice(slice(items, 1000.0, 100), &shutdown),
            )
            .await
            .expect("the slice ends");
            assert!(broker.published().is_empty(), "nothing was published");
            let calls = planner.calls();
            assert!(calls.reported.is_empty(), "nothing was reported");
            assert_eq!(calls.completed, [true], "released, not completed");
        }
    }

    /// A slice is paced by its rate, on a paused clock: at 20 a second with
    /// a burst of 1, 41 items take 2 s of (virtual) time (the first goes at
    /// once), however fast the broker confirms, and every item is sent.
    #[tokio::test(start_paused = true)]
    async fn a_slice_is_paced_by_its_rate() {
        let planner = FakePlanner::start(Answers::default());
        let broker = FakeBroker::new(8);
        let items = (1..=41).map(item).collect();
        let shutdown = CancellationToken::new();
        let started = Instant::now();
        tokio::time::timeout(
            Duration::from_secs(60),
            worker(&planner, &broker).replay_slice(slice(items, 20.0, 1), &shutdown),
        )
        .await
        .expect("the slice ends");
        let took = started.elapsed();
        assert_eq!(broker.published().len(), 41, "each published once");
        assert!(
            took >= Duration::from_secs(2) && took < Duration::from_millis(2200),
            "41 items at 20/s took {took:?}"
        );
        let actions = actions(&planner);
        assert_eq!(actions.len(), 41);
        assert!(
            actions
                .values()
                .all(|actions| actions == &[v1::AuditAction::Sent]),
            "{actions:?}"
        );
    }

    /// The claim loop ends at shutdown, its publisher closed.
    #[tokio::test]
    async fn the_claim_loop_ends_at_shutdown() {
        let planner = FakePlanner::start(Answers::default());
        let broker = FakeBroker::new(8);
        let shutdown = CancellationToken::new();
        let running = tokio::spawn(worker(&planner, &broker).run(shutdown.clone()));
        tokio::time::sleep(Duration::from_millis(200)).await;
        shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(3), running)
            .await
            .expect("it ends within the close bound")
            .expect("the loop did not panic");
        assert!(broker.published().is_empty(), "nothing was claimed");
    }

    /// The planner refuses outcomes of a live lease (it never saw them
    /// marked): the slice stops publishing at once and is neither completed
    /// nor released, so that its lease expires and the planner judges the
    /// unreported items by the mark.
    #[tokio::test]
    async fn refused_outcomes_stop_the_slice_and_leave_its_lease_to_expire() {
        let planner = FakePlanner::start(Answers {
            refuse_reports: true,
            ..Answers::default()
        });
        let broker = FakeBroker::new(8);
        let items = (1..=40).map(item).collect();
        let shutdown = CancellationToken::new();
        let mut worker = worker(&planner, &broker);

        // 20 a second: two seconds of publishing, were it not stopped.
        tokio::time::timeout(
            Duration::from_secs(20),
            worker.replay_slice(slice(items, 20.0, 1), &shutdown),
        )
        .await
        .expect("the slice ends");

        let published = broker.published().len();
        assert!(
            (1..40).contains(&published),
            "{published} of 40 published: stopped after the first refused report"
        );
        let calls = planner.calls();
        assert!(!calls.reported.is_empty(), "a report was sent");
        assert!(
            calls.completed.is_empty(),
            "neither completed nor released: {:?}",
            calls.completed
        );
    }
}

/// The stall warning, on a paused clock.
mod stall {
    use std::{
        sync::{Arc, Mutex},
        time::Duration,
    };

    use tokio::time::Instant;

    use crate::worker::slice::Progress;

    /// A slice loop that moves nothing for 30 s is warned about, with what
    /// it waits for, then again 30 s later; progress puts the warning off.
    #[tokio::test(start_paused = true)]
    async fn a_slice_still_for_thirty_seconds_is_warned_about() {
        let progress = Progress::default();
        let warnings = Arc::new(Mutex::new(Vec::new()));
        let started = Instant::now();
        let watching = {
            let warnings = Arc::clone(&warnings);
            tokio::spawn(progress.clone().watch_with(move |stalled, waiting_for| {
                warnings
                    .lock()
                    .unwrap()
                    .push((started.elapsed(), stalled, waiting_for));
            }))
        };
        progress.waiting_for("publisher confirms");
        // Progress at 15 s: still from then on.
        tokio::time::sleep(Duration::from_secs(15)).await;
        progress.bump();
        tokio::time::sleep(Duration::from_secs(29)).await;
        assert!(warnings.lock().unwrap().is_empty(), "warned at 44 s");
        tokio::time::sleep(Duration::from_secs(37)).await;
        watching.abort();
        let warnings = warnings.lock().unwrap().clone();
        let secs = |duration: Duration| duration.as_secs();
        let seen: Vec<(u64, u64, &str)> = warnings
            .iter()
            .map(|&(at, stalled, waiting_for)| (secs(at), secs(stalled), waiting_for))
            .collect();
        // Looked at every 10 s: the bump is seen at 20 s, still for 30 s at
        // 50 s, and again at 80 s.
        assert_eq!(
            seen,
            [
                (50, 30, "publisher confirms"),
                (80, 30, "publisher confirms")
            ]
        );
    }
}
