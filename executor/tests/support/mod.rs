//! Helpers for the executor's tests against the local Redis and RabbitMQ
//! (SERVICES.md): unique names, a TCP proxy a test can cut, and a broker
//! handle that cleans up what it declared.

#![allow(dead_code)]

use std::{
    net::SocketAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use lapin::{
    Channel, Connection, ConnectionProperties, ExchangeKind,
    options::{
        BasicGetOptions, ExchangeDeclareOptions, ExchangeDeleteOptions, QueueBindOptions,
        QueueDeclareOptions, QueueDeleteOptions,
    },
    types::FieldTable,
};
use redis::aio::ConnectionManager;
use tokio::{net::TcpListener, task::JoinHandle};

/// The local Redis.
pub const REDIS_ADDR: &str = "127.0.0.1:6379";
/// The local RabbitMQ.
pub const AMQP_ADDR: &str = "127.0.0.1:5672";
/// See [`AMQP_ADDR`].
pub const AMQP_URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

/// `redis://` URL of `addr`.
pub fn redis_url(addr: SocketAddr) -> String {
    format!("redis://{addr}/")
}

/// `amqp://` URL of `addr` with the default credentials and vhost.
pub fn amqp_url(addr: SocketAddr) -> String {
    format!("amqp://guest:guest@{addr}/%2f")
}

/// `{prefix}-{12 hex}`: a name no other test run uses.
pub fn unique(prefix: &str) -> String {
    format!(
        "{prefix}-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    )
}

/// A connection to the local Redis (for setup and assertions).
pub async fn redis() -> ConnectionManager {
    redrive_executor::bucket::connect_redis(
        &redis_url(REDIS_ADDR.parse().expect("address")),
        Duration::from_secs(5),
    )
    .await
    .expect("the local redis answers")
}

/// Deletes every key starting with `prefix`.
pub async fn delete_prefix(connection: &mut ConnectionManager, prefix: &str) {
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}*"))
        .query_async(connection)
        .await
        .expect("KEYS");
    if !keys.is_empty() {
        let _: i64 = redis::cmd("DEL")
            .arg(&keys)
            .query_async(connection)
            .await
            .expect("DEL");
    }
}

/// A TCP proxy on `127.0.0.1:0` forwarding to `target`, which a test can cut
/// (close every open connection and refuse new ones) and restore.
pub struct TcpProxy {
    addr: SocketAddr,
    cut: Arc<AtomicBool>,
    generation: tokio::sync::watch::Sender<u64>,
    task: JoinHandle<()>,
}

impl TcpProxy {
    /// Starts forwarding to `target`.
    pub async fn start(target: &str) -> Self {
        let target: SocketAddr = target.parse().expect("target address");
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("local address");
        let cut = Arc::new(AtomicBool::new(false));
        let (generation, _) = tokio::sync::watch::channel(0_u64);
        let accept_cut = Arc::clone(&cut);
        let accept_generation = generation.clone();
        let task = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                if accept_cut.load(Ordering::SeqCst) {
                    drop(inbound);
                    continue;
                }
                let mut killed = accept_generation.subscribe();
                tokio::spawn(async move {
                    let Ok(mut outbound) = tokio::net::TcpStream::connect(target).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = killed.changed() => {}
                    }
                });
            }
        });
        Self {
            addr,
            cut,
            generation,
            task,
        }
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Closes every open connection and refuses new ones until
    /// [`TcpProxy::restore`].
    pub fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        self.generation.send_modify(|generation| *generation += 1);
    }

    /// Accepts connections again.
    pub fn restore(&self) {
        self.cut.store(false, Ordering::SeqCst);
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A plain channel on the local RabbitMQ for setup and assertions; deletes
/// the queues and exchanges it declared on [`Broker::cleanup`], or when
/// dropped without it (a failed test).
pub struct Broker {
    /// The connection.
    pub connection: Connection,
    /// A channel (not in confirm mode).
    pub channel: Channel,
    queues: Mutex<Vec<String>>,
    exchanges: Mutex<Vec<String>>,
}

impl Broker {
    /// Connects to the local RabbitMQ.
    pub async fn connect() -> Self {
        let connection = Connection::connect(AMQP_URL, ConnectionProperties::default())
            .await
            .expect("the local rabbitmq answers");
        let channel = connection.create_channel().await.expect("channel");
        Self {
            connection,
            channel,
            queues: Mutex::new(Vec::new()),
            exchanges: Mutex::new(Vec::new()),
        }
    }

    /// Declares a durable queue.
    pub async fn queue(&self, name: &str) {
        self.channel
            .queue_declare(
                name.into(),
                QueueDeclareOptions {
                    durable: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await
            .expect("queue.declare");
        self.queues.lock().unwrap().push(name.to_owned());
    }

    /// Declares a durable direct exchange.
    pub async fn direct_exchange(&self, name: &str) {
        self.channel
            .exchange_declare(
                name.into(),
                ExchangeKind::Direct,
                ExchangeDeclareOptions {
                    durable: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await
            .expect("exchange.declare");
        self.exchanges.lock().unwrap().push(name.to_owned());
    }

    /// Binds `queue` to `exchange` with `routing_key`.
    pub async fn bind(&self, queue: &str, exchange: &str, routing_key: &str) {
        self.channel
            .queue_bind(
                queue.into(),
                exchange.into(),
                routing_key.into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .expect("queue.bind");
    }

    /// Messages ready in `queue`.
    pub async fn message_count(&self, queue: &str) -> u32 {
        self.channel
            .queue_declare(
                queue.into(),
                QueueDeclareOptions {
                    passive: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await
            .expect("passive queue.declare")
            .message_count()
    }

    /// The bodies in `queue`, in queue order, taking them out.
    pub async fn drain(&self, queue: &str) -> Vec<Vec<u8>> {
        let mut bodies = Vec::new();
        while let Some(message) = self
            .channel
            .basic_get(queue.into(), BasicGetOptions { no_ack: true })
            .await
            .expect("basic.get")
        {
            bodies.push(message.delivery.data.clone());
        }
        bodies
    }

    /// Deletes what this broker declared.
    pub async fn cleanup(&self) {
        let queues = std::mem::take(&mut *self.queues.lock().unwrap());
        let exchanges = std::mem::take(&mut *self.exchanges.lock().unwrap());
        delete_topology(&self.channel, queues, exchanges).await;
    }
}

/// Dropped without [`Broker::cleanup`] (a test that failed early), it
/// deletes what it declared over a connection of its own, on a thread and
/// runtime of its own (`Drop` cannot await, and may run inside a runtime).
impl Drop for Broker {
    fn drop(&mut self) {
        let queues = std::mem::take(&mut *self.queues.lock().unwrap());
        let exchanges = std::mem::take(&mut *self.exchanges.lock().unwrap());
        if queues.is_empty() && exchanges.is_empty() {
            return;
        }
        let _ = std::thread::spawn(move || {
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            runtime.block_on(async move {
                let Ok(connection) =
                    Connection::connect(AMQP_URL, ConnectionProperties::default()).await
                else {
                    return;
                };
                if let Ok(channel) = connection.create_channel().await {
                    delete_topology(&channel, queues, exchanges).await;
                }
                let _ = connection.close(200, "test cleanup".into()).await;
            });
        })
        .join();
    }
}

/// Deletes `queues` and `exchanges`, ignoring errors (already gone).
async fn delete_topology(channel: &Channel, queues: Vec<String>, exchanges: Vec<String>) {
    for queue in queues {
        let _ = channel
            .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
            .await;
    }
    for exchange in exchanges {
        let _ = channel
            .exchange_delete(exchange.as_str().into(), ExchangeDeleteOptions::default())
            .await;
    }
}
