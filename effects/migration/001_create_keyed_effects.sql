-- keyed_effects holds one row per effect key: the claim, its lease and, once
-- the effect has happened, its outcome. The primary key is the guard: a claim
-- is an INSERT ... ON CONFLICT DO NOTHING against it.
--
-- Keys begin with the tenant and are ASCII, so with the key in the "C"
-- collation (byte order) the primary key orders a tenant's records together
-- and serves List's prefix scan. Prune and ListKind read the created_at
-- index. No index covers a column that Complete, Fail, Extend or a takeover
-- changes, so those updates are HOT whenever the row's page has room.
--
-- This file is idempotent: a database created by keyed's app migrations 1, 6
-- and 9 before effects had its own migration line (with any prefix of those
-- applied) is brought to the same shape as a new one.
CREATE TABLE IF NOT EXISTS keyed_effects (
    key           text        COLLATE "C" PRIMARY KEY,
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

-- A table from app migration 1 has the key in the default collation.
-- Changing it rebuilds the primary key under an exclusive lock: seconds per
-- million records.
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_attribute a JOIN pg_collation c ON c.oid = a.attcollation
               WHERE a.attrelid = 'keyed_effects'::regclass AND a.attname = 'key' AND c.collname <> 'C') THEN
        ALTER TABLE keyed_effects ALTER COLUMN key TYPE text COLLATE "C";
    END IF;
END
$$;

-- Indexes of app migrations 1 and 6 that the primary key and the created_at
-- index replace.
DROP INDEX IF EXISTS keyed_effects_tenant_idx;
DROP INDEX IF EXISTS keyed_effects_finished_idx;
DROP INDEX IF EXISTS keyed_effects_kind_created_idx;

CREATE INDEX IF NOT EXISTS keyed_effects_created_idx ON keyed_effects (created_at, kind);
