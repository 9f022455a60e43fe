//! What one caller may take of the planner (issue 15, "Abuse and limits"),
//! against a real planner: idle connections from one peer cannot make it
//! unreachable for another, a caller over its request rate is refused
//! while health checks still answer, and open `WatchPlan` streams are
//! capped per caller.

use std::time::Duration;

use redrive_proto::v1::{self, PlanState};
use redrive_tests::{Broker, TestBed, init_logging};
use tokio::{io::AsyncReadExt, net::TcpSocket};
use tonic::Code;

mod support;
use support::*;

/// A TCP connection to `planner` from `local` (any address of 127/8 is
/// this host, so 127.0.0.2 is another peer for the planner).
async fn connect_from(
    local: &str,
    planner: std::net::SocketAddr,
) -> std::io::Result<tokio::net::TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(format!("{local}:0").parse().expect("an address"))?;
    socket.connect(planner).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn idle_connections_from_one_peer_do_not_lock_out_another() -> anyhow::Result<()> {
    init_logging();
    let bed = TestBed::without_broker(|config| {
        config.max_connections_per_peer = 16;
    })
    .await?;
    // 300 connections that never speak, from 127.0.0.2.
    let mut idle = Vec::new();
    for _ in 0..300 {
        idle.push(connect_from("127.0.0.2", bed.planner.addr).await?);
    }
    // The planner closed all but 16 of them at once.
    let mut closed = 0;
    for stream in &mut idle {
        let mut byte = [0_u8; 1];
        if let Ok(Ok(0) | Err(_)) =
            tokio::time::timeout(Duration::from_millis(200), stream.read(&mut byte)).await
        {
            closed += 1;
        }
    }
    assert_eq!(closed, 300 - 16, "all but the per-peer cap are closed");
    // Another peer (127.0.0.1) is served at once.
    let mut client = bed.planner.client().await?;
    let listed = tokio::time::timeout(
        Duration::from_secs(5),
        client.list_plans(v1::ListPlansRequest::default()),
    )
    .await?;
    assert!(listed.is_ok(), "{listed:?}");
    drop(idle);
    bed.finish().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_caller_over_its_request_rate_is_refused_and_health_still_answers() -> anyhow::Result<()>
{
    init_logging();
    let bed = TestBed::without_broker(|config| {
        config.requests_per_second = 1;
        config.request_burst = 5;
    })
    .await?;
    let mut client = bed.planner.client().await?;
    let mut refused = None;
    for call in 0..20 {
        if let Err(status) = client.list_plans(v1::ListPlansRequest::default()).await {
            refused = Some((call, status));
            break;
        }
    }
    let (call, status) = refused.expect("a call over the rate is refused");
    assert!(
        call >= 4,
        "the burst is allowed first (refused at call {call})"
    );
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(
        status.message().contains("rate limit"),
        "{}",
        status.message()
    );
    let mut health =
        tonic_health::pb::health_client::HealthClient::new(bed.planner.channel().await?);
    for _ in 0..10 {
        health
            .check(tonic_health::pb::HealthCheckRequest::default())
            .await?;
    }
    bed.finish().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn watch_streams_are_capped_per_caller_and_a_closed_one_frees_its_place() -> anyhow::Result<()>
{
    init_logging();
    let broker = Broker::connect().await?;
    let incident = incident(&broker, 2).await?;
    let mut bed = TestBed::start(broker, |config| {
        capturing(config, &[&incident.dlq]);
        config.max_watches_per_principal = 2;
    })
    .await?;
    captured(&mut bed.client, &incident.dlq, 2).await?;
    let plan = approved_plan(&mut bed.client, &incident.dlq, 10.0, 1, None).await?;
    assert_eq!(plan.state(), PlanState::Canary);
    let watch = || v1::WatchPlanRequest {
        plan_id: plan.plan_id.clone(),
        include_events: true,
    };
    let first = bed.client.watch_plan(watch()).await?.into_inner();
    let _second = bed.client.watch_plan(watch()).await?.into_inner();
    let refused = bed.client.watch_plan(watch()).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(
        refused.message().contains("WatchPlan"),
        "{}",
        refused.message()
    );
    drop(first);
    // The server frees the place when it sees the stream cancelled.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        match bed.client.watch_plan(watch()).await {
            Ok(_third) => break,
            Err(status) if status.code() == Code::ResourceExhausted => {
                assert!(tokio::time::Instant::now() < deadline, "place never freed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(status) => return Err(status.into()),
        }
    }
    bed.finish().await
}

/// The breaker's attack on the total cap: HTTP/2 clients that connect from
/// several addresses, answer the server's keepalive pings (as every HTTP/2
/// client does by itself) and never make a request. They are closed after
/// the first-request timeout, so the total cap does not stay full and
/// another caller gets in.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn silent_http2_clients_are_closed_after_the_first_request_timeout() -> anyhow::Result<()> {
    init_logging();
    let bed = TestBed::without_broker(|config| {
        config.max_connections = 8;
        config.first_request_timeout_seconds = 2;
    })
    .await?;
    // The bed's own client holds one place; fill the other seven.
    let mut silent = Vec::new();
    for last in 2..9 {
        let endpoint = tonic::transport::Endpoint::from_shared(bed.planner.url())?
            .local_address(Some(std::net::IpAddr::from([127, 0, 0, last])));
        silent.push(endpoint.connect().await?);
    }
    let fresh = || async {
        let channel = tonic::transport::Endpoint::from_shared(bed.planner.url())?
            .local_address(Some(std::net::IpAddr::from([127, 0, 0, 20])))
            .connect()
            .await?;
        let mut client = redrive_proto::v1::planner_client::PlannerClient::new(channel);
        anyhow::Ok(
            tokio::time::timeout(
                Duration::from_secs(2),
                client.list_plans(v1::ListPlansRequest::default()),
            )
            .await,
        )
    };
    // Full now: a new caller is turned away.
    let refused = fresh().await;
    assert!(
        !matches!(refused, Ok(Ok(Ok(_)))),
        "the total cap is full: {refused:?}"
    );
    // After the first-request timeout the silent ones are gone.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let served = fresh().await?;
    assert!(matches!(served, Ok(Ok(_))), "{served:?}");
    drop(silent);
    bed.finish().await
}
