package workflows_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/client"

	"github.com/keyedhq/keyed/doctor"
	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/outbox"
	"github.com/keyedhq/keyed/pipeline"
	"github.com/keyedhq/keyed/pipeline/pipelinetest"
	"github.com/keyedhq/keyed/workflows"
)

// A third pipeline plugs in through its Spec alone: the worker's one
// registration takes it beside the others, and the relay's dispatch, the
// retention check's longest run, doctor's declarations and key shapes, the
// search attributes and starter resolve's run of a key all see it.
func TestAThirdPipelinePlugsInThroughItsSpec(t *testing.T) {
	t.Parallel()
	specs := append(workflows.Pipelines(), pipelinetest.Renewal())

	env := pipelinetest.NewEnv(t)
	pipelinetest.Register(t, env, nil, specs...)
	pipelinetest.MockRest(env, specs...)
	env.ExecuteWorkflow("RenewalWorkflow", pipelinetest.RenewalInput{Tenant: "acme", ID: "s1"})
	require.NoError(t, env.GetWorkflowError())
	require.Equal(t, []string{"renew=done"}, pipelinetest.States(t, env))

	var o client.StartWorkflowOptions
	require.NoError(t, pipeline.Configure(specs, nil)(context.Background(), outbox.Request{WorkflowType: "RenewalWorkflow", WorkflowID: "renewal:acme:s1"}, &o))
	require.Equal(t, "renewal renewal:acme:s1", o.StaticSummary)

	renewal := pipeline.LongestRun([]pipeline.Spec{pipelinetest.Renewal()})
	require.Equal(t, 10*time.Hour, renewal, "its one step's retry window")
	require.Equal(t, max(pipeline.LongestRun(workflows.Pipelines()), renewal), pipeline.LongestRun(specs))

	var shape string
	for _, a := range doctor.Declared(specs) {
		if a.Name == "RenewSubscription" {
			shape = a.KeyShape
			require.Equal(t, "RenewalWorkflow", a.Workflow)
		}
	}
	require.Equal(t, "{tenant}:subscription:{subscription}:renew", shape)
	require.Contains(t, pipeline.SearchAttributes(specs), pipeline.SearchAttribute{Name: "SubscriptionID", Type: "Keyword"})

	k, err := effects.ParseKey("acme:subscription:s1:renew")
	require.NoError(t, err)
	id, s, ok := pipeline.RunOfKey(specs, k)
	require.True(t, ok)
	require.Equal(t, "renewal:acme:s1", id)
	require.Equal(t, "renew", s)
}

// TestEveryKeyFindsItsOwnPipeline derives each declared step's key from
// its spec's Placeholder and checks that pipeline.RunOfKey, which takes the
// first spec whose key shape matches, gives it to that spec and step: a
// pipeline whose keys another pipeline's shape would take fails here, not
// when an operator's decision reaches the wrong run.
func TestEveryKeyFindsItsOwnPipeline(t *testing.T) {
	t.Parallel()
	specs := append(workflows.Pipelines(), pipelinetest.Renewal())
	for _, s := range specs {
		for _, d := range s.Steps {
			k, err := s.Placeholder.EffectKey(d.Step)
			require.NoError(t, err, "%s's step %s", s.Name, d.Name)
			for _, other := range specs {
				if _, _, ok := other.RunOfKey(k); ok {
					require.Equal(t, s.Name, other.Name, "%s's key %s is taken by the %s pipeline", s.Name, k, other.Name)
					break
				}
			}
			_, st, ok := pipeline.RunOfKey(specs, k)
			require.True(t, ok, "%s's key %s", s.Name, k)
			require.Equal(t, d.Step, st, "%s's key %s", s.Name, k)
		}
	}
}
