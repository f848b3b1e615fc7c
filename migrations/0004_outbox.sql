-- keyed_outbox is the transactional outbox: a request to start a workflow,
-- written in the same transaction as the business row it belongs to, so the
-- two commit or roll back together. A relay claims due rows with
-- FOR UPDATE SKIP LOCKED, starts each workflow under its business-derived ID
-- (a repeated start collapses), and marks the row sent.
--
-- available_at is both the claim lease and the retry backoff: a claim moves
-- it into the future, so a relay that dies holding rows gives them back when
-- the lease runs out, and a failed start moves it by a jittered backoff.
CREATE TABLE keyed_outbox (
    id            bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id     text        NOT NULL,
    workflow_type text        NOT NULL,
    workflow_id   text        NOT NULL,
    payload       jsonb       NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    available_at  timestamptz NOT NULL DEFAULT now(),
    attempts      integer     NOT NULL DEFAULT 0,
    claimed_by    text,
    last_error    text,
    sent_at       timestamptz,
    run_id        text
);

-- One start request per workflow ID: enqueueing the same start twice (a
-- retried handler) is a no-op rather than a second row.
CREATE UNIQUE INDEX keyed_outbox_workflow_idx ON keyed_outbox (workflow_id);
-- The relay's claim walks unsent rows by due time.
CREATE INDEX keyed_outbox_due_idx ON keyed_outbox (available_at, id) WHERE sent_at IS NULL;
-- Prune walks sent rows by age.
CREATE INDEX keyed_outbox_sent_idx ON keyed_outbox (sent_at) WHERE sent_at IS NOT NULL;
