//! Where plan items are published (the routing SQL decided once when a plan
//! is created) and the reads that compare destinations: exchange-only items,
//! overlapping plans, running plans to a destination.

use redrive_proto::v1;
use sqlx::AssertSqlSafe;

use super::{
    super::{Store, StoreError},
    DestinationMode, destination_columns,
};
use crate::{
    ids::{DeadLetterId, PlanId, PrecheckId},
    plan::state,
};

/// Where a plan item is published, decided once when the plan is created
/// (docs/design.md, "Plan items"): the exchange, by the plan's destination
/// mode (`p.destination_mode`) and the dead letter `d`. Queue mode: the
/// default exchange to the queue it died in, or the `exchange/routing-key`
/// an ingested, imported or exchange-only dead letter names. Exchange mode:
/// the exchange and first routing key of a death the broker recorded (one
/// with an exchange or routing keys; an ingested reason makes a death with
/// neither), else the exchange and key a framework recorded, else the
/// `exchange/routing-key` destination, else the queue through the default
/// exchange. Redirect: the plan's exchange and key.
/// The coordinator reads `plan_items.exchange` and `routing_key`; this SQL
/// is the one place the rule is written.
pub(super) const ITEM_EXCHANGE_SQL: &str = "CASE p.destination_mode \
    WHEN 'redirect' THEN coalesce(p.redirect_exchange, '') \
    WHEN 'exchange' THEN CASE \
        WHEN coalesce(d.death_exchange, '') <> '' OR coalesce(cardinality(d.death_routing_keys), 0) > 0 \
            THEN coalesce(d.death_exchange, '') \
        WHEN d.original_exchange IS NOT NULL THEN d.original_exchange \
        WHEN strpos(d.destination, '/') > 0 THEN split_part(d.destination, '/', 1) \
        ELSE '' END \
    ELSE CASE WHEN (d.origin <> 'rabbitmq' OR d.exchange_only) AND strpos(d.destination, '/') > 0 \
              THEN split_part(d.destination, '/', 1) ELSE '' END END";

/// The routing key half of [`ITEM_EXCHANGE_SQL`], branch by branch.
pub(super) const ITEM_ROUTING_KEY_SQL: &str = "CASE p.destination_mode \
    WHEN 'redirect' THEN coalesce(p.redirect_routing_key, '') \
    WHEN 'exchange' THEN CASE \
        WHEN coalesce(d.death_exchange, '') <> '' OR coalesce(cardinality(d.death_routing_keys), 0) > 0 \
            THEN coalesce(d.death_routing_keys[1], '') \
        WHEN d.original_exchange IS NOT NULL THEN coalesce(d.original_routing_key, '') \
        WHEN strpos(d.destination, '/') > 0 \
            THEN substr(d.destination, strpos(d.destination, '/') + 1) \
        ELSE d.destination END \
    ELSE CASE WHEN (d.origin <> 'rabbitmq' OR d.exchange_only) AND strpos(d.destination, '/') > 0 \
              THEN substr(d.destination, strpos(d.destination, '/') + 1) \
              ELSE d.destination END END";

/// Where plan item `i` (of dead letter `d`) lands, as the executors' token
/// bucket keys it (`redrive_executor::outcomes::landing`, branch by branch;
/// docs/replay.md, "Rate"), named as [`landing_name`] names it: `queue q`
/// through the default exchange (the routing key is the queue) or along the
/// death the broker recorded (exchange mode: the queue it died in), else
/// `exchange x routing key k`.
const ITEM_DESTINATION_SQL: &str = "(CASE WHEN i.exchange = '' THEN 'queue ' || i.routing_key \
    WHEN d.origin = 'rabbitmq' AND NOT d.exchange_only AND d.destination <> '' \
        AND coalesce(d.death_queue, '') = d.destination \
        AND coalesce(d.death_exchange, '') = i.exchange \
        AND coalesce(d.death_routing_keys[1], '') = i.routing_key \
        THEN 'queue ' || d.destination \
    ELSE 'exchange ' || i.exchange || ' routing key ' || i.routing_key END)";

/// The name [`ITEM_DESTINATION_SQL`] gives a publish to `exchange` with
/// `routing_key` whose landing queue is not otherwise known: `queue {key}`
/// through the default exchange, else `exchange {x} routing key {key}`.
pub fn landing_name(exchange: &str, routing_key: &str) -> String {
    if exchange.is_empty() {
        format!("queue {routing_key}")
    } else {
        format!("exchange {exchange} routing key {routing_key}")
    }
}

impl Store {
    /// Where dead letter `dead_letter_id` would be published under `mode`:
    /// `(exchange, routing_key)` by the same SQL a plan item's route is
    /// decided with ([`ITEM_EXCHANGE_SQL`]); `None` for an unknown id.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn route_of(
        &self,
        dead_letter_id: DeadLetterId,
        mode: &DestinationMode,
    ) -> Result<Option<(String, String)>, StoreError> {
        let (destination_mode, redirect_exchange, redirect_routing_key) = destination_columns(mode);
        Ok(sqlx::query_as(AssertSqlSafe(format!(
            "SELECT {ITEM_EXCHANGE_SQL} AS exchange, {ITEM_ROUTING_KEY_SQL} AS routing_key \
             FROM dead_letters d, (SELECT $2::text AS destination_mode, $3::text AS redirect_exchange, \
                                          $4::text AS redirect_routing_key) p \
             WHERE d.id = $1"
        )))
        .bind(dead_letter_id)
        .bind(destination_mode)
        .bind(redirect_exchange)
        .bind(redirect_routing_key)
        .fetch_optional(self.pool())
        .await?)
    }
}

/// The replayable items of a precheck whose dead letter knows only an
/// exchange and a routing key (`exchange_only`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, sqlx::FromRow)]
pub struct ExchangeOnlyItems {
    /// How many.
    pub count: i64,
    /// How many of them know no exchange either (only a routing key, such as
    /// a Kafka topic): only a redirect can replay them.
    pub without_exchange: i64,
    /// The lowest dead letter id among them, as an example.
    pub example: Option<DeadLetterId>,
    /// All replayable items of the precheck, these included.
    pub replayable: i64,
}

impl ExchangeOnlyItems {
    /// Counts `candidate`, a replayable one; candidates come in id order,
    /// but the example is the lowest id whatever the order.
    pub fn add(&mut self, candidate: &crate::store::prechecks::Candidate) {
        self.replayable += 1;
        if candidate.exchange_only {
            self.count += 1;
            self.without_exchange += i64::from(candidate.without_exchange);
            self.example = Some(
                self.example
                    .map_or(candidate.id, |example| example.min(candidate.id)),
            );
        }
    }
}

impl Store {
    /// [`ExchangeOnlyItems`] of precheck `precheck_id`, read from its items
    /// (a precheck counts them as it classifies: [`ExchangeOnlyItems::add`]).
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn exchange_only_items(
        &self,
        precheck_id: PrecheckId,
    ) -> Result<ExchangeOnlyItems, StoreError> {
        Ok(sqlx::query_as(
            "SELECT count(*) FILTER (WHERE d.exchange_only) AS count, \
                    count(*) FILTER (WHERE d.exchange_only AND d.original_exchange IS NULL) \
                        AS without_exchange, \
                    min(d.id) FILTER (WHERE d.exchange_only) AS example, \
                    count(*) AS replayable \
             FROM precheck_items i JOIN dead_letters d ON d.id = i.dead_letter_id \
             WHERE i.precheck_id = $1 AND i.verdict = 'replayable'",
        )
        .bind(precheck_id)
        .fetch_one(self.pool())
        .await?)
    }

    /// Other running plans (canary, observing, main, paused) that publish to a
    /// destination plan `plan_id` publishes to: `(plan id, destination)`.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn overlapping_plans(
        &self,
        plan_id: PlanId,
    ) -> Result<Vec<(PlanId, String)>, StoreError> {
        let query = format!(
            "WITH mine AS (SELECT DISTINCT {ITEM_DESTINATION_SQL} AS destination \
                 FROM plans p JOIN plan_items i ON i.plan_id = p.id JOIN dead_letters d ON d.id = i.dead_letter_id \
                 WHERE p.id = $1), \
             theirs AS (SELECT DISTINCT p.id, {ITEM_DESTINATION_SQL} AS destination \
                 FROM plans p JOIN plan_items i ON i.plan_id = p.id JOIN dead_letters d ON d.id = i.dead_letter_id \
                 WHERE p.id <> $1 AND p.state = ANY($2)) \
             SELECT theirs.id, theirs.destination FROM theirs JOIN mine USING (destination) ORDER BY 2, 1"
        );
        Ok(sqlx::query_as(AssertSqlSafe(query))
            .bind(plan_id)
            .bind(state::names_where(v1::PlanState::is_running))
            .fetch_all(self.pool())
            .await?)
    }

    /// Replaces a plan's warnings.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn set_plan_warnings(
        &self,
        plan_id: PlanId,
        warnings: &[String],
    ) -> Result<(), StoreError> {
        sqlx::query("UPDATE plans SET warnings = $2 WHERE id = $1")
            .bind(plan_id)
            .bind(warnings)
            .execute(self.pool())
            .await?;
        Ok(())
    }
}

impl Store {
    /// Landing places ([`landing_name`]: `queue q`, or `exchange x routing
    /// key k`) of running plans (canary, observing, main, paused) among
    /// `destinations`: `(plan id, destination)`.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn running_plans_to(
        &self,
        destinations: &[String],
    ) -> Result<Vec<(PlanId, String)>, StoreError> {
        let query = format!(
            "SELECT DISTINCT p.id, {ITEM_DESTINATION_SQL} AS destination \
             FROM plans p JOIN plan_items i ON i.plan_id = p.id JOIN dead_letters d ON d.id = i.dead_letter_id \
             WHERE p.state = ANY($2) \
             AND {ITEM_DESTINATION_SQL} = ANY($1) ORDER BY 2, 1"
        );
        Ok(sqlx::query_as(AssertSqlSafe(query))
            .bind(destinations)
            .bind(state::names_where(v1::PlanState::is_running))
            .fetch_all(self.pool())
            .await?)
    }
}

/// One item a plan would have, routed as [`ITEM_EXCHANGE_SQL`] routes it
/// ([`Store::preview_routes`]).
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct PreviewRoute {
    /// The item's dead letter.
    pub dead_letter_id: DeadLetterId,
    /// Where it would be published ("" is the default exchange).
    pub exchange: String,
    /// Its routing key.
    pub routing_key: String,
    /// Plans that sent its message key before (the replay's
    /// `x-redrive-count` is this plus one), as a claim counts them.
    pub redrive_count: i64,
    /// The body it would be published with (the latest revision, else the
    /// captured body), in bytes.
    pub body_bytes: i64,
}

impl Store {
    /// The first `limit` replayable items of precheck `precheck_id` in plan
    /// order (by dead letter id, as [`Store::create_plan`] numbers them),
    /// routed under `mode`, and how many replayable items it has. Reads
    /// only: the plan's preview.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn preview_routes(
        &self,
        precheck_id: PrecheckId,
        mode: &DestinationMode,
        limit: u32,
    ) -> Result<(Vec<PreviewRoute>, i64), StoreError> {
        let (destination_mode, redirect_exchange, redirect_routing_key) = destination_columns(mode);
        let routes = sqlx::query_as(AssertSqlSafe(format!(
            "SELECT d.id AS dead_letter_id, {ITEM_EXCHANGE_SQL} AS exchange, \
                    {ITEM_ROUTING_KEY_SQL} AS routing_key, \
                    (SELECT count(DISTINCT e.plan_id) FROM audit_events e \
                      WHERE e.message_key = ANY(d.previous_message_keys || d.message_key) \
                        AND e.destination = d.destination AND e.action = 'sent') AS redrive_count, \
                    coalesce((SELECT octet_length(v.body) FROM dead_letter_revisions v \
                               WHERE v.dead_letter_id = d.id AND v.revision = d.body_revision), \
                             octet_length(d.body))::bigint AS body_bytes \
             FROM precheck_items i JOIN dead_letters d ON d.id = i.dead_letter_id, \
                  (SELECT $2::text AS destination_mode, $3::text AS redirect_exchange, \
                          $4::text AS redirect_routing_key) p \
             WHERE i.precheck_id = $1 AND i.verdict = 'replayable' \
             ORDER BY i.dead_letter_id LIMIT $5"
        )))
        .bind(precheck_id)
        .bind(destination_mode)
        .bind(redirect_exchange)
        .bind(redirect_routing_key)
        .bind(i64::from(limit))
        .fetch_all(self.pool())
        .await?;
        let (items,): (i64,) = sqlx::query_as(
            "SELECT count(*) FROM precheck_items WHERE precheck_id = $1 AND verdict = 'replayable'",
        )
        .bind(precheck_id)
        .fetch_one(self.pool())
        .await?;
        Ok((routes, items))
    }
}
