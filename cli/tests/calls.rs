//! `redrivectl` calls in general against the fake planner: page tokens,
//! how gRPC errors print, the actor on every request.

mod support;

use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_all_follows_page_tokens() {
    let address = serve(Fake::default()).await;
    let output = redrivectl(address, &["dead-letters", "list", "--all", "--json"], "").await;
    assert_eq!(output.status.code(), Some(0));
    let listed: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let ids: Vec<&str> = listed["deadLetters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|dead_letter| dead_letter["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["1", "2"]);
    // The last page: no next page token (a default value, left out).
    assert_eq!(listed.get("nextPageToken"), None);

    let output = redrivectl(address, &["dead-letters", "list"], "").await;
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert!(stdout.ends_with("next page token: p2\n"), "{stdout}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_errors_print_code_and_message() {
    let address = serve(Fake::default()).await;
    let output = redrivectl(address, &["dead-letters", "show", "42"], "").await;
    assert_eq!(output.status.code(), Some(65));
    assert_eq!(
        String::from_utf8(output.stderr).unwrap(),
        "redrivectl: not_found: dead letter 42 not found\n"
    );
    let output = redrivectl(address, &["dead-letters", "summary"], "").await;
    assert_eq!(output.status.code(), Some(1));
    assert_eq!(
        String::from_utf8(output.stderr).unwrap(),
        "redrivectl: unimplemented: summarize_dead_letters\n"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_actor_defaults_to_user_then_anonymous_on_every_request() {
    let (fake, address) = served().await;
    let run = ["precheck", "--source", "q", "--json"];
    for env in [
        &[("USER", Some("bob"))][..],
        &[("USER", Some("bob")), ("REDRIVE_ACTOR", Some("deploy-bot"))],
        &[("USER", None)],
        &[("USER", Some("")), ("REDRIVE_ACTOR", Some(""))],
    ] {
        let output = redrivectl_with_env(address, &run, "", env).await;
        assert_eq!(output.status.code(), Some(0), "{env:?}");
    }
    let output = redrivectl_with_env(
        address,
        &["dead-letters", "list"],
        "",
        &[("REDRIVE_ACTOR", Some("carol"))],
    )
    .await;
    assert_eq!(output.status.code(), Some(0));
    let actor = |name: &str| Some(name.to_owned());
    assert_eq!(
        fake.actors(),
        [
            ("run_precheck", actor("bob")),
            ("run_precheck", actor("deploy-bot")),
            ("run_precheck", actor("anonymous")),
            ("run_precheck", actor("anonymous")),
            ("list_dead_letters", actor("carol")),
        ]
    );

    // A name that cannot travel as metadata is refused before any call.
    let output = redrivectl_with_env(address, &run, "", &[("USER", Some("jos\u{e9}"))]).await;
    assert_eq!(output.status.code(), Some(64));
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(stderr.contains("set --actor or REDRIVE_ACTOR"), "{stderr}");
    assert_eq!(fake.actors().len(), 5);
}
