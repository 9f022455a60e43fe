//! [`RateLimitLayer`]: requests per caller, GCRA from `governor`; it also
//! moves a connection to the authenticated pool at its first authenticated
//! request.

use std::{
    future::Future,
    num::NonZeroU32,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use tonic::{Status, codegen::http};
use tracing::warn;

use super::{
    Connections, DEFAULT_REQUEST_BURST, DEFAULT_REQUESTS_PER_SECOND, Throttled, http_caller_key,
    http_peer,
};

/// A request rate per caller ([`caller_key`](super::caller_key)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestRate {
    /// Requests per second, sustained.
    pub per_second: NonZeroU32,
    /// Requests above the rate allowed at once.
    pub burst: NonZeroU32,
}

impl Default for RequestRate {
    fn default() -> Self {
        Self {
            per_second: NonZeroU32::new(DEFAULT_REQUESTS_PER_SECOND).unwrap_or(NonZeroU32::MIN),
            burst: NonZeroU32::new(DEFAULT_REQUEST_BURST).unwrap_or(NonZeroU32::MIN),
        }
    }
}

/// A tower layer that answers `RESOURCE_EXHAUSTED` to a caller over its
/// [`RequestRate`], before the request reaches a service. Placed inside the
/// authentication layer, so that it counts per principal. Health checks are
/// not counted.
#[derive(Clone)]
pub struct RateLimitLayer {
    limiter: Arc<DefaultKeyedRateLimiter<String>>,
    refused: Arc<Throttled>,
    rate: RequestRate,
    connections: Connections,
}

impl std::fmt::Debug for RateLimitLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("rate", &self.rate)
            .finish_non_exhaustive()
    }
}

impl RateLimitLayer {
    /// A limiter of `rate` per caller, moving the connections of the
    /// requests it sees to the authenticated pool of `connections`.
    pub fn new(rate: RequestRate, connections: Connections) -> Self {
        let quota = Quota::per_second(rate.per_second).allow_burst(rate.burst);
        Self {
            limiter: Arc::new(RateLimiter::keyed(quota)),
            refused: Arc::new(Throttled::default()),
            rate,
            connections,
        }
    }

    /// `Err` with the status to answer when `key` is over its rate. Forgets
    /// callers that are back to a full bucket now and then, so the table
    /// does not grow with every caller ever seen.
    fn check(&self, key: &str) -> Result<(), Status> {
        if self.limiter.len() > 10_000 {
            self.limiter.retain_recent();
        }
        match self.limiter.check_key(&key.to_owned()) {
            Ok(()) => Ok(()),
            Err(_) => {
                if let Some(refused) = self.refused.count() {
                    warn!(caller = key, refused, rate = ?self.rate, "requests refused over the rate limit");
                }
                Err(Status::resource_exhausted(format!(
                    "rate limit: {} requests per second (burst {}) per caller; retry later",
                    self.rate.per_second, self.rate.burst
                )))
            }
        }
    }
}

impl<S> tower::Layer<S> for RateLimitLayer {
    type Service = RateLimited<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimited {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service of [`RateLimitLayer`].
#[derive(Clone, Debug)]
pub struct RateLimited<S> {
    inner: S,
    layer: RateLimitLayer,
}

impl<S, B> tower::Service<http::Request<B>> for RateLimited<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<tonic::body::Body>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future =
        Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send + 'static>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let health = request.uri().path().starts_with("/grpc.health.v1.");
        // Inside authentication: this request passed it. Health checks
        // pass without credentials, so they do not authenticate a connection.
        if !health
            && let Some(peer) = http_peer(request.extensions())
            && let Err(status) = self.layer.connections.authenticate(peer)
        {
            return Box::pin(async move { Ok(status.into_http()) });
        }
        if !health && let Err(status) = self.layer.check(&http_caller_key(request.extensions())) {
            return Box::pin(async move { Ok(status.into_http()) });
        }
        Box::pin(self.inner.call(request))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::edge::admission::ConnectionLimits;

    #[test]
    fn a_caller_over_its_rate_is_refused_and_others_are_not() {
        let layer = RateLimitLayer::new(
            RequestRate {
                per_second: NonZeroU32::MIN,
                burst: NonZeroU32::new(2).unwrap(),
            },
            Connections::new(ConnectionLimits::default()),
        );
        assert!(layer.check("principal:a").is_ok());
        assert!(layer.check("principal:a").is_ok());
        let refused = layer.check("principal:a").unwrap_err();
        assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
        assert!(
            refused
                .message()
                .contains("1 requests per second (burst 2)"),
            "{}",
            refused.message()
        );
        assert!(layer.check("principal:b").is_ok(), "per caller");
    }
}
