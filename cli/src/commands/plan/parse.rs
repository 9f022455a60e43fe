//! The value parsers of the `plan` flags (`--rate`, `--rationale`,
//! `--destination`, `--canary-fraction`, `--kind`, `--state`): each error
//! says what is wrong and what is accepted, for clap to name the flag.

use redrive_proto::{
    limits::{MAX_RATE_PER_SECOND, MIN_RATE_PER_SECOND},
    v1::{PlanKind, PlanState},
};

use super::view::Destination;

/// Parses `--rate`: messages per second, from
/// [`MIN_RATE_PER_SECOND`] to [`MAX_RATE_PER_SECOND`] (the planner's
/// limits, checked here so that the flag is named before any call).
///
/// # Errors
/// What is wrong and the range, for clap (which names the flag); the value
/// is not echoed back (`1e308` would print 309 digits).
pub fn parse_rate(text: &str) -> Result<f64, String> {
    let rate: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a number; messages per second, e.g. 50 or 0.5"))?;
    if !(rate.is_finite() && (MIN_RATE_PER_SECOND..=MAX_RATE_PER_SECOND).contains(&rate)) {
        return Err(format!(
            "must be a number of messages per second from {MIN_RATE_PER_SECOND} to \
             {MAX_RATE_PER_SECOND}, e.g. 50 or 0.5"
        ));
    }
    Ok(rate)
}

/// Parses `--rationale`: not blank (surrounding blanks dropped).
///
/// # Errors
/// What to write, for clap.
pub fn parse_rationale(text: &str) -> Result<String, String> {
    let text = text.trim();
    if text.is_empty() {
        return Err(
            "must say how the rate follows from the downstream's capacity, e.g. \
                    'payments-api sustains 300/s, peak traffic is 200/s, so 50/s leaves headroom'"
                .into(),
        );
    }
    Ok(text.to_owned())
}

const DESTINATION_FORMS: &str = "expected queue, exchange or redirect:EXCHANGE/ROUTING_KEY (e.g. redirect:quarantine/ \
     with an empty routing key)";

/// Parses `--destination`: `queue`, `exchange` or
/// `redirect:EXCHANGE/ROUTING_KEY`, split at the first `/` (a routing key may
/// hold more). The routing key may be empty; the exchange may be empty (the
/// default exchange) only with a routing key (the queue name).
///
/// # Errors
/// What is wrong and the accepted forms, for clap.
pub fn parse_destination(text: &str) -> Result<Destination, String> {
    match text {
        "queue" => return Ok(Destination::Queue),
        "exchange" => return Ok(Destination::Exchange),
        _ => {}
    }
    let Some(target) = text.strip_prefix("redirect:") else {
        return Err(format!("unknown destination {text:?}; {DESTINATION_FORMS}"));
    };
    let Some((exchange, routing_key)) = target.split_once('/') else {
        return Err(format!(
            "no '/' between exchange and routing key in {text:?}; {DESTINATION_FORMS}"
        ));
    };
    if exchange.is_empty() && routing_key.is_empty() {
        return Err(format!(
            "{text:?} names neither an exchange nor a routing key (the default exchange needs \
             the queue name as routing key: redirect:/QUEUE); {DESTINATION_FORMS}"
        ));
    }
    Ok(Destination::Redirect {
        exchange: exchange.to_owned(),
        routing_key: routing_key.to_owned(),
    })
}

/// Parses `--canary-fraction`: 0 < F ≤ 1.
///
/// # Errors
/// What is wrong, for clap.
pub fn parse_canary_fraction(text: &str) -> Result<f64, String> {
    let fraction: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a number; a fraction, e.g. 0.05 for 5%"))?;
    if !(fraction > 0.0 && fraction <= 1.0) {
        return Err("must be above 0 and at most 1, e.g. 0.05 for 5% of the items".into());
    }
    Ok(fraction)
}

/// Checks `--observe`: a humantime duration of at least a millisecond, the
/// planner's resolution (it keeps the window in milliseconds, so `1ns`
/// would be no window at all).
///
/// # Errors
/// What is wrong, for clap.
pub fn parse_observe(text: &str) -> Result<std::time::Duration, String> {
    let observe = crate::args::parse_positive_duration(text)?;
    if observe < std::time::Duration::from_millis(1) {
        return Err(
            "must be at least 1ms (the planner counts the window in milliseconds)".to_owned(),
        );
    }
    Ok(observe)
}

/// One share of a ramp (`--ramp 10%,50%` or `--ramp 0.1,0.5`, split at the
/// commas): the cumulative share of the items at the end of a wave between
/// the canary and the main wave, as a percentage or a fraction, above 0 and
/// below all (the planner checks that they increase, above the canary).
///
/// # Errors
/// A value that is no share, or one out of range.
pub fn parse_ramp_share(text: &str) -> Result<f64, String> {
    let part = text.trim();
    let fraction = match part.strip_suffix('%') {
        Some(percent) => percent.trim().parse::<f64>().map(|value| value / 100.0),
        None => part.parse::<f64>(),
    }
    .map_err(|_| format!("{part:?} is not a share of the items, e.g. 10% or 0.1"))?;
    if !(fraction.is_finite() && fraction > 0.0 && fraction < 1.0) {
        return Err(format!(
            "{part:?} must be above 0 and below all of the items (the main wave takes the rest)"
        ));
    }
    Ok(fraction)
}

/// A plan kind by its name (`bulk`, `single`; any case).
///
/// # Errors
/// An unknown name, listing the valid ones.
pub fn parse_kind(name: &str) -> Result<PlanKind, String> {
    match name.trim().to_ascii_lowercase().as_str() {
        "bulk" => Ok(PlanKind::Bulk),
        "single" => Ok(PlanKind::Single),
        _ => Err(format!(
            "unknown plan kind {name:?}; valid names: bulk, single"
        )),
    }
}

/// The plan state named `name` (`awaiting_approval`; `awaiting-approval` too).
///
/// # Errors
/// A message listing the valid names.
pub fn parse_state(name: &str) -> Result<PlanState, String> {
    let normalized = name.trim().to_ascii_lowercase().replace('-', "_");
    PlanState::from_name(&normalized).ok_or_else(|| {
        format!(
            "unknown plan state {name:?}; valid names: {}",
            PlanState::ALL.map(PlanState::name).join(", ")
        )
    })
}
