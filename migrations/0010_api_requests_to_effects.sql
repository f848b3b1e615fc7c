-- The HTTP API's Idempotency-Key records move into keyed_effects (kind
-- api_request; see api.KindAPIRequest), claimed through the effects client
-- like every other effect. This copies the stored responses of finished
-- requests, so that a retry after the upgrade still replays its response,
-- under the key the API now derives: "<tenant>:idempotency:<key>", or
-- "<tenant>:idempotency-sha256:<hex of SHA-256 of the key>" when the key
-- holds ":" or the effect key would be over 255 bytes. The request hash is
-- the fingerprint, and the result is {"status":…,"body":"<the JSON body as
-- a string>"}. Claims of running requests are not copied: their holders
-- roll back or finish within their lease.
--
-- keyed_api_requests stays for now: during a rolling deploy the binaries
-- still running the old version keep claiming and storing there, and
-- dropping it would fail every POST they serve until they are replaced.
-- Drop it in a later release, once no binary older than this one runs.
-- On a partitioned keyed_effects (effects migration 2) the records go to
-- leaves, made first for the last two days, and a key already recorded is
-- skipped by NOT EXISTS (a partitioned table has no unique key to conflict
-- on; nothing else writes while migrations hold their lock).
DO $$
BEGIN
    IF to_regproc('keyed_effects_ensure_leaves') IS NOT NULL THEN
        PERFORM keyed_effects_ensure_leaves(interval '2 days', interval '0');
    END IF;
END
$$;
INSERT INTO keyed_effects (key, tenant_id, kind, state, owner, fingerprint, result, created_at, updated_at, finished_at)
SELECT CASE
           WHEN strpos(idempotency_key, ':') = 0 AND length(tenant_id || ':idempotency:' || idempotency_key) <= 255
           THEN tenant_id || ':idempotency:' || idempotency_key
           ELSE tenant_id || ':idempotency-sha256:' || encode(sha256(convert_to(idempotency_key, 'UTF8')), 'hex')
       END,
       tenant_id, 'api_request', 'succeeded', owner, request_hash,
       jsonb_build_object('status', status, 'body', convert_from(response, 'UTF8')),
       created_at, finished_at, finished_at
FROM keyed_api_requests r
WHERE state = 'done' AND NOT EXISTS (
    SELECT FROM keyed_effects e WHERE e.key = CASE
        WHEN strpos(r.idempotency_key, ':') = 0 AND length(r.tenant_id || ':idempotency:' || r.idempotency_key) <= 255
        THEN r.tenant_id || ':idempotency:' || r.idempotency_key
        ELSE r.tenant_id || ':idempotency-sha256:' || encode(sha256(convert_to(r.idempotency_key, 'UTF8')), 'hex')
    END);
