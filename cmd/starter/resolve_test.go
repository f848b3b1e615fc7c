package main

import (
	"context"
	"math"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/stripe/stripe-go/v76"

	"github.com/keyedhq/keyed/activities/stripestep"
	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/effects/effectstest"
	"github.com/keyedhq/keyed/internal/dbtest"
	"github.com/keyedhq/keyed/internal/fakestripe"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/pipeline"
	"github.com/keyedhq/keyed/refunds"
	"github.com/keyedhq/keyed/step"
)

// runOfKey finds the run of an order's and a refund's step from the key
// alone, as each pipeline derives its workflow ID.
func TestRunOfKeyMapsOrderAndRefundKeys(t *testing.T) {
	t.Parallel()
	order := orders.NewOrderInput("acme", "9f3a")
	refund := refunds.NewInput("acme", "9f3a", "r1", 500, "")
	cases := []struct {
		key       string
		id, step  string
		recognise bool
	}{
		{"acme:order:9f3a:receipt", order.WorkflowID(), orders.StepReceipt, true},
		{"acme:order:9f3a:refund:r1:refund_email", refund.WorkflowID(), refunds.StepEmail, true},
		{"acme:order:9f3a:refund:r1:refund_stripe", refund.WorkflowID(), refunds.StepStripe, true},
		{"acme:order:9f3a", "", "", false},
		{"acme:order:9f3a:refund:r1", "", "", false},
		{"acme:shipment:s1:label", "", "", false},
		{"acme:order:9f3a:other:r1:refund_email", "", "", false},
	}
	for _, c := range cases {
		k, err := effects.ParseKey(c.key)
		require.NoError(t, err, c.key)
		id, step, ok := runOfKey(k)
		require.Equal(t, c.recognise, ok, c.key)
		require.Equal(t, c.id, id, c.key)
		require.Equal(t, c.step, step, c.key)
	}
	require.Equal(t, "order:acme:9f3a:fulfil", order.WorkflowID())
	require.Equal(t, "refund:acme:9f3a:r1", refund.WorkflowID())
}

// resolve --as done on a record no run waits for checks the outcome
// against Stripe as the waiting run would: a made-up PaymentIntent is
// refused with exit 2 and why, the one Stripe holds under the key is
// applied; an outage is refused unless --unverified. A done on a refund
// reserve that refused for good is refused, whatever the flags.
func TestResolveDoneChecksTheProvider(t *testing.T) {
	t.Parallel()
	_, url := effectstest.NewSchema(t)
	pool := dbtest.Connect(t, url)
	fake := fakestripe.New(nil)
	srv := httptest.NewServer(fake)
	t.Cleanup(srv.Close)
	env := withTemporal(t, map[string]string{"DATABASE_URL": url,
		"STRIPE_SECRET_KEY": "sk_test_resolve", "STRIPE_API_BASE": srv.URL})
	fxc := effectstest.NewClient(t, pool, nil)
	ctx := context.Background()
	store, err := orders.NewStore(pool)
	require.NoError(t, err)
	_, _, err = store.Create(ctx, orders.NewOrder{TenantID: "acme", ID: "c1", AmountMinor: 2500, Currency: "eur",
		CustomerEmail: "ann@example.com", PaymentMethod: "pm_card_visa"})
	require.NoError(t, err)
	key := effects.MustKey("acme", "order", "c1", "charge")
	cl, err := fxc.Claim(ctx, effects.ClaimParams{Key: key, Owner: "wf/charge"})
	require.NoError(t, err)
	require.NoError(t, fxc.Fail(ctx, cl, effects.NewCodedError("key_reused", "the key came back with other inputs")))
	runDeleted(t, pool, key)
	sc, err := stripestep.NewClient("sk_test_resolve", srv.URL, nil)
	require.NoError(t, err)
	p := &stripe.PaymentIntentParams{Amount: stripe.Int64(2500), Currency: stripe.String("eur"),
		PaymentMethod: stripe.String("pm_card_visa"), Confirm: stripe.Bool(true)}
	p.AddMetadata("effect_key", key.String())
	pi, err := sc.PaymentIntents.New(p)
	require.NoError(t, err)

	done := func(id string, extra ...string) []string {
		return append([]string{"resolve", "--key", key.String(), "--as", "done", "--by", "ops", "--reason", "seen at Stripe",
			"--result", `{"payment_intent_id":"` + id + `","status":"succeeded","amount_minor":2500,"currency":"eur"}`}, extra...)
	}
	code, out, errOut := starter(t, env, done("pi_fake123")...)
	require.Equal(t, 2, code, errOut)
	require.Empty(t, out)
	require.Contains(t, errOut, "DecisionRefused: done on charge acme:order:c1:charge refused: Stripe has no PaymentIntent pi_fake123")
	code, _, errOut = starter(t, env, done("pi_fake123", "--unverified")...)
	require.Equal(t, 2, code, "a contradiction is not overridden: %s", errOut)
	fake.SetOutage(true)
	code, _, errOut = starter(t, env, done(pi.ID)...)
	require.Equal(t, 2, code, errOut)
	require.Contains(t, errOut, "the record could not be checked: look up PaymentIntent "+pi.ID+" at Stripe")
	fake.SetOutage(false)
	rec, err := fxc.Get(ctx, key)
	require.NoError(t, err)
	require.Equal(t, effects.StateFailedTerminal, rec.State, "nothing refused changed the record")

	code, out, errOut = starter(t, env, done(pi.ID)...)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "acme:order:c1:charge is now succeeded (resolved by operator: ops decided done via starter resolve: seen at Stripe (confirmed))")

	// A refund whose reserve refused for good cannot be done.
	_, _, err = store.Create(ctx, orders.NewOrder{TenantID: "acme", ID: "p1", AmountMinor: 500, Currency: "eur",
		CustomerEmail: "ann@example.com", PaymentMethod: "pm_card_visa"})
	require.NoError(t, err)
	reserve := effects.MustKey("acme", "order", "p1", "refund", "r1", "refund_reserve")
	cl, err = fxc.Claim(ctx, effects.ClaimParams{Key: reserve, Owner: "refund:acme:p1:r1/refund_reserve"})
	require.NoError(t, err)
	require.NoError(t, fxc.Fail(ctx, cl, &step.Error{Type: step.ErrTypeInvalidState, Message: "order is pending, not paid: nothing to refund"}))
	runDeleted(t, pool, reserve)
	code, _, errOut = starter(t, env, "resolve", "--key", reserve.String(), "--as", "done", "--by", "ops", "--reason", "x", "--unverified",
		"--result", `{"amount_minor":500,"currency":"eur","refunded_minor":500,"charged_minor":500}`)
	require.Equal(t, 2, code, errOut)
	require.Contains(t, errOut, "the step refused for good (invalid_state: order is pending, not paid: nothing to refund)")
}

// A batch decides one kind of step: a query listing runs that wait on
// several steps is refused unless --step names one, which filters them.
func TestBatchDecidesOneStepKind(t *testing.T) {
	t.Parallel()
	wait := func(step string) *pipeline.Wait {
		return &pipeline.Wait{StepStatus: pipeline.StepStatus{Step: step}}
	}
	waits := []*pipeline.Wait{wait("receipt"), wait("charge"), wait("receipt")}
	_, err := oneStep(waits, "")
	require.ErrorContains(t, err, "--query lists runs waiting on 2 steps (charge, receipt): give --step")
	got, err := oneStep(waits, "receipt")
	require.NoError(t, err)
	require.Len(t, got, 2)
	got, err = oneStep(waits[:1], "")
	require.NoError(t, err)
	require.Len(t, got, 1)

	rate := 0.0
	err = checkBatch(batch{rate: &rate}, pipeline.Decision{Resolution: "maybe"})
	require.ErrorContains(t, err, "--rate must be above 0 and at most 1000")
	require.ErrorContains(t, err, `invalid --as "maybe"`)
	require.ErrorContains(t, err, "--reason is required")
	// A rate whose ticker interval would be zero or undefined is refused too.
	ok := pipeline.Decision{Resolution: effects.ResolveRetry, Reason: "x", By: "ada"}
	for _, r := range []float64{math.NaN(), math.Inf(1), 1e308, maxRate + 1} {
		err = checkBatch(batch{rate: &r}, ok)
		require.ErrorContains(t, err, "--rate must be above 0 and at most 1000", "%v", r)
	}
	rate = maxRate
	require.NoError(t, checkBatch(batch{rate: &rate}, ok))
}
