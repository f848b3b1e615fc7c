package order

import (
	"context"

	"go.temporal.io/sdk/client"

	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/outbox"
	"github.com/keyedhq/keyed/outbox/temporalstart"
	"github.com/keyedhq/keyed/refunds"
	refundflow "github.com/keyedhq/keyed/workflows/refund"
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
// does not decode to a valid input. A refund run (refunds.WorkflowName)
// gets what ConfigureRefundStart gives it.
func ConfigureOutboxStart(store *orders.Store) temporalstart.ConfigureFunc {
	return func(ctx context.Context, req outbox.Request, o *client.StartWorkflowOptions) error {
		if req.WorkflowType == refunds.WorkflowName {
			return ConfigureRefundStart(ctx, req, o)
		}
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

// ConfigureRefundStart gives a refund run started from the outbox what
// refundflow.StartOptions gives every refund run, the TenantID and OrderID
// search attributes of its order and a static summary, with the amount
// added to the summary when the row's Meta carries the currency, as
// refunds.StartRequest writes it: "refund r1 of order 9f3a · 5.00 USD". It
// returns an error wrapping outbox.ErrInvalid when req's payload does not
// decode to a valid refund input.
func ConfigureRefundStart(_ context.Context, req outbox.Request, o *client.StartWorkflowOptions) error {
	in, currency, err := refunds.FromStartRequest(req)
	if err != nil {
		return err
	}
	so := refundflow.StartOptions(in, o.TaskQueue)
	o.TypedSearchAttributes, o.StaticSummary = so.TypedSearchAttributes, so.StaticSummary
	if currency != "" {
		o.StaticSummary += " · " + orders.FormatAmount(in.AmountMinor, currency)
	}
	return nil
}
