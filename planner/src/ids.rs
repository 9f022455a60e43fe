//! Identifiers and page tokens as the API writes them, parsed once at the
//! edge: each parser answers `InvalidArgument` naming the field. A leaf
//! module: the adapters, the selector and the stores all read ids here.

use uuid::Uuid;

use crate::error::Error;

/// Where a page starts: after this id, with this many already returned (so the
/// selector's limit holds across pages). Encoded as `"{after_id}.{returned}"`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PageToken {
    /// Last id of the previous page.
    pub after_id: i64,
    /// Dead letters returned by earlier pages.
    pub returned: u64,
}

impl PageToken {
    /// Parses a token from a previous answer; empty is the first page.
    ///
    /// # Errors
    /// `InvalidArgument` naming `page_token`.
    pub fn parse(token: &str) -> Result<Self, Error> {
        if token.is_empty() {
            return Ok(Self::default());
        }
        let parsed = token
            .split_once('.')
            .and_then(|(after, returned)| Some((after.parse().ok()?, returned.parse().ok()?)));
        let (after_id, returned) = parsed
            .ok_or_else(|| Error::invalid("page_token", "not a token from a previous answer"))?;
        Ok(Self { after_id, returned })
    }

    /// The token text.
    pub fn encode(self) -> String {
        format!("{}.{}", self.after_id, self.returned)
    }
}

/// Parses a dead letter id (decimal).
///
/// # Errors
/// `InvalidArgument` naming `field`.
pub fn dead_letter_id(field: &str, id: &str) -> Result<i64, Error> {
    // Digits only: `+1` and ` 1` are not how ids are written.
    Some(id)
        .filter(|id| !id.is_empty() && id.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|id| id.parse::<i64>().ok())
        .filter(|id| *id > 0)
        .ok_or_else(|| {
            Error::invalid(
                field,
                format!("{id:?} is not a dead letter id (a positive integer)"),
            )
        })
}

/// Parses a plan id (a UUID).
///
/// # Errors
/// `InvalidArgument` naming `field`.
pub fn plan_id(field: &str, id: &str) -> Result<Uuid, Error> {
    Uuid::parse_str(id)
        .map_err(|_| Error::invalid(field, format!("{id:?} is not a plan id (a UUID)")))
}

/// Parses a precheck id (a UUID).
///
/// # Errors
/// `InvalidArgument` naming `field`.
pub fn precheck_id(field: &str, id: &str) -> Result<Uuid, Error> {
    Uuid::parse_str(id)
        .map_err(|_| Error::invalid(field, format!("{id:?} is not a precheck id (a UUID)")))
}
