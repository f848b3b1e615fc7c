package reconcile_test

import (
	"log/slog"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/log"
	"go.temporal.io/sdk/testsuite"

	ordersteps "github.com/keyedhq/keyed/activities/order"
	refundsteps "github.com/keyedhq/keyed/activities/refund"
	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/internal/fakesendgrid"
	"github.com/keyedhq/keyed/internal/fakestripe"
	"github.com/keyedhq/keyed/notify"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/pipeline"
	"github.com/keyedhq/keyed/reconcile"
	"github.com/keyedhq/keyed/refunds"
	"github.com/keyedhq/keyed/step"
	"github.com/keyedhq/keyed/workflows"
)

// activityEnv returns an activity environment with the order activities
// and the refund ones, over b's database and fake Stripe.
func (b *bundle) activityEnv(t *testing.T) (*testsuite.TestActivityEnvironment, *orders.Store) {
	t.Helper()
	quiet := slog.New(slog.DiscardHandler)
	store, err := orders.NewStore(b.pool)
	require.NoError(t, err)
	gts := httptest.NewServer(fakesendgrid.New(nil))
	t.Cleanup(gts.Close)
	sender, err := notify.NewSender(b.claims, b.pool, &notify.SenderOpts{APIKey: "SG.test", From: "shop@example.com", BaseURL: gts.URL, Logger: quiet})
	require.NoError(t, err)
	defs, err := pipeline.Definitions(workflows.Pipelines(), pipeline.Deps{DB: b.pool, Effects: b.claims, Logger: quiet, Providers: []any{b.stripe, sender}})
	require.NoError(t, err)
	var suite testsuite.WorkflowTestSuite
	suite.SetLogger(log.NewStructuredLogger(quiet))
	env := suite.NewTestActivityEnvironment()
	require.NoError(t, step.Register(env, defs...))
	return env, store
}

// TestRefundsMadeByTheRefundStepsAreClean runs the real charge and refund
// activities: two partial refunds, the second of which loses Stripe's
// answer and is recorded by its retry. Reconciliation is clean before the
// retry (the refund is in flight) and after it, and reports the lost
// answer only to a reconciler with no grace.
func TestRefundsMadeByTheRefundStepsAreClean(t *testing.T) {
	t.Parallel()
	b := setup(t)
	now := time.Now()
	b.setClock(now)
	b.window = reconcile.Window{From: now.Add(-time.Hour), To: now.Add(time.Hour)}
	env, store := b.activityEnv(t)
	_, _, err := store.Create(b.ctx, orders.NewOrder{TenantID: "acme", ID: "o1", AmountMinor: 1250, Currency: "eur",
		CustomerEmail: "ada@example.com", PaymentMethod: "pm_card_visa"})
	require.NoError(t, err)
	for _, name := range []string{ordersteps.NameCharge, ordersteps.NameMarkPaid} {
		_, err := env.ExecuteActivity(name, orders.NewOrderInput("acme", "o1"))
		require.NoError(t, err, name)
	}
	r1 := refunds.NewInput("acme", "o1", "r1", 400, "damaged")
	for _, name := range []string{refundsteps.NameReserve, refundsteps.NameRefundAtStripe, refundsteps.NameMarkRefunded, refundsteps.NameSendRefundEmail} {
		_, err := env.ExecuteActivity(name, r1)
		require.NoError(t, err, name)
	}

	r2 := refunds.NewInput("acme", "o1", "r2", 300, "")
	_, err = env.ExecuteActivity(refundsteps.NameReserve, r2)
	require.NoError(t, err)
	// Twice: net/http replays a request with an Idempotency-Key once when a
	// reused connection drops, and the replay must be lost too.
	b.fake.Inject(fakestripe.Fault{Kind: fakestripe.FaultDropResponse, Match: "POST /v1/refunds", Times: 2})
	_, err = env.ExecuteActivity(refundsteps.NameRefundAtStripe, r2)
	require.Error(t, err)
	require.Equal(t, 2, b.fake.Refunds(), "the lost answer's refund happened")

	rep := b.run(t)
	require.True(t, rep.Clean(), "%v", kinds(rep))
	require.Equal(t, 1, rep.InFlight, "r2 is refunded, its answer not yet recorded")
	impatient, err := reconcile.New(b.claims, b.pool, b.stripe, &reconcile.Opts{Logger: slog.New(slog.DiscardHandler), RefundGrace: time.Nanosecond})
	require.NoError(t, err)
	rep, err = impatient.Run(b.ctx, b.window)
	require.NoError(t, err)
	r2Key, err := r2.EffectKey(refunds.StepStripe)
	require.NoError(t, err)
	require.Equal(t, []string{"unrecorded_refund " + r2Key.String()}, kinds(rep))
	require.Equal(t, effects.StateFailedTransient, rep.Findings[0].RecordState)

	// The retry finds the refund by metadata and records it.
	_, err = env.ExecuteActivity(refundsteps.NameRefundAtStripe, r2)
	require.NoError(t, err)
	require.Equal(t, 2, b.fake.Refunds())
	for _, r := range []*reconcile.Reconciler{b.rec, impatient} {
		rep, err := r.Run(b.ctx, b.window)
		require.NoError(t, err)
		require.True(t, rep.Clean(), "%v", kinds(rep))
		require.Zero(t, rep.InFlight)
		require.Equal(t, 2, rep.Refunds)
		require.Equal(t, 2, rep.StripeRefunds)
		require.Equal(t, 1, rep.Records)
	}
}
