//! Plan-change notifications across planner replicas: one `LISTEN` connection
//! per planner (PostgreSQL `LISTEN/NOTIFY`) fanned out in-process, so that
//! long-polled claims and `WatchPlan` streams wake up when any replica changes
//! a plan.

use std::time::Duration;

use redrive_proto::backoff::Backoff;
use sqlx::postgres::PgListener;
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;
use tracing::warn;
use uuid::Uuid;

use crate::{
    ids::PlanId,
    store::{Store, plans::PLAN_CHANNEL},
};

/// Subscribers get the id of every plan that changed.
#[derive(Debug, Clone)]
pub struct Notifier {
    sender: broadcast::Sender<PlanId>,
}

impl Notifier {
    /// A notifier with no listener yet (see [`Notifier::listen`]).
    pub fn new() -> Self {
        let (sender, _) = broadcast::channel(1024);
        Self { sender }
    }

    /// A receiver of plan ids. A lagging receiver misses ids, not wake-ups:
    /// callers re-read state on any message or lag.
    pub fn subscribe(&self) -> broadcast::Receiver<PlanId> {
        self.sender.subscribe()
    }

    /// Listens until `shutdown`, reconnecting with backoff.
    pub async fn listen(self, store: Store, shutdown: CancellationToken) {
        let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(5));
        while !shutdown.is_cancelled() {
            match PgListener::connect_with(store.pool()).await {
                Ok(mut listener) => {
                    if let Err(error) = listener.listen(PLAN_CHANNEL).await {
                        warn!(%error, "cannot LISTEN for plan changes");
                    } else {
                        backoff.reset();
                        loop {
                            tokio::select! {
                                () = shutdown.cancelled() => return,
                                notification = listener.recv() => match notification {
                                    Ok(notification) => {
                                        if let Ok(plan_id) = Uuid::parse_str(notification.payload()) {
                                            let _ = self.sender.send(PlanId::new(plan_id));
                                        }
                                    }
                                    Err(error) => {
                                        warn!(%error, "plan-change listener lost its connection");
                                        break;
                                    }
                                },
                            }
                        }
                    }
                }
                Err(error) => warn!(%error, "cannot connect the plan-change listener"),
            }
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(backoff.next_delay()) => {}
            }
        }
    }
}

impl Default for Notifier {
    fn default() -> Self {
        Self::new()
    }
}
