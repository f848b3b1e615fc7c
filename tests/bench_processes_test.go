package tests

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/keyedhq/keyed/internal/proccpu"
	"github.com/keyedhq/keyed/orders"
	orderflow "github.com/keyedhq/keyed/workflows/order"
)

// envBareWorker, set to a task queue, makes the test binary run as the
// bare-k8 worker of BenchmarkPipelineProcesses on that queue (TestMain),
// against the dev server at TEMPORAL_ADDRESS, until SIGTERM.
const envBareWorker = "KEYED_BENCH_BARE_WORKER"

// runBareWorker is the bare-k8 worker process: BareWorkflow and its three
// no-op activities with keyed's default worker options.
func runBareWorker(queue string) int {
	c, err := client.Dial(client.Options{HostPort: os.Getenv("TEMPORAL_ADDRESS"), Logger: quietSDK()})
	if err != nil {
		fmt.Fprintln(os.Stderr, "bare worker: dial:", err)
		return 1
	}
	defer c.Close()
	w := worker.New(c, queue, benchWorkerOptions())
	w.RegisterWorkflowWithOptions(bareWorkflow, workflow.RegisterOptions{Name: "BareWorkflow"})
	for _, name := range []string{"BareA", "BareB", "BareC"} {
		w.RegisterActivityWithOptions(bareActivity, activity.RegisterOptions{Name: name})
	}
	if err := w.Run(worker.InterruptCh()); err != nil {
		fmt.Fprintln(os.Stderr, "bare worker:", err)
		return 1
	}
	return 0
}

// catalogState says whether autovacuum runs and how many dead rows the
// catalogs keyed's side reads hold: with autovacuum off, the schemas that
// tests create and drop pile them up, and keyed's backends pay for them
// (VACUUM the catalogs to compare runs).
func catalogState(ctx context.Context, b *testing.B, pool *pgxpool.Pool) string {
	var autovacuum string
	var attribute, class int64
	err := pool.QueryRow(ctx, `SELECT current_setting('autovacuum'),
	coalesce((SELECT n_dead_tup FROM pg_stat_sys_tables WHERE relname = 'pg_attribute'), 0),
	coalesce((SELECT n_dead_tup FROM pg_stat_sys_tables WHERE relname = 'pg_class'), 0)`).Scan(&autovacuum, &attribute, &class)
	require.NoError(b, err)
	return fmt.Sprintf("autovacuum %s; dead catalog rows: pg_attribute %d, pg_class %d", autovacuum, attribute, class)
}

// BenchmarkPipelineProcesses measures keyed's shipped worker binary
// (cmd/worker: relay, prune, settler, metrics and info logs on; the
// reconciliation off) beside bare-k8, a worker of three no-op activities
// with keyed's step activity options and default worker options, each in
// its own process on one dev server, in three shapes: open (BENCH_N runs,
// default 300, started by C starters at once, then awaited), closed (C
// clients each starting a run and waiting for it) and open-relay (open,
// keyed's orders committed with their outbox rows as the API does and
// started by the worker's relay). BENCH_C (default "20,50") lists the
// concurrencies, BENCH_SHAPES (default all) the shapes; BENCH_ROUNDS
// (default 4) rounds per C alternate which side goes first. Each batch
// starts on a quiet machine and its CPU counts the work its runs left the
// dev server and Postgres (waitQuiet). It prints at each C whether
// Postgres runs autovacuum and the catalogs' dead rows (catalogState),
// then each round, the medians of wf/s and p50/p99/max latency, the CPU per workflow
// of each process (dev server, worker, the worker's Postgres backends,
// this process: starters and fakes), the dev server's calls per run by
// service and operation (with its history tasks and visibility writes), and, from every run's history, the events and
// bytes per run, activity tasks per run, timeouts, and the longest gap
// between two events of any run with the two events. BENCH_BARE_START=keyed
// gives bare-k8's starts keyed's start options (search attributes,
// summary, fairness priority); a list of attrs, summary and priority gives
// those.
func BenchmarkPipelineProcesses(b *testing.B) {
	n, rounds := envInt("BENCH_N", 300), envInt("BENCH_ROUNDS", 4)
	workerBin := buildWorker(b)
	for _, c := range envInts("BENCH_C", 20, 50) {
		b.Run(fmt.Sprintf("C=%d", c), func(b *testing.B) {
			world := setup(b)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
			b.Cleanup(cancel)
			fmt.Printf("pipeline C=%d: Postgres %s\n", c, catalogState(ctx, b, world.pool))
			bareQueue := world.taskQueue + "-bare"
			appName := "keyed-bench-" + world.tenant
			env, healthz := keyedWorkerEnv(b, world, appName)
			keyedPID, exited := startProcess(b, workerBin, "keyed-worker", env)
			waitHealthy(b, healthz, exited)
			barePID, _ := startProcess(b, os.Args[0], "bare-worker", []string{envBareWorker + "=" + bareQueue, "TEMPORAL_ADDRESS=" + temporalAddr})
			backends := func() []int {
				var pids []int
				rows, err := world.pool.Query(ctx, "SELECT pid FROM pg_stat_activity WHERE application_name = $1", appName)
				require.NoError(b, err)
				for rows.Next() {
					var pid int
					require.NoError(b, rows.Scan(&pid))
					pids = append(pids, pid)
				}
				require.NoError(b, rows.Err())
				return pids
			}
			keyed := side{name: "keyed", pid: keyedPID, backends: backends,
				start: func(id string) (string, string, error) {
					st, err := orderflow.Start(ctx, world.temporal, orders.NewOrderInput(world.tenant, id), &orderflow.StartOpts{TaskQueue: world.taskQueue})
					if err != nil {
						return "", "", err
					}
					return st.WorkflowID, st.RunID, nil
				}}
			bare := side{name: "bare-k8", pid: barePID,
				start: func(id string) (string, string, error) {
					o, err := bareStartOptions(orders.NewOrderInput(world.tenant, id), os.Getenv("BENCH_BARE_START"))
					if err != nil {
						return "", "", err
					}
					o.ID, o.TaskQueue = "bare:"+world.tenant+":"+id, bareQueue
					run, err := world.temporal.ExecuteWorkflow(ctx, o, "BareWorkflow", orders.NewOrderInput(world.tenant, id))
					if err != nil {
						return "", "", err
					}
					return run.GetID(), run.GetRunID(), nil
				}}
			for _, s := range []*side{&keyed, &bare} {
				s.await = func(wfID, runID string) error { return world.temporal.GetWorkflow(ctx, wfID, runID).Get(ctx, nil) }
			}
			// A relayed run is awaited once its outbox row is sent, by the run
			// ID the relay stored: asking the dev server for a run that does
			// not exist yet would charge keyed the server's answers to the
			// harness's polls, and a run awaited without its run ID costs the
			// server a DescribeWorkflowExecution and a history read more.
			sent := watchSent(ctx, b, world.pool)
			// keyed's runs started by the worker's relay from outbox rows, as the
			// API enqueues them: its start is the commit of the order and its
			// row, and the relay starts the run eagerly in the worker.
			relayed := side{name: "keyed-relay", pid: keyedPID, backends: backends,
				start: func(id string) (string, string, error) {
					in := orders.NewOrderInput(world.tenant, id)
					err := pgx.BeginFunc(ctx, world.pool, func(tx pgx.Tx) error {
						_, _, err := world.orders.CreateAndEnqueueTx(ctx, tx, orders.NewOrder{TenantID: world.tenant, ID: id, AmountMinor: 1000,
							Currency: "eur", CustomerEmail: "ada@example.com", PaymentMethod: "pm_card_visa"})
						return err
					})
					return in.WorkflowID(), "", err
				},
				await: func(wfID, _ string) error {
					runID, err := sent.wait(ctx, wfID)
					if err != nil {
						return err
					}
					return world.temporal.GetWorkflow(ctx, wfID, runID).Get(ctx, nil)
				}}
			round := 0
			newIDs := func(n int, create bool) []string {
				ids := make([]string, n)
				for i := range ids {
					ids[i] = fmt.Sprintf("p%d-%d", round, i)
					if create { // world.order's context ends after 3 minutes
						_, _, err := world.orders.Create(ctx, orders.NewOrder{TenantID: world.tenant, ID: ids[i], AmountMinor: 1000 + int64(i),
							Currency: "eur", CustomerEmail: "ada@example.com", PaymentMethod: "pm_card_visa"})
						require.NoError(b, err)
					}
				}
				round++
				return ids
			}
			type result struct{ keyed, bare batch }
			results := map[string][]result{}
			for r := -1; r < rounds; r++ { // round -1 warms up, not counted
				for _, sh := range benchShapes() {
					size := n
					if r < 0 {
						size = max(n/4, c)
					}
					k := &keyed
					if sh.relay {
						k = &relayed
					}
					ids, fresh := newIDs(size, true), newIDs(size, !sh.relay)
					var res result
					if r%2 == 0 {
						res.keyed, res.bare = sh.run(b, k, fresh, c), sh.run(b, &bare, ids, c)
					} else {
						res.bare, res.keyed = sh.run(b, &bare, ids, c), sh.run(b, k, fresh, c)
					}
					if r < 0 {
						continue
					}
					results[sh.name] = append(results[sh.name], res)
					fmt.Printf("pipeline %s C=%d round %d: keyed %s\n                           bare-k8 %s\n", sh.name, c, r+1, res.keyed, res.bare)
					hs := histories(ctx, b, world.temporal, res.keyed.runs)
					hb := histories(ctx, b, world.temporal, res.bare.runs)
					fmt.Printf("  keyed histories: %s\n  bare-k8 histories: %s\n", hs, hb)
					fmt.Printf("  keyed server calls per run: %s\n  bare-k8 server calls per run: %s\n", res.keyed.calls, res.bare.calls)
				}
			}
			for _, sh := range benchShapes() {
				var k, bb []batch
				for _, r := range results[sh.name] {
					k, bb = append(k, r.keyed), append(bb, r.bare)
				}
				reportShape(b, sh.name, c, k, bb)
			}
		})
	}
}

// envInts returns the comma-separated positive integers of the variable
// name, or def when it is unset or holds none.
func envInts(name string, def ...int) []int {
	var out []int
	for _, f := range strings.Split(os.Getenv(name), ",") {
		if v, err := strconv.Atoi(strings.TrimSpace(f)); err == nil && v > 0 {
			out = append(out, v)
		}
	}
	if len(out) == 0 {
		return def
	}
	return out
}

// side is one of the two pipelines a round runs: how to start a run of an
// order and wait for it, and its worker's process.
type side struct {
	name string
	pid  int
	// backends lists the Postgres backends of the side's worker.
	backends func() []int
	start    func(id string) (workflowID, runID string, err error)
	await    func(workflowID, runID string) error
}

// backendPIDs returns the side's Postgres backends, none without a
// database.
func (s *side) backendPIDs() []int {
	if s.backends == nil {
		return nil
	}
	return s.backends()
}

// sampleCPUFor is sampleCPUOf with Postgres counted as the backends pg
// only: other jobs share the server, and backends that come or go between
// two samples would count theirs.
func sampleCPUFor(workerPID int, pg []int) cpuSample {
	s := sampleCPUOf(workerPID)
	s.postgres = 0
	for _, p := range pg {
		s.postgres += proccpu.Of(strconv.Itoa(p))
	}
	return s
}

// sentWatcher tells when the relay has sent an outbox row, and the run it
// started: one query every 20 ms over the rows still awaited.
type sentWatcher struct {
	mu      sync.Mutex
	pending map[string]chan string
}

// watchSent starts a sentWatcher on pool's keyed_outbox until ctx ends.
func watchSent(ctx context.Context, b testing.TB, pool *pgxpool.Pool) *sentWatcher {
	w := &sentWatcher{pending: map[string]chan string{}}
	go func() {
		for ctx.Err() == nil {
			time.Sleep(20 * time.Millisecond)
			w.mu.Lock()
			ids := slices.Collect(maps.Keys(w.pending))
			w.mu.Unlock()
			if len(ids) == 0 {
				continue
			}
			rows, err := pool.Query(ctx, `SELECT workflow_id, coalesce(run_id, '') FROM keyed_outbox WHERE workflow_id = ANY($1) AND sent_at IS NOT NULL`, ids)
			if err != nil {
				if ctx.Err() == nil {
					b.Errorf("watch the outbox: %v", err)
				}
				return
			}
			done, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (r [2]string, err error) {
				return r, row.Scan(&r[0], &r[1])
			})
			if err != nil && ctx.Err() == nil {
				b.Errorf("watch the outbox: %v", err)
				return
			}
			w.mu.Lock()
			for _, row := range done {
				w.pending[row[0]] <- row[1]
				delete(w.pending, row[0])
			}
			w.mu.Unlock()
		}
	}()
	return w
}

// wait returns, once the row of workflowID is sent, the ID of the run the
// relay started, or ctx's error.
func (w *sentWatcher) wait(ctx context.Context, workflowID string) (string, error) {
	w.mu.Lock()
	ch, ok := w.pending[workflowID]
	if !ok {
		ch = make(chan string, 1)
		w.pending[workflowID] = ch
	}
	w.mu.Unlock()
	select {
	case runID := <-ch:
		return runID, nil
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

// shape is a way to offer a batch of runs: open or closed loop, and for
// keyed started by the benchmark or by the worker's relay.
type shape struct {
	name  string
	run   func(b testing.TB, s *side, ids []string, c int) batch
	relay bool
}

var shapes = []shape{{"open", runOpen, false}, {"closed", runClosed, false}, {"open-relay", runOpen, true}}

// benchShapes returns the shapes BENCH_SHAPES names (comma-separated), or
// all of them when it names none.
func benchShapes() []shape {
	var out []shape
	for _, name := range strings.Split(os.Getenv("BENCH_SHAPES"), ",") {
		if i := slices.IndexFunc(shapes, func(s shape) bool { return s.name == strings.TrimSpace(name) }); i >= 0 {
			out = append(out, shapes[i])
		}
	}
	if len(out) == 0 {
		return shapes
	}
	return out
}

// runOpen starts every run of ids from c starters at once and then waits
// for all of them; a run's latency is from its start call to its close.
func runOpen(b testing.TB, s *side, ids []string, c int) batch {
	b.Helper()
	n := len(ids)
	lat, runs := make([]time.Duration, n), make([][2]string, n)
	sem := make(chan struct{}, c)
	errs := make(chan error, n)
	var wg sync.WaitGroup
	pg := s.backendPIDs()
	waitQuiet(quietLimit)
	calls0, cpu0, begin := readServerCalls(b), sampleCPUFor(s.pid, pg), time.Now()
	for i, id := range ids {
		wg.Go(func() {
			sem <- struct{}{}
			t0 := time.Now()
			wfID, runID, err := s.start(id)
			<-sem
			if err == nil {
				err = s.await(wfID, runID)
			}
			if err != nil {
				errs <- err
				return
			}
			lat[i], runs[i] = time.Since(t0), [2]string{wfID, runID}
		})
	}
	wg.Wait()
	return finish(b, errs, begin, calls0, cpu0, s.pid, pg, lat, runs)
}

// runClosed runs ids from c clients, each starting a run and waiting for
// it before the next.
func runClosed(b testing.TB, s *side, ids []string, c int) batch {
	b.Helper()
	n := len(ids)
	lat, runs := make([]time.Duration, n), make([][2]string, n)
	next := make(chan int, n)
	for i := range n {
		next <- i
	}
	close(next)
	errs := make(chan error, n)
	var wg sync.WaitGroup
	pg := s.backendPIDs()
	waitQuiet(quietLimit)
	calls0, cpu0, begin := readServerCalls(b), sampleCPUFor(s.pid, pg), time.Now()
	for range c {
		wg.Go(func() {
			for i := range next {
				t0 := time.Now()
				wfID, runID, err := s.start(ids[i])
				if err == nil {
					err = s.await(wfID, runID)
				}
				if err != nil {
					errs <- err
					return
				}
				lat[i], runs[i] = time.Since(t0), [2]string{wfID, runID}
			}
		})
	}
	wg.Wait()
	return finish(b, errs, begin, calls0, cpu0, s.pid, pg, lat, runs)
}

func finish(b testing.TB, errs chan error, begin time.Time, calls0 serverCalls, cpu0 cpuSample, pid int, pg []int, lat []time.Duration, runs [][2]string) batch {
	b.Helper()
	elapsed := time.Since(begin)
	// The batch's CPU counts the deferred work its runs left the dev
	// server and Postgres (waitQuiet).
	quiet := waitQuiet(quietLimit)
	cpu := sampleCPUFor(pid, pg).sub(cpu0, len(lat))
	calls := readServerCalls(b).perRun(calls0, len(lat))
	close(errs)
	for err := range errs {
		require.NoError(b, err)
	}
	// The runs in the order of their latency, slowest last.
	idx := make([]int, len(lat))
	for i := range idx {
		idx[i] = i
	}
	slices.SortFunc(idx, func(x, y int) int { return int(lat[x] - lat[y]) })
	sorted := make([]time.Duration, len(lat))
	byLat := make([][2]string, len(lat))
	for j, i := range idx {
		sorted[j], byLat[j] = lat[i], runs[i]
	}
	n := len(sorted)
	return batch{rate: float64(n) / elapsed.Seconds(), p50: sorted[n/2], p99: sorted[n*99/100], max: sorted[n-1], cpu: cpu, runs: byLat, calls: calls, quiet: quiet}
}

func (x batch) String() string {
	return fmt.Sprintf("%.1f wf/s, p50 %v, p99 %v, max %v; %v; quiet %v after", x.rate, x.p50.Round(time.Millisecond),
		x.p99.Round(time.Millisecond), x.max.Round(time.Millisecond), x.cpu, x.quiet.Round(10*time.Millisecond))
}

// reportShape prints the medians of a shape's rounds at concurrency c.
func reportShape(b *testing.B, name string, c int, keyed, bare []batch) {
	rate := func(x batch) float64 { return x.rate }
	ms := func(f func(batch) time.Duration) func(batch) float64 {
		return func(x batch) float64 { return float64(f(x).Microseconds()) / 1000 }
	}
	p50, p99, mx := ms(func(x batch) time.Duration { return x.p50 }), ms(func(x batch) time.Duration { return x.p99 }), ms(func(x batch) time.Duration { return x.max })
	cpuOf := func(f func(cpuSample) time.Duration) func(batch) float64 {
		return func(x batch) float64 { return float64(f(x.cpu).Microseconds()) / 1000 }
	}
	server, wk := cpuOf(func(s cpuSample) time.Duration { return s.server }), cpuOf(func(s cpuSample) time.Duration { return s.worker })
	pg, self := cpuOf(func(s cpuSample) time.Duration { return s.postgres }), cpuOf(func(s cpuSample) time.Duration { return s.self })
	total := cpuOf(func(s cpuSample) time.Duration { return s.total() })
	ratios := make([]float64, len(keyed))
	for i := range keyed {
		ratios[i] = keyed[i].rate / bare[i].rate
	}
	line := func(who string, bs []batch) string {
		return fmt.Sprintf("%s %.1f wf/s, p50 %.0f ms, p99 %.0f ms, max %.0f ms; CPU ms/wf %.1f (server %.1f / worker %.1f / postgres %.1f; starters+fakes %.1f)",
			who, median(bs, rate), median(bs, p50), median(bs, p99), median(bs, mx), median(bs, total), median(bs, server), median(bs, wk), median(bs, pg), median(bs, self))
	}
	fmt.Printf("pipeline %s C=%d median of %d rounds: keyed/bare-k8 %.2f (rounds %.2f)\n  %s\n  %s\n", name, c, len(keyed),
		medianOf(slices.Clone(ratios)), ratios, line("keyed  ", keyed), line("bare-k8", bare))
	b.ReportMetric(medianOf(ratios), name+"-ratio")
	b.ReportMetric(median(keyed, p99), name+"-keyed-p99-ms")
	b.ReportMetric(median(keyed, mx), name+"-keyed-max-ms")
}

// bareStartOptions returns bare-k8's start options for in: none, or those
// parts of keyed's that which names ("keyed": all; or a comma-separated
// list of attrs, summary and priority).
func bareStartOptions(in orders.OrderInput, which string) (client.StartWorkflowOptions, error) {
	if which == "" {
		return client.StartWorkflowOptions{}, nil
	}
	k, err := orderflow.StartOptions(in, nil)
	if err != nil || which == "keyed" {
		return k, err
	}
	var o client.StartWorkflowOptions
	for part := range strings.SplitSeq(which, ",") {
		switch part {
		case "attrs":
			o.TypedSearchAttributes = k.TypedSearchAttributes
		case "summary":
			o.StaticSummary = k.StaticSummary
		case "priority":
			o.Priority = k.Priority
		case "policy":
			o.WorkflowIDConflictPolicy, o.WorkflowIDReusePolicy = k.WorkflowIDConflictPolicy, k.WorkflowIDReusePolicy
		default:
			return o, fmt.Errorf("BENCH_BARE_START: %q is not keyed, attrs, summary, priority or policy", part)
		}
	}
	return o, nil
}

// historyStats sums what the histories of a batch's runs hold.
type historyStats struct {
	runs, events, bytes, activityTasks, timeouts int
	// gap is the longest time between two events of one run, between the
	// events named in gapAt, in the run gapRun.
	gap           time.Duration
	gapAt, gapRun string
	// spent sums, by pair of consecutive event types, the time between
	// them: where a run's time goes.
	spent map[string]time.Duration
}

func (h historyStats) String() string {
	if h.runs == 0 {
		return "none"
	}
	return fmt.Sprintf("%.1f events, %.0f bytes, %.2f activity tasks per run; %d timeouts; longest gap %v (%s in %s); per run: %s",
		float64(h.events)/float64(h.runs), float64(h.bytes)/float64(h.runs), float64(h.activityTasks)/float64(h.runs),
		h.timeouts, h.gap.Round(time.Millisecond), h.gapAt, h.gapRun, h.topSpent(5))
}

// topSpent names the n pairs of events with the most time between them,
// with the mean time per run.
func (h historyStats) topSpent(n int) string {
	pairs := slices.SortedFunc(maps.Keys(h.spent), func(a, b string) int { return cmp.Compare(h.spent[b], h.spent[a]) })
	var out []string
	for _, p := range pairs[:min(n, len(pairs))] {
		out = append(out, fmt.Sprintf("%s %v", p, (h.spent[p]/time.Duration(h.runs)).Round(time.Millisecond)))
	}
	return strings.Join(out, ", ")
}

// histories reads the history of every run and sums it up.
func histories(ctx context.Context, b testing.TB, c client.Client, runs [][2]string) historyStats {
	b.Helper()
	var mu sync.Mutex
	sum := historyStats{spent: map[string]time.Duration{}}
	sem := make(chan struct{}, 8)
	var wg sync.WaitGroup
	for _, r := range runs {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			h, err := runHistory(ctx, c, r[0], r[1])
			require.NoError(b, err)
			mu.Lock()
			defer mu.Unlock()
			sum.runs++
			sum.events += h.events
			sum.bytes += h.bytes
			sum.activityTasks += h.activityTasks
			sum.timeouts += h.timeouts
			if h.gap > sum.gap {
				sum.gap, sum.gapAt, sum.gapRun = h.gap, h.gapAt, r[0]
			}
			for p, d := range h.spent {
				sum.spent[p] += d
			}
		})
	}
	wg.Wait()
	return sum
}

// runHistory reads one run's history: its events, their encoded size, its
// activity tasks (attempts started), its timeouts of activity and workflow
// tasks, and the longest time between two events.
func runHistory(ctx context.Context, c client.Client, workflowID, runID string) (historyStats, error) {
	h := historyStats{runs: 1, spent: map[string]time.Duration{}}
	it := c.GetWorkflowHistory(ctx, workflowID, runID, false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	var prevT time.Time
	var prevType enumspb.EventType
	for it.HasNext() {
		e, err := it.Next()
		if err != nil {
			return h, fmt.Errorf("read the history of %s: %w", workflowID, err)
		}
		h.events++
		h.bytes += protoSize(e)
		switch e.GetEventType() {
		case enumspb.EVENT_TYPE_ACTIVITY_TASK_STARTED:
			h.activityTasks++
		case enumspb.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT, enumspb.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT:
			h.timeouts++
		}
		t := e.GetEventTime().AsTime()
		pair := shortType(prevType) + " → " + shortType(e.GetEventType())
		if !prevT.IsZero() {
			h.spent[pair] += t.Sub(prevT)
		}
		if !prevT.IsZero() && t.Sub(prevT) > h.gap {
			h.gap, h.gapAt = t.Sub(prevT), pair
		}
		prevT, prevType = t, e.GetEventType()
	}
	return h, nil
}

func shortType(t enumspb.EventType) string {
	s := t.String()
	const p = "EVENT_TYPE_"
	if len(s) > len(p) && s[:len(p)] == p {
		return s[len(p):]
	}
	return s
}

// keyedWorkerEnv is the shipped worker's configuration for world: its
// schema (its connections named appName), task queue and fakes, a metrics port of its own, info logs, no
// reconciliation schedule. WORKER_* settings come from the environment.
func keyedWorkerEnv(b testing.TB, world *bundle, appName string) (env []string, healthz string) {
	b.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(b, err)
	port := l.Addr().(*net.TCPAddr).Port
	require.NoError(b, l.Close())
	healthz = "http://127.0.0.1:" + strconv.Itoa(port) + "/healthz"
	return append([]string{
		"DATABASE_URL=" + world.dbURL + "&application_name=" + appName, "TEMPORAL_ADDRESS=" + temporalAddr, "TEMPORAL_TASK_QUEUE=" + world.taskQueue,
		"METRICS_ADDR=127.0.0.1:" + strconv.Itoa(port), "LOG_LEVEL=info", "RECONCILE_EVERY=0",
	}, world.workerEnv()...), healthz
}

// waitHealthy waits until url answers 200 or the process behind it exits.
func waitHealthy(b testing.TB, url string, exited <-chan struct{}) {
	b.Helper()
	for range 600 {
		select {
		case <-exited:
			b.Fatalf("the worker exited before %s answered; see its log above", url)
		case <-time.After(100 * time.Millisecond):
		}
		resp, err := http.Get(url)
		if err == nil {
			require.NoError(b, resp.Body.Close())
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
	}
	b.Fatalf("%s did not answer 200 within a minute", url)
}

// startProcess starts bin with env added to this process's environment,
// its output in a log file of the benchmark's, and stops it with SIGTERM
// when the benchmark ends. It returns the process ID and a channel closed
// when the process exits.
func startProcess(b testing.TB, bin, name string, env []string) (int, <-chan struct{}) {
	b.Helper()
	logPath := filepath.Join(b.TempDir(), name+".log")
	logFile, err := os.Create(logPath)
	require.NoError(b, err)
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	require.NoError(b, cmd.Start(), "start %s", name)
	exited := make(chan struct{})
	var waitErr error
	go func() {
		waitErr = cmd.Wait()
		close(exited)
	}()
	b.Cleanup(func() {
		if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
			b.Logf("stop %s: %v", name, err)
		}
		<-exited
		if err := waitErr; err != nil {
			tail, rerr := os.ReadFile(logPath)
			require.NoError(b, rerr)
			if len(tail) > 2000 {
				tail = tail[len(tail)-2000:]
			}
			b.Logf("%s exited: %v\n%s", name, err, tail)
		}
		require.NoError(b, logFile.Close())
	})
	return cmd.Process.Pid, exited
}
