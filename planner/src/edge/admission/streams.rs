//! [`StreamLimits`]: open server streams of one kind per caller and in
//! total, with places kept for callers' first stream.

use std::sync::{Arc, Mutex, PoisonError};

use tonic::Status;
use tracing::warn;

use super::{Open, Throttled};
use crate::metrics::PlannerMetrics;

/// Caps on open server streams of one kind (`WatchPlan`, `WatchLease`):
/// per caller ([`caller_key`](super::caller_key): the principal, else the peer address) and in
/// total, with places of the total kept for callers that have none open
/// yet, so that the first watch of one caller is not refused because
/// others hold the rest.
#[derive(Debug, Clone)]
pub struct StreamLimits {
    what: &'static str,
    per_caller: usize,
    total: usize,
    reserved: usize,
    /// The settings that set the caps, named in refusals.
    settings: [&'static str; 2],
    open: Arc<Mutex<Open<String>>>,
    refused: Arc<Throttled>,
    metrics: Option<PlannerMetrics>,
}

impl StreamLimits {
    /// At most `per_caller` open `what` streams per caller and `total` in
    /// all, of which `reserved` (less than `total`) only for callers with
    /// none open yet. `settings` name the per-caller and total settings.
    pub fn new(
        what: &'static str,
        per_caller: usize,
        total: usize,
        reserved: usize,
        settings: [&'static str; 2],
    ) -> Self {
        Self {
            what,
            per_caller,
            total,
            reserved: reserved.min(total.saturating_sub(1)),
            settings,
            open: Arc::default(),
            refused: Arc::default(),
            metrics: None,
        }
    }

    /// Refusals are counted in `metrics` too
    /// ([`PlannerMetrics::stream_refused`]).
    #[must_use]
    pub fn with_metrics(mut self, metrics: PlannerMetrics) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Streams open now, in total.
    pub fn open_count(&self) -> usize {
        self.open
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .total
    }

    /// A place for one more stream of `caller` ([`caller_key`](super::caller_key)), held until
    /// the permit is dropped (with the stream). A caller with none open may
    /// take any place; one with some open only those not reserved.
    ///
    /// # Errors
    /// `RESOURCE_EXHAUSTED` naming the cap and its setting when the caller
    /// already has `per_caller` open, or the places it may take are all
    /// held. Refusals are logged at most once every 10 s, with their count.
    pub fn open(&self, caller: String) -> Result<StreamPermit, Status> {
        let refused = {
            let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
            let mine = open.per_peer.get(&caller).copied().unwrap_or(0);
            let mut room = self.total;
            if mine > 0 {
                room -= self.reserved;
            }
            if mine >= self.per_caller {
                Some("per_principal")
            } else if open.total >= room {
                Some("total")
            } else {
                *open.per_peer.entry(caller.clone()).or_default() += 1;
                open.total += 1;
                None
            }
        };
        let Some(cap) = refused else {
            return Ok(StreamPermit {
                open: Arc::clone(&self.open),
                caller,
            });
        };
        if let Some(metrics) = &self.metrics {
            metrics.stream_refused(self.what, cap);
        }
        if let Some(count) = self.refused.count() {
            warn!(
                refused = count,
                last_caller = caller,
                cap,
                what = self.what,
                "streams refused at their cap (logged at most every 10 s)"
            );
        }
        Err(Status::resource_exhausted(if cap == "total" {
            format!(
                "the planner has its most open {} streams ({}, --{}; {} of them kept for callers' \
                 first stream, and you have some open): close one of yours, or try again later",
                self.what, self.total, self.settings[1], self.reserved
            )
        } else {
            format!(
                "you have the most open {} streams one caller may have ({}, --{}): close one first",
                self.what, self.per_caller, self.settings[0]
            )
        }))
    }
}

/// One open stream's place ([`StreamLimits::open`]); dropping it frees it.
#[derive(Debug)]
pub struct StreamPermit {
    open: Arc<Mutex<Open<String>>>,
    caller: String,
}

impl Drop for StreamPermit {
    fn drop(&mut self) {
        self.open
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .leave(&self.caller);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_are_capped_per_caller_and_in_total() {
        let limits = StreamLimits::new("WatchPlan", 1, 2, 0, ["per", "all"]);
        let first = limits.open("principal:a".into()).unwrap();
        let refused = limits.open("principal:a".into()).unwrap_err();
        assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
        assert!(
            refused.message().contains("WatchPlan") && refused.message().contains("--per"),
            "{}",
            refused.message()
        );
        let _second = limits.open("principal:b".into()).unwrap();
        let refused = limits.open("principal:c".into()).unwrap_err();
        assert!(refused.message().contains("--all"), "{}", refused.message());
        drop(first);
        assert!(
            limits.open("principal:a".into()).is_ok(),
            "a closed stream frees its place"
        );
    }

    #[test]
    fn a_callers_first_stream_takes_a_reserved_place() {
        // 4 places, 2 kept for first streams; one caller may hold 10.
        let limits = StreamLimits::new("WatchPlan", 10, 4, 2, ["per", "all"]);
        let crowd: Vec<_> = (0..2)
            .map(|_| limits.open("principal:crowd".into()).unwrap())
            .collect();
        assert!(
            limits.open("principal:crowd".into()).is_err(),
            "a caller with streams open cannot take the reserved places"
        );
        let _mine = limits.open("principal:me".into()).unwrap();
        let _theirs = limits.open("principal:you".into()).unwrap();
        assert!(limits.open("principal:them".into()).is_err(), "total");
        assert!(limits.open("principal:me".into()).is_err());
        drop(crowd);
        assert_eq!(limits.open_count(), 2);
        // A caller with streams open may join only while fewer than
        // total − reserved = 2 are open; a first stream while fewer than 4.
        assert!(limits.open("principal:me".into()).is_err());
        assert!(limits.open("principal:them".into()).is_ok());
    }
}
