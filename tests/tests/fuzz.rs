//! Fuzz-style test (issue 13): `proptest` strategies make arbitrary requests
//! (deep, long and boundary values: NUL characters, 5,000-byte texts, any
//! integer, any duration and timestamp, header tables nested past the limit)
//! for every `Planner` and `Coordinator` RPC, plus undecodable bytes, and
//! send them to one in-process planner. No answer may be `INTERNAL` or
//! `UNKNOWN` (a panic in a handler), and the planner answers health at the
//! end.
//!
//! A case is one call, drawn from [`CALLS`]. Ids are the case's own text one
//! time in four, else ids the planner handed out to earlier cases (a plan of
//! a fuzzed precheck, approved with its digest half the time), so that calls
//! reach past the lookup.
//!
//! `REDRIVE_FUZZ_CASES` sets the number of cases (default 10,000, about a
//! minute here): `REDRIVE_FUZZ_CASES=1000000 cargo test -p redrive-tests
//! --test fuzz --release` is the long run.

use std::{collections::BTreeMap, time::Duration};

use proptest::{
    collection::{btree_map, vec},
    option,
    prelude::*,
    test_runner::{Config as RunnerConfig, TestRunner},
};
use redrive_proto::v1::{
    self, HeaderArray, HeaderTable, HeaderValue, coordinator_client::CoordinatorClient,
    header_value::Value, planner_client::PlannerClient,
};
use redrive_tests::{PlannerHandle, TestBed, init_logging, raw::raw_unary};
use tonic::{Code, Status, transport::Channel};

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        "[a-z.*/-]{1,12}",
        any::<String>(),
        "\\PC{0,40}",
        (0usize..5000).prop_map(|n| "x".repeat(n)),
        Just("a\0b".to_owned()),
        Just("1".to_owned()),
        Just("999999999".to_owned()),
        Just("01a22d22-68c3-710f-a087-b226c28277c7".to_owned()),
        Just("12.34".to_owned()),
    ]
}

fn texts() -> impl Strategy<Value = Vec<String>> {
    prop_oneof![
        vec(text(), 0..4),
        (0usize..1100).prop_map(|n| vec!["s".to_owned(); n])
    ]
}

fn duration() -> impl Strategy<Value = Option<prost_types::Duration>> {
    option::of(
        prop_oneof![
            (any::<i64>(), any::<i32>()),
            (-5i64..100_000, 0i32..1_000_000_000),
            Just((i64::MAX, 999_999_999)),
            Just((3_170_000 * 365 * 86_400, 0)),
        ]
        .prop_map(|(seconds, nanos)| prost_types::Duration { seconds, nanos }),
    )
}

fn timestamp() -> impl Strategy<Value = Option<prost_types::Timestamp>> {
    option::of(
        prop_oneof![
            (any::<i64>(), any::<i32>()),
            (0i64..4_000_000_000, 0i32..1_000_000_000),
        ]
        .prop_map(|(seconds, nanos)| prost_types::Timestamp { seconds, nanos }),
    )
}

fn header_leaf() -> impl Strategy<Value = HeaderValue> {
    prop_oneof![
        any::<bool>().prop_map(Value::Boolean),
        any::<i32>().prop_map(Value::ShortShortInt),
        any::<u32>().prop_map(Value::ShortUint),
        any::<i64>().prop_map(Value::LongLongInt),
        any::<f64>().prop_map(Value::Double),
        text().prop_map(Value::ShortString),
        vec(any::<u8>(), 0..64).prop_map(Value::LongString),
        any::<u64>().prop_map(Value::Timestamp),
        Just(Value::Void(v1::Void {})),
    ]
    .prop_map(|value| HeaderValue { value: Some(value) })
}

/// A chain of `depth` tables or arrays around `leaf`.
fn chain(depth: usize, arrays: bool, leaf: HeaderValue) -> HeaderValue {
    let mut value = leaf;
    for _ in 0..depth {
        value = HeaderValue {
            value: Some(if arrays {
                Value::Array(HeaderArray {
                    values: vec![value],
                })
            } else {
                Value::Table(HeaderTable {
                    fields: BTreeMap::from([("n".to_owned(), value)]),
                })
            }),
        };
    }
    value
}

fn headers() -> impl Strategy<Value = Option<HeaderTable>> {
    let tree = header_leaf().prop_recursive(4, 24, 4, |inner| {
        prop_oneof![
            vec(inner.clone(), 0..4).prop_map(|values| HeaderValue {
                value: Some(Value::Array(HeaderArray { values })),
            }),
            btree_map(text(), inner, 0..4).prop_map(|fields| HeaderValue {
                value: Some(Value::Table(HeaderTable { fields })),
            }),
        ]
    });
    let deep = (55usize..75, any::<bool>(), header_leaf())
        .prop_map(|(depth, arrays, leaf)| chain(depth, arrays, leaf));
    option::of(
        btree_map(text(), prop_oneof![3 => tree, 1 => deep], 0..4)
            .prop_map(|fields| HeaderTable { fields }),
    )
}

fn selector() -> impl Strategy<Value = Option<v1::Selector>> {
    option::of(
        (
            texts(),
            texts(),
            texts(),
            texts(),
            texts(),
            timestamp(),
            timestamp(),
            any::<u64>(),
            texts(),
            prop_oneof![0i32..6, any::<i32>()],
            text(),
            vec((text(), text()), 0..3),
        )
            .prop_map(
                |(
                    sources,
                    reasons,
                    destinations,
                    event_types,
                    producers,
                    from,
                    to,
                    limit,
                    ids,
                    status,
                    error_contains,
                    body_matches,
                )| {
                    v1::Selector {
                        sources,
                        reasons,
                        destinations,
                        event_types: event_types.clone(),
                        schema_versions: Vec::new(),
                        // The tuple is at proptest's 12: fingerprints get
                        // the event types' arbitrary text.
                        error_groups: event_types,
                        producers,
                        died_from: from,
                        died_to: to,
                        limit,
                        ids,
                        status,
                        error_contains,
                        body_matches: body_matches
                            .into_iter()
                            .map(|(pointer, value)| v1::BodyMatch { pointer, value })
                            .collect(),
                    }
                },
            ),
    )
}

fn options() -> impl Strategy<Value = Option<v1::PrecheckOptions>> {
    option::of(
        (
            btree_map(text(), duration().prop_map(Option::unwrap_or_default), 0..3),
            duration(),
            duration(),
            any::<u32>(),
            any::<u32>(),
            duration(),
            text(),
            any::<bool>(),
            text(),
        )
            .prop_map(
                |(stale_after, default, window, redrives, batch, timeout, pointer, over, why)| {
                    v1::PrecheckOptions {
                        stale_after: stale_after.clone(),
                        default_stale_after: default,
                        replay_key_window: window,
                        max_redrives: redrives,
                        state_check_batch_size: batch,
                        state_check_timeout: timeout,
                        block_on_state_check_error: over,
                        event_time_pointer: pointer,
                        stale_after_source: stale_after,
                        override_policy: over,
                        override_reason: why,
                    }
                },
            ),
    )
}

/// What one case sends.
#[derive(Debug, Clone)]
struct Case {
    /// Which call ([`CALLS`]).
    call: usize,
    /// Which known id a call uses (or the case's own text).
    pick: usize,
    texts: [String; 4],
    numbers: (u32, u64, f64, i32),
    selector: Option<v1::Selector>,
    options: Option<v1::PrecheckOptions>,
    headers: Option<HeaderTable>,
    duration: Option<prost_types::Duration>,
    timestamp: Option<prost_types::Timestamp>,
    body: Vec<u8>,
    garbage: Vec<u8>,
}

prop_compose! {
    /// One case: a call, with every input it may take drawn at random.
    fn case()(
        call in 0..CALLS.len(),
        pick in any::<usize>(),
        texts in [text(), text(), text(), text()],
        numbers in prop_oneof![
            (
                any::<u32>(),
                any::<u64>(),
                prop_oneof![any::<f64>(), 0.0f64..2.0, Just(f64::NAN), Just(1e300)],
                any::<i32>(),
            ),
            // Tame: mostly within the limits, so that calls get past them.
            (1u32..600, 0u64..10_000, 0.001f64..1.0, 0i32..9),
        ],
        selector in selector(),
        options in options(),
        headers in headers(),
        duration in duration(),
        timestamp in timestamp(),
        body in vec(any::<u8>(), 0..256),
        garbage in vec(any::<u8>(), 0..64),
    ) -> Case {
        Case { call, pick, texts, numbers, selector, options, headers, duration, timestamp, body, garbage }
    }
}

/// Answers per call: (accepted, refused), printed at the end to show how
/// far the cases reached.
static TALLY: std::sync::Mutex<BTreeMap<String, (u32, u32)>> =
    std::sync::Mutex::new(BTreeMap::new());

/// Fails on the codes a client must never get for its input.
fn check<T>(call: &str, answer: Result<T, Status>) -> Result<(), TestCaseError> {
    if let Ok(mut tally) = TALLY.lock() {
        let counts = tally.entry(call.to_owned()).or_default();
        if answer.is_ok() {
            counts.0 += 1;
        } else {
            counts.1 += 1;
        }
    }
    match answer {
        Err(status) if matches!(status.code(), Code::Internal | Code::Unknown) => Err(
            TestCaseError::fail(format!("{call}: {:?} {}", status.code(), status.message())),
        ),
        _ => Ok(()),
    }
}

/// Checks a streaming call's answer (waited for as [`bounded`]) and, when
/// the stream opened, its first message (a watch of a live plan goes on: the
/// first is enough).
async fn check_first<T>(
    name: &str,
    call: impl std::future::Future<Output = Result<tonic::Response<tonic::Streaming<T>>, Status>>,
) -> Result<(), TestCaseError> {
    let opened = bounded(name, call).await?;
    let Ok(stream) = opened else {
        return check(name, opened);
    };
    let first = bounded(name, stream.into_inner().message()).await?;
    check(name, first)
}

/// Waits at most 15 s for `call` (no random request may hang a handler).
async fn bounded<T>(
    name: &str,
    call: impl std::future::Future<Output = Result<T, Status>>,
) -> Result<Result<T, Status>, TestCaseError> {
    tokio::time::timeout(Duration::from_secs(15), call)
        .await
        .map_err(|_| TestCaseError::fail(format!("{name}: no answer within 15 s")))
}

/// [`check`] of `call`'s answer, waited for at most 15 s ([`bounded`]).
async fn checked<T>(
    name: &str,
    call: impl std::future::Future<Output = Result<T, Status>>,
) -> Result<(), TestCaseError> {
    check(name, bounded(name, call).await?)
}

/// Unary methods that get the case's undecodable bytes.
const RAW_METHODS: &[&str] = &[
    "/redrive.v1.Planner/ListDeadLetters",
    "/redrive.v1.Planner/RunPrecheck",
    "/redrive.v1.Planner/CreatePlan",
    "/redrive.v1.Planner/CancelPlan",
    "/redrive.v1.Planner/RepairDeadLetter",
    "/redrive.v1.Coordinator/ClaimSlice",
    "/redrive.v1.Coordinator/RecheckState",
];

/// The calls a case can make, one a case: every `Planner` and `Coordinator`
/// RPC, and undecodable bytes to a unary method.
const CALLS: &[&str] = &[
    "IngestDeadLetters",
    "ListDeadLetters",
    "GetDeadLetter",
    "SummarizeDeadLetters",
    "ArchiveDeadLetters",
    "UnarchiveDeadLetters",
    "RunPrecheck",
    "GetPrecheck",
    "ListPrecheckItems",
    "CreatePlan",
    "ApprovePlan",
    "GetPlan",
    "ListPlans",
    "PausePlan",
    "ResumePlan",
    "PromotePlan",
    "CancelPlan",
    "ListCompensations",
    "GetAuditReport",
    "ExportAudit",
    "WatchPlan",
    "ReplayDeadLetter",
    "RepairDeadLetter",
    "ClaimSlice",
    "MarkPublishing",
    "Heartbeat",
    "CompleteSlice",
    "RecheckState",
    "WatchLease",
    "ReportOutcomes",
    "raw",
];

/// Ids the planner handed out to earlier cases, so that later cases reach
/// past the lookup (a plan of a fuzzed precheck, approved with a fuzzed
/// digest, ...). Each list keeps its newest [`Known::KEEP`].
#[derive(Debug, Default)]
struct Known {
    dead_letters: Vec<String>,
    prechecks: Vec<String>,
    plans: Vec<String>,
    /// Leased slices: id, fencing token, item ids.
    slices: Vec<(String, u64, Vec<String>)>,
}

impl Known {
    const KEEP: usize = 64;

    fn add<T>(list: &mut Vec<T>, id: T) {
        if list.len() == Self::KEEP {
            list.remove(0);
        }
        list.push(id);
    }

    /// Three times in four a known id (when there is one), else `own`.
    fn pick(list: &[String], pick: usize, own: &str) -> String {
        if list.is_empty() || pick.is_multiple_of(4) {
            own.to_owned()
        } else {
            list[pick / 4 % list.len()].clone()
        }
    }
}

#[allow(clippy::too_many_lines)]
async fn run_case(
    handle: &PlannerHandle,
    planner: &mut PlannerClient<Channel>,
    coordinator: &mut CoordinatorClient<Channel>,
    known: &mut Known,
    case: Case,
) -> Result<(), TestCaseError> {
    let [a, b, c, d] = case.texts.clone();
    let (number, big, float, signed) = case.numbers;
    let name = CALLS[case.call];
    let dead_letter = Known::pick(&known.dead_letters, case.pick, &b);
    let precheck_id = Known::pick(&known.prechecks, case.pick, &c);
    let plan_id = Known::pick(&known.plans, case.pick, &a);
    // An id that names nothing: replaying a real dead letter would wait for
    // an executor.
    let absent = format!("9{:09}", big % 1_000_000_000);
    // A leased slice three times in four, with its token half of those.
    let (slice_id, token, item_id) =
        match known.slices.get(case.pick / 4 % known.slices.len().max(1)) {
            Some((slice, token, items)) if !case.pick.is_multiple_of(4) => (
                slice.clone(),
                if case.pick % 8 < 4 { *token } else { big },
                items
                    .get(number as usize % items.len().max(1))
                    .cloned()
                    .unwrap_or_else(|| c.clone()),
            ),
            _ => (b.clone(), big, c.clone()),
        };
    match name {
        "IngestDeadLetters" => {
            let item = v1::IngestDeadLettersRequest {
                source: a.clone(),
                message_id: b.clone(),
                body: case.body.clone(),
                properties: Some(v1::MessageProperties {
                    message_id: Some(c.clone()),
                    r#type: Some(d.clone()),
                    priority: Some(number),
                    ..Default::default()
                }),
                headers: case.headers.clone(),
                reason: c.clone(),
                attempts: number,
                error_text: d.clone(),
                original_destination: b.clone(),
                occurred_at: case.timestamp,
                imported: number % 2 == 0,
            };
            let ordinary = v1::IngestDeadLettersRequest {
                source: "fuzz".into(),
                original_destination: "orders".into(),
                body: case.body.clone(),
                ..Default::default()
            };
            checked(
                name,
                planner.ingest_dead_letters(tokio_stream::iter(vec![item, ordinary])),
            )
            .await
        }
        "ListDeadLetters" => {
            let answer = bounded(
                name,
                planner.list_dead_letters(v1::ListDeadLettersRequest {
                    selector: case.selector.clone(),
                    page_size: number % 2000,
                    page_token: a.clone(),
                }),
            )
            .await?;
            if let Ok(page) = &answer {
                for dead_letter in page.get_ref().dead_letters.iter().take(4) {
                    Known::add(&mut known.dead_letters, dead_letter.id.clone());
                }
            }
            check(name, answer)
        }
        "GetDeadLetter" => {
            checked(
                name,
                planner.get_dead_letter(v1::GetDeadLetterRequest { id: dead_letter }),
            )
            .await
        }
        "SummarizeDeadLetters" => {
            checked(
                name,
                planner.summarize_dead_letters(v1::SummarizeDeadLettersRequest {
                    selector: case.selector.clone(),
                    group_by: if number % 2 == 0 {
                        vec![signed % 8]
                    } else {
                        vec![signed, signed % 8, 1]
                    },
                }),
            )
            .await
        }
        "RunPrecheck" => {
            let answer = bounded(
                name,
                planner.run_precheck(v1::RunPrecheckRequest {
                    selector: case.selector.clone(),
                    options: case.options.clone(),
                }),
            )
            .await?;
            if let Ok(report) = &answer {
                Known::add(&mut known.prechecks, report.get_ref().precheck_id.clone());
            }
            check(name, answer)
        }
        "GetPrecheck" => {
            checked(
                name,
                planner.get_precheck(v1::GetPrecheckRequest { precheck_id }),
            )
            .await
        }
        "ListPrecheckItems" => {
            checked(
                name,
                planner.list_precheck_items(v1::ListPrecheckItemsRequest {
                    precheck_id,
                    verdict: signed,
                    page_size: number % 2000,
                    page_token: d.clone(),
                }),
            )
            .await
        }
        "CreatePlan" => {
            let destination = match number % 4 {
                0 => None,
                1 => Some(v1::destination::Mode::Queue(v1::QueueDestination {})),
                2 => Some(v1::destination::Mode::Exchange(v1::ExchangeDestination {})),
                _ => Some(v1::destination::Mode::Redirect(v1::RedirectDestination {
                    exchange: a.clone(),
                    routing_key: b.clone(),
                })),
            };
            let answer = bounded(
                name,
                planner.create_plan(v1::CreatePlanRequest {
                    precheck_id,
                    rate: Some(v1::Rate {
                        per_second: float,
                        burst: number,
                        rationale: d.clone(),
                    }),
                    destination: destination.map(|mode| v1::Destination { mode: Some(mode) }),
                    slice_size: number,
                    canary_fraction: Some(float),
                    // Arbitrary shares, increasing or not, in range or not.
                    ramp: vec![float * 2.0, float.abs().sqrt(), f64::from(number % 7) / 5.0],
                    observe_for: case.duration,
                    ordered: number % 2 == 0,
                    // Arbitrary text a third of the time: the webhook
                    // target's checks must refuse it by name.
                    webhook_url: if number % 3 == 0 {
                        a.clone()
                    } else {
                        String::new()
                    },
                    webhook_secret: if number % 3 == 0 {
                        b.clone()
                    } else {
                        String::new()
                    },
                }),
            )
            .await?;
            if let Ok(plan) = &answer {
                Known::add(&mut known.plans, plan.get_ref().plan_id.clone());
            }
            check(name, answer)
        }
        "ApprovePlan" => {
            // The plan's own digest half the time, so that approvals happen.
            let digest = match bounded(
                name,
                planner.get_plan(v1::GetPlanRequest {
                    plan_id: plan_id.clone(),
                }),
            )
            .await?
            {
                Ok(plan) if number % 2 == 0 => plan.into_inner().precheck_digest,
                _ => b.clone(),
            };
            checked(
                name,
                planner.approve_plan(v1::ApprovePlanRequest {
                    plan_id,
                    digest,
                    ..Default::default()
                }),
            )
            .await
        }
        "GetPlan" => check(
            name,
            bounded(name, planner.get_plan(v1::GetPlanRequest { plan_id })).await?,
        ),
        "ListPlans" => {
            checked(
                name,
                planner.list_plans(v1::ListPlansRequest {
                    states: vec![signed, signed % 10],
                    kinds: vec![signed % 4],
                    page_size: number % 2000,
                    page_token: c.clone(),
                }),
            )
            .await
        }
        "PausePlan" | "ResumePlan" | "PromotePlan" | "CancelPlan" => {
            let request = v1::PlanControlRequest {
                plan_id,
                reason: d.clone(),
                ..Default::default()
            };
            let answer = match name {
                "PausePlan" => bounded(name, planner.pause_plan(request)).await?,
                "ResumePlan" => bounded(name, planner.resume_plan(request)).await?,
                "PromotePlan" => bounded(name, planner.promote_plan(request)).await?,
                _ => bounded(name, planner.cancel_plan(request)).await?,
            };
            check(name, answer)
        }
        "ListCompensations" => {
            checked(
                name,
                planner.list_compensations(v1::ListCompensationsRequest {
                    plan_id,
                    page_size: number % 2000,
                    page_token: d.clone(),
                }),
            )
            .await
        }
        "GetAuditReport" => {
            checked(
                name,
                planner.get_audit_report(v1::GetAuditReportRequest { plan_id }),
            )
            .await
        }
        "ExportAudit" => {
            let export = bounded(
                name,
                planner.export_audit(v1::ExportAuditRequest {
                    plan_id,
                    format: signed,
                }),
            )
            .await?;
            let Ok(stream) = export else {
                return check(name, export);
            };
            let mut stream = stream.into_inner();
            while let Some(chunk) = bounded(name, stream.message()).await?.transpose() {
                check(name, chunk)?;
            }
            Ok(())
        }
        "WatchPlan" => {
            check_first(
                name,
                planner.watch_plan(v1::WatchPlanRequest {
                    plan_id,
                    include_events: number % 2 == 0,
                }),
            )
            .await
        }
        "ReplayDeadLetter" => {
            checked(
                name,
                planner.replay_dead_letter(v1::ReplayDeadLetterRequest {
                    dead_letter_id: if number % 2 == 0 {
                        absent
                    } else {
                        c.clone() + "x"
                    },
                    reason: a.clone(),
                    options: case.options.clone(),
                    wait: case.duration,
                }),
            )
            .await
        }
        "ArchiveDeadLetters" | "UnarchiveDeadLetters" => {
            let request = v1::ArchiveDeadLettersRequest {
                selector: case.selector.clone(),
                reason: c.clone(),
            };
            let answer = if name == "ArchiveDeadLetters" {
                bounded(name, planner.archive_dead_letters(request)).await?
            } else {
                bounded(name, planner.unarchive_dead_letters(request)).await?
            };
            check(name, answer)
        }
        "RepairDeadLetter" => {
            checked(
                name,
                planner.repair_dead_letter(v1::RepairDeadLetterRequest {
                    dead_letter_id: dead_letter,
                    new_body: case.body.clone(),
                    reason: c.clone(),
                }),
            )
            .await
        }
        "ClaimSlice" => {
            // At most a millisecond's long poll: a claim may lease a slice of
            // an approved fuzz plan, which then expires unreported.
            let wait = case.duration.map(|duration| prost_types::Duration {
                seconds: duration.seconds.min(0),
                nanos: duration.nanos % 1_000_000,
            });
            let answer = bounded(
                name,
                coordinator.claim_slice(v1::ClaimSliceRequest {
                    executor_id: a.clone(),
                    wait,
                    marks_publishing: number % 2 == 0,
                }),
            )
            .await?;
            if let Ok(claim) = &answer
                && let Some(slice) = &claim.get_ref().slice
            {
                let items = slice
                    .items
                    .iter()
                    .map(|item| item.item_id.clone())
                    .collect();
                Known::add(
                    &mut known.slices,
                    (slice.slice_id.clone(), slice.fencing_token, items),
                );
            }
            check(name, answer)
        }
        "MarkPublishing" => {
            checked(
                name,
                coordinator.mark_publishing(v1::MarkPublishingRequest {
                    slice_id,
                    fencing_token: token,
                    through_item_id: item_id,
                }),
            )
            .await
        }
        "Heartbeat" => {
            checked(
                name,
                coordinator.heartbeat(v1::HeartbeatRequest {
                    slice_id,
                    fencing_token: token,
                }),
            )
            .await
        }
        "CompleteSlice" => {
            checked(
                name,
                coordinator.complete_slice(v1::CompleteSliceRequest {
                    slice_id,
                    fencing_token: token,
                    release: number % 2 == 0,
                }),
            )
            .await
        }
        "RecheckState" => {
            checked(
                name,
                coordinator.recheck_state(v1::RecheckStateRequest {
                    plan_id,
                    dead_letter_ids: vec![dead_letter, d.clone()],
                    slice_id,
                    fencing_token: token,
                }),
            )
            .await
        }
        "WatchLease" => {
            check_first(
                name,
                coordinator.watch_lease(v1::WatchLeaseRequest {
                    slice_id,
                    fencing_token: token,
                }),
            )
            .await
        }
        "ReportOutcomes" => {
            let report = v1::ReportOutcomesRequest {
                slice_id: slice_id.clone(),
                fencing_token: token,
                events: vec![v1::AuditEvent {
                    plan_id,
                    slice_id,
                    dead_letter_id: dead_letter,
                    message_key: b.clone(),
                    action: signed,
                    reason: c.clone(),
                    executor_id: d.clone(),
                    attempt: number,
                    confirm_latency_us: big,
                    at: case.timestamp,
                    ..Default::default()
                }],
            };
            check_first(
                name,
                coordinator.report_outcomes(tokio_stream::iter(vec![report])),
            )
            .await
        }
        _ => {
            let method = RAW_METHODS[number as usize % RAW_METHODS.len()];
            check(
                method,
                bounded(method, raw_unary(handle, method, case.garbage.clone())).await?,
            )
        }
    }
}

#[test]
fn arbitrary_requests_never_crash_or_get_internal() -> anyhow::Result<()> {
    init_logging();
    let cases = std::env::var("REDRIVE_FUZZ_CASES")
        .ok()
        .and_then(|cases| cases.parse().ok())
        .unwrap_or(10_000);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let bed = runtime.block_on(TestBed::without_broker(|_| {}))?;
    let planner = &bed.planner;
    let (client, coordinator) = runtime.block_on(async {
        let channel = Channel::from_shared(planner.url())?.connect().await?;
        anyhow::Ok((
            PlannerClient::new(channel.clone())
                .max_decoding_message_size(64 * 1024 * 1024)
                .max_encoding_message_size(usize::MAX),
            CoordinatorClient::new(channel),
        ))
    })?;
    let mut runner = TestRunner::new(RunnerConfig {
        cases,
        failure_persistence: None,
        ..RunnerConfig::default()
    });
    let known = std::sync::Mutex::new(Known::default());
    let result = runner.run(&case(), |case| {
        // Clients are cheap clones over one connection.
        let (mut client, mut coordinator) = (client.clone(), coordinator.clone());
        let mut known = known.lock().expect("one case at a time");
        runtime.block_on(run_case(
            planner,
            &mut client,
            &mut coordinator,
            &mut known,
            case,
        ))
    });
    let serving = runtime.block_on(planner.serving())?;
    if let Ok(tally) = TALLY.lock() {
        for (call, (accepted, refused)) in tally.iter() {
            eprintln!("{call}: {accepted} accepted, {refused} refused");
        }
    }
    runtime.block_on(bed.finish())?;
    if let Err(error) = result {
        anyhow::bail!("{error}");
    }
    anyhow::ensure!(serving, "the planner no longer answers health");
    Ok(())
}
