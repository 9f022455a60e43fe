//! Paged listings (`dead-letters list`, `plan list`, `precheck items`, ...):
//! the pages walked, written as canonical JSON item by item or as one table.

use std::io::{self, Write};

use super::{Column, message_text, table, write_table};
use crate::{
    args::Paging,
    error::{CliError, EX_OK},
};

/// A paged listing on its way out: with `--json`, the API's list response in
/// its canonical proto3 JSON, `{"<key>": [...], "nextPageToken": "..."}`
/// (the items of every page walked; `<key>` the response's repeated field
/// in lowerCamelCase, left out when nothing matched, as is `nextPageToken`
/// on the last page: `{}` is an empty last page), its array written item by
/// item as pages arrive (a request refused before any item leaves nothing
/// on stdout, only the error); otherwise one aligned table after the last
/// page (or `empty` when nothing matched), then `next page token: T` when
/// more pages are left.
pub struct Listing<'o> {
    out: &'o mut dyn Write,
    json: bool,
    /// The JSON opening, `{"<key>":[`, until the first item is written.
    opening: String,
    listed: usize,
    rows: Vec<Vec<String>>,
}

impl<'o> Listing<'o> {
    /// Starts a listing whose JSON array is named `key` (the response's
    /// field in lowerCamelCase: `deadLetters`).
    ///
    /// # Errors
    /// Never; kept fallible for the writers to come.
    pub fn open(out: &'o mut dyn Write, json: bool, key: &str) -> io::Result<Self> {
        let opening = format!("{{{}:[", serde_json::to_string(key)?);
        Ok(Self {
            out,
            json,
            opening,
            listed: 0,
            rows: Vec::new(),
        })
    }

    /// Adds one item, an API message: its canonical JSON ([`message_json`]),
    /// or its table row (built only for tables).
    ///
    /// # Errors
    /// Writing to the output.
    pub fn push<M: prost::Message + prost::Name>(
        &mut self,
        item: &M,
        row: impl FnOnce() -> Vec<String>,
    ) -> io::Result<()> {
        if self.json {
            let json = message_text(item)?;
            if self.listed == 0 {
                self.out.write_all(self.opening.as_bytes())?;
            } else {
                self.out.write_all(b",")?;
            }
            self.out.write_all(json.as_bytes())?;
        } else {
            self.rows.push(row());
        }
        self.listed += 1;
        Ok(())
    }

    /// Ends the listing with the token of the next page (empty on the last).
    ///
    /// # Errors
    /// Writing to the output.
    pub fn finish(self, page_token: &str, columns: &[Column], empty: &str) -> io::Result<()> {
        if self.json {
            if self.listed == 0 {
                self.out.write_all(b"{")?;
            } else {
                self.out.write_all(b"]")?;
            }
            if !page_token.is_empty() {
                if self.listed > 0 {
                    self.out.write_all(b",")?;
                }
                self.out.write_all(b"\"nextPageToken\":")?;
                serde_json::to_writer(&mut *self.out, page_token)?;
            }
            return self.out.write_all(b"}\n");
        }
        if self.listed == 0 {
            writeln!(self.out, "{empty}")?;
        } else {
            let mut table = table(columns);
            table.add_rows(self.rows);
            write_table(self.out, &table)?;
        }
        if !page_token.is_empty() {
            writeln!(self.out, "next page token: {page_token}")?;
        }
        Ok(())
    }
}

/// What a paged listing is called and shows: the key of its JSON array, its
/// table columns, and the line printed when nothing matched.
#[derive(Debug, Clone, Copy)]
pub struct ListingKind {
    /// The JSON array's key, the list response's repeated field in
    /// lowerCamelCase (`items`, `deadLetters`).
    pub key: &'static str,
    /// The table's columns.
    pub columns: &'static [Column],
    /// What a table listing prints when nothing matched.
    pub empty: &'static str,
}

/// Lists the pages `paging` asks for ([`Paging::walk`]) as a
/// [`Listing`] of `kind`: `fetch(page_size, page_token)` answers one page's
/// items and the next page token, `push` adds one item to the listing.
/// Answers [`EX_OK`].
///
/// # Errors
/// `fetch`'s, or writing to `out`.
pub async fn list_pages<T>(
    out: &mut dyn Write,
    json: bool,
    kind: ListingKind,
    paging: &Paging,
    mut fetch: impl AsyncFnMut(u32, String) -> Result<(Vec<T>, String), CliError>,
    mut push: impl FnMut(&mut Listing<'_>, &T) -> io::Result<()>,
) -> Result<u8, CliError> {
    let mut listing = Listing::open(out, json, kind.key)?;
    let page_token = paging
        .walk(async |page_size, page_token| {
            let (items, next_page_token) = fetch(page_size, page_token).await?;
            for item in &items {
                push(&mut listing, item)?;
            }
            Ok(next_page_token)
        })
        .await?;
    listing.finish(&page_token, kind.columns, kind.empty)?;
    Ok(EX_OK)
}
