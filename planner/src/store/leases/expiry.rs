//! The sweep that ends expired leases ([`Store::expire_leases`]).

use crate::{
    ids::PlanId,
    store::{Store, StoreError, audit::lock_plan_audit, plans::notify},
};

impl Store {
    /// Ends every lease that expired: the items its holder had not reported
    /// and may have published become `uncertain` (an audit event each, which
    /// records the key as possibly delivered), and the slice is pending
    /// again for the next claim, which publishes them again with the same
    /// message id. "May have published": up to the lease's write-ahead mark
    /// ([`Store::mark_publishing`]) when its holder marks; every unreported
    /// item when it does not. Items past the mark stay pending, without an
    /// event: nobody published them. Runs in every planner's sweep; `SKIP
    /// LOCKED` keeps two replicas from ending one lease twice. Returns the
    /// plans touched.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn expire_leases(&self) -> Result<Vec<PlanId>, StoreError> {
        let mut transaction = self.pool().begin().await?;
        // The plans' audit locks first, in order (see `lock_plan_audit`);
        // only those plans' leases are ended: one that expires meanwhile
        // waits for the next sweep.
        let mut expiring: Vec<PlanId> = sqlx::query_scalar(
            "SELECT DISTINCT plan_id FROM plan_slices WHERE state = 'leased' AND lease_expires_at < now()",
        )
        .fetch_all(&mut *transaction)
        .await?;
        if expiring.is_empty() {
            return Ok(Vec::new());
        }
        expiring.sort_unstable();
        for plan_id in &expiring {
            lock_plan_audit(&mut transaction, *plan_id).await?;
        }
        let plans: Vec<PlanId> = sqlx::query_scalar(
            "WITH expired AS ( \
                SELECT id, plan_id, wave, coalesce(lease_owner, '') AS owner, published_through FROM plan_slices \
                WHERE state = 'leased' AND lease_expires_at < now() AND plan_id = ANY($1) \
                FOR UPDATE SKIP LOCKED), \
             released AS ( \
                UPDATE plan_slices s SET state = 'pending', lease_owner = NULL, lease_expires_at = NULL, \
                    published_through = NULL \
                FROM expired e WHERE s.id = e.id RETURNING e.id, e.plan_id, e.wave, e.owner, e.published_through), \
             taken AS ( \
                UPDATE plan_items i SET state = 'uncertain' FROM released r \
                WHERE i.slice_id = r.id AND i.state = 'pending' \
                  AND (r.published_through IS NULL OR i.position <= r.published_through) \
                RETURNING i.plan_id, i.slice_id, i.dead_letter_id, i.message_key, i.attempts, r.wave, r.owner), \
             events AS ( \
                INSERT INTO audit_events (plan_id, slice_id, dead_letter_id, message_key, destination, action, \
                    reason, wave, executor_id, attempt, message_id) \
                SELECT t.plan_id, t.slice_id, t.dead_letter_id, t.message_key, d.destination, 'uncertain', \
                    'the lease of ' || t.owner || ' expired after it may have published this item and before \
it reported it; the next lease publishes it again with the same message id', t.wave, t.owner, \
                    greatest(t.attempts, 1), d.message_id \
                FROM taken t LEFT JOIN dead_letters d ON d.id = t.dead_letter_id) \
             SELECT plan_id FROM released",
        )
        .bind(&expiring)
        .fetch_all(&mut *transaction)
        .await?;
        // One row per expired lease: counted, then one per plan.
        let expired = u64::try_from(plans.len()).unwrap_or(u64::MAX);
        let plans: Vec<PlanId> = {
            let mut seen = std::collections::HashSet::new();
            plans
                .into_iter()
                .filter(|plan| seen.insert(*plan))
                .collect()
        };
        for plan_id in &plans {
            notify(&mut transaction, *plan_id).await?;
        }
        transaction.commit().await?;
        self.metrics.leases_expired(expired);
        Ok(plans)
    }
}
