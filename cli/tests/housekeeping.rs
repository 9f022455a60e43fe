//! `redrivectl dead-letters archive | unarchive` and the housekeeping
//! selector flags (`--status`, `--error-contains`, `--body`) against the
//! fake planner.

mod support;

use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn archive_sends_the_selector_reason_and_actor() {
    let (fake, address) = served().await;
    let output = redrivectl(
        address,
        &[
            "dead-letters",
            "archive",
            "--id",
            "3",
            "--id",
            "7",
            "--error-contains",
            "Timeout",
            "--body",
            "/order/status=paid",
            "--reason-class",
            "poison",
            "--reason",
            "  duplicates of orders already settled ",
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
        String::from_utf8(output.stdout).unwrap(),
        "archived 1 dead letter(s) (1 unchanged)\nids: 3\n"
    );
    let archives = fake.archives.lock().unwrap().clone();
    assert_eq!(archives.len(), 1);
    let (verb, request) = &archives[0];
    assert_eq!(*verb, "archive");
    assert_eq!(request.reason, "duplicates of orders already settled");
    let selector = request.selector.clone().unwrap();
    assert_eq!(selector.ids, ["3", "7"]);
    assert_eq!(selector.reasons, ["poison"], "--reason-class filters here");
    assert_eq!(selector.error_contains, "Timeout");
    assert_eq!(
        selector.body_matches,
        [v1::BodyMatch {
            pointer: "/order/status".into(),
            value: "paid".into(),
        }]
    );
    assert_eq!(
        fake.actors(),
        [("archive", Some("tester".to_owned()))],
        "the actor travels with the call"
    );

    let output = redrivectl(
        address,
        &[
            "dead-letters",
            "unarchive",
            "--id",
            "3",
            "--status",
            "archived",
            "--reason",
            "wrong call",
            "--json",
        ],
        "",
    )
    .await;
    assert_eq!(output.status.code(), Some(0));
    assert_eq!(
        stdout_json(&output),
        // The API's ArchiveDeadLettersResponse (no ids not found: left out).
        serde_json::json!({"changed": "1", "unchanged": "1", "deadLetterIds": ["3"]})
    );
    let archives = fake.archives.lock().unwrap().clone();
    assert_eq!(archives[1].0, "unarchive");
    assert_eq!(
        archives[1].1.selector.clone().unwrap().status,
        i32::from(v1::DeadLetterStatus::Archived)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn archive_needs_a_reason_and_a_well_formed_body_filter() {
    let (fake, address) = served().await;
    for args in [
        &["dead-letters", "archive", "--id", "3"][..],
        &["dead-letters", "archive", "--id", "3", "--reason", "  "],
        &[
            "dead-letters",
            "archive",
            "--body",
            "/order/status",
            "--reason",
            "r",
        ],
        &["dead-letters", "list", "--status", "closed"],
    ] {
        let output = redrivectl(address, args, "").await;
        assert_eq!(output.status.code(), Some(64), "{args:?}");
    }
    // `--reason poison` filters in `list`: here, where it says why, a bare
    // reason class is refused rather than archiving the whole source.
    for class in ["poison", " Rejected ", "delivery_limit"] {
        let output = redrivectl(
            address,
            &[
                "dead-letters",
                "archive",
                "--source",
                "orders.dlq",
                "--reason",
                class,
            ],
            "",
        )
        .await;
        assert_eq!(output.status.code(), Some(64), "{class:?}");
        let stderr = String::from_utf8(output.stderr).unwrap();
        assert!(
            stderr.contains(&format!(
                "--reason-class {}",
                class.trim().to_ascii_lowercase()
            )),
            "{stderr}"
        );
    }
    assert!(fake.archives.lock().unwrap().is_empty());

    // An id that names nothing is said, and the exit is 65: not everything
    // asked was done.
    let output = redrivectl(
        address,
        &[
            "dead-letters",
            "archive",
            "--id",
            "5",
            "--id",
            "404",
            "--reason",
            "settled by hand",
        ],
        "",
    )
    .await;
    assert_eq!(output.status.code(), Some(65));
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert!(stdout.contains("archived 1 dead letter(s)"), "{stdout}");
    assert!(
        stdout.contains("not found (never captured here, or deleted by retention): 404"),
        "{stdout}"
    );

    // A refusal of the planner is printed with its code, exit 1.
    let output = redrivectl(
        address,
        &["dead-letters", "archive", "--id", "9", "--reason", "r"],
        "",
    )
    .await;
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(stderr.contains("failed_precondition"), "{stderr}");
    assert!(stderr.contains("plan p-1"), "{stderr}");
}
