//! `dead-letters summary`: the `--group-by` names and the grouped table.

use std::{fmt, io::Write, str::FromStr};

use chrono::Utc;
use redrive_proto::v1::{SummarizeDeadLettersRequest, SummaryDimension, SummaryGroup};

use super::SummaryArgs;
use crate::{
    client::Planner,
    error::{CliError, EX_OK},
    output::{self, Column, cell, timestamp_text, write_message, write_table},
};

/// Group-by names and their dimensions, in the order the help lists them.
pub const DIMENSIONS: &[(&str, SummaryDimension)] = &[
    ("reason", SummaryDimension::Reason),
    ("destination", SummaryDimension::Destination),
    ("producer", SummaryDimension::Producer),
    ("schema_version", SummaryDimension::SchemaVersion),
    ("event_type", SummaryDimension::EventType),
    ("hour", SummaryDimension::Hour),
    ("source", SummaryDimension::Source),
    ("error", SummaryDimension::Error),
    ("status", SummaryDimension::Status),
];

/// A `--group-by` value: dimensions in order, each at most once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupBy(pub Vec<SummaryDimension>);

/// A `--group-by` value that names no dimension, or one twice.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GroupByError {
    /// Not a dimension name.
    #[error(
        "unknown group-by name {0:?}; valid names: reason, destination, producer, schema_version, event_type, hour, source, error, status"
    )]
    Unknown(String),
    /// Named twice.
    #[error("group-by name {0:?} given twice")]
    Repeated(String),
    /// Nothing given.
    #[error("no group-by name given")]
    Empty,
}

impl FromStr for GroupBy {
    type Err = GroupByError;

    fn from_str(text: &str) -> Result<Self, GroupByError> {
        let mut dimensions = Vec::new();
        for name in text
            .split(',')
            .map(str::trim)
            .filter(|name| !name.is_empty())
        {
            // `schema-version` and `event-type` read like the flags; accept both.
            let normalized = name.to_ascii_lowercase().replace('-', "_");
            let dimension = DIMENSIONS
                .iter()
                .find(|(known, _)| *known == normalized)
                .map(|(_, dimension)| *dimension)
                .ok_or_else(|| GroupByError::Unknown(name.to_owned()))?;
            if dimensions.contains(&dimension) {
                return Err(GroupByError::Repeated(name.to_owned()));
            }
            dimensions.push(dimension);
        }
        if dimensions.is_empty() {
            return Err(GroupByError::Empty);
        }
        Ok(Self(dimensions))
    }
}

impl GroupBy {
    /// The names, in order (also the keys of each group).
    pub fn names(&self) -> Vec<&'static str> {
        self.0
            .iter()
            .map(|dimension| dimension_name(*dimension))
            .collect()
    }
}

impl fmt::Display for GroupBy {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(&self.names().join(","))
    }
}

/// The name of a summary dimension (`schema_version`).
pub fn dimension_name(dimension: SummaryDimension) -> &'static str {
    DIMENSIONS
        .iter()
        .find(|(_, known)| *known == dimension)
        .map_or("unspecified", |(name, _)| name)
}

/// The value of `name` in a group's key (`""` when absent); an `hour` as
/// every time is written ([`crate::time`]), not as the planner's
/// `2026-11-29T14:00Z`.
fn key_value(group: &SummaryGroup, name: &str) -> String {
    let value = group.key.get(name).cloned().unwrap_or_default();
    if name == "hour" {
        crate::time::normalize(&value).unwrap_or(value)
    } else {
        value
    }
}

/// Runs `dead-letters summary` (module docs of [`super`]).
pub(super) async fn summary(
    planner: &mut Planner,
    args: SummaryArgs,
    json: bool,
    out: &mut dyn Write,
) -> Result<u8, CliError> {
    let response = planner
        .summarize_dead_letters(SummarizeDeadLettersRequest {
            selector: Some(args.selector.to_selector(Utc::now())),
            group_by: args
                .group_by
                .0
                .iter()
                .map(|dimension| *dimension as i32)
                .collect(),
        })
        .await?
        .into_inner();
    if json {
        write_message(out, &response)?;
        return Ok(EX_OK);
    }
    let names = args.group_by.names();
    let mut columns: Vec<Column> = names
        .iter()
        .map(|name| {
            if *name == "hour" {
                Column::keep(name)
            } else {
                Column::shorten(name)
            }
        })
        .collect();
    columns.extend([
        Column::keep("count"),
        Column::keep("first_seen").optional(),
        Column::keep("last_seen").optional(),
    ]);
    let mut table = output::table(&columns);
    for group in &response.groups {
        let mut row: Vec<String> = names
            .iter()
            .map(|name| cell(&key_value(group, name)).to_owned())
            .collect();
        row.push(group.count.to_string());
        row.push(timestamp_text(group.first_seen.as_ref()).unwrap_or_else(|| "-".to_owned()));
        row.push(timestamp_text(group.last_seen.as_ref()).unwrap_or_else(|| "-".to_owned()));
        table.add_row(row);
    }
    if !response.groups.is_empty() {
        write_table(out, &table)?;
    }
    writeln!(
        out,
        "open: {}, archived: {}, replayed: {}",
        response.open, response.archived, response.replayed
    )?;
    writeln!(out, "total: {}", response.total)?;
    Ok(EX_OK)
}
