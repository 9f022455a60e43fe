//! The self-checks, each printed `ok` or `FAIL` as it is made.

use std::{
    collections::{BTreeSet, HashMap, HashSet},
    time::Duration,
};

use anyhow::Context;
use redrive_proto::v1::{self, PlanState, planner_client::PlannerClient};
use tokio::time::Instant;
use tonic::transport::Channel;

use super::{
    ScenarioConfig,
    incident::{Shape, count, message_id, retry_message_id},
    recorder::Delivery,
};
use crate::{Broker, stored_total};

/// One self-check: what was checked, whether it held, and the figures.
#[derive(Debug, Clone)]
pub struct Check {
    /// What was checked.
    pub what: String,
    /// Whether it held.
    pub ok: bool,
    /// The figures behind it.
    pub detail: String,
}

/// What a run concluded.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    /// Every self-check, in the order made.
    pub checks: Vec<Check>,
    /// The plan's id, once created.
    pub plan_id: String,
    /// The killed executor's progress when it was killed (`items_done` of
    /// `total_items`), when it was.
    pub killed_at: Option<(u64, u64)>,
    /// Items the audit marks `uncertain` (message ids).
    pub uncertain: BTreeSet<String>,
    /// Message ids the fulfilment consumer got more than once.
    pub delivered_twice: BTreeSet<String>,
}

impl Outcome {
    /// The checks that failed.
    pub fn failures(&self) -> Vec<&Check> {
        self.checks.iter().filter(|check| !check.ok).collect()
    }

    pub(super) fn check(&mut self, what: &str, ok: bool, detail: String) {
        println!("   {} {what}: {detail}", if ok { "ok  " } else { "FAIL" });
        self.checks.push(Check {
            what: what.to_owned(),
            ok,
            detail,
        });
    }

    pub(super) fn check_count(&mut self, what: &str, actual: u64, wanted: u64) {
        self.check(
            what,
            actual == wanted,
            format!("{actual} (expected {wanted})"),
        );
    }
}

pub(super) async fn check_precheck(
    outcome: &mut Outcome,
    broker: &Broker,
    dlq: &str,
    shape: &Shape,
    report: &serde_json::Value,
) -> anyhow::Result<()> {
    outcome.check_count(
        "dead letters captured",
        uint64(&report["total"])?,
        shape.dead_letters(),
    );
    outcome.check_count(
        "left in the DLQ",
        u64::from(broker.ready_count(dlq).await?),
        0,
    );
    let counts = &report["counts"];
    let verdict = |name: &str| uint64(&counts[camel_case(name).as_str()]).unwrap_or(u64::MAX);
    outcome.check_count(
        "duplicate (producer retries)",
        verdict("duplicate"),
        count(&shape.retried_orders()),
    );
    outcome.check_count(
        "stale (payments past 2 h)",
        verdict("stale"),
        count(&shape.stale_orders()),
    );
    outcome.check_count(
        "blocked_by_state (cancelled or fulfilled)",
        verdict("blocked_by_state"),
        count(&shape.cancelled_orders()) + count(&shape.fulfilled_orders()),
    );
    outcome.check_count(
        "needs_compensation (stock reserved)",
        verdict("needs_compensation"),
        count(&shape.reserved_orders()),
    );
    outcome.check_count("replayable", verdict("replayable"), shape.replayable());
    outcome.check_count("invalid", verdict("invalid"), 0);
    Ok(())
}

/// What the audit report and its export say.
pub(super) struct Audit {
    pub(super) counts: serde_json::Value,
    pub(super) sent_keys: HashSet<String>,
    pub(super) not_sent_actions: BTreeSet<String>,
    /// Message ids (`msg-N`) of items with an `uncertain` event.
    pub(super) uncertain_ids: BTreeSet<String>,
    pub(super) events: usize,
}

impl Audit {
    pub(super) fn parse(report: &serde_json::Value, export: &str) -> anyhow::Result<Self> {
        // proto3 JSON leaves an empty list out.
        let sent_keys = list(&report["sentKeys"], "sentKeys")?
            .iter()
            .filter_map(|key| key.as_str().map(str::to_owned))
            .collect();
        let not_sent_actions = list(&report["notSent"], "notSent")?
            .iter()
            .filter_map(|event| event["action"].as_str().map(str::to_owned))
            .collect();
        let mut uncertain_ids = BTreeSet::new();
        let mut events = 0;
        for line in export.lines().filter(|line| !line.trim().is_empty()) {
            events += 1;
            let event: serde_json::Value =
                serde_json::from_str(line).context("an audit export line is JSON")?;
            if event["action"] == "uncertain" {
                let key = event["message_key"].as_str().unwrap_or_default();
                uncertain_ids.insert(key_message_id(key));
            }
        }
        Ok(Self {
            counts: report["counts"].clone(),
            sent_keys,
            not_sent_actions,
            uncertain_ids,
            events,
        })
    }

    /// The report's count of `action` (`sent`, `skipped_duplicate`, ...).
    pub(super) fn count(&self, action: &str) -> u64 {
        uint64(&self.counts[camel_case(action).as_str()]).unwrap_or(u64::MAX)
    }
}

/// A `uint64` of the API's proto3 JSON: a decimal string, left out when 0.
///
/// # Errors
/// When it is neither.
fn uint64(value: &serde_json::Value) -> anyhow::Result<u64> {
    match value {
        serde_json::Value::Null => Ok(0),
        serde_json::Value::String(text) => text
            .parse()
            .with_context(|| format!("{text:?} is not a uint64")),
        other => anyhow::bail!("{other} is not a proto3 JSON uint64 (a decimal string)"),
    }
}

/// A repeated field of the API's proto3 JSON: an array, left out when empty.
///
/// # Errors
/// When it is something else.
fn list<'a>(value: &'a serde_json::Value, name: &str) -> anyhow::Result<&'a [serde_json::Value]> {
    match value {
        serde_json::Value::Null => Ok(&[]),
        serde_json::Value::Array(items) => Ok(items),
        other => anyhow::bail!("the report's {name} is not a list: {other}"),
    }
}

/// A proto field name as proto3 JSON spells it: `blocked_by_state` →
/// `blockedByState`.
fn camel_case(name: &str) -> String {
    let mut parts = name.split('_');
    let mut out = parts.next().unwrap_or_default().to_owned();
    for part in parts {
        let mut chars = part.chars();
        if let Some(first) = chars.next() {
            out.extend(first.to_uppercase());
            out.push_str(chars.as_str());
        }
    }
    out
}

/// `o-17:order.paid` → `msg-17` (the message id the producer gave order 17).
pub(super) fn key_message_id(key: &str) -> String {
    let order = key.split(':').next().unwrap_or(key);
    format!("msg-{}", order.trim_start_matches("o-"))
}

pub(super) fn check_replay(
    config: &ScenarioConfig,
    outcome: &mut Outcome,
    plan: &v1::Plan,
    fulfilment: &[Delivery],
    analytics: &[Delivery],
    replay_started: Instant,
    audit: &Audit,
) {
    let shape = &config.shape;
    outcome.check(
        "the plan completed",
        plan.state() == PlanState::Completed,
        format!(
            "{} with {} of {} items done",
            plan.state().as_str_name(),
            plan.items_done,
            plan.total_items
        ),
    );

    let replayable: BTreeSet<String> = shape.replayable_orders().map(message_id).collect();
    let mut copies: HashMap<&str, usize> = HashMap::new();
    for delivery in fulfilment {
        *copies.entry(delivery.message_id.as_str()).or_default() += 1;
    }
    let received: BTreeSet<String> = copies.keys().map(|id| (*id).to_owned()).collect();
    let missing = replayable.difference(&received).count();
    let unexpected = received.difference(&replayable).count();
    outcome.check(
        "the fulfilment consumer got exactly the replayable dead letters' message ids",
        missing == 0 && unexpected == 0,
        format!(
            "{} of {} replayable message ids ({missing} missing, {unexpected} others)",
            replayable.len() - missing,
            replayable.len()
        ),
    );

    let twice: BTreeSet<String> = copies
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(id, _)| (*id).to_owned())
        .collect();
    outcome.delivered_twice.clone_from(&twice);
    if config.kill_executor {
        // The honest guarantee with a crash (docs/replay.md, "Guarantees, and their
        // limits"): what the killed executor had published but not reported
        // is `uncertain` and is published again with the same message id, so
        // consumer idempotency on the message id closes the gap. Distinct ids
        // are checked above and below; a second copy is allowed only of an
        // item the audit marks `uncertain`.
        let unexplained: Vec<&String> = twice.difference(&audit.uncertain_ids).collect();
        outcome.check(
            "exactly once per message id, except items the audit marks uncertain",
            unexplained.is_empty(),
            format!(
                "{} of {} distinct ids delivered twice, {} of them not marked uncertain {unexplained:?}; \
                 {} items have an uncertain event",
                twice.len(),
                received.len(),
                unexplained.len(),
                audit.uncertain_ids.len()
            ),
        );
    } else {
        outcome.check(
            "each exactly once",
            twice.is_empty() && fulfilment.len() == received.len(),
            format!(
                "{} deliveries of {} distinct message ids; twice: {:?}",
                fulfilment.len(),
                received.len(),
                twice.iter().take(10).collect::<Vec<_>>()
            ),
        );
    }

    let by_class = |orders: &mut dyn Iterator<Item = u32>, id: fn(u32) -> String| {
        orders.map(id).filter(|id| received.contains(id)).count()
    };
    let blocked = by_class(
        &mut shape.cancelled_orders().chain(shape.fulfilled_orders()),
        message_id,
    );
    let compensation = by_class(&mut shape.reserved_orders(), message_id);
    let stale = by_class(&mut shape.stale_orders(), message_id);
    let duplicates = by_class(&mut shape.retried_orders(), retry_message_id);
    let other = unexpected - blocked - compensation - stale - duplicates;
    // By business key too: an order must not be fulfilled twice under two ids.
    let mut ids_per_order: HashMap<&str, HashSet<&str>> = HashMap::new();
    for delivery in fulfilment {
        ids_per_order
            .entry(delivery.order_id.as_str())
            .or_default()
            .insert(delivery.message_id.as_str());
    }
    let orders_twice = ids_per_order.values().filter(|ids| ids.len() > 1).count();
    let without_plan = fulfilment
        .iter()
        .filter(|delivery| delivery.plan_id.as_deref() != Some(outcome.plan_id.as_str()))
        .count();
    outcome.check(
        "none of the blocked, stale, duplicate or compensation items reached it",
        blocked + compensation + stale + duplicates + other + orders_twice + without_plan == 0,
        format!(
            "blocked {blocked}, needs_compensation {compensation}, stale {stale}, duplicate {duplicates}, \
             other {other}; orders under two message ids {orders_twice}; without this plan's header {without_plan}"
        ),
    );

    let after_start = analytics
        .iter()
        .filter(|delivery| delivery.at >= replay_started)
        .count();
    let replayed_copies = analytics
        .iter()
        .filter(|delivery| delivery.plan_id.is_some())
        .count();
    outcome.check(
        "the healthy subscriber got no second copy",
        after_start == 0 && replayed_copies == 0,
        format!(
            "{after_start} deliveries since the replay began, {replayed_copies} with redrive-plan-id \
             ({} before it)",
            analytics.len() - after_start
        ),
    );

    // The bucket's promise (docs/replay.md, "Guarantees"): over any second at most
    // per_second + burst. The consumer timestamps deliveries when it gets
    // them, so a consumer held up for a moment sees a bunch at once: 50 ms of
    // the rate is allowed for that.
    let jitter = u64::from(config.rate_per_second.div_ceil(20));
    let limit = u64::from(config.rate_per_second + config.burst);
    let (worst, mean) = observed_rate(fulfilment, usize::try_from(plan.canary_items).unwrap_or(0));
    outcome.check(
        "the observed rate stayed within the plan's rate",
        worst <= limit + jitter,
        format!(
            "at most {worst} deliveries in any 1 s (limit {}/s + burst {} = {limit}, \
             + {jitter} for 50 ms of receive-time jitter); main wave {mean:.0}/s on average",
            config.rate_per_second, config.burst
        ),
    );

    let sent = audit.count("sent");
    let expected_keys: HashSet<String> = fulfilment
        .iter()
        .map(|delivery| format!("{}:order.paid", delivery.order_id))
        .collect();
    let others: u64 = redrive_planner::store::leases::FINAL_ITEM_STATES
        .iter()
        .filter(|action| **action != "sent")
        .map(|action| audit.count(action))
        .sum();
    // `counts.uncertain` counts items still uncertain (none once the plan
    // completed); the export keeps every `uncertain` event.
    let uncertain = audit.uncertain_ids.len() as u64;
    let extra_deliveries = (fulfilment.len() - received.len()) as u64;
    let uncertain_ok = if config.kill_executor {
        extra_deliveries <= uncertain
            && audit
                .not_sent_actions
                .iter()
                .all(|action| action == "uncertain")
    } else {
        uncertain == 0 && audit.not_sent_actions.is_empty()
    };
    outcome.check(
        "the audit reconciles with what the fulfilment consumer got",
        sent == received.len() as u64
            && sent == shape.replayable()
            && audit.sent_keys == expected_keys
            && others == 0
            && uncertain_ok,
        format!(
            "sent {sent} = {} distinct message ids received = {} sent keys (the same keys: {}); \
             {uncertain} items with an uncertain event, {extra_deliveries} second copies; other actions {others}; \
             {} audit events",
            received.len(),
            audit.sent_keys.len(),
            audit.sent_keys == expected_keys,
            audit.events
        ),
    );

    if let Some((done, total)) = outcome.killed_at {
        outcome.check(
            "executor-1 was killed mid-main-wave and its work taken over",
            // `uncertain` may be 0: only what it had marked and not
            // reported is (docs/design.md, "Precise uncertain items"), and
            // between two runs under the rate limit that is nothing.
            done < total && plan.state() == PlanState::Completed,
            format!(
                "killed at {done}/{total}; the others finished the plan; {uncertain} items it may have \
                 published without reporting were marked uncertain"
            ),
        );
    }
}

/// The most deliveries in any 1 s window, and the mean rate of the main wave
/// (after the first `canary` deliveries), per second.
pub(super) fn observed_rate(deliveries: &[Delivery], canary: usize) -> (u64, f64) {
    let mut times: Vec<Instant> = deliveries.iter().map(|delivery| delivery.at).collect();
    times.sort();
    let mut worst = 0;
    let mut end = 0;
    for (start, at) in times.iter().enumerate() {
        while end < times.len() && times[end].duration_since(*at) < Duration::from_secs(1) {
            end += 1;
        }
        worst = worst.max(end - start);
    }
    let main = &times[canary.min(times.len())..];
    let mean = match (main.first(), main.last()) {
        (Some(first), Some(last)) if last > first => {
            (main.len() - 1) as f64 / last.duration_since(*first).as_secs_f64()
        }
        _ => 0.0,
    };
    (worst as u64, mean)
}

pub(super) async fn check_no_re_dead_letters(
    outcome: &mut Outcome,
    broker: &Broker,
    planner: &mut PlannerClient<Channel>,
    dlq: &str,
    shape: &Shape,
) -> anyhow::Result<()> {
    let total = stored_total(planner, dlq).await?;
    let waiting = broker.ready_count(dlq).await?;
    outcome.check(
        "no replayed message came back to the DLQ",
        total == shape.dead_letters() && waiting == 0,
        format!("{total} dead letters captured in all, {waiting} waiting in the DLQ"),
    );
    Ok(())
}
