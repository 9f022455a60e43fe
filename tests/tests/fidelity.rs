//! Capture faithful at the edges, against the real services: event times
//! written in milliseconds or microseconds (ruby-amqp/bunny #455, gmr/pamqp
//! #35) count for staleness, an implausible one is noted; a stream DLQ
//! (rabbitmq/rstream #158) and a capture queue that does not exist are
//! refused and named by readiness; a kombu body compressed with zlib and
//! labelled by its `compression` header (celery/kombu #707) is keyed by its
//! content and replayed byte for byte.

use std::{io::Write, net::SocketAddr, time::Duration};

use lapin::{BasicProperties, types::FieldTable};
use redrive_proto::v1::{self, GetDeadLetterRequest};
use redrive_tests::{
    Broker, DlqTopology, ExecutorHandle, TestBed, amqp_table, amqp_text, dead_letters_of,
    init_logging, unique, wait_until,
};
use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};

mod support;
use support::{
    approved_plan, assert_bed_audit, captured, consume, precheck, stop_consuming, wait_completed,
};

/// The health status of `service` at `address` (`None`: no answer).
async fn health(address: SocketAddr, service: &str) -> Option<ServingStatus> {
    let channel = tonic::transport::Channel::from_shared(format!("http://{address}"))
        .ok()?
        .connect_timeout(Duration::from_secs(2))
        .connect()
        .await
        .ok()?;
    let answer = tokio::time::timeout(
        Duration::from_secs(3),
        HealthClient::new(channel).check(HealthCheckRequest {
            service: service.to_owned(),
        }),
    )
    .await
    .ok()?
    .ok()?;
    Some(answer.into_inner().status())
}

async fn wait_health(
    address: SocketAddr,
    service: &str,
    status: ServingStatus,
) -> anyhow::Result<()> {
    wait_until(
        &format!("health of {service:?} {status:?}"),
        Duration::from_secs(30),
        || async move { Ok(health(address, service).await == Some(status)) },
    )
    .await
}

/// Dead letters of `source` by message id, with bodies and notes.
async fn by_message_id(
    bed: &mut TestBed,
    source: &str,
) -> anyhow::Result<std::collections::HashMap<String, v1::DeadLetter>> {
    let listed = dead_letters_of(&mut bed.client, source, 100).await?;
    let mut found = std::collections::HashMap::new();
    for dead_letter in listed.dead_letters {
        let full = bed
            .client
            .get_dead_letter(GetDeadLetterRequest { id: dead_letter.id })
            .await?
            .into_inner()
            .dead_letter
            .expect("a dead letter");
        found.insert(full.message_id.clone().unwrap_or_default(), full);
    }
    Ok(found)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn event_times_in_any_unit_count_for_staleness_and_implausible_ones_are_noted()
-> anyhow::Result<()> {
    init_logging();
    let broker = Broker::connect().await?;
    let topology = DlqTopology::declare(&broker).await?;
    let now = chrono::Utc::now();
    let three_hours_ago = now - chrono::Duration::hours(3);
    let fresh = now - chrono::Duration::minutes(5);
    // (message id, timestamp property, header value, stale under 2h)
    let cases: Vec<(&str, Option<u64>, Option<lapin::types::AMQPValue>, bool)> = vec![
        // The report: a 3-hour-old payment stamped in milliseconds.
        (
            "ms-old",
            Some(three_hours_ago.timestamp_millis() as u64),
            None,
            true,
        ),
        (
            "us-old",
            Some(three_hours_ago.timestamp_micros() as u64),
            None,
            true,
        ),
        (
            "s-old",
            Some(three_hours_ago.timestamp() as u64),
            None,
            true,
        ),
        (
            "ms-fresh",
            Some(fresh.timestamp_millis() as u64),
            None,
            false,
        ),
        // The header beats the property; text and integers alike.
        (
            "header-iso-old",
            Some(fresh.timestamp() as u64),
            Some(amqp_text(&three_hours_ago.to_rfc3339())),
            true,
        ),
        (
            "header-ms-old",
            None,
            Some(lapin::types::AMQPValue::LongLongInt(
                three_hours_ago.timestamp_millis(),
            )),
            true,
        ),
        (
            "header-timestamp-ms-old",
            None,
            Some(lapin::types::AMQPValue::Timestamp(
                three_hours_ago.timestamp_millis() as u64,
            )),
            true,
        ),
        // Not a time: noted, and its age counts from its death (just now).
        ("implausible", Some(12_345), None, false),
        // After its death: not the time it happened (a placeholder year,
        // a local time an hour ahead written as UTC). Noted; the next
        // source counts.
        ("future-property", Some(4_070_908_800), None, false),
        (
            "header-future-then-property-old",
            Some(three_hours_ago.timestamp() as u64),
            Some(amqp_text(
                &(fresh + chrono::TimeDelta::hours(1))
                    .naive_utc()
                    .format("%Y-%m-%dT%H:%M:%S")
                    .to_string(),
            )),
            true,
        ),
    ];
    for (id, timestamp, header, _) in &cases {
        let mut properties = BasicProperties::default()
            .with_message_id((*id).into())
            .with_type("payment.captured".into())
            .with_content_type("application/json".into());
        if let Some(timestamp) = timestamp {
            properties = properties.with_timestamp(*timestamp);
        }
        if let Some(header) = header {
            properties = properties.with_headers(amqp_table(vec![("occurred-at", header.clone())]));
        }
        let body = format!(r#"{{"order_id":"{id}"}}"#);
        topology
            .reject(&broker, body.as_bytes(), properties)
            .await?;
    }
    let dlq = topology.dlq.clone();
    let mut bed = TestBed::start(broker, |config| {
        config.capture_queues = vec![dlq.clone()];
        config.message_keys = vec!["json:/order_id".to_owned()];
        config.event_time_header = Some("occurred-at".to_owned());
        config.stale_after = vec!["payment.*=2h".to_owned()];
    })
    .await?;
    captured(&mut bed.client, &topology.dlq, cases.len() as u64).await?;
    let stored = by_message_id(&mut bed, &topology.dlq).await?;
    for (id, _, _, stale) in &cases {
        let dead_letter = &stored[*id];
        let occurred = dead_letter.occurred_at.as_ref().map(|at| at.seconds);
        let not_read = match *id {
            "implausible" => Some("12345 is not a plausible time"),
            "future-property" => Some("timestamp property not read: 2099-01-01T00:00:00.000Z is "),
            "header-future-then-property-old" => Some("after its first death"),
            _ => None,
        };
        if let Some(note) = not_read {
            assert!(
                dead_letter
                    .capture_notes
                    .iter()
                    .any(|text| text.contains(note)),
                "{id}: {:?}",
                dead_letter.capture_notes
            );
        }
        if matches!(*id, "implausible" | "future-property") {
            assert_eq!(occurred, None, "{id}");
        } else {
            let expected = if *stale { three_hours_ago } else { fresh };
            let occurred = occurred.unwrap_or_else(|| panic!("{id} has no occurred_at"));
            assert!(
                (occurred - expected.timestamp()).abs() <= 1,
                "{id}: {occurred} vs {expected}"
            );
        }
    }
    assert!(
        stored["ms-old"]
            .capture_notes
            .iter()
            .any(|note| note.contains("read as milliseconds")),
        "{:?}",
        stored["ms-old"].capture_notes
    );

    let report = precheck(&mut bed.client, &topology.dlq).await?;
    let counts = report.counts.unwrap();
    let stale = cases.iter().filter(|case| case.3).count() as u64;
    assert_eq!(
        (counts.stale, counts.replayable),
        (stale, cases.len() as u64 - stale),
        "{report:?}"
    );
    bed.finish().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stream_dlq_is_refused_and_a_missing_capture_queue_is_named_by_readiness()
-> anyhow::Result<()> {
    init_logging();
    let broker = Broker::connect().await?;
    let stream = unique("stream-dlq");
    broker
        .queue(
            &stream,
            amqp_table(vec![("x-queue-type", amqp_text("stream"))]),
        )
        .await?;
    for index in 0..3 {
        broker
            .publish(
                "",
                &stream,
                format!(r#"{{"order_id":"s-{index}"}}"#).as_bytes(),
                BasicProperties::default().with_message_id(format!("s-{index}").into()),
            )
            .await?;
    }
    let classic = unique("dlq");
    broker.queue(&classic, FieldTable::default()).await?;
    let quorum = unique("quorum-dlq");
    broker
        .queue(
            &quorum,
            amqp_table(vec![("x-queue-type", amqp_text("quorum"))]),
        )
        .await?;
    // Never declared: a typo.
    let missing = unique("nt3_orders.dql");
    let queues = vec![
        classic.clone(),
        quorum.clone(),
        stream.clone(),
        missing.clone(),
    ];
    let bed = TestBed::start(broker, |config| {
        config.capture_queues = queues;
    })
    .await?;
    let planner = bed.planner.addr;

    // The classic and quorum queues are consumed; the stream is refused;
    // the missing queue is retried, never consumed.
    wait_health(
        planner,
        &format!("capture/{classic}"),
        ServingStatus::Serving,
    )
    .await?;
    wait_health(
        planner,
        &format!("capture/{quorum}"),
        ServingStatus::Serving,
    )
    .await?;
    wait_health(
        planner,
        &format!("capture/{stream}"),
        ServingStatus::NotServing,
    )
    .await?;
    wait_health(
        planner,
        &format!("capture/{missing}"),
        ServingStatus::NotServing,
    )
    .await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    for queue in [&stream, &missing] {
        assert_eq!(
            health(planner, &format!("capture/{queue}")).await,
            Some(ServingStatus::NotServing),
            "{queue} has no consumer"
        );
    }
    assert_eq!(
        health(planner, "").await,
        Some(ServingStatus::NotServing),
        "not ready while a capture queue is refused or missing"
    );
    assert_eq!(
        health(planner, "redrive.v1.Planner").await,
        Some(ServingStatus::Serving),
        "the API serves"
    );
    // Nothing of the stream was stored (and a stream keeps its messages).
    let pool = bed.pool().await?;
    let stored: i64 = sqlx::query_scalar("SELECT count(*) FROM dead_letters WHERE source = $1")
        .bind(&stream)
        .fetch_one(&pool)
        .await?;
    pool.close().await;
    assert_eq!(stored, 0);
    bed.finish().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kombu_zlib_and_bzip2_bodies_are_keyed_by_their_content_and_replayed_byte_for_byte()
-> anyhow::Result<()> {
    init_logging();
    let broker = Broker::connect().await?;
    let topology = DlqTopology::declare(&broker).await?;
    let mut bodies = Vec::new();
    // kombu: charset in content_encoding, the codec in its `compression`
    // header (`application/x-gzip` is kombu's name for zlib); a bzip2
    // sibling under kombu's `application/x-bz2`.
    for (index, compression) in ["application/x-gzip", "zlib", "application/x-bz2"]
        .into_iter()
        .enumerate()
    {
        let json = format!(r#"{{"order_id":"k-{index}","task":"charge"}}"#);
        let body = if compression.contains("bz2") {
            let mut bzip2 = bzip2::write::BzEncoder::new(Vec::new(), bzip2::Compression::default());
            bzip2.write_all(json.as_bytes())?;
            bzip2.finish()?
        } else {
            let mut zlib =
                flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
            zlib.write_all(json.as_bytes())?;
            zlib.finish()?
        };
        topology
            .reject(
                &broker,
                &body,
                BasicProperties::default()
                    .with_message_id(format!("m-k-{index}").into())
                    .with_content_type("application/json".into())
                    .with_content_encoding("utf-8".into())
                    .with_headers(amqp_table(vec![("compression", amqp_text(compression))])),
            )
            .await?;
        bodies.push(body);
    }
    let dlq = topology.dlq.clone();
    let mut bed = TestBed::start(broker, |config| {
        config.capture_queues = vec![dlq];
        config.message_keys = vec!["json:/order_id".to_owned()];
        config.lease_ttl_seconds = 3;
    })
    .await?;
    captured(&mut bed.client, &topology.dlq, 3).await?;
    let stored = by_message_id(&mut bed, &topology.dlq).await?;
    for index in 0..3 {
        let dead_letter = &stored[&format!("m-k-{index}")];
        assert_eq!(dead_letter.message_key, format!("k-{index}"));
        assert_eq!(
            dead_letter.body, bodies[index],
            "the captured bytes are kept"
        );
    }
    let report = precheck(&mut bed.client, &topology.dlq).await?;
    let counts = report.counts.unwrap();
    assert_eq!((counts.replayable, counts.invalid), (3, 0), "{report:?}");

    let (received, consuming) = consume(bed.broker(), &topology.work).await?;
    let plan = approved_plan(&mut bed.client, &topology.dlq, 100.0, 10, None).await?;
    let executor = ExecutorHandle::start(bed.executor_config());
    wait_completed(&mut bed.client, &plan.plan_id, Duration::from_secs(30)).await?;
    executor.stop().await?;
    wait_until("the replay consumed", Duration::from_secs(10), || {
        let received = received.clone();
        async move { Ok(received.lock().unwrap().len() >= 3) }
    })
    .await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop_consuming(consuming)?;
    let received = received.lock().unwrap().clone();
    assert_bed_audit(&bed, &plan.plan_id, &received).await?;
    assert_eq!(received.len(), 3);
    for delivery in &received {
        let index: usize = delivery.message_id["m-k-".len()..].parse()?;
        assert_eq!(delivery.body, bodies[index], "the exact compressed bytes");
        assert_eq!(
            delivery
                .properties
                .content_encoding()
                .as_ref()
                .map(|e| e.as_str()),
            Some("utf-8")
        );
    }

    // A repair is checked as capture reads: the zlib body decoded by the
    // dead letter's kombu header.
    let id = stored["m-k-1"].id.clone();
    let zlib = |text: &str| -> anyhow::Result<Vec<u8>> {
        let mut encoder =
            flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
        encoder.write_all(text.as_bytes())?;
        Ok(encoder.finish()?)
    };
    let refused = bed
        .client
        .repair_dead_letter(v1::RepairDeadLetterRequest {
            dead_letter_id: id.clone(),
            new_body: zlib("not json")?,
            reason: "test".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    assert!(
        refused.message().contains("does not parse as JSON"),
        "{}",
        refused.message()
    );
    bed.client
        .repair_dead_letter(v1::RepairDeadLetterRequest {
            dead_letter_id: id,
            new_body: zlib(r#"{"order_id":"k-1","task":"charge","fixed":true}"#)?,
            reason: "test".into(),
        })
        .await?;
    bed.finish().await
}

/// The event time in the body is read as capture reads the body: a raw
/// deflate body (no magic bytes) labelled `content_encoding: deflate`, and a
/// kombu zlib body, are stale by the time in them; a value at the pointer
/// that is not a time is warned of with the dead letters, never silently
/// replaced by another time.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn body_event_times_are_read_from_declared_compression_and_bad_ones_are_warned_of()
-> anyhow::Result<()> {
    init_logging();
    let broker = Broker::connect().await?;
    let topology = DlqTopology::declare(&broker).await?;
    let old = (chrono::Utc::now() - chrono::Duration::days(3)).to_rfc3339();
    let fresh = chrono::Utc::now().to_rfc3339();
    // (message id, JSON `at`, codec, header `compression`, stale)
    let cases: [(&str, String, &str, Option<&str>, bool); 5] = [
        ("deflate-old", format!("{old:?}"), "deflate", None, true),
        (
            "kombu-old",
            format!("{old:?}"),
            "zlib",
            Some("application/x-gzip"),
            true,
        ),
        (
            "deflate-fresh",
            format!("{fresh:?}"),
            "deflate",
            None,
            false,
        ),
        ("words", r#""last week""#.to_owned(), "none", None, false),
        ("tiny", "99".to_owned(), "none", None, false),
    ];
    for (id, at, codec, compression, _) in &cases {
        let json = format!(r#"{{"order_id":"{id}","at":{at}}}"#);
        let (body, content_encoding) = match *codec {
            "deflate" => {
                let mut raw =
                    flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::default());
                raw.write_all(json.as_bytes())?;
                (raw.finish()?, "deflate")
            }
            "zlib" => {
                let mut zlib =
                    flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
                zlib.write_all(json.as_bytes())?;
                (zlib.finish()?, "utf-8")
            }
            _ => (json.into_bytes(), ""),
        };
        let mut properties = BasicProperties::default()
            .with_message_id((*id).into())
            .with_type("order.created".into())
            .with_content_type("application/json".into());
        if !content_encoding.is_empty() {
            properties = properties.with_content_encoding(content_encoding.into());
        }
        if let Some(compression) = compression {
            properties =
                properties.with_headers(amqp_table(vec![("compression", amqp_text(compression))]));
        }
        topology.reject(&broker, &body, properties).await?;
    }
    let dlq = topology.dlq.clone();
    let mut bed = TestBed::start(broker, |config| {
        config.capture_queues = vec![dlq.clone()];
        config.event_time_pointer = Some("/at".to_owned());
        config.default_stale_after = Some(Duration::from_secs(86_400));
    })
    .await?;
    captured(&mut bed.client, &topology.dlq, cases.len() as u64).await?;
    let stored = by_message_id(&mut bed, &topology.dlq).await?;
    let report = precheck(&mut bed.client, &topology.dlq).await?;
    let counts = report.counts.unwrap();
    assert_eq!(
        (counts.stale, counts.replayable),
        (2, 3),
        "the two old ones are stale by the time in their bodies: {report:?}"
    );
    let items = bed
        .client
        .list_precheck_items(v1::ListPrecheckItemsRequest {
            precheck_id: report.precheck_id.clone(),
            verdict: v1::Verdict::Stale.into(),
            page_size: 10,
            page_token: String::new(),
        })
        .await?
        .into_inner()
        .items;
    for id in ["deflate-old", "kombu-old"] {
        let item = items
            .iter()
            .find(|item| item.dead_letter_id == stored[id].id)
            .unwrap_or_else(|| panic!("{id} is not stale: {items:?}"));
        assert!(
            item.reason.contains("from its event time in the body"),
            "{id}: {}",
            item.reason
        );
    }
    let warning = report
        .warnings
        .iter()
        .find(|warning| warning.contains("not a plausible time"))
        .unwrap_or_else(|| panic!("no warning of the bad event times: {:?}", report.warnings));
    for id in ["words", "tiny"] {
        assert!(warning.contains(&stored[id].id), "{id}: {warning}");
    }
    assert!(
        warning.starts_with("2 dead letters have a value at the event time pointer /at"),
        "{warning}"
    );
    bed.finish().await
}

/// Publishes an order with message id `id` to `queue`.
async fn publish_order(broker: &Broker, queue: &str, id: &str) -> anyhow::Result<()> {
    broker
        .publish(
            "",
            queue,
            format!(r#"{{"order_id":"{id}"}}"#).as_bytes(),
            BasicProperties::default().with_message_id(id.into()),
        )
        .await
}

/// A capture queue deleted while it is captured (an operator's cleanup, a
/// redeclare with other arguments) is named as missing in the log, as at
/// start-up, and captured again once it is back. Before, the planner took
/// the ended consumer for a failed session, tried to take the queue's
/// messages one at a time, and said "taking messages one at a time failed"
/// (404 from `basic.get`) at every retry, never that the queue was gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_capture_queue_deleted_while_captured_is_named_and_captured_again_when_back()
-> anyhow::Result<()> {
    use lapin::options::QueueDeleteOptions;
    use redrive_tests::{TestDb, scenario};
    init_logging();
    let broker = Broker::connect().await?;
    let queue = unique("deleted-dlq");
    broker.queue(&queue, FieldTable::default()).await?;
    publish_order(&broker, &queue, "before").await?;
    let db = TestDb::new();
    let binaries = scenario::Binaries::of_tests()?;
    let listen = scenario::free_local_addr()?;
    let metrics = scenario::free_local_addr()?;
    let (mut planner, log) = scenario::spawn_logged(
        &binaries.planner,
        [
            "--listen",
            &listen.to_string(),
            "--database-url",
            &db.url(),
            "--capture-queue",
            &queue,
            "--metrics-listen",
            &metrics.to_string(),
        ],
    )?;
    let captured_ids = || async {
        let Ok(pool) = db.pool().await else {
            return Ok::<_, anyhow::Error>(Vec::new());
        };
        let ids: Vec<String> =
            sqlx::query_scalar("SELECT message_id FROM dead_letters WHERE source = $1 ORDER BY id")
                .bind(&queue)
                .fetch_all(&pool)
                .await
                .unwrap_or_default();
        pool.close().await;
        Ok(ids)
    };
    let text = || log.text();
    wait_until(
        "the first message captured",
        Duration::from_secs(30),
        || async { Ok(captured_ids().await? == ["before"]) },
    )
    .await?;

    broker
        .channel
        .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
        .await?;
    let missing = format!("capture queue {queue} does not exist");
    wait_until(
        "the log naming the deleted queue",
        Duration::from_secs(30),
        || async { Ok(text().contains(&missing)) },
    )
    .await
    .map_err(|error| anyhow::anyhow!("{error}:\n{}", text()))?;
    // Retried, and said once a retry, not as failed single takes.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let said = text();
    assert!(
        !said.contains("taking messages one at a time failed"),
        "{said}"
    );
    let lines = said.lines().filter(|line| line.contains(&missing)).count();
    assert!((1..=12).contains(&lines), "{lines} lines:\n{said}");
    // One capture error a try: the session the deletion ended, then each
    // retry that found no queue; the single take that first met the 404
    // right after that session is no second count of the one deletion.
    let errors = |text: &str| {
        support::metric_total(
            text,
            "redrive_planner_capture_errors_total",
            &[("redrive_source", &queue)],
            &[],
        )
    };
    // Read when no try came between two readings 300 ms apart (each a
    // scrape, then the log: both only grow), so the two agree.
    let reading = || async {
        let counted = errors(&support::scrape_metrics(metrics).await?);
        let tries = text()
            .lines()
            .filter(|line| line.contains(&missing))
            .count();
        anyhow::Ok((counted, tries))
    };
    let (counted, tries) = loop {
        let first = reading().await?;
        tokio::time::sleep(Duration::from_millis(300)).await;
        if reading().await? == first {
            break first;
        }
    };
    assert_eq!(counted, tries as f64, "{}", text());

    broker.queue(&queue, FieldTable::default()).await?;
    publish_order(&broker, &queue, "after").await?;
    wait_until(
        "the message after the queue came back",
        Duration::from_secs(30),
        || async { Ok(captured_ids().await? == ["before", "after"]) },
    )
    .await
    .map_err(|error| anyhow::anyhow!("{error}:\n{}", text()))?;
    assert_eq!(broker.ready_count(&queue).await?, 0, "acked once stored");

    scenario::signal(&planner, "TERM")?;
    let exited = tokio::time::timeout(Duration::from_secs(10), planner.wait()).await;
    assert!(
        exited.is_ok_and(|status| status.is_ok_and(|status| status.success())),
        "{}",
        text()
    );
    broker.cleanup().await;
    db.drop_database().await;
    Ok(())
}

/// A second new user's pass: with the broker unreachable, the planner's
/// capture said "the connection to the broker ended (the capture guard's
/// relay closed)" at every retry, never which broker it could not reach nor
/// that it refused the connection. The line now names the node and why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_capture_cannot_reach_or_that_never_answers_is_named_with_why()
-> anyhow::Result<()> {
    use redrive_tests::{TestDb, scenario};
    init_logging();
    let db = TestDb::new();
    let binaries = scenario::Binaries::of_tests()?;
    let listen = scenario::free_local_addr()?;
    // Nothing listens there.
    let nowhere = scenario::free_local_addr()?;
    let (mut planner, log) = scenario::spawn_logged(
        &binaries.planner,
        [
            "--listen",
            &listen.to_string(),
            "--database-url",
            &db.url(),
            "--amqp-url",
            &format!("amqp://guest:guest@{nowhere}/%2f"),
            "--capture-queue",
            &unique("unreachable-dlq"),
        ],
    )?;
    let text = || log.text();
    let named = format!("broker {nowhere} (node 1 of 1): cannot reach the broker: ");
    let outcome = wait_until(
        "the capture's line naming the broker it cannot reach",
        Duration::from_secs(30),
        || async { Ok(text().contains(&named)) },
    )
    .await
    .map_err(|error| anyhow::anyhow!("{error}:\n{}", text()));
    let _ = planner.start_kill();
    let _ = planner.wait().await;
    db.drop_database().await;
    outcome?;
    let said = text();
    assert!(said.contains("refused"), "{said}");
    assert!(!said.contains("relay"), "{said}");
    assert!(!said.contains("guest:guest"), "{said}");

    // A path that takes the connection and never answers (a second new
    // user's pass: nothing was said, and SIGTERM waited the whole grace).
    let stalled = redrive_tests::TcpProxy::start("127.0.0.1:5672".parse()?).await?;
    stalled.stall();
    let db = TestDb::new();
    let listen = scenario::free_local_addr()?;
    let through = stalled.addr();
    let (mut planner, log) = scenario::spawn_logged(
        &binaries.planner,
        [
            "--listen",
            &listen.to_string(),
            "--database-url",
            &db.url(),
            "--amqp-url",
            &format!("amqp://guest:guest@{through}/%2f"),
            "--broker-id",
            "127.0.0.1:5672/%2f",
            "--capture-queue",
            &unique("stalled-dlq"),
            "--shutdown-grace-seconds",
            "30",
        ],
    )?;
    let text = || log.text();
    let named = format!("broker {through} (node 1 of 1): no answer within 10 s");
    let outcome = async {
        wait_until(
            "the capture's line naming the broker that does not answer",
            Duration::from_secs(40),
            || async { Ok(text().contains(&named)) },
        )
        .await
        .map_err(|error| anyhow::anyhow!("{error}:\n{}", text()))?;
        scenario::signal(&planner, "TERM")?;
        // Well under the 30 s grace.
        let exited = tokio::time::timeout(Duration::from_secs(8), planner.wait())
            .await
            .map_err(|_| anyhow::anyhow!("still running 8 s after SIGTERM:\n{}", text()))??;
        anyhow::ensure!(exited.success(), "{exited}:\n{}", text());
        anyhow::ensure!(
            !text().contains("did not stop within the grace period"),
            "{}",
            text()
        );
        Ok(())
    }
    .await;
    let _ = planner.start_kill();
    db.drop_database().await;
    outcome
}
