//go:build cluster

// The cluster tests run against a self-hosted Temporal cluster
// (internal/tempcluster) instead of the package's dev server. They take
// minutes, so they are behind the cluster build tag: `make test-cluster`
// runs them; `go test ./...` runs internal/tempcluster's short node-kill
// test instead.

package tests

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"

	"github.com/keyedhq/keyed/internal/config"
	"github.com/keyedhq/keyed/internal/fakefault"
	"github.com/keyedhq/keyed/internal/pgcluster"
	"github.com/keyedhq/keyed/internal/tempcluster"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/refunds"
)

// The cluster fault test's plan: orders, the share refunded, and when
// each fault is dealt after the first start.
const (
	clusterOrders      = 240
	clusterRefundEvery = 4 // every 4th order (not declined) gets two partial refunds
	clusterWorkers     = 3
	clusterSettle      = 240 * time.Second
	clusterNodeKillAt  = 12 * time.Second
	clusterNodeBackAt  = 27 * time.Second
	clusterPGRestartAt = 40 * time.Second
	clusterRefundParts = 2 // r1 = 999, r2 = 1000 of 1999
)

var clusterWorkerKills = []struct{ slot, at int }{{0, 7}, {1, 17}, {2, 24}, {0, 33}}

// startCluster starts a private Postgres and a two-node Temporal cluster on
// it, so that a Postgres restart hits Temporal's persistence and keyed's
// records at once.
func startCluster(t testing.TB, ctx context.Context) (*pgcluster.Cluster, *tempcluster.Cluster) {
	t.Helper()
	return startClusterOn(t, ctx, pgcluster.New(t, &pgcluster.Opts{Settings: map[string]string{"max_connections": "300"}}))
}

// startClusterOn starts a two-node Temporal cluster on pg, stopped when the
// test ends.
func startClusterOn(t testing.TB, ctx context.Context, pg *pgcluster.Cluster) (*pgcluster.Cluster, *tempcluster.Cluster) {
	t.Helper()
	tc, err := tempcluster.Start(ctx, &tempcluster.Opts{DatabaseURL: pg.URL(), UIPort: -1})
	require.NoError(t, err, "start the Temporal cluster (run `make tools` to build bin/temporal-server, bin/temporal-sql-tool and bin/temporal-ui)")
	t.Cleanup(func() {
		if err := tc.Stop(); err != nil {
			t.Logf("stop the Temporal cluster: %v", err)
		}
	})
	return pg, tc
}

// TestClusterFaults runs the fault test's shape on a two-node Temporal
// cluster with three worker processes: 240 orders (each started three
// times, a third through the outbox), two partial refunds of every 4th
// paid order (each started three times), the fakes' faults of TestFaults,
// four worker SIGKILLs, one Temporal server process SIGKILLed and started
// again 15 s later, and an immediate restart of the Postgres under both
// keyed and Temporal. It counts at the fakes: no double charge, no
// duplicate receipt, no refund twice or beyond the charge, every order
// settled; and it reports how long the node kill stalled a start probe.
func TestClusterFaults(t *testing.T) {
	bin := buildWorker(t)
	ctx, cancel := context.WithTimeout(context.Background(), clusterSettle+4*time.Minute)
	defer cancel()
	pg, tc := startCluster(t, ctx)
	w := newFaultWorldOn(t, ctx, bin, config.AtLeastOnce, pg, tc.Address(), clusterWorkers)
	plan := make([]*faultOrder, clusterOrders)
	refunded := map[string]bool{}
	for i := range plan {
		plan[i] = &faultOrder{id: fmt.Sprintf("o%03d", i), declined: i%37 == 5, outbox: i%3 == 0}
		refunded[plan[i].id] = i%clusterRefundEvery == 1 && !plan[i].declined
	}
	w.stripe.Inject(fakefault.Fault{Kind: fakefault.FaultDropResponse, Rate: 0.10})
	w.stripe.Inject(fakefault.Fault{Kind: fakefault.FaultServerError, Rate: 0.05})
	w.stripe.Inject(fakefault.Fault{Kind: fakefault.FaultRateLimit, Rate: 0.05})
	w.mail.Inject(fakefault.Fault{Kind: fakefault.FaultDropResponse, Rate: 0.05})
	w.mail.Inject(fakefault.Fault{Kind: fakefault.FaultServerError, Rate: 0.03})
	w.mail.SetIndexLag(2 * time.Second)
	for i := range clusterWorkers {
		require.NoError(t, w.spawn(i))
	}

	w.began = time.Now()
	settled := make(chan struct{})
	chaosDone := make(chan error, 1)
	probe := &startProbe{c: w.temporal, queue: "probe-" + randomID()}
	go func() { chaosDone <- w.clusterChaos(ctx, tc, settled, probe) }()
	var (
		starts   sync.WaitGroup
		mu       sync.Mutex
		startErr []error
		refundN  int
	)
	for i, o := range plan {
		starts.Go(func() {
			time.Sleep(startAt(i, len(plan)))
			err := w.startOrder(ctx, o)
			if err == nil && refunded[o.id] {
				err = w.refundOrder(ctx, o)
				mu.Lock()
				refundN += clusterRefundParts
				mu.Unlock()
			}
			if err != nil {
				mu.Lock()
				startErr = append(startErr, fmt.Errorf("order %s: %w", o.id, err))
				mu.Unlock()
			}
		})
	}
	starts.Wait()
	for _, err := range startErr {
		t.Errorf("start: %v", err)
	}
	settledIn, settleErr := w.waitSettled(ctx, clusterSettle)
	close(settled)
	require.NoError(t, <-chaosDone, "deal the faults")

	w.inspect(t, ctx, plan)
	doubleRefunds, overRefunds, refundsBad := w.inspectRefunds(t, plan, refunded)
	for _, o := range plan {
		if refunded[o.id] && o.status == orders.StatusRefunded {
			o.status = orders.StatusPaid // fine() judges the order run; the refunds are judged above
		}
	}
	t.Logf("cluster figures: nodes=%d workers=%d refunds=%d double_refunds=%d over_refunds=%d refunds_not_fine=%d "+
		"node_kill_probe_max=%s node_kill_probe_failed=%d probe_p50=%s probes=%d",
		tc.Nodes(), clusterWorkers, refundN, doubleRefunds, overRefunds, len(refundsBad),
		probe.maxAfterKill().Round(100*time.Millisecond), probe.failedAfterKill(), probe.p50().Round(time.Millisecond), probe.count())
	w.mu.Lock()
	t.Logf("faults dealt:\n  %s", strings.Join(w.events, "\n  "))
	w.mu.Unlock()
	for _, b := range refundsBad {
		t.Logf("refund not fine: %s", b)
	}
	w.report(t, plan, settledIn, settleErr)
	require.Zero(t, doubleRefunds, "refunds made twice at the fake")
	require.Zero(t, overRefunds, "orders refunded beyond their charge")
	require.LessOrEqual(t, len(refundsBad), refundN/100, "refunds needing a person (at most 1%%)")
}

// refundOrder waits for o's order run and, when it paid, refunds it in two
// parts, each started twice at once and once more a second later.
func (w *faultWorld) refundOrder(ctx context.Context, o *faultOrder) error {
	in := orders.NewOrderInput(w.tenant, o.id)
	if err := w.temporal.GetWorkflow(ctx, in.WorkflowID(), "").Get(ctx, nil); err != nil {
		return nil // not paid: nothing to refund; inspect reports the order
	}
	for i, amount := range []int64{999, 1000} {
		rin := refunds.NewInput(w.tenant, o.id, fmt.Sprintf("r%d", i+1), amount, "requested_by_customer")
		var twice sync.WaitGroup
		errs := make([]error, 3)
		for j := range 2 {
			twice.Go(func() { errs[j] = w.startRefund(ctx, rin) })
		}
		twice.Wait()
		time.Sleep(time.Second)
		errs[2] = w.startRefund(ctx, rin)
		for _, err := range errs {
			if err != nil {
				return fmt.Errorf("refund %s: %w", rin.RefundID, err)
			}
		}
		// The second part is asked for once the first is done, as a
		// support agent would.
		if err := w.awaitRun(ctx, rin.WorkflowID()); err != nil {
			return fmt.Errorf("refund %s: %w", rin.RefundID, err)
		}
	}
	return nil
}

// awaitRun waits for the run of workflowID to close and returns its
// failure, asking again (as a client would) when the call itself fails,
// such as while a Temporal node is down.
func (w *faultWorld) awaitRun(ctx context.Context, workflowID string) error {
	for try := 1; ; try++ {
		err := w.temporal.GetWorkflow(ctx, workflowID, "").Get(ctx, nil)
		var failed *temporal.WorkflowExecutionError
		if err == nil || errors.As(err, &failed) || try == 10 || ctx.Err() != nil {
			return err
		}
		time.Sleep(time.Second)
	}
}

// startRefund starts rin's run like a client that retries a failed call.
func (w *faultWorld) startRefund(ctx context.Context, rin refunds.RefundInput) error {
	for try := 1; ; try++ {
		_, err := startRefund(ctx, w.temporal, rin, w.taskQueue)
		if err == nil || try == 10 || ctx.Err() != nil {
			return err
		}
		w.mu.Lock()
		w.figs.startRetries++
		w.mu.Unlock()
		time.Sleep(time.Second)
	}
}

// inspectRefunds counts each refunded order's refunds at the fake: refunds
// made more than once, orders refunded beyond their 1999 charge, and
// refunds that did not end as one Stripe refund with the order refunded.
func (w *faultWorld) inspectRefunds(t *testing.T, plan []*faultOrder, refunded map[string]bool) (double, over int, bad []string) {
	t.Helper()
	for _, o := range plan {
		if !refunded[o.id] || o.status != orders.StatusRefunded && o.status != orders.StatusPaid && o.status != orders.StatusPartiallyRefunded {
			continue
		}
		var total int64
		for i, amount := range []int64{999, 1000} {
			rin := refunds.NewInput(w.tenant, o.id, fmt.Sprintf("r%d", i+1), amount, "requested_by_customer")
			key, err := rin.EffectKey(refunds.StepStripe)
			require.NoError(t, err)
			n := w.stripe.RefundsForMetadata("effect_key", key.String())
			double += b2i(n > 1)
			total += int64(n) * amount
			if n != 1 {
				bad = append(bad, fmt.Sprintf("%s r%d: %d Stripe refunds", o.id, i+1, n))
			}
		}
		over += b2i(total > 1999)
		if o.status != orders.StatusRefunded {
			bad = append(bad, fmt.Sprintf("%s: order %s after both refunds", o.id, o.status))
		}
	}
	return double, over, bad
}

// clusterChaos deals the faults until settled is closed: the worker kills,
// the Temporal node kill and restart, the Postgres restart and the backend
// terminations; it restarts a node that exits by itself, as an
// orchestrator would, and runs the start probe throughout.
func (w *faultWorld) clusterChaos(ctx context.Context, tc *tempcluster.Cluster, settled <-chan struct{}, probe *startProbe) error {
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	go probe.run(ctx, settled)
	kills, nodeKilled, nodeBack, restarted, nextTerm := 0, false, false, false, faultTerminateEvery
	for {
		select {
		case <-settled:
			return nil
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		if err := w.supervise(); err != nil {
			return err
		}
		for i, pid := range tc.PIDs() {
			if pid == 0 && (!nodeKilled || nodeBack || i != 1) {
				w.event("Temporal node %d exited by itself; starting it again:\n%s", i, tc.NodeLog(i, 10))
				if err := tc.StartNode(i); err != nil {
					return err
				}
			}
		}
		at := time.Since(w.began)
		switch {
		case kills < len(clusterWorkerKills) && at >= time.Duration(clusterWorkerKills[kills].at)*time.Second:
			if err := w.killWorker(clusterWorkerKills[kills].slot); err != nil {
				return err
			}
			kills++
		case !nodeKilled && at >= clusterNodeKillAt:
			if err := tc.Kill(1); err != nil {
				return err
			}
			probe.markKill()
			nodeKilled = true
			w.event("SIGKILL Temporal node 1")
		case nodeKilled && !nodeBack && at >= clusterNodeBackAt:
			start := time.Now()
			if err := tc.Restart(ctx, 1); err != nil {
				return err
			}
			nodeBack = true
			w.event("Temporal node 1 started again, serving in %s", time.Since(start).Round(time.Millisecond))
		case !restarted && at >= clusterPGRestartAt:
			if err := w.restartPostgres(ctx); err != nil {
				return err
			}
			restarted = true
		case at >= nextTerm:
			if _, err := w.terminateBackends(ctx); err != nil {
				return err
			}
			nextTerm = at + faultTerminateEvery
		}
	}
}

// startProbe starts a workflow with a fresh ID (on a queue no worker
// polls) every 250 ms and records how long each start took, so that a
// node kill's stall shows as the slowest or failed starts after it.
type startProbe struct {
	c     client.Client
	queue string

	mu       sync.Mutex
	killedAt time.Time
	took     []time.Duration
	after    []time.Duration // starts sent after the kill, failed ones as their time to fail
	failed   int
}

func (p *startProbe) run(ctx context.Context, settled <-chan struct{}) {
	for i := 0; ; i++ {
		select {
		case <-settled:
			return
		case <-ctx.Done():
			return
		case <-time.After(250 * time.Millisecond):
		}
		sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		began := time.Now()
		_, err := p.c.ExecuteWorkflow(sctx, client.StartWorkflowOptions{ID: fmt.Sprintf("%s-%d", p.queue, i), TaskQueue: p.queue}, "probe")
		took := time.Since(began)
		cancel()
		p.mu.Lock()
		p.took = append(p.took, took)
		if !p.killedAt.IsZero() && began.After(p.killedAt.Add(-time.Second)) && began.Before(p.killedAt.Add(60*time.Second)) {
			p.after = append(p.after, took)
			p.failed += b2i(err != nil)
		}
		p.mu.Unlock()
	}
}

func (p *startProbe) markKill() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.killedAt = time.Now()
}

func (p *startProbe) maxAfterKill() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	return quantile(p.after, 1)
}

func (p *startProbe) failedAfterKill() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.failed
}

func (p *startProbe) p50() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	return pct(p.took, 0.5)
}

// pct returns the q quantile of ds, unrounded, or 0 for none.
func pct(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	ds = slices.Clone(ds)
	slices.Sort(ds)
	return ds[int(q*float64(len(ds)-1))]
}

func (p *startProbe) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.took)
}
