//! The services' metrics pipeline: one OpenTelemetry [`SdkMeterProvider`] per
//! running service, read by a Prometheus scrape endpoint (`GET /metrics`,
//! text exposition format 0.0.4) when a listen address is given, and pushed
//! to an OTLP collector over gRPC when an endpoint is given. With neither,
//! every instrument is a no-op.
//!
//! Each `run` of a service builds its own pipeline (never the global
//! provider), so several planners and executors in one test process keep
//! separate counts.

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

/// Whether this process exports spans (set once by [`tracer_provider`]):
/// without it, the executor makes no span per message and replays carry a
/// random `traceparent`.
static TRACING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether spans are exported by this process ([`tracer_provider`] ran).
pub fn tracing_enabled() -> bool {
    TRACING.load(std::sync::atomic::Ordering::Relaxed)
}

/// The tracer provider exporting `service_name`'s spans over OTLP/gRPC to
/// `endpoint`, in batches. The sampler is the SDK's, from
/// `OTEL_TRACES_SAMPLER` / `OTEL_TRACES_SAMPLER_ARG` (default
/// `parentbased_always_on`); the resource from `OTEL_SERVICE_NAME` and
/// `OTEL_RESOURCE_ATTRIBUTES`. Installs the W3C Trace Context propagator as
/// the global one (what RPCs and replayed messages carry) and the provider
/// as the global one. Must run inside the Tokio runtime.
///
/// # Errors
/// [`TelemetryError::Exporter`] for an endpoint the exporter refuses.
pub fn tracer_provider(
    service_name: &'static str,
    endpoint: &str,
) -> Result<opentelemetry_sdk::trace::SdkTracerProvider, TelemetryError> {
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(endpoint.to_owned())
        .build()
        .map_err(|error| TelemetryError::Exporter {
            what: "OTLP span exporter",
            text: error.to_string(),
        })?;
    let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
        .with_resource(resource(service_name))
        .with_batch_exporter(exporter)
        .build();
    opentelemetry::global::set_text_map_propagator(
        opentelemetry_sdk::propagation::TraceContextPropagator::new(),
    );
    opentelemetry::global::set_tracer_provider(provider.clone());
    TRACING.store(true, std::sync::atomic::Ordering::Relaxed);
    Ok(provider)
}

/// The `tracing` layer that turns spans into OpenTelemetry spans of
/// `provider` (instrumentation scope `scope`); `otel.name`, `otel.kind` and
/// `otel.status_code` fields set the span's name, kind and status.
pub fn tracing_layer<S>(
    provider: &opentelemetry_sdk::trace::SdkTracerProvider,
    scope: &'static str,
) -> tracing_opentelemetry::OpenTelemetryLayer<S, opentelemetry_sdk::trace::SdkTracer>
where
    S: tracing::Subscriber + for<'span> tracing_subscriber::registry::LookupSpan<'span>,
{
    use opentelemetry::trace::TracerProvider as _;
    tracing_opentelemetry::layer().with_tracer(provider.tracer(scope))
}

/// Reads W3C Trace Context from HTTP/2 headers (gRPC metadata).
struct HeaderExtractor<'a>(&'a hyper::HeaderMap);

impl opentelemetry::propagation::Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|value| value.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0
            .keys()
            .map(hyper::header::HeaderName::as_str)
            .collect()
    }
}

/// The server span of one gRPC call (`rpc.system = grpc`, named by its
/// path as the RPC semantic conventions ask: `package.Service/Method`),
/// continuing the caller's W3C `traceparent` when it sent one. For tonic's
/// `Server::trace_fn`.
pub fn grpc_server_span<B>(request: &hyper::Request<B>) -> tracing::Span {
    use tracing_opentelemetry::OpenTelemetrySpanExt as _;
    let path = request.uri().path();
    let name = path.trim_start_matches('/');
    let (service, method) = name.split_once('/').unwrap_or((name, ""));
    let span = tracing::info_span!(
        "grpc.server",
        otel.name = %name,
        otel.kind = "server",
        rpc.system = "grpc",
        rpc.service = %service,
        rpc.method = %method,
    );
    if tracing_enabled() {
        let parent = opentelemetry::global::get_text_map_propagator(|propagator| {
            propagator.extract(&HeaderExtractor(request.headers()))
        });
        let _ = span.set_parent(parent);
    }
    span
}

/// The W3C `traceparent` naming `span` when it is an exported span's (the
/// OpenTelemetry layer is installed and the span is enabled); `None`
/// otherwise.
pub fn traceparent_of(span: &tracing::Span) -> Option<String> {
    use opentelemetry::trace::TraceContextExt as _;
    use tracing_opentelemetry::OpenTelemetrySpanExt as _;
    let context = span.context();
    traceparent_of_context(context.span().span_context())
}

/// The W3C `traceparent` (version `00`) naming `span_context`, when it is
/// valid.
pub fn traceparent_of_context(span_context: &opentelemetry::trace::SpanContext) -> Option<String> {
    span_context.is_valid().then(|| {
        format!(
            "00-{}-{}-{:02x}",
            span_context.trace_id(),
            span_context.span_id(),
            span_context.trace_flags().to_u8()
        )
    })
}

/// The span context a W3C `traceparent` value names, when it is valid.
pub fn parse_traceparent(value: &str) -> Option<opentelemetry::trace::SpanContext> {
    use opentelemetry::{propagation::TextMapPropagator as _, trace::TraceContextExt as _};
    let carrier = std::collections::HashMap::from([("traceparent".to_owned(), value.to_owned())]);
    let context = opentelemetry_sdk::propagation::TraceContextPropagator::new().extract(&carrier);
    let span_context = context.span().span_context().clone();
    span_context.is_valid().then_some(span_context)
}

/// Libraries whose most verbose levels print what they send and receive,
/// credentials included, with the most verbose level of theirs that does
/// not: lapin and amq-protocol (every `amq_protocol*` crate) print AMQP
/// frames at TRACE, among them `Connection.StartOk`, whose SASL PLAIN
/// `response` carries the broker user and password as bytes
/// (<https://www.rabbitmq.com/docs/access-control>, "SASL mechanisms").
pub const SECRET_CAPPED_TARGETS: &[(&str, tracing::Level)] = &[
    ("lapin", tracing::Level::DEBUG),
    ("amq_protocol", tracing::Level::DEBUG),
];

/// The filter every log line passes whatever `REDRIVE_LOG` says, so that no
/// level prints a secret: [`SECRET_CAPPED_TARGETS`] capped (a target names
/// a module and everything under it, and prefixes of crate names match:
/// `amq_protocol` covers `amq_protocol_tcp`), everything else as
/// `REDRIVE_LOG` decides.
pub fn secret_cap() -> tracing_subscriber::filter::Targets {
    tracing_subscriber::filter::Targets::new()
        .with_default(tracing::Level::TRACE)
        .with_targets(SECRET_CAPPED_TARGETS.iter().copied())
}

/// Installs the process's `tracing` subscriber: log lines to stderr (JSON
/// lines with `json`, else text; filtered by `filter`, e.g. `REDRIVE_LOG`,
/// and by [`secret_cap`] whatever `filter` says)
/// and, with an OTLP `endpoint`, spans at INFO and above exported through
/// [`tracer_provider`] whatever the log filter says. Returns the provider
/// to shut down (flush) at exit. Must run inside the Tokio runtime.
///
/// # Errors
/// [`TelemetryError::Exporter`] for an endpoint the exporter refuses.
pub fn init_subscriber(
    service_name: &'static str,
    filter: tracing_subscriber::EnvFilter,
    json: bool,
    endpoint: Option<&str>,
) -> Result<Option<opentelemetry_sdk::trace::SdkTracerProvider>, TelemetryError> {
    use tracing_subscriber::{Layer as _, layer::SubscriberExt as _, util::SubscriberInitExt as _};
    let provider = endpoint
        .map(|endpoint| tracer_provider(service_name, endpoint))
        .transpose()?;
    let spans = provider.as_ref().map(|provider| {
        tracing_layer(provider, service_name)
            .with_filter(tracing_subscriber::filter::LevelFilter::INFO)
    });
    let logs = log_layer(json, std::io::stderr).with_filter(
        tracing_subscriber::filter::FilterExt::and(filter, secret_cap()),
    );
    tracing_subscriber::registry().with(spans).with(logs).init();
    Ok(provider)
}

/// The log-line layer writing to `writer`: JSON lines with `json`, else
/// text (coloured on a terminal). Either way a line logged inside an
/// exported span carries that span's `trace_id` (32 hex digits) and
/// `span_id` (16), the W3C Trace Context identifiers, so that a log search
/// and a trace viewer meet ([`WithTraceIds`]).
pub fn log_layer<S, W>(json: bool, writer: W) -> Box<dyn tracing_subscriber::Layer<S> + Send + Sync>
where
    S: tracing::Subscriber + for<'span> tracing_subscriber::registry::LookupSpan<'span>,
    W: for<'writer> tracing_subscriber::fmt::MakeWriter<'writer> + Send + Sync + 'static,
{
    use tracing_subscriber::Layer as _;
    let dispatch = Arc::new(std::sync::OnceLock::new());
    let catcher = DispatchCatcher(Arc::clone(&dispatch));
    if json {
        tracing_subscriber::fmt::layer()
            .json()
            .map_event_format(|format| WithTraceIds {
                inner: format,
                json: true,
                dispatch,
            })
            .with_writer(writer)
            .and_then(catcher)
            .boxed()
    } else {
        let terminal = std::io::IsTerminal::is_terminal(&std::io::stderr());
        tracing_subscriber::fmt::layer()
            .with_ansi(terminal)
            .map_event_format(|format| WithTraceIds {
                inner: format,
                json: false,
                dispatch,
            })
            .with_writer(writer)
            .and_then(catcher)
            .boxed()
    }
}

/// The dispatcher a subscriber was registered as, kept (weakly) for the
/// log format: an event is formatted while that dispatcher is busy, when
/// `tracing`'s own lookups of the current dispatcher answer "none" for a
/// scoped one.
type RegisteredDispatch = Arc<std::sync::OnceLock<tracing::dispatcher::WeakDispatch>>;

/// A layer that does nothing but remember its dispatcher.
struct DispatchCatcher(RegisteredDispatch);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for DispatchCatcher {
    fn on_register_dispatch(&self, subscriber: &tracing::Dispatch) {
        let _ = self.0.set(subscriber.downgrade());
    }
}

/// An event format adding the current span's OpenTelemetry `trace_id` and
/// `span_id` to the line `inner` writes: as two more members of the JSON
/// object, or as `trace_id=… span_id=…` at the end of a text line. Lines
/// outside any exported span are written unchanged. (A text line with ids
/// loses its ANSI colours: the line is formatted into a buffer first.)
#[derive(Debug, Clone)]
pub struct WithTraceIds<F> {
    inner: F,
    json: bool,
    dispatch: RegisteredDispatch,
}

impl<F> WithTraceIds<F> {
    /// The trace and span id (lower-case hex) of the event's span, when it
    /// is an OpenTelemetry span with a valid context.
    fn trace_ids<S, N>(
        &self,
        context: &tracing_subscriber::fmt::FmtContext<'_, S, N>,
    ) -> Option<(String, String)>
    where
        S: tracing::Subscriber + for<'span> tracing_subscriber::registry::LookupSpan<'span>,
        N: for<'fields> tracing_subscriber::fmt::FormatFields<'fields> + 'static,
    {
        use opentelemetry::trace::TraceContextExt as _;
        let span = context.parent_span()?.id();
        let dispatch = self.dispatch.get()?.upgrade()?;
        let otel = tracing_opentelemetry::get_otel_context(&span, &dispatch)?;
        let span_context = otel.span().span_context().clone();
        span_context.is_valid().then(|| {
            (
                span_context.trace_id().to_string(),
                span_context.span_id().to_string(),
            )
        })
    }
}

impl<S, N, F> tracing_subscriber::fmt::FormatEvent<S, N> for WithTraceIds<F>
where
    S: tracing::Subscriber + for<'span> tracing_subscriber::registry::LookupSpan<'span>,
    N: for<'fields> tracing_subscriber::fmt::FormatFields<'fields> + 'static,
    F: tracing_subscriber::fmt::FormatEvent<S, N>,
{
    fn format_event(
        &self,
        context: &tracing_subscriber::fmt::FmtContext<'_, S, N>,
        mut writer: tracing_subscriber::fmt::format::Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> std::fmt::Result {
        let Some((trace_id, span_id)) = self.trace_ids(context) else {
            return self.inner.format_event(context, writer, event);
        };
        let mut line = String::new();
        self.inner.format_event(
            context,
            tracing_subscriber::fmt::format::Writer::new(&mut line),
            event,
        )?;
        let body = line.trim_end_matches('\n');
        if self.json {
            // The inner format wrote one JSON object: add two members
            // before its closing brace.
            let Some(open) = body.strip_suffix('}') else {
                return writeln!(writer, "{body}");
            };
            writeln!(
                writer,
                "{open},\"trace_id\":\"{trace_id}\",\"span_id\":\"{span_id}\"}}"
            )
        } else {
            writeln!(writer, "{body} trace_id={trace_id} span_id={span_id}")
        }
    }
}

/// The log filter when `REDRIVE_LOG` is not set: `info`, without lapin's
/// own `lapin::channel` lines. lapin logs every channel or connection the
/// broker closes at ERROR (`Channel closed`, `Connection closed`), also
/// those the service expects and reports itself with its context (a
/// capture queue that does not exist: one WARN per retry naming it); every
/// such close also reaches the service as an error. `REDRIVE_LOG=info`
/// shows them again.
pub const DEFAULT_LOG_FILTER: &str = "info,lapin::channel=off";

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

/// Puts `span`'s W3C `traceparent` into the metadata of an outgoing gRPC
/// call, so that the callee continues the trace (nothing when spans are not
/// exported).
pub fn inject_traceparent(span: &tracing::Span, metadata: &mut tonic::metadata::MetadataMap) {
    if !tracing_enabled() {
        return;
    }
    if let Some(value) = traceparent_of(span).and_then(|text| text.parse().ok()) {
        metadata.insert("traceparent", value);
    }
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
