package order

import (
	"context"
	"errors"
	"fmt"
	"strings"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"
	"golang.org/x/sync/singleflight"

	"github.com/keyedhq/keyed/orders"
)

// Search attribute keys set on every order run. Register them as Keyword
// attributes on the namespace.
var (
	SearchAttrTenantID = temporal.NewSearchAttributeKeyKeyword(orders.SearchAttrTenantID)
	SearchAttrOrderID  = temporal.NewSearchAttributeKeyKeyword(orders.SearchAttrOrderID)
)

// StartOpts configures StartOptions and Start. A nil *StartOpts means all
// defaults.
type StartOpts struct {
	// TaskQueue is the workers' task queue. Empty means orders.TaskQueue.
	TaskQueue string
	// Order, if set, adds the amount to the run's static summary. It must
	// be the order the input names; another order is ignored.
	Order *orders.Order
}

// Started identifies the order run a Start led to.
type Started struct {
	WorkflowID string
	RunID      string
	// Created is true when this start created the run, and false when it
	// collapsed into the run already going or was refused because the order
	// already completed; RunID is then that run's.
	Created bool
}

// StartOptions returns the options every starter uses for in's run: the
// workflow ID derived from the order (in.WorkflowID()), conflict policy
// USE_EXISTING (a duplicate start while a run is going returns that run),
// reuse policy ALLOW_DUPLICATE_FAILED_ONLY (no second run after a success; a
// deliberate re-run after a failure), the TenantID and OrderID search
// attributes, and a static summary such as "tenant acme · order 9f3a ·
// 12.50 EUR" (the amount only when opts.Order is set).
func StartOptions(in orders.OrderInput, opts *StartOpts) client.StartWorkflowOptions {
	if opts == nil {
		opts = &StartOpts{}
	}
	tq := opts.TaskQueue
	if tq == "" {
		tq = orders.TaskQueue
	}
	summary := []string{"tenant " + in.TenantID, "order " + in.OrderID}
	if o := opts.Order; o != nil && o.TenantID == in.TenantID && o.ID == in.OrderID {
		summary = append(summary, orders.FormatAmount(o.AmountMinor, o.Currency))
	}
	return client.StartWorkflowOptions{
		ID:                       in.WorkflowID(),
		TaskQueue:                tq,
		WorkflowIDConflictPolicy: enumspb.WORKFLOW_ID_CONFLICT_POLICY_USE_EXISTING,
		WorkflowIDReusePolicy:    enumspb.WORKFLOW_ID_REUSE_POLICY_ALLOW_DUPLICATE_FAILED_ONLY,
		TypedSearchAttributes:    temporal.NewSearchAttributes(SearchAttrTenantID.ValueSet(in.TenantID), SearchAttrOrderID.ValueSet(in.OrderID)),
		StaticSummary:            strings.Join(summary, " · "),
	}
}

// Start starts in's order run with StartOptions, and says whether it created
// it.
//
// The SDK (v1.51) does not surface the server's "started" flag: with
// USE_EXISTING, ExecuteWorkflow returns the same WorkflowRun whether the
// server created a run or handed back the one already going. So Start sends
// the same options with conflict policy FAIL and
// WorkflowExecutionErrorWhenAlreadyStarted, and lets the server decide in
// the one atomic start call: success means this call created the run; a
// WorkflowExecutionAlreadyStarted error means a run is going, or the reuse
// policy refused a new one after a success, and carries that run's ID. The
// outcome for the caller is what USE_EXISTING gives (the running run's IDs),
// plus an exact Created.
//
// Concurrent calls for one workflow ID in this process share one request
// (a singleflight): one of them reports Created, the others collapsed, and
// all share its outcome, a cancellation of the first caller's context
// included.
//
// It returns an error wrapping orders.ErrUnsupportedVersion or
// effects.ErrInvalidKey for a bad input, and one wrapping orders.ErrFinal
// when opts.Order is a failed order (a failed order is final), before
// calling Temporal; and the client's error if the start fails otherwise.
func Start(ctx context.Context, c client.Client, in orders.OrderInput, opts *StartOpts) (*Started, error) {
	if err := in.Validate(); err != nil {
		return nil, fmt.Errorf("start order workflow: %w", err)
	}
	if c == nil {
		return nil, errors.New("start order workflow: client is nil")
	}
	if o := optsOrder(in, opts); o != nil {
		if err := o.CheckRunnable(); err != nil {
			return nil, fmt.Errorf("start order workflow: %w", err)
		}
	}
	o := StartOptions(in, opts)
	leader := false
	v, err, _ := starts.Do(fmt.Sprintf("%p\x00%s\x00%s", c, o.TaskQueue, o.ID), func() (any, error) {
		leader = true
		return start(ctx, c, o, in)
	})
	if err != nil {
		return nil, err
	}
	st := *v.(*Started)
	st.Created = st.Created && leader
	return &st, nil
}

// starts collapses concurrent starts of one workflow ID, through one client
// and task queue, into one request to the server: a storm of duplicate
// starts in one process costs one round trip. The server and its workflow
// ID policies still decide across processes.
var starts singleflight.Group

// optsOrder returns opts.Order when it is the order in names.
func optsOrder(in orders.OrderInput, opts *StartOpts) *orders.Order {
	if opts == nil || opts.Order == nil || opts.Order.TenantID != in.TenantID || opts.Order.ID != in.OrderID {
		return nil
	}
	return opts.Order
}

// start makes the one start request: conflict policy FAIL with
// WorkflowExecutionErrorWhenAlreadyStarted, so that the server says whether
// it created the run (see Start).
func start(ctx context.Context, c client.Client, o client.StartWorkflowOptions, in orders.OrderInput) (*Started, error) {
	o.WorkflowIDConflictPolicy = enumspb.WORKFLOW_ID_CONFLICT_POLICY_FAIL
	o.WorkflowExecutionErrorWhenAlreadyStarted = true
	run, err := c.ExecuteWorkflow(ctx, o, orders.WorkflowName, in)
	var already *serviceerror.WorkflowExecutionAlreadyStarted
	if errors.As(err, &already) {
		return &Started{WorkflowID: o.ID, RunID: already.RunId, Created: false}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("start order workflow %s: %w", o.ID, err)
	}
	return &Started{WorkflowID: run.GetID(), RunID: run.GetRunID(), Created: true}, nil
}
