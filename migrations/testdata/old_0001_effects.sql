-- keyed_effects holds one row per effect key: the claim, its lease and, once
-- the effect has happened, its outcome. The primary key is the guard: a claim
-- is an INSERT ... ON CONFLICT DO NOTHING against it.
CREATE TABLE keyed_effects (
    key           text        PRIMARY KEY,
    tenant_id     text        NOT NULL,
    kind          text        NOT NULL,
    state         text        NOT NULL CHECK (state IN ('claimed', 'succeeded', 'failed_transient', 'failed_terminal')),
    owner         text        NOT NULL,
    fingerprint   text        NOT NULL DEFAULT '',
    generation    bigint      NOT NULL DEFAULT 1,
    attempts      integer     NOT NULL DEFAULT 1,
    lease_until   timestamptz,
    result        jsonb,
    error_code    text,
    error_message text,
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    finished_at   timestamptz,
    CHECK (length(key) <= 255),
    CHECK (state <> 'claimed' OR lease_until IS NOT NULL)
);

-- Prune walks finished records by age; live claims are never in this index.
CREATE INDEX keyed_effects_finished_idx ON keyed_effects (finished_at) WHERE state <> 'claimed';
CREATE INDEX keyed_effects_tenant_idx ON keyed_effects (tenant_id, key text_pattern_ops);
