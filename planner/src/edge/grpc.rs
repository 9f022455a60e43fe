//! The gRPC adapters: request → domain types (validated, `InvalidArgument`
//! naming the field) → one domain call → response. No SQL and no business
//! branching here.
//!
//! - `planner.rs`: [`PlannerGrpc`], `redrive.v1.Planner` (what operators,
//!   the CLI and services call).
//! - `coordinator.rs`: [`CoordinatorGrpc`], `redrive.v1.Coordinator` (what
//!   executors call).
//! - here: [`PlannerState`], what every Planner handler needs.

mod coordinator;
mod planner;

use std::{sync::Arc, time::Duration};

use tokio_util::sync::CancellationToken;

pub use self::{coordinator::CoordinatorGrpc, planner::PlannerGrpc};
pub use crate::edge::auth::ACTOR_METADATA;
use crate::{
    audit::notifier::Notifier, dead_letters::ExtractionRules, plan::single::Single,
    precheck::policy::Policy, precheck::state_check::StateChecker, store::Store,
};

/// What every handler needs; cheap to clone.
#[derive(Debug, Clone)]
pub struct PlannerState {
    /// PostgreSQL.
    pub store: Store,
    /// How ingested dead letters are read.
    pub rules: Arc<ExtractionRules>,
    /// The state-check hooks.
    pub checker: Arc<StateChecker>,
    /// Plan-change notifications.
    pub notifier: Notifier,
    /// Approvers must differ from creators.
    pub four_eyes: bool,
    /// The floor under every precheck's options.
    pub policy: Arc<Policy>,
    /// Oldest precheck a plan may be approved from.
    pub max_precheck_age: Duration,
    /// The planner's shutdown: long waits (ReplayDeadLetter, WatchPlan) end
    /// early instead of being cut.
    pub shutdown: CancellationToken,
    /// Caps on open `WatchPlan` streams, per caller and in total.
    pub watches: crate::edge::admission::StreamLimits,
    /// The live watches, one reader per plan and per lease.
    pub hub: crate::audit::watch_hub::WatchHub,
    /// Each capture queue's consumer and depth (`ListSources`).
    pub capture: crate::capture::CaptureStatus,
    /// Whether callers are authenticated (`GetCaller`).
    pub authenticated: bool,
    /// The audit log (its proofs, checkpoints and export).
    pub audit_log: crate::audit::log::AuditLog,
}

impl PlannerState {
    /// Single dead letter operations over this state.
    pub fn single(&self) -> Single<'_> {
        Single {
            store: &self.store,
            checker: &self.checker,
            policy: &self.policy,
            notifier: &self.notifier,
            rules: &self.rules,
            shutdown: &self.shutdown,
        }
    }
}
