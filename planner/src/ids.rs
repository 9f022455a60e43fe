//! Identifiers and page tokens as the API writes them, parsed once at the
//! edge: each parser answers `InvalidArgument` naming the field. Each kind of
//! id is a type of its own ([`DeadLetterId`], [`SliceId`], [`PlanId`],
//! [`PrecheckId`]), bound and decoded by sqlx as the column it is, so that
//! an id of one kind cannot be passed for another. A leaf module: the
//! adapters, the selector and the stores all read ids here, and a parse
//! error ([`InvalidId`]) becomes the domain's `InvalidArgument` where it
//! meets [`crate::error::Error`].

use std::fmt;

use uuid::Uuid;

/// An id or page token that is not one: the request field and what is
/// wrong with it. Becomes `InvalidArgument` naming the field
/// (`From<InvalidId> for crate::error::Error`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {problem}")]
pub struct InvalidId {
    /// The field path, e.g. `selector.ids[3]`.
    pub field: String,
    /// What is wrong with it.
    pub problem: String,
}

impl InvalidId {
    fn new(field: impl Into<String>, problem: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            problem: problem.into(),
        }
    }
}

/// One page of `rows`, which were fetched as `page_size + 1`: the first
/// Rows a listing RPC answers per page when the request says 0.
pub const DEFAULT_PAGE_SIZE: u32 = 100;

/// A listing request's `page_size`: 0 means [`DEFAULT_PAGE_SIZE`]; more than
/// [`redrive_proto::limits::MAX_PAGE_SIZE`] is refused.
///
/// # Errors
/// [`InvalidId`] naming `page_size`.
pub fn page_size(requested: u32) -> Result<u32, InvalidId> {
    use redrive_proto::limits::MAX_PAGE_SIZE;
    match requested {
        0 => Ok(DEFAULT_PAGE_SIZE),
        size if size > MAX_PAGE_SIZE => Err(InvalidId::new(
            "page_size",
            format!("at most {MAX_PAGE_SIZE}"),
        )),
        size => Ok(size),
    }
}

/// `page_size` rows and whether another page follows (the extra row says
/// so). A full last page thus gets no next page token, so following a token
/// never yields an empty page.
pub fn page_of<T>(mut rows: Vec<T>, page_size: u32) -> (Vec<T>, bool) {
    let size = usize::try_from(page_size).unwrap_or(usize::MAX);
    let more = rows.len() > size;
    rows.truncate(size);
    (rows, more)
}

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
    pub fn parse(token: &str) -> Result<Self, InvalidId> {
        if token.is_empty() {
            return Ok(Self::default());
        }
        let parsed = token
            .split_once('.')
            .and_then(|(after, returned)| Some((after.parse().ok()?, returned.parse().ok()?)));
        let (after_id, returned) = parsed
            .ok_or_else(|| InvalidId::new("page_token", "not a token from a previous answer"))?;
        Ok(Self { after_id, returned })
    }

    /// The token text.
    pub fn encode(self) -> String {
        format!("{}.{}", self.after_id, self.returned)
    }
}

/// An integer id of one kind: a positive integer, written in decimal;
/// parsed once at the edge, bound and decoded as the `bigint` column it is.
macro_rules! integer_id {
    ($(#[$doc:meta])* $name:ident, $what:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, sqlx::Type)]
        #[sqlx(transparent)]
        pub struct $name(i64);

        impl $name {
            #[doc = concat!("Parses the ", $what, " in request field `field` (decimal digits only).")]
            ///
            /// # Errors
            /// `InvalidArgument` naming `field`.
            pub fn parse(field: &str, id: &str) -> Result<Self, InvalidId> {
                // Digits only: `+1` and ` 1` are not how ids are written.
                Some(id)
                    .filter(|id| !id.is_empty() && id.bytes().all(|b| b.is_ascii_digit()))
                    .and_then(|id| id.parse::<i64>().ok())
                    .filter(|id| *id > 0)
                    .map(Self)
                    .ok_or_else(|| {
                        InvalidId::new(
                            field,
                            format!("{id:?} is not a {} (a positive integer)", $what),
                        )
                    })
            }

            #[doc = concat!("The id `id` as stored (already known to be a ", $what, ").")]
            pub const fn new(id: i64) -> Self {
                Self(id)
            }

            /// The stored integer.
            pub const fn get(self) -> i64 {
                self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt(formatter)
            }
        }
    };
}

integer_id!(
    /// A dead letter id (`dead_letters.id`).
    DeadLetterId,
    "dead letter id"
);

integer_id!(
    /// A slice id (`plan_slices.id`).
    SliceId,
    "slice id"
);

/// A UUID id of one kind: parsed once at the edge, bound and decoded as the
/// `uuid` column it is, shown hyphenated.
macro_rules! uuid_id {
    ($(#[$doc:meta])* $name:ident, $what:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, sqlx::Type)]
        #[sqlx(transparent)]
        pub struct $name(Uuid);

        impl $name {
            #[doc = concat!("Parses the ", $what, " in request field `field`.")]
            ///
            /// # Errors
            /// `InvalidArgument` naming `field`.
            pub fn parse(field: &str, id: &str) -> Result<Self, InvalidId> {
                Uuid::parse_str(id).map(Self).map_err(|_| {
                    InvalidId::new(field, format!("{id:?} is not a {} (a UUID)", $what))
                })
            }

            #[doc = concat!("A new ", $what, " (a UUIDv7: ids sort by creation).")]
            pub fn generate() -> Self {
                Self(Uuid::now_v7())
            }

            #[doc = concat!("The UUID `id` as stored (already known to be a ", $what, ").")]
            pub const fn new(id: Uuid) -> Self {
                Self(id)
            }

            /// The UUID.
            pub const fn get(self) -> Uuid {
                self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt(formatter)
            }
        }
    };
}

uuid_id!(
    /// A plan id (`plans.id`).
    PlanId,
    "plan id"
);

uuid_id!(
    /// A precheck id (`prechecks.id`).
    PrecheckId,
    "precheck id"
);

#[cfg(test)]
mod tests {

    #[test]
    fn a_page_fetched_one_longer_says_whether_more_follow() {
        assert_eq!(page_of(vec![1, 2, 3], 2), (vec![1, 2], true));
        assert_eq!(page_of(vec![1, 2], 2), (vec![1, 2], false));
        assert_eq!(page_of(Vec::<u8>::new(), 2), (vec![], false));
    }

    use super::*;

    fn field_of(error: InvalidId) -> String {
        error.field
    }

    #[test]
    fn a_dead_letter_id_is_positive_decimal_digits_only() {
        assert_eq!(DeadLetterId::parse("id", "42").unwrap().get(), 42);
        for text in ["", "0", "-1", "+1", " 1", "1.0", "99999999999999999999"] {
            let error = DeadLetterId::parse("selector.ids[3]", text).unwrap_err();
            assert_eq!(field_of(error), "selector.ids[3]", "{text:?}");
        }
    }

    #[test]
    fn a_slice_id_is_positive_decimal_digits_only() {
        assert_eq!(SliceId::parse("slice_id", "7").unwrap().get(), 7);
        for text in [
            "",
            "0",
            "-1",
            "+1",
            " 1",
            "1.0",
            "s-3",
            "99999999999999999999",
        ] {
            let error = SliceId::parse("slice_id", text).unwrap_err();
            assert_eq!(field_of(error), "slice_id", "{text:?}");
        }
        assert_eq!(
            SliceId::parse("slice_id", "x").unwrap_err().to_string(),
            "slice_id: \"x\" is not a slice id (a positive integer)"
        );
    }

    #[test]
    fn a_uuid_id_parses_to_its_kind_and_a_bad_one_names_the_field() {
        let text = "01890a5d-ac96-774b-bcce-b302099a8057";
        assert_eq!(PlanId::parse("plan_id", text).unwrap().to_string(), text);
        assert_eq!(
            PrecheckId::parse("precheck_id", text).unwrap().get(),
            Uuid::parse_str(text).unwrap()
        );
        let error = PrecheckId::parse("precheck_id", "plan-7").unwrap_err();
        assert_eq!(
            error.to_string(),
            "precheck_id: \"plan-7\" is not a precheck id (a UUID)"
        );
    }
}
