-- One database is one deployment, of one broker and virtual host: the record
-- of what was delivered (audit events, dead letters' destinations) names
-- queues, not brokers. The first planner to start records its broker here;
-- a planner of another broker is refused on this database (docs/operating.md,
-- "One database per broker").
CREATE TABLE deployment (
    singleton   BOOLEAN     PRIMARY KEY DEFAULT true CHECK (singleton),
    broker_id   TEXT        NOT NULL,
    recorded_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
