//! The Prometheus rules in `deploy/prometheus/`: `promtool check rules`
//! accepts `redrive.rules.yml`, and `promtool test rules` passes its unit
//! tests, `redrive.rules.test.yml` (each alert firing with its exact labels
//! and annotations, and quiet in a near miss). `promtool` comes with Debian's
//! `prometheus` package, which `scripts/services.sh` installs; without it
//! these tests fail, never skip.

use std::path::Path;
use std::process::Command;

/// Runs `promtool ARGS` from the workspace root and asserts it succeeds,
/// showing its output when it does not.
fn promtool(args: &[&str]) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root above tests/");
    let output = Command::new("promtool")
        .args(args)
        .current_dir(root)
        .output()
        .unwrap_or_else(|error| {
            panic!(
                "cannot run promtool ({error}): it comes with Debian's prometheus package, \
                 which scripts/services.sh installs (run it as root)"
            )
        });
    assert!(
        output.status.success(),
        "promtool {} failed ({}):\n--- stdout\n{}\n--- stderr\n{}",
        args.join(" "),
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
    );
}

#[test]
fn the_rules_are_valid() {
    promtool(&["check", "rules", "deploy/prometheus/redrive.rules.yml"]);
}

#[test]
fn the_rules_pass_their_unit_tests() {
    promtool(&["test", "rules", "deploy/prometheus/redrive.rules.test.yml"]);
}
