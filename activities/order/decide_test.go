package order_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/stripe/stripe-go/v76"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/notify"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/pipeline"
	"github.com/keyedhq/keyed/pipeline/pipelinetest"
	orderflow "github.com/keyedhq/keyed/workflows/order"
)

// undecided leaves key's effect record failed with code, as a step that
// waits for a decision leaves it, and returns the decision input of a
// "done" with result on it.
func (b *bundle) undecided(t *testing.T, key effects.Key, code string, result any) pipeline.DecisionInput {
	t.Helper()
	ctx := context.Background()
	cl, err := b.claims.Claim(ctx, effects.ClaimParams{Key: key, Owner: "wf/" + key.Parts()[2]})
	require.NoError(t, err)
	require.NoError(t, b.claims.Fail(ctx, cl, effects.NewCodedError(code, "outcome unknown")))
	raw, err := json.Marshal(result)
	require.NoError(t, err)
	return pipeline.DecisionInput{EffectKey: key.String(), Step: key.Parts()[2], Resolution: effects.ResolveDone,
		Result: raw, Reason: "checked the provider", By: "ada", RunID: "run-1"}
}

// intent creates a PaymentIntent at the fake Stripe as a client other than
// keyed would: for amount in eur, confirmed or not, carrying effectKey in
// its metadata when it is not empty.
func (b *bundle) intent(t *testing.T, amount int64, confirm bool, effectKey string) *stripe.PaymentIntent {
	t.Helper()
	p := &stripe.PaymentIntentParams{Amount: stripe.Int64(amount), Currency: stripe.String("eur"),
		PaymentMethod: stripe.String("pm_card_visa"), Confirm: stripe.Bool(confirm)}
	if effectKey != "" {
		p.AddMetadata("effect_key", effectKey)
	}
	pi, err := b.stripeAPI.PaymentIntents.New(p)
	require.NoError(t, err)
	return pi
}

// decider returns a Decider over the order pipeline's definitions, as the
// worker makes it.
func (b *bundle) decider(t *testing.T) *pipeline.Decider {
	t.Helper()
	d, err := pipeline.NewDecider(b.claims, b.acts.Definitions()...)
	require.NoError(t, err)
	return d
}

// requireRefused checks that d refuses in saying want
// (pipelinetest.RequireRefused), and that the record is still failed.
func (b *bundle) requireRefused(t *testing.T, d *pipeline.Decider, in pipeline.DecisionInput, want string, unverifiable bool) {
	t.Helper()
	pipelinetest.RequireRefused(t, d, in, want, unverifiable)
	key, err := effects.ParseKey(in.EffectKey)
	require.NoError(t, err)
	rec, err := b.claims.Get(context.Background(), key)
	require.NoError(t, err)
	require.Equal(t, effects.StateFailedTerminal, rec.State, "refused: %s", want)
}

// A charge waiting on a reused key is decided "done" only with the
// PaymentIntent Stripe has under its effect key, succeeded, for the
// order's amount: a made-up ID, another amount, another key, an intent not
// succeeded are contradicted; a Stripe outage leaves it unverifiable
// unless the operator overrides it, which the record keeps.
func TestDeciderVerifiesAChargeAtStripe(t *testing.T) {
	t.Parallel()
	b := setup(t)
	d := b.decider(t)
	in := b.order(t, "dc1", "pm_card_visa")
	key, err := in.EffectKey(orders.StepCharge)
	require.NoError(t, err)
	real := b.intent(t, 1250, true, key.String())
	result := func(id string, amount int64) orders.ChargeResult {
		return orders.ChargeResult{PaymentIntentID: id, Status: "succeeded", AmountMinor: amount, Currency: "eur"}
	}
	decision := b.undecided(t, key, "key_reused", result(real.ID, 1250))
	with := func(r orders.ChargeResult) pipeline.DecisionInput {
		raw, err := json.Marshal(r)
		require.NoError(t, err)
		di := decision
		di.Result = raw
		return di
	}

	b.requireRefused(t, d, with(result("pi_fake123", 1250)), "Stripe has no PaymentIntent pi_fake123", false)
	b.requireRefused(t, d, with(result(b.intent(t, 999, true, key.String()).ID, 1250)), "is for 9.99 EUR, the order for 12.50 EUR", false)
	other := b.intent(t, 1250, true, "acme:order:other:charge")
	b.requireRefused(t, d, with(result(other.ID, 1250)), "carries the effect key acme:order:other:charge, not "+key.String(), false)
	b.requireRefused(t, d, with(result(b.intent(t, 1250, true, "").ID, 1250)), "carries no effect key", false)
	b.requireRefused(t, d, with(result(b.intent(t, 1250, false, key.String()).ID, 1250)), "is requires_confirmation, not succeeded", false)
	b.requireRefused(t, d, with(result(real.ID, 999)), "the result is for 9.99 EUR, the order for 12.50 EUR", false)
	b.requireRefused(t, d, with(orders.ChargeResult{PaymentIntentID: real.ID}), `status "" is not "succeeded"`, false)

	b.stripe.SetOutage(true)
	b.requireRefused(t, d, decision, "the record could not be checked: look up PaymentIntent "+real.ID+" at Stripe", true)
	b.requireRefused(t, d, decision, "status 503", true)
	b.stripe.SetOutage(false)

	res, err := d.Apply(context.Background(), decision)
	require.NoError(t, err)
	require.Equal(t, "confirmed", res.Verification)
	rec, err := b.claims.Get(context.Background(), key)
	require.NoError(t, err)
	require.Equal(t, effects.StateSucceeded, rec.State)
	require.JSONEq(t, `{"payment_intent_id":"`+real.ID+`","status":"succeeded","amount_minor":1250,"currency":"eur"}`, string(rec.Result))
	require.Contains(t, rec.ErrorMessage, "ada decided done via the decide update of run run-1: checked the provider (confirmed)")

	// The operator overrides an outage: applied, and the record says so.
	key2, err := b.order(t, "dc2", "pm_card_visa").EffectKey(orders.StepCharge)
	require.NoError(t, err)
	over := b.undecided(t, key2, "key_reused", result(b.intent(t, 1250, true, key2.String()).ID, 1250))
	over.Unverified = true
	b.stripe.SetOutage(true)
	res, err = d.Apply(context.Background(), over)
	require.NoError(t, err)
	require.Contains(t, res.Verification, "unverified: look up PaymentIntent")
	rec, err = b.claims.Get(context.Background(), key2)
	require.NoError(t, err)
	require.Equal(t, effects.StateSucceeded, rec.State)
	require.Contains(t, rec.ErrorMessage, "(unverified: look up PaymentIntent")
}

// mailDirect sends a message to the fake SendGrid under effectKey, as the
// lost first attempt of a send did, and returns its X-Message-Id.
func (b *bundle) mailDirect(t *testing.T, url, effectKey string) string {
	t.Helper()
	body, err := json.Marshal(map[string]any{
		"personalizations": []any{map[string]any{"to": []any{map[string]string{"email": email}},
			"custom_args": map[string]string{"effect_key": effectKey}}},
		"from": map[string]string{"email": "receipts@example.com"}, "subject": "Your receipt",
		"content": []any{map[string]string{"type": "text/plain", "value": "Thank you."}},
	})
	require.NoError(t, err)
	req, err := http.NewRequest(http.MethodPost, url+"/v3/mail/send", bytes.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer SG.test")
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.Equal(t, http.StatusAccepted, resp.StatusCode)
	return resp.Header.Get("X-Message-Id")
}

// A receipt is decided "done" only with a message SendGrid's Email Activity
// shows under its effect key; an outage of the look-up is unverifiable.
// The writes are decided done only when the order's transition under
// their key is recorded.
func TestDeciderVerifiesAReceiptAtSendGridAndTheWritesInTheDatabase(t *testing.T) {
	t.Parallel()
	// A short send timeout and index lag, so that SendGrid's index is
	// complete within the test.
	b := setupWith(t, setupOpts{sender: &notify.SenderOpts{HTTPClient: &http.Client{Timeout: 200 * time.Millisecond},
		LookupLag: 100 * time.Millisecond}})
	mail := httptest.NewServer(b.sendgrid)
	t.Cleanup(mail.Close)
	d := b.decider(t)
	in := b.order(t, "dr1", "pm_card_visa")
	key, err := in.EffectKey(orders.StepReceipt)
	require.NoError(t, err)
	id := b.mailDirect(t, mail.URL, key.String())
	decision := b.undecided(t, key, "ambiguous", orders.ReceiptResult{MessageID: id})
	fake := decision
	fake.Result = json.RawMessage(`{"message_id":"made-up"}`)
	b.requireRefused(t, d, fake, "SendGrid shows only "+id+" under "+key.String()+" so far; its index may take 300ms", true)
	time.Sleep(300 * time.Millisecond)
	b.requireRefused(t, d, fake, "SendGrid's Email Activity shows only "+id+" under "+key.String()+", not made-up", false)
	b.sendgrid.SetLookupOutage(true)
	b.requireRefused(t, d, decision, "SendGrid email activity look-up failed: email activity look-up: status 503", true)
	b.sendgrid.SetLookupOutage(false)
	res, err := d.Apply(context.Background(), decision)
	require.NoError(t, err)
	require.Equal(t, "confirmed", res.Verification)
	require.Equal(t, 1, b.sendgrid.Count(), "deciding sends nothing")

	paidKey, err := in.EffectKey(orders.StepMarkPaid)
	require.NoError(t, err)
	paid := b.undecided(t, paidKey, "transient", orders.MarkPaidResult{Status: "paid"})
	b.requireRefused(t, d, paid, "order acme/dr1 has no transition recorded under "+paidKey.String(), false)
	tx, err := b.pool.Begin(context.Background())
	require.NoError(t, err)
	_, err = b.store.TransitionTx(context.Background(), tx, "acme", "dr1", orders.StatusPending, orders.StatusPaid, paidKey.String())
	require.NoError(t, err)
	require.NoError(t, tx.Commit(context.Background()))
	res, err = d.Apply(context.Background(), paid)
	require.NoError(t, err)
	require.Equal(t, "confirmed", res.Verification)
}

// MarkPaid keeps no effect record (it is self-guarded): "done" is applied
// only when its transition is there, and stores nothing; "retry" has
// nothing to undo.
func TestDeciderChecksASelfGuardedStepAgainstItsOwnWrite(t *testing.T) {
	t.Parallel()
	b := setup(t)
	d := b.decider(t)
	in := b.order(t, "sg1", "pm_card_visa")
	key, err := in.EffectKey(orders.StepMarkPaid)
	require.NoError(t, err)
	raw, err := json.Marshal(orders.MarkPaidResult{Status: "paid"})
	require.NoError(t, err)
	done := pipeline.DecisionInput{EffectKey: key.String(), Step: orders.StepMarkPaid, Resolution: effects.ResolveDone,
		Result: raw, Reason: "paid by hand", By: "ada", RunID: "run-1"}
	pipelinetest.RequireRefused(t, d, done, `no transition recorded under `+key.String()+`: the step did not write it; decide retry; this step keeps no effect record`, false)
	done.Unverified = true
	pipelinetest.RequireRefused(t, d, done, "no transition recorded under", false)

	retry := done
	retry.Resolution, retry.Unverified = effects.ResolveRetry, false
	res, err := d.Apply(context.Background(), retry)
	require.NoError(t, err)
	require.Equal(t, "absent", res.State)

	_, err = b.charge(t, in)
	require.NoError(t, err)
	_, err = b.markPaid(t, in)
	require.NoError(t, err)
	done.Unverified = false
	res, err = d.Apply(context.Background(), done)
	require.NoError(t, err)
	require.Equal(t, "confirmed", res.Verification)
	require.Equal(t, string(effects.StateSucceeded), res.State)
	_, err = b.claims.Get(context.Background(), key)
	require.ErrorIs(t, err, effects.ErrNotFound, "a decision on a self-guarded step stores no record")
}

// Every declared order step has a Verify and its declaration an Outcome;
// without Stripe or SendGrid, the steps that ask them are unverifiable.
func TestEveryOrderStepIsVerified(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pipelinetest.RequireVerified(t, orderflow.Pipeline())
	d, err := pipeline.NewDeciderOf([]pipeline.Spec{orderflow.Pipeline()}, pipeline.Deps{DB: b.pool, Effects: b.claims})
	require.NoError(t, err)
	key, err := b.order(t, "dn1", "pm_card_visa").EffectKey(orders.StepCharge)
	require.NoError(t, err)
	decision := b.undecided(t, key, "key_reused", orders.ChargeResult{PaymentIntentID: "pi_1", Status: "succeeded", AmountMinor: 1250, Currency: "eur"})
	b.requireRefused(t, d, decision, "no Stripe client to ask (STRIPE_SECRET_KEY is not set)", true)
}
