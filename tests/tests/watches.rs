//! Watches that cost the database nothing per stream (issue 28, items 3
//! and 4), against a real planner: hundreds of `WatchPlan` streams of one
//! plan, or `WatchLease` streams of one lease, share one reader; every
//! stream still sees every change; streams are capped per caller and in
//! total, with places kept for a caller's first watch; and what a caller
//! sees past a cap names the setting.

use std::time::Duration;

use anyhow::Context as _;
use redrive_proto::v1::{self, PlanState, coordinator_client::CoordinatorClient};
use redrive_tests::{Broker, TestBed, init_logging};
use tonic::{Code, transport::Channel};

mod support;
use support::*;

/// `connections` connections to `bed`'s planner from `local` (any address
/// of 127/8 is this host, and another peer for the planner).
async fn channels_from(
    bed: &TestBed,
    local: &str,
    connections: usize,
) -> anyhow::Result<Vec<Channel>> {
    let mut channels = Vec::new();
    for _ in 0..connections {
        channels.push(
            tonic::transport::Endpoint::from_shared(bed.planner.url())?
                .local_address(Some(local.parse()?))
                .connect()
                .await?,
        );
    }
    Ok(channels)
}

fn reads(text: &str, what: &str) -> f64 {
    metric_total(
        text,
        "redrive_planner_watch_reads_total",
        &[("redrive_watch_read", what)],
        &[],
    )
}

/// The state a `WatchPlan` stream shows next (skipping events).
async fn next_state(
    stream: &mut tonic::Streaming<v1::WatchPlanResponse>,
) -> anyhow::Result<PlanState> {
    loop {
        let update = tokio::time::timeout(Duration::from_secs(30), stream.message())
            .await
            .context("no update within 30 s")??
            .context("the watch ended")?;
        if let Some(v1::watch_plan_response::Update::Progress(plan)) = update.update {
            return Ok(plan.state());
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn four_hundred_watches_of_one_plan_share_one_reader_and_all_see_each_change()
-> anyhow::Result<()> {
    init_logging();
    let broker = Broker::connect().await?;
    let incident = incident(&broker, 4).await?;
    let metrics = free_address().await?;
    let mut bed = TestBed::start(broker, |config| {
        capturing(config, &[&incident.dlq]);
        config.telemetry.metrics_listen = Some(metrics);
        config.max_watches_per_principal = 1_000;
        config.max_watches = 1_000;
    })
    .await?;
    captured(&mut bed.client, &incident.dlq, 4).await?;
    let plan = approved_plan(&mut bed.client, &incident.dlq, 10.0, 1, None).await?;
    assert_eq!(plan.state(), PlanState::Canary);
    let before = scrape_metrics(metrics).await?;

    // 400 streams over 8 connections; one in ten also wants the events.
    let channels = channels_from(&bed, "127.0.0.1", 8).await?;
    let mut streams = Vec::new();
    for index in 0..400 {
        let mut client =
            v1::planner_client::PlannerClient::new(channels[index % channels.len()].clone());
        streams.push(
            client
                .watch_plan(v1::WatchPlanRequest {
                    plan_id: plan.plan_id.clone(),
                    include_events: index % 10 == 0,
                })
                .await?
                .into_inner(),
        );
    }
    for stream in &mut streams {
        assert_eq!(next_state(stream).await?, PlanState::Canary);
    }
    // Two changes every stream must see.
    bed.client
        .pause_plan(v1::PlanControlRequest {
            plan_id: plan.plan_id.clone(),
            reason: "watch test".into(),
            ..Default::default()
        })
        .await?;
    for stream in &mut streams {
        assert_eq!(next_state(stream).await?, PlanState::Paused);
    }
    bed.client
        .cancel_plan(v1::PlanControlRequest {
            plan_id: plan.plan_id.clone(),
            reason: "watch test".into(),
            ..Default::default()
        })
        .await?;
    for stream in &mut streams {
        assert_eq!(next_state(stream).await?, PlanState::Cancelled);
        // A final state ends the stream.
        let end = tokio::time::timeout(Duration::from_secs(10), stream.message()).await??;
        assert!(
            end.is_none(),
            "the watch ended after the final state: {end:?}"
        );
    }
    let after = scrape_metrics(metrics).await?;
    let plan_reads = reads(&after, "plan") - reads(&before, "plan");
    let history_reads = reads(&after, "history") - reads(&before, "history");
    eprintln!("400 watchers, 2 changes: {plan_reads} plan reads, {history_reads} history reads");
    // One read to start the feed, one per change (and perhaps a periodic
    // look), never one per stream.
    assert!(
        (2.0..=8.0).contains(&plan_reads),
        "{plan_reads} plan reads for 400 watchers and 2 changes"
    );
    // Each of the 40 streams with events caught up on the past once.
    assert_eq!(history_reads, 40.0);
    bed.finish().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_hundred_watches_of_one_lease_share_one_reader_and_are_capped() -> anyhow::Result<()>
{
    init_logging();
    let broker = Broker::connect().await?;
    let incident = incident(&broker, 2).await?;
    let metrics = free_address().await?;
    let mut bed = TestBed::start(broker, |config| {
        capturing(config, &[&incident.dlq]);
        config.lease_ttl_seconds = 60;
        config.telemetry.metrics_listen = Some(metrics);
        config.max_lease_watches_per_principal = 300;
        config.max_lease_watches = 1_000;
    })
    .await?;
    captured(&mut bed.client, &incident.dlq, 2).await?;
    let plan = approved_plan(&mut bed.client, &incident.dlq, 10.0, 1, None).await?;
    let mut coordinator = CoordinatorClient::connect(bed.planner.url()).await?;
    let slice = coordinator
        .claim_slice(v1::ClaimSliceRequest {
            executor_id: "watcher".into(),
            wait: Some(prost_types::Duration {
                seconds: 10,
                nanos: 0,
            }),
            marks_publishing: true,
        })
        .await?
        .into_inner()
        .slice
        .context("a slice")?;
    let request = || v1::WatchLeaseRequest {
        slice_id: slice.slice_id.clone(),
        fencing_token: slice.fencing_token,
    };
    let channels = channels_from(&bed, "127.0.0.1", 6).await?;
    let mut streams = Vec::new();
    for index in 0..300 {
        let mut client = CoordinatorClient::new(channels[index % channels.len()].clone());
        let mut stream = client.watch_lease(request()).await?.into_inner();
        let first = stream.message().await?.context("a first signal")?;
        assert!(first.keep_publishing && !first.lease_lost, "{first:?}");
        streams.push(stream);
    }
    // One caller's 301st is refused, naming the setting.
    let refused = coordinator.watch_lease(request()).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(
        refused
            .message()
            .contains("--max-lease-watches-per-principal"),
        "{}",
        refused.message()
    );
    // Idle for 5 s: the lease is looked at every 500 ms, once for all.
    let before = scrape_metrics(metrics).await?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let after = scrape_metrics(metrics).await?;
    let idle_reads = reads(&after, "lease") - reads(&before, "lease");
    eprintln!("300 lease watchers, 5 s idle: {idle_reads} lease reads");
    assert!(
        idle_reads <= 15.0,
        "{idle_reads} lease reads in 5 s for 300 watchers of one lease"
    );
    // A cancel reaches every watcher.
    bed.client
        .cancel_plan(v1::PlanControlRequest {
            plan_id: plan.plan_id.clone(),
            reason: "watch test".into(),
            ..Default::default()
        })
        .await?;
    for stream in &mut streams {
        let signal = tokio::time::timeout(Duration::from_secs(10), stream.message())
            .await
            .context("no stop signal within 10 s")??
            .context("the watch ended without a signal")?;
        assert!(!signal.keep_publishing, "{signal:?}");
    }
    let text = scrape_metrics(metrics).await?;
    assert_eq!(
        metric_total(
            &text,
            "redrive_planner_streams_refused_total",
            &[
                ("redrive_stream_kind", "WatchLease"),
                ("redrive_stream_cap", "per_principal")
            ],
            &[],
        ),
        1.0,
        "{text}"
    );
    drop(streams);
    bed.finish().await
}

/// The probe's attack on `WatchPlan`: a crowd fills every place it may
/// take; another caller's first watch still gets in, and the crowd's next
/// one is refused naming the total.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_crowd_of_watches_leaves_room_for_another_callers_first_watch() -> anyhow::Result<()> {
    init_logging();
    let broker = Broker::connect().await?;
    let incident = incident(&broker, 2).await?;
    let mut bed = TestBed::start(broker, |config| {
        capturing(config, &[&incident.dlq]);
        config.max_watches_per_principal = 200;
        config.max_watches = 100;
        config.reserved_watches = 20;
    })
    .await?;
    captured(&mut bed.client, &incident.dlq, 2).await?;
    let plan = approved_plan(&mut bed.client, &incident.dlq, 10.0, 1, None).await?;
    let request = || v1::WatchPlanRequest {
        plan_id: plan.plan_id.clone(),
        include_events: false,
    };
    // Without authentication a caller is its address: the crowd is
    // 127.0.0.2, the legitimate user 127.0.0.3.
    let crowd = channels_from(&bed, "127.0.0.2", 4).await?;
    let mut held = Vec::new();
    for index in 0..80 {
        let mut client = v1::planner_client::PlannerClient::new(crowd[index % crowd.len()].clone());
        held.push(client.watch_plan(request()).await?.into_inner());
    }
    let mut client = v1::planner_client::PlannerClient::new(crowd[0].clone());
    let refused = client.watch_plan(request()).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(
        refused.message().contains("--max-watches"),
        "{}",
        refused.message()
    );
    let user = channels_from(&bed, "127.0.0.3", 1).await?;
    let mut user = v1::planner_client::PlannerClient::new(user[0].clone());
    let mut mine = user.watch_plan(request()).await?.into_inner();
    assert_eq!(next_state(&mut mine).await?, PlanState::Canary);
    drop(held);
    bed.finish().await
}
