//! The sources a selector names, checked against those ever stored: an
//! unknown one is refused with the closest known name.

use crate::{error::Error, store::Store};

/// Known sources named in the error for a source never seen.
pub const KNOWN_SOURCES_LISTED: usize = 10;

/// Known sources compared with an unknown one for the closest name (a skip
/// scan of the source index: one probe each).
const KNOWN_SOURCES_COMPARED: usize = 1000;

/// Refuses sources no dead letter was ever stored from: a typo would
/// otherwise give an empty answer that reads like "nothing there". The one
/// rule for every request that names sources: `RunPrecheck`,
/// `ListDeadLetters`, `SummarizeDeadLetters`, `ArchiveDeadLetters` and
/// `UnarchiveDeadLetters`.
///
/// # Errors
/// `NotFound` naming each unknown `selector.sources[i]`, the closest known
/// name when one is near (`did you mean "orders.dlq"?`), and up to
/// [`KNOWN_SOURCES_LISTED`] known sources; store errors.
pub async fn check_sources(store: &Store, sources: &[String]) -> Result<(), Error> {
    if sources.is_empty() {
        return Ok(());
    }
    let unknown = store.unknown_sources(sources).await?;
    if unknown.is_empty() {
        return Ok(());
    }
    let known = store.known_sources(KNOWN_SOURCES_COMPARED).await?;
    let named = unknown
        .iter()
        .map(|(index, source)| {
            let mut text = format!("selector.sources[{index}] {source:?}");
            if let Some(close) = closest(source, &known) {
                text.push_str(&format!(" (did you mean {close:?}?)"));
            }
            text
        })
        .collect::<Vec<_>>()
        .join(", ");
    let listed = match known.len() {
        0 => "no dead letter has been stored yet".to_owned(),
        n if n > KNOWN_SOURCES_LISTED => format!(
            "known sources include {}, ...",
            known[..KNOWN_SOURCES_LISTED].join(", ")
        ),
        _ => format!("known sources: {}", known.join(", ")),
    };
    Err(Error::NotFound(format!(
        "{named}: no dead letter from this source has ever been stored (a typo?); {listed}"
    )))
}

/// The known source closest to `unknown` by edit distance, when it is near:
/// at most a third of the name's characters (at least one) apart, or the
/// same name in another case.
pub(super) fn closest<'a>(unknown: &str, known: &'a [String]) -> Option<&'a str> {
    let limit = (unknown.chars().count() / 3).max(1);
    known
        .iter()
        .map(|name| {
            (
                edit_distance(&unknown.to_lowercase(), &name.to_lowercase()),
                name,
            )
        })
        .filter(|(distance, _)| *distance <= limit)
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, name)| name.as_str())
}

/// Levenshtein distance in characters, with a swap of two neighbours
/// counted as one edit (`nt3` for `n3t`).
pub(super) fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let mut rows = vec![vec![0_usize; b.len() + 1]; a.len() + 1];
    for (i, row) in rows.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in rows[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut best = (rows[i - 1][j] + 1)
                .min(rows[i][j - 1] + 1)
                .min(rows[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(rows[i - 2][j - 2] + 1);
            }
            rows[i][j] = best;
        }
    }
    rows[a.len()][b.len()]
}
