//! Connecting to the planner's `redrive.v1.Planner` service, and who the
//! caller is. Without credentials every request carries the actor
//! (`--actor`, `REDRIVE_ACTOR`, else `USER`, else `anonymous`) in the
//! `x-redrive-actor` metadata, which the planner records as the actor of
//! what the request creates (a precheck's `actor`). With credentials (a
//! bearer token from `--token-file` or `REDRIVE_TOKEN`, sent as
//! `authorization: Bearer TOKEN`, or a client certificate) the planner
//! records the authenticated caller, and the actor is sent only when named
//! (a portal with the delegate permission naming its user). `https://`
//! URLs use TLS: `--ca` (else the platform's roots), and `--tls-client-cert`
//! with `--tls-client-key` for mutual TLS.

use std::{error::Error as _, time::Duration};

use redrive_proto::v1::planner_client::PlannerClient;
use tonic::{
    Request, Status,
    metadata::{Ascii, MetadataValue},
    service::{Interceptor, interceptor::InterceptedService},
    transport::{Channel, Endpoint},
};

use crate::error::CliError;

/// The gRPC metadata key the planner reads the caller from.
pub use redrive_proto::headers::ACTOR_METADATA;

/// The gRPC metadata key of an idempotency key (docs/api.md, "Idempotency
/// keys"; after the IETF draft "The Idempotency-Key HTTP Header Field").
pub const IDEMPOTENCY_KEY_METADATA: &str = "idempotency-key";

/// The longest idempotency key the planner keeps, in bytes.
pub const MAX_IDEMPOTENCY_KEY_BYTES: usize = 255;

/// The actor when neither `--actor`, `REDRIVE_ACTOR` nor `USER` names one.
pub const ANONYMOUS: &str = "anonymous";

/// Where the planner listens by default (its own `--listen` default).
pub const DEFAULT_PLANNER: &str = "http://127.0.0.1:50051";

/// Largest answer accepted: the planner's limit (a dead letter with a 16 MiB
/// body and its revisions fits well).
pub use redrive_proto::limits::MAX_GRPC_MESSAGE_BYTES as MAX_DECODING_MESSAGE_BYTES;

/// How long to try to open the connection before giving up.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How often an HTTP/2 PING (RFC 9113, section 6.7) asks the planner
/// whether the connection still stands, also while a call waits for its
/// answer: a peer that accepted the connection and went silent (a hung
/// process, a half-open path, a balancer with no backend) is found within
/// this interval plus [`KEEP_ALIVE_TIMEOUT`], not never.
const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(10);

/// How long a PING waits for its acknowledgement before the connection is
/// taken for dead (the call then fails as unreachable).
const KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// A planner client; every request carries the actor and the token.
pub type Planner = PlannerClient<InterceptedService<Channel, ActorInterceptor>>;

/// What the CLI presents to the planner.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Credentials {
    /// CA bundle and client certificate for `https://`.
    pub tls: redrive_proto::tls::ClientTlsFiles,
    /// The bearer token (a static token or a JWT).
    pub token: Option<String>,
}

impl Credentials {
    /// Whether the planner can tell who calls from these (a token or a
    /// client certificate).
    pub fn present(&self) -> bool {
        self.token.is_some() || self.tls.client_cert.is_some()
    }
}

/// Adds `x-redrive-actor: NAME`, `authorization: Bearer TOKEN` and the
/// invocation's W3C `traceparent` ([`invocation_traceparent`]) to every
/// request.
#[derive(Debug, Clone)]
pub struct ActorInterceptor {
    actor: Option<MetadataValue<Ascii>>,
    authorization: Option<MetadataValue<Ascii>>,
    traceparent: Option<MetadataValue<Ascii>>,
    idempotency_key: Option<MetadataValue<Ascii>>,
}

/// Whether `text` is a W3C Trace Context `traceparent` of version 00 with
/// non-zero ids (<https://www.w3.org/TR/trace-context/#traceparent-header>).
fn is_traceparent(text: &str) -> bool {
    let parts: Vec<&str> = text.split('-').collect();
    let hex_of = |part: &str, length: usize| {
        part.len() == length
            && part
                .bytes()
                .all(|byte| byte.is_ascii_digit() || (b'a'..=b'f').contains(&byte))
    };
    matches!(parts.as_slice(), [version, trace, span, flags]
        if *version == "00"
            && hex_of(trace, 32)
            && hex_of(span, 16)
            && hex_of(flags, 2)
            && trace.bytes().any(|byte| byte != b'0')
            && span.bytes().any(|byte| byte != b'0'))
}

/// The `traceparent` every RPC of this `redrivectl` run carries, so that
/// the planner's server spans of one command share one trace: the
/// `TRACEPARENT` environment variable when it holds a valid one (a caller
/// such as a CI job or a script continuing its own trace), else a new
/// random one per run, sampled.
pub fn invocation_traceparent() -> &'static str {
    static TRACEPARENT: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    TRACEPARENT.get_or_init(|| {
        std::env::var("TRACEPARENT")
            .ok()
            .map(|text| text.trim().to_owned())
            .filter(|text| is_traceparent(text))
            .unwrap_or_else(|| {
                let trace = uuid::Uuid::new_v4().simple().to_string();
                let span = &uuid::Uuid::new_v4().simple().to_string()[..16];
                format!("00-{trace}-{span}-01")
            })
    })
}

fn traceparent_metadata() -> Option<MetadataValue<Ascii>> {
    MetadataValue::try_from(invocation_traceparent()).ok()
}

impl ActorInterceptor {
    /// An interceptor sending `actor`.
    ///
    /// # Errors
    /// [`CliError::Usage`] when `actor` cannot be a gRPC metadata value
    /// (visible ASCII only).
    pub fn new(actor: &str) -> Result<Self, CliError> {
        Ok(Self {
            actor: Some(actor_metadata(actor).map_err(CliError::Usage)?),
            authorization: None,
            traceparent: traceparent_metadata(),
            idempotency_key: None,
        })
    }

    /// An interceptor sending `actor` when given, and `token` when given.
    ///
    /// # Errors
    /// [`CliError::Usage`] when either cannot be a gRPC metadata value.
    pub fn with_token(actor: Option<&str>, token: Option<&str>) -> Result<Self, CliError> {
        let actor = actor
            .map(actor_metadata)
            .transpose()
            .map_err(CliError::Usage)?;
        let authorization = token
            .map(|token| {
                MetadataValue::try_from(format!("Bearer {token}")).map_err(|_| {
                    CliError::Usage("the bearer token is not visible ASCII".to_owned())
                })
            })
            .transpose()?;
        Ok(Self {
            actor,
            authorization,
            traceparent: traceparent_metadata(),
            idempotency_key: None,
        })
    }

    /// The same, also sending `idempotency-key: KEY` when `key` is given.
    ///
    /// # Errors
    /// [`CliError::Usage`] when `key` is not 1 to 255 visible ASCII
    /// characters ([`parse_idempotency_key`]).
    pub fn with_idempotency_key(mut self, key: Option<&str>) -> Result<Self, CliError> {
        self.idempotency_key = key
            .map(|key| {
                parse_idempotency_key(key)
                    .and_then(|key| MetadataValue::try_from(key).map_err(|error| error.to_string()))
                    .map_err(|problem| CliError::Usage(format!("--idempotency-key: {problem}")))
            })
            .transpose()?;
        Ok(self)
    }
}

impl Interceptor for ActorInterceptor {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        if let Some(actor) = &self.actor {
            request.metadata_mut().insert(ACTOR_METADATA, actor.clone());
        }
        if let Some(authorization) = &self.authorization {
            request
                .metadata_mut()
                .insert("authorization", authorization.clone());
        }
        if let Some(traceparent) = &self.traceparent {
            request
                .metadata_mut()
                .insert("traceparent", traceparent.clone());
        }
        if let Some(key) = &self.idempotency_key {
            request
                .metadata_mut()
                .insert(IDEMPOTENCY_KEY_METADATA, key.clone());
        }
        Ok(request)
    }
}

/// Checks an `--actor` value (and `REDRIVE_ACTOR`): visible ASCII, since it
/// travels as gRPC metadata. Surrounding blanks are dropped; an empty value
/// counts as not given ([`resolve_actor`]).
///
/// # Errors
/// A message saying what is allowed, for clap.
pub fn parse_actor(text: &str) -> Result<String, String> {
    let actor = text.trim();
    if !actor.is_empty() {
        actor_metadata(actor)?;
    }
    Ok(actor.to_owned())
}

fn actor_metadata(actor: &str) -> Result<MetadataValue<Ascii>, String> {
    // `MetadataValue` lets bytes over 0x7f through, which the planner cannot
    // read back as text (and would then record `anonymous`): check first.
    Some(actor)
        .filter(|actor| actor.bytes().all(|byte| matches!(byte, b' '..=b'~')))
        .and_then(|actor| MetadataValue::try_from(actor).ok())
        .ok_or_else(|| {
            format!(
                "actor {actor:?} cannot be sent as gRPC metadata: use visible ASCII \
             (letters, digits, punctuation, spaces)"
            )
        })
}

/// Checks an `--idempotency-key` value as the planner will: 1 to
/// [`MAX_IDEMPOTENCY_KEY_BYTES`] visible ASCII characters (33-126: no space).
///
/// # Errors
/// A message saying what is allowed, for clap.
pub fn parse_idempotency_key(text: &str) -> Result<String, String> {
    if text.is_empty() || text.len() > MAX_IDEMPOTENCY_KEY_BYTES {
        return Err(format!(
            "must be 1 to {MAX_IDEMPOTENCY_KEY_BYTES} bytes, not {}",
            text.len()
        ));
    }
    if let Some(bad) = text.chars().find(|c| !c.is_ascii_graphic()) {
        return Err(format!(
            "{bad:?} is not allowed: a key is visible ASCII without spaces (33-126), e.g. \
             RUN_ID:create"
        ));
    }
    Ok(text.to_owned())
}

/// The actor: `flag` (`--actor` or `REDRIVE_ACTOR`), else `user` (the `USER`
/// environment variable), else [`ANONYMOUS`]; blank values count as absent.
pub fn resolve_actor(flag: Option<&str>, user: Option<&str>) -> String {
    [flag, user]
        .into_iter()
        .flatten()
        .map(str::trim)
        .find(|actor| !actor.is_empty())
        .unwrap_or(ANONYMOUS)
        .to_owned()
}

/// Checks a `--planner` value and answers the URL to dial
/// ([`redrive_proto::tls::planner_url`]: an `http://` or `https://` URL, or
/// `HOST:PORT` alone, which means `http://HOST:PORT`).
///
/// # Errors
/// A message saying what is wrong, for clap.
pub fn parse_planner_url(text: &str) -> Result<String, String> {
    redrive_proto::tls::planner_url(text)
}

/// Connects to the planner at `url`, eagerly, so an unreachable planner is
/// reported once, clearly, before any work is done; every request will carry
/// `actor` (when given), the credentials' token and `idempotency_key` (when
/// given: the planner reads it on the calls that create or change
/// something and ignores it on reads); an `https://` URL uses the
/// credentials' TLS files.
///
/// # Errors
/// [`CliError::Usage`] when `actor` cannot be sent as metadata (it came from
/// `USER`; `--actor` is checked while parsing), or a TLS file is missing or
/// misplaced; [`CliError::Unreachable`] with the transport's reason.
pub async fn connect(
    url: &str,
    actor: Option<&str>,
    credentials: &Credentials,
    idempotency_key: Option<&str>,
) -> Result<Planner, CliError> {
    if credentials.token.is_some() {
        refuse_cleartext_token(url)?;
    }
    let interceptor = ActorInterceptor::with_token(actor, credentials.token.as_deref())
        .map_err(|error| CliError::Usage(format!("{error}; set --actor or REDRIVE_ACTOR")))?
        .with_idempotency_key(idempotency_key)?;
    let unreachable = |cause: String| CliError::Unreachable {
        url: url.to_owned(),
        cause,
    };
    let endpoint = Endpoint::from_shared(url.to_owned())
        .map_err(|error| unreachable(error.to_string()))?
        .connect_timeout(CONNECT_TIMEOUT)
        .http2_keep_alive_interval(KEEP_ALIVE_INTERVAL)
        .keep_alive_timeout(KEEP_ALIVE_TIMEOUT)
        .keep_alive_while_idle(true);
    let endpoint = credentials
        .tls
        .apply(url, endpoint)
        .map_err(CliError::Usage)?;
    let channel = tokio::time::timeout(CONNECT_TIMEOUT, endpoint.connect())
        .await
        .map_err(|_| {
            unreachable(format!(
                "no connection within {} s",
                CONNECT_TIMEOUT.as_secs()
            ))
        })?
        .map_err(|error| unreachable(redrive_proto::settings::error_text(&error)))?;
    Ok(PlannerClient::with_interceptor(channel, interceptor)
        .max_decoding_message_size(MAX_DECODING_MESSAGE_BYTES))
}

/// `error` told in words that say what to change when it comes from a TLS
/// mismatch between this client and the planner at `url`:
///
/// - plain `http://` to a port that speaks TLS: the HTTP/2 client reads the
///   server's TLS records as garbage (`h2 protocol error`, a bare
///   `transport error`, a reset connection: it varies), so when a call over
///   `http://` fails at the transport, the port is asked once for a TLS
///   handshake: `the planner at HOST:PORT speaks TLS: use
///   https://HOST:PORT and --ca FILE`;
/// - `https://` to a port that answers in plain text (rustls: a corrupt
///   message of an invalid content type): say so and name `http://`;
/// - a server certificate not signed by a CA this client trusts
///   (`UnknownIssuer`): say so and name `--ca FILE` (`ca_given`: the CA
///   given did not sign it).
///
/// Anything else is returned as it is. The diagnosis is
/// [`redrive_proto::tls::mismatch`], which the executor shares.
pub async fn explain_tls(error: CliError, url: &str, ca_given: bool) -> CliError {
    let text = match &error {
        CliError::Unreachable { cause, .. } => cause.clone(),
        CliError::Grpc(status) if transport_code(status.code()) => status.message().to_owned(),
        _ => return error,
    };
    match redrive_proto::tls::mismatch(
        url,
        &text,
        "--ca FILE (or REDRIVE_CA, or `ca` in the profile)",
        ca_given,
    )
    .await
    {
        Some(message) => CliError::Tls { message },
        None => lost_at_the_transport(error, url),
    }
}

/// A call that failed in this client's transport, not with a status the
/// planner sent (tonic keeps the transport's error as the status's
/// source): the connection broke, the planner stopped answering (no
/// PING acknowledgement within [`KEEP_ALIVE_TIMEOUT`]), or what answers at
/// the address does not speak gRPC (a database's or Redis's port). A reset
/// of the call's own stream (RFC 9113, `RST_STREAM`: the planner or a proxy
/// refused this one call, say at shutdown, or an answer's headers were too
/// large) keeps its status: the connection stands. Told as
/// [`CliError::Unreachable`] naming `url`, with the transport's reasons.
fn lost_at_the_transport(error: CliError, url: &str) -> CliError {
    match &error {
        CliError::Grpc(status)
            if transport_code(status.code())
                && status.source().is_some()
                && !stream_reset(status) =>
        {
            CliError::Unreachable {
                url: url.to_owned(),
                cause: redrive_proto::settings::error_text_from(
                    status.message().to_owned(),
                    status.source(),
                ),
            }
        }
        _ => error,
    }
}

/// The codes tonic gives a call that failed in the transport (a broken or
/// refused connection, a peer that speaks no gRPC): the ones worth a look at
/// TLS and at the connection.
fn transport_code(code: tonic::Code) -> bool {
    matches!(
        code,
        tonic::Code::Unknown
            | tonic::Code::Internal
            | tonic::Code::Unavailable
            | tonic::Code::Cancelled
    )
}

/// A bearer token travels in clear over `http://`: allowed only to a
/// loopback address (local development), where nobody else can read it.
///
/// # Errors
/// [`CliError::Usage`] naming the host, for `http://` to any other host.
fn refuse_cleartext_token(url: &str) -> Result<(), CliError> {
    let Some(rest) = url.strip_prefix("http://") else {
        return Ok(());
    };
    let authority = rest.split('/').next().unwrap_or_default();
    let host = authority
        .rsplit_once(':')
        .map_or(authority, |(host, _)| host)
        .trim_start_matches('[')
        .trim_end_matches(']');
    let loopback = host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    if loopback {
        Ok(())
    } else {
        Err(CliError::Usage(format!(
            "refusing to send the bearer token in clear text to {host}: use an https:// planner URL (a token over http:// is sent only to a loopback address)"
        )))
    }
}

/// Whether `status` came of a reset of its own HTTP/2 stream (an
/// `h2::Error` in its chain that is one), not of the connection.
fn stream_reset(status: &tonic::Status) -> bool {
    let mut source = status.source();
    while let Some(cause) = source {
        if cause
            .downcast_ref::<h2::Error>()
            .is_some_and(h2::Error::is_reset)
        {
            return true;
        }
        source = cause.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A status the planner sent stays itself; one made of a transport
    /// failure (its source kept) is "cannot reach", exit 69, naming the
    /// address; `https://` to a plain-text port says to use `http://`.
    #[tokio::test]
    async fn transport_failures_name_the_planner() {
        let url = "https://planner.internal:443";
        let sent = explain_tls(
            CliError::Grpc(tonic::Status::internal("a defect")),
            url,
            false,
        )
        .await;
        assert!(matches!(sent, CliError::Grpc(_)), "{sent}");
        let broken =
            tonic::Status::from_error(Box::new(std::io::Error::other("keep-alive timed out")));
        let lost = explain_tls(CliError::Grpc(broken), url, false).await;
        assert_eq!(lost.exit_code(), crate::error::EX_UNAVAILABLE, "{lost}");
        assert!(
            lost.to_string()
                .starts_with("cannot reach the planner at https://planner.internal:443")
                && lost.to_string().contains("keep-alive timed out"),
            "{lost}"
        );
        let plain = CliError::Unreachable {
            url: url.to_owned(),
            cause: "transport error: received corrupt message of type InvalidContentType"
                .to_owned(),
        };
        let told = explain_tls(plain, "https://planner.internal", false)
            .await
            .to_string();
        assert!(
            told.starts_with("the planner at planner.internal:443 does not speak TLS: use http://planner.internal:443"),
            "{told}"
        );
        assert_eq!(
            redrive_proto::tls::host_and_port("http://[::1]/"),
            "[::1]:80"
        );
        assert_eq!(
            redrive_proto::tls::host_and_port("https://h:8443"),
            "h:8443"
        );
    }

    /// A server that resets the call's own stream (`RST_STREAM`
    /// `REFUSED_STREAM`, as a planner shutting down does) leaves the
    /// connection standing: the status stays the planner's, not "cannot
    /// reach".
    #[tokio::test]
    async fn a_reset_stream_is_not_a_lost_planner() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                tokio::spawn(async move {
                    // (The TLS probe of an `http://` failure is no HTTP/2.)
                    let Ok(mut connection) = h2::server::handshake(socket).await else {
                        return;
                    };
                    while let Some(Ok((_, mut respond))) = connection.accept().await {
                        respond.send_reset(h2::Reason::REFUSED_STREAM);
                    }
                });
            }
        });
        let channel = Endpoint::from_shared(url.clone())
            .unwrap()
            .connect()
            .await
            .unwrap();
        let mut client = redrive_proto::v1::planner_client::PlannerClient::new(channel);
        let status = client
            .list_plans(redrive_proto::v1::ListPlansRequest::default())
            .await
            .unwrap_err();
        let told = explain_tls(CliError::Grpc(status), &url, false).await;
        assert!(matches!(told, CliError::Grpc(_)), "{told}");
    }

    #[test]
    fn a_bearer_token_goes_in_clear_text_only_to_loopback() {
        for url in [
            "http://127.0.0.1:50051",
            "http://localhost:50051",
            "http://[::1]:50051",
            "https://planner.example:443",
        ] {
            assert!(refuse_cleartext_token(url).is_ok(), "{url}");
        }
        for url in ["http://192.0.2.2:50994", "http://planner.example:50051/"] {
            let refused = refuse_cleartext_token(url).unwrap_err();
            assert!(
                refused.to_string().contains("clear text"),
                "{url}: {refused}"
            );
        }
    }

    #[test]
    fn traceparents_are_checked() {
        assert!(is_traceparent(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        ));
        assert!(!is_traceparent(
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01"
        ));
        assert!(!is_traceparent(
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01"
        ));
        assert!(!is_traceparent("garbage"));
        assert!(is_traceparent(invocation_traceparent()));
    }

    #[test]
    fn planner_urls_need_a_scheme() {
        assert_eq!(parse_planner_url(DEFAULT_PLANNER).unwrap(), DEFAULT_PLANNER);
        assert!(parse_planner_url("https://planner.internal:443").is_ok());
        // HOST:PORT alone, as grpcurl takes it: plain http.
        assert_eq!(
            parse_planner_url("127.0.0.1:50051").unwrap(),
            "http://127.0.0.1:50051"
        );
        assert_eq!(
            parse_planner_url("planner.internal:50051").unwrap(),
            "http://planner.internal:50051"
        );
        assert!(parse_planner_url("http://bad host").is_err());
        assert!(parse_planner_url("ftp://planner:21").is_err());
        assert!(parse_planner_url("").is_err());
    }

    #[test]
    fn the_actor_falls_back_to_user_then_anonymous() {
        assert_eq!(resolve_actor(Some("alice"), Some("bob")), "alice");
        assert_eq!(resolve_actor(Some("  "), Some("bob")), "bob");
        assert_eq!(resolve_actor(None, Some("bob")), "bob");
        assert_eq!(resolve_actor(None, Some("")), ANONYMOUS);
        assert_eq!(resolve_actor(None, None), ANONYMOUS);
    }

    #[test]
    fn actors_must_be_visible_ascii() {
        assert_eq!(parse_actor(" alice@ops ").unwrap(), "alice@ops");
        assert_eq!(parse_actor("").unwrap(), "");
        assert!(parse_actor("José").unwrap_err().contains("visible ASCII"));
        assert!(parse_actor("a\nb").is_err());
        assert!(ActorInterceptor::new("José").is_err());
    }

    #[test]
    fn the_interceptor_sets_the_actor_metadata() {
        let mut interceptor = ActorInterceptor::new("alice").unwrap();
        let request = interceptor.call(Request::new(())).unwrap();
        assert_eq!(request.metadata().get(ACTOR_METADATA).unwrap(), "alice");
    }

    #[tokio::test]
    async fn nothing_listening_is_unreachable() {
        // Bind then drop: the port is free, so the connection is refused.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        drop(listener);
        let error = connect(&url, Some("ops"), &Credentials::default(), None)
            .await
            .unwrap_err();
        assert_eq!(error.exit_code(), crate::error::EX_UNAVAILABLE);
        assert!(error.to_string().contains(&url), "{error}");
    }
}
