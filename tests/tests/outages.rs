//! Servers that accept a connection and never answer (a hung process, a
//! half-open network path, a balancer with no backend), imitated by a
//! stalled [`TcpProxy`] in front of a shared server (never the server
//! itself): the planner waiting for its PostgreSQL, and `redrivectl`
//! calling a planner, say what they wait for, stop waiting, and stop when
//! told to.

use std::{process::Stdio, time::Duration};

use redrive_tests::{
    TcpProxy, init_logging,
    scenario::{self, signal},
};
use tokio::time::Instant;

/// A planner whose PostgreSQL accepts the connection and never answers
/// warns within seconds, naming PostgreSQL's address and that it said
/// nothing, keeps trying, and stops at SIGTERM although an attempt is
/// waiting (before, it waited silently and outlived SIGTERM).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_planner_whose_postgresql_never_answers_says_so_and_stops_on_sigterm()
-> anyhow::Result<()> {
    init_logging();
    let proxy = TcpProxy::start("127.0.0.1:5432".parse()?).await?;
    proxy.stall();
    let binaries = scenario::Binaries::of_tests()?;
    let listen = scenario::free_local_addr()?;
    let address = proxy.addr().to_string();
    let (mut planner, log) = scenario::spawn_logged(
        &binaries.planner,
        [
            "--listen",
            &listen.to_string(),
            "--database-url",
            &format!("postgres://postgres@{address}/redrive_never_answers"),
        ],
    )?;
    let deadline = Instant::now() + Duration::from_secs(30);
    let warnings = |text: &str| {
        text.lines()
            .filter(|line| {
                line.contains("PostgreSQL unreachable")
                    && line.contains(&address)
                    && line.contains("no answer within 5 s")
            })
            .count()
    };
    loop {
        let text = log.text();
        if warnings(&text) >= 2 {
            break;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "no two warnings naming PostgreSQL at {address} within 30 s:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The third attempt is waiting now (the pause between attempts is
    // under a second this early).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    signal(&planner, "TERM")?;
    let exited = tokio::time::timeout(Duration::from_secs(5), planner.wait()).await;
    let text = log.text();
    let status =
        exited.map_err(|_| anyhow::anyhow!("still running 5 s after SIGTERM:\n{text}"))??;
    assert!(status.success(), "{status}:\n{text}");
    assert!(text.contains("planner stopped"), "{text}");
    Ok(())
}

/// `redrivectl` calling a planner address that accepts the connection and
/// never answers ends with exit 69 (unreachable), naming the address and
/// the unanswered HTTP/2 PING, instead of waiting forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redrivectl_gives_up_on_a_planner_that_never_answers() -> anyhow::Result<()> {
    init_logging();
    // Any server behind a stalled path: nothing reaches it, nothing comes
    // back.
    let proxy = TcpProxy::start("127.0.0.1:5432".parse()?).await?;
    proxy.stall();
    let binaries = scenario::Binaries::of_tests()?;
    let address = proxy.addr().to_string();
    let call = tokio::process::Command::new(&binaries.redrivectl)
        .args(["--planner", &address, "plan", "list"])
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(Duration::from_secs(60), call)
        .await
        .map_err(|_| anyhow::anyhow!("redrivectl still waiting after 60 s"))??;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(69), "{stderr}");
    assert!(
        stderr.contains(&format!("cannot reach the planner at http://{address}"))
            && stderr.contains("keep-alive"),
        "{stderr}"
    );
    Ok(())
}

/// A second new user's pass: at SIGTERM the planner waited its whole grace
/// (here 60 s) for an idle executor's long-polled claim before it stopped.
/// The claim's wait ends with the shutdown now, answered "no slice".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_planner_stops_at_sigterm_without_waiting_out_a_long_polled_claim() -> anyhow::Result<()>
{
    use redrive_proto::v1::{self, coordinator_client::CoordinatorClient};
    init_logging();
    let db = redrive_tests::TestDb::new();
    let binaries = scenario::Binaries::of_tests()?;
    let listen = scenario::free_local_addr()?;
    let (mut planner, log) = scenario::spawn_logged(
        &binaries.planner,
        [
            "--listen",
            &listen.to_string(),
            "--database-url",
            &db.url(),
            "--shutdown-grace-seconds",
            "60",
        ],
    )?;
    let text = || log.text();
    let outcome = async {
        let url = format!("http://{listen}");
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut coordinator = loop {
            if let Ok(client) = CoordinatorClient::connect(url.clone()).await {
                break client;
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "the planner did not listen:\n{}",
                text()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        // Ready once it answers a claim (the database prepared).
        loop {
            let quick = coordinator
                .claim_slice(v1::ClaimSliceRequest {
                    executor_id: "idle".to_owned(),
                    wait: Some(redrive_proto::time::duration(Duration::ZERO)),
                    marks_publishing: true,
                })
                .await;
            if quick.is_ok() {
                break;
            }
            anyhow::ensure!(Instant::now() < deadline, "no claim answered:\n{}", text());
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let mut waiting = coordinator.clone();
        let long_poll = tokio::spawn(async move {
            waiting
                .claim_slice(v1::ClaimSliceRequest {
                    executor_id: "idle".to_owned(),
                    wait: Some(redrive_proto::time::duration(Duration::from_secs(30))),
                    marks_publishing: true,
                })
                .await
        });
        tokio::time::sleep(Duration::from_secs(1)).await;
        anyhow::ensure!(!long_poll.is_finished(), "the claim did not wait");
        signal(&planner, "TERM")?;
        // Well under the 30 s wait and the 60 s grace.
        let exited = tokio::time::timeout(Duration::from_secs(15), planner.wait())
            .await
            .map_err(|_| anyhow::anyhow!("still running 15 s after SIGTERM:\n{}", text()))??;
        anyhow::ensure!(exited.success(), "{exited}:\n{}", text());
        let answer = long_poll.await?;
        if let Ok(answer) = answer {
            anyhow::ensure!(answer.into_inner().slice.is_none(), "a slice with no plan");
        }
        Ok(())
    }
    .await;
    let _ = planner.start_kill();
    db.drop_database().await;
    outcome
}
