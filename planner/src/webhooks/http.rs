//! The webhook HTTP client: one HTTP/1.1 `POST` per connection, over TLS
//! (rustls with ring, the platform's roots, as tonic's `tls-native-roots`)
//! for `https://`, in the clear for `http://` (loopback only:
//! [`super::check_url`]). No redirect is followed (the specification: a 3xx
//! is a failure).

use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, StatusCode, Uri};
use hyper_util::rt::TokioIo;
use tokio::{
    io::{AsyncRead, AsyncWrite},
    net::TcpStream,
};
use tokio_rustls::{
    TlsConnector,
    rustls::{ClientConfig, RootCertStore, crypto::ring, pki_types::ServerName},
};

/// Posts webhook bodies.
#[derive(Clone)]
pub(crate) struct Client {
    tls: TlsConnector,
}

impl Client {
    /// A client trusting the platform's root certificates (read once
    /// here; unreadable ones are skipped, as tonic does).
    pub(crate) fn new() -> Self {
        let mut roots = RootCertStore::empty();
        roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
        let config = ClientConfig::builder_with_provider(Arc::new(ring::default_provider()))
            .with_safe_default_protocol_versions()
            .expect("ring supports the default protocol versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
        Self {
            tls: TlsConnector::from(Arc::new(config)),
        }
    }

    /// Posts `body` (of `content_type`) to `uri` with `headers`; the
    /// answer's status.
    ///
    /// # Errors
    /// The connection, TLS handshake or exchange failing, as text (the
    /// caller bounds the time).
    pub(crate) async fn post(
        &self,
        uri: &Uri,
        content_type: &str,
        headers: &[(&str, String)],
        body: String,
    ) -> Result<StatusCode, String> {
        let https = uri.scheme_str() == Some("https");
        let host = uri
            .host()
            .unwrap_or_default()
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
        let mut request = Request::post(uri.path_and_query().map_or("/", |path| path.as_str()))
            .header(
                hyper::header::HOST,
                uri.authority().map_or("", |a| a.as_str()),
            )
            .header(hyper::header::CONTENT_TYPE, content_type)
            .header(hyper::header::USER_AGENT, "redrive-planner");
        for (name, value) in headers {
            request = request.header(*name, value.as_str());
        }
        let request = request
            .body(Full::new(Bytes::from(body)))
            .map_err(|error| format!("building the request: {error}"))?;
        let tcp = TcpStream::connect((host.as_str(), port))
            .await
            .map_err(|error| format!("connecting to {host}:{port}: {error}"))?;
        let _ = tcp.set_nodelay(true);
        if https {
            let name = ServerName::try_from(host.clone())
                .map_err(|error| format!("{host} is not a TLS server name: {error}"))?;
            let tls = self
                .tls
                .connect(name, tcp)
                .await
                .map_err(|error| format!("TLS with {host}:{port}: {error}"))?;
            send(tls, request).await
        } else {
            send(tcp, request).await
        }
    }
}

/// Sends `request` over `io` (HTTP/1.1) and answers its status; the body of
/// the answer is not read.
async fn send<S>(io: S, request: Request<Full<Bytes>>) -> Result<StatusCode, String>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(|error| format!("HTTP handshake: {error}"))?;
    let driving = tokio::spawn(connection);
    let answer = sender.send_request(request).await;
    driving.abort();
    answer
        .map(|response| response.status())
        .map_err(|error| format!("HTTP exchange: {error}"))
}
