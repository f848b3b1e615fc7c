package refund_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/mock"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"

	refundsteps "github.com/keyedhq/keyed/activities/refund"
	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/pipeline"
	"github.com/keyedhq/keyed/pipeline/pipelinetest"
	"github.com/keyedhq/keyed/refunds"
	"github.com/keyedhq/keyed/step"
	refundflow "github.com/keyedhq/keyed/workflows/refund"
)

const (
	tenant = "acme"
	amount = 1250
)

var (
	refundIn = refunds.NewInput(tenant, "o1", "r1", 500, "damaged")
	reserved = refunds.ReserveResult{AmountMinor: 500, Currency: "eur", RefundedMinor: 500, ChargedMinor: amount}
	refunded = refunds.StripeResult{RefundID: "re_1", PaymentIntentID: "pi_1", Status: "succeeded", AmountMinor: 500, Currency: "eur"}
	marked   = refunds.MarkResult{Status: string(orders.StatusPartiallyRefunded)}
	emailed  = refunds.EmailResult{MessageID: "msg_1"}
)

// mockedRun is RefundWorkflow in the SDK's test environment with every
// activity mocked (no database), and what it saw.
type mockedRun struct {
	env       *testsuite.TestWorkflowEnvironment
	started   *pipelinetest.Started
	attention *pipelinetest.Attention
}

// newMockedRun registers the refund workflow with opts and its activities
// and ApplyDecision by name only: each test mocks them with OnActivity.
func newMockedRun(t *testing.T, opts *pipeline.Opts) *mockedRun {
	t.Helper()
	m := &mockedRun{env: pipelinetest.NewEnv(t)}
	pipelinetest.Register(t, m.env, opts, refundflow.Pipeline())
	m.env.SetStartWorkflowOptions(client.StartWorkflowOptions{ID: refundIn.WorkflowID()})
	m.started = pipelinetest.RecordStarted(m.env)
	m.attention = pipelinetest.RecordAttention(m.env)
	return m
}

// execute runs the refund workflow on refundIn, every step the test did
// not mock succeeding.
func (m *mockedRun) execute() {
	pipelinetest.MockRest(m.env, refundflow.Pipeline())
	m.env.ExecuteWorkflow(refunds.WorkflowName, refundIn)
}

// An ambiguous refund email waits for a decision instead of failing the
// refund; "done" stores SendGrid's message as the outcome and the email
// step, run again, returns it.
func TestAmbiguousRefundEmailWaitsForADecision(t *testing.T) {
	t.Parallel()
	m := newMockedRun(t, nil)
	ambiguous := temporal.NewNonRetryableApplicationError("maybe sent", step.ErrTypeAmbiguous, nil)
	m.env.OnActivity(refundsteps.NameReserve, mock.Anything, refundIn).Return(reserved, nil).Once()
	m.env.OnActivity(refundsteps.NameRefundAtStripe, mock.Anything, refundIn).Return(refunded, nil).Once()
	m.env.OnActivity(refundsteps.NameMarkRefunded, mock.Anything, refundIn).Return(marked, nil).Once()
	m.env.OnActivity(refundsteps.NameSendRefundEmail, mock.Anything, refundIn).Return(refunds.EmailResult{}, ambiguous).Once()
	m.env.OnActivity(refundsteps.NameSendRefundEmail, mock.Anything, refundIn).Return(emailed, nil).Once()
	applied := pipelinetest.MockApplyDecision(m.env, 0)

	var during []string
	var details string
	m.env.RegisterDelayedCallback(func() { during, details = pipelinetest.States(t, m.env), pipelinetest.Details(t, m.env) }, time.Hour)
	decided := pipelinetest.Decide(m.env, pipeline.Decision{Step: refunds.StepEmail, Resolution: effects.ResolveDone, By: "ada",
		Reason: "found in SendGrid", Result: json.RawMessage(`{"message_id":"msg_1"}`)}, 2*time.Hour)
	m.execute()

	require.NoError(t, m.env.GetWorkflowError())
	require.NoError(t, decided.Err())
	require.Equal(t, []string{"refund_email:ambiguous", "<unset>"}, m.attention.Values(), "KeyedAttention set, then cleared")
	require.Equal(t, []string{"refund_reserve=done", "refund_stripe=done", "refund_mark=done", "refund_email=waiting"}, during)
	require.Contains(t, details, "**Needs a decision**")
	require.Contains(t, details, "`re_1`", "the Stripe refund is shown")
	require.Equal(t, "acme:order:o1:refund:r1:refund_email", applied.EffectKey)
	require.Equal(t, refundIn.WorkflowID(), applied.WorkflowID)
	require.Equal(t, []string{refundsteps.NameReserve, refundsteps.NameRefundAtStripe, refundsteps.NameMarkRefunded, refundsteps.NameSendRefundEmail,
		pipeline.NameApplyDecision, refundsteps.NameSendRefundEmail}, m.started.Names())
	var res refunds.Result
	require.NoError(t, m.env.GetWorkflowResult(&res))
	require.Equal(t, emailed, res.Email)
	require.Equal(t, []string{"refund_reserve=done", "refund_stripe=done", "refund_mark=done", "refund_email=done"}, pipelinetest.States(t, m.env))
}

// A refund at Stripe whose retries ran out waits; with no decision within
// the decision timeout the run fails with DecisionTimeout, and the later
// steps never run.
func TestUndecidedRefundFailsAfterTheDecisionTimeout(t *testing.T) {
	t.Parallel()
	m := newMockedRun(t, &pipeline.Opts{DecisionTimeout: time.Hour})
	m.env.OnActivity(refundsteps.NameReserve, mock.Anything, refundIn).Return(reserved, nil).Once()
	m.env.OnActivity(refundsteps.NameRefundAtStripe, mock.Anything, refundIn).
		Return(refunds.StripeResult{}, temporal.NewApplicationError("stripe 500", step.ErrTypeTransient))

	m.execute()
	var app *temporal.ApplicationError
	require.ErrorAs(t, m.env.GetWorkflowError(), &app)
	require.Equal(t, pipeline.ErrTypeDecisionTimeout, app.Type())
	require.True(t, app.NonRetryable())
	require.Contains(t, app.Error(), "no operator decision within 1h0m0s")
	require.Contains(t, app.Error(), "acme:order:o1:refund:r1:refund_stripe")
	require.Equal(t, []string{"refund_stripe:retries_exhausted", "<unset>"}, m.attention.Values())
	require.NotContains(t, m.started.Names(), pipeline.NameApplyDecision)
	require.NotContains(t, m.started.Names(), refundsteps.NameMarkRefunded)
	require.Equal(t, []string{"refund_reserve=done", "refund_stripe=failed", "refund_mark=skipped", "refund_email=skipped"}, pipelinetest.States(t, m.env))
}

// Stripe's refusal is a known outcome: the run releases the reservation,
// then fails with the Stripe step's one line, and waits for nobody.
func TestStripeRefusalFailsTheRefundWithoutWaiting(t *testing.T) {
	t.Parallel()
	m := newMockedRun(t, nil)
	m.env.OnActivity(refundsteps.NameReserve, mock.Anything, refundIn).Return(reserved, nil).Once()
	m.env.OnActivity(refundsteps.NameRefundAtStripe, mock.Anything, refundIn).Return(refunds.StripeResult{},
		temporal.NewNonRetryableApplicationError("refund_stripe: charge already refunded", step.ErrTypeProviderRejected, nil)).Once()
	m.env.OnActivity(refundsteps.NameReleaseRefund, mock.Anything, refundIn).
		Return(refunds.ReleaseResult{AmountMinor: 500, Code: "charge_already_refunded"}, nil).Once()

	m.execute()
	var app *temporal.ApplicationError
	require.ErrorAs(t, m.env.GetWorkflowError(), &app)
	require.Equal(t, step.ErrTypeProviderRejected, app.Type())
	require.Contains(t, app.Error(), "charge already refunded")
	require.Empty(t, m.attention.Values(), "no KeyedAttention")
	require.Equal(t, []string{"refund_reserve=done", "refund_stripe=failed", "refund_mark=skipped", "refund_email=skipped",
		"refund_release=done"}, pipelinetest.States(t, m.env))
	require.Equal(t, []string{refundsteps.NameReserve, refundsteps.NameRefundAtStripe, refundsteps.NameReleaseRefund}, m.started.Names())
}

// A refund at Stripe whose outcome is unknown, undecided, is not released:
// Stripe may have refunded it.
func TestUndecidedRefundIsNotReleased(t *testing.T) {
	t.Parallel()
	m := newMockedRun(t, &pipeline.Opts{DecisionTimeout: time.Hour})
	m.env.OnActivity(refundsteps.NameReserve, mock.Anything, refundIn).Return(reserved, nil).Once()
	m.env.OnActivity(refundsteps.NameRefundAtStripe, mock.Anything, refundIn).Return(refunds.StripeResult{},
		temporal.NewNonRetryableApplicationError("refund_stripe: idempotency_error", step.ErrTypeKeyReused, nil))

	m.execute()
	var app *temporal.ApplicationError
	require.ErrorAs(t, m.env.GetWorkflowError(), &app)
	require.Equal(t, pipeline.ErrTypeDecisionTimeout, app.Type())
	require.NotContains(t, m.started.Names(), refundsteps.NameReleaseRefund)
}
