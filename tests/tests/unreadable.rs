//! Capture survives deliveries the AMQP client cannot read, against the real
//! broker: a short string that is not UTF-8 (the `type` and `message_id`
//! properties, a header name, a name inside a nested table), and a header frame that the broker's `x-death` pushed over `frame_max`. The
//! messages around each are captured once; each unreadable one is a
//! placeholder (`unreadable`, `invalid` at precheck, a note naming the field)
//! and sits byte for byte in `<dlq>.unreadable`; the DLQ ends empty. On a
//! quorum DLQ with a delivery limit of 1, no message is dropped by the broker.
//! (An unknown field type is refused by RabbitMQ itself, 541 INTERNAL_ERROR at
//! publish, so it cannot reach a DLQ; the reader's unit tests cover it.)

use std::{collections::BTreeMap, time::Duration};

use lapin::{BasicProperties, types::FieldTable};
use redrive_planner::capture::{raw::RawConnection, unreadable_queue};
use redrive_proto::v1::{self, Verdict};
use redrive_test_support::amqp::{
    content_header,
    encode::{long_string, short_string as short, table as headers},
};
use redrive_tests::{
    AMQP_URL, Broker, DlqTopology, TcpProxy, TestBed, amqp_table, init_logging, precheck_items,
    stored_total, unique, wait_until,
};

mod support;
use support::*;

/// A planner capturing `dlq` in small batches (4) with a small prefetch (8),
/// so that sessions and isolation rounds alternate.
/// The planner settings here: capture `dlq` in small batches, key by the
/// body's `order_id`.
fn capturing(config: &mut redrive_planner::config::Config, dlq: &str) {
    config.capture_queues = vec![dlq.to_owned()];
    config.capture_batch_size = 4;
    config.capture_prefetch = 8;
    config.message_keys = vec!["json:/order_id".to_owned()];
}

/// The unreadable kinds, each as (what the note must name, content header);
/// `cc`: a queue named in the message_id kind's `CC` header.
fn unreadable_kinds(body_len: u64, cc: &str) -> Vec<(&'static str, Vec<u8>)> {
    let json = short(b"application/json");
    let cc_array = {
        let item = long_string(cc.as_bytes());
        let mut out = vec![b'A'];
        out.extend_from_slice(&u32::try_from(item.len()).unwrap().to_be_bytes());
        out.extend(item);
        out
    };
    vec![
        (
            "property type is not UTF-8",
            content_header(
                body_len,
                &[(15, json.clone()), (5, short(b"bestellung.ge\xe4ndert"))],
            ),
        ),
        (
            "property message_id is not UTF-8",
            content_header(
                body_len,
                &[
                    (15, json.clone()),
                    (13, headers(&[(b"CC", cc_array)])),
                    (7, short(b"best-\xfc-1")),
                ],
            ),
        ),
        (
            "headers field name is not UTF-8",
            content_header(
                body_len,
                &[
                    (15, json.clone()),
                    (13, headers(&[(b"gr\xf6\xdfe", long_string(b"L"))])),
                ],
            ),
        ),
        (
            "headers.meta field name is not UTF-8",
            content_header(
                body_len,
                &[
                    (15, json),
                    (10, short(b"corr-1")),
                    (
                        13,
                        headers(&[
                            (b"ok", long_string(b"1")),
                            (
                                b"meta",
                                [vec![b'F'], headers(&[(b"h\xe9", long_string(b"v"))])].concat(),
                            ),
                        ]),
                    ),
                ],
            ),
        ),
    ]
}

async fn good(broker: &Broker, dlq: &str, from: u32, count: u32) -> anyhow::Result<()> {
    for n in from..from + count {
        broker
            .publish(
                "",
                dlq,
                format!(r#"{{"order_id":"good-{n}"}}"#).as_bytes(),
                BasicProperties::default()
                    .with_content_type("application/json".into())
                    .with_message_id(format!("good-{n}").into()),
            )
            .await?;
    }
    Ok(())
}

/// A DLQ named `unique(prefix)` declared with `arguments`, and the name of
/// its parking queue (which the planner declares; tracked for clean-up).
async fn dlq_and_parking(
    broker: &Broker,
    prefix: &str,
    arguments: FieldTable,
) -> anyhow::Result<(String, String)> {
    let dlq = unique(prefix);
    broker.queue(&dlq, arguments).await?;
    let parking = unreadable_queue(&dlq);
    broker.track_queue(&parking);
    broker.track_exchange(&parking);
    Ok((dlq, parking))
}

/// The arguments of a quorum queue that drops a message returned more than
/// `limit` times.
fn quorum_with_delivery_limit(limit: i32) -> FieldTable {
    amqp_table(vec![
        ("x-queue-type", redrive_tests::amqp_text("quorum")),
        ("x-delivery-limit", lapin::types::AMQPValue::LongInt(limit)),
    ])
}

/// Into `dlq`: good messages `0..before`, then `body` under each of
/// `headers` published raw (each confirmed), then good messages
/// `before..before + after`.
async fn good_around_raw(
    broker: &Broker,
    dlq: &str,
    before: u32,
    headers: &[&[u8]],
    body: &[u8],
    after: u32,
) -> anyhow::Result<()> {
    good(broker, dlq, 0, before).await?;
    let mut publisher = RawConnection::connect(AMQP_URL).await?;
    for header in headers {
        assert!(publisher.publish("", dlq.as_bytes(), header, body).await?);
    }
    publisher.close().await;
    good(broker, dlq, before, after).await
}

/// Waits at most `timeout` until `queue` holds exactly `count` ready messages.
async fn wait_ready(
    broker: &Broker,
    what: &str,
    queue: &str,
    count: u32,
    timeout: Duration,
) -> anyhow::Result<()> {
    wait_until(what, timeout, || async move {
        Ok(broker.ready_count(queue).await? == count)
    })
    .await
}

/// Waits until `count` dead letters of `dlq` are stored and the DLQ is
/// empty, gives redeliveries 500 ms to show up (none may), and lists them.
/// A capture that stops short says how many it stored and how many are
/// still ready in the DLQ.
async fn settled_dead_letters(
    bed: &mut TestBed,
    dlq: &str,
    count: u64,
) -> anyhow::Result<Vec<v1::DeadLetter>> {
    if let Err(error) = captured(&mut bed.client, dlq, count).await {
        let stored = stored_total(&mut bed.client, dlq).await?;
        let ready = bed.broker().ready_count(dlq).await?;
        anyhow::bail!("{error}: stored {stored} of {count}; {ready} still ready in the DLQ");
    }
    wait_ready(
        bed.broker(),
        "the DLQ to empty",
        dlq,
        0,
        Duration::from_secs(30),
    )
    .await?;
    // Nothing more arrives later (no duplicates from redeliveries).
    tokio::time::sleep(Duration::from_millis(500)).await;
    all_dead_letters(&mut bed.client, dlq).await
}

/// A bed over `broker` capturing `dlq` must store `count` dead letters
/// (`what`, for the failure); a failure says how many it stored and how
/// many are still ready in the DLQ.
async fn captures_all(broker: Broker, dlq: &str, count: u64, what: &str) -> anyhow::Result<()> {
    let mut bed = TestBed::start(broker, |config| capturing(config, dlq)).await?;
    let outcome = captured(&mut bed.client, dlq, count).await;
    let stored = stored_total(&mut bed.client, dlq).await?;
    let ready = bed.broker().ready_count(dlq).await?;
    bed.finish().await?;
    outcome.map_err(|e| {
        anyhow::anyhow!("{e}: stored {stored} of {what}; {ready} still ready in the DLQ")
    })
}

async fn all_dead_letters(
    client: &mut v1::planner_client::PlannerClient<tonic::transport::Channel>,
    dlq: &str,
) -> anyhow::Result<Vec<v1::DeadLetter>> {
    let mut out = Vec::new();
    let mut page_token = String::new();
    loop {
        let page = client
            .list_dead_letters(v1::ListDeadLettersRequest {
                selector: Some(v1::Selector {
                    sources: vec![dlq.to_owned()],
                    ..Default::default()
                }),
                page_size: 1000,
                page_token,
            })
            .await
            .or_else(|status| match status.code() {
                // Nothing captured from it yet: an unknown source is refused.
                tonic::Code::NotFound => Ok(tonic::Response::new(Default::default())),
                _ => Err(status),
            })?
            .into_inner();
        out.extend(page.dead_letters);
        if page.next_page_token.is_empty() {
            return Ok(out);
        }
        page_token = page.next_page_token;
    }
}

/// Every good message captured exactly once, by message id.
fn assert_each_good_once(dead_letters: &[v1::DeadLetter], expected: u32) {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for dead_letter in dead_letters {
        if let Some(id) = &dead_letter.message_id
            && id.starts_with("good-")
        {
            *seen.entry(id.clone()).or_default() += 1;
        }
    }
    assert_eq!(seen.len(), expected as usize, "good messages captured");
    let twice: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "captured more than once: {twice:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unreadable_messages_are_moved_aside_and_everything_around_them_is_captured()
-> anyhow::Result<()> {
    init_logging();
    let broker = Broker::connect().await?;
    let topology = DlqTopology::declare(&broker).await?;
    let dlq = topology.dlq.clone();
    let parking = unreadable_queue(&dlq);
    // The planner declares it (a fanout exchange and a queue of that name).
    broker.track_queue(&parking);
    broker.track_exchange(&parking);
    // A healthy queue named in one message's CC header: moving that message
    // aside must not copy it there.
    let audit = unique("audit");
    broker.queue(&audit, FieldTable::default()).await?;

    // good ×10, then each unreadable kind followed by 10 more good ones.
    let body = br#"{"order_id":"poison"}"#;
    let kinds = unreadable_kinds(body.len() as u64, &audit);
    let mut publisher = RawConnection::connect(AMQP_URL).await?;
    let mut good_count = 0;
    good(&broker, &dlq, good_count, 10).await?;
    good_count += 10;
    for (problem, header) in &kinds {
        assert!(
            publisher
                .publish("", dlq.as_bytes(), header, body)
                .await
                .map_err(|e| anyhow::anyhow!("publishing {problem}: {e}"))?
        );
        good(&broker, &dlq, good_count, 10).await?;
        good_count += 10;
    }
    // A header frame within frame_max when published, over it once the
    // broker adds x-death: readable, only too large for lapin.
    let padding = "p".repeat(131_072 - 8 - 27 - 40);
    topology
        .reject(
            &broker,
            br#"{"order_id":"big-header"}"#,
            BasicProperties::default()
                .with_content_type("application/json".into())
                .with_message_id("big-header".into())
                .with_headers(amqp_table(vec![(
                    "pad",
                    redrive_tests::amqp_text(&padding),
                )])),
        )
        .await?;
    good(&broker, &dlq, good_count, 10).await?;
    good_count += 10;
    publisher.close().await;
    // Publishing it into the DLQ through the default exchange honoured its CC
    // header once already: that copy is the baseline.
    let audit_before = broker.ready_count(&audit).await?;
    assert_eq!(audit_before, 1);

    let planner_metrics = free_address().await?;
    let mut bed = TestBed::start(broker, |config| {
        capturing(config, &dlq);
        config.telemetry.metrics_listen = Some(planner_metrics);
    })
    .await?;
    let total = u64::from(good_count) + kinds.len() as u64 + 1;
    let dead_letters = settled_dead_letters(&mut bed, &dlq, total).await?;
    assert_eq!(dead_letters.len() as u64, total, "one row per message");
    assert_each_good_once(&dead_letters, good_count);

    // The big header is an ordinary dead letter, with its death read.
    let big = dead_letters
        .iter()
        .find(|d| d.message_id.as_deref() == Some("big-header"))
        .expect("the big-header message is captured");
    assert_eq!(big.reason_class(), v1::ReasonClass::Rejected);
    assert_eq!(big.destination, topology.work);

    // Each unreadable kind: a placeholder with a note naming the field.
    let unreadable: Vec<_> = dead_letters
        .iter()
        .filter(|d| d.reason_class() == v1::ReasonClass::Unreadable)
        .collect();
    assert_eq!(unreadable.len(), kinds.len());
    // Counted as quarantined (moved aside), by source.
    let text = scrape_metrics(planner_metrics).await?;
    assert_eq!(
        metric_total(
            &text,
            "redrive_planner_dead_letters_quarantined_total",
            &[("redrive_source", &dlq), ("redrive_quarantine", "parked")],
            &[]
        ),
        kinds.len() as f64,
        "each unreadable message counted once, as parked:\n{text}"
    );
    // Every dead letter stored is counted once as captured, also those the
    // one-at-a-time reader stored (it counted none).
    assert_eq!(
        metric_total(
            &text,
            "redrive_planner_dead_letters_captured_total",
            &[("redrive_source", &dlq)],
            &[]
        ),
        total as f64,
        "each dead letter counted once as captured:\n{text}"
    );
    // Stopping at an unreadable message is no capture failure: none is
    // counted, and none waits for the growing reconnect backoff (the five
    // kinds here used to count five failed sessions and wait 6 to 12 s).
    assert_eq!(
        metric_total(
            &text,
            "redrive_planner_capture_errors_total",
            &[("redrive_source", &dlq)],
            &[]
        ),
        0.0,
        "capture errors counted for unreadable messages:\n{text}"
    );
    for (problem, _) in &kinds {
        assert!(
            unreadable
                .iter()
                .any(|d| d.capture_notes.iter().any(|note| note.contains(problem))),
            "a note names {problem:?}: {:?}",
            unreadable
                .iter()
                .map(|d| &d.capture_notes)
                .collect::<Vec<_>>()
        );
    }
    let latin = unreadable
        .iter()
        .find(|d| {
            d.properties
                .as_ref()
                .and_then(|p| p.r#type.as_deref())
                .is_some()
        })
        .expect("the Latin-1 type placeholder");
    assert_eq!(
        latin.properties.as_ref().unwrap().r#type.as_deref(),
        Some("bestellung.ge\u{fffd}ndert"),
        "shown lossily"
    );
    assert!(
        latin
            .capture_notes
            .iter()
            .any(|note| note.contains(&parking)),
        "{:?}",
        latin.capture_notes
    );

    // The summary counts them.
    let summary = bed
        .client
        .summarize_dead_letters(v1::SummarizeDeadLettersRequest {
            selector: Some(v1::Selector {
                sources: vec![dlq.clone()],
                ..Default::default()
            }),
            group_by: vec![v1::SummaryDimension::Reason as i32],
        })
        .await?
        .into_inner();
    let unreadable_group = summary
        .groups
        .iter()
        .find(|g| g.key.get("reason").map(String::as_str) == Some("unreadable"))
        .expect("an unreadable group in the summary");
    assert_eq!(unreadable_group.count, kinds.len() as u64);

    // The precheck calls them invalid, naming why; the rest is replayable.
    let report = precheck(&mut bed.client, &dlq).await?;
    let items = precheck_items(
        &mut bed.client,
        &report.precheck_id,
        Verdict::Invalid as i32,
        1000,
    )
    .await?
    .items;
    // (The good ones were published straight into the DLQ: no x-death, so
    // they are invalid for want of a destination.)
    let unreadable_items: Vec<_> = items
        .iter()
        .filter(|item| item.reason.contains("cannot read it"))
        .collect();
    assert_eq!(unreadable_items.len(), kinds.len(), "{items:?}");
    assert!(
        unreadable_items
            .iter()
            .all(|item| item.reason.contains(&parking)),
        "{unreadable_items:?}"
    );

    // A repair replaces the body; the placeholder stays invalid.
    bed.client
        .repair_dead_letter(v1::RepairDeadLetterRequest {
            dead_letter_id: latin.id.clone(),
            new_body: br#"{"order_id":"poison","fixed":true}"#.to_vec(),
            reason: "test".into(),
        })
        .await?;
    let again = bed
        .client
        .run_precheck(v1::RunPrecheckRequest {
            selector: Some(v1::Selector {
                ids: vec![latin.id.clone()],
                ..Default::default()
            }),
            options: None,
        })
        .await?
        .into_inner();
    let repaired = precheck_items(&mut bed.client, &again.precheck_id, 0, 10)
        .await?
        .items;
    assert_eq!(repaired.len(), 1);
    assert_eq!(repaired[0].verdict(), Verdict::Invalid);
    assert!(
        repaired[0].reason.contains("cannot read it"),
        "{}",
        repaired[0].reason
    );

    assert_eq!(
        bed.broker().ready_count(&audit).await?,
        audit_before,
        "the CC header of a parked message copied it nowhere"
    );

    // The exact messages sit in the parking queue, in order.
    let mut reader = RawConnection::connect(AMQP_URL).await?;
    for (problem, header) in &kinds {
        let parked = reader
            .get(&parking)
            .await?
            .unwrap_or_else(|| panic!("{problem}: parked"));
        assert_eq!(&parked.header, header, "{problem}: header byte-identical");
        assert_eq!(parked.body, body, "{problem}: body byte-identical");
        reader.ack(parked.delivery_tag).await?;
    }
    assert!(reader.get(&parking).await?.is_none(), "nothing else parked");
    reader.close().await;

    bed.planner.halt().await?;
    // Nothing was held back unacked: with the planner gone the DLQ is empty.
    assert_eq!(bed.broker().ready_count(&dlq).await?, 0);
    bed.finish().await
}

/// A quorum DLQ with a delivery limit of 1 (the broker drops a message
/// returned a second time) holding good messages `0..100` around one poison
/// message, captured with `prefetch` (101: its failed session held all of
/// them) by a planner whose broker connection goes through `proxy` when
/// given, while `trickle` more good messages arrive, one every 200 ms.
/// Checks each good message is stored once, the poison one as a placeholder
/// and in its parking queue.
async fn poison_on_a_quorum_dlq_costs_nothing(
    proxy: Option<&TcpProxy>,
    trickle: u32,
    prefetch: u16,
) -> anyhow::Result<()> {
    let broker = Broker::connect().await?;
    let (dlq, parking) =
        dlq_and_parking(&broker, "quorum-dlq", quorum_with_delivery_limit(1)).await?;

    let body = br#"{"order_id":"poison"}"#;
    let (_, header) = unreadable_kinds(body.len() as u64, "nobody").remove(0);
    good_around_raw(&broker, &dlq, 5, &[&header], body, 95).await?;

    // A prefetch of all of them: the failed session held every message.
    // With the old behaviour each restart returned them all, and the second
    // return made the broker drop them (delivery limit 1, no dead-letter
    // exchange). No more: new ones go to the queue, not to the ended
    // session's consumer before the broker notices it ended.
    let amqp_url = proxy.map(|proxy| format!("amqp://guest:guest@{}/%2f", proxy.addr()));
    // Arriving from when the first session has taken every message, while
    // the broker has yet to return them.
    let arriving = {
        let publisher = Broker::connect().await?;
        let dlq = dlq.clone();
        tokio::spawn(async move {
            if trickle > 0 {
                wait_ready(
                    &publisher,
                    "a session to take them",
                    &dlq,
                    0,
                    Duration::from_secs(60),
                )
                .await?;
            }
            for n in 100..100 + trickle {
                good(&publisher, &dlq, n, 1).await?;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            anyhow::Ok(())
        })
    };
    let mut bed = TestBed::start(broker, |config| {
        capturing(config, &dlq);
        // At most the prefetch, as the planner requires.
        config.capture_batch_size = usize::from(prefetch).min(100);
        config.capture_prefetch = prefetch;
        if let Some(url) = amqp_url {
            config.amqp.url = url;
        }
    })
    .await?;
    arriving.await??;
    all_captured_and_parked(&mut bed, &dlq, &parking, 100 + trickle, 1).await?;
    bed.finish().await
}

/// Waits until `good` messages and `unreadable` placeholders of `dlq` are
/// stored and the DLQ is empty; checks each good one is stored once and
/// the unreadable ones sit in `parking`.
async fn all_captured_and_parked(
    bed: &mut TestBed,
    dlq: &str,
    parking: &str,
    good: u32,
    unreadable: u32,
) -> anyhow::Result<()> {
    let dead_letters = settled_dead_letters(bed, dlq, u64::from(good + unreadable)).await?;
    assert_eq!(dead_letters.len(), (good + unreadable) as usize);
    assert_each_good_once(&dead_letters, good);
    assert_eq!(
        dead_letters
            .iter()
            .filter(|d| d.reason_class() == v1::ReasonClass::Unreadable)
            .count(),
        unreadable as usize
    );
    assert_eq!(
        bed.broker().ready_count(parking).await?,
        unreadable,
        "the unreadable messages are parked"
    );
    Ok(())
}

/// A proxy to the local broker through which the broker notices a
/// client's close two seconds late (a loaded broker).
async fn late_noticing_proxy() -> anyhow::Result<TcpProxy> {
    let proxy = TcpProxy::start("127.0.0.1:5672".parse()?).await?;
    proxy.linger(Duration::from_secs(2));
    Ok(proxy)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_poison_message_on_a_quorum_dlq_with_a_delivery_limit_costs_no_other_message()
-> anyhow::Result<()> {
    init_logging();
    poison_on_a_quorum_dlq_costs_nothing(None, 0, 101).await
}

/// The broker returns what the stopped session held only once it notices
/// the connection closed, which a loaded broker does late (CI saw "stored 0
/// of 101; 0 still ready"): the round taking messages one at a time found
/// the queue empty, a session took them all again, and their second return
/// made the broker drop all 101. Here the broker notices every close two
/// seconds late.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_poison_message_on_a_quorum_dlq_costs_nothing_when_the_broker_notices_the_stop_late()
-> anyhow::Result<()> {
    init_logging();
    let proxy = late_noticing_proxy().await?;
    poison_on_a_quorum_dlq_costs_nothing(Some(&proxy), 0, 101).await
}

/// The same when the stopped session held only the first 50 (its
/// prefetch): the 51 behind them, still in the queue, come first and must
/// not end the round before the returns do.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_poison_message_noticed_late_behind_more_than_a_prefetch_costs_nothing()
-> anyhow::Result<()> {
    init_logging();
    let proxy = late_noticing_proxy().await?;
    poison_on_a_quorum_dlq_costs_nothing(Some(&proxy), 0, 50).await
}

/// The same while new dead letters keep arriving: the round takes them
/// first, and an empty queue between two of them is not taken for the
/// returns having come (a session would take the poison message again).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_poison_message_noticed_late_on_a_busy_quorum_dlq_costs_nothing() -> anyhow::Result<()> {
    init_logging();
    let proxy = late_noticing_proxy().await?;
    poison_on_a_quorum_dlq_costs_nothing(Some(&proxy), 20, 101).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unreadable_message_that_cannot_be_moved_aside_stays_in_the_dlq_and_blocks_nothing()
-> anyhow::Result<()> {
    init_logging();
    let broker = Broker::connect().await?;
    let (dlq, _parking) = dlq_and_parking(&broker, "dlq", FieldTable::default()).await?;

    // Unreadable (Latin-1 type) and with an expiration: moved to the parking
    // queue it would expire there, so it must stay where it is.
    let body = br#"{"order_id":"poison"}"#;
    let header = content_header(
        body.len() as u64,
        &[
            (15, short(b"application/json")),
            (8, short(b"3600000")),
            (5, short(b"bestellung.ge\xe4ndert")),
        ],
    );
    good_around_raw(&broker, &dlq, 10, &[&header], body, 10).await?;

    let mut bed = TestBed::start(broker, |config| capturing(config, &dlq)).await?;
    captured(&mut bed.client, &dlq, 21).await?;
    wait_ready(
        bed.broker(),
        "the good messages to be acked",
        &dlq,
        0,
        Duration::from_secs(30),
    )
    .await?;
    let dead_letters = all_dead_letters(&mut bed.client, &dlq).await?;
    assert_eq!(dead_letters.len(), 21);
    assert_each_good_once(&dead_letters, 20);
    let placeholder = dead_letters
        .iter()
        .find(|d| d.reason_class() == v1::ReasonClass::Unreadable)
        .expect("a placeholder");
    assert!(
        placeholder
            .capture_notes
            .iter()
            .any(|n| n.contains("expiration") && n.contains("stays in this DLQ")),
        "{:?}",
        placeholder.capture_notes
    );
    bed.planner.halt().await?;
    // Held unacked while the planner ran, back in the DLQ once it stopped.
    wait_ready(
        bed.broker(),
        "the held message back in the DLQ",
        &dlq,
        1,
        Duration::from_secs(10),
    )
    .await?;

    // A restart meets it again: no second row, the queue keeps flowing.
    bed.restart_planner(|config| capturing(config, &dlq))
        .await?;
    good(bed.broker(), &dlq, 20, 5).await?;
    captured(&mut bed.client, &dlq, 26).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let dead_letters = all_dead_letters(&mut bed.client, &dlq).await?;
    assert_eq!(
        dead_letters.len(),
        26,
        "the held message was not stored twice"
    );
    assert_each_good_once(&dead_letters, 25);
    bed.planner.halt().await?;
    wait_ready(
        bed.broker(),
        "the held message back again",
        &dlq,
        1,
        Duration::from_secs(10),
    )
    .await?;
    bed.finish().await
}

/// Headers nested thousands of levels deep overflow the stack of lapin's
/// recursive frame parser and abort the process (without the capture guard
/// this test binary dies). The guard stops the delivery before lapin reads
/// it; the fallback reader stores a placeholder and moves it aside.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn headers_nested_thousands_deep_crash_nothing_and_are_moved_aside() -> anyhow::Result<()> {
    init_logging();
    let broker = Broker::connect().await?;
    let (dlq, parking) = dlq_and_parking(&broker, "dlq", FieldTable::default()).await?;

    let mut value = long_string(b"leaf");
    for _ in 0..3000 {
        value = [vec![b'F'], headers(&[(b"k", value)])].concat();
    }
    let body = br#"{"order_id":"deep"}"#;
    let header = content_header(
        body.len() as u64,
        &[
            (15, short(b"application/json")),
            (13, headers(&[(b"deep", value)])),
            (7, short(b"deep-1")),
        ],
    );
    good_around_raw(&broker, &dlq, 10, &[&header], body, 10).await?;

    let mut bed = TestBed::start(broker, |config| capturing(config, &dlq)).await?;
    captured(&mut bed.client, &dlq, 21).await?;
    let dead_letters = all_dead_letters(&mut bed.client, &dlq).await?;
    assert_eq!(dead_letters.len(), 21);
    assert_each_good_once(&dead_letters, 20);
    let deep = dead_letters
        .iter()
        .find(|d| d.message_id.as_deref() == Some("deep-1"))
        .expect("the deep one is recorded");
    assert_eq!(deep.reason_class(), v1::ReasonClass::Unreadable);
    assert!(
        deep.capture_notes
            .iter()
            .any(|n| n.contains("nests deeper than 64")),
        "{:?}",
        deep.capture_notes
    );
    wait_ready(
        bed.broker(),
        "the parked copy",
        &parking,
        1,
        Duration::from_secs(10),
    )
    .await?;
    bed.planner.halt().await?;
    assert_eq!(bed.broker().ready_count(&dlq).await?, 0);
    bed.finish().await
}

/// A Latin-1 `type` plus an `expiration`: unreadable by lapin, and (per the
/// README) it cannot be moved aside, so the planner holds it unacked.
fn unparkable_header(body_len: u64, n: u32) -> Vec<u8> {
    content_header(
        body_len,
        &[
            (15, short(b"application/json")),
            (8, short(b"3600000")),
            (7, short(format!("poison-{n}").as_bytes())),
            (5, short(b"bestellung.ge\xe4ndert")),
        ],
    )
}

/// A producer that sets a per-message `expiration` (or its own validated
/// `user_id`) and a Latin-1 `type` makes every one of its messages
/// unparkable. After 16 of them (`MAX_HELD`) the 17th makes `isolate` fail
/// before it even stores the placeholder, forever: the 17th is never
/// recorded and nothing behind it is captured.
///
/// Expected: all good messages captured, 17 placeholders.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn seventeen_unparkable_poison_messages_do_not_stop_the_queue() -> anyhow::Result<()> {
    init_logging();
    let broker = Broker::connect().await?;
    let (dlq, _parking) = dlq_and_parking(&broker, "dlq", FieldTable::default()).await?;

    let body = br#"{"order_id":"poison"}"#;
    let headers: Vec<Vec<u8>> = (0..17)
        .map(|n| unparkable_header(body.len() as u64, n))
        .collect();
    let headers: Vec<&[u8]> = headers.iter().map(Vec::as_slice).collect();
    good_around_raw(&broker, &dlq, 5, &headers, body, 5).await?;

    captures_all(broker, &dlq, 27, "27 dead letters (10 good + 17 poison)").await
}

/// Cuts every connection of the planner (through `proxy`) `count` times and
/// requires the unparkable message of `dlq` held again after each blip:
/// not ready in the DLQ (unacked by the planner's capture) within 30 s.
/// The cut comes at varied times after the hold (at once: while the round
/// that held it ends or the next session connects; later: while that
/// session consumes). Afterwards the message must stay held, not go round
/// again.
async fn blips_hold_it_again(
    bed: &TestBed,
    proxy: &TcpProxy,
    dlq: &str,
    count: u32,
) -> anyhow::Result<()> {
    wait_ready(
        bed.broker(),
        "the poison message held before any blip",
        dlq,
        0,
        Duration::from_secs(30),
    )
    .await?;
    for blip in 1..=count {
        tokio::time::sleep(Duration::from_millis([0, 0, 300, 1500][blip as usize % 4])).await;
        proxy.cut();
        tokio::time::sleep(Duration::from_millis(500)).await;
        proxy.restore();
        tokio::time::sleep(Duration::from_millis(500)).await;
        let started = tokio::time::Instant::now();
        wait_ready(
            bed.broker(),
            &format!("the poison message held again after connection blip {blip} of {count}"),
            dlq,
            0,
            Duration::from_secs(30),
        )
        .await?;
        tracing::info!(
            blip,
            held_again_after_ms = started.elapsed().as_millis() as u64,
            "held again"
        );
    }
    // Held for good, not returned and taken again in a loop.
    for _ in 0..20 {
        assert_eq!(
            bed.broker().ready_count(dlq).await?,
            0,
            "the poison message stays held after the blips"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// After the blips: `good` good messages (ids `good-0…`) and the one
/// placeholder of `poison-0` stored, each once, the poison message never
/// moved to `parking`; then the planner stops and the poison message is back
/// in `dlq`, ready.
async fn held_once_and_back_after_halt(
    bed: &mut TestBed,
    dlq: &str,
    parking: &str,
    good: u32,
) -> anyhow::Result<()> {
    wait_ready(
        bed.broker(),
        "the good messages acked, the poison message still held",
        dlq,
        0,
        Duration::from_secs(30),
    )
    .await?;
    // Nothing more arrives later (no second row from a redelivery).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let dead_letters = all_dead_letters(&mut bed.client, dlq).await?;
    assert_eq!(
        dead_letters.len(),
        good as usize + 1,
        "the good ones and one placeholder, however often the poison came back"
    );
    assert_each_good_once(&dead_letters, good);
    let placeholders: Vec<_> = dead_letters
        .iter()
        .filter(|d| d.reason_class() == v1::ReasonClass::Unreadable)
        .collect();
    assert_eq!(placeholders.len(), 1, "one placeholder");
    assert_eq!(placeholders[0].message_id.as_deref(), Some("poison-0"));
    assert!(
        placeholders[0]
            .capture_notes
            .iter()
            .any(|n| n.contains("stays in this DLQ")),
        "{:?}",
        placeholders[0].capture_notes
    );
    // Unparkable: never moved aside (the parking queue is empty or was
    // never declared; asked on a connection of its own, as a 404 closes
    // the channel that asks).
    match Broker::connect().await?.ready_count(parking).await {
        Ok(parked) => assert_eq!(parked, 0, "nothing parked"),
        Err(error) => assert!(
            format!("{error:#}").contains("NOT_FOUND"),
            "the parking queue: {error:#}"
        ),
    }
    // Back in the DLQ once the planner stops.
    bed.planner.halt().await?;
    wait_ready(
        bed.broker(),
        "the held message back in the DLQ after the planner stopped",
        dlq,
        1,
        Duration::from_secs(10),
    )
    .await
}

/// A planner capturing `dlq` through a TCP proxy the test cuts, once it has
/// stored the 7 readable messages around the poison one. Blips a few
/// seconds apart never let a capture session count as healthy, so capture
/// reconnects within a second (`--capture-reconnect-max-ms`), not the
/// service's 10 s: 20 blips take a minute, not five, under the same
/// hold-again rule.
async fn capturing_through_a_proxy(
    broker: Broker,
    dlq: &str,
) -> anyhow::Result<(TestBed, TcpProxy)> {
    let proxy = TcpProxy::start("127.0.0.1:5672".parse()?).await?;
    let amqp_via_proxy = format!("amqp://guest:guest@{}/%2f", proxy.addr());
    let mut bed = TestBed::start(broker, |config| {
        capturing(config, dlq);
        config.amqp.url = amqp_via_proxy;
        config.capture_reconnect_max_ms = 1000;
    })
    .await?;
    captured(&mut bed.client, dlq, 7).await?;
    Ok((bed, proxy))
}

/// Every time the planner's broker connection blips, the connection holding
/// an unparkable message dies and the broker returns the message to the
/// DLQ; the next round must hold it again (docs/capture.md, "Messages the
/// AMQP client cannot read", 4.), blip after blip: never lost, never moved
/// elsewhere, never stored twice, never left ready for long, and back in the
/// DLQ (ready) once the planner stops. Messages published after the blips
/// are captured. (Once the session after a blip failed before it consumed,
/// the dead holding connection went unnoticed: lapin met the returned
/// message first, the guard ended that session too, and the hold waited for
/// two backoff delays, over 30 s after a few blips.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_unparkable_message_survives_many_connection_blips() -> anyhow::Result<()> {
    init_logging();
    let broker = Broker::connect().await?;
    let (dlq, parking) = dlq_and_parking(&broker, "dlq", FieldTable::default()).await?;

    let body = br#"{"order_id":"poison"}"#;
    let header = unparkable_header(body.len() as u64, 0);
    good_around_raw(&broker, &dlq, 3, &[&header], body, 3).await?;

    let (mut bed, proxy) = capturing_through_a_proxy(broker, &dlq).await?;

    blips_hold_it_again(&bed, &proxy, &dlq, 20).await?;
    // A message published now is captured.
    good(bed.broker(), &dlq, 6, 3).await?;
    captured(&mut bed.client, &dlq, 10).await?;
    held_once_and_back_after_halt(&mut bed, &dlq, &parking, 9).await?;
    bed.finish().await
}

/// As above on a quorum DLQ, which counts every return of a message
/// (`x-delivery-count`): the held message does not go round in a loop.
/// Counted: its first delivery to lapin (the guard ends that session), the
/// planner's stop, and per blip its return from the holding connection and
/// at most one more: the connections of a blip do not end at the same
/// instant, so the broker may hand it to the session in the moment before
/// that one ends too.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn each_blip_returns_a_held_message_once() -> anyhow::Result<()> {
    init_logging();
    let broker = Broker::connect().await?;
    // A limit far above what the test returns (RabbitMQ 4 sets 20 by default).
    let (dlq, parking) =
        dlq_and_parking(&broker, "quorum-dlq", quorum_with_delivery_limit(1000)).await?;

    let body = br#"{"order_id":"poison"}"#;
    let header = unparkable_header(body.len() as u64, 0);
    good_around_raw(&broker, &dlq, 3, &[&header], body, 3).await?;

    let (mut bed, proxy) = capturing_through_a_proxy(broker, &dlq).await?;
    let blips = 8;
    blips_hold_it_again(&bed, &proxy, &dlq, blips).await?;
    held_once_and_back_after_halt(&mut bed, &dlq, &parking, 6).await?;

    let mut reader = RawConnection::connect(AMQP_URL).await?;
    let poison = reader.get(&dlq).await?.expect("the poison message is back");
    reader.close().await;
    let header = redrive_planner::capture::raw::decode_content_header(&poison.header)?;
    use redrive_proto::v1::header_value::Value;
    let returns = match header
        .headers
        .fields
        .get("x-delivery-count")
        .and_then(|count| count.value.clone())
    {
        Some(Value::LongLongInt(count)) => count,
        Some(Value::LongInt(count) | Value::ShortInt(count) | Value::ShortShortInt(count)) => {
            i64::from(count)
        }
        other => anyhow::bail!("x-delivery-count of the poison message: {other:?}"),
    };
    assert!(
        (i64::from(blips) + 2..=2 * i64::from(blips) + 2).contains(&returns),
        "{returns} returns of the held message after {blips} blips: its first delivery, the stop, one or two per blip"
    );
    bed.finish().await
}

/// An operator (or an earlier tool) has declared `<dlq>.unreadable` with a
/// length limit. The planner's `queue.declare` with no arguments fails with
/// 406 PRECONDITION_FAILED, `isolate` returns an error, the loop retries
/// `isolate` forever and never goes back to consuming: the queue's capture
/// stops behind one readable-by-nobody message.
///
/// Expected: capture goes on (the message stays in the DLQ, or is parked
/// anyway), every good message is captured.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_parking_queue_declared_with_other_arguments_does_not_stop_capture() -> anyhow::Result<()>
{
    init_logging();
    let broker = Broker::connect().await?;
    let dlq = unique("dlq");
    broker.queue(&dlq, FieldTable::default()).await?;
    let parking = unreadable_queue(&dlq);
    broker
        .queue(
            &parking,
            amqp_table(vec![(
                "x-max-length",
                lapin::types::AMQPValue::LongInt(100_000),
            )]),
        )
        .await?;
    broker.track_exchange(&parking);

    let body = br#"{"order_id":"poison"}"#;
    let header = content_header(
        body.len() as u64,
        &[
            (15, short(b"application/json")),
            (5, short(b"bestellung.ge\xe4ndert")),
        ],
    );
    good_around_raw(&broker, &dlq, 5, &[&header], body, 5).await?;

    captures_all(broker, &dlq, 11, "11").await
}

/// An unparkable unreadable message is held in the DLQ. Every time the hold
/// ends (planner restart, connection blip, `consumer_timeout`) the broker
/// returns it, and a quorum DLQ counts each return against
/// `x-delivery-limit`: past it the broker drops the message. Redrive cannot
/// prevent that, so the placeholder keeps the message byte for byte (its raw
/// content header and body) and says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_held_message_dropped_by_a_quorum_dlq_is_kept_byte_for_byte() -> anyhow::Result<()> {
    init_logging();
    let broker = Broker::connect().await?;
    let (dlq, _parking) =
        dlq_and_parking(&broker, "quorum-dlq", quorum_with_delivery_limit(2)).await?;

    let body = br#"{"order_id":"poison"}"#;
    let header = unparkable_header(body.len() as u64, 0);
    good_around_raw(&broker, &dlq, 2, &[&header], body, 0).await?;

    let mut bed = TestBed::start(broker, |config| capturing(config, &dlq)).await?;
    for (restart, expected) in (0..4).zip(3..) {
        good(bed.broker(), &dlq, 2 + restart, 1).await?;
        captured(&mut bed.client, &dlq, expected).await?;
        tokio::time::sleep(Duration::from_millis(300)).await;
        bed.restart_planner(|config| capturing(config, &dlq))
            .await?;
    }
    // By now the broker may have dropped it; the placeholder has it all.
    let list = bed
        .client
        .list_dead_letters(v1::ListDeadLettersRequest {
            selector: Some(v1::Selector {
                sources: vec![dlq.clone()],
                reasons: vec!["unreadable".to_owned()],
                ..Default::default()
            }),
            page_size: 10,
            page_token: String::new(),
        })
        .await?
        .into_inner()
        .dead_letters;
    assert_eq!(list.len(), 1, "one placeholder however often it came back");
    let placeholder = bed
        .client
        .get_dead_letter(v1::GetDeadLetterRequest {
            id: list[0].id.clone(),
        })
        .await?
        .into_inner()
        .dead_letter
        .unwrap();
    // As the broker delivered it: the published header plus the quorum
    // queue's own x-delivery-count.
    let stored =
        redrive_planner::capture::raw::decode_content_header(&placeholder.raw_content_header)?;
    let published = redrive_planner::capture::raw::decode_content_header(&header)?;
    assert_eq!(stored.properties, published.properties);
    assert!(stored.headers.fields.contains_key("x-delivery-count"));
    assert!(
        placeholder
            .raw_content_header
            .windows(19)
            .any(|w| w == b"bestellung.ge\xe4ndert"),
        "the exact Latin-1 bytes"
    );
    assert_eq!(placeholder.body, body, "the exact body");
    assert!(
        placeholder
            .capture_notes
            .iter()
            .any(|n| n.contains("exact bytes are kept here")),
        "{:?}",
        placeholder.capture_notes
    );
    bed.finish().await
}

/// The one-at-a-time reader logs in with the capability
/// `authentication_failure_close`: a wrong password is told by RabbitMQ's
/// 403 "Login was refused" (which the capture's line turns into advice),
/// not as a connection that merely ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_one_at_a_time_reader_is_told_a_refused_login() -> anyhow::Result<()> {
    init_logging();
    let wrong = AMQP_URL.replacen("guest:guest@", "guest:not-the-password@", 1);
    anyhow::ensure!(
        wrong != AMQP_URL,
        "the test URL has no guest:guest@: {AMQP_URL}"
    );
    let refused = match RawConnection::connect(&wrong).await {
        Ok(_) => anyhow::bail!("a wrong password was accepted"),
        Err(error) => error.to_string(),
    };
    assert!(refused.contains("403"), "{refused}");
    assert!(refused.contains("Login was refused"), "{refused}");
    assert!(!refused.contains("not-the-password"), "{refused}");
    assert_eq!(
        redrive_proto::amqp_nodes::refusal_advice(&refused),
        Some("the broker refused the login: check the user and password of --amqp-url")
    );
    Ok(())
}

/// Two unreadable messages in one backlog on a quorum DLQ with a delivery
/// limit of 1, a prefetch holding all of it: the round after the first stop
/// takes every returned message, past the first unreadable one, so no
/// session is handed them again and the second stop returns none of them a
/// second time (a new user lost the 200 behind the first one).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_unreadable_messages_in_a_backlog_on_a_quorum_dlq_cost_nothing() -> anyhow::Result<()> {
    init_logging();
    let broker = Broker::connect().await?;
    let (dlq, parking) =
        dlq_and_parking(&broker, "quorum-dlq", quorum_with_delivery_limit(1)).await?;
    let body = br#"{"order_id":"poison"}"#;
    let mut kinds = unreadable_kinds(body.len() as u64, "nobody");
    let (_, second) = kinds.remove(1);
    let (_, first) = kinds.remove(0);
    good(&broker, &dlq, 0, 100).await?;
    let mut publisher = RawConnection::connect(AMQP_URL).await?;
    assert!(publisher.publish("", dlq.as_bytes(), &first, body).await?);
    good(&broker, &dlq, 100, 99).await?;
    assert!(publisher.publish("", dlq.as_bytes(), &second, body).await?);
    publisher.close().await;
    good(&broker, &dlq, 199, 99).await?;

    let mut bed = TestBed::start(broker, |config| {
        capturing(config, &dlq);
        config.capture_batch_size = 100;
        config.capture_prefetch = 400;
    })
    .await?;
    all_captured_and_parked(&mut bed, &dlq, &parking, 298, 2).await?;
    bed.finish().await
}

/// A planner stopped while its round took returned messages one at a time
/// leaves them at the head of the queue, returned once; on a quorum DLQ
/// with a delivery limit of 1 a session handed them again returns them a
/// second time at the next unreadable one (a new user lost up to 3,000 that
/// way). Here another consumer held them all and left: the starting
/// planner takes the returned ones one at a time before it consumes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn messages_returned_before_the_planner_started_are_not_returned_again() -> anyhow::Result<()>
{
    init_logging();
    let broker = Broker::connect().await?;
    let (dlq, parking) =
        dlq_and_parking(&broker, "quorum-dlq", quorum_with_delivery_limit(1)).await?;
    let body = br#"{"order_id":"poison"}"#;
    let (_, header) = unreadable_kinds(body.len() as u64, "nobody").remove(0);
    good_around_raw(&broker, &dlq, 5, &[&header], body, 95).await?;
    // Held by a consumer that leaves without acking: returned once.
    let mut holder = RawConnection::connect(AMQP_URL).await?;
    for _ in 0..101 {
        assert!(holder.get(&dlq).await?.is_some());
    }
    holder.close().await;
    wait_ready(&broker, "the returns", &dlq, 101, Duration::from_secs(30)).await?;

    let mut bed = TestBed::start(broker, |config| {
        capturing(config, &dlq);
        config.capture_batch_size = 100;
        config.capture_prefetch = 200;
    })
    .await?;
    all_captured_and_parked(&mut bed, &dlq, &parking, 100, 1).await?;
    bed.finish().await
}
