//go:build cluster

package tests

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keyedhq/keyed/internal/config"
	"github.com/keyedhq/keyed/internal/pgcluster"
	"github.com/keyedhq/keyed/orders"
)

// The throughput run: clusterBenchOrders orders, clusterBenchConc at a
// time (each client creates an order, starts its run and waits for it).
const (
	clusterBenchOrders = 200
	clusterBenchConc   = 20
)

// BenchmarkClusterThroughput runs 200 orders, 20 at a time, through 1 and
// then 3 worker processes on the package's dev server and on a two-node
// Temporal cluster (Postgres persistence), each on a private Postgres with
// no fault, and reports orders/s and the p50/p99 of start-to-paid.
func BenchmarkClusterThroughput(b *testing.B) {
	bin := buildWorker(b)
	for _, target := range []string{"devserver", "cluster"} {
		for _, workers := range []int{1, 3} {
			b.Run(fmt.Sprintf("%s/workers=%d", target, workers), func(b *testing.B) {
				for range b.N {
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
					pg := pgcluster.New(b, &pgcluster.Opts{Settings: map[string]string{"max_connections": "300"}})
					addr := temporalAddr
					if target == "cluster" {
						_, tc := startClusterOn(b, ctx, pg)
						addr = tc.Address()
					}
					w := newFaultWorldOn(b, ctx, bin, config.AtLeastOnce, pg, addr, workers)
					for i := range workers {
						require.NoError(b, w.spawn(i))
					}
					rate, p50, p99 := w.closedLoop(b, ctx, clusterBenchOrders, clusterBenchConc)
					b.ReportMetric(rate, "orders/s")
					b.ReportMetric(p50.Seconds()*1000, "p50_ms")
					b.ReportMetric(p99.Seconds()*1000, "p99_ms")
					cancel()
				}
			})
		}
	}
}

// closedLoop runs n orders through w, conc at a time, and returns the
// orders per second from the first start to the last paid and the p50
// and p99 of each order's start-to-paid time. Every order must be paid.
func (w *faultWorld) closedLoop(b testing.TB, ctx context.Context, n, conc int) (float64, time.Duration, time.Duration) {
	var (
		next  atomic.Int64
		mu    sync.Mutex
		took  []time.Duration
		wg    sync.WaitGroup
		errs  []error
		began = time.Now()
	)
	for range conc {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= int64(n) {
					return
				}
				id := fmt.Sprintf("b%04d", i)
				start := time.Now()
				err := w.payOne(ctx, id)
				mu.Lock()
				if err != nil {
					errs = append(errs, fmt.Errorf("order %s: %w", id, err))
				}
				took = append(took, time.Since(start))
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(began)
	require.Empty(b, errs)
	return float64(n) / elapsed.Seconds(), pct(took, 0.50), pct(took, 0.99)
}

// payOne creates order id, starts its run and waits until it is paid.
func (w *faultWorld) payOne(ctx context.Context, id string) error {
	if _, _, err := w.orders.Create(ctx, orders.NewOrder{TenantID: w.tenant, ID: id, AmountMinor: 1999, Currency: "eur",
		CustomerEmail: "ada+" + id + "@example.com", PaymentMethod: "pm_card_visa"}); err != nil {
		return fmt.Errorf("create: %w", err)
	}
	in := orders.NewOrderInput(w.tenant, id)
	st, err := w.start(ctx, in)
	if err != nil {
		return fmt.Errorf("start: %w", err)
	}
	var res orders.OrderResult
	return w.temporal.GetWorkflow(ctx, st.WorkflowID, st.RunID).Get(ctx, &res)
}
