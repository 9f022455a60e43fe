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
        config.max_unauthenticated_connections_per_peer = 16;
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
        config.max_unauthenticated_connections = 8;
        config.first_request_timeout_seconds = 2;
    })
    .await?;
    // The bed's own client holds one place; fill the other seven, one per
    // address (so that no peer holds more than a newcomer's and none gives
    // its place up).
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

/// Connections that never speak, from `addresses` addresses of 127/8
/// (127.0.0.2 on), `per_address` at a time from each, each opened again
/// `reconnect_after` after the planner closes it; on a runtime of their own
/// (as another process would be). Dropping it stops them.
struct SilentCrowd {
    stop: tokio_util::sync::CancellationToken,
    open: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl SilentCrowd {
    fn start(
        planner: std::net::SocketAddr,
        addresses: u8,
        per_address: usize,
        reconnect_after: Duration,
    ) -> Self {
        let stop = tokio_util::sync::CancellationToken::new();
        let open = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let thread = {
            let stop = stop.clone();
            let open = std::sync::Arc::clone(&open);
            std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(1)
                    .enable_all()
                    .build()
                    .expect("a runtime");
                runtime.block_on(async move {
                    let mut tasks = tokio::task::JoinSet::new();
                    for address in 0..addresses {
                        let local = format!("127.0.0.{}", 2 + address);
                        for _ in 0..per_address {
                            let (stop, open, local) =
                                (stop.clone(), std::sync::Arc::clone(&open), local.clone());
                            tasks.spawn(async move {
                                while !stop.is_cancelled() {
                                    if let Ok(mut stream) = connect_from(&local, planner).await {
                                        open.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                                        let mut byte = [0_u8; 1];
                                        tokio::select! {
                                            _ = stream.read(&mut byte) => {}
                                            () = stop.cancelled() => {}
                                        }
                                        open.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
                                    } else {
                                        tokio::time::sleep(Duration::from_millis(10)).await;
                                    }
                                    tokio::select! {
                                        () = tokio::time::sleep(reconnect_after) => {}
                                        () = stop.cancelled() => {}
                                    }
                                }
                            });
                        }
                    }
                    while tasks.join_next().await.is_some() {}
                });
            })
        };
        Self {
            stop,
            open,
            thread: Some(thread),
        }
    }

    /// How many of its connections are open now.
    fn open(&self) -> usize {
        self.open.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl Drop for SilentCrowd {
    fn drop(&mut self) {
        self.stop.cancel();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The probe's attack on connection places (issue 28), against a planner
/// set up as docs/security.md recommends (TLS, client certificates,
/// defaults for every cap): 1,000 connections from 20 addresses that never
/// speak (not even a TLS hello), each opened again as soon as the planner
/// closes it; then again with each opened 1 s after. A legitimate client,
/// connecting afresh each time with its certificate, gets its answer
/// within 1 s at least 39 times out of 40 (before, 3 and 7 times).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_connections_from_twenty_addresses_leave_room_for_a_legitimate_client()
-> anyhow::Result<()> {
    init_logging();
    let bed = TestBed::start_secure(None, redrive_tests::pki::Pki::new()?, |_| {}).await?;
    for reconnect_after in [Duration::ZERO, Duration::from_secs(1)] {
        let crowd = SilentCrowd::start(bed.planner.addr, 20, 50, reconnect_after);
        // The crowd takes every place it can: the unauthenticated pool
        // (256 by default, 16 per address) fills within a moment.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while crowd.open() < 250 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the crowd never held the pool: {} open",
                crowd.open()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let mut served = 0;
        let mut held = Vec::new();
        let mut failures = Vec::new();
        let mut took = Vec::new();
        for _ in 0..40 {
            held.push(crowd.open());
            let started = std::time::Instant::now();
            let attempt = tokio::time::timeout(Duration::from_secs(1), async {
                let mut client = redrive_proto::v1::planner_client::PlannerClient::new(
                    bed.planner.channel().await?,
                );
                client.list_plans(v1::ListPlansRequest::default()).await?;
                anyhow::Ok(())
            })
            .await;
            took.push(started.elapsed());
            match attempt {
                Ok(Ok(())) => served += 1,
                Ok(Err(error)) => failures.push(format!("{error:#}")),
                Err(_) => failures.push("no answer within 1 s".to_owned()),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        held.sort_unstable();
        let median = held[held.len() / 2];
        drop(crowd);
        took.sort_unstable();
        eprintln!(
            "reconnecting after {reconnect_after:?}: served {served}/40 while the crowd held \
             {median} (median); answer time median {:?}, slowest {:?}",
            took[took.len() / 2],
            took[took.len() - 1]
        );
        assert!(
            median >= 200,
            "the attack was real: the crowd held {median} connections (median) while the client tried"
        );
        assert!(
            served >= 39,
            "reconnecting after {reconnect_after:?}: the legitimate client was served {served} times \
             of 40 while the crowd held {median} connections; failures: {failures:?}"
        );
    }
    bed.finish().await
}
