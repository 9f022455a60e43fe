//! The plan state machine: the one table of which [`Event`] moves a plan from
//! which states to which (docs/design.md, "Plan states"). The states
//! themselves, and their kinds (`is_final`, `is_running`, `is_publishing`),
//! are [`v1::PlanState`](S)'s (`proto/src/names.rs`).
//!
//! Every other file asks this module: the operator controls
//! ([`crate::plan::control`]), the gates ([`crate::plan::gates`]), the store, which
//! only executes a transition in one guarded
//! `UPDATE plans SET state = $target ... WHERE id = $1 AND state = ANY($allowed)`
//! ([`crate::store::Store::transition_plan`]), and the SQL state lists
//! ([`names_where`], [`gated`]).
//!
//! | event | from | to |
//! |---|---|---|
//! | [`Event::Approve`] | `awaiting_approval` | `canary` |
//! | [`Event::StartSingle`] | `awaiting_approval` | `main` |
//! | [`Event::CanaryDone`] | `canary` | `observing` |
//! | [`Event::ObservationPassed`] | `observing` | `main` |
//! | [`Event::Promote`] | `canary`, `observing` | `main` |
//! | [`Event::Complete`] | `main` | `completed` |
//! | [`Event::Pause`] | `canary`, `observing`, `main` | `paused` |
//! | [`Event::GatePause`] | `main` | `paused` |
//! | [`Event::Resume`] | `paused` | its `paused_from` (`main` when unknown) |
//! | [`Event::Cancel`] | `awaiting_approval`, `canary`, `observing`, `main`, `paused` | `cancelled` |
//! | [`Event::CancelUnclaimed`] | `main`, `paused` | `cancelled` |
//! | [`Event::Abort`] | `canary`, `observing` | `aborted` |
//!
//! A plan that lands in `main` with every slice completed is completed at once
//! ([`Event::Complete`], done by the store after such a move).

use std::fmt;

use redrive_proto::v1::PlanState as S;
use sqlx::{
    Decode, Encode, Postgres, Type,
    encode::IsNull,
    error::BoxDynError,
    postgres::{PgArgumentBuffer, PgHasArrayType, PgTypeInfo, PgValueRef},
};

/// A stored plan state (`plans.state`, TEXT): a [`v1::PlanState`](S) other than
/// `Unspecified`, stored by its [`v1::PlanState::name`](S::name). Decoding an unknown
/// name is an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct State(S);

impl State {
    /// `state` as a stored state; `None` for `Unspecified`.
    pub fn new(state: S) -> Option<Self> {
        (state != S::Unspecified).then_some(Self(state))
    }

    /// The API state.
    pub fn get(self) -> S {
        self.0
    }

    /// Its name, as stored (`awaiting_approval`, `canary`, ...).
    pub fn name(self) -> &'static str {
        self.0.name()
    }

    /// The state named `name`, if any.
    pub fn from_name(name: &str) -> Option<Self> {
        S::from_name(name).map(Self)
    }
}

impl From<State> for S {
    fn from(state: State) -> Self {
        state.0
    }
}

impl PartialEq<S> for State {
    fn eq(&self, other: &S) -> bool {
        self.0 == *other
    }
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl Type<Postgres> for State {
    fn type_info() -> PgTypeInfo {
        <&str as Type<Postgres>>::type_info()
    }

    fn compatible(ty: &PgTypeInfo) -> bool {
        <&str as Type<Postgres>>::compatible(ty)
    }
}

impl PgHasArrayType for State {
    fn array_type_info() -> PgTypeInfo {
        <&str as PgHasArrayType>::array_type_info()
    }

    fn array_compatible(ty: &PgTypeInfo) -> bool {
        <&str as PgHasArrayType>::array_compatible(ty)
    }
}

impl Encode<'_, Postgres> for State {
    fn encode_by_ref(&self, buf: &mut PgArgumentBuffer) -> Result<IsNull, BoxDynError> {
        <&str as Encode<Postgres>>::encode(self.name(), buf)
    }
}

impl<'r> Decode<'r, Postgres> for State {
    fn decode(value: PgValueRef<'r>) -> Result<Self, BoxDynError> {
        let name = <&str as Decode<Postgres>>::decode(value)?;
        Self::from_name(name).ok_or_else(|| format!("unknown plan state {name:?}").into())
    }
}

/// Something that moves a plan from one state to another.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Event {
    /// An operator approves the plan (`ApprovePlan`): its canary wave starts.
    Approve,
    /// A plan of one (`ReplayDeadLetter`) is approved by its creator, right
    /// after it is created, straight into its main wave (it has no canary).
    StartSingle,
    /// The current wave's last slice completed (extra condition: no slice
    /// of the plan's current ramp wave left): the observation window starts.
    CanaryDone,
    /// The observation window of a ramp wave passed with the gates green and
    /// the ramp has another wave before the main one (extra condition): that
    /// wave starts (`ramp_step` + 1), back in `canary`.
    NextWave,
    /// The observation window of the last wave before the main one passed
    /// with the gates green (extra condition: no ramp wave left): the gates'
    /// promote.
    ObservationPassed,
    /// An operator ends the canary or its observation now (`plan promote`).
    Promote,
    /// The plan's last slice completed (extra condition: no slice left).
    Complete,
    /// An operator pauses the plan.
    Pause,
    /// A gate tripped in the main wave (the gates pause).
    GatePause,
    /// An operator resumes the plan in the state it was paused in.
    Resume,
    /// An operator cancels the plan (final).
    Cancel,
    /// A plan of one no executor claimed before its claim deadline is
    /// cancelled (extra condition: no slice ever leased).
    CancelUnclaimed,
    /// A gate tripped in the canary wave or the observation (final).
    Abort,
}

/// Where an event moves a plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// To this state.
    To(S),
    /// Back to the state the plan was paused in (`plans.paused_from`), or to
    /// `otherwise` when that is unknown.
    PausedFrom {
        /// The state when `paused_from` is unknown.
        otherwise: S,
    },
}

/// One row of the transition table: the states an event is allowed from and
/// where it moves the plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rule {
    /// The states the plan may be in.
    pub from: &'static [S],
    /// Where it goes.
    pub to: Target,
}

/// States an operator can pause a plan in.
const PAUSABLE: &[S] = &[S::Canary, S::Observing, S::Main];
/// States an operator can cancel a plan in: every state not final.
const CANCELLABLE: &[S] = &[
    S::AwaitingApproval,
    S::Canary,
    S::Observing,
    S::Main,
    S::Paused,
];

impl Event {
    /// Every event.
    pub const ALL: [Self; 13] = [
        Self::Approve,
        Self::StartSingle,
        Self::CanaryDone,
        Self::NextWave,
        Self::ObservationPassed,
        Self::Promote,
        Self::Complete,
        Self::Pause,
        Self::GatePause,
        Self::Resume,
        Self::Cancel,
        Self::CancelUnclaimed,
        Self::Abort,
    ];

    /// The transition table: the one place that says which states an event
    /// is allowed from and where it moves the plan.
    pub const fn rule(self) -> Rule {
        use Target::To;
        let (from, to): (&'static [S], Target) = match self {
            Self::Approve => (&[S::AwaitingApproval], To(S::Canary)),
            Self::StartSingle => (&[S::AwaitingApproval], To(S::Main)),
            Self::CanaryDone => (&[S::Canary], To(S::Observing)),
            Self::NextWave => (&[S::Observing], To(S::Canary)),
            Self::ObservationPassed => (&[S::Observing], To(S::Main)),
            Self::Promote => (&[S::Canary, S::Observing], To(S::Main)),
            Self::Complete => (&[S::Main], To(S::Completed)),
            Self::Pause => (PAUSABLE, To(S::Paused)),
            Self::GatePause => (&[S::Main], To(S::Paused)),
            Self::Resume => (&[S::Paused], Target::PausedFrom { otherwise: S::Main }),
            Self::Cancel => (CANCELLABLE, To(S::Cancelled)),
            Self::CancelUnclaimed => (&[S::Main, S::Paused], To(S::Cancelled)),
            Self::Abort => (&[S::Canary, S::Observing], To(S::Aborted)),
        };
        Rule { from, to }
    }

    /// The states this event is allowed from.
    pub fn allowed(self) -> &'static [S] {
        self.rule().from
    }

    /// Whether this event is allowed from `state`.
    pub fn allows(self, state: S) -> bool {
        self.allowed().contains(&state)
    }

    /// Where this event moves a plan in `state` that was paused from
    /// `paused_from` (if paused); `None` when it is not allowed from `state`.
    /// The store does the same in SQL ([`crate::store::Store::transition_plan`]).
    pub fn apply(self, state: S, paused_from: Option<S>) -> Option<S> {
        if !self.allows(state) {
            return None;
        }
        Some(match self.rule().to {
            Target::To(to) => to,
            Target::PausedFrom { otherwise } => paused_from.unwrap_or(otherwise),
        })
    }

    /// The operator action the move is recorded as (`operator_actions`), by
    /// its actor with its reason; `None` for the moves that follow from
    /// slices completing.
    pub fn action(self) -> Option<&'static str> {
        Some(match self {
            Self::Approve | Self::StartSingle => "approve",
            Self::ObservationPassed | Self::Promote => "promote",
            Self::NextWave => "next_wave",
            Self::Pause | Self::GatePause => "pause",
            Self::Resume => "resume",
            Self::Cancel | Self::CancelUnclaimed => "cancel",
            Self::Abort => "abort",
            Self::CanaryDone | Self::Complete => return None,
        })
    }

    /// Whether the move records its approver (`approved_by`, `approved_at`).
    pub fn approves(self) -> bool {
        matches!(self, Self::Approve | Self::StartSingle)
    }

    /// Whether the move resets the gates (`gates_since`): from then on only
    /// new failures and re-dead-letters count.
    pub fn resets_gates(self) -> bool {
        matches!(
            self,
            Self::StartSingle
                | Self::NextWave
                | Self::ObservationPassed
                | Self::Promote
                | Self::Resume
        )
    }
}

/// The event that follows `event` once it moved a plan to `to`, if any: a
/// plan resumed or promoted into `main` completes when no slice is left;
/// one resumed into its canary (it was paused after its last canary slice
/// completed) goes on to the observation. The follow-up's own condition (no
/// slice left) decides whether it moves; its refusal is no error.
pub fn follow_up(event: Event, to: S) -> Option<Event> {
    match to {
        S::Main => Some(Event::Complete),
        S::Canary if event != Event::Approve => Some(Event::CanaryDone),
        _ => None,
    }
}

/// Whether a plan in `state` keeps the reason of the move that put it there
/// (`plans.state_reason`): `paused`, `cancelled`, `aborted`. Every action's
/// reason stays in the operator actions either way.
pub fn keeps_reason(state: S) -> bool {
    matches!(state, S::Paused | S::Cancelled | S::Aborted)
}

/// Whether a move to `target` keeps its reason (see [`keeps_reason`]); a
/// resume never does (a plan is never paused from a state that keeps one).
pub fn target_keeps_reason(target: Target) -> bool {
    match target {
        Target::To(state) => keeps_reason(state),
        Target::PausedFrom { otherwise } => {
            keeps_reason(otherwise) || PAUSABLE.iter().any(|state| keeps_reason(*state))
        }
    }
}

/// The events the gates cause.
pub const GATE_EVENTS: [Event; 4] = [
    Event::GatePause,
    Event::Abort,
    Event::NextWave,
    Event::ObservationPassed,
];

/// The states whose gates are watched: those some gate event is allowed from
/// (`canary`, `observing`, `main`), in [`v1::PlanState::ALL`](S::ALL) order.
pub fn gated() -> Vec<S> {
    S::ALL
        .into_iter()
        .filter(|state| GATE_EVENTS.iter().any(|event| event.allows(*state)))
        .collect()
}

/// The names of the states `keep` holds for, in [`v1::PlanState::ALL`](S::ALL) order,
/// for SQL (`p.state = ANY($n)`), e.g. `names_where(v1::PlanState::is_running)`.
pub fn names_where(keep: impl Fn(S) -> bool) -> Vec<&'static str> {
    S::ALL
        .into_iter()
        .filter(|state| keep(*state))
        .map(S::name)
        .collect()
}

/// The names of `states`, for SQL (`p.state = ANY($n)`).
pub fn names(states: &[S]) -> Vec<&'static str> {
    states.iter().map(|state| state.name()).collect()
}

/// The gates' decision for a plan in `state` whose gates tripped: pause in
/// the main wave, abort in the canary wave or the observation.
pub fn gate_trip(state: S) -> Event {
    if Event::GatePause.allows(state) {
        Event::GatePause
    } else {
        Event::Abort
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every allowed move, by event, as `(from, to)`; every other
    /// `(event, state)` is refused. Resume is listed for a plan paused from
    /// `main`; [`resume_returns_where_it_was_paused`] covers the others.
    const ALLOWED: &[(Event, &[(S, S)])] = &[
        (Event::Approve, &[(S::AwaitingApproval, S::Canary)]),
        (Event::StartSingle, &[(S::AwaitingApproval, S::Main)]),
        (Event::CanaryDone, &[(S::Canary, S::Observing)]),
        (Event::ObservationPassed, &[(S::Observing, S::Main)]),
        (
            Event::Promote,
            &[(S::Canary, S::Main), (S::Observing, S::Main)],
        ),
        (Event::Complete, &[(S::Main, S::Completed)]),
        (
            Event::Pause,
            &[
                (S::Canary, S::Paused),
                (S::Observing, S::Paused),
                (S::Main, S::Paused),
            ],
        ),
        (Event::GatePause, &[(S::Main, S::Paused)]),
        (Event::NextWave, &[(S::Observing, S::Canary)]),
        (Event::Resume, &[(S::Paused, S::Main)]),
        (
            Event::Cancel,
            &[
                (S::AwaitingApproval, S::Cancelled),
                (S::Canary, S::Cancelled),
                (S::Observing, S::Cancelled),
                (S::Main, S::Cancelled),
                (S::Paused, S::Cancelled),
            ],
        ),
        (
            Event::CancelUnclaimed,
            &[(S::Main, S::Cancelled), (S::Paused, S::Cancelled)],
        ),
        (
            Event::Abort,
            &[(S::Canary, S::Aborted), (S::Observing, S::Aborted)],
        ),
    ];

    #[test]
    fn every_event_in_every_state() {
        assert_eq!(ALLOWED.len(), Event::ALL.len());
        for event in Event::ALL {
            let (_, moves) = ALLOWED
                .iter()
                .find(|(listed, _)| *listed == event)
                .unwrap_or_else(|| panic!("{event:?} is not in the test table"));
            for state in S::ALL.into_iter().chain([S::Unspecified]) {
                let expected = moves
                    .iter()
                    .find(|(from, _)| *from == state)
                    .map(|(_, to)| *to);
                assert_eq!(
                    event.apply(state, None),
                    expected,
                    "{event:?} from {}",
                    state.name()
                );
                assert_eq!(
                    event.allows(state),
                    expected.is_some(),
                    "{event:?} from {state:?}"
                );
            }
        }
    }

    #[test]
    fn resume_returns_where_it_was_paused() {
        for paused_from in PAUSABLE {
            assert_eq!(
                Event::Resume.apply(S::Paused, Some(*paused_from)),
                Some(*paused_from)
            );
        }
        assert_eq!(Event::Resume.apply(S::Paused, None), Some(S::Main));
        assert_eq!(Event::Resume.apply(S::Main, Some(S::Main)), None);
    }

    #[test]
    fn final_states_allow_nothing() {
        for state in S::ALL.into_iter().filter(|state| state.is_final()) {
            for event in Event::ALL {
                assert!(!event.allows(state), "{event:?} from {state:?}");
            }
        }
    }

    #[test]
    fn actions_and_side_effects() {
        let action = |event: Event| event.action();
        assert_eq!(action(Event::Approve), Some("approve"));
        assert_eq!(action(Event::StartSingle), Some("approve"));
        assert_eq!(action(Event::CanaryDone), None);
        assert_eq!(action(Event::ObservationPassed), Some("promote"));
        assert_eq!(action(Event::NextWave), Some("next_wave"));
        assert_eq!(action(Event::Promote), Some("promote"));
        assert_eq!(action(Event::Complete), None);
        assert_eq!(action(Event::Pause), Some("pause"));
        assert_eq!(action(Event::GatePause), Some("pause"));
        assert_eq!(action(Event::Resume), Some("resume"));
        assert_eq!(action(Event::Cancel), Some("cancel"));
        assert_eq!(action(Event::CancelUnclaimed), Some("cancel"));
        assert_eq!(action(Event::Abort), Some("abort"));
        let approving: Vec<_> = Event::ALL.into_iter().filter(|e| e.approves()).collect();
        assert_eq!(approving, [Event::Approve, Event::StartSingle]);
        let resetting: Vec<_> = Event::ALL
            .into_iter()
            .filter(|e| e.resets_gates())
            .collect();
        assert_eq!(
            resetting,
            [
                Event::StartSingle,
                Event::NextWave,
                Event::ObservationPassed,
                Event::Promote,
                Event::Resume
            ]
        );
        let keeping: Vec<_> = Event::ALL
            .into_iter()
            .filter(|event| target_keeps_reason(event.rule().to))
            .collect();
        assert_eq!(
            keeping,
            [
                Event::Pause,
                Event::GatePause,
                Event::Cancel,
                Event::CancelUnclaimed,
                Event::Abort
            ]
        );
    }

    #[test]
    fn gates_and_state_lists() {
        assert_eq!(gated(), [S::Canary, S::Observing, S::Main]);
        assert_eq!(gate_trip(S::Main), Event::GatePause);
        assert_eq!(gate_trip(S::Canary), Event::Abort);
        assert_eq!(gate_trip(S::Observing), Event::Abort);
        assert_eq!(
            names_where(S::is_running),
            ["canary", "observing", "main", "paused"]
        );
        assert_eq!(
            names_where(|state| !state.is_final()),
            ["awaiting_approval", "canary", "observing", "main", "paused"]
        );
        // Cancel is allowed from every state not final.
        assert_eq!(
            names(Event::Cancel.allowed()),
            names_where(|state| !state.is_final())
        );
    }

    #[test]
    fn stored_state_by_name() {
        for state in S::ALL {
            let stored = State::new(state).unwrap();
            assert_eq!(State::from_name(stored.name()), Some(stored));
            assert_eq!(stored.to_string(), state.name());
            assert_eq!(stored, state);
        }
        assert_eq!(State::new(S::Unspecified), None);
        assert_eq!(State::from_name("unspecified"), None);
    }
}
