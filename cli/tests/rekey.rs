//! `redrivectl dead-letters rekey` against the fake planner: the selector,
//! rules, reason and actor sent; the counts and examples printed; `--json`;
//! a bad rule named.

mod support;

use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rekey_sends_the_rules_and_prints_the_changes() {
    let (fake, address) = served().await;
    let output = redrivectl(
        address,
        &[
            "dead-letters",
            "rekey",
            "--source",
            "orders.dlq",
            "--message-key",
            "json:/order_id",
            "--message-key",
            "property:message_id",
            "--reason",
            "key by order",
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
        "re-keyed 3 dead letter(s): 2 key(s) changed (rekey 7)\n  \
         dead letter 1: sha256:ab12 -> o-1\n  dead letter 2: sha256:cd34 -> o-1\n"
    );
    let rekeys = fake.rekeys.lock().unwrap().clone();
    assert_eq!(rekeys.len(), 1);
    assert_eq!(
        rekeys[0].key_rules,
        ["json:/order_id", "property:message_id"]
    );
    assert_eq!(rekeys[0].reason, "key by order");
    assert_eq!(rekeys[0].selector.clone().unwrap().sources, ["orders.dlq"]);
    assert_eq!(fake.actors(), [("rekey", Some("tester".to_owned()))]);

    let output = redrivectl(
        address,
        &[
            "dead-letters",
            "rekey",
            "--source",
            "orders.dlq",
            "--reason",
            "back to the default",
            "--json",
        ],
        "",
    )
    .await;
    assert_eq!(output.status.code(), Some(0));
    assert_eq!(
        stdout_json(&output),
        // The API's RekeyDeadLettersResponse (no ids not found: left out).
        serde_json::json!({
            "rekeyed": "3", "changed": "2", "rekeyId": "7",
            "examples": [
                {"deadLetterId": "1", "oldKey": "sha256:ab12", "newKey": "o-1"},
                {"deadLetterId": "2", "oldKey": "sha256:cd34", "newKey": "o-1"},
            ],
        })
    );
    assert!(
        fake.rekeys.lock().unwrap()[1].key_rules.is_empty(),
        "no --message-key: the default rule"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rekey_needs_a_reason_and_names_a_bad_rule() {
    let (fake, address) = served().await;
    let output = redrivectl(
        address,
        &[
            "dead-letters",
            "rekey",
            "--source",
            "q",
            "--message-key",
            "body",
        ],
        "",
    )
    .await;
    assert_eq!(output.status.code(), Some(64), "a usage error (EX_USAGE)");
    assert!(fake.rekeys.lock().unwrap().is_empty());
    let output = redrivectl(
        address,
        &[
            "dead-letters",
            "rekey",
            "--source",
            "q",
            "--message-key",
            "bad",
            "--reason",
            "r",
        ],
        "",
    )
    .await;
    assert_ne!(output.status.code(), Some(0));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("key_rules[0]"), "{stderr}");
}
