//! Hardening (issue 13): no input crashes, wedges or bloats the planner. Every
//! request field has a bound (`redrive_proto::limits`), checked at the API
//! edge with `INVALID_ARGUMENT` naming the field and the limit; deep header
//! tables are refused before anything recurses; the planner still answers
//! health afterwards.

use std::collections::BTreeMap;

use prost::Message;
use redrive_proto::{
    limits,
    v1::{
        self, CreatePlanRequest, HeaderArray, HeaderTable, HeaderValue, IngestDeadLettersRequest,
        PlanControlRequest, PrecheckOptions, Rate, RunPrecheckRequest, header_value::Value,
        planner_client::PlannerClient,
    },
};
use redrive_tests::{
    TestBed, dead_letters_of, init_logging, precheck,
    raw::{raw_ingest, raw_unary},
    unique,
};
use tonic::{Code, Status, transport::Channel};

fn length_delimited(out: &mut Vec<u8>, field: u8, content: &[u8]) {
    let key = u32::from(field) << 3 | 2;
    if key >= 0x80 {
        out.push(u8::try_from(key & 0x7f).unwrap() | 0x80);
        out.push(u8::try_from(key >> 7).unwrap());
    } else {
        out.push(u8::try_from(key).unwrap());
    }
    let mut length = content.len();
    while length >= 0x80 {
        out.push(u8::try_from(length & 0x7f).unwrap() | 0x80);
        length >>= 7;
    }
    out.push(u8::try_from(length).unwrap());
    out.extend_from_slice(content);
}

/// An encoded `IngestDeadLettersRequest` whose headers nest `depth` tables
/// (or arrays), built inside out by hand: prost recurses to encode, so a test
/// thread could not build it.
fn deep_ingest_item(source: &str, depth: usize, arrays: bool) -> Vec<u8> {
    let mut inner = Vec::new();
    for _ in 0..depth {
        let mut value = Vec::new();
        if arrays {
            // HeaderValue.array (14) → HeaderArray.values (1) → HeaderValue.
            let mut array = Vec::new();
            length_delimited(&mut array, 1, &inner);
            length_delimited(&mut value, 14, &array);
        } else {
            // HeaderValue.table (16) → HeaderTable.fields entry → value.
            let mut entry = Vec::new();
            length_delimited(&mut entry, 1, b"n");
            length_delimited(&mut entry, 2, &inner);
            let mut table = Vec::new();
            length_delimited(&mut table, 1, &entry);
            length_delimited(&mut value, 16, &table);
        }
        inner = value;
    }
    let mut entry = Vec::new();
    length_delimited(&mut entry, 1, b"deep");
    length_delimited(&mut entry, 2, &inner);
    let mut headers = Vec::new();
    length_delimited(&mut headers, 1, &entry);
    let mut request = IngestDeadLettersRequest {
        source: source.to_owned(),
        message_id: "deep".into(),
        body: b"{}".to_vec(),
        original_destination: "orders".into(),
        ..Default::default()
    }
    .encode_to_vec();
    length_delimited(&mut request, 5, &headers);
    request
}

fn item(source: &str, message_id: &str) -> IngestDeadLettersRequest {
    IngestDeadLettersRequest {
        source: source.to_owned(),
        message_id: message_id.to_owned(),
        body: format!(r#"{{"id":"{message_id}"}}"#).into_bytes(),
        original_destination: "orders".into(),
        reason: "rejected".into(),
        ..Default::default()
    }
}

/// A header table nesting `depth` tables (the top-level one included).
fn nested_headers(depth: usize) -> HeaderTable {
    let mut table = HeaderTable::default();
    for _ in 1..depth {
        table = HeaderTable {
            fields: BTreeMap::from([(
                "n".to_owned(),
                HeaderValue {
                    value: Some(Value::Table(table)),
                },
            )]),
        };
    }
    table
}

fn assert_invalid(status: &Status, field: &str, limit: &str) {
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(
        status.message().contains(field) && status.message().contains(limit),
        "expected {field} and {limit} in {:?}",
        status.message()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_nested_thousands_deep_are_refused_and_the_planner_lives() -> anyhow::Result<()> {
    init_logging();
    let bed = TestBed::without_broker(|_| {}).await?;
    let source = unique("deep");
    // The issue's example: tables nested 3,000 deep (44 KB) aborted the
    // planner with a stack overflow; arrays are the sibling.
    for arrays in [false, true] {
        for depth in [3000, 100_000] {
            let error = raw_ingest(&bed.planner, vec![deep_ingest_item(&source, depth, arrays)])
                .await
                .unwrap_err();
            assert_eq!(error.code(), Code::InvalidArgument, "{error:?}");
            assert!(error.message().contains("deeper than"), "{error:?}");
            assert!(error.message().contains("stream item 0"), "{error:?}");
        }
    }
    assert!(
        bed.planner.serving().await?,
        "the planner still answers health"
    );

    // At the limit a table is stored and read back; one level more is one
    // item's rejection, and the stream goes on.
    let mut client = bed.planner.client().await?;
    let mut at_limit = item(&source, "at-limit");
    at_limit.headers = Some(nested_headers(limits::MAX_HEADER_NESTING));
    let mut over = item(&source, "over");
    over.headers = Some(nested_headers(limits::MAX_HEADER_NESTING + 1));
    let mut wide = item(&source, "wide");
    wide.headers = Some(HeaderTable {
        fields: (0..=limits::MAX_HEADER_VALUES)
            .map(|index| {
                (
                    format!("h{index}"),
                    HeaderValue {
                        value: Some(Value::Boolean(true)),
                    },
                )
            })
            .collect(),
    });
    let mut big = item(&source, "big");
    big.headers = Some(HeaderTable {
        fields: BTreeMap::from([(
            "big".to_owned(),
            HeaderValue {
                value: Some(Value::LongString(vec![b'x'; limits::MAX_HEADERS_BYTES])),
            },
        )]),
    });
    let mut deep_array = item(&source, "deep-array");
    let mut array = HeaderValue {
        value: Some(Value::Boolean(true)),
    };
    for _ in 0..limits::MAX_HEADER_NESTING {
        array = HeaderValue {
            value: Some(Value::Array(HeaderArray {
                values: vec![array],
            })),
        };
    }
    deep_array.headers = Some(HeaderTable {
        fields: BTreeMap::from([("a".to_owned(), array)]),
    });
    let summary = client
        .ingest_dead_letters(tokio_stream::iter(vec![
            at_limit,
            over,
            wide,
            big,
            deep_array,
            item(&source, "after"),
        ]))
        .await?
        .into_inner();
    assert_eq!(summary.accepted, 2, "{summary:?}");
    let rejected: Vec<(u64, &str)> = summary
        .rejected
        .iter()
        .map(|rejection| (rejection.index, rejection.reason.as_str()))
        .collect();
    assert_eq!(rejected.len(), 4, "{rejected:?}");
    assert_eq!(rejected[0].0, 1);
    assert!(
        rejected[0].1.contains("deeper than 64 levels"),
        "{rejected:?}"
    );
    assert_eq!(rejected[1].0, 2);
    assert!(
        rejected[1].1.contains("more than 10000 header values"),
        "{rejected:?}"
    );
    assert_eq!(rejected[2].0, 3);
    assert!(rejected[2].1.contains("at most 1048576"), "{rejected:?}");
    assert_eq!(rejected[3].0, 4);
    assert!(
        rejected[3].1.contains("deeper than 64 levels"),
        "{rejected:?}"
    );
    let listed = dead_letters_of(&mut client, &source, 10).await?;
    let stored = listed
        .dead_letters
        .iter()
        .find(|dead_letter| dead_letter.message_id.as_deref() == Some("at-limit"))
        .expect("the table at the limit is stored");
    let read_back = client
        .get_dead_letter(v1::GetDeadLetterRequest {
            id: stored.id.clone(),
        })
        .await?
        .into_inner();
    assert_eq!(
        read_back.dead_letter.unwrap().headers,
        Some(nested_headers(limits::MAX_HEADER_NESTING))
    );
    assert!(bed.planner.serving().await?);
    bed.finish().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn durations_numbers_and_text_have_bounds() -> anyhow::Result<()> {
    init_logging();
    let mut bed = TestBed::without_broker(|_| {}).await?;
    let years = |years: i64| prost_types::Duration {
        seconds: years * 365 * 24 * 3600,
        nanos: 0,
    };
    let seconds = |seconds: i64| prost_types::Duration { seconds, nanos: 0 };
    let plan = |change: &dyn Fn(&mut CreatePlanRequest)| {
        let mut request = CreatePlanRequest {
            precheck_id: uuid::Uuid::now_v7().to_string(),
            rate: Some(Rate {
                per_second: 10.0,
                burst: 1,
                rationale: "the downstream takes 40/s".into(),
            }),
            ..Default::default()
        };
        change(&mut request);
        request
    };
    // CreatePlan: `--observe 1000000000years`, `--burst 4000000000`, a 10 MB
    // rationale, a rationale with a NUL, a huge slice size.
    let cases: Vec<(CreatePlanRequest, &str, &str)> = vec![
        (
            plan(&|r| r.observe_for = Some(years(1_000_000_000))),
            "observe_for",
            "7 days",
        ),
        (
            plan(&|r| r.rate.as_mut().unwrap().burst = 4_000_000_000),
            "rate.burst",
            "1000000",
        ),
        (
            plan(&|r| r.rate.as_mut().unwrap().rationale = "x".repeat(10_000_000)),
            "rate.rationale",
            "at most 4096",
        ),
        (
            plan(&|r| r.rate.as_mut().unwrap().rationale = "a\0b".into()),
            "rate.rationale",
            "NUL",
        ),
        (plan(&|r| r.slice_size = u32::MAX), "slice_size", "10000"),
        (
            plan(&|r| r.precheck_id = "p".repeat(5000)),
            "precheck_id",
            "at most 1024",
        ),
    ];
    for (request, field, limit) in cases {
        let error = bed.client.create_plan(request).await.unwrap_err();
        assert_invalid(&error, field, limit);
    }

    // RunPrecheck: `--default-stale-after 3170000years`, `--replay-key-window
    // 100000years`, a `state_check_timeout` of 10^12 s, and their siblings.
    let precheck = |options: PrecheckOptions| RunPrecheckRequest {
        selector: None,
        options: Some(options),
    };
    let cases: Vec<(RunPrecheckRequest, &str, &str)> = vec![
        (
            precheck(PrecheckOptions {
                default_stale_after: Some(years(3_170_000)),
                ..Default::default()
            }),
            "options.default_stale_after",
            "36500 days",
        ),
        (
            precheck(PrecheckOptions {
                replay_key_window: Some(years(100_000)),
                ..Default::default()
            }),
            "options.replay_key_window",
            "36500 days",
        ),
        (
            precheck(PrecheckOptions {
                state_check_timeout: Some(seconds(1_000_000_000_000)),
                ..Default::default()
            }),
            "options.state_check_timeout",
            "120 s",
        ),
        (
            precheck(PrecheckOptions {
                stale_after: [("order.*".to_owned(), years(200))].into(),
                ..Default::default()
            }),
            "options.stale_after",
            "36500 days",
        ),
        (
            precheck(PrecheckOptions {
                stale_after_source: [("orders.dlq".to_owned(), years(200))].into(),
                ..Default::default()
            }),
            "options.stale_after_source",
            "36500 days",
        ),
        (
            precheck(PrecheckOptions {
                max_redrives: u32::MAX,
                ..Default::default()
            }),
            "options.max_redrives",
            "1000",
        ),
        (
            precheck(PrecheckOptions {
                override_policy: true,
                override_reason: "r".repeat(limits::MAX_REASON_BYTES + 1),
                ..Default::default()
            }),
            "options.override_reason",
            "at most 4096",
        ),
        (
            RunPrecheckRequest {
                selector: Some(v1::Selector {
                    limit: u64::MAX,
                    ..Default::default()
                }),
                options: None,
            },
            "selector.limit",
            "100000000",
        ),
        (
            RunPrecheckRequest {
                selector: Some(v1::Selector {
                    died_from: Some(prost_types::Timestamp {
                        seconds: 300_000_000_000,
                        nanos: 0,
                    }),
                    ..Default::default()
                }),
                options: None,
            },
            "selector.died_from",
            "9999-12-31",
        ),
        (
            RunPrecheckRequest {
                selector: Some(v1::Selector {
                    sources: (0..=limits::MAX_SELECTOR_VALUES)
                        .map(|index| format!("s{index}"))
                        .collect(),
                    ..Default::default()
                }),
                options: None,
            },
            "selector.sources",
            "more than 1000 elements",
        ),
    ];
    for (request, field, limit) in cases {
        let error = bed.client.run_precheck(request).await.unwrap_err();
        assert_invalid(&error, field, limit);
    }

    // A NUL in a selector's source, event type or producer: INVALID_ARGUMENT,
    // never INTERNAL with PostgreSQL's text.
    for selector in [
        v1::Selector {
            sources: vec!["orders\0dlq".into()],
            ..Default::default()
        },
        v1::Selector {
            event_types: vec!["order\0paid".into()],
            ..Default::default()
        },
        v1::Selector {
            producers: vec!["shop\0".into()],
            ..Default::default()
        },
    ] {
        let error = bed
            .client
            .list_dead_letters(v1::ListDeadLettersRequest {
                selector: Some(selector.clone()),
                page_size: 0,
                page_token: String::new(),
            })
            .await
            .unwrap_err();
        assert_invalid(&error, "selector.", "NUL");
        let error = bed
            .client
            .summarize_dead_letters(v1::SummarizeDeadLettersRequest {
                selector: Some(selector),
                group_by: vec![],
            })
            .await
            .unwrap_err();
        assert_invalid(&error, "selector.", "NUL");
    }
    let error = bed
        .client
        .list_plans(v1::ListPlansRequest {
            page_size: limits::MAX_PAGE_SIZE + 1,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_invalid(&error, "page_size", "1000");
    assert!(bed.planner.serving().await?);
    bed.finish().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undecodable_and_oversized_requests_get_client_codes() -> anyhow::Result<()> {
    init_logging();
    let bed = TestBed::without_broker(|_| {}).await?;
    // Garbage where a GetPlanRequest belongs (a field key of wire type 7,
    // then a length running past the end): the client's fault.
    for garbage in [vec![0xff_u8, 0xff, 0xff], vec![0x0a, 0x7f, b'x']] {
        for method in [
            "/redrive.v1.Planner/GetPlan",
            "/redrive.v1.Planner/RunPrecheck",
            "/redrive.v1.Coordinator/ClaimSlice",
        ] {
            let error = raw_unary(&bed.planner, method, garbage.clone())
                .await
                .unwrap_err();
            assert_eq!(error.code(), Code::InvalidArgument, "{method}: {error:?}");
        }
    }
    // A request over the 64 MiB message limit: RESOURCE_EXHAUSTED naming it.
    let repair = v1::RepairDeadLetterRequest {
        dead_letter_id: "1".into(),
        new_body: vec![b'x'; limits::MAX_GRPC_MESSAGE_BYTES + 1],
        reason: "fix".into(),
    };
    let error = raw_unary(
        &bed.planner,
        "/redrive.v1.Planner/RepairDeadLetter",
        repair.encode_to_vec(),
    )
    .await
    .unwrap_err();
    assert_eq!(error.code(), Code::ResourceExhausted, "{error:?}");
    assert!(error.message().contains("67108864"), "{error:?}");
    assert!(bed.planner.serving().await?);
    bed.finish().await
}

/// The issue's import example: a 4,000-character message id among ordinary
/// lines is that line's rejection; the rest are stored and counted exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_item_the_limits_refuse_does_not_stop_an_ingest() -> anyhow::Result<()> {
    init_logging();
    let mut bed = TestBed::without_broker(|_| {}).await?;
    let source = unique("import");
    let mut long_id = item(&source, "long");
    long_id.message_id = "m".repeat(4000);
    let mut nul_text = item(&source, "nul");
    nul_text.error_text = "boom\0".into();
    let mut long_property = item(&source, "property");
    long_property.properties = Some(v1::MessageProperties {
        correlation_id: Some("c".repeat(300)),
        ..Default::default()
    });
    let mut attempts = item(&source, "attempts");
    attempts.attempts = u32::MAX;
    let mut far_future = item(&source, "future");
    far_future.occurred_at = Some(prost_types::Timestamp {
        seconds: 300_000_000_000,
        nanos: 0,
    });
    // Event times no event happened at: a placeholder year, a local time
    // an hour ahead written as UTC, an unset (1970) one. A clock a minute
    // ahead is within the skew allowed.
    let at = |name: &str, at: chrono::DateTime<chrono::Utc>| {
        let mut item = item(&source, name);
        item.occurred_at = Some(prost_types::Timestamp {
            seconds: at.timestamp(),
            nanos: 0,
        });
        item
    };
    let now = chrono::Utc::now();
    let items = vec![
        item(&source, "m-1"),
        item(&source, "m-2"),
        long_id,
        item(&source, "m-3"),
        nul_text,
        long_property,
        attempts,
        far_future,
        item(&source, "m-4"),
        at("2099", now + chrono::TimeDelta::days(365 * 73)),
        at("hour-ahead", now + chrono::TimeDelta::hours(1)),
        at("unset", chrono::DateTime::UNIX_EPOCH),
        at("minute-ahead", now + chrono::TimeDelta::minutes(1)),
    ];
    let summary = bed
        .client
        .ingest_dead_letters(tokio_stream::iter(items))
        .await?
        .into_inner();
    assert_eq!(summary.accepted, 5, "{summary:?}");
    let rejected: Vec<u64> = summary.rejected.iter().map(|r| r.index).collect();
    assert_eq!(rejected, vec![2, 4, 5, 6, 7, 9, 10, 11], "{summary:?}");
    for (rejection, said) in summary.rejected[5..].iter().zip([
        "after the planner's clock",
        "59m",
        "1970-01-01T00:00:00.000Z is not a plausible event time",
    ]) {
        assert!(
            rejection.reason.starts_with("occurred_at: "),
            "{rejection:?}"
        );
        assert!(rejection.reason.contains(said), "{rejection:?}");
    }
    assert!(
        summary.rejected[0]
            .reason
            .contains("message_id: 4000 bytes, at most 255")
    );
    assert!(summary.rejected[1].reason.contains("NUL"));
    assert!(
        summary.rejected[2]
            .reason
            .contains("properties.correlation_id")
    );
    assert!(summary.rejected[3].reason.contains("attempts"));
    assert!(summary.rejected[4].reason.contains("occurred_at"));
    let listed = dead_letters_of(&mut bed.client, &source, 100).await?;
    assert_eq!(
        listed.dead_letters.len(),
        5,
        "the summary counts what is stored"
    );
    // A minute ahead is taken, but it died no later than it reached the
    // planner: never a death after the capture, nor a future arrival.
    let ahead = listed
        .dead_letters
        .iter()
        .find(|dead_letter| dead_letter.message_id.as_deref() == Some("minute-ahead"))
        .ok_or_else(|| anyhow::anyhow!("minute-ahead not stored: {listed:?}"))?;
    let instant =
        |at: &Option<prost_types::Timestamp>| at.as_ref().map(|at| (at.seconds, at.nanos));
    assert!(
        instant(&ahead.died_at) <= instant(&ahead.captured_at),
        "{ahead:?}"
    );
    bed.finish().await
}

/// A 25 MB cancel reason was committed and then made `GetPlan` fail for ever;
/// now it is refused, and the plan stays readable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reasons_are_bounded_and_plans_stay_readable() -> anyhow::Result<()> {
    init_logging();
    let bed = TestBed::without_broker(|_| {}).await?;
    let mut client: PlannerClient<Channel> = bed.planner.client().await?;
    let source = unique("reasons");
    client
        .ingest_dead_letters(tokio_stream::iter(vec![item(&source, "m-1")]))
        .await?;
    let report = precheck(&mut client, &source).await?;
    let plan = client
        .create_plan(CreatePlanRequest {
            precheck_id: report.precheck_id,
            rate: Some(Rate {
                per_second: 10.0,
                burst: 1,
                rationale: "the downstream takes 40/s".into(),
            }),
            ..Default::default()
        })
        .await?
        .into_inner();
    for reason in ["x".repeat(25_000_000), "a\0b".to_owned()] {
        let error = client
            .cancel_plan(PlanControlRequest {
                plan_id: plan.plan_id.clone(),
                reason,
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(error.code(), Code::InvalidArgument, "{error:?}");
        assert!(error.message().starts_with("reason: "), "{error:?}");
    }
    let longest = "r".repeat(limits::MAX_REASON_BYTES);
    client
        .cancel_plan(PlanControlRequest {
            plan_id: plan.plan_id.clone(),
            reason: longest.clone(),
            ..Default::default()
        })
        .await?;
    let read = client
        .get_plan(v1::GetPlanRequest {
            plan_id: plan.plan_id,
        })
        .await?
        .into_inner();
    assert_eq!(read.state(), v1::PlanState::Cancelled);
    assert!(read.actions.iter().any(|action| action.reason == longest));
    bed.finish().await
}
