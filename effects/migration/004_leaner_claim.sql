-- Cheaper claims on the partitioned table (measured in docs/benchmarks.md):
--
-- * A leaf has no CHECK constraint of its own any more. Migration 2 gave
--   each leaf a CHECK repeating its bounds so that ATTACH would not scan
--   it, but a new leaf is empty, and every INSERT and UPDATE of a leaf
--   parsed and planned that CHECK again. Leaves that hold the present or
--   the future lose it here; older ones keep it until they are retired.
--   A leaf's class and bounds are written in its comment instead, which
--   a leaf keeps when it is detached: DetachedLeaves reads them there.
-- * The claim inserts into the kind's class partition, which it already
--   knows, instead of routing through keyed_effects.

-- keyed_effects_leaf_comment is the comment of a leaf: its class and
-- bounds, in a form that reads back under any DateStyle and TimeZone.
CREATE OR REPLACE FUNCTION keyed_effects_leaf_comment(p_class text, p_lo timestamptz, p_hi timestamptz) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT format('keyed effect leaf: class %s, from %s to %s', p_class,
        to_char(p_lo AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'),
        to_char(p_hi AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'))
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
            EXECUTE format('CREATE TABLE %I (LIKE keyed_effects INCLUDING DEFAULTS INCLUDING CONSTRAINTS)', leaf);
            EXECUTE format('COMMENT ON TABLE %I IS %L', leaf, keyed_effects_leaf_comment(l.class, v_lo, v_hi));
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

-- keyed_effects_use_partitioned_claim (re)writes keyed_effects_claim for
-- the partitioned table from keyed_effect_lifetimes: the claim serialises
-- on the key with a transaction-scoped advisory lock, then, with a snapshot
-- taken after the lock, looks for the key in every class a record of that
-- kind may be in, and inserts only if none has it, into the kind's class
-- partition (one level of tuple routing, not two). Racers on one key run
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
    v_insert constant text := 'INSERT INTO %I AS e (key, tenant_id, kind, class, state, owner, fingerprint, '
        'lease_until) VALUES (p_key, p_tenant, p_kind, %L, ''claimed'', p_owner, p_fingerprint, '
        'now() + p_lease_us * interval ''1 microsecond'') RETURNING true, e.generation, e.attempts, e.lease_until, '
        '''''::text, ''''::text, ''''::text, NULL::jsonb, ''''::text, ''''::text, e.created_at, true, '
        'e.tableoid::regclass::text';
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
        IF v_probe LIKE '% UNION ALL %' THEN
            v_probe := format('SELECT * FROM (%s OFFSET 0) s ORDER BY 11 DESC', v_probe);
        END IF;
        v_probe := format(E'RETURN QUERY %s LIMIT 1;\n        IF NOT FOUND THEN\n            RETURN QUERY ', v_probe)
            || format(v_insert, 'keyed_effects_' || l.class, l.class) || E';\n        END IF;';
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


-- Every leaf, attached or left detached by a killed Retire, gets its
-- comment from its CHECK (COMMENT waits for no claim). Then the leaves that
-- take inserts now or will lose the CHECK: each is locked for a moment,
-- and one that a long transaction holds keeps it (lock_timeout), which
-- costs only speed.
DO $$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT c.relname, m.b[1] AS class, m.b[2]::timestamptz AS lo, m.b[3]::timestamptz AS hi
             FROM pg_class c JOIN pg_constraint k ON k.conrelid = c.oid AND k.contype = 'c'
             CROSS JOIN LATERAL regexp_match(pg_get_constraintdef(k.oid),
                 $re$class = '([^']+)'::text\) AND \(created_at >= '([^']+)'::timestamp with time zone\) AND \(created_at < '([^']+)'$re$) m(b)
             WHERE c.relnamespace = (SELECT n.oid FROM pg_namespace n WHERE n.nspname = current_schema())
                 AND c.relkind = 'r' AND c.relname LIKE 'keyed\_effects\_%' AND m.b IS NOT NULL
    LOOP
        EXECUTE format('COMMENT ON TABLE %I IS %L', r.relname,
            keyed_effects_leaf_comment(r.class, r.lo, r.hi));
    END LOOP;
END
$$;

DO $$
DECLARE
    r      record;
    v_wait text := current_setting('lock_timeout');
BEGIN
    FOR r IN SELECT c.relname AS leaf, k.conname
             FROM pg_class c JOIN pg_constraint k ON k.conrelid = c.oid AND k.contype = 'c'
             JOIN pg_inherits i ON i.inhrelid = c.oid JOIN pg_class p ON p.oid = i.inhparent
             CROSS JOIN LATERAL (SELECT b.hi FROM keyed_effects_leaf_bounds(p.relname::text) b WHERE b.leaf = c.relname::text) b
             WHERE c.relnamespace = (SELECT n.oid FROM pg_namespace n WHERE n.nspname = current_schema())
                 AND p.relname LIKE 'keyed\_effects\_%' AND k.conname = c.relname || '_check' AND b.hi > now()
    LOOP
        BEGIN
            PERFORM set_config('lock_timeout', '200ms', true);
            EXECUTE format('ALTER TABLE %I DROP CONSTRAINT %I', r.leaf, r.conname);
        EXCEPTION WHEN lock_not_available OR deadlock_detected THEN
            RAISE NOTICE 'effect leaf % keeps its CHECK: it is in use', r.leaf;
        END;
    END LOOP;
    PERFORM set_config('lock_timeout', v_wait, true);
END
$$;

DO $$
BEGIN
    IF (SELECT c.relkind FROM pg_class c WHERE c.oid = 'keyed_effects'::regclass) = 'p' THEN
        PERFORM keyed_effects_use_partitioned_claim();
    END IF;
END
$$;
