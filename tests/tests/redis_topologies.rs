//! The bucket and the replay keys in a Redis Cluster and behind Redis
//! Sentinel (docs/operating.md, "Redis Cluster and Sentinel"), each on
//! private `redis-server` processes this test starts on ports of its own:
//! a node or the master is killed mid-replay. The executors fail closed
//! while it is down and resume when it is back; the rate bound holds across
//! the outage; no message is delivered twice; the marks written before the
//! outage are still there after it.

use std::{collections::HashSet, time::Duration};

use redrive_tests::{
    Broker, ExecutorHandle, RedisCluster, RedisProcess, RedisSentinelGroup, TestBed, init_logging,
    unique,
};
use tokio::time::Instant;

mod support;
use support::*;

/// The replay keys (`{prefix}replayed-on:…`) stored on `node`.
fn marks_on(node: &RedisProcess, prefix: &str) -> anyhow::Result<usize> {
    let pattern = format!("{prefix}replayed-on:*");
    Ok(node
        .cli(&["--scan", "--pattern", &pattern])?
        .lines()
        .filter(|line| !line.trim().is_empty())
        .count())
}

/// The name of a token bucket key of `prefix` (the key lives while grants
/// go on), as any running node lists it (a replica holds its master's keys).
fn bucket_key(cluster: &RedisCluster, prefix: &str) -> anyhow::Result<Option<String>> {
    let pattern = format!("{prefix}bucket:*");
    for node in cluster.nodes.iter().filter(|node| node.is_running()) {
        if let Some(key) = node
            .cli(&["--scan", "--pattern", &pattern])?
            .lines()
            .map(str::trim)
            .find(|line| !line.is_empty())
        {
            return Ok(Some(key.to_owned()));
        }
    }
    Ok(None)
}

/// What the consumer received between two instants, as offsets from `from`.
fn received_between(
    received: &std::sync::Mutex<Vec<Received>>,
    from: Instant,
    to: Instant,
) -> Vec<Duration> {
    received
        .lock()
        .unwrap()
        .iter()
        .filter(|r| r.at > from && r.at < to)
        .map(|r| r.at - from)
        .collect()
}

/// Messages in each test's plan.
const ITEMS: u32 = 600;
/// Each test's rate: per second, burst.
const RATE: (f64, u32) = (100.0, 10);

/// A replay with its Redis outage to come.
struct Outage {
    bed: TestBed,
    prefix: String,
    received: std::sync::Arc<std::sync::Mutex<Vec<Received>>>,
    consuming: tokio::task::JoinHandle<()>,
    plan: redrive_proto::v1::Plan,
    executor: ExecutorHandle,
}

/// An incident of [`ITEMS`] messages, an approved plan at [`RATE`] and an
/// executor configured by `redis` (the Redis settings), returned once 150
/// messages have arrived.
async fn replay_until_mid_plan(
    redis: impl FnOnce(&mut redrive_executor::Config),
) -> anyhow::Result<Outage> {
    let broker = Broker::connect().await?;
    let incident = incident(&broker, ITEMS).await?;
    let mut bed = bed(broker, &[&incident.dlq], u64::from(ITEMS)).await?;
    let prefix = bed.redis.prefix.clone();
    let (received, consuming) = consume(bed.broker(), &incident.work).await?;
    let plan = approved_plan(&mut bed.client, &incident.dlq, RATE.0, RATE.1, None).await?;
    let mut config = bed.executor_config();
    redis(&mut config);
    let executor = ExecutorHandle::start(config);
    wait_received(&received, 150, Duration::from_secs(30)).await?;
    Ok(Outage {
        bed,
        prefix,
        received,
        consuming,
        plan,
        executor,
    })
}

/// The Redis settings of an executor seeded with every node of `cluster`.
fn on_cluster(cluster: &RedisCluster) -> impl FnOnce(&mut redrive_executor::Config) {
    let urls = cluster.urls();
    move |config| {
        config.redis_url = Some(urls);
        config.redis_cluster = true;
    }
}

/// The checks after the replay: every message arrived exactly once, no
/// second held more than rate + burst (plus 5% for the jitter between a
/// grant and the consumer's receive time, as the other rate tests), and
/// every delivery is `sent` or `uncertain` in the audit.
async fn assert_exactly_once_within_rate(
    bed: &TestBed,
    plan_id: &str,
    received: &[Received],
) -> anyhow::Result<()> {
    let (items, (per_second, burst)) = (ITEMS as usize, RATE);
    let ids: HashSet<&str> = received.iter().map(|r| r.message_id.as_str()).collect();
    assert_eq!(
        (received.len(), ids.len()),
        (items, items),
        "every message arrived exactly once"
    );
    let bound = (per_second * 1.05 + f64::from(burst)) as usize;
    let most = most_in_any(received, Duration::from_secs(1));
    assert!(
        most <= bound,
        "{most} deliveries in one second across the outage, bound {bound}"
    );
    let (sent, _uncertain) = assert_bed_audit(bed, plan_id, received).await?;
    assert_eq!(sent.len(), items, "every item sent in the end");
    Ok(())
}

/// A 3-master Redis Cluster; the node holding the destination's bucket is
/// killed (`SIGKILL`) mid-plan (after 150 of 600 deliveries at 100/s, burst
/// 10, once every node holds replay keys), and started again 4 s later with its append-only file. Nothing is published
/// from a second after the kill until it is back; the plan completes; each
/// message arrives once; no second exceeds the bound; the marks the killed
/// node held are all there after its restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cluster_node_killed_mid_replay_pauses_publishing_and_loses_no_mark() -> anyhow::Result<()>
{
    init_logging();
    let mut cluster = tokio::task::spawn_blocking(|| RedisCluster::start(3)).await??;
    let Outage {
        mut bed,
        prefix,
        received,
        consuming,
        plan,
        executor,
    } = replay_until_mid_plan(on_cluster(&cluster)).await?;

    let key = bucket_key(&cluster, &prefix)?
        .ok_or_else(|| anyhow::anyhow!("no node holds the bucket mid-replay"))?;
    let victim = cluster.node_of(&key)?;
    // The message keys differ in a few digits, and CRC16 (the slot's hash)
    // is linear: the slots of the first 150 or so can miss one node's range
    // altogether (a quarter of the prefixes do). The first 310 reach every
    // node for every prefix of 3,000 tried, and the replay goes on
    // meanwhile, so wait for that: at most 2.5 s (about 400 delivered),
    // which leaves 200 of the plan's 600 for the outage.
    let spread_by = Instant::now() + Duration::from_millis(2500);
    let spread = loop {
        let spread: Vec<usize> = cluster
            .nodes
            .iter()
            .map(|node| marks_on(node, &prefix))
            .collect::<anyhow::Result<_>>()?;
        if spread.iter().all(|marks| *marks > 0) || Instant::now() > spread_by {
            break spread;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let marks_before = marks_on(&cluster.nodes[victim], &prefix)?;
    assert!(
        spread.iter().all(|marks| *marks > 0),
        "the replay keys spread over every node: {spread:?}"
    );
    let cut_at = Instant::now();
    cluster.nodes[victim].kill();
    let delivered_at_cut = received.lock().unwrap().len();
    tokio::time::sleep(Duration::from_secs(4)).await;
    let restored_at = Instant::now();
    let cluster = tokio::task::spawn_blocking(move || -> anyhow::Result<RedisCluster> {
        cluster.nodes[victim].restart()?;
        cluster.wait_ok(Duration::from_secs(20))?;
        Ok(cluster)
    })
    .await??;
    let during = received_between(&received, cut_at, restored_at);
    assert!(
        during.iter().all(|after| *after < Duration::from_secs(1)),
        "nothing is published while the bucket's node is down (fail closed): deliveries \
         {during:?} after the kill"
    );
    assert!(
        delivered_at_cut < ITEMS as usize,
        "the kill came mid-plan ({delivered_at_cut} delivered)"
    );
    let marks_after = marks_on(&cluster.nodes[victim], &prefix)?;
    assert!(
        marks_after >= marks_before,
        "the killed node came back with its marks: {marks_before} before, {marks_after} after"
    );

    wait_completed(&mut bed.client, &plan.plan_id, Duration::from_secs(90)).await?;
    executor.stop().await?;
    let received = drain(&received, consuming, Duration::from_millis(300)).await?;
    assert!(
        received.iter().any(|r| r.at > restored_at),
        "publishing resumed once the node was back"
    );
    assert_exactly_once_within_rate(&bed, &plan.plan_id, &received).await?;
    let marks: usize = cluster
        .nodes
        .iter()
        .map(|node| marks_on(node, &prefix))
        .sum::<anyhow::Result<_>>()?;
    let early = received
        .iter()
        .filter(|r| r.at + Duration::from_secs(1) < cut_at)
        .count();
    assert!(
        marks >= early,
        "every message delivered a second before the kill is marked: {marks} marks, {early} early"
    );
    bed.finish().await
}

/// A Redis Cluster of 3 masters, each with a replica in sync; the master
/// holding the destination's bucket is killed (`SIGKILL`) mid-plan (after
/// 150 of 600 deliveries at 100/s, burst 10) and never comes back. Its
/// replica is promoted (node timeout 1 s); the executor, told only the
/// seed URLs, follows the slot to it (the cluster answers `MOVED` or the
/// old address refuses). Nothing is published from a second after the kill
/// until the promotion; publishing resumes after it; the plan completes;
/// each message arrives once; no second exceeds the bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cluster_master_killed_mid_replay_fails_over_to_its_replica() -> anyhow::Result<()> {
    init_logging();
    let mut cluster =
        tokio::task::spawn_blocking(|| RedisCluster::start_with_replicas(3, 1)).await??;
    let Outage {
        mut bed,
        prefix,
        received,
        consuming,
        plan,
        executor,
    } = replay_until_mid_plan(on_cluster(&cluster)).await?;

    let key = bucket_key(&cluster, &prefix)?
        .ok_or_else(|| anyhow::anyhow!("no node holds the bucket mid-replay"))?;
    let victim = cluster.node_of(&key)?;
    anyhow::ensure!(cluster.is_master(victim)?, "the bucket's node is a master");
    let cut_at = Instant::now();
    cluster.nodes[victim].kill();
    let delivered_at_cut = received.lock().unwrap().len();
    let (cluster, heir) = tokio::task::spawn_blocking(move || -> anyhow::Result<_> {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(heir) = cluster.node_of(&key)
                && heir != victim
                && cluster.is_master(heir)?
            {
                return Ok((cluster, heir));
            }
            anyhow::ensure!(
                std::time::Instant::now() < deadline,
                "no replica was promoted within 30 s"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    })
    .await??;
    let promoted_at = Instant::now();
    tracing::info!(
        victim,
        heir,
        after = ?(promoted_at - cut_at),
        "the bucket's master failed over to its replica"
    );
    assert!(
        delivered_at_cut < ITEMS as usize,
        "the kill came mid-plan ({delivered_at_cut} delivered)"
    );
    // The promotion is seen by polling, up to some 0.5 s after it happened
    // (Redis elects the replica at least 1.5 s after the kill: 1 s node
    // timeout, then 0.5 s and a random delay).
    let seen_late = Duration::from_millis(500);
    let during = received_between(&received, cut_at, promoted_at - seen_late);
    assert!(
        during.iter().all(|after| *after < Duration::from_secs(1)),
        "nothing is published while the bucket's master is down and not yet replaced \
         (fail closed): deliveries {during:?} after the kill, promotion seen after {:?}",
        promoted_at - cut_at
    );

    wait_completed(&mut bed.client, &plan.plan_id, Duration::from_secs(90)).await?;
    executor.stop().await?;
    let received = drain(&received, consuming, Duration::from_millis(300)).await?;
    assert!(
        received.iter().any(|r| r.at > promoted_at),
        "publishing went on after the replica was promoted"
    );
    assert_exactly_once_within_rate(&bed, &plan.plan_id, &received).await?;
    drop(cluster);
    bed.finish().await
}

/// How the Sentinel test loses its master.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum MasterLoss {
    /// `SIGKILL`: the Sentinel promotes the replica after its down-after.
    Killed,
    /// `SENTINEL FAILOVER` with a master that cannot be made a replica
    /// (`REPLICAOF` renamed away): the replica is promoted and the old
    /// master stays up and writable, so nothing but the Sentinel's answer
    /// tells the executor to leave it.
    Replaced,
}

/// A master requiring a password, its replica and a Sentinel without one
/// (the master's password given as `--redis-master-password`), listed after
/// a Sentinel address where nothing listens. The master is lost (`loss`)
/// after 150 of 600 deliveries at 100/s, burst 10. The executor finds the
/// new master through the Sentinel by itself; the plan completes, each
/// message once, within the bound, with the marks written before the loss
/// on the new master. When the master was killed, nothing is published
/// until the replica is promoted.
async fn replay_across_a_sentinel_failover(loss: MasterLoss) -> anyhow::Result<()> {
    init_logging();
    let password = unique("redis_pw");
    let group = {
        let password = password.clone();
        let stubborn = loss == MasterLoss::Replaced;
        tokio::task::spawn_blocking(move || RedisSentinelGroup::start(Some(&password), stubborn))
            .await??
    };
    let nobody = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let sentinels = format!("redis://{nobody},{}", group.sentinel.url());
    let Outage {
        mut bed,
        prefix,
        received,
        consuming,
        plan,
        executor,
    } = replay_until_mid_plan(|config| {
        config.redis_url = Some(sentinels);
        config.redis_sentinel_master = Some(RedisSentinelGroup::MASTER.to_owned());
        config.redis_master_password = Some(password);
    })
    .await?;

    let cut_at = Instant::now();
    let mut group = group;
    match loss {
        MasterLoss::Killed => group.master.kill(),
        MasterLoss::Replaced => {
            let answer =
                group
                    .sentinel
                    .cli(&["SENTINEL", "FAILOVER", RedisSentinelGroup::MASTER])?;
            anyhow::ensure!(answer.trim() == "OK", "SENTINEL FAILOVER: {answer}");
        }
    }
    let replica_port = group.replica.port();
    let group = tokio::task::spawn_blocking(move || -> anyhow::Result<RedisSentinelGroup> {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while group.master_port()? != replica_port {
            anyhow::ensure!(
                std::time::Instant::now() < deadline,
                "the Sentinel did not promote the replica within 30 s"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(group)
    })
    .await??;
    let promoted_at = Instant::now();
    eprintln!(
        "{loss:?}: replica promoted {:?} after",
        promoted_at - cut_at
    );
    // The old master, still writable, gets no more marks once the
    // executor has noticed the switch (the Sentinel is asked every second).
    let mut old_master_marks = None;
    if loss == MasterLoss::Replaced {
        tokio::time::sleep(Duration::from_secs(2)).await;
        old_master_marks = Some(marks_on(&group.master, &prefix)?);
    }
    if loss == MasterLoss::Killed {
        let during = received_between(&received, cut_at, promoted_at);
        assert!(
            during.iter().all(|after| *after < Duration::from_secs(1)),
            "nothing is published while there is no master (fail closed): deliveries \
             {during:?} after the kill"
        );
    }

    wait_completed(&mut bed.client, &plan.plan_id, Duration::from_secs(90)).await?;
    executor.stop().await?;
    let received = drain(&received, consuming, Duration::from_millis(300)).await?;
    assert!(
        received.iter().any(|r| r.at > promoted_at),
        "publishing went on after the replica was promoted"
    );
    assert_exactly_once_within_rate(&bed, &plan.plan_id, &received).await?;
    if let Some(before) = old_master_marks {
        let after = marks_on(&group.master, &prefix)?;
        assert_eq!(
            after, before,
            "the replaced master, still writable, got marks after the switch"
        );
    }
    let marks = marks_on(&group.replica, &prefix)?;
    let early = received
        .iter()
        .filter(|r| r.at + Duration::from_secs(1) < cut_at)
        .count();
    assert!(
        marks >= early,
        "the new master holds a mark for every message delivered a second before the \
         failover: {marks} marks, {early} early"
    );
    bed.finish().await
}

/// [`replay_across_a_sentinel_failover`], the master killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sentinel_failover_mid_replay_pauses_publishing_then_finds_the_new_master()
-> anyhow::Result<()> {
    replay_across_a_sentinel_failover(MasterLoss::Killed).await
}

/// [`replay_across_a_sentinel_failover`], the master replaced and still up
/// and writable (`SENTINEL FAILOVER`, the old master unable to become a
/// replica): the executor leaves it for the new master because the
/// Sentinel names another one, though the old one never refuses a write.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_master_replaced_while_still_up_is_left_for_the_new_one() -> anyhow::Result<()> {
    replay_across_a_sentinel_failover(MasterLoss::Replaced).await
}
