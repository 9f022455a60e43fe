//! The executor binary names every bad setting at once and exits with
//! `EX_USAGE` (64) before it connects to anything.

use std::process::Command;

/// Runs `redrive-executor` with `args` and no `REDRIVE_*` environment;
/// answers the exit code and stderr.
fn executor(args: &[&str]) -> (Option<i32>, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_redrive-executor"))
        .args(args)
        .env_clear()
        .output()
        .expect("running redrive-executor");
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// The settings `stderr` names, in order (`redrive-executor: invalid setting --NAME: ...`).
fn named(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter_map(|line| line.strip_prefix("redrive-executor: invalid setting --"))
        .filter_map(|rest| rest.split(':').next())
        .collect()
}

/// A new user's pass: `--replay-key-ttl-days 18446744073709551615`
/// panicked at start (the seconds overflowed), and 999999999999 started an
/// executor whose every replay-key write Redis refused.
#[test]
fn a_replay_key_ttl_beyond_a_hundred_years_is_refused() {
    for days in ["18446744073709551615", "999999999999", "36501", "0"] {
        let (code, stderr) = executor(&["--replay-key-ttl-days", days]);
        assert_eq!(code, Some(64), "{days}: {stderr}");
        assert_eq!(named(&stderr), ["replay-key-ttl-days"], "{stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}

#[test]
fn every_bad_setting_is_named() {
    let (code, stderr) = executor(&["--window=-1", "--concurrent-slices", "many"]);
    assert_eq!(code, Some(64), "{stderr}");
    for named in ["'-1'", "--window", "'many'", "--concurrent-slices"] {
        assert!(stderr.contains(named), "{named} missing from:\n{stderr}");
    }

    let (code, stderr) = executor(&[
        "--planner",
        "planner:99999",
        "--window",
        "0",
        "--claim-wait-seconds",
        "31",
    ]);
    assert_eq!(code, Some(64), "{stderr}");
    assert_eq!(
        named(&stderr),
        ["planner", "window", "claim-wait-seconds"],
        "{stderr}"
    );

    let (code, stderr) = executor(&[
        "--planner",
        "http://",
        "--amqp-url",
        "amqp://x:1/%2f?heartbeat=abc",
        "--redis-url",
        "redis://127.0.0.1:99999",
        "--executor-id",
        "",
    ]);
    assert_eq!(code, Some(64), "{stderr}");
    assert_eq!(
        named(&stderr),
        ["planner", "amqp-url", "redis-url", "executor-id"],
        "{stderr}"
    );
}

/// `--planner` (and `REDRIVE_PLANNER`) read as `redrivectl` reads them: a
/// URL, or HOST:PORT alone for plain http, so one exported value serves
/// both.
#[test]
fn the_planner_is_a_url_or_host_and_port_as_for_redrivectl() {
    for (given, dialed) in [
        ("127.0.0.1:50051", "http://127.0.0.1:50051"),
        ("planner.internal:50051", "http://planner.internal:50051"),
        (
            "https://planner.internal:443",
            "https://planner.internal:443",
        ),
    ] {
        let config = redrive_executor::Config::for_planner(given);
        assert_eq!(config.planner_url().as_deref(), Ok(dialed), "{given}");
    }
    for bad in ["ftp://planner:21", "planner:0", ""] {
        let config = redrive_executor::Config::for_planner(bad);
        assert!(config.planner_url().is_err(), "{bad:?} accepted");
    }
}

/// Redis Cluster and Sentinel settings: several URLs need one of the two,
/// the two exclude each other, each needs `--redis-url`, a cluster has only
/// database 0; every wrong one is named, no password shown.
#[test]
fn redis_cluster_and_sentinel_settings_are_checked() {
    for (args, setting, says) in [
        (
            &[
                "--redis-url",
                "redis://:hunter2@a:6379,redis://:hunter2@b:6379",
            ][..],
            "redis-url",
            "add --redis-cluster",
        ),
        (
            &[
                "--redis-url",
                "redis://a:6379",
                "--redis-cluster",
                "--redis-sentinel-master",
                "m",
            ][..],
            "redis-url",
            "exclude each other",
        ),
        (
            &["--redis-cluster"][..],
            "redis-cluster",
            "needs --redis-url",
        ),
        (
            &["--redis-sentinel-master", "m"][..],
            "redis-sentinel-master",
            "needs --redis-url",
        ),
        (
            &[
                "--redis-cluster",
                "--redis-url",
                "redis://:hunter2@a:7000/1",
            ][..],
            "redis-url",
            "only database 0",
        ),
        (
            &[
                "--redis-sentinel-master",
                "",
                "--redis-url",
                "redis://s:26379",
            ][..],
            "redis-url",
            "is empty",
        ),
        (
            &[
                "--redis-url",
                "redis://a:1",
                "--redis-master-password",
                "hunter2",
            ][..],
            "redis-url",
            "needs --redis-sentinel-master",
        ),
        (
            &["--redis-master-password", "hunter2"][..],
            "redis-master-password",
            "needs --redis-sentinel-master",
        ),
    ] {
        let (code, stderr) = executor(args);
        assert_eq!(code, Some(64), "{args:?}: {stderr}");
        assert_eq!(named(&stderr), [setting], "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
        assert!(!stderr.contains("hunter2"), "{stderr}");
    }
}

/// Issue 15: no password in `--help` or in a bad setting's error; TLS files
/// need an `https://` planner and go in pairs.
#[test]
fn secrets_stay_hidden_and_tls_files_are_checked() {
    let output = Command::new(env!("CARGO_BIN_EXE_redrive-executor"))
        .arg("--help")
        .env_clear()
        .env("REDRIVE_AMQP_URL", "amqp://u:hunter2@rabbit:5672/%2f")
        .env("REDRIVE_REDIS_URL", "redis://:hunter2@redis:6379")
        .output()
        .expect("running redrive-executor");
    let help = String::from_utf8_lossy(&output.stdout);
    assert!(help.contains("REDRIVE_REDIS_URL"), "{help}");
    assert!(!help.contains("hunter2"), "{help}");
    let (code, stderr) = executor(&[
        "--redis-url",
        "redis://:hunter2@redis:port",
        "--amqp-url",
        "amqp://u:hunter2@rabbit:port/%2f",
    ]);
    assert_eq!(code, Some(64), "{stderr}");
    assert_eq!(named(&stderr), ["amqp-url", "redis-url"], "{stderr}");
    assert!(!stderr.contains("hunter2"), "{stderr}");
    let (code, stderr) = executor(&["--ca", "/etc/ca.pem"]);
    assert_eq!(code, Some(64), "{stderr}");
    assert!(stderr.contains("https://"), "{stderr}");
    let (code, stderr) = executor(&[
        "--planner",
        "https://planner:50051",
        "--tls-client-cert",
        "/etc/executor.pem",
    ]);
    assert_eq!(code, Some(64), "{stderr}");
    assert!(stderr.contains("--tls-client-key"), "{stderr}");
    // A CA file that is no PEM: named at start, not at the first call, and
    // under its own flag (a new user's pass: it was filed under --planner).
    let (code, stderr) = executor(&[
        "--planner",
        "https://planner:50051",
        "--ca",
        "/etc/hostname",
    ]);
    assert_eq!(code, Some(64), "{stderr}");
    assert_eq!(named(&stderr), ["ca"], "{stderr}");
}

/// The settings both services share (`proto/src/settings.rs`): an OTLP
/// endpoint that is no `http://HOST` URL is refused at start (it used to
/// pass, and fail only when the exporter started, or never), a bad URL read
/// from `--amqp-url-file` is named by that flag, and an unreadable secret
/// file does not hide the other problems.
#[test]
fn shared_settings_are_checked_at_start_with_the_others() {
    for endpoint in [
        "notaurl",
        "ftp://collector:4317",
        "https://collector:4317",
        "http://",
    ] {
        let (code, stderr) = executor(&["--otlp-endpoint", endpoint]);
        assert_eq!(code, Some(64), "{endpoint}: {stderr}");
        assert_eq!(named(&stderr), ["otlp-endpoint"], "{endpoint}: {stderr}");
    }
    let (code, stderr) = executor(&["--otlp-endpoint", "http://127.0.0.1:4317", "--window", "0"]);
    assert_eq!(code, Some(64), "{stderr}");
    assert_eq!(
        named(&stderr),
        ["window"],
        "a good endpoint passes: {stderr}"
    );

    let directory = std::env::temp_dir().join(format!("redrive-settings-{}", std::process::id()));
    std::fs::create_dir_all(&directory).expect("temp dir");
    let file = directory.join("amqp-url");
    std::fs::write(&file, "amqp://u:hunter2@rabbit:port/%2f\n").expect("write");
    let file_flag = file.to_str().expect("UTF-8 path").to_owned();
    let (code, stderr) = executor(&["--amqp-url-file", &file_flag]);
    assert_eq!(code, Some(64), "{stderr}");
    assert_eq!(named(&stderr), ["amqp-url-file"], "{stderr}");
    assert!(!stderr.contains("hunter2"), "{stderr}");

    let missing = directory.join("missing");
    let (code, stderr) = executor(&[
        "--amqp-url-file",
        missing.to_str().expect("UTF-8 path"),
        "--window",
        "0",
        "--otlp-endpoint",
        "notaurl",
    ]);
    let _ = std::fs::remove_dir_all(&directory);
    assert_eq!(code, Some(64), "{stderr}");
    assert_eq!(
        named(&stderr),
        ["amqp-url-file", "window", "otlp-endpoint"],
        "{stderr}"
    );
}

#[test]
fn a_blank_broker_id_is_refused_and_the_default_is_host_port_vhost() {
    let (code, stderr) = executor(&["--broker-id", " "]);
    assert_eq!(code, Some(64), "{stderr}");
    assert_eq!(named(&stderr), ["broker-id"], "{stderr}");

    let mut config = redrive_executor::Config::for_planner("http://127.0.0.1:50051");
    assert_eq!(config.broker_id(), "127.0.0.1:5672/%2f");
    config.amqp.url = "amqp://redrive:secret@Rabbit:5673/tenant-b".to_owned();
    assert_eq!(
        config.broker_id(),
        "rabbit:5673/tenant-b",
        "never the credentials"
    );
    config.broker_id = Some("orders-cluster/%2f".to_owned());
    assert_eq!(config.broker_id(), "orders-cluster/%2f");
}

#[test]
fn several_broker_addresses_need_a_broker_id_and_one_vhost() {
    let two = "amqp://redrive:secret@rabbit-1:5672/%2f,amqp://redrive:secret@rabbit-2:5672/%2f";
    let (code, stderr) = executor(&["--amqp-url", two, "--window", "0"]);
    assert_eq!(code, Some(64), "{stderr}");
    let mut settings = named(&stderr);
    settings.sort_unstable();
    assert_eq!(settings, ["amqp-url", "window"], "{stderr}");
    assert!(
        stderr.contains("--broker-id orders-cluster/%2f") && !stderr.contains("secret"),
        "{stderr}"
    );
    let mixed = "amqp://redrive:secret@rabbit-1/%2f,amqp://redrive:secret@rabbit-2/eu";
    let (code, stderr) = executor(&["--amqp-url", mixed, "--broker-id", "orders/%2f"]);
    assert_eq!(code, Some(64), "{stderr}");
    assert!(
        stderr.contains("URL 2 of 2")
            && stderr.contains("virtual host")
            && !stderr.contains("secret"),
        "{stderr}"
    );
    let mut config = redrive_executor::Config::for_planner("http://127.0.0.1:50051");
    config.amqp.url = two.to_owned();
    config.broker_id = Some("orders-cluster/%2f".to_owned());
    assert_eq!(config.broker_id(), "orders-cluster/%2f");
    assert_eq!(config.amqp.nodes().len(), 2);
}
