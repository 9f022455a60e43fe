//! The child processes (killed when their handles drop) and `redrivectl`
//! as an operator runs it.

use std::{
    fmt::Write as _,
    net::SocketAddr,
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

use anyhow::{Context, bail, ensure};
use redrive_proto::v1::planner_client::PlannerClient;
use tokio::{
    process::{Child, Command},
    time::Instant,
};
use tonic::transport::Channel;

use super::{Logs, ScenarioConfig};

/// The directory of the running binary's Cargo profile (`target/debug` for
/// a binary or a test of this workspace).
///
/// # Errors
/// When the running binary's path is unknown.
pub fn profile_dir() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let dir = exe.parent().context("the running binary has a directory")?;
    // Test binaries live in `target/debug/deps`, binaries in `target/debug`.
    Ok(if dir.file_name().is_some_and(|name| name == "deps") {
        dir.parent().context("deps has a parent")?.to_owned()
    } else {
        dir.to_owned()
    })
}

/// The programs a scenario starts, by path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binaries {
    /// `redrive-planner`.
    pub planner: PathBuf,
    /// `redrive-executor`.
    pub executor: PathBuf,
    /// `redrivectl`.
    pub redrivectl: PathBuf,
    /// `redrive-example-orders-hook`.
    pub orders_hook: PathBuf,
}

impl Binaries {
    /// The workspace's binaries by their own names in `dir` (`cargo build
    /// --bins` makes them): what `redrive-demo` runs.
    pub fn in_dir(dir: &Path) -> Self {
        Self {
            planner: dir.join("redrive-planner"),
            executor: dir.join("redrive-executor"),
            redrivectl: dir.join("redrivectl"),
            orders_hook: dir.join("redrive-example-orders-hook"),
        }
    }

    /// This package's own binaries for the tests and benchmarks:
    /// `redrive-tests-planner`, `redrive-tests-executor` and
    /// `redrive-tests-redrivectl` (`src/bin/`: each the real binary's entry
    /// function, run under the real binary's name) and
    /// `redrive-example-orders-hook`, in the running test's profile directory
    /// ([`profile_dir`]). Cargo builds a package's binaries before its
    /// integration tests and benchmarks, so they are there, in the same
    /// profile, with or without `--workspace`.
    ///
    /// # Errors
    /// When the running binary's path is unknown, or one of them is missing
    /// (a test binary run by hand: `cargo build -p redrive-tests --bins`
    /// makes them).
    pub fn of_tests() -> anyhow::Result<Self> {
        let dir = profile_dir()?;
        let binaries = Self {
            planner: dir.join("redrive-tests-planner"),
            executor: dir.join("redrive-tests-executor"),
            redrivectl: dir.join("redrive-tests-redrivectl"),
            orders_hook: dir.join("redrive-example-orders-hook"),
        };
        for path in [
            &binaries.planner,
            &binaries.executor,
            &binaries.redrivectl,
            &binaries.orders_hook,
        ] {
            ensure!(
                path.exists(),
                "{} is missing: cargo builds it before the tests and benchmarks of redrive-tests (`cargo build -p redrive-tests --bins`)",
                path.display()
            );
        }
        Ok(binaries)
    }
}

/// This process's arguments with `program` as the program's name (what
/// clap's usage lines show): how `src/bin/` runs a real binary's entry
/// function under the real binary's name.
pub fn args_as(program: &str) -> impl Iterator<Item = std::ffi::OsString> {
    std::iter::once(program.into()).chain(std::env::args_os().skip(1))
}

/// Starts `program` with `args` and `REDRIVE_LOG=info`, its stdout and
/// stderr in a temporary file the test reads ([`ChildLog::text`]); the
/// child is killed (SIGKILL) when dropped.
///
/// # Errors
/// The log file cannot be made, or the program cannot be started.
pub fn spawn_logged<I, S>(program: &Path, args: I) -> anyhow::Result<(Child, ChildLog)>
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    let log = tempfile::NamedTempFile::new()?;
    let child = Command::new(program)
        .args(args)
        .env("REDRIVE_LOG", "info")
        .stdin(Stdio::null())
        .stdout(log.reopen()?)
        .stderr(log.reopen()?)
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {}", program.display()))?;
    Ok((child, ChildLog(log)))
}

/// The log file of a child started by [`spawn_logged`], removed when dropped.
pub struct ChildLog(tempfile::NamedTempFile);

impl ChildLog {
    /// What the child has logged so far (empty if the file cannot be read).
    pub fn text(&self) -> String {
        std::fs::read_to_string(self.0.path()).unwrap_or_default()
    }
}

/// Sends `signal` (`TERM`, `INT`, `STOP`) to `child` with kill(1).
///
/// # Errors
/// The child has exited and been waited for, or kill(1) fails.
pub fn signal(child: &Child, signal: &str) -> anyhow::Result<()> {
    let pid = child.id().context("the process has exited")?;
    let status = std::process::Command::new("kill")
        .args([format!("-{signal}"), pid.to_string()])
        .status()?;
    ensure!(status.success(), "kill -{signal} {pid} failed");
    Ok(())
}

/// A child process, killed (SIGKILL) when dropped.
pub(super) struct Process {
    pub(super) name: String,
    pub(super) child: Child,
    pub(super) log: Option<PathBuf>,
}

/// The scenario's child processes.
pub(super) struct Processes {
    /// `REDRIVE_LOG` of every child.
    log_filter: String,
    pub(super) logs: Logs,
    pub(super) running: Vec<Process>,
    /// Processes that are gone: name, how they ended, log file.
    pub(super) ended: Vec<(String, String, Option<PathBuf>)>,
}

impl Processes {
    pub(super) fn new(config: &ScenarioConfig) -> Self {
        Self {
            log_filter: config.log_filter.clone(),
            logs: config.logs.clone(),
            running: Vec::new(),
            ended: Vec::new(),
        }
    }

    pub(super) fn spawn(
        &mut self,
        name: &str,
        program: &Path,
        args: &[&str],
    ) -> anyhow::Result<u32> {
        ensure!(
            program.exists(),
            "{} is missing: run `cargo build --bins` first (scripts/demo.sh does)",
            program.display()
        );
        let mut command = Command::new(program);
        command
            .args(args)
            .env("REDRIVE_LOG", &self.log_filter)
            .stdin(Stdio::null())
            .kill_on_drop(true);
        let log = match &self.logs {
            Logs::Inherit => None,
            Logs::Directory(dir) => {
                let path = dir.join(format!("{name}.log"));
                let file = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&path)?;
                command.stdout(file.try_clone()?).stderr(file);
                Some(path)
            }
        };
        let child = command
            .spawn()
            .with_context(|| format!("starting {}", program.display()))?;
        let pid = child.id().unwrap_or_default();
        self.running.push(Process {
            name: name.to_owned(),
            child,
            log,
        });
        Ok(pid)
    }

    pub(super) fn pid(&self, name: &str) -> Option<u32> {
        self.running
            .iter()
            .find(|process| process.name == name)
            .and_then(|process| process.child.id())
    }

    /// `name (pid N), ...` of the running processes.
    pub(super) fn describe(&self) -> String {
        self.running
            .iter()
            .map(|process| {
                format!(
                    "{} (pid {})",
                    process.name,
                    process.child.id().unwrap_or_default()
                )
            })
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// An error when a process has exited on its own.
    pub(super) fn ensure_alive(&mut self) -> anyhow::Result<()> {
        for process in &mut self.running {
            if let Some(status) = process.child.try_wait()? {
                bail!("{} exited unexpectedly with {status}", process.name);
            }
        }
        Ok(())
    }

    /// SIGKILL: a crash, nothing released or reported.
    pub(super) async fn kill(&mut self, name: &str) -> anyhow::Result<()> {
        let index = self
            .running
            .iter()
            .position(|process| process.name == name)
            .with_context(|| format!("{name} is not running"))?;
        let mut process = self.running.remove(index);
        process.child.start_kill()?;
        let status = process.child.wait().await?;
        self.ended
            .push((process.name, format!("killed ({status})"), process.log));
        Ok(())
    }

    /// SIGTERM to each process, newest first (executors before the planner
    /// before the hook); each must exit with success within 20 s, else it is
    /// killed and named in the error.
    pub(super) async fn stop_all(&mut self) -> anyhow::Result<()> {
        let mut failures = Vec::new();
        while let Some(mut process) = self.running.pop() {
            let ended = match process.child.try_wait() {
                Ok(Some(status)) => Err(format!("had exited on its own with {status}")),
                _ => match process.child.id() {
                    None => Err("had exited".to_owned()),
                    Some(pid) => {
                        let _ = Command::new("kill")
                            .arg("-TERM")
                            .arg(pid.to_string())
                            .status()
                            .await;
                        match tokio::time::timeout(Duration::from_secs(20), process.child.wait())
                            .await
                        {
                            Ok(Ok(status)) if status.success() => Ok(()),
                            Ok(Ok(status)) => Err(format!("exited with {status} after SIGTERM")),
                            Ok(Err(error)) => Err(format!("could not be waited for: {error}")),
                            Err(_) => {
                                let _ = process.child.start_kill();
                                let _ = process.child.wait().await;
                                Err("did not stop within 20 s of SIGTERM (killed)".to_owned())
                            }
                        }
                    }
                },
            };
            let how = match ended {
                Ok(()) => "stopped".to_owned(),
                Err(why) => {
                    failures.push(format!("{} {why}", process.name));
                    why
                }
            };
            self.ended
                .push((process.name.clone(), how, process.log.take()));
        }
        ensure!(
            failures.is_empty(),
            "processes did not stop cleanly: {}",
            failures.join("; ")
        );
        Ok(())
    }

    /// The last lines of each child's log (when logs go to files), for an
    /// error report.
    pub(super) fn log_tails(&self) -> String {
        let mut tails = String::from("how the processes ended:");
        for (name, how, log) in &self.ended {
            let _ = write!(tails, "\n{name}: {how}");
            if let Some(log) = log {
                let text = std::fs::read_to_string(log).unwrap_or_default();
                let lines: Vec<&str> = text.lines().collect();
                let _ = write!(tails, "; last lines of {}:", log.display());
                for line in &lines[lines.len().saturating_sub(15)..] {
                    let _ = write!(tails, "\n    {line}");
                }
            }
        }
        tails
    }
}

pub(super) fn spawn_executor(
    config: &ScenarioConfig,
    processes: &mut Processes,
    executor_id: &str,
) -> anyhow::Result<u32> {
    let mut args: Vec<String> = [
        "--planner",
        &config.planner_url(),
        "--redis-url",
        &config.redis_url,
        "--redis-prefix",
        &config.redis_prefix,
        "--executor-id",
        executor_id,
    ]
    .iter()
    .map(|arg| (*arg).to_owned())
    .collect();
    if let Some(pki) = &config.pki {
        // The certificate's name is the executor's principal.
        let tls = pki.client(executor_id)?;
        for (flag, path) in [
            ("--ca", tls.ca),
            ("--tls-client-cert", tls.client_cert),
            ("--tls-client-key", tls.client_key),
        ] {
            if let Some(path) = path {
                args.extend([flag.to_owned(), path.to_string_lossy().into_owned()]);
            }
        }
    }
    if let Some(amqp_url) = &config.amqp_url {
        args.extend(["--amqp-url".to_owned(), amqp_url.clone()]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    processes.spawn(executor_id, &config.binaries.executor, &args)
}

pub(super) async fn wait_for_port(
    processes: &mut Processes,
    addr: SocketAddr,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while tokio::net::TcpStream::connect(addr).await.is_err() {
        processes.ensure_alive()?;
        ensure!(
            Instant::now() < deadline,
            "nothing listens on {addr} after 30 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

/// Waits until the planner reports SERVING on `grpc.health.v1` (its
/// migrations applied) and returns a client presenting `tls` (for an
/// `https://` planner).
pub(super) async fn wait_for_planner(
    processes: &mut Processes,
    url: &str,
    tls: &redrive_proto::tls::ClientTlsFiles,
) -> anyhow::Result<PlannerClient<Channel>> {
    let deadline = Instant::now() + Duration::from_secs(60);
    let endpoint = tls
        .apply(url, Channel::from_shared(url.to_owned())?)
        .map_err(anyhow::Error::msg)?;
    loop {
        if let Ok(channel) = endpoint.connect().await {
            let mut health = tonic_health::pb::health_client::HealthClient::new(channel.clone());
            let request = tonic_health::pb::HealthCheckRequest {
                service: "redrive.v1.Planner".to_owned(),
            };
            let serving = tonic_health::pb::health_check_response::ServingStatus::Serving as i32;
            if let Ok(answer) = health.check(request).await
                && answer.into_inner().status == serving
            {
                return Ok(PlannerClient::new(channel).max_decoding_message_size(64 * 1024 * 1024));
            }
        }
        processes.ensure_alive()?;
        ensure!(
            Instant::now() < deadline,
            "the planner at {url} was not serving after 60 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Runs `redrivectl` as an operator would, with the planner and the actor in
/// the environment (`REDRIVE_PLANNER`, `REDRIVE_ACTOR`).
pub(super) struct Redrivectl {
    pub(super) program: PathBuf,
    pub(super) planner_url: String,
    /// `REDRIVE_CA` and `REDRIVE_TOKEN_FILE` for a planner with TLS and
    /// authentication (the token's principal is `demo-operator`).
    pub(super) credentials: Option<(PathBuf, PathBuf)>,
}

impl Redrivectl {
    /// # Errors
    /// Writing the token file failed.
    pub(super) fn new(config: &ScenarioConfig) -> anyhow::Result<Self> {
        let credentials = match &config.pki {
            Some(pki) => Some((pki.ca_pem.clone(), pki.token_file("demo-operator")?)),
            None => None,
        };
        Ok(Self {
            program: config.binaries.redrivectl.clone(),
            planner_url: config.planner_url(),
            credentials,
        })
    }

    pub(super) fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(&self.program);
        command
            .args(args)
            .env("REDRIVE_PLANNER", &self.planner_url)
            .env("REDRIVE_ACTOR", "demo-operator")
            .stdin(Stdio::null())
            .kill_on_drop(true);
        if let Some((ca, token_file)) = &self.credentials {
            command
                .env("REDRIVE_CA", ca)
                .env("REDRIVE_TOKEN_FILE", token_file);
        }
        command
    }

    /// Prints the command line, runs it and prints what it printed.
    pub(super) async fn show(&self, args: &[&str]) -> anyhow::Result<String> {
        println!("$ redrivectl {}", shell_words(args));
        let output = self.quiet(args).await?;
        print!("{output}");
        if !output.ends_with('\n') {
            println!();
        }
        Ok(output)
    }

    /// Runs it and returns its standard output.
    pub(super) async fn quiet(&self, args: &[&str]) -> anyhow::Result<String> {
        let output = tokio::time::timeout(Duration::from_secs(120), self.command(args).output())
            .await
            .with_context(|| format!("redrivectl {} took over 120 s", shell_words(args)))??;
        ensure!(
            output.status.success(),
            "redrivectl {} failed ({}): {}",
            shell_words(args),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
        Ok(String::from_utf8(output.stdout)?)
    }
}

/// `args` as one would type them in a POSIX shell.
pub(super) fn shell_words(args: &[&str]) -> String {
    args.iter()
        .map(|arg| {
            let plain = !arg.is_empty()
                && arg.chars().all(|c| {
                    c.is_ascii_alphanumeric()
                        || matches!(c, '-' | '_' | '.' | '/' | ':' | ',' | '=' | '@')
                });
            if plain {
                (*arg).to_owned()
            } else {
                format!("'{}'", arg.replace('\'', r"'\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The value of a `name:   value` line of redrivectl's human output.
pub(super) fn field(output: &str, name: &str) -> anyhow::Result<String> {
    output
        .lines()
        .find_map(|line| {
            line.trim_start()
                .strip_prefix(name)
                .and_then(|rest| rest.strip_prefix(':'))
                .map(|value| value.trim().to_owned())
        })
        .filter(|value| !value.is_empty())
        .with_context(|| format!("no `{name}:` line in redrivectl's output:\n{output}"))
}
