//! No secret in any log at any level (issue 28): the demo's incident, as
//! separate processes with TLS and authentication, every child logging at
//! `REDRIVE_LOG=trace`, with a secret on every path: the broker's user and
//! password (a RabbitMQ user of the test's own), a password in the database
//! URL, a Redis of the test's own that requires a password, the operator's
//! bearer token and the client certificates' private keys. Not one of
//! them appears in any child's log, written plainly or as lapin and Rust
//! print bytes (`[0, 103, 117, ...]`), in hex or in base64.

use std::{path::Path, time::Duration};

use anyhow::{Context, ensure};
use base64::Engine as _;
use redrive_tests::{
    POSTGRES_URL,
    scenario::{self, Logs, ScenarioConfig, free_local_addr},
    unique,
};

/// A RabbitMQ user of the test's own on the local broker (all rights on
/// `/`), deleted when dropped.
struct BrokerUser {
    name: String,
}

impl BrokerUser {
    fn create(name: &str, password: &str) -> anyhow::Result<Self> {
        rabbitmqctl(&["add_user", name, password])?;
        let user = Self {
            name: name.to_owned(),
        };
        rabbitmqctl(&["set_permissions", "-p", "/", name, ".*", ".*", ".*"])?;
        Ok(user)
    }
}

impl Drop for BrokerUser {
    fn drop(&mut self) {
        let _ = rabbitmqctl(&["delete_user", &self.name]);
    }
}

fn rabbitmqctl(args: &[&str]) -> anyhow::Result<()> {
    let output = std::process::Command::new("rabbitmqctl")
        .arg("-q")
        .args(args)
        .output()
        .context("running rabbitmqctl (scripts/services.sh installs RabbitMQ)")?;
    ensure!(
        output.status.success(),
        "rabbitmqctl {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(())
}

/// A Redis of the test's own on a free port, requiring `password`; killed
/// when dropped.
struct PrivateRedis {
    child: std::process::Child,
    url: String,
}

impl PrivateRedis {
    fn start(password: &str) -> anyhow::Result<Self> {
        let port = free_local_addr()?.port();
        let child = std::process::Command::new("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--requirepass",
                password,
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .stdout(std::process::Stdio::null())
            .spawn()
            .context("starting redis-server (scripts/services.sh installs it)")?;
        let redis = Self {
            child,
            url: format!("redis://:{password}@127.0.0.1:{port}"),
        };
        for _ in 0..100 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return Ok(redis);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        anyhow::bail!("the private redis-server on port {port} did not start")
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The ways a log could spell `secret`: as it is, as the list of its bytes
/// Rust's `Debug` prints (with or without spaces), in hex and in base64.
fn spellings(secret: &[u8]) -> Vec<String> {
    let bytes: Vec<String> = secret.iter().map(u8::to_string).collect();
    vec![
        String::from_utf8_lossy(secret).into_owned(),
        bytes.join(", "),
        bytes.join(","),
        hex::encode(secret),
        base64::engine::general_purpose::STANDARD.encode(secret),
        base64::engine::general_purpose::STANDARD_NO_PAD.encode(secret),
    ]
}

/// Every log file under `dir` with its text.
fn logs(dir: &Path) -> anyhow::Result<Vec<(String, String)>> {
    let mut logs = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let text = String::from_utf8_lossy(&std::fs::read(&path)?).into_owned();
        logs.push((path.display().to_string(), text));
    }
    Ok(logs)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_secret_reaches_any_log_even_at_trace() -> anyhow::Result<()> {
    let mut config = ScenarioConfig::small(scenario::Binaries::of_tests()?)?;
    // Secrets of this run only, so that a hit is a leak, not a coincidence.
    let tag = unique("s").replace(['-', '.', ':'], "");
    let broker_password = format!("amqp-pw-{tag}");
    let database_password = format!("pg-pw-{tag}");
    let redis_password = format!("redis-pw-{tag}");
    let user = BrokerUser::create(&format!("redrive-{tag}"), &broker_password)?;
    let redis = PrivateRedis::start(&redis_password)?;
    config.log_filter = "trace".to_owned();
    config.amqp_url = Some(format!(
        "amqp://{}:{broker_password}@127.0.0.1:5672/%2f",
        user.name
    ));
    config.redis_url = redis.url.clone();
    // PostgreSQL trusts local clients: the password is sent nowhere, but
    // it is in the URL every process is given.
    config.database_url = config.database_url.replacen(
        POSTGRES_URL,
        &format!("postgres://postgres:{database_password}@127.0.0.1:5432"),
        1,
    );
    config.kill_executor = false;
    let Logs::Directory(dir) = config.logs.clone() else {
        anyhow::bail!("the small scenario logs to a directory");
    };
    let pki = config.pki.clone().context("the small scenario is secure")?;
    let outcome = scenario::run(&config).await?;
    ensure!(
        outcome.failures().is_empty(),
        "the replay itself went wrong: {:?}",
        outcome
            .failures()
            .iter()
            .map(|check| &check.what)
            .collect::<Vec<_>>()
    );

    let mut secrets: Vec<(&str, Vec<u8>)> = vec![
        ("the broker password", broker_password.clone().into_bytes()),
        (
            "the broker's SASL PLAIN response",
            format!("\0{}\0{broker_password}", user.name).into_bytes(),
        ),
        ("the database password", database_password.into_bytes()),
        ("the Redis password", redis_password.into_bytes()),
        (
            "the operator's bearer token",
            redrive_tests::pki::token_of("demo-operator")
                .as_bytes()
                .to_vec(),
        ),
    ];
    for name in ["executor-1.key", "executor-2.key", "planner.key"] {
        let pem = std::fs::read_to_string(pki.path(name))?;
        // A line from the middle of the key's base64: a printed key would
        // hold it whatever its framing.
        let lines: Vec<&str> = pem
            .lines()
            .filter(|line| !line.starts_with("-----"))
            .collect();
        let middle = lines
            .get(lines.len() / 2)
            .context("a key of several lines")?;
        secrets.push(("a private key", middle.as_bytes().to_vec()));
    }
    let logs = logs(&dir)?;
    let total: usize = logs.iter().map(|(_, text)| text.len()).sum();
    ensure!(
        logs.len() >= 4 && total > 1_000_000,
        "trace logs were written ({} files, {total} bytes)",
        logs.len()
    );
    let mut leaks = Vec::new();
    for (what, secret) in &secrets {
        for spelling in spellings(secret) {
            for (file, text) in &logs {
                if let Some(at) = text.find(&spelling) {
                    let line_start = text[..at].rfind('\n').map_or(0, |i| i + 1);
                    let line: String = text[line_start..].chars().take(300).collect();
                    leaks.push(format!("{what} as {spelling:?} in {file}: {line}"));
                }
            }
        }
    }
    assert!(
        leaks.is_empty(),
        "secrets in the logs:\n{}",
        leaks.join("\n")
    );
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
