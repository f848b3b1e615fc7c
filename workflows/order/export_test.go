package order

import (
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/pipeline"
	"github.com/keyedhq/keyed/step"
)

// RegisterWithStepAfterReceipt registers, for the tests of adding a step
// to a workflow with runs in flight, the order workflow with one more step
// after the receipt, declared by d: behind the change changeID
// (pipeline.RunAddedStep) when changeID is not empty, bare otherwise, as a
// careless change would add it.
func RegisterWithStepAfterReceipt(r worker.WorkflowRegistry, d step.Declaration, changeID string) {
	r.RegisterWorkflowWithOptions(func(ctx workflow.Context, in orders.OrderInput) (orders.OrderResult, error) {
		out, o, err := run(ctx, in, nil)
		if err != nil {
			return out, err
		}
		var added any
		if changeID == "" {
			err = pipeline.RunStep(ctx, o, d, &added, nil)
		} else {
			err = pipeline.RunAddedStep(ctx, o, changeID, d, &added)
		}
		if err != nil {
			return out, err
		}
		o.ShowDetails(ctx)
		return out, nil
	}, workflow.RegisterOptions{Name: orders.WorkflowName})
}
