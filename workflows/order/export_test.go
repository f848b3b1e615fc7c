package order

import (
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/pipeline"
	"github.com/keyedhq/keyed/step"
)

// RegisterWithStepAfterReceipt registers the order workflow with one more
// step after the receipt, the activity declared by d: behind the change
// changeID (runAddedStep) when changeID is not empty, bare otherwise, as a
// careless change would add it.
func RegisterWithStepAfterReceipt(r worker.WorkflowRegistry, d step.Declaration, changeID string) {
	k := step.Keyed[orders.OrderInput, any]{Declaration: d}
	RegisterWithOpts(r, &WorkflowOpts{then: func(ctx workflow.Context, o *pipeline.Run) error {
		var out any
		if changeID == "" {
			return runStep(ctx, o, k, &out, nil)
		}
		return runAddedStep(ctx, o, changeID, k, &out)
	}})
}
