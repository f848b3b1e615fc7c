-- refund_releases gives back what a refund reserved when Stripe refused the
-- refund for good (package refunds, the ReleaseRefund step): one row per
-- released refund, never more than one (the primary key), for the whole of
-- its ledger row's amount. It is append-only, as refund_ledger is: what an
-- order has refunded is SUM(refund_ledger.amount_minor) minus
-- SUM(refund_releases.amount_minor), and no row is ever updated or deleted
-- (the trigger below refuses it). code is Stripe's refusal code, such as
-- charge_disputed.
CREATE TABLE refund_releases (
    tenant_id    text        NOT NULL,
    order_id     text        NOT NULL,
    refund_id    text        NOT NULL,
    amount_minor bigint      NOT NULL CHECK (amount_minor > 0),
    code         text        NOT NULL,
    effect_key   text        NOT NULL UNIQUE,
    created_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, order_id, refund_id),
    FOREIGN KEY (tenant_id, order_id, refund_id) REFERENCES refund_ledger (tenant_id, order_id, refund_id)
);

CREATE FUNCTION refund_releases_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'refund_releases is append-only: % refused', TG_OP;
END
$$;

CREATE TRIGGER refund_releases_append_only BEFORE UPDATE OR DELETE ON refund_releases
    FOR EACH ROW EXECUTE FUNCTION refund_releases_append_only();
