//! Per-item facts are decided once: where a plan item is published (by the
//! plan's destination mode) and when it turns stale (by its precheck's
//! options, counted from its first death). The coordinator and the executor
//! read what was stored; nothing recomputes it.

use chrono::{DateTime, Duration as Age, Utc};
use redrive_planner::{
    ids::DeadLetterId,
    store::{Store, plans::DestinationMode},
};
use redrive_proto::v1::{
    self, HeaderArray, HeaderTable, HeaderValue, IngestDeadLettersRequest, MessageProperties,
    header_value::Value,
};
use redrive_tests::{TestBed, init_logging, plan_request, unique};

fn text(value: &str) -> HeaderValue {
    HeaderValue {
        value: Some(Value::LongString(value.as_bytes().to_vec())),
    }
}

/// One `x-death` entry as RabbitMQ writes it.
fn death(queue: &str, exchange: &str, routing_key: &str, at: DateTime<Utc>) -> HeaderValue {
    let fields = [
        ("reason", text("rejected")),
        ("queue", text(queue)),
        ("exchange", text(exchange)),
        (
            "routing-keys",
            HeaderValue {
                value: Some(Value::Array(HeaderArray {
                    values: vec![text(routing_key)],
                })),
            },
        ),
        (
            "count",
            HeaderValue {
                value: Some(Value::LongLongInt(1)),
            },
        ),
        (
            "time",
            HeaderValue {
                value: Some(Value::Timestamp(u64::try_from(at.timestamp()).unwrap())),
            },
        ),
    ];
    HeaderValue {
        value: Some(Value::Table(HeaderTable {
            fields: fields.into_iter().map(|(k, v)| (k.to_owned(), v)).collect(),
        })),
    }
}

fn item(
    source: &str,
    id: &str,
    destination: &str,
    deaths: Vec<HeaderValue>,
) -> IngestDeadLettersRequest {
    IngestDeadLettersRequest {
        source: source.to_owned(),
        message_id: id.to_owned(),
        body: format!(r#"{{"order_id":"{id}"}}"#).into_bytes(),
        properties: Some(MessageProperties {
            r#type: Some("order.paid".to_owned()),
            ..Default::default()
        }),
        headers: Some(HeaderTable {
            fields: if deaths.is_empty() {
                Default::default()
            } else {
                [(
                    "x-death".to_owned(),
                    HeaderValue {
                        value: Some(Value::Array(HeaderArray { values: deaths })),
                    },
                )]
                .into()
            },
        }),
        reason: "rejected".to_owned(),
        original_destination: destination.to_owned(),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_and_deadlines_are_decided_once_from_the_first_death() -> anyhow::Result<()> {
    init_logging();
    let mut bed = TestBed::without_broker(|_| {}).await?;
    let source = unique("svc");
    let now = Utc::now();
    let first = now - Age::minutes(30);
    let last = now - Age::minutes(5);
    // Died twice: in `orders.fulfil` (newest first, as RabbitMQ orders
    // x-death) and, earlier, in `orders.pick`.
    let twice = item(
        &source,
        "twice",
        "orders.fulfil",
        vec![
            death("orders.fulfil", "orders", "order.paid", last),
            death("orders.pick", "orders", "order.picked", first),
        ],
    );
    let ingested = item(&source, "ingested", "billing/invoice.sent", vec![]);
    let stored = bed
        .client
        .ingest_dead_letters(tokio_stream::iter(vec![twice, ingested]))
        .await?
        .into_inner();
    assert_eq!(stored.accepted, 2, "{:?}", stored.rejected);

    // The route rule, per mode.
    let store = Store::from_pool(bed.pool().await?);
    let ids: Vec<(i64, String)> =
        sqlx::query_as("SELECT id, message_id FROM dead_letters WHERE source = $1 ORDER BY id")
            .bind(&source)
            .fetch_all(&bed.pool().await?)
            .await?;
    let id_of = |name: &str| ids.iter().find(|(_, m)| m == name).unwrap().0;
    let dead_letter = |name: &str| DeadLetterId::new(id_of(name));
    let route = |exchange: &str, key: &str| Some((exchange.to_owned(), key.to_owned()));
    let redirect = DestinationMode::Redirect {
        exchange: "quarantine".into(),
        routing_key: "all".into(),
    };
    assert_eq!(
        store
            .route_of(dead_letter("twice"), &DestinationMode::Queue)
            .await?,
        route("", "orders.fulfil"),
        "queue mode: the queue of the death that counts, through the default exchange"
    );
    assert_eq!(
        store
            .route_of(dead_letter("twice"), &DestinationMode::Exchange)
            .await?,
        route("orders", "order.paid"),
        "exchange mode: that death's exchange and routing key"
    );
    assert_eq!(
        store.route_of(dead_letter("twice"), &redirect).await?,
        route("quarantine", "all")
    );
    assert_eq!(
        store
            .route_of(dead_letter("ingested"), &DestinationMode::Queue)
            .await?,
        route("billing", "invoice.sent"),
        "an ingested exchange/routing-key goes to that exchange"
    );
    assert_eq!(
        store
            .route_of(dead_letter("ingested"), &DestinationMode::Exchange)
            .await?,
        route("billing", "invoice.sent")
    );

    // The deadline: one hour after the first death, not the last.
    let report = bed
        .client
        .run_precheck(v1::RunPrecheckRequest {
            selector: Some(v1::Selector {
                sources: vec![source.clone()],
                ..Default::default()
            }),
            options: Some(v1::PrecheckOptions {
                default_stale_after: Some(prost_types::Duration {
                    seconds: 3600,
                    nanos: 0,
                }),
                ..Default::default()
            }),
        })
        .await?
        .into_inner();
    assert_eq!(report.counts.as_ref().unwrap().replayable, 2, "{report:?}");
    let plan = bed
        .client
        .create_plan(v1::CreatePlanRequest {
            destination: Some(v1::Destination {
                mode: Some(v1::destination::Mode::Exchange(v1::ExchangeDestination {})),
            }),
            ..plan_request(&report, 10.0, 1)
        })
        .await?
        .into_inner();
    let plan_id: uuid::Uuid = plan.plan_id.parse()?;
    let rows: Vec<(i64, String, String, Option<DateTime<Utc>>)> = sqlx::query_as(
        "SELECT dead_letter_id, exchange, routing_key, stale_at FROM plan_items \
         WHERE plan_id = $1 ORDER BY dead_letter_id",
    )
    .bind(plan_id)
    .fetch_all(&bed.pool().await?)
    .await?;
    let twice_row = rows.iter().find(|r| r.0 == id_of("twice")).unwrap();
    assert_eq!(
        (twice_row.1.as_str(), twice_row.2.as_str()),
        ("orders", "order.paid")
    );
    let stale_at = twice_row.3.expect("a deadline is stored");
    let expected = DateTime::from_timestamp(first.timestamp(), 0).unwrap() + Age::hours(1);
    assert_eq!(stale_at, expected, "counted from the first death");
    let ingested_row = rows.iter().find(|r| r.0 == id_of("ingested")).unwrap();
    assert_eq!(
        (ingested_row.1.as_str(), ingested_row.2.as_str()),
        ("billing", "invoice.sent")
    );
    bed.finish().await
}
