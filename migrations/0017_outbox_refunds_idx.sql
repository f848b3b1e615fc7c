-- keyed:no-transaction
--
-- An order's view lists the refunds requested for it that are still only
-- in the outbox (refunds.Ledger.Refunds): rows of RefundWorkflow by tenant
-- and order. Without this index that read scanned the whole outbox, sent
-- rows included (kept 7 days): 65 ms per GET /v1/orders/{id} at 500 000
-- rows. The index holds refund rows only, so order enqueues do not pay for
-- it, and it is built CONCURRENTLY, so the API keeps enqueueing meanwhile.
-- A build that failed left an invalid index: the DROP clears it on the
-- next start.
DROP INDEX CONCURRENTLY IF EXISTS keyed_outbox_refunds_idx;
CREATE INDEX CONCURRENTLY keyed_outbox_refunds_idx ON keyed_outbox (tenant_id, (payload->>'order_id'), id)
    WHERE workflow_type = 'RefundWorkflow';
