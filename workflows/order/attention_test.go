package order_test

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/mock"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/log"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"

	ordersteps "github.com/keyedhq/keyed/activities/order"
	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/pipeline"
	"github.com/keyedhq/keyed/pipeline/pipelinetest"
	"github.com/keyedhq/keyed/step"
	orderflow "github.com/keyedhq/keyed/workflows/order"
)

var ambiguous = temporal.NewNonRetryableApplicationError("maybe sent", step.ErrTypeAmbiguous, nil)

// expectAttention expects KeyedAttention set to value, then cleared.
func (b *bundle) expectAttention(t *testing.T, value string) {
	t.Helper()
	got := pipelinetest.RecordAttention(b.env)
	t.Cleanup(func() { require.Equal(t, []string{value, "<unset>"}, got.Values(), "KeyedAttention set, then cleared") })
}

func TestAmbiguousReceiptWaitsForDecisionAndUsesStoredOutcome(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.env.OnActivity(ordersteps.NameCharge, mock.Anything, in).Return(charged, nil).Once()
	b.env.OnActivity(ordersteps.NameMarkPaid, mock.Anything, in).Return(paid, nil).Once()
	b.env.OnActivity(ordersteps.NameSendReceipt, mock.Anything, in).Return(orders.ReceiptResult{}, ambiguous).Once()
	b.env.OnActivity(ordersteps.NameSendReceipt, mock.Anything, in).Return(sent, nil).Once()
	applied := pipelinetest.MockApplyDecision(b.env, 3)
	b.expectAttention(t, "receipt:ambiguous")

	var during []string
	var details string
	b.env.RegisterDelayedCallback(func() {
		during = pipelinetest.States(t, b.env)
		details = pipelinetest.Details(t, b.env)
	}, time.Hour)
	u := pipelinetest.Decide(b.env, pipeline.Decision{Step: "receipt", Resolution: effects.ResolveDone, By: "ada",
		Reason: "found in SendGrid", Result: json.RawMessage(`{"message_id":"msg_123"}`)}, 2*time.Hour)
	b.execute(in)

	require.NoError(t, b.env.GetWorkflowError())
	require.NoError(t, u.Rejected)
	require.NoError(t, u.Completed)
	require.Equal(t, int64(3), u.Result.Generation)
	require.Equal(t, []string{"charge=done", "mark_paid=done", "receipt=waiting"}, during)
	require.Contains(t, details, "**Needs a decision**")
	require.Contains(t, details, "acme:order:9f3a:receipt")
	require.Contains(t, details, "pi_123", "the charge's payment intent is shown")
	require.Equal(t, "acme:order:9f3a:receipt", applied.EffectKey)
	require.Equal(t, "ada", applied.By)
	require.Equal(t, in.WorkflowID(), applied.WorkflowID)
	pipelinetest.RequireSteps(t, []string{"Charge", "MarkPaid", "SendReceipt", "ApplyDecision", "SendReceipt"}, b.started.Names())
	var res orders.OrderResult
	require.NoError(t, b.env.GetWorkflowResult(&res))
	require.Equal(t, "msg_123", res.Receipt.MessageID)
	pipelinetest.RequireSteps(t, []string{"charge=done", "mark_paid=done", "receipt=done"}, pipelinetest.States(t, b.env))
	require.Contains(t, pipelinetest.Details(t, b.env), "msg_123")
}

func TestDeclineFailsWithOneOperatorLine(t *testing.T) {
	t.Parallel()
	b := setup(t)
	declined := &step.Error{Type: step.ErrTypeCardDeclined,
		Message: "charge acme:order:9f3a:charge: create payment intent: status 402 card_error/card_declined: Your card was declined."}
	b.env.OnActivity(ordersteps.NameCharge, mock.Anything, in).
		Return(orders.ChargeResult{}, step.ToTemporal(fmt.Errorf("charge: %w", &effects.TerminalError{Code: "card_declined", Message: declined.Error()}))).Once()
	b.env.OnActivity(ordersteps.NameMarkFailed, mock.Anything, in).Return(markedFailed, nil).Once()

	b.execute(in)
	err := b.env.GetWorkflowError()
	require.Error(t, err)
	var app *temporal.ApplicationError
	require.ErrorAs(t, err, &app)
	require.Equal(t, step.ErrTypeCardDeclined, app.Type())
	require.True(t, app.NonRetryable())
	line := app.Error()
	require.NotContains(t, line, "\n")
	require.NotContains(t, line, "retryable: true")
	for _, want := range []string{"charge", "acme:order:9f3a:charge", "card_declined", "another card", "retryable: false"} {
		require.Contains(t, line, want)
	}
	require.Equal(t, 1, strings.Count(line, "Your card was declined"), "said once: %s", line)
	st := pipelinetest.Status(t, b.env)
	require.Equal(t, []string{"charge=failed", "mark_paid=skipped", "receipt=skipped", "mark_failed=done"}, pipelinetest.StepStates(st))
	require.Equal(t, 1, strings.Count(st[0].Error, "Your card was declined"), st[0].Error)
	t.Log(line)
}

func TestUndecidedChargeFailsWithoutMarkFailed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.env.OnActivity(ordersteps.NameCharge, mock.Anything, in).
		Return(orders.ChargeResult{}, temporal.NewNonRetryableApplicationError("maybe charged", step.ErrTypeAmbiguous, nil)).Once()
	b.expectAttention(t, "charge:ambiguous")

	b.execute(in)
	var app *temporal.ApplicationError
	require.ErrorAs(t, b.env.GetWorkflowError(), &app)
	require.Equal(t, pipeline.ErrTypeDecisionTimeout, app.Type())
	require.NotContains(t, b.started.Names(), ordersteps.NameMarkFailed, "the card may have been charged")
	require.Equal(t, []string{"charge=failed", "mark_paid=skipped", "receipt=skipped"}, pipelinetest.States(t, b.env))
}

// TestDecisionTimeoutIsConfigurable: a worker registered with a shorter
// decision timeout fails an undecided run after it, naming it.
func TestDecisionTimeoutIsConfigurable(t *testing.T) {
	t.Parallel()
	var suite testsuite.WorkflowTestSuite
	suite.SetLogger(log.NewStructuredLogger(slog.New(slog.DiscardHandler)))
	env := suite.NewTestWorkflowEnvironment()
	pipelinetest.Register(t, env, &pipeline.Opts{DecisionTimeout: time.Hour}, orderflow.Pipeline())
	env.SetStartWorkflowOptions(client.StartWorkflowOptions{ID: in.WorkflowID()})
	env.OnActivity(ordersteps.NameCharge, mock.Anything, in).
		Return(orders.ChargeResult{}, temporal.NewNonRetryableApplicationError("maybe charged", step.ErrTypeAmbiguous, nil)).Once()
	env.OnUpsertTypedSearchAttributes(mock.Anything).Return(nil)

	env.ExecuteWorkflow(orders.WorkflowName, in)
	var app *temporal.ApplicationError
	require.ErrorAs(t, env.GetWorkflowError(), &app)
	require.Equal(t, pipeline.ErrTypeDecisionTimeout, app.Type())
	require.Contains(t, app.Error(), "no operator decision within 1h0m0s")
}
