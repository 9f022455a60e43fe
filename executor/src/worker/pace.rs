//! Pacing a slice's runs: run sizes and the write-ahead mark's lookahead
//! from the rate, the tokens of each run, and the token debt of late and
//! lost confirms.

use std::time::Duration;

use redrive_proto::backoff::Backoff;
use tokio::time::Instant;
use tracing::{info, warn};

use super::{
    Leave, Worker,
    slice::{Progress, SliceRun},
};
use crate::{
    bucket::{BucketError, Rate},
    lease::{Lease, StopReason},
    publisher::Connect,
};

/// The token bucket's failures in [`LoopFailures`](crate::loop_failures::LoopFailures).
const TOKEN_BUCKET: &str = "token bucket";
/// Most tokens taken from the bucket in one call.
const TOKEN_CHUNK: u32 = 64;
/// A run asks for about this much of the rate's time at once, so that slow
/// rates take one token at a time and checks stay close to the publish.
const RUN_SPAN: Duration = Duration::from_millis(50);
/// At full speed the write-ahead mark is kept about this much of the rate
/// ahead of publishing ([`mark_lookahead`]).
const MARK_AHEAD_SPAN: Duration = Duration::from_millis(100);
/// A bucket that granted the last run's tokens within this did not hold it
/// back: the next run's mark is sent while its tokens are taken.
const TOKENS_AT_ONCE: Duration = Duration::from_millis(5);
/// A token older than this is not spent: the run is taken again with fresh
/// tokens (an interruption between the grant and the publish).
pub const TOKEN_SPEND_LIMIT: Duration = Duration::from_millis(250);

/// How far ahead of a run the write-ahead mark is kept at full speed: about
/// [`MARK_AHEAD_SPAN`] of the rate (a mark's durable commit and round trip
/// take tens of milliseconds), at most the confirm window `window`, at
/// least 1. This much is added to what a lost lease may leave `uncertain`.
pub fn mark_lookahead(rate: Rate, window: usize) -> u64 {
    let span = (rate.per_second * MARK_AHEAD_SPAN.as_secs_f64()).ceil();
    let most = u64::try_from(window).unwrap_or(u64::MAX).max(1);
    // `span` is finite and ≥ 0 (a validated rate); the cast saturates.
    (span as u64).clamp(1, most)
}

/// Tokens per bucket call for `rate`: about [`RUN_SPAN`] of it, at least 1,
/// at most the burst, [`TOKEN_CHUNK`] and the window.
pub fn run_size(rate: Rate, window: usize) -> usize {
    let span = (rate.per_second * RUN_SPAN.as_secs_f64()).floor();
    let most = rate
        .burst
        .min(TOKEN_CHUNK)
        .min(u32::try_from(window).unwrap_or(u32::MAX))
        .max(1);
    // `span` is finite and ≥ 0 (a validated rate); the cast saturates.
    (span as u32).clamp(1, most) as usize
}

impl<C: Connect> Worker<C> {
    /// Says once, for all slice loops, that the token bucket answers again
    /// after a failure that was said.
    fn bucket_mended(&self) {
        if self.settings.failures.mended(TOKEN_BUCKET, Instant::now()) {
            info!(redis = %self.settings.redis, "token bucket reachable again: publishing (said once for all slice loops)");
        }
    }

    /// Charges late and lost confirms of `key` to the rate limit again, the
    /// moment the connection works again: that is when what a stalled one
    /// held reaches the broker too. Fails closed: with the bucket
    /// unreachable nothing is published (the run is taken again after
    /// 500 ms).
    pub(super) async fn pay_debt(
        &self,
        lease: &Lease,
        run: &mut SliceRun,
        key: &str,
    ) -> Result<(), Leave> {
        run.progress.waiting_for("tokens of the rate limit");
        let owed = run.debt.take(key, u32::MAX);
        if owed == 0 {
            return Ok(());
        }
        info!(
            tokens = owed,
            destination = %key,
            "charging late or lost confirms to the rate limit again"
        );
        let charged = tokio::select! {
            () = lease.stopped() => {
                run.debt.add(key.to_owned(), owed);
                return Err(Leave::Stop);
            }
            charged = self.bucket.charge(key, run.rate, owed) => charged,
        };
        if let Err(error) = charged {
            let delay = Duration::from_millis(500);
            run.progress.waiting_for(
                "tokens of the rate limit (the token bucket in Redis failed at the last try)",
            );
            if self.settings.failures.to_say(
                TOKEN_BUCKET,
                &error.to_string(),
                Instant::now(),
                delay,
            ) {
                warn!(redis = %self.settings.redis, %error, "cannot charge the rate limit: not publishing (fail closed; said once for all slice loops)");
            }
            run.debt.add(key.to_owned(), owed);
            tokio::select! {
                () = lease.stopped() => return Err(Leave::Stop),
                () = tokio::time::sleep(delay) => return Err(Leave::Next),
            }
        }
        self.bucket_mended();
        Ok(())
    }

    /// Takes `tokens` of `key` and makes sure the planner has the lease's
    /// write-ahead mark through item `through` ([`Lease::mark_publishing`]):
    /// nothing is published before both, so a lost lease judges only marked
    /// items uncertain. Each mark is a durable commit, a round trip too
    /// slow to pay per run at full speed. So, while the bucket answers at
    /// once, the mark is kept up to a confirm window ahead of the run
    /// ([`Lease::mark_ahead`], in the background), and a run waits only
    /// when it is not there yet (overlapping the bucket's round trip).
    /// Under a rate limit the run waits for its tokens first and then marks
    /// exactly itself: a run still waiting is not marked. When the tokens
    /// were granted; `None` when publishing stopped first.
    pub(super) async fn grant(
        &self,
        lease: &Lease,
        run: &mut SliceRun,
        key: &str,
        tokens: u32,
        through: u64,
    ) -> Option<Instant> {
        let asked_at = Instant::now();
        run.progress.waiting_for("tokens of the rate limit");
        let progress = run.progress.clone();
        let take = async {
            let granted = self
                .take_tokens(lease, &progress, key, run.rate, tokens)
                .await
                .then(Instant::now);
            // What is left to wait for, if anything, is the mark.
            progress.waiting_for("the planner's write-ahead mark");
            granted
        };
        let (granted, marked) = if run.tokens_waited < TOKENS_AT_ONCE {
            let lookahead = mark_lookahead(run.rate, self.settings.publisher.window);
            let ahead = through
                .saturating_add(lookahead)
                .min(run.last_position)
                .max(through);
            if lease.is_marked_through(through) {
                // Moved once half the lookahead is used: one durable commit
                // per half a lookahead of items, not one per run.
                if !lease.is_marked_through(through.saturating_add(lookahead / 2)) {
                    lease.mark_ahead(ahead);
                }
                (take.await, true)
            } else {
                tokio::join!(take, lease.mark_publishing(ahead))
            }
        } else {
            match take.await {
                Some(granted_at) => (Some(granted_at), lease.mark_publishing(through).await),
                None => (None, false),
            }
        };
        let granted_at = granted.filter(|_| marked)?;
        run.tokens_waited = granted_at - asked_at;
        Some(granted_at)
    }

    /// Takes `tokens` of `key`; `false` when publishing stopped first or the
    /// bucket refused the request (the slice is given back then).
    pub(super) async fn take_tokens(
        &self,
        lease: &Lease,
        progress: &Progress,
        key: &str,
        rate: Rate,
        tokens: u32,
    ) -> bool {
        let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(2));
        loop {
            // A slow rate waits long for its tokens: the loop is alive
            // meanwhile, and beats once a second to say so.
            let acquire = self.bucket.acquire(key, rate, tokens);
            tokio::pin!(acquire);
            let answer = loop {
                tokio::select! {
                    () = lease.stopped() => return false,
                    answer = &mut acquire => break answer,
                    () = tokio::time::sleep(Duration::from_secs(1)) => self.heartbeat.beat(),
                }
            };
            match answer {
                Ok(()) => {
                    self.bucket_mended();
                    return true;
                }
                Err(BucketError::Unavailable { reason }) => {
                    let delay = backoff.next_delay();
                    // Kept until the tokens come: true while Redis is
                    // still gone, and while a slow rate's tokens are
                    // waited for after it came back.
                    progress.waiting_for("tokens of the rate limit (the token bucket in Redis failed at the last try)");
                    if self
                        .settings
                        .failures
                        .to_say(TOKEN_BUCKET, &reason, Instant::now(), delay)
                    {
                        warn!(redis = %self.settings.redis, %reason, retry_in_ms = delay.as_millis() as u64,
                            "token bucket unreachable: not publishing (fail closed; said once for all slice loops)");
                    }
                    tokio::select! {
                        () = lease.stopped() => return false,
                        () = tokio::time::sleep(delay) => {}
                    }
                }
                Err(error) => {
                    warn!(%error, "token bucket refused the request; giving the slice back");
                    lease.stop(StopReason::Plan(error.to_string()));
                    return false;
                }
            }
        }
    }
}
