package main

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/stripe/stripe-go/v76"

	"github.com/keyedhq/keyed/activities/stripestep"
	"github.com/keyedhq/keyed/effects/effectstest"
	"github.com/keyedhq/keyed/internal/dbtest"
	"github.com/keyedhq/keyed/internal/fakestripe"
	"github.com/keyedhq/keyed/reconcile"
)

func TestReconcilePrintsRefundFindings(t *testing.T) {
	t.Parallel()
	_, url := effectstest.NewSchema(t)
	pool := dbtest.Connect(t, url)
	srv := httptest.NewServer(fakestripe.New(nil))
	t.Cleanup(srv.Close)
	const secret = "sk_test_reconcile_refunds_0123456789"
	env := map[string]string{"DATABASE_URL": url, "TEMPORAL_ADDRESS": "127.0.0.1:1", "STRIPE_SECRET_KEY": secret, "STRIPE_API_BASE": srv.URL}
	ctx := context.Background()
	sc, err := stripestep.NewClient(secret, srv.URL, srv.Client())
	require.NoError(t, err)
	p := &stripe.PaymentIntentParams{Amount: stripe.Int64(1999), Currency: stripe.String("usd"),
		PaymentMethod: stripe.String("pm_card_visa"), Confirm: stripe.Bool(true)}
	pi, err := sc.PaymentIntents.New(p)
	require.NoError(t, err)
	refund := func(effectKey string, amount int64) *stripe.Refund {
		t.Helper()
		rp := &stripe.RefundParams{PaymentIntent: stripe.String(pi.ID), Amount: stripe.Int64(amount)}
		rp.AddMetadata("effect_key", effectKey)
		re, err := sc.Refunds.New(rp)
		require.NoError(t, err)
		return re
	}
	// Refunded at Stripe; the ledger has no row.
	lost := refund("acme:order:cli-f1:refund:r9:refund_stripe", 300)
	// In the ledger for 500, recorded so, refunded for 400.
	_, err = pool.Exec(ctx, `INSERT INTO orders (tenant_id, id, amount_minor, currency, customer_email, payment_method, status)
VALUES ('acme', 'cli-f2', 1999, 'usd', 'ada@example.com', 'pm_card_visa', 'paid')`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO refund_ledger (tenant_id, order_id, refund_id, amount_minor, effect_key)
VALUES ('acme', 'cli-f2', 'r1', 500, 'acme:order:cli-f2:refund:r1:refund_reserve')`)
	require.NoError(t, err)
	short := refund("acme:order:cli-f2:refund:r1:refund_stripe", 400)
	_, err = pool.Exec(ctx, `INSERT INTO refund_stripe_outcomes
(tenant_id, order_id, refund_id, stripe_refund_id, payment_intent_id, status, amount_minor, currency, effect_key)
VALUES ('acme', 'cli-f2', 'r1', $1, $2, 'succeeded', 500, 'usd', 'acme:order:cli-f2:refund:r1:refund_stripe')`, short.ID, pi.ID)
	require.NoError(t, err)

	code, out, errOut := starter(t, env, "reconcile", "--since", "1h")
	require.Equal(t, 3, code, errOut)
	for _, want := range []string{
		"refunds          1 (in the ledger)", "stripe refunds   2 (at Stripe, with an effect_key)", "findings         2",
		"unrecorded_refund", "acme:order:cli-f1:refund:r9:refund_stripe", lost.ID + " succeeded 3.00 USD of " + pi.ID,
		"refund_mismatch", "refund r1 5.00 USD as " + short.ID + " succeeded 5.00 USD of " + pi.ID, "amount 500 in the ledger, 400 at Stripe",
	} {
		require.Contains(t, out, want)
	}
	code, out, errOut = starter(t, env, "reconcile", "--since", "1h", "--json")
	require.Equal(t, 3, code, errOut)
	var rep reconcile.Report
	require.NoError(t, json.Unmarshal([]byte(out), &rep), out)
	require.Equal(t, []reconcile.Kind{reconcile.KindUnrecordedRefund, reconcile.KindRefundMismatch},
		[]reconcile.Kind{rep.Findings[0].Kind, rep.Findings[1].Kind})
	require.Equal(t, short.ID, rep.Findings[1].ProviderRefunds[0].RefundID)
	require.Equal(t, "r1", rep.Findings[1].Refund.RefundID)
}
