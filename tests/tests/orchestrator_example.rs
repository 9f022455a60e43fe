//! The orchestrator example, `examples/python/orchestrate.py`, run as an
//! Airflow task would run it, against a real planner capturing a real
//! RabbitMQ incident: the script prechecks, creates a plan as `airflow` and
//! waits; the test approves as `bob` (four-eyes on, so `airflow` itself
//! may not) and starts an executor; the script follows the plan to its end
//! and writes the audit report.
//!
//! Nothing is installed by hand: a virtualenv under the cargo target dir
//! (`target/python-example-venv`, reused while it matches
//! `requirements.txt`) gets `examples/python/requirements.txt` from the
//! package index, and `generate.sh` writes the stubs into a scratch
//! directory per test. Without a reachable package index these tests FAIL
//! saying so; they never skip.

use std::{
    path::{Path, PathBuf},
    process::{ExitStatus, Stdio},
    sync::{Arc, Mutex, OnceLock},
    time::Duration,
};

use anyhow::Context as _;
use futures::StreamExt as _;
use redrive_proto::v1::{self, PlanState, planner_client::PlannerClient};
use redrive_tests::{Broker, ExecutorHandle, TestBed, init_logging, unique, wait_until};
use sha2::{Digest as _, Sha256};
use tokio::io::{AsyncBufReadExt as _, BufReader};
use tonic::transport::Channel;

mod support;
use support::*;

/// The workspace root (above `tests/`).
fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root above tests/")
        .to_owned()
}

/// `examples/python/`.
fn examples() -> PathBuf {
    workspace().join("examples/python")
}

/// Runs `command`, failing with `what`, its exit status and its output
/// unless it succeeds.
fn run(command: &mut std::process::Command, what: &str) -> Result<(), String> {
    let output = command
        .output()
        .map_err(|error| format!("{what}: cannot start {command:?}: {error}"))?;
    if output.status.success() {
        return Ok(());
    }
    Err(format!(
        "{what} failed ({}):\n--- stdout\n{}\n--- stderr\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
    ))
}

/// The virtualenv's interpreter, with `requirements.txt` installed: the one
/// under the target dir when its stamp names the current requirements, else
/// a new one built beside it and moved into place (so a half-built one is
/// never used, even by another test process).
fn make_virtualenv() -> Result<PathBuf, String> {
    let requirements = examples().join("requirements.txt");
    let wanted = std::fs::read(&requirements)
        .map(|text| hex::encode(Sha256::digest(text)))
        .map_err(|error| format!("cannot read {}: {error}", requirements.display()))?;
    let profile = redrive_tests::scenario::profile_dir().map_err(|error| error.to_string())?;
    let target = profile.parent().unwrap_or(&profile).to_owned();
    let venv = target.join("python-example-venv");
    let stamp = |dir: &Path| dir.join("redrive-requirements.sha256");
    let complete = |dir: &Path| std::fs::read_to_string(stamp(dir)).is_ok_and(|s| s == wanted);
    if complete(&venv) {
        return Ok(venv.join("bin/python"));
    }
    let building = target.join(format!("python-example-venv.building-{}", unique("v")));
    run(
        std::process::Command::new("python3")
            .args(["-m", "venv"])
            .arg(&building),
        "python3 -m venv (CPython 3 with the venv module is needed)",
    )?;
    let installed = run(
        std::process::Command::new(building.join("bin/python"))
            .args(["-m", "pip", "install", "--disable-pip-version-check"])
            .args(["--no-input", "--timeout", "30", "-r"])
            .arg(&requirements),
        "pip install -r examples/python/requirements.txt (is a package index reachable? \
         these tests need pip to reach one, or PIP_INDEX_URL naming a mirror)",
    );
    if let Err(error) = installed {
        let _ = std::fs::remove_dir_all(&building);
        return Err(error);
    }
    std::fs::write(stamp(&building), &wanted).map_err(|error| error.to_string())?;
    if venv.exists() && !complete(&venv) {
        let _ = std::fs::remove_dir_all(&venv);
    }
    if std::fs::rename(&building, &venv).is_err() {
        // Another test process moved its own into place first.
        let _ = std::fs::remove_dir_all(&building);
        if !complete(&venv) {
            return Err(format!("cannot move the virtualenv to {}", venv.display()));
        }
    }
    Ok(venv.join("bin/python"))
}

/// The virtualenv's interpreter, made once per test process.
async fn python() -> PathBuf {
    static PYTHON: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let made = tokio::task::spawn_blocking(|| PYTHON.get_or_init(make_virtualenv).clone())
        .await
        .expect("the virtualenv task");
    match made {
        Ok(python) => python,
        Err(error) => panic!("cannot set up Python for examples/python: {error}"),
    }
}

/// Stubs made by `generate.sh` with `python` into a scratch directory.
async fn stubs(python: &Path) -> anyhow::Result<tempfile::TempDir> {
    let dir = tempfile::tempdir()?;
    let output = tokio::process::Command::new(examples().join("generate.sh"))
        .arg(dir.path())
        .env("PYTHON", python)
        .output()
        .await?;
    anyhow::ensure!(
        output.status.success(),
        "generate.sh failed ({}): {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(dir)
}

/// A running `orchestrate.py`, its output collected line by line.
struct Script {
    child: tokio::process::Child,
    stdout: Arc<Mutex<Vec<String>>>,
    stderr: Arc<Mutex<Vec<String>>>,
}

/// Collects the lines of `pipe` into `into`.
fn collect(pipe: impl tokio::io::AsyncRead + Unpin + Send + 'static) -> Arc<Mutex<Vec<String>>> {
    let lines = Arc::new(Mutex::new(Vec::new()));
    let into = lines.clone();
    tokio::spawn(async move {
        let mut reader = BufReader::new(pipe).lines();
        while let Ok(Some(line)) = reader.next_line().await {
            into.lock().unwrap().push(line);
        }
    });
    lines
}

impl Script {
    /// Starts `orchestrate.py` as `airflow` against `planner_url` over the
    /// dead letters of `dlq`, for job run `run_id`, reporting to `report`,
    /// with `extra` arguments after the common ones.
    fn start(
        python: &Path,
        stubs: &Path,
        planner_url: &str,
        dlq: &str,
        run_id: &str,
        report: &Path,
        extra: &[&str],
    ) -> anyhow::Result<Self> {
        let mut child = tokio::process::Command::new(python)
            .arg(examples().join("orchestrate.py"))
            .args(["--planner", planner_url, "--actor", "airflow"])
            .args(["--source", dlq, "--run-id", run_id])
            .args([
                "--rationale",
                "orders-api takes 300/s; 200/s leaves headroom",
            ])
            .args([
                "--slice-size",
                "10",
                "--observe",
                "0s",
                "--poll-interval",
                "0.2s",
            ])
            .arg("--report")
            .arg(report)
            .args(extra)
            .env("REDRIVE_STUBS", stubs)
            .env_remove("REDRIVE_TOKEN")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .context("starting orchestrate.py")?;
        let stdout = collect(child.stdout.take().context("stdout")?);
        let stderr = collect(child.stderr.take().context("stderr")?);
        Ok(Self {
            child,
            stdout,
            stderr,
        })
    }

    /// What it printed so far, both streams.
    fn output(&self) -> String {
        format!(
            "--- stdout\n{}\n--- stderr\n{}",
            self.stdout.lock().unwrap().join("\n"),
            self.stderr.lock().unwrap().join("\n")
        )
    }

    /// The plan id of its `plan ID awaiting_approval, created by …` line,
    /// waiting at most 60 s for it.
    async fn plan_id(&self) -> anyhow::Result<String> {
        for _ in 0..600 {
            let found = self.stdout.lock().unwrap().iter().find_map(|line| {
                let rest = line.strip_prefix("plan ")?;
                let (id, _) = rest.split_once(' ')?;
                id.parse::<uuid::Uuid>().ok().map(|_| id.to_owned())
            });
            if let Some(id) = found {
                return Ok(id);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        anyhow::bail!(
            "orchestrate.py printed no plan id in 60 s\n{}",
            self.output()
        )
    }

    /// Waits at most `timeout` for it to exit; its status.
    async fn exit(&mut self, timeout: Duration) -> anyhow::Result<ExitStatus> {
        let status = tokio::time::timeout(timeout, self.child.wait())
            .await
            .with_context(|| {
                format!(
                    "orchestrate.py still running after {timeout:?}\n{}",
                    self.output()
                )
            })??;
        // Let the readers take the last lines.
        tokio::time::sleep(Duration::from_millis(200)).await;
        Ok(status)
    }
}

/// A bed with four-eyes on whose planner captured an incident of
/// `messages`, and a consumer of the queue the replay goes to.
async fn four_eyes_incident(messages: u32) -> anyhow::Result<(Incident, TestBed)> {
    let broker = Broker::connect().await?;
    let incident = incident(&broker, messages).await?;
    let mut bed = TestBed::start(broker, |config| {
        capturing(config, &[&incident.dlq]);
        config.four_eyes = true;
    })
    .await?;
    captured(&mut bed.client, &incident.dlq, u64::from(messages)).await?;
    Ok((incident, bed))
}

/// Approves plan `plan_id` as `bob` with the digest of its precheck, after
/// checking that its creator `airflow` may not (four-eyes).
async fn approve_as_bob(client: &mut PlannerClient<Channel>, plan_id: &str) -> anyhow::Result<()> {
    let plan = get_plan(client, plan_id).await?;
    assert_eq!(
        plan.state(),
        PlanState::AwaitingApproval,
        "the script waits for approval"
    );
    assert_eq!(
        plan.created_by, "airflow",
        "the script's actor created the plan"
    );
    let approve = |actor: &str| {
        as_actor(
            actor,
            v1::ApprovePlanRequest {
                plan_id: plan_id.to_owned(),
                digest: plan.precheck_digest.clone(),
                ..Default::default()
            },
        )
    };
    assert!(
        client.approve_plan(approve("airflow")).await.is_err(),
        "four-eyes: the creator cannot approve its own plan"
    );
    client.approve_plan(approve("bob")).await?;
    Ok(())
}

/// The report `orchestrate.py` wrote.
/// Waits for `script` to fail the job (exit 5, `what`) and reads the report
/// it still wrote.
async fn failed_job(
    script: &mut Script,
    report_path: &Path,
    what: &str,
) -> anyhow::Result<serde_json::Value> {
    let status = script.exit(Duration::from_secs(60)).await?;
    let output = script.output();
    assert_eq!(status.code(), Some(5), "{what}\n{output}");
    read_report(report_path)
}

fn read_report(path: &Path) -> anyhow::Result<serde_json::Value> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("orchestrate.py wrote no report at {}", path.display()))?;
    Ok(serde_json::from_str(&text)?)
}

/// The SHA-256 of plan `plan_id`'s JSON Lines export, as docs/webhooks.md
/// defines the report digest.
async fn export_sha256(
    client: &mut PlannerClient<Channel>,
    plan_id: &str,
) -> anyhow::Result<String> {
    let mut chunks = client
        .export_audit(v1::ExportAuditRequest {
            plan_id: plan_id.to_owned(),
            format: v1::ExportFormat::Jsonl.into(),
        })
        .await?
        .into_inner();
    let mut hasher = Sha256::new();
    while let Some(chunk) = chunks.next().await {
        hasher.update(chunk?.data);
    }
    Ok(hex::encode(hasher.finalize()))
}

/// The whole path an orchestrator takes: the script prechecks and creates
/// the plan as `airflow`, waits while `bob` approves, follows the replay to
/// the end and exits 0 with a report saying every message was sent; the
/// consumer got every message, and only messages the audit calls sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_replays_an_incident_after_a_second_person_approves() -> anyhow::Result<()> {
    init_logging();
    const MESSAGES: u32 = 30;
    let python = python().await;
    let stubs = stubs(&python).await?;
    let (incident, mut bed) = four_eyes_incident(MESSAGES).await?;
    let (received, consuming) = consume(bed.broker(), &incident.work).await?;
    let scratch = tempfile::tempdir()?;
    let report_path = scratch.path().join("report.json");

    let mut script = Script::start(
        &python,
        stubs.path(),
        &bed.planner.url(),
        &incident.dlq,
        &unique("scheduled__2026-12-01"),
        &report_path,
        &["--rate", "200", "--burst", "20"],
    )?;
    let plan_id = script.plan_id().await?;
    approve_as_bob(&mut bed.client, &plan_id).await?;
    let executor = ExecutorHandle::start(bed.executor_config());

    let status = script.exit(Duration::from_secs(120)).await?;
    let output = script.output();
    assert_eq!(status.code(), Some(0), "the job succeeds\n{output}");
    assert!(
        output.contains(&format!("replayable {MESSAGES}")),
        "it printed the verdict counts\n{output}"
    );
    assert!(
        output.contains("digest "),
        "it printed the digest\n{output}"
    );
    assert!(
        output.contains("approve") && output.contains("other than airflow"),
        "it said who may approve\n{output}"
    );
    assert!(output.contains("approved by bob"), "{output}");
    assert!(
        output.contains(&format!("plan {plan_id} completed")),
        "{output}"
    );

    let report = read_report(&report_path)?;
    assert_eq!(report["plan_id"], plan_id.as_str());
    assert_eq!(report["state"], "completed");
    assert_eq!(report["exit_code"], 0);
    assert_eq!(report["sent"], MESSAGES, "the report says all were sent");
    assert_eq!(report["all_sent"], true);
    assert_eq!(
        report["audit"]["sent_keys"].as_array().map(Vec::len),
        Some(MESSAGES as usize),
        "the reconciliation list is in the report"
    );
    assert_eq!(
        report["export_sha256"].as_str(),
        Some(export_sha256(&mut bed.client, &plan_id).await?.as_str()),
        "the report carries the export's SHA-256 (the webhook's report_digest)"
    );

    let received = drain(&received, consuming, Duration::from_millis(500)).await?;
    let copies = copies_by_id(&received);
    assert_eq!(
        copies.len(),
        MESSAGES as usize,
        "the consumer got every message"
    );
    assert_bed_audit(&bed, &plan_id, &received).await?;
    executor.stop().await?;
    bed.finish().await
}

/// A plan cancelled while it runs fails the job: exit 5, and the report is
/// still written, saying cancelled, why, and what was never attempted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_plan_fails_the_job_with_the_report_written() -> anyhow::Result<()> {
    init_logging();
    const MESSAGES: u32 = 40;
    let python = python().await;
    let stubs = stubs(&python).await?;
    let (incident, mut bed) = four_eyes_incident(MESSAGES).await?;
    let (received, consuming) = consume(bed.broker(), &incident.work).await?;
    let scratch = tempfile::tempdir()?;
    let report_path = scratch.path().join("report.json");

    let mut script = Script::start(
        &python,
        stubs.path(),
        &bed.planner.url(),
        &incident.dlq,
        &unique("manual__cancelled"),
        &report_path,
        &["--rate", "4", "--burst", "1"],
    )?;
    let plan_id = script.plan_id().await?;
    approve_as_bob(&mut bed.client, &plan_id).await?;
    let executor = ExecutorHandle::start(bed.executor_config());
    wait_until("a few messages sent", Duration::from_secs(30), || {
        let mut client = bed.client.clone();
        let plan_id = plan_id.clone();
        async move {
            let plan = get_plan(&mut client, &plan_id).await?;
            Ok(plan.counts.is_some_and(|counts| counts.sent >= 2))
        }
    })
    .await?;
    bed.client
        .cancel_plan(control_by_bob(&plan_id, "downstream struggling"))
        .await?;

    let report = failed_job(&mut script, &report_path, "a cancelled plan fails the job").await?;
    assert_eq!(report["plan_id"], plan_id.as_str());
    assert_eq!(report["state"], "cancelled");
    assert_eq!(report["exit_code"], 5);
    assert_eq!(report["all_sent"], false);
    assert!(
        report["state_reason"]
            .as_str()
            .is_some_and(|reason| reason.contains("downstream struggling")),
        "the report says why: {}",
        report["state_reason"]
    );
    let never_attempted: u64 = report["audit"]["never_attempted"]
        .as_str()
        .context("never_attempted in the report")?
        .parse()?;
    assert!(never_attempted > 0, "the rest is listed as never attempted");

    executor.stop().await?;
    let received = drain(&received, consuming, Duration::from_millis(500)).await?;
    assert!(
        received.len() < MESSAGES as usize,
        "the cancel stopped the replay"
    );
    assert_bed_audit(&bed, &plan_id, &received).await?;
    bed.finish().await
}

/// A retried job finds its plan again: the first try gives up waiting for
/// approval (exit 4, the plan left awaiting approval), the retry with the
/// same `--run-id` sends the same idempotency keys, gets the same precheck
/// and the same plan (never a second one), and completes once approved.
///
/// This needs the planner to honour the `idempotency-key` metadata on
/// RunPrecheck and CreatePlan (docs/api.md, "Idempotency keys"): without
/// it the retry makes a second plan and this test fails on the plan ids.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_job_gets_the_same_plan() -> anyhow::Result<()> {
    init_logging();
    const MESSAGES: u32 = 10;
    let python = python().await;
    let stubs = stubs(&python).await?;
    let (incident, mut bed) = four_eyes_incident(MESSAGES).await?;
    let (received, consuming) = consume(bed.broker(), &incident.work).await?;
    let scratch = tempfile::tempdir()?;
    let run_id = unique("scheduled__2026-12-01T00:00:00+00:00");
    let start = |report: &Path, extra: &[&str]| {
        let mut args = vec!["--rate", "200", "--burst", "20"];
        args.extend_from_slice(extra);
        Script::start(
            &python,
            stubs.path(),
            &bed.planner.url(),
            &incident.dlq,
            &run_id,
            report,
            &args,
        )
    };

    let first_report = scratch.path().join("first.json");
    let mut first = start(&first_report, &["--approval-timeout", "1s"])?;
    let first_plan = first.plan_id().await?;
    let status = first.exit(Duration::from_secs(60)).await?;
    assert_eq!(
        status.code(),
        Some(4),
        "nobody approved: the first try times out\n{}",
        first.output()
    );
    let report = read_report(&first_report)?;
    assert_eq!(report["state"], "awaiting_approval");
    assert_eq!(report["outcome"], "approval_timeout");

    let second_report = scratch.path().join("second.json");
    let mut second = start(&second_report, &[])?;
    let second_plan = second.plan_id().await?;
    assert_eq!(
        second_plan,
        first_plan,
        "the retry gets the first try's plan\n{}",
        second.output()
    );
    let plans = bed
        .client
        .list_plans(v1::ListPlansRequest {
            page_size: 10,
            ..Default::default()
        })
        .await?
        .into_inner()
        .plans;
    assert_eq!(plans.len(), 1, "never a second plan: {plans:?}");
    approve_as_bob(&mut bed.client, &second_plan).await?;
    let executor = ExecutorHandle::start(bed.executor_config());
    let status = second.exit(Duration::from_secs(120)).await?;
    assert_eq!(
        status.code(),
        Some(0),
        "the retry completes\n{}",
        second.output()
    );
    let report = read_report(&second_report)?;
    assert_eq!(report["plan_id"], first_plan.as_str());
    assert_eq!(report["all_sent"], true);

    let received = drain(&received, consuming, Duration::from_millis(500)).await?;
    assert_eq!(copies_by_id(&received).len(), MESSAGES as usize);
    assert_bed_audit(&bed, &first_plan, &received).await?;
    executor.stop().await?;
    bed.finish().await
}

/// A plan paused for longer than `--pause-timeout` fails the job: exit 5,
/// the report saying it is paused, and why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plan_paused_too_long_fails_the_job() -> anyhow::Result<()> {
    init_logging();
    const MESSAGES: u32 = 10;
    let python = python().await;
    let stubs = stubs(&python).await?;
    let (incident, mut bed) = four_eyes_incident(MESSAGES).await?;
    let scratch = tempfile::tempdir()?;
    let report_path = scratch.path().join("report.json");

    let mut script = Script::start(
        &python,
        stubs.path(),
        &bed.planner.url(),
        &incident.dlq,
        &unique("manual__paused"),
        &report_path,
        &["--rate", "200", "--burst", "20", "--pause-timeout", "2s"],
    )?;
    let plan_id = script.plan_id().await?;
    approve_as_bob(&mut bed.client, &plan_id).await?;
    // No executor yet: the plan waits in its canary, and is paused there.
    bed.client
        .pause_plan(control_by_bob(&plan_id, "consumer deploy in progress"))
        .await?;

    let report = failed_job(&mut script, &report_path, "paused too long fails the job").await?;
    assert_eq!(report["outcome"], "paused_too_long");
    assert_eq!(report["state"], "paused");
    assert!(
        report["state_reason"]
            .as_str()
            .is_some_and(|reason| reason.contains("consumer deploy in progress")),
        "the report says why: {}",
        report["state_reason"]
    );
    assert_eq!(report["sent"], 0);
    bed.finish().await
}

/// A pause or cancel of `plan_id` by bob, the second principal, with `reason`.
fn control_by_bob(plan_id: &str, reason: &str) -> tonic::Request<v1::PlanControlRequest> {
    as_actor(
        "bob",
        v1::PlanControlRequest {
            plan_id: plan_id.to_owned(),
            reason: reason.to_owned(),
            ..Default::default()
        },
    )
}
