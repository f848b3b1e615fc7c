-- A told claim whose window lies inside one leaf inserts first: when the
-- records its key can have (created from an hour before the bound, or the
-- claim, on; to an hour after the moment it holds the key's lock) all fall
-- in the leaf its own record goes to, that leaf's unique index alone orders
-- the key, so the claim sends INSERT ... ON CONFLICT DO NOTHING to that
-- leaf by name (no routing through the class) and reads the record only on
-- a conflict, instead of a look-up before every insert (docs/design.md,
-- "Inserting first inside one leaf"). The claim function names each
-- current and future leaf and its bounds for this, so it is written
-- again whenever leaves are made (keyed_effects_refresh_claim, which
-- effects.Client.EnsureLeaves calls); a claim past every leaf it names, an
-- untold claim, and a kind whose look-up reads more than its class take the
-- look-up as before.

-- keyed_effects_use_partitioned_claim (re)writes keyed_effects_claim for
-- the partitioned table from keyed_effect_lifetimes, as in migration 5,
-- with the insert first inside one leaf: for each leaf of a kind's class
-- that ends after now, a told claim whose window lies inside it inserts
-- into it first. Otherwise, as in migration 5, the look-up in the kind's own class
-- reads only the leaves that hold records created from an hour before
-- p_not_before (or before the claim, if earlier) on: the hour covers a
-- claim inside a transaction begun before the record it names was
-- created, and clocks that differ or step back. 'default' and 'legacy' are
-- read whole. It then makes the seven-argument form the wrapper.
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
    b        record;
    v_look   constant text := 'SELECT false, e.generation, e.attempts, e.lease_until, e.state, e.owner, '
        'e.fingerprint, e.result, coalesce(e.error_code, ''''), coalesce(e.error_message, ''''), e.created_at, '
        'coalesce(e.lease_until > now(), false), e.tableoid::regclass::text FROM %I e WHERE e.key = p_key';
    v_since  constant text := ' AND e.created_at >= v_from';
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
                    quote_literal(to_char(b.lo AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')) || '::timestamptz',
                    quote_literal(to_char(b.hi AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')) || '::timestamptz',
                    format(v_insert, b.leaf, l.class, ' ON CONFLICT DO NOTHING'),
                    format(v_look, b.leaf));
            END LOOP;
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

-- keyed_effects_refresh_claim writes keyed_effects_claim again from the
-- lifetimes and the leaves there are now, under the lock that orders the
-- makers of leaves (two concurrent rewrites of one function would fail);
-- on an unpartitioned table it does nothing.
CREATE OR REPLACE FUNCTION keyed_effects_refresh_claim() RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('keyed.effects.leaves:' || current_schema(), 0));
    IF (SELECT c.relkind FROM pg_class c WHERE c.oid = 'keyed_effects'::regclass) = 'p' THEN
        PERFORM keyed_effects_use_partitioned_claim();
    END IF;
END
$$;

SELECT keyed_effects_refresh_claim();
