package pipeline_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/mock"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/workflow"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/notify"
	"github.com/keyedhq/keyed/pipeline"
	"github.com/keyedhq/keyed/pipeline/pipelinetest"
	"github.com/keyedhq/keyed/step"
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

// Validate requires the message ID, as an operator's "done" must give it.
func (n notified) Validate() error {
	if n.MessageID == "" {
		return errors.New("message_id is required")
	}
	return nil
}

type shipResult struct {
	Label    label    `json:"label"`
	Notified notified `json:"notified"`
}

var (
	ship = shipInput{TenantID: "acme", ShipmentID: "s1"}
	// declLabel declares no Outcome: "done" needs some JSON result.
	declLabel  = step.Declaration{Name: "BuyLabel", Class: effects.ClassExternalCreate, Step: "label"}
	declNotify = step.Declaration{Name: "NotifyShipped", Class: effects.ClassIrreversibleSend, Step: "notify", Policy: notify.AtMostOnce,
		Outcome: step.OutcomeOf[notified]()}
	bought    = label{LabelID: "lbl--1"}
	told      = notified{MessageID: "msg_1"}
	ambiguous = temporal.NewNonRetryableApplicationError("maybe sent", step.ErrTypeAmbiguous, nil)
)

const shipWorkflowName = "ShipWorkflow"

// shipWorkflow runs the two steps through a pipeline.Run.
func shipWorkflow(ctx workflow.Context, in shipInput, opts *pipeline.Opts) (shipResult, error) {
	var out shipResult
	r, err := pipeline.New(ctx, in, []step.Declaration{declLabel, declNotify}, opts)
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
	started   *pipelinetest.Started
	attention *pipelinetest.Attention
}

func setup(t *testing.T, opts *pipeline.Opts) *bundle {
	t.Helper()
	b := &bundle{env: pipelinetest.NewEnv(t)}
	b.env.RegisterWorkflowWithOptions(func(ctx workflow.Context, in shipInput) (shipResult, error) {
		return shipWorkflow(ctx, in, opts)
	}, workflow.RegisterOptions{Name: shipWorkflowName})
	var d *pipeline.Decider
	require.NoError(t, step.Register(b.env,
		declLabel.Bind(func(context.Context, shipInput) (label, error) { return label{}, nil }),
		declNotify.Bind(func(context.Context, shipInput) (notified, error) { return notified{}, nil }),
		d.Definition()))
	b.env.SetStartWorkflowOptions(client.StartWorkflowOptions{ID: "shipment:acme:s1"})
	b.started = pipelinetest.RecordStarted(b.env)
	b.attention = pipelinetest.RecordAttention(b.env)
	return b
}

func TestAmbiguousStepWaitsAndDoneReturnsTheStoredOutcome(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.env.OnActivity(declLabel.Name, mock.Anything, ship).Return(bought, nil).Once()
	b.env.OnActivity(declNotify.Name, mock.Anything, ship).Return(notified{}, ambiguous).Once()
	b.env.OnActivity(declNotify.Name, mock.Anything, ship).Return(told, nil).Once()
	applied := pipelinetest.MockApplyDecision(b.env, 3)
	var during []string
	var details string
	b.env.RegisterDelayedCallback(func() { during, details = pipelinetest.States(t, b.env), pipelinetest.Details(t, b.env) }, time.Hour)
	u := pipelinetest.Decide(b.env, pipeline.Decision{Step: "notify", Resolution: effects.ResolveDone, By: " ada ",
		Reason: "found at the provider", Result: json.RawMessage(`{"message_id":"msg_1"}`)}, 2*time.Hour)
	var canceled int
	b.env.SetOnTimerCanceledListener(func(string) { canceled++ })
	b.env.ExecuteWorkflow(shipWorkflowName, ship)

	require.NoError(t, b.env.GetWorkflowError())
	require.NoError(t, u.Rejected)
	require.NoError(t, u.Completed)
	require.Equal(t, 1, canceled, "the decision timer is canceled once the decision is applied")
	require.Equal(t, int64(3), u.Result.Generation)
	require.Equal(t, []string{"notify:ambiguous", "<unset>"}, b.attention.Values(), "KeyedAttention set, then cleared")
	require.Equal(t, []string{"label=done", "notify=waiting"}, during)
	require.Contains(t, details, "- **label** done · `acme:shipment:s1:label` · `lbl--1`", "outcome IDs in backticks")
	require.Contains(t, details, "**Needs a decision** (KeyedAttention = `notify:ambiguous`, since ")
	require.Contains(t, details, "`"+`{"step":"notify","wait":"acme:shipment:s1:notify#1","resolution":"done","by":"…","reason":"…","result":{"message_id":"…"}}`+"`",
		"the exact JSON to paste, with the wait")
	require.Contains(t, details, "Ambiguous: maybe sent")
	require.Equal(t, pipeline.DecisionInput{EffectKey: "acme:shipment:s1:notify", Step: "notify", Resolution: effects.ResolveDone,
		Result: json.RawMessage(`{"message_id":"msg_1"}`), Reason: "found at the provider", By: "ada",
		WorkflowID: "shipment:acme:s1", RunID: applied.RunID}, *applied)
	require.Equal(t, []string{"BuyLabel", "NotifyShipped", "ApplyDecision", "NotifyShipped"}, b.started.Names())
	var res shipResult
	require.NoError(t, b.env.GetWorkflowResult(&res))
	require.Equal(t, told, res.Notified)
	require.Equal(t, []string{"label=done", "notify=done"}, pipelinetest.States(t, b.env))
	require.NotContains(t, pipelinetest.Details(t, b.env), "Needs a decision")
	require.Contains(t, pipelinetest.Details(t, b.env), "- acme:shipment:s1:notify#1 decided done by ada: found at the provider",
		"the details keep who decided and why")
}

// A decision names the wait it is for: one for a wait that is over is
// refused, never applied to the step's next wait; the status query shows
// the wait and since when; a repeated decision has one Update ID.
func TestDecisionForAWaitThatIsOverIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.env.OnActivity(declLabel.Name, mock.Anything, ship).Return(bought, nil).Once()
	b.env.OnActivity(declNotify.Name, mock.Anything, ship).Return(notified{}, ambiguous).Twice()
	b.env.OnActivity(declNotify.Name, mock.Anything, ship).Return(told, nil).Once()
	pipelinetest.MockApplyDecision(b.env, 3)
	pipelinetest.MockApplyDecision(b.env, 5)
	var first, second []pipeline.StepStatus
	b.env.RegisterDelayedCallback(func() { first = pipelinetest.Status(t, b.env) }, time.Hour)
	retry := pipeline.Decision{Step: "notify", Wait: "acme:shipment:s1:notify#1", Resolution: effects.ResolveRetry, By: "ada", Reason: "not sent"}
	u1 := pipelinetest.Decide(b.env, retry, 2*time.Hour)
	b.env.RegisterDelayedCallback(func() { second = pipelinetest.Status(t, b.env) }, 3*time.Hour)
	again := pipelinetest.Decide(b.env, retry, 4*time.Hour) // A double click, or the settler racing a person.
	retry2 := retry
	retry2.Wait = "acme:shipment:s1:notify#2"
	u2 := pipelinetest.Decide(b.env, retry2, 5*time.Hour)
	b.env.ExecuteWorkflow(shipWorkflowName, ship)

	require.NoError(t, b.env.GetWorkflowError())
	require.NoError(t, u1.Err())
	require.ErrorContains(t, again.Rejected, "wait acme:shipment:s1:notify#1 is over (the run waits on acme:shipment:s1:notify#2 now)")
	require.NoError(t, u2.Err())
	require.Equal(t, "acme:shipment:s1:notify#1", first[1].Wait)
	require.False(t, first[1].WaitingSince.IsZero())
	require.Equal(t, "acme:shipment:s1:notify#2", second[1].Wait)
	require.Equal(t, pipeline.DecisionUpdateID(retry), pipeline.DecisionUpdateID(retry), "one decision, one Update ID")
	require.NotEqual(t, pipeline.DecisionUpdateID(retry), pipeline.DecisionUpdateID(retry2))
	require.Empty(t, pipeline.DecisionUpdateID(pipeline.Decision{Step: "notify"}), "no wait: a random ID")
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
				return label{}, temporal.NewApplicationError("carrier 500", step.ErrTypeTransient)
			}
			return bought, nil
		})
	b.env.OnActivity(pipeline.NameApplyDecision, mock.Anything, mock.Anything).Return(
		func(context.Context, pipeline.DecisionInput) (pipeline.DecisionResult, error) {
			retried = true
			return pipeline.DecisionResult{State: "failed_transient"}, nil
		}).Once()
	b.env.OnActivity(declNotify.Name, mock.Anything, ship).Return(told, nil).Once()

	bad := pipelinetest.Decide(b.env, pipeline.Decision{Step: "notify", Resolution: effects.ResolveRetry, By: "ada", Reason: "x"}, time.Hour)
	// A step whose declaration gives no Outcome still needs a result with done.
	bare := pipelinetest.Decide(b.env, pipeline.Decision{Step: "label", Resolution: effects.ResolveDone, By: "ada", Reason: "x"}, time.Hour)
	good := pipelinetest.Decide(b.env, pipeline.Decision{Step: "label", Resolution: effects.ResolveRetry, By: "ada", Reason: "no label bought"}, 2*time.Hour)
	b.env.ExecuteWorkflow(shipWorkflowName, ship)

	require.ErrorContains(t, bad.Rejected, `step "notify" is not waiting; "label" is`)
	require.EqualError(t, bare.Rejected, "decision refused: result is required with done: the step's outcome as JSON")
	require.NoError(t, good.Rejected)
	require.NoError(t, good.Completed)
	require.NoError(t, b.env.GetWorkflowError())
	require.Equal(t, []string{"label:retries_exhausted", "<unset>"}, b.attention.Values())
	started := b.started.Names()
	require.Equal(t, []string{"BuyLabel", "ApplyDecision", "BuyLabel", "NotifyShipped"}, started[len(started)-4:])
}

func TestDecisionValidatorRefusesBadInput(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.env.OnActivity(declLabel.Name, mock.Anything, ship).Return(bought, nil).Once()
	b.env.OnActivity(declNotify.Name, mock.Anything, ship).Return(notified{}, ambiguous).Once()

	ok := pipeline.Decision{Step: "notify", Resolution: effects.ResolveDone, By: "ada", Reason: "checked",
		Result: json.RawMessage(`{"message_id":"msg_1"}`)}
	cases := map[string]struct {
		edit func(d *pipeline.Decision)
		want string
	}{
		"unknown step":    {func(d *pipeline.Decision) { d.Step = "label" }, `step "label" is not waiting; "notify" is`},
		"bad resolution":  {func(d *pipeline.Decision) { d.Resolution = "maybe" }, `resolution "maybe" is neither "done" nor "retry"`},
		"missing reason":  {func(d *pipeline.Decision) { d.Reason = "  " }, "reason is required"},
		"long reason":     {func(d *pipeline.Decision) { d.Reason = strings.Repeat("x", pipeline.MaxDecisionReason+1) }, "reason is too long: 201 bytes, at most 200"},
		"two-line reason": {func(d *pipeline.Decision) { d.Reason = "one\ntwo" }, `reason holds '\n' at byte 3, a control or invisible character`},
		"missing by":      {func(d *pipeline.Decision) { d.By = "" }, "by (who decides) is required"},
		"long by":         {func(d *pipeline.Decision) { d.By = strings.Repeat("x", pipeline.MaxDecisionBy+1) }, "by (who decides) is too long: 65 bytes, at most 64"},
		"escape in by":    {func(d *pipeline.Decision) { d.By = "ev\x1b[2Jil" }, `by (who decides) holds '\x1b' at byte 2, a control or invisible character`},
		"bidi in by":      {func(d *pipeline.Decision) { d.By = "ev\u202eil" }, `by (who decides) holds '\u202e' at byte 2, a control or invisible character`},
		"done, no result": {func(d *pipeline.Decision) { d.Result = nil }, `result is required with done: the step's outcome, {"message_id":"…"}`},
		"done, null":      {func(d *pipeline.Decision) { d.Result = json.RawMessage(`null`) }, "result is required with done"},
		"unknown field":   {func(d *pipeline.Decision) { d.Result = json.RawMessage(`{"msg":"1"}`) }, `result has the unknown field "msg"`},
		"invalid outcome": {func(d *pipeline.Decision) { d.Result = json.RawMessage(`{"message_id":""}`) }, "result is not the step's outcome: message_id is required"},
		"oversized result": {func(d *pipeline.Decision) {
			d.Result = json.RawMessage(`"` + strings.Repeat("x", effects.MaxResultBytes) + `"`)
		}, "result is too large"},
		"result with retry": {func(d *pipeline.Decision) { d.Resolution, d.Result = effects.ResolveRetry, json.RawMessage(`{}`) },
			"result goes with done only"},
		"unverified retry": {func(d *pipeline.Decision) { d.Resolution, d.Result, d.Unverified = effects.ResolveRetry, nil, true },
			"unverified goes with done only"},
	}
	updates := map[string]*pipelinetest.Update{}
	for name, c := range cases {
		d := ok
		c.edit(&d)
		updates[name] = pipelinetest.Decide(b.env, d, time.Hour)
	}
	// Every problem at once.
	all := pipelinetest.Decide(b.env, pipeline.Decision{Step: "notify", Resolution: effects.ResolveDone}, time.Hour)
	early := pipelinetest.Decide(b.env, ok, 0) // Before anything waits.
	b.env.ExecuteWorkflow(shipWorkflowName, ship)

	for name, u := range updates {
		require.ErrorContains(t, u.Rejected, cases[name].want, name)
		require.False(t, u.Accepted, name)
	}
	require.EqualError(t, all.Rejected, `decision refused: reason is required; by (who decides) is required; `+
		`result is required with done: the step's outcome, {"message_id":"…"}`)
	require.ErrorContains(t, early.Rejected, "no step of this run is waiting")
	// Nothing was decided: the run waited out the default decision timeout.
	var app *temporal.ApplicationError
	require.ErrorAs(t, b.env.GetWorkflowError(), &app)
	require.Equal(t, pipeline.ErrTypeDecisionTimeout, app.Type())
	require.True(t, app.NonRetryable())
	require.Contains(t, app.Error(), "acme:shipment:s1:notify")
	require.Contains(t, app.Error(), "no operator decision within 168h0m0s")
	require.NotContains(t, b.started.Names(), pipeline.NameApplyDecision)
	require.Equal(t, []string{"label=done", "notify=failed"}, pipelinetest.States(t, b.env))
}

func TestRefusedDecisionKeepsTheRunWaiting(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.env.OnActivity(declLabel.Name, mock.Anything, ship).Return(bought, nil).Once()
	b.env.OnActivity(declNotify.Name, mock.Anything, ship).Return(notified{}, ambiguous).Once()
	b.env.OnActivity(declNotify.Name, mock.Anything, ship).Return(told, nil).Once()
	b.env.OnActivity(pipeline.NameApplyDecision, mock.Anything, mock.Anything).Return(pipeline.DecisionResult{},
		temporal.NewNonRetryableApplicationError("claim is live", step.ErrTypeInvalidState, nil)).Once()
	b.env.OnActivity(pipeline.NameApplyDecision, mock.Anything, mock.Anything).Return(pipeline.DecisionResult{State: "failed_transient"}, nil).Once()

	d := pipeline.Decision{Step: "notify", Resolution: effects.ResolveRetry, By: "ada", Reason: "not at the provider"}
	first := pipelinetest.Decide(b.env, d, time.Hour)
	second := pipelinetest.Decide(b.env, d, 2*time.Hour)
	b.env.ExecuteWorkflow(shipWorkflowName, ship)

	require.ErrorContains(t, first.Completed, "claim is live")
	require.NoError(t, second.Completed)
	require.NoError(t, b.env.GetWorkflowError())
	require.Equal(t, []string{"notify:ambiguous", "<unset>"}, b.attention.Values(), "one wait, across both decisions")
}

// A known failure fails the run at once with the step's one line, of the
// step's type and without a cause chain; the later steps are skipped.
func TestKnownFailureFailsWithOneLineAndSkipsTheRest(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.env.OnActivity(declLabel.Name, mock.Anything, ship).Return(label{},
		temporal.NewNonRetryableApplicationError("label acme:shipment:s1:label: address refused\nby the carrier", step.ErrTypeProviderRejected, nil)).Once()

	b.env.ExecuteWorkflow(shipWorkflowName, ship)
	var app *temporal.ApplicationError
	require.ErrorAs(t, b.env.GetWorkflowError(), &app)
	require.Equal(t, step.ErrTypeProviderRejected, app.Type())
	require.True(t, app.NonRetryable())
	require.Equal(t, "ProviderRejected: label acme:shipment:s1:label: address refused", app.Message())
	require.Empty(t, b.attention.Values(), "no KeyedAttention for a known outcome")
	require.Equal(t, []string{"label=failed", "notify=skipped"}, pipelinetest.States(t, b.env))
	require.Contains(t, pipelinetest.Details(t, b.env), "  - ProviderRejected: label acme:shipment:s1:label: address refused\n")
}

// A shorter decision timeout fails an undecided run after it, naming it.
func TestDecisionTimeoutIsConfigurable(t *testing.T) {
	t.Parallel()
	b := setup(t, &pipeline.Opts{DecisionTimeout: time.Hour})
	b.env.OnActivity(declLabel.Name, mock.Anything, ship).Return(label{},
		temporal.NewNonRetryableApplicationError("key came back with other inputs", step.ErrTypeKeyReused, nil)).Once()

	b.env.ExecuteWorkflow(shipWorkflowName, ship)
	var app *temporal.ApplicationError
	require.ErrorAs(t, b.env.GetWorkflowError(), &app)
	require.Equal(t, pipeline.ErrTypeDecisionTimeout, app.Type())
	require.Contains(t, app.Error(), "no operator decision within 1h0m0s")
	require.Equal(t, []string{"label:key_reused", "<unset>"}, b.attention.Values())
	require.Equal(t, []string{"label=failed", "notify=skipped"}, pipelinetest.States(t, b.env))
}

// An input that cannot key a step fails the run before any activity.
func TestUnkeyableInputFailsBeforeAnyStep(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.env.ExecuteWorkflow(shipWorkflowName, shipInput{TenantID: "acme", ShipmentID: "s:1"})
	var app *temporal.ApplicationError
	require.ErrorAs(t, b.env.GetWorkflowError(), &app)
	require.Equal(t, step.ErrTypeInvalidInput, app.Type())
	require.Empty(t, b.started.Names())
}

// firstAttempts runs shipWorkflow as pipeline.Start would start it, with
// MemoLocalSteps and MemoLocalFirst, after mock set the steps' outcomes.
func firstAttempts(t *testing.T, mock func(env *testsuite.TestWorkflowEnvironment)) *bundle {
	t.Helper()
	b := setup(t, nil)
	require.NoError(t, b.env.SetMemoOnStart(map[string]any{pipeline.MemoLocalSteps: true, pipeline.MemoLocalFirst: true}))
	mock(b.env)
	b.env.ExecuteWorkflow(shipWorkflowName, ship)
	return b
}

// TestFirstAttemptsRunInTheWorkflowTask: in a run started with
// MemoLocalFirst each step's first attempt is a local activity; one that
// fails with a retryable error (or is refused by the worker's gate) is
// followed by the step as an activity, and a terminal failure is the
// step's.
func TestFirstAttemptsRunInTheWorkflowTask(t *testing.T) {
	t.Parallel()
	transient := temporal.NewApplicationError("503", step.ErrTypeTransient)
	notLocal := temporal.NewApplicationError("bounded", step.ErrTypeNotLocal)
	declined := temporal.NewNonRetryableApplicationError("declined", step.ErrTypeCardDeclined, nil)
	for _, tc := range []struct {
		name   string
		first  error // the label's first attempt
		names  []string
		local  []bool
		failed string // the run's error type, "" for success
	}{
		{"both answer", nil, []string{"BuyLabel", "NotifyShipped"}, []bool{true, true}, ""},
		{"transient", transient, []string{"BuyLabel", "BuyLabel", "NotifyShipped"}, []bool{true, false, true}, ""},
		{"refused", notLocal, []string{"BuyLabel", "BuyLabel", "NotifyShipped"}, []bool{true, false, true}, ""},
		{"terminal", declined, []string{"BuyLabel"}, []bool{true}, step.ErrTypeCardDeclined},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := firstAttempts(t, func(env *testsuite.TestWorkflowEnvironment) {
				if tc.first != nil {
					env.OnActivity(declLabel.Name, mock.Anything, mock.Anything).Return(label{}, tc.first).Once()
				}
				env.OnActivity(declLabel.Name, mock.Anything, mock.Anything).Return(bought, nil).Maybe()
				env.OnActivity(declNotify.Name, mock.Anything, mock.Anything).Return(told, nil).Maybe()
			})
			require.True(t, b.env.IsWorkflowCompleted())
			require.Equal(t, tc.names, b.started.Names())
			require.Equal(t, tc.local, b.started.Local())
			err := b.env.GetWorkflowError()
			if tc.failed == "" {
				require.NoError(t, err)
				return
			}
			var app *temporal.ApplicationError
			require.ErrorAs(t, err, &app)
			require.Equal(t, tc.failed, app.Type())
		})
	}
}
