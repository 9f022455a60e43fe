//! [`IngestBudgetLayer`]: the tower layer that charges the messages of
//! `IngestDeadLetters` requests to the budget; other requests pass
//! untouched.

use std::{
    sync::Arc,
    task::{Context, Poll},
};

use tonic::codegen::http;

use super::{INGEST_PATH, IngestBudget, Reservations, body::ChargedBody};

/// A tower layer charging the messages of `IngestDeadLetters` requests to
/// an [`IngestBudget`]; other requests pass untouched.
#[derive(Debug, Clone)]
pub struct IngestBudgetLayer {
    budget: IngestBudget,
}

impl IngestBudgetLayer {
    /// The layer of `budget`.
    pub fn new(budget: IngestBudget) -> Self {
        Self { budget }
    }
}

impl<S> tower::Layer<S> for IngestBudgetLayer {
    type Service = IngestBudgeted<S>;

    fn layer(&self, inner: S) -> Self::Service {
        IngestBudgeted {
            inner,
            budget: self.budget.clone(),
        }
    }
}

/// The service of [`IngestBudgetLayer`].
#[derive(Debug, Clone)]
pub struct IngestBudgeted<S> {
    inner: S,
    budget: IngestBudget,
}

impl<S> tower::Service<http::Request<tonic::body::Body>> for IngestBudgeted<S>
where
    S: tower::Service<http::Request<tonic::body::Body>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        if request.uri().path() != INGEST_PATH {
            return self.inner.call(request);
        }
        let reservations = Reservations::default();
        let caller: Arc<str> = crate::edge::admission::http_caller_key(request.extensions()).into();
        let (mut parts, body) = request.into_parts();
        parts.extensions.insert(reservations.clone());
        let body = tonic::body::Body::new(ChargedBody::new(
            body,
            self.budget.clone(),
            reservations,
            caller,
        ));
        self.inner.call(http::Request::from_parts(parts, body))
    }
}
