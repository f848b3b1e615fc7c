-- The daily reconcile reads the refunds reserved in its window; without an
-- index on created_at that read scans the whole ledger.
CREATE INDEX refund_ledger_created_at_idx ON refund_ledger (created_at);
