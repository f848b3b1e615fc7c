package refund_test

import (
	"context"
	"io"
	"log/slog"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	stripeclient "github.com/stripe/stripe-go/v76/client"
	"go.temporal.io/sdk/log"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"

	ordersteps "github.com/keyedhq/keyed/activities/order"
	refundsteps "github.com/keyedhq/keyed/activities/refund"
	"github.com/keyedhq/keyed/activities/stripestep"
	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/effects/effectstest"
	"github.com/keyedhq/keyed/internal/dbtest"
	"github.com/keyedhq/keyed/internal/fakesendgrid"
	"github.com/keyedhq/keyed/internal/fakestripe"
	"github.com/keyedhq/keyed/notify"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/pipeline"
	"github.com/keyedhq/keyed/refunds"
	"github.com/keyedhq/keyed/step"
	"github.com/keyedhq/keyed/workflows"
)

const (
	tenant = "acme"
	amount = 1250
)

// tables are every table a refund step may write.
var tables = []string{"keyed_effects", "orders", "order_transitions", "keyed_sends", "refund_ledger", "refund_stripe_outcomes", "refund_releases"}

type bundle struct {
	pool     *pgxpool.Pool
	claims   *effects.Client
	store    *orders.Store
	ledger   *refunds.Ledger
	stripe   *fakestripe.Server
	sendgrid *fakesendgrid.Server
	api      *stripeclient.API
	deps     pipeline.Deps
	env      *testsuite.TestActivityEnvironment
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// setup gives a test its own schema, fakes, and an activity environment
// with the order activities (to charge and pay orders) and the refund ones.
func setup(t *testing.T) *bundle {
	t.Helper()
	b := &bundle{pool: dbtest.NewPool(t)}
	b.claims = effectstest.NewClient(t, b.pool, &effects.ClientOpts{Logger: quiet()})
	var err error
	b.store, err = orders.NewStore(b.pool)
	require.NoError(t, err)
	b.ledger, err = refunds.NewLedger(b.pool)
	require.NoError(t, err)
	b.stripe, b.sendgrid = fakestripe.New(nil), fakesendgrid.New(nil)
	sts, gts := httptest.NewServer(b.stripe), httptest.NewServer(b.sendgrid)
	t.Cleanup(sts.Close)
	t.Cleanup(gts.Close)
	sc, err := stripestep.NewClient("sk_test_refunds", sts.URL, sts.Client())
	require.NoError(t, err)
	b.api = sc
	sender, err := notify.NewSender(b.claims, b.pool, &notify.SenderOpts{APIKey: "SG.test", From: "shop@example.com", BaseURL: gts.URL, Logger: quiet()})
	require.NoError(t, err)
	b.deps = pipeline.Deps{DB: b.pool, Effects: b.claims, Logger: quiet(), Providers: []any{sc, sender}}
	b.env = newEnv(t, b.deps)
	return b
}

// newEnv returns an activity environment with every pipeline's steps
// bound to d.
func newEnv(t *testing.T, d pipeline.Deps) *testsuite.TestActivityEnvironment {
	t.Helper()
	defs, err := pipeline.Definitions(workflows.Pipelines(), d)
	require.NoError(t, err)
	var suite testsuite.WorkflowTestSuite
	suite.SetLogger(log.NewStructuredLogger(quiet()))
	env := suite.NewTestActivityEnvironment()
	require.NoError(t, step.Register(env, defs...))
	return env
}

// order creates an order; with pm "" it stays pending, otherwise it is
// charged with pm and, when the charge succeeds, marked paid.
func (b *bundle) order(t *testing.T, id, pm string) {
	t.Helper()
	method := pm
	if method == "" {
		method = "pm_card_visa"
	}
	_, _, err := b.store.Create(context.Background(), orders.NewOrder{TenantID: tenant, ID: id, AmountMinor: amount,
		Currency: "eur", CustomerEmail: "ada@example.com", PaymentMethod: method})
	require.NoError(t, err)
	if pm == "" {
		return
	}
	in := orders.NewOrderInput(tenant, id)
	if _, err := b.env.ExecuteActivity(ordersteps.NameCharge, in); err != nil {
		_, merr := b.env.ExecuteActivity(ordersteps.NameMarkFailed, in)
		require.NoError(t, merr)
		return
	}
	_, err = b.env.ExecuteActivity(ordersteps.NameMarkPaid, in)
	require.NoError(t, err)
}

func exec[T any](t *testing.T, env *testsuite.TestActivityEnvironment, name string, in refunds.RefundInput) (T, error) {
	t.Helper()
	var out T
	val, err := env.ExecuteActivity(name, in)
	if err == nil {
		require.NoError(t, val.Get(&out))
	}
	return out, err
}

// refund runs the four steps of in in order and returns the first error.
func (b *bundle) refund(t *testing.T, in refunds.RefundInput) error {
	t.Helper()
	for _, name := range []string{refundsteps.NameReserve, refundsteps.NameRefundAtStripe, refundsteps.NameMarkRefunded, refundsteps.NameSendRefundEmail} {
		if _, err := b.env.ExecuteActivity(name, in); err != nil {
			return err
		}
	}
	return nil
}

func (b *bundle) status(t *testing.T, id string) orders.Status {
	t.Helper()
	o, err := b.store.Get(context.Background(), tenant, id)
	require.NoError(t, err)
	return o.Status
}

func (b *bundle) ledgerRows(t *testing.T, id string) int {
	t.Helper()
	rows, err := b.ledger.List(context.Background(), tenant, id)
	require.NoError(t, err)
	return len(rows)
}

func requireTerminal(t *testing.T, err error, errType string) {
	t.Helper()
	var app *temporal.ApplicationError
	require.ErrorAs(t, err, &app)
	require.Equal(t, errType, app.Type(), "error: %v", err)
	require.True(t, app.NonRetryable(), "error: %v", err)
}

func TestFullRefundMarksTheOrderRefunded(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.order(t, "o1", "pm_card_visa")
	require.NoError(t, b.refund(t, refunds.NewInput(tenant, "o1", "r1", amount, "requested_by_customer")))
	require.Equal(t, orders.StatusRefunded, b.status(t, "o1"))
	require.Equal(t, 1, b.stripe.Refunds())
	require.Equal(t, 1, b.sendgrid.Count())
	out, found, err := b.ledger.StripeOutcome(context.Background(), tenant, "o1", "r1")
	require.NoError(t, err)
	require.True(t, found)
	require.Equal(t, int64(amount), out.AmountMinor)
	require.Equal(t, "succeeded", out.Status)
}

func TestPartialRefundsMarkTheOrderPartiallyThenFullyRefunded(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.order(t, "o1", "pm_card_visa")
	require.NoError(t, b.refund(t, refunds.NewInput(tenant, "o1", "r1", 500, "")))
	require.Equal(t, orders.StatusPartiallyRefunded, b.status(t, "o1"))
	require.NoError(t, b.refund(t, refunds.NewInput(tenant, "o1", "r2", 250, "")))
	require.Equal(t, orders.StatusPartiallyRefunded, b.status(t, "o1"))
	require.NoError(t, b.refund(t, refunds.NewInput(tenant, "o1", "r3", 500, "")))
	require.Equal(t, orders.StatusRefunded, b.status(t, "o1"))
	require.Equal(t, 3, b.stripe.Refunds())
	require.Equal(t, 3, b.sendgrid.Count(), "one email per refund, none collapsed")

	_, err := exec[refunds.ReserveResult](t, b.env, refundsteps.NameReserve, refunds.NewInput(tenant, "o1", "r4", 1, ""))
	requireTerminal(t, err, step.ErrTypeInvalidState)
	require.Contains(t, err.Error(), "0.00 EUR left")
}

func TestReserveRefusesWhatExceedsTheCharge(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.order(t, "o1", "pm_card_visa")
	_, err := exec[refunds.ReserveResult](t, b.env, refundsteps.NameReserve, refunds.NewInput(tenant, "o1", "r1", amount+1, ""))
	requireTerminal(t, err, step.ErrTypeInvalidState)
	require.Contains(t, err.Error(), "refund of 12.51 EUR exceeds what is left of the charge: 12.50 EUR charged, 0.00 EUR refunded or in flight, 12.50 EUR left")
	require.Zero(t, b.ledgerRows(t, "o1"))
	require.Zero(t, b.stripe.Refunds())
	// The refusal is kept, so GET and show see it, and a repeat gets it
	// back without summing the ledger again.
	rec, err := b.claims.Get(context.Background(), effects.MustKey(tenant, "order", "o1", "refund", "r1", refunds.StepReserve))
	require.NoError(t, err)
	require.Equal(t, effects.StateFailedTerminal, rec.State)
	require.Equal(t, "invalid_state", rec.ErrorCode)
	_, err = exec[refunds.ReserveResult](t, b.env, refundsteps.NameReserve, refunds.NewInput(tenant, "o1", "r1", amount+1, ""))
	requireTerminal(t, err, step.ErrTypeInvalidState)
	require.Zero(t, b.ledgerRows(t, "o1"))
}

// A run started without RequestTx (its cap) meets the cap at Reserve: an
// order whose ledger holds MaxPerOrder refunds takes no new one, and a
// repeat of one of them still gets its reservation back.
func TestReserveRefusesARefundPastTheMostAnOrderMayHave(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.order(t, "o1", "pm_card_visa")
	_, err := b.pool.Exec(context.Background(), `INSERT INTO refund_ledger (tenant_id, order_id, refund_id, amount_minor, effect_key)
SELECT $1, 'o1', 'l' || i, 1, $1 || ':order:o1:refund:l' || i || ':refund_reserve' FROM generate_series(1, $2) i`, tenant, refunds.MaxPerOrder)
	require.NoError(t, err)
	_, err = exec[refunds.ReserveResult](t, b.env, refundsteps.NameReserve, refunds.NewInput(tenant, "o1", "one-more", 1, ""))
	requireTerminal(t, err, step.ErrTypeInvalidState)
	require.Contains(t, err.Error(), "the most one order may have")
	require.Equal(t, refunds.MaxPerOrder, b.ledgerRows(t, "o1"))
	_, err = exec[refunds.ReserveResult](t, b.env, refundsteps.NameReserve, refunds.NewInput(tenant, "o1", "l1", 1, ""))
	require.NoError(t, err, "a refund in the ledger reserves again")
}

func TestReserveRefusesUnpaidAndDeclinedOrders(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.order(t, "pending", "")
	b.order(t, "declined", "pm_card_chargeDeclined")
	require.Equal(t, orders.StatusFailed, b.status(t, "declined"))
	for _, id := range []string{"pending", "declined"} {
		err := b.refund(t, refunds.NewInput(tenant, id, "r1", 100, ""))
		requireTerminal(t, err, step.ErrTypeInvalidState)
		require.Contains(t, err.Error(), "not paid: nothing to refund")
		require.Zero(t, b.ledgerRows(t, id))
	}
	require.Zero(t, b.stripe.Refunds())
	require.Zero(t, b.sendgrid.Count())
}

// Two concurrent partial refunds whose sum exceeds the charge: exactly one
// is reserved, the other refused.
func TestConcurrentPartialRefundsReserveOnlyWhatTheChargeCovers(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.order(t, "o1", "pm_card_visa")
	envs := []*testsuite.TestActivityEnvironment{b.env, b.secondEnv(t)}
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Go(func() {
			_, errs[i] = exec[refunds.ReserveResult](t, envs[i], refundsteps.NameReserve, refunds.NewInput(tenant, "o1", "r"+string(rune('1'+i)), 700, ""))
		})
	}
	wg.Wait()
	ok := 0
	for _, err := range errs {
		if err == nil {
			ok++
			continue
		}
		requireTerminal(t, err, step.ErrTypeInvalidState)
		require.Contains(t, err.Error(), "exceeds what is left")
	}
	require.Equal(t, 1, ok, "errors: %v", errs)
	require.Equal(t, 1, b.ledgerRows(t, "o1"))
}

// Many racers straight at the ledger: the sum never exceeds the charge.
func TestLedgerReserveTxNeverExceedsTheCharge(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.order(t, "o1", "pm_card_visa")
	ctx := context.Background()
	var wg sync.WaitGroup
	var mu sync.Mutex
	reserved := 0
	for i := range 10 {
		wg.Go(func() {
			id := "r" + string(rune('a'+i))
			e := refunds.Entry{TenantID: tenant, OrderID: "o1", RefundID: id, AmountMinor: 300, EffectKey: "k:" + id}
			err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
				_, err := b.ledger.ReserveTx(ctx, tx, e, amount)
				return err
			})
			if err == nil {
				mu.Lock()
				reserved++
				mu.Unlock()
				return
			}
			require.ErrorIs(t, err, refunds.ErrExceedsCharge)
		})
	}
	wg.Wait()
	require.Equal(t, 4, reserved, "4 × 300 fit in 1250, a fifth does not")
	require.Equal(t, 4, b.ledgerRows(t, "o1"))
}

func TestLedgerIsAppendOnly(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.order(t, "o1", "pm_card_visa")
	_, err := exec[refunds.ReserveResult](t, b.env, refundsteps.NameReserve, refunds.NewInput(tenant, "o1", "r1", 100, ""))
	require.NoError(t, err)
	_, err = b.pool.Exec(context.Background(), `UPDATE refund_ledger SET amount_minor = 1`)
	require.ErrorContains(t, err, "append-only")
	_, err = b.pool.Exec(context.Background(), `DELETE FROM refund_ledger`)
	require.ErrorContains(t, err, "append-only")
}

func TestReserveRefusesTheSameRefundWithAnotherAmount(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.order(t, "o1", "pm_card_visa")
	_, err := exec[refunds.ReserveResult](t, b.env, refundsteps.NameReserve, refunds.NewInput(tenant, "o1", "r1", 100, ""))
	require.NoError(t, err)
	_, err = exec[refunds.ReserveResult](t, b.env, refundsteps.NameReserve, refunds.NewInput(tenant, "o1", "r1", 200, ""))
	requireTerminal(t, err, step.ErrTypeKeyReused)
	require.Equal(t, 1, b.ledgerRows(t, "o1"))
}

func (b *bundle) secondEnv(t *testing.T) *testsuite.TestActivityEnvironment {
	t.Helper()
	sc, err := stripestep.NewClient("sk_test_refunds", "http://127.0.0.1:1", nil)
	require.NoError(t, err)
	sender, err := notify.NewSender(b.claims, b.pool, &notify.SenderOpts{APIKey: "SG.test", From: "shop@example.com", BaseURL: "http://127.0.0.1:1", Logger: quiet()})
	require.NoError(t, err)
	return newEnv(t, pipeline.Deps{DB: b.pool, Effects: b.claims, Logger: quiet(), Providers: []any{sc, sender}})
}

// A refund may run while the order's run still has its receipt to send:
// the receipt goes out for a refunded order too.
func TestReceiptAfterARefundIsStillSent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.order(t, "o1", "pm_card_visa")
	require.NoError(t, b.refund(t, refunds.NewInput(tenant, "o1", "r1", amount, "")))
	_, err := b.env.ExecuteActivity(ordersteps.NameSendReceipt, orders.NewOrderInput(tenant, "o1"))
	require.NoError(t, err)
	require.Equal(t, 2, b.sendgrid.Count(), "the refund email and the receipt")
}

// Two refunds marked out of order: the later one, which completes the
// ledger, marks the order refunded; the earlier one's mark then keeps it
// refunded. The status only grows.
func TestMarkRefundedOutOfOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.order(t, "o1", "pm_card_visa")
	r1, r2 := refunds.NewInput(tenant, "o1", "r1", 500, ""), refunds.NewInput(tenant, "o1", "r2", amount-500, "")
	for _, in := range []refunds.RefundInput{r1, r2} {
		for _, name := range []string{refundsteps.NameReserve, refundsteps.NameRefundAtStripe} {
			_, err := b.env.ExecuteActivity(name, in)
			require.NoError(t, err)
		}
	}
	res, err := exec[refunds.MarkResult](t, b.env, refundsteps.NameMarkRefunded, r2)
	require.NoError(t, err)
	require.Equal(t, string(orders.StatusRefunded), res.Status)
	res, err = exec[refunds.MarkResult](t, b.env, refundsteps.NameMarkRefunded, r1)
	require.NoError(t, err)
	require.Equal(t, string(orders.StatusRefunded), res.Status)
	require.Equal(t, orders.StatusRefunded, b.status(t, "o1"))
	b.secondRun(t, refundsteps.NameMarkRefunded, r1)
}

// MarkRefunded refuses a refund that has not reached Stripe.
func TestMarkRefundedNeedsTheStripeRefund(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.order(t, "o1", "pm_card_visa")
	in := refunds.NewInput(tenant, "o1", "r1", 500, "")
	_, err := exec[refunds.ReserveResult](t, b.env, refundsteps.NameReserve, in)
	require.NoError(t, err)
	_, err = exec[refunds.MarkResult](t, b.env, refundsteps.NameMarkRefunded, in)
	requireTerminal(t, err, step.ErrTypeInvalidState)
	require.Contains(t, err.Error(), "no Stripe refund recorded")
	require.Equal(t, orders.StatusPaid, b.status(t, "o1"))
}

// Refunds often come after the effects retention: with the charge's record
// pruned, the PaymentIntent is found at Stripe by its effect key.
func TestRefundAfterTheChargeRecordWasPruned(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.order(t, "o1", "pm_card_visa")
	chargeKey, err := orders.NewOrderInput(tenant, "o1").EffectKey(orders.StepCharge)
	require.NoError(t, err)
	rec, err := b.claims.Get(context.Background(), chargeKey)
	require.NoError(t, err)
	_, err = b.pool.Exec(context.Background(), `DELETE FROM keyed_effects WHERE key = $1`, chargeKey.String())
	require.NoError(t, err)

	require.NoError(t, b.refund(t, refunds.NewInput(tenant, "o1", "r1", 300, "")))
	out, found, err := b.ledger.StripeOutcome(context.Background(), tenant, "o1", "r1")
	require.NoError(t, err)
	require.True(t, found)
	require.Contains(t, string(rec.Result), out.PaymentIntentID)
	require.Equal(t, orders.StatusPartiallyRefunded, b.status(t, "o1"))
}

// With no charge anywhere, the refund at Stripe is refused before any call.
func TestRefundAtStripeWithoutACharge(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.order(t, "o1", "pm_card_visa")
	in := refunds.NewInput(tenant, "o1", "r1", 300, "")
	_, err := exec[refunds.ReserveResult](t, b.env, refundsteps.NameReserve, in)
	require.NoError(t, err)
	chargeKey, err := orders.NewOrderInput(tenant, "o1").EffectKey(orders.StepCharge)
	require.NoError(t, err)
	_, err = b.pool.Exec(context.Background(), `DELETE FROM keyed_effects WHERE key = $1`, chargeKey.String())
	require.NoError(t, err)
	b.stripe.Reset() // Stripe forgets the payment intent too.

	_, err = exec[refunds.StripeResult](t, b.env, refundsteps.NameRefundAtStripe, in)
	requireTerminal(t, err, step.ErrTypeInvalidState)
	require.Contains(t, err.Error(), "and none at Stripe")
	require.Zero(t, b.stripe.Refunds())
}
