//! Webhooks (docs/webhooks.md) against the real services: a receiver in
//! the test (hyper on 127.0.0.1:0) verifies every signature with its own
//! HMAC and records what arrives; a precheck, a plan run to completion, a
//! gate's abort and a planner killed with events in its outbox.

use std::{
    collections::{HashMap, HashSet},
    net::SocketAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU16, Ordering},
    },
    time::Duration,
};

use base64::{Engine as _, engine::general_purpose::STANDARD as BASE64};
use futures::StreamExt as _;
use hmac::{Hmac, Mac};
use http_body_util::BodyExt as _;
use redrive_proto::v1::{self, PlanState, planner_client::PlannerClient};
use redrive_tests::{
    AMQP_URL, Broker, ExecutorHandle, TestBed, TestDb, init_logging, scenario::Binaries, wait_until,
};
use serde_json::Value;
use sha2::{Digest as _, Sha256};
use tonic::transport::Channel;

mod support;
use support::*;

/// The planner's secret in these tests (24 random bytes).
const SECRET: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";
/// A plan's own secret (32 bytes).
const PLAN_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw8fWBqkU7I8k=";

/// One request the receiver got.
#[derive(Debug, Clone)]
struct Delivery {
    id: String,
    timestamp: String,
    signature: String,
    body: String,
}

impl Delivery {
    /// The body as JSON.
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).expect("a JSON body")
    }

    /// The event's `type`.
    fn event(&self) -> String {
        self.json()["type"].as_str().unwrap_or_default().to_owned()
    }

    /// Whether a `v1,` signature in `webhook-signature` is the HMAC-SHA256
    /// of `{id}.{timestamp}.{body}` under `secret` (`whsec_<base64>`): the
    /// Standard Webhooks verification, written here without the planner's
    /// code.
    fn verifies_with(&self, secret: &str) -> bool {
        let key = BASE64
            .decode(secret.trim_start_matches("whsec_"))
            .expect("a base64 secret");
        let mut mac = Hmac::<Sha256>::new_from_slice(&key).expect("any key length");
        mac.update(format!("{}.{}.{}", self.id, self.timestamp, self.body).as_bytes());
        let expected = BASE64.encode(mac.finalize().into_bytes());
        self.signature
            .split(' ')
            .filter_map(|signature| signature.strip_prefix("v1,"))
            .any(|signature| signature == expected)
    }
}

/// A webhook receiver on 127.0.0.1: answers `status` (200 unless set) and
/// records every request.
struct Receiver {
    address: SocketAddr,
    status: Arc<AtomicU16>,
    deliveries: Arc<Mutex<Vec<Delivery>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Receiver {
    async fn start() -> anyhow::Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?;
        let status = Arc::new(AtomicU16::new(200));
        let deliveries = Arc::new(Mutex::new(Vec::new()));
        let (answer, record) = (status.clone(), deliveries.clone());
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (answer, record) = (answer.clone(), record.clone());
                let service = hyper::service::service_fn(
                    move |request: hyper::Request<hyper::body::Incoming>| {
                        let (answer, record) = (answer.clone(), record.clone());
                        async move {
                            let header = |name: &str| {
                                request
                                    .headers()
                                    .get(name)
                                    .and_then(|value: &hyper::header::HeaderValue| {
                                        value.to_str().ok()
                                    })
                                    .unwrap_or_default()
                                    .to_owned()
                            };
                            let (id, timestamp, signature) = (
                                header("webhook-id"),
                                header("webhook-timestamp"),
                                header("webhook-signature"),
                            );
                            let body = request.into_body().collect().await?.to_bytes();
                            record.lock().unwrap().push(Delivery {
                                id,
                                timestamp,
                                signature,
                                body: String::from_utf8_lossy(&body).into_owned(),
                            });
                            let mut response =
                                hyper::Response::new(http_body_util::Empty::<bytes::Bytes>::new());
                            *response.status_mut() =
                                hyper::StatusCode::from_u16(answer.load(Ordering::SeqCst))
                                    .unwrap_or(hyper::StatusCode::OK);
                            Ok::<_, hyper::Error>(response)
                        }
                    },
                );
                tokio::spawn(
                    hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service),
                );
            }
        });
        Ok(Self {
            address,
            status,
            deliveries,
            task,
        })
    }

    fn url(&self) -> String {
        format!("http://{}/hooks/redrive", self.address)
    }

    fn answer(&self, status: u16) {
        self.status.store(status, Ordering::SeqCst);
    }

    fn deliveries(&self) -> Vec<Delivery> {
        self.deliveries.lock().unwrap().clone()
    }

    /// Waits until events of every type in `types` arrived (accepted or
    /// not); returns all deliveries.
    async fn wait_for(&self, types: &[&str], timeout: Duration) -> anyhow::Result<Vec<Delivery>> {
        wait_until(&format!("webhook events {types:?}"), timeout, || {
            let seen: HashSet<String> = self.deliveries().iter().map(Delivery::event).collect();
            let done = types.iter().all(|event| seen.contains(*event));
            async move { Ok(done) }
        })
        .await?;
        Ok(self.deliveries())
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The deliveries of one event `type` (each id once: its first delivery).
fn of_type(deliveries: &[Delivery], event: &str) -> Vec<Delivery> {
    let mut seen = HashSet::new();
    deliveries
        .iter()
        .filter(|delivery| delivery.event() == event && seen.insert(delivery.id.clone()))
        .cloned()
        .collect()
}

/// Every delivery verifies with `secret`, none with another secret, and
/// the copies of one id (at least once) carry one body.
fn assert_signed_and_stable(deliveries: &[Delivery], secret: &str) {
    let mut bodies: HashMap<&str, &str> = HashMap::new();
    for delivery in deliveries {
        assert!(delivery.id.starts_with("msg_"), "{delivery:?}");
        assert!(
            delivery.verifies_with(secret),
            "bad signature: {delivery:?}"
        );
        assert!(
            !delivery.verifies_with(PLAN_SECRET) || secret == PLAN_SECRET,
            "a wrong secret must not verify"
        );
        let body = bodies.entry(&delivery.id).or_insert(&delivery.body);
        assert_eq!(*body, delivery.body, "one id, one body");
    }
}

/// Asserts that `ended`'s `report_digest` is the hex SHA-256 of plan
/// `plan_id`'s JSON Lines export as `ExportAudit` streams it (the chunks
/// joined): what a receiver recomputes it from.
async fn assert_digest_recomputes(
    client: &mut PlannerClient<Channel>,
    ended: &Value,
    plan_id: &str,
) -> anyhow::Result<()> {
    let mut chunks = client
        .export_audit(v1::ExportAuditRequest {
            plan_id: plan_id.to_owned(),
            format: v1::ExportFormat::Jsonl.into(),
        })
        .await?
        .into_inner();
    let mut hasher = Sha256::new();
    while let Some(chunk) = chunks.next().await {
        hasher.update(chunk?.data);
    }
    let recomputed = hex::encode(hasher.finalize());
    assert_eq!(
        ended["data"]["report_digest"].as_str(),
        Some(recomputed.as_str()),
        "the digest is the export's SHA-256"
    );
    Ok(())
}

/// A rate the test broker takes easily.
fn rate() -> v1::Rate {
    v1::Rate {
        per_second: 500.0,
        burst: 50,
        rationale: "test downstream takes this easily".into(),
    }
}

/// Sets the planner's webhook to `receiver` with [`SECRET`], retries fast.
fn webhook_to(config: &mut redrive_planner::Config, receiver: &Receiver) {
    config.webhooks.url = Some(receiver.url());
    config.webhooks.secret = Some(SECRET.to_owned());
    config.webhooks.retry_min = Duration::from_millis(200);
}

/// An [`incident`] of `messages` and a bed capturing its DLQ (all of them
/// stored), the planner's webhook to `receiver` ([`webhook_to`]).
async fn webhook_bed(receiver: &Receiver, messages: u32) -> anyhow::Result<(Incident, TestBed)> {
    let broker = Broker::connect().await?;
    let incident = incident(&broker, messages).await?;
    let mut bed = TestBed::start(broker, |config| {
        capturing(config, &[&incident.dlq]);
        webhook_to(config, receiver);
    })
    .await?;
    captured(&mut bed.client, &incident.dlq, u64::from(messages)).await?;
    Ok((incident, bed))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_precheck_a_plan_and_its_completion_are_told_signed_once_per_id() -> anyhow::Result<()> {
    init_logging();
    let receiver = Receiver::start().await?;
    let plan_receiver = Receiver::start().await?;
    // The first attempt of every event is refused: each is delivered again,
    // with the same id and body.
    receiver.answer(503);
    let (incident, mut bed) = webhook_bed(&receiver, 40).await?;
    let (received, consuming) = consume(bed.broker(), &incident.work).await?;
    // A bad secret is refused by name, never quoted.
    let refused = approved_plan_with(&mut bed.client, &incident.dlq, |request| {
        request.rate = Some(rate());
        request.webhook_url = plan_receiver.url();
        request.webhook_secret = "whsec_hunter2".into();
    })
    .await
    .unwrap_err()
    .to_string();
    assert!(
        refused.contains("webhook_secret") && !refused.contains("hunter2"),
        "{refused}"
    );
    let plan = approved_plan_with(&mut bed.client, &incident.dlq, |request| {
        request.rate = Some(rate());
        request.webhook_url = plan_receiver.url();
        request.webhook_secret = PLAN_SECRET.into();
    })
    .await?;
    assert_eq!(plan.webhook_url, plan_receiver.url());
    assert!(plan.webhook_secret_set, "GetPlan says a secret is set");
    receiver
        .wait_for(
            &["precheck.finished", "plan.created"],
            Duration::from_secs(30),
        )
        .await?;
    receiver.answer(200);

    let executor = ExecutorHandle::start(bed.executor_config());
    let done = wait_completed(&mut bed.client, &plan.plan_id, Duration::from_secs(60)).await?;
    let deliveries = receiver
        .wait_for(&["plan.ended"], Duration::from_secs(30))
        .await?;
    executor.stop().await?;
    let received = drain(&received, consuming, Duration::from_millis(300)).await?;
    assert_eq!(received.len(), 40);
    assert_bed_audit(&bed, &plan.plan_id, &received).await?;

    assert_signed_and_stable(&deliveries, SECRET);
    // Two prechecks (one plan refused, one made) and the plan's events.
    let prechecks = of_type(&deliveries, "precheck.finished");
    assert_eq!(prechecks.len(), 2, "{deliveries:#?}");
    let precheck = prechecks[1].json();
    assert_eq!(precheck["data"]["state"], "done");
    assert_eq!(precheck["data"]["counts"]["replayable"], 40);
    assert_eq!(
        precheck["data"]["digest"].as_str(),
        Some(done.precheck_digest.as_str())
    );
    let created = of_type(&deliveries, "plan.created");
    assert_eq!(created.len(), 1, "one plan created: {deliveries:#?}");
    assert_eq!(created[0].json()["data"]["state"], "awaiting_approval");
    let ended = of_type(&deliveries, "plan.ended");
    assert_eq!(ended.len(), 1);
    let ended = ended[0].json();
    assert_eq!(ended["data"]["plan_id"], plan.plan_id.as_str());
    assert_eq!(ended["data"]["state"], "completed");
    assert_eq!(ended["data"]["counts"]["sent"], 40);
    assert!(
        ended["timestamp"]
            .as_str()
            .is_some_and(|at| at.ends_with('Z'))
    );
    // The digest, recomputed from the API as a receiver would.
    assert_digest_recomputes(&mut bed.client, &ended, &plan.plan_id).await?;
    // Every first attempt was refused: each id arrived at least twice.
    let mut copies: HashMap<String, usize> = HashMap::new();
    for delivery in &deliveries {
        *copies.entry(delivery.id.clone()).or_default() += 1;
    }
    for delivery in created.iter().chain(&prechecks) {
        assert!(copies[&delivery.id] >= 2, "{} retried", delivery.id);
    }
    // The plan's own target got the plan's events after its creation,
    // signed with its own secret, not the planner's.
    let own = plan_receiver
        .wait_for(&["plan.ended"], Duration::from_secs(30))
        .await?;
    assert_signed_and_stable(&own, PLAN_SECRET);
    assert!(own.iter().all(|delivery| !delivery.verifies_with(SECRET)));
    bed.finish().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_gate_abort_is_told_as_a_trip_and_an_end() -> anyhow::Result<()> {
    init_logging();
    let receiver = Receiver::start().await?;
    let (incident, mut bed) = webhook_bed(&receiver, 100).await?;
    // The consumer is still broken: what is replayed dead-letters again
    // into the captured DLQ, and the canary gate aborts the plan.
    let (_, rejecting) = reject_all(bed.broker(), &incident.work).await?;
    let plan = approved_plan_with(&mut bed.client, &incident.dlq, |request| {
        request.rate = Some(rate());
        request.observe_for = Some(prost_types::Duration {
            seconds: 10,
            nanos: 0,
        });
    })
    .await?;
    let executor = ExecutorHandle::start(bed.executor_config());
    let aborted = wait_aborted(&mut bed.client, &plan.plan_id).await?;
    let deliveries = receiver
        .wait_for(
            &["plan.gate_tripped", "plan.ended"],
            Duration::from_secs(30),
        )
        .await?;
    executor.stop().await?;
    rejecting.abort();
    assert_signed_and_stable(&deliveries, SECRET);
    let tripped = of_type(&deliveries, "plan.gate_tripped");
    assert_eq!(tripped.len(), 1, "{deliveries:#?}");
    let tripped = tripped[0].json();
    assert_eq!(tripped["data"]["actor"], "redrive-gate");
    assert_eq!(tripped["data"]["state"], "aborted");
    assert_eq!(
        tripped["data"]["reason"].as_str(),
        Some(aborted.state_reason.as_str())
    );
    let ended = of_type(&deliveries, "plan.ended")[0].json();
    assert_eq!(ended["data"]["state"], "aborted");
    // The audit was closed (no lease) when the digest was taken.
    assert_digest_recomputes(&mut bed.client, &ended, &plan.plan_id).await?;
    assert!(of_type(&deliveries, "plan.paused").is_empty());
    bed.finish().await
}

/// `redrive-planner` as a child process over `db`, capturing `dlq`, its
/// webhook to `receiver` (the secret in `secret_file`); killed on drop.
fn spawn_planner(
    db: &TestDb,
    dlq: &str,
    listen: SocketAddr,
    receiver: &Receiver,
    secret_file: &std::path::Path,
) -> anyhow::Result<tokio::process::Child> {
    let binaries = Binaries::of_tests()?;
    let listen = listen.to_string();
    let url = receiver.url();
    let args = [
        "--listen",
        &listen,
        "--database-url",
        &db.url(),
        "--amqp-url",
        AMQP_URL,
        "--broker-id",
        "redrive-tests",
        "--capture-queue",
        dlq,
        "--message-key",
        "json:/order_id",
        "--webhook-url",
        &url,
        "--webhook-secret-file",
        secret_file.to_str().unwrap_or_default(),
        "--webhook-retry-min",
        "200ms",
    ];
    Ok(tokio::process::Command::new(&binaries.planner)
        .args(args)
        .env("REDRIVE_LOG", "warn")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()?)
}

/// A client of the planner at `address`, once it serves (its database
/// ready; 30 s at most).
async fn client_of(address: SocketAddr) -> anyhow::Result<PlannerClient<Channel>> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(mut client) = PlannerClient::connect(format!("http://{address}")).await
            && client
                .list_plans(v1::ListPlansRequest::default())
                .await
                .is_ok()
        {
            return Ok(client);
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "the planner at {address} did not answer within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn events_in_the_outbox_survive_a_killed_planner() -> anyhow::Result<()> {
    init_logging();
    let receiver = Receiver::start().await?;
    receiver.answer(503);
    let secret_file = tempfile::NamedTempFile::new()?;
    std::fs::write(secret_file.path(), format!("{SECRET}\n"))?;
    let broker = Broker::connect().await?;
    let incident = incident(&broker, 5).await?;
    let db = TestDb::new();
    let listen = free_address().await?;
    let mut planner = spawn_planner(&db, &incident.dlq, listen, &receiver, secret_file.path())?;
    let mut client = client_of(listen).await?;
    captured(&mut client, &incident.dlq, 5).await?;
    let plan = approved_plan(&mut client, &incident.dlq, 10.0, 1, None).await?;
    for (state, control) in [
        ("pause", PlanState::Paused),
        ("cancel", PlanState::Cancelled),
    ] {
        let request = v1::PlanControlRequest {
            plan_id: plan.plan_id.clone(),
            reason: format!("{state} for the crash test"),
            ..Default::default()
        };
        let moved = if control == PlanState::Paused {
            client.pause_plan(request).await?
        } else {
            client.cancel_plan(request).await?
        };
        assert_eq!(moved.into_inner().state(), control);
    }
    // Killed right after the last state change, everything refused so far.
    planner.start_kill()?;
    planner.wait().await?;
    let refused = receiver.deliveries().len();
    receiver.answer(200);
    let mut planner = spawn_planner(&db, &incident.dlq, listen, &receiver, secret_file.path())?;
    let expected = [
        "precheck.finished",
        "plan.created",
        "plan.paused",
        "plan.ended",
    ];
    let deliveries = receiver
        .wait_for(&expected, Duration::from_secs(60))
        .await?;
    let pool = db.pool().await?;
    wait_until(
        "every outbox row delivered",
        Duration::from_secs(30),
        || {
            let pool = pool.clone();
            async move {
                let pending: i64 = sqlx::query_scalar(
                    "SELECT count(*) FROM webhook_deliveries WHERE state <> 'delivered'",
                )
                .fetch_one(&pool)
                .await?;
                Ok(pending == 0)
            }
        },
    )
    .await?;
    let stored: Vec<String> = sqlx::query_scalar("SELECT webhook_id FROM webhook_deliveries")
        .fetch_all(&pool)
        .await?;
    pool.close().await;
    let deliveries = [deliveries, receiver.deliveries()].concat();
    assert_signed_and_stable(&deliveries, SECRET);
    let arrived: HashSet<&str> = deliveries.iter().map(|d| d.id.as_str()).collect();
    assert_eq!(
        stored.len(),
        expected.len(),
        "one row per event: {stored:?}"
    );
    assert!(
        stored.iter().all(|id| arrived.contains(id.as_str())),
        "none lost: {stored:?} vs {arrived:?}"
    );
    for event in expected {
        assert_eq!(of_type(&deliveries, event).len(), 1, "{event} once");
    }
    let ended = of_type(&deliveries, "plan.ended")[0].json();
    assert_eq!(ended["data"]["state"], "cancelled");
    assert_eq!(ended["data"]["reason"], "cancel for the crash test");
    let mut client = client_of(listen).await?;
    assert_digest_recomputes(&mut client, &ended, &plan.plan_id).await?;
    eprintln!(
        "{refused} attempts refused before the kill; {} requests in all",
        deliveries.len()
    );
    planner.start_kill()?;
    planner.wait().await?;
    broker.cleanup().await;
    db.drop_database().await;
    Ok(())
}
