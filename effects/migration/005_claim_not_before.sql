-- A claim can be told when its key could first have been claimed
-- (effects.ClaimParams.NotBefore, such as the creation time of the order
-- the key derives from), and then looks for the key only in the leaves that
-- hold records created from an hour before that time on: with a lifetime
-- cut into many leaves, a fresh key's look-up costs one or two leaves
-- instead of every leaf of its class (docs/design.md, "A claim told when
-- its key was born"). Without it the claim looks in every leaf, as before.
--
-- keyed_effects_claim gains an eighth argument, p_not_before; -infinity
-- means unknown. The seven-argument function that code from before this
-- migration calls stays, as a wrapper passing -infinity, so a rolling
-- deploy keeps claiming. The partitioned claim plans its statements once,
-- generically (plan_cache_mode), and Postgres skips the leaves the bound
-- rules out when each runs: a plan made for one bound, as a custom plan
-- is, may read the key's leaves by their (created_at, kind) index, which
-- is a scan of the newest leaf per claim.
--
-- A bound more than an hour later than the claim's statement began is
-- refused (invalid_parameter_value): it cannot be when a business record
-- the claim read was created. A bound up to an hour ahead (a clock that
-- differs between two database servers after a failover) counts as the
-- claim's own time.

-- keyed_effects_claim_without_bound makes keyed_effects_claim's seven-
-- argument form a wrapper of the eight-argument one that looks in every
-- leaf.
CREATE OR REPLACE FUNCTION keyed_effects_claim_without_bound() RETURNS void
LANGUAGE plpgsql AS $outer$
BEGIN
    EXECUTE $f$
    CREATE OR REPLACE FUNCTION keyed_effects_claim(p_key text, p_tenant text, p_kind text, p_owner text,
        p_fingerprint text, p_lease_us bigint, p_async boolean)
    RETURNS TABLE (inserted boolean, generation bigint, attempts integer, lease_until timestamptz, state text,
        owner text, fingerprint text, result jsonb, error_code text, error_message text, created_at timestamptz,
        live boolean, leaf text)
    LANGUAGE sql AS $w$
        SELECT * FROM keyed_effects_claim(p_key, p_tenant, p_kind, p_owner, p_fingerprint, p_lease_us, p_async,
            '-infinity'::timestamptz)
    $w$$f$;
END
$outer$;

-- keyed_effects_claim, for the unpartitioned table, with the bound: a
-- single index holds every key, so the bound is only checked. The
-- seven-argument form of migration 2 stays as it is for this layout.
CREATE OR REPLACE FUNCTION keyed_effects_claim(p_key text, p_tenant text, p_kind text, p_owner text,
    p_fingerprint text, p_lease_us bigint, p_async boolean, p_not_before timestamptz)
RETURNS TABLE (inserted boolean, generation bigint, attempts integer, lease_until timestamptz, state text,
    owner text, fingerprint text, result jsonb, error_code text, error_message text, created_at timestamptz,
    live boolean, leaf text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    IF p_not_before > statement_timestamp() + interval '1 hour' THEN
        RAISE EXCEPTION 'keyed effect claim: not_before % is later than the claim', p_not_before
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
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
-- the partitioned table from keyed_effect_lifetimes, as in migration 4,
-- with the bound: the look-up in the kind's own class reads only the
-- leaves that hold records created from an hour before p_not_before (or
-- before the claim, if earlier) on: the hour covers a claim inside a
-- transaction begun before the record it names was created, and clocks
-- that differ or step back. 'default' and 'legacy' are read whole. It then makes the seven-argument form the wrapper.
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
    v_since  constant text := ' AND e.created_at >= v_from';
    v_insert constant text := 'INSERT INTO %I AS e (key, tenant_id, kind, class, state, owner, fingerprint, '
        'lease_until) VALUES (p_key, p_tenant, p_kind, %L, ''claimed'', p_owner, p_fingerprint, '
        'now() + p_lease_us * interval ''1 microsecond'') RETURNING true, e.generation, e.attempts, e.lease_until, '
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

DO $$
BEGIN
    IF (SELECT c.relkind FROM pg_class c WHERE c.oid = 'keyed_effects'::regclass) = 'p' THEN
        PERFORM keyed_effects_use_partitioned_claim();
    END IF;
END
$$;
