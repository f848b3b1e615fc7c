package api_test

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keyedhq/keyed/api"
)

// BenchmarkCreateOrder measures POST /v1/orders through a local HTTP server
// over real Postgres, at 1 and 16 concurrent clients, with fresh keys (each
// request writes an order, its outbox row and the stored response in one
// transaction) and replayed keys (each request finds the stored response and
// sends it back), side by side in one run: through the idempotency
// middleware (path=middleware, the route as served) and through the
// handler as it was before it, with the claim, transaction and replay
// inline (path=inline, LegacyCreateOrderForTest). No relay runs: this is
// the API and database path alone. All report req/s.
//
//	go test -run '^$' -bench CreateOrder -benchtime 3s ./api
func BenchmarkCreateOrder(b *testing.B) {
	for _, conc := range []int{1, 16} {
		bd := setup(b)
		require.NoError(b, bd.handler.LegacyCreateOrderForTest())
		client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
		for _, path := range []struct{ name, route string }{{"middleware", "/v1/orders"}, {"inline", "/bench/legacy-orders"}} {
			// Keys to replay, created before any timing.
			const replayKeys = 256
			for i := range replayKeys {
				r := bd.postTo(b, client, path.route, fmt.Sprintf("replay-%s-%d", path.name, i), fmt.Sprintf("ord_replay_%s_%d", path.name, i))
				require.Equal(b, http.StatusCreated, r, "seed replay key %d", i)
			}
			var seq atomic.Int64
			b.Run(fmt.Sprintf("fresh/path=%s/conc=%d", path.name, conc), func(b *testing.B) {
				runConcurrent(b, conc, func() int {
					n := seq.Add(1)
					return bd.postTo(b, client, path.route, fmt.Sprintf("fresh-%s-%d", path.name, n), fmt.Sprintf("ord_fresh_%s_%d", path.name, n))
				}, http.StatusCreated)
			})
			b.Run(fmt.Sprintf("replayed/path=%s/conc=%d", path.name, conc), func(b *testing.B) {
				runConcurrent(b, conc, func() int {
					i := seq.Add(1) % replayKeys
					return bd.postTo(b, client, path.route, fmt.Sprintf("replay-%s-%d", path.name, i), fmt.Sprintf("ord_replay_%s_%d", path.name, i))
				}, http.StatusCreated)
			})
		}
	}
}

// postTo sends one create to route and returns the status, reading and
// discarding the body as a client would.
func (b *bundle) postTo(t testing.TB, c *http.Client, route, idemKey, orderID string) int {
	req, err := http.NewRequest("POST", b.srv.URL+route, strings.NewReader(orderBody(orderID, 1999)))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+b.keyA)
	req.Header.Set(api.HeaderIdempotencyKey, idemKey)
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// runConcurrent runs b.N calls of fn over conc goroutines, fails on any
// status but want, and reports the rate as req/s.
func runConcurrent(b *testing.B, conc int, fn func() int, want int) {
	var next atomic.Int64
	var bad atomic.Int64
	var wg sync.WaitGroup
	b.ResetTimer()
	start := time.Now()
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(b.N) {
				if got := fn(); got != want {
					bad.Store(int64(got))
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	if got := bad.Load(); got != 0 {
		b.Fatalf("a request got status %d, want %d", got, want)
	}
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "req/s")
	b.ReportMetric(0, "ns/op")
}
