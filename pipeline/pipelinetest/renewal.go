package pipelinetest

import (
	"context"
	"time"

	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/outbox"
	"github.com/keyedhq/keyed/pipeline"
	"github.com/keyedhq/keyed/step"
)

// RenewalInput is the input of Renewal, a third pipeline written only
// against the framework for the tests: one keyed step, renewing a
// subscription, in a workflow of its own.
type RenewalInput struct {
	Tenant, ID string
}

func (in RenewalInput) Validate() error { return nil }
func (in RenewalInput) EffectKey(s string) (effects.Key, error) {
	return effects.NewKey(in.Tenant, "subscription", in.ID, s)
}
func (in RenewalInput) LogAttrs() []any {
	return []any{"tenant_id", in.Tenant, "subscription_id", in.ID}
}

var declRenew = step.Declare[RenewalInput, string](step.Declaration{Name: "RenewSubscription",
	Class: effects.ClassExternalCreate, Step: "renew", Options: step.Options{ScheduleToClose: 10 * time.Hour}})

// Renewal returns the renewal pipeline's Spec (docs/adding-a-pipeline.md).
func Renewal() pipeline.Spec {
	return pipeline.Spec{
		Name:     "renewal",
		Workflow: "RenewalWorkflow",
		Register: func(r worker.WorkflowRegistry, opts *pipeline.Opts) {
			r.RegisterWorkflowWithOptions(func(ctx workflow.Context, in RenewalInput) (string, error) {
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
			return []step.Definition{declRenew.Bind(func(ctx context.Context, in RenewalInput) (string, error) {
				return declRenew.Run(ctx, d.Runner(), in, step.Effect[RenewalInput, string]{
					Do: func(context.Context, *step.Call[RenewalInput]) (string, error) { return "renewed", nil }})
			})}, nil
		},
		Placeholder: RenewalInput{Tenant: "{tenant}", ID: "{subscription}"},
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
