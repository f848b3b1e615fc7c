package workflows_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/keyedhq/keyed/doctor"
	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/outbox"
	"github.com/keyedhq/keyed/pipeline"
	"github.com/keyedhq/keyed/pipeline/pipelinetest"
	"github.com/keyedhq/keyed/step"
	"github.com/keyedhq/keyed/workflows"
)

// renewal is a third pipeline written only against the framework: one
// keyed step, renewing a subscription, in a workflow of its own.
type renewal struct {
	Tenant, ID string
}

func (in renewal) Validate() error { return nil }
func (in renewal) EffectKey(s string) (effects.Key, error) {
	return effects.NewKey(in.Tenant, "subscription", in.ID, s)
}
func (in renewal) LogAttrs() []any { return []any{"tenant_id", in.Tenant, "subscription_id", in.ID} }

var declRenew = step.Declare[renewal, string](step.Declaration{Name: "RenewSubscription",
	Class: effects.ClassExternalCreate, Step: "renew", Options: step.Options{ScheduleToClose: 10 * time.Hour}})

func renewalSpec() pipeline.Spec {
	return pipeline.Spec{
		Name:     "renewal",
		Workflow: "RenewalWorkflow",
		Register: func(r worker.WorkflowRegistry, opts *pipeline.Opts) {
			r.RegisterWorkflowWithOptions(func(ctx workflow.Context, in renewal) (string, error) {
				run, err := pipeline.New(ctx, in, []step.Declaration{declRenew.Declaration}, opts)
				if err != nil {
					return "", err
				}
				var out string
				return out, pipeline.RunStep(ctx, run, declRenew.Declaration, &out, nil)
			}, workflow.RegisterOptions{Name: "RenewalWorkflow"})
		},
		Steps: []step.Declaration{declRenew.Declaration},
		Activities: func(d pipeline.Deps) ([]step.Definition, error) {
			return []step.Definition{declRenew.Bind(func(ctx context.Context, in renewal) (string, error) {
				return declRenew.Run(ctx, d.Runner(), in, step.Effect[renewal, string]{
					Do: func(context.Context, *step.Call[renewal]) (string, error) { return "renewed", nil }})
			})}, nil
		},
		Placeholder: renewal{Tenant: "{tenant}", ID: "{subscription}"},
		RunOfKey: func(k effects.Key) (string, string, bool) {
			parts := k.Parts()
			if len(parts) != 3 || parts[0] != "subscription" {
				return "", "", false
			}
			return "renewal:" + k.Tenant() + ":" + parts[1], parts[2], true
		},
		Configure: func(_ context.Context, _ effects.DB, req outbox.Request, o *client.StartWorkflowOptions) error {
			o.StaticSummary = "renewal " + req.WorkflowID
			return nil
		},
		SearchAttributes: []pipeline.SearchAttribute{{Name: "SubscriptionID", Type: "Keyword"}},
	}
}

// A third pipeline plugs in through its Spec alone: the worker's one
// registration takes it beside the others, and the relay's dispatch, the
// retention check's longest run, doctor's declarations and key shapes, the
// search attributes and starter resolve's run of a key all see it.
func TestAThirdPipelinePlugsInThroughItsSpec(t *testing.T) {
	t.Parallel()
	specs := append(workflows.Pipelines(), renewalSpec())

	env := pipelinetest.NewEnv(t)
	pipelinetest.Register(t, env, nil, specs...)
	pipelinetest.MockRest(env, specs...)
	env.ExecuteWorkflow("RenewalWorkflow", renewal{Tenant: "acme", ID: "s1"})
	require.NoError(t, env.GetWorkflowError())
	require.Equal(t, []string{"renew=done"}, pipelinetest.States(t, env))

	var o client.StartWorkflowOptions
	require.NoError(t, pipeline.Configure(specs, nil)(context.Background(), outbox.Request{WorkflowType: "RenewalWorkflow", WorkflowID: "renewal:acme:s1"}, &o))
	require.Equal(t, "renewal renewal:acme:s1", o.StaticSummary)

	require.Equal(t, 10*time.Hour, pipeline.LongestRun(specs), "its one step retries longest")
	require.Less(t, pipeline.LongestRun(workflows.Pipelines()), pipeline.LongestRun(specs))

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
