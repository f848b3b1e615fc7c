-- Refunds (package refunds). An order may now be refunded in part or in
-- full; its status says which.
ALTER TABLE orders DROP CONSTRAINT orders_status_check;
ALTER TABLE orders ADD CONSTRAINT orders_status_check
    CHECK (status IN ('pending', 'paid', 'failed', 'partially_refunded', 'refunded'));

-- refund_ledger is the append-only ledger of an order's refunds: one row per
-- refund event, written by the Reserve step under a per-order lock after it
-- checked that the charge covers it. What an order has refunded is always
-- SUM(amount_minor) of its rows, never a column updated in place; the
-- primary key makes a second reservation of the same refund a conflict, not
-- a second debit. Rows are never updated or deleted (the trigger below
-- refuses it).
CREATE TABLE refund_ledger (
    tenant_id    text        NOT NULL,
    order_id     text        NOT NULL,
    refund_id    text        NOT NULL,
    amount_minor bigint      NOT NULL CHECK (amount_minor > 0),
    reason       text        NOT NULL DEFAULT '',
    effect_key   text        NOT NULL UNIQUE,
    created_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, order_id, refund_id),
    FOREIGN KEY (tenant_id, order_id) REFERENCES orders (tenant_id, id)
);

CREATE FUNCTION refund_ledger_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'refund_ledger is append-only: % refused', TG_OP;
END
$$;

CREATE TRIGGER refund_ledger_append_only BEFORE UPDATE OR DELETE ON refund_ledger
    FOR EACH ROW EXECUTE FUNCTION refund_ledger_append_only();

-- refund_stripe_outcomes keeps what Stripe answered to each refund, as
-- outcomes only (IDs, status, amount), written once by the RefundAtStripe
-- step, for reconciliation and for showing a refund after its effect record
-- was pruned.
CREATE TABLE refund_stripe_outcomes (
    tenant_id         text        NOT NULL,
    order_id          text        NOT NULL,
    refund_id         text        NOT NULL,
    stripe_refund_id  text        NOT NULL,
    payment_intent_id text        NOT NULL,
    status            text        NOT NULL,
    amount_minor      bigint      NOT NULL,
    currency          text        NOT NULL,
    effect_key        text        NOT NULL UNIQUE,
    created_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, order_id, refund_id),
    FOREIGN KEY (tenant_id, order_id, refund_id) REFERENCES refund_ledger (tenant_id, order_id, refund_id)
);
