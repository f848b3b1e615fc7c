-- The claim's look-up reads each leaf by its key index whatever the
-- statistics say. The generated look-up of a kind in several classes
-- (its own, 'default' while its records may be there, 'legacy') sorted
-- the union by created_at under LIMIT 1, which let the planner walk every
-- leaf's (created_at, kind) index instead, a whole index per fresh key on
-- a leaf the planner took for empty. Now a kind in one class reads its
-- leaves with LIMIT 1 and no order, and a union is fenced (OFFSET 0) so
-- that only its few rows are sorted. The function is otherwise as in
-- migration 2, and is regenerated here for a partitioned table.

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
        IF v_probe LIKE '% UNION ALL %' THEN
            v_probe := format('SELECT * FROM (%s OFFSET 0) s ORDER BY 11 DESC', v_probe);
        END IF;
        v_probe := format(E'v_class := %L;\n        RETURN QUERY %s LIMIT 1;', l.class, v_probe);
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


DO $$
BEGIN
    IF (SELECT c.relkind FROM pg_class c WHERE c.oid = 'keyed_effects'::regclass) = 'p' THEN
        PERFORM keyed_effects_use_partitioned_claim();
    END IF;
END
$$;
