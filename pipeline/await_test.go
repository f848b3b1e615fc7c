package pipeline_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/mock"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/testsuite"

	"github.com/keyedhq/keyed/pipeline"
)

// awaitUpdate sends UpdateAwaitSteps for steps when the run starts and
// records its outcome.
func awaitUpdate(env *testsuite.TestWorkflowEnvironment, steps ...string) *struct {
	got    []pipeline.StepStatus
	err    error
	reject error
} {
	u := &struct {
		got    []pipeline.StepStatus
		err    error
		reject error
	}{}
	env.RegisterDelayedCallback(func() {
		env.UpdateWorkflow(pipeline.UpdateAwaitSteps, "", &testsuite.TestUpdateCallback{
			OnAccept: func() {},
			OnReject: func(err error) { u.reject = err },
			OnComplete: func(res any, err error) {
				u.err = err
				u.got, _ = res.([]pipeline.StepStatus)
			},
		}, pipeline.AwaitSteps{Steps: steps})
	}, 0)
	return u
}

// The await update returns the named steps once each has settled: the
// label once bought, while the run goes on; the notify step once it waits
// for a decision. Naming no step is refused.
func TestAwaitStepsReturnsOnceTheStepsSettle(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.env.OnActivity(declLabel.Name, mock.Anything, ship).Return(bought, nil).Once()
	b.env.OnActivity(declNotify.Name, mock.Anything, ship).After(time.Minute).Return(notified{}, ambiguous).Once()
	label := awaitUpdate(b.env, "label")
	both := awaitUpdate(b.env, "label", "notify")
	none := awaitUpdate(b.env)
	b.env.ExecuteWorkflow(shipWorkflowName, ship)

	require.NoError(t, label.err)
	require.Len(t, label.got, 1)
	require.Equal(t, pipeline.StateDone, label.got[0].State)
	require.NoError(t, both.err)
	require.Equal(t, []string{"done", "waiting"}, []string{both.got[0].State, both.got[1].State})
	require.ErrorContains(t, none.reject, "name the steps to await")
}
