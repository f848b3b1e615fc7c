package api_test

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/keyedhq/keyed/api"
	"github.com/keyedhq/keyed/migrations"
)

// Migration 0010 copies the responses stored in keyed_api_requests, the
// table of the API's own claim engine before it moved onto effects, so that
// a retry after the upgrade still replays, or gets 422 for another request.
func TestStoredResponsesMoveToEffects(t *testing.T) {
	t.Parallel()
	b := setup(t)
	body := orderBody("ord_legacy", 700)
	first := b.do(t, "POST", "/v1/orders", b.keyA, "seed", body)
	require.Equal(t, http.StatusCreated, first.status, "%s", first.body)
	var hash string
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT fingerprint FROM keyed_effects WHERE key = $1`,
		requestKey(t, b.tenantA, "seed")).Scan(&hash))

	// As the old version stored them: one key with ":", which the API
	// hashes, and a plain one.
	for _, k := range []string{"legacy:1", "legacy-2"} {
		_, err := b.pool.Exec(b.ctx, `INSERT INTO keyed_api_requests
			(tenant_id, idempotency_key, route, request_hash, state, owner, status, response, finished_at)
			VALUES ($1, $2, $3, $4, 'done', 'old-owner', 201, $5, now())`, b.tenantA, k, api.RouteCreateOrder, hash, first.body)
		require.NoError(t, err)
	}
	_, err := b.pool.Exec(b.ctx, `INSERT INTO keyed_api_requests (tenant_id, idempotency_key, route, request_hash, state, owner, locked_until)
		VALUES ($1, 'legacy-running', $2, $3, 'running', 'old-owner', now() + interval '30 seconds')`, b.tenantA, api.RouteCreateOrder, hash)
	require.NoError(t, err)
	all, err := migrations.All()
	require.NoError(t, err)
	require.Equal(t, 10, all[9].Version)
	_, err = b.pool.Exec(b.ctx, all[9].SQL)
	require.NoError(t, err)

	for _, k := range []string{"legacy:1", "legacy-2"} {
		r := b.do(t, "POST", "/v1/orders", b.keyA, k, body)
		require.Equal(t, http.StatusCreated, r.status, "%s: %s", k, r.body)
		require.Equal(t, "true", r.header.Get(api.HeaderReplayed), k)
		require.Equal(t, string(first.body), string(r.body), k)
	}
	r := b.do(t, "POST", "/v1/orders", b.keyA, "legacy-2", orderBody("ord_legacy", 701))
	require.Equal(t, http.StatusUnprocessableEntity, r.status, "%s", r.body)
	r = b.do(t, "POST", "/v1/orders", b.keyA, "legacy-running", body)
	require.Equal(t, http.StatusOK, r.status, "a running claim is not copied: the identical order exists")
	require.Empty(t, r.header.Get(api.HeaderReplayed))
	require.Equal(t, 4, b.rows(t)["api_requests"])
}
