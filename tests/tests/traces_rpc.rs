//! A planner RPC is a server span continuing its caller's W3C `traceparent`
//! (gRPC metadata), exported over OTLP to a receiver inside the test; the
//! calls of `redrivectl` carry one.
//!
//! Its own test binary: the tracing subscriber is global to the process.

use std::time::Duration;

use anyhow::Context;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use redrive_proto::v1::ListPlansRequest;
use redrive_tests::{
    TestBed, init_logging,
    otlp::{OtlpReceiver, attribute},
    wait_until,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_rpc_continues_its_callers_trace() -> anyhow::Result<()> {
    init_logging();
    let receiver = OtlpReceiver::start().await?;
    let tracer = redrive_proto::telemetry::init_subscriber(
        "redrive-tests",
        tracing_subscriber::EnvFilter::new("warn"),
        false,
        Some(&receiver.endpoint),
    )?
    .context("a tracer with an endpoint")?;
    let mut bed = TestBed::without_broker(|_| {}).await?;

    let caller_trace = format!("{:032x}", 0x5eed_u128);
    let caller_span = format!("{:016x}", 0xca11_u64);
    let mut request = tonic::Request::new(ListPlansRequest::default());
    request.metadata_mut().insert(
        "traceparent",
        format!("00-{caller_trace}-{caller_span}-01").parse()?,
    );
    bed.client.list_plans(request).await?;

    let flushing = tracer.clone();
    tokio::task::spawn_blocking(move || flushing.force_flush()).await??;
    let name = "redrive.v1.Planner/ListPlans";
    wait_until("the server span exported", Duration::from_secs(20), || {
        let found = receiver.spans().iter().any(|span| span.name == name);
        async move { Ok(found) }
    })
    .await?;
    let spans = receiver.spans();
    let rpc = spans
        .iter()
        .find(|span| span.name == name)
        .context("the ListPlans server span")?;
    assert_eq!(rpc.kind, SpanKind::Server as i32);
    assert_eq!(
        hex::encode(&rpc.trace_id),
        caller_trace,
        "the caller's trace"
    );
    assert_eq!(
        hex::encode(&rpc.parent_span_id),
        caller_span,
        "under the caller's span"
    );
    assert_eq!(attribute(rpc, "rpc.system"), Some("grpc"));
    assert_eq!(attribute(rpc, "rpc.service"), Some("redrive.v1.Planner"));
    assert_eq!(attribute(rpc, "rpc.method"), Some("ListPlans"));

    // redrivectl sends its run's traceparent on every call.
    let mut cli = redrivectl::client::connect(
        &bed.planner.url(),
        Some("tracer"),
        &redrivectl::client::Credentials::default(),
        None,
    )
    .await?;
    cli.get_plan(redrive_proto::v1::GetPlanRequest {
        plan_id: "01a23314-fe74-756d-9456-334411319931".to_owned(),
    })
    .await
    .err()
    .context("no such plan")?;
    let flushing = tracer.clone();
    tokio::task::spawn_blocking(move || flushing.force_flush()).await??;
    let sent = redrivectl::client::invocation_traceparent();
    let (cli_trace, cli_span) = (&sent[3..35], &sent[36..52]);
    wait_until(
        "redrivectl's call exported",
        Duration::from_secs(20),
        || {
            let found = receiver
                .spans()
                .iter()
                .any(|span| span.name == "redrive.v1.Planner/GetPlan");
            async move { Ok(found) }
        },
    )
    .await?;
    let spans = receiver.spans();
    let get_plan = spans
        .iter()
        .find(|span| span.name == "redrive.v1.Planner/GetPlan")
        .context("the GetPlan server span")?;
    assert_eq!(
        hex::encode(&get_plan.trace_id),
        cli_trace,
        "redrivectl's trace"
    );
    assert_eq!(hex::encode(&get_plan.parent_span_id), cli_span);
    bed.finish().await
}
