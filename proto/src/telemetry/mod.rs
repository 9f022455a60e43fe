//! The services' metrics pipeline: one OpenTelemetry [`SdkMeterProvider`] per
//! running service, read by a Prometheus scrape endpoint (`GET /metrics`,
//! text exposition format 0.0.4) when a listen address is given, and pushed
//! to an OTLP collector over gRPC when an endpoint is given. With neither,
//! every instrument is a no-op.
//!
//! Each `run` of a service builds its own pipeline (never the global
//! provider), so several planners and executors in one test process keep
//! separate counts.
//!
//! Also the rest of a service's telemetry, from start ([`start_service`]) to
//! exit: span export and W3C Trace Context (`traces.rs`: [`tracer_provider`],
//! [`grpc_server_span`], [`traceparent_of`], ...) and log lines (`logs.rs`:
//! [`init_subscriber`], [`secret_cap`], [`WithTraceIds`]).

use std::{net::SocketAddr, sync::Arc, time::Duration};

use http_body_util::Full;
use hyper::{Method, Request, Response, StatusCode, body::Bytes, header::CONTENT_TYPE};
use hyper_util::rt::TokioIo;
use opentelemetry::metrics::{Meter, MeterProvider as _};
use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_sdk::{Resource, metrics::SdkMeterProvider};
use prometheus::{Encoder as _, TextEncoder};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

mod logs;
mod traces;

pub use logs::{
    DropMisleading, MISLEADING_LINES, SECRET_CAPPED_TARGETS, WithTraceIds, init_subscriber,
    line_filter, log_layer, secret_cap,
};
pub use traces::{
    grpc_server_span, inject_traceparent, parse_traceparent, traceparent_of,
    traceparent_of_context, tracer_provider, tracing_enabled, tracing_layer,
};

/// Histogram bucket boundaries in seconds for latencies from half a
/// millisecond to ten seconds (the SDK's default boundaries, 0 to 10,000,
/// suit milliseconds, not seconds).
pub const SECONDS_BOUNDARIES: [f64; 15] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// One attribute set `[key = name]` per value of a proto enum of `N`
/// values, indexed by its wire number (0 to `N - 1`): built once, so that
/// recording a measurement by enum allocates nothing.
#[derive(Debug, Clone)]
pub struct EnumAttributes<const N: usize> {
    sets: [[opentelemetry::KeyValue; 1]; N],
}

impl<const N: usize> EnumAttributes<N> {
    /// The sets of `key`, each value named by `name_of(wire number)`.
    pub fn new(key: &'static str, name_of: impl Fn(i32) -> &'static str) -> Self {
        Self {
            sets: std::array::from_fn(|index| {
                let number = i32::try_from(index).unwrap_or_default();
                [opentelemetry::KeyValue::new(key, name_of(number))]
            }),
        }
    }

    /// The set of the value with wire number `number`; `None` outside
    /// `0..N`.
    pub fn of(&self, number: i32) -> Option<&[opentelemetry::KeyValue]> {
        usize::try_from(number)
            .ok()
            .and_then(|index| self.sets.get(index))
            .map(<[_; 1]>::as_slice)
    }
}

/// How often metrics are pushed to the OTLP collector.
pub const OTLP_EXPORT_INTERVAL: Duration = Duration::from_secs(10);

/// A telemetry pipeline that could not be started.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// The metrics listen address could not be bound.
    #[error("cannot bind the metrics address {address}: {source}")]
    Bind {
        /// The `--metrics-listen` address.
        address: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The OTLP exporter or the Prometheus reader could not be built.
    #[error("cannot build the {what}: {text}")]
    Exporter {
        /// Which exporter.
        what: &'static str,
        /// The SDK's error text.
        text: String,
    },
}

impl TelemetryError {
    /// The setting at fault: `--metrics-listen` for an address that cannot
    /// be bound, `--otlp-endpoint` for an exporter that cannot be built.
    pub fn setting(&self) -> &'static str {
        match self {
            Self::Bind { .. } => "--metrics-listen",
            Self::Exporter { .. } => "--otlp-endpoint",
        }
    }
}

/// What a service's metrics pipeline is told at start.
#[derive(Debug, Clone, Default)]
pub struct MetricsSettings {
    /// Serve `GET /metrics` here (`--metrics-listen`); none: no endpoint.
    pub listen: Option<SocketAddr>,
    /// The OTLP/gRPC collector (`OTEL_EXPORTER_OTLP_ENDPOINT`, e.g.
    /// `http://127.0.0.1:4317`); none: no push.
    pub otlp_endpoint: Option<String>,
}

impl From<&crate::settings::TelemetrySettings> for MetricsSettings {
    fn from(settings: &crate::settings::TelemetrySettings) -> Self {
        Self {
            listen: settings.metrics_listen,
            otlp_endpoint: settings.otlp_endpoint.clone(),
        }
    }
}

/// A running metrics pipeline: its meter provider and the scrape endpoint's
/// address. Dropping it stops the endpoint; [`Metrics::shutdown`] also
/// flushes the OTLP exporter.
pub struct Metrics {
    provider: SdkMeterProvider,
    scrape_address: Option<SocketAddr>,
    serving: Option<tokio::task::JoinHandle<()>>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("Metrics")
            .field("scrape_address", &self.scrape_address)
            .finish_non_exhaustive()
    }
}

/// The resource every signal of `service_name` carries: the SDK's detectors
/// (`OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`), with `service.name`
/// defaulting to `service_name` rather than `unknown_service`.
pub fn resource(service_name: &'static str) -> Resource {
    let named = std::env::var("OTEL_SERVICE_NAME").is_ok_and(|name| !name.trim().is_empty());
    let builder = Resource::builder();
    if named {
        builder.build()
    } else {
        builder.with_service_name(service_name).build()
    }
}

impl Metrics {
    /// Starts the pipeline of `service_name` (its `service.name` unless
    /// `OTEL_SERVICE_NAME` says otherwise). Must run inside the Tokio
    /// runtime (the OTLP exporter's channel and the endpoint live on it);
    /// the endpoint stops when `shutdown` is cancelled.
    ///
    /// # Errors
    /// [`TelemetryError`] when the address cannot be bound or an exporter
    /// cannot be built (a malformed endpoint).
    pub async fn start(
        service_name: &'static str,
        settings: &MetricsSettings,
        shutdown: CancellationToken,
    ) -> Result<Self, TelemetryError> {
        let mut builder = SdkMeterProvider::builder().with_resource(resource(service_name));
        let mut scrape = None;
        if let Some(address) = settings.listen {
            let registry = prometheus::Registry::new();
            let reader = opentelemetry_prometheus::exporter()
                .with_registry(registry.clone())
                .build()
                .map_err(|error| TelemetryError::Exporter {
                    what: "Prometheus reader",
                    text: error.to_string(),
                })?;
            builder = builder.with_reader(reader);
            let listener = TcpListener::bind(address)
                .await
                .map_err(|source| TelemetryError::Bind { address, source })?;
            scrape = Some((listener, registry));
        }
        if let Some(endpoint) = &settings.otlp_endpoint {
            let exporter = opentelemetry_otlp::MetricExporter::builder()
                .with_tonic()
                .with_endpoint(endpoint.clone())
                .build()
                .map_err(|error| TelemetryError::Exporter {
                    what: "OTLP metric exporter",
                    text: error.to_string(),
                })?;
            let reader = opentelemetry_sdk::metrics::PeriodicReader::builder(exporter)
                .with_interval(OTLP_EXPORT_INTERVAL)
                .build();
            builder = builder.with_reader(reader);
        }
        let provider = builder.build();
        let (scrape_address, serving) = match scrape {
            None => (None, None),
            Some((listener, registry)) => {
                let address = listener.local_addr().ok();
                if let Some(address) = address {
                    info!(%address, "metrics endpoint serving /metrics");
                }
                let serving = tokio::spawn(serve_metrics(listener, Arc::new(registry), shutdown));
                (address, Some(serving))
            }
        };
        Ok(Self {
            provider,
            scrape_address,
            serving,
        })
    }

    /// The meter of the instrumentation scope `scope` (the crate name).
    pub fn meter(&self, scope: &'static str) -> Meter {
        self.provider.meter(scope)
    }

    /// Where `/metrics` is served (the bound address, also for port 0).
    pub fn scrape_address(&self) -> Option<SocketAddr> {
        self.scrape_address
    }

    /// Stops the endpoint and flushes and stops the exporters (the OTLP
    /// exporter pushes what it holds once more).
    pub async fn shutdown(mut self) {
        if let Some(serving) = self.serving.take() {
            serving.abort();
        }
        let provider = self.provider.clone();
        // The periodic reader's shutdown blocks until its last export.
        let stopped = tokio::task::spawn_blocking(move || provider.shutdown()).await;
        if let Ok(Err(error)) = stopped {
            warn!(%error, "metrics pipeline did not stop cleanly");
        }
    }
}

impl Drop for Metrics {
    fn drop(&mut self) {
        if let Some(serving) = self.serving.take() {
            serving.abort();
        }
    }
}

/// Serves `GET /metrics` (HTTP/1.1) from `registry` until `shutdown`.
async fn serve_metrics(
    listener: TcpListener,
    registry: Arc<prometheus::Registry>,
    shutdown: CancellationToken,
) {
    loop {
        let accepted = tokio::select! {
            () = shutdown.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(error) => {
                warn!(%error, "metrics endpoint: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let registry = Arc::clone(&registry);
        let connection_shutdown = shutdown.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request| {
                let registry = Arc::clone(&registry);
                async move { Ok::<_, std::convert::Infallible>(answer(&request, &registry)) }
            });
            let connection = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service);
            tokio::select! {
                () = connection_shutdown.cancelled() => {}
                _ = connection => {}
            }
        });
    }
}

fn answer<B>(request: &Request<B>, registry: &prometheus::Registry) -> Response<Full<Bytes>> {
    let status = |code: StatusCode, text: &'static str| {
        let mut response = Response::new(Full::new(Bytes::from_static(text.as_bytes())));
        *response.status_mut() = code;
        response
    };
    if request.uri().path() != "/metrics" {
        return status(
            StatusCode::NOT_FOUND,
            "not found: metrics are at /metrics\n",
        );
    }
    if request.method() != Method::GET && request.method() != Method::HEAD {
        return status(StatusCode::METHOD_NOT_ALLOWED, "GET /metrics\n");
    }
    let encoder = TextEncoder::new();
    let mut body = Vec::new();
    if let Err(error) = encoder.encode(&registry.gather(), &mut body) {
        warn!(%error, "metrics endpoint: encoding failed");
        return status(StatusCode::INTERNAL_SERVER_ERROR, "encoding failed\n");
    }
    let mut response = Response::new(Full::new(Bytes::from(body)));
    if let Ok(value) = encoder.format_type().parse() {
        response.headers_mut().insert(CONTENT_TYPE, value);
    }
    response
}

/// The log filter when `REDRIVE_LOG` is not set: `info`, without lapin's
/// own `lapin::channel` lines. lapin logs every channel or connection the
/// broker closes at ERROR (`Channel closed`, `Connection closed`), also
/// those the service expects and reports itself with its context (a
/// capture queue that does not exist: one WARN per retry naming it); every
/// such close also reaches the service as an error. `REDRIVE_LOG=info`
/// shows them again. The OpenTelemetry SDK's own lines from `warn` up (its
/// INFO ones tell its providers' lifecycle, e.g. `MeterProvider.Drop` at
/// every exit). PostgreSQL's notices from `warn` up: sqlx logs each
/// `NOTICE` at INFO (a migration's `DROP INDEX IF EXISTS` on a new
/// database: `index "…" does not exist, skipping`). lapin's `io_loop` and
/// `heartbeat` lines are left out too: at every broker outage they say at
/// ERROR, once a connection, what the services then say themselves with
/// the broker's address (`Socket was readable but we read 0`, `error
/// doing IO`, `We haven't received anything from the server for too
/// long`).
pub const DEFAULT_LOG_FILTER: &str = "info,lapin::channel=off,lapin::io_loop=off,lapin::heartbeat=off,opentelemetry_sdk=warn,sqlx::postgres::notice=warn";

/// A service binary's logging and span export, from start to exit: the
/// subscriber of [`init_subscriber`] filtered by `REDRIVE_LOG` (default
/// [`DEFAULT_LOG_FILTER`]), and the tracer provider to flush at exit.
#[derive(Debug)]
pub struct Logging {
    tracer: Option<opentelemetry_sdk::trace::SdkTracerProvider>,
}

impl Logging {
    /// Installs the subscriber of `program` (its `service.name`): JSON lines
    /// with `json`, spans exported to `otlp_endpoint` when given. Must run
    /// inside the Tokio runtime.
    ///
    /// # Errors
    /// [`EX_USAGE`](crate::settings::EX_USAGE), after printing
    /// `program: invalid setting --otlp-endpoint: ...`, for an endpoint the
    /// exporter refuses.
    pub fn start(
        program: &'static str,
        json: bool,
        otlp_endpoint: Option<&str>,
    ) -> Result<Self, std::process::ExitCode> {
        let filter = tracing_subscriber::EnvFilter::try_from_env("REDRIVE_LOG")
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(DEFAULT_LOG_FILTER));
        match init_subscriber(program, filter, json, otlp_endpoint) {
            Ok(tracer) => Ok(Self { tracer }),
            Err(error) => {
                eprintln!("{program}: invalid setting --otlp-endpoint: {error}");
                Err(std::process::ExitCode::from(crate::settings::EX_USAGE))
            }
        }
    }

    /// Flushes and stops span export (the batch processor's last export
    /// blocks, so it runs off the runtime).
    pub async fn finish(self) {
        if let Some(tracer) = self.tracer {
            let _ = tokio::task::spawn_blocking(move || tracer.shutdown()).await;
        }
    }
}

/// What a service does first: parses its settings
/// ([`parse_service`](crate::settings::parse_service)), starts its logging
/// ([`Logging::start`]) and wires SIGINT and SIGTERM to the cancellation
/// token it answers ([`cancel_on_signal`]). Must run inside the Tokio
/// runtime.
///
/// # Errors
/// The exit code to end with, after printing.
pub fn start_service<C: crate::settings::ServiceSettings>(
    program: &'static str,
    args: impl IntoIterator<Item = std::ffi::OsString>,
) -> Result<(C, Logging, CancellationToken), std::process::ExitCode> {
    let config = crate::settings::parse_service::<C>(program, args)?;
    let telemetry = config.telemetry();
    let logging = Logging::start(
        program,
        telemetry.log_json,
        telemetry.otlp_endpoint.as_deref(),
    )?;
    let shutdown = CancellationToken::new();
    tokio::spawn(cancel_on_signal(shutdown.clone()));
    Ok((config, logging, shutdown))
}

/// Cancels `shutdown` at the first SIGINT or SIGTERM.
///
/// # Panics
/// When the SIGTERM handler cannot be installed (at start, once).
pub async fn cancel_on_signal(shutdown: CancellationToken) {
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("installing the SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate.recv() => {}
    }
    info!("shutdown requested");
    shutdown.cancel();
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use tracing_subscriber::layer::SubscriberExt as _;

    use super::*;

    /// Log lines written to memory.
    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Lines {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().expect("lines").extend_from_slice(bytes);
            Ok(bytes.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'writer> tracing_subscriber::fmt::MakeWriter<'writer> for Lines {
        type Writer = Self;

        fn make_writer(&'writer self) -> Self {
            self.clone()
        }
    }

    /// Logs one line inside an exported span and one outside any span;
    /// returns the two lines and the span's traceparent.
    fn log_in_and_out_of_a_span(json: bool) -> (String, String, String) {
        let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder().build();
        let lines = Lines::default();
        let subscriber = tracing_subscriber::registry()
            .with(tracing_layer(&provider, "redrive-tests"))
            .with(log_layer(json, lines.clone()));
        let traceparent = tracing::subscriber::with_default(subscriber, || {
            tracing::info!(plan = "p-1", "outside");
            let span = tracing::info_span!("replay.publish");
            let _entered = span.enter();
            tracing::info!(plan = "p-1", "inside");
            traceparent_of(&span).expect("an exported span")
        });
        let text = String::from_utf8(lines.0.lock().expect("lines").clone()).expect("utf-8");
        let mut each = text.lines().map(str::to_owned);
        let outside = each.next().expect("the line outside");
        let inside = each.next().expect("the line inside");
        (outside, inside, traceparent)
    }

    /// A new user's pass: a wrong broker password printed lapin's
    /// `aborting recovery` ERROR once a slice loop a second, a recovery
    /// Redrive never asked lapin for. That line is dropped at every level;
    /// lapin's other lines stay, and its frames stay capped (secrets).
    #[test]
    fn lapins_misleading_line_is_dropped_and_the_rest_kept() {
        use tracing_subscriber::Layer as _;
        let lines = Lines::default();
        let subscriber = tracing_subscriber::registry().with(
            log_layer(false, lines.clone())
                .with_filter(line_filter(tracing_subscriber::EnvFilter::new("trace"))),
        );
        tracing::subscriber::with_default(subscriber, || {
            tracing::error!(
                target: "lapin::io_loop",
                "Exponential backoff attempts exhausted, aborting recovery"
            );
            tracing::error!(target: "lapin::io_loop", error = "reset", "error doing IO");
            tracing::trace!(target: "lapin::frames", "StartOk with a password");
            tracing::error!(target: "redrive_executor", "aborting recovery");
        });
        let text = String::from_utf8(lines.0.lock().expect("lines").clone()).expect("utf-8");
        assert!(!text.contains("attempts exhausted"), "{text}");
        assert!(!text.contains("StartOk"), "{text}");
        assert!(text.contains("error doing IO"), "{text}");
        assert!(
            text.contains("redrive_executor: aborting recovery"),
            "{text}"
        );
        assert_eq!(text.lines().count(), 2, "{text}");
        // The filter keeps the level of `REDRIVE_LOG`: `info` stays `info`
        // (a review: without a hint of its own, the combined filter's
        // level was TRACE, and every debug callsite reached the dispatcher).
        let hint =
            tracing_subscriber::layer::Filter::<tracing_subscriber::Registry>::max_level_hint(
                &line_filter::<tracing_subscriber::Registry>(tracing_subscriber::EnvFilter::new(
                    "info",
                )),
            );
        assert_eq!(hint, Some(tracing::level_filters::LevelFilter::INFO));
    }

    #[test]
    fn json_log_lines_inside_a_span_carry_its_trace_and_span_ids() {
        let (outside, inside, traceparent) = log_in_and_out_of_a_span(true);
        let outside: serde_json::Value = serde_json::from_str(&outside).expect("JSON outside");
        assert!(outside.get("trace_id").is_none(), "{outside}");
        let inside: serde_json::Value = serde_json::from_str(&inside).expect("JSON inside");
        assert_eq!(inside["trace_id"], traceparent[3..35], "{inside}");
        assert_eq!(inside["span_id"], traceparent[36..52], "{inside}");
        assert_eq!(inside["fields"]["message"], "inside");
        assert_eq!(inside["fields"]["plan"], "p-1");
    }

    #[test]
    fn text_log_lines_inside_a_span_end_with_its_trace_and_span_ids() {
        let (outside, inside, traceparent) = log_in_and_out_of_a_span(false);
        assert!(!outside.contains("trace_id="), "{outside}");
        assert!(outside.contains("outside"), "{outside}");
        let expected = format!(
            " trace_id={} span_id={}",
            &traceparent[3..35],
            &traceparent[36..52]
        );
        assert!(inside.ends_with(&expected), "{inside}");
        assert!(inside.contains("inside plan=\"p-1\""), "{inside}");
    }
}
