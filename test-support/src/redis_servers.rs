//! Private Redis servers for tests of Redis Cluster and Sentinel: real
//! `redis-server` processes on ports of their own, in a directory of their
//! own, killed and deleted when dropped (also when the test fails). The
//! shared Redis on 6379 is never touched.
//!
//! - [`RedisCluster`]: masters of a Redis Cluster (`redis-cli --cluster
//!   create`), each with an append-only file synced on every write, so a
//!   node killed with `SIGKILL` and started again comes back with its data.
//! - [`RedisSentinelGroup`]: a master, a replica and one Sentinel watching
//!   them (quorum 1), which promotes the replica when the master dies.

use std::{
    net::TcpListener,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, bail};

/// One `redis-server` process on `127.0.0.1:{port}`, killed when dropped.
pub struct RedisProcess {
    port: u16,
    args: Vec<String>,
    /// What `redis-cli` authenticates with (the server's `requirepass`).
    password: Option<String>,
    child: Option<Child>,
}

impl RedisProcess {
    fn start(port: u16, args: Vec<String>, password: Option<&str>) -> anyhow::Result<Self> {
        let mut process = Self {
            port,
            args,
            password: password.map(str::to_owned),
            child: None,
        };
        process.restart()?;
        Ok(process)
    }

    /// The server's port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Whether the server runs (not killed, or restarted since).
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// `redis://127.0.0.1:{port}`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Kills the server with `SIGKILL` (no shutdown, no save) and waits for
    /// it to end.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again with the same arguments and waits until it
    /// answers `PING` (at most 10 s).
    ///
    /// # Errors
    /// `redis-server` cannot be started or does not answer.
    pub fn restart(&mut self) -> anyhow::Result<()> {
        self.kill();
        let child = Command::new("redis-server")
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("cannot start redis-server")?;
        // Its own answer, not another server's on the same port: the
        // process id it reports is the child's.
        let pid = format!("process_id:{}", child.id());
        self.child = Some(child);
        wait_for(
            "redis-server to answer as itself",
            Duration::from_secs(10),
            || Ok(self.cli(&["INFO", "server"])?.contains(&pid)),
        )
    }

    /// Runs `redis-cli -p {port} {args}` (with the server's password) and
    /// returns what it printed.
    ///
    /// # Errors
    /// `redis-cli` cannot be run.
    pub fn cli(&self, args: &[&str]) -> anyhow::Result<String> {
        match &self.password {
            Some(password) => {
                let mut with_password = vec!["--no-auth-warning", "-a", password];
                with_password.extend(args);
                cli(self.port, &with_password)
            }
            None => cli(self.port, args),
        }
    }
}

impl Drop for RedisProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Runs `redis-cli -h 127.0.0.1 -p {port} {args}`.
///
/// # Errors
/// `redis-cli` cannot be run, exits with a failure, or prints nothing but
/// an error (it cannot connect, say): an empty answer is never mistaken
/// for "no keys". The error names the command without a password, and
/// gives what it printed (`--cluster create` prints its errors to standard
/// output).
fn cli(port: u16, args: &[&str]) -> anyhow::Result<String> {
    let output = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .context("cannot run redis-cli")?;
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    if !output.status.success() || (stdout.trim().is_empty() && !stderr.trim().is_empty()) {
        let shown: Vec<&str> = args
            .iter()
            .enumerate()
            .map(
                |(at, arg)| match at.checked_sub(1).map(|before| args[before]) {
                    Some("-a") => "***",
                    _ => arg,
                },
            )
            .collect();
        bail!(
            "redis-cli -p {port} {} failed ({}): {} {}",
            shown.join(" "),
            output.status,
            stderr.trim(),
            stdout.trim()
        );
    }
    Ok(stdout)
}

/// Polls `ready` every 50 ms until it holds, for at most `limit`.
fn wait_for(
    what: &str,
    limit: Duration,
    mut ready: impl FnMut() -> anyhow::Result<bool>,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + limit;
    loop {
        if ready().unwrap_or(false) {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("waited {limit:?} for {what}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A directory of the test's own under the system's temporary directory,
/// deleted when dropped.
struct ScratchDir(PathBuf);

impl ScratchDir {
    fn new(prefix: &str) -> anyhow::Result<Self> {
        let path = std::env::temp_dir().join(crate::unique(prefix));
        std::fs::create_dir_all(&path)
            .with_context(|| format!("cannot create {}", path.display()))?;
        Ok(Self(path))
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A free port `p` on 127.0.0.1 whose cluster bus port `p + 10000` is free
/// too (the bus port is fixed by Redis Cluster). Both lie below Linux's
/// ephemeral range (32768 and up), so no client socket of the test can hold
/// them; they are handed out from one counter per test process, starting
/// at a random point of 10000-19999, so tests starting servers at the same
/// moment never get the same one.
fn free_port() -> anyhow::Result<u16> {
    use std::sync::atomic::{AtomicU16, Ordering};
    static NEXT: std::sync::OnceLock<AtomicU16> = std::sync::OnceLock::new();
    let next = NEXT.get_or_init(|| {
        let offset = u16::try_from(uuid::Uuid::new_v4().as_u128() % 10_000).unwrap_or(0);
        AtomicU16::new(offset)
    });
    for _ in 0..1_000 {
        let port = 10_000 + next.fetch_add(1, Ordering::Relaxed) % 10_000;
        if TcpListener::bind(("127.0.0.1", port)).is_ok()
            && TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok()
        {
            return Ok(port);
        }
    }
    bail!("no free pair of ports for a Redis Cluster node")
}

fn base_args(port: u16, dir: &Path) -> Vec<String> {
    [
        "--port",
        &port.to_string(),
        "--bind",
        "127.0.0.1",
        "--dir",
        &dir.display().to_string(),
        "--save",
        "",
        "--logfile",
        &format!("redis-{port}.log"),
        "--daemonize",
        "no",
    ]
    .map(str::to_owned)
    .to_vec()
}

/// A Redis Cluster on private ports: masters, and replicas when asked.
/// Dropping it kills the nodes and deletes their files.
pub struct RedisCluster {
    /// The nodes, in the order they were created.
    pub nodes: Vec<RedisProcess>,
    _dir: ScratchDir,
}

impl RedisCluster {
    /// Starts `masters` (at least 3) nodes with `--cluster-enabled yes`, a
    /// node timeout of 1 s and `appendfsync always`, joins them with
    /// `redis-cli --cluster create`, and waits until every node reports
    /// `cluster_state:ok`.
    ///
    /// # Errors
    /// A node does not start or the cluster does not form within 20 s.
    pub fn start(masters: usize) -> anyhow::Result<Self> {
        Self::start_with_replicas(masters, 0)
    }

    /// [`Self::start`] with `replicas` replicas of each master (`--cluster-replicas`):
    /// `masters × (1 + replicas)` nodes, the masters first. Waits, besides,
    /// until every replica's link to its master is up, so that a master
    /// killed afterwards is failed over to a replica in sync.
    ///
    /// # Errors
    /// A node does not start, or the cluster does not form or sync within
    /// 20 s.
    pub fn start_with_replicas(masters: usize, replicas: usize) -> anyhow::Result<Self> {
        let dir = ScratchDir::new("redis_cluster")?;
        let mut nodes = Vec::new();
        for _ in 0..masters * (1 + replicas) {
            let port = free_port()?;
            let mut args = base_args(port, dir.path());
            args.extend(
                [
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    &format!("nodes-{port}.conf"),
                    "--cluster-node-timeout",
                    "1000",
                    "--appendonly",
                    "yes",
                    "--appendfsync",
                    "always",
                    "--appendfilename",
                    &format!("appendonly-{port}.aof"),
                    "--appenddirname",
                    &format!("aof-{port}"),
                ]
                .map(str::to_owned),
            );
            nodes.push(RedisProcess::start(port, args, None)?);
        }
        let addresses: Vec<String> = nodes
            .iter()
            .map(|node| format!("127.0.0.1:{}", node.port()))
            .collect();
        let mut create = vec!["--cluster", "create"];
        create.extend(addresses.iter().map(String::as_str));
        let replicas = replicas.to_string();
        create.extend(["--cluster-replicas", &replicas, "--cluster-yes"]);
        let created = nodes[0].cli(&create)?;
        let cluster = Self { nodes, _dir: dir };
        cluster
            .wait_ok(Duration::from_secs(20))
            .with_context(|| format!("redis-cli --cluster create said: {created}"))?;
        wait_for("every replica in sync", Duration::from_secs(20), || {
            for node in &cluster.nodes {
                let replication = node.cli(&["INFO", "replication"])?;
                if replication.contains("role:slave")
                    && !replication.contains("master_link_status:up")
                {
                    return Ok(false);
                }
            }
            Ok(true)
        })
        .with_context(|| format!("redis-cli --cluster create said: {created}"))?;
        Ok(cluster)
    }

    /// Whether the node at `index` is a master now (`ROLE`).
    ///
    /// # Errors
    /// The node does not answer.
    pub fn is_master(&self, index: usize) -> anyhow::Result<bool> {
        Ok(self.nodes[index]
            .cli(&["ROLE"])?
            .lines()
            .next()
            .is_some_and(|role| role.trim() == "master"))
    }

    /// The seed URLs of every node, comma-separated (`--redis-url` with
    /// `--redis-cluster`).
    pub fn urls(&self) -> String {
        self.nodes
            .iter()
            .map(RedisProcess::url)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Waits until every node that runs reports `cluster_state:ok`.
    ///
    /// # Errors
    /// Not within `limit`.
    pub fn wait_ok(&self, limit: Duration) -> anyhow::Result<()> {
        wait_for("cluster_state:ok on every node", limit, || {
            for node in self.nodes.iter().filter(|node| node.is_running()) {
                if !node.cli(&["CLUSTER", "INFO"])?.contains("cluster_state:ok") {
                    return Ok(false);
                }
            }
            Ok(true)
        })
    }

    /// The index in [`RedisCluster::nodes`] of the node serving `key`'s
    /// hash slot (`CLUSTER KEYSLOT`, then the slot ranges of `CLUSTER
    /// NODES`).
    ///
    /// # Errors
    /// The cluster does not answer or no node serves the slot.
    pub fn node_of(&self, key: &str) -> anyhow::Result<usize> {
        let asker = self
            .nodes
            .iter()
            .find(|node| node.is_running())
            .context("no node runs")?;
        let slot: u16 = asker
            .cli(&["CLUSTER", "KEYSLOT", key])?
            .trim()
            .parse()
            .context("CLUSTER KEYSLOT")?;
        for line in asker.cli(&["CLUSTER", "NODES"])?.lines() {
            // <id> <ip:port@bus> <flags> <master> <ping> <pong> <epoch> <state> <slots>...
            let fields: Vec<&str> = line.split_whitespace().collect();
            let Some(address) = fields.get(1) else {
                continue;
            };
            let serves = fields.iter().skip(8).any(|range| {
                let mut ends = range.split('-');
                match (ends.next().map(str::parse::<u16>), ends.next()) {
                    (Some(Ok(first)), Some(last)) => last
                        .parse::<u16>()
                        .is_ok_and(|last| first <= slot && slot <= last),
                    (Some(Ok(only)), None) => only == slot,
                    _ => false,
                }
            });
            if serves {
                let port = address
                    .split(['@', ':'])
                    .nth(1)
                    .and_then(|port| port.parse::<u16>().ok());
                if let Some(index) = self.nodes.iter().position(|node| Some(node.port()) == port) {
                    return Ok(index);
                }
            }
        }
        bail!("no node serves slot {slot}")
    }
}

/// A master, one replica of it and one Sentinel monitoring them under
/// [`RedisSentinelGroup::MASTER`] with quorum 1, a down-after of 1 s and a
/// failover timeout of 5 s. Dropping it kills all three and deletes their
/// files.
pub struct RedisSentinelGroup {
    /// The master at the start.
    pub master: RedisProcess,
    /// Its replica at the start.
    pub replica: RedisProcess,
    /// The Sentinel (no password).
    pub sentinel: RedisProcess,
    _dir: ScratchDir,
}

impl RedisSentinelGroup {
    /// The master's name in the Sentinel's configuration.
    pub const MASTER: &'static str = "redrive-test";

    /// Starts the three, the master and the replica requiring `password`
    /// when given (the Sentinel knows it, `sentinel auth-pass`), and waits
    /// until the replica is in sync and the Sentinel knows it. A `stubborn`
    /// master has `REPLICAOF` and `SLAVEOF` renamed away: after a failover
    /// the Sentinel cannot make it a replica, so it stays a writable master
    /// (a master on the wrong side of a partition, as clients see it).
    ///
    /// # Errors
    /// A process does not start or the Sentinel does not see the replica
    /// within 20 s.
    pub fn start(password: Option<&str>, stubborn: bool) -> anyhow::Result<Self> {
        let dir = ScratchDir::new("redis_sentinel")?;
        let secured = |mut args: Vec<String>| {
            if let Some(password) = password {
                args.extend(
                    ["--requirepass", password, "--masterauth", password].map(str::to_owned),
                );
            }
            args
        };
        let master_port = free_port()?;
        let mut master_args = secured(base_args(master_port, dir.path()));
        // The replica's first sync at once, not after Redis's 5 s wait for
        // more replicas.
        master_args.extend(["--repl-diskless-sync-delay", "0"].map(str::to_owned));
        if stubborn {
            master_args.extend(
                [
                    "--rename-command",
                    "REPLICAOF",
                    "",
                    "--rename-command",
                    "SLAVEOF",
                    "",
                ]
                .map(str::to_owned),
            );
        }
        let master = RedisProcess::start(master_port, master_args, password)?;
        let replica_port = free_port()?;
        let mut replica_args = secured(base_args(replica_port, dir.path()));
        replica_args
            .extend(["--replicaof", "127.0.0.1", &master_port.to_string()].map(str::to_owned));
        let replica = RedisProcess::start(replica_port, replica_args, password)?;
        let sentinel_port = free_port()?;
        let config = dir.path().join("sentinel.conf");
        let name = Self::MASTER;
        let auth = password
            .map(|password| format!("sentinel auth-pass {name} {password}\n"))
            .unwrap_or_default();
        std::fs::write(
            &config,
            format!(
                "port {sentinel_port}\nbind 127.0.0.1\ndir {dir}\nlogfile sentinel.log\n\
                 sentinel monitor {name} 127.0.0.1 {master_port} 1\n{auth}\
                 sentinel down-after-milliseconds {name} 1000\n\
                 sentinel failover-timeout {name} 5000\n\
                 sentinel parallel-syncs {name} 1\n",
                dir = dir.path().display()
            ),
        )?;
        let sentinel = RedisProcess::start(
            sentinel_port,
            vec![config.display().to_string(), "--sentinel".to_owned()],
            None,
        )?;
        let group = Self {
            master,
            replica,
            sentinel,
            _dir: dir,
        };
        wait_for(
            "the replica in sync and the Sentinel seeing it",
            Duration::from_secs(20),
            || {
                let synced = group
                    .replica
                    .cli(&["INFO", "replication"])?
                    .contains("master_link_status:up");
                let replicas = group
                    .sentinel
                    .cli(&["SENTINEL", "REPLICAS", Self::MASTER])?;
                Ok(synced && replicas.contains(&replica_port.to_string()))
            },
        )?;
        Ok(group)
    }

    /// The port of the master the Sentinel names now.
    ///
    /// # Errors
    /// The Sentinel does not answer.
    pub fn master_port(&self) -> anyhow::Result<u16> {
        let answer = self
            .sentinel
            .cli(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", Self::MASTER])?;
        answer
            .lines()
            .nth(1)
            .and_then(|port| port.trim().parse().ok())
            .with_context(|| format!("the Sentinel answered {answer:?}"))
    }
}
