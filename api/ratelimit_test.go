package api_test

import (
	"math"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/fx"

	"github.com/keyedhq/keyed/api"
	"github.com/keyedhq/keyed/internal/config"
	"github.com/keyedhq/keyed/internal/fxapi"
	"github.com/keyedhq/keyed/internal/fxapp"
)

// fakeClock is a clock that moves only when told to.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// limitedSetup is a bundle whose handler limits each tenant to limit, on a
// fake clock.
func limitedSetup(t *testing.T, limit api.RateLimit) (*bundle, *fakeClock) {
	t.Helper()
	b := setup(t, setupOpts{handler: &api.HandlerOpts{RateLimit: limit}})
	clock := &fakeClock{t: time.Unix(1_800_000_000, 0)}
	b.handler.SetRateLimitClockForTest(clock.now)
	return b, clock
}

func requireRateLimited(t *testing.T, r response, retryAfter int) {
	t.Helper()
	require.Equal(t, http.StatusTooManyRequests, r.status, "%s", r.body)
	require.Equal(t, strconv.Itoa(retryAfter), r.header.Get("Retry-After"))
	require.Equal(t, "application/json", r.header.Get("Content-Type"))
	e := decodeError(t, r)
	require.Equal(t, api.CodeRateLimited, e.Code)
	require.Contains(t, e.Message, "retry after "+strconv.Itoa(retryAfter)+" s")
}

// A tenant that empties its bucket gets 429 rate_limited with Retry-After,
// and its request writes nothing and claims no Idempotency-Key: the same
// key with another body succeeds once the bucket refills, where a claimed
// key would answer 422. Another tenant is not held up meanwhile.
func TestRateLimitRefusesATenantOverItsLimitAndNobodyElse(t *testing.T) {
	t.Parallel()
	b, clock := limitedSetup(t, api.RateLimit{Rate: 2, Burst: 3})
	for i := range 3 {
		id := "ord_" + strconv.Itoa(i)
		require.Equal(t, http.StatusCreated, b.do(t, "POST", "/v1/orders", b.keyA, "k-"+id, orderBody(id, 100)).status)
	}
	before := b.rows(t)
	requireRateLimited(t, b.do(t, "POST", "/v1/orders", b.keyA, "k-next", orderBody("ord_next", 100)), 1)
	requireRateLimited(t, b.do(t, "GET", "/v1/orders/ord_0", b.keyA, "", ""), 1)
	require.Equal(t, before, b.rows(t), "a refused request writes nothing")
	require.Zero(t, b.count(t, `SELECT count(*) FROM keyed_effects WHERE key = $1`, requestKey(t, b.tenantA, "k-next")),
		"and claims no Idempotency-Key")

	// B has a bucket of its own.
	require.Equal(t, http.StatusCreated, b.do(t, "POST", "/v1/orders", b.keyB, "k-b", orderBody("ord_b", 100)).status)
	require.Equal(t, http.StatusOK, b.do(t, "GET", "/v1/orders/ord_b", b.keyB, "", "").status)

	// Half a second refills one token at 2 a second: A's retry, under the
	// same key with another body, runs as a first request.
	clock.advance(500 * time.Millisecond)
	require.Equal(t, http.StatusCreated, b.do(t, "POST", "/v1/orders", b.keyA, "k-next", orderBody("ord_other", 100)).status)
	requireRateLimited(t, b.do(t, "POST", "/v1/orders", b.keyA, "k-more", orderBody("ord_more", 100)), 1)

	// A quiet spell refills the bucket to its burst, no further.
	clock.advance(time.Hour)
	for range 3 {
		require.Equal(t, http.StatusOK, b.do(t, "GET", "/v1/orders/ord_0", b.keyA, "", "").status)
	}
	requireRateLimited(t, b.do(t, "GET", "/v1/orders/ord_0", b.keyA, "", ""), 1)
}

// Retry-After is the whole seconds until the bucket holds a token again,
// rounded up.
func TestRateLimitRetryAfterIsWhenATokenIsBack(t *testing.T) {
	t.Parallel()
	b, clock := limitedSetup(t, api.RateLimit{Rate: 0.1, Burst: 1}) // one request every 10 s
	require.Equal(t, http.StatusNotFound, b.do(t, "GET", "/v1/orders/none", b.keyA, "", "").status)
	requireRateLimited(t, b.do(t, "GET", "/v1/orders/none", b.keyA, "", ""), 10)
	clock.advance(3 * time.Second)
	requireRateLimited(t, b.do(t, "GET", "/v1/orders/none", b.keyA, "", ""), 7)
	clock.advance(6500 * time.Millisecond)
	requireRateLimited(t, b.do(t, "GET", "/v1/orders/none", b.keyA, "", ""), 1)
	clock.advance(time.Second)
	require.Equal(t, http.StatusNotFound, b.do(t, "GET", "/v1/orders/none", b.keyA, "", "").status)
}

// A zero RateLimit turns the limit off; routes without a key are never
// limited.
func TestRateLimitOffAndUnkeyedRoutes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for range 50 {
		require.Equal(t, http.StatusNotFound, b.do(t, "GET", "/v1/orders/none", b.keyA, "", "").status)
	}
	limited, _ := limitedSetup(t, api.RateLimit{Rate: 1, Burst: 1})
	for range 5 {
		require.Equal(t, http.StatusOK, limited.do(t, "GET", "/healthz", "", "", "").status)
		require.Equal(t, http.StatusUnauthorized, limited.do(t, "GET", "/v1/orders/none", "", "", "").status)
	}
}

func TestRateLimitOptionsAreValidated(t *testing.T) {
	t.Parallel()
	b := setup(t)
	keys, err := api.ParseKeys(b.keyList)
	require.NoError(t, err)
	for _, bad := range []api.RateLimit{{Rate: -1, Burst: 1}, {Rate: math.NaN(), Burst: 1}, {Rate: math.Inf(1), Burst: 1}, {Rate: 5}} {
		_, err := api.NewHandler(b.pool, keys, &api.HandlerOpts{RateLimit: bad})
		require.Error(t, err, "%+v", bad)
	}
	_, err = api.NewHandler(b.pool, keys, &api.HandlerOpts{RateLimit: api.RateLimit{Burst: 0}})
	require.NoError(t, err, "off")
}

// `starter serve`'s graph takes the limit from the configuration:
// KEYED_API_RATE_LIMIT and KEYED_API_RATE_BURST, 0 for none.
func TestRateLimitComesFromTheConfiguration(t *testing.T) {
	t.Parallel()
	b := setup(t)
	keys, err := api.ParseKeys(b.keyList)
	require.NoError(t, err)
	serve := func(rate string) string {
		env := map[string]string{"DATABASE_URL": b.url, "TEMPORAL_ADDRESS": temporalAddr,
			"KEYED_API_RATE_LIMIT": rate, "KEYED_API_RATE_BURST": "2"}
		l := config.NewLoader(config.Starter, func(k string) (string, bool) { v, ok := env[k]; return v, ok })
		l.Command("serve")
		cfg, err := l.Load()
		require.NoError(t, err)
		var srv *api.Server
		app := fx.New(fxapp.Starter(cfg, b.logger, fx.Supply(fxapi.Config{Addr: "127.0.0.1:0", Keys: keys}),
			fxapi.Module, fx.Populate(&srv)))
		require.NoError(t, fxapp.RootCause(app.Err()))
		require.NoError(t, app.Start(b.ctx))
		t.Cleanup(func() { _ = app.Stop(b.ctx) })
		return "http://" + srv.Addr()
	}
	get := func(base string) response {
		return doAt(t, http.DefaultClient, base, "GET", "/v1/orders/none", b.keyA, "", "")
	}

	limited := serve("0.01")
	for range 2 {
		require.Equal(t, http.StatusNotFound, get(limited).status)
	}
	r := get(limited)
	require.Equal(t, http.StatusTooManyRequests, r.status, "%s", r.body)
	require.Equal(t, api.CodeRateLimited, decodeError(t, r).Code)
	secs, err := strconv.Atoi(r.header.Get("Retry-After"))
	require.NoError(t, err)
	require.InDelta(t, 100, secs, 5, "a request every 100 s")

	off := serve("0")
	for range 10 {
		require.Equal(t, http.StatusNotFound, get(off).status)
	}
}
