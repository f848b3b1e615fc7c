package tests

import (
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keyedhq/keyed/internal/fakestripe"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/refunds"
)

// The worker process is SIGKILLed after Stripe refunded and before the
// activity completed; a new worker process finishes the refund with one
// Stripe refund and one refund email.
func TestWorkerKilledAfterRefund(t *testing.T) {
	t.Parallel()
	b := setup(t)
	bin := buildWorker(t)
	first, out := b.spawnWorker(t, bin)
	b.order(t, "o1", 1999, "pm_card_visa")
	_, err := b.wait(t, b.start(t, orders.NewOrderInput(b.tenant, "o1")))
	require.NoError(t, err, "worker output:\n%s", out)

	// The refund happens at once; its response is held back long enough
	// to kill the worker that is waiting for it.
	b.stripe.Inject(fakestripe.Fault{Kind: fakestripe.FaultHoldResponse, Match: "POST /v1/refunds", Delay: 20 * time.Second})
	in := refunds.NewInput(b.tenant, "o1", "r1", 1999, "requested_by_customer")
	_, err = startRefund(b.ctx, b.temporal, in, b.taskQueue)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return b.stripe.Refunds() == 1 }, 60*time.Second, 50*time.Millisecond,
		"the first worker never refunded; its output:\n%s", out)
	require.NoError(t, first.Process.Signal(syscall.SIGKILL))
	_ = first.Wait()

	_, out2 := b.spawnWorker(t, bin)
	var res refunds.Result
	require.NoError(t, b.temporal.GetWorkflow(b.ctx, in.WorkflowID(), "").Get(b.ctx, &res), "second worker output:\n%s", out2)
	require.Equal(t, string(orders.StatusRefunded), res.Mark.Status)
	require.Equal(t, 1, b.stripe.Refunds())
	require.Equal(t, 2, b.mail.Count(), "the receipt and one refund email")
	got, err := b.orders.Get(b.ctx, b.tenant, "o1")
	require.NoError(t, err)
	require.Equal(t, orders.StatusRefunded, got.Status)
}
