package order

import (
	"context"

	"go.temporal.io/sdk/client"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/outbox"
)

// configure gives an order run started from the outbox what StartOptions
// gives it, with the amount the row's Meta carries. Only a row without an
// amount loads the order from db (when db is not nil); an order that cannot
// be loaded still starts (the run reports it missing), a failed one is
// refused with orders.ErrFinal. A payload that does not decode is an error
// wrapping outbox.ErrInvalid.
func configure(ctx context.Context, db effects.DB, req outbox.Request, o *client.StartWorkflowOptions) error {
	in, order, err := orders.FromStartRequest(req)
	if err != nil {
		return err
	}
	if order == nil && db != nil {
		store, err := orders.NewStore(db)
		if err != nil {
			return err
		}
		if order, err = store.Get(ctx, in.TenantID, in.OrderID); err != nil {
			order = nil
		}
	}
	so, err := StartOptions(in, &StartOpts{TaskQueue: o.TaskQueue, Order: order})
	if err != nil {
		return err
	}
	o.TypedSearchAttributes, o.StaticSummary, o.Priority = so.TypedSearchAttributes, so.StaticSummary, so.Priority
	return nil
}

// final reports whether the failed order run workflowID ended a declined
// order: its order is failed, which is final.
func final(ctx context.Context, db effects.DB, workflowID string) bool {
	tenant, id, ok := orders.ParseWorkflowID(workflowID)
	if !ok || db == nil {
		return false
	}
	store, err := orders.NewStore(db)
	if err != nil {
		return false
	}
	o, err := store.Get(ctx, tenant, id)
	return err == nil && o.Status == orders.StatusFailed
}
