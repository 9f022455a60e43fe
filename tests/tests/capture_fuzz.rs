//! Capture fuzz (issue 13): arbitrary AMQP header tables, published through
//! the real broker into a DLQ, are each captured exactly once, and the
//! planner keeps serving.
//!
//! `proptest` makes the tables: every field type RabbitMQ accepts, any
//! Unicode in names and texts, tables and arrays mixed up to 5 levels, and
//! chains 40 to 90 levels deep (past the 64-level limit). A table within the
//! limits is stored exactly as sent; one past them is a placeholder with the
//! reason `unreadable` and its bytes are moved to `<dlq>.unreadable`. No
//! message is lost or stored twice, and the DLQ ends empty.
//!
//! `REDRIVE_CAPTURE_FUZZ_MESSAGES` sets the number of messages (default 300).

use std::{collections::BTreeMap, time::Duration};

use lapin::{
    BasicProperties,
    types::{AMQPValue, DecimalValue, FieldArray, FieldTable, ShortString},
};
use proptest::{
    collection::{btree_map, vec},
    prelude::*,
    strategy::ValueTree,
    test_runner::TestRunner,
};
use redrive_planner::capture::unreadable_queue;
use redrive_proto::{amqp::table_from_amqp, v1};
use redrive_tests::{Broker, TestBed, init_logging, unique, wait_until};

mod support;
use support::captured_within;

fn name() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z-]{1,12}",
        "\\PC{1,20}",
        // Control characters and the longest short string.
        "(?s).{1,8}",
        Just("x".repeat(255)),
    ]
}

fn leaf() -> impl Strategy<Value = AMQPValue> {
    prop_oneof![
        any::<bool>().prop_map(AMQPValue::Boolean),
        any::<i8>().prop_map(AMQPValue::ShortShortInt),
        any::<i16>().prop_map(AMQPValue::ShortInt),
        any::<i32>().prop_map(AMQPValue::LongInt),
        any::<i64>().prop_map(AMQPValue::LongLongInt),
        any::<f32>()
            .prop_filter("NaN is not equal to itself", |f| !f.is_nan())
            .prop_map(AMQPValue::Float),
        any::<f64>()
            .prop_filter("NaN is not equal to itself", |f| !f.is_nan())
            .prop_map(AMQPValue::Double),
        (any::<u8>(), any::<u32>())
            .prop_map(|(scale, value)| AMQPValue::DecimalValue(DecimalValue { scale, value })),
        "(?s).{0,40}".prop_map(|s| AMQPValue::LongString(s.into())),
        vec(any::<u8>(), 0..64).prop_map(|b| AMQPValue::LongString(b.into())),
        any::<u64>().prop_map(AMQPValue::Timestamp),
        vec(any::<u8>(), 0..40).prop_map(|b| AMQPValue::ByteArray(b.into())),
        Just(AMQPValue::Void),
    ]
}

fn table_of(fields: BTreeMap<String, AMQPValue>) -> FieldTable {
    fields
        .into_iter()
        .map(|(key, value)| (ShortString::from(key), value))
        .collect::<BTreeMap<_, _>>()
        .into()
}

/// A chain of `depth` tables or arrays around `leaf`.
fn chain(depth: usize, arrays: bool, leaf: AMQPValue) -> AMQPValue {
    (0..depth).fold(leaf, |inner, _| {
        if arrays {
            AMQPValue::FieldArray(FieldArray::from(vec![inner]))
        } else {
            AMQPValue::FieldTable(table_of(BTreeMap::from([("n".to_owned(), inner)])))
        }
    })
}

fn headers() -> impl Strategy<Value = FieldTable> {
    let tree = leaf().prop_recursive(5, 48, 6, |inner| {
        prop_oneof![
            vec(inner.clone(), 0..6).prop_map(|values| AMQPValue::FieldArray(values.into())),
            btree_map(name(), inner, 0..6).prop_map(|m| AMQPValue::FieldTable(table_of(m))),
        ]
    });
    let deep = (40usize..90, any::<bool>(), leaf())
        .prop_map(|(depth, arrays, leaf)| chain(depth, arrays, leaf));
    btree_map(name(), prop_oneof![6 => tree, 1 => deep], 0..6).prop_map(table_of)
}

/// Deepest nesting of tables and arrays in `value` (a leaf is 0).
fn depth(value: &AMQPValue) -> usize {
    match value {
        AMQPValue::FieldTable(table) => 1 + table.inner().values().map(depth).max().unwrap_or(0),
        AMQPValue::FieldArray(array) => 1 + array.as_slice().iter().map(depth).max().unwrap_or(0),
        _ => 0,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn arbitrary_header_tables_are_captured_once_each() -> anyhow::Result<()> {
    init_logging();
    let messages: usize = std::env::var("REDRIVE_CAPTURE_FUZZ_MESSAGES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(300);
    let broker = Broker::connect().await?;
    let dlq = unique("fuzz.dlq");
    broker.queue(&dlq, FieldTable::default()).await?;
    let parking = unreadable_queue(&dlq);
    broker.track_queue(&parking);
    broker.track_exchange(&parking);

    let mut runner = TestRunner::default();
    let strategy = headers();
    let mut sent = BTreeMap::new();
    for n in 0..messages {
        let table = strategy
            .new_tree(&mut runner)
            .map_err(|error| anyhow::anyhow!("{error}"))?
            .current();
        let id = format!("fuzz-{n}");
        broker
            .publish(
                "",
                &dlq,
                format!(r#"{{"n":{n}}}"#).as_bytes(),
                BasicProperties::default()
                    .with_message_id(id.clone().into())
                    .with_headers(table.clone()),
            )
            .await
            .map_err(|error| anyhow::anyhow!("publishing {id} ({table:?}): {error}"))?;
        sent.insert(id, table);
    }

    // The planner starts capturing once every message is in the DLQ.
    let bed = TestBed::start(broker, |config| {
        config.capture_queues = vec![dlq.clone()];
    })
    .await?;
    let broker = bed.broker();
    let mut client = bed.client.clone();
    let started = std::time::Instant::now();
    captured_within(
        &mut client,
        &dlq,
        messages as u64,
        Duration::from_secs(30 + messages as u64 / 10),
    )
    .await?;
    eprintln!("captured in {:?}", started.elapsed());
    wait_until("the DLQ to empty", Duration::from_secs(30), || {
        let dlq = dlq.clone();
        async move { Ok(broker.ready_count(&dlq).await? == 0) }
    })
    .await?;

    // Every message once: readable ones exactly as sent, the others parked.
    let mut stored = Vec::new();
    let mut page_token = String::new();
    loop {
        let page = client
            .list_dead_letters(v1::ListDeadLettersRequest {
                selector: Some(v1::Selector {
                    sources: vec![dlq.clone()],
                    ..Default::default()
                }),
                page_size: 1000,
                page_token,
            })
            .await?
            .into_inner();
        stored.extend(page.dead_letters);
        if page.next_page_token.is_empty() {
            break;
        }
        page_token = page.next_page_token;
    }
    assert_eq!(stored.len(), messages, "one row per message");
    let mut seen = BTreeMap::new();
    let mut placeholders = 0;
    for dead_letter in &stored {
        if dead_letter.reason_class() == v1::ReasonClass::Unreadable {
            placeholders += 1;
            continue;
        }
        let id = dead_letter
            .message_id
            .clone()
            .expect("a readable message keeps its id");
        let table = sent.get(&id).expect("a message that was sent");
        assert_eq!(
            dead_letter.headers.clone().unwrap_or_default(),
            table_from_amqp(table),
            "{id}: headers as sent"
        );
        *seen.entry(id).or_insert(0) += 1;
    }
    assert!(seen.values().all(|count| *count == 1), "stored twice");
    let too_deep: Vec<&String> = sent
        .iter()
        .filter(|(_, table)| table.inner().values().map(depth).max().unwrap_or(0) + 1 > 64)
        .map(|(id, _)| id)
        .collect();
    // A table within the limit is never a placeholder.
    for (id, _) in sent.iter().filter(|(id, _)| !too_deep.contains(id)) {
        assert!(
            seen.contains_key(id),
            "{id} (within the limits) is readable"
        );
    }
    // ... and one past it never stored as if read.
    for id in &too_deep {
        assert!(
            !seen.contains_key(*id),
            "{id} (nested past 64) is a placeholder"
        );
    }
    assert_eq!(placeholders, too_deep.len());
    assert_eq!(
        u64::from(broker.ready_count(&parking).await?),
        placeholders as u64,
        "every placeholder's message is parked"
    );
    eprintln!(
        "{messages} messages: {} stored as sent, {placeholders} placeholders ({} nested past 64)",
        seen.len(),
        too_deep.len()
    );

    // Still serving.
    client
        .summarize_dead_letters(v1::SummarizeDeadLettersRequest::default())
        .await?;
    bed.finish().await
}
