package refunds_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/log"
	"go.temporal.io/sdk/testsuite"

	"github.com/keyedhq/keyed/activities"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/refunds"
)

// runWorkflow runs RefundWorkflow on in in the SDK's test environment, with
// b's real activities.
func (b *bundle) runWorkflow(t *testing.T, in refunds.RefundInput) (refunds.Result, error) {
	t.Helper()
	var suite testsuite.WorkflowTestSuite
	suite.SetLogger(log.NewStructuredLogger(quiet()))
	env := suite.NewTestWorkflowEnvironment()
	refunds.Register(env)
	require.NoError(t, refunds.RegisterActivities(env, b.racts))
	env.ExecuteWorkflow(refunds.WorkflowName, in)
	require.True(t, env.IsWorkflowCompleted())
	var res refunds.Result
	if err := env.GetWorkflowError(); err != nil {
		return res, err
	}
	require.NoError(t, env.GetWorkflowResult(&res))
	return res, nil
}

func TestRefundWorkflowRefundsInPart(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.order(t, "o1", "pm_card_visa")
	res, err := b.runWorkflow(t, refunds.NewInput(tenant, "o1", "r1", 250, ""))
	require.NoError(t, err)
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
	_, err := b.runWorkflow(t, refunds.NewInput(tenant, "o1", "r1", amount+1, ""))
	requireTerminal(t, err, activities.ErrTypeInvalidState)
	require.Contains(t, err.Error(), "exceeds what is left of the charge")
	require.Zero(t, b.stripe.Refunds())
	require.Zero(t, b.sendgrid.Count())
	require.Equal(t, orders.StatusPaid, b.status(t, "o1"))
}

func TestRefundWorkflowRefusesABadInput(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := b.runWorkflow(t, refunds.NewInput(tenant, "o1", "r:1", 100, ""))
	requireTerminal(t, err, activities.ErrTypeInvalidInput)
	_, err = b.runWorkflow(t, refunds.NewInput(tenant, "o1", "r1", 0, ""))
	requireTerminal(t, err, activities.ErrTypeInvalidInput)
}
