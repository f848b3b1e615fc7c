package api_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keyedhq/keyed/api"
	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/effects/effectstest"
	"github.com/keyedhq/keyed/internal/config"
	"github.com/keyedhq/keyed/internal/dbtest"
	"github.com/keyedhq/keyed/internal/fxapp"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/refunds"
)

// probe is one request of a route and the status it must get.
type probe struct {
	method, path, apiKey, idemKey, body string
	want                                int
}

// routeProbes are requests of every route of the handler's route table
// (api.Handler.RoutesForTest), by pattern, over the order ord_1 of tenant A
// (paid, 1000.00) with the refund r1 requested and an effect record under
// each, and ord_2 (pending). The POSTs run a new request, its replay, the same order or refund
// under another key (200), and refusals that release the key.
func (b *bundle) routeProbes() map[string][]probe {
	a := b.keyA
	return map[string][]probe{
		api.RouteCreateOrder: {
			{"POST", "/v1/orders", a, "pool-create", orderBody("ord_3", 700), http.StatusCreated},
			{"POST", "/v1/orders", a, "pool-create", orderBody("ord_3", 700), http.StatusCreated},
			{"POST", "/v1/orders", a, "pool-create-again", orderBody("ord_3", 700), http.StatusOK},
			{"POST", "/v1/orders", a, "pool-create-conflict", orderBody("ord_3", 701), http.StatusConflict},
			{"POST", "/v1/orders", a, "pool-create", orderBody("ord_3", 701), http.StatusUnprocessableEntity},
		},
		api.RouteGetOrder: {
			{"GET", "/v1/orders/ord_1", a, "", "", http.StatusOK},
			{"GET", "/v1/orders/ord_none", a, "", "", http.StatusNotFound},
		},
		api.RouteCreateRefund: {
			{"POST", "/v1/orders/ord_1/refunds", a, "pool-refund", refundBody("r2", 100, "damaged"), http.StatusAccepted},
			{"POST", "/v1/orders/ord_1/refunds", a, "pool-refund", refundBody("r2", 100, "damaged"), http.StatusAccepted},
			{"POST", "/v1/orders/ord_1/refunds", a, "pool-refund-again", refundBody("r1", 100, "damaged"), http.StatusOK},
			{"POST", "/v1/orders/ord_1/refunds", a, "pool-refund-exceeds", refundBody("r3", 100001, ""), http.StatusUnprocessableEntity},
			{"POST", "/v1/orders/ord_1/refunds", a, "pool-refund-conflict", refundBody("r1", 101, "damaged"), http.StatusConflict},
			{"POST", "/v1/orders/ord_2/refunds", a, "pool-refund-pending", refundBody("r1", 100, ""), http.StatusConflict},
			{"POST", "/v1/orders/ord_none/refunds", a, "pool-refund-none", refundBody("r1", 100, ""), http.StatusNotFound},
		},
		api.RouteGetRefund: {
			{"GET", "/v1/orders/ord_1/refunds/r1", a, "", "", http.StatusOK},
			{"GET", "/v1/orders/ord_1/refunds/r9", a, "", "", http.StatusNotFound},
		},
		api.RouteHealthz:                      {{"GET", "/healthz", "", "", "", http.StatusOK}},
		api.RouteMetrics:                      {{"GET", "/metrics", "", "", "", http.StatusOK}},
		"/v1/orders":                          {{"DELETE", "/v1/orders", a, "", "", http.StatusMethodNotAllowed}},
		"/v1/orders/{id}":                     {{"DELETE", "/v1/orders/ord_1", a, "", "", http.StatusMethodNotAllowed}},
		"/v1/orders/{id}/refunds":             {{"GET", "/v1/orders/ord_1/refunds", a, "", "", http.StatusMethodNotAllowed}},
		"/v1/orders/{id}/refunds/{refund_id}": {{"DELETE", "/v1/orders/ord_1/refunds/r1", a, "", "", http.StatusMethodNotAllowed}},
		"/healthz":                            {{"POST", "/healthz", "", "", "", http.StatusMethodNotAllowed}},
		"/metrics":                            {{"DELETE", "/metrics", "", "", "", http.StatusMethodNotAllowed}},
		"/":                                   {{"GET", "/v2/nothing", a, "", "", http.StatusNotFound}},
	}
}

// send sends p with a deadline, so that a request that hangs fails the test
// instead of stalling it.
func (b *bundle) send(t testing.TB, p probe) response {
	t.Helper()
	c := &http.Client{Timeout: 20 * time.Second, Transport: b.srv.Client().Transport}
	return doAt(t, c, b.srv.URL, p.method, p.path, p.apiKey, p.idemKey, p.body)
}

// sendUntilServed sends p to the server at url and sends it again, after
// 100 ms and under the same Idempotency-Key, while it gets 503, or 409
// request_in_progress (up to 50 times), as a client honouring Retry-After
// would. An order's refund requests run one at a time, and on a loaded
// machine the last of a burst may outwait the request timeout; its retry
// may then find the first attempt still running.
func sendUntilServed(t testing.TB, c *http.Client, url string, p probe) response {
	t.Helper()
	var r response
	for range 50 {
		r = doAt(t, c, url, p.method, p.path, p.apiKey, p.idemKey, p.body)
		inProgress := r.status == http.StatusConflict && strings.Contains(string(r.body), api.CodeRequestInProgress)
		if r.status != http.StatusServiceUnavailable && !inProgress {
			return r
		}
		time.Sleep(100 * time.Millisecond)
	}
	return r
}

// TestEveryRouteOnOneConnection serves every route of the handler's route
// table on a pool of one connection: no request may hold a connection while
// it waits for a second (a transaction reads through itself), or it would
// wait out the request timeout and answer 503. A route added to the table
// without a probe here fails the test.
func TestEveryRouteOnOneConnection(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{maxConns: 1})
	b.paidOrder(t, "ord_1", 100000)
	b.orderWithStatus(t, "ord_2", 700, "pending")
	r := b.do(t, "POST", "/v1/orders/ord_1/refunds", b.keyA, "seed-r1", refundBody("r1", 100, "damaged"))
	require.Equal(t, http.StatusAccepted, r.status, "%s", r.body)
	fxc := effectstest.NewClient(t, b.pool, nil)
	for _, k := range []effects.Key{effects.MustKey(b.tenantA, "order", "ord_1", "charge"),
		effects.MustKey(b.tenantA, "order", "ord_1", "refund", "r1", "refund_reserve")} {
		cl, err := fxc.Claim(b.ctx, effects.ClaimParams{Key: k, Owner: "test"})
		require.NoError(t, err)
		require.NoError(t, fxc.Complete(b.ctx, cl, map[string]int{"amount_minor": 100}))
	}

	probes := b.routeProbes()
	routes := b.handler.RoutesForTest()
	require.Contains(t, routes, api.RouteCreateRefund)
	for _, pattern := range routes {
		ps, ok := probes[pattern]
		require.True(t, ok, "route %q has no probe in routeProbes: add one", pattern)
		for _, p := range ps {
			r := b.send(t, p)
			require.Equal(t, p.want, r.status, "%s %s: %s", p.method, p.path, r.body)
		}
		delete(probes, pattern)
	}
	require.Empty(t, probes, "probes of routes the handler does not have")

	// Parallel requests queue for the one connection; none waits for a
	// second while it holds it.
	var wg sync.WaitGroup
	got := make([]response, 8)
	for i := range got {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got[i] = b.send(t, probe{"POST", "/v1/orders/ord_1/refunds", b.keyA, fmt.Sprintf("pool-par-%d", i),
				refundBody(fmt.Sprintf("par%d", i), 100, ""), http.StatusAccepted})
		}()
	}
	wg.Wait()
	for i, r := range got {
		require.Equal(t, http.StatusAccepted, r.status, "refund %d: %s", i, r.body)
	}
}

// defaultPoolSize is the pool starter serve gets when DATABASE_URL sets no
// pool_max_conns.
func defaultPoolSize() int32 {
	_, def := fxapp.PoolNeeds(&config.Config{Role: config.Starter})
	return def
}

// TestFiftyParallelRefundsOnTheDefaultPool sends 50 refunds of 1.00 of one
// order of 1000.00 at once, on the pool starter serve gets by default,
// while another tenant reads its own order: every refund is accepted and
// the other tenant's read answered.
func TestFiftyParallelRefundsOnTheDefaultPool(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{maxConns: defaultPoolSize()})
	b.paidOrder(t, "ord_1", 100000)
	r := b.do(t, "POST", "/v1/orders", b.keyB, "b-create", orderBody("ord_b", 500))
	require.Equal(t, http.StatusCreated, r.status, "%s", r.body)

	const n = 50
	client := &http.Client{Timeout: 20 * time.Second, Transport: b.srv.Client().Transport}
	start := make(chan struct{})
	var wg sync.WaitGroup
	got := make([]response, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			got[i] = sendUntilServed(t, client, b.srv.URL, probe{"POST", "/v1/orders/ord_1/refunds", b.keyA, fmt.Sprintf("par-%d", i),
				refundBody(fmt.Sprintf("r%d", i), 100, ""), http.StatusAccepted})
		}()
	}
	var other response
	wg.Add(1)
	go func() {
		defer wg.Done()
		<-start
		other = b.send(t, probe{"GET", "/v1/orders/ord_b", b.keyB, "", "", http.StatusOK})
	}()
	close(start)
	wg.Wait()
	for i, r := range got {
		require.Equal(t, http.StatusAccepted, r.status, "refund %d: %s", i, r.body)
	}
	require.Equal(t, http.StatusOK, other.status, "the other tenant's read: %s", other.body)
	require.Equal(t, n, b.refundRows(t))
}

// TestRefundsWaitingForTheirOrderHoldNoConnection holds an order's
// refund-request lock from outside while ten refunds of it arrive on a pool
// of two connections: one of them waits on the lock, the rest wait in the
// process, another tenant's read is answered meanwhile, and once the lock
// goes all ten are accepted.
func TestRefundsWaitingForTheirOrderHoldNoConnection(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{maxConns: 2})
	b.paidOrder(t, "ord_1", 100000)
	r := b.do(t, "POST", "/v1/orders", b.keyB, "b-create", orderBody("ord_b", 500))
	require.Equal(t, http.StatusCreated, r.status, "%s", r.body)
	order, err := orders.OrderKey(b.tenantA, "ord_1")
	require.NoError(t, err)
	lock, err := order.With("refund_requests")
	require.NoError(t, err)
	tx := dbtest.Begin(t, b.pool)
	require.NoError(t, effects.LockEntityTx(b.ctx, tx, lock))

	const n = 10
	var wg sync.WaitGroup
	got := make([]response, n)
	for i := range n {
		wg.Go(func() {
			got[i] = b.send(t, probe{"POST", "/v1/orders/ord_1/refunds", b.keyA, fmt.Sprintf("held-%d", i),
				refundBody(fmt.Sprintf("r%d", i), 100, ""), http.StatusAccepted})
		})
	}
	waiting := func() int {
		return b.count(t, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
AND ((classid::bigint << 32) | objid::bigint) = hashtextextended($1, 0)`, lock.String())
	}
	require.Eventually(t, func() bool { return waiting() > 0 }, 5*time.Second, 10*time.Millisecond)
	other := b.send(t, probe{"GET", "/v1/orders/ord_b", b.keyB, "", "", http.StatusOK})
	require.Equal(t, http.StatusOK, other.status, "the other tenant's read: %s", other.body)
	require.Equal(t, 1, waiting(), "one request of the order waits on its lock; the others hold no connection")

	require.NoError(t, tx.Rollback(b.ctx))
	wg.Wait()
	for i, r := range got {
		require.Equal(t, http.StatusAccepted, r.status, "refund %d: %s", i, r.body)
	}
	require.Equal(t, n, b.refundRows(t))
}

// BenchmarkOtherTenantReadUnderRefunds measures tenant B's GET of its own
// order on the default pool, alone and while 6 and 50 clients of tenant A
// loop refunds (of one order until it has refunds.MaxPerOrder, then of the
// next), side by side in one run. It reports B's
// median and 99th-percentile latency, and the refunds' rate.
//
//	go test -run '^$' -bench OtherTenantRead -benchtime 200x ./api
func BenchmarkOtherTenantReadUnderRefunds(b *testing.B) {
	for _, refunders := range []int{0, 6, 50} {
		b.Run(fmt.Sprintf("refunders=%d", refunders), func(b *testing.B) {
			bd := setup(b, setupOpts{maxConns: defaultPoolSize()})
			r := bd.do(b, "POST", "/v1/orders", bd.keyB, "b-create", orderBody("ord_b", 500))
			require.Equal(b, http.StatusCreated, r.status, "%s", r.body)
			client := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 128}}
			ctx, cancel := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			var mu sync.Mutex
			made, failed := 0, 0
			for w := range refunders {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; ctx.Err() == nil; i++ {
						// A new order each refunds.MaxPerOrder refunds.
						order := fmt.Sprintf("ord_w%d_%d", w, i/refunds.MaxPerOrder)
						if i%refunds.MaxPerOrder == 0 && !bd.paidOrderOf(b, client, order) {
							mu.Lock()
							failed++
							mu.Unlock()
							return
						}
						status := bd.status(b, client, "POST", "/v1/orders/"+order+"/refunds", bd.keyA, fmt.Sprintf("w%d-%d", w, i),
							refundBody(fmt.Sprintf("w%d-%d", w, i), 1, ""))
						mu.Lock()
						made++
						if status != http.StatusAccepted {
							failed++
						}
						mu.Unlock()
					}
				}()
			}
			lat := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			began := time.Now()
			for range b.N {
				t0 := time.Now()
				if got := bd.status(b, client, "GET", "/v1/orders/ord_b", bd.keyB, "", ""); got != http.StatusOK {
					b.Fatalf("tenant B's read got %d", got)
				}
				lat = append(lat, time.Since(t0))
			}
			elapsed := time.Since(began)
			b.StopTimer()
			cancel()
			wg.Wait()
			if failed > 0 {
				b.Fatalf("%d of %d refunds were not accepted", failed, made)
			}
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
			b.ReportMetric(float64(made)/elapsed.Seconds(), "refunds/s")
			b.ReportMetric(0, "ns/op")
		})
	}
}

// paidOrderOf creates tenant A's order id through c and marks it paid,
// from any goroutine; it reports whether both worked.
func (b *bundle) paidOrderOf(t testing.TB, c *http.Client, id string) bool {
	if b.status(t, c, "POST", "/v1/orders", b.keyA, "create-"+id, orderBody(id, 99_999_999)) != http.StatusCreated {
		return false
	}
	_, err := b.pool.Exec(b.ctx, `UPDATE orders SET status = 'paid' WHERE tenant_id = $1 AND id = $2`, b.tenantA, id)
	return err == nil
}

// status sends one request and returns its status, discarding the body.
func (b *bundle) status(t testing.TB, c *http.Client, method, path, apiKey, idemKey, body string) int {
	req, err := http.NewRequest(method, b.srv.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+apiKey)
	if idemKey != "" {
		req.Header.Set(api.HeaderIdempotencyKey, idemKey)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Error(err)
		return 0
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}
