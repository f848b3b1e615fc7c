package tests

import (
	"encoding/json"
	"os/exec"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/stripe/stripe-go/v76"

	"github.com/keyedhq/keyed/activities/stripestep"
	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/internal/devserver"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/pipeline"
)

// TestDoneOnAChargeNeedsTheRealPaymentIntent is issue 18's finding 0: a
// charge waits on a reused key (Stripe holds another request under the
// charge's key). A "done" without a result, through the Web UI's decide
// update (here Temporal's CLI, the same update) and through `starter
// resolve`, is refused before it enters history; a "done" with a made-up
// PaymentIntent is refused after Stripe is asked. Neither marks the order
// paid nor sends a receipt, and the run keeps waiting. A "done" with the
// PaymentIntent Stripe holds under the key is accepted, confirmed, and the
// run goes on: the order is paid with that PaymentIntent and one receipt
// goes out.
func TestDoneOnAChargeNeedsTheRealPaymentIntent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startWorker(t)
	o := b.order(t, "kr1", 2500, "pm_card_visa")
	in := orders.NewOrderInput(b.tenant, o.ID)
	key, err := in.EffectKey(orders.StepCharge)
	require.NoError(t, err)
	// Another request under the charge's key: the same amount, another
	// description, with the effect key in its metadata.
	sc, err := stripestep.NewClient(stripeKey, b.stripeURL, nil)
	require.NoError(t, err)
	p := &stripe.PaymentIntentParams{Amount: stripe.Int64(2500), Currency: stripe.String("eur"), PaymentMethod: stripe.String("pm_card_visa"),
		Confirm: stripe.Bool(true), Description: stripe.String("an earlier checkout")}
	p.SetIdempotencyKey(key.String())
	p.AddMetadata("effect_key", key.String())
	held, err := sc.PaymentIntents.New(p)
	require.NoError(t, err)

	st := b.start(t, in)
	require.Equal(t, "charge:key_reused", b.awaitAttention(t, st.WorkflowID).Attention)

	// The exact update, as the Web UI sends it.
	bin, err := devserver.FindBinary()
	require.NoError(t, err)
	out, err := exec.CommandContext(b.ctx, bin, "workflow", "update", "execute", "--address", temporalAddr,
		"--workflow-id", st.WorkflowID, "--name", pipeline.UpdateDecide,
		"--input", `{"step":"charge","resolution":"done","by":"ops","reason":"test"}`).CombinedOutput()
	require.Error(t, err, "the update is refused:\n%s", out)
	require.Contains(t, string(out), "decision refused: result is required with done: the step's outcome")
	require.Contains(t, string(out), "payment_intent_id", "and names its fields")

	starter := b.starterRun(t)
	code, text := starter("resolve", "--key", key.String(), "--as", "done", "--by", "ops", "--reason", "test")
	require.Equal(t, 2, code, text)
	require.Contains(t, text, "--result is required with done")

	fake := json.RawMessage(`{"payment_intent_id":"pi_fake0000000000000000000","status":"succeeded","amount_minor":2500,"currency":"eur"}`)
	_, err = pipeline.SendDecision(b.ctx, b.temporal, st.WorkflowID, "", pipeline.Decision{Step: "charge", Resolution: effects.ResolveDone,
		By: "ops", Reason: "test", Result: fake})
	require.ErrorContains(t, err, "DecisionRefused: done on charge "+key.String()+" refused: Stripe has no PaymentIntent pi_fake0000000000000000000")
	code, text = starter("resolve", "--key", key.String(), "--as", "done", "--by", "ops", "--reason", "test", "--result", string(fake))
	require.Equal(t, 2, code, text)
	require.Contains(t, text, "the waiting run "+st.WorkflowID+" refused the decision: DecisionRefused: done on charge "+key.String()+
		" refused: Stripe has no PaymentIntent pi_fake0000000000000000000")

	require.Zero(t, b.mail.Count(), "no receipt went out")
	got, err := b.orders.Get(b.ctx, b.tenant, o.ID)
	require.NoError(t, err)
	require.Equal(t, orders.StatusPending, got.Status, "the order is not paid")
	require.Equal(t, effects.StateFailedTerminal, b.records(t, o.ID)[orders.StepCharge].State)
	require.NotContains(t, b.records(t, o.ID), orders.StepMarkPaid)
	value, _, err := pipeline.AttentionOf(b.ctx, b.temporal, st.WorkflowID)
	require.NoError(t, err)
	require.Equal(t, "charge:key_reused", value, "the run keeps waiting")

	real, err := json.Marshal(orders.ChargeResult{PaymentIntentID: held.ID, Status: "succeeded", AmountMinor: 2500, Currency: "eur"})
	require.NoError(t, err)
	res, err := pipeline.SendDecision(b.ctx, b.temporal, st.WorkflowID, "", pipeline.Decision{Step: "charge", Resolution: effects.ResolveDone,
		By: "ops", Reason: "the earlier checkout charged it", Result: real})
	require.NoError(t, err)
	require.Equal(t, "confirmed", res.Verification)
	result, err := b.wait(t, st)
	require.NoError(t, err)
	require.Equal(t, held.ID, result.Charge.PaymentIntentID)
	got, err = b.orders.Get(b.ctx, b.tenant, o.ID)
	require.NoError(t, err)
	require.Equal(t, orders.StatusPaid, got.Status)
	require.Equal(t, 1, b.mail.Count(), "one receipt, for the real charge")
	require.Equal(t, 1, b.stripe.Charges(), "nothing charged again")
	require.Equal(t, 1, b.runs(t, st.WorkflowID), "the same run went on")
	require.Contains(t, b.records(t, o.ID)[orders.StepCharge].ErrorMessage, "ops decided done via the decide update of run "+st.RunID)
}
