package refunds_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/mock"
	"github.com/stretchr/testify/require"
	sdkpb "go.temporal.io/api/sdk/v1"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/log"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"

	"github.com/keyedhq/keyed/activities"
	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/pipeline"
	"github.com/keyedhq/keyed/refunds"
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
	started   []string
	attention []string
}

// newMockedRun registers the refund workflow with opts and its activities
// and ApplyDecision by name only: each test mocks them with OnActivity.
func newMockedRun(t *testing.T, opts *pipeline.Opts) *mockedRun {
	t.Helper()
	var suite testsuite.WorkflowTestSuite
	suite.SetLogger(log.NewStructuredLogger(quiet()))
	m := &mockedRun{env: suite.NewTestWorkflowEnvironment()}
	refunds.RegisterWithOpts(m.env, opts)
	var racts *refunds.Activities
	var d *pipeline.Decider
	require.NoError(t, activities.Register(m.env, append(racts.Definitions(), d.Definition())...))
	m.env.SetStartWorkflowOptions(client.StartWorkflowOptions{ID: refundIn.WorkflowID()})
	m.env.SetOnActivityStartedListener(func(info *activity.Info, _ context.Context, _ converter.EncodedValues) {
		m.started = append(m.started, info.ActivityType.Name)
	})
	m.env.OnUpsertTypedSearchAttributes(mock.Anything).Run(func(args mock.Arguments) {
		v, ok := args.Get(0).(temporal.SearchAttributes).GetKeyword(pipeline.SearchAttrAttention)
		if !ok {
			v = "<unset>"
		}
		m.attention = append(m.attention, v)
	}).Return(nil).Maybe()
	t.Cleanup(func() { m.env.AssertExpectations(t) })
	return m
}

func (m *mockedRun) states(t *testing.T) []string {
	t.Helper()
	val, err := m.env.QueryWorkflow(orders.QueryStatus)
	require.NoError(t, err)
	var st []orders.StepStatus
	require.NoError(t, val.Get(&st))
	var out []string
	for _, s := range st {
		out = append(out, s.Step+"="+s.State)
	}
	return out
}

func (m *mockedRun) details(t *testing.T) string {
	t.Helper()
	val, err := m.env.QueryWorkflow("__temporal_workflow_metadata")
	require.NoError(t, err)
	var md sdkpb.WorkflowMetadata
	require.NoError(t, val.Get(&md))
	return md.GetCurrentDetails()
}

// An ambiguous refund email waits for a decision instead of failing the
// refund; "done" stores SendGrid's message as the outcome and the email
// step, run again, returns it.
func TestAmbiguousRefundEmailWaitsForADecision(t *testing.T) {
	t.Parallel()
	m := newMockedRun(t, nil)
	ambiguous := temporal.NewNonRetryableApplicationError("maybe sent", activities.ErrTypeAmbiguous, nil)
	m.env.OnActivity(refunds.NameReserve, mock.Anything, refundIn).Return(reserved, nil).Once()
	m.env.OnActivity(refunds.NameRefundAtStripe, mock.Anything, refundIn).Return(refunded, nil).Once()
	m.env.OnActivity(refunds.NameMarkRefunded, mock.Anything, refundIn).Return(marked, nil).Once()
	m.env.OnActivity(refunds.NameSendRefundEmail, mock.Anything, refundIn).Return(refunds.EmailResult{}, ambiguous).Once()
	m.env.OnActivity(refunds.NameSendRefundEmail, mock.Anything, refundIn).Return(emailed, nil).Once()
	var applied pipeline.DecisionInput
	m.env.OnActivity(pipeline.NameApplyDecision, mock.Anything, mock.Anything).Return(
		func(_ context.Context, di pipeline.DecisionInput) (pipeline.DecisionResult, error) {
			applied = di
			return pipeline.DecisionResult{Step: di.Step, EffectKey: di.EffectKey, Resolution: string(di.Resolution), State: "succeeded"}, nil
		}).Once()

	var during []string
	var details string
	m.env.RegisterDelayedCallback(func() { during, details = m.states(t), m.details(t) }, time.Hour)
	var decided error
	m.env.RegisterDelayedCallback(func() {
		m.env.UpdateWorkflow(pipeline.UpdateDecide, "", &testsuite.TestUpdateCallback{
			OnAccept: func() {}, OnReject: func(err error) { decided = err },
			OnComplete: func(_ any, err error) { decided = err },
		}, pipeline.Decision{Step: refunds.StepEmail, Resolution: effects.ResolveDone, By: "ada", Reason: "found in SendGrid",
			Result: json.RawMessage(`{"message_id":"msg_1"}`)})
	}, 2*time.Hour)
	m.env.ExecuteWorkflow(refunds.WorkflowName, refundIn)

	require.NoError(t, m.env.GetWorkflowError())
	require.NoError(t, decided)
	require.Equal(t, []string{"refund_email:ambiguous", "<unset>"}, m.attention, "KeyedAttention set, then cleared")
	require.Equal(t, []string{"refund_reserve=done", "refund_stripe=done", "refund_mark=done", "refund_email=waiting"}, during)
	require.Contains(t, details, "**Needs a decision**")
	require.Contains(t, details, "`re_1`", "the Stripe refund is shown")
	require.Equal(t, "acme:order:o1:refund:r1:refund_email", applied.EffectKey)
	require.Equal(t, refundIn.WorkflowID(), applied.WorkflowID)
	require.Equal(t, []string{refunds.NameReserve, refunds.NameRefundAtStripe, refunds.NameMarkRefunded, refunds.NameSendRefundEmail,
		pipeline.NameApplyDecision, refunds.NameSendRefundEmail}, m.started)
	var res refunds.Result
	require.NoError(t, m.env.GetWorkflowResult(&res))
	require.Equal(t, emailed, res.Email)
	require.Equal(t, []string{"refund_reserve=done", "refund_stripe=done", "refund_mark=done", "refund_email=done"}, m.states(t))
}

// A refund at Stripe whose retries ran out waits; with no decision within
// the decision timeout the run fails with DecisionTimeout, and the later
// steps never run.
func TestUndecidedRefundFailsAfterTheDecisionTimeout(t *testing.T) {
	t.Parallel()
	m := newMockedRun(t, &pipeline.Opts{DecisionTimeout: time.Hour})
	m.env.OnActivity(refunds.NameReserve, mock.Anything, refundIn).Return(reserved, nil).Once()
	m.env.OnActivity(refunds.NameRefundAtStripe, mock.Anything, refundIn).
		Return(refunds.StripeResult{}, temporal.NewApplicationError("stripe 500", activities.ErrTypeTransient))

	m.env.ExecuteWorkflow(refunds.WorkflowName, refundIn)
	var app *temporal.ApplicationError
	require.ErrorAs(t, m.env.GetWorkflowError(), &app)
	require.Equal(t, pipeline.ErrTypeDecisionTimeout, app.Type())
	require.True(t, app.NonRetryable())
	require.Contains(t, app.Error(), "no operator decision within 1h0m0s")
	require.Contains(t, app.Error(), "acme:order:o1:refund:r1:refund_stripe")
	require.Equal(t, []string{"refund_stripe:retries_exhausted", "<unset>"}, m.attention)
	require.NotContains(t, m.started, pipeline.NameApplyDecision)
	require.NotContains(t, m.started, refunds.NameMarkRefunded)
	require.Equal(t, []string{"refund_reserve=done", "refund_stripe=failed", "refund_mark=skipped", "refund_email=skipped"}, m.states(t))
}

// Stripe's refusal is a known outcome: the run releases the reservation,
// then fails with the Stripe step's one line, and waits for nobody.
func TestStripeRefusalFailsTheRefundWithoutWaiting(t *testing.T) {
	t.Parallel()
	m := newMockedRun(t, nil)
	m.env.OnActivity(refunds.NameReserve, mock.Anything, refundIn).Return(reserved, nil).Once()
	m.env.OnActivity(refunds.NameRefundAtStripe, mock.Anything, refundIn).Return(refunds.StripeResult{},
		temporal.NewNonRetryableApplicationError("refund_stripe: charge already refunded", activities.ErrTypeProviderRejected, nil)).Once()
	m.env.OnActivity(refunds.NameReleaseRefund, mock.Anything, refundIn).
		Return(refunds.ReleaseResult{AmountMinor: 500, Code: "charge_already_refunded"}, nil).Once()

	m.env.ExecuteWorkflow(refunds.WorkflowName, refundIn)
	var app *temporal.ApplicationError
	require.ErrorAs(t, m.env.GetWorkflowError(), &app)
	require.Equal(t, activities.ErrTypeProviderRejected, app.Type())
	require.Contains(t, app.Error(), "charge already refunded")
	require.Empty(t, m.attention, "no KeyedAttention")
	require.Equal(t, []string{"refund_reserve=done", "refund_stripe=failed", "refund_mark=skipped", "refund_email=skipped",
		"refund_release=done"}, m.states(t))
	require.Equal(t, []string{refunds.NameReserve, refunds.NameRefundAtStripe, refunds.NameReleaseRefund}, m.started)
}

// A refund at Stripe whose outcome is unknown, undecided, is not released:
// Stripe may have refunded it.
func TestUndecidedRefundIsNotReleased(t *testing.T) {
	t.Parallel()
	m := newMockedRun(t, &pipeline.Opts{DecisionTimeout: time.Hour})
	m.env.OnActivity(refunds.NameReserve, mock.Anything, refundIn).Return(reserved, nil).Once()
	m.env.OnActivity(refunds.NameRefundAtStripe, mock.Anything, refundIn).Return(refunds.StripeResult{},
		temporal.NewNonRetryableApplicationError("refund_stripe: idempotency_error", activities.ErrTypeKeyReused, nil))

	m.env.ExecuteWorkflow(refunds.WorkflowName, refundIn)
	var app *temporal.ApplicationError
	require.ErrorAs(t, m.env.GetWorkflowError(), &app)
	require.Equal(t, pipeline.ErrTypeDecisionTimeout, app.Type())
	require.NotContains(t, m.started, refunds.NameReleaseRefund)
}
