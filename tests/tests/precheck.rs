//! The precheck over dead letters that RabbitMQ itself dead-lettered, with the
//! example orders hook: every verdict from its real cause, precedence, the
//! digest, hook failures, empty and invalid selections.

use std::{collections::HashMap, time::Duration};

use lapin::BasicProperties;
use redrive_planner::Config;
use redrive_proto::v1::{
    self, ListPrecheckItemsRequest, PrecheckOptions, RunPrecheckRequest, Verdict,
    planner_client::PlannerClient,
};
use redrive_tests::{
    Broker, DlqTopology, TestBed, amqp_table, amqp_text, init_logging,
    orders_hook::{self, OrdersHook},
    plan_request, precheck, precheck_items, wait_until,
};
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;
use tonic::{Code, transport::Channel};

fn order(order_id: &str, event_type: &str, message_id: &str) -> (Vec<u8>, BasicProperties) {
    let body = format!(r#"{{"order_id":"{order_id}","amount":10}}"#).into_bytes();
    let properties = BasicProperties::default()
        .with_message_id(message_id.into())
        .with_type(event_type.into())
        .with_content_type("application/json".into())
        .with_timestamp(chrono::Utc::now().timestamp() as u64);
    (body, properties)
}

fn seconds(seconds: i64) -> prost_types::Duration {
    prost_types::Duration { seconds, nanos: 0 }
}

async fn items(
    client: &mut PlannerClient<Channel>,
    precheck_id: &str,
) -> anyhow::Result<HashMap<String, (Verdict, String)>> {
    let mut items = HashMap::new();
    let mut page_token = String::new();
    loop {
        let page = client
            .list_precheck_items(ListPrecheckItemsRequest {
                precheck_id: precheck_id.to_owned(),
                verdict: 0,
                page_size: 3,
                page_token,
            })
            .await?
            .into_inner();
        for item in page.items {
            items.insert(
                item.message_key.clone() + "#" + &item.dead_letter_id,
                (item.verdict(), item.reason),
            );
        }
        if page.next_page_token.is_empty() {
            return Ok(items);
        }
        page_token = page.next_page_token;
    }
}

fn verdict_of(
    items: &HashMap<String, (Verdict, String)>,
    key_prefix: &str,
) -> Vec<(Verdict, String)> {
    let mut found: Vec<(&String, &(Verdict, String))> = items
        .iter()
        .filter(|(k, _)| k.starts_with(key_prefix))
        .collect();
    found.sort_by_key(|(k, _)| k.split('#').nth(1).and_then(|id| id.parse::<i64>().ok()));
    found.into_iter().map(|(_, v)| v.clone()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_verdict_comes_from_its_real_cause() -> anyhow::Result<()> {
    init_logging();
    let broker = Broker::connect().await?;
    let topology = DlqTopology::declare(&broker).await?;

    // The incident, made by the broker.
    for (order_id, event_type, id) in [
        ("o-1", "order.paid", "m-1"),  // replayable
        ("o-2", "order.paid", "m-2a"), // replayable (earliest of its key)
        ("o-2", "order.paid", "m-2b"), // duplicate
        ("o-3", "order.paid", "m-3"),  // already_replayed
        ("o-4", "order.paid", "m-4"),  // looping
        ("o-6", "order.paid", "m-6"),  // blocked: cancelled
        ("o-7", "order.paid", "m-7"),  // blocked: fulfilled
        ("o-8", "order.paid", "m-8"),  // needs compensation
    ] {
        let (body, properties) = order(order_id, event_type, id);
        topology.reject(&broker, &body, properties).await?;
    }
    // Stale: a payment three hours old (its timestamp property).
    let (body, properties) = order("o-5", "payment.captured", "m-5");
    let three_hours_ago = (chrono::Utc::now() - chrono::Duration::hours(3)).timestamp() as u64;
    topology
        .reject(&broker, &body, properties.with_timestamp(three_hours_ago))
        .await?;
    // Invalid: a JSON content type whose body does not parse.
    let (_, properties) = order("o-9", "order.paid", "m-9");
    topology.reject(&broker, b"{not json", properties).await?;
    // o-4 came back three times after three replays (re-dead-letters carry
    // their plan's redrive-plan-id header).
    for plan in [
        "11111111-1111-7111-8111-111111111111",
        "22222222-2222-7222-8222-222222222222",
        "33333333-3333-7333-8333-333333333333",
    ] {
        let (body, properties) = order("o-4", "order.paid", &format!("m-4-{plan}"));
        let properties =
            properties.with_headers(amqp_table(vec![("redrive-plan-id", amqp_text(plan))]));
        topology.reject(&broker, &body, properties).await?;
    }

    let hook_shutdown = CancellationToken::new();
    let capturing = |config: &mut Config| {
        config.capture_queues = vec![topology.dlq.clone()];
        config.capture_batch_size = 20;
        config.capture_prefetch = 100;
        config.message_keys = vec!["json:/order_id".to_owned()];
    };
    // The hook needs the orders table in place: start it after the planner made the database.
    let mut bed = TestBed::start(broker, capturing).await?;
    let pool = bed.pool().await?;
    OrdersHook::create_schema(&pool).await?;
    sqlx::query(
        "INSERT INTO orders (order_id, status, stock_reserved, fulfilled) VALUES \
         ('o-6', 'CANCELLED', false, false), ('o-7', 'SHIPPED', true, true), ('o-8', 'PAID', true, false)",
    )
    .execute(&pool)
    .await?;
    // o-3 was replayed successfully to its work queue by an earlier plan
    // yesterday; a replay of its key to another queue does not count.
    // The replay record is the audit's `sent` event of that plan.
    sqlx::query(
        "WITH c AS (INSERT INTO prechecks (id, actor, state) \
                    VALUES ('44444444-4444-7444-8444-444444444444', 'earlier', 'done') RETURNING id), \
              p AS (INSERT INTO plans (id, precheck_id, precheck_digest, state, rate_per_second, rate_burst, \
                        rate_rationale, destination_mode, slice_size, canary_fraction, observe_for_ms, \
                        total_items, canary_items, created_by) \
                    SELECT id, id, '', 'completed', 1, 1, '', 'queue', 1, 0, 0, 0, 0, 'earlier' FROM c RETURNING id) \
         INSERT INTO audit_events (plan_id, dead_letter_id, message_key, destination, action, wave, executor_id, \
             attempt, at) \
         SELECT p.id, 1, e.key, e.destination, 'sent', 'main', 'exec-earlier', 1, now() - interval '1 day' \
         FROM p, (VALUES ('o-3:order.paid', $1), ('o-2:order.paid', 'another-queue')) AS e(key, destination)",
    )
    .bind(&topology.work)
    .execute(&pool)
    .await?;
    let hook_url = orders_hook::spawn(OrdersHook::new(pool.clone()), hook_shutdown.clone()).await?;
    bed.restart_planner(|config| {
        capturing(config);
        config.state_checks = vec![format!("order.*={hook_url}")];
    })
    .await?;
    wait_until(
        "all 13 dead letters captured",
        Duration::from_secs(20),
        || {
            let pool = pool.clone();
            async move {
                let count: i64 = sqlx::query_scalar("SELECT count(*) FROM dead_letters")
                    .fetch_one(&pool)
                    .await?;
                Ok(count == 13)
            }
        },
    )
    .await?;

    let request = RunPrecheckRequest {
        selector: Some(v1::Selector {
            sources: vec![topology.dlq.clone()],
            ..Default::default()
        }),
        options: Some(PrecheckOptions {
            stale_after: [("payment.*".to_owned(), seconds(2 * 3600))].into(),
            ..Default::default()
        }),
    };
    let report = bed.client.run_precheck(request.clone()).await?.into_inner();
    let counts = report.counts.unwrap();
    assert_eq!(report.total, 13);
    assert_eq!(counts.replayable, 2, "o-1 and the first o-2");
    assert_eq!(
        counts.duplicate, 4,
        "the second o-2 and the three o-4 re-dead-letters"
    );
    assert_eq!(counts.already_replayed, 1);
    assert_eq!(counts.looping, 1);
    assert_eq!(counts.stale, 1);
    assert_eq!(counts.blocked_by_state, 2);
    assert_eq!(counts.needs_compensation, 1);
    assert_eq!(counts.invalid, 1);
    assert_eq!(report.digest.len(), 64);
    assert!(!report.sample_blocked.is_empty());

    let all = items(&mut bed.client, &report.precheck_id).await?;
    assert_eq!(all.len(), 13, "every item is stored and pages through");
    assert_eq!(verdict_of(&all, "o-1:")[0].0, Verdict::Replayable);
    let o2: Vec<Verdict> = verdict_of(&all, "o-2:").into_iter().map(|v| v.0).collect();
    assert_eq!(
        o2,
        vec![Verdict::Replayable, Verdict::Duplicate],
        "the earliest dead letter wins"
    );
    assert_eq!(verdict_of(&all, "o-3:")[0].0, Verdict::AlreadyReplayed);
    let o4 = verdict_of(&all, "o-4:");
    assert_eq!(o4[0].0, Verdict::Looping);
    assert!(o4[0].1.contains("3 replays"), "{}", o4[0].1);
    let (stale, stale_reason) = &verdict_of(&all, "o-5:")[0];
    assert_eq!(*stale, Verdict::Stale);
    assert!(stale_reason.contains("payment.captured"), "{stale_reason}");
    let (blocked, reason) = &verdict_of(&all, "o-6:")[0];
    assert_eq!(*blocked, Verdict::BlockedByState);
    assert!(
        reason.contains("would revive a cancelled order"),
        "{reason}"
    );
    assert!(verdict_of(&all, "o-7:")[0].1.contains("would fulfil twice"));
    let (compensation, reason) = &verdict_of(&all, "o-8:")[0];
    assert_eq!(*compensation, Verdict::NeedsCompensation);
    assert!(reason.contains("release the extra reservation"), "{reason}");
    let invalid: Vec<_> = all
        .values()
        .filter(|(v, _)| *v == Verdict::Invalid)
        .collect();
    assert!(
        invalid[0].1.contains("does not parse as JSON"),
        "{}",
        invalid[0].1
    );

    // Only one verdict, paged.
    let blocked_only = bed
        .client
        .list_precheck_items(ListPrecheckItemsRequest {
            precheck_id: report.precheck_id.clone(),
            verdict: Verdict::BlockedByState as i32,
            ..Default::default()
        })
        .await?
        .into_inner();
    assert_eq!(blocked_only.items.len(), 2);

    // The digest is stable for the same data, and changes when one verdict does.
    let again = bed.client.run_precheck(request.clone()).await?.into_inner();
    assert_eq!(again.digest, report.digest);
    assert_ne!(again.precheck_id, report.precheck_id);
    sqlx::query("INSERT INTO orders (order_id, status) VALUES ('o-1', 'CANCELLED')")
        .execute(&pool)
        .await?;
    let changed = bed.client.run_precheck(request.clone()).await?.into_inner();
    assert_ne!(changed.digest, report.digest);
    assert_eq!(changed.counts.unwrap().replayable, 1);
    let stored = bed
        .client
        .get_precheck(v1::GetPrecheckRequest {
            precheck_id: report.precheck_id.clone(),
        })
        .await?
        .into_inner();
    assert_eq!(
        stored.digest, report.digest,
        "GetPrecheck returns the stored report"
    );

    // A source never seen is a typo, not an empty selection: refused, with
    // the sources there are.
    let unknown = bed
        .client
        .run_precheck(RunPrecheckRequest {
            selector: Some(v1::Selector {
                sources: vec![topology.dlq.clone(), "no-such-queue".into()],
                ..Default::default()
            }),
            options: None,
        })
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), Code::NotFound, "{}", unknown.message());
    assert!(
        unknown
            .message()
            .starts_with("selector.sources[1] \"no-such-queue\""),
        "{}",
        unknown.message()
    );
    assert!(
        unknown
            .message()
            .contains(&format!("known sources: {}", topology.dlq)),
        "{}",
        unknown.message()
    );

    // Empty selection: a report of nothing, with a warning.
    let empty = bed
        .client
        .run_precheck(RunPrecheckRequest {
            selector: Some(v1::Selector {
                sources: vec![topology.dlq.clone()],
                event_types: vec!["no.such.type".into()],
                ..Default::default()
            }),
            options: None,
        })
        .await?
        .into_inner();
    assert_eq!(empty.total, 0);
    assert!(
        empty.warnings.iter().any(|w| w.contains("empty")),
        "{:?}",
        empty.warnings
    );

    // Invalid selector and options name the field.
    let bad = bed
        .client
        .run_precheck(RunPrecheckRequest {
            selector: Some(v1::Selector {
                reasons: vec!["melted".into()],
                ..Default::default()
            }),
            options: None,
        })
        .await
        .unwrap_err();
    assert_eq!(bad.code(), Code::InvalidArgument);
    assert!(
        bad.message().contains("selector.reasons"),
        "{}",
        bad.message()
    );
    let bad = bed
        .client
        .run_precheck(RunPrecheckRequest {
            selector: None,
            options: Some(PrecheckOptions {
                stale_after: [("pay*ment".to_owned(), seconds(1))].into(),
                ..Default::default()
            }),
        })
        .await
        .unwrap_err();
    assert!(
        bad.message().contains("options.stale_after"),
        "{}",
        bad.message()
    );
    let unknown = bed
        .client
        .get_precheck(v1::GetPrecheckRequest {
            precheck_id: uuid::Uuid::now_v7().to_string(),
        })
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), Code::NotFound);

    // The plan made from it lists the compensation items for people.
    let plan = bed
        .client
        .create_plan(plan_request(&report, 10.0, 1))
        .await?
        .into_inner();
    let compensations = bed
        .client
        .list_compensations(v1::ListCompensationsRequest {
            plan_id: plan.plan_id.clone(),
            ..Default::default()
        })
        .await?
        .into_inner();
    assert_eq!(compensations.items.len(), 1);
    assert!(compensations.items[0].message_key.starts_with("o-8:"));
    assert!(
        compensations.items[0]
            .reason
            .contains("release the extra reservation")
    );

    bed.planner.halt().await?;
    hook_shutdown.cancel();
    pool.close().await;
    bed.finish().await
}

/// A test bed without a broker whose planner checks `orders.fulfil` with
/// the example orders hook answering `delay` late, and `count` dead letters
/// ingested for it (orders `o-0`…, none in the `orders` table): the bed, its
/// pool, the hook (its calls counted) and the hook's shutdown.
async fn orders_hook_bed(
    delay: Duration,
    count: usize,
) -> anyhow::Result<(TestBed, sqlx::PgPool, OrdersHook, CancellationToken)> {
    let hook_shutdown = CancellationToken::new();
    let mut bed = TestBed::without_broker(|_| {}).await?;
    let pool = bed.pool().await?;
    OrdersHook::create_schema(&pool).await?;
    let hook = OrdersHook::new(pool.clone()).with_delay(delay);
    let hook_url = orders_hook::spawn(hook.clone(), hook_shutdown.clone()).await?;
    bed.restart_planner(|config| {
        config.state_checks = vec![format!("destination:orders.fulfil={hook_url}")];
        config.message_keys = vec!["json:/order_id".to_owned()];
    })
    .await?;
    let items: Vec<v1::IngestDeadLettersRequest> = (0..count)
        .map(|index| v1::IngestDeadLettersRequest {
            source: "svc".into(),
            message_id: format!("m-{index}"),
            body: format!(r#"{{"order_id":"o-{index}"}}"#).into_bytes(),
            original_destination: "orders.fulfil".into(),
            reason: "rejected".into(),
            ..Default::default()
        })
        .collect();
    bed.client
        .ingest_dead_letters(tokio_stream::iter(items))
        .await?;
    Ok((bed, pool, hook, hook_shutdown))
}

/// Chunks are judged ahead of the one being recorded, but the owning
/// service never gets more than four hook batches at once over the whole
/// precheck (docs/replay.md, "four batches in flight").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hook_calls_stay_four_in_flight_across_chunks() -> anyhow::Result<()> {
    init_logging();
    // Three chunks of 2,000 and more, batches of 50: 40 batches a chunk.
    let (mut bed, pool, hook, hook_shutdown) =
        orders_hook_bed(Duration::from_millis(20), 6500).await?;
    let report = bed
        .client
        .run_precheck(RunPrecheckRequest {
            selector: None,
            options: Some(PrecheckOptions {
                state_check_batch_size: 50,
                ..Default::default()
            }),
        })
        .await?
        .into_inner();
    assert_eq!(report.counts.unwrap().replayable, 6500, "no order is known");
    let peak = hook.peak_in_flight();
    assert!(
        (2..=4).contains(&peak),
        "the hook answered {peak} calls at once"
    );

    bed.planner.halt().await?;
    hook_shutdown.cancel();
    pool.close().await;
    bed.finish().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hook_that_times_out_fails_the_precheck_unless_told_to_block() -> anyhow::Result<()> {
    init_logging();
    let (mut bed, pool, _hook, hook_shutdown) = orders_hook_bed(Duration::from_secs(3), 3).await?;
    let options = PrecheckOptions {
        state_check_timeout: Some(prost_types::Duration {
            seconds: 0,
            nanos: 300_000_000,
        }),
        ..Default::default()
    };

    let failed = bed
        .client
        .run_precheck(RunPrecheckRequest {
            selector: None,
            options: Some(options.clone()),
        })
        .await
        .unwrap_err();
    assert_eq!(failed.code(), Code::Unavailable);
    assert!(
        failed.message().contains("did not answer within"),
        "{}",
        failed.message()
    );
    assert!(
        failed.message().contains("block_on_state_check_error"),
        "{}",
        failed.message()
    );

    let blocked = bed
        .client
        .run_precheck(RunPrecheckRequest {
            selector: None,
            options: Some(PrecheckOptions {
                block_on_state_check_error: true,
                ..options
            }),
        })
        .await?
        .into_inner();
    let counts = blocked.counts.unwrap();
    assert_eq!(
        (counts.blocked_by_state, counts.replayable),
        (3, 0),
        "never silently replayable"
    );
    assert!(
        blocked.sample_blocked[0].reason.contains("did not answer"),
        "{:?}",
        blocked.sample_blocked
    );

    bed.planner.halt().await?;
    hook_shutdown.cancel();
    pool.close().await;
    bed.finish().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn re_dead_letters_in_one_queue_do_not_make_another_queues_copy_loop() -> anyhow::Result<()> {
    init_logging();
    let mut bed = TestBed::without_broker(|config| {
        config.message_keys = vec!["json:/order_id".to_owned()];
    })
    .await?;
    let source = redrive_tests::unique("svc");
    let item = |destination: &str, plan: Option<&str>| v1::IngestDeadLettersRequest {
        source: source.clone(),
        message_id: "m-1".into(),
        body: br#"{"order_id":"o-1"}"#.to_vec(),
        original_destination: destination.into(),
        reason: "rejected".into(),
        headers: plan.map(|plan| v1::HeaderTable {
            fields: [(
                "redrive-plan-id".to_owned(),
                v1::HeaderValue {
                    value: Some(v1::header_value::Value::LongString(
                        plan.as_bytes().to_vec(),
                    )),
                },
            )]
            .into(),
        }),
        ..Default::default()
    };
    // o-1 died in queues a and b; three replays to a came back.
    let items = vec![
        item("orders.a", None),
        item("orders.b", None),
        item("orders.a", Some("11111111-1111-7111-8111-111111111111")),
        item("orders.a", Some("22222222-2222-7222-8222-222222222222")),
        item("orders.a", Some("33333333-3333-7333-8333-333333333333")),
    ];
    let stored = bed
        .client
        .ingest_dead_letters(tokio_stream::iter(items))
        .await?
        .into_inner();
    assert_eq!(stored.accepted, 5);
    let report = precheck(&mut bed.client, &source).await?;
    let counts = report.counts.unwrap();
    assert_eq!(
        (counts.looping, counts.replayable, counts.duplicate),
        (1, 1, 3),
        "a's copy loops, b's copy is replayable: {counts:?}"
    );
    let replayable = precheck_items(
        &mut bed.client,
        &report.precheck_id,
        Verdict::Replayable.into(),
        10,
    )
    .await?;
    let destinations: Vec<&str> = replayable
        .items
        .iter()
        .map(|item| item.destination.as_str())
        .collect();
    assert_eq!(destinations, ["orders.b"]);
    bed.finish().await
}

/// Every dead letter of precheck `precheck_id`: (dead letter id, message key,
/// verdict), in id order.
async fn all_items(
    client: &mut PlannerClient<Channel>,
    precheck_id: &str,
) -> anyhow::Result<Vec<(String, String, Verdict)>> {
    let page = precheck_items(client, precheck_id, 0, 1000).await?;
    anyhow::ensure!(page.next_page_token.is_empty(), "one page holds them");
    Ok(page
        .items
        .into_iter()
        .map(|item| {
            let verdict = item.verdict();
            (item.dead_letter_id, item.message_key, verdict)
        })
        .collect())
}

/// The planner's settings for these tests: capture `dlq`, no key rule unless
/// `keys` names some.
fn capture_only(config: &mut Config, dlq: &str, keys: &[&str]) {
    config.capture_queues = vec![dlq.to_owned()];
    config.capture_batch_size = 20;
    config.capture_prefetch = 100;
    config.message_keys = keys.iter().map(|key| (*key).to_owned()).collect();
}

/// Issue 27's two cases with the default identity (no `--message-key`): four
/// retries of one order under one message id with slightly different bodies
/// are one message (duplicates of the earliest) and the near-duplicate
/// warning names them; four different commands with one body under four
/// message ids are all replayable and the same-body warning names them; a
/// message without a message id is keyed by its body hash, with a warning.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn by_default_the_message_id_is_the_identity_and_near_duplicates_are_reported()
-> anyhow::Result<()> {
    init_logging();
    let broker = Broker::connect().await?;
    let topology = DlqTopology::declare(&broker).await?;
    let json = |message_id: Option<&str>| {
        let properties = BasicProperties::default()
            .with_type("order.paid".into())
            .with_content_type("application/json".into());
        match message_id {
            Some(id) => properties.with_message_id(id.into()),
            None => properties,
        }
    };
    // Four retries of order o-50: one message id, a body that changed a little.
    for attempt in 1..=4 {
        let body = format!(r#"{{"order_id":"o-50","attempt":{attempt}}}"#);
        topology
            .reject(&broker, body.as_bytes(), json(Some("m-50")))
            .await?;
    }
    // Four different commands with the same body.
    for command in 1..=4 {
        topology
            .reject(
                &broker,
                br#"{"command":"recalculate-prices"}"#,
                json(Some(&format!("c-{command}"))),
            )
            .await?;
    }
    // No message id at all.
    let anonymous = br#"{"order_id":"o-77"}"#;
    topology.reject(&broker, anonymous, json(None)).await?;

    let dlq = topology.dlq.clone();
    let mut bed = TestBed::start(broker, |config| capture_only(config, &dlq, &[])).await?;
    wait_until("9 dead letters captured", Duration::from_secs(20), || {
        let mut client = bed.client.clone();
        let dlq = dlq.clone();
        async move { Ok(redrive_tests::stored_total(&mut client, &dlq).await? == 9) }
    })
    .await?;

    // The keys as people know them, in the listing.
    let listed = redrive_tests::dead_letters_of(&mut bed.client, &dlq, 100).await?;
    let mut keys: Vec<(Option<String>, String)> = listed
        .dead_letters
        .iter()
        .map(|d| (d.message_id.clone(), d.message_key.clone()))
        .collect();
    keys.sort();
    let body_hash = format!("sha256:{}", hex::encode(Sha256::digest(anonymous)));
    let mut expected: Vec<(Option<String>, String)> = vec![(None, body_hash.clone())];
    expected.extend((1..=4).map(|_| (Some("m-50".to_owned()), "m-50".to_owned())));
    expected.extend((1..=4).map(|n| (Some(format!("c-{n}")), format!("c-{n}"))));
    expected.sort();
    assert_eq!(keys, expected);

    let report = precheck(&mut bed.client, &dlq).await?;
    let items = all_items(&mut bed.client, &report.precheck_id).await?;
    let verdicts = |key: &str| -> Vec<Verdict> {
        items
            .iter()
            .filter(|(_, k, _)| k == key)
            .map(|(_, _, verdict)| *verdict)
            .collect()
    };
    assert_eq!(
        verdicts("m-50"),
        [
            Verdict::Replayable,
            Verdict::Duplicate,
            Verdict::Duplicate,
            Verdict::Duplicate
        ],
        "four retries of one message: the earliest is replayed, once"
    );
    for command in 1..=4 {
        assert_eq!(
            verdicts(&format!("c-{command}")),
            [Verdict::Replayable],
            "a different command with the same body is not lost as a duplicate"
        );
    }
    assert_eq!(verdicts(&body_hash), [Verdict::Replayable]);
    let counts = report.counts.unwrap_or_default();
    assert_eq!(
        (report.total, counts.replayable, counts.duplicate),
        (9, 6, 3)
    );

    let ids_of = |key: &str| -> Vec<String> {
        items
            .iter()
            .filter(|(_, k, _)| k == key)
            .map(|(id, _, _)| id.clone())
            .collect()
    };
    let anonymous_id = &ids_of(&body_hash)[0];
    let warning = |start: &str| {
        report
            .warnings
            .iter()
            .find(|w| w.starts_with(start))
            .cloned()
            .unwrap_or_else(|| panic!("a warning starting {start:?}: {:#?}", report.warnings))
    };
    assert!(
        warning("1 of 9 dead letters are keyed by their body hash")
            .contains(&format!("(for example dead letter {anonymous_id})")),
        "{:#?}",
        report.warnings
    );
    let same_id = warning("near-duplicates, same message id with different bodies");
    assert!(
        same_id.contains(&format!(
            "1 message id on 4 dead letters, for example message id \"m-50\" to {:?}: dead letters {} (4 bodies, one message key)",
            topology.work,
            ids_of("m-50").join(", ")
        )),
        "{same_id}"
    );
    let command_ids: Vec<String> = (1..=4).flat_map(|n| ids_of(&format!("c-{n}"))).collect();
    let same_body = warning("near-duplicates, same body under different message ids");
    assert!(
        same_body.contains(&format!(
            "1 body on 4 dead letters, for example body sha256:{}... to {:?}: dead letters {} under message ids \"c-1\", \"c-2\", \"c-3\", ... (4 ids, 4 message keys)",
            &hex::encode(Sha256::digest(br#"{"command":"recalculate-prices"}"#))[..12],
            topology.work,
            command_ids.join(", ")
        )),
        "{same_body}"
    );
    // Facts for the operator: no other warning came from these, besides the
    // one a planner without a staleness rule gives every precheck.
    assert_eq!(report.warnings.len(), 4, "{:#?}", report.warnings);
    assert!(
        report.warnings[3].starts_with("no staleness rule covers 9 dead letters"),
        "{:#?}",
        report.warnings
    );
    bed.finish().await
}

/// A key rule reads a header of whatever AMQP type the producer wrote it in,
/// through RabbitMQ's dead-lettering and capture: an order id set as the
/// integer 42 is key `42`, not the body hash.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_keys_of_every_amqp_type_survive_capture() -> anyhow::Result<()> {
    use lapin::types::{AMQPValue, ByteArray, DecimalValue, LongString};
    init_logging();
    let broker = Broker::connect().await?;
    let topology = DlqTopology::declare(&broker).await?;
    let cases: Vec<(&str, AMQPValue, &str)> = vec![
        (
            "string",
            AMQPValue::LongString(LongString::from("o-1")),
            "o-1",
        ),
        ("i8", AMQPValue::ShortShortInt(-8), "-8"),
        ("u8", AMQPValue::ShortShortUInt(200), "200"),
        ("i16", AMQPValue::ShortInt(-300), "-300"),
        ("u16", AMQPValue::ShortUInt(60_000), "60000"),
        ("i32", AMQPValue::LongInt(42), "42"),
        ("u32", AMQPValue::LongUInt(4_000_000_000), "4000000000"),
        (
            "i64",
            AMQPValue::LongLongInt(9_007_199_254_740_993),
            "9007199254740993",
        ),
        (
            "timestamp",
            AMQPValue::Timestamp(1_764_000_000),
            "1764000000",
        ),
        (
            "bytes",
            AMQPValue::ByteArray(ByteArray::from(b"o-bytes".to_vec())),
            "o-bytes",
        ),
        (
            "decimal",
            AMQPValue::DecimalValue(DecimalValue {
                scale: 2,
                value: 12_345,
            }),
            "123.45",
        ),
        ("double", AMQPValue::Double(1.5), "1.5"),
    ];
    for (name, value, _) in &cases {
        topology
            .reject(
                &broker,
                format!(r#"{{"case":"{name}"}}"#).as_bytes(),
                BasicProperties::default()
                    .with_message_id(format!("t-{name}").into())
                    .with_headers(amqp_table(vec![("order-id", value.clone())])),
            )
            .await?;
    }
    // A boolean cannot tell messages apart: the body hash, and the note says why.
    topology
        .reject(
            &broker,
            br#"{"case":"boolean"}"#,
            BasicProperties::default()
                .with_message_id("t-boolean".into())
                .with_headers(amqp_table(vec![("order-id", AMQPValue::Boolean(true))])),
        )
        .await?;
    let total = cases.len() as u64 + 1;

    let dlq = topology.dlq.clone();
    let mut bed = TestBed::start(broker, |config| {
        capture_only(config, &dlq, &["header:order-id"])
    })
    .await?;
    wait_until("every case captured", Duration::from_secs(20), || {
        let mut client = bed.client.clone();
        let dlq = dlq.clone();
        async move { Ok(redrive_tests::stored_total(&mut client, &dlq).await? == total) }
    })
    .await?;
    let listed = redrive_tests::dead_letters_of(&mut bed.client, &dlq, 100).await?;
    let key_of = |message_id: &str| {
        listed
            .dead_letters
            .iter()
            .find(|d| d.message_id.as_deref() == Some(message_id))
            .map(|d| (d.id.clone(), d.message_key.clone()))
            .unwrap_or_else(|| panic!("{message_id} is listed"))
    };
    for (name, _, expected) in &cases {
        assert_eq!(key_of(&format!("t-{name}")).1, *expected, "a {name} header");
    }
    let (boolean_id, boolean_key) = key_of("t-boolean");
    assert!(boolean_key.starts_with("sha256:"), "{boolean_key}");
    let shown = bed
        .client
        .get_dead_letter(v1::GetDeadLetterRequest {
            id: boolean_id.clone(),
        })
        .await?
        .into_inner()
        .dead_letter
        .expect("a dead letter");
    assert!(
        shown.capture_notes.iter().any(|note| note
            == "message key is the body hash: no key from header:order-id: header:order-id is a boolean (true or false cannot tell messages apart)"),
        "{:?}",
        shown.capture_notes
    );

    let report = precheck(&mut bed.client, &dlq).await?;
    let items = all_items(&mut bed.client, &report.precheck_id).await?;
    let mut precheck_keys: Vec<&str> = items.iter().map(|(_, key, _)| key.as_str()).collect();
    precheck_keys.sort_unstable();
    let mut expected: Vec<&str> = cases.iter().map(|(_, _, key)| *key).collect();
    expected.push(&boolean_key);
    expected.sort_unstable();
    assert_eq!(precheck_keys, expected);
    assert!(
        items
            .iter()
            .all(|(_, _, verdict)| *verdict == Verdict::Replayable),
        "{items:?}"
    );
    assert!(
        report.warnings.iter().any(|w| w.starts_with(&format!(
            "1 of {total} dead letters are keyed by their body hash (for example dead letter {boolean_id})"
        ))),
        "{:#?}",
        report.warnings
    );
    bed.finish().await
}
