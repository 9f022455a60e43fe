//! An example `redrive.v1.StateCheck` hook, as the team owning orders would
//! write it: backed by an `orders` table in PostgreSQL, with the rules of an
//! order workflow. Tests and the demo use it; `redrive-example-orders-hook` runs
//! it as a process.
//!
//! Rules, per message (the order id comes from a JSON pointer into the body,
//! `/order_id` by default):
//! - no such order → replay (the message is what creates or advances it);
//! - `CANCELLED` or `EXPIRED` → block: "would revive a cancelled order";
//! - fulfilled → block: "would fulfil twice";
//! - stock reserved but not fulfilled → needs compensation: "release the extra
//!   reservation first";
//! - anything else → replay;
//! - a body without an order id → block: it cannot be checked.

use std::{
    collections::HashMap,
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use redrive_proto::v1::{
    StateCheckRequest, StateCheckResponse, StateCheckVerdict, StateDecision,
    state_check_server::{StateCheck, StateCheckServer},
};
use sqlx::{PgPool, Row};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

/// The example hook.
#[derive(Debug, Clone)]
pub struct OrdersHook {
    pool: PgPool,
    order_id_pointer: String,
    /// Extra latency per call, to test hook timeouts.
    delay: Duration,
    /// Calls being answered now, and the most at once so far (shared by
    /// the clones the server makes).
    in_flight: Arc<AtomicUsize>,
    peak_in_flight: Arc<AtomicUsize>,
}

/// Counts a call in flight until dropped.
struct InFlight(Arc<AtomicUsize>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The `orders` table the hook reads.
pub const ORDERS_SCHEMA: &str = "CREATE TABLE IF NOT EXISTS orders (
    order_id       TEXT PRIMARY KEY,
    status         TEXT NOT NULL,
    stock_reserved BOOLEAN NOT NULL DEFAULT false,
    fulfilled      BOOLEAN NOT NULL DEFAULT false,
    updated_at     TIMESTAMPTZ NOT NULL DEFAULT now()
)";

impl OrdersHook {
    /// A hook over `pool`, reading order ids at `/order_id`.
    pub fn new(pool: PgPool) -> Self {
        Self {
            pool,
            order_id_pointer: "/order_id".to_owned(),
            delay: Duration::ZERO,
            in_flight: Arc::default(),
            peak_in_flight: Arc::default(),
        }
    }

    /// The most calls this hook (and its clones) answered at once.
    pub fn peak_in_flight(&self) -> usize {
        self.peak_in_flight.load(Ordering::SeqCst)
    }

    /// The same hook answering `delay` late.
    pub fn with_delay(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }

    /// Creates the `orders` table if missing.
    ///
    /// # Errors
    /// PostgreSQL errors.
    pub async fn create_schema(pool: &PgPool) -> sqlx::Result<()> {
        sqlx::query(ORDERS_SCHEMA).execute(pool).await?;
        Ok(())
    }

    fn order_id(&self, body: &[u8]) -> Option<String> {
        let json: serde_json::Value = serde_json::from_slice(body).ok()?;
        match json.pointer(&self.order_id_pointer)? {
            serde_json::Value::String(id) => Some(id.clone()),
            serde_json::Value::Number(id) => Some(id.to_string()),
            _ => None,
        }
    }
}

/// One order's state.
struct Order {
    status: String,
    stock_reserved: bool,
    fulfilled: bool,
}

fn decide(order: Option<&Order>) -> (StateCheckVerdict, String) {
    match order {
        None => (StateCheckVerdict::Replay, String::new()),
        Some(order) if order.status == "CANCELLED" || order.status == "EXPIRED" => (
            StateCheckVerdict::Block,
            format!("order is {}: would revive a cancelled order", order.status),
        ),
        Some(order) if order.fulfilled => (
            StateCheckVerdict::Block,
            "order already fulfilled: would fulfil twice".to_owned(),
        ),
        Some(order) if order.stock_reserved => (
            StateCheckVerdict::NeedsCompensation,
            "stock reserved but not fulfilled: release the extra reservation first".to_owned(),
        ),
        Some(_) => (StateCheckVerdict::Replay, String::new()),
    }
}

#[tonic::async_trait]
impl StateCheck for OrdersHook {
    async fn check(
        &self,
        request: Request<StateCheckRequest>,
    ) -> Result<Response<StateCheckResponse>, Status> {
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.peak_in_flight.fetch_max(now, Ordering::SeqCst);
        let _in_flight = InFlight(Arc::clone(&self.in_flight));
        if !self.delay.is_zero() {
            tokio::time::sleep(self.delay).await;
        }
        let messages = request.into_inner().messages;
        let order_ids: Vec<Option<String>> =
            messages.iter().map(|m| self.order_id(&m.body)).collect();
        let wanted: Vec<String> = order_ids.iter().flatten().cloned().collect();
        let rows = sqlx::query("SELECT order_id, status, stock_reserved, fulfilled FROM orders WHERE order_id = ANY($1)")
            .bind(&wanted)
            .fetch_all(&self.pool)
            .await
            .map_err(|error| Status::unavailable(format!("orders database: {error}")))?;
        let mut orders = HashMap::with_capacity(rows.len());
        for row in rows {
            let order = Order {
                status: row
                    .try_get("status")
                    .map_err(|e| Status::internal(e.to_string()))?,
                stock_reserved: row
                    .try_get("stock_reserved")
                    .map_err(|e| Status::internal(e.to_string()))?,
                fulfilled: row
                    .try_get("fulfilled")
                    .map_err(|e| Status::internal(e.to_string()))?,
            };
            orders.insert(
                row.try_get::<String, _>("order_id")
                    .map_err(|e| Status::internal(e.to_string()))?,
                order,
            );
        }
        let decisions = messages
            .iter()
            .zip(order_ids)
            .map(|(message, order_id)| {
                let (verdict, reason) = match order_id {
                    None => (
                        StateCheckVerdict::Block,
                        "no order id in the body: cannot check the order".to_owned(),
                    ),
                    Some(order_id) => decide(orders.get(&order_id)),
                };
                StateDecision {
                    dead_letter_id: message.dead_letter_id.clone(),
                    verdict: verdict.into(),
                    reason,
                }
            })
            .collect();
        Ok(Response::new(StateCheckResponse { decisions }))
    }
}

/// Serves `hook` on `listener` until `shutdown`.
///
/// # Errors
/// Server errors.
pub async fn serve(
    hook: OrdersHook,
    listener: TcpListener,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    serve_with(hook, listener, None, shutdown).await
}

/// [`serve`], over TLS when `tls` is given.
///
/// # Errors
/// Server errors, or `tls` refused.
pub async fn serve_with(
    hook: OrdersHook,
    listener: TcpListener,
    tls: Option<tonic::transport::ServerTlsConfig>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let mut builder = tonic::transport::Server::builder();
    if let Some(tls) = tls {
        builder = builder.tls_config(tls)?;
    }
    builder
        .add_service(StateCheckServer::new(hook))
        .serve_with_incoming_shutdown(
            tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true)),
            shutdown.cancelled_owned(),
        )
        .await?;
    Ok(())
}

/// Starts `hook` on `127.0.0.1:0` over TLS with `tls` in the background
/// (as a hook on a shared network runs); returns its `https://` URL.
///
/// # Errors
/// When binding fails or `tls` is refused.
pub async fn spawn_tls(
    hook: OrdersHook,
    tls: tonic::transport::ServerTlsConfig,
    shutdown: CancellationToken,
) -> anyhow::Result<String> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr: SocketAddr = listener.local_addr()?;
    tokio::spawn(serve_with(hook, listener, Some(tls), shutdown));
    Ok(format!("https://{addr}"))
}

/// Starts `hook` on `127.0.0.1:0` in the background; returns its URL.
///
/// # Errors
/// When binding fails.
pub async fn spawn(hook: OrdersHook, shutdown: CancellationToken) -> anyhow::Result<String> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr: SocketAddr = listener.local_addr()?;
    tokio::spawn(serve(hook, listener, shutdown));
    Ok(format!("http://{addr}"))
}
