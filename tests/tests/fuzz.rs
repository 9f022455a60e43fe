//! Fuzz-style test (issue 13): `proptest` strategies make arbitrary requests
//! (deep, long and boundary values: NUL characters, 5,000-byte texts, any
//! integer, any duration and timestamp, header tables nested past the limit)
//! for every `Planner` and `Coordinator` RPC, plus undecodable bytes, and
//! send them to one in-process planner. No answer may be `INTERNAL` or
//! `UNKNOWN` (a panic in a handler), and the planner answers health at the
//! end.
//!
//! `REDRIVE_FUZZ_CASES` sets the number of cases (default 48; each case makes
//! about 30 calls): `REDRIVE_FUZZ_CASES=10000 cargo test -p redrive-tests
//! --test fuzz --release` is the long run.

use std::{collections::BTreeMap, time::Duration};

use proptest::{
    collection::{btree_map, vec},
    option,
    prelude::*,
    test_runner::{Config as RunnerConfig, TestRunner},
};
use redrive_planner::Config;
use redrive_proto::v1::{
    self, HeaderArray, HeaderTable, HeaderValue, coordinator_client::CoordinatorClient,
    header_value::Value, planner_client::PlannerClient,
};
use redrive_tests::{PlannerHandle, TestDb, init_logging, raw::raw_unary};
use tonic::{Code, Status, transport::Channel};
use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};

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
        )
            .prop_map(
                |(sources, reasons, destinations, event_types, producers, from, to, limit, ids)| {
                    v1::Selector {
                        sources,
                        reasons,
                        destinations,
                        event_types,
                        schema_versions: Vec::new(),
                        producers,
                        died_from: from,
                        died_to: to,
                        limit,
                        ids,
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

fn case() -> impl Strategy<Value = Case> {
    (
        [text(), text(), text(), text()],
        (
            any::<u32>(),
            any::<u64>(),
            prop_oneof![any::<f64>(), 0.0f64..2.0, Just(f64::NAN), Just(1e300)],
            any::<i32>(),
        ),
        selector(),
        options(),
        headers(),
        duration(),
        timestamp(),
        vec(any::<u8>(), 0..256),
        vec(any::<u8>(), 0..64),
    )
        .prop_map(
            |(texts, numbers, selector, options, headers, duration, timestamp, body, garbage)| {
                Case {
                    texts,
                    numbers,
                    selector,
                    options,
                    headers,
                    duration,
                    timestamp,
                    body,
                    garbage,
                }
            },
        )
}

/// Fails on the codes a client must never get for its input.
fn check<T>(call: &str, answer: Result<T, Status>) -> Result<(), TestCaseError> {
    match answer {
        Err(status) if matches!(status.code(), Code::Internal | Code::Unknown) => Err(
            TestCaseError::fail(format!("{call}: {:?} {}", status.code(), status.message())),
        ),
        _ => Ok(()),
    }
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

#[allow(clippy::too_many_lines)]
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

async fn run_case(
    handle: &PlannerHandle,
    planner: &mut PlannerClient<Channel>,
    coordinator: &mut CoordinatorClient<Channel>,
    case: Case,
) -> Result<(), TestCaseError> {
    let [a, b, c, d] = case.texts.clone();
    let (number, big, float, signed) = case.numbers;
    // An id that names nothing: a random one could name an ingested dead
    // letter, and replaying it would wait for an executor.
    let absent = format!("9{}", big % 1_000_000_000);
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
    check(
        "IngestDeadLetters",
        bounded(
            "IngestDeadLetters",
            planner.ingest_dead_letters(tokio_stream::iter(vec![item, ordinary])),
        )
        .await?,
    )?;
    check(
        "ListDeadLetters",
        bounded(
            "ListDeadLetters",
            planner.list_dead_letters(v1::ListDeadLettersRequest {
                selector: case.selector.clone(),
                page_size: number % 2000,
                page_token: a.clone(),
            }),
        )
        .await?,
    )?;
    check(
        "GetDeadLetter",
        bounded(
            "GetDeadLetter",
            planner.get_dead_letter(v1::GetDeadLetterRequest { id: b.clone() }),
        )
        .await?,
    )?;
    check(
        "SummarizeDeadLetters",
        bounded(
            "SummarizeDeadLetters",
            planner.summarize_dead_letters(v1::SummarizeDeadLettersRequest {
                selector: case.selector.clone(),
                group_by: vec![signed, signed % 8, 1],
            }),
        )
        .await?,
    )?;
    let precheck = bounded(
        "RunPrecheck",
        planner.run_precheck(v1::RunPrecheckRequest {
            selector: case.selector.clone(),
            options: case.options.clone(),
        }),
    )
    .await?;
    let precheck_id = precheck
        .as_ref()
        .map(|report| report.get_ref().precheck_id.clone())
        .unwrap_or_else(|_| c.clone());
    check("RunPrecheck", precheck)?;
    check(
        "GetPrecheck",
        bounded(
            "GetPrecheck",
            planner.get_precheck(v1::GetPrecheckRequest {
                precheck_id: precheck_id.clone(),
            }),
        )
        .await?,
    )?;
    check(
        "ListPrecheckItems",
        bounded(
            "ListPrecheckItems",
            planner.list_precheck_items(v1::ListPrecheckItemsRequest {
                precheck_id: precheck_id.clone(),
                verdict: signed,
                page_size: number % 2000,
                page_token: d.clone(),
            }),
        )
        .await?,
    )?;
    let destination = match number % 4 {
        0 => None,
        1 => Some(v1::destination::Mode::Queue(v1::QueueDestination {})),
        2 => Some(v1::destination::Mode::Exchange(v1::ExchangeDestination {})),
        _ => Some(v1::destination::Mode::Redirect(v1::RedirectDestination {
            exchange: a.clone(),
            routing_key: b.clone(),
        })),
    };
    let plan = bounded(
        "CreatePlan",
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
            observe_for: case.duration,
        }),
    )
    .await?;
    let plan_id = plan
        .as_ref()
        .map(|plan| plan.get_ref().plan_id.clone())
        .unwrap_or_else(|_| a.clone());
    check("CreatePlan", plan)?;
    check(
        "ApprovePlan",
        bounded(
            "ApprovePlan",
            planner.approve_plan(v1::ApprovePlanRequest {
                plan_id: plan_id.clone(),
                digest: b.clone(),
            }),
        )
        .await?,
    )?;
    check(
        "GetPlan",
        bounded(
            "GetPlan",
            planner.get_plan(v1::GetPlanRequest {
                plan_id: plan_id.clone(),
            }),
        )
        .await?,
    )?;
    check(
        "ListPlans",
        bounded(
            "ListPlans",
            planner.list_plans(v1::ListPlansRequest {
                states: vec![signed, signed % 10],
                page_size: number % 2000,
                page_token: c.clone(),
            }),
        )
        .await?,
    )?;
    for (name, reason) in [("PausePlan", &a), ("ResumePlan", &b), ("PromotePlan", &c)] {
        let request = v1::PlanControlRequest {
            plan_id: plan_id.clone(),
            reason: reason.clone(),
        };
        let answer = match name {
            "PausePlan" => bounded(name, planner.pause_plan(request)).await?,
            "ResumePlan" => bounded(name, planner.resume_plan(request)).await?,
            _ => bounded(name, planner.promote_plan(request)).await?,
        };
        check(name, answer)?;
    }
    check(
        "ListCompensations",
        bounded(
            "ListCompensations",
            planner.list_compensations(v1::ListCompensationsRequest {
                plan_id: plan_id.clone(),
                page_size: number % 2000,
                page_token: d.clone(),
            }),
        )
        .await?,
    )?;
    check(
        "GetAuditReport",
        bounded(
            "GetAuditReport",
            planner.get_audit_report(v1::GetAuditReportRequest {
                plan_id: plan_id.clone(),
            }),
        )
        .await?,
    )?;
    let export = bounded(
        "ExportAudit",
        planner.export_audit(v1::ExportAuditRequest {
            plan_id: plan_id.clone(),
            format: signed,
        }),
    )
    .await?;
    if let Ok(stream) = export {
        let mut stream = stream.into_inner();
        while let Some(chunk) = bounded("ExportAudit chunk", stream.message())
            .await?
            .transpose()
        {
            check("ExportAudit chunk", chunk)?;
        }
    } else {
        check("ExportAudit", export)?;
    }
    check(
        "CancelPlan",
        bounded(
            "CancelPlan",
            planner.cancel_plan(v1::PlanControlRequest {
                plan_id: plan_id.clone(),
                reason: d.clone(),
            }),
        )
        .await?,
    )?;
    // A watch on the (now cancelled, or absent) plan ends or fails at once.
    let watch = bounded(
        "WatchPlan",
        planner.watch_plan(v1::WatchPlanRequest {
            plan_id: plan_id.clone(),
            include_events: number % 2 == 0,
        }),
    )
    .await?;
    if let Ok(stream) = watch {
        let mut stream = stream.into_inner();
        let _first = bounded("WatchPlan message", stream.message()).await?;
    } else {
        check("WatchPlan", watch)?;
    }
    check(
        "ReplayDeadLetter",
        bounded(
            "ReplayDeadLetter",
            planner.replay_dead_letter(v1::ReplayDeadLetterRequest {
                dead_letter_id: if number % 2 == 0 {
                    absent.clone()
                } else {
                    c.clone() + "x"
                },
                reason: a.clone(),
                options: case.options.clone(),
                wait: case.duration,
            }),
        )
        .await?,
    )?;
    check(
        "RepairDeadLetter",
        bounded(
            "RepairDeadLetter",
            planner.repair_dead_letter(v1::RepairDeadLetterRequest {
                dead_letter_id: b.clone(),
                new_body: case.body.clone(),
                reason: c.clone(),
            }),
        )
        .await?,
    )?;

    // The Coordinator, with ids that name no lease.
    let wait = case.duration.map(|duration| prost_types::Duration {
        seconds: duration.seconds.min(0),
        nanos: duration.nanos,
    });
    check(
        "ClaimSlice",
        bounded(
            "ClaimSlice",
            coordinator.claim_slice(v1::ClaimSliceRequest {
                executor_id: a.clone(),
                wait,
                marks_publishing: number % 2 == 0,
            }),
        )
        .await?,
    )?;
    check(
        "MarkPublishing",
        bounded(
            "MarkPublishing",
            coordinator.mark_publishing(v1::MarkPublishingRequest {
                slice_id: b.clone(),
                fencing_token: big,
                through_item_id: c.clone(),
            }),
        )
        .await?,
    )?;
    check(
        "Heartbeat",
        bounded(
            "Heartbeat",
            coordinator.heartbeat(v1::HeartbeatRequest {
                slice_id: b.clone(),
                fencing_token: big,
            }),
        )
        .await?,
    )?;
    check(
        "CompleteSlice",
        bounded(
            "CompleteSlice",
            coordinator.complete_slice(v1::CompleteSliceRequest {
                slice_id: c.clone(),
                fencing_token: big,
                release: number % 2 == 0,
            }),
        )
        .await?,
    )?;
    check(
        "RecheckState",
        bounded(
            "RecheckState",
            coordinator.recheck_state(v1::RecheckStateRequest {
                plan_id: plan_id.clone(),
                dead_letter_ids: vec![absent.clone(), d.clone()],
            }),
        )
        .await?,
    )?;
    let watch = bounded(
        "WatchLease",
        coordinator.watch_lease(v1::WatchLeaseRequest {
            slice_id: d.clone(),
            fencing_token: big,
        }),
    )
    .await?;
    if let Ok(stream) = watch {
        let mut stream = stream.into_inner();
        let _first = bounded("WatchLease message", stream.message()).await?;
    } else {
        check("WatchLease", watch)?;
    }
    let report = v1::ReportOutcomesRequest {
        slice_id: a.clone(),
        fencing_token: big,
        events: vec![v1::AuditEvent {
            plan_id,
            dead_letter_id: absent,
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
    let reports = bounded(
        "ReportOutcomes",
        coordinator.report_outcomes(tokio_stream::iter(vec![report])),
    )
    .await?;
    if let Ok(stream) = reports {
        let mut stream = stream.into_inner();
        let answer = bounded("ReportOutcomes answer", stream.message()).await?;
        check("ReportOutcomes answer", answer)?;
    } else {
        check("ReportOutcomes", reports)?;
    }
    let method = RAW_METHODS[number as usize % RAW_METHODS.len()];
    check(
        method,
        bounded(method, raw_unary(handle, method, case.garbage.clone())).await?,
    )?;
    Ok(())
}

#[test]
fn arbitrary_requests_never_crash_or_get_internal() -> anyhow::Result<()> {
    init_logging();
    let cases = std::env::var("REDRIVE_FUZZ_CASES")
        .ok()
        .and_then(|cases| cases.parse().ok())
        .unwrap_or(48);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let db = TestDb::new();
    let planner = runtime.block_on(PlannerHandle::start(Config::for_database(db.url())))?;
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
    let result = runner.run(&case(), |case| {
        // Clients are cheap clones over one connection.
        let (mut client, mut coordinator) = (client.clone(), coordinator.clone());
        runtime.block_on(run_case(&planner, &mut client, &mut coordinator, case))
    });
    let serving = runtime.block_on(async {
        let channel = Channel::from_shared(planner.url())?.connect().await?;
        let answer = HealthClient::new(channel)
            .check(HealthCheckRequest {
                service: "redrive.v1.Planner".into(),
            })
            .await?
            .into_inner();
        anyhow::Ok(answer.status() == ServingStatus::Serving)
    })?;
    runtime.block_on(planner.stop())?;
    runtime.block_on(db.drop_database());
    if let Err(error) = result {
        anyhow::bail!("{error}");
    }
    anyhow::ensure!(serving, "the planner no longer answers health");
    Ok(())
}
