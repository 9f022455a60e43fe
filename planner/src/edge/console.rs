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

/// The tower layer serving the console to `GET` and `HEAD`.
#[derive(Debug, Clone, Copy, Default)]
pub struct ConsoleLayer;

impl<S> Layer<S> for ConsoleLayer {
    type Service = ConsoleService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ConsoleService { inner }
    }
}

/// [`ConsoleLayer`]'s service.
#[derive(Debug, Clone)]
pub struct ConsoleService<S> {
    inner: S,
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
