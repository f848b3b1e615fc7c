package tests

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/temporal"

	"github.com/keyedhq/keyed/internal/config"
	"github.com/keyedhq/keyed/internal/fakefault"
	"github.com/keyedhq/keyed/notify"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/outbox"
	"github.com/keyedhq/keyed/pipeline"
	orderflow "github.com/keyedhq/keyed/workflows/order"
)

// The fault test's plan, per receipt policy. Both sub-runs run at once, so
// the test deals 2×faultOrders orders.
const (
	faultOrders    = 110                      // orders per sub-run
	faultSpread    = 15 * time.Second         // the first 60% of the orders' first starts are spread over this
	faultBurstAt   = 10 * time.Second         // the other 40% start at once, at this time
	faultSettle    = 150 * time.Second        // from the first start, the time every order has to settle
	faultDeclinePM = "pm_card_chargeDeclined" // the card of every 37th order
)

// faultSchedule is when, after the first start, each fault is dealt: worker
// kills (slot, time), the Postgres restart, and the backend terminations
// every faultTerminateEvery until the orders settle.
var (
	faultKills          = []struct{ slot, at int }{{0, 7}, {1, 17}, {0, 29}}
	faultRestartAt      = 22 * time.Second
	faultTerminateEvery = 3 * time.Second
)

// TestFaults runs the order pipeline through faults on every side, under
// each receipt policy: 110 orders per policy (66 arriving over 15 s, 44 in
// one burst at 10 s), each started three times (twice concurrently, once
// more seconds later; a third also through the outbox), two real worker
// processes SIGKILLed three times between them (and respawned, like any
// worker that exits), pg_terminate_backend of the workers' connections every
// 3 s, one immediate restart of a private Postgres, Stripe dropping 10% of
// responses after charging and answering 5% with 500 and 5% with 429,
// SendGrid accepting and then dropping 5% of sends and answering 3% with 500
// (its activity index 2 s behind), and a declining card on every 37th order.
// It counts at the fakes: no order is charged twice or gets two receipts;
// every order ends paid with one charge and one receipt, or declined with
// neither; at most 1% of orders need a person. On failure it prints each
// order that did not end so, the faults dealt, and the workers' warnings.
func TestFaults(t *testing.T) {
	t.Parallel()
	bin := buildWorker(t)
	for _, policy := range []string{config.AtMostOnce, config.AtLeastOnce} {
		t.Run(policy, func(t *testing.T) {
			t.Parallel()
			runFaults(t, bin, policy)
		})
	}
}

// faultOrder is one order of the plan and what happened to it.
type faultOrder struct {
	id       string
	declined bool // paid with faultDeclinePM
	outbox   bool // created through orders.Store.CreateAndEnqueueTx
	created  atomic.Int32
	first    time.Time // when its first start was sent

	// Filled in by inspect.
	status             orders.Status
	charges, receipts  int
	runs               int
	runStatus          enumspb.WorkflowExecutionStatus
	runErr, runErrType string
	chargeCode         string // the charge record's error code
	pending            []string
	records            []string
	took               time.Duration // first start to the latest run's close; 0 if it did not close
}

func runFaults(t *testing.T, bin, policy string) {
	ctx, cancel := context.WithTimeout(context.Background(), faultSettle+2*time.Minute)
	defer cancel()
	w := newFaultWorld(t, ctx, bin, policy)
	plan := make([]*faultOrder, faultOrders)
	for i := range plan {
		plan[i] = &faultOrder{id: fmt.Sprintf("o%03d", i), declined: i%37 == 5, outbox: i%3 == 0}
	}
	w.stripe.Inject(fakefault.Fault{Kind: fakefault.FaultDropResponse, Rate: 0.10})
	w.stripe.Inject(fakefault.Fault{Kind: fakefault.FaultServerError, Rate: 0.05})
	w.stripe.Inject(fakefault.Fault{Kind: fakefault.FaultRateLimit, Rate: 0.05})
	w.mail.Inject(fakefault.Fault{Kind: fakefault.FaultDropResponse, Rate: 0.05})
	w.mail.Inject(fakefault.Fault{Kind: fakefault.FaultServerError, Rate: 0.03})
	// An accepted message shows in the Email Activity API 2 s later, so
	// that a look-up right after a lost answer finds nothing yet.
	w.mail.SetIndexLag(2 * time.Second)
	require.NoError(t, w.spawn(0))
	require.NoError(t, w.spawn(1))

	w.began = time.Now()
	settled := make(chan struct{})
	chaosDone := make(chan error, 1)
	go func() { chaosDone <- w.chaos(ctx, settled) }()

	var (
		starts   sync.WaitGroup
		startErr = make(chan error, 4*len(plan))
	)
	for i, o := range plan {
		starts.Go(func() {
			time.Sleep(startAt(i, len(plan)))
			if err := w.startOrder(ctx, o); err != nil {
				startErr <- fmt.Errorf("order %s: %w", o.id, err)
			}
		})
	}
	starts.Wait()
	close(startErr)
	for err := range startErr {
		t.Errorf("start: %v", err)
	}
	settledIn, settleErr := w.waitSettled(ctx, faultSettle)
	close(settled)
	require.NoError(t, <-chaosDone, "deal the faults")

	w.inspect(t, ctx, plan)
	w.report(t, plan, settledIn, settleErr)
}

// startAt returns when order i of n is first started: the first 60% are
// spread over faultSpread, the rest arrive in one burst at faultBurstAt.
func startAt(i, n int) time.Duration {
	spread := n * 6 / 10
	if i >= spread {
		return faultBurstAt
	}
	return time.Duration(i) * faultSpread / time.Duration(spread)
}

// startOrder creates o (through the outbox for a third of the orders) and
// starts its run twice concurrently, then once more a few seconds later, as
// impatient clients and retried requests do.
func (w *faultWorld) startOrder(ctx context.Context, o *faultOrder) error {
	pm := "pm_card_visa"
	if o.declined {
		pm = faultDeclinePM
	}
	no := orders.NewOrder{TenantID: w.tenant, ID: o.id, AmountMinor: 1999, Currency: "eur",
		CustomerEmail: "ada+" + o.id + "@example.com", PaymentMethod: pm}
	err := retryDB(ctx, func(ctx context.Context) error {
		if !o.outbox {
			_, _, err := w.orders.Create(ctx, no)
			return err
		}
		return pgx.BeginFunc(ctx, w.pool, func(tx pgx.Tx) error {
			_, _, err := w.orders.CreateAndEnqueueTx(ctx, tx, no)
			return err
		})
	})
	if err != nil {
		return fmt.Errorf("create: %w", err)
	}
	in := orders.NewOrderInput(w.tenant, o.id)
	start := func() error {
		st, err := w.start(ctx, in)
		if err == nil && st.Created {
			o.created.Add(1)
		}
		return err
	}
	o.first = time.Now()
	var twice sync.WaitGroup
	errs := make([]error, 2)
	for i := range errs {
		twice.Go(func() { errs[i] = start() })
	}
	twice.Wait()
	time.Sleep(2*time.Second + rand.N(6*time.Second))
	return errors.Join(errs[0], errs[1], start())
}

// start starts in's run like a client that retries a failed call: a
// loaded dev server times some calls out. Start is idempotent, so a retry
// collapses into the run a lost call may have started.
func (w *faultWorld) start(ctx context.Context, in orders.OrderInput) (*outbox.Started, error) {
	for try := 1; ; try++ {
		st, err := orderflow.Start(ctx, w.temporal, in, &orderflow.StartOpts{TaskQueue: w.taskQueue})
		if err == nil || try == 10 || ctx.Err() != nil {
			return st, err
		}
		w.mu.Lock()
		w.figs.startRetries++
		w.mu.Unlock()
		time.Sleep(time.Second)
	}
}

// chaos deals the faults on schedule until settled is closed: the worker
// kills, the Postgres restart, and the backend terminations.
func (w *faultWorld) chaos(ctx context.Context, settled <-chan struct{}) error {
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	kills, restarted, nextTerm := 0, false, faultTerminateEvery
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
		at := time.Since(w.began)
		switch {
		case kills < len(faultKills) && at >= time.Duration(faultKills[kills].at)*time.Second:
			if err := w.killWorker(faultKills[kills].slot); err != nil {
				return err
			}
			kills++
		case !restarted && at >= faultRestartAt:
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

// waitSettled waits until no run of the world's task queue is running and
// the outbox is empty, after every start; it returns how long the orders
// took from the first start, and an error if they did not settle within.
func (w *faultWorld) waitSettled(ctx context.Context, within time.Duration) (time.Duration, error) {
	deadline := w.began.Add(within)
	// A run waiting for an operator's decision has settled: it needs a
	// person, and inspect counts its order as such.
	query := fmt.Sprintf("TaskQueue = '%s' AND ExecutionStatus = 'Running' AND %s IS NULL", w.taskQueue, pipeline.SearchAttrAttentionName)
	var last string
	runsDone := false
	for time.Now().Before(deadline) {
		running, err := w.temporal.CountWorkflow(ctx, &workflowservice.CountWorkflowExecutionsRequest{Namespace: "default", Query: query})
		var depth int64 = -1
		if err == nil {
			err = retryDB(ctx, func(ctx context.Context) error {
				st, err := outbox.ReadStats(ctx, w.pool)
				depth = st.Depth
				return err
			})
		}
		if err == nil && running.GetCount() == 0 {
			if !runsDone {
				w.event("no run running; outbox depth %d", depth)
				runsDone = true
			}
			if depth == 0 {
				return time.Since(w.began), nil
			}
		}
		last = fmt.Sprintf("%d runs running, outbox depth %d, err %v", running.GetCount(), depth, err)
		time.Sleep(time.Second)
	}
	return time.Since(w.began), fmt.Errorf("not settled %s after the first start: %s", within, last)
}

// inspect fills in each order's outcome: its status, the charges and
// receipts counted at the fakes, its runs, and for a run that did not
// complete, its failure, pending activities and effect records.
func (w *faultWorld) inspect(t *testing.T, ctx context.Context, plan []*faultOrder) {
	t.Helper()
	for _, o := range plan {
		in := orders.NewOrderInput(w.tenant, o.id)
		chargeKey, err := in.EffectKey(orders.StepCharge)
		require.NoError(t, err)
		receiptKey, err := in.EffectKey(orders.StepReceipt)
		require.NoError(t, err)
		o.charges = w.stripe.ChargesForMetadata("effect_key", chargeKey.String())
		o.receipts = len(w.mail.MessagesFor(notify.CustomArgEffectKey, receiptKey.String()))
		var got *orders.Order
		err = retryDB(ctx, func(ctx context.Context) (err error) {
			got, err = w.orders.Get(ctx, w.tenant, o.id)
			return err
		})
		if err != nil { // reported with the order, as not fine
			o.status = orders.Status("(" + err.Error() + ")")
		} else {
			o.status = got.Status
		}
		o.runs = w.runs(t, in.WorkflowID())

		desc, err := w.temporal.DescribeWorkflow(ctx, in.WorkflowID(), "")
		if err != nil { // such as no run at all: the order is reported, not fine
			o.runErrType, o.runErr = "describe", err.Error()
		}
		o.runStatus = desc.RawResponse.GetWorkflowExecutionInfo().GetStatus()
		if ct := desc.RawResponse.GetWorkflowExecutionInfo().GetCloseTime(); ct != nil {
			o.took = ct.AsTime().Sub(o.first)
		}
		for _, pa := range desc.RawResponse.GetPendingActivities() {
			o.pending = append(o.pending, fmt.Sprintf("%s attempt %d %s: %s", pa.GetActivityType().GetName(),
				pa.GetAttempt(), pa.GetState(), truncate(pa.GetLastFailure().GetMessage(), 300)))
		}
		if err == nil && o.runStatus != enumspb.WORKFLOW_EXECUTION_STATUS_COMPLETED && o.runStatus != enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING {
			o.runErrType, o.runErr = runFailure(ctx, w, in.WorkflowID())
		}
		recs := w.records(t, o.id)
		if r := recs[orders.StepCharge]; r != nil {
			o.chargeCode = r.ErrorCode
		}
		if !o.fine() {
			for _, r := range recs {
				o.records = append(o.records, fmt.Sprintf("%s=%s(attempts %d%s)", r.Kind, r.State, r.Attempts,
					cond(r.ErrorCode != "", ", "+r.ErrorCode+": "+truncate(r.ErrorMessage, 200), "")))
			}
			slices.Sort(o.records)
		}
	}
}

// runFailure returns the error type and message of the latest run of
// workflowID, which has closed.
func runFailure(ctx context.Context, w *faultWorld, workflowID string) (typ, msg string) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	err := w.temporal.GetWorkflow(ctx, workflowID, "").Get(ctx, nil)
	var app *temporal.ApplicationError
	switch {
	case err == nil:
		return "", ""
	case errors.As(err, &app):
		return app.Type(), truncate(app.Error(), 400)
	}
	return "other", truncate(err.Error(), 400)
}

// fine reports whether o ended as it should with no person involved: paid
// with one charge and one receipt after a completed run, or (a declining
// card) failed with neither, its charge recorded as card_declined and its
// latest run failed (the decline itself, or a re-run refused).
func (o *faultOrder) fine() bool {
	if o.declined {
		return o.status == orders.StatusFailed && o.charges == 0 && o.receipts == 0 &&
			o.runStatus == enumspb.WORKFLOW_EXECUTION_STATUS_FAILED && o.chargeCode == "card_declined"
	}
	return o.status == orders.StatusPaid && o.charges == 1 && o.receipts == 1 &&
		o.runStatus == enumspb.WORKFLOW_EXECUTION_STATUS_COMPLETED
}

func (o *faultOrder) String() string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "%s (%s%s): order %s, %d charges, %d receipts, %d runs (%d created by Start), latest %s after %s",
		o.id, cond(o.declined, "declining card", "visa"), cond(o.outbox, ", outbox", ""), o.status, o.charges, o.receipts,
		o.runs, o.created.Load(), strings.TrimPrefix(o.runStatus.String(), "WorkflowExecutionStatus"),
		cond(o.took > 0, o.took.Round(100*time.Millisecond).String(), "(not closed)"))
	if o.runErr != "" {
		fmt.Fprintf(&sb, " [%s] %s", o.runErrType, o.runErr)
	}
	for _, p := range o.pending {
		fmt.Fprintf(&sb, "\n      pending %s", p)
	}
	if !o.fine() {
		fmt.Fprintf(&sb, "\n      effects %s", cond(len(o.records) == 0, "(no records)", strings.Join(o.records, " ")))
	}
	return sb.String()
}

// report prints the figures line and, for every order that did not end
// fine, its state; then asserts the outcomes.
func (w *faultWorld) report(t *testing.T, plan []*faultOrder, settledIn time.Duration, settleErr error) {
	t.Helper()
	var charges, receipts, doubleCharged, doubleReceipts, declined, outboxed, reruns int
	var bad []string
	var took []time.Duration
	for _, o := range plan {
		if o.took > 0 {
			took = append(took, o.took)
		}
		charges += o.charges
		receipts += o.receipts
		declined += b2i(o.declined)
		outboxed += b2i(o.outbox)
		doubleCharged += b2i(o.charges > 1)
		doubleReceipts += b2i(o.receipts > 1)
		reruns += max(o.runs-1, 0)
		if !o.fine() {
			bad = append(bad, "  "+o.String())
		}
	}
	w.mu.Lock()
	f := w.figs
	events := slices.Clone(w.events)
	w.mu.Unlock()
	t.Logf("fault figures: policy=%s orders=%d (declining %d, via outbox %d) kills=%d terminations=%d (backends %d) restarts=%d "+
		"start_retries=%d order_time_p50=%s order_time_max=%s charges=%d receipts=%d double_charges=%d duplicate_receipts=%d needing_a_person=%d reruns=%d stripe_requests=%d sendgrid_requests=%d settled_in=%s",
		w.policy, len(plan), declined, outboxed, f.kills, f.terminations, f.backends, f.restarts,
		f.startRetries, quantile(took, 0.5), quantile(took, 1), charges, receipts, doubleCharged, doubleReceipts, len(bad), reruns, w.stripe.Requests(), w.mail.Requests(), settledIn.Round(time.Second))
	if len(bad) > 0 || settleErr != nil || t.Failed() {
		t.Logf("faults dealt:\n  %s", strings.Join(events, "\n  "))
		t.Logf("orders that did not end fine (%d):\n%s", len(bad), strings.Join(bad, "\n"))
		t.Logf("worker warnings and errors, grouped:\n%s", w.logSummary(25))
	}
	for _, e := range w.selfExits() {
		// Respawned by supervise; a crash, not a refusal to start, fails the test.
		if strings.Contains(e, "panic") {
			t.Errorf("worker process %s", e)
		} else {
			t.Logf("worker process %s", e)
		}
	}
	require.NoError(t, settleErr)
	require.Zero(t, doubleCharged, "orders charged more than once")
	require.Zero(t, doubleReceipts, "orders with more than one receipt")
	for _, o := range plan {
		if o.declined {
			require.Zero(t, o.charges+o.receipts, "declined order %s was charged or sent a receipt", o.id)
		}
	}
	require.LessOrEqual(t, len(bad), len(plan)/100, "orders needing a person (at most 1%%)")
}

// quantile returns the q quantile of ds (0.5 the median, 1 the maximum),
// rounded to 100 ms, or 0 for none.
func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	ds = slices.Clone(ds)
	slices.Sort(ds)
	return ds[int(q*float64(len(ds)-1))].Round(100 * time.Millisecond)
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

func cond(c bool, yes, no string) string {
	if c {
		return yes
	}
	return no
}
