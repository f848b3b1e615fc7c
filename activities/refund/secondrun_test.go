package refund_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/temporal"

	refundsteps "github.com/keyedhq/keyed/activities/refund"
	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/effects/effectstest"
	"github.com/keyedhq/keyed/internal/fakestripe"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/refunds"
	"github.com/keyedhq/keyed/step"
)

// secondRun runs the activity name twice on in through
// effectstest.SecondRun: the second run must return the same error (nil or
// not) and change no table.
func (b *bundle) secondRun(t *testing.T, name string, in refunds.RefundInput) {
	t.Helper()
	effectstest.SecondRun(t, b.pool, tables, func(context.Context) error {
		_, err := b.env.ExecuteActivity(name, in)
		return err
	})
}

func TestEachStepsSecondRunChangesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.order(t, "o1", "pm_card_visa")
	in := refunds.NewInput(tenant, "o1", "r1", 400, "damaged")
	for _, name := range []string{refundsteps.NameReserve, refundsteps.NameRefundAtStripe, refundsteps.NameMarkRefunded, refundsteps.NameSendRefundEmail} {
		t.Run(name, func(t *testing.T) { b.secondRun(t, name, in) })
	}
	require.Equal(t, 1, b.ledgerRows(t, "o1"))
	require.Equal(t, 1, b.stripe.Refunds())
	require.Equal(t, 1, b.sendgrid.Count())
}

func TestRefusedReserveSecondRunChangesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.order(t, "o1", "pm_card_visa")
	b.secondRun(t, refundsteps.NameReserve, refunds.NewInput(tenant, "o1", "r1", 5000, ""))
	require.Zero(t, b.ledgerRows(t, "o1"))
}

// A lost answer from Stripe: the refund happened; the retry re-enters its
// claim, finds the refund by metadata and does not refund again.
func TestRefundAtStripeAfterALostAnswerRefundsOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	in := refundWithALostAnswer(t, b)

	res, err := exec[refunds.StripeResult](t, b.env, refundsteps.NameRefundAtStripe, in)
	require.NoError(t, err)
	require.Equal(t, 1, b.stripe.Refunds(), "the retry found it instead of refunding again")
	require.Equal(t, int64(400), res.AmountMinor)
	key, err := in.EffectKey(refunds.StepStripe)
	require.NoError(t, err)
	require.Equal(t, 1, b.stripe.RefundsForMetadata("effect_key", key.String()))
}

// The refund's claim commits without waiting for the WAL flush, so a
// Postgres crash may lose it after Stripe refunded. The retry claims the
// key anew and sends it again; Stripe answers with the first refund.
func TestRefundAtStripeWhoseClaimWasLostRefundsOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	in := refundWithALostAnswer(t, b)
	key, err := in.EffectKey(refunds.StepStripe)
	require.NoError(t, err)
	tag, err := b.pool.Exec(context.Background(), `DELETE FROM keyed_effects WHERE key = $1`, key.String())
	require.NoError(t, err)
	require.EqualValues(t, 1, tag.RowsAffected(), "the crash takes the claim's record")

	res, err := exec[refunds.StripeResult](t, b.env, refundsteps.NameRefundAtStripe, in)
	require.NoError(t, err)
	require.Equal(t, int64(400), res.AmountMinor)
	require.Equal(t, 1, b.stripe.Refunds(), "Stripe replayed the first refund")
}

// refundWithALostAnswer reserves 400 of order o1's amount for refund r1
// and runs RefundAtStripe once with Stripe's answer lost: the refund
// happened, the step failed transiently.
func refundWithALostAnswer(t *testing.T, b *bundle) refunds.RefundInput {
	t.Helper()
	b.order(t, "o1", "pm_card_visa")
	in := refunds.NewInput(tenant, "o1", "r1", 400, "")
	_, err := exec[refunds.ReserveResult](t, b.env, refundsteps.NameReserve, in)
	require.NoError(t, err)
	// Twice: net/http replays a request with an Idempotency-Key once when
	// a reused connection drops, and the replay must be lost too.
	b.stripe.Inject(fakestripe.Fault{Kind: fakestripe.FaultDropResponse, Match: "POST /v1/refunds", Times: 2})
	_, err = exec[refunds.StripeResult](t, b.env, refundsteps.NameRefundAtStripe, in)
	requireRetryable(t, err, step.ErrTypeTransient)
	require.Equal(t, 1, b.stripe.Refunds(), "the dropped answer's refund happened")
	return in
}

func requireRetryable(t *testing.T, err error, errType string) {
	t.Helper()
	var app *temporal.ApplicationError
	require.ErrorAs(t, err, &app)
	require.Equal(t, errType, app.Type(), "error: %v", err)
	require.False(t, app.NonRetryable(), "error: %v", err)
}

// Another owner claimed the refund and vanished: once its lease runs out,
// the step takes the claim over, asks Stripe first, and refunds once.
func TestRefundAtStripeTakesOverAnExpiredClaim(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.order(t, "o1", "pm_card_visa")
	in := refunds.NewInput(tenant, "o1", "r1", 400, "")
	_, err := exec[refunds.ReserveResult](t, b.env, refundsteps.NameReserve, in)
	require.NoError(t, err)
	key, err := in.EffectKey(refunds.StepStripe)
	require.NoError(t, err)
	chargeKey, err := orders.NewOrderInput(tenant, "o1").EffectKey(orders.StepCharge)
	require.NoError(t, err)
	rec, err := b.claims.Get(context.Background(), chargeKey)
	require.NoError(t, err)
	var charge orders.ChargeResult
	require.NoError(t, json.Unmarshal(rec.Result, &charge))
	_, err = b.claims.Claim(context.Background(), effects.ClaimParams{Key: key, Owner: "vanished/refund_stripe", Lease: time.Second,
		Fingerprint: step.Fingerprint("400", charge.PaymentIntentID)})
	require.NoError(t, err)
	time.Sleep(1100 * time.Millisecond)

	_, err = exec[refunds.StripeResult](t, b.env, refundsteps.NameRefundAtStripe, in)
	require.NoError(t, err)
	require.Equal(t, 1, b.stripe.Refunds())
	rec, err = b.claims.Get(context.Background(), key)
	require.NoError(t, err)
	require.Equal(t, effects.StateSucceeded, rec.State)
	require.Greater(t, rec.Generation, int64(1), "taken over")
}
