package refund_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/stripe/stripe-go/v76"

	refundsteps "github.com/keyedhq/keyed/activities/refund"
	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/pipeline"
	"github.com/keyedhq/keyed/pipeline/pipelinetest"
	"github.com/keyedhq/keyed/refunds"
	"github.com/keyedhq/keyed/step"
	refundflow "github.com/keyedhq/keyed/workflows/refund"
)

// decider returns a Decider over the refund pipeline's definitions, as the
// worker makes it.
func (b *bundle) decider(t *testing.T) *pipeline.Decider {
	t.Helper()
	d, err := pipeline.NewDeciderOf([]pipeline.Spec{refundflow.Pipeline()}, b.deps)
	require.NoError(t, err)
	return d
}

// undecided leaves in's step record failed with code, as a step that waits
// for a decision leaves it, and returns a "done" with result on it.
func (b *bundle) undecided(t *testing.T, in refunds.RefundInput, step, code string, result any) pipeline.DecisionInput {
	t.Helper()
	ctx := context.Background()
	key, err := in.EffectKey(step)
	require.NoError(t, err)
	cl, err := b.claims.Claim(ctx, effects.ClaimParams{Key: key, Owner: in.WorkflowID() + "/" + step})
	require.NoError(t, err)
	require.NoError(t, b.claims.Fail(ctx, cl, effects.NewCodedError(code, "outcome unknown")))
	raw, err := json.Marshal(result)
	require.NoError(t, err)
	return pipeline.DecisionInput{EffectKey: key.String(), Step: step, Resolution: effects.ResolveDone,
		Result: raw, Reason: "checked Stripe", By: "ada", RunID: "run-1"}
}

// paymentIntent returns the PaymentIntent the order's charge stored.
func (b *bundle) paymentIntent(t *testing.T, order string) string {
	t.Helper()
	rec, err := b.claims.Get(context.Background(), effects.MustKey(tenant, "order", order, orders.StepCharge))
	require.NoError(t, err)
	var c orders.ChargeResult
	require.NoError(t, json.Unmarshal(rec.Result, &c))
	return c.PaymentIntentID
}

// stripeRefund refunds amount of pi at the fake Stripe as another client
// would, with effectKey in its metadata.
func (b *bundle) stripeRefund(t *testing.T, pi string, amount int64, effectKey string) *stripe.Refund {
	t.Helper()
	p := &stripe.RefundParams{PaymentIntent: stripe.String(pi), Amount: stripe.Int64(amount)}
	p.AddMetadata("effect_key", effectKey)
	re, err := b.api.Refunds.New(p)
	require.NoError(t, err)
	return re
}

// A refund at Stripe whose retries ran out is decided "done" only with the
// refund Stripe made under its effect key for the ledger's amount, against
// the order's charge; once confirmed it is recorded as RefundAtStripe
// records it, so that MarkRefunded counts it.
func TestDeciderVerifiesARefundAtStripe(t *testing.T) {
	t.Parallel()
	b := setup(t)
	d := b.decider(t)
	b.order(t, "o1", "pm_card_visa")
	in := refunds.NewInput(tenant, "o1", "r1", 500, "")
	_, err := exec[refunds.ReserveResult](t, b.env, refundsteps.NameReserve, in)
	require.NoError(t, err)
	key, err := in.EffectKey(refunds.StepStripe)
	require.NoError(t, err)
	pi := b.paymentIntent(t, "o1")
	made := b.stripeRefund(t, pi, 500, key.String())
	result := func(id string) refunds.StripeResult {
		return refunds.StripeResult{RefundID: id, PaymentIntentID: pi, Status: "succeeded", AmountMinor: 500, Currency: "eur"}
	}
	decision := b.undecided(t, in, refunds.StepStripe, "transient", result(made.ID))
	with := func(r refunds.StripeResult) pipeline.DecisionInput {
		raw, err := json.Marshal(r)
		require.NoError(t, err)
		di := decision
		di.Result = raw
		return di
	}

	pipelinetest.RequireRefused(t, d, with(result("re_fake1")), "Stripe has no refund re_fake1", false)
	pipelinetest.RequireRefused(t, d, with(result(b.stripeRefund(t, pi, 400, key.String()).ID)), "is for 4.00 EUR, the ledger's for 5.00 EUR", false)
	pipelinetest.RequireRefused(t, d, with(result(b.stripeRefund(t, pi, 100, "acme:order:o1:refund:r9:refund_stripe").ID)),
		`carries the effect key "acme:order:o1:refund:r9:refund_stripe"`, false)
	wrongAmount := result(made.ID)
	wrongAmount.AmountMinor = 600
	pipelinetest.RequireRefused(t, d, with(wrongAmount), "the ledger reserved 500, the result says 600", false)
	pipelinetest.RequireRefused(t, d, with(refunds.StripeResult{RefundID: "ch_1"}), `stripe_refund_id "ch_1" is not a Stripe refund ID`, false)
	b.stripe.SetOutage(true)
	pipelinetest.RequireRefused(t, d, decision, "look up refund "+made.ID+" at Stripe", true)
	b.stripe.SetOutage(false)
	_, found, err := b.ledger.StripeOutcome(context.Background(), tenant, "o1", "r1")
	require.NoError(t, err)
	require.False(t, found, "nothing refused is recorded")

	res, err := d.Apply(context.Background(), decision)
	require.NoError(t, err)
	require.Equal(t, "confirmed", res.Verification)
	out, found, err := b.ledger.StripeOutcome(context.Background(), tenant, "o1", "r1")
	require.NoError(t, err)
	require.True(t, found)
	require.Equal(t, made.ID, out.RefundID)
	mark, err := exec[refunds.MarkResult](t, b.env, refundsteps.NameMarkRefunded, in)
	require.NoError(t, err, "the decided refund counts")
	require.Equal(t, string(orders.StatusPartiallyRefunded), mark.Status)
}

// A reserve that refused for good (the refund exceeds the charge) cannot
// be decided done: it never happened, and its run failed with it.
func TestDeciderRefusesDoneOnARefusedReserve(t *testing.T) {
	t.Parallel()
	b := setup(t)
	d := b.decider(t)
	b.order(t, "o1", "pm_card_visa")
	in := refunds.NewInput(tenant, "o1", "r1", amount+1, "")
	_, err := exec[refunds.ReserveResult](t, b.env, refundsteps.NameReserve, in)
	requireTerminal(t, err, step.ErrTypeInvalidState)
	key, err := in.EffectKey(refunds.StepReserve)
	require.NoError(t, err)
	raw, err := json.Marshal(refunds.ReserveResult{AmountMinor: amount + 1, Currency: "eur", RefundedMinor: amount + 1, ChargedMinor: amount + 1})
	require.NoError(t, err)
	_, err = d.Apply(context.Background(), pipeline.DecisionInput{EffectKey: key.String(), Step: refunds.StepReserve,
		Resolution: effects.ResolveDone, Result: raw, Reason: "x", By: "ada", Unverified: true})
	require.ErrorContains(t, err, "the step refused for good (invalid_state: ")
	require.ErrorContains(t, err, "exceeds what is left of the charge")
	require.Zero(t, b.ledgerRows(t, "o1"))
}

// Every declared refund step has a Verify and its declaration an Outcome.
func TestEveryRefundStepIsVerified(t *testing.T) {
	t.Parallel()
	pipelinetest.RequireVerified(t, refundflow.Pipeline())
}
