-- A told claim that can insert first inside one leaf (migration 6) may be
-- sent by effects.Client as a plain statement, not through the claim
-- function: an INSERT ... ON CONFLICT DO NOTHING into the leaf by name
-- under the key's lock, which Postgres runs without a PL/pgSQL call
-- (docs/design.md, "Claiming from Go"). The client learns the leaves from
-- keyed_effects_claim_leaves() and may hold a stale picture of them, so the
-- statement inserts only if keyed_effects_claim_leaf, written with the claim
-- function from the same lifetimes and leaves, says the claim function would
-- have taken that leaf's shortcut; otherwise, and on a conflict, the client
-- calls the claim function. Both are SQL functions that Postgres inlines:
-- the guard costs a few comparisons, and writing it again replans every
-- statement that uses it.

-- keyed_effects_time_literal spells t as a timestamptz literal that reads
-- back the same under any TimeZone and DateStyle.
CREATE OR REPLACE FUNCTION keyed_effects_time_literal(t timestamptz) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT quote_literal(to_char(t AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')) || '::timestamptz'
$$;

-- keyed_effects_write_claim_leaves (re)writes, where they differ from the
-- given ones, the guard keyed_effects_claim_leaf (p_guard: a boolean
-- expression of p_kind, p_class, p_leaf and p_not_before) and the picture
-- keyed_effects_claim_leaves (p_rows: rows of kind, class, leaf, lo, hi,
-- each after a comma; a kind with no leaf to insert into first has a NULL
-- leaf; the kind '' stands for every kind not listed).
CREATE OR REPLACE FUNCTION keyed_effects_write_claim_leaves(p_guard text, p_rows text) RETURNS void
LANGUAGE plpgsql AS $outer$
DECLARE
    v_guard text := E'\n    SELECT ' || p_guard || E'\n';
    v_rows  text := E'\n    SELECT v.kind, v.class, v.leaf, v.lo, v.hi FROM (VALUES\n    '
        || '(NULL::text, NULL::text, NULL::text, NULL::timestamptz, NULL::timestamptz)' || p_rows
        || E') v (kind, class, leaf, lo, hi) WHERE v.kind IS NOT NULL\n';
BEGIN
    IF v_guard IS DISTINCT FROM (SELECT p.prosrc FROM pg_proc p
            WHERE p.oid = to_regprocedure('keyed_effects_claim_leaf(text,text,text,timestamptz)')) THEN
        EXECUTE format($f$
        CREATE OR REPLACE FUNCTION keyed_effects_claim_leaf(p_kind text, p_class text, p_leaf text,
            p_not_before timestamptz) RETURNS boolean LANGUAGE sql VOLATILE AS %L$f$, v_guard);
    END IF;
    IF v_rows IS DISTINCT FROM (SELECT p.prosrc FROM pg_proc p
            WHERE p.oid = to_regprocedure('keyed_effects_claim_leaves()')) THEN
        EXECUTE format($f$
        CREATE OR REPLACE FUNCTION keyed_effects_claim_leaves()
            RETURNS TABLE (kind text, class text, leaf text, lo timestamptz, hi timestamptz)
            LANGUAGE sql STABLE AS %L$f$, v_rows);
    END IF;
END
$outer$;

-- On the unpartitioned table no claim inserts first: the guard refuses
-- every claim and the picture is empty. keyed_effects_partition's call of
-- keyed_effects_use_partitioned_claim writes them for the leaves.
SELECT keyed_effects_write_claim_leaves('false', '')
WHERE to_regprocedure('keyed_effects_claim_leaf(text,text,text,timestamptz)') IS NULL;

-- keyed_effects_use_partitioned_claim is migration 6's, and writes the
-- guard and the picture from the same leaves as the claim function's
-- shortcuts: a kind whose look-up reads more than its class has none.
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
    v_fast   text;
    v_src    text;
    v_gcases text := '';
    v_gleaf  text;
    v_gelse  text := 'false';
    v_rows   text := '';
    b        record;
    v_look   constant text := 'SELECT false, e.generation, e.attempts, e.lease_until, e.state, e.owner, '
        'e.fingerprint, e.result, coalesce(e.error_code, ''''), coalesce(e.error_message, ''''), e.created_at, '
        'coalesce(e.lease_until > now(), false), e.tableoid::regclass::text FROM %I e WHERE e.key = p_key';
    v_since  constant text := ' AND e.created_at >= v_from';
    v_cond   constant text := 'least(p_not_before, statement_timestamp()) - interval ''1 hour'' >= %1$s '
        'AND now() >= %1$s AND now() < %2$s AND clock_timestamp() + interval ''1 hour'' < %2$s '
        'AND p_not_before <= statement_timestamp() + interval ''1 hour'' '
        'AND current_setting(''transaction_isolation'') = ''read committed''';
    v_insert constant text := 'INSERT INTO %I AS e (key, tenant_id, kind, class, state, owner, fingerprint, '
        'lease_until) VALUES (p_key, p_tenant, p_kind, %L, ''claimed'', p_owner, p_fingerprint, '
        'now() + p_lease_us * interval ''1 microsecond'')%s RETURNING true, e.generation, e.attempts, e.lease_until, '
        '''''::text, ''''::text, ''''::text, NULL::jsonb, ''''::text, ''''::text, e.created_at, true, '
        'e.tableoid::regclass::text';
BEGIN
    SELECT k.keep, k.width INTO d FROM keyed_effect_lifetimes k WHERE k.kind = '';
    FOR l IN SELECT k.kind, k.class, k.since, k.apart FROM keyed_effect_lifetimes k ORDER BY k.kind DESC LOOP
        v_probe := format(v_look, 'keyed_effects_' || l.class) || v_since;
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
        v_fast := '';
        v_gleaf := '';
        IF v_probe NOT LIKE '% UNION ALL %' THEN
            FOR b IN SELECT x.leaf, x.lo, x.hi FROM keyed_effects_leaf_bounds('keyed_effects_' || l.class) x
                     WHERE x.hi > now() ORDER BY x.lo LOOP
                v_fast := v_fast || format(E'IF v_from >= %1$s AND now() >= %1$s AND now() < %2$s\n'
                    || E'           AND clock_timestamp() + interval ''1 hour'' < %2$s THEN\n'
                    || E'            RETURN QUERY %3$s;\n'
                    || E'            IF NOT FOUND THEN\n'
                    || E'                RETURN QUERY %4$s LIMIT 1;\n'
                    || E'            END IF;\n'
                    || E'            RETURN;\n'
                    || E'        END IF;\n        ',
                    keyed_effects_time_literal(b.lo), keyed_effects_time_literal(b.hi),
                    format(v_insert, b.leaf, l.class, ' ON CONFLICT DO NOTHING'),
                    format(v_look, b.leaf));
                v_gleaf := v_gleaf || format(E'\n        WHEN %L THEN p_class = %L AND %s', b.leaf, l.class,
                    format(v_cond, keyed_effects_time_literal(b.lo), keyed_effects_time_literal(b.hi)));
                v_rows := v_rows || format(E',\n    (%L, %L, %L, %s, %s)', l.kind, l.class, b.leaf,
                    keyed_effects_time_literal(b.lo), keyed_effects_time_literal(b.hi));
            END LOOP;
        END IF;
        IF v_gleaf = '' THEN
            v_gleaf := 'false';
            v_rows := v_rows || format(E',\n    (%L, %L, NULL, NULL, NULL)', l.kind, l.class);
        ELSE
            v_gleaf := E'CASE p_leaf' || v_gleaf || E'\n        ELSE false END';
        END IF;
        IF l.kind = '' THEN
            v_gelse := v_gleaf;
        ELSE
            v_gcases := v_gcases || format(E'\n    WHEN %L THEN ', l.kind) || v_gleaf;
        END IF;
        IF v_probe LIKE '% UNION ALL %' THEN
            v_probe := format('SELECT * FROM (%s OFFSET 0) s ORDER BY 11 DESC', v_probe);
        END IF;
        v_probe := v_fast || format(E'RETURN QUERY %s LIMIT 1;\n        IF NOT FOUND THEN\n            RETURN QUERY ', v_probe)
            || format(v_insert, 'keyed_effects_' || l.class, l.class, '') || E';\n        END IF;';
        IF l.kind = '' THEN
            v_else := v_probe;
        ELSE
            v_cases := v_cases || format(E'\n    WHEN %L THEN\n        ', l.kind) || v_probe;
        END IF;
    END LOOP;
    PERFORM keyed_effects_write_claim_leaves(
        CASE WHEN v_gcases = '' THEN v_gelse ELSE 'CASE p_kind' || v_gcases || E'\n    ELSE ' || v_gelse || E'\n    END' END,
        v_rows);
    IF v_cases <> '' THEN
        v_else := 'CASE p_kind' || v_cases || E'\n    ELSE\n        ' || v_else || E'\n    END CASE;';
    END IF;
    v_src := format($src$
#variable_conflict use_column
DECLARE
    v_from timestamptz := least(p_not_before, statement_timestamp()) - interval '1 hour';
BEGIN
    IF p_not_before > statement_timestamp() + interval '1 hour' THEN
        RAISE EXCEPTION 'keyed effect claim: not_before %% is later than the claim', p_not_before
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
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
            WHERE p.oid = to_regprocedure('keyed_effects_claim(text,text,text,text,text,bigint,boolean,timestamptz)'))
       AND (SELECT p.prolang FROM pg_proc p WHERE p.oid = to_regprocedure('keyed_effects_claim(text,text,text,text,text,bigint,boolean)'))
           = (SELECT g.oid FROM pg_language g WHERE g.lanname = 'sql') THEN
        RETURN;
    END IF;
    EXECUTE format($f$
    CREATE OR REPLACE FUNCTION keyed_effects_claim(p_key text, p_tenant text, p_kind text, p_owner text,
        p_fingerprint text, p_lease_us bigint, p_async boolean, p_not_before timestamptz)
    RETURNS TABLE (inserted boolean, generation bigint, attempts integer, lease_until timestamptz, state text,
        owner text, fingerprint text, result jsonb, error_code text, error_message text, created_at timestamptz,
        live boolean, leaf text)
    LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS %L$f$, v_src);
    PERFORM keyed_effects_claim_without_bound();
END
$outer$;

SELECT keyed_effects_refresh_claim();
