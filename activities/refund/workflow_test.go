package refund_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/log"
	"go.temporal.io/sdk/testsuite"

	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/pipeline"
	"github.com/keyedhq/keyed/refunds"
	"github.com/keyedhq/keyed/step"
	refundflow "github.com/keyedhq/keyed/workflows/refund"
)

// runWorkflow runs RefundWorkflow on in in the SDK's test environment, with
// b's real activities.
func (b *bundle) runWorkflow(t *testing.T, in refunds.RefundInput) (refunds.Result, error) {
	t.Helper()
	res, _, err := b.runWorkflowStatus(t, in)
	return res, err
}

// runWorkflowStatus is runWorkflow, also returning the status query's
// answer after the run.
func (b *bundle) runWorkflowStatus(t *testing.T, in refunds.RefundInput) (refunds.Result, []pipeline.StepStatus, error) {
	t.Helper()
	var suite testsuite.WorkflowTestSuite
	suite.SetLogger(log.NewStructuredLogger(quiet()))
	env := suite.NewTestWorkflowEnvironment()
	require.NoError(t, pipeline.Register(env, []pipeline.Spec{refundflow.Pipeline()}, b.deps, nil))
	env.ExecuteWorkflow(refunds.WorkflowName, in)
	require.True(t, env.IsWorkflowCompleted())
	var status []pipeline.StepStatus // none when the run refused its input before registering the query
	if val, err := env.QueryWorkflow(pipeline.QueryStatus); err == nil {
		require.NoError(t, val.Get(&status))
	}
	var res refunds.Result
	if err := env.GetWorkflowError(); err != nil {
		return res, status, err
	}
	require.NoError(t, env.GetWorkflowResult(&res))
	return res, status, nil
}

func TestRefundWorkflowRefundsInPart(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.order(t, "o1", "pm_card_visa")
	res, status, err := b.runWorkflowStatus(t, refunds.NewInput(tenant, "o1", "r1", 250, ""))
	require.NoError(t, err)
	require.Len(t, status, 4)
	for _, s := range status {
		require.Equal(t, pipeline.StateDone, s.State, s.Step)
	}
	require.Equal(t, refunds.ReserveResult{AmountMinor: 250, Currency: "eur", RefundedMinor: 250, ChargedMinor: amount}, res.Reserve)
	require.Equal(t, "succeeded", res.Stripe.Status)
	require.Equal(t, string(orders.StatusPartiallyRefunded), res.Mark.Status)
	require.NotEmpty(t, res.Email.MessageID)
	require.Equal(t, orders.StatusPartiallyRefunded, b.status(t, "o1"))
}

// A refused reservation ends the run: no Stripe call, no status change, no
// email.
func TestRefundWorkflowStopsAtARefusedReservation(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.order(t, "o1", "pm_card_visa")
	_, status, err := b.runWorkflowStatus(t, refunds.NewInput(tenant, "o1", "r1", amount+1, ""))
	requireTerminal(t, err, step.ErrTypeInvalidState)
	require.Len(t, status, 4)
	states := []string{}
	for _, s := range status {
		states = append(states, s.Step+":"+s.State)
	}
	require.Equal(t, []string{"refund_reserve:failed", "refund_stripe:skipped", "refund_mark:skipped", "refund_email:skipped"}, states)
	require.Equal(t, "acme:order:o1:refund:r1:refund_reserve", status[0].EffectKey)
	require.Contains(t, err.Error(), "exceeds what is left of the charge")
	require.Zero(t, b.stripe.Refunds())
	require.Zero(t, b.sendgrid.Count())
	require.Equal(t, orders.StatusPaid, b.status(t, "o1"))
}

func TestRefundWorkflowRefusesABadInput(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := b.runWorkflow(t, refunds.NewInput(tenant, "o1", "r:1", 100, ""))
	requireTerminal(t, err, step.ErrTypeInvalidInput)
	_, err = b.runWorkflow(t, refunds.NewInput(tenant, "o1", "r1", 0, ""))
	requireTerminal(t, err, step.ErrTypeInvalidInput)
}
