//! The slice loop's unit tests.

use std::collections::VecDeque;

use redrive_proto::v1;

use super::{run_size, slice::take_run};
use crate::{bucket::Rate, outcomes::Work};

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
        item: v1::SliceItem {
            item_id: id.to_string(),
            routing_key: routing_key.to_owned(),
            ..Default::default()
        },
        attempt: 1,
        not_before: retry.then(tokio::time::Instant::now),
    }
}

fn ids(works: &[Work]) -> Vec<&str> {
    works
        .iter()
        .map(|work| work.item.item_id.as_str())
        .collect()
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
        ["1", "3", "6"],
        "at most the chunk, in order, no retry"
    );
    assert_eq!(ids(queue.make_contiguous()), ["2", "4", "5", "7", "8"]);
    let run = take_run(&mut queue.split_off(0), work(9, "c", false), 64);
    assert_eq!(ids(&run), ["9"], "nothing else for c");
}

#[tokio::test]
async fn a_run_of_one_destination_is_taken_from_the_front() {
    let mut queue: VecDeque<Work> = (2..=6).map(|id| work(id, "a", false)).collect();
    let run = take_run(&mut queue, work(1, "a", false), 4);
    assert_eq!(ids(&run), ["1", "2", "3", "4"]);
    assert_eq!(ids(queue.make_contiguous()), ["5", "6"]);
    let run = take_run(&mut queue, work(0, "a", false), 1);
    assert_eq!(ids(&run), ["0"], "a chunk of one takes only the first");
    assert_eq!(ids(queue.make_contiguous()), ["5", "6"]);
}
