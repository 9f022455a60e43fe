//! The publishing pipeline of a slice: its runs, room in the confirm
//! window, and the publishes themselves (the steps of the [`super`] docs).

use std::{collections::VecDeque, time::Duration};

use redrive_proto::v1;
use tokio::time::Instant;
use tracing::warn;

use super::{
    Leave, Worker, filters::drop_stale, pace::TOKEN_SPEND_LIMIT, pace::run_size, slice::SliceRun,
};
use crate::{
    lease::{Lease, StopReason},
    message,
    outcomes::{InFlight, LATE_CONFIRM, Work},
    publisher::{Connect, Outgoing, Publish, PublishError, Slot},
};

/// The instrumentation scope of the publish spans (the crate, as the
/// `tracing` bridge names the executor's other spans).
const TRACER_SCOPE: &str = "redrive-executor";

impl<C: Connect> Worker<C> {
    /// Publishes the slice's queue until it is empty or the lease stops.
    pub(super) async fn publish_slice(&mut self, lease: &Lease, run: &mut SliceRun) {
        let chunk = run_size(run.rate, self.settings.publisher.window);
        loop {
            while let Ok(message) = run.feedback.try_recv() {
                run.take_feedback(message);
            }
            if run.outstanding == 0 || !lease.may_publish() {
                return;
            }
            let Some(work) = run.queue.pop_front() else {
                // Everything is published: wait for confirms or retries.
                run.progress.waiting_for("publisher confirms");
                tokio::select! {
                    () = lease.stopped() => return,
                    message = run.feedback.recv() => match message {
                        Some(message) => run.take_feedback(message),
                        None => return,
                    },
                }
                continue;
            };
            if let Some(not_before) = work.not_before {
                run.progress.waiting_for("a retry's backoff");
                tokio::select! {
                    () = lease.stopped() => {
                        run.queue.push_front(work);
                        return;
                    }
                    () = tokio::time::sleep_until(not_before) => {}
                }
            }
            let items = run.next_run(work, chunk);
            match self.publish_run(lease, run, items).await {
                Leave::Stop => return,
                Leave::Next => {}
            }
        }
    }

    /// One run of the pipeline (module docs). A step that cannot go on puts
    /// the run's items back at the front of the queue and says why
    /// ([`Leave`]).
    pub(super) async fn publish_run(
        &mut self,
        lease: &Lease,
        run: &mut SliceRun,
        items: Vec<Work>,
    ) -> Leave {
        // 1. Decided without publishing.
        let items = drop_stale(run, items).await;
        let Some(items) = self.recheck_state(lease, run, items).await else {
            return Leave::Stop;
        };
        if items.is_empty() {
            return Leave::Next;
        }
        let through = items.iter().map(Work::position).max().unwrap_or(0);
        let key = items[0].bucket_key();
        // 2. Room in the window, the debt, then the tokens and the mark.
        let slots = match self.room(lease, run, items.len()).await {
            Ok(slots) => slots,
            Err(leave) => return run.give_back(items, leave),
        };
        if let Err(leave) = self.pay_debt(lease, run, &key).await {
            return run.give_back(items, leave);
        }
        let tokens = u32::try_from(items.len()).unwrap_or(u32::MAX);
        let Some(granted_at) = self.grant(lease, run, &key, tokens, through).await else {
            return run.give_back(items, Leave::Stop);
        };
        self.metrics.tokens_granted(
            &items[0].item.exchange,
            &items[0].item.routing_key,
            tokens,
            run.tokens_waited,
            run.rate.per_second,
        );
        // 3. Sent by a concurrent plan or an earlier lease (Redis).
        run.progress.waiting_for("the replay keys in Redis");
        let Some(items) = self.drop_replayed(lease, run, items).await else {
            return Leave::Stop;
        };
        // 4. Publish, each only under a live lease and a fresh token.
        self.publish_items(lease, run, items, slots, granted_at)
            .await
    }

    /// A connected publisher with room for `count` publishes in its confirm
    /// window, and no confirm overdue: a confirm overdue means a stalled
    /// connection, so nothing more goes into it until it answers or the
    /// confirm timeout ends it. The broker unreachable for half the lease
    /// TTL gives the slice back.
    pub(super) async fn room(
        &mut self,
        lease: &Lease,
        run: &mut SliceRun,
        count: usize,
    ) -> Result<Vec<Slot>, Leave> {
        run.progress.waiting_for("the broker connection");
        let Some(publisher) = self
            .publisher(&lease.stop_signal(), Some(lease.ttl() / 2))
            .await
        else {
            if lease.may_publish() {
                warn!("broker unreachable for half the lease TTL: giving the slice back");
                lease.stop(StopReason::Plan("broker unreachable".to_owned()));
            }
            return Err(Leave::Stop);
        };
        run.progress.waiting_for("room in the confirm window");
        let slots = tokio::select! {
            () = lease.stopped() => return Err(Leave::Stop),
            slots = publisher.reserve(count) => slots,
        };
        let Ok(slots) = slots else {
            self.retire_publisher();
            return Err(Leave::Next);
        };
        let overdue = |publisher: &C::Publisher| {
            publisher
                .oldest_unconfirmed_age()
                .is_some_and(|age| age > LATE_CONFIRM)
        };
        if overdue(publisher) {
            run.progress.waiting_for("an overdue publisher confirm");
            tracing::debug!(
                in_flight = publisher.in_flight(),
                "a publisher confirm is overdue: not publishing until it comes"
            );
        }
        while overdue(publisher) && publisher.is_connected() {
            if let Some(heartbeat) = &run.progress.heartbeat {
                heartbeat.beat();
            }
            tokio::select! {
                () = lease.stopped() => return Err(Leave::Stop),
                () = tokio::time::sleep(Duration::from_millis(20)) => {}
            }
        }
        if !publisher.is_connected() {
            // The confirm timeout ended it: reconnect first. The debt of its
            // lost confirms is paid on the new connection, when whatever the
            // dead one held may reach the broker too.
            self.retire_publisher();
            return Err(Leave::Next);
        }
        Ok(slots)
    }

    /// Publishes `items` into `slots` (one each), each only while the lease
    /// allows it and while the run's tokens, granted at `granted_at`, are
    /// fresh ([`TOKEN_SPEND_LIMIT`]); the rest goes back to the queue.
    pub(super) async fn publish_items(
        &mut self,
        lease: &Lease,
        run: &mut SliceRun,
        items: Vec<Work>,
        mut slots: Vec<Slot>,
        granted_at: Instant,
    ) -> Leave {
        let Some(publisher) = self.publisher.as_ref() else {
            return run.give_back(items, Leave::Next);
        };
        // With spans exported, each message's publish span is a child of the
        // slice's span.
        let tracing: Option<Tracing> = redrive_proto::telemetry::tracing_enabled().then(|| {
            use tracing_opentelemetry::OpenTelemetrySpanExt as _;
            (
                opentelemetry::global::tracer(TRACER_SCOPE),
                tracing::Span::current().context(),
            )
        });
        let mut items = VecDeque::from(items);
        while let Some(work) = items.pop_front() {
            if !lease.may_publish() {
                items.push_front(work);
                return run.give_back(items, Leave::Stop);
            }
            if granted_at.elapsed() > TOKEN_SPEND_LIMIT {
                items.push_front(work);
                return run.give_back(items, Leave::Next);
            }
            // A slot first: a span is made only for a message that goes out.
            let Some(slot) = slots.pop() else {
                items.push_front(work);
                return run.give_back(items, Leave::Next);
            };
            if publisher
                .oldest_unconfirmed_age()
                .is_some_and(|age| age > LATE_CONFIRM)
            {
                // Overdue since the room was made: take the tokens again later.
                items.push_front(work);
                return run.give_back(items, Leave::Next);
            }
            let (outgoing, span) = match outgoing(tracing.as_ref(), run, &work) {
                Ok(message) => message,
                Err(reason) => {
                    slots.push(slot);
                    run.finish(&work, v1::AuditAction::Failed, &reason).await;
                    continue;
                }
            };
            let not_after = lease.deadline().min(granted_at + TOKEN_SPEND_LIMIT);
            match publisher
                .publish_in(slot, outgoing, Some(not_after), run.handoff)
                .await
            {
                Ok(pending) => {
                    run.progress.bump();
                    if run
                        .in_flight
                        .send(InFlight {
                            work,
                            pending,
                            span,
                        })
                        .await
                        .is_err()
                    {
                        return Leave::Stop;
                    }
                }
                Err(PublishError::Expired) => {
                    // Not published: its token or the lease ran out while it
                    // waited for the publishing task.
                    items.push_front(work);
                    return run.give_back(items, Leave::Next);
                }
                Err(error) => {
                    // Not published: publish it again on a new connection,
                    // with new tokens.
                    warn!(%error, "publish failed; reconnecting");
                    self.retire_publisher();
                    items.push_front(work);
                    return run.give_back(items, Leave::Next);
                }
            }
        }
        Leave::Next
    }
}

/// The tracer of publish spans and the slice span's context, their parent.
type Tracing = (opentelemetry::global::BoxedTracer, opentelemetry::Context);

/// The message of `work`'s attempt, and its publish span when spans are
/// exported (`tracing`): the message names its span as its traceparent;
/// otherwise a random traceparent, and no span per message. The error
/// (properties that cannot be built) is the reason it fails.
fn outgoing(
    tracing: Option<&Tracing>,
    run: &SliceRun,
    work: &Work,
) -> Result<(Outgoing, Option<opentelemetry::global::BoxedSpan>), String> {
    let span = tracing.map(|(tracer, parent)| {
        message::publish_span(
            tracer,
            parent,
            &run.context.plan_id,
            &run.context.slice_id,
            &work.item,
        )
    });
    let traceparent = span
        .as_ref()
        .and_then(|span| {
            use opentelemetry::trace::Span as _;
            redrive_proto::telemetry::traceparent_of_context(span.span_context())
        })
        .unwrap_or_else(message::traceparent);
    // lapin takes these as AMQP short strings and panics past 255 bytes (a
    // new user's pass: an imported queue name of 300 bytes crashed the
    // publisher once a second): such an item fails, named.
    for (what, name) in [
        ("exchange", &work.item.exchange),
        ("routing key", &work.item.routing_key),
    ] {
        if let Some(problem) = redrive_proto::limits::amqp_name_problem(what, name) {
            return Err(problem);
        }
    }
    let properties = message::properties(
        &run.context.plan_id,
        &run.context.executor_id,
        &work.item,
        work.attempt,
        &traceparent,
    )?;
    let outgoing = Outgoing {
        exchange: work.item.exchange.clone(),
        routing_key: work.item.routing_key.clone(),
        body: work.item.body.clone(),
        properties,
    };
    Ok((outgoing, span))
}
