package refunds

import (
	"context"
	"errors"
	"fmt"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/pipeline"
	"github.com/keyedhq/keyed/step"
)

// RefundWorkflow refunds part or all of a paid order: Reserve (the ledger
// row, refused when it would exceed the charge), RefundAtStripe,
// MarkRefunded and SendRefundEmail, each its own activity with its own
// effect key and the options of its declaration. The workflow carries only
// the RefundInput; its ID derives from the refund (RefundInput.WorkflowID),
// so duplicate starts collapse into one run. Its steps run through a
// pipeline.Run: the status query (pipeline.QueryStatus, "status") returns
// each step's state and effect key as []pipeline.StepStatus, and the current
// details show them with each step's outcome ID (the Stripe refund, the
// order's status, the message ID).
//
// A step that ends with an outcome keyed cannot know (an ambiguous refund
// email, a reused key, a RefundAtStripe whose retries ran out) does not
// fail the run: it waits, with KeyedAttention set to such as
// "refund_email:ambiguous", for an operator's pipeline.Decision sent as the
// "decide" update, then runs the step again in the same run; with no
// decision within the decision timeout (DefaultDecisionTimeout unless
// RegisterWithOpts says otherwise) it fails with the non-retryable
// pipeline.ErrTypeDecisionTimeout error. A worker running it must register
// pipeline's ApplyDecision once (workflows.RegisterActivities does).
//
// It returns a non-retryable application error of type
// step.ErrTypeInvalidInput, before any activity runs, for an input
// that does not Validate, and, as a non-retryable application error of
// the step's type with the step's one-line message, the error of the
// first step that fails for good, in which case later steps do not run: a
// refund that exceeds what is left of the charge, or of an order that is
// not paid, ends at Reserve with InvalidState, with no ledger row and no
// Stripe call; Stripe's refusal for good (ProviderRejected) ends it at
// RefundAtStripe, after the ReleaseRefund step (behind the
// workflow.GetVersion change "release-on-refusal") gave the reservation
// back, so that what is left of the charge can be refunded under another
// refund ID. The status query shows the release step after the others; when
// it fails for good, the run fails with its error instead.
func RefundWorkflow(ctx workflow.Context, in RefundInput) (Result, error) {
	return refundWorkflow(ctx, in, nil)
}

func refundWorkflow(ctx workflow.Context, in RefundInput, opts *pipeline.Opts) (Result, error) {
	var out Result
	if err := in.Validate(); err != nil {
		return out, temporal.NewNonRetryableApplicationError(
			fmt.Sprintf("refund workflow %s: %v", in.WorkflowID(), err), step.ErrTypeInvalidInput, nil)
	}
	r, err := pipeline.New(ctx, in, steps(), opts)
	if err != nil {
		return out, err
	}
	if err := runStep(ctx, r, DeclReserve, &out.Reserve, nil); err != nil {
		return out, err
	}
	if err := runStep(ctx, r, DeclStripe, &out.Stripe, func(s StripeResult) string { return s.RefundID }); err != nil {
		return out, release(ctx, r, err)
	}
	if err := runStep(ctx, r, DeclMark, &out.Mark, func(m MarkResult) string { return m.Status }); err != nil {
		return out, err
	}
	if err := runStep(ctx, r, DeclEmail, &out.Email, func(e EmailResult) string { return e.MessageID }); err != nil {
		return out, err
	}
	r.ShowDetails(ctx)
	return out, nil
}

// releaseChange is the workflow.GetVersion change ID of releasing the
// reservation of a refund Stripe refused: runs that failed on a refusal
// before it replay unchanged.
const releaseChange = "release-on-refusal"

// release runs ReleaseRefund when stripeErr, the error RefundAtStripe
// failed with, is Stripe's refusal for good (ProviderRejected), and returns
// the error the run fails with: stripeErr, or the release step's own error
// when it failed. Any other failure (a decision timeout, an invalid state)
// comes back unchanged, releasing nothing.
func release(ctx workflow.Context, r *pipeline.Run, stripeErr error) error {
	var app *temporal.ApplicationError
	if !errors.As(stripeErr, &app) || app.Type() != step.ErrTypeProviderRejected {
		return stripeErr
	}
	if workflow.GetVersion(ctx, releaseChange, workflow.DefaultVersion, 1) < 1 {
		return stripeErr
	}
	var res ReleaseResult
	if err := runStep(ctx, r, DeclRelease, &res, func(x ReleaseResult) string { return x.Code }); err != nil {
		return err
	}
	r.ShowDetails(ctx)
	return stripeErr
}

// runStep runs the refund activity declared by k into out with
// pipeline.RunStep, which waits for a decision on an unknown outcome and
// shows outcome(*out) beside the step once it succeeds.
func runStep[T any](ctx workflow.Context, r *pipeline.Run, k step.Keyed[RefundInput, T], out *T, outcome func(T) string) error {
	return pipeline.RunStep(ctx, r, k.Declaration, out, outcome)
}

// Register registers RefundWorkflow with r under WorkflowName.
func Register(r worker.WorkflowRegistry) {
	r.RegisterWorkflowWithOptions(RefundWorkflow, workflow.RegisterOptions{Name: WorkflowName})
}

// RegisterWithOpts registers the refund workflow with r under
// WorkflowName, configured by opts (a nil opts means all defaults, as
// Register). opts.DecisionTimeout is how long a run waits for an
// operator's decision (DECISION_TIMEOUT).
func RegisterWithOpts(r worker.WorkflowRegistry, opts *pipeline.Opts) {
	var o pipeline.Opts
	if opts != nil {
		o = *opts
	}
	r.RegisterWorkflowWithOptions(func(ctx workflow.Context, in RefundInput) (Result, error) {
		return refundWorkflow(ctx, in, &o)
	}, workflow.RegisterOptions{Name: WorkflowName})
}

// RegisterActivities registers a's activities (Definitions) with r through
// step.Register, which refuses an undeclared or duplicate one. It
// does not register pipeline's ApplyDecision, which the refund workflow
// runs on a decision: a worker registers that once for all its pipelines
// (workflows.RegisterActivities, or pipeline.Decider.Definition).
func RegisterActivities(r worker.ActivityRegistry, a *Activities) error {
	return step.Register(r, a.Definitions()...)
}

// StartOptions returns the options every start of in's refund uses: the
// workflow ID derived from the refund, so that a start while the run is
// going joins it (conflict policy USE_EXISTING), one after it succeeded is
// refused and one after it failed runs again (reuse policy
// ALLOW_DUPLICATE_FAILED_ONLY), the task queue, the order's TenantID and
// OrderID search attributes (so that a search for an order in the Web UI
// finds its refunds too), and a static summary such as "refund r1 of order
// 9f3a".
func StartOptions(in RefundInput, taskQueue string) client.StartWorkflowOptions {
	return client.StartWorkflowOptions{
		ID:                       in.WorkflowID(),
		TaskQueue:                taskQueue,
		WorkflowIDReusePolicy:    enumspb.WORKFLOW_ID_REUSE_POLICY_ALLOW_DUPLICATE_FAILED_ONLY,
		WorkflowIDConflictPolicy: enumspb.WORKFLOW_ID_CONFLICT_POLICY_USE_EXISTING,
		TypedSearchAttributes: temporal.NewSearchAttributes(
			temporal.NewSearchAttributeKeyKeyword(orders.SearchAttrTenantID).ValueSet(in.TenantID),
			temporal.NewSearchAttributeKeyKeyword(orders.SearchAttrOrderID).ValueSet(in.OrderID)),
		StaticSummary: "refund " + in.RefundID + " of order " + in.OrderID,
	}
}

// Start starts in's refund on taskQueue with StartOptions and returns its
// run: a new one, the run already going, or the one that already succeeded
// (Temporal refuses a new run then, and Start hands back the finished one,
// so that a repeated start reads the same result). It returns an error
// wrapping ErrInvalidInput (or the key's) for an input that does not
// Validate, and Temporal's other errors.
func Start(ctx context.Context, c client.Client, in RefundInput, taskQueue string) (client.WorkflowRun, error) {
	if err := in.Validate(); err != nil {
		return nil, fmt.Errorf("start refund %s: %w", in.WorkflowID(), err)
	}
	run, err := c.ExecuteWorkflow(ctx, StartOptions(in, taskQueue), WorkflowName, in)
	var started *serviceerror.WorkflowExecutionAlreadyStarted
	if errors.As(err, &started) {
		return c.GetWorkflow(ctx, in.WorkflowID(), started.RunId), nil
	}
	if err != nil {
		return nil, fmt.Errorf("start refund %s: %w", in.WorkflowID(), err)
	}
	return run, nil
}
