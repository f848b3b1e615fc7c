package tests

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"

	ordersteps "github.com/keyedhq/keyed/activities/order"
	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/effects/effectstest"
	"github.com/keyedhq/keyed/internal/fakestripe"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/outbox"
	"github.com/keyedhq/keyed/pipeline"
	"github.com/keyedhq/keyed/step"
	orderflow "github.com/keyedhq/keyed/workflows/order"
)

// 1. The happy path: paid, charged once, receipted once, every record done.
func TestHappyPath(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startWorker(t)
	o := b.order(t, "o1", 1250, "pm_card_visa")

	st := b.start(t, orders.NewOrderInput(b.tenant, o.ID))
	require.True(t, st.Created)
	require.Equal(t, orders.WorkflowID(b.tenant, "o1"), st.WorkflowID)
	res, err := b.wait(t, st)
	require.NoError(t, err)
	require.Equal(t, "succeeded", res.Charge.Status)
	require.EqualValues(t, 1250, res.Charge.AmountMinor)
	require.NotEmpty(t, res.Receipt.MessageID)

	got, err := b.orders.Get(b.ctx, b.tenant, "o1")
	require.NoError(t, err)
	require.Equal(t, orders.StatusPaid, got.Status)
	require.Equal(t, 1, b.stripe.ChargesForMetadata("order_id", "o1"))
	key, _ := orders.NewOrderInput(b.tenant, "o1").EffectKey(orders.StepCharge)
	require.Equal(t, 1, b.stripe.ChargesForKey(key.String()), "Stripe must see our effect key as Idempotency-Key")
	receiptKey, _ := orders.NewOrderInput(b.tenant, "o1").EffectKey(orders.StepReceipt)
	require.Len(t, b.mail.MessagesFor("effect_key", receiptKey.String()), 1)
	require.Equal(t, 1, b.mail.Count())

	recs := b.records(t, "o1")
	require.Len(t, recs, len(ordersteps.PaidPath()))
	for _, step := range []string{orders.StepCharge, orders.StepMarkPaid, orders.StepReceipt} {
		require.Contains(t, recs, step)
		require.Equal(t, effects.StateSucceeded, recs[step].State, step)
	}

	// Started with pipeline.MemoLocalSteps and MemoLocalFirst, the run
	// runs MarkPaid as a local activity with no version marker and no
	// search attribute upsert, and the charge and the receipt in the same
	// workflow task: no activity task at all.
	events := b.history(t, st)
	recordHistory(t, events) // workflows/order/testdata/order_happy_v3.json
	require.Contains(t, events[0].GetWorkflowExecutionStartedEventAttributes().GetMemo().GetFields(), pipeline.MemoLocalSteps)
	require.Contains(t, events[0].GetWorkflowExecutionStartedEventAttributes().GetMemo().GetFields(), pipeline.MemoLocalFirst)
	// (A step added later behind its own workflow.GetVersion has a marker
	// and an upsert of its own.)
	const localStepsChange = "local-database-steps" // pipeline's change ID
	var markers []string
	for _, e := range events {
		if a := e.GetUpsertWorkflowSearchAttributesEventAttributes(); a != nil {
			require.NotContains(t, a.String(), localStepsChange, "an upsert saying how Local steps run")
		}
		if m := e.GetMarkerRecordedEventAttributes(); m != nil {
			require.NotContains(t, m.String(), localStepsChange, "a version marker saying how Local steps run")
			markers = append(markers, m.GetMarkerName())
		}
	}
	require.Equal(t, []string{"LocalActivity", "LocalActivity", "LocalActivity"}, markers, "the three steps ran as local activities")
	require.Empty(t, scheduledActivities(events), "no step went through the task queue")
}

// 2. Ten concurrent starts of one order: one run, one charge, one email.
func TestConcurrentStartsCollapse(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startWorker(t)
	b.order(t, "o2", 990, "pm_card_visa")
	in := orders.NewOrderInput(b.tenant, "o2")

	var wg sync.WaitGroup
	starts := make(chan string, 10)
	created := make(chan bool, 10)
	for i := 0; i < 10; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st := b.start(t, in)
			starts <- st.RunID
			created <- st.Created
		}()
	}
	wg.Wait()
	close(starts)
	close(created)
	runIDs := map[string]bool{}
	for id := range starts {
		runIDs[id] = true
	}
	require.Len(t, runIDs, 1, "every start must land on the same run")
	newRuns := 0
	for c := range created {
		if c {
			newRuns++
		}
	}
	require.Equal(t, 1, newRuns, "exactly one start creates the run")

	var runID string
	for id := range runIDs {
		runID = id
	}
	_, err := b.wait(t, &outbox.Started{WorkflowID: in.WorkflowID(), RunID: runID})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return b.runs(t, in.WorkflowID()) == 1 }, 10*time.Second, 200*time.Millisecond)
	require.Equal(t, 1, b.stripe.Charges())
	require.Equal(t, 1, b.mail.Count())
}

// 3. Each activity twice with the same input: the second run changes no
// table and reaches no provider.
func TestEachActivitySecondRunIsANoop(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.order(t, "o3", 4200, "pm_card_visa")
	in := orders.NewOrderInput(b.tenant, "o3")
	tables := []string{"keyed_effects", "orders", "order_transitions"}

	var suite testsuite.WorkflowTestSuite
	env := suite.NewTestActivityEnvironment()
	defs, err := orderflow.Pipeline().Activities(b.deps)
	require.NoError(t, err)
	for _, d := range defs {
		env.RegisterActivityWithOptions(d.Fn, activity.RegisterOptions{Name: d.Name})
	}
	for _, name := range []string{"Charge", "MarkPaid", "SendReceipt"} {
		effectstest.SecondRun(t, b.pool, tables, func(ctx context.Context) error {
			_, err := env.ExecuteActivity(name, in)
			return err
		})
	}
	require.Equal(t, 1, b.stripe.Charges())
	require.Equal(t, 1, b.mail.Count())
	got, err := b.orders.Get(b.ctx, b.tenant, "o3")
	require.NoError(t, err)
	require.Equal(t, orders.StatusPaid, got.Status)
}

// 4. Stripe charges, then the response is lost: the retry finds the charge.
func TestChargeResponseLost(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startWorker(t)
	b.order(t, "o4", 700, "pm_card_visa")
	// Two drops: Go's HTTP client silently resends an idempotent request
	// once on a reused connection, so the first drop alone might never
	// reach our code.
	b.stripe.Inject(fakestripe.Fault{Kind: fakestripe.FaultDropResponse, Times: 2})

	st := b.start(t, orders.NewOrderInput(b.tenant, "o4"))
	_, err := b.wait(t, st)
	require.NoError(t, err)
	require.Equal(t, 1, b.stripe.Charges())
	require.GreaterOrEqual(t, b.stripe.Requests(), 2, "the charge must have been attempted again")
	require.Equal(t, 1, b.mail.Count())

	// The first attempt, in the workflow task, lost the answer; the run
	// then scheduled the charge as an activity, which found it.
	events := b.history(t, st)
	recordHistory(t, events) // workflows/order/testdata/order_charge_lost_v3.json
	require.Equal(t, []string{ordersteps.NameCharge}, scheduledActivities(events), "only the charge goes through the task queue")
}

// 4b. Stripe charges but holds its answer past the first attempt's bound
// (step.FirstAttemptTimeout): the attempt in the workflow task gives up,
// the run schedules the charge as an activity, and that attempt's claim
// and Stripe's idempotency key turn it into the same charge.
func TestChargeAnsweredAfterTheFirstAttemptsBound(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startWorker(t)
	b.order(t, "o4b", 1250, "pm_card_visa")
	b.stripe.Inject(fakestripe.Fault{Kind: fakestripe.FaultHoldResponse, Delay: step.FirstAttemptTimeout + 2*time.Second})

	st := b.start(t, orders.NewOrderInput(b.tenant, "o4b"))
	res, err := b.wait(t, st)
	require.NoError(t, err)
	require.Equal(t, "succeeded", res.Charge.Status)
	require.Equal(t, 1, b.stripe.Charges(), "one charge at Stripe")
	require.Equal(t, 1, b.mail.Count())
	require.Equal(t, []string{ordersteps.NameCharge}, scheduledActivities(b.history(t, st)),
		"the charge went through the task queue after its first attempt")
}

// 6. A card decline fails the workflow terminally after one attempt, with
// no email, and marks the order failed.
func TestCardDeclineIsTerminal(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startWorker(t)
	b.order(t, "o6", 500, "pm_card_chargeDeclined")

	_, err := b.wait(t, b.start(t, orders.NewOrderInput(b.tenant, "o6")))
	require.Error(t, err)
	var appErr *temporal.ApplicationError
	require.True(t, errors.As(err, &appErr), "want an application error, got %v", err)
	require.Equal(t, "CardDeclined", appErr.Type())
	require.Contains(t, err.Error(), "declined")
	require.Equal(t, 1, b.stripe.Requests(), "a decline must not be retried")
	require.Zero(t, b.stripe.Charges())
	require.Zero(t, b.mail.Count())
	recs := b.records(t, "o6")
	require.Equal(t, effects.StateFailedTerminal, recs[orders.StepCharge].State)
	require.NotContains(t, recs, orders.StepReceipt)
	require.NotContains(t, recs, orders.StepMarkPaid)
	require.Contains(t, recs, orders.StepMarkFailed)
	require.Equal(t, effects.StateSucceeded, recs[orders.StepMarkFailed].State)
	require.JSONEq(t, `{"status":"failed","charge_error":"card_declined"}`, string(recs[orders.StepMarkFailed].Result))
	got, err := b.orders.Get(b.ctx, b.tenant, "o6")
	require.NoError(t, err)
	require.Equal(t, orders.StatusFailed, got.Status)
}

// 7. A stale duplicate start after the order completed starts nothing.
func TestStaleDuplicateStartAfterCompletion(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startWorker(t)
	b.order(t, "o7", 300, "pm_card_visa")
	in := orders.NewOrderInput(b.tenant, "o7")
	first := b.start(t, in)
	_, err := b.wait(t, first)
	require.NoError(t, err)

	again := b.start(t, in)
	require.False(t, again.Created)
	require.Equal(t, first.RunID, again.RunID)
	time.Sleep(500 * time.Millisecond)
	require.Equal(t, 1, b.runs(t, in.WorkflowID()))
	require.Equal(t, 1, b.stripe.Charges())
	require.Equal(t, 1, b.mail.Count())
}

// 8. Bad input fails terminally, names the problem, and has no effect.
func TestBadInput(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startWorker(t)

	t.Run("unknown order", func(t *testing.T) {
		_, err := b.wait(t, b.start(t, orders.NewOrderInput(b.tenant, "missing")))
		require.ErrorContains(t, err, "missing")
		require.ErrorContains(t, err, "not found")
	})
	t.Run("unsupported version", func(t *testing.T) {
		b.order(t, "o8v", 100, "pm_card_visa")
		in := orders.NewOrderInput(b.tenant, "o8v")
		in.V = 2
		o, err := orderflow.StartOptions(in, &orderflow.StartOpts{TaskQueue: b.taskQueue})
		require.NoError(t, err)
		run, err := b.temporal.ExecuteWorkflow(b.ctx, o, orders.WorkflowName, in)
		require.NoError(t, err)
		err = run.Get(b.ctx, nil)
		require.ErrorContains(t, err, "v=2")
		require.Empty(t, b.records(t, "o8v"))
	})
	for name, tc := range map[string]struct {
		o     orders.NewOrder
		field string
	}{
		"negative amount":  {orders.NewOrder{ID: "neg", AmountMinor: -5, Currency: "eur"}, "amount_minor"},
		"unknown currency": {orders.NewOrder{ID: "cur", AmountMinor: 5, Currency: "xyz"}, "currency"},
	} {
		t.Run(name, func(t *testing.T) {
			tc.o.TenantID, tc.o.CustomerEmail, tc.o.PaymentMethod = b.tenant, "ada@example.com", "pm_card_visa"
			_, _, err := b.orders.Create(b.ctx, tc.o)
			var ve *orders.ValidationError
			require.ErrorAs(t, err, &ve)
			require.Equal(t, tc.field, ve.Field)
			_, err = b.orders.Get(b.ctx, b.tenant, tc.o.ID)
			require.ErrorIs(t, err, orders.ErrNotFound)
		})
	}
	require.Zero(t, b.stripe.Requests())
	require.Zero(t, b.mail.Count())
}
