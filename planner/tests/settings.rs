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
        "body",
    ]);
    assert_eq!(code, Some(64), "{stderr}");
    let named: Vec<&str> = stderr
        .lines()
        .filter_map(|line| line.strip_prefix("redrive-planner: invalid setting --"))
        .filter_map(|rest| rest.split(':').next())
        .collect();
    assert_eq!(
        named,
        [
            "amqp-url",
            "message-key",
            "stale-after",
            "max-redrives",
            "lease-ttl-seconds"
        ],
        "{stderr}"
    );
}

#[test]
fn help_exits_zero() {
    let (code, _) = planner(&["--help"]);
    assert_eq!(code, Some(0));
}
