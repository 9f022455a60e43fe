//! The operator console (issue 30) in a real headless Chromium, over the
//! planner's real TLS listener with bearer tokens: a RabbitMQ incident
//! from the overview to the audit's export, the safety gestures (four-eyes,
//! typed count, one submit per click, no action without the role), a forged
//! call from the page's own origin, and a dead letter holding HTML shown as
//! text. Screenshots land in `target/console-screenshots/`
//! (`REDRIVE_SCREENSHOTS=docs` writes docs/console/, which docs/console.md
//! shows).

use std::time::Duration;

use redrive_proto::v1;
use redrive_tests::{
    Broker, ExecutorHandle, TestBed,
    browser::Browser,
    init_logging,
    pki::{Pki, token_of},
};
use serde_json::json;

mod support;
use support::*;

/// Signs in with `token` and waits for the caller's name.
async fn sign_in(browser: &Browser, url: &str, token: &str, name: &str) -> anyhow::Result<()> {
    browser.open(url).await?;
    if browser.has("signout").await? {
        browser.click("signout").await?;
    }
    browser.fill("signin-token", token).await?;
    browser.click("signin-submit").await?;
    browser
        .text_until("caller", &format!("names {name}"), |text| {
            text.contains(name)
        })
        .await?;
    Ok(())
}

/// Fills the reason of the open dialog, checks that it repeats `count`, and
/// confirms.
async fn confirm(browser: &Browser, count: &str, reason: Option<&str>) -> anyhow::Result<()> {
    let repeated = browser.text("dialog-count").await?;
    assert!(
        repeated.contains(count),
        "the dialog repeats {count}: {repeated:?}"
    );
    if let Some(reason) = reason {
        browser.fill("dialog-reason", reason).await?;
    }
    browser.click("dialog-confirm").await?;
    Ok(())
}

/// The `data-sent-total` of the live chart.
async fn charted(browser: &Browser) -> anyhow::Result<u64> {
    let chart = browser.find("rate-chart").await?;
    Ok(chart
        .attr("data-sent-total")
        .await?
        .unwrap_or_default()
        .parse()
        .unwrap_or(0))
}

/// What the page's own origin gets when it calls `path` itself with a
/// grpc-web frame of an empty message and `token` (none when empty),
/// cookies included: `{status, grpc, message}`.
async fn forged_call(
    browser: &Browser,
    path: &str,
    token: &str,
) -> anyhow::Result<serde_json::Value> {
    browser
        .run(
            "const [path, token, done] = arguments;
             const headers = {'content-type': 'application/grpc-web+proto', 'x-grpc-web': '1'};
             if (token) headers['authorization'] = 'Bearer ' + token;
             fetch(path, {method: 'POST', headers, credentials: 'include', body: new Uint8Array([0, 0, 0, 0, 0])})
               .then(r => done({status: r.status, grpc: r.headers.get('grpc-status'), message: r.headers.get('grpc-message')}))
               .catch(e => done({error: String(e)}));",
            vec![json!(path), json!(token)],
        )
        .await
}

/// The whole incident in the browser: overview, dead letters, precheck,
/// plan with preview, approval by a second principal after the creator's
/// disabled button, the live chart, pause, resume and cancel, then the
/// audit's never-attempted items and the export. At the end, every message
/// the consumer received is `sent` or `uncertain` in the audit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_incident_from_the_overview_to_the_audit_in_the_browser() -> anyhow::Result<()> {
    init_logging();
    const MESSAGES: u32 = 150;
    let broker = Broker::connect().await?;
    let incident = incident(&broker, MESSAGES).await?;
    let mut bed = TestBed::start_secure(Some(broker), Pki::new()?, |config| {
        capturing(config, &[&incident.dlq]);
        config.four_eyes = true;
    })
    .await?;
    captured(&mut bed.client, &incident.dlq, u64::from(MESSAGES)).await?;
    let (received, consuming) = consume(bed.broker(), &incident.work).await?;
    let url = bed.planner.url();
    let browser = Browser::start().await?;
    sign_in(&browser, &url, token_of("alice"), "alice").await?;

    // 1. The overview: the source, its counts and its group.
    let row = browser
        .text_until("source-row", "shows the DLQ", |text| {
            text.contains(&incident.dlq)
        })
        .await?;
    assert!(row.contains("150"), "{row}");
    let group = browser.text("group-row").await?;
    assert!(
        group.contains("150") && group.contains("rejected"),
        "{group}"
    );
    browser.screenshot("overview").await?;
    // The group's fingerprint selects exactly its dead letters.
    browser.follow("group-row").await?;
    let rows = browser.at_least("dl-row", 50).await?;
    assert_eq!(rows.len(), 50, "the group's first page");
    let fingerprint = browser.find("filter-group").await?.prop("value").await?;
    assert_eq!(fingerprint.as_deref(), Some("rejected"));

    // 2. Dead letters, paged on the server; one of them; the precheck.
    browser.follow("nav-dead-letters").await?;
    browser.fill("filter-source", &incident.dlq).await?;
    browser.follow("filter-apply").await?;
    let rows = browser.at_least("dl-row", 50).await?;
    assert_eq!(rows.len(), 50, "one page of 50, not the backlog");
    assert!(browser.has("next-page").await?);
    browser.screenshot("dead-letters").await?;
    rows[0].click().await?;
    browser
        .text_until("dl-body", "shows the order", |text| text.contains("order"))
        .await?;
    assert!(browser.text("dl-headers").await?.contains("x-death"));
    assert_eq!(browser.text("dl-fingerprint").await?, "rejected");
    browser.screenshot("dead-letter").await?;
    browser.client.back().await?;
    browser.click("precheck-run").await?;
    if browser.has("dialog").await? {
        confirm(&browser, "150", None).await?;
    }
    browser.find("verdict-bar").await?;
    // They all died just now: the page says the cause may still be active.
    let arrivals = browser.text("precheck-arrivals").await?;
    assert!(
        arrivals.starts_with("150 of them died in the 15m"),
        "{arrivals}"
    );
    let replay = browser
        .client
        .wait()
        .at_most(redrive_tests::browser::WAIT)
        .for_element(fantoccini::Locator::Css(
            "[data-testid=\"verdict-segment\"][data-verdict=\"replayable\"]",
        ))
        .await?;
    assert!(replay.text().await?.contains("150"));
    replay.click().await?;
    browser.at_least("verdict-item", 1).await?;
    let message_id = browser.text("verdict-item-message-id").await?;
    assert!(
        message_id.starts_with("m-"),
        "the item names its message id: {message_id}"
    );
    assert!(!browser.text("precheck-digest").await?.is_empty());
    assert!(browser.text("precheck-age").await?.contains("too old"));
    browser.screenshot("precheck").await?;

    // 3. The plan builder and its preview's header diff.
    browser.click("plan-build").await?;
    browser.fill("rate-per-second", "5").await?;
    browser.fill("rate-burst", "1").await?;
    browser
        .fill(
            "rate-rationale",
            "the order service takes 50/s; a tenth of it",
        )
        .await?;
    browser.fill("canary-fraction", "0.02").await?;
    browser.fill("observe-for", "2").await?;
    browser.click("preview-run").await?;
    browser.at_least("preview-message", 1).await?;
    let routing = browser.text("preview-routing-key").await?;
    assert!(routing.contains(&incident.work), "{routing}");
    let removed = browser.text("preview-removed").await?;
    assert!(removed.contains("x-death"), "{removed}");
    let added = browser.text("preview-added").await?;
    assert!(added.contains("redrive-plan-id"), "{added}");
    browser.screenshot("plan-builder").await?;
    browser.click("plan-create").await?;
    let create = browser.find("dialog-confirm").await?;
    // A double click creates one plan.
    create.click().await?;
    let _ = create.click().await;
    browser.find("plan-state").await?;
    let plans = bed
        .client
        .list_plans(v1::ListPlansRequest::default())
        .await?
        .into_inner()
        .plans;
    assert_eq!(plans.len(), 1, "a double click made {} plans", plans.len());
    let plan_id = plans[0].plan_id.clone();

    // 4. Four-eyes: the creator's approve is disabled, with the reason.
    let approve = browser.find("approve-button").await?;
    assert!(!approve.is_enabled().await?, "the creator may not approve");
    let reason = browser.text("approve-disabled-reason").await?;
    assert!(reason.to_lowercase().contains("four-eyes"), "{reason}");
    assert!(
        !browser.has("approve-override-button").await?,
        "the arrivals override is offered only after a refusal"
    );
    assert!(browser.text("approve-digest").await?.len() >= 16);
    // The canary's true share: 2% of 150 is 3 whole items.
    assert_eq!(
        browser.text("plan-canary").await?,
        "3 items (2% of the items)"
    );
    browser.screenshot("approval").await?;
    let plan_url = format!("{url}/#/plans/{plan_id}");
    // A viewer sent the link is told who can approve, not left guessing.
    sign_in(&browser, &plan_url, token_of("vera"), "vera").await?;
    browser.open(&plan_url).await?;
    let needs = browser.text("approve-needs-role").await?;
    assert!(needs.contains("approver role"), "{needs}");
    assert!(!browser.has("approve-button").await?);
    browser.screenshot("approval-viewer").await?;
    sign_in(&browser, &plan_url, token_of("bob"), "bob").await?;
    browser.open(&plan_url).await?;
    browser.click("approve-button").await?;
    // The dialog repeats what is approved: the rate and where it goes.
    let rate = plans[0].rate.clone().unwrap_or_default();
    let terms = browser.text("approve-terms").await?;
    assert!(
        terms.contains(&format!("{}/s (burst {})", rate.per_second, rate.burst))
            && terms.contains("queue"),
        "{terms}"
    );
    browser.screenshot("approve-dialog").await?;
    let confirm_button = browser.find("dialog-confirm").await?;
    assert!(
        !confirm_button.is_enabled().await?,
        "above 100 items the count must be typed first"
    );
    browser.fill("approve-count-input", "150").await?;
    confirm(&browser, "150", None).await?;

    // 5. The live chart moves; pause, resume, cancel.
    let executor = ExecutorHandle::start(bed.secure_executor_config("executor-console-1")?);
    browser
        .text_until("plan-state", "reaches the main wave", |text| {
            text.to_lowercase().contains("main")
        })
        .await?;
    let first = charted(&browser).await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while charted(&browser).await? <= first.max(5) {
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "the chart never moved past {first}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    browser.screenshot("live-plan").await?;
    // The gates promoted the plan (its observation window passed green):
    // that is no trip.
    anyhow::ensure!(
        !browser.has("gate-trips").await?,
        "a promotion by the gates shown as a gate trip: {}",
        browser.text("gate-trips").await?
    );
    browser.click("plan-pause").await?;
    confirm(&browser, "", Some("downstream latency rising")).await?;
    browser
        .text_until("plan-state", "says paused", |text| {
            text.to_lowercase().contains("paused")
        })
        .await?;
    browser.click("plan-resume").await?;
    confirm(&browser, "", Some("latency back to normal")).await?;
    browser
        .text_until("plan-state", "runs again", |text| {
            !text.to_lowercase().contains("paused")
        })
        .await?;
    browser.click("plan-cancel").await?;
    confirm(&browser, "", Some("enough for today")).await?;
    browser
        .text_until("plan-state", "says cancelled", |text| {
            text.to_lowercase().contains("cancel")
        })
        .await?;

    // 6. The audit: items never attempted, the operator timeline, the export.
    browser.click("plan-audit").await?;
    let never = browser.at_least("never-attempted-row", 1).await?;
    assert!(!never.is_empty());
    let timeline = browser.text("audit-timeline").await?;
    assert!(
        timeline.contains("downstream latency rising") && timeline.contains("bob"),
        "{timeline}"
    );
    // Events by message id, filtered by action on the server.
    browser
        .find("audit-filter-action")
        .await?
        .select_by_value("sent")
        .await?;
    // The page shows the server's first page of `sent` events, read whole
    // (the page keeps the unfiltered rows until the filtered answer
    // arrives), and asked of the server again at each look (events of
    // publishes still in flight at the cancel may come in meanwhile, after
    // the page's own answer).
    let deadline = tokio::time::Instant::now() + redrive_tests::browser::WAIT;
    let shown_sent: Vec<String> = loop {
        let expected: Vec<(Option<String>, Option<String>)> = bed
            .client
            .list_audit_events(v1::ListAuditEventsRequest {
                plan_id: plan_id.clone(),
                actions: vec![v1::AuditAction::Sent as i32],
                page_size: 100,
                page_token: String::new(),
            })
            .await?
            .into_inner()
            .events
            .into_iter()
            .map(|event| (Some("sent".to_owned()), Some(event.message_id)))
            .collect();
        let shown = browser
            .rows("audit-row", "data-action", "audit-message-id")
            .await?;
        // The page's answer may predate events that came in since: its
        // rows are the server's first ones, in order, all `sent`.
        if !shown.is_empty() && expected.starts_with(&shown) {
            break shown.into_iter().filter_map(|(_, id)| id).collect();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the page never showed the sent events by message id: {shown:?}, not {expected:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    browser.screenshot("audit").await?;
    browser.click("export-csv").await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let export = loop {
        let done: Vec<_> = std::fs::read_dir(browser.downloads.path())?
            .filter_map(Result::ok)
            .map(|entry| entry.path())
            .filter(|path| path.extension().is_some_and(|ext| ext == "csv"))
            .collect();
        if let Some(path) = done.first() {
            break std::fs::read_to_string(path)?;
        }
        anyhow::ensure!(tokio::time::Instant::now() < deadline, "no CSV downloaded");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(
        export.lines().count() > 1 && export.contains("sent"),
        "{export}"
    );

    executor.stop().await?;
    stop_consuming(consuming)?;
    let received = received.lock().unwrap().clone();
    assert!(!received.is_empty(), "the consumer received the replay");
    let (sent, _) = assert_bed_audit(&bed, &plan_id, &received).await?;
    for id in &shown_sent {
        assert!(
            received.iter().any(|message| &message.message_id == id),
            "the audit page says {id} was sent; the consumer never got it"
        );
    }
    assert!(sent.len() < MESSAGES as usize, "cancelled before the end");
    browser.close().await?;
    bed.finish().await
}

/// A viewer sees no action; the server refuses the calls the page would
/// make for one all the same, with a forged grpc-web call from the page's
/// own origin (with the viewer's token, and with no token but cookies).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_viewer_sees_no_action_and_a_forged_call_is_refused() -> anyhow::Result<()> {
    init_logging();
    let broker = Broker::connect().await?;
    let incident = incident(&broker, 3).await?;
    let mut bed = TestBed::start_secure(Some(broker), Pki::new()?, |config| {
        capturing(config, &[&incident.dlq]);
    })
    .await?;
    captured(&mut bed.client, &incident.dlq, 3).await?;
    let url = bed.planner.url();
    let browser = Browser::start().await?;
    sign_in(&browser, &url, token_of("vera"), "vera").await?;
    browser.follow("nav-dead-letters").await?;
    browser.fill("filter-source", &incident.dlq).await?;
    browser.follow("filter-apply").await?;
    let rows = browser.at_least("dl-row", 3).await?;
    assert!(
        !browser.has("precheck-run").await?,
        "a viewer gets no precheck button"
    );
    rows[0].click().await?;
    browser.find("dl-body").await?;
    assert!(
        !browser.has("repair-open").await?,
        "a viewer gets no repair button"
    );
    for (path, token, code) in [
        ("/redrive.v1.Planner/RunPrecheck", token_of("vera"), "7"),
        ("/redrive.v1.Planner/CreatePlan", token_of("vera"), "7"),
        ("/redrive.v1.Planner/ApprovePlan", "", "16"),
        ("/redrive.v1.Planner/ListDeadLetters", "", "16"),
    ] {
        let answer = forged_call(&browser, path, token).await?;
        assert_eq!(answer["grpc"], json!(code), "{path}: {answer}");
    }
    // The page itself answers with a strict policy and no framing.
    let headers = browser
        .run(
            "const done = arguments[0];
             fetch('/').then(r => done({csp: r.headers.get('content-security-policy'), frame: r.headers.get('x-frame-options')}));",
            vec![],
        )
        .await?;
    let csp = headers["csp"].as_str().unwrap_or_default();
    assert!(
        csp.contains("script-src 'self'") && csp.contains("frame-ancestors 'none'"),
        "{headers}"
    );
    assert_eq!(headers["frame"], json!("DENY"));
    browser.screenshot("viewer").await?;
    browser.close().await?;
    bed.finish().await
}

/// Ingests one dead letter `message_id` of `source` (rejected, for the
/// queue `orders`) with `body` and `content_type`, and checks it was stored.
async fn ingest_one(
    bed: &mut TestBed,
    source: &str,
    message_id: &str,
    body: &[u8],
    content_type: Option<&str>,
) -> anyhow::Result<()> {
    let answer = bed
        .client
        .ingest_dead_letters(tokio_stream::iter(vec![v1::IngestDeadLettersRequest {
            source: source.to_owned(),
            message_id: message_id.to_owned(),
            body: body.to_vec(),
            properties: content_type.map(|content_type| v1::MessageProperties {
                content_type: Some(content_type.to_owned()),
                ..Default::default()
            }),
            reason: "rejected".to_owned(),
            original_destination: "orders".to_owned(),
            ..Default::default()
        }]))
        .await?
        .into_inner();
    anyhow::ensure!(answer.accepted == 1, "{message_id} not stored: {answer:?}");
    Ok(())
}

/// A dead letter whose body and headers hold `<script>` and an `<img
/// onerror>` is shown as text: the markup is on the page as characters, no
/// handler ran and no dialog opened.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn markup_in_a_dead_letter_is_shown_as_text() -> anyhow::Result<()> {
    init_logging();
    let mut bed = TestBed::start_secure(None, Pki::new()?, |_| {}).await?;
    let source = format!("console-xss-{}", uuid::Uuid::new_v4().simple());
    let script = "<script>window.__pwned = 'script'; alert('script')</script>";
    let image = "<img src=x onerror=\"window.__pwned = 'img'; alert('img')\">";
    let mut headers = v1::HeaderTable::default();
    headers.fields.insert(
        "x-note".to_owned(),
        v1::HeaderValue {
            value: Some(v1::header_value::Value::LongString(
                image.as_bytes().to_vec(),
            )),
        },
    );
    // A long header: cut on the page until asked for whole.
    let long = format!("{}END-OF-LONG", "ab".repeat(1_500));
    headers.fields.insert(
        "x-long".to_owned(),
        v1::HeaderValue {
            value: Some(v1::header_value::Value::LongString(
                long.as_bytes().to_vec(),
            )),
        },
    );
    let answer = bed
        .client
        .ingest_dead_letters(tokio_stream::iter(vec![v1::IngestDeadLettersRequest {
            source: source.clone(),
            message_id: "html-1".to_owned(),
            body: format!("{script}{image}").into_bytes(),
            properties: Some(v1::MessageProperties {
                content_type: Some("text/html".to_owned()),
                ..Default::default()
            }),
            headers: Some(headers),
            reason: "rejected".to_owned(),
            error_text: image.to_owned(),
            original_destination: "orders".to_owned(),
            ..Default::default()
        }]))
        .await?
        .into_inner();
    assert_eq!(answer.accepted, 1, "{answer:?}");
    let url = bed.planner.url();
    let browser = Browser::start().await?;
    sign_in(&browser, &url, token_of("alice"), "alice").await?;
    browser.follow("nav-dead-letters").await?;
    browser.fill("filter-source", &source).await?;
    browser.follow("filter-apply").await?;
    let rows = browser.at_least("dl-row", 1).await?;
    let listed = rows[0].text().await?;
    assert!(
        listed.contains("<img src=x onerror="),
        "the error text as text: {listed}"
    );
    rows[0].click().await?;
    let body = browser
        .text_until("dl-body", "shows the markup", |text| {
            text.contains("<script>")
        })
        .await?;
    assert!(body.contains(image), "{body}");
    let headers = browser.text("dl-headers").await?;
    assert!(headers.contains("<img src=x onerror="), "{headers}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    browser.no_dialog().await?;
    let pwned = browser
        .run(
            "arguments[0](window.__pwned === undefined ? null : window.__pwned);",
            vec![],
        )
        .await?;
    assert_eq!(pwned, json!(null), "a handler of the dead letter ran");
    let images = browser
        .run(
            "arguments[0](document.querySelectorAll('img').length);",
            vec![],
        )
        .await?;
    assert_eq!(images, json!(0), "no element was made from the dead letter");
    browser.screenshot("markup-as-text").await?;
    let long_row = "arguments[0](document.querySelector('[data-testid=header-row][data-name=x-long]').innerText);";
    let cut = browser.run(long_row, vec![]).await?;
    let cut = cut.as_str().unwrap_or_default();
    assert!(
        cut.len() < 700
            && !cut.contains("END-OF-LONG")
            && cut.contains("show all 3,011 characters"),
        "{cut}"
    );
    browser.click("header-more").await?;
    let whole = browser.run(long_row, vec![]).await?;
    assert!(
        whole.as_str().unwrap_or_default().contains(&long),
        "{whole}"
    );
    // A link whose filter cannot be read lists and prechecks nothing,
    // rather than everything of the source.
    for bad in ["body=order_id", "from=2099-99-99T99:99"] {
        browser
            .go(&format!("{url}/#/dead-letters?source={source}&{bad}"))
            .await?;
        let problems = browser.text("filter-problems").await?;
        assert!(
            problems.contains(bad.split('=').next().unwrap_or_default()),
            "{problems}"
        );
        assert!(
            !browser.has("precheck-run").await?,
            "{bad}: no precheck of more"
        );
        assert!(!browser.has("dl-row").await?, "{bad}: nothing listed");
        // The error box says what failed in words, not as a gRPC method.
        let error = browser.text("error").await?;
        assert!(
            error.contains("dead letters failed:") && !error.contains("DeadLetters"),
            "{error}"
        );
        browser.screenshot("unreadable-filter").await?;
    }
    // A malformed escape in the address is a page not found, not a blank page.
    browser
        .go(&format!("{url}/#/dead-letters/%E0%A4%A"))
        .await?;
    let heading = browser
        .client
        .find(fantoccini::Locator::Css("main h1"))
        .await?
        .text()
        .await?;
    assert_eq!(heading, "Not found");
    browser.find("nav-overview").await?;
    browser.no_dialog().await?;
    // A JSON body is shown with every token as written: an id past 2^53
    // and a price's trailing zero are not rewritten, as parsing and
    // printing again would (a new user copied a wrong customer id).
    ingest_one(
        &mut bed,
        &source,
        "json-1",
        br#"{"customer_id":12345678901234567891,"price":1.10}"#,
        Some("application/json"),
    )
    .await?;
    let listed = redrive_tests::dead_letters_of(&mut bed.client, &source, 10).await?;
    let json_id = listed
        .dead_letters
        .iter()
        .find(|dead_letter| dead_letter.message_id.as_deref() == Some("json-1"))
        .map(|dead_letter| dead_letter.id.clone())
        .ok_or_else(|| anyhow::anyhow!("json-1 not listed"))?;
    browser
        .go(&format!("{url}/#/dead-letters/{json_id}"))
        .await?;
    let body = browser
        .text_until("dl-body", "shows the JSON", |text| {
            text.contains("customer_id")
        })
        .await?;
    assert!(
        body.contains("\"customer_id\": 12345678901234567891,") && body.contains("\"price\": 1.10"),
        "{body}"
    );
    // A 250-character message id wraps in its own cell: the other columns
    // keep their words whole (a new user saw "rejecte / d").
    let long_id = format!("long-{}", "x".repeat(245));
    ingest_one(&mut bed, &source, &long_id, br#"{"n":1}"#, None).await?;
    browser
        .go(&format!("{url}/#/dead-letters?source={source}"))
        .await?;
    browser.at_least("dl-row", 3).await?;
    // [how far the table reaches beyond its container in px, the most lines
    // a reason cell takes], with the page's own rules, then without the id
    // cells' rule.
    let layout = "const table = document.querySelector('[data-testid=dl-row]').closest('table');
         const over = table.getBoundingClientRect().width - table.parentElement.clientWidth;
         const cells = [...document.querySelectorAll('[data-testid=dl-row] td:nth-child(4)')];
         const lines = Math.max(...cells.map((cell) => {
           const range = document.createRange();
           range.selectNodeContents(cell);
           return range.getClientRects().length;
         }));
         return [Math.round(over), lines];";
    let fitted = browser
        .run(&format!("arguments[0]((() => {{ {layout} }})());"), vec![])
        .await?;
    browser.screenshot("long-values").await?;
    assert!(
        fitted[0].as_i64().is_some_and(|over| over <= 1) && fitted[1] == json!(1),
        "the table overflows its page or a reason wraps beside a long id: {fitted}"
    );
    let unruled = browser
        .run(
            &format!(
                "for (const cell of document.querySelectorAll('td.mono')) cell.style.overflowWrap = 'normal';
                 arguments[0]((() => {{ {layout} }})());"
            ),
            vec![],
        )
        .await?;
    assert!(
        unruled[0].as_i64().is_some_and(|over| over > 1),
        "without the rule the long id widens the table: the check can fail ({unruled})"
    );
    // A plan that does not exist is said to be missing, not loading for ever.
    browser
        .go(&format!("{url}/#/plans/{}", uuid::Uuid::now_v7()))
        .await?;
    let missing = browser.text("plan-missing").await?;
    assert!(missing.contains("NOT_FOUND"), "{missing}");
    browser.close().await?;
    bed.finish().await
}

/// Repair in the browser: invalid JSON keeps the submit disabled and says
/// why; a valid edit with a reason creates a revision shown in the lineage,
/// and the captured body stays as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repair_creates_a_revision_and_keeps_the_original() -> anyhow::Result<()> {
    init_logging();
    let mut bed = TestBed::start_secure(None, Pki::new()?, |_| {}).await?;
    let source = format!("console-repair-{}", uuid::Uuid::new_v4().simple());
    let original = br#"{"order_id":"o-1","amount":"12,50"}"#.to_vec();
    let answer = bed
        .client
        .ingest_dead_letters(tokio_stream::iter(vec![v1::IngestDeadLettersRequest {
            source: source.clone(),
            message_id: "json-1".to_owned(),
            body: original.clone(),
            properties: Some(v1::MessageProperties {
                content_type: Some("application/json".to_owned()),
                ..Default::default()
            }),
            reason: "rejected".to_owned(),
            error_text: "amount is not a number".to_owned(),
            original_destination: "orders".to_owned(),
            ..Default::default()
        }]))
        .await?
        .into_inner();
    assert_eq!(answer.accepted, 1, "{answer:?}");
    let id = bed
        .client
        .list_dead_letters(v1::ListDeadLettersRequest {
            selector: Some(v1::Selector {
                sources: vec![source.clone()],
                ..Default::default()
            }),
            ..Default::default()
        })
        .await?
        .into_inner()
        .dead_letters[0]
        .id
        .clone();
    let url = bed.planner.url();
    let browser = Browser::start().await?;
    sign_in(&browser, &url, token_of("alice"), "alice").await?;
    browser.open(&format!("{url}/#/dead-letters/{id}")).await?;
    browser
        .text_until("dl-body", "pretty-prints the JSON", |text| {
            text.contains("\"amount\": \"12,50\"")
        })
        .await?;
    browser.click("repair-open").await?;
    browser
        .fill("repair-editor", r#"{"order_id":"o-1","amount":12.5"#)
        .await?;
    browser
        .text_until("repair-json-status", "names the JSON error", |text| {
            text.to_lowercase().starts_with("invalid json")
        })
        .await?;
    browser
        .fill("repair-reason", "amount as a number (INC-42)")
        .await?;
    assert!(
        !browser.find("repair-submit").await?.is_enabled().await?,
        "invalid JSON is not submitted"
    );
    browser
        .fill("repair-editor", r#"{"order_id":"o-1","amount":12.5}"#)
        .await?;
    browser
        .text_until("repair-json-status", "accepts the JSON", |text| {
            text.to_lowercase().starts_with("valid json")
        })
        .await?;
    browser.screenshot("repair").await?;
    browser.click("repair-submit").await?;
    let revision = browser
        .text_until("revision-row", "lists the revision", |text| {
            text.contains("INC-42")
        })
        .await?;
    assert!(revision.contains("alice"), "{revision}");
    let stored = bed
        .client
        .get_dead_letter(v1::GetDeadLetterRequest { id: id.clone() })
        .await?
        .into_inner()
        .dead_letter
        .expect("the dead letter");
    assert_eq!(
        stored.body, original,
        "the captured body is never overwritten"
    );
    assert_eq!(stored.revisions.len(), 1);
    assert_eq!(
        stored.revisions[0].body,
        br#"{"order_id":"o-1","amount":12.5}"#
    );
    browser.close().await?;
    bed.finish().await
}

/// `request` sent as is over a new connection to `address`; the status
/// line of the answer.
async fn raw_http(address: &str, request: &str) -> anyhow::Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(address).await?;
    stream.write_all(request.as_bytes()).await?;
    let mut answer = vec![0; 4096];
    let read = stream.read(&mut answer).await?;
    Ok(String::from_utf8_lossy(&answer[..read])
        .lines()
        .next()
        .unwrap_or_default()
        .to_owned())
}

/// Without authentication, a browser's request to a name that is not an
/// address (a site whose DNS was rebound to this machine) is refused: the
/// page and grpc-web alike; at 127.0.0.1 or localhost it is answered, and
/// gRPC clients, which send no browser headers, are not affected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_authentication_a_rebound_name_is_refused() -> anyhow::Result<()> {
    init_logging();
    let mut bed = TestBed::without_broker(|_| {}).await?;
    let address = bed.planner.url().trim_start_matches("http://").to_owned();
    let port = address.rsplit(':').next().unwrap_or_default().to_owned();
    let page = |host: &str| format!("GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    assert!(raw_http(&address, &page(&address)).await?.contains(" 200 "));
    assert!(
        raw_http(&address, &page(&format!("localhost:{port}")))
            .await?
            .contains(" 200 ")
    );
    let rebound = format!("rebind.evil.example:{port}");
    assert!(raw_http(&address, &page(&rebound)).await?.contains(" 403 "));
    let grpc_web = format!(
        "POST /redrive.v1.Planner/ArchiveDeadLetters HTTP/1.1\r\nHost: {rebound}\r\nOrigin: http://{rebound}\r\n\
         Content-Type: application/grpc-web+proto\r\nX-Grpc-Web: 1\r\nContent-Length: 5\r\nConnection: close\r\n\r\n\0\0\0\0\0"
    );
    let answer = raw_http(&address, &grpc_web).await?;
    assert!(answer.contains(" 403 "), "{answer}");
    // A gRPC client is still served.
    bed.client.get_caller(v1::GetCallerRequest {}).await?;
    bed.finish().await
}

/// A running plan that no executor works on: after 30 s without an item
/// done its page says so and what to check (the banner a user meets when
/// every executor is down); once an executor takes the plan the banner goes
/// and every message is sent, the consumer's within the audit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plan_no_executor_works_on_says_so_on_its_page() -> anyhow::Result<()> {
    init_logging();
    let broker = Broker::connect().await?;
    let incident = incident(&broker, 3).await?;
    let mut bed = TestBed::start_secure(Some(broker), Pki::new()?, |config| {
        capturing(config, &[&incident.dlq]);
    })
    .await?;
    captured(&mut bed.client, &incident.dlq, 3).await?;
    let (received, consuming) = consume(bed.broker(), &incident.work).await?;
    let plan = approved_plan(&mut bed.client, &incident.dlq, 100.0, 10, None).await?;
    let url = bed.planner.url();
    let browser = Browser::start().await?;
    sign_in(&browser, &url, token_of("alice"), "alice").await?;
    browser
        .go(&format!("{url}/#/plans/{}", plan.plan_id))
        .await?;
    browser.find("plan-state").await?;
    // Not at once: a plan that has just started is not stalled.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(
        !browser.has("plan-stalled").await?,
        "stalled after 5 s already"
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(45);
    while !browser.has("plan-stalled").await? {
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "no stall banner 50 s into a plan no executor works on"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let banner = browser.text("plan-stalled").await?;
    assert!(
        banner.starts_with("No item done for") && banner.contains("executor"),
        "{banner}"
    );
    browser.screenshot("plan-stalled").await?;

    let executor = ExecutorHandle::start(bed.secure_executor_config("executor-stall-1")?);
    browser
        .text_until("plan-state", "completes", |text| {
            text.to_lowercase().contains("completed")
        })
        .await?;
    assert!(
        !browser.has("plan-stalled").await?,
        "the banner stays on a completed plan"
    );
    executor.stop().await?;
    wait_received(&received, 3, Duration::from_secs(10)).await?;
    stop_consuming(consuming)?;
    let received = received.lock().unwrap().clone();
    let (sent, _) = assert_bed_audit(&bed, &plan.plan_id, &received).await?;
    assert_eq!(sent.len(), 3, "every message sent: {sent:?}");
    assert_eq!(received.len(), 3);
    browser.close().await?;
    bed.finish().await
}
