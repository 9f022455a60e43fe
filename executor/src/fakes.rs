//! Fakes for the executor's unit tests: a planner `Coordinator` served in
//! memory ([`FakePlanner`]) and a broker behind the [`Publish`] seam
//! ([`FakeBroker`]). Both record what the executor did.

use std::{
    collections::{HashMap, VecDeque},
    pin::Pin,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use futures::Stream;
use redrive_proto::v1::{
    self,
    coordinator_client::CoordinatorClient,
    coordinator_server::{Coordinator, CoordinatorServer},
};
use tokio::{
    sync::{OwnedSemaphorePermit, Semaphore, mpsc},
    time::Instant,
};
use tokio_util::task::AbortOnDropHandle;
use tonic::{
    Request, Response, Status, Streaming,
    transport::{Channel, Endpoint, Server},
};

use crate::publisher::{
    Connect, Handoff, Outgoing, Pending, Publish, PublishError, PublishOutcome, Slot,
};

/// What the fake planner was asked, in order.
#[derive(Debug, Default)]
pub(crate) struct Calls {
    /// When each `Heartbeat` came (the paused clock in a paused test).
    pub(crate) heartbeats: Vec<Instant>,
    /// Every `MarkPublishing`'s position.
    pub(crate) marks: Vec<u64>,
    /// Every reported event, in report order.
    pub(crate) reported: Vec<v1::AuditEvent>,
    /// Every `CompleteSlice`'s `release`.
    pub(crate) completed: Vec<bool>,
    /// Every `RecheckState`'s dead letter ids.
    pub(crate) rechecks: Vec<Vec<String>>,
}

/// How the fake planner answers.
#[derive(Debug, Default, Clone)]
pub(crate) struct Answers {
    /// Refuse every reported event under a live lease (a planner that
    /// never saw them marked).
    pub(crate) refuse_reports: bool,
    /// Dead letter ids the owning service blocks, with the reason.
    pub(crate) blocked: HashMap<String, String>,
    /// Answer heartbeats with `UNAVAILABLE` from this many on (the first is
    /// number 1): a planner that stopped answering.
    pub(crate) heartbeats_fail_from: Option<usize>,
}

#[derive(Clone)]
struct Fake {
    calls: Arc<Mutex<Calls>>,
    answers: Answers,
}

impl Fake {
    fn calls(&self) -> std::sync::MutexGuard<'_, Calls> {
        self.calls.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

#[tonic::async_trait]
impl Coordinator for Fake {
    async fn claim_slice(
        &self,
        _request: Request<v1::ClaimSliceRequest>,
    ) -> Result<Response<v1::ClaimSliceResponse>, Status> {
        // Nothing to claim: a long poll that ends empty.
        tokio::time::sleep(Duration::from_millis(50)).await;
        Ok(Response::new(v1::ClaimSliceResponse::default()))
    }

    async fn heartbeat(
        &self,
        _request: Request<v1::HeartbeatRequest>,
    ) -> Result<Response<v1::HeartbeatResponse>, Status> {
        let count = {
            let mut calls = self.calls();
            calls.heartbeats.push(Instant::now());
            calls.heartbeats.len()
        };
        if self
            .answers
            .heartbeats_fail_from
            .is_some_and(|from| count >= from)
        {
            return Err(Status::unavailable("the fake planner stopped answering"));
        }
        Ok(Response::new(v1::HeartbeatResponse {
            keep_publishing: true,
            reason: String::new(),
        }))
    }

    type WatchLeaseStream = BoxStream<v1::LeaseSignal>;

    async fn watch_lease(
        &self,
        _request: Request<v1::WatchLeaseRequest>,
    ) -> Result<Response<Self::WatchLeaseStream>, Status> {
        // Never a signal: the lease's own deadline and heartbeats decide.
        Ok(Response::new(Box::pin(futures::stream::pending())))
    }

    type ReportOutcomesStream = BoxStream<v1::ReportOutcomesResponse>;

    async fn report_outcomes(
        &self,
        request: Request<Streaming<v1::ReportOutcomesRequest>>,
    ) -> Result<Response<Self::ReportOutcomesStream>, Status> {
        let mut requests = request.into_inner();
        let mut answers = Vec::new();
        while let Some(report) = requests.message().await? {
            let count = u64::try_from(report.events.len()).unwrap_or(u64::MAX);
            self.calls().reported.extend(report.events);
            let (accepted, refused) = if self.answers.refuse_reports {
                (0, count)
            } else {
                (count, 0)
            };
            answers.push(Ok(v1::ReportOutcomesResponse {
                accepted,
                refused,
                dropped: refused,
                ..Default::default()
            }));
        }
        Ok(Response::new(Box::pin(futures::stream::iter(answers))))
    }

    async fn complete_slice(
        &self,
        request: Request<v1::CompleteSliceRequest>,
    ) -> Result<Response<v1::CompleteSliceResponse>, Status> {
        self.calls().completed.push(request.into_inner().release);
        Ok(Response::new(v1::CompleteSliceResponse::default()))
    }

    async fn recheck_state(
        &self,
        request: Request<v1::RecheckStateRequest>,
    ) -> Result<Response<v1::RecheckStateResponse>, Status> {
        let ids = request.into_inner().dead_letter_ids;
        self.calls().rechecks.push(ids.clone());
        let decisions = ids
            .into_iter()
            .map(|id| {
                let (verdict, reason) = match self.answers.blocked.get(&id) {
                    Some(reason) => (v1::StateCheckVerdict::Block, reason.clone()),
                    None => (v1::StateCheckVerdict::Replay, String::new()),
                };
                v1::StateDecision {
                    dead_letter_id: id,
                    verdict: verdict.into(),
                    reason,
                }
            })
            .collect();
        Ok(Response::new(v1::RecheckStateResponse { decisions }))
    }

    async fn mark_publishing(
        &self,
        request: Request<v1::MarkPublishingRequest>,
    ) -> Result<Response<v1::MarkPublishingResponse>, Status> {
        let through = request
            .into_inner()
            .through_item_id
            .parse()
            .map_err(|_| Status::invalid_argument("not a position"))?;
        self.calls().marks.push(through);
        Ok(Response::new(v1::MarkPublishingResponse::default()))
    }
}

/// A planner's `Coordinator` served in memory (no socket: it works on a
/// paused clock), and a client of it.
pub(crate) struct FakePlanner {
    /// A client of the fake, as the executor holds one.
    pub(crate) client: CoordinatorClient<Channel>,
    fake: Fake,
    _serving: AbortOnDropHandle<()>,
}

impl FakePlanner {
    /// Serves a fake planner that answers as `answers` says.
    pub(crate) fn start(answers: Answers) -> Self {
        let fake = Fake {
            calls: Arc::default(),
            answers,
        };
        let (connections, incoming) = mpsc::channel::<std::io::Result<tokio::io::DuplexStream>>(4);
        let server = Server::builder()
            .add_service(CoordinatorServer::new(fake.clone()))
            .serve_with_incoming(tokio_stream::wrappers::ReceiverStream::new(incoming));
        let serving = AbortOnDropHandle::new(tokio::spawn(async move {
            let _ = server.await;
        }));
        let channel = Endpoint::from_static("http://fake.planner").connect_with_connector_lazy(
            tower::service_fn(move |_: tonic::transport::Uri| {
                let connections = connections.clone();
                async move {
                    let (client, server) = tokio::io::duplex(1 << 20);
                    connections
                        .send(Ok(server))
                        .await
                        .map_err(|_| std::io::Error::other("the fake planner stopped"))?;
                    Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(client))
                }
            }),
        );
        Self {
            client: CoordinatorClient::new(channel),
            fake,
            _serving: serving,
        }
    }

    /// What it was asked so far.
    pub(crate) fn calls(&self) -> std::sync::MutexGuard<'_, Calls> {
        self.fake.calls()
    }
}

/// How the fake broker answers one publish.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Answer {
    /// `basic.ack`: sent.
    Ack,
    /// `basic.nack`.
    Nack,
    /// No confirm ever (the connection is lost with it): uncertain.
    Never,
    /// Its frames were never written (the connection was lost first): not
    /// published.
    Unwritten,
}

/// A broker behind the [`Publish`] seam: it records every publish and
/// answers each by its body, per attempt ([`FakeBroker::answer`]; acks
/// when nothing is scripted).
pub(crate) struct FakeBroker {
    window: Arc<Semaphore>,
    window_size: usize,
    /// Body → answers of its next publishes, in order.
    script: Mutex<HashMap<Vec<u8>, VecDeque<Answer>>>,
    /// The bodies published, in publish order.
    published: Mutex<Vec<String>>,
    /// The handoff each publish asked for, in publish order.
    handoffs: Mutex<Vec<Handoff>>,
}

impl FakeBroker {
    /// A broker whose publishers have a confirm window of `window`.
    pub(crate) fn new(window: usize) -> Arc<Self> {
        Arc::new(Self {
            window: Arc::new(Semaphore::new(window)),
            window_size: window,
            script: Mutex::default(),
            published: Mutex::default(),
            handoffs: Mutex::default(),
        })
    }

    /// The message with body `body` is answered `answers`, one per
    /// publish, then acked.
    pub(crate) fn answer(&self, body: &str, answers: &[Answer]) {
        self.script
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(body.as_bytes().to_vec(), answers.iter().copied().collect());
    }

    /// The bodies published so far, in publish order.
    pub(crate) fn published(&self) -> Vec<String> {
        self.published
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The handoff of every publish so far, in publish order.
    pub(crate) fn handoffs(&self) -> Vec<Handoff> {
        self.handoffs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// Connects publishers of a [`FakeBroker`].
#[derive(Clone)]
pub(crate) struct FakeConnect(pub(crate) Arc<FakeBroker>);

/// A connected publisher of a [`FakeBroker`].
pub(crate) struct FakePublisher(Arc<FakeBroker>);

impl Connect for FakeConnect {
    type Publisher = FakePublisher;

    async fn connect(&self) -> Result<FakePublisher, PublishError> {
        Ok(FakePublisher(Arc::clone(&self.0)))
    }
}

impl Publish for FakePublisher {
    fn is_connected(&self) -> bool {
        true
    }

    async fn reserve(&self, count: usize) -> Result<Vec<Slot>, PublishError> {
        let count = count.clamp(1, self.0.window_size);
        let mut slots = Vec::with_capacity(count);
        for _ in 0..count {
            let permit: OwnedSemaphorePermit = Arc::clone(&self.0.window)
                .acquire_owned()
                .await
                .map_err(|_| PublishError::ConnectionLost {
                    reason: "closed".to_owned(),
                })?;
            slots.push(Slot::fake(permit));
        }
        Ok(slots)
    }

    async fn publish_in(
        &self,
        slot: Slot,
        outgoing: Outgoing,
        _not_after: Option<Instant>,
        handoff: Handoff,
    ) -> Result<Pending, PublishError> {
        // The fake's window frees at once: confirms are not held here.
        drop(slot);
        self.0
            .handoffs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(handoff);
        let body = outgoing.body.clone();
        self.0
            .published
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(String::from_utf8_lossy(&body).into_owned());
        let answer = self
            .0
            .script
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get_mut(&body)
            .and_then(VecDeque::pop_front)
            .unwrap_or(Answer::Ack);
        Ok(match answer {
            Answer::Ack => Pending::ready(PublishOutcome::Sent {
                latency: Duration::from_millis(1),
            }),
            Answer::Nack => Pending::ready(PublishOutcome::Nacked),
            // Its sender dropped: "the publisher stopped before the
            // confirm came".
            Answer::Never => Pending::fake().1,
            // As the real publisher: a publish that returns only once
            // written fails then; one that returned at the handoff learns
            // it from its outcome.
            Answer::Unwritten if handoff == Handoff::Written => {
                return Err(PublishError::ConnectionLost {
                    reason: "connection reset by peer".to_owned(),
                });
            }
            Answer::Unwritten => Pending::ready(PublishOutcome::NotPublished {
                reason: "connection reset by peer".to_owned(),
            }),
        })
    }

    fn oldest_unconfirmed_age(&self) -> Option<Duration> {
        None
    }

    fn in_flight(&self) -> usize {
        0
    }

    async fn close(self) -> Result<(), PublishError> {
        Ok(())
    }
}
