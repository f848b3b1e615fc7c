package reconcile_test

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/stripe/stripe-go/v76"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/reconcile"
	"github.com/keyedhq/keyed/refunds"
)

// order inserts a paid order of amount usd and charges it the keyed way,
// at at, returning its PaymentIntent.
func (b *bundle) order(t *testing.T, tenant, id string, amount int64, at time.Time) *stripe.PaymentIntent {
	t.Helper()
	_, err := b.pool.Exec(b.ctx, `INSERT INTO orders (tenant_id, id, amount_minor, currency, customer_email, payment_method, status)
VALUES ($1, $2, $3, 'usd', 'ada@example.com', 'pm_card_visa', 'paid')`, tenant, id, amount)
	require.NoError(t, err)
	return b.charge(t, tenant+":order:"+id+":charge", amount, at)
}

// stripeKey returns the refund's refund_stripe effect key.
func stripeKey(t *testing.T, tenant, order, refundID string) string {
	t.Helper()
	k, err := refunds.NewInput(tenant, order, refundID, 1, "").EffectKey(refunds.StepStripe)
	require.NoError(t, err)
	return k.String()
}

// reserve appends the refund to the ledger as reserved at at, as the
// Reserve step does.
func (b *bundle) reserve(t *testing.T, tenant, order, refundID string, amount int64, at time.Time) {
	t.Helper()
	k, err := refunds.NewInput(tenant, order, refundID, amount, "").EffectKey(refunds.StepReserve)
	require.NoError(t, err)
	_, err = b.pool.Exec(b.ctx, `INSERT INTO refund_ledger (tenant_id, order_id, refund_id, amount_minor, reason, effect_key, created_at)
VALUES ($1, $2, $3, $4, 'damaged', $5, $6)`, tenant, order, refundID, amount, k.String(), at)
	require.NoError(t, err)
}

// stripeRefund refunds amount of pi at the fake at at, under the
// Idempotency-Key idem, with the metadata the refund_stripe step sets for
// effectKey (none when it is empty).
func (b *bundle) stripeRefund(t *testing.T, pi *stripe.PaymentIntent, effectKey, idem string, amount int64, at time.Time) *stripe.Refund {
	t.Helper()
	b.setClock(at)
	p := &stripe.RefundParams{PaymentIntent: stripe.String(pi.ID), Amount: stripe.Int64(amount)}
	p.SetIdempotencyKey(idem)
	if effectKey != "" {
		p.AddMetadata("effect_key", effectKey)
		p.AddMetadata("tenant_id", "acme")
	}
	re, err := b.stripe.Refunds.New(p)
	require.NoError(t, err)
	return re
}

// outcome records res as the refund's Stripe outcome and completes its
// refund_stripe step with it, as the step does.
func (b *bundle) outcome(t *testing.T, tenant, order, refundID string, res refunds.StripeResult) {
	t.Helper()
	key := stripeKey(t, tenant, order, refundID)
	_, err := b.pool.Exec(b.ctx, `INSERT INTO refund_stripe_outcomes
(tenant_id, order_id, refund_id, stripe_refund_id, payment_intent_id, status, amount_minor, currency, effect_key)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)`, tenant, order, refundID, res.RefundID, res.PaymentIntentID, res.Status, res.AmountMinor, res.Currency, key)
	require.NoError(t, err)
	b.record(t, key, res, time.Now())
}

// refund does what the refund workflow's first two steps do: reserve,
// refund at Stripe under the effect key, record the answer.
func (b *bundle) refund(t *testing.T, pi *stripe.PaymentIntent, order, refundID string, amount int64, reservedAt, refundedAt time.Time) *stripe.Refund {
	t.Helper()
	b.reserve(t, "acme", order, refundID, amount, reservedAt)
	key := stripeKey(t, "acme", order, refundID)
	re := b.stripeRefund(t, pi, key, key, amount, refundedAt)
	b.outcome(t, "acme", order, refundID, refundResult(re))
	return re
}

func refundResult(re *stripe.Refund) refunds.StripeResult {
	return refunds.StripeResult{RefundID: re.ID, PaymentIntentID: re.PaymentIntent.ID, Status: string(re.Status),
		AmountMinor: re.Amount, Currency: string(re.Currency)}
}

// finding returns rep's finding of kind for key.
func finding(t *testing.T, rep *reconcile.Report, kind reconcile.Kind, key string) reconcile.Finding {
	t.Helper()
	for _, f := range rep.Findings {
		if f.Kind == kind && f.EffectKey == key {
			return f
		}
	}
	t.Fatalf("no %s finding for %s in %v", kind, key, kinds(rep))
	return reconcile.Finding{}
}

func TestCleanWithPartialRefunds(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pi := b.order(t, "acme", "1", 1999, from.Add(time.Hour))
	b.refund(t, pi, "1", "r1", 500, from.Add(2*time.Hour), from.Add(2*time.Hour))
	b.refund(t, pi, "1", "r2", 700, from.Add(3*time.Hour), from.Add(3*time.Hour+time.Second))
	// Charged and reserved before the window, refunded in it.
	old := b.order(t, "acme", "old", 900, from.Add(-72*time.Hour))
	b.refund(t, old, "old", "r1", 900, from.Add(-time.Minute), from.Add(time.Second))
	// Reserved at the end of the window, refunded after it.
	b.refund(t, pi, "1", "r3", 99, b.window.To.Add(-time.Second), b.window.To.Add(time.Second))
	// Not keyed's: a charge and its refund without an effect_key.
	b.stripeRefund(t, b.pi(t, "someone-else", "", 4200, "pm_card_visa", from.Add(5*time.Hour)), "", "dashboard", 100, from.Add(5*time.Hour))

	rep := b.run(t)
	require.True(t, rep.Clean(), "%+v", rep.Findings)
	require.Equal(t, 3, rep.Refunds, "r1, r2 and r3 of order 1")
	require.Equal(t, 3, rep.StripeRefunds, "r1, r2 and old's; not r3, nor the dashboard's")
	require.Zero(t, rep.InFlight)
	for _, k := range []reconcile.Kind{reconcile.KindDoubleRefund, reconcile.KindUnrecordedRefund, reconcile.KindRefundMismatch, reconcile.KindRefundMissingAtProvider} {
		require.Zero(t, b.gauge(t, k), k)
	}
	out, err := json.Marshal(rep)
	require.NoError(t, err)
	require.Contains(t, string(out), `"refunds":3,"stripe_refunds":3`)
}

func TestUnrecordedRefundIsMoneyOutWithoutARecord(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pi := b.order(t, "acme", "1", 1999, from.Add(time.Hour))
	// Refunded at Stripe under a refund's key that the ledger never had.
	lostKey := stripeKey(t, "acme", "1", "lost")
	lost := b.stripeRefund(t, pi, lostKey, lostKey, 300, from.Add(2*time.Hour))
	// Refunded under a key that is no refund's.
	b.stripeRefund(t, pi, "acme:order:1:manual", "manual", 100, from.Add(3*time.Hour))
	// Reserved and refunded; the worker died before recording the answer,
	// long ago: its claim expired.
	b.reserve(t, "acme", "1", "died", 200, from.Add(4*time.Hour))
	diedKey := stripeKey(t, "acme", "1", "died")
	b.claim(t, diedKey, from.Add(4*time.Hour))
	_, err := b.pool.Exec(b.ctx, `UPDATE keyed_effects SET lease_until = now() - interval '1 second' WHERE key = $1`, diedKey)
	require.NoError(t, err)
	b.stripeRefund(t, pi, diedKey, diedKey, 200, from.Add(4*time.Hour))
	// Refunded from the Dashboard, without an effect key, twice: of a keyed
	// charge in the window, and of one before it.
	dash := b.stripeRefund(t, pi, "", "dashboard-1", 50, from.Add(5*time.Hour))
	old := b.order(t, "acme", "old", 900, from.Add(-72*time.Hour))
	b.stripeRefund(t, old, "", "dashboard-2", 60, from.Add(6*time.Hour))
	// Not keyed's at all: no finding.
	b.stripeRefund(t, b.pi(t, "someone-else", "", 4200, "pm_card_visa", from.Add(7*time.Hour)), "", "dashboard-3", 70, from.Add(7*time.Hour))

	rep := b.run(t)
	require.Equal(t, []string{
		"unrecorded_refund acme:order:1:charge",
		"unrecorded_refund acme:order:1:manual",
		"unrecorded_refund " + diedKey,
		"unrecorded_refund " + lostKey,
		"unrecorded_refund acme:order:old:charge",
	}, kinds(rep))
	f := finding(t, rep, reconcile.KindUnrecordedRefund, "acme:order:1:charge")
	require.Equal(t, "acme", f.TenantID)
	require.Equal(t, []refunds.StripeResult{refundResult(dash)}, f.ProviderRefunds)
	require.Contains(t, f.Detail, "Stripe refunded "+dash.ID+" of payment intent "+pi.ID+" without an effect_key")
	require.Len(t, finding(t, rep, reconcile.KindUnrecordedRefund, "acme:order:old:charge").ProviderRefunds, 1)
	f = finding(t, rep, reconcile.KindUnrecordedRefund, lostKey)
	require.Equal(t, "acme", f.TenantID)
	require.Nil(t, f.Refund)
	require.Empty(t, f.RecordState)
	require.Equal(t, []refunds.StripeResult{refundResult(lost)}, f.ProviderRefunds)
	require.Contains(t, f.Detail, "refund_ledger has no row")
	f = finding(t, rep, reconcile.KindUnrecordedRefund, diedKey)
	require.Equal(t, effects.StateClaimed, f.RecordState)
	require.Equal(t, "died", f.Refund.RefundID)
	require.EqualValues(t, 200, f.Refund.AmountMinor)
	require.Nil(t, f.Refund.Stripe)
	require.Contains(t, f.Detail, "keyed recorded no Stripe answer (the refund_stripe step is claimed)")
	require.Equal(t, 5.0, b.gauge(t, reconcile.KindUnrecordedRefund))

	out, err := json.Marshal(rep)
	require.NoError(t, err)
	require.NotContains(t, string(out), "damaged", "no refund reason reaches a finding")
}

func TestDoubleRefundOfOneRefundID(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pi := b.order(t, "acme", "1", 1999, from.Add(time.Hour))
	first := b.refund(t, pi, "1", "r1", 500, from.Add(2*time.Hour), from.Add(2*time.Hour))
	key := stripeKey(t, "acme", "1", "r1")
	// Same refund, another idempotency key: Stripe refunds again.
	second := b.stripeRefund(t, pi, key, key+":retry", 500, from.Add(3*time.Hour))
	// Refunded two days before the window; refunded again in it.
	old := b.order(t, "acme", "old", 900, from.Add(-72*time.Hour))
	b.refund(t, old, "old", "r1", 400, from.Add(-48*time.Hour), from.Add(-48*time.Hour))
	oldKey := stripeKey(t, "acme", "old", "r1")
	again := b.stripeRefund(t, old, oldKey, "again", 400, from.Add(4*time.Hour))

	rep := b.run(t)
	require.Equal(t, []string{"double_refund " + key, "double_refund " + oldKey}, kinds(rep), "the records match the first refunds: no mismatch")
	f := finding(t, rep, reconcile.KindDoubleRefund, key)
	require.Equal(t, effects.StateSucceeded, f.RecordState)
	require.Equal(t, first.ID, f.Refund.Stripe.RefundID)
	require.Equal(t, []refunds.StripeResult{refundResult(first), refundResult(second)}, f.ProviderRefunds)
	require.Contains(t, f.Detail, "2 refunds at Stripe carry this effect key: "+first.ID+", "+second.ID)
	f = finding(t, rep, reconcile.KindDoubleRefund, oldKey)
	require.Len(t, f.ProviderRefunds, 2, "the refund before the window is listed by payment intent")
	require.Equal(t, again.ID, f.ProviderRefunds[1].RefundID)
	require.Equal(t, 2.0, b.gauge(t, reconcile.KindDoubleRefund))
	require.Equal(t, 2, b.fake.RefundsForMetadata("effect_key", key))
}

func TestRefundMismatchBetweenLedgerAndStripe(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pi := b.order(t, "acme", "1", 1999, from.Add(time.Hour))
	other := b.order(t, "acme", "2", 1999, from.Add(time.Hour))
	// The ledger reserved 500; Stripe refunded 400 (and recorded it so).
	b.reserve(t, "acme", "1", "amount", 500, from.Add(2*time.Hour))
	amountKey := stripeKey(t, "acme", "1", "amount")
	re := b.stripeRefund(t, pi, amountKey, amountKey, 400, from.Add(2*time.Hour))
	b.outcome(t, "acme", "1", "amount", refundResult(re))
	// The recorded answer names another Stripe refund.
	b.reserve(t, "acme", "1", "id", 100, from.Add(3*time.Hour))
	idKey := stripeKey(t, "acme", "1", "id")
	real := b.stripeRefund(t, pi, idKey, idKey, 100, from.Add(3*time.Hour))
	wrong := refundResult(real)
	wrong.RefundID = "re_notthisone"
	b.outcome(t, "acme", "1", "id", wrong)
	// Refunded on another order's payment intent.
	b.reserve(t, "acme", "1", "pi", 50, from.Add(4*time.Hour))
	piKey := stripeKey(t, "acme", "1", "pi")
	elsewhere := b.stripeRefund(t, other, piKey, piKey, 50, from.Add(4*time.Hour))
	b.outcome(t, "acme", "1", "pi", refundResult(elsewhere))

	rep := b.run(t)
	require.ElementsMatch(t, []string{
		"refund_mismatch " + amountKey, "refund_mismatch " + idKey, "refund_mismatch " + piKey,
	}, kinds(rep))
	require.Contains(t, finding(t, rep, reconcile.KindRefundMismatch, amountKey).Detail, "amount 500 in the ledger, 400 at Stripe")
	require.Contains(t, finding(t, rep, reconcile.KindRefundMismatch, idKey).Detail,
		"keyed recorded Stripe refund re_notthisone, but Stripe's refund under this key is "+real.ID)
	f := finding(t, rep, reconcile.KindRefundMismatch, piKey)
	require.Contains(t, f.Detail, "the order was charged on "+pi.ID+", and Stripe refunded "+other.ID)
	require.Equal(t, other.ID, f.Refund.Stripe.PaymentIntentID)
	require.Equal(t, 3.0, b.gauge(t, reconcile.KindRefundMismatch))
}

func TestRefundMissingAtProviderIsARefundNeverMade(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pi := b.order(t, "acme", "1", 1999, from.Add(time.Hour))
	// Recorded as refunded; Stripe has no such refund.
	b.reserve(t, "acme", "1", "ghost", 100, from.Add(2*time.Hour))
	b.outcome(t, "acme", "1", "ghost", refunds.StripeResult{RefundID: "re_ghost", PaymentIntentID: pi.ID, Status: "succeeded", AmountMinor: 100, Currency: "usd"})
	// The step's record succeeded, with no outcome row and no refund.
	b.reserve(t, "acme", "1", "step", 100, from.Add(3*time.Hour))
	b.record(t, stripeKey(t, "acme", "1", "step"), refunds.StripeResult{RefundID: "re_step"}, from.Add(3*time.Hour))
	// Reserved long ago, and its Stripe step never ran, or failed for good.
	b.reserve(t, "acme", "1", "stalled", 100, from.Add(4*time.Hour))
	b.reserve(t, "acme", "1", "refused", 100, from.Add(5*time.Hour))
	cl := b.claim(t, stripeKey(t, "acme", "1", "refused"), from.Add(5*time.Hour))
	require.NoError(t, b.claims.Fail(b.ctx, cl, errors.New("amount_too_large")))
	// Still running: a live claim. Not a finding, yet.
	b.reserve(t, "acme", "1", "running", 100, from.Add(6*time.Hour))
	b.claim(t, stripeKey(t, "acme", "1", "running"), from.Add(6*time.Hour))

	rep := b.run(t)
	require.ElementsMatch(t, []string{
		"refund_missing_at_provider " + stripeKey(t, "acme", "1", "ghost"),
		"refund_missing_at_provider " + stripeKey(t, "acme", "1", "step"),
		"refund_missing_at_provider " + stripeKey(t, "acme", "1", "stalled"),
		"refund_missing_at_provider " + stripeKey(t, "acme", "1", "refused"),
	}, kinds(rep))
	require.Equal(t, 1, rep.InFlight)
	detail := func(id string) string {
		return finding(t, rep, reconcile.KindRefundMissingAtProvider, stripeKey(t, "acme", "1", id)).Detail
	}
	require.Contains(t, detail("ghost"), "keyed recorded Stripe refund re_ghost, and Stripe has no refund under this key")
	require.Contains(t, detail("step"), "the refund_stripe step succeeded")
	require.Contains(t, detail("stalled"), "the refund_stripe step is not claimed")
	require.Contains(t, detail("refused"), "the refund_stripe step is failed_terminal")
	require.Empty(t, finding(t, rep, reconcile.KindRefundMissingAtProvider, stripeKey(t, "acme", "1", "ghost")).ProviderRefunds)
	require.Equal(t, 4.0, b.gauge(t, reconcile.KindRefundMissingAtProvider))
}

func TestARecentRefundWithoutAStripeRefundIsInFlight(t *testing.T) {
	t.Parallel()
	b := setup(t)
	now := time.Now()
	b.window = reconcile.Window{From: now.Add(-3 * time.Hour), To: now.Add(time.Hour)}
	b.order(t, "acme", "1", 1999, now.Add(-3*time.Hour))
	b.reserve(t, "acme", "1", "new", 100, now.Add(-time.Minute))
	b.reserve(t, "acme", "1", "stale", 100, now.Add(-2*time.Hour))

	rep := b.run(t)
	require.Equal(t, []string{"refund_missing_at_provider " + stripeKey(t, "acme", "1", "stale")}, kinds(rep))
	require.Equal(t, 1, rep.InFlight, "reserved a minute ago, within the default grace of an hour")
}

func TestNewRefusesANegativeRefundGrace(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := reconcile.New(b.claims, b.pool, b.stripe, &reconcile.Opts{RefundGrace: -time.Second})
	require.ErrorContains(t, err, "refund grace -1s is negative")
}

// release records that keyed released the refund's reservation after
// Stripe refused it, as the refund_release step does.
func (b *bundle) release(t *testing.T, order, refundID string) {
	t.Helper()
	k, err := refunds.NewInput("acme", order, refundID, 1, "").EffectKey(refunds.StepRelease)
	require.NoError(t, err)
	_, err = b.pool.Exec(b.ctx, `INSERT INTO refund_releases (tenant_id, order_id, refund_id, amount_minor, code, effect_key)
SELECT tenant_id, order_id, refund_id, amount_minor, 'charge_disputed', $4 FROM refund_ledger
WHERE tenant_id = $1 AND order_id = $2 AND refund_id = $3`, "acme", order, refundID, k.String())
	require.NoError(t, err)
}

// A released refund with no Stripe refund is what its release says, not a
// refund missing at Stripe; one that Stripe refunded all the same is
// released_but_refunded.
func TestReleasedRefunds(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pi := b.order(t, "acme", "1", 1999, from.Add(time.Hour))
	b.reserve(t, "acme", "1", "refused", 100, from.Add(2*time.Hour))
	cl := b.claim(t, stripeKey(t, "acme", "1", "refused"), from.Add(2*time.Hour))
	require.NoError(t, b.claims.Fail(b.ctx, cl, errors.New("charge_disputed")))
	b.release(t, "1", "refused")
	// Released, and yet refunded at Stripe under its key.
	b.reserve(t, "acme", "1", "both", 200, from.Add(3*time.Hour))
	key := stripeKey(t, "acme", "1", "both")
	re := b.stripeRefund(t, pi, key, key, 200, from.Add(3*time.Hour))
	b.release(t, "1", "both")

	rep := b.run(t)
	require.Equal(t, []string{"released_but_refunded " + key}, kinds(rep))
	f := finding(t, rep, reconcile.KindReleasedButRefunded, key)
	require.Contains(t, f.Detail, "after Stripe refused it (charge_disputed), and Stripe refunded "+re.ID)
	require.Equal(t, "charge_disputed", f.Refund.ReleaseCode)
	require.Equal(t, 1.0, b.gauge(t, reconcile.KindReleasedButRefunded))
}
