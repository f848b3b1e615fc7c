package idempotency_test

import (
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/keyedhq/keyed/idempotency"
	"github.com/keyedhq/keyed/internal/dbtest"
)

// The docs' subscription route, run: a retry replays the 201 and its
// Location, and the subscription, its start and its response are one row
// each.
func TestSubscriptionRoute(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	_, err := pool.Exec(t.Context(), `CREATE TABLE subscriptions (tenant_id text, id text, plan text, PRIMARY KEY (tenant_id, id))`)
	require.NoError(t, err)
	h, err := subscriptionsAPI(pool, map[string]string{"Bearer sk_acme": "acme"})
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	post := func(body string) *http.Response {
		req, err := http.NewRequest("POST", srv.URL+"/v1/subscriptions", strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer sk_acme")
		req.Header.Set(idempotency.HeaderKey, "sub-1")
		resp, err := srv.Client().Do(req)
		require.NoError(t, err)
		t.Cleanup(func() { _ = resp.Body.Close() })
		return resp
	}
	require.Equal(t, http.StatusBadRequest, post(`{"subscription_id":"s1"}`).StatusCode)
	first := post(`{"subscription_id":"s1","plan":"pro"}`)
	require.Equal(t, http.StatusCreated, first.StatusCode)
	again := post(`{"subscription_id":"s1","plan":"pro"}`)
	require.Equal(t, http.StatusCreated, again.StatusCode)
	require.Equal(t, "true", again.Header.Get(idempotency.HeaderReplayed))
	require.Equal(t, "/v1/subscriptions/s1", again.Header.Get("Location"))
	require.Equal(t, http.StatusUnprocessableEntity, post(`{"subscription_id":"s1","plan":"max"}`).StatusCode)
	var subs, starts int
	require.NoError(t, pool.QueryRow(t.Context(), `SELECT count(*) FROM subscriptions`).Scan(&subs))
	require.NoError(t, pool.QueryRow(t.Context(), `SELECT count(*) FROM keyed_outbox
		WHERE workflow_type = 'SubscriptionWorkflow' AND workflow_id = 'subscription:acme:s1:activate' AND tenant_id = 'acme'`).Scan(&starts))
	require.Equal(t, 1, subs)
	require.Equal(t, 1, starts)
}

// goBlock is a ```go block of a docs page and the file it names.
var goBlock = regexp.MustCompile("(?s)```go( file=(\\S+))?\n(.*?)```")

// Every Go block of docs/api.md names a file of the tree and is text of
// it, which go test compiles (this file's example is one).
func TestAPIDocsCodeIsCompiled(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../docs/api.md")
	require.NoError(t, err)
	blocks := goBlock.FindAllStringSubmatch(string(b), -1)
	require.NotEmpty(t, blocks)
	for _, m := range blocks {
		file, code := m[2], m[3]
		require.NotEmpty(t, file, "docs/api.md: a go block names no file:\n%s", code)
		src, err := os.ReadFile("../" + file)
		require.NoError(t, err)
		require.Contains(t, string(src), code, "docs/api.md: a block is not the text of %s", file)
	}
}
