//go:build cluster

package tests

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keyedhq/keyed/internal/config"
	"github.com/keyedhq/keyed/internal/devserver"
	"github.com/keyedhq/keyed/internal/fakefault"
	"github.com/keyedhq/keyed/internal/pgcluster"
	"github.com/keyedhq/keyed/internal/tempcluster"
	"github.com/keyedhq/keyed/orders"
)

// The fairness run: tenant A floods fairFlood orders at once; tenant B
// sends fairB orders, one every fairEvery, from a second into the flood.
// One worker with fairSlots activity slots and Stripe answering in 50 ms
// keeps a backlog in Temporal's activity queue for tens of seconds.
const (
	fairFlood = 400
	fairB     = 20
	fairEvery = 500 * time.Millisecond
	fairSlots = 4
)

// BenchmarkTenantFairness measures tenant B's start-to-paid p50/p99 while
// tenant A's 400 orders flood the task queue, with Temporal's fairness off
// and on (matching.enableFairness; keyed's runs carry the tenant as their
// fairness key), on a dev server and on a two-node cluster.
func BenchmarkTenantFairness(b *testing.B) {
	bin := buildWorker(b)
	for _, target := range []string{"devserver", "cluster"} {
		for _, fair := range []bool{false, true} {
			b.Run(fmt.Sprintf("%s/fairness=%t", target, fair), func(b *testing.B) {
				for range b.N {
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
					dyn := map[string]string{"matching.enableFairness": fmt.Sprint(fair)}
					pg := pgcluster.New(b, &pgcluster.Opts{Settings: map[string]string{"max_connections": "300"}})
					var addr string
					if target == "cluster" {
						tc, err := tempcluster.Start(ctx, &tempcluster.Opts{DatabaseURL: pg.URL(), UIPort: -1, DynamicConfig: dyn})
						require.NoError(b, err)
						b.Cleanup(func() { _ = tc.Stop() })
						addr = tc.Address()
					} else {
						ds, err := devserver.Start(ctx, &devserver.Opts{UIPort: -1, DynamicConfig: dyn})
						require.NoError(b, err)
						b.Cleanup(func() { _ = ds.Stop() })
						addr = ds.Address()
					}
					w := newFaultWorldOn(b, ctx, bin, config.AtLeastOnce, pg, addr, 1)
					w.env = []string{fmt.Sprintf("WORKER_MAX_ACTIVITIES=%d", fairSlots)}
					w.stripe.Inject(fakefault.Fault{Kind: fakefault.FaultLatency, Rate: 1, Delay: 50 * time.Millisecond})
					require.NoError(b, w.spawn(0))
					bP50, bP99, aDone := w.floodAndMeasure(b, ctx)
					b.ReportMetric(bP50.Seconds()*1000, "B_p50_ms")
					b.ReportMetric(bP99.Seconds()*1000, "B_p99_ms")
					b.ReportMetric(aDone.Seconds(), "A_flood_s")
					cancel()
				}
			})
		}
	}
}

// floodAndMeasure starts tenant A's flood and tenant B's trickle and
// returns B's start-to-paid p50 and p99 and how long A's flood took.
func (w *faultWorld) floodAndMeasure(b testing.TB, ctx context.Context) (time.Duration, time.Duration, time.Duration) {
	tenantA, tenantB := w.tenant+"a", w.tenant+"b"
	var wg sync.WaitGroup
	errs := make(chan error, fairFlood+fairB)
	pay := func(tenant, id string) (time.Duration, error) {
		start := time.Now()
		if _, _, err := w.orders.Create(ctx, orders.NewOrder{TenantID: tenant, ID: id, AmountMinor: 1999, Currency: "eur",
			CustomerEmail: "ada+" + id + "@example.com", PaymentMethod: "pm_card_visa"}); err != nil {
			return 0, fmt.Errorf("create: %w", err)
		}
		st, err := w.start(ctx, orders.NewOrderInput(tenant, id))
		if err != nil {
			return 0, fmt.Errorf("start: %w", err)
		}
		var res orders.OrderResult
		err = w.temporal.GetWorkflow(ctx, st.WorkflowID, st.RunID).Get(ctx, &res)
		return time.Since(start), err
	}
	began := time.Now()
	var aDone time.Duration
	var aMu sync.Mutex
	sem := make(chan struct{}, 50)
	for i := range fairFlood {
		wg.Go(func() {
			sem <- struct{}{}
			_, err := pay(tenantA, fmt.Sprintf("a%04d", i))
			<-sem
			if err != nil {
				errs <- err
			}
			aMu.Lock()
			aDone = max(aDone, time.Since(began))
			aMu.Unlock()
		})
	}
	var mu sync.Mutex
	var took []time.Duration
	time.Sleep(time.Second)
	for i := range fairB {
		wg.Go(func() {
			d, err := pay(tenantB, fmt.Sprintf("b%04d", i))
			if err != nil {
				errs <- err
			}
			mu.Lock()
			took = append(took, d)
			mu.Unlock()
		})
		time.Sleep(fairEvery)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(b, err)
	}
	return pct(took, 0.5), pct(took, 0.99), aDone
}
