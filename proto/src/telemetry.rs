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

/// What a service's metrics pipeline is told at start.
#[derive(Debug, Clone, Default)]
pub struct MetricsSettings {
    /// Serve `GET /metrics` here (`--metrics-listen`); none: no endpoint.
    pub listen: Option<SocketAddr>,
    /// The OTLP/gRPC collector (`OTEL_EXPORTER_OTLP_ENDPOINT`, e.g.
    /// `http://127.0.0.1:4317`); none: no push.
    pub otlp_endpoint: Option<String>,
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
                info!(address = ?address, "metrics endpoint serving /metrics");
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

    /// A pipeline that records nothing (tests of parts that need a meter).
    pub fn disabled() -> Self {
        Self {
            provider: SdkMeterProvider::builder().build(),
            scrape_address: None,
            serving: None,
        }
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
