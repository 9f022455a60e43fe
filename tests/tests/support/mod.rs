//! Helpers shared by the replay test files: an incident made by RabbitMQ,
//! a planner capturing it, a plan approved over it, a recording consumer,
//! and the audit invariant.
#![allow(dead_code)]

use std::{collections::HashMap, net::SocketAddr, time::Duration};

use anyhow::Context as _;

use futures::StreamExt;
use lapin::{
    BasicProperties, ExchangeKind,
    options::BasicConsumeOptions,
    types::{AMQPValue, FieldTable},
};
use redrive_planner::Config;
use redrive_proto::v1::{
    self, ApprovePlanRequest, CreatePlanRequest, GetPlanRequest, PlanState, Rate,
    planner_client::PlannerClient,
};
use redrive_tests::{
    Broker, REDIS_URL, TestBed, amqp_table, amqp_text, stored_total, unique, wait_until,
};
// Re-exported for the files that glob-import this module; not every test
// binary uses them.
#[allow(unused_imports)]
pub use redrive_tests::{precheck, precheck_request};
use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    time::Instant,
};
use tonic::transport::Channel;

/// `message` sent as `actor`: request metadata `x-redrive-actor`, which
/// names the actor when the planner runs without authentication.
pub fn as_actor<T>(actor: &str, message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request
        .metadata_mut()
        .insert("x-redrive-actor", actor.parse().expect("an ASCII actor"));
    request
}

/// A fanout exchange with a work queue (dead-lettering to a DLQ) and a healthy
/// subscriber queue.
#[derive(Clone)]
pub struct Incident {
    pub exchange: String,
    pub work: String,
    pub healthy: String,
    pub dlq: String,
}

pub async fn incident(broker: &Broker, messages: u32) -> anyhow::Result<Incident> {
    incident_named(broker, messages, "").await
}

/// [`incident`] with order and message ids prefixed by `tag` (distinct keys).
pub async fn incident_named(broker: &Broker, messages: u32, tag: &str) -> anyhow::Result<Incident> {
    incident_padded(broker, messages, tag, 0).await
}

/// [`incident_named`] whose bodies carry a `pad` field of `pad` bytes (none
/// when 0): large bodies.
pub async fn incident_padded(
    broker: &Broker,
    messages: u32,
    tag: &str,
    pad: usize,
) -> anyhow::Result<Incident> {
    let incident = Incident {
        exchange: unique("orders"),
        work: unique("work"),
        healthy: unique("healthy"),
        dlq: unique("dlq"),
    };
    declare_incident(broker, incident, messages, tag, pad).await
}

/// [`incident_padded`] with the names of `incident` (the same names on two
/// brokers or vhosts); its dead letter exchange is `{dlq}.dlx`.
pub async fn declare_incident(
    broker: &Broker,
    incident: Incident,
    messages: u32,
    tag: &str,
    pad: usize,
) -> anyhow::Result<Incident> {
    let dlx = format!("{}.dlx", incident.dlq);
    broker
        .exchange(&incident.exchange, ExchangeKind::Fanout)
        .await?;
    broker.exchange(&dlx, ExchangeKind::Fanout).await?;
    broker.queue(&incident.dlq, FieldTable::default()).await?;
    broker.bind(&incident.dlq, &dlx, "").await?;
    broker
        .queue(
            &incident.work,
            amqp_table(vec![("x-dead-letter-exchange", amqp_text(&dlx))]),
        )
        .await?;
    broker
        .queue(&incident.healthy, FieldTable::default())
        .await?;
    broker.bind(&incident.work, &incident.exchange, "").await?;
    broker
        .bind(&incident.healthy, &incident.exchange, "")
        .await?;
    for index in 0..messages {
        let body = if pad == 0 {
            format!(r#"{{"order_id":"{tag}o-{index}","n":{index}}}"#)
        } else {
            format!(
                r#"{{"order_id":"{tag}o-{index}","n":{index},"pad":"{}"}}"#,
                "x".repeat(pad)
            )
        };
        let properties = BasicProperties::default()
            .with_message_id(format!("{tag}m-{index}").into())
            .with_type("order.paid".into())
            .with_content_type("application/json".into())
            .with_headers(amqp_table(vec![
                ("tenant", amqp_text("acme")),
                ("seq", AMQPValue::LongInt(index as i32)),
            ]));
        broker
            .publish(
                &incident.exchange,
                "order.paid",
                body.as_bytes(),
                properties,
            )
            .await?;
    }
    // The broken consumer rejects everything on the work queue.
    let channel = broker.connection.create_channel().await?;
    for _ in 0..messages {
        reject_next(&channel, &incident.work, "the work queue holds the message").await?;
    }
    channel.close(200, "done".into()).await?;
    Ok(incident)
}

/// Takes the next message of `queue` (there must be one: `what` says
/// which) and rejects it without requeueing, as a broken consumer would:
/// the broker dead-letters it.
pub async fn reject_next(channel: &lapin::Channel, queue: &str, what: &str) -> anyhow::Result<()> {
    let delivery = channel
        .basic_get(queue.into(), Default::default())
        .await?
        .expect(what);
    delivery
        .acker
        .reject(lapin::options::BasicRejectOptions { requeue: false })
        .await?;
    Ok(())
}

/// The replay tests' planner settings: capture `dlqs`, key by the body's
/// `order_id`, a 3 s lease.
pub fn capturing(config: &mut Config, dlqs: &[&str]) {
    config.capture_queues = dlqs.iter().map(|dlq| (*dlq).to_owned()).collect();
    config.capture_batch_size = 100;
    config.capture_prefetch = 500;
    config.message_keys = vec!["json:/order_id".to_owned()];
    config.lease_ttl_seconds = 3;
}

/// A [`TestBed`] over `broker` whose planner captures `dlqs`
/// ([`capturing`]), with `messages` of the first of them stored.
pub async fn bed(broker: Broker, dlqs: &[&str], messages: u64) -> anyhow::Result<TestBed> {
    let mut bed = TestBed::start(broker, |config| capturing(config, dlqs)).await?;
    captured(&mut bed.client, dlqs[0], messages).await?;
    Ok(bed)
}

/// An [`incident`] of `messages` and a [`bed`] capturing its DLQ, with all
/// of them stored.
pub async fn incident_bed(messages: u32) -> anyhow::Result<(Incident, TestBed)> {
    let broker = Broker::connect().await?;
    let incident = incident(&broker, messages).await?;
    let bed = bed(broker, &[&incident.dlq], u64::from(messages)).await?;
    Ok((incident, bed))
}

/// Waits at most 30 s until `count` dead letters from `dlq` are stored.
pub async fn captured(
    client: &mut PlannerClient<Channel>,
    dlq: &str,
    count: u64,
) -> anyhow::Result<()> {
    captured_within(client, dlq, count, Duration::from_secs(30)).await
}

/// Waits at most `limit` until `count` dead letters from `dlq` are stored.
pub async fn captured_within(
    client: &mut PlannerClient<Channel>,
    dlq: &str,
    count: u64,
    limit: Duration,
) -> anyhow::Result<()> {
    wait_until("capture", limit, || {
        let mut client = client.clone();
        let dlq = dlq.to_owned();
        async move { Ok(stored_total(&mut client, &dlq).await? >= count) }
    })
    .await
}

/// Precheck → plan → approve; returns the approved plan.
pub async fn approved_plan(
    client: &mut PlannerClient<Channel>,
    dlq: &str,
    per_second: f64,
    burst: u32,
    destination: Option<v1::destination::Mode>,
) -> anyhow::Result<v1::Plan> {
    approved_plan_with(client, dlq, |request| {
        request.rate = Some(Rate {
            per_second,
            burst,
            rationale: "test downstream takes this easily".into(),
        });
        request.destination = destination.map(|mode| v1::Destination { mode: Some(mode) });
    })
    .await
}

/// Precheck of `dlq` → plan → approve, with the plan request shaped by
/// `shape` (by default slices of 50, the default canary, no observation).
pub async fn approved_plan_with(
    client: &mut PlannerClient<Channel>,
    dlq: &str,
    shape: impl FnOnce(&mut CreatePlanRequest),
) -> anyhow::Result<v1::Plan> {
    let report = precheck(client, dlq).await?;
    let mut request = CreatePlanRequest {
        precheck_id: report.precheck_id.clone(),
        slice_size: 50,
        canary_fraction: None,
        observe_for: Some(prost_types::Duration {
            seconds: 0,
            nanos: 0,
        }),
        ..Default::default()
    };
    shape(&mut request);
    let plan = client.create_plan(request).await?.into_inner();
    assert_eq!(plan.state(), PlanState::AwaitingApproval);
    Ok(client
        .approve_plan(ApprovePlanRequest {
            plan_id: plan.plan_id.clone(),
            digest: report.digest,
            ..Default::default()
        })
        .await?
        .into_inner())
}

/// Waits at most `timeout` until plan `plan_id` is completed; returns it.
pub async fn wait_completed(
    client: &mut PlannerClient<Channel>,
    plan_id: &str,
    timeout: Duration,
) -> anyhow::Result<v1::Plan> {
    wait_plan(client, plan_id, PlanState::Completed, "completed", timeout).await
}

/// Waits at most `timeout` until plan `plan_id` is in `state`; returns it.
pub async fn wait_state(
    client: &mut PlannerClient<Channel>,
    plan_id: &str,
    state: PlanState,
    timeout: Duration,
) -> anyhow::Result<v1::Plan> {
    wait_plan(client, plan_id, state, &format!("{state:?}"), timeout).await
}

/// Polls plan `plan_id` every 100 ms until it is in `state` (called `what`
/// in the error when `timeout` runs out first).
async fn wait_plan(
    client: &mut PlannerClient<Channel>,
    plan_id: &str,
    state: PlanState,
    what: &str,
    timeout: Duration,
) -> anyhow::Result<v1::Plan> {
    let deadline = Instant::now() + timeout;
    loop {
        let plan = get_plan(client, plan_id).await?;
        if plan.state() == state {
            return Ok(plan);
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "plan not {what} in {timeout:?}: {:?} {:?}",
            plan.state(),
            plan.counts
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits at most 30 s until plan `plan_id` is aborted; returns it.
pub async fn wait_aborted(
    client: &mut PlannerClient<Channel>,
    plan_id: &str,
) -> anyhow::Result<v1::Plan> {
    wait_state(client, plan_id, PlanState::Aborted, Duration::from_secs(30)).await
}

/// Plan `plan_id` as the planner has it now.
pub async fn get_plan(
    client: &mut PlannerClient<Channel>,
    plan_id: &str,
) -> anyhow::Result<v1::Plan> {
    Ok(client
        .get_plan(GetPlanRequest {
            plan_id: plan_id.to_owned(),
        })
        .await?
        .into_inner())
}

/// Cancels plan `plan_id`, giving `reason`.
pub async fn cancel(
    client: &mut PlannerClient<Channel>,
    plan_id: &str,
    reason: &str,
) -> anyhow::Result<()> {
    client
        .cancel_plan(v1::PlanControlRequest {
            plan_id: plan_id.to_owned(),
            reason: reason.to_owned(),
            ..Default::default()
        })
        .await?;
    Ok(())
}

/// The audit report of plan `plan_id`.
pub async fn audit_report(
    client: &mut PlannerClient<Channel>,
    plan_id: &str,
) -> anyhow::Result<v1::AuditReport> {
    Ok(client
        .get_audit_report(v1::GetAuditReportRequest {
            plan_id: plan_id.to_owned(),
        })
        .await?
        .into_inner())
}

/// A delivery as the consumer saw it.
#[derive(Debug, Clone)]
pub struct Received {
    pub at: Instant,
    pub message_id: String,
    pub body: Vec<u8>,
    pub headers: FieldTable,
    pub properties: BasicProperties,
}

/// A consumer of `queue` on a channel of its own, its tag `name` made
/// unique; acking itself unless `no_ack`.
async fn consumer_of(
    broker: &Broker,
    queue: &str,
    name: &str,
    no_ack: bool,
) -> anyhow::Result<(lapin::Channel, lapin::Consumer)> {
    let channel = broker.connection.create_channel().await?;
    let consumer = channel
        .basic_consume(
            queue.into(),
            unique(name).as_str().into(),
            BasicConsumeOptions {
                no_ack,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await?;
    Ok((channel, consumer))
}

/// Consumes `queue` (auto-ack) into a shared list until the returned token is
/// cancelled.
pub async fn consume(
    broker: &Broker,
    queue: &str,
) -> anyhow::Result<(
    std::sync::Arc<std::sync::Mutex<Vec<Received>>>,
    tokio::task::JoinHandle<()>,
)> {
    let (channel, mut consumer) = consumer_of(broker, queue, "test-consumer", true).await?;
    let received = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = received.clone();
    let task = tokio::spawn(async move {
        let _channel = channel;
        // An error or the end of the stream ends the task, which
        // `stop_consuming` / `assert_consuming` turn into a test failure: a
        // consumer that died silently would make every "nothing arrived"
        // check pass.
        while let Some(delivery) = consumer.next().await {
            let Ok(delivery) = delivery else {
                return;
            };
            sink.lock().unwrap().push(Received {
                at: Instant::now(),
                message_id: delivery
                    .properties
                    .message_id()
                    .as_ref()
                    .map(|id| id.to_string())
                    .unwrap_or_default(),
                body: delivery.data.clone(),
                headers: delivery.properties.headers().clone().unwrap_or_default(),
                properties: delivery.properties.clone(),
            });
        }
    });
    Ok((received, task))
}

/// The most deliveries in any window of `window` (sliding, by receive time).
pub fn most_in_any(received: &[Received], window: Duration) -> usize {
    busiest_window(received, window).map_or(0, |(count, _)| count)
}

/// Where the busiest window of `window` starts (by receive time).
pub fn busiest_window_start(received: &[Received], window: Duration) -> Option<Instant> {
    busiest_window(received, window).map(|(_, start)| start)
}

/// The busiest window of `window`: how many deliveries, and where it starts.
fn busiest_window(received: &[Received], window: Duration) -> Option<(usize, Instant)> {
    let mut times: Vec<Instant> = received.iter().map(|r| r.at).collect();
    times.sort();
    let mut best: Option<(usize, Instant)> = None;
    let mut first = 0;
    for last in 0..times.len() {
        while times[last].duration_since(times[first]) >= window {
            first += 1;
        }
        let count = last - first + 1;
        if best.is_none_or(|(most, _)| count > most) {
            best = Some((count, times[first]));
        }
    }
    best
}

/// [`assert_received_within_audit`] over a pool of `bed`'s database, closed
/// again after the check. Returns the audit's sent and uncertain ids.
pub async fn assert_bed_audit(
    bed: &TestBed,
    plan_id: &str,
    received: &[Received],
) -> anyhow::Result<(Vec<String>, Vec<String>)> {
    let pool = bed.pool().await?;
    let ids = assert_received_within_audit(&pool, plan_id, received).await;
    pool.close().await;
    ids
}

/// Waits at most `timeout` until the consumer has received `count`
/// messages.
pub async fn wait_received(
    received: &std::sync::Arc<std::sync::Mutex<Vec<Received>>>,
    count: usize,
    timeout: Duration,
) -> anyhow::Result<()> {
    wait_until("deliveries", timeout, || {
        let received = received.clone();
        async move { Ok(received.lock().unwrap().len() >= count) }
    })
    .await
}

/// The audit invariant after a replay (DESIGN "Executor loop and
/// guarantees"): every message id the consumer received is `sent` or
/// `uncertain` in the audit of `plan_id`, and an id received twice has an
/// `uncertain` event. Returns the audit's sent and uncertain ids.
pub async fn assert_received_within_audit(
    pool: &sqlx::PgPool,
    plan_id: &str,
    received: &[Received],
) -> anyhow::Result<(Vec<String>, Vec<String>)> {
    let plan_id: uuid::Uuid = plan_id.parse()?;
    let ids = |action: &'static str| {
        sqlx::query_scalar::<_, String>(
            "SELECT DISTINCT d.message_id FROM audit_events e JOIN dead_letters d ON d.id = e.dead_letter_id \
             WHERE e.plan_id = $1 AND e.action = $2 AND d.message_id IS NOT NULL",
        )
        .bind(plan_id)
        .bind(action)
        .fetch_all(pool)
    };
    let sent = ids("sent").await?;
    let uncertain = ids("uncertain").await?;
    let mut copies: HashMap<&str, usize> = HashMap::new();
    for delivery in received {
        *copies.entry(delivery.message_id.as_str()).or_default() += 1;
    }
    for (id, count) in copies {
        let id = id.to_owned();
        anyhow::ensure!(
            sent.contains(&id) || uncertain.contains(&id),
            "{id} reached the consumer but the audit has neither sent nor uncertain for it"
        );
        anyhow::ensure!(
            count == 1 || uncertain.contains(&id),
            "{id} arrived {count} times but the audit never called it uncertain"
        );
    }
    Ok((sent, uncertain))
}

/// A broken consumer of `queue`: rejects (without requeue) everything it
/// gets, so that it dead-letters again; how many it rejected, and its task.
pub async fn reject_all(
    broker: &Broker,
    queue: &str,
) -> anyhow::Result<(
    std::sync::Arc<std::sync::atomic::AtomicUsize>,
    tokio::task::JoinHandle<()>,
)> {
    let (channel, mut consumer) = consumer_of(broker, queue, "broken", false).await?;
    let rejected = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = rejected.clone();
    let task = tokio::spawn(async move {
        let _channel = channel;
        while let Some(Ok(delivery)) = consumer.next().await {
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let _ = delivery
                .acker
                .reject(lapin::options::BasicRejectOptions { requeue: false })
                .await;
        }
    });
    Ok((rejected, task))
}

/// Fails unless the consumer task is still running (a consumer that died
/// would make every "nothing arrived" check pass).
pub fn assert_consuming(consuming: &tokio::task::JoinHandle<()>) -> anyhow::Result<()> {
    anyhow::ensure!(!consuming.is_finished(), "the test consumer stopped early");
    Ok(())
}

/// Ends a consumer of [`consume`], failing the test if it had already
/// stopped (an error or a closed channel) before its test was done with it.
pub fn stop_consuming(consuming: tokio::task::JoinHandle<()>) -> anyhow::Result<()> {
    assert_consuming(&consuming)?;
    consuming.abort();
    Ok(())
}

/// Gives deliveries in flight `settle` to arrive, ends the consumer of
/// [`consume`] (failing if it had stopped early, as [`stop_consuming`]) and
/// returns everything it received.
pub async fn drain(
    received: &std::sync::Mutex<Vec<Received>>,
    consuming: tokio::task::JoinHandle<()>,
    settle: Duration,
) -> anyhow::Result<Vec<Received>> {
    tokio::time::sleep(settle).await;
    stop_consuming(consuming)?;
    Ok(received.lock().unwrap().clone())
}

/// How many copies of each message id the consumer received.
pub fn copies_by_id(received: &[Received]) -> HashMap<String, usize> {
    let mut copies: HashMap<String, usize> = HashMap::new();
    for delivery in received {
        *copies.entry(delivery.message_id.clone()).or_default() += 1;
    }
    copies
}

/// Arguments of a `redrive-executor` process for `planner_url`, the broker
/// at `amqp_url` and the local Redis under `prefix`.
pub fn executor_args(planner_url: &str, amqp_url: &str, prefix: &str) -> Vec<String> {
    [
        "--planner",
        planner_url,
        "--amqp-url",
        amqp_url,
        "--redis-url",
        REDIS_URL,
        "--redis-prefix",
        prefix,
        "--claim-wait-seconds",
        "1",
        "--shutdown-grace-seconds",
        "5",
    ]
    .iter()
    .map(|arg| (*arg).to_owned())
    .collect()
}

/// A port free a moment ago on 127.0.0.1.
pub async fn free_address() -> anyhow::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    Ok(listener.local_addr()?)
}

/// `GET /metrics` over plain HTTP/1.1: the exposition text.
pub async fn scrape_metrics(address: SocketAddr) -> anyhow::Result<String> {
    let mut stream = tokio::net::TcpStream::connect(address).await?;
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: metrics\r\nConnection: close\r\n\r\n")
        .await?;
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await?;
    let answer = String::from_utf8(answer)?;
    let (head, body) = answer
        .split_once("\r\n\r\n")
        .context("an HTTP answer with a body")?;
    anyhow::ensure!(head.starts_with("HTTP/1.1 200"), "answer {head:?}");
    anyhow::ensure!(
        head.to_ascii_lowercase()
            .contains("content-type: text/plain"),
        "the Prometheus text format: {head:?}"
    );
    Ok(body.to_owned())
}

/// The samples of metric `name` in exposition `text`: labels → value.
pub fn metric_samples(text: &str, name: &str) -> Vec<(HashMap<String, String>, f64)> {
    let mut found = Vec::new();
    for line in text.lines() {
        if line.starts_with('#') {
            continue;
        }
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        let (labels, value) = match rest.strip_prefix('{') {
            Some(rest) => match rest.split_once("} ") {
                Some((labels, value)) => (labels, value),
                None => continue,
            },
            None => match rest.strip_prefix(' ') {
                Some(value) => ("", value),
                None => continue,
            },
        };
        let labels = labels
            .split(',')
            .filter_map(|pair| pair.split_once('='))
            .map(|(key, value)| (key.to_owned(), value.trim_matches('"').to_owned()))
            .collect();
        if let Ok(value) = value.trim().parse::<f64>() {
            found.push((labels, value));
        }
    }
    found
}

/// The sum of metric `name`'s samples whose labels include `with` and none
/// of `without`.
pub fn metric_total(text: &str, name: &str, with: &[(&str, &str)], without: &[&str]) -> f64 {
    metric_samples(text, name)
        .into_iter()
        .filter(|(labels, _)| {
            with.iter()
                .all(|(key, value)| labels.get(*key).map(String::as_str) == Some(*value))
                && without.iter().all(|key| !labels.contains_key(*key))
        })
        .map(|(_, value)| value)
        .sum()
}

/// Ingests `items`, failing unless the planner accepted every one.
pub async fn ingest(
    client: &mut PlannerClient<Channel>,
    items: Vec<v1::IngestDeadLettersRequest>,
) -> anyhow::Result<()> {
    let count = items.len() as u64;
    let answer = client
        .ingest_dead_letters(tokio_stream::iter(items))
        .await?
        .into_inner();
    anyhow::ensure!(
        answer.accepted == count && answer.rejected.is_empty(),
        "{answer:?}"
    );
    Ok(())
}

/// The first 1,000 dead letters `selector` lists.
pub async fn list_selected(
    client: &mut PlannerClient<Channel>,
    selector: v1::Selector,
) -> anyhow::Result<Vec<v1::DeadLetter>> {
    Ok(client
        .list_dead_letters(v1::ListDeadLettersRequest {
            selector: Some(selector),
            page_size: 1000,
            page_token: String::new(),
        })
        .await?
        .into_inner()
        .dead_letters)
}

/// The message ids `selector` lists ([`list_selected`]), sorted.
pub async fn listed(
    client: &mut PlannerClient<Channel>,
    selector: v1::Selector,
) -> anyhow::Result<Vec<String>> {
    let mut ids: Vec<String> = list_selected(client, selector)
        .await?
        .into_iter()
        .map(|dead_letter| dead_letter.message_id.unwrap_or_default())
        .collect();
    ids.sort();
    Ok(ids)
}

/// A precheck of `selector` under the planner's policy.
pub async fn precheck_selected(
    client: &mut PlannerClient<Channel>,
    selector: v1::Selector,
) -> anyhow::Result<v1::PrecheckReport> {
    Ok(client
        .run_precheck(v1::RunPrecheckRequest {
            selector: Some(selector),
            options: None,
        })
        .await?
        .into_inner())
}

/// A consumer of `queue` that works for its first `healthy` deliveries (acks
/// them) and then breaks (rejects the rest without requeue, so that they
/// dead-letter again): every delivery's message id with whether it was
/// acked, and its task.
pub async fn breaks_after(
    broker: &Broker,
    queue: &str,
    healthy: usize,
) -> anyhow::Result<(
    std::sync::Arc<std::sync::Mutex<Vec<(String, bool)>>>,
    tokio::task::JoinHandle<()>,
)> {
    let (channel, mut consumer) = consumer_of(broker, queue, "breaking", false).await?;
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = seen.clone();
    let task = tokio::spawn(async move {
        let _channel = channel;
        while let Some(Ok(delivery)) = consumer.next().await {
            let id = delivery
                .properties
                .message_id()
                .as_ref()
                .map(|id| id.to_string())
                .unwrap_or_default();
            let acked = sink.lock().unwrap().len() < healthy;
            sink.lock().unwrap().push((id, acked));
            let _ = if acked {
                delivery.acker.ack(Default::default()).await
            } else {
                delivery
                    .acker
                    .reject(lapin::options::BasicRejectOptions { requeue: false })
                    .await
            };
        }
    });
    Ok((seen, task))
}

/// A consumer of `queue` that records and acks every delivery except the
/// one with message id `poison`, which it rejects without requeue (a
/// consumer still broken for that message: it dead-letters again from
/// `queue`); the deliveries it took, and its task.
pub async fn consume_rejecting(
    broker: &Broker,
    queue: &str,
    poison: &str,
) -> anyhow::Result<(
    std::sync::Arc<std::sync::Mutex<Vec<Received>>>,
    tokio::task::JoinHandle<()>,
)> {
    let (channel, mut consumer) = consumer_of(broker, queue, "rejecting", false).await?;
    let received = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = received.clone();
    let poison = poison.to_owned();
    let task = tokio::spawn(async move {
        let _channel = channel;
        while let Some(Ok(delivery)) = consumer.next().await {
            let message_id = delivery
                .properties
                .message_id()
                .as_ref()
                .map(|id| id.to_string())
                .unwrap_or_default();
            if message_id == poison {
                let _ = delivery
                    .acker
                    .reject(lapin::options::BasicRejectOptions { requeue: false })
                    .await;
                continue;
            }
            sink.lock().unwrap().push(Received {
                at: Instant::now(),
                message_id,
                body: delivery.data.clone(),
                headers: delivery.properties.headers().clone().unwrap_or_default(),
                properties: delivery.properties.clone(),
            });
            let _ = delivery.acker.ack(Default::default()).await;
        }
    });
    Ok((received, task))
}

/// Makes this test's own database plan as a busy one may: `tables`
/// analyzed now and never again (no autovacuum), so their statistics stay
/// those of this moment while the test fills them.
pub async fn keep_statistics_of_now(pool: &sqlx::PgPool, tables: &[&str]) -> anyhow::Result<()> {
    for table in tables {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "ALTER TABLE {table} SET (autovacuum_enabled = false)"
        )))
        .execute(pool)
        .await?;
        sqlx::query(sqlx::AssertSqlSafe(format!("ANALYZE {table}")))
            .execute(pool)
            .await?;
    }
    Ok(())
}
