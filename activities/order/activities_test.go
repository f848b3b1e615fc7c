package order_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"github.com/stripe/stripe-go/v76"
	stripeclient "github.com/stripe/stripe-go/v76/client"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/log"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"

	ordersteps "github.com/keyedhq/keyed/activities/order"
	"github.com/keyedhq/keyed/activities/stripestep"
	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/effects/effectstest"
	"github.com/keyedhq/keyed/internal/dbtest"
	"github.com/keyedhq/keyed/internal/fakesendgrid"
	"github.com/keyedhq/keyed/internal/fakestripe"
	"github.com/keyedhq/keyed/notify"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/pipeline"
	"github.com/keyedhq/keyed/step"
)

const (
	stripeKey = "sk_test_keyed_123456789"
	email     = "ada@example.com"
	// testWorkflowID is the workflow ID the Temporal test activity
	// environment puts in every activity's info.
	testWorkflowID = "default-test-workflow-id"
)

var tables = []string{"keyed_effects", "orders", "order_transitions", "keyed_sends"}

type bundle struct {
	pool      *pgxpool.Pool
	claims    *effects.Client
	store     *orders.Store
	stripe    *fakestripe.Server
	stripeAPI *stripeclient.API
	sendgrid  *fakesendgrid.Server
	acts      *ordersteps.Activities
	env       *testsuite.TestActivityEnvironment
	clock     *clock
}

type setupOpts struct {
	// maxConns caps the pool; zero means effectstest's default.
	maxConns int32
	// pool, when set, is used instead of a fresh one (maxConns is ignored).
	pool    *pgxpool.Pool
	stripe  *fakestripe.Opts
	sender  *notify.SenderOpts
	effects *effects.ClientOpts
}

func setup(t *testing.T) *bundle { return setupWith(t, setupOpts{}) }

func setupWith(t *testing.T, o setupOpts) *bundle {
	t.Helper()
	b := &bundle{pool: o.pool, clock: &clock{}}
	if b.pool == nil {
		b.pool = dbtest.NewPool(t, &effectstest.PoolOpts{MaxConns: o.maxConns})
	}
	quiet := slog.New(slog.DiscardHandler)
	if o.effects == nil {
		o.effects = &effects.ClientOpts{}
	}
	o.effects.Logger = quiet
	b.claims = effectstest.NewClient(t, b.pool, o.effects)
	var err error
	b.store, err = orders.NewStore(b.pool)
	require.NoError(t, err)

	so := o.stripe
	if so == nil {
		so = &fakestripe.Opts{}
	}
	so.Now = b.clock.Now
	b.stripe = fakestripe.New(so)
	sts := httptest.NewServer(b.stripe)
	t.Cleanup(sts.Close)
	b.stripeAPI, err = stripestep.NewClient(stripeKey, sts.URL, sts.Client())
	require.NoError(t, err)

	b.sendgrid = fakesendgrid.New(nil)
	gts := httptest.NewServer(b.sendgrid)
	t.Cleanup(gts.Close)
	sendOpts := o.sender
	if sendOpts == nil {
		sendOpts = &notify.SenderOpts{}
	}
	sendOpts.APIKey, sendOpts.From, sendOpts.BaseURL, sendOpts.Logger = "SG.test", "receipts@example.com", gts.URL, quiet
	sender, err := notify.NewSender(b.claims, b.pool, sendOpts)
	require.NoError(t, err)

	b.acts, err = ordersteps.New(pipeline.Deps{DB: b.pool, Effects: b.claims, Logger: quiet, Providers: []any{b.stripeAPI, sender}})
	require.NoError(t, err)
	var suite testsuite.WorkflowTestSuite
	suite.SetLogger(log.NewStructuredLogger(quiet))
	b.env = suite.NewTestActivityEnvironment()
	require.NoError(t, step.Register(b.env, append(b.acts.Definitions(), ordersteps.DemoDefinitions(b.acts)...)...))
	return b
}

// secondRun runs the activity name twice on in through
// effectstest.SecondRun: the second run must change no table.
func (b *bundle) secondRun(t *testing.T, name string, in orders.OrderInput) {
	t.Helper()
	effectstest.SecondRun(t, b.pool, tables, func(context.Context) error {
		_, err := b.env.ExecuteActivity(name, in)
		return err
	})
}

// paidOrder creates an order, charges it and marks it paid, and returns its
// checkout input.
func (b *bundle) paidOrder(t *testing.T, id string) orders.OrderInput {
	t.Helper()
	in := b.order(t, id, "pm_card_visa")
	_, err := b.charge(t, in)
	require.NoError(t, err)
	_, err = b.markPaid(t, in)
	require.NoError(t, err)
	return in
}

// order creates an order and returns its checkout input.
func (b *bundle) order(t *testing.T, id, paymentMethod string) orders.OrderInput {
	t.Helper()
	_, _, err := b.store.Create(context.Background(), orders.NewOrder{TenantID: "acme", ID: id, AmountMinor: 1250,
		Currency: "eur", CustomerEmail: email, PaymentMethod: paymentMethod})
	require.NoError(t, err)
	return orders.NewOrderInput("acme", id)
}

// execute runs activity name on in and decodes its result.
func execute[T any](t *testing.T, b *bundle, name string, in orders.OrderInput) (T, error) {
	t.Helper()
	var res T
	val, err := b.env.ExecuteActivity(name, in)
	if err == nil {
		require.NoError(t, val.Get(&res))
	}
	return res, err
}

func (b *bundle) charge(t *testing.T, in orders.OrderInput) (orders.ChargeResult, error) {
	t.Helper()
	return execute[orders.ChargeResult](t, b, ordersteps.NameCharge, in)
}

func (b *bundle) markPaid(t *testing.T, in orders.OrderInput) (orders.MarkPaidResult, error) {
	t.Helper()
	return execute[orders.MarkPaidResult](t, b, ordersteps.NameMarkPaid, in)
}

func (b *bundle) markFailed(t *testing.T, in orders.OrderInput) (orders.MarkFailedResult, error) {
	t.Helper()
	return execute[orders.MarkFailedResult](t, b, ordersteps.NameMarkFailed, in)
}

func (b *bundle) receipt(t *testing.T, in orders.OrderInput) (orders.ReceiptResult, error) {
	t.Helper()
	return execute[orders.ReceiptResult](t, b, ordersteps.NameSendReceipt, in)
}

func key(t *testing.T, in orders.OrderInput, step string) string {
	t.Helper()
	k, err := in.EffectKey(step)
	require.NoError(t, err)
	return k.String()
}

// appError returns err's *temporal.ApplicationError.
func appError(t *testing.T, err error) *temporal.ApplicationError {
	t.Helper()
	var app *temporal.ApplicationError
	require.ErrorAs(t, err, &app)
	return app
}

func requireTerminal(t *testing.T, err error, errType string) *temporal.ApplicationError {
	t.Helper()
	app := appError(t, err)
	require.Equal(t, errType, app.Type(), "error: %v", err)
	require.True(t, app.NonRetryable(), "error: %v", err)
	return app
}

func requireRetryable(t *testing.T, err error, errType string) {
	t.Helper()
	app := appError(t, err)
	require.Equal(t, errType, app.Type(), "error: %v", err)
	require.False(t, app.NonRetryable(), "error: %v", err)
}

// clock is the fake Stripe's clock, which a test can move forward.
type clock struct{ offset atomic.Int64 }

func (c *clock) Now() time.Time          { return time.Now().Add(time.Duration(c.offset.Load())) }
func (c *clock) Advance(d time.Duration) { c.offset.Add(int64(d)) }

func TestChargeTwiceChargesOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	in := b.order(t, "9f3a", "pm_card_visa")

	var results []orders.ChargeResult
	effectstest.SecondRun(t, b.pool, tables, func(context.Context) error {
		res, err := b.charge(t, in)
		results = append(results, res)
		return err
	})
	require.Equal(t, results[0], results[1])
	require.True(t, strings.HasPrefix(results[0].PaymentIntentID, "pi_"))
	require.Equal(t, orders.ChargeResult{PaymentIntentID: results[0].PaymentIntentID, Status: "succeeded", AmountMinor: 1250, Currency: "eur"}, results[0])

	k := key(t, in, orders.StepCharge)
	require.Equal(t, 1, b.stripe.Charges())
	require.Equal(t, 1, b.stripe.ChargesForKey(k), "the effect key is the idempotency key")
	require.Equal(t, 1, b.stripe.ChargesForMetadata("effect_key", k))
	require.Equal(t, 1, b.stripe.ChargesForMetadata("order_id", "9f3a"))
	require.Equal(t, 1, b.stripe.ChargesForMetadata("tenant_id", "acme"))
	require.Equal(t, 1, b.stripe.Requests(), "the second run never reached Stripe")

	rec, err := b.claims.Get(context.Background(), effects.MustKey("acme", "order", "9f3a", "charge"))
	require.NoError(t, err)
	require.Equal(t, effects.StateSucceeded, rec.State)
	require.Equal(t, testWorkflowID+"/charge", rec.Owner)
	require.Equal(t, step.Fingerprint("1250", "eur", "pm_card_visa"), rec.Fingerprint)
}

func TestMarkPaidTwiceWritesOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	in := b.order(t, "9f3a", "pm_card_visa")
	_, err := b.charge(t, in)
	require.NoError(t, err)

	effectstest.SecondRun(t, b.pool, tables, func(context.Context) error {
		res, err := b.markPaid(t, in)
		if err == nil {
			require.Equal(t, orders.MarkPaidResult{Status: "paid"}, res)
		}
		return err
	})
	o, err := b.store.Get(context.Background(), "acme", "9f3a")
	require.NoError(t, err)
	require.Equal(t, orders.StatusPaid, o.Status)
	var events []string
	rows, err := b.pool.Query(context.Background(), `SELECT event_id FROM order_transitions`)
	require.NoError(t, err)
	for rows.Next() {
		var e string
		require.NoError(t, rows.Scan(&e))
		events = append(events, e)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, []string{key(t, in, orders.StepMarkPaid)}, events)
	_, err = b.claims.Get(context.Background(), effects.MustKey("acme", "order", "9f3a", "mark_paid"))
	require.ErrorIs(t, err, effects.ErrNotFound, "its transition is its record: MarkPaid claims none")
}

func TestMarkPaidNeedsACharge(t *testing.T) {
	t.Parallel()
	b := setup(t)
	in := b.order(t, "9f3a", "pm_card_visa")
	_, err := b.markPaid(t, in)
	app := requireTerminal(t, err, step.ErrTypeInvalidState)
	require.Contains(t, app.Error(), "no charge recorded")
	o, err := b.store.Get(context.Background(), "acme", "9f3a")
	require.NoError(t, err)
	require.Equal(t, orders.StatusPending, o.Status)
	require.Empty(t, b.transitions(t), "a refused transition writes nothing")
}

// transitions returns the event IDs of the recorded order transitions.
func (b *bundle) transitions(t *testing.T) []string {
	t.Helper()
	rows, err := b.pool.Query(context.Background(), `SELECT from_state || '->' || to_state || ' ' || event_id FROM order_transitions ORDER BY 1`)
	require.NoError(t, err)
	events, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return events
}

func TestMarkFailedTwiceWritesOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	in := b.order(t, "9f3a", "pm_card_chargeDeclined")
	_, err := b.charge(t, in)
	requireTerminal(t, err, step.ErrTypeCardDeclined)

	var results []orders.MarkFailedResult
	effectstest.SecondRun(t, b.pool, tables, func(context.Context) error {
		res, err := b.markFailed(t, in)
		results = append(results, res)
		return err
	})
	require.Equal(t, orders.MarkFailedResult{Status: "failed", ChargeError: "card_declined"}, results[0])
	require.Equal(t, results[0], results[1], "the second run returns the stored result")
	o, err := b.store.Get(context.Background(), "acme", "9f3a")
	require.NoError(t, err)
	require.Equal(t, orders.StatusFailed, o.Status)
	require.Equal(t, []string{"pending->failed " + key(t, in, orders.StepMarkFailed)}, b.transitions(t))
	rec, err := b.claims.Get(context.Background(), effects.MustKey("acme", "order", "9f3a", "mark_failed"))
	require.NoError(t, err)
	require.Equal(t, effects.StateSucceeded, rec.State)
	require.Equal(t, 1, b.stripe.Requests(), "marking failed never reaches Stripe")
}

func TestMarkFailedNeedsATerminallyFailedCharge(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		prepare func(t *testing.T, b *bundle, in orders.OrderInput)
		want    string
	}{
		"no charge": {func(*testing.T, *bundle, orders.OrderInput) {}, "no charge recorded"},
		"charge succeeded": {func(t *testing.T, b *bundle, in orders.OrderInput) {
			_, err := b.charge(t, in)
			require.NoError(t, err)
		}, "is succeeded, not failed_terminal"},
		"charge claimed": {func(t *testing.T, b *bundle, in orders.OrderInput) {
			b.leaveClaim(t, in, "someone-else/charge", time.Hour)
		}, "is claimed, not failed_terminal"},
		"charge may have happened": {func(t *testing.T, b *bundle, in orders.OrderInput) {
			claim, err := b.claims.Claim(context.Background(), effects.ClaimParams{Key: effects.MustKey("acme", "order", "9f3a", "charge"), Owner: "x/charge"})
			require.NoError(t, err)
			require.NoError(t, b.claims.Fail(context.Background(), claim, &step.Error{Type: step.ErrTypeKeyReused, Message: "other amount"}))
		}, "may have happened"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			in := b.order(t, "9f3a", "pm_card_visa")
			tc.prepare(t, b, in)
			_, err := b.markFailed(t, in)
			app := requireTerminal(t, err, step.ErrTypeInvalidState)
			require.Contains(t, app.Error(), tc.want)
			o, err := b.store.Get(context.Background(), "acme", "9f3a")
			require.NoError(t, err)
			require.Equal(t, orders.StatusPending, o.Status)
			require.Empty(t, b.transitions(t))
			_, err = b.claims.Get(context.Background(), effects.MustKey("acme", "order", "9f3a", "mark_failed"))
			require.ErrorIs(t, err, effects.ErrNotFound, "a failed transaction records nothing")
		})
	}
}

func TestMarkFailedRefusesAPaidOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	in := b.order(t, "9f3a", "pm_card_chargeDeclined")
	_, err := b.charge(t, in)
	requireTerminal(t, err, step.ErrTypeCardDeclined)
	_, err = b.pool.Exec(context.Background(), `UPDATE orders SET status = 'paid'`)
	require.NoError(t, err)
	_, err = b.markFailed(t, in)
	requireTerminal(t, err, step.ErrTypeInvalidState)
	o, err := b.store.Get(context.Background(), "acme", "9f3a")
	require.NoError(t, err)
	require.Equal(t, orders.StatusPaid, o.Status)
	require.Empty(t, b.transitions(t))
}

func TestSendReceiptTwiceSendsOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	in := b.paidOrder(t, "9f3a")

	var results []orders.ReceiptResult
	effectstest.SecondRun(t, b.pool, tables, func(context.Context) error {
		res, err := b.receipt(t, in)
		results = append(results, res)
		return err
	})
	require.Equal(t, results[0], results[1])
	require.NotEmpty(t, results[0].MessageID)
	require.False(t, results[0].Collapsed)

	k := key(t, in, orders.StepReceipt)
	require.Equal(t, 1, b.sendgrid.Count())
	sent := b.sendgrid.MessagesFor(notify.CustomArgEffectKey, k)
	require.Len(t, sent, 1)
	require.Equal(t, []string{email}, sent[0].To)
	require.Equal(t, k, sent[0].Headers[notify.HeaderEffectKey])
	require.Contains(t, sent[0].Body, "12.50 EUR")
	require.Contains(t, sent[0].Subject, "9f3a")
}

func TestSendReceiptNeedsAPaidOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	in := b.order(t, "9f3a", "pm_card_visa")
	_, err := b.receipt(t, in)
	requireTerminal(t, err, step.ErrTypeInvalidState)
	require.Zero(t, b.sendgrid.Requests())
}

func TestSendReceiptTransientThenSent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	in := b.paidOrder(t, "9f3a")

	b.sendgrid.Inject(fakesendgrid.Fault{Kind: fakesendgrid.FaultRateLimit})
	_, err := b.receipt(t, in)
	requireRetryable(t, err, step.ErrTypeTransient)
	_, err = b.receipt(t, in)
	require.NoError(t, err)
	require.Equal(t, 1, b.sendgrid.Count())
}

func TestSendReceiptLostResponseIsSettledFromSendGrid(t *testing.T) {
	t.Parallel()
	b := setup(t)
	in := b.paidOrder(t, "9f3a")

	// The first attempt's response was lost after SendGrid accepted it: not
	// a verdict, so the attempt is retried, and the retry finds the message.
	b.sendgrid.Inject(fakesendgrid.Fault{Kind: fakesendgrid.FaultDropResponse})
	_, err := b.receipt(t, in)
	requireRetryable(t, err, step.ErrTypeTransient)
	res, err := b.receipt(t, in)
	require.NoError(t, err)
	require.Equal(t, 1, b.sendgrid.Count())
	require.Equal(t, b.sendgrid.Messages()[0].MessageID, res.MessageID)
}

func TestChargeDroppedResponseThenRetryChargesOnce(t *testing.T) {
	t.Parallel()
	for name, opts := range map[string]*fakestripe.Opts{
		"found by search":         {},
		"replayed by idempotency": {SearchLag: time.Hour},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setupWith(t, setupOpts{stripe: opts})
			in := b.order(t, "9f3a", "pm_card_visa")
			b.stripe.Inject(fakestripe.Fault{Kind: fakestripe.FaultDropResponse})

			_, err := b.charge(t, in)
			requireRetryable(t, err, step.ErrTypeTransient)
			require.Equal(t, 1, b.stripe.Charges(), "Stripe charged; we never heard")

			res, err := b.charge(t, in)
			require.NoError(t, err)
			require.Equal(t, "succeeded", res.Status)
			require.Equal(t, 1, b.stripe.Charges())
			require.Equal(t, 1, b.stripe.ChargesForKey(key(t, in, orders.StepCharge)))
		})
	}
}

// The charge's claim commits without waiting for the WAL flush, so a
// Postgres crash may lose it after Stripe charged. The next attempt claims
// the key anew and sends it again, and Stripe answers with the first
// charge (docs/design.md, "A claim that need not be flushed").
func TestChargeWhoseClaimWasLostChargesOnce(t *testing.T) {
	t.Parallel()
	b := setupWith(t, setupOpts{stripe: &fakestripe.Opts{SearchLag: time.Hour}})
	in := b.order(t, "lost1", "pm_card_visa")
	b.stripe.Inject(fakestripe.Fault{Kind: fakestripe.FaultDropResponse})
	_, err := b.charge(t, in)
	requireRetryable(t, err, step.ErrTypeTransient)
	require.Equal(t, 1, b.stripe.Charges(), "Stripe charged; we never heard")

	k := key(t, in, orders.StepCharge)
	tag, err := b.pool.Exec(context.Background(), `DELETE FROM keyed_effects WHERE key = $1`, k)
	require.NoError(t, err)
	require.EqualValues(t, 1, tag.RowsAffected(), "the crash takes the claim's record")

	res, err := b.charge(t, in)
	require.NoError(t, err)
	require.Equal(t, "succeeded", res.Status)
	require.Equal(t, 1, b.stripe.Charges())
	require.Equal(t, 1, b.stripe.ChargesForKey(k))
}

func TestChargeServerErrorsAreTransient(t *testing.T) {
	t.Parallel()
	for _, kind := range []fakestripe.FaultKind{fakestripe.FaultServerError, fakestripe.FaultRateLimit} {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			in := b.order(t, "9f3a", "pm_card_visa")
			b.stripe.Inject(fakestripe.Fault{Kind: kind})

			_, err := b.charge(t, in)
			requireRetryable(t, err, step.ErrTypeTransient)
			require.Equal(t, 1, b.stripe.Requests(), "stripe-go must not retry by itself")
			require.Zero(t, b.stripe.Charges())

			res, err := b.charge(t, in)
			require.NoError(t, err)
			require.Equal(t, "succeeded", res.Status)
			require.Equal(t, 1, b.stripe.Charges())
		})
	}
}

func TestChargeDeclineIsTerminal(t *testing.T) {
	t.Parallel()
	b := setup(t)
	in := b.order(t, "9f3a", "pm_card_chargeDeclined")

	var errs []error
	effectstest.SecondRun(t, b.pool, tables, func(context.Context) error {
		_, err := b.charge(t, in)
		errs = append(errs, err)
		return err
	})
	for _, err := range errs {
		app := requireTerminal(t, err, step.ErrTypeCardDeclined)
		require.Contains(t, app.Error(), "card_declined")
		require.NotContains(t, app.Error(), "secret", "no Stripe payload in the error")
	}
	require.Zero(t, b.stripe.Charges())
	require.Equal(t, 1, b.stripe.Requests())
	rec, err := b.claims.Get(context.Background(), effects.MustKey("acme", "order", "9f3a", "charge"))
	require.NoError(t, err)
	require.Equal(t, effects.StateFailedTerminal, rec.State)
	require.Equal(t, "card_declined", rec.ErrorCode)
}

// prior charges the order at Stripe as an earlier owner would have, under
// the effect key, and returns the payment intent.
func (b *bundle) prior(t *testing.T, in orders.OrderInput) *stripe.PaymentIntent {
	t.Helper()
	k := key(t, in, orders.StepCharge)
	p := &stripe.PaymentIntentParams{Amount: stripe.Int64(1250), Currency: stripe.String("eur"),
		PaymentMethod: stripe.String("pm_card_visa"), Confirm: stripe.Bool(true)}
	p.SetIdempotencyKey(k)
	p.AddMetadata("effect_key", k)
	pi, err := b.stripeAPI.PaymentIntents.New(p)
	require.NoError(t, err)
	return pi
}

// leaveClaim leaves the charge claim of a crashed attempt by owner.
func (b *bundle) leaveClaim(t *testing.T, in orders.OrderInput, owner string, lease time.Duration) {
	t.Helper()
	k, err := in.EffectKey(orders.StepCharge)
	require.NoError(t, err)
	_, err = b.claims.Claim(context.Background(), effects.ClaimParams{Key: k, Owner: owner, Lease: lease,
		Fingerprint: step.Fingerprint("1250", "eur", "pm_card_visa")})
	require.NoError(t, err)
}

func TestChargeTakeoverFindsEarlierCharge(t *testing.T) {
	t.Parallel()
	for name, owner := range map[string]string{
		"takeover": "order:acme:9f3a:fulfil-previous/charge",
		"reentry":  testWorkflowID + "/charge",
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			in := b.order(t, "9f3a", "pm_card_visa")
			pi := b.prior(t, in)
			lease := time.Hour
			if name == "takeover" {
				lease = time.Millisecond
			}
			b.leaveClaim(t, in, owner, lease)
			time.Sleep(5 * time.Millisecond)
			// Two days later Stripe has forgotten the idempotency key: only
			// the search stands between the retry and a second charge.
			b.clock.Advance(48 * time.Hour)

			res, err := b.charge(t, in)
			require.NoError(t, err)
			require.Equal(t, pi.ID, res.PaymentIntentID)
			require.Equal(t, 1, b.stripe.Charges())
			rec, err := b.claims.Get(context.Background(), effects.MustKey("acme", "order", "9f3a", "charge"))
			require.NoError(t, err)
			require.Equal(t, effects.StateSucceeded, rec.State)
			require.Equal(t, testWorkflowID+"/charge", rec.Owner)
		})
	}
}

func TestChargeTakeoverWithoutEarlierChargeCreates(t *testing.T) {
	t.Parallel()
	b := setup(t)
	in := b.order(t, "9f3a", "pm_card_visa")
	b.leaveClaim(t, in, "someone-else/charge", time.Millisecond)
	time.Sleep(5 * time.Millisecond)
	res, err := b.charge(t, in)
	require.NoError(t, err)
	require.Equal(t, "succeeded", res.Status)
	require.Equal(t, 1, b.stripe.Charges())
}

func TestChargeLiveClaimElsewhereIsInProgress(t *testing.T) {
	t.Parallel()
	b := setup(t)
	in := b.order(t, "9f3a", "pm_card_visa")
	b.leaveClaim(t, in, "someone-else/charge", time.Hour)
	_, err := b.charge(t, in)
	requireRetryable(t, err, step.ErrTypeInProgress)
	require.Zero(t, b.stripe.Requests())
}

func TestChargeHeartbeatsWhileStripeIsSlow(t *testing.T) {
	t.Parallel()
	b := setupWith(t, setupOpts{effects: &effects.ClientOpts{Lease: 1500 * time.Millisecond}})
	in := b.order(t, "9f3a", "pm_card_visa")
	var beats atomic.Int32
	b.env.SetOnActivityHeartbeatListener(func(*activity.Info, converter.EncodedValues) { beats.Add(1) })
	b.stripe.Inject(fakestripe.Fault{Kind: fakestripe.FaultLatency, Delay: 1500 * time.Millisecond})

	_, err := b.charge(t, in)
	require.NoError(t, err)
	// The lease was renewed every 500ms while Stripe took 1.5s; the SDK
	// throttles the heartbeats it passes on.
	require.GreaterOrEqual(t, beats.Load(), int32(1))
	require.Equal(t, 1, b.stripe.Charges())
}

func TestChargeRequiresActionIsTerminal(t *testing.T) {
	t.Parallel()
	// A payment intent that needs 3-D Secure ends in requires_action. The
	// fake has no such card, so this serves one from a stub Stripe.
	stub := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"id":"pi_3ds","object":"payment_intent","amount":1250,"currency":"eur","status":"requires_action"}`))
	}))
	t.Cleanup(stub.Close)
	b := setup(t)
	api, err := stripestep.NewClient(stripeKey, stub.URL, nil)
	require.NoError(t, err)
	quiet := slog.New(slog.DiscardHandler)
	acts, err := ordersteps.New(pipeline.Deps{DB: b.pool, Effects: b.claims, Logger: quiet, Providers: []any{api, senderFor(t, b)}})
	require.NoError(t, err)
	var suite testsuite.WorkflowTestSuite
	suite.SetLogger(log.NewStructuredLogger(quiet))
	env := suite.NewTestActivityEnvironment()
	require.NoError(t, step.Register(env, acts.Definitions()...))
	in := b.order(t, "9f3a", "pm_card_visa")

	_, err = env.ExecuteActivity(ordersteps.NameCharge, in)
	app := requireTerminal(t, err, step.ErrTypePaymentIncomplete)
	require.Contains(t, app.Error(), "requires_action")
}

func senderFor(t *testing.T, b *bundle) *notify.Sender {
	t.Helper()
	s, err := notify.NewSender(b.claims, b.pool, &notify.SenderOpts{APIKey: "SG.x", From: "r@example.com"})
	require.NoError(t, err)
	return s
}

func TestBadInputIsTerminal(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.order(t, "9f3a", "pm_card_visa")
	unknown := orders.NewOrderInput("acme", "nope")
	future := orders.NewOrderInput("acme", "9f3a")
	future.V = 2
	badTenant := orders.NewOrderInput("ac me", "9f3a")

	for _, d := range ordersteps.Declarations() {
		_, err := b.env.ExecuteActivity(d.Name, unknown)
		app := requireTerminal(t, err, step.ErrTypeNotFound)
		require.Contains(t, app.Error(), "acme/nope", d.Name)

		_, err = b.env.ExecuteActivity(d.Name, future)
		app = requireTerminal(t, err, step.ErrTypeInvalidInput)
		require.Contains(t, app.Error(), "v=2", d.Name)

		_, err = b.env.ExecuteActivity(d.Name, badTenant)
		requireTerminal(t, err, step.ErrTypeInvalidInput)
	}
	require.Zero(t, b.stripe.Requests())
	require.Zero(t, b.sendgrid.Requests())
	n := 0
	require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT count(*) FROM keyed_effects`).Scan(&n))
	require.Zero(t, n)
}

func TestChargeRefusesASettledOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	in := b.order(t, "9f3a", "pm_card_visa")
	_, err := b.pool.Exec(context.Background(), `UPDATE orders SET status = 'paid'`)
	require.NoError(t, err)
	_, err = b.charge(t, in)
	requireTerminal(t, err, step.ErrTypeInvalidState)
	require.Zero(t, b.stripe.Charges())
	require.Equal(t, 1, b.stripe.Requests(), "one search for an earlier charge, no create")
}

func TestChargeKeyReused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	in := b.order(t, "9f3a", "pm_card_visa")
	_, err := b.charge(t, in)
	require.NoError(t, err)
	// The order's amount changes under the same key.
	_, err = b.pool.Exec(context.Background(), `UPDATE orders SET amount_minor = 999`)
	require.NoError(t, err)
	_, err = b.charge(t, in)
	requireTerminal(t, err, step.ErrTypeKeyReused)
	require.Equal(t, 1, b.stripe.Charges())
}

// A step whose provider the worker lacks fails for good, naming it, and
// touches nothing; the steps that need no provider still run.
func TestAStepWithoutItsProviderFailsForGood(t *testing.T) {
	t.Parallel()
	b := setup(t)
	acts, err := ordersteps.New(pipeline.Deps{DB: b.pool, Effects: b.claims})
	require.NoError(t, err)
	var suite testsuite.WorkflowTestSuite
	suite.SetLogger(log.NewStructuredLogger(slog.New(slog.DiscardHandler)))
	env := suite.NewTestActivityEnvironment()
	require.NoError(t, step.Register(env, acts.Definitions()...))
	in := b.order(t, "np1", "pm_card_visa")
	_, err = env.ExecuteActivity(ordersteps.NameCharge, in)
	app := requireTerminal(t, err, step.ErrTypeTerminal)
	require.Contains(t, app.Error(), "no Stripe client")
	_, err = env.ExecuteActivity(ordersteps.NameSendReceipt, in)
	require.Contains(t, requireTerminal(t, err, step.ErrTypeTerminal).Error(), "no SendGrid sender")
	_, err = env.ExecuteActivity(ordersteps.NameMarkPaid, in)
	requireTerminal(t, err, step.ErrTypeInvalidState) // no charge: it ran, and refused
	require.Zero(t, b.stripe.Requests())
	require.Zero(t, b.sendgrid.Requests())
}

func TestChargeStopsWhenItsClaimIsTakenOver(t *testing.T) {
	t.Parallel()
	b := setupWith(t, setupOpts{effects: &effects.ClientOpts{Lease: 1200 * time.Millisecond}})
	in := b.order(t, "9f3a", "pm_card_visa")
	b.stripe.Inject(fakestripe.Fault{Kind: fakestripe.FaultLatency, Delay: 3 * time.Second})

	// While Stripe is slow, another attempt takes the claim over.
	go func() {
		time.Sleep(200 * time.Millisecond)
		_, _ = b.pool.Exec(context.Background(),
			`UPDATE keyed_effects SET generation = generation + 1, owner = 'someone-else/charge'`)
	}()
	start := time.Now()
	_, err := b.charge(t, in)
	requireRetryable(t, err, step.ErrTypeLeaseLost)
	require.Less(t, time.Since(start), 2*time.Second, "the lost lease cancelled the Stripe request")
}

// TestPipelineOnOneConnection runs every step on a pool of one connection:
// no step may hold a connection while it waits for a second one.
func TestPipelineOnOneConnection(t *testing.T) {
	t.Parallel()
	b := setupWith(t, setupOpts{maxConns: 1})
	in := b.paidOrder(t, "9f3a")
	_, err := b.receipt(t, in)
	require.NoError(t, err)
	require.Equal(t, 1, b.sendgrid.Count())

	declined := b.order(t, "9f3b", "pm_card_chargeDeclined")
	_, err = b.charge(t, declined)
	requireTerminal(t, err, step.ErrTypeCardDeclined)
	res, err := b.markFailed(t, declined)
	require.NoError(t, err)
	require.Equal(t, "card_declined", res.ChargeError)
}

func TestChargeRefusesAFailedOrderWithoutTouchingItsRecord(t *testing.T) {
	t.Parallel()
	b := setup(t)
	in := b.order(t, "9f3a", "pm_card_chargeDeclined")
	_, err := b.charge(t, in)
	requireTerminal(t, err, step.ErrTypeCardDeclined)
	_, err = b.markFailed(t, in)
	require.NoError(t, err)
	k, err := in.EffectKey(orders.StepCharge)
	require.NoError(t, err)
	_, err = b.claims.Resolve(context.Background(), k, effects.ResolveParams{Resolution: effects.ResolveRetry, Reason: "test"})
	require.NoError(t, err)

	_, err = b.charge(t, in)
	requireTerminal(t, err, step.ErrTypeInvalidState)
	rec, err := b.claims.Get(context.Background(), k)
	require.NoError(t, err)
	require.Equal(t, "resolved_retry", rec.ErrorCode, "the refused charge did not claim the record")
}

// prune forgets every effect and collapse-window record, as Prune does after
// the retention, and ages the orders past RecordHorizon.
func (b *bundle) prune(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	for _, sql := range []string{
		`DELETE FROM keyed_effects`,
		`DELETE FROM keyed_sends`,
		`UPDATE orders SET created_at = now() - interval '40 days', updated_at = now() - interval '40 days'`,
	} {
		_, err := b.pool.Exec(ctx, sql)
		require.NoError(t, err, sql)
	}
}

// TestStepsStaySafeAfterTheirRecordsArePruned runs every step again after
// its effect record was pruned: each finds its effect at the provider or in
// the order's own state, and none acts twice.
func TestStepsStaySafeAfterTheirRecordsArePruned(t *testing.T) {
	t.Parallel()
	b := setup(t)
	paid := b.order(t, "9f3a", "pm_card_visa")
	charged, err := b.charge(t, paid)
	require.NoError(t, err)
	_, err = b.markPaid(t, paid)
	require.NoError(t, err)
	sent, err := b.receipt(t, paid)
	require.NoError(t, err)
	declined := b.order(t, "9f3b", "pm_card_chargeDeclined")
	_, err = b.charge(t, declined)
	requireTerminal(t, err, step.ErrTypeCardDeclined)
	_, err = b.markFailed(t, declined)
	require.NoError(t, err)
	b.prune(t)
	stripeBefore := b.stripe.Requests()

	again, err := b.charge(t, paid)
	require.NoError(t, err, "the charge is found at Stripe by metadata")
	require.Equal(t, charged.PaymentIntentID, again.PaymentIntentID)
	_, err = b.markPaid(t, paid)
	require.NoError(t, err, "the order is already paid by this step")
	resent, err := b.receipt(t, paid)
	require.NoError(t, err, "the receipt is found at SendGrid")
	require.Equal(t, sent.MessageID, resent.MessageID)
	_, err = b.markFailed(t, declined)
	require.NoError(t, err, "the order is already failed by this step")
	_, err = b.charge(t, declined)
	requireTerminal(t, err, step.ErrTypeInvalidState)

	require.Equal(t, 1, b.stripe.Charges(), "one charge")
	require.Equal(t, 1, b.sendgrid.Count(), "one receipt")
	require.Equal(t, stripeBefore+1, b.stripe.Requests(), "one search at Stripe, no create; the failed order is refused before Stripe")
}

// TestDefinitionsAreTheDeclarations checks that Definitions register, in
// one step.Register call, exactly the declared steps.
func TestDefinitionsAreTheDeclarations(t *testing.T) {
	t.Parallel()
	var acts *ordersteps.Activities
	defs := acts.Definitions()
	require.Len(t, defs, len(ordersteps.Declarations()))
	for i, d := range ordersteps.Declarations() {
		require.Equal(t, defs[i].Declaration, d)
		require.NoError(t, d.Validate())
	}
	var suite testsuite.WorkflowTestSuite
	require.NoError(t, step.Register(suite.NewTestActivityEnvironment(), defs...))
}
