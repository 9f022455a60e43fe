//! A plan's preview (`PreviewPlan`): its first messages as an executor would
//! publish them, computed by the rules that publish them, and nothing
//! stored. The route is the plan items' SQL ([`Store::preview_routes`]); the
//! headers are [`redrive_proto::headers::replay_headers`], the executor's
//! own rule.

use redrive_proto::{
    headers::{ReplayStamp, drops_header, replay_headers},
    v1::{self, header_value::Value},
};

use crate::{error::Error, ids::DeadLetterId, precheck, store::Store, store::plans::NewPlan};

/// Messages a preview shows when the request says 0.
pub const DEFAULT_PREVIEW_MESSAGES: u32 = 5;
/// The most messages one preview shows.
pub const MAX_PREVIEW_MESSAGES: u32 = 50;

/// Stand-ins for what only the publish itself knows: the plan's id (made by
/// CreatePlan), the publishing executor and the publish's trace.
pub const PREVIEW_PLAN_ID: &str = "<plan id>";
/// See [`PREVIEW_PLAN_ID`].
pub const PREVIEW_EXECUTOR_ID: &str = "<executor id>";
/// See [`PREVIEW_PLAN_ID`].
pub const PREVIEW_TRACEPARENT: &str = "<traceparent of the publish>";

/// The first `limit` messages of `plan` (validated as CreatePlan validates
/// it) and how many items it would have.
///
/// # Errors
/// `InvalidArgument` for a `limit` over [`MAX_PREVIEW_MESSAGES`]; as
/// [`super::create`]: `NotFound` for an unknown precheck, `FailedPrecondition`
/// when it has nothing replayable or the destination mode cannot route its
/// items; store errors.
pub async fn preview(
    store: &Store,
    plan: &NewPlan,
    limit: u32,
) -> Result<v1::PreviewPlanResponse, Error> {
    let limit = match limit {
        0 => DEFAULT_PREVIEW_MESSAGES,
        limit if limit > MAX_PREVIEW_MESSAGES => {
            return Err(Error::invalid(
                "limit",
                format!("at most {MAX_PREVIEW_MESSAGES} messages"),
            ));
        }
        limit => limit,
    };
    // NotFound for an unknown precheck, as CreatePlan says it.
    precheck::get(store, plan.precheck_id).await?;
    super::refuse_unroutable(store, plan).await?;
    let (routes, items) = store
        .preview_routes(plan.precheck_id, &plan.destination, limit)
        .await?;
    if items == 0 {
        return Err(Error::FailedPrecondition(format!(
            "precheck {} has no replayable item: there is nothing to plan",
            plan.precheck_id
        )));
    }
    let mut messages = Vec::with_capacity(routes.len());
    for route in routes {
        let (dead_letter, _) =
            crate::dead_letters::inspect::get(store, route.dead_letter_id).await?;
        messages.push(outgoing(route, &dead_letter));
    }
    Ok(v1::PreviewPlanResponse {
        messages,
        items: u64::try_from(items).unwrap_or_default(),
    })
}

/// One message as it would be published, with its header diff against the
/// stored dead letter.
fn outgoing(
    route: crate::store::plans::PreviewRoute,
    dead_letter: &v1::DeadLetter,
) -> v1::OutgoingMessage {
    let stored = dead_letter.headers.clone().unwrap_or_default();
    let count = u32::try_from(route.redrive_count.saturating_add(1)).unwrap_or(u32::MAX);
    let published = replay_headers(
        &stored,
        &ReplayStamp {
            plan_id: PREVIEW_PLAN_ID,
            executor_id: PREVIEW_EXECUTOR_ID,
            attempt: 1,
            count,
            reason: dead_letter
                .death
                .as_ref()
                .map(|death| death.reason.as_str()),
            traceparent: PREVIEW_TRACEPARENT,
        },
    );
    let removed_headers = stored
        .fields
        .keys()
        .filter(|name| drops_header(name))
        .cloned()
        .collect();
    let mut added_headers = Vec::new();
    let mut kept_headers = Vec::new();
    for (name, value) in &published.fields {
        if stored.fields.get(name) == Some(value) {
            kept_headers.push(name.clone());
        } else {
            added_headers.push(v1::StampedHeader {
                name: name.clone(),
                value: stamp_text(value),
            });
        }
    }
    v1::OutgoingMessage {
        dead_letter_id: DeadLetterId::get(route.dead_letter_id).to_string(),
        message_id: dead_letter
            .properties
            .as_ref()
            .and_then(|properties| properties.message_id.clone())
            .unwrap_or_default(),
        exchange: route.exchange,
        routing_key: route.routing_key,
        removed_headers,
        added_headers,
        kept_headers,
        body_bytes: u64::try_from(route.body_bytes).unwrap_or_default(),
    }
}

/// A stamp header's value as text: the stamp writes long strings and long
/// integers only.
fn stamp_text(value: &v1::HeaderValue) -> String {
    match &value.value {
        Some(Value::LongString(bytes)) => String::from_utf8_lossy(bytes).into_owned(),
        Some(Value::LongInt(number)) => number.to_string(),
        other => format!("{other:?}"),
    }
}
