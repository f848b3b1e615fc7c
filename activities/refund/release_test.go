package refund_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	refundsteps "github.com/keyedhq/keyed/activities/refund"
	"github.com/keyedhq/keyed/internal/fakestripe"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/pipeline"
	"github.com/keyedhq/keyed/refunds"
	"github.com/keyedhq/keyed/step"
)

// refuse makes the fake Stripe refuse the next refund for good.
func (b *bundle) refuse() {
	b.stripe.Inject(fakestripe.Fault{Kind: fakestripe.FaultRefuseRefund, Match: "POST /v1/refunds"})
}

// A refund Stripe refuses for good: its release gives the reservation back
// once (a second run changes nothing), Stripe is never asked again under
// that refund ID, and the whole charge can be refunded under another.
func TestReleaseGivesARefusedReservationBackOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.order(t, "o1", "pm_card_visa")
	in := refunds.NewInput(tenant, "o1", "r1", 400, "")
	_, err := exec[refunds.ReserveResult](t, b.env, refundsteps.NameReserve, in)
	require.NoError(t, err)
	b.refuse()
	_, err = exec[refunds.StripeResult](t, b.env, refundsteps.NameRefundAtStripe, in)
	requireTerminal(t, err, step.ErrTypeProviderRejected)
	require.Contains(t, err.Error(), "charge_disputed")

	b.secondRun(t, refundsteps.NameReleaseRefund, in)
	res, err := exec[refunds.ReleaseResult](t, b.env, refundsteps.NameReleaseRefund, in)
	require.NoError(t, err)
	require.Equal(t, refunds.ReleaseResult{AmountMinor: 400, Code: "charge_disputed", RefundedMinor: 0}, res)
	rel, err := b.ledger.Released(context.Background(), tenant, "o1", "r1")
	require.NoError(t, err)
	require.NotNil(t, rel)
	require.Equal(t, "acme:order:o1:refund:r1:refund_release", rel.EffectKey)
	require.Equal(t, 1, b.ledgerRows(t, "o1"), "the ledger row stays: nothing is subtracted from it")

	_, err = exec[refunds.StripeResult](t, b.env, refundsteps.NameRefundAtStripe, in)
	requireTerminal(t, err, step.ErrTypeInvalidState)
	require.Contains(t, err.Error(), "was released")

	require.NoError(t, b.refund(t, refunds.NewInput(tenant, "o1", "r2", amount, "")))
	require.Equal(t, 1, b.stripe.Refunds())
	require.Equal(t, orders.StatusRefunded, b.status(t, "o1"))
	_, err = b.pool.Exec(context.Background(), `DELETE FROM refund_releases`)
	require.ErrorContains(t, err, "append-only")
}

// Nothing is released for a refund Stripe made, or whose Stripe step did
// not fail with Stripe's refusal.
func TestReleaseRefusesWhatStripeDidNotRefuse(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.order(t, "o1", "pm_card_visa")
	made := refunds.NewInput(tenant, "o1", "r1", 400, "")
	require.NoError(t, b.refund(t, made))
	b.secondRun(t, refundsteps.NameReleaseRefund, made)
	_, err := exec[refunds.ReleaseResult](t, b.env, refundsteps.NameReleaseRefund, made)
	requireTerminal(t, err, step.ErrTypeInvalidState)

	reserved := refunds.NewInput(tenant, "o1", "r2", 400, "")
	_, err = exec[refunds.ReserveResult](t, b.env, refundsteps.NameReserve, reserved)
	require.NoError(t, err)
	b.stripe.Inject(fakestripe.Fault{Kind: fakestripe.FaultDropResponse, Match: "POST /v1/refunds", Times: 2})
	_, err = exec[refunds.StripeResult](t, b.env, refundsteps.NameRefundAtStripe, reserved)
	require.Error(t, err, "a lost answer: the step's record is not a refusal")
	_, err = exec[refunds.ReleaseResult](t, b.env, refundsteps.NameReleaseRefund, reserved)
	requireTerminal(t, err, step.ErrTypeInvalidState)
	for _, id := range []string{"r1", "r2"} {
		rel, err := b.ledger.Released(context.Background(), tenant, "o1", id)
		require.NoError(t, err)
		require.Nil(t, rel, id)
	}
}

// A released amount counts as not refunded: ReserveTx reserves it again.
func TestLedgerReservesAReleasedAmountAgain(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.order(t, "o1", "pm_card_visa")
	ctx := context.Background()
	reserve := func(id string, amt int64) error {
		return pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
			_, err := b.ledger.ReserveTx(ctx, tx, refunds.Entry{TenantID: tenant, OrderID: "o1", RefundID: id, AmountMinor: amt,
				EffectKey: "acme:order:o1:refund:" + id + ":refund_reserve"}, amount)
			return err
		})
	}
	require.NoError(t, reserve("r1", amount))
	require.ErrorIs(t, reserve("r2", 1), refunds.ErrExceedsCharge)
	err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		rel, refunded, err := b.ledger.ReleaseTx(ctx, tx, refunds.Release{TenantID: tenant, OrderID: "o1", RefundID: "r1",
			Code: "charge_disputed", EffectKey: "acme:order:o1:refund:r1:refund_release"})
		require.Equal(t, int64(amount), rel.AmountMinor)
		require.Zero(t, refunded)
		return err
	})
	require.NoError(t, err)
	require.NoError(t, reserve("r2", amount))
	err = pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		refunded, err := b.ledger.ReservedTx(ctx, tx, tenant, "o1")
		require.Equal(t, int64(amount), refunded)
		return err
	})
	require.NoError(t, err)
	require.ErrorIs(t, reserve("r3", 1), refunds.ErrExceedsCharge)
}

func TestRefusalCode(t *testing.T) {
	t.Parallel()
	for msg, want := range map[string]string{
		"refund stripe k: create refund: status 400 invalid_request_error/charge_disputed: The charge (request req_1)": "charge_disputed",
		"refund stripe k: Stripe refund re_1 is failed (expired_or_canceled_card)":                                     "refund_failed",
		"refund stripe k: Stripe refund re_1 is canceled ()":                                                           "refund_canceled",
		"refund stripe k: status 401 invalid_request_error: no code":                                                   "provider_rejected",
		"": "provider_rejected",
	} {
		require.Equal(t, want, refundsteps.RefusalCode(msg), msg)
	}
}

// Stripe refuses the refund for good: the run releases the reservation,
// then fails with Stripe's refusal; the status shows the release.
func TestRefundWorkflowReleasesARefusedRefund(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.order(t, "o1", "pm_card_visa")
	b.refuse()
	_, status, err := b.runWorkflowStatus(t, refunds.NewInput(tenant, "o1", "r1", 400, ""))
	requireTerminal(t, err, step.ErrTypeProviderRejected)
	require.Contains(t, err.Error(), "charge_disputed")
	states := []string{}
	for _, s := range status {
		states = append(states, s.Step+":"+s.State)
	}
	require.Equal(t, []string{"refund_reserve:" + pipeline.StateDone, "refund_stripe:" + pipeline.StateFailed,
		"refund_mark:" + pipeline.StateSkipped, "refund_email:" + pipeline.StateSkipped, "refund_release:" + pipeline.StateDone}, states)
	rel, err := b.ledger.Released(context.Background(), tenant, "o1", "r1")
	require.NoError(t, err)
	require.Equal(t, "charge_disputed", rel.Code)
	require.Zero(t, b.stripe.Refunds())
	require.Zero(t, b.sendgrid.Count())
	require.Equal(t, orders.StatusPaid, b.status(t, "o1"), "MarkRefunded never ran")
}

// ReleaseRefund runs instead of MarkRefunded and SendRefundEmail, so the
// longest path (orderflow.LongestRun) leaves it out: it must retry for no
// longer than they do together.
func TestReleaseRetriesNoLongerThanTheStepsItReplaces(t *testing.T) {
	t.Parallel()
	window := func(d step.Declaration) time.Duration { return step.RetryWindow(d.ActivityOptions("")) }
	require.LessOrEqual(t, window(refundsteps.DeclRelease.Declaration), window(refundsteps.DeclMark.Declaration)+window(refundsteps.DeclEmail.Declaration))
	require.NotContains(t, refundsteps.LongestPath(), refundsteps.DeclRelease.Declaration)
}
