package order

import (
	"context"
	"fmt"
	"strings"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"

	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/outbox"
	"github.com/keyedhq/keyed/pipeline"
)

// searchAttrOrderID is the typed key of the OrderID search attribute.
var searchAttrOrderID = temporal.NewSearchAttributeKeyKeyword(orders.SearchAttrOrderID)

// StartOpts configures StartOptions. A nil *StartOpts means all defaults.
type StartOpts struct {
	// TaskQueue is the workers' task queue. Empty means orders.TaskQueue.
	TaskQueue string
	// Order, if it is the order in names, adds the amount to the summary
	// and refuses a failed order.
	Order *orders.Order
}

// StartOptions returns the options of in's run, for pipeline.Start: the
// workflow ID derived from the order (duplicate starts collapse), reuse
// policy ALLOW_DUPLICATE_FAILED_ONLY (no second run after a success, a
// deliberate re-run after a failure), the TenantID and OrderID search
// attributes, a summary such as "tenant acme · order 9f3a · 12.50 EUR" and
// the tenant's fairness key (pipeline.TenantPriority).
// It returns an error wrapping orders.ErrFinal when opts.Order failed.
func StartOptions(in orders.OrderInput, opts *StartOpts) (client.StartWorkflowOptions, error) {
	if opts == nil {
		opts = &StartOpts{}
	}
	tq := opts.TaskQueue
	if tq == "" {
		tq = orders.TaskQueue
	}
	summary := []string{"tenant " + in.TenantID, "order " + in.OrderID}
	if o := opts.Order; o != nil && o.TenantID == in.TenantID && o.ID == in.OrderID {
		if err := o.CheckRunnable(); err != nil {
			return client.StartWorkflowOptions{}, fmt.Errorf("start order workflow: %w", err)
		}
		summary = append(summary, orders.FormatAmount(o.AmountMinor, o.Currency))
	}
	return client.StartWorkflowOptions{
		ID:                       in.WorkflowID(),
		TaskQueue:                tq,
		WorkflowIDConflictPolicy: enumspb.WORKFLOW_ID_CONFLICT_POLICY_USE_EXISTING,
		WorkflowIDReusePolicy:    enumspb.WORKFLOW_ID_REUSE_POLICY_ALLOW_DUPLICATE_FAILED_ONLY,
		TypedSearchAttributes: temporal.NewSearchAttributes(pipeline.SearchAttrTenantID.ValueSet(in.TenantID),
			searchAttrOrderID.ValueSet(in.OrderID)),
		StaticSummary: strings.Join(summary, " · "),
		Priority:      pipeline.TenantPriority(in.TenantID),
	}, nil
}

// Start starts (or joins) in's order run on c with StartOptions and
// pipeline.Start. It returns StartOptions' and pipeline.Start's errors.
func Start(ctx context.Context, c client.Client, in orders.OrderInput, opts *StartOpts) (*outbox.Started, error) {
	o, err := StartOptions(in, opts)
	if err != nil {
		return nil, err
	}
	return pipeline.Start(ctx, c, o, orders.WorkflowName, in)
}
