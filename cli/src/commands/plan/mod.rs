//! `redrivectl plan`: replay plans, from creation to the audit report
//! (`CreatePlan`, `ApprovePlan`, `GetPlan`, `ListPlans`, `WatchPlan`,
//! `PromotePlan`, `PausePlan`, `ResumePlan`, `CancelPlan`,
//! `ListCompensations`, `GetAuditReport`, `ExportAudit`).
//!
//! ```text
//! redrivectl plan create --precheck ID --rate N --burst N --rationale TEXT
//!            [--destination queue|exchange|redirect:EXCHANGE/ROUTING_KEY] [--slice-size N]
//!            [--canary-fraction F] [--ramp SHARES] [--observe DUR] [--ordered]
//!            [--webhook-url URL --webhook-secret-file FILE]
//! redrivectl plan approve ID --digest D [--override-arrivals --reason TEXT]
//! redrivectl plan status ID                      (alias: show)
//! redrivectl plan list [--state S]... [--page-size N] [--page-token T] [--all]
//! redrivectl plan watch ID [--events] [--stall-after DUR]
//! redrivectl plan wait ID [--timeout DUR] [--interval DUR]
//! redrivectl plan report ID [--format text|json|jsonl|csv]
//! redrivectl plan promote|pause|resume|cancel ID [--reason TEXT]
//! redrivectl plan resume ID --override-arrivals --reason TEXT
//! redrivectl plan compensations ID [--page-size N] [--page-token T] [--all]
//! ```
//!
//! # `create`
//! | flag | `CreatePlanRequest` field |
//! | --- | --- |
//! | `--precheck ID` | `precheck_id` (required) |
//! | `--rate N` | `rate.per_second`: messages per second, from 0.001 to 1000000 (`0.5` is one every 2 s) (required) |
//! | `--burst N` | `rate.burst`: messages that may go at once, ≥ 1 (required) |
//! | `--rationale TEXT` | `rate.rationale`: how the rate follows from the downstream's capacity; not blank (required) |
//! | `--destination D` | `destination`: `queue` (default: the queue each message died in), `exchange` (the exchange and routing keys of its death) or `redirect:EXCHANGE/ROUTING_KEY` (split at the first `/`; the routing key may be empty, `redirect:quarantine/`; an empty exchange is the default exchange, `redirect:/parking` routes to queue `parking`) |
//! | `--slice-size N` | `slice_size`, ≥ 1 (planner default 100) |
//! | `--canary-fraction F` | `canary_fraction`, 0 < F ≤ 1 (planner default 0.01, at least one item) |
//! | `--ramp 10%,50%` | `ramp`: waves between the canary and the main wave, as cumulative shares of the items |
//! | `--observe DUR` | `observe_for`, humantime of at least `1ms`, the planner's resolution (planner default 15 min) |
//! | `--ordered` | `ordered`: publish in dead-letter order across all executors, one slice at a time; a failed item is not retried after later ones |
//! | `--webhook-url URL` | `webhook_url`: where this plan's events are also posted (docs/webhooks.md); needs `--webhook-secret-file` |
//! | `--webhook-secret-file FILE` | `webhook_secret`: the file's text without surrounding whitespace, `whsec_<base64>`; read just before the call, never printed |
//!
//! A bad value is a usage error naming the flag (exit 64), before any call.
//! It prints the plan and `next: redrivectl plan approve ID --digest D`.
//!
//! # Output
//! `create`, `approve`, `status`, `promote`, `pause`, `resume`, `cancel` and
//! `wait` print the plan: key fields, counts per action (all eight), operator
//! actions, warnings, and a `next:` hint for its state; `--json` prints the
//! API's `Plan` in canonical proto3 JSON. `list` prints a table (`--json`:
//! the `ListPlansResponse`, `{"plans": [plan, ...], "nextPageToken":
//! "..."}`), `compensations` the precheck item table of the items that need
//! compensation, both those the precheck found and those the state re-check
//! right before publishing found (verdict `needs_compensation (at send)`)
//! (`--json`: the `ListCompensationsResponse`, `{"items": [...],
//! "nextPageToken": "..."}`).
//!
//! # `watch`
//! Follows `WatchPlan` until the planner ends the stream (the plan is final),
//! then prints `plan ID STATE` and exits 0 whatever the state. On a terminal
//! one progress line is redrawn in place every second (`[####----] main
//! 450/1000 45.0% sent 440 skipped_stale 10 rate 12.5/s elapsed 4m05s eta
//! 44s`, the counts that are not zero, then the pace of [`pace`]); elsewhere
//! one line per change, and the line again every 10 s while nothing changes.
//! `--events` also asks for the audit events and prints each (`AT ACTION KEY
//! REASON`). A plan in `canary` or `main` whose `items_done` stands still for
//! `--stall-after` (default 30 s) gets one `warning: no progress for ...`
//! line, and a `progress resumed after ...` line when it moves again.
//! `--json`: one object per line, the API's `WatchPlanResponse`s
//! (`{"progress": plan}`, `{"event": audit event}`, canonical proto3 JSON),
//! and the CLI's own `{"stalled": stall}` or `{"resumed": stall}`
//! ([`live::StallJson`]: no API message says them).
//! A stream that ends while the plan is not final is `unavailable` (exit 69):
//! watch again.
//!
//! # `wait`
//! Polls `GetPlan` every `--interval` (default 1 s) until the plan is final,
//! then prints it. Exit 0 when `completed`; 1 when `cancelled` or `aborted`
//! (with `plan ID ended STATE (reason), not completed` on stderr); `paused` is
//! not final (it can be resumed), so the wait goes on. `--timeout DUR`: exit
//! 75 when it runs out, after printing the last plan seen. An `unavailable`
//! planner is retried until the timeout.
//!
//! # `report`
//! `--format text` (the default; `json` with `--json`): `GetAuditReport`,
//! printed for people (plan fields, counts per action, the number of sent keys
//! and the first 20, the items not sent with their reasons) or as the API's
//! `AuditReport` in canonical proto3 JSON. `--format jsonl|csv`:
//! `ExportAudit`, the planner's export (the reconciliation file), whatever
//! `--json` says: each chunk written as it arrives, nothing re-parsed (the
//! planner writes times in the one format and makes cells that a
//! spreadsheet would run as formulas text).

pub mod live;
pub mod pace;
mod parse;
pub mod view;
pub mod wait;

pub use parse::{
    parse_canary_fraction, parse_destination, parse_kind, parse_observe, parse_ramp_share,
    parse_rate, parse_rationale, parse_state,
};

use crate::{
    args::Paging,
    output::{ListingKind, list_pages},
};
use std::{io::Write, time::Duration};

use clap::{Args, Subcommand, ValueEnum};
use redrive_proto::{
    time::duration,
    v1::{
        ApprovePlanRequest, CreatePlanRequest, ExportAuditRequest, ExportFormat,
        GetAuditReportRequest, GetPlanRequest, ListCompensationsRequest, ListPlansRequest,
        PlanControlRequest, PlanKind, PlanState, Rate,
    },
};

use self::{live::WatchMode, view::Destination, wait::WaitOutcome};
use crate::{
    args::parse_positive_duration,
    client::Planner,
    error::{CliError, EX_OK},
    output::{terminal_width, write_message},
    views::list_items,
};

// ---------------------------------------------------------------------------
// Command line
// ---------------------------------------------------------------------------

/// `plan` subcommands.
#[derive(Debug, Clone, Subcommand)]
pub enum PlanCommand {
    /// Create a plan from a precheck: rate, destination, canary wave, slices.
    #[command(after_help = "Examples:\n  \
        redrivectl plan create --precheck 0190f3a2-7c1e-7b3a-9d4e-2f6a8b1c0d5e --rate 50 --burst 10 \\\n    \
        --rationale 'payments-api sustains 300/s, peak traffic 200/s: 50/s keeps 50/s in reserve'\n  \
        redrivectl plan create --precheck ID --rate 5 --burst 1 --rationale '...' \\\n    \
        --destination redirect:quarantine/ --canary-fraction 0.05 --observe 30m")]
    Create(CreateArgs),
    /// Approve a plan with the digest of the precheck report you read.
    Approve(ApproveArgs),
    /// Show a plan: state, progress, counts per action.
    #[command(visible_alias = "show")]
    Status(IdArgs),
    /// List plans, one page at a time (or all with --all).
    List(ListArgs),
    /// Follow a plan live until it is final (a progress bar on a terminal).
    Watch(WatchArgs),
    /// Wait until a plan is final: exit 0 when completed, 1 when cancelled or
    /// aborted, 75 on --timeout.
    Wait(WaitArgs),
    /// The audit report: counts per action, sent keys, items not sent; or the
    /// export (--format jsonl|csv) for reconciliation.
    Report(ReportArgs),
    /// End the observation window now and start the main wave.
    Promote(ControlArgs),
    /// Pause a plan (executors stop claiming its slices).
    Pause(ControlArgs),
    /// Resume a paused plan.
    Resume(ControlArgs),
    /// Cancel a plan for good.
    Cancel(ControlArgs),
    /// List the items that need a person (needs_compensation): never replayed.
    Compensations(PageArgs),
}

/// `plan create` flags.
#[derive(Debug, Clone, PartialEq, Args)]
pub struct CreateArgs {
    /// The precheck to replay the replayable items of.
    #[arg(long = "precheck", value_name = "ID")]
    pub precheck_id: String,

    /// Sustained replay rate in messages per second, from 0.001 to 1000000
    /// (0.5 = one message every 2 s); shared by every executor and every plan
    /// to the same destination.
    #[arg(long, value_name = "PER_SECOND", value_parser = parse_rate, allow_negative_numbers = true)]
    pub rate: f64,

    /// Messages that may go at once (token bucket size), 1 to 1000000.
    #[arg(long, value_name = "N", allow_negative_numbers = true,
          value_parser = clap::value_parser!(u32).range(1..=i64::from(redrive_proto::limits::MAX_RATE_BURST)))]
    pub burst: u32,

    /// Why this rate is safe: how it follows from the downstream's capacity,
    /// e.g. 'payments-api sustains 300/s, peak traffic is 200/s, so 50/s
    /// leaves headroom'. Recorded on the plan.
    #[arg(long, value_name = "TEXT", value_parser = parse_rationale)]
    pub rationale: String,

    /// Where to publish: queue (the queue each message died in, through the
    /// default exchange), exchange (the exchange and routing keys of its
    /// death), or redirect:EXCHANGE/ROUTING_KEY (the routing key may be empty:
    /// redirect:quarantine/).
    #[arg(long, value_name = "DESTINATION", default_value = "queue", value_parser = parse_destination)]
    pub destination: Destination,

    /// Items per slice, the unit an executor claims, 1 to 10000 (planner
    /// default 100).
    #[arg(long, value_name = "N", allow_negative_numbers = true,
          value_parser = clap::value_parser!(u32).range(1..=i64::from(redrive_proto::limits::MAX_SLICE_SIZE)))]
    pub slice_size: Option<u32>,

    /// Fraction of the items in the canary wave, 0 < F <= 1 (planner default
    /// 0.01, at least one item).
    #[arg(long, value_name = "F", value_parser = parse_canary_fraction)]
    pub canary_fraction: Option<f64>,

    /// Waves between the canary and the main wave, each observed and
    /// promoted by itself: the cumulative share of the items at each wave's
    /// end, e.g. `10%,50%` (with the 1% canary: 1% → 10% → 50% → the rest).
    #[arg(long, value_name = "SHARES", value_delimiter = ',', value_parser = parse_ramp_share)]
    pub ramp: Vec<f64>,

    /// How long to observe after the canary wave before the main wave
    /// (planner default 15m).
    #[arg(long = "observe", value_name = "DURATION", value_parser = parse_observe)]
    pub observe_for: Option<Duration>,

    /// Publish in dead-letter order across all executors: one slice at a
    /// time, and an item that fails is not retried after later ones (slower).
    /// Without it, order is kept only within a slice.
    #[arg(long)]
    pub ordered: bool,

    /// Where this plan's events (paused, ended, gate trips) are also posted,
    /// signed (docs/webhooks.md): https://, or http:// to a loopback
    /// address. Needs --webhook-secret-file.
    #[arg(long, value_name = "URL", requires = "webhook_secret_file")]
    pub webhook_url: Option<String>,

    /// A file holding the secret --webhook-url's events are signed with
    /// (`whsec_` and base64 of 24 to 64 random bytes).
    #[arg(long, value_name = "FILE", requires = "webhook_url")]
    pub webhook_secret_file: Option<std::path::PathBuf>,
}

/// `plan approve` arguments.
#[derive(Debug, Clone, PartialEq, Eq, Args)]
pub struct ApproveArgs {
    /// The plan id.
    pub id: String,

    /// The digest of the precheck report you read (`plan create` and `precheck
    /// show` print it); the planner refuses a different one.
    #[arg(long, value_name = "DIGEST")]
    pub digest: String,

    /// Approve although dead letters failing like the plan's own died after
    /// its precheck (the planner refuses otherwise, with the figures), and
    /// let the plan run through more of them; needs --reason, recorded as
    /// the operator action `override_arrivals`.
    #[arg(long, requires = "reason")]
    pub override_arrivals: bool,

    /// Why the arrivals are overridden.
    #[arg(long, value_name = "TEXT", requires = "override_arrivals")]
    pub reason: Option<String>,
}

/// A plan id.
#[derive(Debug, Clone, PartialEq, Eq, Args)]
pub struct IdArgs {
    /// The plan id.
    pub id: String,
}

/// `plan list` flags.
#[derive(Debug, Clone, PartialEq, Eq, Args)]
pub struct ListArgs {
    /// Only plans in this state; repeatable: awaiting_approval, canary,
    /// observing, main, completed, paused, cancelled, aborted.
    #[arg(long = "state", value_name = "STATE", value_parser = parse_state)]
    pub states: Vec<PlanState>,

    /// Only plans of this kind; repeatable: bulk (made from a precheck and
    /// approved) or single (`redrivectl replay`).
    #[arg(long = "kind", value_name = "KIND", value_parser = parse_kind)]
    pub kinds: Vec<PlanKind>,

    #[command(flatten)]
    #[allow(missing_docs)]
    pub page: Paging,
}

/// A plan id and paging flags.
#[derive(Debug, Clone, PartialEq, Eq, Args)]
pub struct PageArgs {
    /// The plan id.
    pub id: String,

    #[command(flatten)]
    #[allow(missing_docs)]
    pub page: Paging,
}

/// `plan watch` flags.
#[derive(Debug, Clone, PartialEq, Eq, Args)]
pub struct WatchArgs {
    /// The plan id.
    pub id: String,

    /// Also print every audit event (time, action, message key, reason).
    #[arg(long)]
    pub events: bool,

    /// Warn when a plan in canary or main has made no progress (items_done
    /// unchanged) for this long; once per stall, and again when it moves.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_positive_duration)]
    pub stall_after: Duration,
}

/// `plan wait` flags.
#[derive(Debug, Clone, PartialEq, Eq, Args)]
pub struct WaitArgs {
    /// The plan id.
    pub id: String,

    /// Give up after this long (exit 75); default: wait as long as it takes.
    #[arg(long, value_name = "DURATION", value_parser = parse_positive_duration)]
    pub timeout: Option<Duration>,

    /// How often to ask the planner.
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = parse_positive_duration)]
    pub interval: Duration,
}

/// `plan report` flags.
#[derive(Debug, Clone, PartialEq, Eq, Args)]
pub struct ReportArgs {
    /// The plan id.
    pub id: String,

    /// text (for people; the default) or json: the audit report; jsonl or
    /// csv: every audit event, exported by the planner (cells starting with
    /// = + - @ get a ' in front, safe for spreadsheets). Default: json with
    /// --json, else text.
    #[arg(long, value_name = "FORMAT")]
    pub format: Option<ReportFormat>,
}

/// `plan report --format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ReportFormat {
    /// The audit report for people.
    Text,
    /// The audit report as one JSON document.
    Json,
    /// The planner's export, one JSON object per audit event.
    Jsonl,
    /// The planner's export as CSV.
    Csv,
}

/// `plan promote | pause | resume | cancel` arguments.
#[derive(Debug, Clone, PartialEq, Eq, Args)]
pub struct ControlArgs {
    /// The plan id.
    pub id: String,

    /// Why; recorded with the operator action.
    #[arg(long, value_name = "TEXT")]
    pub reason: Option<String>,

    /// `resume` only: go on although dead letters failing like the plan's
    /// own keep arriving (the planner no longer pauses it for them); needs
    /// --reason, recorded as the operator action `override_arrivals`.
    #[arg(long, requires = "reason")]
    pub override_arrivals: bool,
}

impl CreateArgs {
    /// The request; unset flags leave the planner's defaults.
    pub fn to_request(&self) -> CreatePlanRequest {
        CreatePlanRequest {
            precheck_id: self.precheck_id.clone(),
            rate: Some(Rate {
                per_second: self.rate,
                burst: self.burst,
                rationale: self.rationale.clone(),
            }),
            destination: Some(self.destination.to_proto()),
            slice_size: self.slice_size.unwrap_or(0),
            canary_fraction: self.canary_fraction,
            ramp: self.ramp.clone(),
            observe_for: self.observe_for.map(duration),
            ordered: self.ordered,
            webhook_url: self.webhook_url.clone().unwrap_or_default(),
            // Read by `webhook_secret`, just before the call.
            webhook_secret: String::new(),
        }
    }

    /// The text of `--webhook-secret-file` without surrounding whitespace
    /// ("" without the flag).
    ///
    /// # Errors
    /// A usage error naming the flag and the file, never its content.
    pub fn webhook_secret(&self) -> Result<String, CliError> {
        let Some(path) = &self.webhook_secret_file else {
            return Ok(String::new());
        };
        std::fs::read_to_string(path)
            .map(|text| text.trim().to_owned())
            .map_err(|error| {
                CliError::Usage(format!(
                    "--webhook-secret-file: cannot read {}: {error}",
                    path.display()
                ))
            })
    }
}

// ---------------------------------------------------------------------------
// Running
// ---------------------------------------------------------------------------

/// Runs a `plan` subcommand, writing its output to `out`; `tty` says whether
/// stdout is a terminal (`watch` draws a progress bar there).
///
/// # Errors
/// gRPC errors from the planner; `wait` ending other than completed
/// ([`CliError::NotCompleted`], [`CliError::Timeout`]); output errors.
pub async fn run(
    planner: &mut Planner,
    command: PlanCommand,
    json: bool,
    tty: bool,
    out: &mut dyn Write,
) -> Result<u8, CliError> {
    let plan = match command {
        PlanCommand::Create(args) => {
            let mut request = args.to_request();
            request.webhook_secret = args.webhook_secret()?;
            planner.create_plan(request).await?
        }
        PlanCommand::Approve(args) => {
            planner
                .approve_plan(ApprovePlanRequest {
                    plan_id: args.id,
                    digest: args.digest,
                    override_arrivals: args.override_arrivals,
                    override_reason: args.reason.unwrap_or_default(),
                })
                .await?
        }
        PlanCommand::Status(args) => {
            planner
                .get_plan(GetPlanRequest { plan_id: args.id })
                .await?
        }
        PlanCommand::Promote(args) => planner.promote_plan(control(args)).await?,
        PlanCommand::Pause(args) => planner.pause_plan(control(args)).await?,
        PlanCommand::Resume(args) => planner.resume_plan(control(args)).await?,
        PlanCommand::Cancel(args) => planner.cancel_plan(control(args)).await?,
        PlanCommand::List(args) => return list(planner, args, json, out).await,
        PlanCommand::Compensations(args) => return compensations(planner, args, json, out).await,
        PlanCommand::Report(args) => return report(planner, args, json, out).await,
        PlanCommand::Watch(args) => {
            let mode = if json {
                WatchMode::Json
            } else if tty {
                WatchMode::Bar {
                    width: bar_width(terminal_width(), std::env::var("COLUMNS").ok().as_deref()),
                }
            } else {
                WatchMode::Lines
            };
            return live::watch(planner, args.id, args.events, mode, args.stall_after, out).await;
        }
        PlanCommand::Wait(args) => {
            return match wait::wait(planner, &args.id, args.timeout, args.interval, json).await? {
                WaitOutcome::Final(plan) => {
                    wait::print_plan(out, &plan, json)?;
                    wait::not_completed(&plan).map_or(Ok(EX_OK), Err)
                }
                WaitOutcome::TimedOut(last) => {
                    if let Some(plan) = &last {
                        wait::print_plan(out, plan, json)?;
                    }
                    Err(wait::timed_out(
                        &args.id,
                        last.as_ref(),
                        args.timeout.unwrap_or_default(),
                    ))
                }
            };
        }
    }
    .into_inner();
    wait::print_plan(out, &plan, json)?;
    Ok(EX_OK)
}

/// The progress bar's width: the terminal's, else `COLUMNS`, else 80.
fn bar_width(terminal: Option<u16>, columns: Option<&str>) -> usize {
    terminal
        .map(usize::from)
        .or_else(|| {
            columns
                .and_then(|columns| columns.trim().parse().ok())
                .filter(|columns| *columns > 0)
        })
        .unwrap_or(80)
}

fn control(args: ControlArgs) -> PlanControlRequest {
    PlanControlRequest {
        plan_id: args.id,
        reason: args.reason.unwrap_or_default(),
        override_arrivals: args.override_arrivals,
    }
}

/// `plan list`: the plans in the states and of the kinds asked for.
async fn list(
    planner: &mut Planner,
    args: ListArgs,
    json: bool,
    out: &mut dyn Write,
) -> Result<u8, CliError> {
    let states: Vec<i32> = args.states.iter().map(|state| i32::from(*state)).collect();
    let kinds: Vec<i32> = args.kinds.iter().map(|kind| i32::from(*kind)).collect();
    let kind = ListingKind {
        key: "plans",
        columns: view::LIST_COLUMNS,
        empty: "no plans match",
    };
    let fetch = async |page_size, page_token| {
        let request = ListPlansRequest {
            states: states.clone(),
            kinds: kinds.clone(),
            page_size,
            page_token,
        };
        let response = planner.list_plans(request).await?.into_inner();
        Ok((response.plans, response.next_page_token))
    };
    list_pages(out, json, kind, &args.page, fetch, |listing, plan| {
        listing.push(plan, || view::list_row(plan))
    })
    .await
}

async fn compensations(
    planner: &mut Planner,
    args: PageArgs,
    json: bool,
    out: &mut dyn Write,
) -> Result<u8, CliError> {
    let fetch = async |page_size, page_token| {
        let request = ListCompensationsRequest {
            plan_id: args.id.clone(),
            page_size,
            page_token,
        };
        let response = planner.list_compensations(request).await?.into_inner();
        Ok((response.items, response.next_page_token))
    };
    list_items(out, json, "no items need compensation", &args.page, fetch).await
}

async fn report(
    planner: &mut Planner,
    args: ReportArgs,
    json: bool,
    out: &mut dyn Write,
) -> Result<u8, CliError> {
    let format = args.format.unwrap_or(if json {
        ReportFormat::Json
    } else {
        ReportFormat::Text
    });
    let export = match format {
        ReportFormat::Text | ReportFormat::Json => {
            let report = planner
                .get_audit_report(GetAuditReportRequest {
                    plan_id: args.id.clone(),
                })
                .await?
                .into_inner();
            if format == ReportFormat::Json {
                write_message(out, &report)?;
            } else {
                view::write_audit_report(out, &args.id, &report)?;
            }
            return Ok(EX_OK);
        }
        ReportFormat::Jsonl => ExportFormat::Jsonl,
        ReportFormat::Csv => ExportFormat::Csv,
    };
    let mut stream = planner
        .export_audit(ExportAuditRequest {
            plan_id: args.id,
            format: export.into(),
        })
        .await?
        .into_inner();
    // Streamed: each chunk goes out as it arrives (records may span
    // chunks; the file is their concatenation).
    while let Some(chunk) = stream.message().await? {
        out.write_all(&chunk.data)?;
    }
    out.flush()?;
    Ok(EX_OK)
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct Harness {
        #[command(subcommand)]
        command: PlanCommand,
    }

    fn parse(args: &[&str]) -> Result<PlanCommand, clap::Error> {
        Harness::try_parse_from(std::iter::once("plan").chain(args.iter().copied()))
            .map(|harness| harness.command)
    }

    const CREATE: [&str; 9] = [
        "create",
        "--precheck",
        "pc-1",
        "--rate",
        "50",
        "--burst",
        "10",
        "--rationale",
        "downstream takes 300/s",
    ];

    fn create(extra: &[&str]) -> Result<CreateArgs, clap::Error> {
        let args: Vec<&str> = CREATE.iter().chain(extra).copied().collect();
        match parse(&args)? {
            PlanCommand::Create(args) => Ok(args),
            other => panic!("not create: {other:?}"),
        }
    }

    /// A new user's pass: `--rate -1` read as an unknown flag, a burst or
    /// slice size the planner refuses passed the flag.
    #[test]
    fn numbers_are_checked_against_the_planners_limits_at_the_flag() {
        let with = |rate: &str, burst: &str, extra: &[&str]| {
            let mut args = vec![
                "create",
                "--precheck",
                "pc-1",
                "--rate",
                rate,
                "--burst",
                burst,
                "--rationale",
                "r",
            ];
            args.extend(extra);
            parse(&args)
        };
        assert!(with("50", "1000000", &["--slice-size", "10000"]).is_ok());
        for (rate, burst, extra, says) in [
            ("-1", "10", &[][..], "from 0.001"),
            ("50", "1000001", &[], "1000001"),
            ("50", "-3", &[], "-3"),
            ("50", "10", &["--slice-size", "10001"], "10001"),
            ("50", "10", &["--slice-size", "-1"], "-1"),
        ] {
            let error = with(rate, burst, extra).unwrap_err().to_string();
            assert!(error.contains(says), "{error}");
            assert!(!error.contains("unexpected argument"), "{error}");
        }
    }

    #[test]
    fn destinations_parse_in_three_forms() {
        assert_eq!(parse_destination("queue"), Ok(Destination::Queue));
        assert_eq!(parse_destination("exchange"), Ok(Destination::Exchange));
        let redirect = |exchange: &str, routing_key: &str| {
            Ok(Destination::Redirect {
                exchange: exchange.into(),
                routing_key: routing_key.into(),
            })
        };
        assert_eq!(
            parse_destination("redirect:ops/orders.retry"),
            redirect("ops", "orders.retry")
        );
        assert_eq!(
            parse_destination("redirect:quarantine/"),
            redirect("quarantine", "")
        );
        assert_eq!(
            parse_destination("redirect:/parking"),
            redirect("", "parking")
        );
        // Only the first '/' splits: routing keys may hold more.
        assert_eq!(parse_destination("redirect:ex/a/b"), redirect("ex", "a/b"));
    }

    #[test]
    fn bad_destinations_say_what_is_accepted() {
        for (text, expected) in [
            ("redirect:quarantine", "no '/'"),
            ("redirect:", "no '/'"),
            ("redirect:/", "neither an exchange nor a routing key"),
            ("redirect", "unknown destination"),
            ("Queue", "unknown destination"),
            ("orders", "unknown destination"),
            ("", "unknown destination"),
        ] {
            let error = parse_destination(text).unwrap_err();
            assert!(error.contains(expected), "{text:?}: {error}");
            assert!(
                error.contains("redirect:EXCHANGE/ROUTING_KEY"),
                "{text:?}: {error}"
            );
        }
    }

    #[test]
    fn rates_bursts_and_fractions_have_bounds() {
        assert_eq!(parse_rate("50"), Ok(50.0));
        assert_eq!(parse_rate(" 0.5 "), Ok(0.5));
        assert_eq!(parse_rate("1000000"), Ok(1_000_000.0));
        assert_eq!(parse_rate("0.001"), Ok(0.001));
        for bad in [
            "0", "-1", "0.0", "inf", "NaN", "fast", "", "0.0009", "1000001",
        ] {
            assert!(parse_rate(bad).is_err(), "{bad}");
        }
        // The planner's range, said at the flag, and never the value echoed
        // back: a new user's `--rate 1e308` printed 309 digits.
        for huge in ["1e308", "1e300", "-1e308"] {
            let error = parse_rate(huge).unwrap_err();
            assert!(error.contains("from 0.001 to 1000000"), "{error}");
            assert!(error.len() < 120, "{error}");
        }
        assert_eq!(parse_canary_fraction("0.05"), Ok(0.05));
        assert_eq!(parse_canary_fraction("1"), Ok(1.0));
        for bad in ["0", "-0.1", "1.01", "5%", "NaN", "inf"] {
            assert!(parse_canary_fraction(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_rationale("  why  "), Ok("why".to_owned()));
        assert!(parse_rationale("   ").unwrap_err().contains("capacity"));
    }

    /// A new user's pass: `--observe 1ns` was accepted and shown as `0s`
    /// (the planner keeps the window in milliseconds).
    #[test]
    fn an_observation_shorter_than_a_millisecond_is_refused() {
        for short in ["1ns", "999us", "0s"] {
            let error = create(&["--observe", short]).unwrap_err().to_string();
            assert!(error.contains("--observe"), "{short}: {error}");
        }
        assert!(create(&["--observe", "1ms"]).is_ok());
    }

    #[test]
    fn create_flags_land_in_the_request() {
        let args = create(&[
            "--destination",
            "redirect:quarantine/",
            "--slice-size",
            "50",
            "--canary-fraction",
            "0.05",
            "--observe",
            "30m",
        ])
        .unwrap();
        assert_eq!(
            args.to_request(),
            CreatePlanRequest {
                precheck_id: "pc-1".into(),
                rate: Some(Rate {
                    per_second: 50.0,
                    burst: 10,
                    rationale: "downstream takes 300/s".into(),
                }),
                destination: Some(
                    Destination::Redirect {
                        exchange: "quarantine".into(),
                        routing_key: String::new(),
                    }
                    .to_proto()
                ),
                slice_size: 50,
                canary_fraction: Some(0.05),
                ramp: Vec::new(),
                observe_for: Some(duration(Duration::from_secs(1800))),
                ordered: false,
                webhook_url: String::new(),
                webhook_secret: String::new(),
            }
        );
        // Defaults: queue; the rest left to the planner.
        let request = create(&[]).unwrap().to_request();
        assert_eq!(request.destination, Some(Destination::Queue.to_proto()));
        assert_eq!(
            (
                request.slice_size,
                request.canary_fraction,
                request.observe_for
            ),
            (0, None, None)
        );
    }

    #[test]
    fn bad_create_flags_are_usage_errors_naming_the_flag() {
        for (args, flag) in [
            (&["--rate", "0"][..], "--rate"),
            (&["--rate", "-5"], "--rate"),
            (&["--burst", "0"], "--burst"),
            (&["--rationale", " "], "--rationale"),
            (&["--destination", "redirect:nowhere"], "--destination"),
            (&["--destination", "fanout"], "--destination"),
            (&["--slice-size", "0"], "--slice-size"),
            (&["--canary-fraction", "0"], "--canary-fraction"),
            (&["--canary-fraction", "1.5"], "--canary-fraction"),
            (&["--observe", "0s"], "--observe"),
            (&["--observe", "soon"], "--observe"),
        ] {
            let error = create(args).unwrap_err();
            assert!(error.use_stderr(), "{args:?}");
            assert!(error.to_string().contains(flag), "{args:?}: {error}");
        }
        // Required flags.
        for missing in ["--precheck", "--rate", "--burst", "--rationale"] {
            let position = CREATE.iter().position(|arg| *arg == missing).unwrap();
            let mut args = CREATE.to_vec();
            args.drain(position..position + 2);
            let error = parse(&args).unwrap_err();
            assert!(error.to_string().contains(missing), "{missing}: {error}");
        }
    }

    #[test]
    fn the_other_subcommands_parse() {
        let id = |id: &str| IdArgs { id: id.into() };
        assert!(
            matches!(parse(&["status", "p-1"]).unwrap(), PlanCommand::Status(args) if args == id("p-1"))
        );
        assert!(
            matches!(parse(&["show", "p-1"]).unwrap(), PlanCommand::Status(args) if args == id("p-1"))
        );
        assert!(matches!(
            parse(&["approve", "p-1", "--digest", "ab12"]).unwrap(),
            PlanCommand::Approve(args) if args == ApproveArgs { id: "p-1".into(), digest: "ab12".into(), override_arrivals: false, reason: None }
        ));
        assert!(matches!(
            parse(&["approve", "p-1", "--digest", "ab12", "--override-arrivals", "--reason", "a known trickle"]).unwrap(),
            PlanCommand::Approve(args) if args.override_arrivals && args.reason.as_deref() == Some("a known trickle")
        ));
        assert!(parse(&["approve", "p-1", "--digest", "ab12", "--override-arrivals"]).is_err());
        let PlanCommand::Wait(wait) = parse(&["wait", "p-1"]).unwrap() else {
            panic!("not wait");
        };
        assert_eq!(
            (wait.timeout, wait.interval),
            (None, Duration::from_secs(1))
        );
        let PlanCommand::Wait(wait) =
            parse(&["wait", "p-1", "--timeout", "2h", "--interval", "5s"]).unwrap()
        else {
            panic!("not wait");
        };
        assert_eq!(
            (wait.timeout, wait.interval),
            (Some(Duration::from_secs(7200)), Duration::from_secs(5))
        );
        let PlanCommand::Report(report) = parse(&["report", "p-1", "--format", "csv"]).unwrap()
        else {
            panic!("not report");
        };
        assert_eq!(report.format, Some(ReportFormat::Csv));
        let PlanCommand::Cancel(cancel) =
            parse(&["cancel", "p-1", "--reason", "wrong selection"]).unwrap()
        else {
            panic!("not cancel");
        };
        assert_eq!(
            control(cancel),
            PlanControlRequest {
                plan_id: "p-1".into(),
                reason: "wrong selection".into(),
                override_arrivals: false,
            }
        );
        let PlanCommand::Pause(pause) = parse(&["pause", "p-1"]).unwrap() else {
            panic!("not pause");
        };
        assert_eq!(control(pause).reason, "");
        let PlanCommand::List(list) =
            parse(&["list", "--state", "main", "--state", "paused", "--all"]).unwrap()
        else {
            panic!("not list");
        };
        assert_eq!(list.states, [PlanState::Main, PlanState::Paused]);
        assert!(list.page.all);
        let PlanCommand::Watch(watch) = parse(&["watch", "p-1", "--events"]).unwrap() else {
            panic!("not watch");
        };
        assert!(watch.events);
        assert_eq!(watch.stall_after, Duration::from_secs(30), "the default");
        let PlanCommand::Watch(watch) =
            parse(&["watch", "p-1", "--stall-after", "1m 30s"]).unwrap()
        else {
            panic!("not watch");
        };
        assert_eq!(watch.stall_after, Duration::from_secs(90));
        for args in [
            &["approve", "p-1"][..],
            &["watch", "p-1", "--stall-after", "0s"],
            &["watch", "p-1", "--stall-after", "soon"],
            &["wait", "p-1", "--timeout", "0s"],
            &["report", "p-1", "--format", "xml"],
            &["list", "--state", "running"],
            &["compensations", "p-1", "--page-size", "0"],
            &["status"],
        ] {
            assert!(parse(args).unwrap_err().use_stderr(), "{args:?}");
        }
    }

    #[test]
    fn the_bar_fits_the_terminal_else_columns_else_80() {
        assert_eq!(bar_width(Some(120), Some("60")), 120);
        assert_eq!(bar_width(None, Some(" 60 ")), 60);
        assert_eq!(bar_width(None, Some("0")), 80);
        assert_eq!(bar_width(None, Some("wide")), 80);
        assert_eq!(bar_width(None, None), 80);
    }

    #[test]
    fn states_parse_by_name() {
        for state in PlanState::ALL {
            assert_eq!(parse_state(state.name()), Ok(state));
        }
        assert_eq!(
            parse_state("Awaiting-Approval"),
            Ok(PlanState::AwaitingApproval)
        );
        assert!(
            parse_state("running")
                .unwrap_err()
                .ends_with("valid names: awaiting_approval, canary, observing, main, completed, paused, cancelled, aborted")
        );
        assert!(parse_state("unspecified").is_err());
    }
}
