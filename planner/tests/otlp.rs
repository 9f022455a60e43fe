//! A collector that cannot be reached at `--otlp-endpoint` is reported in the
//! log (the OpenTelemetry SDK's own errors, its feature `internal-logs`),
//! instead of telemetry vanishing without a word. The planner pushes metrics
//! every 10 s, so its first push fails within seconds of that.

use std::{
    io::{BufRead as _, BufReader},
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use redrive_test_support::TestDb;

/// A local port nothing listens on (bound, then released).
fn closed_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("address").port()
}

/// The planner process and its database, both gone when dropped (also when
/// the test fails).
struct Planner {
    child: Child,
    /// Dropped after the process is killed in [`Planner::drop`].
    _db: TestDb,
}

impl Drop for Planner {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn an_unreachable_collector_is_logged() {
    let db = TestDb::new();
    let database_url = db.url();
    let collector = format!("http://127.0.0.1:{}", closed_port());
    let child = Command::new(env!("CARGO_BIN_EXE_redrive-planner"))
        .args([
            "--database-url",
            &database_url,
            "--listen",
            "127.0.0.1:0",
            "--otlp-endpoint",
            &collector,
        ])
        .env_clear()
        .env("REDRIVE_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running redrive-planner");
    let mut planner = Planner { child, _db: db };
    let (lines, received) = mpsc::channel();
    let stdout = planner.child.stdout.take().expect("stdout");
    let stderr = planner.child.stderr.take().expect("stderr");
    for stream in [
        Box::new(stdout) as Box<dyn std::io::Read + Send>,
        Box::new(stderr),
    ] {
        let lines = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stream).lines().map_while(Result::ok) {
                if lines.send(line).is_err() {
                    return;
                }
            }
        });
    }
    let deadline = Instant::now() + Duration::from_secs(45);
    let mut seen = Vec::new();
    let reported = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match received.recv_timeout(left) {
            Ok(line) if line.contains("ExportError") => break Some(line),
            Ok(line) => seen.push(line),
            Err(_) => break None,
        }
    };
    drop(planner);
    let line = reported.unwrap_or_else(|| {
        panic!(
            "no export error logged in 45 s; the log was:\n{}",
            seen.join("\n")
        )
    });
    assert!(line.contains("ERROR"), "{line}");
    assert!(line.contains("Connection refused"), "{line}");
}
