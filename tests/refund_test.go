package tests

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/worker"

	"github.com/keyedhq/keyed/internal/fakestripe"
	"github.com/keyedhq/keyed/notify"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/outbox"
	"github.com/keyedhq/keyed/pipeline"
	"github.com/keyedhq/keyed/refunds"
	"github.com/keyedhq/keyed/step"
	orderflow "github.com/keyedhq/keyed/workflows/order"
	refundflow "github.com/keyedhq/keyed/workflows/refund"
)

// startRefundWorker runs an in-process worker with the order and refund
// workflows and all their activities, as the real worker registers them
// (ApplyDecision once), until the test ends. edit changes the refund
// activities' sender options.
func (b *bundle) startRefundWorker(t *testing.T, edit ...func(*notify.SenderOpts)) {
	t.Helper()
	refundDeps := b.newDeps(t, edit...)
	orderDefs, err := orderflow.Pipeline().Activities(b.deps)
	require.NoError(t, err)
	refundDefs, err := refundflow.Pipeline().Activities(refundDeps)
	require.NoError(t, err)
	defs := append(orderDefs, refundDefs...)
	d, err := pipeline.NewDecider(b.effects, defs...)
	require.NoError(t, err)
	w := worker.New(b.temporal, b.taskQueue, worker.Options{})
	orderflow.Register(w, nil)
	refundflow.Register(w, nil)
	require.NoError(t, step.Register(w, append(defs, d.Definition())...))
	require.NoError(t, w.Start())
	t.Cleanup(w.Stop)
}

// paidOrder creates an order and runs its order workflow to paid.
func (b *bundle) paidOrder(t *testing.T, id string, amount int64) {
	t.Helper()
	b.order(t, id, amount, "pm_card_visa")
	_, err := b.wait(t, b.start(t, orders.NewOrderInput(b.tenant, id)))
	require.NoError(t, err)
}

// refund starts in's refund n times at once, waits for the run and returns
// its result.
func (b *bundle) refund(t *testing.T, in refunds.RefundInput, n int) refunds.Result {
	t.Helper()
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() { _, errs[i] = startRefund(b.ctx, b.temporal, in, b.taskQueue) })
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err, "concurrent starts join the run going")
	}
	var res refunds.Result
	require.NoError(t, b.temporal.GetWorkflow(b.ctx, in.WorkflowID(), "").Get(b.ctx, &res))
	return res
}

// Twenty starts of one full refund: one run, one ledger row, one Stripe
// refund, one email, and the order refunded.
func TestRefundStartedTwentyTimesRefundsOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startRefundWorker(t)
	b.paidOrder(t, "o1", 1999)
	in := refunds.NewInput(b.tenant, "o1", "r1", 1999, "requested_by_customer")
	res := b.refund(t, in, 20)
	require.Equal(t, string(orders.StatusRefunded), res.Mark.Status)
	// A start after the run succeeded hands back that run and its result.
	again := b.refund(t, in, 1)
	require.Equal(t, res, again)

	require.Equal(t, 1, b.runs(t, in.WorkflowID()))
	// Every step ran in the first workflow task: no activity task.
	events := b.history(t, &outbox.Started{WorkflowID: in.WorkflowID()})
	recordHistory(t, events) // workflows/refund/testdata/refund_happy_v3.json
	require.Empty(t, scheduledActivities(events), "no step went through the task queue")
	entries, err := refundLedger(t, b).List(b.ctx, b.tenant, "o1")
	require.NoError(t, err)
	require.Len(t, entries, 1)
	require.Equal(t, 1, b.stripe.Refunds())
	stripeKey, err := in.EffectKey(refunds.StepStripe)
	require.NoError(t, err)
	require.Equal(t, 1, b.stripe.RefundsForMetadata("effect_key", stripeKey.String()))
	emailKey, err := in.EffectKey(refunds.StepEmail)
	require.NoError(t, err)
	require.Len(t, b.mail.MessagesFor(notify.CustomArgEffectKey, emailKey.String()), 1)
	o, err := b.orders.Get(b.ctx, b.tenant, "o1")
	require.NoError(t, err)
	require.Equal(t, orders.StatusRefunded, o.Status)
}

// A partial refund leaves the order partially refunded; one that exceeds
// what is left fails at Reserve with no Stripe call and no email.
func TestPartialRefundThenOneTooLarge(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startRefundWorker(t)
	b.paidOrder(t, "o1", 1999)
	res := b.refund(t, refunds.NewInput(b.tenant, "o1", "r1", 999, ""), 1)
	require.Equal(t, string(orders.StatusPartiallyRefunded), res.Mark.Status)
	o, err := b.orders.Get(b.ctx, b.tenant, "o1")
	require.NoError(t, err)
	require.Equal(t, orders.StatusPartiallyRefunded, o.Status)

	tooLarge := refunds.NewInput(b.tenant, "o1", "r2", 1001, "")
	run, err := startRefund(b.ctx, b.temporal, tooLarge, b.taskQueue)
	require.NoError(t, err)
	err = run.Get(b.ctx, nil)
	require.ErrorContains(t, err, "exceeds what is left of the charge")
	require.Equal(t, 1, b.stripe.Refunds())
	require.Equal(t, 2, b.mail.Count(), "the receipt and one refund email")
}

func refundLedger(t *testing.T, b *bundle) *refunds.Ledger {
	t.Helper()
	l, err := refunds.NewLedger(b.pool)
	require.NoError(t, err)
	return l
}

// Two concurrent partial refunds whose sum exceeds the charge: exactly one
// succeeds; the other fails at Reserve, with no Stripe call.
func TestConcurrentRefundsBeyondTheCharge(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startRefundWorker(t)
	b.paidOrder(t, "o1", 1999)
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, id := range []string{"r1", "r2"} {
		wg.Go(func() {
			run, err := startRefund(b.ctx, b.temporal, refunds.NewInput(b.tenant, "o1", id, 1200, ""), b.taskQueue)
			if err == nil {
				err = run.Get(b.ctx, nil)
			}
			errs[i] = err
		})
	}
	wg.Wait()
	failed := 0
	for _, err := range errs {
		if err != nil {
			failed++
			require.ErrorContains(t, err, "exceeds what is left of the charge")
		}
	}
	require.Equal(t, 1, failed, "errors: %v", errs)
	require.Equal(t, 1, b.stripe.Refunds())
	o, err := b.orders.Get(b.ctx, b.tenant, "o1")
	require.NoError(t, err)
	require.Equal(t, orders.StatusPartiallyRefunded, o.Status)
}

// Stripe refuses a refund for good: no Stripe refund, the reservation is
// released, and a refund of the whole charge under another refund ID then
// refunds once.
func TestRefusedRefundReleasesItsReservation(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startRefundWorker(t)
	b.paidOrder(t, "o1", 1999)
	b.stripe.Inject(fakestripe.Fault{Kind: fakestripe.FaultRefuseRefund, Match: "POST /v1/refunds"})
	refused := refunds.NewInput(b.tenant, "o1", "r1", 1999, "")
	run, err := startRefund(b.ctx, b.temporal, refused, b.taskQueue)
	require.NoError(t, err)
	err = run.Get(b.ctx, nil)
	require.ErrorContains(t, err, "charge_disputed")
	require.Zero(t, b.stripe.Refunds())
	rel, err := refundLedger(t, b).Released(b.ctx, b.tenant, "o1", "r1")
	require.NoError(t, err)
	require.NotNil(t, rel, "the reservation was released")
	require.Equal(t, "charge_disputed", rel.Code)
	require.EqualValues(t, 1999, rel.AmountMinor)

	res := b.refund(t, refunds.NewInput(b.tenant, "o1", "r2", 1999, ""), 1)
	require.Equal(t, string(orders.StatusRefunded), res.Mark.Status)
	require.Equal(t, 1, b.stripe.Refunds())
}
