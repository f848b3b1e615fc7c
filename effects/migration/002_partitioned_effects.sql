-- Partitioned effect records: keyed_effects becomes a table partitioned by
-- lifetime class (LIST on class), each class partitioned by time (RANGE on
-- created_at) into leaves as wide as the class's width. Retention drops
-- whole leaves; docs/design.md ("Partitioned effect records") gives the
-- argument for global key uniqueness.
--
-- A new install (an empty keyed_effects) is converted here. A table with
-- records keeps its layout until keyed_effects_partition() is called
-- (effects.Partition, `starter effects partition`), which converts it
-- online: the old table becomes the 'legacy' class partition.

-- keyed_effect_lifetimes is the one table of kinds and how long their
-- records are kept. The row with kind '' covers every kind not listed.
-- A kind's class and width are fixed once it has leaves; keep may change.
-- apart is set once no record of the kind can be in 'default' (see
-- keyed_effects_use_partitioned_claim).
CREATE TABLE IF NOT EXISTS keyed_effect_lifetimes (
    kind   text        COLLATE "C" PRIMARY KEY,
    class  text        NOT NULL UNIQUE CHECK (class ~ '^[a-z][a-z0-9_]{0,23}$' AND class <> 'legacy'),
    keep   interval    NOT NULL CHECK (keep >= interval '1 hour'),
    width  interval    NOT NULL CHECK (width >= interval '1 hour' AND width <= interval '366 days'),
    since  timestamptz NOT NULL DEFAULT now(),
    apart  boolean     NOT NULL DEFAULT false
);
INSERT INTO keyed_effect_lifetimes (kind, class, keep, width)
VALUES ('', 'default', interval '30 days', interval '1 day')
ON CONFLICT (kind) DO NOTHING;

-- The class column: every record of the unpartitioned table is 'legacy'.
-- A constant default adds it without rewriting the table.
ALTER TABLE keyed_effects ADD COLUMN IF NOT EXISTS class text NOT NULL DEFAULT 'legacy';

-- keyed_effects_class gives the class a kind's new records go to and the
-- classes a claim of that kind must look in: its own, 'legacy' while the
-- legacy partition exists, and 'default' while default leaves older than
-- the kind's lifetime row may hold its records.
CREATE OR REPLACE FUNCTION keyed_effects_class(p_kind text, OUT class text, OUT probe text[])
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_since timestamptz;
    d_keep  interval;
    d_width interval;
BEGIN
    SELECT l.class, l.since INTO class, v_since FROM keyed_effect_lifetimes l WHERE l.kind = p_kind;
    SELECT l.keep, l.width INTO d_keep, d_width FROM keyed_effect_lifetimes l WHERE l.kind = '';
    IF class IS NULL THEN
        class := 'default';
        probe := ARRAY['default', 'legacy'];
    ELSIF v_since > now() - d_keep - 2 * d_width THEN
        probe := ARRAY[class, 'default', 'legacy'];
    ELSE
        probe := ARRAY[class, 'legacy'];
    END IF;
END
$$;

-- keyed_effects_leaf_start is the start of the leaf of a class of the given
-- width that holds time t: leaves are aligned to whole widths since the
-- Unix epoch, so every process computes the same bounds.
CREATE OR REPLACE FUNCTION keyed_effects_leaf_start(p_width interval, t timestamptz) RETURNS timestamptz
LANGUAGE sql IMMUTABLE AS $$
    SELECT to_timestamp(floor(extract(epoch FROM t) / extract(epoch FROM p_width)) * extract(epoch FROM p_width))
$$;

-- keyed_effects_leaf_bounds lists the leaves of a class partition with
-- their bounds.
CREATE OR REPLACE FUNCTION keyed_effects_leaf_bounds(p_parent text)
RETURNS TABLE (leaf text, lo timestamptz, hi timestamptz) LANGUAGE sql STABLE AS $$
    SELECT c.relname::text,
        (regexp_match(pg_get_expr(c.relpartbound, c.oid), 'FROM \(''([^'']+)''\)'))[1]::timestamptz,
        (regexp_match(pg_get_expr(c.relpartbound, c.oid), 'TO \(''([^'']+)''\)'))[1]::timestamptz
    FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
    WHERE i.inhparent = to_regclass(quote_ident(p_parent))
$$;

-- keyed_effects_ensure_leaves creates, for every class, its partition and
-- leaves covering the time from now() - p_behind to now() + p_ahead. Leaves
-- are aligned to whole widths since the Unix epoch, so every process
-- computes the same bounds; where a class's existing leaves (of an earlier
-- width) cover part of a leaf, the new leaf is cut to the part they leave.
-- It returns the leaves it created and takes a lock against concurrent
-- callers.
CREATE OR REPLACE FUNCTION keyed_effects_ensure_leaves(p_behind interval, p_ahead interval)
RETURNS SETOF text LANGUAGE plpgsql AS $$
DECLARE
    l      record;
    v_lo     timestamptz;
    v_hi     timestamptz;
    a      timestamptz;
    b      timestamptz;
    leaf   text;
    parent text;
BEGIN
    IF (SELECT c.relkind FROM pg_class c WHERE c.oid = 'keyed_effects'::regclass) <> 'p' THEN
        RETURN;
    END IF;
    PERFORM pg_advisory_xact_lock(hashtextextended('keyed.effects.leaves:' || current_schema(), 0));
    FOR l IN SELECT * FROM keyed_effect_lifetimes ORDER BY class LOOP
        parent := 'keyed_effects_' || l.class;
        -- New tables are created apart and attached: ATTACH takes only a
        -- SHARE UPDATE EXCLUSIVE lock on the parent, which claims (ROW
        -- EXCLUSIVE) do not wait for, where CREATE TABLE ... PARTITION OF
        -- would take an exclusive one and could deadlock with a claiming
        -- transaction.
        IF to_regclass(quote_ident(parent)) IS NULL THEN
            EXECUTE format('CREATE TABLE %I (LIKE keyed_effects INCLUDING DEFAULTS INCLUDING CONSTRAINTS) PARTITION BY RANGE (created_at)', parent);
            EXECUTE format('ALTER TABLE keyed_effects ATTACH PARTITION %I FOR VALUES IN (%L)', parent, l.class);
        END IF;
        v_lo := keyed_effects_leaf_start(l.width, now() - p_behind);
        WHILE v_lo <= now() + p_ahead LOOP
            -- Step over an existing leaf (of this width or an earlier one).
            SELECT x.hi INTO b FROM keyed_effects_leaf_bounds(parent) x WHERE x.lo <= v_lo AND x.hi > v_lo;
            IF b IS NOT NULL THEN
                v_lo := b;
                CONTINUE;
            END IF;
            -- The rest of the aligned slot holding v_lo, up to the next leaf.
            SELECT min(x.lo) INTO a FROM keyed_effects_leaf_bounds(parent) x WHERE x.lo > v_lo;
            v_hi := least(keyed_effects_leaf_start(l.width, v_lo) + l.width, a);
            leaf := parent || '_' || to_char(v_lo AT TIME ZONE 'UTC', 'YYYYMMDDHH24MI');
            EXECUTE format('CREATE TABLE %I (LIKE keyed_effects INCLUDING DEFAULTS INCLUDING CONSTRAINTS, '
                'CHECK (class = %L AND created_at >= %L AND created_at < %L))', leaf, l.class, v_lo, v_hi);
            -- One record per key per leaf, and the lookup index; the
            -- claim's lock makes it one per key across leaves.
            EXECUTE format('CREATE UNIQUE INDEX %I ON %I (key)', leaf || '_key', leaf);
            EXECUTE format('CREATE INDEX %I ON %I (created_at, kind)', leaf || '_created', leaf);
            EXECUTE format('ALTER TABLE %I ATTACH PARTITION %I FOR VALUES FROM (%L) TO (%L)', parent, leaf, v_lo, v_hi);
            RETURN NEXT leaf;
            v_lo := v_hi;
        END LOOP;
    END LOOP;
END
$$;

-- keyed_effects_set_lifetimes upserts rows of keyed_effect_lifetimes and
-- creates the leaves of new classes in the same transaction, so that no
-- claim sees a kind's class before its leaves exist.
CREATE OR REPLACE FUNCTION keyed_effects_set_lifetimes(p_kinds text[], p_classes text[], p_keeps interval[],
    p_widths interval[], p_ahead interval) RETURNS SETOF text LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('keyed.effects.leaves:' || current_schema(), 0));
    INSERT INTO keyed_effect_lifetimes (kind, class, keep, width)
    SELECT * FROM unnest(p_kinds, p_classes, p_keeps, p_widths)
    ON CONFLICT (kind) DO UPDATE SET keep = excluded.keep, width = excluded.width;
    RETURN QUERY SELECT keyed_effects_ensure_leaves(interval '0', p_ahead);
    IF (SELECT c.relkind FROM pg_class c WHERE c.oid = 'keyed_effects'::regclass) = 'p' THEN
        PERFORM keyed_effects_use_partitioned_claim();
    END IF;
END
$$;

-- keyed_effects_partition converts an unpartitioned keyed_effects: the old
-- table is attached as the 'legacy' class partition (its CHECK validated
-- first, so the attach scans nothing), a partitioned parent takes its name,
-- and the claim function switches to the partitioned claim, all in the
-- caller's transaction. Claims wait on it for the brief exclusive locks.
CREATE OR REPLACE FUNCTION keyed_effects_partition() RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    IF (SELECT c.relkind FROM pg_class c WHERE c.oid = 'keyed_effects'::regclass) = 'p' THEN
        RETURN false;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_constraint WHERE conname = 'keyed_effects_legacy_class'
                   AND conrelid = 'keyed_effects'::regclass) THEN
        ALTER TABLE keyed_effects ADD CONSTRAINT keyed_effects_legacy_class CHECK (class = 'legacy') NOT VALID;
    END IF;
    ALTER TABLE keyed_effects VALIDATE CONSTRAINT keyed_effects_legacy_class;
    LOCK TABLE keyed_effects IN ACCESS EXCLUSIVE MODE;
    ALTER TABLE keyed_effects RENAME TO keyed_effects_legacy;
    -- The parent has the old table's columns and checks, under the same
    -- names (an attach matches checks by name), but not its class check.
    CREATE TABLE keyed_effects (LIKE keyed_effects_legacy INCLUDING DEFAULTS INCLUDING CONSTRAINTS)
        PARTITION BY LIST (class);
    ALTER TABLE keyed_effects DROP CONSTRAINT keyed_effects_legacy_class;
    ALTER TABLE keyed_effects ALTER COLUMN class SET DEFAULT 'default';
    IF EXISTS (SELECT FROM keyed_effects_legacy) THEN
        ALTER TABLE keyed_effects ATTACH PARTITION keyed_effects_legacy FOR VALUES IN ('legacy');
    ELSE
        DROP TABLE keyed_effects_legacy;
    END IF;
    PERFORM keyed_effects_ensure_leaves(interval '0', interval '2 days');
    PERFORM keyed_effects_use_partitioned_claim();
    RETURN true;
END
$$;

-- keyed_effects_claim, for the unpartitioned table: the claim of
-- effects.Client in one statement (see claimSQL's contract). The
-- partitioned version replaces it in keyed_effects_partition.
CREATE OR REPLACE FUNCTION keyed_effects_claim(p_key text, p_tenant text, p_kind text, p_owner text,
    p_fingerprint text, p_lease_us bigint, p_async boolean)
RETURNS TABLE (inserted boolean, generation bigint, attempts integer, lease_until timestamptz, state text,
    owner text, fingerprint text, result jsonb, error_code text, error_message text, created_at timestamptz,
    live boolean, leaf text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    IF p_async THEN
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
    RETURN QUERY
    WITH ins AS (
        INSERT INTO keyed_effects (key, tenant_id, kind, state, owner, fingerprint, lease_until)
        VALUES (p_key, p_tenant, p_kind, 'claimed', p_owner, p_fingerprint, now() + p_lease_us * interval '1 microsecond')
        ON CONFLICT (key) DO NOTHING
        RETURNING generation, attempts, lease_until, created_at, tableoid)
    SELECT true, i.generation, i.attempts, i.lease_until, '', '', '', NULL::jsonb, '', '', i.created_at, true, i.tableoid::regclass::text FROM ins i
    UNION ALL
    SELECT false, e.generation, e.attempts, e.lease_until, e.state, e.owner, e.fingerprint, e.result,
        coalesce(e.error_code, ''), coalesce(e.error_message, ''), e.created_at, coalesce(e.lease_until > now(), false), e.tableoid::regclass::text
    FROM keyed_effects e WHERE e.key = p_key AND NOT EXISTS (SELECT FROM ins);
END
$$;

-- keyed_effects_use_partitioned_claim (re)writes keyed_effects_claim for
-- the partitioned table from keyed_effect_lifetimes: the claim serialises
-- on the key with a transaction-scoped advisory lock, then, with a snapshot
-- taken after the lock, looks for the key in every class a record of that
-- kind may be in, and inserts only if none has it. Racers on one key run
-- one after the other; the second sees the first's committed record.
--
-- The function is generated so that each kind's look-up is a static query
-- naming its classes' partitions: it plans once per session and touches
-- only those leaves. It looks in 'legacy' while a converted table's
-- partition exists. A kind given a class of its own looks in 'default'
-- too, until its records there have expired (a constant cutoff) or it is
-- set apart: an hour after its row was written, once no transaction begun
-- before then is open (one might still run the claim that sent the kind to
-- 'default') and 'default' holds no record of the kind. A session whose
-- transactions this role cannot see counts as open. The function is
-- rewritten by keyed_effects_set_lifetimes and keyed_effects_partition,
-- and only when its text changes.
CREATE OR REPLACE FUNCTION keyed_effects_use_partitioned_claim() RETURNS void
LANGUAGE plpgsql AS $outer$
DECLARE
    d        record;
    l        record;
    v_cutoff timestamptz;
    v_legacy boolean := to_regclass('keyed_effects_legacy') IS NOT NULL;
    v_cases  text := '';
    v_else   text;
    v_probe  text;
    v_src    text;
    v_look   constant text := 'SELECT false, e.generation, e.attempts, e.lease_until, e.state, e.owner, '
        'e.fingerprint, e.result, coalesce(e.error_code, ''''), coalesce(e.error_message, ''''), e.created_at, '
        'coalesce(e.lease_until > now(), false), e.tableoid::regclass::text FROM %I e WHERE e.key = p_key';
BEGIN
    SELECT k.keep, k.width INTO d FROM keyed_effect_lifetimes k WHERE k.kind = '';
    FOR l IN SELECT k.kind, k.class, k.since, k.apart FROM keyed_effect_lifetimes k ORDER BY k.kind DESC LOOP
        v_probe := format(v_look, 'keyed_effects_' || l.class);
        v_cutoff := l.since + d.keep + 2 * d.width;
        IF l.kind <> '' AND NOT l.apart AND v_cutoff > now() AND now() > l.since + interval '1 hour'
           AND NOT EXISTS (SELECT FROM pg_stat_activity a WHERE a.datname = current_database()
                           AND a.backend_type = 'client backend' AND a.pid <> pg_backend_pid()
                           AND (a.xact_start < l.since + interval '1 hour' OR a.query = '<insufficient privilege>'))
           AND NOT EXISTS (SELECT FROM keyed_effects_default e WHERE e.kind = l.kind) THEN
            UPDATE keyed_effect_lifetimes SET apart = true WHERE kind = l.kind;
            l.apart := true;
        END IF;
        IF l.kind <> '' AND NOT l.apart AND v_cutoff > now() THEN
            v_probe := v_probe || ' UNION ALL ' || format(v_look, 'keyed_effects_default')
                || format(' AND now() < %L::timestamptz', v_cutoff);
        END IF;
        IF v_legacy THEN
            v_probe := v_probe || ' UNION ALL ' || format(v_look, 'keyed_effects_legacy');
        END IF;
        v_probe := format(E'v_class := %L;\n        RETURN QUERY %s ORDER BY 11 DESC LIMIT 1;', l.class, v_probe);
        IF l.kind = '' THEN
            v_else := v_probe;
        ELSE
            v_cases := v_cases || format(E'\n    WHEN %L THEN\n        ', l.kind) || v_probe;
        END IF;
    END LOOP;
    IF v_cases <> '' THEN
        v_else := 'CASE p_kind' || v_cases || E'\n    ELSE\n        ' || v_else || E'\n    END CASE;';
    END IF;
    v_src := format($src$
#variable_conflict use_column
DECLARE
    v_class text;
BEGIN
    IF p_async THEN
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'keyed effect claims need READ COMMITTED, not %%', current_setting('transaction_isolation')
            USING ERRCODE = 'feature_not_supported';
    END IF;
    PERFORM pg_advisory_xact_lock(1801, hashtext(p_key));
    %s
    IF FOUND THEN
        RETURN;
    END IF;
    RETURN QUERY
    INSERT INTO keyed_effects AS e (key, tenant_id, kind, class, state, owner, fingerprint, lease_until)
    VALUES (p_key, p_tenant, p_kind, v_class, 'claimed', p_owner, p_fingerprint,
        now() + p_lease_us * interval '1 microsecond')
    RETURNING true, e.generation, e.attempts, e.lease_until, ''::text, ''::text, ''::text, NULL::jsonb,
        ''::text, ''::text, e.created_at, true, e.tableoid::regclass::text;
END
$src$, v_else);
    IF v_src IS NOT DISTINCT FROM (SELECT p.prosrc FROM pg_proc p
            WHERE p.oid = to_regprocedure('keyed_effects_claim(text,text,text,text,text,bigint,boolean)')) THEN
        RETURN;
    END IF;
    EXECUTE format($f$
    CREATE OR REPLACE FUNCTION keyed_effects_claim(p_key text, p_tenant text, p_kind text, p_owner text,
        p_fingerprint text, p_lease_us bigint, p_async boolean)
    RETURNS TABLE (inserted boolean, generation bigint, attempts integer, lease_until timestamptz, state text,
        owner text, fingerprint text, result jsonb, error_code text, error_message text, created_at timestamptz,
        live boolean, leaf text)
    LANGUAGE plpgsql AS %L$f$, v_src);
END
$outer$;

-- A new install converts now; so does any empty table, unless the session
-- sets keyed.effects_partition to off (tests of the unpartitioned layout).
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM keyed_effects)
       AND current_setting('keyed.effects_partition', true) IS DISTINCT FROM 'off' THEN
        PERFORM keyed_effects_partition();
    END IF;
END
$$;
