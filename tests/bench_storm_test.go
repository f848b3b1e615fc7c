package tests

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.temporal.io/api/enums/v1"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"

	"github.com/keyedhq/keyed/orders"
	orderflow "github.com/keyedhq/keyed/workflows/order"
)

// stormStarts and stormOrders shape one storm: stormStarts concurrent
// starts spread evenly over stormOrders orders.
const (
	stormStarts = 1000
	stormOrders = 10
)

// BenchmarkStorm sends a storm of 1000 concurrent starts over 10 orders
// through orderflow.Start, and the same storm through the bare SDK
// (ExecuteWorkflow with conflict policy USE_EXISTING, of the baseline's
// 3-no-op-activity workflow), alternately on one dev server, BENCH_PAIRS
// (default 3) pairs. Each keyed storm must leave exactly 10 runs and 10
// charges at the Stripe fake (its runs complete before the next storm). It
// prints the start latencies p50/p99 of each storm and the p99 ratio
// keyed/bare (goal <= 1.1). A third storm posts the same 1000 requests to
// keyed's HTTP API (each order's with one Idempotency-Key), whose outbox a
// relay starts, and checks 10 runs and 10 charges too; it reports the POST
// latencies and the answers' statuses. Run it with `make bench-storm`.
func BenchmarkStorm(b *testing.B) {
	world := setup(b)
	bareQueue := startBenchWorkers(b, world)

	api := newStormAPI(b, world)

	var keyed, bare, viaAPI []batch
	for pair := range envInt("BENCH_PAIRS", 3) {
		bareIDs := make([]string, stormOrders)
		for k := range bareIDs {
			bareIDs[k] = fmt.Sprintf("bare-storm:%s:%d:%d", world.tenant, pair, k)
		}
		bare = append(bare, storm(b, func(i int) error {
			_, err := world.temporal.ExecuteWorkflow(world.ctx, client.StartWorkflowOptions{
				ID: bareIDs[i%stormOrders], TaskQueue: bareQueue,
				WorkflowIDConflictPolicy: enums.WORKFLOW_ID_CONFLICT_POLICY_USE_EXISTING,
			}, "BareWorkflow", orders.NewOrderInput(world.tenant, bareIDs[i%stormOrders]))
			return err
		}))

		charges := world.stripe.Charges()
		ins := make([]orders.OrderInput, stormOrders)
		for k := range ins {
			id := fmt.Sprintf("storm%d-%d", pair, k)
			world.order(b, id, 1000+int64(k), "pm_card_visa")
			ins[k] = orders.NewOrderInput(world.tenant, id)
		}
		keyed = append(keyed, storm(b, func(i int) error {
			_, err := orderflow.Start(world.ctx, world.temporal, ins[i%stormOrders], &orderflow.StartOpts{TaskQueue: world.taskQueue})
			return err
		}))
		runs := 0
		for _, in := range ins {
			require.NoError(b, world.temporal.GetWorkflow(world.ctx, in.WorkflowID(), "").Get(world.ctx, nil))
			runs += countRuns(b, world, in.WorkflowID())
		}
		got := world.stripe.Charges() - charges
		fmt.Printf("storm pair %d: keyed %d runs, %d charges; p50 %v, p99 %v  bare p50 %v, p99 %v  p99 ratio %.2f\n",
			pair+1, runs, got, keyed[pair].p50.Round(time.Microsecond), keyed[pair].p99.Round(time.Microsecond),
			bare[pair].p50.Round(time.Microsecond), bare[pair].p99.Round(time.Microsecond),
			float64(keyed[pair].p99)/float64(bare[pair].p99))
		require.Equal(b, stormOrders, runs, "one run per order")
		require.Equal(b, stormOrders, got, "one charge per order")

		charges = world.stripe.Charges()
		viaAPI = append(viaAPI, api.storm(b, fmt.Sprintf("api%d", pair)))
		runs, got = api.settle(b), world.stripe.Charges()-charges
		fmt.Printf("storm pair %d: HTTP API %d runs, %d charges; POST p50 %v, p99 %v; statuses %v\n", pair+1, runs, got,
			viaAPI[pair].p50.Round(time.Microsecond), viaAPI[pair].p99.Round(time.Microsecond), api.statuses())
		require.Equal(b, stormOrders, runs, "one run per order through the API")
		require.Equal(b, stormOrders, got, "one charge per order through the API")
	}
	ms := func(f func(batch) time.Duration) func(batch) float64 {
		return func(x batch) float64 { return float64(f(x).Microseconds()) / 1000 }
	}
	p50 := ms(func(x batch) time.Duration { return x.p50 })
	p99 := ms(func(x batch) time.Duration { return x.p99 })
	kp99, bp99 := median(keyed, p99), median(bare, p99)
	fmt.Printf("storm median: keyed p50 %.1f ms, p99 %.1f ms; bare p50 %.1f ms, p99 %.1f ms; p99 ratio %.2f (goal <= 1.10)\n",
		median(keyed, p50), kp99, median(bare, p50), bp99, kp99/bp99)
	b.ReportMetric(median(keyed, p50), "keyed-p50-ms")
	b.ReportMetric(kp99, "keyed-p99-ms")
	b.ReportMetric(median(bare, p50), "bare-p50-ms")
	b.ReportMetric(bp99, "bare-p99-ms")
	b.ReportMetric(kp99/bp99, "p99-ratio")
	ap99 := median(viaAPI, p99)
	fmt.Printf("storm median: HTTP API POST p50 %.1f ms, p99 %.1f ms; p99 ratio to bare %.2f\n", median(viaAPI, p50), ap99, ap99/bp99)
	b.ReportMetric(median(viaAPI, p50), "api-p50-ms")
	b.ReportMetric(ap99, "api-p99-ms")
}

// storm runs start(i) for i in [0, stormStarts) from as many goroutines,
// released together, and returns the start latencies.
func storm(b *testing.B, start func(i int) error) batch {
	b.Helper()
	lat := make([]time.Duration, stormStarts)
	errs := make([]error, stormStarts)
	gate := make(chan struct{})
	var ready, done sync.WaitGroup
	for i := range stormStarts {
		ready.Add(1)
		done.Add(1)
		go func() {
			defer done.Done()
			ready.Done()
			<-gate
			t0 := time.Now()
			errs[i] = start(i)
			lat[i] = time.Since(t0)
		}()
	}
	ready.Wait()
	begin := time.Now()
	close(gate)
	done.Wait()
	elapsed := time.Since(begin)
	for _, err := range errs {
		require.NoError(b, err)
	}
	slices.Sort(lat)
	return batch{rate: stormStarts / elapsed.Seconds(), p50: lat[stormStarts/2], p99: lat[stormStarts*99/100]}
}

// countRuns counts the executions of workflowID in the server's visibility
// store, waiting until it lists them all finished.
func countRuns(b *testing.B, world *bundle, workflowID string) int {
	b.Helper()
	var n int
	require.Eventually(b, func() bool {
		resp, err := world.temporal.ListWorkflow(world.ctx, &workflowservice.ListWorkflowExecutionsRequest{
			Namespace: "default", Query: "WorkflowId = '" + workflowID + "'",
		})
		if err != nil || len(resp.Executions) == 0 {
			return false
		}
		for _, e := range resp.Executions {
			if e.Status == enums.WORKFLOW_EXECUTION_STATUS_RUNNING {
				return false
			}
		}
		n = len(resp.Executions)
		return true
	}, 10*time.Second, 100*time.Millisecond)
	return n
}
