//! The state-check hooks: `redrive.v1.StateCheck` services owned by the teams
//! whose business state decides whether a message may be replayed (docs/design.md,
//! "state check"). Routes map an event type pattern or a destination to a hook
//! URL; the first matching route wins.

use std::{collections::HashMap, fmt, str::FromStr, sync::Mutex, time::Duration};

use redrive_proto::{
    codec::CheckedCodec,
    v1::{StateCheckResponse, StateCheckVerdict},
};
use tonic::{
    client::Grpc,
    codegen::http::uri::PathAndQuery,
    transport::{Channel, Endpoint},
};

/// The hook's method: `redrive.v1.StateCheck/Check`.
const CHECK_PATH: &str = "/redrive.v1.StateCheck/Check";

/// `redrive.v1.StateCheckMessage` as the planner sends it: the properties
/// and headers are the protobuf encodings capture stored, sent as they are.
/// An embedded message and `bytes` are the same on the wire, a
/// length-delimited field
/// (<https://protobuf.dev/programming-guides/encoding/#embedded>), so the
/// hook decodes a `StateCheckMessage` while the planner never decodes and
/// re-encodes a header table (`x-death` and its tables) per message.
#[derive(Clone, PartialEq, prost::Message)]
pub struct StoredStateCheckMessage {
    /// The dead letter's id, in decimal.
    #[prost(string, tag = "1")]
    pub dead_letter_id: String,
    /// Its message key.
    #[prost(string, tag = "2")]
    pub message_key: String,
    /// Its event type, when known.
    #[prost(string, optional, tag = "3")]
    pub event_type: Option<String>,
    /// Its body, as captured.
    #[prost(bytes = "vec", tag = "4")]
    pub body: Vec<u8>,
    /// Its stored `redrive.v1.MessageProperties`, encoded.
    #[prost(bytes = "vec", optional, tag = "5")]
    pub properties: Option<Vec<u8>>,
    /// Its stored `redrive.v1.HeaderTable`, encoded.
    #[prost(bytes = "vec", optional, tag = "6")]
    pub headers: Option<Vec<u8>>,
}

/// `redrive.v1.StateCheckRequest` of [`StoredStateCheckMessage`]s.
#[derive(Clone, PartialEq, prost::Message)]
pub struct StoredStateCheckRequest {
    /// The messages to decide, at most a batch.
    #[prost(message, repeated, tag = "1")]
    pub messages: Vec<StoredStateCheckMessage>,
}

/// An event type pattern: exact (`order.paid`) or a prefix ending in `*`
/// (`order.*`, `*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pattern(String);

impl Pattern {
    /// Parses a pattern; `*` may only end it.
    ///
    /// # Errors
    /// A sentence naming the problem.
    pub fn parse(pattern: &str) -> Result<Self, String> {
        if pattern.is_empty() {
            return Err("an event type pattern must not be empty".to_owned());
        }
        // Everything but a trailing '*' (a last character of any width).
        let body = pattern.strip_suffix('*').unwrap_or(pattern);
        if body.contains('*') {
            return Err(format!("{pattern:?}: '*' may only end a pattern"));
        }
        Ok(Self(pattern.to_owned()))
    }

    /// Whether `value` matches.
    pub fn matches(&self, value: &str) -> bool {
        match self.0.strip_suffix('*') {
            Some(prefix) => value.starts_with(prefix),
            None => self.0 == value,
        }
    }

    /// Higher is more specific: an exact pattern beats any prefix, a longer
    /// prefix beats a shorter one.
    pub fn specificity(&self) -> usize {
        if self.0.ends_with('*') {
            self.0.len() - 1
        } else {
            usize::MAX
        }
    }

    /// Whether every value `other` matches, this pattern matches too: `order.*`
    /// covers `order.paid` and `order.p*`; an exact pattern covers only itself.
    pub fn covers(&self, other: &Pattern) -> bool {
        match (self.0.strip_suffix('*'), other.0.strip_suffix('*')) {
            (Some(prefix), Some(other_prefix)) => other_prefix.starts_with(prefix),
            (Some(_), None) | (None, None) => self.matches(&other.0),
            (None, Some(_)) => false,
        }
    }

    /// The pattern text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// What a route matches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HookMatcher {
    /// Dead letters whose event type matches.
    EventType(Pattern),
    /// Dead letters bound for this destination.
    Destination(String),
}

/// A hook route, parsed from `event-type:PATTERN=URL`, `destination:NAME=URL`
/// or `PATTERN=URL` (an event type pattern).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HookRoute {
    /// What it matches.
    pub matcher: HookMatcher,
    /// The hook's gRPC URL (`http://host:port`).
    pub url: String,
}

impl FromStr for HookRoute {
    type Err = String;

    fn from_str(spec: &str) -> Result<Self, Self::Err> {
        // The matcher ends at the `=` before the URL's scheme: a URL may hold
        // `=` in its query, and a queue name may hold one too.
        let split = ["=http://", "=https://"]
            .iter()
            .filter_map(|scheme| spec.find(scheme))
            .min();
        let Some(split) = split else {
            return Err(if spec.contains('=') {
                format!("{spec:?}: the hook URL must be http:// or https://")
            } else {
                format!(
                    "{spec:?}: expected event-type:PATTERN=URL, destination:NAME=URL or PATTERN=URL"
                )
            });
        };
        let (matcher, url) = (&spec[..split], &spec[split + 1..]);
        let matcher = match matcher.split_once(':') {
            Some(("destination", name)) if !name.is_empty() => {
                HookMatcher::Destination(name.to_owned())
            }
            Some(("event-type", pattern)) => HookMatcher::EventType(Pattern::parse(pattern)?),
            _ => HookMatcher::EventType(Pattern::parse(matcher)?),
        };
        Ok(Self {
            matcher,
            url: url.to_owned(),
        })
    }
}

impl fmt::Display for HookRoute {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.matcher {
            HookMatcher::EventType(pattern) => {
                write!(formatter, "event-type:{}={}", pattern.as_str(), self.url)
            }
            HookMatcher::Destination(name) => write!(formatter, "destination:{name}={}", self.url),
        }
    }
}

/// A hook's answer for one message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StateDecision {
    /// Replay it.
    Replay,
    /// Do not: the business state forbids it (the reason says why).
    Block(String),
    /// Do not: something must be undone first (the reason says what).
    NeedsCompensation(String),
}

/// A hook call that failed.
#[derive(Debug, thiserror::Error)]
pub enum StateCheckError {
    /// The hook could not be reached or answered with an error.
    #[error("state check hook {url} failed: {message}")]
    Failed {
        /// The hook.
        url: String,
        /// What went wrong.
        message: String,
    },
    /// The hook took longer than the timeout.
    #[error("state check hook {url} did not answer within {timeout:?}")]
    Timeout {
        /// The hook.
        url: String,
        /// The timeout.
        timeout: Duration,
    },
    /// The hook's answer does not cover every message, or says nothing usable.
    #[error("state check hook {url} answered badly: {message}")]
    BadAnswer {
        /// The hook.
        url: String,
        /// What is wrong with the answer.
        message: String,
    },
}

/// Routes and connections to the configured hooks (connections are made lazily
/// and reused).
#[derive(Debug, Default)]
pub struct StateChecker {
    routes: Vec<HookRoute>,
    clients: Mutex<HashMap<String, Grpc<Channel>>>,
    /// CA bundle and client certificate for `https://` hooks.
    tls: redrive_proto::tls::ClientTlsFiles,
}

impl StateChecker {
    /// A checker over `routes`.
    pub fn new(routes: Vec<HookRoute>) -> Self {
        Self {
            routes,
            clients: Mutex::new(HashMap::new()),
            tls: redrive_proto::tls::ClientTlsFiles::default(),
        }
    }

    /// The checker calling `https://` hooks with `tls` (a CA bundle, else
    /// the platform's roots; a client certificate when given).
    pub fn with_tls(mut self, tls: redrive_proto::tls::ClientTlsFiles) -> Self {
        self.tls = tls;
        self
    }

    /// Whether any hook is configured.
    pub fn is_empty(&self) -> bool {
        self.routes.is_empty()
    }

    /// The index of the first route for a dead letter, if any.
    pub fn route(&self, event_type: Option<&str>, destination: &str) -> Option<usize> {
        self.routes.iter().position(|route| match &route.matcher {
            HookMatcher::EventType(pattern) => {
                event_type.is_some_and(|event_type| pattern.matches(event_type))
            }
            HookMatcher::Destination(name) => name == destination,
        })
    }

    /// The URL of route `index`.
    pub fn url(&self, index: usize) -> &str {
        &self.routes[index].url
    }

    fn client(&self, url: &str) -> Result<Grpc<Channel>, StateCheckError> {
        let mut clients = self
            .clients
            .lock()
            .expect("hook client map is never poisoned");
        if let Some(client) = clients.get(url) {
            return Ok(client.clone());
        }
        let failed = |message: String| StateCheckError::Failed {
            url: url.to_owned(),
            message,
        };
        let mut endpoint =
            Endpoint::from_shared(url.to_owned()).map_err(|error| failed(error.to_string()))?;
        if url.starts_with("https://") {
            endpoint = self
                .tls
                .apply_named(url, endpoint, &crate::config::STATE_CHECK_TLS)
                .map_err(|error| failed(error.text))?;
        }
        let client = Grpc::new(
            endpoint
                .connect_timeout(Duration::from_secs(5))
                .connect_lazy(),
        )
        .max_decoding_message_size(64 * 1024 * 1024)
        .max_encoding_message_size(64 * 1024 * 1024);
        clients.insert(url.to_owned(), client.clone());
        Ok(client)
    }

    /// Asks route `index`'s hook about `messages`; the answer maps each
    /// `dead_letter_id` to a decision.
    ///
    /// # Errors
    /// [`StateCheckError`] when the hook fails, times out, or leaves a message
    /// out.
    pub async fn check(
        &self,
        index: usize,
        messages: Vec<StoredStateCheckMessage>,
        timeout: Duration,
    ) -> Result<HashMap<String, StateDecision>, StateCheckError> {
        let url = self.url(index).to_owned();
        let mut client = self.client(&url)?;
        let wanted: Vec<String> = messages.iter().map(|m| m.dead_letter_id.clone()).collect();
        // A client span, its traceparent sent along: the hook's own server
        // span continues the precheck's (or the executor's re-check) trace.
        let span = tracing::info_span!(
            "grpc.client",
            otel.name = "redrive.v1.StateCheck/Check",
            otel.kind = "client",
            rpc.system = "grpc",
            rpc.service = "redrive.v1.StateCheck",
            rpc.method = "Check",
            redrive.messages = wanted.len(),
        );
        let mut request = tonic::Request::new(StoredStateCheckRequest { messages });
        redrive_proto::telemetry::inject_traceparent(&span, request.metadata_mut());
        request
            .extensions_mut()
            .insert(tonic::GrpcMethod::new("redrive.v1.StateCheck", "Check"));
        let call = async move {
            client
                .ready()
                .await
                .map_err(|error| tonic::Status::unknown(format!("hook not ready: {error}")))?;
            client
                .unary(
                    request,
                    PathAndQuery::from_static(CHECK_PATH),
                    CheckedCodec::<StoredStateCheckRequest, StateCheckResponse>::default(),
                )
                .await
        };
        let call = tracing::Instrument::instrument(call, span);
        let answer = match tokio::time::timeout(timeout, call).await {
            Err(_) => return Err(StateCheckError::Timeout { url, timeout }),
            Ok(Err(status)) => {
                return Err(StateCheckError::Failed {
                    url,
                    message: format!("{:?}: {}", status.code(), status.message()),
                });
            }
            Ok(Ok(answer)) => answer.into_inner(),
        };
        let mut decisions = HashMap::with_capacity(answer.decisions.len());
        for decision in answer.decisions {
            let verdict = match StateCheckVerdict::try_from(decision.verdict).unwrap_or_default() {
                StateCheckVerdict::Replay => StateDecision::Replay,
                StateCheckVerdict::Block => StateDecision::Block(bounded_reason(decision.reason)),
                StateCheckVerdict::NeedsCompensation => {
                    StateDecision::NeedsCompensation(bounded_reason(decision.reason))
                }
                StateCheckVerdict::Unspecified => {
                    return Err(StateCheckError::BadAnswer {
                        url,
                        message: format!("no verdict for dead letter {}", decision.dead_letter_id),
                    });
                }
            };
            decisions.insert(decision.dead_letter_id, verdict);
        }
        if let Some(missing) = wanted.iter().find(|id| !decisions.contains_key(*id)) {
            return Err(StateCheckError::BadAnswer {
                url,
                message: format!("no decision for dead letter {missing}"),
            });
        }
        Ok(decisions)
    }
}

/// A hook's reason as the audit keeps it: at most
/// [`redrive_proto::limits::MAX_REASON_BYTES`] (cut at a character boundary,
/// with `…`), so that the reports and exports carrying it stay bounded
/// whatever a hook answers.
fn bounded_reason(mut reason: String) -> String {
    let limit = redrive_proto::limits::MAX_REASON_BYTES;
    if reason.len() > limit {
        let mut end = limit - '…'.len_utf8();
        while !reason.is_char_boundary(end) {
            end -= 1;
        }
        reason.truncate(end);
        reason.push('…');
    }
    reason
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The stored encodings sent as bytes are, on the wire, the
    /// `StateCheckMessage` the hook decodes: byte for byte what encoding the
    /// decoded properties and headers would send.
    #[test]
    fn stored_messages_are_state_check_messages_on_the_wire() {
        use prost::Message as _;
        use redrive_proto::v1::{self, HeaderValue, header_value::Value};
        let value = |value| HeaderValue { value: Some(value) };
        let properties = v1::MessageProperties {
            content_type: Some("application/json".into()),
            delivery_mode: Some(2),
            ..Default::default()
        };
        let death = v1::HeaderTable {
            fields: [
                ("count".to_owned(), value(Value::LongLongInt(3))),
                (
                    "queue".to_owned(),
                    value(Value::LongString(b"work".to_vec())),
                ),
            ]
            .into(),
        };
        let headers = v1::HeaderTable {
            fields: [(
                "x-death".to_owned(),
                value(Value::Array(v1::HeaderArray {
                    values: vec![value(Value::Table(death))],
                })),
            )]
            .into(),
        };
        for (properties, headers) in [
            (properties, headers),
            (Default::default(), Default::default()),
        ] {
            let stored = StoredStateCheckRequest {
                messages: vec![StoredStateCheckMessage {
                    dead_letter_id: "7".into(),
                    message_key: "o-1".into(),
                    event_type: Some("order.paid".into()),
                    body: b"{}".to_vec(),
                    properties: Some(properties.encode_to_vec()),
                    headers: Some(headers.encode_to_vec()),
                }],
            }
            .encode_to_vec();
            let sent = v1::StateCheckRequest {
                messages: vec![v1::StateCheckMessage {
                    dead_letter_id: "7".into(),
                    message_key: "o-1".into(),
                    event_type: Some("order.paid".into()),
                    body: b"{}".to_vec(),
                    properties: Some(properties),
                    headers: Some(headers),
                }],
            };
            assert_eq!(
                v1::StateCheckRequest::decode(stored.as_slice()).unwrap(),
                sent
            );
            assert_eq!(stored, sent.encode_to_vec());
        }
    }

    #[test]
    fn hook_reasons_are_bounded() {
        assert_eq!(bounded_reason("short".to_owned()), "short");
        let long = bounded_reason("é".repeat(10_000));
        assert!(long.len() <= redrive_proto::limits::MAX_REASON_BYTES);
        assert!(long.ends_with('…'));
    }

    #[test]
    fn routes_parse_and_match_first_wins() {
        let routes: Vec<HookRoute> = [
            "destination:orders.fulfil=http://a:1",
            "order.*=http://b:2",
            "event-type:*=http://c:3",
        ]
        .iter()
        .map(|spec| spec.parse().unwrap())
        .collect();
        let checker = StateChecker::new(routes);
        assert_eq!(checker.route(Some("order.paid"), "orders.fulfil"), Some(0));
        assert_eq!(checker.route(Some("order.paid"), "elsewhere"), Some(1));
        assert_eq!(checker.route(Some("invoice.sent"), "elsewhere"), Some(2));
        assert_eq!(checker.route(None, "elsewhere"), None);
        assert!(
            "order.*"
                .parse::<HookRoute>()
                .unwrap_err()
                .contains("expected")
        );
        assert!(
            "order.*=ftp://x"
                .parse::<HookRoute>()
                .unwrap_err()
                .contains("http")
        );
        assert!(
            "or*der=http://x"
                .parse::<HookRoute>()
                .unwrap_err()
                .contains("'*'")
        );
        // A query string with `=`, and a queue name with one.
        let route: HookRoute = "order.*=http://a/x?p=1&q=2".parse().unwrap();
        assert_eq!(route.url, "http://a/x?p=1&q=2");
        let route: HookRoute = "destination:a=b=https://h/".parse().unwrap();
        assert_eq!(route.matcher, HookMatcher::Destination("a=b".into()));
        assert_eq!(route.url, "https://h/");
    }

    /// Found by the fuzz test: a pattern ending in a multi-byte character
    /// made the planner panic (a string cut inside a character).
    #[test]
    fn patterns_ending_in_wide_characters_parse() {
        assert!(Pattern::parse("order.ⶺ").is_ok());
        assert!(Pattern::parse("ⶺ*").is_ok());
        assert!(Pattern::parse("a*ⶺ").is_err());
        assert!(Pattern::parse("*").is_ok());
        assert!(Pattern::parse("**").is_err());
    }

    #[test]
    fn exact_patterns_are_more_specific_than_prefixes() {
        let exact = Pattern::parse("payment.captured").unwrap();
        let prefix = Pattern::parse("payment.*").unwrap();
        assert!(exact.specificity() > prefix.specificity());
        assert!(prefix.matches("payment.captured") && !prefix.matches("order.paid"));
        assert!(Pattern::parse("*").unwrap().matches("anything"));
    }
}
