//! `redrivectl precheck` against the fake planner: the flags and actor it
//! sends, its JSON and human reports, item pages, a hook outage, bad flags.

mod support;

use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn precheck_sends_the_flags_and_the_actor_and_prints_stable_json() {
    let (fake, address) = served().await;
    let output = redrivectl(
        address,
        &[
            "precheck",
            "--source",
            "payments.dlq",
            "--source",
            "refunds.dlq",
            "--reason",
            "rejected",
            "--event-type",
            "payment.captured",
            "--from",
            "2024-05-01T10:00:00Z",
            "--to",
            "2024-05-01T12:00:00Z",
            "--stale-after",
            "payment.*=2h",
            "--stale-after",
            "payment.captured=30m",
            "--default-stale-after",
            "1day",
            "--replay-key-window",
            "3days",
            "--max-redrives",
            "5",
            "--state-check-batch",
            "250",
            "--state-check-timeout",
            "4s",
            "--block-on-state-check-error",
            "--event-time-pointer",
            "/meta/occurred_at",
            "--actor",
            "alice",
            "--json",
        ],
        "",
    )
    .await;
    let stdout = String::from_utf8(output.stdout).unwrap();
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert_eq!(output.status.code(), Some(0), "{stdout}\n{stderr}");

    let seconds = |seconds| Some(prost_types::Duration { seconds, nanos: 0 });
    let requests = fake.prechecks.lock().unwrap().clone();
    assert_eq!(
        requests,
        [v1::RunPrecheckRequest {
            selector: Some(v1::Selector {
                sources: vec!["payments.dlq".into(), "refunds.dlq".into()],
                reasons: vec!["rejected".into()],
                event_types: vec!["payment.captured".into()],
                died_from: Some(prost_types::Timestamp {
                    seconds: 1_714_557_600,
                    nanos: 0,
                }),
                died_to: Some(prost_types::Timestamp {
                    seconds: 1_714_564_800,
                    nanos: 0,
                }),
                ..Default::default()
            }),
            options: Some(v1::PrecheckOptions {
                stale_after: [
                    ("payment.*".to_owned(), seconds(7200).unwrap()),
                    ("payment.captured".to_owned(), seconds(1800).unwrap()),
                ]
                .into_iter()
                .collect(),
                default_stale_after: seconds(86_400),
                replay_key_window: seconds(3 * 86_400),
                max_redrives: 5,
                state_check_batch_size: 250,
                state_check_timeout: seconds(4),
                block_on_state_check_error: true,
                event_time_pointer: "/meta/occurred_at".into(),
                ..Default::default()
            }),
        }]
    );
    assert_eq!(fake.actors(), [("run_precheck", Some("alice".to_owned()))]);

    let report: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    // The API's PrecheckReport in canonical proto3 JSON: uint64 counts as
    // strings, zero counts, empty breakdowns and the unset options left
    // out, enums by name.
    let counts = serde_json::json!({
        "replayable": "7", "duplicate": "1", "blockedByState": "2",
    });
    assert_eq!(
        report,
        serde_json::json!({
            "precheckId": PRECHECK_ID,
            "actor": "alice",
            "createdAt": "2024-05-01T12:00:00Z",
            "digest": "9f86d081",
            "total": "10",
            "counts": counts,
            "byDestination": [{"value": "payments", "total": "10", "counts": counts}],
            "diedFrom": "2024-05-01T10:00:00Z",
            "diedTo": "2024-05-01T11:30:00Z",
            "warnings": ["state check hooks blocked 2 of the 3 messages they checked"],
            "sampleBlocked": [{
                "deadLetterId": "41",
                "messageKey": "order-9:capture",
                "verdict": "VERDICT_BLOCKED_BY_STATE",
                "reason": "order 9 is cancelled",
                "destination": "payments",
                "eventType": "payment.captured",
            }],
        })
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn precheck_prints_a_report_people_can_read() {
    let (fake, address) = served().await;
    let output = redrivectl(address, &["precheck", "--source", "payments.dlq"], "").await;
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert_eq!(output.status.code(), Some(0), "{stdout}");
    for expected in [
        &format!("precheck id:  {PRECHECK_ID}")[..],
        "actor:        tester",
        "digest:       9f86d081",
        "total:        10",
        "died:         2024-05-01T10:00:00.000Z .. 2024-05-01T11:30:00.000Z",
        "\nreplayable          7\n",
        "\nneeds_compensation  0\n",
        "by destination:",
        "VALUE     TOTAL  REPLAYABLE  DUPLICATE  BLOCKED_BY_STATE",
        "WARNING: state check hooks blocked 2 of the 3 messages they checked",
        "first non-replayable items (1 shown of 3 not replayable):",
        "41              order-9:capture  blocked_by_state  order 9 is cancelled",
    ] {
        assert!(stdout.contains(expected), "{expected:?} in:\n{stdout}");
    }
    assert!(
        stdout.ends_with(&format!(
            "\nnext: redrivectl precheck items {PRECHECK_ID} --verdict blocked_by_state\n"
        )),
        "{stdout}"
    );
    // Options left unset go out unset: the planner applies its defaults.
    let requests = fake.prechecks.lock().unwrap().clone();
    assert_eq!(requests[0].options, Some(v1::PrecheckOptions::default()));

    // `show` prints the same report.
    let shown = redrivectl(address, &["precheck", "show", PRECHECK_ID], "").await;
    let shown = String::from_utf8(shown.stdout).unwrap();
    assert_eq!(
        shown,
        stdout.replace("actor:        tester", "actor:        carol")
    );
    let output = redrivectl(address, &["precheck", "--json", "show", PRECHECK_ID], "").await;
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(report["actor"], "carol");
    // Zero: a default value, left out.
    assert_eq!(report["counts"].get("looping"), None);
    let output = redrivectl(address, &["precheck", "show", "nope"], "").await;
    assert_eq!(output.status.code(), Some(65));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn precheck_items_follow_pages_with_the_verdict() {
    let (fake, address) = served().await;
    let output = redrivectl(
        address,
        &[
            "precheck",
            "items",
            PRECHECK_ID,
            "--verdict",
            "stale",
            "--page-size",
            "2",
            "--all",
            "--json",
            "--actor",
            "dana",
        ],
        "",
    )
    .await;
    assert_eq!(output.status.code(), Some(0));
    let listed: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(
        listed,
        // The API's ListPrecheckItemsResponse, every page's items in one;
        // an absent event type, at_send false and the last page's empty
        // token are left out.
        serde_json::json!({
            "items": [
                {"deadLetterId": "41", "messageKey": "key-41", "verdict": "VERDICT_STALE",
                 "reason": "reason 41", "destination": "payments", "eventType": "payment.captured"},
                {"deadLetterId": "42", "messageKey": "key-42", "verdict": "VERDICT_STALE",
                 "reason": "reason 42", "destination": "payments"},
                {"deadLetterId": "43", "messageKey": "key-43", "verdict": "VERDICT_STALE",
                 "reason": "reason 43", "destination": "payments", "eventType": "payment.refunded"},
            ],
        })
    );
    let calls = fake.item_calls.lock().unwrap().clone();
    assert_eq!(
        calls,
        [
            v1::ListPrecheckItemsRequest {
                precheck_id: PRECHECK_ID.into(),
                verdict: v1::Verdict::Stale.into(),
                page_size: 2,
                page_token: String::new(),
            },
            v1::ListPrecheckItemsRequest {
                precheck_id: PRECHECK_ID.into(),
                verdict: v1::Verdict::Stale.into(),
                page_size: 2,
                page_token: "p2".into(),
            },
        ]
    );
    assert!(
        fake.actors()
            .iter()
            .all(|(_, actor)| actor.as_deref() == Some("dana"))
    );

    // One page, as a table, with every verdict (--wide: every column; 80
    // columns leave out the event type here).
    let output = redrivectl(address, &["precheck", "items", PRECHECK_ID, "--wide"], "").await;
    let stdout = String::from_utf8(output.stdout).unwrap();
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 4, "{stdout}");
    assert!(
        lines[0]
            .starts_with("DEAD_LETTER_ID  VERDICT           MESSAGE_KEY  DESTINATION  EVENT_TYPE"),
        "{stdout}"
    );
    assert!(
        lines[2].contains("42              blocked_by_state  key-42       payments     -"),
        "{stdout}"
    );
    assert_eq!(lines[3], "next page token: p2");
    let calls = fake.item_calls.lock().unwrap().clone();
    assert_eq!(calls[2].verdict, i32::from(v1::Verdict::Unspecified));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_check_hook_outage_is_unavailable_and_says_which_flag() {
    let (_fake, address) = served().await;
    let output = redrivectl(address, &["precheck", "--source", "hook-down"], "").await;
    assert_eq!(output.status.code(), Some(69));
    assert!(output.stdout.is_empty());
    assert_eq!(
        String::from_utf8(output.stderr).unwrap(),
        "redrivectl: unavailable: state check hook http://127.0.0.1:9 for payment.*: connection \
         refused; the precheck is not complete. Fix the hook, or run the precheck with \
         block_on_state_check_error to mark its messages blocked_by_state \
         (redrivectl precheck --block-on-state-check-error)\n"
    );
    let output = redrivectl(
        address,
        &[
            "precheck",
            "--source",
            "hook-down",
            "--block-on-state-check-error",
        ],
        "",
    )
    .await;
    assert_eq!(output.status.code(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_precheck_flags_exit_64_before_any_call() {
    let (fake, address) = served().await;
    for (args, expected) in [
        (
            &["precheck", "--source", "q", "--stale-after", "payment.*"][..],
            "--stale-after <TYPE=DURATION>",
        ),
        (
            &["precheck", "--source", "q", "--stale-after", "pay*ment=2h"],
            "'*' may only end a pattern",
        ),
        (
            &[
                "precheck",
                "--source",
                "q",
                "--stale-after",
                "a=1h",
                "--stale-after",
                "a=2h",
            ],
            "--stale-after: a is given twice",
        ),
        (
            &["precheck", "items", PRECHECK_ID, "--verdict", "blocked"],
            "valid names: replayable, duplicate, already_replayed, looping, stale, \
             blocked_by_state, needs_compensation, invalid",
        ),
        (&["precheck", "--reason", "rejected"], "--source <SOURCE>"),
        (
            &["precheck", "--source", "q", "show", PRECHECK_ID],
            "takes no selector flags",
        ),
    ] {
        let output = redrivectl(address, args, "").await;
        let stderr = String::from_utf8(output.stderr).unwrap();
        assert_eq!(output.status.code(), Some(64), "{args:?}: {stderr}");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
    }
    assert!(fake.actors().is_empty());
}
