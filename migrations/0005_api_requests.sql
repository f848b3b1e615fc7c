-- keyed_api_requests holds one row per (tenant, Idempotency-Key) sent to the
-- HTTP API: who holds the key while the request runs, a hash of the
-- canonical request, and, once it succeeded, the response to replay. The
-- primary key is the guard: a request claims its key with
-- INSERT ... ON CONFLICT DO NOTHING. The tenant is part of the key, so one
-- tenant can neither replay nor block another's requests.
--
-- The response is the status and the JSON body only: no request headers, no
-- API keys, no card data.
CREATE TABLE keyed_api_requests (
    tenant_id       text        NOT NULL,
    idempotency_key text        NOT NULL,
    route           text        NOT NULL,
    request_hash    text        NOT NULL,
    state           text        NOT NULL CHECK (state IN ('running', 'done')),
    owner           text        NOT NULL,
    locked_until    timestamptz,
    status          integer,
    response        bytea,
    created_at      timestamptz NOT NULL DEFAULT now(),
    finished_at     timestamptz,
    PRIMARY KEY (tenant_id, idempotency_key),
    CHECK (length(idempotency_key) BETWEEN 1 AND 255),
    CHECK (state <> 'running' OR locked_until IS NOT NULL),
    CHECK (state <> 'done' OR (status IS NOT NULL AND response IS NOT NULL AND finished_at IS NOT NULL))
);

-- Prune walks finished requests by age, and abandoned claims by lease.
CREATE INDEX keyed_api_requests_finished_idx ON keyed_api_requests (finished_at) WHERE state = 'done';
CREATE INDEX keyed_api_requests_abandoned_idx ON keyed_api_requests (locked_until) WHERE state = 'running';
