package pipelinetest_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/workflow"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/pipeline"
	"github.com/keyedhq/keyed/pipeline/pipelinetest"
	"github.com/keyedhq/keyed/step"
)

// waitOnce is a stand-in for a pipeline run, so that each helper is checked
// against what it reads alone: it starts "Ping", then waits for one decide
// update while its status, current details and KeyedAttention say so.
func waitOnce(ctx workflow.Context) (string, error) {
	status := []pipeline.StepStatus{{Step: "ping", State: pipeline.StateWaiting}}
	if err := workflow.SetQueryHandler(ctx, pipeline.QueryStatus, func() ([]pipeline.StepStatus, error) { return status, nil }); err != nil {
		return "", err
	}
	decided := false
	err := workflow.SetUpdateHandlerWithOptions(ctx, pipeline.UpdateDecide,
		func(_ workflow.Context, d pipeline.Decision) (pipeline.DecisionResult, error) {
			decided = true
			return pipeline.DecisionResult{Step: d.Step, Resolution: string(d.Resolution), Generation: 2}, nil
		}, workflow.UpdateHandlerOptions{Validator: func(_ workflow.Context, d pipeline.Decision) error {
			if d.Step != "ping" {
				return errors.New("not waiting")
			}
			return nil
		}})
	if err != nil {
		return "", err
	}
	actx := workflow.WithActivityOptions(ctx, workflow.ActivityOptions{StartToCloseTimeout: time.Minute})
	var pong string
	if err := workflow.ExecuteActivity(actx, "Ping").Get(ctx, &pong); err != nil {
		return "", err
	}
	workflow.SetCurrentDetails(ctx, "**Needs a decision**")
	if err := workflow.UpsertTypedSearchAttributes(ctx, pipeline.SearchAttrAttention.ValueSet("ping:ambiguous")); err != nil {
		return "", err
	}
	if err := workflow.Await(ctx, func() bool { return decided }); err != nil {
		return "", err
	}
	status[0].State = pipeline.StateDone
	workflow.SetCurrentDetails(ctx, "done")
	return pong, workflow.UpsertTypedSearchAttributes(ctx, pipeline.SearchAttrAttention.ValueUnset())
}

func TestHelpersReadTheRun(t *testing.T) {
	t.Parallel()
	env := pipelinetest.NewEnv(t)
	env.RegisterWorkflow(waitOnce)
	env.RegisterActivityWithOptions(func(context.Context) (string, error) { return "pong", nil }, activity.RegisterOptions{Name: "Ping"})
	started := pipelinetest.RecordStarted(env)
	attention := pipelinetest.RecordAttention(env)
	var during []string
	var details string
	env.RegisterDelayedCallback(func() { during, details = pipelinetest.States(t, env), pipelinetest.Details(t, env) }, time.Hour)
	refused := pipelinetest.Decide(env, pipeline.Decision{Step: "pong", Resolution: effects.ResolveDone}, 2*time.Hour)
	accepted := pipelinetest.Decide(env, pipeline.Decision{Step: "ping", Resolution: effects.ResolveDone}, 3*time.Hour)
	env.ExecuteWorkflow(waitOnce)

	require.NoError(t, env.GetWorkflowError())
	require.Equal(t, []string{"ping=waiting"}, during)
	require.Equal(t, "**Needs a decision**", details)
	require.ErrorContains(t, refused.Rejected, "not waiting")
	require.False(t, refused.Accepted)
	require.Equal(t, refused.Rejected, refused.Err())
	require.True(t, accepted.Accepted)
	require.NoError(t, accepted.Err())
	require.Equal(t, int64(2), accepted.Result.Generation)
	require.Equal(t, []string{"ping:ambiguous", pipelinetest.Unset}, attention.Values())
	require.Equal(t, []string{"Ping"}, started.Names())
	require.Equal(t, "Ping", started.Info("Ping").ActivityType.Name)
	require.Zero(t, started.Info("Pong"))
	require.Equal(t, []pipeline.StepStatus{{Step: "ping", State: pipeline.StateDone}}, pipelinetest.Status(t, env))
	require.Equal(t, "done", pipelinetest.Details(t, env))
}

func TestStepStates(t *testing.T) {
	t.Parallel()
	require.Nil(t, pipelinetest.StepStates(nil))
	require.Equal(t, []string{"charge=done", "receipt=skipped"}, pipelinetest.StepStates([]pipeline.StepStatus{
		{Step: "charge", State: pipeline.StateDone}, {Step: "receipt", State: pipeline.StateSkipped, Error: "x"}}))
}

// applyOnce runs ApplyDecision once with a fixed decision.
func applyOnce(ctx workflow.Context) (pipeline.DecisionResult, error) {
	actx := workflow.WithActivityOptions(ctx, workflow.ActivityOptions{StartToCloseTimeout: time.Minute})
	var res pipeline.DecisionResult
	err := workflow.ExecuteActivity(actx, pipeline.NameApplyDecision, pipeline.DecisionInput{
		EffectKey: "acme:order:o1:receipt", Step: "receipt", Resolution: effects.ResolveDone, By: "ada"}).Get(ctx, &res)
	return res, err
}

func TestMockApplyDecisionKeepsWhatItWasGiven(t *testing.T) {
	t.Parallel()
	env := pipelinetest.NewEnv(t)
	env.RegisterWorkflow(applyOnce)
	var d *pipeline.Decider
	require.NoError(t, step.Register(env, d.Definition()))
	applied := pipelinetest.MockApplyDecision(env, 4)
	env.ExecuteWorkflow(applyOnce)

	require.NoError(t, env.GetWorkflowError())
	var res pipeline.DecisionResult
	require.NoError(t, env.GetWorkflowResult(&res))
	require.Equal(t, pipeline.DecisionResult{Step: "receipt", EffectKey: "acme:order:o1:receipt", Resolution: "done",
		State: "succeeded", Generation: 4}, res)
	require.Equal(t, "ada", applied.By)
}
