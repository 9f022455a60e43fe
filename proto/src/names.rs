//! Stable lowercase names of API enums, used in CLI output, JSON and SQL.

use crate::v1::{AuditAction, DeadLetterStatus, Origin, PlanState, ReasonClass, Verdict};

impl ReasonClass {
    /// `rejected`, `expired`, `overflow`, `exhausted`, `poison`, `permanent`,
    /// `unknown`, `unreadable` (docs/design.md, "death reason").
    pub fn name(self) -> &'static str {
        match self {
            Self::Unspecified | Self::Unknown => "unknown",
            Self::Rejected => "rejected",
            Self::Expired => "expired",
            Self::Overflow => "overflow",
            Self::Exhausted => "exhausted",
            Self::Poison => "poison",
            Self::Permanent => "permanent",
            Self::Unreadable => "unreadable",
        }
    }

    /// The class named `name`, if any.
    pub fn from_name(name: &str) -> Option<Self> {
        Some(match name {
            "rejected" => Self::Rejected,
            "expired" => Self::Expired,
            "overflow" => Self::Overflow,
            "exhausted" => Self::Exhausted,
            "poison" => Self::Poison,
            "permanent" => Self::Permanent,
            "unknown" => Self::Unknown,
            "unreadable" => Self::Unreadable,
            _ => return None,
        })
    }
}

impl Origin {
    /// `rabbitmq`, `ingest` or `import`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Unspecified => "unspecified",
            Self::Rabbitmq => "rabbitmq",
            Self::Ingest => "ingest",
            Self::Import => "import",
        }
    }

    /// The origin named `name`, if any.
    pub fn from_name(name: &str) -> Option<Self> {
        Some(match name {
            "rabbitmq" => Self::Rabbitmq,
            "ingest" => Self::Ingest,
            "import" => Self::Import,
            _ => return None,
        })
    }
}

impl Verdict {
    /// `replayable`, `duplicate`, `already_replayed`, `looping`, `stale`,
    /// `blocked_by_state`, `needs_compensation`, `invalid`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Unspecified => "unspecified",
            Self::Replayable => "replayable",
            Self::Duplicate => "duplicate",
            Self::AlreadyReplayed => "already_replayed",
            Self::Looping => "looping",
            Self::Stale => "stale",
            Self::BlockedByState => "blocked_by_state",
            Self::NeedsCompensation => "needs_compensation",
            Self::Invalid => "invalid",
        }
    }
}

/// The plan states' one list and their kinds. Which event moves a plan from
/// which state to which lives in the planner (`planner/src/plan/state.rs`).
impl PlanState {
    /// Every plan state, in lifecycle order (`Unspecified` is none).
    pub const ALL: [Self; 8] = [
        Self::AwaitingApproval,
        Self::Canary,
        Self::Observing,
        Self::Main,
        Self::Completed,
        Self::Paused,
        Self::Cancelled,
        Self::Aborted,
    ];

    /// Whether a plan in this state will not change any more: `completed`,
    /// `cancelled`, `aborted` (`paused` is resumable, so not final).
    pub fn is_final(self) -> bool {
        matches!(self, Self::Completed | Self::Cancelled | Self::Aborted)
    }

    /// Whether the plan was approved and is not final: `canary`, `observing`,
    /// `main`, `paused` (the plans other plans' destinations are compared with).
    pub fn is_running(self) -> bool {
        matches!(
            self,
            Self::Canary | Self::Observing | Self::Main | Self::Paused
        )
    }

    /// Whether executors publish for a plan in this state: `canary` (its
    /// canary slices) and `main`.
    pub fn is_publishing(self) -> bool {
        matches!(self, Self::Canary | Self::Main)
    }

    /// `awaiting_approval`, `canary`, `observing`, `main`, `completed`, `paused`,
    /// `cancelled`, `aborted`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Unspecified => "unspecified",
            Self::AwaitingApproval => "awaiting_approval",
            Self::Canary => "canary",
            Self::Observing => "observing",
            Self::Main => "main",
            Self::Completed => "completed",
            Self::Paused => "paused",
            Self::Cancelled => "cancelled",
            Self::Aborted => "aborted",
        }
    }

    /// The state named `name` (one of [`PlanState::ALL`]), if any.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|state| state.name() == name)
    }
}

impl AuditAction {
    /// `sent`, `skipped_duplicate`, `skipped_stale`, `skipped_state`,
    /// `needs_compensation`, `failed`, `unroutable`, `uncertain`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Unspecified => "unspecified",
            Self::Sent => "sent",
            Self::SkippedDuplicate => "skipped_duplicate",
            Self::SkippedStale => "skipped_stale",
            Self::SkippedState => "skipped_state",
            Self::NeedsCompensation => "needs_compensation",
            Self::Failed => "failed",
            Self::Unroutable => "unroutable",
            Self::Uncertain => "uncertain",
        }
    }
}

impl DeadLetterStatus {
    /// `open`, `archived`, `replayed`, `all`; `unspecified` for a selector's
    /// default (not archived).
    pub fn name(self) -> &'static str {
        match self {
            Self::Unspecified => "unspecified",
            Self::Open => "open",
            Self::Archived => "archived",
            Self::Replayed => "replayed",
            Self::All => "all",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_states_round_trip_by_name() {
        for state in PlanState::ALL {
            assert_eq!(PlanState::from_name(state.name()), Some(state));
        }
        assert_eq!(PlanState::from_name("unspecified"), None);
        assert_eq!(PlanState::from_name("running"), None);
    }

    #[test]
    fn plan_state_kinds() {
        use PlanState as S;
        let named = |keep: fn(PlanState) -> bool| -> Vec<&str> {
            PlanState::ALL
                .into_iter()
                .filter(|state| keep(*state))
                .map(PlanState::name)
                .collect()
        };
        assert_eq!(
            named(PlanState::is_final),
            ["completed", "cancelled", "aborted"]
        );
        assert_eq!(
            named(PlanState::is_running),
            ["canary", "observing", "main", "paused"]
        );
        assert_eq!(named(PlanState::is_publishing), ["canary", "main"]);
        for kind in [S::is_final, S::is_running, S::is_publishing] {
            assert!(!kind(S::Unspecified));
        }
        // Every state is awaiting approval, running or final.
        for state in PlanState::ALL {
            let kinds = [
                state == S::AwaitingApproval,
                state.is_running(),
                state.is_final(),
            ];
            assert_eq!(kinds.iter().filter(|kind| **kind).count(), 1, "{state:?}");
        }
    }
}
