// Package refund holds the refund pipeline's workflow, RefundWorkflow,
// and how its runs start.
package refund

import (
	"errors"
	"fmt"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	steps "github.com/keyedhq/keyed/activities/refund"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/pipeline"
	"github.com/keyedhq/keyed/refunds"
	"github.com/keyedhq/keyed/step"
)

// Register registers the refund workflow with r under refunds.WorkflowName,
// configured by opts (nil: defaults).
func Register(r worker.WorkflowRegistry, opts *pipeline.Opts) {
	r.RegisterWorkflowWithOptions(func(ctx workflow.Context, in refunds.RefundInput) (refunds.Result, error) {
		return refundWorkflow(ctx, in, opts)
	}, workflow.RegisterOptions{Name: refunds.WorkflowName})
}

// refundWorkflow refunds part or all of a paid order: Reserve,
// RefundAtStripe, MarkRefunded and SendRefundEmail, through a pipeline.Run.
// After Stripe's refusal for good it runs ReleaseRefund and fails with
// Stripe's error. It returns a non-retryable InvalidInput error for an
// input that does not Validate, and the first step's error that is final.
func refundWorkflow(ctx workflow.Context, in refunds.RefundInput, opts *pipeline.Opts) (refunds.Result, error) {
	var out refunds.Result
	if err := in.Validate(); err != nil {
		return out, temporal.NewNonRetryableApplicationError(
			fmt.Sprintf("refund workflow %s: %v", in.WorkflowID(), err), step.ErrTypeInvalidInput, nil)
	}
	r, err := pipeline.New(ctx, in, steps.LongestPath(), opts)
	if err != nil {
		return out, err
	}
	if err := runStep(ctx, r, steps.DeclReserve, &out.Reserve, nil); err != nil {
		return out, err
	}
	if err := runStep(ctx, r, steps.DeclStripe, &out.Stripe, func(s refunds.StripeResult) string { return s.RefundID }); err != nil {
		return out, release(ctx, r, err)
	}
	if err := runStep(ctx, r, steps.DeclMark, &out.Mark, func(m refunds.MarkResult) string { return m.Status }); err != nil {
		return out, err
	}
	if err := runStep(ctx, r, steps.DeclEmail, &out.Email, func(e refunds.EmailResult) string { return e.MessageID }); err != nil {
		return out, err
	}
	r.ShowDetails(ctx)
	return out, nil
}

// releaseChange is the workflow.GetVersion change ID of releasing the
// reservation of a refund Stripe refused: runs that failed on a refusal
// before it replay unchanged.
const releaseChange = "release-on-refusal"

// release runs ReleaseRefund when stripeErr is Stripe's refusal for good
// (ProviderRejected) and returns the error the run fails with; any other
// failure releases nothing.
func release(ctx workflow.Context, r *pipeline.Run, stripeErr error) error {
	var app *temporal.ApplicationError
	if !errors.As(stripeErr, &app) || app.Type() != step.ErrTypeProviderRejected {
		return stripeErr
	}
	if workflow.GetVersion(ctx, releaseChange, workflow.DefaultVersion, 1) < 1 {
		return stripeErr
	}
	var res refunds.ReleaseResult
	if err := runStep(ctx, r, steps.DeclRelease, &res, func(x refunds.ReleaseResult) string { return x.Code }); err != nil {
		return err
	}
	r.ShowDetails(ctx)
	return stripeErr
}

// runStep runs the refund activity declared by k into out with
// pipeline.RunStep, which waits for a decision on an unknown outcome and
// shows outcome(*out) beside the step once it succeeds.
func runStep[T any](ctx workflow.Context, r *pipeline.Run, k step.Keyed[refunds.RefundInput, T], out *T, outcome func(T) string) error {
	return pipeline.RunStep(ctx, r, k.Declaration, out, outcome)
}

// StartOptions returns the options of in's run, for pipeline.Start: the
// workflow ID derived from the refund, reuse policy
// ALLOW_DUPLICATE_FAILED_ONLY, the order's TenantID and OrderID search
// attributes (a search for an order finds its refunds), a summary and the
// tenant's fairness key (pipeline.TenantPriority).
func StartOptions(in refunds.RefundInput, taskQueue string) client.StartWorkflowOptions {
	return client.StartWorkflowOptions{
		ID:                       in.WorkflowID(),
		TaskQueue:                taskQueue,
		WorkflowIDReusePolicy:    enumspb.WORKFLOW_ID_REUSE_POLICY_ALLOW_DUPLICATE_FAILED_ONLY,
		WorkflowIDConflictPolicy: enumspb.WORKFLOW_ID_CONFLICT_POLICY_USE_EXISTING,
		TypedSearchAttributes: temporal.NewSearchAttributes(pipeline.SearchAttrTenantID.ValueSet(in.TenantID),
			temporal.NewSearchAttributeKeyKeyword(orders.SearchAttrOrderID).ValueSet(in.OrderID)),
		StaticSummary: "refund " + in.RefundID + " of order " + in.OrderID,
		Priority:      pipeline.TenantPriority(in.TenantID),
	}
}
