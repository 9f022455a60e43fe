//! Log lines: the `tracing` subscriber of a service (log lines to stderr,
//! spans exported when asked), the filter that keeps secrets out of every
//! level, and the trace and span ids on each line.

use std::sync::Arc;

use super::{TelemetryError, tracer_provider, tracing_layer};

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

/// Lines of libraries that say something false of Redrive's use of them,
/// by target and message, dropped whatever `REDRIVE_LOG` says: lapin logs
/// `Exponential backoff attempts exhausted, aborting recovery` at ERROR
/// after every failed connection attempt when its own reconnection is off
/// (its default, kept: the services reconnect themselves, and say so with
/// the broker's address and reason), so a wrong password printed it once a
/// loop a second.
pub const MISLEADING_LINES: &[(&str, &str)] = &[(
    "lapin::io_loop",
    "Exponential backoff attempts exhausted, aborting recovery",
)];

/// The per-layer filter that drops [`MISLEADING_LINES`].
#[derive(Debug, Clone, Copy, Default)]
pub struct DropMisleading;

impl DropMisleading {
    /// Whether lines of `metadata`'s callsite may be among
    /// [`MISLEADING_LINES`] (they are all ERROR lines).
    fn may_drop(metadata: &tracing::Metadata<'_>) -> bool {
        *metadata.level() == tracing::Level::ERROR
            && MISLEADING_LINES
                .iter()
                .any(|&(target, _)| target == metadata.target())
    }
}

/// Every callsite but those of [`MISLEADING_LINES`]' targets at ERROR is
/// left to the other filters for good (`Interest::always`, and no level
/// cap: `TRACE`), so that the combined filter's interest and level hint
/// are theirs: without these, `And` would take the whole filter's most
/// verbose level to be TRACE and ask about every callsite at every event.
impl<S> tracing_subscriber::layer::Filter<S> for DropMisleading {
    fn enabled(
        &self,
        _: &tracing::Metadata<'_>,
        _: &tracing_subscriber::layer::Context<'_, S>,
    ) -> bool {
        true
    }

    fn callsite_enabled(
        &self,
        metadata: &'static tracing::Metadata<'static>,
    ) -> tracing::subscriber::Interest {
        if Self::may_drop(metadata) {
            tracing::subscriber::Interest::sometimes()
        } else {
            tracing::subscriber::Interest::always()
        }
    }

    fn max_level_hint(&self) -> Option<tracing::level_filters::LevelFilter> {
        Some(tracing::level_filters::LevelFilter::TRACE)
    }

    fn event_enabled(
        &self,
        event: &tracing::Event<'_>,
        _: &tracing_subscriber::layer::Context<'_, S>,
    ) -> bool {
        /// Whether the event's message is `.0`.
        struct MessageIs<'a>(&'a str, bool);
        impl tracing::field::Visit for MessageIs<'_> {
            fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
                if field.name() == "message" {
                    self.1 = value == self.0;
                }
            }
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                if field.name() == "message" {
                    self.1 = format!("{value:?}") == self.0;
                }
            }
        }
        if !Self::may_drop(event.metadata()) {
            return true;
        }
        let target = event.metadata().target();
        !MISLEADING_LINES.iter().any(|&(of, message)| {
            of == target && {
                let mut is = MessageIs(message, false);
                event.record(&mut is);
                is.1
            }
        })
    }
}

/// What decides which log lines are written: `filter` (`REDRIVE_LOG`),
/// then [`secret_cap`] and [`DropMisleading`], whatever `filter` says.
pub fn line_filter<S>(
    filter: tracing_subscriber::EnvFilter,
) -> impl tracing_subscriber::layer::Filter<S> + Send + Sync + 'static
where
    S: tracing::Subscriber + for<'span> tracing_subscriber::registry::LookupSpan<'span>,
{
    use tracing_subscriber::filter::FilterExt as _;
    filter.and(secret_cap()).and(DropMisleading)
}

/// Installs the process's `tracing` subscriber: log lines to stderr (JSON
/// lines with `json`, else text; filtered by `filter`, e.g. `REDRIVE_LOG`,
/// and by [`secret_cap`] and [`DropMisleading`] whatever `filter` says:
/// [`line_filter`])
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
    let logs = log_layer(json, std::io::stderr).with_filter(line_filter(filter));
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
