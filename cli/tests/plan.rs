//! `redrivectl plan` against the fake planner: create, approve, the
//! controls, list, wait, watch (lines, stall warning, countdown), report.

mod support;

use support::*;

/// `plan create` of the fake's precheck at 50/s, burst 10, rationale "r".
const CREATE_AT_50: [&str; 10] = [
    "plan",
    "create",
    "--precheck",
    PRECHECK_ID,
    "--rate",
    "50",
    "--burst",
    "10",
    "--rationale",
    "r",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plan_create_sends_the_flags_and_prints_the_plan() {
    let (fake, address) = served().await;
    let secret_file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        secret_file.path(),
        "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD\n",
    )
    .unwrap();
    let secret_path = secret_file.path().to_str().unwrap().to_owned();
    let output = redrivectl(
        address,
        &[
            "plan",
            "create",
            "--precheck",
            PRECHECK_ID,
            "--rate",
            "12.5",
            "--burst",
            "5",
            "--rationale",
            "payments-api sustains 300/s, peak 200/s",
            "--destination",
            "redirect:quarantine/",
            "--slice-size",
            "50",
            "--canary-fraction",
            "0.05",
            "--ramp",
            "20%,0.6",
            "--observe",
            "30m",
            "--ordered",
            "--webhook-url",
            "https://hooks.example.com/redrive",
            "--webhook-secret-file",
            &secret_path,
            "--json",
            "--actor",
            "alice",
        ],
        "",
    )
    .await;
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(
        fake.plan_calls(),
        [PlanCall::Create(v1::CreatePlanRequest {
            precheck_id: PRECHECK_ID.into(),
            rate: Some(v1::Rate {
                per_second: 12.5,
                burst: 5,
                rationale: "payments-api sustains 300/s, peak 200/s".into(),
            }),
            destination: Some(v1::Destination {
                mode: Some(v1::destination::Mode::Redirect(v1::RedirectDestination {
                    exchange: "quarantine".into(),
                    routing_key: String::new(),
                })),
            }),
            slice_size: 50,
            canary_fraction: Some(0.05),
            ramp: vec![0.2, 0.6],
            observe_for: Some(prost_types::Duration {
                seconds: 1800,
                nanos: 0,
            }),
            ordered: true,
            webhook_url: "https://hooks.example.com/redrive".into(),
            // The file's text, its newline dropped.
            webhook_secret: "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD".into(),
        })]
    );
    // The API's Plan in canonical proto3 JSON.
    let plan = stdout_json(&output);
    assert_eq!(plan["planId"], "plan-new");
    assert_eq!(plan["state"], "PLAN_STATE_AWAITING_APPROVAL");
    assert_eq!(plan["precheckDigest"], DIGEST);
    assert_eq!(
        plan["rate"],
        serde_json::json!({"perSecond": 12.5, "burst": 5,
                           "rationale": "payments-api sustains 300/s, peak 200/s"})
    );
    // An empty routing key is a default value: left out.
    assert_eq!(
        plan["destination"],
        serde_json::json!({"redirect": {"exchange": "quarantine"}})
    );
    assert_eq!(plan["observeFor"], "1800s");
    assert_eq!(plan["createdBy"], "alice");
    // Every count zero: each left out as a default value.
    assert_eq!(plan["counts"], serde_json::json!({}));

    // People get the plan and the command to approve it; defaults left unset.
    let output = redrivectl(address, &CREATE_AT_50, "").await;
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert_eq!(output.status.code(), Some(0), "{stdout}");
    for expected in [
        "plan id:      plan-new",
        "state:        awaiting_approval",
        "rate:         50/s, burst 10",
        "rationale:    r",
        "destination:  queue",
        "items:        7 total, 1 in the canary (14.29% of the items; asked 1%, rounded up to whole items)",
        "WARNING: 2 of 9 items are not replayable and stay out",
    ] {
        assert!(stdout.contains(expected), "{expected:?} in:\n{stdout}");
    }
    assert!(
        stdout.ends_with(&format!(
            "\nnext: redrivectl plan approve plan-new --digest {DIGEST}\n"
        )),
        "{stdout}"
    );
    // The hint keeps the --planner and --profile typed, so it goes where
    // this command went (not to the default planner).
    let config_home = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(config_home.path().join("redrive")).unwrap();
    std::fs::write(
        config_home.path().join("redrive/config.toml"),
        format!("[profiles.prod]\nplanner = \"http://{address}\"\n"),
    )
    .unwrap();
    let home = config_home.path().to_str().unwrap();
    let planner = format!("http://{address}");
    for (flags, prefix) in [
        (
            vec!["--planner", planner.as_str()],
            format!("redrivectl --planner {planner}"),
        ),
        (
            vec!["--profile", "prod"],
            "redrivectl --profile prod".to_owned(),
        ),
    ] {
        let mut args = flags.clone();
        args.extend(CREATE_AT_50);
        let output = redrivectl_with_env(
            address,
            &args,
            "",
            &[
                ("REDRIVE_PLANNER", None),
                ("XDG_CONFIG_HOME", Some(home)),
                ("USER", Some("tester")),
            ],
        )
        .await;
        let stdout = String::from_utf8(output.stdout).unwrap();
        assert!(
            stdout.ends_with(&format!(
                "\nnext: {prefix} plan approve plan-new --digest {DIGEST}\n"
            )),
            "{flags:?}: {stdout}"
        );
    }
    let PlanCall::Create(request) = &fake.plan_calls()[1] else {
        panic!("not create");
    };
    assert_eq!(
        (
            request.slice_size,
            request.canary_fraction,
            request.observe_for
        ),
        (0, None, None)
    );
    assert_eq!(
        request.destination,
        Some(v1::Destination {
            mode: Some(v1::destination::Mode::Queue(v1::QueueDestination {})),
        })
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_plan_flags_exit_64_before_any_call() {
    let (fake, address) = served().await;
    let create = |extra: &[&'static str]| {
        let mut args = CREATE_AT_50.to_vec();
        args.extend_from_slice(extra);
        args
    };
    for (args, expected) in [
        (create(&["--rate", "0"]), "--rate <PER_SECOND>"),
        (create(&["--burst", "0"]), "--burst <N>"),
        (create(&["--rationale", "  "]), "--rationale <TEXT>"),
        (
            create(&["--destination", "redirect:quarantine"]),
            "--destination <DESTINATION>",
        ),
        (
            create(&["--canary-fraction", "1.5"]),
            "--canary-fraction <F>",
        ),
        (create(&["--observe", "0s"]), "--observe <DURATION>"),
        (
            vec!["plan", "wait", "plan-done", "--timeout", "never"],
            "--timeout <DURATION>",
        ),
        (
            vec!["plan", "list", "--state", "running"],
            "valid names: awaiting_approval",
        ),
        (
            vec!["plan", "report", "plan-done", "--format", "xml"],
            "--format <FORMAT>",
        ),
        (vec!["plan", "approve", "plan-new"], "--digest <DIGEST>"),
    ] {
        let output = redrivectl(address, &args, "").await;
        let stderr = String::from_utf8(output.stderr).unwrap();
        assert_eq!(output.status.code(), Some(64), "{args:?}: {stderr}");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
    }
    assert!(fake.plan_calls().is_empty());
    assert!(fake.actors().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plan_wait_exits_0_when_completed_1_when_cancelled_75_on_timeout() {
    let (fake, address) = served().await;
    let wait = |plan_id: &'static str, extra: &[&'static str]| {
        let mut args = vec!["plan", "wait", plan_id, "--interval", "10ms", "--json"];
        args.extend_from_slice(extra);
        args
    };

    // Completed: exit 0, the final plan on stdout.
    let output = redrivectl(address, &wait("plan-done", &[]), "").await;
    assert_eq!(output.status.code(), Some(0));
    assert_eq!(stdout_json(&output)["state"], "PLAN_STATE_COMPLETED");
    assert!(output.stderr.is_empty());
    assert_eq!(fake.polls("plan-done"), 3);

    // Paused is not final: the wait goes on until it completes.
    let output = redrivectl(address, &wait("plan-paused", &[]), "").await;
    assert_eq!(output.status.code(), Some(0));
    assert_eq!(fake.polls("plan-paused"), 3);

    // Cancelled or aborted: exit 1, the plan on stdout, why on stderr.
    let output = redrivectl(address, &wait("plan-cancelled", &[]), "").await;
    assert_eq!(output.status.code(), Some(1));
    assert_eq!(stdout_json(&output)["state"], "PLAN_STATE_CANCELLED");
    // With --json, why is JSON on stderr too.
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&output.stderr).unwrap(),
        serde_json::json!({"error": {
            "code": "not_completed",
            "message": "plan plan-cancelled ended cancelled (wrong selection), not completed"
        }})
    );
    let output = redrivectl(address, &["plan", "wait", "plan-aborted"], "").await;
    assert_eq!(output.status.code(), Some(1));
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert!(
        stdout.contains("state:        aborted (canary gate: 1 failed)"),
        "{stdout}"
    );
    assert!(
        stdout.ends_with("next: redrivectl plan report plan-aborted\n"),
        "{stdout}"
    );

    // Timeout: exit 75 with the last plan seen.
    let output = redrivectl(address, &wait("plan-slow", &["--timeout", "2s"]), "").await;
    assert_eq!(output.status.code(), Some(75));
    assert_eq!(stdout_json(&output)["state"], "PLAN_STATE_MAIN");
    assert_eq!(
        String::from_utf8(output.stderr).unwrap(),
        "{\"error\":{\"code\":\"timeout\",\"message\":\"timed out after 2s: plan plan-slow is still main \
         (--timeout)\"}}\n"
    );
    assert!(fake.polls("plan-slow") >= 2);

    // A planner that is briefly unavailable is waited for.
    let output = redrivectl(address, &wait("plan-flaky", &[]), "").await;
    assert_eq!(output.status.code(), Some(0));
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(
        stderr.contains("unavailable (planner restarting); still waiting"),
        "{stderr}"
    );
    // --json: the note is a JSON warning line.
    let warning: serde_json::Value = serde_json::from_str(stderr.trim_end()).unwrap();
    assert_eq!(warning["warning"]["code"], "unavailable");

    // An unknown plan is not found at once.
    let output = redrivectl(address, &wait("plan-nope", &["--timeout", "5s"]), "").await;
    assert_eq!(output.status.code(), Some(65));
    assert_eq!(
        String::from_utf8(output.stderr).unwrap(),
        "{\"error\":{\"code\":\"not_found\",\"message\":\"plan plan-nope not found\"}}\n"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plan_watch_prints_one_line_per_update() {
    let (fake, address) = served().await;
    let output = redrivectl(
        address,
        &["plan", "watch", "plan-done", "--events", "--json"],
        "",
    )
    .await;
    assert_eq!(output.status.code(), Some(0));
    let stdout = String::from_utf8(output.stdout).unwrap();
    let lines: Vec<serde_json::Value> = stdout
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    let kinds: Vec<(&str, &str)> = lines
        .iter()
        .map(|line| {
            let object = line.as_object().unwrap();
            assert_eq!(object.len(), 1, "{line}");
            let (kind, value) = object.iter().next().unwrap();
            let detail = match kind.as_str() {
                "progress" => value["state"].as_str().unwrap(),
                _ => value["action"].as_str().unwrap(),
            };
            (kind.as_str(), detail)
        })
        .collect();
    assert_eq!(
        kinds,
        [
            ("progress", "PLAN_STATE_CANARY"),
            ("event", "AUDIT_ACTION_SENT"),
            ("progress", "PLAN_STATE_MAIN"),
            ("event", "AUDIT_ACTION_SKIPPED_STALE"),
            ("progress", "PLAN_STATE_COMPLETED"),
        ]
    );
    // uint64 values are strings in proto3 JSON.
    assert_eq!(lines[4]["progress"]["itemsDone"], "7");
    assert_eq!(lines[4]["progress"]["counts"]["sent"], "7");
    assert_eq!(
        lines[3]["event"],
        serde_json::json!({
            "planId": "plan-done", "sliceId": "slice-1", "deadLetterId": "41",
            "messageKey": "order-7:pay", "action": "AUDIT_ACTION_SKIPPED_STALE",
            "reason": "older than 2h", "wave": "WAVE_MAIN", "executorId": "executor-1",
            "attempt": 1, "confirmLatencyUs": "900", "at": "2024-05-01T12:03:20Z",
        })
    );
    assert_eq!(
        fake.plan_calls(),
        [PlanCall::Watch(v1::WatchPlanRequest {
            plan_id: "plan-done".into(),
            include_events: true,
        })]
    );
    // The last snapshot was final: no GetPlan needed.
    assert_eq!(fake.polls("plan-done"), 0);

    // Not a terminal: one line per update, then the final state.
    let output = redrivectl(address, &["plan", "watch", "plan-done"], "").await;
    assert_eq!(output.status.code(), Some(0));
    // The pace: no rate yet (snapshots under a second apart), time since
    // the watch began (these plans have no approval time), no estimate.
    assert_eq!(
        String::from_utf8(output.stdout).unwrap(),
        "canary  1/7 14.3%  sent 1  rate —  watched 0s  eta —\n\
         main  4/7 57.1%  sent 4  rate —  watched 0s  eta —\n\
         completed  7/7 100.0%  sent 7\n\
         plan plan-done completed\n"
    );
    let output = redrivectl(address, &["plan", "watch", "plan-done", "--events"], "").await;
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert!(
        stdout.contains(
            "main  4/7 57.1%  sent 4  rate —  watched 0s  eta —\n\
             2024-05-01T12:03:20.000Z skipped_stale order-7:pay older than 2h\n"
        ),
        "{stdout}"
    );

    // A stream that ends before the plan is final: watch again.
    let output = redrivectl(address, &["plan", "watch", "plan-cut"], "").await;
    assert_eq!(output.status.code(), Some(69));
    assert_eq!(
        String::from_utf8(output.stdout).unwrap(),
        "main  3/7 42.9%  sent 3  rate —  watched 0s  eta —\n"
    );
    assert_eq!(
        String::from_utf8(output.stderr).unwrap(),
        "redrivectl: unavailable: the watch stream ended while plan plan-cut is still main; \
         run `redrivectl plan watch plan-cut` again\n"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plan_watch_warns_once_of_a_stall_and_says_when_it_ends() {
    let (fake, address) = served().await;

    // Lines: the plan stays in main at 3/7; the planner sends nothing.
    let (mut child, mut lines) = redrivectl_live(
        address,
        &["plan", "watch", "plan-stalled", "--stall-after", "1s"],
    );
    let seen = lines_around(
        &mut lines,
        |line| line.starts_with("warning: "),
        || fake.resume.notify_one(),
    )
    .await;
    assert_eq!(child.wait().unwrap().code(), Some(0), "{seen:#?}");
    // Approved 90 s ago; no rate nor estimate from one snapshot.
    assert!(
        seen[0].starts_with("main  3/7 42.9%  sent 3  rate —  elapsed 1m3")
            && seen[0].ends_with("  eta —"),
        "{seen:#?}"
    );
    let warnings: Vec<&String> = seen
        .iter()
        .filter(|line| line.starts_with("warning: "))
        .collect();
    assert_eq!(warnings.len(), 1, "once per stall: {seen:#?}");
    let warning = warnings[0];
    assert!(
        warning.starts_with("warning: no progress for ")
            && warning.ends_with(
                "s (plan main, 3/7 done); check the executors: are any running, what do their \
                 logs say? (to stop the plan: redrivectl plan pause plan-stalled --reason TEXT)"
            ),
        "{warning}"
    );
    let resumed = seen
        .iter()
        .position(|line| line.starts_with("progress resumed after "))
        .unwrap_or_else(|| panic!("no resumed line: {seen:#?}"));
    assert!(
        seen[resumed].ends_with("s stalled (plan main, 4/7 done)"),
        "{seen:#?}"
    );
    // Progress again: a rate above zero, and an estimate for the other 3.
    let moving = &seen[resumed + 1];
    assert!(
        moving.starts_with("main  4/7 57.1%  sent 4  rate "),
        "{moving}"
    );
    let rate: f64 = figure(moving, "rate")
        .strip_suffix("/s")
        .unwrap()
        .parse()
        .unwrap();
    assert!(rate > 0.0, "{moving}");
    assert_ne!(figure(moving, "eta"), "—", "{moving}");
    assert_eq!(
        seen[resumed + 2..],
        [
            "completed  7/7 100.0%  sent 7",
            "plan plan-stalled completed"
        ],
        "{seen:#?}"
    );

    // JSON: the same as tagged objects.
    let (mut child, mut lines) = redrivectl_live(
        address,
        &[
            "plan",
            "watch",
            "plan-stalled",
            "--stall-after",
            "1s",
            "--json",
        ],
    );
    let seen = lines_around(
        &mut lines,
        |line| line.starts_with("{\"stalled\""),
        || fake.resume.notify_one(),
    )
    .await;
    assert_eq!(child.wait().unwrap().code(), Some(0), "{seen:#?}");
    let objects: Vec<serde_json::Value> = seen
        .iter()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    let kinds: Vec<&str> = objects
        .iter()
        .map(|object| object.as_object().unwrap().keys().next().unwrap().as_str())
        .collect();
    assert_eq!(
        kinds,
        ["progress", "stalled", "resumed", "progress", "progress"],
        "{seen:#?}"
    );
    let stalled = &objects[1]["stalled"];
    assert_eq!(stalled["plan_id"], "plan-stalled");
    assert_eq!(stalled["state"], "main");
    assert_eq!(stalled["items_done"], 3);
    assert_eq!(stalled["total_items"], 7);
    assert!(
        stalled["no_progress_seconds"].as_u64().unwrap() >= 1,
        "{stalled}"
    );
    assert!(
        stalled["message"]
            .as_str()
            .unwrap()
            .starts_with("no progress for "),
        "{stalled}"
    );
    assert_eq!(objects[2]["resumed"]["items_done"], 4);
    assert_eq!(objects[4]["progress"]["state"], "PLAN_STATE_COMPLETED");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plan_watch_counts_down_the_observation_window() {
    let (_fake, address) = served().await;
    let output = redrivectl(address, &["plan", "watch", "plan-observing"], "").await;
    assert_eq!(output.status.code(), Some(0));
    let stdout = String::from_utf8(output.stdout).unwrap();
    let first = stdout.lines().next().unwrap();
    assert!(
        first.starts_with("observing  1/7 14.3%  sent 1  rate —  watched 0s  eta —"),
        "{stdout}"
    );
    // 10 minutes from when the fake answered, a moment ago: until when, the
    // time left, and how to end the window now.
    let until = figure(first, "observing until");
    assert!(
        until.ends_with(
            "left); to send the rest now: redrivectl plan promote plan-observing --reason TEXT"
        ),
        "{stdout}"
    );
    let left = until.split(" (").nth(1).unwrap();
    assert!(
        left.starts_with("9m5") || left.starts_with("10m00s"),
        "{stdout}"
    );
    let until = until.split(' ').next().unwrap();
    assert!(
        chrono::DateTime::parse_from_rfc3339(until).is_ok() && until.ends_with('Z'),
        "{stdout}"
    );
    let output = redrivectl(address, &["plan", "watch", "plan-observing", "--json"], "").await;
    let stdout = String::from_utf8(output.stdout).unwrap();
    let first: serde_json::Value = serde_json::from_str(stdout.lines().next().unwrap()).unwrap();
    assert!(first["progress"]["observingUntil"].is_string(), "{stdout}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plan_report_csv_and_jsonl_pass_the_export_through_byte_for_byte() {
    let (fake, address) = served().await;
    let expected: Vec<u8> = CSV_CHUNKS.concat();
    for args in [
        &["plan", "report", "plan-done", "--format", "csv"][..],
        // The export is the export, --json or not.
        &["plan", "report", "plan-done", "--format", "csv", "--json"],
    ] {
        let output = redrivectl(address, args, "").await;
        assert_eq!(output.status.code(), Some(0), "{args:?}");
        assert_eq!(output.stdout, expected, "{args:?}");
    }
    let output = redrivectl(
        address,
        &["plan", "report", "plan-done", "--format", "jsonl"],
        "",
    )
    .await;
    assert_eq!(
        String::from_utf8(output.stdout).unwrap(),
        "{\"message_key\":\"order-1:pay\",\"action\":\"sent\"}\n\
         {\"message_key\":\"order-7:pay\",\"action\":\"skipped_stale\"}\n"
    );
    let export = |format: v1::ExportFormat| {
        PlanCall::Export(v1::ExportAuditRequest {
            plan_id: "plan-done".into(),
            format: format.into(),
        })
    };
    assert_eq!(
        fake.plan_calls(),
        [
            export(v1::ExportFormat::Csv),
            export(v1::ExportFormat::Csv),
            export(v1::ExportFormat::Jsonl),
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plan_report_json_and_text() {
    let (fake, address) = served().await;
    let output = redrivectl(address, &["plan", "report", "plan-done", "--json"], "").await;
    assert_eq!(output.status.code(), Some(0));
    let report = stdout_json(&output);
    assert_eq!(
        report.as_object().unwrap().keys().collect::<Vec<_>>(),
        // The API's AuditReport; fields at their default value left out:
        // nothing never attempted, no key possibly duplicated.
        ["counts", "notSent", "plan", "sentKeys"]
    );
    assert_eq!(report["plan"]["state"], "PLAN_STATE_COMPLETED");
    assert_eq!(report["counts"]["sent"], "6");
    // Zero: a default value, left out.
    assert_eq!(report["counts"].get("uncertain"), None);
    assert_eq!(report["sentKeys"].as_array().unwrap().len(), 6);
    assert_eq!(report["sentKeys"][0], "order-1:pay");
    assert_eq!(report["notSent"][0]["reason"], "older than 2h");
    // --format json without --json is the same document.
    let output = redrivectl(
        address,
        &["plan", "report", "plan-done", "--format", "json"],
        "",
    )
    .await;
    assert_eq!(stdout_json(&output), report);

    // --wide: 80 columns have no room for the AT column.
    let output = redrivectl(address, &["plan", "report", "plan-done", "--wide"], "").await;
    let stdout = String::from_utf8(output.stdout).unwrap();
    for expected in [
        "state:        completed",
        "sent                6",
        "skipped_stale       1",
        "sent keys: 6\n  order-1:pay\n",
        "not sent: 1",
        "41              order-7:pay  skipped_stale  main  2024-05-01T12:03:20.000Z  older than 2h",
        "redrivectl plan report plan-done --format csv",
    ] {
        assert!(stdout.contains(expected), "{expected:?} in:\n{stdout}");
    }
    assert!(
        fake.plan_calls()
            .iter()
            .all(|call| matches!(call, PlanCall::Report(_)))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plan_approve_and_controls_send_the_id_reason_and_actor() {
    let (fake, address) = served().await;
    let output = redrivectl(
        address,
        &[
            "plan", "approve", "plan-new", "--digest", DIGEST, "--actor", "bob", "--json",
        ],
        "",
    )
    .await;
    assert_eq!(output.status.code(), Some(0));
    let plan = stdout_json(&output);
    assert_eq!(
        (plan["state"].clone(), plan["approvedBy"].clone()),
        ("PLAN_STATE_CANARY".into(), "bob".into())
    );

    // A digest that does not match is refused by the planner (exit 1).
    let output = redrivectl(
        address,
        &["plan", "approve", "plan-new", "--digest", "0000"],
        "",
    )
    .await;
    assert_eq!(output.status.code(), Some(1));
    assert_eq!(
        String::from_utf8(output.stderr).unwrap(),
        "redrivectl: failed_precondition: digest 0000 is not the precheck's digest 9f86d081\n"
    );

    for (command, state) in [
        ("promote", "PLAN_STATE_MAIN"),
        ("pause", "PLAN_STATE_PAUSED"),
        ("resume", "PLAN_STATE_MAIN"),
        ("cancel", "PLAN_STATE_CANCELLED"),
    ] {
        let output = redrivectl(
            address,
            &[
                "plan",
                command,
                "plan-done",
                "--reason",
                "downstream alarm",
                "--json",
            ],
            "",
        )
        .await;
        assert_eq!(output.status.code(), Some(0), "{command}");
        let plan = stdout_json(&output);
        assert_eq!(plan["state"], state, "{command}");
        assert_eq!(
            plan["actions"],
            serde_json::json!([{"action": command, "actor": "tester",
                               "reason": "downstream alarm", "at": "2024-05-01T12:10:00Z"}])
        );
    }
    let output = redrivectl(address, &["plan", "pause", "plan-done"], "").await;
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert!(stdout.contains("state:        paused\n"), "{stdout}");
    assert!(
        stdout.ends_with("next: redrivectl plan resume plan-done --reason TEXT\n"),
        "{stdout}"
    );

    let control = |method, reason: &str| {
        PlanCall::Control(
            method,
            v1::PlanControlRequest {
                plan_id: "plan-done".into(),
                reason: reason.into(),
                ..Default::default()
            },
        )
    };
    let approve = |digest: &str| {
        PlanCall::Approve(v1::ApprovePlanRequest {
            plan_id: "plan-new".into(),
            digest: digest.into(),
            ..Default::default()
        })
    };
    assert_eq!(
        fake.plan_calls(),
        [
            approve(DIGEST),
            approve("0000"),
            control("promote", "downstream alarm"),
            control("pause", "downstream alarm"),
            control("resume", "downstream alarm"),
            control("cancel", "downstream alarm"),
            control("pause", ""),
        ]
    );
    let actors = fake.actors();
    assert_eq!(actors[0], ("approve_plan", Some("bob".to_owned())));
    assert_eq!(actors[2], ("promote", Some("tester".to_owned())));

    // status (alias show) is GetPlan.
    let output = redrivectl(address, &["plan", "show", "plan-done", "--json"], "").await;
    assert_eq!(stdout_json(&output)["state"], "PLAN_STATE_MAIN");
    let output = redrivectl(address, &["plan", "status", "plan-nope"], "").await;
    assert_eq!(output.status.code(), Some(65));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plan_list_and_compensations_follow_pages() {
    let (fake, address) = served().await;
    let output = redrivectl(
        address,
        &[
            "plan",
            "list",
            "--state",
            "main",
            "--state",
            "cancelled",
            "--kind",
            "single",
            "--kind",
            "BULK",
            "--page-size",
            "1",
            "--all",
            "--json",
        ],
        "",
    )
    .await;
    assert_eq!(output.status.code(), Some(0));
    let listed = stdout_json(&output);
    let states: Vec<(&str, &str)> = listed["plans"]
        .as_array()
        .unwrap()
        .iter()
        .map(|plan| {
            (
                plan["planId"].as_str().unwrap(),
                plan["state"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        states,
        [
            ("plan-done", "PLAN_STATE_MAIN"),
            ("plan-cancelled", "PLAN_STATE_CANCELLED")
        ]
    );
    // The last page: no next page token (a default value, left out).
    assert_eq!(listed.get("nextPageToken"), None);
    let list = |token: &str| {
        PlanCall::List(v1::ListPlansRequest {
            states: vec![v1::PlanState::Main.into(), v1::PlanState::Cancelled.into()],
            kinds: vec![v1::PlanKind::Single.into(), v1::PlanKind::Bulk.into()],
            page_size: 1,
            page_token: token.into(),
        })
    };
    assert_eq!(fake.plan_calls(), [list(""), list("p2")]);

    let output = redrivectl(address, &["plan", "list"], "").await;
    let stdout = String::from_utf8(output.stdout).unwrap();
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{stdout}");
    assert!(
        lines[0].starts_with("PLAN_ID    STATE  KIND  DONE         RATE  DESTINATION  CREATED_BY"),
        "{stdout}"
    );
    assert!(
        lines[1].starts_with("plan-done  main   bulk  3/7 (42.9%)  50/s  queue        alice"),
        "{stdout}"
    );
    assert_eq!(lines[2], "next page token: p2");

    let output = redrivectl(
        address,
        &["plan", "compensations", "plan-done", "--all", "--json"],
        "",
    )
    .await;
    assert_eq!(output.status.code(), Some(0));
    let items = stdout_json(&output);
    assert_eq!(items["items"].as_array().unwrap().len(), 3);
    assert_eq!(
        items["items"][2],
        // at_send false: a default value, left out.
        serde_json::json!({
            "deadLetterId": "53", "messageKey": "order-53:refund",
            "verdict": "VERDICT_NEEDS_COMPENSATION", "reason": "refund 53 already issued by hand",
            "destination": "payments", "eventType": "payment.refunded",
        })
    );
    assert_eq!(items.get("nextPageToken"), None);
    let output = redrivectl(address, &["plan", "compensations", "plan-done"], "").await;
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert!(
        stdout.contains("51              needs_compensation  order-51:refund"),
        "{stdout}"
    );
    assert!(stdout.ends_with("next page token: c2\n"), "{stdout}");
}
