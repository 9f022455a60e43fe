//! The executor loop (docs/design.md, "Executor loop and guarantees"): claim a slice
//! (long poll), hold its [`Lease`], and publish its items as a short pipeline
//! per run of items bound for one destination:
//!
//! 1. drop what is decided without publishing: a key the planner already
//!    saw replayed, an item past its deadline (`skipped_stale`), an item the
//!    owning service now blocks (state re-check through the planner);
//! 2. wait for room in the confirm window, pay any token debt (late or lost
//!    confirms, [`crate::outcomes`]), then take the run's tokens;
//! 3. read the replay keys in Redis (a concurrent plan may have sent a key);
//! 4. publish at once, each message only while [`Lease::may_publish`] holds
//!    and while its token is fresh: a token is never spent after an
//!    interruption (a reconnect, a stall, a lost lease).
//!
//! Confirms go to the slice's [`Collector`], which reports outcomes and sends
//! retries back. Every wait (window, tokens, state re-check, Redis, backoff)
//! also waits for [`Lease::stopped`], so a cancel, pause, gate abort, lost
//! lease or SIGTERM ends publishing at once; what was already handed to the
//! broker (at most the window) is still confirmed and reported.

mod filters;
mod pace;
mod pipeline;
mod slice;
#[cfg(test)]
mod tests;

use std::{sync::Arc, time::Duration};

use redrive_proto::{
    amqp_nodes::AmqpNodes,
    backoff::Backoff,
    v1::{self, coordinator_client::CoordinatorClient},
};
use tokio::{task::JoinSet, time::Instant};
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;
use tracing::{info, warn};

pub use crate::loop_failures::LoopFailures;
use crate::{
    bucket::Bucket,
    health::Heartbeat,
    metrics::ExecutorMetrics,
    outcomes::TokenDebt,
    publisher::{AmqpConnect, Connect, Publish, PublisherOptions},
    replay_keys::ReplayKeys,
};

pub use pace::{TOKEN_SPEND_LIMIT, mark_lookahead, run_size};

/// What the loop needs.
#[derive(Clone)]
pub struct WorkerSettings {
    /// This executor's id in leases and audit events.
    pub executor_id: String,
    /// The broker's node URLs (round robin, [`AmqpConnect`]); each slice
    /// loop goes round them on its own.
    pub amqp: AmqpNodes,
    /// The publisher's window, confirm timeout and heartbeat.
    pub publisher: PublisherOptions,
    /// Attempts before a nacked item is `failed`.
    pub max_attempts: u32,
    /// Long-poll wait of a claim.
    pub claim_wait: Duration,
    /// The planner's URL, named when a claim fails.
    pub planner: String,
    /// Redis's addresses, passwords redacted
    /// ([`crate::redis_topology::RedisTopology::addresses`]), named when the
    /// bucket or the replay keys fail; `in-process` without Redis.
    pub redis: String,
    /// What the slice loops last said of a failure they share.
    pub failures: LoopFailures,
    /// Whether `--ca` was given (for what a certificate the executor does
    /// not trust means).
    pub ca_given: bool,
}

/// What to say of a broker connection that failed with `error`: a refusal
/// that will not mend by itself, with its advice
/// ([`redrive_proto::amqp_nodes::refusal_advice`]), else that the broker
/// cannot be reached.
fn connect_advice(error: &str) -> &'static str {
    redrive_proto::amqp_nodes::refusal_advice(error).unwrap_or("cannot connect to the broker")
}

/// What to change when a call to the planner at `planner` failed in the
/// transport with `status` because the executor and the planner disagree on
/// TLS (`http://` to a TLS port, a certificate `--ca` does not trust, TLS
/// to a plain port: [`redrive_proto::tls::mismatch`]); `None` otherwise.
async fn tls_mismatch(planner: &str, status: &tonic::Status, ca_given: bool) -> Option<String> {
    // Only a call that failed in this client's transport (tonic keeps the
    // transport's error as the status's source), never a status the
    // planner sent (not ready, PostgreSQL gone): that answer was in gRPC.
    if !matches!(
        status.code(),
        tonic::Code::Unknown | tonic::Code::Internal | tonic::Code::Unavailable
    ) || std::error::Error::source(status).is_none()
    {
        return None;
    }
    let text = redrive_proto::settings::error_text_from(
        status.message().to_owned(),
        std::error::Error::source(status),
    );
    redrive_proto::tls::mismatch(planner, &text, "--ca FILE (or REDRIVE_CA)", ca_given).await
}

/// The running executor: claims slices until `shutdown`, publishing
/// through the publishers `connect` makes ([`AmqpConnect`]: the broker).
pub struct Worker<C: Connect = AmqpConnect> {
    settings: WorkerSettings,
    coordinator: CoordinatorClient<Channel>,
    bucket: Arc<Bucket>,
    replay_keys: Option<ReplayKeys>,
    connect: C,
    publisher: Option<C::Publisher>,
    /// Publishers given up on (connection lost or taken for dead), closing:
    /// their outstanding confirms still resolve into outcomes. Owned by the
    /// loop and awaited when it ends ([`Worker::retire_publisher`]).
    retired: JoinSet<()>,
    /// Late and lost confirms not yet charged, shared by every slice loop of
    /// the executor: a slice that ends does not take its debt with it.
    debt: TokenDebt,
    metrics: ExecutorMetrics,
    /// Beaten by the loop, for the health service's liveness.
    heartbeat: Heartbeat,
}

/// Why the publishing loop left a run.
pub(super) enum Leave {
    /// Stop publishing this slice.
    Stop,
    /// Go on with the next run.
    Next,
}

impl Worker<AmqpConnect> {
    /// A worker over its parts; `debt` is shared by the executor's workers.
    pub fn new(
        settings: WorkerSettings,
        coordinator: CoordinatorClient<Channel>,
        bucket: Arc<Bucket>,
        replay_keys: Option<ReplayKeys>,
        debt: TokenDebt,
        metrics: ExecutorMetrics,
        heartbeat: Heartbeat,
    ) -> Self {
        Self {
            retired: JoinSet::new(),
            connect: AmqpConnect {
                amqp: settings.amqp.clone(),
                options: settings.publisher,
                failures: settings.failures.clone(),
            },
            settings,
            coordinator,
            bucket,
            replay_keys,
            publisher: None,
            debt,
            metrics,
            heartbeat,
        }
    }
}

impl<C: Connect> Worker<C> {
    /// Claims and replays slices until `shutdown`.
    pub async fn run(mut self, shutdown: CancellationToken) {
        let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(5));
        while !shutdown.is_cancelled() {
            self.heartbeat.beat();
            // No claim without a broker to publish to: a slice would only be held.
            if self.publisher(&shutdown, None).await.is_none() {
                break;
            }
            let claim = self.coordinator.claim_slice(v1::ClaimSliceRequest {
                executor_id: self.settings.executor_id.clone(),
                wait: Some(redrive_proto::time::duration(self.settings.claim_wait)),
                marks_publishing: true,
            });
            let answer = tokio::select! {
                () = shutdown.cancelled() => break,
                answer = claim => answer,
            };
            self.heartbeat.beat();
            match answer {
                Ok(answer) => {
                    backoff.reset();
                    if self.settings.failures.mended("claim", Instant::now()) {
                        info!(planner = %self.settings.planner, "the planner answers claims again (said once for all slice loops)");
                    }
                    if let Some(slice) = answer.into_inner().slice {
                        self.replay_slice(slice, &shutdown).await;
                    }
                }
                Err(status) => {
                    let delay = backoff.next_delay();
                    // The loops retry about together (their jitter drifts
                    // them apart): one line a round.
                    let reason = format!("{:?}: {}", status.code(), status.message());
                    if self
                        .settings
                        .failures
                        .to_say("claim", &reason, Instant::now(), delay)
                    {
                        let advice = tokio::select! {
                            () = shutdown.cancelled() => break,
                            advice = tls_mismatch(&self.settings.planner, &status, self.settings.ca_given) => advice,
                        };
                        match advice {
                            Some(advice) => {
                                warn!(planner = %self.settings.planner, retry_in_ms = delay.as_millis() as u64, "claim failed: {advice} (said once for all slice loops)");
                            }
                            None => {
                                warn!(planner = %self.settings.planner, code = ?status.code(), grpc_message = status.message(), retry_in_ms = delay.as_millis() as u64, "claim failed (said once for all slice loops)");
                            }
                        }
                    }
                    tokio::select! {
                        () = shutdown.cancelled() => break,
                        () = tokio::time::sleep(delay) => {}
                    }
                }
            }
        }
        self.retire_publisher();
        let retired = &mut self.retired;
        let closed = async { while retired.join_next().await.is_some() {} };
        if tokio::time::timeout(Duration::from_secs(2), closed)
            .await
            .is_err()
        {
            warn!("closing the broker connection timed out");
            self.retired.abort_all();
        }
        tracing::debug!("slice loop stopped");
    }

    /// Gives the publisher up (its connection is lost, or the loop ends):
    /// it is closed in the background, where its outstanding confirms
    /// still resolve (the collector awaits them), owned by the loop.
    pub(super) fn retire_publisher(&mut self) {
        if let Some(publisher) = self.publisher.take() {
            self.retired.spawn(async move {
                let _ = publisher.close().await;
            });
        }
        // Those already closed.
        while self.retired.try_join_next().is_some() {}
    }

    /// A connected publisher, reconnecting with backoff until `stop` or, with
    /// `give_up_after`, until that long has passed (`None` either way).
    pub(super) async fn publisher(
        &mut self,
        stop: &CancellationToken,
        give_up_after: Option<Duration>,
    ) -> Option<&C::Publisher> {
        let started = Instant::now();
        if self
            .publisher
            .as_ref()
            .is_some_and(|publisher| !publisher.is_connected())
        {
            self.retire_publisher();
        }
        let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(5));
        // An attempt that hangs (a path that takes the connection and
        // never answers) counts against the limit too.
        let give_up_at = give_up_after.map(|limit| started + limit);
        let gave_up = async {
            match give_up_at {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(gave_up);
        while self.publisher.is_none() {
            let connect = self.connect.connect();
            let connected = tokio::select! {
                () = stop.cancelled() => return None,
                () = &mut gave_up => return None,
                connected = connect => connected,
            };
            match connected {
                Ok(publisher) => self.publisher = Some(publisher),
                Err(error) => {
                    let delay = backoff.next_delay();
                    self.heartbeat.beat();
                    let error = error.to_string();
                    if self
                        .settings
                        .failures
                        .to_say("connect", &error, Instant::now(), delay)
                    {
                        warn!(%error, retry_in_ms = delay.as_millis() as u64, "{} (said once for all slice loops)", connect_advice(&error));
                    }
                    if give_up_after.is_some_and(|limit| started.elapsed() >= limit) {
                        return None;
                    }
                    tokio::select! {
                        () = stop.cancelled() => return None,
                        () = &mut gave_up => return None,
                        () = tokio::time::sleep(delay) => {}
                    }
                }
            }
        }
        self.publisher.as_ref()
    }
}
