package order_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/mock"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"

	ordersteps "github.com/keyedhq/keyed/activities/order"
	"github.com/keyedhq/keyed/notify"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/pipeline"
	"github.com/keyedhq/keyed/pipeline/pipelinetest"
	"github.com/keyedhq/keyed/step"
	orderflow "github.com/keyedhq/keyed/workflows/order"
)

var (
	in      = orders.NewOrderInput("acme", "9f3a")
	charged = orders.ChargeResult{PaymentIntentID: "pi_123", Status: "succeeded", AmountMinor: 1250, Currency: "eur"}
	paid    = orders.MarkPaidResult{Status: "paid"}
	sent    = orders.ReceiptResult{MessageID: "msg_123"}

	markedFailed = orders.MarkFailedResult{Status: "failed", ChargeError: "card_declined"}
)

type bundle struct {
	env     *testsuite.TestWorkflowEnvironment
	started *pipelinetest.Started
}

// setup returns a workflow test environment with the workflow and every
// declared step registered; tests mock the steps they drive with
// OnActivity, and execute mocks the rest.
func setup(t *testing.T) *bundle {
	t.Helper()
	b := &bundle{env: pipelinetest.NewEnv(t)}
	pipelinetest.Register(t, b.env, nil, orderflow.Pipeline())
	b.env.SetStartWorkflowOptions(client.StartWorkflowOptions{ID: in.WorkflowID()})
	b.started = pipelinetest.RecordStarted(b.env)
	return b
}

// execute runs the order workflow on input, every step the test did not
// mock succeeding.
func (b *bundle) execute(input orders.OrderInput) {
	pipelinetest.MockRest(b.env, orderflow.Pipeline())
	b.env.ExecuteWorkflow(orders.WorkflowName, input)
}

func TestHappyPath(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.env.OnActivity(ordersteps.NameCharge, mock.Anything, in).Return(charged, nil).Once()
	b.env.OnActivity(ordersteps.NameMarkPaid, mock.Anything, in).Return(paid, nil).Once()
	b.env.OnActivity(ordersteps.NameSendReceipt, mock.Anything, in).Return(sent, nil).Once()

	b.execute(in)
	require.True(t, b.env.IsWorkflowCompleted())
	require.NoError(t, b.env.GetWorkflowError())
	var res orders.OrderResult
	require.NoError(t, b.env.GetWorkflowResult(&res))
	require.Equal(t, orders.OrderResult{Charge: charged, Paid: paid, Receipt: sent}, res)
	pipelinetest.RequireSteps(t, []string{"Charge", "MarkPaid", "SendReceipt"}, b.started.Names())

	require.Equal(t, []pipeline.StepStatus{
		{Step: "charge", EffectKey: "acme:order:9f3a:charge", State: "done"},
		{Step: "mark_paid", EffectKey: "acme:order:9f3a:mark_paid", State: "done"},
		{Step: "receipt", EffectKey: "acme:order:9f3a:receipt", State: "done"},
	}, pipelinetest.OnlySteps(pipelinetest.Status(t, b.env), "charge", "mark_paid", "receipt"))

	// The external calls heartbeat; a killed worker is noticed within 15s.
	require.Equal(t, step.HeartbeatTimeout, b.started.Info("Charge").HeartbeatTimeout)
	require.Equal(t, step.HeartbeatTimeout, b.started.Info("SendReceipt").HeartbeatTimeout)
	require.Zero(t, b.started.Info("MarkPaid").HeartbeatTimeout)
}

func TestDeclineMarksFailedWithoutReceipt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.env.OnActivity(ordersteps.NameCharge, mock.Anything, in).
		Return(orders.ChargeResult{}, temporal.NewNonRetryableApplicationError("card declined", step.ErrTypeCardDeclined, nil)).Once()
	b.env.OnActivity(ordersteps.NameMarkFailed, mock.Anything, in).Return(markedFailed, nil).Once()

	b.execute(in)
	require.True(t, b.env.IsWorkflowCompleted())
	err := b.env.GetWorkflowError()
	var app *temporal.ApplicationError
	require.ErrorAs(t, err, &app)
	require.Equal(t, step.ErrTypeCardDeclined, app.Type(), "the run fails with the charge's error")
	require.Equal(t, []string{"Charge", "MarkFailed"}, b.started.Names(), "one charge attempt, no mark paid, no receipt")
	require.Zero(t, b.started.Info("MarkFailed").HeartbeatTimeout)

	st := pipelinetest.Status(t, b.env)
	require.Equal(t, []string{"charge=failed", "mark_paid=skipped", "receipt=skipped", "mark_failed=done"}, pipelinetest.StepStates(st))
	require.Contains(t, st[0].Error, "CardDeclined")
	require.Equal(t, "acme:order:9f3a:mark_failed", st[3].EffectKey)
}

func TestDeclineFailsWithChargeErrorWhenMarkFailedFails(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.env.OnActivity(ordersteps.NameCharge, mock.Anything, in).
		Return(orders.ChargeResult{}, temporal.NewNonRetryableApplicationError("card declined", step.ErrTypeCardDeclined, nil)).Once()
	b.env.OnActivity(ordersteps.NameMarkFailed, mock.Anything, in).
		Return(orders.MarkFailedResult{}, temporal.NewNonRetryableApplicationError("order is paid", step.ErrTypeInvalidState, nil)).Once()

	b.execute(in)
	var app *temporal.ApplicationError
	require.ErrorAs(t, b.env.GetWorkflowError(), &app)
	require.Equal(t, step.ErrTypeCardDeclined, app.Type())
	st := pipelinetest.Status(t, b.env)
	require.Equal(t, []string{"charge=failed", "mark_paid=skipped", "receipt=skipped", "mark_failed=failed"}, pipelinetest.StepStates(st))
	require.Contains(t, st[3].Error, "InvalidState")
}

func TestChargeNotFoundFailsWithoutMarkFailed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.env.OnActivity(ordersteps.NameCharge, mock.Anything, in).
		Return(orders.ChargeResult{}, temporal.NewNonRetryableApplicationError("no order", step.ErrTypeNotFound, nil))

	b.execute(in)
	require.Error(t, b.env.GetWorkflowError())
	require.NotContains(t, b.started.Names(), "MarkFailed")
	require.Equal(t, []string{"charge=failed", "mark_paid=skipped", "receipt=skipped"}, pipelinetest.States(t, b.env))
}

func TestTransientChargeIsRetried(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.env.OnActivity(ordersteps.NameCharge, mock.Anything, in).
		Return(orders.ChargeResult{}, temporal.NewApplicationError("stripe 500", step.ErrTypeTransient)).Twice()
	b.env.OnActivity(ordersteps.NameCharge, mock.Anything, in).Return(charged, nil).Once()
	b.env.OnActivity(ordersteps.NameMarkPaid, mock.Anything, in).Return(paid, nil).Once()
	b.env.OnActivity(ordersteps.NameSendReceipt, mock.Anything, in).Return(sent, nil).Once()

	b.execute(in)
	require.NoError(t, b.env.GetWorkflowError())
	pipelinetest.RequireSteps(t, []string{"Charge", "Charge", "Charge", "MarkPaid", "SendReceipt"}, b.started.Names())
}

func TestTerminalTypesAreNotRetriedEvenIfMarkedRetryable(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.env.OnActivity(ordersteps.NameCharge, mock.Anything, in).Return(charged, nil).Once()
	// The retry policy lists the terminal types, so even a retryable error
	// of such a type stops.
	b.env.OnActivity(ordersteps.NameMarkPaid, mock.Anything, in).
		Return(orders.MarkPaidResult{}, temporal.NewApplicationError("order is failed", step.ErrTypeInvalidState)).Once()

	b.execute(in)
	var app *temporal.ApplicationError
	require.ErrorAs(t, b.env.GetWorkflowError(), &app)
	require.Equal(t, step.ErrTypeInvalidState, app.Type())
	require.Equal(t, []string{"charge=done", "mark_paid=failed", "receipt=skipped"}, pipelinetest.States(t, b.env))
}

func TestUnsupportedVersionFailsBeforeAnyActivity(t *testing.T) {
	t.Parallel()
	b := setup(t)
	future := in
	future.V = 2

	b.execute(future)
	require.True(t, b.env.IsWorkflowCompleted())
	var app *temporal.ApplicationError
	require.ErrorAs(t, b.env.GetWorkflowError(), &app)
	require.Equal(t, step.ErrTypeInvalidInput, app.Type())
	require.True(t, app.NonRetryable())
	require.Contains(t, app.Error(), "unsupported input version: v=2")
	require.Empty(t, b.started.Names())
}

func TestStatusQueryWhileRunning(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.env.OnActivity(ordersteps.NameCharge, mock.Anything, in).Return(charged, nil).Once()
	b.env.OnActivity(ordersteps.NameMarkPaid, mock.Anything, in).After(time.Minute).Return(paid, nil).Once()
	b.env.OnActivity(ordersteps.NameSendReceipt, mock.Anything, in).Return(sent, nil).Once()

	var during []string
	b.env.RegisterDelayedCallback(func() { during = pipelinetest.States(t, b.env) }, 30*time.Second)
	b.execute(in)
	require.NoError(t, b.env.GetWorkflowError())
	require.Equal(t, []string{"charge=done", "mark_paid=running", "receipt=pending"}, during)
	pipelinetest.RequireSteps(t, []string{"charge=done", "mark_paid=done", "receipt=done"}, pipelinetest.States(t, b.env))
}

// TestAddedStepRunsInNewRuns: a step added behind workflow.GetVersion runs
// in a new run, after the receipt, and joins the status query.
func TestAddedStepRunsInNewRuns(t *testing.T) {
	t.Parallel()
	env := pipelinetest.NewEnv(t)
	orderflow.RegisterWithStepAfterReceipt(env, survey, "send-survey")
	require.NoError(t, step.Register(env, append(pipelinetest.Stubs([]pipeline.Spec{orderflow.Pipeline()}, nil), survey.Bind(func(context.Context, orders.OrderInput) (notify.Result, error) {
		return notify.Result{}, nil
	}))...))
	env.SetStartWorkflowOptions(client.StartWorkflowOptions{ID: in.WorkflowID()})
	env.OnActivity(ordersteps.NameCharge, mock.Anything, in).Return(charged, nil).Once()
	env.OnActivity(ordersteps.NameMarkPaid, mock.Anything, in).Return(paid, nil).Once()
	env.OnActivity(ordersteps.NameSendReceipt, mock.Anything, in).Return(sent, nil).Once()
	env.OnActivity(survey.Name, mock.Anything, in).Return(notify.Result{MessageID: "msg_2"}, nil).Once()

	env.ExecuteWorkflow(orders.WorkflowName, in)
	require.NoError(t, env.GetWorkflowError())
	env.AssertExpectations(t)
	pipelinetest.RequireSteps(t, []string{"charge=done", "mark_paid=done", "receipt=done", "survey=done"}, pipelinetest.States(t, env))
}
