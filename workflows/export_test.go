package workflows

import (
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/keyedhq/keyed/activities"
	"github.com/keyedhq/keyed/pipeline"
)

// RegisterWithStepAfterReceipt registers the order workflow with one more
// step after the receipt, the activity declared by d: behind the change
// changeID (runAddedStep) when changeID is not empty, bare otherwise, as a
// careless change would add it.
func RegisterWithStepAfterReceipt(r worker.WorkflowRegistry, d activities.Declaration, changeID string) {
	k := activities.Keyed[any]{Declaration: d}
	RegisterWithOpts(r, &WorkflowOpts{then: func(ctx workflow.Context, o *pipeline.Run) error {
		var out any
		if changeID == "" {
			return runStep(ctx, o, k, &out, nil)
		}
		return runAddedStep(ctx, o, changeID, k, &out)
	}})
}
