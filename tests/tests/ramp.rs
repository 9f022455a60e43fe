//! Ramps (issue "Closed loop", part 4): waves of growing size between the
//! canary and the main wave, each published, observed and promoted by itself
//! with the same gates. Against the real RabbitMQ, PostgreSQL and Redis: a
//! clean three-wave run promotes itself wave by wave (no wave's messages
//! before the previous wave's window passed), and a run whose consumer
//! breaks stops at the wave where the gate tripped, the main wave untouched.

mod support;

use std::time::Duration;

use redrive_proto::v1::{self, PlanState};
use redrive_tests::{ExecutorHandle, init_logging};

use support::{
    approved_plan_with, assert_bed_audit, breaks_after, consume, get_plan, incident_bed,
    stop_consuming, wait_aborted, wait_completed,
};

/// A 10% canary, then up to 40%, then the rest: with 40 items, waves of 4,
/// 12 and 24, each observed for a second.
fn three_waves(request: &mut v1::CreatePlanRequest) {
    request.rate = Some(v1::Rate {
        per_second: 200.0,
        burst: 5,
        rationale: "the test consumer takes 200 a second".into(),
    });
    request.slice_size = 5;
    request.canary_fraction = Some(0.1);
    request.ramp = vec![0.4];
    request.observe_for = Some(prost_types::Duration {
        seconds: 1,
        nanos: 0,
    });
}

/// When each wave's items were reported, (first, last), by `ramp_step`,
/// and when the gates moved the plan on (`next_wave`, `promote`).
async fn wave_times(
    pool: &sqlx::PgPool,
    plan_id: &str,
) -> anyhow::Result<(
    Vec<(
        i32,
        chrono::DateTime<chrono::Utc>,
        chrono::DateTime<chrono::Utc>,
    )>,
    Vec<(String, chrono::DateTime<chrono::Utc>)>,
)> {
    let plan_id: uuid::Uuid = plan_id.parse()?;
    let waves = sqlx::query_as(
        "SELECT s.ramp_step, min(e.at), max(e.at) FROM audit_events e \
         JOIN plan_items i ON i.plan_id = e.plan_id AND i.dead_letter_id = e.dead_letter_id \
         JOIN plan_slices s ON s.id = i.slice_id \
         WHERE e.plan_id = $1 AND e.action = 'sent' GROUP BY 1 ORDER BY 1",
    )
    .bind(plan_id)
    .fetch_all(pool)
    .await?;
    let moves = sqlx::query_as(
        "SELECT action, at FROM operator_actions WHERE plan_id = $1 \
         AND action IN ('next_wave', 'promote') ORDER BY id",
    )
    .bind(plan_id)
    .fetch_all(pool)
    .await?;
    Ok((waves, moves))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_three_wave_ramp_promotes_itself_on_a_clean_run() -> anyhow::Result<()> {
    init_logging();
    let (incident, mut bed) = incident_bed(40).await?;
    let (received, consuming) = consume(bed.broker(), &incident.work).await?;
    let plan = approved_plan_with(&mut bed.client, &incident.dlq, three_waves).await?;
    assert_eq!(plan.ramp_items, [4, 16], "the canary's 4, then up to 16");
    assert_eq!(plan.canary_items, 4);
    let executor = ExecutorHandle::start(bed.executor_config());
    let done = wait_completed(&mut bed.client, &plan.plan_id, Duration::from_secs(60)).await;
    executor.stop().await?;
    let done = done?;
    assert_eq!(done.counts.as_ref().map(|counts| counts.sent), Some(40));
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop_consuming(consuming)?;
    let received = received.lock().unwrap().clone();
    assert_eq!(received.len(), 40);
    assert_bed_audit(&bed, &plan.plan_id, &received).await?;

    // The gates moved it on twice, and no wave started before the window
    // after the one before it passed.
    let pool = bed.pool().await?;
    let (waves, moves) = wave_times(&pool, &plan.plan_id).await?;
    pool.close().await;
    let actions: Vec<&str> = moves.iter().map(|(action, _)| action.as_str()).collect();
    assert_eq!(actions, ["next_wave", "promote"]);
    assert_eq!(
        waves.iter().map(|wave| wave.0).collect::<Vec<_>>(),
        [0, 1, 2]
    );
    for step in 0..2 {
        let (_, _, last) = waves[step];
        let (_, moved_at) = &moves[step];
        let (_, first_next, _) = waves[step + 1];
        assert!(
            last + chrono::Duration::seconds(1) <= *moved_at && *moved_at <= first_next,
            "wave {step} ended {last}, observed a second, moved on {moved_at}, next wave from {first_next}"
        );
    }
    bed.finish().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ramp_stops_at_the_wave_where_a_gate_trips() -> anyhow::Result<()> {
    init_logging();
    let (incident, mut bed) = incident_bed(40).await?;
    // The consumer takes the canary's 4, then breaks: the second wave's
    // messages come back dead-lettered.
    let (seen, consuming) = breaks_after(bed.broker(), &incident.work, 4).await?;
    let plan = approved_plan_with(&mut bed.client, &incident.dlq, three_waves).await?;
    let executor = ExecutorHandle::start(bed.executor_config());
    let aborted = wait_aborted(&mut bed.client, &plan.plan_id).await;
    executor.stop().await?;
    let aborted = aborted?;
    assert_eq!(aborted.ramp_step, 1, "stopped in the second wave");
    assert!(
        aborted.state_reason.starts_with("gate tripped: ")
            && aborted.state_reason.contains("re-dead-letter"),
        "{}",
        aborted.state_reason
    );
    let sent = aborted.counts.as_ref().map_or(0, |counts| counts.sent);
    assert!(
        (5..=16).contains(&sent),
        "the canary and part of the second wave: {sent}"
    );
    let now = get_plan(&mut bed.client, &plan.plan_id).await?;
    assert_eq!(now.state(), PlanState::Aborted);

    // Nothing of the main wave was published.
    let pool = bed.pool().await?;
    let main_sent: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM audit_events e \
         JOIN plan_items i ON i.plan_id = e.plan_id AND i.dead_letter_id = e.dead_letter_id \
         JOIN plan_slices s ON s.id = i.slice_id \
         WHERE e.plan_id = $1::uuid AND s.wave = 'main'",
    )
    .bind(&plan.plan_id)
    .fetch_one(&pool)
    .await?;
    pool.close().await;
    assert_eq!(main_sent, 0, "no main-wave item was attempted");
    tokio::time::sleep(Duration::from_millis(300)).await;
    consuming.abort();
    let seen = seen.lock().unwrap().clone();
    assert!(
        seen.len() >= 5,
        "the broken consumer got the second wave: {seen:?}"
    );
    let received: Vec<support::Received> = seen
        .iter()
        .map(|(id, _)| support::Received {
            at: tokio::time::Instant::now(),
            message_id: id.clone(),
            body: Vec::new(),
            headers: Default::default(),
            properties: Default::default(),
        })
        .collect();
    assert_bed_audit(&bed, &plan.plan_id, &received).await?;
    bed.finish().await
}
