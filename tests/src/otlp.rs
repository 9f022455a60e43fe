//! An OTLP trace receiver inside a test: the OpenTelemetry collector's gRPC
//! trace service (`opentelemetry.proto.collector.trace.v1.TraceService`)
//! on `127.0.0.1:0`, keeping every span exported to it.

use std::sync::{Arc, Mutex};

use opentelemetry_proto::tonic::{
    collector::trace::v1::{
        ExportTraceServiceRequest, ExportTraceServiceResponse,
        trace_service_server::{TraceService, TraceServiceServer},
    },
    common::v1::any_value,
    trace::v1::Span,
};
use tokio::task::JoinHandle;

/// The running receiver; stops when dropped.
pub struct OtlpReceiver {
    /// `http://127.0.0.1:port`: what `OTEL_EXPORTER_OTLP_ENDPOINT` would say.
    pub endpoint: String,
    spans: Arc<Mutex<Vec<Span>>>,
    serving: JoinHandle<()>,
}

#[derive(Clone)]
struct Service {
    spans: Arc<Mutex<Vec<Span>>>,
}

#[tonic::async_trait]
impl TraceService for Service {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut spans = self
            .spans
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for resource in request.into_inner().resource_spans {
            for scope in resource.scope_spans {
                spans.extend(scope.spans);
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

impl OtlpReceiver {
    /// Serves on a free port.
    ///
    /// # Errors
    /// When binding fails.
    pub async fn start() -> anyhow::Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let endpoint = format!("http://{}", listener.local_addr()?);
        let spans = Arc::new(Mutex::new(Vec::new()));
        let service = TraceServiceServer::new(Service {
            spans: Arc::clone(&spans),
        });
        let serving = tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
                .await;
        });
        Ok(Self {
            endpoint,
            spans,
            serving,
        })
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<Span> {
        self.spans
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

impl Drop for OtlpReceiver {
    fn drop(&mut self) {
        self.serving.abort();
    }
}

/// The string attribute `key` of `span`.
pub fn attribute<'a>(span: &'a Span, key: &str) -> Option<&'a str> {
    span.attributes
        .iter()
        .find(|attribute| attribute.key == key)
        .and_then(|attribute| attribute.value.as_ref())
        .and_then(|value| match value.value.as_ref() {
            Some(any_value::Value::StringValue(text)) => Some(text.as_str()),
            _ => None,
        })
}
