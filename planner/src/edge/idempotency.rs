//! Idempotency keys on the calls that create or change something
//! (docs/api.md, "Idempotency keys"), after the IETF draft
//! "The Idempotency-Key HTTP Header Field" (draft-ietf-httpapi-idempotency-key-header):
//! a caller sends request metadata `idempotency-key`; the first call with a
//! key runs and its answer is kept for [`RETENTION`] under the caller (the
//! recorded actor) and the key. A retry with the same key and the same
//! request gets that answer, not a second plan; while the first call still
//! runs it gets `UNAVAILABLE` (retry); the same key with another request is
//! `FAILED_PRECONDITION`. A refusal (a bad request, an unknown id, a state
//! that forbids it) is not kept: a retry after one runs the request again;
//! any other error (`UNAVAILABLE`, `INTERNAL`, ...), which may come after the
//! call's commit, is kept, and a retry is told to look before using a new
//! key, except for a call that changes nothing (`ERRORS_NOT_KEPT`). The call
//! runs detached: a caller that times out does not cut it.

use std::time::Duration;

use prost::Message;
use sha2::{Digest, Sha256};
use tonic::{Request, Response, Status};

use crate::{
    error::Error,
    store::{
        Store,
        idempotency::{KeyEnd, Reservation},
    },
};

/// The request metadata carrying the key.
pub const METADATA_KEY: &str = "idempotency-key";
/// How long an answer is kept (a key older than this is new again).
pub const RETENTION: Duration = Duration::from_secs(24 * 3600);
/// A first call without an answer after this long is taken over by a retry
/// with the same request: its planner died before it could answer. Counted
/// from the first call alone: a precheck of a large selection runs well
/// within it, a `ReplayDeadLetter` waiting its longest (10 minutes) does not
/// (docs/api.md says to key it only with a shorter wait).
pub const TAKEOVER_AFTER: Duration = Duration::from_secs(600);
/// Longest key, in bytes.
pub const MAX_KEY_BYTES: usize = 255;
/// The calls whose every error frees the key, as a refusal does: a
/// precheck changes no dead letter and no plan (a second run stores a second
/// report, no more), so a retry after its hook was down runs it again instead
/// of being held off for [`RETENTION`].
const ERRORS_NOT_KEPT: &[&str] = &["RunPrecheck"];

/// The key `request` carries, if any.
///
/// # Errors
/// `InvalidArgument` naming `idempotency-key` for an empty or too long key,
/// or one outside visible ASCII.
pub fn key_of<T>(request: &Request<T>) -> Result<Option<String>, Error> {
    let Some(value) = request.metadata().get(METADATA_KEY) else {
        return Ok(None);
    };
    let key = value
        .to_str()
        .ok()
        .filter(|key| key.bytes().all(|byte| byte.is_ascii_graphic()))
        .ok_or_else(|| Error::invalid(METADATA_KEY, "must be visible ASCII (33-126)"))?;
    if key.is_empty() || key.len() > MAX_KEY_BYTES {
        return Err(Error::invalid(
            METADATA_KEY,
            format!("must be 1 to {MAX_KEY_BYTES} bytes, not {}", key.len()),
        ));
    }
    Ok(Some(key.to_owned()))
}

/// Runs `call` on `request` once per idempotency key of `principal`: without
/// a key it just runs; with one, see the module docs. `method` names the
/// call (`CreatePlan`); the request is identified by the SHA-256 of the
/// method and its protobuf encoding (deterministic: maps are B-trees).
///
/// # Errors
/// `call`'s; `InvalidArgument` for a bad key; `FailedPrecondition` for a key
/// used with another request; `Unavailable` while the first call runs;
/// store errors.
pub async fn once<Req, Resp, F, Fut>(
    store: &Store,
    principal: &str,
    method: &'static str,
    request: Request<Req>,
    call: F,
) -> Result<Response<Resp>, Status>
where
    Req: Message + 'static,
    Resp: Message + Default + 'static,
    F: FnOnce(Request<Req>) -> Fut + Send + 'static,
    Fut: Future<Output = Result<Response<Resp>, Status>> + Send + 'static,
{
    let Some(key) = key_of(&request)? else {
        return call(request).await;
    };
    // Detached: a caller that times out or goes away does not cut the call
    // between its commit and keeping its answer, so its retry gets the answer.
    let (store, principal) = (store.clone(), principal.to_owned());
    tokio::spawn(tracing::Instrument::in_current_span(async move {
        keyed(&store, &principal, &key, method, request, call).await
    }))
    .await
    .map_err(|error| Status::internal(format!("{method} task failed: {error}")))?
}

/// [`once`] with `key`, in its detached task.
async fn keyed<Req, Resp, F, Fut>(
    store: &Store,
    principal: &str,
    key: &str,
    method: &'static str,
    request: Request<Req>,
    call: F,
) -> Result<Response<Resp>, Status>
where
    Req: Message,
    Resp: Message + Default,
    F: FnOnce(Request<Req>) -> Fut,
    Fut: Future<Output = Result<Response<Resp>, Status>>,
{
    let key = key.to_owned();
    let mut hash = Sha256::new();
    hash.update(method.as_bytes());
    hash.update([0]);
    hash.update(request.get_ref().encode_to_vec());
    let sha256 = hash.finalize();
    match store
        .reserve_idempotency_key(principal, &key, method, &sha256, TAKEOVER_AFTER, RETENTION)
        .await
        .map_err(Error::from)?
    {
        Reservation::Run => {}
        Reservation::Answered(bytes) => {
            let answer = Resp::decode(bytes.as_slice()).map_err(|error| {
                Status::internal(format!(
                    "the kept answer of {key:?} does not decode: {error}"
                ))
            })?;
            return Ok(Response::new(answer));
        }
        Reservation::Running => {
            return Err(Error::Unavailable(format!(
                "a {method} call with idempotency key {key:?} has not answered: it is still \
                 running (a retry gets its answer once it ends), or its planner stopped before \
                 answering (a retry {} minutes after that first call runs it again)",
                TAKEOVER_AFTER.as_secs() / 60
            ))
            .into());
        }
        Reservation::Failed(failure) => {
            return Err(Error::FailedPrecondition(format!(
                "the first {method} call with idempotency key {key:?} failed after it may have \
                 taken effect ({failure}): look at what it would have made or changed (redrivectl \
                 plan list, plan status) before trying again with a new key"
            ))
            .into());
        }
        Reservation::OtherRequest { method, at } => {
            return Err(Error::FailedPrecondition(format!(
                "idempotency key {key:?} was used for another request ({method} at {}): a new \
                 request needs a new key",
                redrive_proto::time::rfc3339(at)
            ))
            .into());
        }
    }
    match call(request).await {
        Ok(response) => {
            let bytes = response.get_ref().encode_to_vec();
            if let Err(error) = store
                .finish_idempotency_key(principal, &key, KeyEnd::Answer(&bytes))
                .await
            {
                // The call did its work: answer it; a retry runs it again
                // after TAKEOVER_AFTER (the key stays reserved until then).
                tracing::warn!(%error, method, "keeping the answer of an idempotency key failed");
            }
            Ok(response)
        }
        Err(status) => {
            // A refusal changed nothing: the key is free again, as after
            // any error of a call that changes nothing (`ERRORS_NOT_KEPT`).
            // Any other error may come after the call's commit (a read
            // after it failing): kept, so that a retry cannot do the work
            // twice.
            let kept =
                if refused_before_any_effect(status.code()) || ERRORS_NOT_KEPT.contains(&method) {
                    store.release_idempotency_key(principal, &key).await
                } else {
                    let failure = format!("{:?}: {}", status.code(), status.message());
                    store
                        .finish_idempotency_key(principal, &key, KeyEnd::Failure(&failure))
                        .await
                };
            if let Err(error) = kept {
                tracing::warn!(%error, method, "recording an idempotency key's error failed");
            }
            Err(status)
        }
    }
}

/// Whether an answer with `code` is a refusal the planner gives before the
/// call changes anything (a bad request, an unknown id, a state or role that
/// forbids it, a cap): its key may be used again.
fn refused_before_any_effect(code: tonic::Code) -> bool {
    use tonic::Code;
    matches!(
        code,
        Code::InvalidArgument
            | Code::NotFound
            | Code::FailedPrecondition
            | Code::PermissionDenied
            | Code::Unauthenticated
            | Code::ResourceExhausted
            | Code::AlreadyExists
            | Code::OutOfRange
    )
}
