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

	"github.com/keyedhq/keyed/activities"
	"github.com/keyedhq/keyed/orders"
)

// RefundWorkflow refunds part or all of a paid order: Reserve (the ledger
// row, refused when it would exceed the charge), RefundAtStripe,
// MarkRefunded and SendRefundEmail, each its own activity with its own
// effect key and the options of its declaration. The workflow carries only
// the RefundInput; its ID derives from the refund (RefundInput.WorkflowID),
// so duplicate starts collapse into one run. Its status query
// (orders.QueryStatus, "status") returns each step's state and effect key
// as []orders.StepStatus.
//
// It returns a non-retryable application error of type
// activities.ErrTypeInvalidInput, before any activity runs, for an input
// that does not Validate, and the error of the first step that fails for
// good, in which case later steps do not run: a refund that exceeds what is
// left of the charge, or of an order that is not paid, ends at Reserve with
// InvalidState, with no ledger row and no Stripe call.
func RefundWorkflow(ctx workflow.Context, in RefundInput) (Result, error) {
	var out Result
	if err := in.Validate(); err != nil {
		return out, temporal.NewNonRetryableApplicationError(
			fmt.Sprintf("refund workflow %s: %v", in.WorkflowID(), err), activities.ErrTypeInvalidInput, nil)
	}
	steps := []struct {
		decl activities.Declaration
		out  any
	}{
		{DeclReserve.Declaration, &out.Reserve}, {DeclStripe.Declaration, &out.Stripe}, {DeclMark.Declaration, &out.Mark},
		{DeclEmail.Declaration, &out.Email},
	}
	status := make([]orders.StepStatus, len(steps))
	for i, s := range steps {
		key, err := in.EffectKey(s.decl.Step)
		if err != nil { // Validate checked the keys; this cannot happen.
			return out, temporal.NewNonRetryableApplicationError(err.Error(), activities.ErrTypeInvalidInput, nil)
		}
		status[i] = orders.StepStatus{Step: s.decl.Step, EffectKey: key.String(), State: StatePending}
	}
	err := workflow.SetQueryHandler(ctx, orders.QueryStatus, func() ([]orders.StepStatus, error) {
		return append([]orders.StepStatus(nil), status...), nil
	})
	if err != nil {
		return out, fmt.Errorf("register status query: %w", err)
	}
	for i, s := range steps {
		st := &status[i]
		st.State = StateRunning
		actx := workflow.WithActivityOptions(ctx, s.decl.ActivityOptions(st.EffectKey))
		if err := workflow.ExecuteActivity(actx, s.decl.Name, in).Get(ctx, s.out); err != nil {
			st.State, st.Error = StateFailed, err.Error()
			for j := i + 1; j < len(status); j++ {
				status[j].State = StateSkipped
			}
			workflow.GetLogger(ctx).Error("refund step failed", "step", st.Step, "effect_key", st.EffectKey, "error", err)
			return out, err
		}
		st.State = StateDone
	}
	return out, nil
}

// Step states reported by the status query (orders.QueryStatus), as the
// order workflow reports them.
const (
	StatePending = "pending"
	StateRunning = "running"
	StateDone    = "done"
	StateFailed  = "failed"
	StateSkipped = "skipped"
)

// Register registers RefundWorkflow with r under WorkflowName.
func Register(r worker.WorkflowRegistry) {
	r.RegisterWorkflowWithOptions(RefundWorkflow, workflow.RegisterOptions{Name: WorkflowName})
}

// RegisterActivities registers a's activities (Definitions) with r through
// activities.Register, which refuses an undeclared or duplicate one.
func RegisterActivities(r worker.ActivityRegistry, a *Activities) error {
	return activities.Register(r, a.Definitions()...)
}

// StartOptions returns the options every start of in's refund uses: the
// workflow ID derived from the refund, so that a start while the run is
// going joins it (conflict policy USE_EXISTING), one after it succeeded is
// refused and one after it failed runs again (reuse policy
// ALLOW_DUPLICATE_FAILED_ONLY), and the task queue.
func StartOptions(in RefundInput, taskQueue string) client.StartWorkflowOptions {
	return client.StartWorkflowOptions{
		ID:                       in.WorkflowID(),
		TaskQueue:                taskQueue,
		WorkflowIDReusePolicy:    enumspb.WORKFLOW_ID_REUSE_POLICY_ALLOW_DUPLICATE_FAILED_ONLY,
		WorkflowIDConflictPolicy: enumspb.WORKFLOW_ID_CONFLICT_POLICY_USE_EXISTING,
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
