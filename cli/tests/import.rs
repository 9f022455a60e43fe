//! `redrivectl import` against the fake planner: rejections mapped back to
//! file lines across batches, the summary, a failed call mid-import.

mod support;

use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn import_maps_rejections_back_to_file_lines_across_batches() {
    let (fake, address) = served().await;
    let file = [
        line("m-1"),           // 1
        "not json".to_owned(), // 2: refused by redrivectl
        line("dup-1"),         // 3
        String::new(),         // 4: blank, skipped
        line("bad-1"),         // 5: refused by the planner (batch 2, index 0)
        line("m-2"),           // 6
        line("bad-2"),         // 7: refused by the planner (batch 3, index 0)
    ]
    .join("\n");

    let output = redrivectl(
        address,
        &[
            "import", "-", "--source", "export", "--batch", "2", "--json",
        ],
        &file,
    )
    .await;
    let stdout = String::from_utf8(output.stdout).unwrap();
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert_eq!(output.status.code(), Some(65), "{stdout}\n{stderr}");
    let report: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(
        report,
        serde_json::json!({
            "imported": 2,
            "duplicates": 1,
            "rejected": [
                {"line": 2, "reason": "not valid JSON at column 2: expected ident"},
                {"line": 5, "reason": "refused bad-1"},
                {"line": 7, "reason": "refused bad-2"},
            ],
        })
    );
    for expected in [
        "line 2: not valid JSON",
        "line 5: refused bad-1",
        "line 7: refused bad-2",
    ] {
        assert!(stderr.contains(expected), "{expected}: {stderr}");
    }
    // With --json, stderr is JSON lines: one warning per refused line, then
    // the error that ends it, as every failure's does.
    let lines: Vec<serde_json::Value> = stderr
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(lines.len(), 4, "{stderr}");
    for warning in &lines[..3] {
        assert_eq!(warning["warning"]["code"], "rejected", "{stderr}");
    }
    assert_eq!(lines[3]["error"]["code"], "rejected", "{stderr}");
    assert_eq!(
        lines[3]["error"]["message"],
        "3 line(s) rejected (see above); the other lines were imported or already present"
    );

    let calls = fake.calls.lock().unwrap().clone();
    let ids: Vec<Vec<&str>> = calls
        .iter()
        .map(|call| call.iter().map(|item| item.message_id.as_str()).collect())
        .collect();
    assert_eq!(
        ids,
        [vec!["m-1", "dup-1"], vec!["bad-1", "m-2"], vec!["bad-2"]]
    );
    assert!(
        calls
            .iter()
            .flatten()
            .all(|item| item.imported && item.source == "export")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_import_exits_zero_with_a_summary_line() {
    let address = serve(Fake::default()).await;
    let output = redrivectl(address, &["import", "-", "--source", "s"], &line("m-1")).await;
    assert_eq!(output.status.code(), Some(0));
    assert_eq!(
        String::from_utf8(output.stdout).unwrap(),
        "imported 1, already present 0, rejected 0\n"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_call_stops_the_import_and_says_how_far_it_got() {
    let (fake, address) = served().await;
    let mut lines: Vec<String> = (0..5).map(|n| line(&format!("m-{n}"))).collect();
    lines.push(line("boom"));
    lines.extend((5..500).map(|n| line(&format!("m-{n}"))));
    let output = redrivectl(
        address,
        &["import", "-", "--source", "s", "--batch", "3"],
        &lines.join("\n"),
    )
    .await;
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert_eq!(
        stderr,
        "redrivectl: import stopped after line 3 (imported 3, already present 0, rejected 0); \
         importing the file again is safe\nredrivectl: failed_precondition: boom\n"
    );
    assert_eq!(fake.calls.lock().unwrap().len(), 1);

    // With --json: one JSON error, the note in its message.
    let output = redrivectl(
        address,
        &["import", "-", "--source", "s", "--batch", "3", "--json"],
        &lines.join("\n"),
    )
    .await;
    assert_eq!(output.status.code(), Some(1));
    assert!(output.stdout.is_empty());
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&output.stderr).unwrap(),
        serde_json::json!({"error": {
            "code": "failed_precondition",
            "message": "boom; import stopped after line 3 (imported 3, already present 0, \
                        rejected 0); importing the file again is safe"
        }})
    );
}
