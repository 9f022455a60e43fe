//! Inspecting captured dead letters: list (paged), get (with a body preview),
//! summarize (grouped counts).

use redrive_proto::{time::timestamp, v1};

use crate::{
    dead_letters::body,
    dead_letters::selector::Selector,
    error::Error,
    ids::{DeadLetterId, PageToken, page_of},
    store::{Store, dead_letters::Dimension},
};

/// Default and maximum page sizes of `ListDeadLetters`.
pub use crate::ids::DEFAULT_PAGE_SIZE;
pub use redrive_proto::limits::MAX_PAGE_SIZE;

/// One page of dead letters without bodies, and the token of the next page
/// (empty on the last).
///
/// # Errors
/// `InvalidArgument` for a page size over [`MAX_PAGE_SIZE`]; store errors.
pub async fn list(
    store: &Store,
    selector: &Selector,
    page_size: u32,
    token: PageToken,
) -> Result<(Vec<v1::DeadLetter>, String), Error> {
    let mut page_size = crate::ids::page_size(page_size)?;
    if let Some(limit) = selector.limit {
        let remaining = limit.saturating_sub(token.returned);
        page_size = page_size.min(u32::try_from(remaining).unwrap_or(u32::MAX));
        if page_size == 0 {
            return Ok((Vec::new(), String::new()));
        }
    }
    let rows = store
        .list_dead_letters(selector, token.after_id, page_size + 1)
        .await?;
    let (dead_letters, more) = page_of(rows, page_size);
    let returned = token.returned + dead_letters.len() as u64;
    let more = more && selector.limit.is_none_or(|limit| returned < limit);
    let next = match dead_letters.last() {
        Some(last) if more => PageToken {
            after_id: last.id.parse().unwrap_or(i64::MAX),
            returned: token.returned + dead_letters.len() as u64,
        }
        .encode(),
        _ => String::new(),
    };
    Ok((dead_letters, next))
}

/// The dead letter `id` and a preview of its latest body.
///
/// # Errors
/// `NotFound` when no dead letter has that id; store errors.
pub async fn get(store: &Store, id: DeadLetterId) -> Result<(v1::DeadLetter, String), Error> {
    let dead_letter = store
        .get_dead_letter(id)
        .await?
        .ok_or_else(|| Error::NotFound(format!("dead letter {id} not found")))?;
    let latest = dead_letter
        .revisions
        .last()
        .map_or(dead_letter.body.as_slice(), |r| r.body.as_slice());
    let declared = body::declared_encoding(
        &dead_letter.properties.clone().unwrap_or_default(),
        &dead_letter.headers.clone().unwrap_or_default(),
    );
    let preview = body::preview(latest, declared.as_deref());
    Ok((dead_letter, preview))
}

/// The dimension of a proto enum value.
///
/// # Errors
/// `InvalidArgument` naming `group_by[index]`.
pub fn dimension(index: usize, value: i32) -> Result<Dimension, Error> {
    use v1::SummaryDimension as D;
    Ok(match D::try_from(value).unwrap_or(D::Unspecified) {
        D::Reason => Dimension::Reason,
        D::Destination => Dimension::Destination,
        D::Producer => Dimension::Producer,
        D::SchemaVersion => Dimension::SchemaVersion,
        D::EventType => Dimension::EventType,
        D::Hour => Dimension::Hour,
        D::Source => Dimension::Source,
        D::Error => Dimension::Error,
        D::Status => Dimension::Status,
        D::Unspecified => {
            return Err(Error::invalid(
                format!("group_by[{index}]"),
                "one of reason, destination, producer, schema_version, event_type, hour, source, \
                 error, status",
            ));
        }
    })
}

/// Grouped counts of the selected dead letters, largest group first, and
/// how many of them (whatever the selector's status) are open, archived and
/// replayed.
///
/// # Errors
/// `InvalidArgument` for a dimension named twice; store errors.
pub async fn summarize(
    store: &Store,
    selector: &Selector,
    dimensions: Vec<Dimension>,
) -> Result<v1::SummarizeDeadLettersResponse, Error> {
    let dimensions = if dimensions.is_empty() {
        vec![Dimension::Reason]
    } else {
        dimensions
    };
    for (index, dimension) in dimensions.iter().enumerate() {
        if dimensions[..index].contains(dimension) {
            return Err(Error::invalid(
                format!("group_by[{index}]"),
                format!("{} named twice", dimension.name()),
            ));
        }
    }
    let now = chrono::Utc::now();
    let groups = store.summarize_dead_letters(selector, &dimensions).await?;
    let counts = store.status_counts(selector).await?;
    let count = |value: i64| u64::try_from(value).unwrap_or_default();
    Ok(v1::SummarizeDeadLettersResponse {
        open: count(counts.open),
        archived: count(counts.archived),
        replayed: count(counts.replayed),
        total: groups.iter().map(|group| group.count).sum(),
        groups: groups
            .into_iter()
            .map(|group| v1::SummaryGroup {
                key: group
                    .key
                    .into_iter()
                    .map(|(name, value)| (name.to_owned(), value))
                    .collect(),
                count: group.count,
                first_seen: Some(timestamp(group.first_seen)),
                still_arriving: group.last_seen > now - STILL_ARRIVING_WITHIN,
                last_seen: Some(timestamp(group.last_seen)),
            })
            .collect(),
    })
}

/// A group is still arriving when one of its dead letters died this
/// recently (`SummaryGroup.still_arriving`).
pub const STILL_ARRIVING_WITHIN: chrono::TimeDelta = chrono::TimeDelta::minutes(15);

/// Every source dead letters were stored from (`ListSources`), with its
/// capture queue's depth from `capture` where it is one.
///
/// # Errors
/// Store errors.
pub async fn sources(
    store: &Store,
    capture: &crate::capture::CaptureStatus,
) -> Result<v1::ListSourcesResponse, Error> {
    let count = |value: i64| u64::try_from(value).unwrap_or_default();
    let sources = store
        .source_overviews()
        .await?
        .into_iter()
        .map(|source| v1::SourceOverview {
            queue_depth: capture.depth(&source.source),
            stored: count(source.stored),
            open: count(source.open),
            arrivals_per_minute: source.arrivals_per_minute.to_vec(),
            last_arrival: source.last_arrival.map(timestamp),
            source: source.source,
        })
        .collect();
    Ok(v1::ListSourcesResponse { sources })
}
