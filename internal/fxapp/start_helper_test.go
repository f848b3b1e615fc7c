package fxapp_test

import (
	"context"

	"go.temporal.io/sdk/client"

	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/outbox"
	"github.com/keyedhq/keyed/pipeline"
	orderflow "github.com/keyedhq/keyed/workflows/order"
)

// startOrder starts in's order run with pipeline.Start, as every starter
// does.
func startOrder(ctx context.Context, c client.Client, in orders.OrderInput, opts *orderflow.StartOpts) (*outbox.Started, error) {
	o, err := orderflow.StartOptions(in, opts)
	if err != nil {
		return nil, err
	}
	return pipeline.Start(ctx, c, o, orders.WorkflowName, in)
}
