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
CREATE TABLE IF NOT EXISTS keyed_effect_lifetimes (
    kind   text        COLLATE "C" PRIMARY KEY,
    class  text        NOT NULL UNIQUE CHECK (class ~ '^[a-z][a-z0-9_]{0,23}$' AND class <> 'legacy'),
    keep   interval    NOT NULL CHECK (keep >= interval '1 hour'),
    width  interval    NOT NULL CHECK (width >= interval '1 hour' AND width <= interval '366 days'),
    since  timestamptz NOT NULL DEFAULT now()
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

-- keyed_effects_use_partitioned_claim replaces keyed_effects_claim with the
-- partitioned claim: it serialises on the key with a transaction-scoped
-- advisory lock, then, with a snapshot taken after the lock, looks for the
-- key in every class a record of that kind may be in, and inserts only if
-- none has it. Racers on one key run one after the other; the second sees
-- the first's committed record.
CREATE OR REPLACE FUNCTION keyed_effects_use_partitioned_claim() RETURNS void
LANGUAGE plpgsql AS $outer$
BEGIN
    CREATE OR REPLACE FUNCTION keyed_effects_claim(p_key text, p_tenant text, p_kind text, p_owner text,
        p_fingerprint text, p_lease_us bigint, p_async boolean)
    RETURNS TABLE (inserted boolean, generation bigint, attempts integer, lease_until timestamptz, state text,
        owner text, fingerprint text, result jsonb, error_code text, error_message text, created_at timestamptz,
        live boolean, leaf text)
    LANGUAGE plpgsql AS $$
    #variable_conflict use_column
    DECLARE
        v_class text;
        v_probe text[];
        v_c     text;
        v_sql   text;
    BEGIN
        IF p_async THEN
            PERFORM set_config('synchronous_commit', 'off', true);
        END IF;
        IF current_setting('transaction_isolation') <> 'read committed' THEN
            RAISE EXCEPTION 'keyed effect claims need READ COMMITTED, not %', current_setting('transaction_isolation')
                USING ERRCODE = 'feature_not_supported';
        END IF;
        PERFORM pg_advisory_xact_lock(1801, hashtext(p_key));
        -- keyed_effects_class, inlined: one query instead of a call and two.
        SELECT coalesce(l.class, 'default'),
            CASE WHEN l.class IS NULL THEN ARRAY['default', 'legacy']
                 WHEN l.since > now() - d.keep - 2 * d.width THEN ARRAY[l.class, 'default', 'legacy']
                 ELSE ARRAY[l.class, 'legacy'] END
        INTO v_class, v_probe
        FROM keyed_effect_lifetimes d LEFT JOIN keyed_effect_lifetimes l ON l.kind = p_kind AND p_kind <> ''
        WHERE d.kind = '';
        -- The look-up names each class's partition, so that it plans and
        -- locks only that class's leaves, not every leaf of the table.
        v_sql := NULL;
        FOREACH v_c IN ARRAY v_probe LOOP
            IF to_regclass('keyed_effects_' || v_c) IS NOT NULL THEN
                v_sql := coalesce(v_sql || ' UNION ALL ', '') || format(
                    'SELECT false, e.generation, e.attempts, e.lease_until, e.state, e.owner, e.fingerprint, e.result, '
                    'coalesce(e.error_code, %L), coalesce(e.error_message, %L), e.created_at, '
                    'coalesce(e.lease_until > now(), false), e.tableoid::regclass::text FROM %I e WHERE e.key = $1',
                    '', '', 'keyed_effects_' || v_c);
            END IF;
        END LOOP;
        RETURN QUERY EXECUTE v_sql || ' ORDER BY 11 DESC LIMIT 1' USING p_key;
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
    $$;
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
