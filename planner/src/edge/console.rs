//! The operator console's page ([`ConsoleLayer`]): the built assets of
//! `console/dist/` (compiled into the binary: no CDN, nothing fetched at run
//! time), served on the API's own listener to `GET` and `HEAD`; every other
//! request (gRPC and grpc-web are `POST`) goes on to the services. The page
//! calls the same `redrive.v1.Planner` API over grpc-web
//! ([`tonic_web::GrpcWebLayer`]), under the same TLS, authentication, roles
//! and caller limits as any client (docs/console.md).
//!
//! Every answer carries a strict Content-Security-Policy (no inline script
//! or style, no framing, connections to this origin only), and the headers
//! that forbid framing and content sniffing (OWASP Secure Headers). No cookie
//! is set or read: a call is authorized by its `authorization` header only,
//! which a cross-site request cannot add (no CSRF).
//!
//! Without authentication, a page of any site whose name resolves to this
//! machine (DNS rebinding) would be the console's own origin, and every call
//! would be allowed. So then a browser's request (one with `Origin` or
//! `Sec-Fetch-*` headers, or a `GET`) is answered only when its `Host` is an
//! IP address or `localhost`: `403 Forbidden` otherwise. gRPC clients send
//! neither header and are not affected.

use std::task::{Context, Poll};

use futures::future::{Either, Ready, ready};
use tonic::codegen::http::{self, HeaderValue, Method, StatusCode, header};
use tower::{Layer, Service};

/// The Content-Security-Policy of every console answer (W3C CSP Level 3):
/// scripts, styles and connections from this origin only, no inline code,
/// no plugins, no framing (`frame-ancestors 'none'`), no `<base>`, no form
/// posts.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
    style-src 'self'; img-src 'self' data:; connect-src 'self'; font-src 'self'; \
    frame-ancestors 'none'; base-uri 'none'; form-action 'none'";

/// One built asset: its path, content type and bytes.
struct Asset {
    path: &'static str,
    content_type: &'static str,
    bytes: &'static [u8],
}

/// The built console (`console/dist/`, made by `npm run build` in
/// `console/`; docs/console.md).
const ASSETS: &[Asset] = &[
    Asset {
        path: "/",
        content_type: "text/html; charset=utf-8",
        bytes: include_bytes!("../../../console/dist/index.html"),
    },
    Asset {
        path: "/index.html",
        content_type: "text/html; charset=utf-8",
        bytes: include_bytes!("../../../console/dist/index.html"),
    },
    Asset {
        path: "/app.js",
        content_type: "text/javascript; charset=utf-8",
        bytes: include_bytes!("../../../console/dist/app.js"),
    },
    Asset {
        path: "/app.css",
        content_type: "text/css; charset=utf-8",
        bytes: include_bytes!("../../../console/dist/app.css"),
    },
];

/// The answer to a `GET` or `HEAD` of `path`: the asset with its security
/// headers, else `404 Not Found` (with the same headers).
fn answer<B: Default + From<&'static [u8]>>(method: &Method, path: &str) -> http::Response<B> {
    let asset = ASSETS.iter().find(|asset| asset.path == path);
    let (status, content_type, bytes): (_, _, &'static [u8]) = match asset {
        Some(asset) => (StatusCode::OK, asset.content_type, asset.bytes),
        None => (
            StatusCode::NOT_FOUND,
            "text/plain; charset=utf-8",
            b"not found: the console is at /\n",
        ),
    };
    let body = if *method == Method::HEAD {
        B::default()
    } else {
        B::from(bytes)
    };
    let mut response = http::Response::new(body);
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    headers.insert(
        "cross-origin-opener-policy",
        HeaderValue::from_static("same-origin"),
    );
    // The page is small and changes with the binary: always revalidate.
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

/// Whether `host` (a `Host` header or an authority, `name[:port]`) names
/// the machine by address: an IP literal (`127.0.0.1`, `[::1]`) or
/// `localhost`, which no other site's DNS can rebind.
pub fn is_address_host(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or_default(),
        None => match host.rsplit_once(':') {
            Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
            _ => host,
        },
    };
    name.eq_ignore_ascii_case("localhost") || name.parse::<std::net::IpAddr>().is_ok()
}

/// Whether `request` comes from a browser: a `GET` or `HEAD`, or a request
/// with the `Origin` or `Sec-Fetch-Site` header browsers add (WHATWG Fetch).
fn from_browser<B>(request: &http::Request<B>) -> bool {
    let method = request.method();
    *method == Method::GET
        || *method == Method::HEAD
        || request.headers().contains_key(header::ORIGIN)
        || request.headers().contains_key("sec-fetch-site")
}

/// The host `request` was sent to: `:authority` (HTTP/2), else `Host`.
fn host_of<B>(request: &http::Request<B>) -> String {
    request
        .uri()
        .authority()
        .map(|authority| authority.as_str().to_owned())
        .or_else(|| {
            request
                .headers()
                .get(header::HOST)
                .and_then(|host| host.to_str().ok())
                .map(str::to_owned)
        })
        .unwrap_or_default()
}

/// The tower layer serving the console to `GET` and `HEAD`.
#[derive(Debug, Clone, Copy, Default)]
pub struct ConsoleLayer {
    /// Refuse browsers' requests to a host that is not an address (the
    /// planner runs without authentication).
    address_hosts_only: bool,
}

impl ConsoleLayer {
    /// The layer; `authenticated`: whether callers must authenticate (when
    /// not, browsers are answered at an address or `localhost` only).
    pub fn new(authenticated: bool) -> Self {
        Self {
            address_hosts_only: !authenticated,
        }
    }
}

impl<S> Layer<S> for ConsoleLayer {
    type Service = ConsoleService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ConsoleService {
            inner,
            address_hosts_only: self.address_hosts_only,
        }
    }
}

/// [`ConsoleLayer`]'s service.
#[derive(Debug, Clone)]
pub struct ConsoleService<S> {
    inner: S,
    address_hosts_only: bool,
}

/// `403 Forbidden` for a browser's request to `host` of a planner without
/// authentication.
fn rebinding_refused(host: &str) -> http::Response<tonic::body::Body> {
    let text = format!(
        "this planner runs without authentication: browsers are answered at an IP address or localhost only, not at {host:?} (DNS rebinding; docs/console.md)\n"
    );
    let mut response = http::Response::new(tonic::body::Body::new(http_body_util::Full::new(
        bytes::Bytes::from(text),
    )));
    *response.status_mut() = StatusCode::FORBIDDEN;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

impl<S, RequestBody> Service<http::Request<RequestBody>> for ConsoleService<S>
where
    S: Service<http::Request<RequestBody>, Response = http::Response<tonic::body::Body>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Either<S::Future, Ready<Result<S::Response, S::Error>>>;

    fn poll_ready(&mut self, context: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(context)
    }

    fn call(&mut self, request: http::Request<RequestBody>) -> Self::Future {
        if self.address_hosts_only && from_browser(&request) {
            let host = host_of(&request);
            if !is_address_host(&host) {
                return Either::Right(ready(Ok(rebinding_refused(&host))));
            }
        }
        let method = request.method();
        if *method == Method::GET || *method == Method::HEAD {
            let response = answer::<AssetBody>(method, request.uri().path());
            return Either::Right(ready(Ok(
                response.map(|body| tonic::body::Body::new(body.0))
            )));
        }
        Either::Left(self.inner.call(request))
    }
}

/// An asset's bytes as a response body.
#[derive(Default)]
struct AssetBody(http_body_util::Full<bytes::Bytes>);

impl From<&'static [u8]> for AssetBody {
    fn from(bytes: &'static [u8]) -> Self {
        Self(http_body_util::Full::new(bytes::Bytes::from_static(bytes)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_addresses_and_localhost_are_address_hosts() {
        for host in [
            "127.0.0.1",
            "127.0.0.1:50151",
            "[::1]:50151",
            "[::1]",
            "localhost",
            "LOCALHOST:8080",
            "10.1.2.3:443",
        ] {
            assert!(is_address_host(host), "{host}");
        }
        for host in [
            "rebind.evil.example:50472",
            "evil.example",
            "localhost.evil.example",
            "127.0.0.1.nip.io:50151",
            "",
            "[evil]:1",
        ] {
            assert!(!is_address_host(host), "{host}");
        }
    }

    #[test]
    fn every_answer_forbids_inline_code_and_framing() {
        for path in ["/", "/app.js", "/nothing-here"] {
            let response = answer::<AssetBody>(&Method::GET, path);
            let headers = response.headers();
            let policy = headers[header::CONTENT_SECURITY_POLICY].to_str().unwrap();
            assert!(policy.contains("script-src 'self';"), "{policy}");
            assert!(!policy.contains("unsafe-inline"), "{policy}");
            assert!(policy.contains("frame-ancestors 'none'"), "{policy}");
            assert_eq!(headers[header::X_FRAME_OPTIONS], "DENY");
            assert_eq!(headers[header::X_CONTENT_TYPE_OPTIONS], "nosniff");
        }
        assert_eq!(
            answer::<AssetBody>(&Method::GET, "/").status(),
            StatusCode::OK
        );
        assert_eq!(
            answer::<AssetBody>(&Method::GET, "/app.js").headers()[header::CONTENT_TYPE],
            "text/javascript; charset=utf-8"
        );
        assert_eq!(
            answer::<AssetBody>(&Method::GET, "/etc/passwd").status(),
            StatusCode::NOT_FOUND
        );
    }
}
