//! The order-fulfilment incident and its replay, end to end, with the real
//! binaries as separate processes: `redrive-demo` runs it full size
//! ([`ScenarioConfig::demo`]) and `tests/tests/e2e.rs` small
//! ([`ScenarioConfig::small`]), with an executor killed mid-main-wave, on
//! this package's binaries of the planner, executor and `redrivectl`
//! ([`Binaries::of_tests`]).
//!
//! 1. Topology and business state: exchange `NAMES.orders`, queue
//!    `NAMES.fulfilment` dead-lettering (through `NAMES.dlx`) to
//!    `NAMES.fulfilment.dlq`, a healthy subscriber `NAMES.analytics` on the
//!    same exchange, and an `orders` table for the example state-check hook.
//! 2. The incident, made by RabbitMQ: a fulfilment consumer rejecting every
//!    schema-2 message, producer retries (same order, new message id),
//!    messages that expire, orders cancelled, fulfilled or with stock reserved
//!    meanwhile, and payments too old to matter.
//! 3. `redrive-example-orders-hook`, `redrive-planner` and two
//!    `redrive-executor`s start; the planner captures the DLQ; `redrivectl`
//!    shows the summary and the precheck.
//! 4. `redrivectl plan create` at a stated rate with its rationale, `plan
//!    approve` with the digest; the canary wave, the observation window (the
//!    planner promotes the plan when its gates stay green), the main wave with
//!    `redrivectl plan watch`, then `redrivectl plan report`.
//! 5. Self-checks, each printed `ok` or `FAIL`, against what the fixed
//!    fulfilment consumer and the healthy subscriber received.
//!
//! Every child process is killed when its handle drops, so no exit path (an
//! error, a panic) leaves one running; [`run`] also stops them with SIGTERM and
//! checks that they exit cleanly. A run starts by deleting what an earlier run
//! left (queues, database, Redis keys), so it can run again.
//!
//! # Layout
//! - `mod.rs`: [`ScenarioConfig`], [`run`] and the replay's steps.
//! - `incident.rs`: the incident's [`Shape`], the topology, the business
//!   state, and the incident itself.
//! - `processes.rs`: the child processes and `redrivectl`.
//! - `recorder.rs`: the consumers that record what they receive.
//! - `checks.rs`: the self-checks and the run's [`Outcome`].

mod checks;
mod incident;
mod processes;
mod recorder;

use std::{io::IsTerminal, net::SocketAddr, path::PathBuf, process::Stdio, time::Duration};

use anyhow::{Context, bail, ensure};
use redrive_proto::v1::{self, PlanState, planner_client::PlannerClient};
use sqlx::{Postgres, migrate::MigrateDatabase};
use tokio::{
    io::{AsyncBufReadExt, BufReader},
    time::Instant,
};
use tonic::transport::Channel;

use crate::{Broker, POSTGRES_URL, redis_cleanup, stored_total, unique};
use checks::{Audit, check_no_re_dead_letters, check_precheck, check_replay};
use incident::{business_state, reset};
use processes::{
    Processes, Redrivectl, field, shell_words, spawn_executor, wait_for_planner, wait_for_port,
};
use recorder::Recorder;

pub use checks::{Check, Outcome};
pub use incident::Shape;
pub use processes::{Binaries, ChildLog, args_as, profile_dir, signal, spawn_logged};

/// Where the children's stderr goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Logs {
    /// This process's stderr.
    Inherit,
    /// One file per child process in this directory.
    Directory(PathBuf),
}

/// Everything a run depends on: the incident's size, names, addresses and the
/// replay's settings.
#[derive(Debug, Clone)]
pub struct ScenarioConfig {
    /// The incident's size.
    pub shape: Shape,
    /// Prefix of the queue and exchange names (`NAMES.orders`, ...).
    pub names: String,
    /// The database of the planner and of the hook's `orders` table; dropped
    /// and created again at the start.
    pub database_url: String,
    /// Drop the database at the end (the demo keeps it to look at).
    pub drop_database_at_end: bool,
    /// Prefix of the executors' Redis keys (bucket and replay keys); deleted at
    /// the start and at the end.
    pub redis_prefix: String,
    /// Where `redrive-planner` listens.
    pub planner_addr: SocketAddr,
    /// Where `redrive-example-orders-hook` listens.
    pub hook_addr: SocketAddr,
    /// The planner, executor, `redrivectl` and hook programs it starts.
    pub binaries: Binaries,
    /// The plan's rate, messages per second.
    pub rate_per_second: u32,
    /// The plan's burst.
    pub burst: u32,
    /// Items per slice.
    pub slice_size: u32,
    /// The plan's observation window after the canary, seconds.
    pub observe_seconds: u64,
    /// The planner's lease TTL, seconds (a killed executor's slices are leased
    /// again after it).
    pub lease_ttl_seconds: u64,
    /// SIGKILL `executor-1` a third into the main wave and start `executor-3`.
    pub kill_executor: bool,
    /// Where the children's logs go.
    pub logs: Logs,
    /// Let `redrivectl plan watch` draw its bar on this terminal; otherwise
    /// its lines are printed at most once a second.
    pub terminal: bool,
    /// How long the whole replay may take before the run gives up.
    pub replay_timeout: Duration,
    /// With credentials, the planner serves TLS with authentication on:
    /// executors present client certificates (`executor-*`: role
    /// executor), `redrivectl` a token (`demo-operator`), the run's own
    /// client the `scenario-admin` certificate.
    pub pki: Option<std::sync::Arc<crate::pki::Pki>>,
    /// `REDRIVE_LOG` of every child process (`warn`, without lapin's own
    /// `lapin::channel` lines, as the services' default filter: the broker
    /// closing a channel the planner expects it to close, as its stream-queue
    /// check does, is no error).
    pub log_filter: String,
    /// The broker URL the planner and the executors are given (`None`: their
    /// default, the local RabbitMQ as guest). The run itself declares and
    /// reads queues as guest.
    pub amqp_url: Option<String>,
    /// The executors' Redis ([`crate::REDIS_URL`]).
    pub redis_url: String,
    /// After the run, keep the planner up for the operator console: print
    /// its address and two principals' sign-in tokens, and wait for Ctrl-C
    /// (or SIGTERM) before stopping.
    pub console: bool,
}

impl ScenarioConfig {
    /// The demo: full size, fixed names (`redrive-demo.*`, database
    /// `redrive_demo`, Redis prefix `redrive-demo:`) and ports (50151, 50161),
    /// 200 messages/s with a burst of 20, a 5 s observation window.
    pub fn demo(binaries: Binaries) -> Self {
        Self {
            shape: Shape::FULL,
            names: "redrive-demo".to_owned(),
            database_url: format!("{POSTGRES_URL}/redrive_demo"),
            drop_database_at_end: false,
            redis_prefix: "redrive-demo:".to_owned(),
            planner_addr: SocketAddr::from(([127, 0, 0, 1], 50151)),
            hook_addr: SocketAddr::from(([127, 0, 0, 1], 50161)),
            binaries,
            rate_per_second: 200,
            burst: 20,
            slice_size: 100,
            observe_seconds: 5,
            lease_ttl_seconds: 10,
            kill_executor: false,
            logs: Logs::Inherit,
            terminal: std::io::stdout().is_terminal(),
            replay_timeout: Duration::from_secs(180),
            pki: None,
            log_filter: "warn,lapin::channel=off".to_owned(),
            amqp_url: None,
            redis_url: crate::REDIS_URL.to_owned(),
            console: false,
        }
    }

    /// The end-to-end test: small, with unique names and free ports, a
    /// database dropped at the end, 100 messages/s with a burst of 10, a 2 s
    /// observation window, a 3 s lease and `executor-1` killed mid-main-wave;
    /// logs in a temporary directory; TLS and authentication on
    /// ([`ScenarioConfig::pki`]).
    ///
    /// # Errors
    /// When no free port can be found.
    pub fn small(binaries: Binaries) -> anyhow::Result<Self> {
        let names = unique("redrive-e2e");
        Ok(Self {
            shape: Shape::SMALL,
            database_url: format!("{POSTGRES_URL}/{}", unique("redrive_test")),
            drop_database_at_end: true,
            redis_prefix: format!("{names}:"),
            planner_addr: free_local_addr()?,
            hook_addr: free_local_addr()?,
            binaries,
            rate_per_second: 100,
            burst: 10,
            slice_size: 25,
            observe_seconds: 2,
            lease_ttl_seconds: 3,
            kill_executor: true,
            logs: Logs::Directory(std::env::temp_dir().join(&names)),
            terminal: false,
            replay_timeout: Duration::from_secs(90),
            names,
            pki: Some(std::sync::Arc::new(crate::pki::Pki::new()?)),
            log_filter: "warn,lapin::channel=off".to_owned(),
            amqp_url: None,
            redis_url: crate::REDIS_URL.to_owned(),
            console: false,
        })
    }

    fn name(&self, suffix: &str) -> String {
        format!("{}.{suffix}", self.names)
    }

    fn planner_url(&self) -> String {
        let scheme = if self.pki.is_some() { "https" } else { "http" };
        format!("{scheme}://{}", self.planner_addr)
    }

    fn database_name(&self) -> &str {
        self.database_url
            .rsplit('/')
            .next()
            .unwrap_or(&self.database_url)
    }
}

/// A free port on the loopback interface (bound, then released).
///
/// # Errors
/// When binding fails.
pub fn free_local_addr() -> anyhow::Result<SocketAddr> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?)
}

/// Runs the scenario: topology, incident, processes, capture, precheck, plan,
/// canary, observation, main wave, audit, self-checks (then, with
/// [`ScenarioConfig::console`], holds for the console); then stops every
/// process with SIGTERM and deletes the queues and Redis keys (and the
/// database when [`ScenarioConfig::drop_database_at_end`]).
///
/// # Errors
/// When a step cannot be carried out (a service unreachable, a timeout, a
/// command failing, a process not stopping cleanly). Failed self-checks are
/// not errors: they are in [`Outcome::failures`].
pub async fn run(config: &ScenarioConfig) -> anyhow::Result<Outcome> {
    config.shape.check()?;
    if let Logs::Directory(dir) = &config.logs {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("creating the log directory {}", dir.display()))?;
    }
    let broker = Broker::connect()
        .await
        .context("RabbitMQ on 127.0.0.1:5672 (run scripts/services.sh)")?;
    let mut processes = Processes::new(config);
    let mut outcome = Outcome::default();
    let result = replay_incident(config, &broker, &mut processes, &mut outcome).await;
    if result.is_ok() && config.console {
        hold_for_console(config).await;
    }
    let stopped = processes.stop_all().await;
    broker.cleanup().await;
    let redis = if config.redis_url == crate::REDIS_URL {
        redis_cleanup(&config.redis_prefix).await
    } else {
        // A private Redis of the caller's, gone with it.
        Ok(())
    };
    if config.drop_database_at_end {
        let _ = Postgres::force_drop_database(&config.database_url).await;
    }
    if let Err(error) = result {
        bail!("{error:#}\n{}", processes.log_tails());
    }
    stopped?;
    redis.context("deleting the Redis keys")?;
    Ok(outcome)
}

async fn replay_incident(
    config: &ScenarioConfig,
    broker: &Broker,
    processes: &mut Processes,
    outcome: &mut Outcome,
) -> anyhow::Result<()> {
    let shape = &config.shape;
    println!(
        "== 1. topology ({}.*) and business state (database {})",
        config.names,
        config.database_name()
    );
    reset(config, broker).await?;
    let pool = sqlx::PgPool::connect(&config.database_url).await?;
    business_state(&pool, shape).await?;
    pool.close().await;

    println!("== 2. incident: a fulfilment consumer rejects every schema-2 message");
    let analytics = incident::incident(config, broker).await?;
    let dlq = config.name("fulfilment.dlq");

    println!("== 3. the orders hook, the planner and two executors start; capture");
    let mut hook_args: Vec<String> = vec![
        "--listen".to_owned(),
        config.hook_addr.to_string(),
        "--database-url".to_owned(),
        config.database_url.clone(),
    ];
    // With credentials the hook serves TLS too, and the planner calls it
    // over https:// trusting the run's CA.
    let hook_scheme = match &config.pki {
        Some(pki) => {
            let (cert, key) = pki.server("orders-hook")?;
            hook_args.extend([
                "--tls-cert".to_owned(),
                cert.to_string_lossy().into_owned(),
                "--tls-key".to_owned(),
                key.to_string_lossy().into_owned(),
            ]);
            "https"
        }
        None => "http",
    };
    let hook_args: Vec<&str> = hook_args.iter().map(String::as_str).collect();
    processes.spawn(
        "redrive-example-orders-hook",
        &config.binaries.orders_hook,
        &hook_args,
    )?;
    wait_for_port(processes, config.hook_addr).await?;
    let lease_ttl = config.lease_ttl_seconds.to_string();
    let mut planner_args: Vec<String> = [
        "--listen",
        &config.planner_addr.to_string(),
        "--database-url",
        &config.database_url,
        "--capture-queue",
        &dlq,
        "--message-key",
        "json:/order_id",
        "--state-check",
        &format!("order.*={hook_scheme}://{}", config.hook_addr),
        "--lease-ttl-seconds",
        &lease_ttl,
    ]
    .iter()
    .map(|arg| (*arg).to_owned())
    .collect();
    if let Some(amqp_url) = &config.amqp_url {
        planner_args.extend(["--amqp-url".to_owned(), amqp_url.clone()]);
    }
    let mut admin_tls = redrive_proto::tls::ClientTlsFiles::default();
    if let Some(pki) = &config.pki {
        let path = |name: &str| pki.path(name).to_string_lossy().into_owned();
        planner_args.extend([
            "--tls-cert".to_owned(),
            path("planner.pem"),
            "--tls-key".to_owned(),
            path("planner.key"),
            "--tls-client-ca".to_owned(),
            pki.ca_pem.to_string_lossy().into_owned(),
            "--cert-role".to_owned(),
            "executor-*=executor".to_owned(),
            "--cert-role".to_owned(),
            "scenario-admin=admin".to_owned(),
            "--token-file".to_owned(),
            path("tokens.toml"),
            "--state-check-ca".to_owned(),
            pki.ca_pem.to_string_lossy().into_owned(),
        ]);
        admin_tls = pki.client("scenario-admin")?;
    }
    let planner_args: Vec<&str> = planner_args.iter().map(String::as_str).collect();
    processes.spawn("redrive-planner", &config.binaries.planner, &planner_args)?;
    let mut planner = wait_for_planner(processes, &config.planner_url(), &admin_tls).await?;
    for executor in ["executor-1", "executor-2"] {
        spawn_executor(config, processes, executor)?;
    }
    println!(
        "   {} (the planner: {}; redrivectl finds it through REDRIVE_PLANNER)",
        processes.describe(),
        config.planner_url()
    );
    let ctl = Redrivectl::new(config)?;
    captured(&mut planner, &dlq, shape.dead_letters()).await?;
    ctl.show(&[
        "dead-letters",
        "summary",
        "--source",
        &dlq,
        "--group-by",
        "reason,event_type",
    ])
    .await?;

    println!("== 4. precheck (payments older than 2 h are stale)");
    let text = ctl
        .show(&[
            "precheck",
            "--source",
            &dlq,
            "--stale-after",
            "payment.*=2h",
        ])
        .await?;
    let precheck_id = field(&text, "precheck id")?;
    let digest = field(&text, "digest")?;
    let report: serde_json::Value = serde_json::from_str(
        &ctl.quiet(&["--json", "precheck", "show", &precheck_id])
            .await?,
    )?;
    check_precheck(outcome, broker, &dlq, shape, &report).await?;

    println!(
        "== 5. plan: {}/s, burst {}",
        config.rate_per_second, config.burst
    );
    let rationale = format!(
        "fulfilment sustains {}/s at p99 < 50 ms; half of it leaves room for live orders",
        config.rate_per_second * 2
    );
    let text = ctl
        .show(&[
            "plan",
            "create",
            "--precheck",
            &precheck_id,
            "--rate",
            &config.rate_per_second.to_string(),
            "--burst",
            &config.burst.to_string(),
            "--rationale",
            &rationale,
            "--slice-size",
            &config.slice_size.to_string(),
            "--observe",
            &format!("{}s", config.observe_seconds),
        ])
        .await?;
    let plan_id = field(&text, "plan id")?;
    outcome.plan_id.clone_from(&plan_id);

    // The fixed fulfilment consumer is deployed; the replay may start.
    let fulfilment = Recorder::start(&broker.connection, &config.name("fulfilment")).await?;
    let replay_started = Instant::now();
    println!("== 6. approve with the digest of the precheck report; the canary wave goes first");
    ctl.show(&["plan", "approve", &plan_id, "--digest", &digest])
        .await?;
    let plan = wait_for_state(
        &mut planner,
        &plan_id,
        &[PlanState::Observing, PlanState::Main, PlanState::Completed],
        config.replay_timeout,
    )
    .await?;
    println!(
        "   canary: {} of {} items sent; the fulfilment consumer got {}; the plan observes for {} s \
         (a failure or a re-dead-letter would abort it; `redrivectl plan promote` ends the window early)",
        plan.counts.as_ref().map_or(0, |counts| counts.sent),
        plan.canary_items,
        fulfilment.len(),
        config.observe_seconds
    );

    println!("== 7. the main wave, live");
    let killed_at = watch_main_wave(config, processes, &ctl, &mut planner, &plan_id).await?;
    outcome.killed_at = killed_at;
    let plan = get_plan(&mut planner, &plan_id).await?;
    // Deliveries still on their way from the broker to the consumer.
    let replayable = usize::try_from(shape.replayable())?;
    let settle = Instant::now() + Duration::from_secs(10);
    while fulfilment.distinct_ids() < replayable && Instant::now() < settle {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;

    println!("== 8. the audit report");
    ctl.show(&["plan", "report", &plan_id]).await?;
    let report: serde_json::Value =
        serde_json::from_str(&ctl.quiet(&["--json", "plan", "report", &plan_id]).await?)?;
    let events = ctl
        .quiet(&["plan", "report", &plan_id, "--format", "jsonl"])
        .await?;
    let reconciliation = match &config.logs {
        Logs::Directory(dir) => dir.clone(),
        Logs::Inherit => std::env::temp_dir().join(&config.names),
    };
    std::fs::create_dir_all(&reconciliation)?;
    let reconciliation = reconciliation.join("reconciliation.csv");
    let csv = ctl
        .quiet(&["plan", "report", &plan_id, "--format", "csv"])
        .await?;
    std::fs::write(&reconciliation, &csv)?;
    println!(
        "$ redrivectl plan report {plan_id} --format csv > {}\n   {} audit events, one per line (the reconciliation file)",
        reconciliation.display(),
        csv.lines().count().saturating_sub(1)
    );

    println!("== 9. checks");
    let audit = Audit::parse(&report, &events)?;
    outcome.uncertain.clone_from(&audit.uncertain_ids);
    check_replay(
        config,
        outcome,
        &plan,
        &fulfilment.deliveries(),
        &analytics.deliveries(),
        replay_started,
        &audit,
    );
    check_no_re_dead_letters(outcome, broker, &mut planner, &dlq, shape).await?;
    Ok(())
}

async fn captured(
    planner: &mut PlannerClient<Channel>,
    dlq: &str,
    expected: u64,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if stored_total(planner, dlq)
            .await
            .is_ok_and(|total| total >= expected)
        {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "capture did not finish within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn get_plan(planner: &mut PlannerClient<Channel>, plan_id: &str) -> anyhow::Result<v1::Plan> {
    Ok(planner
        .get_plan(v1::GetPlanRequest {
            plan_id: plan_id.to_owned(),
        })
        .await?
        .into_inner())
}

async fn wait_for_state(
    planner: &mut PlannerClient<Channel>,
    plan_id: &str,
    states: &[PlanState],
    timeout: Duration,
) -> anyhow::Result<v1::Plan> {
    let deadline = Instant::now() + timeout;
    loop {
        let plan = get_plan(planner, plan_id).await?;
        if states.contains(&plan.state()) {
            return Ok(plan);
        }
        ensure!(
            !plan.state().is_final(),
            "plan {plan_id} ended {} ({})",
            plan.state().as_str_name(),
            plan.state_reason
        );
        ensure!(
            Instant::now() < deadline,
            "plan {plan_id} still {} after {timeout:?}",
            plan.state().as_str_name()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Runs `redrivectl plan watch` until the plan is final: on a terminal it
/// draws its bar there; otherwise its lines are printed at most once a second
/// (and at every change of state). With [`ScenarioConfig::kill_executor`],
/// SIGKILLs `executor-1` a third into the main wave and starts `executor-3`;
/// returns the progress at the kill.
async fn watch_main_wave(
    config: &ScenarioConfig,
    processes: &mut Processes,
    ctl: &Redrivectl,
    planner: &mut PlannerClient<Channel>,
    plan_id: &str,
) -> anyhow::Result<Option<(u64, u64)>> {
    let args = ["plan", "watch", plan_id];
    println!("$ redrivectl {}", shell_words(&args));
    let mut command = ctl.command(&args);
    command.stdout(if config.terminal {
        Stdio::inherit()
    } else {
        Stdio::piped()
    });
    let mut watch = command.spawn().context("starting redrivectl plan watch")?;
    // Piped only when not drawing on the terminal.
    let printer = watch
        .stdout
        .take()
        .map(|stdout| tokio::spawn(print_throttled(stdout)));
    let deadline = Instant::now() + config.replay_timeout;
    let mut kill_pending = config.kill_executor;
    let mut killed_at = None;
    let status = loop {
        tokio::select! {
            status = watch.wait() => break status?,
            () = tokio::time::sleep(Duration::from_millis(50)) => {}
        }
        processes.ensure_alive()?;
        ensure!(
            Instant::now() < deadline,
            "plan {plan_id} not final after {:?}",
            config.replay_timeout
        );
        if !kill_pending {
            continue;
        }
        let plan = get_plan(planner, plan_id).await?;
        let main_items = plan.total_items.saturating_sub(plan.canary_items);
        if plan.state() == PlanState::Main && plan.items_done >= plan.canary_items + main_items / 3
        {
            let pid = processes.pid("executor-1").unwrap_or_default();
            processes.kill("executor-1").await?;
            let replacement = spawn_executor(config, processes, "executor-3")?;
            println!(
                "\n   !! SIGKILL executor-1 (pid {pid}) at {}/{} items; executor-3 (pid {replacement}) starts; \
                 executor-1's slices are leased again after the {} s lease",
                plan.items_done, plan.total_items, config.lease_ttl_seconds
            );
            killed_at = Some((plan.items_done, plan.total_items));
            kill_pending = false;
        }
    };
    if let Some(printer) = printer {
        printer.await?;
    }
    ensure!(
        status.success(),
        "redrivectl plan watch exited with {status}"
    );
    ensure!(
        !kill_pending,
        "the plan finished before executor-1 could be killed mid-main-wave"
    );
    Ok(killed_at)
}

async fn print_throttled(stdout: tokio::process::ChildStdout) {
    let mut lines = BufReader::new(stdout).lines();
    let mut last_printed: Option<Instant> = None;
    let mut last_state = String::new();
    let mut pending: Option<String> = None;
    while let Ok(Some(line)) = lines.next_line().await {
        let state = line
            .split_whitespace()
            .next()
            .unwrap_or_default()
            .to_owned();
        let due = last_printed.is_none_or(|at| at.elapsed() >= Duration::from_secs(1));
        if due || state != last_state || line.starts_with("plan ") {
            pending = None;
            println!("   {line}");
            last_printed = Some(Instant::now());
            last_state = state;
        } else {
            pending = Some(line);
        }
    }
    if let Some(line) = pending {
        println!("   {line}");
    }
}

/// Prints how to open the operator console of the run's planner and sign in
/// as an operator and as an approver, then waits for Ctrl-C or SIGTERM.
async fn hold_for_console(config: &ScenarioConfig) {
    let url = config.planner_url();
    println!("== the console: {url}/");
    if let Some(pki) = &config.pki {
        println!(
            "   its certificate is signed by this run's CA, {}: the browser warns once (accept it, or import the CA)",
            pki.ca_pem.display()
        );
        println!(
            "   sign in as the operator with the token {}",
            crate::pki::token_of("demo-operator")
        );
        println!(
            "   and as a second approver (four-eyes) with the token {}",
            crate::pki::token_of("bob")
        );
    }
    println!("   press Ctrl-C to stop the planner and the executors");
    let Ok(mut terminate) =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
    else {
        let _ = tokio::signal::ctrl_c().await;
        return;
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate.recv() => {}
    }
}
