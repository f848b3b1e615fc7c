package tests

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/keyedhq/keyed/internal/logbuf"
	"github.com/keyedhq/keyed/internal/pgcluster"
)

// The application names of the fault test's connections: the workers' are
// the ones pg_terminate_backend aims at, the test's own are spared.
const (
	faultWorkerApp = "keyed-fault-worker"
	faultTestApp   = "keyed-fault-test"
)

// faultWorld is one sub-run of the fault test: a bundle whose database is a
// private Postgres cluster (so that it can be restarted), two real worker
// processes, and the record of every fault dealt.
type faultWorld struct {
	*bundle
	cluster *pgcluster.Cluster
	addr    string   // the Temporal frontend the workers and the test dial
	env     []string // more worker settings, after the world's own
	bin     string
	policy  string
	began   time.Time

	mu      sync.Mutex
	workers []*faultWorker // one per slot
	all     []*faultWorker // every worker process spawned, for the log summary
	events  []string       // the faults dealt, with their time, for failure output
	figs    faultFigures
}

// faultFigures counts what a sub-run did.
type faultFigures struct {
	kills, terminations, backends, restarts int
	startRetries                            int // orderflow.Start calls retried after an error
}

// faultWorker is one worker process and its output.
type faultWorker struct {
	name   string
	cmd    *exec.Cmd
	out    *logbuf.Buffer
	done   chan struct{} // closed when the process has exited
	exit   error         // cmd.Wait's error, set before done is closed
	killed atomic.Bool
}

// kill SIGKILLs the process and waits until it has exited.
func (w *faultWorker) kill() {
	w.killed.Store(true)
	if err := w.cmd.Process.Signal(syscall.SIGKILL); err != nil && !errors.Is(err, os.ErrProcessDone) {
		panic(fmt.Sprintf("kill %s: %v", w.name, err)) // only a bad PID; cannot happen
	}
	<-w.done
}

// exitedByItself returns a description of the process's exit if it ended
// without being killed, with the end of its output.
func (w *faultWorker) exitedByItself() (string, bool) {
	select {
	case <-w.done:
	default:
		return "", false
	}
	if w.killed.Load() {
		return "", false
	}
	lines := strings.Split(strings.TrimSpace(w.out.String()), "\n")
	return fmt.Sprintf("%s exited by itself (%v); its last lines:\n    %s", w.name, w.exit,
		strings.Join(lines[max(len(lines)-15, 0):], "\n    ")), true
}

// newFaultWorld builds a sub-run's world: a private cluster with keyed's
// migrations, the fakes, a Temporal client, and a tenant and task queue of
// its own. It spawns no worker yet.
func newFaultWorld(t *testing.T, ctx context.Context, bin, policy string) *faultWorld {
	t.Helper()
	return newFaultWorldOn(t, ctx, bin, policy, pgcluster.New(t, nil), temporalAddr, 2)
}

// newFaultWorldOn builds a sub-run's world on cluster (keyed's migrations
// applied) and the Temporal frontend addr, with the given worker slots.
func newFaultWorldOn(t testing.TB, ctx context.Context, bin, policy string, cluster *pgcluster.Cluster, addr string, slots int) *faultWorld {
	t.Helper()
	b := newBundle(t, ctx, cluster.URL()+"&application_name="+faultTestApp,
		cluster.URL()+"&application_name="+faultWorkerApp, "e2e-faults-", addr)
	w := &faultWorld{bundle: b, cluster: cluster, addr: addr, bin: bin, policy: policy, workers: make([]*faultWorker, slots)}
	t.Cleanup(func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		for _, p := range w.all {
			p.kill()
		}
	})
	return w
}

// spawn starts worker process slot i with the world's receipt
// policy, replacing whatever the slot held.
func (w *faultWorld) spawn(i int) error {
	cmd := exec.Command(w.bin)
	cmd.Env = append(os.Environ(),
		"DATABASE_URL="+w.dbURL,
		"TEMPORAL_ADDRESS="+w.addr,
		"TEMPORAL_NAMESPACE=default",
		"TEMPORAL_TASK_QUEUE="+w.taskQueue,
		"RECEIPT_POLICY="+w.policy,
		// The fake's index lags 2 s: a lost send is settled within seconds,
		// not after SendGrid's production margin of minutes.
		"SENDGRID_LOOKUP_LAG=10s",
		"SENDGRID_LOOKUP_GIVE_UP=30s",
		"METRICS_ADDR=127.0.0.1:0",
	)
	cmd.Env = append(append(cmd.Env, w.workerEnv()...), w.env...)
	out := &logbuf.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start worker: %w", err)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	p := &faultWorker{name: fmt.Sprintf("worker%d.%d", i, len(w.all)), cmd: cmd, out: out, done: make(chan struct{})}
	go func() {
		p.exit = cmd.Wait()
		close(p.done)
	}()
	w.workers[i] = p
	w.all = append(w.all, p)
	return nil
}

// event records a fault dealt, with the time since the run began.
func (w *faultWorld) event(format string, args ...any) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.events = append(w.events, fmt.Sprintf("%6.1fs ", time.Since(w.began).Seconds())+fmt.Sprintf(format, args...))
}

// killWorker SIGKILLs worker slot i and respawns it after a second.
func (w *faultWorld) killWorker(i int) error {
	w.mu.Lock()
	p := w.workers[i]
	w.figs.kills++
	w.mu.Unlock()
	p.kill()
	w.event("SIGKILL %s", p.name)
	time.Sleep(time.Second)
	return w.spawn(i)
}

// terminateBackends runs pg_terminate_backend on every connection of the
// workers, retrying through a Postgres restart, and returns how many it ended.
func (w *faultWorld) terminateBackends(ctx context.Context) (int, error) {
	var n int
	err := retryDB(ctx, func(ctx context.Context) error {
		return w.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))
FROM pg_stat_activity WHERE application_name = $1 AND pid <> pg_backend_pid()`, faultWorkerApp).Scan(&n)
	})
	if err != nil {
		return 0, fmt.Errorf("terminate the workers' backends: %w", err)
	}
	w.mu.Lock()
	w.figs.terminations++
	w.figs.backends += n
	w.mu.Unlock()
	w.event("pg_terminate_backend: %d worker connections", n)
	return n, nil
}

// restartPostgres restarts the private cluster in immediate mode: every
// connection drops mid-query and the server recovers as after a crash.
func (w *faultWorld) restartPostgres(ctx context.Context) error {
	start := time.Now()
	if err := w.cluster.Restart(ctx, pgcluster.Immediate); err != nil {
		return err
	}
	w.mu.Lock()
	w.figs.restarts++
	w.mu.Unlock()
	w.event("Postgres restarted (immediate) in %s", time.Since(start).Round(time.Millisecond))
	return nil
}

// supervise respawns, like an orchestrator, every worker slot whose process
// exited by itself (a worker refuses to start while Postgres is down).
func (w *faultWorld) supervise() error {
	for i := range w.workers {
		w.mu.Lock()
		p := w.workers[i]
		w.mu.Unlock()
		if p == nil {
			continue
		}
		if d, ok := p.exitedByItself(); ok {
			w.event("%s", strings.SplitN(d, ";", 2)[0])
			if err := w.spawn(i); err != nil {
				return err
			}
		}
	}
	return nil
}

// selfExits describes every worker process that exited without being
// killed by the test.
func (w *faultWorld) selfExits() []string {
	w.mu.Lock()
	procs := slices.Clone(w.all)
	w.mu.Unlock()
	var out []string
	for _, p := range procs {
		if d, ok := p.exitedByItself(); ok {
			out = append(out, d)
		}
	}
	return out
}

// retryDB runs fn until it succeeds, for up to a minute, so that the
// test's own database calls ride out the Postgres restart, which takes
// seconds on a loaded machine.
func retryDB(ctx context.Context, fn func(context.Context) error) error {
	deadline := time.Now().Add(time.Minute)
	for {
		err := fn(ctx)
		if err == nil || time.Now().After(deadline) || ctx.Err() != nil {
			return err
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// logSummary groups the warnings and errors the worker processes logged,
// with digits and IDs blanked so that one cause is one line, most frequent
// first, each with one example.
func (w *faultWorld) logSummary(limit int) string {
	w.mu.Lock()
	procs := slices.Clone(w.all)
	w.mu.Unlock()
	type group struct {
		n       int
		example string
	}
	groups := map[string]*group{}
	for _, p := range procs {
		for line := range strings.Lines(p.out.String()) {
			key, ok := logKey(line)
			if !ok {
				continue
			}
			g := groups[key]
			if g == nil {
				g = &group{example: p.name + ": " + truncate(strings.TrimSpace(line), 600)}
				groups[key] = g
			}
			g.n++
		}
	}
	keys := slices.SortedFunc(func(yield func(string) bool) {
		for k := range groups {
			if !yield(k) {
				return
			}
		}
	}, func(a, b string) int { return groups[b].n - groups[a].n })
	var sb strings.Builder
	for i, k := range keys {
		if i == limit {
			fmt.Fprintf(&sb, "  … %d more kinds\n", len(keys)-limit)
			break
		}
		fmt.Fprintf(&sb, "  %5d× %s\n         e.g. %s\n", groups[k].n, k, groups[k].example)
	}
	return sb.String()
}

var blank = regexp.MustCompile(`[0-9a-fA-F]{8,}|[0-9]+`)

// logKey returns the grouping key of a worker log line at WARN or ERROR
// level: its message and error with numbers and IDs blanked.
func logKey(line string) (string, bool) {
	var rec map[string]any
	if json.Unmarshal([]byte(line), &rec) != nil {
		if strings.Contains(line, "panic") || strings.Contains(line, "fatal") {
			return "unstructured: " + truncate(blank.ReplaceAllString(strings.TrimSpace(line), "#"), 200), true
		}
		return "", false
	}
	level, _ := rec["level"].(string)
	if level != "WARN" && level != "ERROR" {
		return "", false
	}
	key := level + " " + fmt.Sprint(rec["msg"])
	for _, f := range []string{"err", "error", "Error"} {
		if v, ok := rec[f]; ok {
			key += " | " + truncate(fmt.Sprint(v), 200)
		}
	}
	return blank.ReplaceAllString(key, "#"), true
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
