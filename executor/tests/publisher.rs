//! The publisher against the real RabbitMQ: a confirm window of many
//! messages, unroutable mandatory publishes (also interleaved with routed
//! ones), a publish to a missing exchange, and a connection cut with confirms
//! outstanding. The rule under test everywhere: a message is reported
//! [`PublishOutcome::Sent`] only if the broker really has it.

mod support;

use std::time::Duration;

use lapin::{
    BasicProperties, ExchangeKind,
    types::{FieldTable, ShortString},
};
use redrive_executor::publisher::{
    DEFAULT_CONFIRM_TIMEOUT, Handoff, Outgoing, Pending, PublishError, PublishOutcome, Publisher,
    PublisherOptions,
};
use support::{AMQP_ADDR, AMQP_URL, Broker, TcpProxy, amqp_url, unique};

fn persistent(message_id: &str) -> BasicProperties {
    BasicProperties::default()
        .with_delivery_mode(2)
        .with_message_id(ShortString::from(message_id))
        .with_content_type(ShortString::from("application/json"))
}

fn to_queue(queue: &str, index: usize) -> Outgoing {
    Outgoing {
        exchange: String::new(),
        routing_key: queue.to_owned(),
        body: format!("{{\"order\":{index}}}").into_bytes(),
        properties: persistent(&format!("msg-{index}")),
    }
}

/// The queue's message count, once it stops changing (confirms of a
/// persistent message come after the enqueue, so this is a formality).
async fn settled_count(broker: &Broker, queue: &str) -> u32 {
    let mut last = broker.ready_count(queue).await.unwrap();
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = broker.ready_count(queue).await.unwrap();
        if now == last {
            return now;
        }
        last = now;
    }
    last
}

/// The index of every message in `queue` once its count settles, read
/// from each body by `index`; the queue is drained.
async fn delivered(
    broker: &Broker,
    queue: &str,
    index: impl Fn(&[u8]) -> usize,
) -> std::collections::BTreeSet<usize> {
    settled_count(broker, queue).await;
    broker
        .drain(queue)
        .await
        .unwrap()
        .iter()
        .map(|body| index(body))
        .collect()
}

/// A direct exchange and a queue bound to it with `routing_key`, both deleted
/// by [`Broker::cleanup`].
async fn bound_queue(broker: &Broker, routing_key: &str) -> (String, String) {
    let exchange = unique("redrive-test-exchange");
    let queue = unique("redrive-test-publish");
    broker
        .exchange(&exchange, ExchangeKind::Direct)
        .await
        .unwrap();
    broker.queue(&queue, FieldTable::default()).await.unwrap();
    broker.bind(&queue, &exchange, routing_key).await.unwrap();
    (exchange, queue)
}

#[tokio::test]
async fn a_window_of_confirms_sends_every_message_once_in_order() {
    let broker = Broker::connect().await.unwrap();
    let queue = unique("redrive-test-publish");
    broker.queue(&queue, FieldTable::default()).await.unwrap();
    let publisher = Publisher::connect(AMQP_URL, 256).await.unwrap();

    let mut pendings = Vec::new();
    let mut most_in_flight = 0;
    for index in 0..2000 {
        pendings.push(publisher.publish(to_queue(&queue, index)).await.unwrap());
        most_in_flight = most_in_flight.max(publisher.in_flight());
    }
    let mut outcomes = Vec::new();
    for pending in pendings {
        outcomes.push(pending.await);
    }

    assert!(
        outcomes.iter().all(PublishOutcome::is_sent),
        "not all sent: {:?}",
        outcomes.iter().find(|outcome| !outcome.is_sent())
    );
    assert!(
        most_in_flight > 1,
        "publishes were not kept in flight together"
    );
    assert!(most_in_flight <= 256, "{most_in_flight} in flight");
    assert_eq!(settled_count(&broker, &queue).await, 2000);
    let bodies = broker.drain(&queue).await.unwrap();
    let expected: Vec<Vec<u8>> = (0..2000)
        .map(|index| format!("{{\"order\":{index}}}").into_bytes())
        .collect();
    assert!(bodies == expected, "the queue holds other bodies or order");
    publisher.close().await.unwrap();
    broker.cleanup().await;
}

#[tokio::test]
async fn a_publish_nobody_is_bound_for_is_unroutable() {
    let broker = Broker::connect().await.unwrap();
    let (exchange, queue) = bound_queue(&broker, "bound").await;
    let publisher = Publisher::connect(AMQP_URL, 16).await.unwrap();

    let outcome = publisher
        .publish(Outgoing {
            exchange: exchange.clone(),
            routing_key: "nobody-listens".to_owned(),
            body: b"lost".to_vec(),
            properties: persistent("unroutable-1"),
        })
        .await
        .unwrap()
        .outcome()
        .await;

    match outcome {
        PublishOutcome::Unroutable {
            reply_code,
            reply_text,
        } => {
            assert_eq!(reply_code, 312);
            assert_eq!(reply_text, "NO_ROUTE");
        }
        other => panic!("expected unroutable, got {other:?}"),
    }
    assert_eq!(settled_count(&broker, &queue).await, 0);
    assert!(publisher.is_connected());
    publisher.close().await.unwrap();
    broker.cleanup().await;
}

/// Routed and unroutable messages mixed in one window: the broker acks
/// several messages with one `multiple` ack, and lapin pairs a return with
/// whichever confirm of that ack it completes first. Each message must still
/// get its own outcome.
#[tokio::test]
async fn returns_are_matched_to_their_own_messages_when_acks_are_batched() {
    let broker = Broker::connect().await.unwrap();
    let (exchange, queue) = bound_queue(&broker, "routed").await;
    let publisher = Publisher::connect(AMQP_URL, 256).await.unwrap();

    // A fixed pseudo-random pattern, about one message in five unroutable.
    let mut state: u64 = 0x2545_F491_4F6C_DD1D;
    let mut routed = Vec::new();
    let mut pendings: Vec<(bool, Pending)> = Vec::new();
    for index in 0..5000 {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let is_routed = !state.is_multiple_of(5);
        routed.push(is_routed);
        let outgoing = Outgoing {
            exchange: exchange.clone(),
            routing_key: if is_routed { "routed" } else { "nowhere" }.to_owned(),
            body: format!("message {index}").into_bytes(),
            properties: persistent(&format!("mixed-{index}")),
        };
        pendings.push((is_routed, publisher.publish(outgoing).await.unwrap()));
    }
    let mut wrong = Vec::new();
    for (index, (is_routed, pending)) in pendings.into_iter().enumerate() {
        let outcome = pending.await;
        let right = if is_routed {
            outcome.is_sent()
        } else {
            matches!(outcome, PublishOutcome::Unroutable { .. })
        };
        if !right {
            wrong.push((index, is_routed, outcome));
        }
    }

    assert!(
        wrong.is_empty(),
        "{} wrong outcomes: {:?}",
        wrong.len(),
        &wrong[..wrong.len().min(5)]
    );
    // By identity: the queue holds exactly the routed messages, in order.
    settled_count(&broker, &queue).await;
    let expected: Vec<Vec<u8>> = routed
        .iter()
        .enumerate()
        .filter(|(_, is_routed)| **is_routed)
        .map(|(index, _)| format!("message {index}").into_bytes())
        .collect();
    let bodies = broker.drain(&queue).await.unwrap();
    assert_eq!(bodies.len(), expected.len());
    assert!(
        bodies == expected,
        "the queue holds other messages than the routed ones"
    );
    publisher.close().await.unwrap();
    broker.cleanup().await;
}

#[tokio::test]
async fn a_missing_exchange_closes_the_channel_and_nothing_is_reported_sent() {
    let broker = Broker::connect().await.unwrap();
    let queue = unique("redrive-test-publish");
    broker.queue(&queue, FieldTable::default()).await.unwrap();
    let publisher = Publisher::connect(AMQP_URL, 64).await.unwrap();

    let mut pendings = Vec::new();
    for index in 0..50 {
        pendings.push(publisher.publish(to_queue(&queue, index)).await.unwrap());
    }
    let missing = publisher
        .publish(Outgoing {
            exchange: unique("redrive-test-missing"),
            routing_key: "any".to_owned(),
            body: b"to nowhere".to_vec(),
            properties: persistent("missing-1"),
        })
        .await
        .unwrap();
    // The broker closes the channel (404); publishes after that either fail
    // at once or never get a confirm.
    let mut refused = 0;
    for index in 50..100 {
        match publisher.publish(to_queue(&queue, index)).await {
            Ok(pending) => pendings.push(pending),
            Err(error) => {
                assert!(
                    matches!(error, PublishError::ConnectionLost { .. }),
                    "{error:?}"
                );
                assert!(error.is_retryable());
                refused += 1;
            }
        }
    }

    match missing.await {
        PublishOutcome::Uncertain { reason } => assert!(
            reason.contains("NOT_FOUND") || reason.contains("404"),
            "reason: {reason}"
        ),
        other => panic!("a publish to a missing exchange is {other:?}"),
    }
    let mut sent = 0;
    for pending in pendings {
        if pending.await.is_sent() {
            sent += 1;
        }
    }
    let delivered = settled_count(&broker, &queue).await;
    assert!(
        sent <= delivered,
        "{sent} reported sent but only {delivered} delivered"
    );
    tokio::time::timeout(Duration::from_secs(5), async {
        while publisher.is_connected() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the publisher sees its channel closed");
    let after = publisher.publish(to_queue(&queue, 1000)).await.unwrap_err();
    assert!(after.is_retryable(), "{after:?}");
    assert!(
        after.to_string().contains("NOT_FOUND"),
        "the error says why: {after}"
    );
    eprintln!("missing exchange: {sent} sent, {delivered} delivered, {refused} refused");
    publisher.close().await.unwrap();
    broker.cleanup().await;
}

/// A cut with 256 messages in flight: nothing reported sent is missing
/// from the queue, nothing in the queue is unexplained, and a message
/// reported not published (its frames never written, [`Handoff::Queued`])
/// is not in the queue either. With [`Handoff::Written`] a failed write is
/// refused at once instead, never reported not published.
#[tokio::test]
async fn a_cut_connection_leaves_outstanding_confirms_uncertain_never_sent() {
    for handoff in [Handoff::Queued, Handoff::Written] {
        cut_connection_with(handoff).await;
    }
}

async fn cut_connection_with(handoff: Handoff) {
    let broker = Broker::connect().await.unwrap();
    let queue = unique("redrive-test-publish");
    broker.queue(&queue, FieldTable::default()).await.unwrap();
    let proxy = TcpProxy::start(AMQP_ADDR).await.unwrap();
    let publisher = Publisher::connect(&amqp_url(proxy.addr()), 256)
        .await
        .unwrap();

    let mut pendings = Vec::new();
    let mut refused = std::collections::BTreeSet::new();
    for index in 0..5000 {
        if index == 1500 {
            proxy.cut();
        }
        match publisher
            .publish_with(to_queue(&queue, index), handoff)
            .await
        {
            Ok(pending) => pendings.push((index, pending)),
            Err(error) => {
                assert!(error.is_retryable(), "{error:?}");
                refused.insert(index);
            }
        }
    }
    let (mut sent, mut uncertain, mut not_published) = (
        std::collections::BTreeSet::new(),
        std::collections::BTreeSet::new(),
        std::collections::BTreeSet::new(),
    );
    for (index, pending) in pendings {
        match tokio::time::timeout(Duration::from_secs(30), pending)
            .await
            .expect("every outcome resolves")
        {
            PublishOutcome::Sent { .. } => sent.insert(index),
            PublishOutcome::Uncertain { .. } => uncertain.insert(index),
            PublishOutcome::NotPublished { .. } if handoff == Handoff::Queued => {
                not_published.insert(index)
            }
            other => panic!("unexpected with {handoff:?}: {other:?}"),
        };
    }

    // By identity: what the queue holds, message by message.
    let delivered = delivered(&broker, &queue, |body| {
        let text = String::from_utf8_lossy(body);
        text.trim_start_matches("{\"order\":")
            .trim_end_matches('}')
            .parse()
            .unwrap_or_else(|_| panic!("an odd body in the queue: {text}"))
    })
    .await;
    eprintln!(
        "cut, {handoff:?}: {} sent, {} uncertain, {} not published, {} refused, {} delivered",
        sent.len(),
        uncertain.len(),
        not_published.len(),
        refused.len(),
        delivered.len()
    );
    let delivered_unpublished: Vec<&usize> = not_published.intersection(&delivered).collect();
    assert!(
        delivered_unpublished.is_empty(),
        "reported not published but in the queue: {delivered_unpublished:?}"
    );
    let sent_missing: Vec<&usize> = sent.difference(&delivered).collect();
    assert!(
        sent_missing.is_empty(),
        "reported sent but not in the queue: {sent_missing:?}"
    );
    let unexplained: Vec<&usize> = delivered
        .iter()
        .filter(|index| !sent.contains(index) && !uncertain.contains(index))
        .collect();
    assert!(
        unexplained.is_empty(),
        "in the queue but neither sent nor uncertain (a refused publish reached the broker): {unexplained:?}"
    );
    assert!(!uncertain.is_empty(), "the cut left no confirm outstanding");
    assert!(!refused.is_empty(), "publishing went on after the cut");
    assert!(!publisher.is_connected());
    publisher.close().await.unwrap();
    broker.cleanup().await;
}

/// A message of `size` bytes whose first eight are `index`.
fn large(queue: &str, index: usize, size: usize) -> Outgoing {
    let mut body = format!("{index:08}").into_bytes();
    body.resize(size, b'.');
    Outgoing {
        exchange: String::new(),
        routing_key: queue.to_owned(),
        body,
        properties: persistent(&format!("large-{index}")),
    }
}

/// The network path stalls with large messages in the window, more than
/// the sockets hold, so lapin still has frames of them queued, then it is
/// cut. With [`Handoff::Queued`] those messages are reported not published,
/// and none of them reached the queue (a message cut off in its body
/// frames is never enqueued); whatever is in the queue was reported sent
/// or uncertain. So it is too when the confirm timeout (here 1 s) takes
/// the connection for dead during the stall: the messages written by then
/// are uncertain, and those still queued in lapin are not published once
/// the cut fails their writes. If the path heals instead, lapin writes
/// them after all: they must be uncertain, never not published (the queue
/// would then hold messages the audit does not explain). With
/// [`Handoff::Written`] the publish waiting for its write is refused
/// instead.
#[tokio::test]
async fn messages_cut_off_before_their_frames_are_written_are_not_published() {
    for (handoff, confirm_timeout, heal) in [
        (Handoff::Queued, DEFAULT_CONFIRM_TIMEOUT, false),
        (Handoff::Queued, Duration::from_secs(1), false),
        (Handoff::Queued, Duration::from_secs(1), true),
        (Handoff::Written, DEFAULT_CONFIRM_TIMEOUT, false),
    ] {
        let broker = Broker::connect().await.unwrap();
        let queue = unique("redrive-test-publish");
        broker.queue(&queue, FieldTable::default()).await.unwrap();
        let proxy = std::sync::Arc::new(TcpProxy::start(AMQP_ADDR).await.unwrap());
        let options = PublisherOptions {
            confirm_timeout,
            ..PublisherOptions::with_window(64)
        };
        let publisher = Publisher::connect_with(&amqp_url(proxy.addr()), options)
            .await
            .unwrap();
        // 64 × 512 KiB in the window: far more than both sockets buffer.
        const SIZE: usize = 512 * 1024;
        let mut outcomes = std::collections::BTreeMap::new();
        for index in 0..4 {
            let pending = publisher
                .publish_with(large(&queue, index, SIZE), handoff)
                .await
                .unwrap();
            let outcome = pending.await;
            assert!(outcome.is_sent(), "the path works before the stall");
            outcomes.insert(index, outcome);
        }
        proxy.stall();
        let cutting = {
            let proxy = std::sync::Arc::clone(&proxy);
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(1500)).await;
                if heal {
                    proxy.heal();
                } else {
                    proxy.cut();
                }
            })
        };
        let mut pendings = Vec::new();
        let mut refused = 0;
        tokio::time::timeout(Duration::from_secs(30), async {
            for index in 4..200 {
                match publisher
                    .publish_with(large(&queue, index, SIZE), handoff)
                    .await
                {
                    Ok(pending) => pendings.push((index, pending)),
                    Err(error) => {
                        assert!(error.is_retryable(), "{error:?}");
                        refused += 1;
                    }
                }
            }
        })
        .await
        .expect("publishing ends once the connection is cut or taken for dead");
        cutting.await.unwrap();
        for (index, pending) in pendings {
            let outcome = tokio::time::timeout(Duration::from_secs(30), pending)
                .await
                .expect("every outcome resolves");
            outcomes.insert(index, outcome);
        }
        let delivered = delivered(&broker, &queue, |body| {
            String::from_utf8_lossy(&body[..8])
                .parse()
                .expect("an index first")
        })
        .await;
        let of = |wanted: fn(&PublishOutcome) -> bool| -> std::collections::BTreeSet<usize> {
            outcomes
                .iter()
                .filter(|(_, outcome)| wanted(outcome))
                .map(|(index, _)| *index)
                .collect()
        };
        let sent = of(PublishOutcome::is_sent);
        let uncertain = of(|outcome| matches!(outcome, PublishOutcome::Uncertain { .. }));
        let not_published = of(|outcome| matches!(outcome, PublishOutcome::NotPublished { .. }));
        eprintln!(
            "stalled then {}, {handoff:?}, confirm timeout {confirm_timeout:?}: {} sent, {} uncertain, {} not published, {refused} refused, {} delivered",
            if heal { "healed" } else { "cut" },
            sent.len(),
            uncertain.len(),
            not_published.len(),
            delivered.len()
        );
        assert!(
            sent.is_subset(&delivered),
            "reported sent but not in the queue: {:?}",
            sent.difference(&delivered).collect::<Vec<_>>()
        );
        let explained: std::collections::BTreeSet<usize> =
            sent.union(&uncertain).copied().collect();
        assert!(
            delivered.is_subset(&explained),
            "in the queue but neither sent nor uncertain: {:?}",
            delivered.difference(&explained).collect::<Vec<_>>()
        );
        if confirm_timeout < DEFAULT_CONFIRM_TIMEOUT {
            let timed_out = outcomes.values().any(|outcome| {
                matches!(outcome, PublishOutcome::Uncertain { reason }
                    if reason.contains("no publisher confirm within"))
            });
            assert!(
                timed_out,
                "the confirm timeout ended the connection before the cut"
            );
        }
        match handoff {
            Handoff::Queued if heal => {
                assert!(not_published.is_empty(), "{not_published:?}");
                assert!(
                    delivered.len() > 4,
                    "the healed path delivered what lapin held: {delivered:?}"
                );
            }
            Handoff::Queued => assert!(
                !not_published.is_empty(),
                "no message was left unwritten by the cut"
            ),
            Handoff::Written => {
                assert!(not_published.is_empty(), "{not_published:?}");
                assert!(
                    refused > 0,
                    "the publish waiting for its write was not refused"
                );
            }
        }
        assert!(!publisher.is_connected());
        publisher.close().await.unwrap();
        broker.cleanup().await;
    }
}

#[tokio::test]
async fn a_zero_window_and_an_unreachable_broker_are_refused() {
    assert!(matches!(
        Publisher::connect(AMQP_URL, 0).await.err(),
        Some(PublishError::InvalidWindow(0))
    ));
    let proxy = TcpProxy::start(AMQP_ADDR).await.unwrap();
    proxy.cut();
    let error = Publisher::connect(&amqp_url(proxy.addr()), 8)
        .await
        .err()
        .expect("no publisher without a broker");
    assert!(
        matches!(error, PublishError::Connect { .. }) && error.is_retryable(),
        "{error:?}"
    );
}
