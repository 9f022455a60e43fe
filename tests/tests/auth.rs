//! The trust boundary over real TLS (issue 15): certificates, tokens and JWTs
//! made in the test ([`redrive_tests::pki`]); who may call what; four-eyes
//! by authenticated principal; delegation recorded with both names; an
//! executor with a client certificate replaying a plan end to end.

use std::time::Duration;

use redrive_proto::v1::{
    self, ApprovePlanRequest, CreatePlanRequest, PlanState, Rate, RunPrecheckRequest,
    coordinator_client::CoordinatorClient, planner_client::PlannerClient,
};
use redrive_tests::{
    Broker, ExecutorHandle, TestBed, init_logging,
    orders_hook::{self, OrdersHook},
    pki::{JWT_AUDIENCE, JWT_ISSUER, Pki, token_of},
};
use tonic::{Code, Request, transport::Channel};

mod support;
use support::*;

/// `message` sent with `authorization: Bearer TOKEN`, and `x-redrive-actor`
/// when `actor` is given.
fn bearer<T>(token: &str, actor: Option<&str>, message: T) -> Request<T> {
    let mut request = Request::new(message);
    request.metadata_mut().insert(
        "authorization",
        format!("Bearer {token}").parse().expect("an ASCII token"),
    );
    if let Some(actor) = actor {
        request
            .metadata_mut()
            .insert("x-redrive-actor", actor.parse().expect("an ASCII actor"));
    }
    request
}

/// `message` as principal `name` of the token file.
fn as_principal<T>(name: &str, message: T) -> Request<T> {
    bearer(token_of(name), None, message)
}

/// An incident of 5 messages and a secure bed capturing its DLQ with
/// four-eyes on, the 5 dead letters stored.
async fn secure_incident() -> anyhow::Result<(Incident, TestBed)> {
    let broker = Broker::connect().await?;
    let incident = incident(&broker, 5).await?;
    let mut bed = TestBed::start_secure(Some(broker), Pki::new()?, |config| {
        capturing(config, &[&incident.dlq]);
        config.four_eyes = true;
    })
    .await?;
    captured(&mut bed.client, &incident.dlq, 5).await?;
    Ok((incident, bed))
}

/// The refusal `answer` must be: PermissionDenied.
fn denied<T: std::fmt::Debug>(answer: Result<T, tonic::Status>) -> tonic::Status {
    let refused = answer.unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    refused
}

/// A client over TLS without a client certificate (trusting the bed's CA).
async fn client_without_certificate(bed: &TestBed) -> anyhow::Result<PlannerClient<Channel>> {
    let pki = bed.pki.as_ref().expect("a secure bed");
    Ok(PlannerClient::new(
        bed.planner.channel_as(&pki.anonymous()).await?,
    ))
}

/// A precheck of `dlq` by `creator`, and a plan over it created as
/// `creator` (`on_behalf_of` through `x-redrive-actor`): the plan and the
/// request that approves it.
async fn plan_by(
    client: &mut PlannerClient<Channel>,
    dlq: &str,
    creator: &str,
    on_behalf_of: Option<&str>,
) -> anyhow::Result<(v1::Plan, ApprovePlanRequest)> {
    let report = client
        .run_precheck(bearer(
            token_of(creator),
            on_behalf_of,
            precheck_request(dlq),
        ))
        .await?
        .into_inner();
    let plan = client
        .create_plan(bearer(
            token_of(creator),
            on_behalf_of,
            CreatePlanRequest {
                precheck_id: report.precheck_id.clone(),
                rate: Some(Rate {
                    per_second: 1000.0,
                    burst: 10,
                    rationale: "test downstream takes this easily".into(),
                }),
                observe_for: Some(prost_types::Duration {
                    seconds: 0,
                    nanos: 0,
                }),
                ..Default::default()
            },
        ))
        .await?
        .into_inner();
    let approval = ApprovePlanRequest {
        plan_id: plan.plan_id.clone(),
        digest: report.digest,
        ..Default::default()
    };
    Ok((plan, approval))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn callers_without_credentials_are_refused_but_health_answers() -> anyhow::Result<()> {
    init_logging();
    let (_incident, bed) = secure_incident().await?;
    let mut anonymous = client_without_certificate(&bed).await?;
    let refused = anonymous
        .list_plans(v1::ListPlansRequest::default())
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::Unauthenticated, "{refused:?}");
    assert!(refused.message().contains("no credentials"), "{refused:?}");
    // A wrong token is no better, and the message does not echo it.
    let refused = anonymous
        .list_plans(bearer("guessed", None, v1::ListPlansRequest::default()))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::Unauthenticated);
    assert!(!refused.message().contains("guessed"), "{refused:?}");
    // Plain HTTP to the TLS port gets nowhere.
    let plain = format!("http://{}", bed.planner.addr);
    let plain_call = async {
        let mut client = PlannerClient::connect(plain).await?;
        client.list_plans(v1::ListPlansRequest::default()).await?;
        anyhow::Ok(())
    };
    assert!(plain_call.await.is_err());
    // Health answers anyone (load balancers), over TLS.
    let mut health = tonic_health::pb::health_client::HealthClient::new(
        bed.planner
            .channel_as(&bed.pki.as_ref().unwrap().anonymous())
            .await?,
    );
    let status = health
        .check(tonic_health::pb::HealthCheckRequest {
            service: "redrive.v1.Planner".to_owned(),
        })
        .await?
        .into_inner();
    assert_eq!(
        status.status,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );
    // With a token, the same client is someone.
    let plans = anonymous
        .list_plans(as_principal("vera", v1::ListPlansRequest::default()))
        .await?
        .into_inner();
    assert!(plans.plans.is_empty());
    bed.finish().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_viewer_cannot_approve_and_the_creator_cannot_approve_whatever_the_header()
-> anyhow::Result<()> {
    init_logging();
    let (incident, mut bed) = secure_incident().await?;
    let (plan, approval) = plan_by(&mut bed.client, &incident.dlq, "alice", None).await?;
    assert_eq!(plan.created_by, "alice");
    let approve = || approval.clone();

    // A viewer: the role is named.
    let refused = denied(
        bed.client
            .approve_plan(as_principal("vera", approve()))
            .await,
    );
    assert!(
        refused.message().contains("vera") && refused.message().contains("approver"),
        "{refused:?}"
    );
    // The creator naming someone else: refused, she may not delegate.
    let refused = denied(
        bed.client
            .approve_plan(bearer(token_of("alice"), Some("bob"), approve()))
            .await,
    );
    assert!(refused.message().contains("delegate"), "{refused:?}");
    // The creator as herself: four-eyes.
    let refused = denied(
        bed.client
            .approve_plan(as_principal("alice", approve()))
            .await,
    );
    assert!(refused.message().contains("four-eyes"), "{refused:?}");
    // The creator through a portal that may delegate: still alice.
    let refused = denied(
        bed.client
            .approve_plan(bearer(token_of("portal-x"), Some("alice"), approve()))
            .await,
    );
    assert!(refused.message().contains("four-eyes"), "{refused:?}");
    let still = get_plan(&mut bed.client, &plan.plan_id).await?;
    assert_eq!(still.state(), PlanState::AwaitingApproval);
    assert_eq!(still.approved_by, "");
    // Someone else approves.
    let approved = bed
        .client
        .approve_plan(as_principal("bob", approve()))
        .await?
        .into_inner();
    assert_eq!(approved.approved_by, "bob");
    bed.finish().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_delegated_approval_is_recorded_with_both_names() -> anyhow::Result<()> {
    init_logging();
    let (incident, mut bed) = secure_incident().await?;
    // Created by the portal for bob.
    let (plan, approval) = plan_by(&mut bed.client, &incident.dlq, "portal-x", Some("bob")).await?;
    assert_eq!(plan.created_by, "portal-x for bob");
    let approve = || approval.clone();
    // Bob himself may not approve what the portal created for him.
    let refused = bed
        .client
        .approve_plan(as_principal("bob", approve()))
        .await
        .unwrap_err();
    assert!(refused.message().contains("four-eyes"), "{refused:?}");
    // The portal for alice may.
    let approved = bed
        .client
        .approve_plan(bearer(token_of("portal-x"), Some("alice"), approve()))
        .await?
        .into_inner();
    assert_eq!(approved.approved_by, "portal-x for alice");
    let actions: Vec<(String, String)> = approved
        .actions
        .iter()
        .map(|action| (action.action.clone(), action.actor.clone()))
        .collect();
    assert!(
        actions.contains(&("create".to_owned(), "portal-x for bob".to_owned()))
            && actions.contains(&("approve".to_owned(), "portal-x for alice".to_owned())),
        "{actions:?}"
    );
    bed.finish().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn only_executors_may_call_the_coordinator() -> anyhow::Result<()> {
    init_logging();
    let bed = TestBed::start_secure(None, Pki::new()?, |_| {}).await?;
    let pki = bed.pki.clone().expect("a secure bed");
    let claim = || v1::ClaimSliceRequest {
        executor_id: "forger".to_owned(),
        marks_publishing: true,
        ..Default::default()
    };
    // Not an admin (the bed's certificate), not an operator token.
    let mut coordinator = CoordinatorClient::new(bed.planner.channel().await?);
    let refused = denied(coordinator.claim_slice(claim()).await);
    assert!(refused.message().contains("executor role"), "{refused:?}");
    denied(
        coordinator
            .claim_slice(as_principal("root-admin", claim()))
            .await,
    );
    let reports = futures::stream::iter(vec![v1::ReportOutcomesRequest::default()]);
    denied(
        coordinator
            .report_outcomes(as_principal("alice", reports))
            .await,
    );
    // Without credentials: unauthenticated.
    let mut anonymous = CoordinatorClient::new(bed.planner.channel_as(&pki.anonymous()).await?);
    let refused = anonymous.claim_slice(claim()).await.unwrap_err();
    assert_eq!(refused.code(), Code::Unauthenticated, "{refused:?}");
    // A certificate of the CA that no rule maps: authenticated, no role.
    let mut stranger =
        CoordinatorClient::new(bed.planner.channel_as(&pki.client("stranger")?).await?);
    denied(stranger.claim_slice(claim()).await);
    // An executor's certificate passes (nothing to claim).
    let mut executor =
        CoordinatorClient::new(bed.planner.channel_as(&pki.client("executor-1")?).await?);
    let answer = executor.claim_slice(claim()).await?.into_inner();
    assert!(answer.slice.is_none());
    // ... and may not use the Planner.
    let mut as_planner_client =
        PlannerClient::new(bed.planner.channel_as(&pki.client("executor-1")?).await?);
    denied(
        as_planner_client
            .list_plans(v1::ListPlansRequest::default())
            .await,
    );
    bed.finish().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn jwts_are_verified_and_an_expired_one_is_refused() -> anyhow::Result<()> {
    init_logging();
    let bed = TestBed::start_secure(None, Pki::new()?, |_| {}).await?;
    let pki = bed.pki.clone().expect("a secure bed");
    let mut client = client_without_certificate(&bed).await?;
    let now = jsonwebtoken::get_current_timestamp();
    let claims = |exp: u64, aud: &str| {
        serde_json::json!({
            "sub": "carol@example.com",
            "iss": JWT_ISSUER,
            "aud": aud,
            "exp": exp,
            "roles": ["viewer", "some-other-group"],
        })
    };
    let valid = pki.jwt(&claims(now + 600, JWT_AUDIENCE))?;
    client
        .list_plans(bearer(&valid, None, v1::ListPlansRequest::default()))
        .await?;
    // Her roles are the claim's: viewer, not operator.
    let refused = denied(
        client
            .run_precheck(bearer(&valid, None, RunPrecheckRequest::default()))
            .await,
    );
    assert!(
        refused.message().contains("carol@example.com"),
        "{refused:?}"
    );
    // Expired an hour ago (beyond the 60 s leeway).
    let expired = pki.jwt(&claims(now - 3600, JWT_AUDIENCE))?;
    let refused = client
        .list_plans(bearer(&expired, None, v1::ListPlansRequest::default()))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::Unauthenticated, "{refused:?}");
    assert!(refused.message().contains("xpired"), "{refused:?}");
    // Another audience.
    let elsewhere = pki.jwt(&claims(now + 600, "another-service"))?;
    let refused = client
        .list_plans(bearer(&elsewhere, None, v1::ListPlansRequest::default()))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::Unauthenticated, "{refused:?}");
    // Signed by a key the planner does not trust.
    let forged = Pki::new()?.jwt(&claims(now + 600, JWT_AUDIENCE))?;
    let refused = client
        .list_plans(bearer(&forged, None, v1::ListPlansRequest::default()))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::Unauthenticated, "{refused:?}");
    bed.finish().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_executor_with_a_client_certificate_replays_a_plan_over_tls() -> anyhow::Result<()> {
    init_logging();
    let broker = Broker::connect().await?;
    let incident = incident(&broker, 20).await?;
    let mut bed = TestBed::start_secure(Some(broker), Pki::new()?, |config| {
        capturing(config, &[&incident.dlq]);
    })
    .await?;
    captured(&mut bed.client, &incident.dlq, 20).await?;
    let (received, consuming) = consume(bed.broker(), &incident.work).await?;
    let (plan, approval) = plan_by(&mut bed.client, &incident.dlq, "alice", None).await?;
    bed.client
        .approve_plan(as_principal("bob", approval))
        .await?;
    let config = bed.secure_executor_config("executor-tls-1")?;
    assert!(config.planner.starts_with("https://"), "{}", config.planner);
    let executor = ExecutorHandle::start(config);
    let done = wait_completed(&mut bed.client, &plan.plan_id, Duration::from_secs(60)).await?;
    assert_eq!(done.counts.as_ref().map(|counts| counts.sent), Some(20));
    executor.stop().await?;
    stop_consuming(consuming)?;
    let mut ids: Vec<String> = received
        .lock()
        .unwrap()
        .iter()
        .map(|message| message.message_id.clone())
        .collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 20, "{ids:?}");
    // The audit names the executor by its certificate's name.
    let mut export = bed
        .client
        .export_audit(v1::ExportAuditRequest {
            plan_id: plan.plan_id.clone(),
            format: v1::ExportFormat::Jsonl as i32,
        })
        .await?
        .into_inner();
    let mut lines = Vec::new();
    while let Some(chunk) = export.message().await? {
        lines.extend_from_slice(&chunk.data);
    }
    let lines = String::from_utf8(lines)?;
    assert!(lines.contains("executor-tls-1/"), "{lines}");
    bed.finish().await
}

/// `redrivectl` as a person runs it: `--planner https://...`, `--ca` and
/// `--token-file`; the actor is the token's principal, not `$USER`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redrivectl_speaks_https_with_a_token() -> anyhow::Result<()> {
    use clap::Parser;
    init_logging();
    let bed = TestBed::start_secure(None, Pki::new()?, |_| {}).await?;
    let pki = bed.pki.clone().expect("a secure bed");
    let token_file = pki.path("vera.token");
    std::fs::write(&token_file, format!("{}\n", token_of("vera")))?;
    let url = bed.planner.url();
    let ca = pki.ca_pem.to_string_lossy().into_owned();
    let token = token_file.to_string_lossy().into_owned();
    let run = |extra: &'static [&'static str], with_token: bool| {
        let mut args = vec![
            "redrivectl".to_owned(),
            "--planner".to_owned(),
            url.clone(),
            "--ca".to_owned(),
            ca.clone(),
            "--json".to_owned(),
        ];
        if with_token {
            args.extend(["--token-file".to_owned(), token.clone()]);
        }
        args.extend(extra.iter().map(|arg| (*arg).to_owned()));
        async move {
            let cli = redrivectl::Cli::try_parse_from(args).expect("the command line parses");
            let mut out = Vec::new();
            match redrivectl::run(cli, &mut out).await {
                Ok(code) => (code, String::from_utf8_lossy(&out).into_owned()),
                Err(error) => (error.exit_code(), error.to_string()),
            }
        }
    };
    let (code, out) = run(&["plan", "list"], true).await;
    assert_eq!(code, 0, "{out}");
    // ListPlansResponse in canonical proto3 JSON: `{}` when no plan
    // exists (an empty list is a default value, left out).
    let listed: serde_json::Value = serde_json::from_str(&out)?;
    let keys: Vec<&String> = listed.as_object().expect("an object").keys().collect();
    assert!(
        keys.iter()
            .all(|key| *key == "plans" || *key == "nextPageToken"),
        "{out}"
    );
    let (code, out) = run(&["plan", "list"], false).await;
    assert_ne!(code, 0, "{out}");
    assert!(out.contains("unauthenticated"), "{out}");
    let (code, out) = run(&["--actor", "someone-else", "plan", "list"], true).await;
    assert_ne!(code, 0, "{out}");
    assert!(
        out.contains("permission_denied") && out.contains("delegate"),
        "{out}"
    );
    bed.finish().await
}

/// The planner calls a state-check hook over TLS when its URL says
/// `https://`, trusting `--state-check-ca`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_planner_calls_an_https_state_check_hook() -> anyhow::Result<()> {
    init_logging();
    let (incident, mut bed) = secure_incident().await?;
    let pool = bed.pool().await?;
    OrdersHook::create_schema(&pool).await?;
    sqlx::query(
        "INSERT INTO orders (order_id, status, stock_reserved, fulfilled) VALUES \
         ('o-0', 'CANCELLED', false, false)",
    )
    .execute(&pool)
    .await?;
    let pki = bed.pki.clone().expect("a secure bed");
    let hook_shutdown = tokio_util::sync::CancellationToken::new();
    let hook_url = orders_hook::spawn_tls(
        OrdersHook::new(pool.clone()),
        pki.server_tls("orders-hook")?,
        hook_shutdown.clone(),
    )
    .await?;
    assert!(hook_url.starts_with("https://"));
    let dlq = incident.dlq.clone();
    let ca = pki.ca_pem.clone();
    bed.restart_planner(|config| {
        capturing(config, &[&dlq]);
        config.state_checks = vec![format!("order.*={hook_url}")];
        config.state_check_ca = Some(ca);
    })
    .await?;
    let report = bed
        .client
        .run_precheck(as_principal("alice", precheck_request(&incident.dlq)))
        .await?
        .into_inner();
    let counts = report.counts.expect("counts");
    assert_eq!(report.total, 5);
    assert_eq!(counts.blocked_by_state, 1, "o-0 was cancelled: {counts:?}");
    assert_eq!(counts.replayable, 4, "{counts:?}");
    assert_eq!(report.actor, "alice");
    hook_shutdown.cancel();
    drop(pool);
    bed.finish().await
}

/// The attack of issue 15: a second executor credential, holding a real
/// lease's slice id and fencing token (both travel to the first executor),
/// can neither renew, mark, report into, watch nor end that lease; its
/// forged `sent` reports reach neither the audit nor the replay ledger.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_executor_cannot_act_on_another_executors_lease() -> anyhow::Result<()> {
    init_logging();
    let (incident, mut bed) = secure_incident().await?;
    let (_plan, approval) = plan_by(&mut bed.client, &incident.dlq, "alice", None).await?;
    bed.client
        .approve_plan(as_principal("bob", approval))
        .await?;
    let pki = bed.pki.clone().expect("a secure bed");
    let mut holder =
        CoordinatorClient::new(bed.planner.channel_as(&pki.client("executor-1")?).await?);
    let mut intruder =
        CoordinatorClient::new(bed.planner.channel_as(&pki.client("executor-2")?).await?);
    let slice = holder
        .claim_slice(v1::ClaimSliceRequest {
            executor_id: "executor-1".to_owned(),
            marks_publishing: true,
            ..Default::default()
        })
        .await?
        .into_inner()
        .slice
        .expect("the canary slice");
    let (slice_id, token) = (slice.slice_id.clone(), slice.fencing_token);
    let stale = |status: tonic::Status| {
        assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
        assert!(
            status.message().contains("stale fencing token"),
            "{status:?}"
        );
    };
    stale(
        intruder
            .heartbeat(v1::HeartbeatRequest {
                slice_id: slice_id.clone(),
                fencing_token: token,
            })
            .await
            .unwrap_err(),
    );
    stale(
        intruder
            .mark_publishing(v1::MarkPublishingRequest {
                slice_id: slice_id.clone(),
                fencing_token: token,
                through_item_id: slice.items[0].item_id.clone(),
            })
            .await
            .unwrap_err(),
    );
    stale(
        intruder
            .watch_lease(v1::WatchLeaseRequest {
                slice_id: slice_id.clone(),
                fencing_token: token,
            })
            .await
            .unwrap_err(),
    );
    let forged = v1::ReportOutcomesRequest {
        slice_id: slice_id.clone(),
        fencing_token: token,
        events: slice
            .items
            .iter()
            .map(|item| v1::AuditEvent {
                dead_letter_id: item
                    .dead_letter
                    .as_ref()
                    .map(|dead_letter| dead_letter.id.clone())
                    .unwrap_or_default(),
                message_key: "forged".to_owned(),
                action: v1::AuditAction::Sent.into(),
                executor_id: "executor-1".to_owned(),
                attempt: 1,
                ..Default::default()
            })
            .collect(),
    };
    let mut answers = intruder
        .report_outcomes(futures::stream::iter(vec![forged]))
        .await?
        .into_inner();
    stale(answers.message().await.unwrap_err());
    stale(
        intruder
            .complete_slice(v1::CompleteSliceRequest {
                slice_id: slice_id.clone(),
                fencing_token: token,
                release: false,
            })
            .await
            .unwrap_err(),
    );
    // Nothing of it was recorded; the holder's lease is intact.
    let pool = bed.pool().await?;
    let recorded: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM audit_events WHERE action IN ('sent', 'uncertain')",
    )
    .fetch_one(&pool)
    .await?;
    assert_eq!(recorded, 0);
    let renewed = holder
        .heartbeat(v1::HeartbeatRequest {
            slice_id: slice_id.clone(),
            fencing_token: token,
        })
        .await?
        .into_inner();
    assert!(renewed.keep_publishing);
    holder
        .complete_slice(v1::CompleteSliceRequest {
            slice_id,
            fencing_token: token,
            release: true,
        })
        .await?;
    bed.finish().await
}

/// A secure bed capturing `dlqs` (the first with `messages` stored) with
/// 30 s leases (expiry is made by backdating), four-eyes on and the
/// planner's metrics on `metrics`; and a plan of alice over the first DLQ,
/// approved by bob: slices of `slice_size`, all in the canary wave.
async fn secure_plan(
    broker: Broker,
    dlqs: &[&str],
    messages: u64,
    slice_size: u32,
    metrics: Option<std::net::SocketAddr>,
) -> anyhow::Result<(TestBed, v1::Plan)> {
    let mut bed = TestBed::start_secure(Some(broker), Pki::new()?, |config| {
        capturing(config, dlqs);
        config.lease_ttl_seconds = 30;
        config.four_eyes = true;
        config.telemetry.metrics_listen = metrics;
    })
    .await?;
    captured(&mut bed.client, dlqs[0], messages).await?;
    let report = bed
        .client
        .run_precheck(as_principal("alice", precheck_request(dlqs[0])))
        .await?
        .into_inner();
    let plan = bed
        .client
        .create_plan(as_principal(
            "alice",
            CreatePlanRequest {
                precheck_id: report.precheck_id.clone(),
                rate: Some(Rate {
                    per_second: 1000.0,
                    burst: 10,
                    rationale: "test downstream takes this easily".into(),
                }),
                slice_size,
                canary_fraction: Some(1.0),
                ..Default::default()
            },
        ))
        .await?
        .into_inner();
    bed.client
        .approve_plan(as_principal(
            "bob",
            ApprovePlanRequest {
                plan_id: plan.plan_id.clone(),
                digest: report.digest,
                ..Default::default()
            },
        ))
        .await?;
    Ok((bed, plan))
}

/// A slice claimed by `coordinator` (with write-ahead marks), waiting up to
/// 10 s.
async fn claim_marking(
    coordinator: &mut CoordinatorClient<Channel>,
    executor: &str,
) -> anyhow::Result<v1::Slice> {
    use anyhow::Context as _;
    coordinator
        .claim_slice(v1::ClaimSliceRequest {
            executor_id: executor.to_owned(),
            wait: Some(prost_types::Duration {
                seconds: 10,
                nanos: 0,
            }),
            marks_publishing: true,
        })
        .await?
        .into_inner()
        .slice
        .with_context(|| format!("no slice for {executor}"))
}

/// `action` outcomes for `items` of `slice`, as its lease's report.
fn outcomes(
    slice: &v1::Slice,
    items: &[v1::SliceItem],
    action: v1::AuditAction,
) -> v1::ReportOutcomesRequest {
    v1::ReportOutcomesRequest {
        slice_id: slice.slice_id.clone(),
        fencing_token: slice.fencing_token,
        events: items
            .iter()
            .map(|item| v1::AuditEvent {
                dead_letter_id: item
                    .dead_letter
                    .as_ref()
                    .map(|d| d.id.clone())
                    .unwrap_or_default(),
                message_key: item
                    .dead_letter
                    .as_ref()
                    .map(|d| d.message_key.clone())
                    .unwrap_or_default(),
                action: action.into(),
                executor_id: "executor".to_owned(),
                attempt: 1,
                at: Some(std::time::SystemTime::now().into()),
                ..Default::default()
            })
            .collect(),
    }
}

/// The answer to one report.
async fn report(
    coordinator: &mut CoordinatorClient<Channel>,
    request: v1::ReportOutcomesRequest,
) -> Result<v1::ReportOutcomesResponse, tonic::Status> {
    let mut answers = coordinator
        .report_outcomes(futures::stream::iter(vec![request]))
        .await?
        .into_inner();
    answers
        .message()
        .await?
        .ok_or_else(|| tonic::Status::internal("no answer"))
}

/// Issue 28, item 5: an authenticated executor that reports `sent` for
/// items its lease never marked as publishing is refused, the refusal is
/// recorded with its principal and counted; and an executor whose lease
/// expired and was leased again to another cannot flip the other's items
/// with its old token.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_executor_cannot_report_outcomes_it_never_marked() -> anyhow::Result<()> {
    init_logging();
    let broker = Broker::connect().await?;
    let incident = incident(&broker, 5).await?;
    let metrics = free_address().await?;
    let (mut bed, plan) = secure_plan(broker, &[&incident.dlq], 5, 10, Some(metrics)).await?;
    let pki = bed.pki.clone().expect("a secure bed");
    let mut first =
        CoordinatorClient::new(bed.planner.channel_as(&pki.client("executor-1")?).await?);
    let mut other =
        CoordinatorClient::new(bed.planner.channel_as(&pki.client("executor-2")?).await?);
    // A claim without write-ahead marks is refused, naming why.
    let unmarked_claim = first
        .claim_slice(v1::ClaimSliceRequest {
            executor_id: "executor-1".to_owned(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(
        unmarked_claim.code(),
        Code::FailedPrecondition,
        "{unmarked_claim:?}"
    );
    assert!(
        unmarked_claim.message().contains("marks_publishing"),
        "{unmarked_claim:?}"
    );

    let slice = claim_marking(&mut first, "executor-1").await?;
    assert_eq!(slice.items.len(), 5);
    // `sent` for all five, none marked: refused, nothing counted as sent.
    let answer = report(
        &mut first,
        outcomes(&slice, &slice.items, v1::AuditAction::Sent),
    )
    .await?;
    assert_eq!(
        (answer.accepted, answer.refused, answer.lease_lost),
        (0, 5, false)
    );
    let pool = bed.pool().await?;
    let refusals = |reason: &'static str| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>(
                "SELECT count(*) FROM refused_outcomes WHERE principal = 'executor-1' \
                 AND action = 'sent' AND reason = $1",
            )
            .bind(reason)
            .fetch_one(&pool)
            .await
        }
    };
    assert_eq!(
        refusals("unmarked").await?,
        5,
        "recorded with the principal"
    );
    let sent: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM audit_events WHERE action IN ('sent', 'uncertain')",
    )
    .fetch_one(&pool)
    .await?;
    assert_eq!(sent, 0, "nothing of it reached the audit");
    assert_eq!(
        get_plan(&mut bed.client, &plan.plan_id)
            .await?
            .counts
            .unwrap_or_default()
            .sent,
        0
    );

    // Marked through the second item: the two are accepted, the rest not.
    first
        .mark_publishing(v1::MarkPublishingRequest {
            slice_id: slice.slice_id.clone(),
            fencing_token: slice.fencing_token,
            through_item_id: slice.items[1].item_id.clone(),
        })
        .await?;
    let answer = report(
        &mut first,
        outcomes(&slice, &slice.items, v1::AuditAction::Sent),
    )
    .await?;
    assert_eq!((answer.accepted, answer.refused), (2, 3));

    // The lease expires and executor-2 takes the slice over; executor-1's
    // late `sent` under its old token flips none of executor-2's items.
    sqlx::query(
        "UPDATE plan_slices SET lease_expires_at = now() - interval '1 second' WHERE id = $1",
    )
    .bind(slice.slice_id.parse::<i64>()?)
    .execute(&pool)
    .await?;
    let taken = claim_marking(&mut other, "executor-2").await?;
    assert_eq!(taken.slice_id, slice.slice_id);
    assert_eq!(taken.items.len(), 3, "the three unsent items");
    assert!(
        taken.items.iter().all(|item| !item.uncertain),
        "never marked: not uncertain"
    );
    let late = report(
        &mut first,
        outcomes(&slice, &slice.items[2..], v1::AuditAction::Sent),
    )
    .await?;
    assert_eq!((late.accepted, late.refused, late.lease_lost), (0, 3, true));
    assert_eq!(refusals("stale_token").await?, 3);
    let states: Vec<String> =
        sqlx::query_scalar("SELECT state FROM plan_items WHERE slice_id = $1 ORDER BY position")
            .bind(slice.slice_id.parse::<i64>()?)
            .fetch_all(&pool)
            .await?;
    assert_eq!(states, ["sent", "sent", "pending", "pending", "pending"]);
    assert_eq!(
        get_plan(&mut bed.client, &plan.plan_id)
            .await?
            .counts
            .unwrap_or_default()
            .sent,
        2
    );
    // executor-2's lease is untouched and its own marked reports count.
    other
        .mark_publishing(v1::MarkPublishingRequest {
            slice_id: taken.slice_id.clone(),
            fencing_token: taken.fencing_token,
            through_item_id: taken.items[2].item_id.clone(),
        })
        .await?;
    let answer = report(
        &mut other,
        outcomes(&taken, &taken.items, v1::AuditAction::Sent),
    )
    .await?;
    assert_eq!(
        (answer.accepted, answer.refused, answer.lease_lost),
        (3, 0, false)
    );

    let text = scrape_metrics(metrics).await?;
    let refused = |reason: &str| {
        metric_total(
            &text,
            "redrive_planner_outcomes_refused_total",
            &[("redrive_refusal_reason", reason)],
            &[],
        )
    };
    assert_eq!(refused("unmarked"), 8.0, "{text}");
    assert_eq!(refused("stale_token"), 3.0, "{text}");
    pool.close().await;
    bed.finish().await
}

/// Issue 28, item 6: a state re-check answers only for items of the
/// caller's current lease: not for a dead letter in no plan, an item of
/// another slice, under a stale token, or for another principal.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn recheck_state_answers_only_for_items_of_the_callers_lease() -> anyhow::Result<()> {
    init_logging();
    let broker = Broker::connect().await?;
    let planned = incident(&broker, 4).await?;
    let elsewhere = incident(&broker, 1).await?;
    let (mut bed, plan) = secure_plan(broker, &[&planned.dlq, &elsewhere.dlq], 4, 2, None).await?;
    captured(&mut bed.client, &elsewhere.dlq, 1).await?;
    let pki = bed.pki.clone().expect("a secure bed");
    let mut holder =
        CoordinatorClient::new(bed.planner.channel_as(&pki.client("executor-1")?).await?);
    let mut intruder =
        CoordinatorClient::new(bed.planner.channel_as(&pki.client("executor-2")?).await?);
    let slice = claim_marking(&mut holder, "executor-1").await?;
    let next = claim_marking(&mut holder, "executor-1").await?;
    assert_ne!(slice.slice_id, next.slice_id);
    let id_of = |item: &v1::SliceItem| {
        item.dead_letter
            .as_ref()
            .map(|d| d.id.clone())
            .unwrap_or_default()
    };
    let pool = bed.pool().await?;
    let in_no_plan: i64 = sqlx::query_scalar("SELECT id FROM dead_letters WHERE source = $1")
        .bind(&elsewhere.dlq)
        .fetch_one(&pool)
        .await?;
    let recheck = |plan_id: &str, token: u64, ids: Vec<String>| v1::RecheckStateRequest {
        plan_id: plan_id.to_owned(),
        dead_letter_ids: ids,
        slice_id: slice.slice_id.clone(),
        fencing_token: token,
    };
    // Its own items: answered.
    let own: Vec<String> = slice.items.iter().map(id_of).collect();
    let answer = holder
        .recheck_state(recheck(&plan.plan_id, slice.fencing_token, own.clone()))
        .await?
        .into_inner();
    assert_eq!(answer.decisions.len(), own.len());
    // A dead letter in no plan, and an item of another slice of the plan.
    for (stranger, what) in [
        (in_no_plan.to_string(), "in no plan"),
        (id_of(&next.items[0]), "of another slice"),
    ] {
        let refused = holder
            .recheck_state(recheck(
                &plan.plan_id,
                slice.fencing_token,
                vec![own[0].clone(), stranger],
            ))
            .await
            .unwrap_err();
        assert_eq!(refused.code(), Code::InvalidArgument, "{what}: {refused:?}");
        assert!(
            refused.message().contains("dead_letter_ids[1]"),
            "{what}: {refused:?}"
        );
        assert!(
            refused.message().contains("not an item of slice"),
            "{what}: {refused:?}"
        );
    }
    // Another plan's id.
    let refused = holder
        .recheck_state(recheck(
            &uuid::Uuid::now_v7().to_string(),
            slice.fencing_token,
            own.clone(),
        ))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    assert!(refused.message().contains("plan_id"), "{refused:?}");
    // A stale token, and the holder's token from another principal.
    let stale = |status: tonic::Status| {
        assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
        assert!(redrive_proto::error::is_stale_token(&status), "{status:?}");
    };
    stale(
        holder
            .recheck_state(recheck(&plan.plan_id, slice.fencing_token + 1, own.clone()))
            .await
            .unwrap_err(),
    );
    stale(
        intruder
            .recheck_state(recheck(&plan.plan_id, slice.fencing_token, own.clone()))
            .await
            .unwrap_err(),
    );
    // An expired lease answers nothing either.
    sqlx::query(
        "UPDATE plan_slices SET lease_expires_at = now() - interval '1 second' WHERE id = $1",
    )
    .bind(slice.slice_id.parse::<i64>()?)
    .execute(&pool)
    .await?;
    stale(
        holder
            .recheck_state(recheck(&plan.plan_id, slice.fencing_token, own))
            .await
            .unwrap_err(),
    );
    pool.close().await;
    bed.finish().await
}

/// A second new user's pass: an executor given the TLS planner's address
/// as `http://` logged `h2 protocol error` at every claim, and one given
/// `https://` without `--ca` logged `UnknownIssuer`, retried for ever; an
/// executor whose client key belonged to another certificate was refused
/// with "transport error" under `--planner`. Now the claim's line says what
/// to change, and the key is refused under its own flag, saying why (exit
/// 64).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_executor_told_the_wrong_tls_says_what_to_change() -> anyhow::Result<()> {
    init_logging();
    let bed = TestBed::start_secure(None, Pki::new()?, |_| {}).await?;
    let pki = bed.pki.clone().expect("a secure bed");
    let address = bed.planner.addr;
    let binaries = redrive_tests::scenario::Binaries::of_tests()?;
    // A broker to publish to: the executor claims nothing without one.
    let executor = |args: Vec<String>| {
        redrive_tests::scenario::spawn_logged(
            &binaries.executor,
            ["--amqp-url".to_owned(), redrive_tests::AMQP_URL.to_owned()]
                .into_iter()
                .chain(args),
        )
    };
    let cases = [
        (
            format!("http://{address}"),
            format!("the planner at {address} speaks TLS: use https://{address} and --ca FILE"),
        ),
        (
            format!("https://{address}"),
            "presented a certificate that is not signed by a CA this client trusts: pass the CA that signed it with --ca FILE".to_owned(),
        ),
    ];
    // A CA file that did not sign the planner's certificate.
    let stranger = Pki::new()?;
    let cases = cases.into_iter().map(|(planner, says)| (vec!["--planner".to_owned(), planner], says)).chain([(
        vec![
            "--planner".to_owned(),
            format!("https://{address}"),
            "--ca".to_owned(),
            stranger.ca_pem.display().to_string(),
        ],
        "presented a certificate that the CA file given with --ca FILE (or REDRIVE_CA) did not sign".to_owned(),
    )]);
    for (args, says) in cases {
        let planner = args.join(" ");
        let (mut child, log) = executor(args)?;
        let seen = redrive_tests::wait_until(
            &format!("the executor's advice for {planner}"),
            Duration::from_secs(30),
            || async { Ok(log.text().contains(&says)) },
        )
        .await;
        let _ = child.start_kill();
        let _ = child.wait().await;
        seen.map_err(|error| anyhow::anyhow!("{error}:\n{}", log.text()))?;
    }
    // A client key of another certificate: refused at the start, under its flag.
    let mine = pki.client("executor-1")?;
    let other = pki.client("executor-2")?;
    let key = other.client_key.expect("a key");
    let (mut child, log) = executor(vec![
        "--planner".to_owned(),
        format!("https://{address}"),
        "--ca".to_owned(),
        pki.ca_pem.display().to_string(),
        "--tls-client-cert".to_owned(),
        mine.client_cert
            .expect("a certificate")
            .display()
            .to_string(),
        "--tls-client-key".to_owned(),
        key.display().to_string(),
    ])?;
    let status = tokio::time::timeout(Duration::from_secs(20), child.wait()).await??;
    let said = log.text();
    assert_eq!(status.code(), Some(64), "{said}");
    assert!(
        said.contains(&format!(
            "--tls-client-key: {}: the key does not belong to the certificate",
            key.display()
        )),
        "{said}"
    );
    bed.finish().await
}
