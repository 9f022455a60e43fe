//! [`AuthLayer`]: the tower layer in front of every service; each request
//! passes [`Authenticator::admit`] first.

use std::{
    sync::Arc,
    task::{Context, Poll},
};

use futures::future::{Either, Ready, ready};
use tonic::codegen::http;
use tower::{Layer, Service};

use super::Authenticator;

/// The tower layer: every request passes [`Authenticator::admit`] first.
/// With `None` (authentication off) it lets everything through.
#[derive(Debug, Clone)]
pub struct AuthLayer {
    authenticator: Option<Arc<Authenticator>>,
}

impl AuthLayer {
    /// A layer checking with `authenticator`, or a pass-through.
    pub fn new(authenticator: Option<Arc<Authenticator>>) -> Self {
        Self { authenticator }
    }
}

impl<S> Layer<S> for AuthLayer {
    type Service = AuthService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        AuthService {
            inner,
            authenticator: self.authenticator.clone(),
        }
    }
}

/// [`AuthLayer`]'s service.
#[derive(Debug, Clone)]
pub struct AuthService<S> {
    inner: S,
    authenticator: Option<Arc<Authenticator>>,
}

impl<S, RequestBody, ResponseBody> Service<http::Request<RequestBody>> for AuthService<S>
where
    S: Service<http::Request<RequestBody>, Response = http::Response<ResponseBody>>,
    ResponseBody: Default,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Either<S::Future, Ready<Result<S::Response, S::Error>>>;

    fn poll_ready(&mut self, context: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(context)
    }

    fn call(&mut self, mut request: http::Request<RequestBody>) -> Self::Future {
        if let Some(authenticator) = &self.authenticator {
            let path = request.uri().path().to_owned();
            let (parts, body) = request.into_parts();
            let mut parts = parts;
            if let Err(status) = authenticator.admit(&path, &parts.headers, &mut parts.extensions) {
                return Either::Right(ready(Ok(status.into_http())));
            }
            request = http::Request::from_parts(parts, body);
        }
        Either::Left(self.inner.call(request))
    }
}
