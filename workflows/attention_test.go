package workflows_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/mock"
	"github.com/stretchr/testify/require"
	sdkpb "go.temporal.io/api/sdk/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/log"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"

	"github.com/keyedhq/keyed/activities"
	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/pipeline"
	"github.com/keyedhq/keyed/workflows"
)

var ambiguous = temporal.NewNonRetryableApplicationError("maybe sent", activities.ErrTypeAmbiguous, nil)

// update sends the decide update at the workflow clock's time after and
// records whether the validator rejected it and what it returned.
type update struct {
	rejected, completed error
	result              pipeline.DecisionResult
}

func (b *bundle) decide(after time.Duration, d pipeline.Decision) *update {
	u := &update{}
	b.env.RegisterDelayedCallback(func() {
		b.env.UpdateWorkflow(pipeline.UpdateDecide, "", &testsuite.TestUpdateCallback{
			OnAccept: func() {},
			OnReject: func(err error) { u.rejected = err },
			OnComplete: func(res any, err error) {
				u.completed = err
				if r, ok := res.(pipeline.DecisionResult); ok {
					u.result = r
				}
			},
		}, d)
	}, after)
	return u
}

// expectAttention expects KeyedAttention set to value, then cleared.
func (b *bundle) expectAttention(t *testing.T, value string) {
	t.Helper()
	var got []string
	b.env.OnUpsertTypedSearchAttributes(mock.Anything).Run(func(args mock.Arguments) {
		sa := args.Get(0).(temporal.SearchAttributes)
		v, ok := sa.GetKeyword(pipeline.SearchAttrAttention)
		if !ok {
			v = "<unset>"
		}
		got = append(got, v)
	}).Return(nil).Twice()
	t.Cleanup(func() { require.Equal(t, []string{value, "<unset>"}, got, "KeyedAttention set, then cleared") })
}

func TestAmbiguousReceiptWaitsForDecisionAndUsesStoredOutcome(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.env.OnActivity(activities.NameCharge, mock.Anything, in).Return(charged, nil).Once()
	b.env.OnActivity(activities.NameMarkPaid, mock.Anything, in).Return(paid, nil).Once()
	b.env.OnActivity(activities.NameSendReceipt, mock.Anything, in).Return(orders.ReceiptResult{}, ambiguous).Once()
	b.env.OnActivity(activities.NameSendReceipt, mock.Anything, in).Return(sent, nil).Once()
	var applied pipeline.DecisionInput
	b.env.OnActivity(pipeline.NameApplyDecision, mock.Anything, mock.Anything).Return(
		func(_ context.Context, di pipeline.DecisionInput) (pipeline.DecisionResult, error) {
			applied = di
			return pipeline.DecisionResult{Step: di.Step, EffectKey: di.EffectKey, Resolution: string(di.Resolution), State: "succeeded", Generation: 3}, nil
		}).Once()
	b.expectAttention(t, "receipt:ambiguous")

	var during []string
	var details string
	b.env.RegisterDelayedCallback(func() {
		during = states(b.status(t))
		details = b.currentDetails(t)
	}, time.Hour)
	u := b.decide(2*time.Hour, pipeline.Decision{Step: "receipt", Resolution: effects.ResolveDone, By: "ada",
		Reason: "found in SendGrid", Result: json.RawMessage(`{"message_id":"msg_123"}`)})
	b.env.ExecuteWorkflow(orders.WorkflowName, in)

	require.NoError(t, b.env.GetWorkflowError())
	require.NoError(t, u.rejected)
	require.NoError(t, u.completed)
	require.Equal(t, int64(3), u.result.Generation)
	require.Equal(t, []string{"charge=done", "mark_paid=done", "receipt=waiting"}, during)
	require.Contains(t, details, "**Needs a decision**")
	require.Contains(t, details, "acme:order:9f3a:receipt")
	require.Contains(t, details, "pi_123", "the charge's payment intent is shown")
	require.Equal(t, "acme:order:9f3a:receipt", applied.EffectKey)
	require.Equal(t, "ada", applied.By)
	require.Equal(t, in.WorkflowID(), applied.WorkflowID)
	require.Equal(t, []string{"Charge", "MarkPaid", "SendReceipt", "ApplyDecision", "SendReceipt"}, b.started)
	var res orders.OrderResult
	require.NoError(t, b.env.GetWorkflowResult(&res))
	require.Equal(t, "msg_123", res.Receipt.MessageID)
	require.Equal(t, []string{"charge=done", "mark_paid=done", "receipt=done"}, states(b.status(t)))
	require.Contains(t, b.currentDetails(t), "msg_123")
}

func (b *bundle) currentDetails(t *testing.T) string {
	t.Helper()
	val, err := b.env.QueryWorkflow("__temporal_workflow_metadata")
	require.NoError(t, err)
	var md sdkpb.WorkflowMetadata
	require.NoError(t, val.Get(&md))
	return md.GetCurrentDetails()
}

func TestDeclineFailsWithOneOperatorLine(t *testing.T) {
	t.Parallel()
	b := setup(t)
	declined := &activities.Error{Type: activities.ErrTypeCardDeclined,
		Message: "charge acme:order:9f3a:charge: create payment intent: status 402 card_error/card_declined: Your card was declined."}
	b.env.OnActivity(activities.NameCharge, mock.Anything, in).
		Return(orders.ChargeResult{}, activities.ToTemporal(fmt.Errorf("charge: %w", &effects.TerminalError{Code: "card_declined", Message: declined.Error()}))).Once()
	b.env.OnActivity(activities.NameMarkFailed, mock.Anything, in).Return(markedFailed, nil).Once()

	b.env.ExecuteWorkflow(orders.WorkflowName, in)
	err := b.env.GetWorkflowError()
	require.Error(t, err)
	var app *temporal.ApplicationError
	require.ErrorAs(t, err, &app)
	require.Equal(t, activities.ErrTypeCardDeclined, app.Type())
	require.True(t, app.NonRetryable())
	line := app.Error()
	require.NotContains(t, line, "\n")
	require.NotContains(t, line, "retryable: true")
	for _, want := range []string{"charge", "acme:order:9f3a:charge", "card_declined", "another card", "retryable: false"} {
		require.Contains(t, line, want)
	}
	require.Equal(t, 1, strings.Count(line, "Your card was declined"), "said once: %s", line)
	st := b.status(t)
	require.Equal(t, []string{"charge=failed", "mark_paid=skipped", "receipt=skipped", "mark_failed=done"}, states(st))
	require.Equal(t, 1, strings.Count(st[0].Error, "Your card was declined"), st[0].Error)
	t.Log(line)
}

func TestUndecidedChargeFailsWithoutMarkFailed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.env.OnActivity(activities.NameCharge, mock.Anything, in).
		Return(orders.ChargeResult{}, temporal.NewNonRetryableApplicationError("maybe charged", activities.ErrTypeAmbiguous, nil)).Once()
	b.expectAttention(t, "charge:ambiguous")

	b.env.ExecuteWorkflow(orders.WorkflowName, in)
	var app *temporal.ApplicationError
	require.ErrorAs(t, b.env.GetWorkflowError(), &app)
	require.Equal(t, pipeline.ErrTypeDecisionTimeout, app.Type())
	require.NotContains(t, b.started, activities.NameMarkFailed, "the card may have been charged")
	require.Equal(t, []string{"charge=failed", "mark_paid=skipped", "receipt=skipped"}, states(b.status(t)))
}

// TestDecisionTimeoutIsConfigurable: a worker registered with a shorter
// decision timeout fails an undecided run after it, naming it.
func TestDecisionTimeoutIsConfigurable(t *testing.T) {
	t.Parallel()
	var suite testsuite.WorkflowTestSuite
	suite.SetLogger(log.NewStructuredLogger(slog.New(slog.DiscardHandler)))
	env := suite.NewTestWorkflowEnvironment()
	workflows.RegisterWithOpts(env, &workflows.WorkflowOpts{DecisionTimeout: time.Hour})
	var a *activities.Activities
	var d *pipeline.Decider
	require.NoError(t, activities.Register(env, append(a.Definitions(), d.Definition())...))
	env.SetStartWorkflowOptions(client.StartWorkflowOptions{ID: in.WorkflowID()})
	env.OnActivity(activities.NameCharge, mock.Anything, in).
		Return(orders.ChargeResult{}, temporal.NewNonRetryableApplicationError("maybe charged", activities.ErrTypeAmbiguous, nil)).Once()
	env.OnUpsertTypedSearchAttributes(mock.Anything).Return(nil)

	env.ExecuteWorkflow(orders.WorkflowName, in)
	var app *temporal.ApplicationError
	require.ErrorAs(t, env.GetWorkflowError(), &app)
	require.Equal(t, pipeline.ErrTypeDecisionTimeout, app.Type())
	require.Contains(t, app.Error(), "no operator decision within 1h0m0s")
}
