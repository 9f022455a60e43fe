//! Traces as a trace viewer sees them: an OTLP receiver runs inside the test
//! (the collector's gRPC trace service) and this process exports to it, as
//! `OTEL_EXPORTER_OTLP_ENDPOINT` makes the binaries do. A replay exports one
//! publish span per message with the messaging semantic-convention
//! attributes; the `traceparent` every replayed message carries names one
//! of them; a dead letter that carried its producer's `traceparent` is
//! linked to it; the precheck and capture batches are spans too
//! (`traces_rpc.rs`: a planner RPC continues its caller's `traceparent`).
//!
//! Its own test binary: the tracing subscriber is global to the process.

use std::{collections::HashMap, time::Duration};

use anyhow::Context;
use lapin::{
    BasicProperties,
    types::{AMQPValue, FieldTable, LongString},
};
use opentelemetry_proto::tonic::trace::v1::{Span, span::SpanKind};
use redrive_tests::{
    Broker, DlqTopology, ExecutorHandle, TestBed, init_logging,
    otlp::{OtlpReceiver, attribute},
    wait_until,
};

mod support;
use support::*;

/// `(trace id, span id)` of a `traceparent` value, as lowercase hex.
fn ids(traceparent: &str) -> Option<(String, String)> {
    let mut parts = traceparent.split('-');
    let _version = parts.next()?;
    Some((parts.next()?.to_owned(), parts.next()?.to_owned()))
}

fn header_text(headers: &FieldTable, name: &str) -> Option<String> {
    match headers.inner().get(name)? {
        AMQPValue::LongString(text) => Some(String::from_utf8_lossy(text.as_bytes()).into_owned()),
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replays_export_publish_spans_their_messages_name() -> anyhow::Result<()> {
    init_logging();
    let receiver = OtlpReceiver::start().await?;
    let endpoint = receiver.endpoint.clone();
    let tracer = redrive_proto::telemetry::init_subscriber(
        "redrive-tests",
        tracing_subscriber::EnvFilter::new("warn"),
        false,
        Some(&endpoint),
    )?
    .context("a tracer with an endpoint")?;

    let broker = Broker::connect().await?;
    let topology = DlqTopology::declare(&broker).await?;
    // Five orders; the first two carry their producer's traceparent.
    let producer_traceparents: HashMap<String, String> = (0..2)
        .map(|n| {
            (
                format!("m-{n}"),
                format!("00-{:032x}-{:016x}-01", 0xabc0 + n, 0xdef0 + n),
            )
        })
        .collect();
    for n in 0..5 {
        let message_id = format!("m-{n}");
        let mut headers = FieldTable::default();
        if let Some(traceparent) = producer_traceparents.get(&message_id) {
            headers.insert(
                "traceparent".into(),
                AMQPValue::LongString(LongString::from(traceparent.as_bytes().to_vec())),
            );
        }
        let properties = BasicProperties::default()
            .with_message_id(message_id.as_str().into())
            .with_headers(headers);
        topology
            .reject(
                &broker,
                format!(r#"{{"order_id":"o-{n}"}}"#).as_bytes(),
                properties,
            )
            .await?;
    }
    let dlq = topology.dlq.clone();
    let mut bed = TestBed::start(broker, |config| capturing(config, &[&dlq])).await?;
    captured(&mut bed.client, &topology.dlq, 5).await?;
    let (received, consuming) = consume(bed.broker(), &topology.work).await?;
    let plan = approved_plan(&mut bed.client, &topology.dlq, 1000.0, 50, None).await?;
    let executor = ExecutorHandle::start(bed.executor_config());
    wait_completed(&mut bed.client, &plan.plan_id, Duration::from_secs(60)).await?;

    executor.stop().await?;
    let received = drain(&received, consuming, Duration::from_millis(300)).await?;
    assert_eq!(received.len(), 5, "every order replayed once");

    let flushing = tracer.clone();
    tokio::task::spawn_blocking(move || flushing.force_flush()).await??;
    // Queue mode (the default destination): the default exchange, routed
    // by the queue's name.
    let publish_name = "publish amq.default".to_owned();
    wait_until(
        "the publish spans exported",
        Duration::from_secs(20),
        || {
            let spans = receiver.spans();
            let publish_name = publish_name.clone();
            async move {
                Ok(spans
                    .iter()
                    .filter(|span| span.name == publish_name)
                    .count()
                    >= 5)
            }
        },
    )
    .await?;
    let spans = receiver.spans();
    let by_ids: HashMap<(String, String), &Span> = spans
        .iter()
        .map(|span| {
            (
                (hex::encode(&span.trace_id), hex::encode(&span.span_id)),
                span,
            )
        })
        .collect();

    for message in &received {
        let traceparent =
            header_text(&message.headers, "traceparent").context("a replayed traceparent")?;
        let key = ids(&traceparent).context("a well-formed traceparent")?;
        let span = by_ids.get(&key).with_context(|| {
            format!(
                "{traceparent} of {} names no exported span",
                message.message_id
            )
        })?;
        assert_eq!(span.name, publish_name);
        assert_eq!(span.kind, SpanKind::Producer as i32);
        let parent = spans
            .iter()
            .find(|parent| parent.span_id == span.parent_span_id)
            .context("the publish span's parent is exported")?;
        assert_eq!(parent.name, "executor.slice", "a child of its slice's span");
        assert_eq!(parent.trace_id, span.trace_id);
        assert_eq!(attribute(span, "messaging.system"), Some("rabbitmq"));
        assert_eq!(attribute(span, "messaging.operation.type"), Some("send"));
        assert_eq!(
            attribute(span, "messaging.destination.name"),
            Some("amq.default")
        );
        assert_eq!(
            attribute(span, "messaging.rabbitmq.destination.routing_key"),
            Some(topology.work.as_str())
        );
        assert_eq!(
            attribute(span, "messaging.message.id"),
            Some(message.message_id.as_str())
        );
        assert_eq!(
            attribute(span, "redrive.plan.id"),
            Some(plan.plan_id.as_str())
        );
        match producer_traceparents.get(&message.message_id) {
            Some(original) => {
                let (trace, span_id) = ids(original).context("the producer's traceparent")?;
                assert!(
                    span.links
                        .iter()
                        .any(|link| hex::encode(&link.trace_id) == trace
                            && hex::encode(&link.span_id) == span_id),
                    "the replay of {} links to its producer's span",
                    message.message_id
                );
                assert_ne!(
                    hex::encode(&span.trace_id),
                    trace,
                    "a link, not the producer's trace continued"
                );
            }
            None => assert!(span.links.is_empty()),
        }
    }

    // The precheck is a span under its RPC's server span; capture batches
    // are spans of their own.
    let run_precheck = spans
        .iter()
        .find(|span| span.name == "redrive.v1.Planner/RunPrecheck")
        .context("the RunPrecheck server span")?;
    let precheck = spans
        .iter()
        .find(|span| span.name == "planner.precheck")
        .context("the precheck span")?;
    assert_eq!(precheck.parent_span_id, run_precheck.span_id);
    assert_eq!(precheck.trace_id, run_precheck.trace_id);
    // Its chunks are spans under it, each with its size.
    let chunks: Vec<_> = spans
        .iter()
        .filter(|span| span.name == "planner.precheck.chunk")
        .collect();
    assert!(!chunks.is_empty(), "the precheck's chunks are spans");
    for chunk in chunks {
        assert_eq!(chunk.parent_span_id, precheck.span_id);
        assert!(
            chunk
                .attributes
                .iter()
                .any(|attribute| attribute.key == "precheck.chunk.size"),
            "a chunk span names its size"
        );
    }
    assert!(
        spans.iter().any(|span| span.name == "planner.capture.batch"
            && attribute(span, "messaging.destination.name") == Some(topology.dlq.as_str())),
        "capture batches are spans"
    );

    bed.finish().await
}
