//! Span export and W3C Trace Context: the OTLP tracer provider, the span of
//! each gRPC call the services answer, and `traceparent` read from and
//! written into requests and replayed messages.

use opentelemetry_otlp::WithExportConfig as _;

use super::{TelemetryError, resource};

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
