//! Stable lowercase names of API enums, used in CLI output, JSON and SQL.

use crate::v1::{AuditAction, Origin, PlanState, ReasonClass, Verdict};

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

impl PlanState {
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
