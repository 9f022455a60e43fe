-- The gates count failures of running plans twice a second: keep that an
-- index lookup, not a scan of every audit event of the plan.
CREATE INDEX audit_events_failures ON audit_events (plan_id, at) WHERE action IN ('failed', 'unroutable');
