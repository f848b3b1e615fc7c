-- The relay claims fairly across tenants: one tenant's backlog must not
-- delay another tenant's rows. Each row carries fair_round, its round in a
-- round-robin over tenants, and the relay claims due rows in round order
-- (keyed_outbox_fair_idx), so a tenant's n-th waiting row goes after every
-- other tenant's (n-1)-th.
--
-- EnqueueTx sets fair_round to the later of two rounds: one after the
-- tenant's last unsent row (keyed_outbox_tenant_round_idx), so a tenant's
-- rows take one round each, and the round the relay is at, the lowest
-- round of the rows never claimed (keyed_outbox_fresh_idx), so a tenant
-- that had no backlog joins the current round instead of jumping ahead of
-- everyone's. A row without a tenant counts as the tenant ''.
--
-- Rolling deploy: code from before this migration inserts without
-- fair_round, so its rows take round 0 and go first, as in the old FIFO
-- order; relays from before it keep claiming in due order through
-- keyed_outbox_due_idx, which stays (the planner also picks it when few
-- rows are due, such as while Temporal is down). Unsent rows
-- written before this migration get their rounds here, in id order per
-- tenant.
ALTER TABLE keyed_outbox ADD COLUMN fair_round bigint NOT NULL DEFAULT 0;

UPDATE keyed_outbox o SET fair_round = r.n - 1
FROM (
    SELECT id, row_number() OVER (PARTITION BY coalesce(tenant_id, '') ORDER BY id) AS n
    FROM keyed_outbox WHERE sent_at IS NULL
) r
WHERE o.id = r.id AND r.n > 1;

-- The relay's claim: due rows by round, then by due time.
CREATE INDEX keyed_outbox_fair_idx ON keyed_outbox (fair_round, available_at, id) WHERE sent_at IS NULL;
-- EnqueueTx: the tenant's last round.
CREATE INDEX keyed_outbox_tenant_round_idx ON keyed_outbox ((coalesce(tenant_id, '')), fair_round) WHERE sent_at IS NULL;
-- EnqueueTx: the round the relay is at.
CREATE INDEX keyed_outbox_fresh_idx ON keyed_outbox (fair_round) WHERE sent_at IS NULL AND attempts = 0;
