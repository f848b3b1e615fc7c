-- keyed_reconcile_runs records every successful reconciliation run against
-- Stripe (package reconcile), so that `starter doctor` can say when charges
-- were last reconciled and whether the daily job still runs. A failed run
-- records nothing. Rows are tiny (one a day); nothing prunes them.
CREATE TABLE keyed_reconcile_runs (
    id              bigserial   PRIMARY KEY,
    window_from     timestamptz NOT NULL,
    window_to       timestamptz NOT NULL,
    records         integer     NOT NULL,
    payment_intents integer     NOT NULL,
    in_flight       integer     NOT NULL,
    findings        integer     NOT NULL,
    finished_at     timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX keyed_reconcile_runs_finished_idx ON keyed_reconcile_runs (finished_at);
