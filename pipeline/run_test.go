package pipeline_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
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
	"go.temporal.io/sdk/workflow"

	"github.com/keyedhq/keyed/activities"
	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/notify"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/pipeline"
)

// A pipeline of keyed's own, as a user would write one: a shipment buys a
// label, then tells the customer.
type shipInput struct {
	TenantID   string `json:"tenant_id"`
	ShipmentID string `json:"shipment_id"`
}

func (in shipInput) EffectKey(step string) (effects.Key, error) {
	return effects.NewKey(in.TenantID, "shipment", in.ShipmentID, step)
}

type label struct {
	LabelID string `json:"label_id"`
}

type notified struct {
	MessageID string `json:"message_id"`
}

type shipResult struct {
	Label    label    `json:"label"`
	Notified notified `json:"notified"`
}

var (
	ship       = shipInput{TenantID: "acme", ShipmentID: "s1"}
	declLabel  = activities.Declaration{Name: "BuyLabel", Class: effects.ClassExternalCreate, Step: "label"}
	declNotify = activities.Declaration{Name: "NotifyShipped", Class: effects.ClassIrreversibleSend, Step: "notify", Policy: notify.AtMostOnce}
	bought     = label{LabelID: "lbl--1"}
	told       = notified{MessageID: "msg_1"}
	ambiguous  = temporal.NewNonRetryableApplicationError("maybe sent", activities.ErrTypeAmbiguous, nil)
)

const shipWorkflowName = "ShipWorkflow"

// shipWorkflow runs the two steps through a pipeline.Run.
func shipWorkflow(ctx workflow.Context, in shipInput, opts *pipeline.Opts) (shipResult, error) {
	var out shipResult
	r, err := pipeline.New(ctx, in, []activities.Declaration{declLabel, declNotify}, opts)
	if err != nil {
		return out, err
	}
	if err := pipeline.RunStep(ctx, r, declLabel, &out.Label, func(l label) string { return l.LabelID }); err != nil {
		return out, err
	}
	if err := pipeline.RunStep(ctx, r, declNotify, &out.Notified, func(n notified) string { return n.MessageID }); err != nil {
		return out, err
	}
	r.ShowDetails(ctx)
	return out, nil
}

// bundle is a test environment with shipWorkflow, its activities and
// ApplyDecision registered by name (each test mocks them), what started,
// and each value KeyedAttention was set to ("<unset>" when cleared).
type bundle struct {
	env       *testsuite.TestWorkflowEnvironment
	started   []string
	attention []string
}

func setup(t *testing.T, opts *pipeline.Opts) *bundle {
	t.Helper()
	var suite testsuite.WorkflowTestSuite
	suite.SetLogger(log.NewStructuredLogger(slog.New(slog.DiscardHandler)))
	b := &bundle{env: suite.NewTestWorkflowEnvironment()}
	b.env.RegisterWorkflowWithOptions(func(ctx workflow.Context, in shipInput) (shipResult, error) {
		return shipWorkflow(ctx, in, opts)
	}, workflow.RegisterOptions{Name: shipWorkflowName})
	var d *pipeline.Decider
	require.NoError(t, activities.Register(b.env,
		declLabel.Bind(func(context.Context, shipInput) (label, error) { return label{}, nil }),
		declNotify.Bind(func(context.Context, shipInput) (notified, error) { return notified{}, nil }),
		d.Definition()))
	b.env.SetStartWorkflowOptions(client.StartWorkflowOptions{ID: "shipment:acme:s1"})
	b.env.SetOnActivityStartedListener(func(info *activity.Info, _ context.Context, _ converter.EncodedValues) {
		b.started = append(b.started, info.ActivityType.Name)
	})
	b.env.OnUpsertTypedSearchAttributes(mock.Anything).Run(func(args mock.Arguments) {
		v, ok := args.Get(0).(temporal.SearchAttributes).GetKeyword(pipeline.SearchAttrAttention)
		if !ok {
			v = "<unset>"
		}
		b.attention = append(b.attention, v)
	}).Return(nil).Maybe()
	t.Cleanup(func() { b.env.AssertExpectations(t) })
	return b
}

// update is what became of one decide update.
type update struct {
	rejected, completed error
	accepted            bool
	result              pipeline.DecisionResult
}

// decide sends d as the decide update at the workflow clock's time after.
func (b *bundle) decide(after time.Duration, d pipeline.Decision) *update {
	u := &update{}
	b.env.RegisterDelayedCallback(func() {
		b.env.UpdateWorkflow(pipeline.UpdateDecide, "", &testsuite.TestUpdateCallback{
			OnAccept: func() { u.accepted = true },
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

func (b *bundle) states(t *testing.T) []string {
	t.Helper()
	val, err := b.env.QueryWorkflow(orders.QueryStatus)
	require.NoError(t, err)
	var st []orders.StepStatus
	require.NoError(t, val.Get(&st))
	var out []string
	for _, s := range st {
		out = append(out, s.Step+"="+s.State)
	}
	return out
}

func (b *bundle) details(t *testing.T) string {
	t.Helper()
	val, err := b.env.QueryWorkflow("__temporal_workflow_metadata")
	require.NoError(t, err)
	var md sdkpb.WorkflowMetadata
	require.NoError(t, val.Get(&md))
	return md.GetCurrentDetails()
}

func TestAmbiguousStepWaitsAndDoneReturnsTheStoredOutcome(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.env.OnActivity(declLabel.Name, mock.Anything, ship).Return(bought, nil).Once()
	b.env.OnActivity(declNotify.Name, mock.Anything, ship).Return(notified{}, ambiguous).Once()
	b.env.OnActivity(declNotify.Name, mock.Anything, ship).Return(told, nil).Once()
	var applied pipeline.DecisionInput
	b.env.OnActivity(pipeline.NameApplyDecision, mock.Anything, mock.Anything).Return(
		func(_ context.Context, di pipeline.DecisionInput) (pipeline.DecisionResult, error) {
			applied = di
			return pipeline.DecisionResult{Step: di.Step, EffectKey: di.EffectKey, Resolution: string(di.Resolution), State: "succeeded", Generation: 3}, nil
		}).Once()
	var during []string
	var details string
	b.env.RegisterDelayedCallback(func() { during, details = b.states(t), b.details(t) }, time.Hour)
	u := b.decide(2*time.Hour, pipeline.Decision{Step: "notify", Resolution: effects.ResolveDone, By: " ada ",
		Reason: "found at the provider", Result: json.RawMessage(`{"message_id":"msg_1"}`)})
	b.env.ExecuteWorkflow(shipWorkflowName, ship)

	require.NoError(t, b.env.GetWorkflowError())
	require.NoError(t, u.rejected)
	require.NoError(t, u.completed)
	require.Equal(t, int64(3), u.result.Generation)
	require.Equal(t, []string{"notify:ambiguous", "<unset>"}, b.attention, "KeyedAttention set, then cleared")
	require.Equal(t, []string{"label=done", "notify=waiting"}, during)
	require.Contains(t, details, "- **label** done · `acme:shipment:s1:label` · `lbl--1`", "outcome IDs in backticks")
	require.Contains(t, details, "**Needs a decision** (KeyedAttention = `notify:ambiguous`)")
	require.Contains(t, details, "Ambiguous: maybe sent")
	require.Equal(t, pipeline.DecisionInput{EffectKey: "acme:shipment:s1:notify", Step: "notify", Resolution: effects.ResolveDone,
		Result: json.RawMessage(`{"message_id":"msg_1"}`), Reason: "found at the provider", By: "ada",
		WorkflowID: "shipment:acme:s1", RunID: applied.RunID}, applied)
	require.Equal(t, []string{"BuyLabel", "NotifyShipped", "ApplyDecision", "NotifyShipped"}, b.started)
	var res shipResult
	require.NoError(t, b.env.GetWorkflowResult(&res))
	require.Equal(t, told, res.Notified)
	require.Equal(t, []string{"label=done", "notify=done"}, b.states(t))
	require.NotContains(t, b.details(t), "Needs a decision")
}

func TestRetriesRanOutWaitsAndRetryRunsTheStepAgain(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	// A retryable failure until the schedule-to-close timeout: the label
	// may or may not have been bought. After the decision it succeeds.
	retried := false
	b.env.OnActivity(declLabel.Name, mock.Anything, ship).Return(
		func(context.Context, shipInput) (label, error) {
			if !retried {
				return label{}, temporal.NewApplicationError("carrier 500", activities.ErrTypeTransient)
			}
			return bought, nil
		})
	b.env.OnActivity(pipeline.NameApplyDecision, mock.Anything, mock.Anything).Return(
		func(context.Context, pipeline.DecisionInput) (pipeline.DecisionResult, error) {
			retried = true
			return pipeline.DecisionResult{State: "failed_transient"}, nil
		}).Once()
	b.env.OnActivity(declNotify.Name, mock.Anything, ship).Return(told, nil).Once()

	bad := b.decide(time.Hour, pipeline.Decision{Step: "notify", Resolution: effects.ResolveRetry, By: "ada", Reason: "x"})
	good := b.decide(2*time.Hour, pipeline.Decision{Step: "label", Resolution: effects.ResolveRetry, By: "ada", Reason: "no label bought"})
	b.env.ExecuteWorkflow(shipWorkflowName, ship)

	require.ErrorContains(t, bad.rejected, `step "notify" is not waiting; "label" is`)
	require.NoError(t, good.rejected)
	require.NoError(t, good.completed)
	require.NoError(t, b.env.GetWorkflowError())
	require.Equal(t, []string{"label:retries_exhausted", "<unset>"}, b.attention)
	require.Equal(t, []string{"BuyLabel", "ApplyDecision", "BuyLabel", "NotifyShipped"}, b.started[len(b.started)-4:])
}

func TestDecisionValidatorRefusesBadInput(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.env.OnActivity(declLabel.Name, mock.Anything, ship).Return(bought, nil).Once()
	b.env.OnActivity(declNotify.Name, mock.Anything, ship).Return(notified{}, ambiguous).Once()

	ok := pipeline.Decision{Step: "notify", Resolution: effects.ResolveDone, By: "ada", Reason: "checked"}
	cases := map[string]func(d *pipeline.Decision){
		"unknown step":   func(d *pipeline.Decision) { d.Step = "label" },
		"bad resolution": func(d *pipeline.Decision) { d.Resolution = "maybe" },
		"missing reason": func(d *pipeline.Decision) { d.Reason = "  " },
		"long reason":    func(d *pipeline.Decision) { d.Reason = strings.Repeat("x", pipeline.MaxDecisionReason+1) },
		"missing by":     func(d *pipeline.Decision) { d.By = "" },
		"long by":        func(d *pipeline.Decision) { d.By = strings.Repeat("x", pipeline.MaxDecisionBy+1) },
		"oversized result": func(d *pipeline.Decision) {
			d.Result = json.RawMessage(`"` + strings.Repeat("x", effects.MaxResultBytes) + `"`)
		},
		"result with retry": func(d *pipeline.Decision) { d.Resolution, d.Result = effects.ResolveRetry, json.RawMessage(`{}`) },
	}
	updates := map[string]*update{}
	for name, edit := range cases {
		d := ok
		edit(&d)
		updates[name] = b.decide(time.Hour, d)
	}
	early := b.decide(0, ok) // Before anything waits.
	b.env.ExecuteWorkflow(shipWorkflowName, ship)

	for name, u := range updates {
		require.Error(t, u.rejected, name)
		require.False(t, u.accepted, name)
	}
	require.ErrorContains(t, early.rejected, "no step of this run is waiting")
	// Nothing was decided: the run waited out the default decision timeout.
	var app *temporal.ApplicationError
	require.ErrorAs(t, b.env.GetWorkflowError(), &app)
	require.Equal(t, pipeline.ErrTypeDecisionTimeout, app.Type())
	require.True(t, app.NonRetryable())
	require.Contains(t, app.Error(), "acme:shipment:s1:notify")
	require.Contains(t, app.Error(), "no operator decision within 168h0m0s")
	require.NotContains(t, b.started, pipeline.NameApplyDecision)
	require.Equal(t, []string{"label=done", "notify=failed"}, b.states(t))
}

func TestRefusedDecisionKeepsTheRunWaiting(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.env.OnActivity(declLabel.Name, mock.Anything, ship).Return(bought, nil).Once()
	b.env.OnActivity(declNotify.Name, mock.Anything, ship).Return(notified{}, ambiguous).Once()
	b.env.OnActivity(declNotify.Name, mock.Anything, ship).Return(told, nil).Once()
	b.env.OnActivity(pipeline.NameApplyDecision, mock.Anything, mock.Anything).Return(pipeline.DecisionResult{},
		temporal.NewNonRetryableApplicationError("claim is live", activities.ErrTypeInvalidState, nil)).Once()
	b.env.OnActivity(pipeline.NameApplyDecision, mock.Anything, mock.Anything).Return(pipeline.DecisionResult{State: "failed_transient"}, nil).Once()

	d := pipeline.Decision{Step: "notify", Resolution: effects.ResolveRetry, By: "ada", Reason: "not at the provider"}
	first := b.decide(time.Hour, d)
	second := b.decide(2*time.Hour, d)
	b.env.ExecuteWorkflow(shipWorkflowName, ship)

	require.ErrorContains(t, first.completed, "claim is live")
	require.NoError(t, second.completed)
	require.NoError(t, b.env.GetWorkflowError())
	require.Equal(t, []string{"notify:ambiguous", "<unset>"}, b.attention, "one wait, across both decisions")
}

// A known failure fails the run at once with the step's one line, of the
// step's type and without a cause chain; the later steps are skipped.
func TestKnownFailureFailsWithOneLineAndSkipsTheRest(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.env.OnActivity(declLabel.Name, mock.Anything, ship).Return(label{},
		temporal.NewNonRetryableApplicationError("label acme:shipment:s1:label: address refused\nby the carrier", activities.ErrTypeProviderRejected, nil)).Once()

	b.env.ExecuteWorkflow(shipWorkflowName, ship)
	var app *temporal.ApplicationError
	require.ErrorAs(t, b.env.GetWorkflowError(), &app)
	require.Equal(t, activities.ErrTypeProviderRejected, app.Type())
	require.True(t, app.NonRetryable())
	require.Equal(t, "ProviderRejected: label acme:shipment:s1:label: address refused", app.Message())
	require.Empty(t, b.attention, "no KeyedAttention for a known outcome")
	require.Equal(t, []string{"label=failed", "notify=skipped"}, b.states(t))
	require.Contains(t, b.details(t), "  - ProviderRejected: label acme:shipment:s1:label: address refused\n")
}

// A shorter decision timeout fails an undecided run after it, naming it.
func TestDecisionTimeoutIsConfigurable(t *testing.T) {
	t.Parallel()
	b := setup(t, &pipeline.Opts{DecisionTimeout: time.Hour})
	b.env.OnActivity(declLabel.Name, mock.Anything, ship).Return(label{},
		temporal.NewNonRetryableApplicationError("key came back with other inputs", activities.ErrTypeKeyReused, nil)).Once()

	b.env.ExecuteWorkflow(shipWorkflowName, ship)
	var app *temporal.ApplicationError
	require.ErrorAs(t, b.env.GetWorkflowError(), &app)
	require.Equal(t, pipeline.ErrTypeDecisionTimeout, app.Type())
	require.Contains(t, app.Error(), "no operator decision within 1h0m0s")
	require.Equal(t, []string{"label:key_reused", "<unset>"}, b.attention)
	require.Equal(t, []string{"label=failed", "notify=skipped"}, b.states(t))
}

// An input that cannot key a step fails the run before any activity.
func TestUnkeyableInputFailsBeforeAnyStep(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.env.ExecuteWorkflow(shipWorkflowName, shipInput{TenantID: "acme", ShipmentID: "s:1"})
	var app *temporal.ApplicationError
	require.ErrorAs(t, b.env.GetWorkflowError(), &app)
	require.Equal(t, activities.ErrTypeInvalidInput, app.Type())
	require.Empty(t, b.started)
}
