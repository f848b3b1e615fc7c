package refund_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	refundsteps "github.com/keyedhq/keyed/activities/refund"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/refunds"
	"github.com/keyedhq/keyed/step"
)

// stepsOK runs the named refund activities on in, in order, and requires
// each to succeed.
func (b *bundle) stepsOK(t *testing.T, in refunds.RefundInput, names ...string) {
	t.Helper()
	for _, name := range names {
		_, err := b.env.ExecuteActivity(name, in)
		require.NoError(t, err, name)
	}
}

// refuseAndRelease makes Stripe refuse in's refund for good and releases
// its reservation, with a second run of the release changing nothing.
func (b *bundle) refuseAndRelease(t *testing.T, in refunds.RefundInput) {
	t.Helper()
	b.refuse()
	_, err := exec[refunds.StripeResult](t, b.env, refundsteps.NameRefundAtStripe, in)
	requireTerminal(t, err, step.ErrTypeProviderRejected)
	b.secondRun(t, refundsteps.NameReleaseRefund, in)
}

// amounts returns what the order has refunded (confirmed by Stripe) and
// what its refunds hold of the charge (reserved, not released).
func (b *bundle) amounts(t *testing.T, id string) (confirmed, reserved int64) {
	t.Helper()
	ctx := context.Background()
	err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) (err error) {
		if confirmed, err = b.ledger.ConfirmedTx(ctx, tx, tenant, id); err != nil {
			return err
		}
		reserved, err = b.ledger.ReservedTx(ctx, tx, tenant, id)
		return err
	})
	require.NoError(t, err)
	return confirmed, reserved
}

// A refund still in flight does not count in the order's status: r2,
// marked while r1 is reserved but not at Stripe yet, makes the order
// partially_refunded although r1 and r2 reserve all of it. Stripe then
// refuses r1, whose release leaves the order partially_refunded, and a new
// refund of the rest makes it refunded. Each refund's mark is its own
// transition, and a second run of it changes nothing.
func TestMarkRefundedCountsOnlyWhatStripeConfirmed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.order(t, "o1", "pm_card_visa")
	r1, r2 := refunds.NewInput(tenant, "o1", "r1", 500, ""), refunds.NewInput(tenant, "o1", "r2", amount-500, "")
	b.stepsOK(t, r1, refundsteps.NameReserve)
	b.stepsOK(t, r2, refundsteps.NameReserve, refundsteps.NameRefundAtStripe)
	res, err := exec[refunds.MarkResult](t, b.env, refundsteps.NameMarkRefunded, r2)
	require.NoError(t, err)
	require.Equal(t, string(orders.StatusPartiallyRefunded), res.Status, "r1 is reserved, not refunded")
	require.Equal(t, orders.StatusPartiallyRefunded, b.status(t, "o1"))
	b.secondRun(t, refundsteps.NameMarkRefunded, r2)
	confirmed, reserved := b.amounts(t, "o1")
	require.Equal(t, [2]int64{amount - 500, amount}, [2]int64{confirmed, reserved})

	_, err = exec[refunds.ReserveResult](t, b.env, refundsteps.NameReserve, refunds.NewInput(tenant, "o1", "r9", 1, ""))
	requireTerminal(t, err, step.ErrTypeInvalidState)
	require.Contains(t, err.Error(), "0.00 EUR left", "Reserve still counts r1, in flight")

	b.refuseAndRelease(t, r1)
	require.Equal(t, orders.StatusPartiallyRefunded, b.status(t, "o1"), "r1 never counted: its release changes nothing")
	confirmed, reserved = b.amounts(t, "o1")
	require.Equal(t, [2]int64{amount - 500, amount - 500}, [2]int64{confirmed, reserved})

	r3 := refunds.NewInput(tenant, "o1", "r3", 500, "")
	require.NoError(t, b.refund(t, r3))
	require.Equal(t, orders.StatusRefunded, b.status(t, "o1"))
	b.secondRun(t, refundsteps.NameMarkRefunded, r3)
	b.secondRun(t, refundsteps.NameMarkRefunded, r2)
	require.Equal(t, orders.StatusRefunded, b.status(t, "o1"))
	require.Equal(t, 2, b.stripe.Refunds())
	require.Equal(t, []string{
		"paid>partially_refunded acme:order:o1:refund:r2:refund_mark",
		"partially_refunded>refunded acme:order:o1:refund:r3:refund_mark",
	}, b.refundTransitions(t, "o1"))
}

// Two refunds confirmed by Stripe and marked out of order: the first mark
// counts only what is confirmed when it runs, and the last one sets the
// final status.
func TestLastMarkSetsTheFinalStatus(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.order(t, "o1", "pm_card_visa")
	r1, r2 := refunds.NewInput(tenant, "o1", "r1", 500, ""), refunds.NewInput(tenant, "o1", "r2", amount-500, "")
	b.stepsOK(t, r1, refundsteps.NameReserve)
	b.stepsOK(t, r2, refundsteps.NameReserve, refundsteps.NameRefundAtStripe, refundsteps.NameMarkRefunded)
	require.Equal(t, orders.StatusPartiallyRefunded, b.status(t, "o1"))
	b.stepsOK(t, r1, refundsteps.NameRefundAtStripe)
	res, err := exec[refunds.MarkResult](t, b.env, refundsteps.NameMarkRefunded, r1)
	require.NoError(t, err)
	require.Equal(t, string(orders.StatusRefunded), res.Status)
	require.Equal(t, orders.StatusRefunded, b.status(t, "o1"))
}

// An order an earlier keyed marked refunded from its reservations, while a
// refund Stripe then refused was in flight, is corrected by that refund's
// release to what Stripe confirmed; a second run of the release changes
// nothing.
func TestReleaseCorrectsAStatusThatCountedTheRefusedRefund(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.order(t, "o1", "pm_card_visa")
	r1, r2 := refunds.NewInput(tenant, "o1", "r1", 500, ""), refunds.NewInput(tenant, "o1", "r2", amount-500, "")
	b.stepsOK(t, r1, refundsteps.NameReserve)
	b.stepsOK(t, r2, refundsteps.NameReserve, refundsteps.NameRefundAtStripe, refundsteps.NameMarkRefunded)
	_, err := b.pool.Exec(context.Background(), `UPDATE orders SET status = 'refunded' WHERE tenant_id = $1 AND id = 'o1'`, tenant)
	require.NoError(t, err, "as the old MarkRefunded, counting r1's reservation, left it")

	b.refuseAndRelease(t, r1)
	require.Equal(t, orders.StatusPartiallyRefunded, b.status(t, "o1"))
	require.Contains(t, b.refundTransitions(t, "o1"), "refunded>partially_refunded acme:order:o1:refund:r1:refund_release")
	require.NoError(t, b.refund(t, refunds.NewInput(tenant, "o1", "r3", 500, "")))
	require.Equal(t, orders.StatusRefunded, b.status(t, "o1"))
}

// refundTransitions returns the order's transitions recorded by refund
// steps, as "from>to event", oldest first.
func (b *bundle) refundTransitions(t *testing.T, id string) []string {
	t.Helper()
	rows, err := b.pool.Query(context.Background(), `SELECT from_state || '>' || to_state || ' ' || event_id FROM order_transitions
WHERE tenant_id = $1 AND order_id = $2 AND event_id LIKE '%:refund:%' ORDER BY created_at, event_id`, tenant, id)
	require.NoError(t, err)
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return out
}
