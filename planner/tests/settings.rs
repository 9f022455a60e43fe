//! The planner binary names every bad setting at once and exits with
//! `EX_USAGE` (64) before it connects to anything.

use std::process::Command;

/// Runs `redrive-planner` with `args` and no `REDRIVE_*` environment; answers
/// the exit code and stderr.
fn planner(args: &[&str]) -> (Option<i32>, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_redrive-planner"))
        .args(args)
        .env_clear()
        .output()
        .expect("running redrive-planner");
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// The settings `stderr` names, in order (`redrive-planner: invalid setting --NAME: ...`).
fn named(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter_map(|line| line.strip_prefix("redrive-planner: invalid setting --"))
        .filter_map(|rest| rest.split(':').next())
        .collect()
}

#[test]
fn values_clap_refuses_are_all_named() {
    let (code, stderr) = planner(&[
        "--lease-ttl-seconds",
        "soon",
        "--capture-prefetch",
        "70000",
        "--replay-key-window",
        "forever",
    ]);
    assert_eq!(code, Some(64), "{stderr}");
    for named in [
        "'soon'",
        "--lease-ttl-seconds",
        "'70000'",
        "--capture-prefetch",
        "'forever'",
        "--replay-key-window",
    ] {
        assert!(stderr.contains(named), "{named} missing from:\n{stderr}");
    }
    assert_eq!(stderr.lines().count(), 3, "one line a problem:\n{stderr}");
}

#[test]
fn settings_the_planner_checks_are_all_named() {
    let (code, stderr) = planner(&[
        "--amqp-url",
        "http://broker",
        "--lease-ttl-seconds",
        "1",
        "--max-redrives",
        "0",
        "--stale-after",
        "payment.*",
        "--message-key",
        "order_id",
        "--max-body-bytes",
        "0",
        "--shutdown-grace-seconds",
        "99999999",
    ]);
    assert_eq!(code, Some(64), "{stderr}");
    assert_eq!(
        named(&stderr),
        [
            "amqp-url",
            "message-key",
            "stale-after",
            "max-redrives",
            "max-body-bytes",
            "shutdown-grace-seconds",
            "lease-ttl-seconds"
        ],
        "{stderr}"
    );
}

/// A URL is checked as its client reads it, at start-up: a bad port or query
/// would otherwise be retried for ever, and a database URL without a name
/// would migrate into the server's default database.
#[test]
fn urls_are_read_as_their_clients_read_them() {
    let (code, stderr) = planner(&[
        "--database-url",
        "postgres://postgres@127.0.0.1:5432/",
        "--amqp-url",
        "amqp://guest:guest@127.0.0.1:99999/%2f",
        "--state-check",
        "order.*=http://hook/check?x=1",
        "--capture-queue",
        "orders.dlq",
        "--capture-queue",
        "orders.dlq",
        "--event-type-header",
        "",
    ]);
    assert_eq!(code, Some(64), "{stderr}");
    assert_eq!(
        named(&stderr),
        [
            "database-url",
            "amqp-url",
            "capture-queue",
            "event-type-header"
        ],
        "{stderr}"
    );
    assert!(stderr.contains("names no database"), "{stderr}");
    assert!(stderr.contains("given twice"), "{stderr}");

    let (code, stderr) = planner(&["--database-url", "postgres://h:99999/x"]);
    assert_eq!(code, Some(64), "{stderr}");
    assert!(stderr.contains("--database-url"), "{stderr}");
}

#[test]
fn one_refused_value_reads_like_several() {
    let (code, stderr) = planner(&["--lease-ttl-seconds", "soon"]);
    assert_eq!(code, Some(64), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with("redrive-planner: invalid value 'soon'"),
        "{stderr}"
    );
}

#[test]
fn help_exits_zero() {
    let (code, _) = planner(&["--help"]);
    assert_eq!(code, Some(0));
}

/// A boolean flag's environment variable has no value of its own for the
/// walk over values to check: clap's error about it still leads the list.
#[test]
fn a_bad_boolean_variable_is_named_beside_the_rest() {
    let output = Command::new(env!("CARGO_BIN_EXE_redrive-planner"))
        .args(["--lease-ttl-seconds", "soon"])
        .env_clear()
        .env("REDRIVE_FOUR_EYES", "maybe")
        .output()
        .expect("running redrive-planner");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(64), "{stderr}");
    assert!(stderr.contains("'maybe'"), "{stderr}");
    assert!(stderr.contains("'soon'"), "{stderr}");
    // The variable the value came from, and what it takes.
    assert!(
        stderr.contains("expected true or false; from REDRIVE_FOUR_EYES"),
        "{stderr}"
    );
}

/// A list variable whose empty entries are each wrong says so once.
#[test]
fn one_problem_is_said_once() {
    let output = Command::new(env!("CARGO_BIN_EXE_redrive-planner"))
        .env_clear()
        .env("REDRIVE_CAPTURE_QUEUES", ",,")
        .output()
        .expect("running redrive-planner");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(64), "{stderr}");
    assert_eq!(
        stderr.matches("invalid setting --capture-queue").count(),
        1,
        "{stderr}"
    );
}

/// Issue 15: `--help` printed `DATABASE_URL=postgres://u:secret@…` (clap
/// shows environment values), and a bad setting's error printed the URL
/// whole.
#[test]
fn help_and_errors_show_no_password() {
    let output = Command::new(env!("CARGO_BIN_EXE_redrive-planner"))
        .arg("--help")
        .env_clear()
        .env("DATABASE_URL", "postgres://u:hunter2@db:5432/redrive")
        .env("REDRIVE_AMQP_URL", "amqp://u:hunter2@rabbit:5672/%2f")
        .output()
        .expect("running redrive-planner");
    let help = String::from_utf8_lossy(&output.stdout);
    assert!(help.contains("DATABASE_URL"), "{help}");
    assert!(!help.contains("hunter2"), "{help}");
    let (code, stderr) = planner(&[
        "--database-url",
        "postgres://u:hunter2@db:notaport/redrive",
        "--amqp-url",
        "amqp://u:hunter2@rabbit:port/%2f",
    ]);
    assert_eq!(code, Some(64), "{stderr}");
    assert_eq!(named(&stderr), ["database-url", "amqp-url"], "{stderr}");
    assert!(!stderr.contains("hunter2"), "{stderr}");
}

/// Issue 15: no plaintext, unauthenticated port on a shared network unless
/// asked for.
#[test]
fn a_public_address_without_tls_and_authentication_is_refused() {
    let (code, stderr) = planner(&["--listen", "0.0.0.0:0"]);
    assert_eq!(code, Some(64), "{stderr}");
    assert_eq!(named(&stderr), ["listen"], "{stderr}");
    assert!(stderr.contains("--insecure"), "{stderr}");
}

/// A pool too small for a precheck (the `LISTEN` connection and a
/// precheck's three at once) is refused at start-up, saying why; the
/// smallest that runs one is accepted by the check.
#[test]
fn a_pool_too_small_for_a_precheck_is_refused() {
    let (code, stderr) = planner(&["--database-max-connections", "3"]);
    assert_eq!(code, Some(64), "{stderr}");
    assert_eq!(named(&stderr), ["database-max-connections"], "{stderr}");
    assert!(
        stderr.contains("must be at least 4") && stderr.contains("near-duplicates"),
        "{stderr}"
    );
    let (_, stderr) = planner(&[
        "--database-max-connections",
        "4",
        "--lease-ttl-seconds",
        "1",
    ]);
    assert_eq!(named(&stderr), ["lease-ttl-seconds"], "{stderr}");
}

/// A prefetch below the batch size names both ways out.
#[test]
fn a_prefetch_below_the_batch_size_names_both_ways_out() {
    let (code, stderr) = planner(&["--capture-prefetch", "20"]);
    assert_eq!(code, Some(64), "{stderr}");
    assert_eq!(named(&stderr), ["capture-prefetch"], "{stderr}");
    for way in [
        "raise --capture-prefetch to at least 1000",
        "lower --capture-batch-size to at most 20",
    ] {
        assert!(stderr.contains(way), "{way} missing from:\n{stderr}");
    }
}

/// A batch size past the 16-bit prefetch names the one way out.
#[test]
fn a_batch_size_past_any_prefetch_names_the_one_way_out() {
    let (code, stderr) = planner(&["--capture-batch-size", "100000"]);
    assert_eq!(code, Some(64), "{stderr}");
    assert!(
        stderr
            .contains("lower --capture-batch-size to at most 4000: the prefetch is at most 65535"),
        "{stderr}"
    );
    assert!(!stderr.contains("raise --capture-prefetch"), "{stderr}");
}
