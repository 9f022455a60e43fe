//! Live watches shared by their watchers (docs/design.md, "No caller takes
//! the planner from the others"): one reader of the database per watched
//! plan and per watched lease, however many streams watch it.
//!
//! - A **plan feed** reads a plan's new audit events and its progress once
//!   per change of the plan (a plan-change notification, `LISTEN/NOTIFY`,
//!   or a look every [`PLAN_RECHECK`] in case one was missed; changes are
//!   coalesced for [`WATCH_INTERVAL`]) and broadcasts them to every
//!   `WatchPlan` stream of that plan. A new stream with `include_events`
//!   reads the events before it joined itself (`history`), page by page,
//!   then goes on with the feed.
//! - A **lease feed** reads a lease's state once per plan change or every
//!   [`LEASE_RECHECK`] (an expiry sends no notification) and keeps the
//!   latest directive for every `WatchLease` stream of that lease (slice,
//!   fencing token and principal).
//!
//! A feed ends when its last stream goes, when what it watches ends (the
//! plan's final state, the lease lost) or when the planner stops. Every
//! read is counted in `redrive.planner.watch.reads`.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use futures::Stream;
use redrive_proto::v1;
use tokio::sync::{broadcast, mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::Status;

use crate::{
    audit::PAGE,
    audit::notifier::Notifier,
    error::Error,
    ids::{PlanId, SliceId},
    leases::{LEASE_RECHECK, lease_signal},
    plan,
    store::Store,
};

/// Progress is read at most this often while a plan moves.
pub const WATCH_INTERVAL: Duration = Duration::from_millis(250);
/// A plan feed looks at its plan at least this often, in case a
/// notification was missed.
pub const PLAN_RECHECK: Duration = Duration::from_secs(5);
/// Updates a plan feed keeps for streams that fall behind; one that falls
/// further catches up on the events it missed itself.
const FEED_BACKLOG: usize = 256;

/// What a plan feed sends its streams.
#[derive(Debug, Clone)]
enum Update {
    /// New audit events, in id order, with their ids.
    Events(Arc<Vec<(i64, v1::AuditEvent)>>),
    /// The plan as it is now.
    Progress(Arc<v1::Plan>),
    /// The feed could not read the plan; it ends.
    Failed(Status),
}

fn is_final(plan: &v1::Plan) -> bool {
    plan.state().is_final()
}

/// One watched plan's feed.
#[derive(Debug)]
struct PlanFeed {
    updates: broadcast::Sender<Update>,
    /// The latest progress, for streams that join.
    latest: Mutex<Arc<v1::Plan>>,
}

/// Who watches one lease: the slice, the fencing token and the principal.
type LeaseKey = (SliceId, u64, String);

/// The live watches of one planner; cheap to clone.
#[derive(Debug, Clone)]
pub struct WatchHub {
    store: Store,
    notifier: Notifier,
    shutdown: CancellationToken,
    plans: Arc<Mutex<HashMap<PlanId, Arc<PlanFeed>>>>,
    leases: Arc<Mutex<HashMap<LeaseKey, Arc<watch::Sender<v1::LeaseSignal>>>>>,
    /// Failed reads of lease feeds, logged at most every 10 s.
    unreadable_leases: Arc<crate::edge::admission::Throttled>,
}

impl WatchHub {
    /// The hub of one planner; its feeds end at `shutdown`.
    pub fn new(store: Store, notifier: Notifier, shutdown: CancellationToken) -> Self {
        Self {
            store,
            notifier,
            shutdown,
            plans: Arc::default(),
            leases: Arc::default(),
            unreadable_leases: Arc::default(),
        }
    }

    /// `WatchPlan`: progress snapshots (and audit events, with
    /// `include_events`) of `plan_id`, live: a snapshot at once, then one
    /// per change of the plan (at most every [`WATCH_INTERVAL`]), ending
    /// after the snapshot of a final state, or with `UNAVAILABLE` when the
    /// planner stops.
    ///
    /// # Errors
    /// `NotFound` for an unknown plan; store errors.
    pub async fn watch_plan(
        &self,
        plan_id: PlanId,
        include_events: bool,
    ) -> Result<impl Stream<Item = Result<v1::WatchPlanResponse, Status>> + Send + 'static, Error>
    {
        let (mut updates, latest) = self.join_plan(plan_id).await?;
        let (sender, receiver) = mpsc::channel(64);
        let store = self.store.clone();
        let shutdown = self.shutdown.clone();
        tokio::spawn(async move {
            let progress = |plan: &v1::Plan| v1::WatchPlanResponse {
                update: Some(v1::watch_plan_response::Update::Progress(plan.clone())),
            };
            let mut after = 0;
            if include_events && !catch_up(&store, plan_id, &mut after, &sender).await {
                return;
            }
            if sender.send(Ok(progress(&latest))).await.is_err() || is_final(&latest) {
                return;
            }
            let stopping = || {
                Status::unavailable(
                    "the planner is shutting down: watch again on another replica or after its restart",
                )
            };
            loop {
                let update = tokio::select! {
                    biased;
                    () = shutdown.cancelled() => {
                        let _ = sender.send(Err(stopping())).await;
                        return;
                    }
                    () = sender.closed() => return,
                    update = updates.recv() => update,
                };
                match update {
                    Ok(Update::Events(events)) => {
                        if !include_events {
                            continue;
                        }
                        for (id, event) in events.iter() {
                            if *id <= after {
                                continue;
                            }
                            after = *id;
                            let update = v1::WatchPlanResponse {
                                update: Some(v1::watch_plan_response::Update::Event(event.clone())),
                            };
                            if sender.send(Ok(update)).await.is_err() {
                                return;
                            }
                        }
                    }
                    Ok(Update::Progress(plan)) => {
                        if sender.send(Ok(progress(&plan))).await.is_err() || is_final(&plan) {
                            return;
                        }
                    }
                    Ok(Update::Failed(status)) => {
                        let _ = sender.send(Err(status)).await;
                        return;
                    }
                    // Fell behind the feed: the events it missed are read
                    // again; the next progress comes with the feed.
                    Err(broadcast::error::RecvError::Lagged(_)) => {
                        if include_events && !catch_up(&store, plan_id, &mut after, &sender).await {
                            return;
                        }
                    }
                    // The feed ended before a final state: the planner is
                    // stopping (a final state or a failure came first
                    // otherwise, and ended this stream).
                    Err(broadcast::error::RecvError::Closed) => {
                        let _ = sender.send(Err(stopping())).await;
                        return;
                    }
                }
            }
        });
        Ok(ReceiverStream::new(receiver))
    }

    /// Joins the feed of `plan_id`, starting it when none runs: its
    /// updates from now on, and the latest progress.
    async fn join_plan(
        &self,
        plan_id: PlanId,
    ) -> Result<(broadcast::Receiver<Update>, Arc<v1::Plan>), Error> {
        if let Some(joined) = self.joined_plan(plan_id) {
            return Ok(joined);
        }
        // Listen before reading, so that no change after the read is missed.
        let changes = self.notifier.subscribe();
        let first = Arc::new(plan::get(&self.store, plan_id).await?);
        let after = self.store.last_audit_event_id(plan_id).await?;
        self.store.metrics().watch_read("plan");
        let mut plans = self.plans.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(feed) = plans.get(&plan_id) {
            // Another stream started it meanwhile.
            let latest = Arc::clone(&feed.latest.lock().unwrap_or_else(PoisonError::into_inner));
            return Ok((feed.updates.subscribe(), latest));
        }
        let (updates, receiver) = broadcast::channel(FEED_BACKLOG);
        let feed = Arc::new(PlanFeed {
            updates,
            latest: Mutex::new(Arc::clone(&first)),
        });
        plans.insert(plan_id, Arc::clone(&feed));
        drop(plans);
        if !is_final(&first) {
            tokio::spawn(self.clone().run_plan_feed(plan_id, feed, changes, after));
        } else {
            self.remove_plan(plan_id, &feed);
        }
        Ok((receiver, first))
    }

    fn joined_plan(&self, plan_id: PlanId) -> Option<(broadcast::Receiver<Update>, Arc<v1::Plan>)> {
        let plans = self.plans.lock().unwrap_or_else(PoisonError::into_inner);
        let feed = plans.get(&plan_id)?;
        // Subscribed before the latest is read: a newer progress sent
        // between the two comes twice, never not at all.
        let updates = feed.updates.subscribe();
        let latest = Arc::clone(&feed.latest.lock().unwrap_or_else(PoisonError::into_inner));
        Some((updates, latest))
    }

    fn remove_plan(&self, plan_id: PlanId, feed: &Arc<PlanFeed>) {
        remove_feed(
            &mut self.plans.lock().unwrap_or_else(PoisonError::into_inner),
            &plan_id,
            feed,
        );
    }

    /// The one reader of a plan's changes for all its streams.
    async fn run_plan_feed(
        self,
        plan_id: PlanId,
        feed: Arc<PlanFeed>,
        mut changes: broadcast::Receiver<PlanId>,
        mut after: i64,
    ) {
        loop {
            tokio::select! {
                () = plan_changed(&mut changes, plan_id) => {}
                () = tokio::time::sleep(PLAN_RECHECK) => {}
                () = self.shutdown.cancelled() => {
                    self.remove_plan(plan_id, &feed);
                    return;
                }
            }
            // Nobody watches any more: the feed ends (under the hub's lock,
            // so that no stream joins it meanwhile).
            {
                let mut plans = self.plans.lock().unwrap_or_else(PoisonError::into_inner);
                if feed.updates.receiver_count() == 0 {
                    remove_feed(&mut plans, &plan_id, &feed);
                    return;
                }
            }
            tokio::time::sleep(WATCH_INTERVAL).await;
            // A change seen now is covered by the reads below.
            while changes.try_recv().is_ok() {}
            let read = async {
                let mut pages = Vec::new();
                loop {
                    let page = self.store.audit_events(plan_id, after, PAGE).await?;
                    let full = page.len() as i64 == PAGE;
                    if let Some((last, _)) = page.last() {
                        after = *last;
                    }
                    if !page.is_empty() {
                        pages.push(page);
                    }
                    if !full {
                        break;
                    }
                }
                let plan = plan::get(&self.store, plan_id).await?;
                Ok::<_, Error>((pages, plan))
            };
            let (pages, plan) = match read.await {
                Ok(read) => read,
                Err(error) => {
                    let _ = feed.updates.send(Update::Failed(Status::from(error)));
                    self.remove_plan(plan_id, &feed);
                    return;
                }
            };
            self.store.metrics().watch_read("plan");
            for page in pages {
                let _ = feed.updates.send(Update::Events(Arc::new(page)));
            }
            let plan = Arc::new(plan);
            let done = is_final(&plan);
            *feed.latest.lock().unwrap_or_else(PoisonError::into_inner) = Arc::clone(&plan);
            let _ = feed.updates.send(Update::Progress(plan));
            if done {
                self.remove_plan(plan_id, &feed);
                return;
            }
        }
    }

    /// `WatchLease`: the stop signal of the lease `slice_id` under `token`
    /// held by `principal`: the current directive at once, then one per
    /// change, ending with `lease_lost` (see `WatchLease` in
    /// `coordinator.proto`) or when the planner stops.
    ///
    /// # Errors
    /// `FailedPrecondition` (STALE_FENCING_TOKEN) when the token is not the
    /// slice's current lease of `principal`; store errors.
    pub async fn watch_lease(
        &self,
        slice_id: SliceId,
        token: u64,
        principal: &str,
    ) -> Result<mpsc::Receiver<v1::LeaseSignal>, Error> {
        let mut signals = self.join_lease(slice_id, token, principal).await?;
        let (sender, receiver) = mpsc::channel(4);
        let shutdown = self.shutdown.clone();
        tokio::spawn(async move {
            loop {
                let signal = signals.borrow_and_update().clone();
                let lost = signal.lease_lost;
                if sender.send(signal).await.is_err() || lost {
                    return;
                }
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    () = sender.closed() => return,
                    changed = signals.changed() => {
                        if changed.is_err() {
                            return;
                        }
                    }
                }
            }
        });
        Ok(receiver)
    }

    async fn join_lease(
        &self,
        slice_id: SliceId,
        token: u64,
        principal: &str,
    ) -> Result<watch::Receiver<v1::LeaseSignal>, Error> {
        let key: LeaseKey = (slice_id, token, principal.to_owned());
        let stale = || {
            Error::from(crate::store::StaleToken {
                slice_id,
                token: i64::try_from(token).unwrap_or(i64::MAX),
            })
        };
        if let Some(feed) = self
            .leases
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&key)
        {
            let signals = feed.subscribe();
            if signals.borrow().lease_lost {
                return Err(stale());
            }
            return Ok(signals);
        }
        let changes = self.notifier.subscribe();
        let db_token = i64::try_from(token).map_err(|_| stale())?;
        let (plan_id, first) = self
            .store
            .lease_state(slice_id, db_token, principal)
            .await??;
        self.store.metrics().watch_read("lease");
        let mut leases = self.leases.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(feed) = leases.get(&key) {
            return Ok(feed.subscribe());
        }
        let (feed, signals) = watch::channel(lease_signal(Ok(first)));
        let feed = Arc::new(feed);
        leases.insert(key.clone(), Arc::clone(&feed));
        drop(leases);
        tokio::spawn(
            self.clone()
                .run_lease_feed(key, db_token, plan_id, feed, changes),
        );
        Ok(signals)
    }

    fn remove_lease(&self, key: &LeaseKey, feed: &Arc<watch::Sender<v1::LeaseSignal>>) {
        remove_feed(
            &mut self.leases.lock().unwrap_or_else(PoisonError::into_inner),
            key,
            feed,
        );
    }

    /// The one reader of a lease's state for all its streams: read again
    /// when the lease's plan changes, and every [`LEASE_RECHECK`].
    async fn run_lease_feed(
        self,
        key: LeaseKey,
        token: i64,
        plan_id: PlanId,
        feed: Arc<watch::Sender<v1::LeaseSignal>>,
        mut changes: broadcast::Receiver<PlanId>,
    ) {
        let (slice_id, _, principal) = &key;
        loop {
            tokio::select! {
                () = self.shutdown.cancelled() => {
                    self.remove_lease(&key, &feed);
                    return;
                }
                () = tokio::time::sleep(LEASE_RECHECK) => {}
                () = plan_changed(&mut changes, plan_id) => {
                    // Coalesce a burst of notifications (one per report).
                    while changes.try_recv().is_ok() {}
                }
            }
            {
                let mut leases = self.leases.lock().unwrap_or_else(PoisonError::into_inner);
                if feed.receiver_count() == 0 {
                    remove_feed(&mut leases, &key, &feed);
                    return;
                }
            }
            let state = match self.store.lease_state(*slice_id, token, principal).await {
                Ok(state) => state,
                Err(error) => {
                    if let Some(count) = self.unreadable_leases.count() {
                        tracing::warn!(%error, slice.id = slice_id.get(), failed = count, "cannot read a lease's state (logged at most every 10 s)");
                    }
                    continue;
                }
            };
            self.store.metrics().watch_read("lease");
            let signal = lease_signal(state.map(|(_, state)| state));
            let lost = signal.lease_lost;
            feed.send_if_modified(|current| {
                if *current == signal {
                    false
                } else {
                    *current = signal;
                    true
                }
            });
            if lost {
                self.remove_lease(&key, &feed);
                return;
            }
        }
    }
}

/// Waits for a notification that `plan_id` changed; a lag counts as one
/// (it may have been missed). Once the notifier is gone it never returns:
/// the feeds' periodic looks go on.
async fn plan_changed(changes: &mut broadcast::Receiver<PlanId>, plan_id: PlanId) {
    loop {
        match changes.recv().await {
            Ok(changed) if changed == plan_id => return,
            Ok(_) => {}
            Err(broadcast::error::RecvError::Lagged(_)) => return,
            Err(broadcast::error::RecvError::Closed) => std::future::pending::<()>().await,
        }
    }
}

/// Removes `feed` from `feeds` when it is still the feed of `key` (a feed
/// that ended may have been replaced by a new one meanwhile).
fn remove_feed<K: std::hash::Hash + Eq, V>(feeds: &mut HashMap<K, Arc<V>>, key: &K, feed: &Arc<V>) {
    if feeds.get(key).is_some_and(|held| Arc::ptr_eq(held, feed)) {
        feeds.remove(key);
    }
}

/// Sends the events of `plan_id` after `after` to `sender`, page by page,
/// moving `after`; `false` when the stream ended (gone, or told of an
/// error).
async fn catch_up(
    store: &Store,
    plan_id: PlanId,
    after: &mut i64,
    sender: &mpsc::Sender<Result<v1::WatchPlanResponse, Status>>,
) -> bool {
    loop {
        let Some(page) = crate::task_stream::or_send_error(
            store.audit_events(plan_id, *after, PAGE).await,
            sender,
        )
        .await
        else {
            return false;
        };
        store.metrics().watch_read("history");
        let full = page.len() as i64 == PAGE;
        for (id, event) in page {
            *after = id;
            let update = v1::WatchPlanResponse {
                update: Some(v1::watch_plan_response::Update::Event(event)),
            };
            if sender.send(Ok(update)).await.is_err() {
                return false;
            }
        }
        if !full {
            return true;
        }
    }
}
