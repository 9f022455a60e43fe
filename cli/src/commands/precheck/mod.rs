//! `redrivectl precheck`: the dry run before a replay (`RunPrecheck`), a stored
//! report (`GetPrecheck`) and its items (`ListPrecheckItems`).
//!
//! ```text
//! redrivectl precheck --source Q [selector flags] [precheck options]
//! redrivectl precheck show ID
//! redrivectl precheck items ID [--verdict V] [--page-size N] [--page-token T] [--all]
//! ```
//!
//! The bare form runs a precheck; `show` and `items` are subcommands, and do
//! not mix with the run flags. The run form needs at least one `--source`
//! (the selection a plan will replay is always named explicitly); the other
//! selector flags are those of `dead-letters list` ([`crate::selector`]).
//!
//! # Precheck options
//! | flag | `PrecheckOptions` field |
//! | --- | --- |
//! | `--stale-after TYPE=DUR` (repeatable) | `stale_after[TYPE] = DUR`: TYPE is an event type or a prefix ending in `*` (`payment.*=2h`); each TYPE at most once |
//! | `--stale-after-source SOURCE=DUR` (repeatable) | `stale_after_source[SOURCE] = DUR`: a source (DLQ name or import label) or a prefix ending in `*` |
//! | `--default-stale-after DUR` | `default_stale_after` (event types no pattern matches) |
//! | `--replay-key-window DUR` | `replay_key_window` (planner default 7 days) |
//! | `--max-redrives N` | `max_redrives`, N ≥ 1 (planner default 3) |
//! | `--state-check-batch N` | `state_check_batch_size`, 1–5000 (planner default 500) |
//! | `--state-check-timeout DUR` | `state_check_timeout` (planner default 10 s) |
//! | `--block-on-state-check-error` | `block_on_state_check_error`: a failing hook marks its items `blocked_by_state` instead of failing the precheck |
//! | `--event-time-pointer /json/pointer` | `event_time_pointer` (RFC 6901, starts with `/`) |
//! | `--override-policy REASON` | `override_policy = true`, `override_reason = REASON` |
//!
//! The planner's precheck policy is the floor under these: they may make it
//! stricter freely (the shorter deadline applies); a looser value (a longer
//! deadline, a shorter window, more redrives, another event time pointer) is
//! refused with `invalid_argument` naming the option (exit 65) unless
//! `--override-policy REASON` is given, which the report then shows.
//!
//! Durations are humantime (`90s`, `2h`, `1day 6h`) and must be positive. A
//! wrong value is a usage error naming the flag (exit 64). Without
//! `--block-on-state-check-error`, a state-check hook that is down fails the
//! precheck with `unavailable` and the planner's explanation (exit 69).
//!
//! # Report (`precheck` and `precheck show ID`)
//! People get the id, actor, creation time, digest, total and the span of
//! death times covered; a table of all eight verdict counts in precedence
//! order ([`VERDICTS`]) after an `options:` line with the effective options
//! (the planner's policy merged) and, for an override, a `policy override:`
//! line with its reason; one table per breakdown (reason class, destination,
//! event type, schema version, producer) with value, total, replayable and a
//! column for each other verdict that is not zero in it; the planner's
//! staleness coverage (per event type, the deadline rule that applied, how many
//! are stale and the age of the oldest; `none: never stale` where no rule
//! covers them); the warnings as `WARNING: ...` lines; the first non-replayable items; and a
//! `next: redrivectl precheck items ID --verdict V` hint.
//!
//! `--json` prints the API's `PrecheckReport` in canonical proto3 JSON
//! ([`crate::output::write_message`]: `precheckId`, `actor`, `createdAt`,
//! `digest`, `total`, `options`, `counts`, `byReasonClass`, ...,
//! `sampleBlocked`, `staleness`; default values left out); the text is
//! rendered straight from it ([`write_report`]).
//!
//! # Items (`precheck items ID`)
//! A table of dead letter id, verdict, message key, destination, event type and
//! reason, then `next page token: T` when there are more; `--all` follows the
//! tokens. `--verdict V` keeps one verdict (a name of [`VERDICTS`]; another
//! word is a usage error listing them). `--json`: the API's
//! `ListPrecheckItemsResponse` in canonical proto3 JSON, `{"items": [item,
//! ...], "nextPageToken": "..."}` (every page walked in one; the token left
//! out on the last page).

use crate::args::Paging;
use std::io::Write;

use chrono::Utc;
use clap::{Args, Subcommand};
use redrive_proto::v1::{
    self, GetPrecheckRequest, ListPrecheckItemsRequest, RunPrecheckRequest, Verdict,
};

use crate::{
    args::OptionsArgs,
    client::Planner,
    error::{CliError, EX_OK},
    output::write_message,
    selector::SelectorArgs,
    views::list_items,
};

mod report;

pub use report::{next_hint, options_summary, verdict_count, write_report};

/// The verdicts in precedence order (first match wins in the planner), which
/// is also the order of every count table and JSON `counts` object.
pub const VERDICTS: [Verdict; 8] = [
    Verdict::Replayable,
    Verdict::Duplicate,
    Verdict::AlreadyReplayed,
    Verdict::Looping,
    Verdict::Stale,
    Verdict::BlockedByState,
    Verdict::NeedsCompensation,
    Verdict::Invalid,
];

// ---------------------------------------------------------------------------
// Command line
// ---------------------------------------------------------------------------

/// `precheck` arguments: the run flags, or a subcommand.
#[derive(Debug, Clone, Args)]
// Not `args_conflicts_with_subcommands`: clap counts a global flag given
// before the subcommand (`precheck --json show ID`) as a conflict too, so
// [`PrecheckArgs::into_command`] checks that the run flags stay unset instead.
#[command(
    subcommand_negates_reqs = true,
    override_usage = "redrivectl precheck --source <SOURCE> [selector flags] [precheck options]\n       \
        redrivectl precheck show <ID>\n       \
        redrivectl precheck items <ID> [--verdict <VERDICT>] [--page-size <N>] [--page-token <TOKEN>] [--all]",
    after_help = "Examples:\n  \
        redrivectl precheck --source orders.dlq --since 2h --stale-after 'payment.*=2h'\n  \
        redrivectl precheck show 0190f3a2-7c1e-7b3a-9d4e-2f6a8b1c0d5e\n  \
        redrivectl precheck items 0190f3a2-7c1e-7b3a-9d4e-2f6a8b1c0d5e --verdict blocked_by_state"
)]
pub struct PrecheckArgs {
    #[command(subcommand)]
    #[allow(missing_docs)]
    pub command: Option<PrecheckSubcommand>,

    #[command(flatten)]
    #[allow(missing_docs)]
    pub run: RunArgs,
}

/// `precheck` subcommands.
#[derive(Debug, Clone, Subcommand)]
pub enum PrecheckSubcommand {
    /// Show a stored precheck report.
    Show(ShowArgs),
    /// List a precheck's items and their verdicts, one page at a time (or all with --all).
    Items(ItemsArgs),
}

/// The run form's flags: which dead letters, and how to judge them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Args)]
#[command(mut_arg("sources", |arg| arg.required(true)))]
pub struct RunArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub selector: SelectorArgs,

    #[command(flatten)]
    #[allow(missing_docs)]
    pub options: OptionsArgs,
}

/// `precheck show` arguments.
#[derive(Debug, Clone, Args)]
pub struct ShowArgs {
    /// The precheck id.
    pub id: String,
}

/// `precheck items` flags.
#[derive(Debug, Clone, Args)]
pub struct ItemsArgs {
    /// The precheck id.
    pub id: String,

    /// Only items with this verdict: replayable, duplicate, already_replayed,
    /// looping, stale, blocked_by_state, needs_compensation, invalid.
    #[arg(long, value_name = "VERDICT", value_parser = parse_verdict)]
    pub verdict: Option<Verdict>,

    #[command(flatten)]
    #[allow(missing_docs)]
    pub page: Paging,
}

/// What `precheck` was asked to do, with the flags checked.
#[derive(Debug, Clone, PartialEq)]
#[allow(clippy::large_enum_variant)] // One per process; boxing buys nothing.
pub enum PrecheckCommand {
    /// Run a precheck.
    Run {
        /// Which dead letters (`--since` is counted back when it runs).
        selector: SelectorArgs,
        /// How to judge them.
        options: v1::PrecheckOptions,
    },
    /// Show a stored report.
    Show(String),
    /// List items.
    Items {
        /// The precheck id.
        id: String,
        /// Only this verdict.
        verdict: Option<Verdict>,
        /// Which pages.
        page: Paging,
    },
}

impl PrecheckArgs {
    /// The command, after the checks clap cannot make on one value.
    ///
    /// # Errors
    /// [`CliError::Usage`] when a `--stale-after` pattern is given twice, or
    /// run flags come with `show` or `items`.
    pub fn into_command(self) -> Result<PrecheckCommand, CliError> {
        if let Some(command) = &self.command
            && self.run != RunArgs::default()
        {
            let name = match command {
                PrecheckSubcommand::Show(_) => "show",
                PrecheckSubcommand::Items(_) => "items",
            };
            return Err(CliError::Usage(format!(
                "`precheck {name}` takes no selector flags or precheck options (they run a new \
                 precheck: redrivectl precheck --source Q ...)"
            )));
        }
        Ok(match self.command {
            Some(PrecheckSubcommand::Show(args)) => PrecheckCommand::Show(args.id),
            Some(PrecheckSubcommand::Items(args)) => PrecheckCommand::Items {
                id: args.id,
                verdict: args.verdict,
                page: args.page,
            },
            None => PrecheckCommand::Run {
                options: self.run.options.to_options()?,
                selector: self.run.selector,
            },
        })
    }
}

/// The verdict named `name` (`blocked_by_state`; `blocked-by-state` too).
///
/// # Errors
/// A message listing the valid names.
pub fn parse_verdict(name: &str) -> Result<Verdict, String> {
    let normalized = name.trim().to_ascii_lowercase().replace('-', "_");
    VERDICTS
        .into_iter()
        .find(|verdict| verdict.name() == normalized)
        .ok_or_else(|| {
            format!(
                "unknown verdict {name:?}; valid names: {}",
                VERDICTS.map(Verdict::name).join(", ")
            )
        })
}

// ---------------------------------------------------------------------------
// Running
// ---------------------------------------------------------------------------

/// Runs a `precheck` command, writing its output to `out`.
///
/// # Errors
/// gRPC errors from the planner (a state-check hook that is down is
/// `unavailable`); output errors.
pub async fn run(
    planner: &mut Planner,
    command: PrecheckCommand,
    json: bool,
    out: &mut dyn Write,
) -> Result<u8, CliError> {
    let report = match command {
        PrecheckCommand::Run { selector, options } => {
            let blocking = options.block_on_state_check_error;
            planner
                .run_precheck(RunPrecheckRequest {
                    selector: Some(selector.to_selector(Utc::now())),
                    options: Some(options),
                })
                .await
                .map_err(|status| name_the_flag(status, blocking))?
        }
        PrecheckCommand::Show(precheck_id) => {
            planner
                .get_precheck(GetPrecheckRequest { precheck_id })
                .await?
        }
        PrecheckCommand::Items { id, verdict, page } => {
            return items(planner, ItemsQuery { id, verdict, page }, json, out).await;
        }
    }
    .into_inner();
    if json {
        write_message(out, &report)?;
    } else {
        write_report(out, &report)?;
    }
    Ok(EX_OK)
}

/// A state-check hook that is down fails the precheck with `unavailable` and a
/// message naming the `block_on_state_check_error` option; add the flag that
/// sets it, keeping the planner's message whole.
fn name_the_flag(status: tonic::Status, blocking: bool) -> tonic::Status {
    if status.code() == tonic::Code::Unavailable
        && !blocking
        && status.message().contains("block_on_state_check_error")
    {
        return tonic::Status::unavailable(format!(
            "{} (redrivectl precheck --block-on-state-check-error)",
            status.message()
        ));
    }
    status
}

// ---------------------------------------------------------------------------
// items
// ---------------------------------------------------------------------------

struct ItemsQuery {
    id: String,
    verdict: Option<Verdict>,
    page: Paging,
}

async fn items(
    planner: &mut Planner,
    query: ItemsQuery,
    json: bool,
    out: &mut dyn Write,
) -> Result<u8, CliError> {
    let fetch = async |page_size, page_token| {
        let request = ListPrecheckItemsRequest {
            precheck_id: query.id.clone(),
            verdict: query.verdict.unwrap_or(Verdict::Unspecified).into(),
            page_size,
            page_token,
        };
        let response = planner.list_precheck_items(request).await?.into_inner();
        Ok((response.items, response.next_page_token))
    };
    list_items(out, json, "no items match", &query.page, fetch).await
}

#[cfg(test)]
mod tests {
    use clap::Parser;
    use redrive_proto::{
        time::{duration, timestamp},
        v1::PrecheckItem,
    };

    use std::time::Duration;

    use redrive_proto::v1::PrecheckReport;

    use super::*;
    use crate::args::{StaleAfter, parse_stale_after};
    use crate::selector::parse_rfc3339;
    use crate::views::item_row;

    /// The verdicts' names in precedence order, as the reports print them.
    const VERDICT_NAMES: [&str; 8] = [
        "replayable",
        "duplicate",
        "already_replayed",
        "looping",
        "stale",
        "blocked_by_state",
        "needs_compensation",
        "invalid",
    ];

    #[derive(Debug, Parser)]
    struct Harness {
        #[command(flatten)]
        options: OptionsArgs,
    }

    fn options(args: &[&str]) -> Result<OptionsArgs, clap::Error> {
        Harness::try_parse_from(std::iter::once("test").chain(args.iter().copied()))
            .map(|harness| harness.options)
    }

    fn secs(seconds: u64) -> Option<prost_types::Duration> {
        Some(duration(Duration::from_secs(seconds)))
    }

    #[test]
    fn stale_after_reads_type_and_duration() {
        assert_eq!(
            parse_stale_after("payment.*=2h").unwrap(),
            StaleAfter {
                pattern: "payment.*".into(),
                max_age: Duration::from_secs(7200),
            }
        );
        assert_eq!(
            parse_stale_after(" order.paid = 1day 6h ").unwrap(),
            StaleAfter {
                pattern: "order.paid".into(),
                max_age: Duration::from_secs(30 * 3600),
            }
        );
        assert_eq!(parse_stale_after("*=90s").unwrap().pattern, "*");
    }

    #[test]
    fn stale_after_errors_say_what_is_wrong() {
        for (text, expected) in [
            ("payment.*", "no '='"),
            ("=2h", "event type before '=' is empty"),
            ("pay*ment=2h", "'*' may only end a pattern"),
            ("payment.*=", "no duration"),
            ("payment.*=soon", "duration \"soon\""),
            ("payment.*=0s", "longer than zero"),
        ] {
            let error = parse_stale_after(text).unwrap_err();
            assert!(error.contains(expected), "{text}: {error}");
            assert!(error.contains("TYPE=DURATION"), "{text}: {error}");
        }
        let error = options(&["--stale-after", "payment"]).unwrap_err();
        assert!(error.use_stderr());
        assert!(error.to_string().contains("--stale-after"), "{error}");
    }

    #[test]
    fn options_land_in_their_fields() {
        let parsed = options(&[
            "--stale-after",
            "payment.*=2h",
            "--stale-after",
            "order.paid=30m",
            "--default-stale-after",
            "1day",
            "--replay-key-window",
            "3days",
            "--max-redrives",
            "5",
            "--state-check-batch",
            "200",
            "--state-check-timeout",
            "3s",
            "--block-on-state-check-error",
            "--event-time-pointer",
            "/meta/occurred_at",
            "--stale-after-source",
            "orders.*=10m",
            "--override-policy",
            " INC-7: late captures are fine ",
        ])
        .unwrap();
        assert_eq!(
            parsed.to_options().unwrap(),
            v1::PrecheckOptions {
                stale_after: [
                    ("payment.*".to_owned(), duration(Duration::from_secs(7200))),
                    ("order.paid".to_owned(), duration(Duration::from_secs(1800))),
                ]
                .into_iter()
                .collect(),
                default_stale_after: secs(86_400),
                replay_key_window: secs(3 * 86_400),
                max_redrives: 5,
                state_check_batch_size: 200,
                state_check_timeout: secs(3),
                block_on_state_check_error: true,
                event_time_pointer: "/meta/occurred_at".into(),
                stale_after_source: [("orders.*".to_owned(), duration(Duration::from_secs(600)))]
                    .into_iter()
                    .collect(),
                override_policy: true,
                override_reason: "INC-7: late captures are fine".into(),
            }
        );
        assert_eq!(
            options(&[]).unwrap().to_options().unwrap(),
            v1::PrecheckOptions::default()
        );
    }

    #[test]
    fn bad_options_are_usage_errors() {
        for args in [
            &["--stale-after", "pay*ment=2h"][..],
            &["--default-stale-after", "0s"],
            &["--replay-key-window", "forever"],
            &["--max-redrives", "0"],
            &["--state-check-batch", "0"],
            &["--state-check-batch", "5001"],
            &["--state-check-timeout", "ten seconds"],
            &["--event-time-pointer", "meta.occurred_at"],
            &["--stale-after-source", "orders.dlq"],
            &["--override-policy", "  "],
        ] {
            let error = options(args).unwrap_err();
            assert!(error.use_stderr(), "{args:?}");
            assert!(error.to_string().contains(args[0]), "{args:?}: {error}");
        }
        let error = options(&["--stale-after", "a=1h", "--stale-after", "a=2h"])
            .unwrap()
            .to_options()
            .unwrap_err();
        assert_eq!(error.exit_code(), crate::error::EX_USAGE);
        assert!(
            error
                .to_string()
                .starts_with("--stale-after: a is given twice"),
            "{error}"
        );
    }

    #[test]
    fn verdict_names_round_trip_in_precedence_order() {
        let names = VERDICTS.map(Verdict::name);
        assert_eq!(names, VERDICT_NAMES);
        for verdict in VERDICTS {
            assert_eq!(parse_verdict(verdict.name()), Ok(verdict));
        }
        assert_eq!(
            parse_verdict("Blocked-By-State"),
            Ok(Verdict::BlockedByState)
        );
        let error = parse_verdict("blocked").unwrap_err();
        assert!(
            error.ends_with(
                "valid names: replayable, duplicate, already_replayed, looping, stale, \
                 blocked_by_state, needs_compensation, invalid"
            ),
            "{error}"
        );
        assert!(parse_verdict("unspecified").is_err());
    }

    fn report() -> PrecheckReport {
        let at = |text| Some(timestamp(parse_rfc3339(text).unwrap()));
        // One reason class: its counts are the whole report's.
        let counts = Some(v1::VerdictCounts {
            replayable: 6,
            stale: 3,
            blocked_by_state: 1,
            ..Default::default()
        });
        PrecheckReport {
            precheck_id: "0190f3a2-7c1e-7b3a-9d4e-2f6a8b1c0d5e".into(),
            actor: "alice".into(),
            created_at: at("2024-05-01T12:00:00Z"),
            total: 10,
            counts,
            by_reason_class: vec![v1::Breakdown {
                value: "rejected".into(),
                total: 10,
                counts,
            }],
            by_event_type: vec![
                v1::Breakdown {
                    value: "payment.captured".into(),
                    total: 4,
                    counts: Some(v1::VerdictCounts {
                        replayable: 1,
                        stale: 3,
                        ..Default::default()
                    }),
                },
                v1::Breakdown {
                    value: String::new(),
                    total: 6,
                    counts: None,
                },
            ],
            died_from: at("2024-05-01T10:00:00Z"),
            died_to: at("2024-05-01T11:30:00Z"),
            warnings: vec!["heterogeneous selection: 2 schema versions (1, 2)".into()],
            digest: "ab12".into(),
            sample_blocked: vec![PrecheckItem {
                dead_letter_id: "7".into(),
                message_key: "order-1:pay".into(),
                verdict: Verdict::Stale.into(),
                reason: "older than 2h".into(),
                destination: "payments".into(),
                event_type: Some("payment.captured".into()),
                at_send: false,
                message_id: String::new(),
            }],
            staleness: vec![
                v1::StalenessCoverage {
                    event_type: String::new(),
                    rule: String::new(),
                    max_age: None,
                    count: 6,
                    stale: 0,
                    oldest_age: Some(duration(Duration::from_secs(3 * 86_400 + 7200))),
                },
                v1::StalenessCoverage {
                    event_type: "payment.captured".into(),
                    rule: "stale_after payment.*=2h0m".into(),
                    max_age: Some(duration(Duration::from_secs(7200))),
                    count: 4,
                    stale: 3,
                    oldest_age: Some(duration(Duration::from_secs(5 * 3600 + 60))),
                },
            ],
            options: Some(v1::PrecheckOptions {
                stale_after: [("payment.*".to_owned(), duration(Duration::from_secs(7200)))].into(),
                stale_after_source: [(
                    "orders.dlq".to_owned(),
                    duration(Duration::from_secs(1800)),
                )]
                .into(),
                replay_key_window: secs(7 * 86_400),
                max_redrives: 3,
                override_policy: true,
                override_reason: "INC-7: late captures are fine".into(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// The (name, count) rows of the verdict table in `text`.
    fn verdict_rows(text: &str) -> Vec<(String, String)> {
        text.lines()
            .skip_while(|line| !line.starts_with("VERDICT"))
            .skip(1)
            .take(VERDICTS.len())
            .map(|line| {
                let mut cells = line.split_whitespace().map(str::to_owned);
                (
                    cells.next().unwrap_or_default(),
                    cells.next().unwrap_or_default(),
                )
            })
            .collect()
    }

    /// The rows, as their cells, of the table under `heading` in `text`.
    fn section_rows(text: &str, heading: &str) -> Vec<Vec<String>> {
        text.lines()
            .skip_while(|line| *line != heading)
            .skip(2)
            .take_while(|line| !line.is_empty())
            .map(|line| line.split_whitespace().map(str::to_owned).collect())
            .collect()
    }

    /// Was `report_json_has_the_stable_fields_and_every_count` (the old
    /// JSON view, gone: `--json` prints the API's message): the counts and
    /// breakdowns it checked, as the text shows them.
    #[test]
    fn report_text_has_every_count() {
        let mut out = Vec::new();
        write_report(&mut out, &report()).unwrap();
        let text = String::from_utf8(out).unwrap();
        let counts = [6, 0, 0, 0, 3, 1, 0, 0];
        assert_eq!(
            verdict_rows(&text),
            VERDICT_NAMES
                .iter()
                .zip(counts)
                .map(|(name, count)| ((*name).to_owned(), count.to_string()))
                .collect::<Vec<_>>(),
            "{text}"
        );
        assert_eq!(
            section_rows(&text, "by reason class:"),
            [["rejected", "10", "6", "3", "1"]],
            "{text}"
        );
        // The row without a value (`-`): its total and zero counts.
        assert_eq!(
            section_rows(&text, "by event type:"),
            [["payment.captured", "4", "1", "3"], ["-", "6", "0", "0"]],
            "{text}"
        );
        for empty in ["by destination:", "by schema version:", "by producer:"] {
            assert!(!text.contains(empty), "{empty}: {text}");
        }

        // An empty report still has all eight counts, and says what it lacks.
        let mut out = Vec::new();
        write_report(&mut out, &PrecheckReport::default()).unwrap();
        let empty = String::from_utf8(out).unwrap();
        assert_eq!(
            verdict_rows(&empty),
            VERDICT_NAMES
                .iter()
                .map(|name| ((*name).to_owned(), "0".to_owned()))
                .collect::<Vec<_>>(),
            "{empty}"
        );
        let field = |name: &str| {
            empty
                .lines()
                .find_map(|line| line.strip_prefix(name))
                .map(str::trim)
        };
        assert_eq!(field("died:"), Some("- (nothing selected)"), "{empty}");
        assert_eq!(field("created at:"), Some("-"), "{empty}");
        assert!(!empty.contains("by "), "{empty}");
    }

    #[test]
    fn report_text_reads_top_to_bottom() {
        let mut out = Vec::new();
        write_report(&mut out, &report()).unwrap();
        let text = String::from_utf8(out).unwrap();
        let mut at = 0;
        for expected in [
            "precheck id:      0190f3a2-7c1e-7b3a-9d4e-2f6a8b1c0d5e",
            "actor:            alice",
            "digest:           ab12",
            "total:            10",
            "died:             2024-05-01T10:00:00.000Z .. 2024-05-01T11:30:00.000Z",
            "options:          stale after payment.*=2h, source orders.dlq=30m; replay-key window 7days; max redrives 3",
            "policy override:  INC-7: late captures are fine",
            "VERDICT",
        ]
        .into_iter()
        .chain(VERDICT_NAMES)
        .chain([
            "by reason class:",
            "VALUE     TOTAL  REPLAYABLE  STALE  BLOCKED_BY_STATE",
            "rejected  10     6           3      1",
            "by event type:",
            "payment.captured  4      1           3",
            "staleness (which deadline applied):",
            "(none)            none: never stale           6      0      3d2h",
            "payment.captured  stale_after payment.*=2h0m  4      3      5h1m",
            "WARNING: heterogeneous selection: 2 schema versions (1, 2)",
            "first non-replayable items (1 shown of 4 not replayable):",
            "7               order-1:pay  stale    older than 2h",
            "next: redrivectl precheck items 0190f3a2-7c1e-7b3a-9d4e-2f6a8b1c0d5e --verdict stale",
        ]) {
            let found = text[at..]
                .find(expected)
                .unwrap_or_else(|| panic!("{expected:?} after byte {at} in:\n{text}"));
            at += found + expected.len();
        }
        assert!(!text.contains("by destination:"), "{text}");
        // Every verdict has its count row, zeros included.
        assert!(text.contains("\nneeds_compensation  0\n"), "{text}");
    }

    #[test]
    fn the_hint_names_the_most_common_blocking_verdict() {
        let mut report = report();
        assert!(next_hint(&report).ends_with("--verdict stale"));
        report.counts.get_or_insert_default().invalid = 3;
        // A tie goes to the verdict earlier in precedence.
        assert!(next_hint(&report).ends_with("--verdict stale"));
        report.counts.get_or_insert_default().invalid = 4;
        assert!(next_hint(&report).ends_with("--verdict invalid"));
        report.counts = Some(v1::VerdictCounts {
            replayable: 10,
            ..Default::default()
        });
        assert!(next_hint(&report).ends_with(&report.precheck_id));
    }

    #[test]
    fn a_hook_outage_names_the_flag() {
        let status = tonic::Status::unavailable(
            "hook down; the precheck is not complete. Fix the hook, or run the precheck with \
             block_on_state_check_error to mark its messages blocked_by_state",
        );
        let named = name_the_flag(status.clone(), false);
        assert_eq!(named.code(), tonic::Code::Unavailable);
        assert!(named.message().starts_with(status.message()));
        assert!(
            named
                .message()
                .ends_with("(redrivectl precheck --block-on-state-check-error)")
        );
        assert_eq!(
            name_the_flag(status.clone(), true).message(),
            status.message()
        );
        let other = tonic::Status::unavailable("database down");
        assert_eq!(name_the_flag(other, false).message(), "database down");
    }

    #[test]
    fn item_rows_follow_the_columns() {
        let item = &report().sample_blocked[0];
        assert_eq!(
            item_row(item),
            [
                "7",
                "stale",
                "order-1:pay",
                "payments",
                "payment.captured",
                "older than 2h"
            ]
        );
        // Was a check of the old JSON view of a default item: its verdict
        // `unspecified`, no event type, not at send.
        assert_eq!(
            item_row(&PrecheckItem::default()),
            ["", "unspecified", "-", "-", "-", "-"]
        );
    }
}
