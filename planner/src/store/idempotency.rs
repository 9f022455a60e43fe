//! Idempotency keys: the answers of mutating calls kept under the caller
//! and the key (migration 0032), for [`crate::edge::idempotency`].

use std::time::Duration;

use super::{Store, StoreError};

/// Where a call with an idempotency key stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reservation {
    /// This call runs the request: the key was new, expired, or its first
    /// call never finished (its planner died) and was taken over.
    Run,
    /// The first call with this key and request answered this (protobuf).
    Answered(Vec<u8>),
    /// The first call with this key and request is still running.
    Running,
    /// The first call with this key and request failed in a way that may
    /// come after its effect: this error.
    Failed(String),
    /// The key was used for another request: this method, at this time.
    OtherRequest {
        /// The first request's method.
        method: String,
        /// When it was made.
        at: chrono::DateTime<chrono::Utc>,
    },
}

/// A stored key: method, request hash, answer, failure, time.
type KeyRow = (
    String,
    Vec<u8>,
    Option<Vec<u8>>,
    Option<String>,
    chrono::DateTime<chrono::Utc>,
);

/// How a keyed call ended ([`Store::finish_idempotency_key`]).
#[derive(Debug, Clone, Copy)]
pub enum KeyEnd<'a> {
    /// Its answer (protobuf).
    Answer(&'a [u8]),
    /// An error that may come after its effect.
    Failure(&'a str),
}

impl Store {
    /// Reserves `key` of `principal` for `method` with a request hashing to
    /// `request_sha256`. A key older than `retention` counts as new; one
    /// whose first call has run longer than `takeover` without an answer
    /// (its planner died) is taken over by the same request.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn reserve_idempotency_key(
        &self,
        principal: &str,
        key: &str,
        method: &str,
        request_sha256: &[u8],
        takeover: Duration,
        retention: Duration,
    ) -> Result<Reservation, StoreError> {
        let reserved: Option<bool> = sqlx::query_scalar(
            "INSERT INTO idempotency_keys (principal, key, method, request_sha256) \
             VALUES ($1, $2, $3, $4) \
             ON CONFLICT (principal, key) DO UPDATE SET method = EXCLUDED.method, \
                 request_sha256 = EXCLUDED.request_sha256, response = NULL, created_at = now(), \
                 completed_at = NULL \
             WHERE idempotency_keys.created_at < now() - make_interval(secs => $6) \
                OR (idempotency_keys.response IS NULL AND idempotency_keys.failure IS NULL \
                    AND idempotency_keys.request_sha256 = EXCLUDED.request_sha256 \
                    AND idempotency_keys.created_at < now() - make_interval(secs => $5)) \
             RETURNING true",
        )
        .bind(principal)
        .bind(key)
        .bind(method)
        .bind(request_sha256)
        .bind(takeover.as_secs_f64())
        .bind(retention.as_secs_f64())
        .fetch_optional(self.pool())
        .await?;
        if reserved.is_some() {
            return Ok(Reservation::Run);
        }
        let (first_method, first_sha256, response, failure, at): KeyRow = sqlx::query_as(
            "SELECT method, request_sha256, response, failure, created_at FROM idempotency_keys \
             WHERE principal = $1 AND key = $2",
        )
        .bind(principal)
        .bind(key)
        .fetch_one(self.pool())
        .await?;
        Ok(if first_sha256 != request_sha256 {
            Reservation::OtherRequest {
                method: first_method,
                at,
            }
        } else if let Some(response) = response {
            Reservation::Answered(response)
        } else if let Some(failure) = failure {
            Reservation::Failed(failure)
        } else {
            Reservation::Running
        })
    }

    /// Keeps how the call that reserved `key` of `principal` ended: its
    /// answer, or an error that may come after its effect.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn finish_idempotency_key(
        &self,
        principal: &str,
        key: &str,
        end: KeyEnd<'_>,
    ) -> Result<(), StoreError> {
        let (response, failure) = match end {
            KeyEnd::Answer(response) => (Some(response), None),
            KeyEnd::Failure(failure) => (None, Some(failure)),
        };
        sqlx::query(
            "UPDATE idempotency_keys SET response = $3, failure = $4, completed_at = now() \
             WHERE principal = $1 AND key = $2",
        )
        .bind(principal)
        .bind(key)
        .bind(response)
        .bind(failure)
        .execute(self.pool())
        .await?;
        Ok(())
    }

    /// Frees `key` of `principal` after its call failed: an error is not
    /// kept, so a retry runs the request again.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn release_idempotency_key(
        &self,
        principal: &str,
        key: &str,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "DELETE FROM idempotency_keys WHERE principal = $1 AND key = $2 AND response IS NULL",
        )
        .bind(principal)
        .bind(key)
        .execute(self.pool())
        .await?;
        Ok(())
    }

    /// Deletes the keys older than `retention`; returns how many.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn expire_idempotency_keys(&self, retention: Duration) -> Result<u64, StoreError> {
        Ok(sqlx::query(
            "DELETE FROM idempotency_keys WHERE created_at < now() - make_interval(secs => $1)",
        )
        .bind(retention.as_secs_f64())
        .execute(self.pool())
        .await?
        .rows_affected())
    }
}
