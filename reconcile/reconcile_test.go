package reconcile_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"
	"github.com/stripe/stripe-go/v76"
	stripeclient "github.com/stripe/stripe-go/v76/client"

	"github.com/keyedhq/keyed/activities/stripestep"
	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/effects/effectstest"
	"github.com/keyedhq/keyed/internal/dbtest"
	"github.com/keyedhq/keyed/internal/fakestripe"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/reconcile"
)

// from is the start of every test's window; the fake Stripe's clock is set
// relative to it.
var from = time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)

type bundle struct {
	ctx    context.Context
	pool   *pgxpool.Pool
	claims *effects.Client
	fake   *fakestripe.Server
	stripe *stripeclient.API
	reg    *prometheus.Registry
	rec    *reconcile.Reconciler
	window reconcile.Window

	mu  sync.Mutex
	now time.Time
}

func setup(t *testing.T) *bundle {
	t.Helper()
	b := &bundle{ctx: context.Background(), now: from, reg: prometheus.NewRegistry(),
		window: reconcile.Window{From: from, To: from.Add(24 * time.Hour)}}
	// Records are backdated to March (from); the unpartitioned layout needs
	// no leaves made for them.
	b.pool = dbtest.NewPool(t, &effectstest.PoolOpts{Unpartitioned: true})
	quiet := slog.New(slog.DiscardHandler)
	b.claims = effectstest.NewClient(t, b.pool, &effects.ClientOpts{Logger: quiet})
	b.fake = fakestripe.New(&fakestripe.Opts{Now: b.clock})
	srv := httptest.NewServer(b.fake)
	t.Cleanup(srv.Close)
	var err error
	b.stripe, err = stripestep.NewClient("sk_test_reconcile", srv.URL, srv.Client())
	require.NoError(t, err)
	// A small page makes every test page through the search.
	b.rec, err = reconcile.New(b.claims, b.pool, b.stripe, &reconcile.Opts{Registerer: b.reg, Logger: quiet, PageSize: 2})
	require.NoError(t, err)
	return b
}

func (b *bundle) clock() time.Time {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.now
}

func (b *bundle) setClock(at time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.now = at
}

// pi creates a PaymentIntent at the fake at time at, under the
// Idempotency-Key idem and, unless effectKey is empty, with the metadata
// the charge activity sets. It is confirmed with the test payment method
// pm, except that pm "pm_unconfirmed" leaves it requires_confirmation.
func (b *bundle) pi(t *testing.T, idem, effectKey string, amount int64, pm string, at time.Time) *stripe.PaymentIntent {
	t.Helper()
	b.setClock(at)
	params := &stripe.PaymentIntentParams{
		Amount: stripe.Int64(amount), Currency: stripe.String("usd"), PaymentMethod: stripe.String(pm),
		PaymentMethodTypes: stripe.StringSlice([]string{"card"}), Confirm: stripe.Bool(pm != "pm_unconfirmed"),
	}
	if pm == "pm_unconfirmed" {
		params.PaymentMethod = stripe.String("pm_card_visa")
	}
	params.SetIdempotencyKey(idem)
	if effectKey != "" {
		params.AddMetadata("effect_key", effectKey)
		if k, err := effects.ParseKey(effectKey); err == nil {
			params.AddMetadata("tenant_id", k.Tenant())
		}
	}
	pi, err := b.stripe.PaymentIntents.New(params)
	var se *stripe.Error
	if errors.As(err, &se) && se.PaymentIntent != nil {
		return se.PaymentIntent // a decline still creates the intent
	}
	require.NoError(t, err)
	return pi
}

// record stores a succeeded charge record for key carrying res, created at.
func (b *bundle) record(t *testing.T, key string, res any, at time.Time) {
	t.Helper()
	cl := b.claim(t, key, at)
	require.NoError(t, b.claims.Complete(b.ctx, cl, res))
}

// claim claims key and backdates its record to at.
func (b *bundle) claim(t *testing.T, key string, at time.Time) *effects.Claim {
	t.Helper()
	k, err := effects.ParseKey(key)
	require.NoError(t, err)
	_, err = b.claims.Claim(b.ctx, effects.ClaimParams{Key: k, Owner: "test"} /* kind: the last part */)
	require.NoError(t, err)
	_, err = b.pool.Exec(b.ctx, `UPDATE keyed_effects SET created_at = $2 WHERE key = $1`, key, at)
	require.NoError(t, err)
	// The owner's claim again holds the backdated record (a claim names its
	// record by key and created_at).
	cl, err := b.claims.Claim(b.ctx, effects.ClaimParams{Key: k, Owner: "test"})
	require.NoError(t, err)
	return cl
}

// charge does what the charge activity does: claim key, create the
// PaymentIntent under it, store its outcome.
func (b *bundle) charge(t *testing.T, key string, amount int64, at time.Time) *stripe.PaymentIntent {
	t.Helper()
	cl := b.claim(t, key, at)
	pi := b.pi(t, key, key, amount, "pm_card_visa", at)
	require.Equal(t, stripe.PaymentIntentStatusSucceeded, pi.Status)
	require.NoError(t, b.claims.Complete(b.ctx, cl, result(pi)))
	return pi
}

func (b *bundle) run(t *testing.T) *reconcile.Report {
	t.Helper()
	rep, err := b.rec.Run(b.ctx, b.window)
	require.NoError(t, err)
	return rep
}

// gauge returns keyed_reconcile_findings{kind}.
func (b *bundle) gauge(t *testing.T, kind reconcile.Kind) float64 {
	t.Helper()
	families, err := b.reg.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() != "keyed_reconcile_findings" {
			continue
		}
		for _, m := range f.GetMetric() {
			if label(m, "kind") == string(kind) {
				return m.GetGauge().GetValue()
			}
		}
	}
	t.Fatalf("no keyed_reconcile_findings{kind=%q}", kind)
	return 0
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

func result(pi *stripe.PaymentIntent) orders.ChargeResult {
	return orders.ChargeResult{PaymentIntentID: pi.ID, Status: string(pi.Status), AmountMinor: pi.Amount, Currency: string(pi.Currency)}
}

// kinds returns each finding as "kind effect_key".
func kinds(rep *reconcile.Report) []string {
	out := []string{}
	for _, f := range rep.Findings {
		out = append(out, string(f.Kind)+" "+f.EffectKey)
	}
	return out
}

func TestCleanWhenRecordsAndStripeAgree(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.charge(t, "acme:order:1:charge", 1999, from.Add(time.Hour))
	b.charge(t, "acme:order:2:charge", 500, from.Add(2*time.Hour))
	b.charge(t, "globex:order:1:charge", 7000, from.Add(3*time.Hour))
	// A decline: the intent exists, not succeeded, and the record failed.
	cl := b.claim(t, "acme:order:3:charge", from.Add(4*time.Hour))
	declined := b.pi(t, "acme:order:3:charge", "acme:order:3:charge", 100, "pm_card_chargeDeclined", from.Add(4*time.Hour))
	require.Equal(t, stripe.PaymentIntentStatusRequiresPaymentMethod, declined.Status)
	require.NoError(t, b.claims.Fail(b.ctx, cl, errors.New("card_declined")))
	// Not keyed's: no effect_key metadata.
	b.pi(t, "someone-else", "", 4200, "pm_card_visa", from.Add(5*time.Hour))
	// Another kind of effect in the window.
	b.record(t, "acme:order:1:receipt", map[string]string{"message_id": "m1"}, from.Add(time.Hour))

	rep := b.run(t)
	require.True(t, rep.Clean(), "%+v", rep.Findings)
	require.Empty(t, rep.Findings)
	require.Equal(t, 4, rep.Records, "charge records only, failed one included")
	require.Equal(t, 4, rep.PaymentIntents, "keyed's intents only, over several pages of 2")
	require.Zero(t, rep.InFlight)
	require.Equal(t, b.window, rep.Window)
	for _, k := range reconcile.Kinds {
		require.Zero(t, b.gauge(t, k), k)
		require.Zero(t, rep.Counts()[k])
	}

	out, err := json.Marshal(rep)
	require.NoError(t, err)
	require.Contains(t, string(out), `"findings":[]`)
}

func TestMissingRecordIsMoneyKeyedDoesNotKnowAbout(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// Created at Stripe directly, outside keyed: no record at all.
	lost := b.pi(t, "manual-1", "acme:order:lost:charge", 1999, "pm_card_visa", from.Add(time.Hour))
	// The record failed terminally, yet Stripe charged.
	cl := b.claim(t, "acme:order:failed:charge", from.Add(2*time.Hour))
	require.NoError(t, b.claims.Fail(b.ctx, cl, errors.New("timeout")))
	b.pi(t, "acme:order:failed:charge", "acme:order:failed:charge", 300, "pm_card_visa", from.Add(2*time.Hour))
	// The worker died after Stripe answered: the claim expired unfinished.
	b.claim(t, "acme:order:died:charge", from.Add(3*time.Hour))
	_, err := b.pool.Exec(b.ctx, `UPDATE keyed_effects SET lease_until = now() - interval '1 second' WHERE key = 'acme:order:died:charge'`)
	require.NoError(t, err)
	b.pi(t, "acme:order:died:charge", "acme:order:died:charge", 400, "pm_card_visa", from.Add(3*time.Hour))
	// Still running: the claim's lease is live. Not a finding, yet.
	b.claim(t, "acme:order:running:charge", from.Add(4*time.Hour))
	b.pi(t, "acme:order:running:charge", "acme:order:running:charge", 500, "pm_card_visa", from.Add(4*time.Hour))
	// A decline without a record is no money taken.
	b.pi(t, "acme:order:declined:charge", "acme:order:declined:charge", 600, "pm_card_chargeDeclined", from.Add(5*time.Hour))

	rep := b.run(t)
	require.Equal(t, []string{
		"missing_record acme:order:died:charge",
		"missing_record acme:order:failed:charge",
		"missing_record acme:order:lost:charge",
	}, kinds(rep))
	require.Equal(t, 1, rep.InFlight)
	require.Equal(t, effects.StateClaimed, rep.Findings[0].RecordState)
	require.Equal(t, effects.StateFailedTerminal, rep.Findings[1].RecordState)
	require.Contains(t, rep.Findings[1].Detail, "only a record in state failed_terminal")

	f := rep.Findings[2]
	require.Equal(t, "acme", f.TenantID)
	require.Empty(t, f.RecordState)
	require.Nil(t, f.Record)
	require.Equal(t, []orders.ChargeResult{{PaymentIntentID: lost.ID, Status: "succeeded", AmountMinor: 1999, Currency: "usd"}}, f.Provider)
	require.Contains(t, f.Detail, lost.ID)
	require.Contains(t, f.Detail, "keyed has no record")
	require.Equal(t, 3.0, b.gauge(t, reconcile.KindMissingRecord))

	// Outcomes only: no client secret, payment method or description.
	out, err := json.Marshal(rep)
	require.NoError(t, err)
	require.NotContains(t, string(out), "secret")
	require.NotContains(t, string(out), "pm_card")
	require.NotEmpty(t, lost.ClientSecret, "the fake hands out client secrets; none may reach a finding")
}

func TestExtraChargesUnderOneEffectKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	first := b.charge(t, "acme:order:9f3a:charge", 1999, from.Add(time.Hour))
	// Same effect, another idempotency key (a bug, or Stripe having
	// forgotten the key): Stripe charges again.
	second := b.pi(t, "acme:order:9f3a:charge:retry", "acme:order:9f3a:charge", 1999, "pm_card_visa", from.Add(time.Hour+time.Minute))
	b.charge(t, "acme:order:ok:charge", 100, from.Add(2*time.Hour))
	// Charged and recorded two days before the window; charged again in it.
	b.charge(t, "acme:order:old:charge", 300, from.Add(-48*time.Hour))
	again := b.pi(t, "acme:order:old:charge:again", "acme:order:old:charge", 300, "pm_card_visa", from.Add(3*time.Hour))

	rep := b.run(t)
	require.Equal(t, []string{"extra_charges acme:order:9f3a:charge", "extra_charges acme:order:old:charge"}, kinds(rep),
		"the records match the first charges: no mismatch")
	require.Len(t, rep.Findings[1].Provider, 2)
	require.Equal(t, again.ID, rep.Findings[1].Provider[1].PaymentIntentID)
	f := rep.Findings[0]
	require.Equal(t, "acme", f.TenantID)
	require.Equal(t, effects.StateSucceeded, f.RecordState)
	require.Equal(t, first.ID, f.Record.PaymentIntentID)
	require.Len(t, f.Provider, 2)
	require.ElementsMatch(t, []string{first.ID, second.ID}, []string{f.Provider[0].PaymentIntentID, f.Provider[1].PaymentIntentID})
	for _, p := range f.Provider {
		require.Equal(t, "succeeded", p.Status)
		require.EqualValues(t, 1999, p.AmountMinor)
	}
	require.Contains(t, f.Detail, "2 succeeded payment intents")
	require.Equal(t, 2.0, b.gauge(t, reconcile.KindExtraCharges))
	require.Equal(t, 2, b.fake.ChargesForMetadata("effect_key", "acme:order:9f3a:charge"))

	// The gauge is the last run's; the counter adds up.
	b.run(t)
	require.Equal(t, 2.0, b.gauge(t, reconcile.KindExtraCharges))
	families, err := b.reg.Gather()
	require.NoError(t, err)
	var total float64
	for _, fam := range families {
		for _, m := range fam.GetMetric() {
			if fam.GetName() == "keyed_reconcile_findings_total" && label(m, "kind") == "extra_charges" {
				total = m.GetCounter().GetValue()
			}
			if fam.GetName() == "keyed_reconcile_last_success_timestamp_seconds" {
				require.Greater(t, m.GetGauge().GetValue(), 0.0)
			}
		}
	}
	require.Equal(t, 4.0, total)
}

func TestMismatchBetweenRecordAndStripe(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// The record stores another payment intent ID than Stripe's charge.
	real := b.pi(t, "acme:order:id:charge", "acme:order:id:charge", 1999, "pm_card_visa", from.Add(time.Hour))
	b.record(t, "acme:order:id:charge", orders.ChargeResult{PaymentIntentID: "pi_notthisone", Status: "succeeded", AmountMinor: 1999, Currency: "usd"}, from.Add(time.Hour))
	// The record stores the right ID, with another amount.
	amt := b.pi(t, "acme:order:amount:charge", "acme:order:amount:charge", 1999, "pm_card_visa", from.Add(2*time.Hour))
	wrong := result(amt)
	wrong.AmountMinor, wrong.Currency = 1000, "eur"
	b.record(t, "acme:order:amount:charge", wrong, from.Add(2*time.Hour))
	// The record stores another key's payment intent.
	other := b.charge(t, "acme:order:other:charge", 700, from.Add(3*time.Hour))
	b.record(t, "acme:order:borrowed:charge", result(other), from.Add(3*time.Hour))
	// The stored outcome has no payment intent at all.
	b.record(t, "acme:order:empty:charge", map[string]string{"status": "succeeded"}, from.Add(4*time.Hour))

	rep := b.run(t)
	require.Equal(t, []string{
		"mismatch acme:order:amount:charge",
		"mismatch acme:order:borrowed:charge",
		"mismatch acme:order:empty:charge",
		"mismatch acme:order:id:charge",
	}, kinds(rep))
	byKey := map[string]reconcile.Finding{}
	for _, f := range rep.Findings {
		byKey[f.EffectKey] = f
	}
	f := byKey["acme:order:id:charge"]
	require.Equal(t, "pi_notthisone", f.Record.PaymentIntentID)
	require.Equal(t, []orders.ChargeResult{result(real)}, f.Provider)
	require.Contains(t, f.Detail, "the record stores payment intent pi_notthisone, but Stripe's succeeded charge under this key is "+real.ID)

	f = byKey["acme:order:amount:charge"]
	require.Contains(t, f.Detail, "amount 1000 eur stored, 1999 usd at Stripe")
	require.Equal(t, amt.ID, f.Record.PaymentIntentID)

	f = byKey["acme:order:borrowed:charge"]
	require.Contains(t, f.Detail, `carries effect key "acme:order:other:charge" at Stripe`)
	require.Equal(t, []orders.ChargeResult{result(other)}, f.Provider)

	require.Contains(t, byKey["acme:order:empty:charge"].Detail, "stores no readable payment intent ID")
	require.Equal(t, 4.0, b.gauge(t, reconcile.KindMismatch))
}

func TestMissingAtProviderIsAPaymentStripeNeverTook(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.record(t, "acme:order:ghost:charge", orders.ChargeResult{PaymentIntentID: "pi_ghost", Status: "succeeded", AmountMinor: 1999, Currency: "usd"}, from.Add(time.Hour))
	// Stripe has the intent under the key, but it never succeeded.
	pending := b.pi(t, "acme:order:pending:charge", "acme:order:pending:charge", 500, "pm_unconfirmed", from.Add(2*time.Hour))
	require.Equal(t, stripe.PaymentIntentStatusRequiresConfirmation, pending.Status)
	b.record(t, "acme:order:pending:charge", orders.ChargeResult{PaymentIntentID: pending.ID, Status: "succeeded", AmountMinor: 500, Currency: "usd"}, from.Add(2*time.Hour))
	b.charge(t, "acme:order:fine:charge", 100, from.Add(3*time.Hour))

	rep := b.run(t)
	require.Equal(t, []string{
		"missing_at_provider acme:order:ghost:charge",
		"missing_at_provider acme:order:pending:charge",
	}, kinds(rep))
	ghost := rep.Findings[0]
	require.Equal(t, "acme", ghost.TenantID)
	require.Equal(t, "pi_ghost", ghost.Record.PaymentIntentID)
	require.Empty(t, ghost.Provider)
	require.Contains(t, ghost.Detail, "pi_ghost does not exist at Stripe")
	require.Contains(t, rep.Findings[1].Detail, "is requires_confirmation at Stripe, not succeeded")
	require.Equal(t, 2.0, b.gauge(t, reconcile.KindMissingAtProvider))
}

func TestWindowBoundariesAreRespected(t *testing.T) {
	t.Parallel()
	b := setup(t)
	to := b.window.To
	// Unrecorded charges: only those created in [from, to) are reported.
	b.pi(t, "x1", "acme:order:before:charge", 100, "pm_card_visa", from.Add(-time.Second))
	b.pi(t, "x2", "acme:order:first:charge", 100, "pm_card_visa", from)
	b.pi(t, "x3", "acme:order:last:charge", 100, "pm_card_visa", to.Add(-time.Second))
	b.pi(t, "x4", "acme:order:end:charge", 100, "pm_card_visa", to)
	// Records of charges Stripe never had: likewise.
	ghost := func(key string, at time.Time) {
		b.record(t, key, orders.ChargeResult{PaymentIntentID: "pi_" + strings.Split(key, ":")[2], Status: "succeeded", AmountMinor: 1, Currency: "usd"}, at)
	}
	ghost("acme:order:ghostbefore:charge", from.Add(-time.Microsecond))
	ghost("acme:order:ghostfirst:charge", from)
	ghost("acme:order:ghostend:charge", to)
	// Straddling the boundary, and fine: a record at the end of the window
	// whose charge Stripe created after it, and a charge at the start whose
	// record was claimed before it.
	cl := b.claim(t, "acme:order:late:charge", to.Add(-time.Second))
	require.NoError(t, b.claims.Complete(b.ctx, cl, result(b.pi(t, "acme:order:late:charge", "acme:order:late:charge", 100, "pm_card_visa", to.Add(time.Second)))))
	b.charge(t, "acme:order:early:charge", 100, from.Add(-time.Hour))
	_, err := b.pool.Exec(b.ctx, `UPDATE keyed_effects SET created_at = $1 WHERE key = 'acme:order:early:charge'`, from.Add(-time.Hour))
	require.NoError(t, err)
	b.pi(t, "acme:order:early:charge:2", "acme:order:early:charge", 100, "pm_card_chargeDeclined", from.Add(time.Second)) // declined retry in the window

	rep := b.run(t)
	require.Equal(t, []string{
		"missing_record acme:order:first:charge",
		"missing_at_provider acme:order:ghostfirst:charge",
		"missing_record acme:order:last:charge",
	}, kinds(rep))

	// Stripe's created is whole seconds: a window starting half a second
	// after from leaves out what was created at from, on both sides.
	rep, err = b.rec.Run(b.ctx, reconcile.Window{From: from.Add(500 * time.Millisecond), To: from.Add(2 * time.Second)})
	require.NoError(t, err)
	require.Empty(t, kinds(rep))
	require.Equal(t, 1, rep.PaymentIntents, "only the declined retry at from+1s")
	require.Zero(t, rep.Records)
}

func TestNewAndRunRefuseBadInput(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := reconcile.New(nil, b.pool, b.stripe, nil)
	require.ErrorContains(t, err, "effects client is nil")
	_, err = reconcile.New(b.claims, nil, b.stripe, nil)
	require.ErrorContains(t, err, "db is nil")
	_, err = reconcile.New(b.claims, b.pool, nil, nil)
	require.ErrorContains(t, err, "Stripe client is nil")
	_, err = reconcile.New(b.claims, b.pool, b.stripe, &reconcile.Opts{PageSize: 101})
	require.ErrorContains(t, err, "page size 101")
	_, err = reconcile.New(b.claims, b.pool, b.stripe, &reconcile.Opts{Registerer: b.reg})
	require.ErrorContains(t, err, "register reconcile metrics")
	r, err := reconcile.New(b.claims, b.pool, b.stripe, nil)
	require.NoError(t, err)

	for _, w := range []reconcile.Window{{}, {From: from}, {From: from, To: from}, {From: from, To: from.Add(-time.Hour)}} {
		_, err := r.Run(b.ctx, w)
		require.ErrorIs(t, err, reconcile.ErrInvalidWindow, "%+v", w)
	}
}

func TestRunFailsWhenStripeRefuses(t *testing.T) {
	t.Parallel()
	b := setup(t)
	srv := httptest.NewServer(fakestripe.New(&fakestripe.Opts{APIKey: "sk_test_other"}))
	t.Cleanup(srv.Close)
	sc, err := stripestep.NewClient("sk_test_wrong", srv.URL, srv.Client())
	require.NoError(t, err)
	r, err := reconcile.New(b.claims, b.pool, sc, nil)
	require.NoError(t, err)
	_, err = r.Run(b.ctx, b.window)
	require.ErrorContains(t, err, "reconcile: search Stripe payment intents")
	var se *stripe.Error
	require.ErrorAs(t, err, &se)
	require.Equal(t, 401, se.HTTPStatusCode)
}
