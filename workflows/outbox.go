package workflows

import (
	"context"

	"go.temporal.io/sdk/client"

	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/outbox"
	"github.com/keyedhq/keyed/outbox/temporalstart"
)

// ConfigureOutboxStart returns the temporalstart.ConfigureFunc that gives an
// order run started from the outbox what Start gives it: the TenantID and
// OrderID search attributes and the static summary, with the amount the
// row's Meta carries (see orders.EnqueueTx). Only for a row that carries no
// amount (enqueued by code older than migration 0012 after it ran, or
// without its order) does it load the order from store, when store is not
// nil; an order that cannot be loaded is still started (the workflow reports
// it missing), and a loaded order that failed is refused with an error
// wrapping orders.ErrFinal, as Start refuses it. Requests of other workflow
// types pass through untouched, so one relay can start them too. It returns
// an error wrapping outbox.ErrInvalid for an order request whose payload
// does not decode to a valid input.
func ConfigureOutboxStart(store *orders.Store) temporalstart.ConfigureFunc {
	return func(ctx context.Context, req outbox.Request, o *client.StartWorkflowOptions) error {
		if req.WorkflowType != orders.WorkflowName {
			return nil
		}
		in, order, err := orders.FromStartRequest(req)
		if err != nil {
			return err
		}
		if order == nil && store != nil {
			if order, err = store.Get(ctx, in.TenantID, in.OrderID); err != nil {
				order = nil
			} else if err := order.CheckRunnable(); err != nil {
				return err
			}
		}
		so := StartOptions(in, &StartOpts{TaskQueue: o.TaskQueue, Order: order})
		o.TypedSearchAttributes = so.TypedSearchAttributes
		o.StaticSummary = so.StaticSummary
		return nil
	}
}
