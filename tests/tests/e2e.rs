//! The demo's scenario (`redrive-demo`, [`redrive_tests::scenario`]), smaller,
//! with the real binaries as separate processes and unique names: a
//! fulfilment incident made by RabbitMQ, capture, precheck, a plan at 100/s,
//! approval, canary, observation, the main wave with `executor-1` killed
//! (SIGKILL) a third into it and `executor-3` started, and the audit report.

use redrive_tests::scenario::{self, ScenarioConfig};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_demo_incident_replays_exactly_once_through_a_killed_executor() -> anyhow::Result<()> {
    // This package's binaries of the planner, executor and redrivectl,
    // which cargo builds before its tests.
    let config = ScenarioConfig::small(scenario::Binaries::of_tests()?)?;
    let outcome = scenario::run(&config).await?;
    let failures: Vec<String> = outcome
        .failures()
        .iter()
        .map(|check| format!("{}: {}", check.what, check.detail))
        .collect();
    assert!(
        failures.is_empty(),
        "failed checks:\n{}",
        failures.join("\n")
    );
    let (done, total) = outcome
        .killed_at
        .expect("executor-1 was killed mid-main-wave");
    assert!(done < total, "killed before the end: {done}/{total}");
    // A crash may deliver an item twice, with the same message id, only when
    // the audit says it was in flight (`uncertain`): never silently.
    assert!(
        outcome.delivered_twice.is_subset(&outcome.uncertain),
        "second copies {:?} are all marked uncertain {:?}",
        outcome.delivered_twice,
        outcome.uncertain
    );
    if let scenario::Logs::Directory(dir) = &config.logs {
        let _ = std::fs::remove_dir_all(dir);
    }
    Ok(())
}

/// `scripts/demo.sh --help` answers before anything is built (issue 17),
/// from its own text: every option `redrive-demo --help` lists is in it,
/// word for word.
#[test]
fn demo_sh_help_answers_without_building_and_lists_every_demo_option() -> anyhow::Result<()> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let script = std::process::Command::new("bash")
        .arg(root.join("scripts/demo.sh"))
        .arg("--help")
        // No cargo on the path: a build attempt would fail the test.
        .env("PATH", "/usr/bin:/bin")
        .output()?;
    assert!(script.status.success(), "{script:?}");
    let script = String::from_utf8(script.stdout)?;
    let demo = std::process::Command::new(env!("CARGO_BIN_EXE_redrive-demo"))
        .arg("--help")
        .output()?;
    let demo = String::from_utf8(demo.stdout)?;
    let options = demo
        .split_once("Options:")
        .map(|(_, options)| options)
        .expect("an Options section");
    for line in options.lines().filter(|line| !line.trim().is_empty()) {
        assert!(
            script.contains(line),
            "demo.sh --help lacks {line:?}:\n{script}"
        );
    }
    Ok(())
}

/// `scripts/services.sh` on a machine without the servers, as a user who is
/// not root (issue 17): it installs nothing, prints the exact apt-get
/// command naming every missing package and the PostgreSQL access step, and
/// exits 1. The machine is simulated with a `PATH` holding only the tools
/// the script itself needs, and an `id` that answers uid 1000.
#[test]
fn services_sh_prints_the_install_commands_when_servers_are_missing() -> anyhow::Result<()> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let bin = tempfile::tempdir()?;
    for tool in ["bash", "seq", "sleep", "cat", "head", "ls"] {
        let found = ["/usr/bin", "/bin"]
            .iter()
            .map(|dir| std::path::Path::new(dir).join(tool))
            .find(|path| path.exists())
            .ok_or_else(|| anyhow::anyhow!("{tool} is not installed"))?;
        std::os::unix::fs::symlink(found, bin.path().join(tool))?;
    }
    let id = bin.path().join("id");
    std::fs::write(&id, "#!/bin/sh\necho 1000\n")?;
    std::fs::set_permissions(&id, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    let output = std::process::Command::new(bin.path().join("bash"))
        .arg(root.join("scripts/services.sh"))
        .env_clear()
        .env("PATH", bin.path())
        .output()?;
    let stderr = String::from_utf8(output.stderr)?;
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(
            "not installed: postgresql postgresql-client redis-server redis-tools rabbitmq-server"
        ),
        "{stderr}"
    );
    assert!(
        stderr.contains(
            "apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends postgresql postgresql-client redis-server redis-tools rabbitmq-server"
        ),
        "{stderr}"
    );
    assert!(
        stderr.contains("host all all 127.0.0.1/32 trust"),
        "the PostgreSQL access step: {stderr}"
    );
    assert!(
        String::from_utf8(output.stdout)?.is_empty(),
        "nothing started or installed"
    );
    Ok(())
}
