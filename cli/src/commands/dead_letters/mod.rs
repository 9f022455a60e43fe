//! `redrivectl dead-letters list | show | summary | repair | archive |
//! unarchive`: inspecting captured dead letters (`ListDeadLetters`,
//! `GetDeadLetter`, `SummarizeDeadLetters`), repairing one, and resolving
//! them without a replay (`ArchiveDeadLetters`, `UnarchiveDeadLetters`).
//!
//! # `list`
//! `redrivectl dead-letters list [selector flags] [--page-size N] [--page-token T] [--all]`
//!
//! A table of id, source, reason class, death reason, destination, event type,
//! message key, body size and death time (fitted to the terminal,
//! [`crate::table`]: body size, destination and death reason are left out
//! first, then source, event type and key are shortened; `--wide` shows them
//! all), then `next page token: T` when there are more; `--all` follows the tokens to the end (the table is printed once
//! all pages are in; `--json` writes each page as it arrives). `--json`: the
//! API's `ListDeadLettersResponse` in canonical proto3 JSON
//! ([`crate::output::Listing`]), `{"deadLetters": [...], "nextPageToken":
//! "..."}` (the dead letters without their bodies; the token left out on
//! the last page).
//!
//! # `show`
//! `redrivectl dead-letters show ID`
//!
//! Key fields, the death, properties, headers (with their AMQP types), capture
//! notes, revisions, then the body preview. `--json`: the API's
//! `GetDeadLetterResponse` (`{"deadLetter": {...}, "bodyPreview": "..."}`,
//! canonical proto3 JSON: the body in base64, the planner's preview).
//!
//! # `repair`
//! `redrivectl dead-letters repair ID --body-file FILE --reason TEXT`
//!
//! Stores FILE's bytes (`-`: stdin), byte-exact, as a new body revision
//! (`RepairDeadLetter`); the captured body stays as it was. Prechecks and
//! replays use the latest revision from then on, and the audit of its replay
//! names the revision and who repaired it. Prints the dead letter as `show`
//! does (`--json`: the `GetDeadLetterResponse` it answers). Refused (exit 1) while a plan that is not
//! final still has the dead letter to publish, or when the body is the one in
//! use already; a body over the planner's limit, or not JSON when the content
//! type says JSON, exits 65.
//!
//! # `summary`
//! `redrivectl dead-letters summary [selector flags] [--group-by reason,producer,...]`
//!
//! Group-by names: `reason` (the default), `destination`, `producer`,
//! `schema_version`, `event_type`, `hour`, `source`, `error` (the error text
//! with digits, hex numbers and UUIDs folded), `status`, comma separated, each
//! at most once. A table with one column per name, then count, first seen and
//! last seen, largest group first, then `open: N, archived: N, replayed: N`
//! (the selection by status, whatever `--status` says) and `total: N`; an
//! absent value in a key is `""`; an `hour` reads as every time does
//! ([`crate::time`]). `--json`: the API's `SummarizeDeadLettersResponse`
//! (canonical proto3 JSON: counts as strings, the keys as the planner wrote
//! them).
//!
//! # `archive`, `unarchive`
//! `redrivectl dead-letters archive [selector flags] --reason TEXT`
//!
//! Archives the selected dead letters (every status unless `--status` says;
//! at least one selector flag; the reason class filter is `--reason-class`
//! here, `--reason` says why): they leave listings, summaries and prechecks,
//! and the planner's retention may delete them later. `unarchive` reverses
//! it. Prints `archived N dead letter(s) (M unchanged)`, the ids changed and
//! the `--id`s that name no dead letter (then exit 65);
//! `--json`: the API's `ArchiveDeadLettersResponse` (canonical proto3 JSON).
//! Refused (exit 1) when a selected dead letter is an item of a plan that has
//! not ended, naming the plan.
//!
//! # `rekey`
//! `redrivectl dead-letters rekey [selector flags] [--message-key RULE]... --reason TEXT`
//!
//! Recomputes the message key of the selected dead letters (at least one
//! selector flag) from their stored message with the `--message-key` rules,
//! first match wins (`property:NAME`, `header:NAME`, `json:/pointer`, `body`;
//! none: the default rule, the `message_id` property). The former keys are
//! kept: a dead letter replayed under one stays `already_replayed`. Prints
//! `re-keyed N dead letter(s): M key(s) changed (rekey ID)` and up to five
//! `  dead letter ID: OLD -> NEW`; `--json`: the API's
//! `RekeyDeadLettersResponse` (canonical proto3 JSON).

use crate::{
    args::Paging,
    output::{ListingKind, list_pages},
};
use std::io::Write;

use chrono::Utc;
use clap::{Args, Subcommand};
use redrive_proto::v1::{
    ArchiveDeadLettersRequest, DeadLetter, GetDeadLetterRequest, ListDeadLettersRequest,
    RekeyDeadLettersRequest, RepairDeadLetterRequest,
};

use crate::{
    client::Planner,
    error::{CliError, EX_DATAERR, EX_OK},
    output::{self, Column, cell, timestamp_text, write_item, write_message},
    selector::SelectorArgs,
};

mod show;
mod summary;

use show::write_dead_letter;
#[cfg(test)]
use show::write_show;
use summary::summary;
pub use summary::{DIMENSIONS, GroupBy, GroupByError, dimension_name};

/// `dead-letters` subcommands.
#[derive(Debug, Clone, Subcommand)]
pub enum DeadLettersCommand {
    /// List dead letters, one page at a time (or all with --all).
    List(ListArgs),
    /// Show one dead letter: fields, death, properties, headers and body.
    Show(ShowArgs),
    /// Count dead letters grouped by reason, destination, producer, ...
    Summary(SummaryArgs),
    /// Store a corrected body as a new revision (the captured one is kept);
    /// prechecks and replays use it from then on.
    Repair(RepairArgs),
    /// Resolve dead letters without replaying them: they leave listings,
    /// summaries and prechecks (reversible with unarchive).
    Archive(ArchiveArgs),
    /// Make archived dead letters open again.
    Unarchive(ArchiveArgs),
    /// Recompute the message keys of stored dead letters with other
    /// --message-key rules (audited; replays under the former keys still
    /// count).
    Rekey(RekeyArgs),
}

/// `dead-letters rekey` flags: those of `archive`, and the key rules.
#[derive(Debug, Clone, Args)]
pub struct RekeyArgs {
    /// Which dead letters, and why.
    #[command(flatten)]
    pub target: ArchiveArgs,
    /// A key rule, first match wins: property:NAME, header:NAME,
    /// json:/pointer or body (repeatable; none: the default rule, the
    /// message_id property, else the body hash).
    #[arg(long = "message-key", value_name = "RULE")]
    pub message_keys: Vec<String>,
}

/// `dead-letters archive` and `unarchive` flags: the selector flags, with
/// the reason class filter as `--reason-class` there, since `--reason` says
/// why, as it does for every other verb (`replay`, `repair`, `plan cancel`).
#[derive(Debug, Clone)]
pub struct ArchiveArgs {
    /// Which dead letters.
    pub selector: SelectorArgs,
    /// Why (recorded with each dead letter, with who did it and when).
    pub reason: String,
}

impl clap::FromArgMatches for ArchiveArgs {
    fn from_arg_matches(matches: &clap::ArgMatches) -> Result<Self, clap::Error> {
        let reason = matches
            .get_one::<String>("reason")
            .cloned()
            .ok_or_else(|| {
                clap::Error::raw(
                    clap::error::ErrorKind::MissingRequiredArgument,
                    "--reason TEXT is required: say why",
                )
            })?;
        // Elsewhere `--reason R` filters by reason class: here it says why,
        // so a bare class name is most likely a filter meant as
        // `--reason-class`, and would archive more than meant.
        let bare = reason.trim().to_ascii_lowercase();
        if crate::selector::REASONS.contains(&bare.as_str()) {
            return Err(clap::Error::raw(
                clap::error::ErrorKind::ValueValidation,
                format!(
                    "--reason {bare:?} looks like a reason class, but here --reason says why \
                     (free text): to select by reason class use --reason-class {bare}, and \
                     say why with --reason\n"
                ),
            ));
        }
        Ok(Self {
            selector: SelectorArgs::from_arg_matches(matches)?,
            reason,
        })
    }

    fn update_from_arg_matches(&mut self, matches: &clap::ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(matches)?;
        Ok(())
    }
}

impl Args for ArchiveArgs {
    fn augment_args(command: clap::Command) -> clap::Command {
        SelectorArgs::augment_args(command)
            .mut_arg("reasons", |arg| arg.long("reason-class"))
            .arg(
                clap::Arg::new("reason")
                    .long("reason")
                    .value_name("TEXT")
                    .required(true)
                    .value_parser(crate::args::non_blank)
                    .help("Why (recorded with each dead letter, with who did it and when)"),
            )
    }

    fn augment_args_for_update(command: clap::Command) -> clap::Command {
        Self::augment_args(command)
    }
}

/// `dead-letters list` flags.
#[derive(Debug, Clone, Args)]
pub struct ListArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub selector: SelectorArgs,

    #[command(flatten)]
    #[allow(missing_docs)]
    pub page: Paging,
}

/// `dead-letters show` arguments.
#[derive(Debug, Clone, Args)]
pub struct ShowArgs {
    /// The dead letter id.
    pub id: String,
}

/// `dead-letters repair` arguments.
#[derive(Debug, Clone, Args)]
pub struct RepairArgs {
    /// The dead letter id.
    pub id: String,

    /// The corrected body, byte-exact (`-`: stdin).
    #[arg(long, value_name = "FILE")]
    pub body_file: String,

    /// Why the body is repaired (kept with the revision and shown in the audit
    /// of its replay).
    #[arg(long, value_name = "TEXT", value_parser = crate::args::non_blank)]
    pub reason: String,

    /// The body, once read ([`DeadLettersCommand::read_input`]).
    #[arg(skip)]
    pub body: Option<Vec<u8>>,
}

impl DeadLettersCommand {
    /// Reads what the command needs from files (`repair`'s body) before the
    /// network: a typo in a file name should not wait on the planner.
    ///
    /// # Errors
    /// [`CliError::NoInput`] when the body file cannot be read.
    pub fn read_input(mut self) -> Result<Self, CliError> {
        if let Self::Repair(args) = &mut self
            && args.body.is_none()
        {
            args.body = Some(read_body(&args.body_file)?);
        }
        Ok(self)
    }
}

/// `dead-letters summary` flags.
#[derive(Debug, Clone, Args)]
pub struct SummaryArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub selector: SelectorArgs,

    /// Group by these, in this order, comma separated: reason, destination,
    /// producer, schema_version, event_type, hour, source, error (the error
    /// text with digits and ids folded), status. The default says what
    /// died, why and where: event_type, reason, destination.
    #[arg(
        long,
        value_name = "NAMES",
        default_value = "event_type,reason,destination"
    )]
    pub group_by: GroupBy,
}

/// Runs a `dead-letters` subcommand, writing its output to `out`.
///
/// # Errors
/// gRPC errors from the planner; output errors.
pub async fn run(
    planner: &mut Planner,
    command: DeadLettersCommand,
    json: bool,
    out: &mut dyn Write,
) -> Result<u8, CliError> {
    match command {
        DeadLettersCommand::List(args) => list(planner, args, json, out).await,
        DeadLettersCommand::Show(args) => show(planner, args, json, out).await,
        DeadLettersCommand::Summary(args) => summary(planner, args, json, out).await,
        DeadLettersCommand::Repair(args) => repair(planner, args, json, out).await,
        DeadLettersCommand::Archive(args) => set_archived(planner, args, true, json, out).await,
        DeadLettersCommand::Unarchive(args) => set_archived(planner, args, false, json, out).await,
        DeadLettersCommand::Rekey(args) => rekey(planner, args, json, out).await,
    }
}

// ---------------------------------------------------------------------------
// list
// ---------------------------------------------------------------------------

/// The columns of `dead-letters list`, least needed marked optional.
pub(crate) const LIST_COLUMNS: &[Column] = &[
    Column::keep("id"),
    Column::shorten("message_id"),
    Column::shorten("source"),
    Column::keep("reason_class"),
    Column::keep("death_reason").optional(),
    Column::shorten("destination").optional(),
    Column::shorten("event_type"),
    Column::shorten("message_key").optional(),
    Column::keep("body_size").optional(),
    Column::keep("died_at"),
];

async fn list(
    planner: &mut Planner,
    args: ListArgs,
    json: bool,
    out: &mut dyn Write,
) -> Result<u8, CliError> {
    let selector = args.selector.to_selector(Utc::now());
    // People get one aligned table (use --json to stream a long --all);
    // scripts get each page written as it comes.
    let kind = ListingKind {
        key: "deadLetters",
        columns: LIST_COLUMNS,
        empty: "no dead letters match",
    };
    let fetch = async |page_size, page_token| {
        let request = ListDeadLettersRequest {
            selector: Some(selector.clone()),
            page_size,
            page_token,
        };
        let response = planner.list_dead_letters(request).await?.into_inner();
        Ok((response.dead_letters, response.next_page_token))
    };
    list_pages(
        out,
        json,
        kind,
        &args.page,
        fetch,
        |listing, dead_letter| listing.push(dead_letter, || list_row(dead_letter)),
    )
    .await
}

/// One `list` table row, in [`LIST_COLUMNS`] order.
fn list_row(dead_letter: &DeadLetter) -> Vec<String> {
    let death_reason = dead_letter
        .death
        .as_ref()
        .map(|death| death.reason.as_str())
        .unwrap_or_default();
    vec![
        dead_letter.id.clone(),
        cell(dead_letter.message_id.as_deref().unwrap_or_default()).to_owned(),
        dead_letter.source.clone(),
        dead_letter.reason_class().name().to_owned(),
        cell(death_reason).to_owned(),
        cell(&dead_letter.destination).to_owned(),
        cell(dead_letter.event_type.as_deref().unwrap_or_default()).to_owned(),
        output::key_cell(&dead_letter.message_key),
        dead_letter.body_size.to_string(),
        timestamp_text(dead_letter.died_at.as_ref()).unwrap_or_else(|| "-".to_owned()),
    ]
}

// ---------------------------------------------------------------------------
// show
// ---------------------------------------------------------------------------

async fn show(
    planner: &mut Planner,
    args: ShowArgs,
    json: bool,
    out: &mut dyn Write,
) -> Result<u8, CliError> {
    let response = planner
        .get_dead_letter(GetDeadLetterRequest { id: args.id })
        .await?
        .into_inner();
    write_dead_letter(out, response, json)
}

/// Repairs with the body read by [`DeadLettersCommand::read_input`] (or
/// reads it now).
async fn repair(
    planner: &mut Planner,
    args: RepairArgs,
    json: bool,
    out: &mut dyn Write,
) -> Result<u8, CliError> {
    let body = match args.body {
        Some(body) => body,
        None => read_body(&args.body_file)?,
    };
    let response = planner
        .repair_dead_letter(RepairDeadLetterRequest {
            dead_letter_id: args.id,
            new_body: body,
            reason: args.reason,
        })
        .await?
        .into_inner();
    write_dead_letter(out, response, json)
}

async fn set_archived(
    planner: &mut Planner,
    args: ArchiveArgs,
    archive: bool,
    json: bool,
    out: &mut dyn Write,
) -> Result<u8, CliError> {
    let request = ArchiveDeadLettersRequest {
        selector: Some(args.selector.to_selector(Utc::now())),
        reason: args.reason,
    };
    let response = if archive {
        planner.archive_dead_letters(request).await?
    } else {
        planner.unarchive_dead_letters(request).await?
    }
    .into_inner();
    write_id_answer(out, &response, &response.not_found_ids, json, |out| {
        writeln!(
            out,
            "{} {} dead letter(s) ({} unchanged)",
            if archive { "archived" } else { "unarchived" },
            response.changed,
            response.unchanged
        )?;
        if !response.dead_letter_ids.is_empty() {
            let more = response
                .changed
                .saturating_sub(response.dead_letter_ids.len() as u64);
            let mut ids = response.dead_letter_ids.join(", ");
            if more > 0 {
                ids.push_str(&format!(" and {more} more"));
            }
            writeln!(out, "ids: {ids}")?;
        }
        Ok(())
    })
}

/// Writes the answer of a call that names dead letters by id (archive,
/// unarchive, rekey): with --json as it is, else `for_people` and then the
/// ids that named nothing. The exit code: `EX_DATAERR` when an id named
/// nothing (what was asked could not all be done), else `EX_OK`.
fn write_id_answer<M: prost::Message + prost::Name>(
    out: &mut dyn Write,
    response: &M,
    not_found_ids: &[String],
    json: bool,
    for_people: impl FnOnce(&mut dyn Write) -> Result<(), CliError>,
) -> Result<u8, CliError> {
    let code = if not_found_ids.is_empty() {
        EX_OK
    } else {
        EX_DATAERR
    };
    if json {
        write_message(out, response)?;
        return Ok(code);
    }
    for_people(out)?;
    if !not_found_ids.is_empty() {
        writeln!(
            out,
            "not found (never captured here, or deleted by retention): {}",
            not_found_ids.join(", ")
        )?;
    }
    Ok(code)
}

async fn rekey(
    planner: &mut Planner,
    args: RekeyArgs,
    json: bool,
    out: &mut dyn Write,
) -> Result<u8, CliError> {
    let request = RekeyDeadLettersRequest {
        selector: Some(args.target.selector.to_selector(Utc::now())),
        key_rules: args.message_keys,
        reason: args.target.reason,
    };
    let response = planner.rekey_dead_letters(request).await?.into_inner();
    write_id_answer(out, &response, &response.not_found_ids, json, |out| {
        writeln!(
            out,
            "re-keyed {} dead letter(s): {} key(s) changed (rekey {})",
            response.rekeyed, response.changed, response.rekey_id
        )?;
        for example in &response.examples {
            write_item(
                out,
                "  ",
                &format!(
                    "dead letter {}: {} -> {}",
                    example.dead_letter_id, example.old_key, example.new_key
                ),
            )?;
        }
        Ok(())
    })
}

/// The bytes of `path` (`-`: stdin).
///
/// # Errors
/// [`CliError::NoInput`] when it cannot be read.
pub fn read_body(path: &str) -> Result<Vec<u8>, CliError> {
    let read = if path == "-" {
        let mut body = Vec::new();
        std::io::Read::read_to_end(&mut std::io::stdin(), &mut body).map(|_| body)
    } else {
        std::fs::read(path)
    };
    read.map_err(|source| CliError::NoInput {
        path: path.to_owned(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use redrive_proto::v1::{Death, ReasonClass, SummaryDimension};

    use super::*;

    #[test]
    fn group_by_reads_names_in_order() {
        let group_by: GroupBy = "reason, producer,schema-version,hour".parse().unwrap();
        assert_eq!(
            group_by.0,
            vec![
                SummaryDimension::Reason,
                SummaryDimension::Producer,
                SummaryDimension::SchemaVersion,
                SummaryDimension::Hour,
            ]
        );
        assert_eq!(group_by.to_string(), "reason,producer,schema_version,hour");
        let every: GroupBy =
            "reason,destination,producer,schema_version,event_type,hour,source,error,status"
                .parse()
                .unwrap();
        assert_eq!(every.0.len(), DIMENSIONS.len());
    }

    #[test]
    fn group_by_errors_list_the_valid_names() {
        let error = "reason,colour".parse::<GroupBy>().unwrap_err();
        assert_eq!(error, GroupByError::Unknown("colour".into()));
        assert!(
            error.to_string().contains(
                "valid names: reason, destination, producer, schema_version, event_type, hour, source"
            ),
            "{error}"
        );
        assert_eq!(
            "reason,reason".parse::<GroupBy>().unwrap_err(),
            GroupByError::Repeated("reason".into())
        );
        assert_eq!(" , ".parse::<GroupBy>().unwrap_err(), GroupByError::Empty);
    }

    #[test]
    fn group_by_is_a_usage_error_on_the_command_line() {
        use clap::Parser;

        #[derive(Debug, Parser)]
        struct Harness {
            #[command(flatten)]
            summary: SummaryArgs,
        }
        let parsed = Harness::try_parse_from(["test", "--group-by", "hour,source"]).unwrap();
        assert_eq!(parsed.summary.group_by.names(), ["hour", "source"]);
        let default = Harness::try_parse_from(["test"]).unwrap();
        assert_eq!(
            default.summary.group_by.names(),
            ["event_type", "reason", "destination"]
        );
        let error = Harness::try_parse_from(["test", "--group-by", "colour"]).unwrap_err();
        assert!(error.use_stderr());
        assert!(error.to_string().contains("valid names"), "{error}");
    }

    #[test]
    fn list_table_shows_one_row_per_dead_letter() {
        let dead_letter = DeadLetter {
            id: "12".into(),
            source: "orders.dlq".into(),
            reason_class: ReasonClass::Exhausted.into(),
            death: Some(Death {
                reason: "delivery_limit".into(),
                ..Default::default()
            }),
            destination: "orders".into(),
            message_key: "order-1:pay".into(),
            body_size: 120,
            ..Default::default()
        };
        let mut table = output::table(LIST_COLUMNS);
        table.add_row(list_row(&dead_letter));
        // --wide: every column (80 columns leave out the body size).
        let text = table.lines_for(None).join("\n");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert!(lines[0].starts_with("ID"), "{text}");
        for expected in [
            "12",
            "orders.dlq",
            "exhausted",
            "delivery_limit",
            "order-1:pay",
            "120",
        ] {
            assert!(lines[1].contains(expected), "{expected}: {text}");
        }
    }

    #[test]
    fn list_shows_the_message_id_and_gives_a_body_hash_little_room() {
        let hash = format!("sha256:{}", "ab12".repeat(16));
        let dead_letter = DeadLetter {
            id: "12".into(),
            source: "orders.dlq".into(),
            reason_class: ReasonClass::Rejected.into(),
            destination: "orders".into(),
            event_type: Some("order.paid".into()),
            message_key: hash.clone(),
            properties: Some(redrive_proto::v1::MessageProperties {
                message_id: Some("m-50".into()),
                ..Default::default()
            }),
            message_id: Some("m-50".into()),
            died_at: Some(prost_types::Timestamp {
                seconds: 1_714_564_800,
                nanos: 0,
            }),
            ..Default::default()
        };
        let mut table = output::table(LIST_COLUMNS);
        table.add_row(list_row(&dead_letter));
        let text = table.lines_for(Some(80)).join("\n");
        let header: Vec<&str> = text.lines().next().unwrap().split_whitespace().collect();
        assert_eq!(header[..3], ["ID", "MESSAGE_ID", "SOURCE"], "{text}");
        assert!(text.lines().nth(1).unwrap().contains("m-50"), "{text}");
        assert!(
            text.lines().all(|line| line.chars().count() <= 80),
            "{text}"
        );
        // Fitted: the hash is cut to 12 digits; --wide has it whole.
        crate::table::set_width(Some(80));
        assert_eq!(list_row(&dead_letter)[7], "sha256:ab12ab12ab12…");
        crate::table::set_width(None);
        assert_eq!(list_row(&dead_letter)[7], hash);
        crate::table::set_width(Some(crate::table::DEFAULT_WIDTH));
    }

    #[test]
    fn show_text_has_every_section() {
        let dead_letter = DeadLetter {
            id: "3".into(),
            message_key: "k".into(),
            ..Default::default()
        };
        let mut out = Vec::new();
        write_show(&mut out, &dead_letter, "{\"a\": 1}").unwrap();
        let text = String::from_utf8(out).unwrap();
        for section in [
            "id:",
            "death:",
            "properties:",
            "headers:",
            "body (0 bytes, none, sha256 )",
            "{\"a\": 1}",
        ] {
            assert!(text.contains(section), "{section}: {text}");
        }
    }
}
