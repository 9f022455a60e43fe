//! The planner's background work: started once the database is ready
//! (health reports, plan counts, the notifier's listener, the canary gates,
//! webhook deliveries, retention, capture), owned in [`Background`], and drained within the
//! shutdown grace ([`stop_within_grace`]).

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use redrive_proto::v1::{coordinator_server::CoordinatorServer, planner_server::PlannerServer};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::{
    Config,
    audit::notifier::Notifier,
    capture::{self, CaptureConfig, CaptureStatus},
    dead_letters,
    edge::grpc::{CoordinatorGrpc, PlannerGrpc},
    health::report_health,
    metrics, plan,
    store::{Store, sources::ReadingsFor},
    webhooks,
};

/// The planner's background tasks, owned so that shutdown drains them:
/// capture, the notifier's listener and the rest (health reports, plan
/// counts, the canary gates, retention). Each ends with `shutdown`.
#[derive(Default)]
pub(crate) struct Background {
    /// Capture: stores and acks what it holds when shutdown comes.
    capture: Option<tokio::task::JoinHandle<()>>,
    /// The notifier's `LISTEN` connection: watches need it until the
    /// server has stopped.
    listening: Option<tokio::task::JoinHandle<()>>,
    /// Health reports, plan counts, the canary gates and retention.
    others: tokio::task::JoinSet<()>,
    /// Why a background task stopped the planner, if one did: the
    /// planner exits with it.
    fatal: Arc<std::sync::OnceLock<String>>,
}

/// Once the database is ready: marks the services `SERVING` and starts the
/// background work (health reports, plan counts, the notifier's listener,
/// the canary gates, the webhook deliverer, retention when set, capture), every task ending with
/// `shutdown`.
pub(crate) async fn start_background(
    config: &Config,
    store: Store,
    health_reporter: tonic_health::server::HealthReporter,
    capture_status: CaptureStatus,
    rules: Arc<dead_letters::ExtractionRules>,
    notifier: Notifier,
    shutdown: &CancellationToken,
) -> Background {
    health_reporter
        .set_serving::<PlannerServer<PlannerGrpc>>()
        .await;
    health_reporter
        .set_serving::<CoordinatorServer<CoordinatorGrpc>>()
        .await;
    // The API serves from here on; readiness (`grpc.health.v1`'s "") also
    // waits for every capture queue's consumer, said by `report_health`.
    info!("planner serving its API");
    let mut others = tokio::task::JoinSet::new();
    others.spawn(report_health(
        store.clone(),
        capture_status.clone(),
        health_reporter,
        shutdown.clone(),
    ));
    others.spawn(count_plans(store.clone(), shutdown.clone()));
    others.spawn(expire_idempotency_keys(store.clone(), shutdown.clone()));
    others.spawn(count_sources(
        store.clone(),
        capture_status.clone(),
        shutdown.clone(),
    ));
    let listening = tokio::spawn(notifier.listen(store.clone(), shutdown.clone()));
    others.spawn(plan::gates::run(store.clone(), shutdown.clone()));
    if let Some(retention) = config.retention {
        others.spawn(dead_letters::housekeeping::run_retention(
            store.clone(),
            retention,
            shutdown.clone(),
        ));
    }
    let capture = tokio::spawn(capture::run(
        CaptureConfig {
            amqp: config.amqp.nodes(),
            queues: config.capture_queues.clone(),
            prefetch: config.capture_prefetch,
            batch_size: config.capture_batch_size,
            batch_bytes: config.capture_batch_bytes,
            batch_wait: config.capture_batch_wait(),
            reconnect_max: config.capture_reconnect_max(),
            rules,
            guard: config.capture_guard,
            status: capture_status,
        },
        store,
        shutdown.clone(),
    ));
    Background {
        capture: Some(capture),
        listening: Some(listening),
        others,
        fatal: Arc::default(),
    }
}

impl Background {
    /// Starts the audit log's sequencer (sealing rounds, checkpoints, the
    /// witness); it stops the planner when the log is signed and the
    /// planner has no key ([`crate::audit::log::KEYLESS_ON_SIGNED_LOG`]).
    pub(crate) fn seal_audit_log(
        &mut self,
        store: Store,
        log: crate::audit::log::AuditLog,
        shutdown: &CancellationToken,
    ) {
        self.others.spawn(crate::audit::log::run(
            store,
            log,
            shutdown.clone(),
            Arc::clone(&self.fatal),
        ));
    }

    /// Starts the webhook deliverer ([`webhooks::deliver::run`]) over
    /// `store` with `delivery`, ending with `shutdown` (its attempts under
    /// way end within their timeout, inside the grace period).
    pub(crate) fn deliver_webhooks(
        &mut self,
        store: Store,
        delivery: webhooks::deliver::Delivery,
        shutdown: &CancellationToken,
    ) {
        self.others
            .spawn(webhooks::deliver::run(store, delivery, shutdown.clone()));
    }
}

/// Waits for `shutdown`, then gives open calls (WatchPlan streams, claim long
/// polls, ReplayDeadLetter waits) the grace period to end before cutting
/// them: a client that keeps a stream open must not keep the planner alive.
/// Then stops the listener and gives capture (which stores and acks what it
/// holds) and the other background tasks one more grace period to end;
/// what is still running then is aborted, with a warning.
///
/// # Errors
/// The server failing, or its task panicking.
pub(crate) async fn stop_within_grace(
    config: &Config,
    mut server: tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
    background: Background,
    shutdown: &CancellationToken,
) -> anyhow::Result<()> {
    let grace = Duration::from_secs(config.shutdown_grace_seconds);
    let grace_after_shutdown = async {
        shutdown.cancelled().await;
        tokio::time::sleep(grace).await;
    };
    tokio::select! {
        served = &mut server => served??,
        () = grace_after_shutdown => {
            warn!(
                grace_seconds = config.shutdown_grace_seconds,
                "open calls did not end within the grace period: cut"
            );
            server.abort();
        }
    }
    let Background {
        capture,
        listening,
        mut others,
        fatal,
    } = background;
    if let Some(listening) = listening {
        listening.abort();
    }
    let drained = async {
        if let Some(capture) = capture {
            let _ = capture.await;
        }
        while others.join_next().await.is_some() {}
    };
    if tokio::time::timeout(grace, drained).await.is_err() {
        warn!(
            grace_seconds = config.shutdown_grace_seconds,
            "capture or a background task did not stop within the grace period: aborted"
        );
        others.abort_all();
    }
    match fatal.get() {
        Some(why) => anyhow::bail!("{why}"),
        None => Ok(()),
    }
}

/// Keeps the `redrive.planner.plans` gauge current: counts the plans in
/// each state every [`metrics::PLANS_COUNT_INTERVAL`]. A count that fails
/// (PostgreSQL away) leaves the last figures; health reports the outage.
async fn count_plans(store: Store, shutdown: CancellationToken) {
    loop {
        match store.count_plans_by_state().await {
            Ok(counts) => {
                let counts: Vec<_> = counts
                    .into_iter()
                    .map(|(state, count)| (state.get(), count))
                    .collect();
                store.metrics().plans_counted(&counts);
            }
            Err(error) => debug!(%error, "counting plans by state failed"),
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(metrics::PLANS_COUNT_INTERVAL) => {}
        }
    }
}

/// Keeps the source gauges and `redrive.planner.plans.stalled` current
/// (docs/operating.md, "Alerts"): every
/// [`metrics::SOURCES_COUNT_INTERVAL`], records each capture queue's depth
/// as capture last read it and counts the stalled plans in PostgreSQL; the
/// dead letters per source and reason class are counted then too, or
/// later after a long count ([`metrics::next_sources_count`]: the count
/// scans every dead letter stored). A count that fails (PostgreSQL away)
/// leaves the last figures of that count (health reports the outage) and is
/// tried again at the next tick; the depths are recorded all the same.
async fn count_sources(store: Store, capture_status: CaptureStatus, shutdown: CancellationToken) {
    let queues: Vec<String> = capture_status.queues().map(str::to_owned).collect();
    store.metrics().capture_queues_known(&queues);
    let mut readings = None;
    let mut readings_due = Instant::now();
    loop {
        let depths: Vec<(String, Option<u64>)> = queues
            .iter()
            .map(|queue| (queue.clone(), capture_status.depth(queue)))
            .collect();
        store.metrics().depths_read(&depths);
        if Instant::now() >= readings_due {
            let started = Instant::now();
            match store.source_readings(ReadingsFor::Gauges).await {
                Ok((read, took)) => {
                    readings = Some(read);
                    readings_due = metrics::next_sources_count(started, took);
                }
                Err(error) => debug!(%error, "counting dead letters per source failed"),
            }
        }
        // Recorded at every tick, so that the oldest open age grows with
        // the clock between two counts.
        if let Some(readings) = &readings {
            store
                .metrics()
                .sources_counted(readings, chrono::Utc::now());
        }
        match store.stalled_plans(metrics::STALL_AFTER).await {
            Ok(stalled) => store.metrics().stalled_counted(stalled),
            Err(error) => debug!(%error, "counting stalled plans failed"),
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(metrics::SOURCES_COUNT_INTERVAL) => {}
        }
    }
}

/// Deletes the idempotency keys past their retention
/// ([`crate::edge::idempotency::RETENTION`]) every 10 minutes, so that the
/// table holds about one day of mutating calls.
async fn expire_idempotency_keys(store: Store, shutdown: CancellationToken) {
    loop {
        if let Err(error) = store
            .expire_idempotency_keys(crate::edge::idempotency::RETENTION)
            .await
        {
            debug!(%error, "expiring idempotency keys failed");
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(Duration::from_secs(600)) => {}
        }
    }
}
