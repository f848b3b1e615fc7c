-- orders holds the business entity the pipeline works on. Workflows carry
-- only (tenant_id, id); activities load the current row when they run.
CREATE TABLE orders (
    tenant_id      text        NOT NULL,
    id             text        NOT NULL,
    amount_minor   bigint      NOT NULL CHECK (amount_minor > 0),
    currency       text        NOT NULL CHECK (currency ~ '^[a-z]{3}$'),
    customer_email text        NOT NULL,
    payment_method text        NOT NULL,
    status         text        NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'paid', 'failed')),
    created_at     timestamptz NOT NULL DEFAULT now(),
    updated_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, id)
);

-- order_transitions records every status change. The unique constraint makes
-- a second attempt at the same transition for the same event a conflict, not
-- a second transition.
CREATE TABLE order_transitions (
    tenant_id  text        NOT NULL,
    order_id   text        NOT NULL,
    from_state text        NOT NULL,
    to_state   text        NOT NULL,
    event_id   text        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, order_id, from_state, to_state, event_id),
    FOREIGN KEY (tenant_id, order_id) REFERENCES orders (tenant_id, id)
);
