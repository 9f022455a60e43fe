//! Views and table rows that more than one command prints, so that
//! commands do not import each other's views.
//!
//! # Precheck item (`precheck items`, `plan compensations`, a report's
//! `sample_blocked`)
//!
//! As a table: [`ITEM_COLUMNS`], [`item_row`] (a verdict a name of
//! [`VERDICTS`](crate::commands::precheck::VERDICTS)); `--json` prints the
//! API's `PrecheckItem`s ([`list_items`]).
//!
//! # Audit event (`plan watch --events`, a report's `not_sent`, `replay`)
//!
//! Its text reads `action` as a name of
//! [`ACTIONS`](crate::commands::plan::view::ACTIONS), `wave` as
//! [`wave_name`], `at` as RFC 3339; `--json` prints the API's `AuditEvent`.

use redrive_proto::v1::{PrecheckItem, Wave};

use crate::{
    args::Paging,
    error::CliError,
    output::{Column, ListingKind, cell, list_pages},
};

/// The `items` table columns (also `plan compensations`).
pub const ITEM_COLUMNS: &[Column] = &[
    Column::keep("dead_letter_id"),
    Column::keep("verdict"),
    Column::shorten("message_key"),
    Column::shorten("destination").optional(),
    Column::shorten("event_type").optional(),
    Column::shorten("reason"),
];

/// Lists the precheck items of the pages `paging` asks for
/// (`precheck items`, `plan compensations`): `fetch(page_size, page_token)`
/// answers one page's items and the next page token; `empty` is printed
/// when none matched.
///
/// # Errors
/// `fetch`'s, or writing to `out`.
pub async fn list_items(
    out: &mut dyn std::io::Write,
    json: bool,
    empty: &'static str,
    paging: &Paging,
    fetch: impl AsyncFnMut(u32, String) -> Result<(Vec<PrecheckItem>, String), CliError>,
) -> Result<u8, CliError> {
    let kind = ListingKind {
        key: "items",
        columns: ITEM_COLUMNS,
        empty,
    };
    list_pages(out, json, kind, paging, fetch, |listing, item| {
        listing.push(item, || item_row(item))
    })
    .await
}

/// One `items` table row, in [`ITEM_COLUMNS`] order.
pub fn item_row(item: &PrecheckItem) -> Vec<String> {
    vec![
        item.dead_letter_id.clone(),
        if item.at_send {
            format!("{} (at send)", item.verdict().name())
        } else {
            item.verdict().name().to_owned()
        },
        crate::output::key_cell(&item.message_key),
        cell(&item.destination).to_owned(),
        cell(item.event_type.as_deref().unwrap_or_default()).to_owned(),
        cell(&item.reason).to_owned(),
    ]
}

/// `canary`, `main`, or `unspecified`.
pub fn wave_name(wave: Wave) -> &'static str {
    match wave {
        Wave::Unspecified => "unspecified",
        Wave::Canary => "canary",
        Wave::Main => "main",
    }
}

#[cfg(test)]
mod tests {
    use redrive_proto::v1::Verdict;

    use super::*;

    /// The 80-column item table: a body-hash key took the room and
    /// the reason read `72h0m old (from its…`. The hash is cut to 12 digits
    /// and the reason is whole.
    #[test]
    fn in_80_columns_a_reason_has_the_room_a_body_hash_had() {
        let item = PrecheckItem {
            dead_letter_id: "1042".into(),
            message_key: format!("sha256:{}", "9f86d081".repeat(8)),
            verdict: Verdict::Stale.into(),
            reason: "72h0m old (from its timestamp)".into(),
            destination: "orders".into(),
            event_type: Some("order.paid".into()),
            at_send: false,
            message_id: String::new(),
        };
        crate::table::set_width(Some(80));
        let mut table = crate::output::table(ITEM_COLUMNS);
        table.add_row(item_row(&item));
        let lines = table.lines_for(Some(80));
        crate::table::set_width(Some(crate::table::DEFAULT_WIDTH));
        assert!(
            lines.iter().all(|line| line.chars().count() <= 80),
            "{lines:#?}"
        );
        assert!(
            lines[1].contains("sha256:9f86d0819f86…")
                && lines[1].contains("72h0m old (from its timestamp)"),
            "{lines:#?}"
        );
    }
}
