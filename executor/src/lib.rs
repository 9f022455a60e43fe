//! The Redrive executor: claims slices of approved plans from the planner's
//! `Coordinator` service under leases and publishes them with publisher
//! confirms under a shared token bucket (DESIGN.md, "Executor loop and
//! guarantees").
//!
//! Replay execution is later work: for now the executor connects, asks the
//! planner for a slice and stops with the planner's answer, so nothing pretends
//! to replay.
//!
//! # Layout
//! - [`Config`]: flags and validation.
//! - [`run`]: the claim loop.

use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use redrive_proto::v1::{ClaimSliceRequest, coordinator_client::CoordinatorClient};
use tokio_util::sync::CancellationToken;
use tracing::info;

/// `redrive-executor` settings.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "redrive-executor",
    version,
    about = "Redrive executor: replays plan slices with publisher confirms"
)]
pub struct Config {
    /// The planner's gRPC URL.
    #[arg(
        long,
        env = "REDRIVE_PLANNER",
        default_value = "http://127.0.0.1:50051"
    )]
    pub planner: String,

    /// AMQP URL of the RabbitMQ broker to publish to.
    #[arg(
        long,
        env = "REDRIVE_AMQP_URL",
        default_value = "amqp://guest:guest@127.0.0.1:5672/%2f"
    )]
    pub amqp_url: String,

    /// Redis URL of the shared token bucket; without it the executor runs in
    /// single-executor mode.
    #[arg(long, env = "REDRIVE_REDIS_URL")]
    pub redis_url: Option<String>,

    /// This executor's id in leases and audit events (default: a random one).
    #[arg(long, env = "REDRIVE_EXECUTOR_ID")]
    pub executor_id: Option<String>,
}

impl Config {
    /// Checks what clap cannot.
    ///
    /// # Errors
    /// A sentence naming the wrong setting.
    pub fn validate(&self) -> Result<(), String> {
        if !self.planner.starts_with("http://") && !self.planner.starts_with("https://") {
            return Err(format!(
                "invalid setting --planner: {:?} is not an http(s):// URL",
                self.planner
            ));
        }
        if !self.amqp_url.starts_with("amqp://") && !self.amqp_url.starts_with("amqps://") {
            return Err(format!(
                "invalid setting --amqp-url: {:?} is not an amqp:// URL",
                self.amqp_url
            ));
        }
        if let Some(redis) = &self.redis_url
            && !redis.starts_with("redis://")
            && !redis.starts_with("rediss://")
        {
            return Err(format!(
                "invalid setting --redis-url: {redis:?} is not a redis:// URL"
            ));
        }
        Ok(())
    }
}

/// Claims slices until `shutdown`.
///
/// # Errors
/// The planner unreachable, or answering that replay execution is not built.
pub async fn run(config: Config, shutdown: CancellationToken) -> anyhow::Result<()> {
    let executor_id = config
        .executor_id
        .clone()
        .unwrap_or_else(|| format!("executor-{}", uuid::Uuid::new_v4()));
    let mut coordinator = CoordinatorClient::connect(config.planner.clone())
        .await
        .with_context(|| format!("cannot reach the planner at {}", config.planner))?;
    info!(executor.id = %executor_id, planner = %config.planner, "executor claiming");
    let claim = coordinator.claim_slice(ClaimSliceRequest {
        executor_id: executor_id.clone(),
        wait: Some(redrive_proto::time::duration(Duration::from_secs(20))),
    });
    let answer = tokio::select! {
        () = shutdown.cancelled() => return Ok(()),
        answer = claim => answer,
    };
    match answer {
        Ok(_) => {
            anyhow::bail!("the planner handed out a slice, but this executor cannot replay yet")
        }
        Err(status) => anyhow::bail!(
            "the planner refused to hand out slices: {}",
            status.message()
        ),
    }
}
