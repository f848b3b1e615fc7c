package tests

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	ordersteps "github.com/keyedhq/keyed/activities/order"
	"github.com/keyedhq/keyed/internal/config"
	"github.com/keyedhq/keyed/internal/fxapp"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/pipeline"
	"github.com/keyedhq/keyed/step"
	"github.com/keyedhq/keyed/workflows"
	orderflow "github.com/keyedhq/keyed/workflows/order"
)

// bareWorkflow is the baseline: three no-op activities in a row on the same
// server, each with the options of the keyed step in its place (the
// declaration's timeouts, heartbeat timeout, retry policy and summary), so
// that the two differ only in what keyed adds: the effect claims, the
// provider calls and the workflow's status and details.
func bareWorkflow(ctx workflow.Context, in orders.OrderInput) error {
	steps := []step.Declaration{ordersteps.DeclCharge.Declaration, ordersteps.DeclMarkPaid.Declaration,
		ordersteps.DeclSendReceipt.Declaration}
	for i, name := range []string{"BareA", "BareB", "BareC"} {
		d := steps[i]
		key, err := in.EffectKey(d.Step)
		if err != nil {
			return err
		}
		actx := workflow.WithActivityOptions(ctx, d.ActivityOptions(key.String()))
		if err := workflow.ExecuteActivity(actx, name, in).Get(ctx, nil); err != nil {
			return err
		}
	}
	return nil
}

func bareActivity(context.Context, orders.OrderInput) error { return nil }

// benchWorkerOptions are the real worker's defaults, the same for keyed's
// worker and the baseline's.
func benchWorkerOptions() worker.Options {
	return fxapp.WorkerOptions(config.WorkerTuning{
		MaxConcurrentActivities: envInt("WORKER_MAX_ACTIVITIES", config.DefaultMaxActivities),
		Pollers:                 envInt("WORKER_POLLERS", config.DefaultPollers),
		StopTimeout:             config.DefaultStopTimeout,
	})
}

// batch is one measured batch: throughput and per-run latency.
type batch struct {
	rate          float64
	p50, p99, max time.Duration
	cpu           cpuSample // CPU per run of each party
	// runs names the batch's runs (workflow ID, run ID), slowest last;
	// only BenchmarkPipelineProcesses sets it.
	runs [][2]string
	// calls counts the dev server's calls per run; only
	// BenchmarkPipelineProcesses sets it.
	calls serverCalls
	// quiet is how long the machine took to fall quiet after the batch's
	// last run closed (waitQuiet); only BenchmarkPipelineProcesses sets it.
	quiet time.Duration
}

// runBatch runs n runs from c concurrent clients; run(i) starts run i and
// waits for it.
func runBatch(b testing.TB, n, c int, run func(i int) error) batch {
	b.Helper()
	lat := make([]time.Duration, n)
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, c)
	cpu0, begin := sampleCPU(), time.Now()
	for range c {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				t0 := time.Now()
				if err := run(i); err != nil {
					errs <- err
					return
				}
				lat[i] = time.Since(t0)
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(begin)
	close(errs)
	for err := range errs {
		require.NoError(b, err)
	}
	slices.Sort(lat)
	return batch{rate: float64(n) / elapsed.Seconds(), p50: lat[n/2], p99: lat[n*99/100], cpu: sampleCPU().sub(cpu0, n)}
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// BenchmarkPipeline runs keyed's order pipeline (charge, mark paid,
// receipt, each claiming its effect key in Postgres, against zero-latency
// provider fakes) and a bare workflow of three no-op activities on one dev
// server, in pairs of batches whose order alternates (bare first, then
// keyed first), after a warm-up batch of each that is not counted. It
// reports both throughputs, the median of the pairs' ratios, and the CPU
// each run cost the dev server, Postgres and this process. BENCH_N
// (default 200) runs per batch, BENCH_PAIRS (default 4) pairs per
// concurrency. Run it with `make bench-pipeline`.
func BenchmarkPipeline(b *testing.B) {
	n, pairs := envInt("BENCH_N", 200), envInt("BENCH_PAIRS", 4)
	for _, c := range []int{20, 50} {
		b.Run(fmt.Sprintf("C=%d", c), func(b *testing.B) {
			world := setup(b)
			bareQueue := startBenchWorkers(b, world)
			batches := 0
			runBoth := func(n int) (keyed, bare batch) {
				ids := make([]string, n)
				for i := range n {
					ids[i] = fmt.Sprintf("b%d-%d", batches, i)
					world.order(b, ids[i], 1000+int64(i), "pm_card_visa")
				}
				batches++
				runKeyed := func() { keyed = runBatch(b, n, c, func(i int) error { return runKeyedOrder(world, ids[i]) }) }
				runBare := func() {
					bare = runBatch(b, n, c, func(i int) error { return runBareOrder(world, bareQueue, ids[i]) })
				}
				if batches%2 == 0 {
					runKeyed()
					runBare()
				} else {
					runBare()
					runKeyed()
				}
				return keyed, bare
			}
			runBoth(max(n/4, c)) // warm-up, not counted
			var keyed, bare []batch
			for range pairs {
				k, bb := runBoth(n)
				keyed, bare = append(keyed, k), append(bare, bb)
			}
			reportPairs(b, c, keyed, bare)
			reportHistories(b, world, "b1-0")
		})
	}
}

// reportHistories prints the size of the keyed run's and the baseline's
// histories for the order id.
func reportHistories(b *testing.B, world *bundle, id string) {
	ke, kb, err := historySize(world.ctx, world.temporal, orders.NewOrderInput(world.tenant, id).WorkflowID())
	require.NoError(b, err)
	be, bb, err := historySize(world.ctx, world.temporal, "bare:"+world.tenant+":"+id)
	require.NoError(b, err)
	fmt.Printf("history per run: keyed %d events, %d bytes; bare %d events, %d bytes\n", ke, kb, be, bb)
}

// runKeyedOrder starts the order's keyed run and waits for it.
func runKeyedOrder(world *bundle, id string) error {
	st, err := orderflow.Start(world.ctx, world.temporal, orders.NewOrderInput(world.tenant, id),
		&orderflow.StartOpts{TaskQueue: world.taskQueue})
	if err != nil {
		return err
	}
	return world.temporal.GetWorkflow(world.ctx, st.WorkflowID, st.RunID).Get(world.ctx, nil)
}

// runBareOrder starts the baseline's run for the order and waits for it.
func runBareOrder(world *bundle, queue, id string) error {
	run, err := world.temporal.ExecuteWorkflow(world.ctx, client.StartWorkflowOptions{
		ID: "bare:" + world.tenant + ":" + id, TaskQueue: queue,
	}, "BareWorkflow", orders.NewOrderInput(world.tenant, id))
	if err != nil {
		return err
	}
	return run.Get(world.ctx, nil)
}

// startBenchWorkers starts, with the same options, keyed's worker on the
// world's task queue and the baseline's worker on a queue of its own, which
// it returns; both stop when the benchmark ends.
func startBenchWorkers(b *testing.B, world *bundle) (bareQueue string) {
	w := worker.New(world.temporal, world.taskQueue, benchWorkerOptions())
	require.NoError(b, pipeline.Register(w, workflows.Pipelines(), world.deps, nil))
	bareQueue = world.taskQueue + "-bare"
	bw := worker.New(world.temporal, bareQueue, benchWorkerOptions())
	bw.RegisterWorkflowWithOptions(bareWorkflow, workflow.RegisterOptions{Name: "BareWorkflow"})
	for _, name := range []string{"BareA", "BareB", "BareC"} {
		bw.RegisterActivityWithOptions(bareActivity, activity.RegisterOptions{Name: name})
	}
	require.NoError(b, w.Start())
	b.Cleanup(w.Stop)
	require.NoError(b, bw.Start())
	b.Cleanup(bw.Stop)
	return bareQueue
}

// median returns the median of f over bs (the mean of the middle two for
// an even count).
func median(bs []batch, f func(batch) float64) float64 {
	v := make([]float64, len(bs))
	for i, x := range bs {
		v[i] = f(x)
	}
	return medianOf(v)
}

func medianOf(v []float64) float64 {
	slices.Sort(v)
	if len(v)%2 == 0 {
		return (v[len(v)/2-1] + v[len(v)/2]) / 2
	}
	return v[len(v)/2]
}

func reportPairs(b *testing.B, c int, keyed, bare []batch) {
	rate := func(x batch) float64 { return x.rate }
	p50 := func(x batch) float64 { return float64(x.p50.Milliseconds()) }
	p99 := func(x batch) float64 { return float64(x.p99.Milliseconds()) }
	cpu := func(x batch) float64 { return float64(x.cpu.total().Microseconds()) / 1000 }
	ratios := make([]float64, len(keyed))
	for i := range keyed {
		ratios[i] = keyed[i].rate / bare[i].rate
		fmt.Printf("pipeline C=%d pair %d: keyed %.1f wf/s (p50 %v, p99 %v)  bare %.1f wf/s (p50 %v, p99 %v)  ratio %.2f\n",
			c, i+1, keyed[i].rate, keyed[i].p50.Round(time.Millisecond), keyed[i].p99.Round(time.Millisecond),
			bare[i].rate, bare[i].p50.Round(time.Millisecond), bare[i].p99.Round(time.Millisecond), ratios[i])
		fmt.Printf("  keyed %v\n  bare  %v\n", keyed[i].cpu, bare[i].cpu)
	}
	kr, br, ratio := median(keyed, rate), median(bare, rate), medianOf(ratios)
	kc, bc := median(keyed, cpu), median(bare, cpu)
	fmt.Printf("pipeline C=%d median: keyed %.1f wf/s, bare %.1f wf/s, pair ratio %.2f (goal >= 0.90); CPU per run keyed %.1f ms, bare %.1f ms, bare/keyed %.2f\n",
		c, kr, br, ratio, kc, bc, bc/kc)
	b.ReportMetric(kr, "keyed-wf/s")
	b.ReportMetric(br, "bare-wf/s")
	b.ReportMetric(ratio, "ratio")
	b.ReportMetric(bc/kc, "cpu-ratio")
	b.ReportMetric(median(keyed, p50), "keyed-p50-ms")
	b.ReportMetric(median(keyed, p99), "keyed-p99-ms")
	b.ReportMetric(median(bare, p50), "bare-p50-ms")
	b.ReportMetric(median(bare, p99), "bare-p99-ms")
}
