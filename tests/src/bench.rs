//! What the benchmarks share: dead letters generated in SQL, the broker's
//! raw publish-confirm limit, and the cost of a run (CPU seconds per process
//! from `/proc`, PostgreSQL rows and WAL written).

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use futures::{StreamExt, stream::FuturesUnordered};
use lapin::{
    BasicProperties, Connection, ConnectionProperties,
    options::{
        BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
        ConfirmSelectOptions, QueuePurgeOptions,
    },
    types::{AMQPValue, FieldTable, LongString, ShortString},
};
use prost::Message as _;
use redrive_proto::v1::{self, HeaderTable, HeaderValue, MessageProperties, header_value::Value};

use crate::{AMQP_URL, Broker, ExecutorProcess, REDIS_URL, TestBed, precheck, unique, wait_until};

/// Unconfirmed publishes at most, raw and per executor slice (the
/// executor's default `--window`).
pub const IN_FLIGHT: usize = 256;

/// Capture's default prefetch (`--capture-prefetch`).
pub const CAPTURE_PREFETCH: u16 = 4000;

/// A DLQ holding `messages` dead letters the broker made (TTL 0 on a work
/// queue with a dead-letter exchange), with the capture
/// benchmark's shape: `{"order_id":"o-<n>",...}` 1 KiB JSON bodies, message ids
/// `m-<n>`, three headers; the DLQ's name.
///
/// # Errors
/// Broker errors, or the DLQ not full within 300 s + 1 s per 1,000.
pub async fn dead_letter_backlog(broker: &Broker, messages: u32) -> anyhow::Result<String> {
    let (work, dlq) = (unique("bench_work"), unique("bench_dlq"));
    broker.queue(&dlq, FieldTable::default()).await?;
    let mut arguments = FieldTable::default();
    arguments.insert(ShortString::from("x-message-ttl"), AMQPValue::LongInt(0));
    arguments.insert(
        ShortString::from("x-dead-letter-exchange"),
        AMQPValue::LongString(LongString::from("")),
    );
    arguments.insert(
        ShortString::from("x-dead-letter-routing-key"),
        AMQPValue::LongString(LongString::from(dlq.as_str())),
    );
    broker.queue(&work, arguments).await?;

    println!("making a backlog of {messages} dead letters (1 KiB bodies) in {dlq}");
    let started = Instant::now();
    let body_padding = "x".repeat(1000);
    let mut confirms = FuturesUnordered::new();
    for index in 0..messages {
        let body = format!(
            r#"{{"order_id":"o-{index}","pad":"{}"}}"#,
            &body_padding[..1000 - 30]
        );
        let mut headers = FieldTable::default();
        headers.insert(
            ShortString::from("tenant"),
            AMQPValue::LongString(LongString::from("acme")),
        );
        headers.insert(
            ShortString::from("schema-version"),
            AMQPValue::LongString(LongString::from("3")),
        );
        headers.insert(ShortString::from("attempt"), AMQPValue::LongInt(1));
        let properties = BasicProperties::default()
            .with_message_id(format!("m-{index}").into())
            .with_type("order.created".into())
            .with_content_type("application/json".into())
            .with_delivery_mode(2)
            .with_headers(headers);
        let confirm = broker
            .channel
            .basic_publish(
                "".into(),
                work.as_str().into(),
                BasicPublishOptions::default(),
                body.as_bytes(),
                properties,
            )
            .await?;
        confirms.push(confirm);
        while confirms.len() >= 1024 {
            confirms.next().await.transpose()?;
        }
    }
    while confirms.next().await.transpose()?.is_some() {}
    wait_until(
        "the DLQ holds the backlog",
        Duration::from_secs(300 + u64::from(messages) / 1000),
        || async { Ok(broker.ready_count(&dlq).await? >= messages) },
    )
    .await?;
    println!("backlog ready in {:.1} s", started.elapsed().as_secs_f64());
    Ok(dlq)
}

/// The broker's raw limit on this machine now: `messages` consumed by a bare
/// lapin consumer with capture's default prefetch, one `basic.ack(multiple)`
/// per 1000, nothing stored. Seconds and dead letters per second.
///
/// # Errors
/// Broker errors, or the consumer ending early.
pub async fn raw_consume(broker: &Broker, dlq: &str, messages: u32) -> anyhow::Result<(f64, f64)> {
    let channel = broker.connection.create_channel().await?;
    channel
        .basic_qos(CAPTURE_PREFETCH, BasicQosOptions::default())
        .await?;
    let started = Instant::now();
    let mut consumer = channel
        .basic_consume(
            dlq.into(),
            "raw-bench".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let mut seen = 0u32;
    while seen < messages {
        let delivery = consumer
            .next()
            .await
            .ok_or_else(|| anyhow::anyhow!("the raw consumer ended"))??;
        seen += 1;
        if seen.is_multiple_of(1000) || seen == messages {
            delivery
                .acker
                .ack(BasicAckOptions { multiple: true })
                .await?;
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    let rate = f64::from(messages) / seconds;
    channel.close(200, "done".into()).await?;
    Ok((seconds, rate))
}

/// The properties and headers (protobuf-encoded, as capture stores them) of
/// a persistent JSON message the broker dead-lettered once from `queue`
/// after it came through `exchange` with `routing_key`: `x-death` with one
/// entry, and the `x-first-death-*` and `x-last-death-*` headers
/// (https://www.rabbitmq.com/docs/dlx#effects).
pub fn dead_lettered_properties_and_headers(
    queue: &str,
    exchange: &str,
    routing_key: &str,
    reason: &str,
) -> (Vec<u8>, Vec<u8>) {
    let properties = MessageProperties {
        content_type: Some("application/json".into()),
        delivery_mode: Some(2),
        r#type: Some("order.paid".into()),
        app_id: Some("checkout".into()),
        timestamp: Some(1_764_892_800),
        ..Default::default()
    }
    .encode_to_vec();
    let text = |value: &str| HeaderValue {
        value: Some(Value::LongString(value.as_bytes().to_vec())),
    };
    let table = |fields: Vec<(&str, HeaderValue)>| HeaderTable {
        fields: fields
            .into_iter()
            .map(|(name, value)| (name.to_owned(), value))
            .collect(),
    };
    let death = HeaderValue {
        value: Some(Value::Table(table(vec![
            (
                "count",
                HeaderValue {
                    value: Some(Value::LongLongInt(1)),
                },
            ),
            ("exchange", text(exchange)),
            ("queue", text(queue)),
            ("reason", text(reason)),
            (
                "routing-keys",
                HeaderValue {
                    value: Some(Value::Array(v1::HeaderArray {
                        values: vec![text(routing_key)],
                    })),
                },
            ),
            (
                "time",
                HeaderValue {
                    value: Some(Value::Timestamp(1_764_892_800)),
                },
            ),
        ]))),
    };
    let headers = table(vec![
        (
            "x-death",
            HeaderValue {
                value: Some(Value::Array(v1::HeaderArray {
                    values: vec![death],
                })),
            },
        ),
        ("x-first-death-exchange", text(exchange)),
        ("x-first-death-queue", text(queue)),
        ("x-first-death-reason", text(reason)),
        ("x-last-death-exchange", text(exchange)),
        ("x-last-death-queue", text(queue)),
        ("x-last-death-reason", text(reason)),
    ])
    .encode_to_vec();
    (properties, headers)
}

/// Waits until capture has stored `count` dead letters of `dlq` into the
/// database of `pool`: first until the DLQ has none ready (cheap to ask the
/// broker), then until `dead_letters` holds `count` rows (a scan, so asked
/// only for the last prefetch being stored): the waiting itself must not
/// load the PostgreSQL it measures.
///
/// # Errors
/// Broker or PostgreSQL errors, or not done within `timeout`.
pub async fn wait_captured(
    broker: &Broker,
    pool: &sqlx::PgPool,
    dlq: &str,
    count: i64,
    timeout: Duration,
) -> anyhow::Result<()> {
    wait_until("capture to drain the DLQ", timeout, || async {
        Ok(broker.ready_count(dlq).await? == 0)
    })
    .await?;
    wait_until("every dead letter stored", timeout, || async {
        let stored: i64 = sqlx::query_scalar("SELECT count(*) FROM dead_letters")
            .fetch_one(pool)
            .await?;
        Ok(stored >= count)
    })
    .await
}

/// Inserts `count` dead letters of source `source` with the shape capture
/// stores: a 1 KiB JSON body (`order_id` `<source>-o-<n>`, also the message
/// key), persistent, three headers, died in the queue `queues[n % len]`.
///
/// # Errors
/// PostgreSQL errors.
pub async fn generate_dead_letters(
    pool: &sqlx::PgPool,
    source: &str,
    count: i64,
    queues: &[&str],
) -> anyhow::Result<()> {
    anyhow::ensure!(!queues.is_empty(), "at least one queue");
    let properties = MessageProperties {
        content_type: Some("application/json".into()),
        delivery_mode: Some(2),
        app_id: Some("checkout".into()),
        ..Default::default()
    }
    .encode_to_vec();
    let text = |value: &str| HeaderValue {
        value: Some(Value::LongString(value.as_bytes().to_vec())),
    };
    let headers = HeaderTable {
        fields: [
            ("tenant".to_owned(), text("acme")),
            ("schema-version".to_owned(), text("3")),
            (
                "attempt".to_owned(),
                HeaderValue {
                    value: Some(Value::LongInt(1)),
                },
            ),
        ]
        .into(),
    }
    .encode_to_vec();
    let queues: Vec<String> = queues.iter().map(|queue| (*queue).to_owned()).collect();
    sqlx::query(crate::insert_dead_letters!(
        r#"
        SELECT $1, 'rabbitmq', now(), sha256(convert_to($1 || g, 'UTF8')), $1 || '-m-' || g, $1 || '-o-' || g,
            b.body, length(b.body), sha256(b.body), false, 'none', $3, $4, 'application/json', 'rejected',
            d.queue, '', ARRAY[d.queue], 1, now(), 'rejected', d.queue, 'order.paid', '3', 'checkout', now(), now(), '{}'
        FROM generate_series(1, $2) g,
        LATERAL (SELECT convert_to('{"order_id":"' || $1 || '-o-' || g || '","pad":"' || repeat('x', 960) || '"}', 'UTF8') AS body) b,
        LATERAL (SELECT $5::text[] AS queues) q,
        LATERAL (SELECT q.queues[1 + (g % cardinality(q.queues))] AS queue) d
        "#
    ),
    )
    .bind(source)
    .bind(count)
    .bind(&properties)
    .bind(&headers)
    .bind(&queues)
    .execute(pool)
    .await?;
    Ok(())
}

/// A precheck of every dead letter of `source` and a plan of it at a rate far
/// above the machine (1,000,000/s, burst 1,000), slices of 1,000, observing
/// the canary for `observe_seconds`; the plan and the digest to approve it
/// with.
///
/// # Errors
/// What the planner answered.
pub async fn unthrottled_plan(
    client: &mut redrive_proto::v1::planner_client::PlannerClient<tonic::transport::Channel>,
    source: &str,
    observe_seconds: i64,
) -> anyhow::Result<(redrive_proto::v1::Plan, String)> {
    let report = precheck(client, source).await?;
    let plan = client
        .create_plan(v1::CreatePlanRequest {
            precheck_id: report.precheck_id.clone(),
            rate: Some(v1::Rate {
                per_second: 1_000_000.0,
                burst: 1000,
                rationale: "benchmark: far above the machine".into(),
            }),
            slice_size: 1000,
            observe_for: Some(prost_types::Duration {
                seconds: observe_seconds,
                nanos: 0,
            }),
            ..Default::default()
        })
        .await?
        .into_inner();
    Ok((plan, report.digest))
}

/// `INSERT INTO dead_letters (…) <select>`: every column capture writes,
/// filled by `select` (a string literal, a `SELECT` of as many values in
/// that order), for the benchmarks' dead letters generated in SQL.
#[macro_export]
macro_rules! insert_dead_letters {
    ($select:literal) => {
        concat!(
            "INSERT INTO dead_letters (source, origin, captured_at, capture_fingerprint, \
             message_id, message_key, body, body_size, body_sha256, body_oversized, \
             body_compression, properties, headers, content_type, death_reason, death_queue, \
             death_exchange, death_routing_keys, death_count, death_time, reason_class, \
             destination, event_type, schema_version, producer, died_at, first_died_at, \
             capture_notes) ",
            $select
        )
    };
}

/// The broker's own limit: `count` persistent 1 KiB messages published with
/// publisher confirms, at most `in_flight` unconfirmed, on one channel of
/// one connection per queue, to every queue of `queues` at once
/// (`count / queues.len()` each). Returns messages per second over all.
///
/// # Errors
/// Broker errors, or a confirm that is not an ack.
pub async fn raw_publish_rate(
    queues: &[String],
    count: usize,
    in_flight: usize,
) -> anyhow::Result<f64> {
    let each = count / queues.len().max(1);
    let mut connections = Vec::new();
    for _ in queues {
        let connection = Connection::connect(AMQP_URL, ConnectionProperties::default()).await?;
        let channel = connection.create_channel().await?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        connections.push((connection, channel));
    }
    let started = Instant::now();
    let publishers = connections
        .iter()
        .zip(queues)
        .map(|((_, channel), queue)| async move {
            let body = vec![b'x'; 1024];
            let mut pending = std::collections::VecDeque::with_capacity(in_flight);
            for index in 0..each {
                let properties = BasicProperties::default()
                    .with_message_id(format!("raw-{index}").into())
                    .with_content_type("application/json".into())
                    .with_delivery_mode(2);
                pending.push_back(
                    channel
                        .basic_publish(
                            "".into(),
                            queue.as_str().into(),
                            BasicPublishOptions {
                                mandatory: true,
                                ..Default::default()
                            },
                            &body,
                            properties,
                        )
                        .await?,
                );
                if pending.len() >= in_flight
                    && let Some(confirm) = pending.pop_front()
                {
                    anyhow::ensure!(confirm.await?.is_ack(), "a raw publish was nacked");
                }
            }
            for confirm in pending {
                anyhow::ensure!(confirm.await?.is_ack(), "a raw publish was nacked");
            }
            anyhow::Ok(())
        });
    futures::future::try_join_all(publishers).await?;
    let rate = (each * queues.len()) as f64 / started.elapsed().as_secs_f64();
    for (connection, _) in connections {
        connection.close(200, "done".into()).await?;
    }
    Ok(rate)
}

/// CPU time (user + system) used by the processes of each group, in clock
/// ticks, read from `/proc/<pid>/stat`.
///
/// A service's figure also counts its processes' reaped children
/// (`cutime` + `cstime`): PostgreSQL's backends and autovacuum workers that
/// exit between two samples are children of the postmaster, so their CPU
/// shows there once they are gone. Summing only the processes alive at
/// each sample lost it, and worse, subtracted what they had used before
/// the first sample: a run whose setup connections closed during the
/// replay read low.
#[derive(Debug, Clone, Default)]
pub struct CpuSample {
    ticks: BTreeMap<String, u64>,
}

/// Clock ticks per second of `/proc/<pid>/stat` (`USER_HZ`, 100 on Linux).
const TICKS_PER_SECOND: f64 = 100.0;

/// One process's CPU so far, in clock ticks.
struct ProcessTicks {
    /// Its command name.
    comm: String,
    /// Its own user + system time.
    own: u64,
    /// Its reaped children's user + system time.
    children: u64,
}

/// The CPU ticks one process has used so far, `None` when it is gone.
fn process_ticks(pid: u32) -> Option<ProcessTicks> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // "pid (comm) state ppid ...": comm may hold spaces and parentheses.
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let comm = stat[open + 1..close].to_owned();
    let fields: Vec<&str> = stat[close + 2..].split_whitespace().collect();
    // Fields 14-17 of proc(5) (utime, stime, cutime, cstime) are 11-14
    // after comm.
    let field = |index: usize| fields.get(index)?.parse::<u64>().ok();
    Some(ProcessTicks {
        comm,
        own: field(11)? + field(12)?,
        children: field(13)? + field(14)?,
    })
}

/// Every running process of the local services, with its group:
/// `postgresql` (`postgres`), `rabbitmq` (`beam.smp`), `redis`
/// (`redis-server`), by the command name in `/proc/<pid>/stat`.
fn service_processes() -> Vec<(u32, &'static str)> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| {
            let group = match process_ticks(pid)?.comm.as_str() {
                "postgres" => "postgresql",
                "beam.smp" => "rabbitmq",
                "redis-server" => "redis",
                _ => return None,
            };
            Some((pid, group))
        })
        .collect()
}

impl CpuSample {
    /// Samples now: PostgreSQL (every `postgres` process), RabbitMQ
    /// (`beam.smp`), Redis (`redis-server`), this process (`planner`: the
    /// benchmark runs the planner in-process) and each of `executors`
    /// (pids of executor child processes, summed as `executor`).
    pub fn now(executors: &[u32]) -> Self {
        let mut ticks = BTreeMap::new();
        let mut add =
            |group: &str, value: u64| *ticks.entry(group.to_owned()).or_insert(0) += value;
        for (pid, group) in service_processes() {
            if let Some(process) = process_ticks(pid) {
                add(group, process.own + process.children);
            }
        }
        // The planner's own time only: its children are the executors.
        if let Some(process) = process_ticks(std::process::id()) {
            add("planner", process.own);
        }
        for pid in executors {
            if let Some(process) = process_ticks(*pid) {
                add("executor", process.own);
            }
        }
        Self { ticks }
    }

    /// CPU microseconds per message of each group between `earlier` and
    /// this sample, for `messages` messages.
    pub fn micros_per_message(&self, earlier: &Self, messages: u64) -> BTreeMap<String, f64> {
        self.ticks
            .iter()
            .map(|(group, value)| {
                let before = earlier.ticks.get(group).copied().unwrap_or(0);
                let seconds = value.saturating_sub(before) as f64 / TICKS_PER_SECOND;
                (group.clone(), seconds * 1e6 / messages.max(1) as f64)
            })
            .collect()
    }
}

/// The CPUs each group of processes may run on, from `Cpus_allowed_list`
/// in `/proc/<pid>/status` (the groups of [`CpuSample::now`], with this
/// process as `planner`), as `rabbitmq 0, postgresql 1, ...`; a group whose
/// processes differ lists each set.
pub fn affinities() -> String {
    let allowed = |pid: u32| {
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .ok()?
            .lines()
            .find_map(|line| line.strip_prefix("Cpus_allowed_list:"))
            .map(|list| list.trim().to_owned())
    };
    let mut groups: BTreeMap<&str, std::collections::BTreeSet<String>> = BTreeMap::new();
    for (pid, group) in service_processes() {
        if let Some(list) = allowed(pid) {
            groups.entry(group).or_default().insert(list);
        }
    }
    if let Some(list) = allowed(std::process::id()) {
        groups.entry("planner").or_default().insert(list);
    }
    groups
        .iter()
        .map(|(group, lists)| {
            format!(
                "{group} {}",
                lists.iter().cloned().collect::<Vec<_>>().join(" and ")
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Rows written to each table of the current database (inserted, updated,
/// of which HOT, deleted), commits, and the WAL the whole server wrote.
#[derive(Debug, Clone, Default)]
pub struct WriteSample {
    tables: BTreeMap<String, [i64; 4]>,
    commits: i64,
    wal_bytes: f64,
}

impl WriteSample {
    /// Reads `pg_stat_user_tables`, `pg_stat_database` and `pg_stat_wal`.
    /// Backends publish their counts about once a second when idle: sample
    /// after a pause.
    ///
    /// # Errors
    /// PostgreSQL errors.
    pub async fn now(pool: &sqlx::PgPool) -> anyhow::Result<Self> {
        let rows: Vec<(String, i64, i64, i64, i64)> = sqlx::query_as(
            "SELECT relname::text, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del FROM pg_stat_user_tables",
        )
        .fetch_all(pool)
        .await?;
        let commits: i64 = sqlx::query_scalar(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()",
        )
        .fetch_one(pool)
        .await?;
        let wal_bytes: f64 = sqlx::query_scalar("SELECT wal_bytes::float8 FROM pg_stat_wal")
            .fetch_one(pool)
            .await?;
        Ok(Self {
            tables: rows
                .into_iter()
                .map(|(table, inserted, updated, hot, deleted)| {
                    (table, [inserted, updated, hot, deleted])
                })
                .collect(),
            commits,
            wal_bytes,
        })
    }

    /// Per message since `earlier`: a line per table that was written
    /// (`table +ins ~upd (hot) -del`), then rows, commits and WAL bytes.
    pub fn describe(&self, earlier: &Self, messages: u64) -> String {
        let per = |value: f64| value / messages.max(1) as f64;
        let mut rows = 0;
        let mut lines = Vec::new();
        for (table, now) in &self.tables {
            let before = earlier.tables.get(table).copied().unwrap_or_default();
            let delta: Vec<i64> = now.iter().zip(before).map(|(a, b)| a - b).collect();
            let written = delta[0] + delta[1] + delta[3];
            if written == 0 {
                continue;
            }
            rows += written;
            lines.push(format!(
                "    {table}: {:.2} inserted, {:.2} updated ({:.2} HOT), {:.2} deleted",
                per(delta[0] as f64),
                per(delta[1] as f64),
                per(delta[2] as f64),
                per(delta[3] as f64)
            ));
        }
        lines.push(format!(
            "    rows written {:.2}, commits {:.3}, WAL {:.0} bytes per message",
            per(rows as f64),
            per((self.commits - earlier.commits) as f64),
            per(self.wal_bytes - earlier.wal_bytes)
        ));
        lines.join("\n")
    }
}

/// A process's peak resident memory (`VmHWM`) in MiB; 0 when unknown.
pub fn peak_rss_of(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|value| {
            value
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<f64>()
                .ok()
        })
        .map_or(0.0, |kib| kib / 1024.0)
}

/// The canary's observation window of [`measure_replay`]'s plans, seconds:
/// the executors wait it out between the canary and the main wave.
pub const OBSERVE_SECONDS: i64 = 1;

/// What one replay measured ([`measure_replay`]).
#[derive(Debug, Clone)]
pub struct ReplayFigures {
    /// Messages per second of the main wave: its `sent` audit events over
    /// the time from their first to their last publish.
    pub main_rate: f64,
    /// Messages per second from approval to completion (canary and
    /// observation included).
    pub end_to_end_rate: f64,
    /// Messages per second from approval to completion less the canary's
    /// observation window ([`OBSERVE_SECONDS`]): the time the machine
    /// works, whatever window a plan asks for.
    pub end_to_end_less_window_rate: f64,
    /// CPU microseconds per message by process group (`postgresql`,
    /// `rabbitmq`, `redis`, `planner`, `executor`: every executor summed),
    /// from approval to completion ([`CpuSample`]).
    pub cpu: BTreeMap<String, f64>,
    /// The largest peak resident memory of the executors, MiB.
    pub executor_rss: f64,
}

/// Empties `queues`; how many messages they held.
///
/// # Errors
/// Broker errors.
pub async fn purge_queues(bed: &TestBed, queues: &[String]) -> anyhow::Result<u64> {
    let mut total = 0;
    for queue in queues {
        total += u64::from(
            bed.broker()
                .channel
                .queue_purge(queue.as_str().into(), QueuePurgeOptions::default())
                .await?,
        );
    }
    Ok(total)
}

/// When the server runs without autovacuum (this machine's shared
/// PostgreSQL does: `autovacuum = off` in its CI configuration), vacuums
/// and analyzes the benchmark's database as autovacuum would have, so that
/// one replay does not pay for the dead rows of the ones before it (the
/// sealing queue's deleted rows, the items' updated ones): a replay then
/// cost up to 1.6 times the first by its eighth. Not timed; says once that
/// it did.
///
/// # Errors
/// PostgreSQL errors.
pub async fn vacuum_if_no_autovacuum(pool: &sqlx::PgPool) -> anyhow::Result<()> {
    static SAID: std::sync::Once = std::sync::Once::new();
    let autovacuum: String = sqlx::query_scalar("SHOW autovacuum")
        .fetch_one(pool)
        .await?;
    if autovacuum == "on" {
        return Ok(());
    }
    SAID.call_once(|| {
        println!(
            "the server runs with autovacuum off: each replay starts after VACUUM (ANALYZE) of this database (not timed)"
        );
    });
    sqlx::raw_sql("VACUUM (ANALYZE)").execute(pool).await?;
    Ok(())
}

/// Replays every dead letter of `source` ([`unthrottled_plan`], 1 s
/// observation) with `executors` executor processes (the release binary,
/// each also given `executor_args`), from approval to completion, and
/// prints the figures: the main wave's rate, approve → completed, CPU µs
/// per message by process (`/proc`), PostgreSQL rows and WAL written per
/// message, the executors' peak RSS. Checks that every item was sent and
/// that `queues` hold exactly as many messages, then empties them.
///
/// # Errors
/// A plan not completed in 10 minutes, an item not sent, a message lost or
/// duplicated, or any service error.
pub async fn measure_replay(
    bed: &TestBed,
    pool: &sqlx::PgPool,
    source: &str,
    queues: &[String],
    executors: usize,
    executor_args: &[String],
) -> anyhow::Result<ReplayFigures> {
    let mut client = bed.client.clone();
    vacuum_if_no_autovacuum(pool).await?;
    let (plan, digest) = unthrottled_plan(&mut client, source, OBSERVE_SECONDS).await?;
    let mut processes = Vec::new();
    for index in 0..executors {
        let args: Vec<String> = executor_args_for(bed, &format!("bench-{index}"))
            .into_iter()
            .chain(executor_args.iter().cloned())
            .collect();
        processes.push(ExecutorProcess::start_quiet(&args).await?);
    }
    let pids: Vec<u32> = processes.iter().filter_map(ExecutorProcess::id).collect();
    // Let the executors connect and start polling for slices, and the
    // statistics of earlier work settle.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let writes_before = WriteSample::now(pool).await?;
    let cpu_before = CpuSample::now(&pids);
    let started = Instant::now();
    approve(&mut client, &plan.plan_id, digest).await?;
    let total = wait_all_sent(
        &mut client,
        &plan.plan_id,
        started,
        Duration::from_millis(100),
    )
    .await?;
    let seconds = started.elapsed().as_secs_f64();
    let cpu = CpuSample::now(&pids).micros_per_message(&cpu_before, total);
    let rss = pids.iter().map(|pid| peak_rss_of(*pid)).fold(0.0, f64::max);
    for process in &processes {
        process.signal("TERM").await?;
    }
    for mut process in processes {
        process.wait_exit(Duration::from_secs(30)).await?;
    }
    // Backends publish their statistics about once a second when idle.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let writes = WriteSample::now(pool)
        .await?
        .describe(&writes_before, total);
    let (main_items, main_seconds): (i64, f64) = sqlx::query_as(
        "SELECT count(*), coalesce(extract(epoch FROM max(at) - min(at))::float8, 0) \
         FROM audit_events WHERE plan_id = $1::uuid AND wave = 'main' AND action = 'sent'",
    )
    .bind(&plan.plan_id)
    .fetch_one(pool)
    .await?;
    let timeline = replay_timeline(pool, &plan.plan_id).await?;
    let delivered = purge_queues(bed, queues).await?;
    anyhow::ensure!(
        delivered == total,
        "{delivered} messages in the queues, {total} sent: lost or duplicated messages"
    );
    let figures = ReplayFigures {
        main_rate: main_items as f64 / main_seconds.max(1e-3),
        end_to_end_rate: total as f64 / seconds,
        end_to_end_less_window_rate: total as f64 / (seconds - OBSERVE_SECONDS as f64).max(1e-3),
        cpu: cpu.clone(),
        executor_rss: rss,
    };
    println!(
        "  {executors} executor(s), {} queue(s): main wave {:.0} msg/s; approve → completed {total} in {seconds:.2} s, {:.0} msg/s",
        queues.len(),
        figures.main_rate,
        figures.end_to_end_rate
    );
    println!(
        "    CPU µs per message: {}",
        cpu.iter()
            .map(|(group, micros)| format!("{group} {micros:.0}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!("{timeline}");
    println!("{writes}");
    println!("    executor peak RSS {rss:.0} MiB");
    Ok(figures)
}

/// The steps of plan `plan_id`'s replay that are not its main wave, in
/// ms, as one line: approval to the first canary event, the observation
/// window's end to the promotion (the gates' lateness), the promotion to
/// the first main-wave event, and the last event to completion. Events'
/// times come from the executors' clocks, the rest from PostgreSQL's (one
/// host here). "-" for a step the plan did not take. With a ramp, the
/// canary event is its first wave's and the promotion its last window's.
///
/// # Errors
/// PostgreSQL's.
async fn replay_timeline(pool: &sqlx::PgPool, plan_id: &str) -> anyhow::Result<String> {
    let steps: (Option<f64>, Option<f64>, Option<f64>, Option<f64>) = sqlx::query_as(
        "WITH e AS (SELECT min(at) FILTER (WHERE wave = 'canary') AS canary, \
                min(at) FILTER (WHERE wave = 'main') AS main, max(at) AS last \
                FROM audit_events WHERE plan_id = $1::uuid), \
            promoted AS (SELECT min(at) AS at FROM operator_actions \
                WHERE plan_id = $1::uuid AND action = 'promote') \
         SELECT extract(epoch FROM e.canary - p.approved_at)::float8 * 1000, \
            extract(epoch FROM promoted.at - p.observing_until)::float8 * 1000, \
            extract(epoch FROM e.main - promoted.at)::float8 * 1000, \
            extract(epoch FROM p.completed_at - e.last)::float8 * 1000 \
         FROM plans p, e, promoted WHERE p.id = $1::uuid",
    )
    .bind(plan_id)
    .fetch_one(pool)
    .await?;
    let ms = |step: Option<f64>| step.map_or_else(|| "-".to_owned(), |ms| format!("{ms:.0}"));
    Ok(format!(
        "    ms: approve → first canary event {}, window's end → promotion {}, promotion → first main-wave event {}, last event → completed {}",
        ms(steps.0),
        ms(steps.1),
        ms(steps.2),
        ms(steps.3)
    ))
}

/// The arguments of a benchmark's executor process `executor_id` for `bed`:
/// its planner, the local broker and Redis under the bed's prefix, claims
/// polled every second.
pub fn executor_args_for(bed: &TestBed, executor_id: &str) -> Vec<String> {
    [
        "--planner",
        &bed.planner.url(),
        "--amqp-url",
        AMQP_URL,
        "--redis-url",
        REDIS_URL,
        "--redis-prefix",
        &bed.redis.prefix,
        "--executor-id",
        executor_id,
        "--claim-wait-seconds",
        "1",
    ]
    .iter()
    .map(|arg| (*arg).to_owned())
    .collect()
}

/// Approves plan `plan_id` with the `digest` of its precheck.
///
/// # Errors
/// The planner's refusal.
pub async fn approve(
    client: &mut v1::planner_client::PlannerClient<tonic::transport::Channel>,
    plan_id: &str,
    digest: String,
) -> anyhow::Result<()> {
    client
        .approve_plan(v1::ApprovePlanRequest {
            plan_id: plan_id.to_owned(),
            digest,
            ..Default::default()
        })
        .await?;
    Ok(())
}

/// Waits, polling `GetPlan` every `poll`, until plan `plan_id` is completed
/// with every item sent; its item count.
///
/// # Errors
/// A plan completed with items not sent, not completed 10 minutes after
/// `started`, or a planner error.
pub async fn wait_all_sent(
    client: &mut v1::planner_client::PlannerClient<tonic::transport::Channel>,
    plan_id: &str,
    started: Instant,
    poll: Duration,
) -> anyhow::Result<u64> {
    loop {
        let current = client
            .get_plan(v1::GetPlanRequest {
                plan_id: plan_id.to_owned(),
            })
            .await?
            .into_inner();
        if current.state() == v1::PlanState::Completed {
            let counts = current.counts.unwrap_or_default();
            anyhow::ensure!(
                counts.sent == current.total_items,
                "not all sent: {counts:?}"
            );
            return Ok(current.total_items);
        }
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(600),
            "replay did not finish in 10 minutes"
        );
        tokio::time::sleep(poll).await;
    }
}
