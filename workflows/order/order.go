// Package order holds the order pipeline's workflow, OrderWorkflow (charge,
// mark paid, send receipt; mark failed after a decline), and how its runs
// start.
package order

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	steps "github.com/keyedhq/keyed/activities/order"
	refundsteps "github.com/keyedhq/keyed/activities/refund"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/pipeline"
	"github.com/keyedhq/keyed/step"
)

// Declarations returns the declaration of every activity a worker of the
// order workflow registers, in the order RegisterActivities registers
// them: the order pipeline's (steps.Declarations), then ApplyDecision
// (pipeline.DeclDecision). Each one's resolved options are its
// ActivityOptions.
func Declarations() []step.Declaration {
	return append(steps.Declarations(), pipeline.DeclDecision)
}

// RegisterActivities registers with r every activity the order workflow
// runs: acts's (steps.Activities.Definitions) and d's ApplyDecision,
// which the refund workflow runs too (register it once per worker; make d
// with every pipeline's Definitions, so that it checks each step's "done"
// at its provider). It returns activities.Register's error.
func RegisterActivities(r worker.ActivityRegistry, acts *steps.Activities, d *pipeline.Decider) error {
	return step.Register(r, append(acts.Definitions(), d.Definition())...)
}

// LongestRun returns the longest a run of either pipeline can take while it
// is retrying its steps: the larger of the sums of the RetryWindow of each
// declared order activity (steps.Declarations) and of each refund
// activity on a refund run's longest path (refundsteps.LongestPath). Effect
// records must be kept at least this long beyond the namespace's retention.
func LongestRun() time.Duration {
	return max(retryWindows(steps.Declarations()), retryWindows(refundsteps.LongestPath()))
}

// retryWindows returns the sum of the RetryWindow of each of decls.
func retryWindows(decls []step.Declaration) time.Duration {
	var total time.Duration
	for _, d := range decls {
		total += step.RetryWindow(d.ActivityOptions(""))
	}
	return total
}

// Register registers OrderWorkflow with r under orders.WorkflowName.
func Register(r worker.WorkflowRegistry) {
	RegisterWithOpts(r, nil)
}

// WorkflowOpts configures the order workflow a worker runs. A nil
// *WorkflowOpts means all defaults.
type WorkflowOpts struct {
	// DecisionTimeout is how long a run waits for an operator's decision
	// before it fails (DECISION_TIMEOUT). Zero means
	// pipeline.DefaultDecisionTimeout.
	// A change applies to waits that begin after it: a wait already begun
	// keeps the timer it started with.
	DecisionTimeout time.Duration
	// then runs after the receipt: the tests' stand-in for a step added
	// later (see runAddedStep).
	then func(workflow.Context, *pipeline.Run) error
}

// RegisterWithOpts registers the order workflow with r under
// orders.WorkflowName, configured by opts.
func RegisterWithOpts(r worker.WorkflowRegistry, opts *WorkflowOpts) {
	var popts pipeline.Opts
	var then func(workflow.Context, *pipeline.Run) error
	if opts != nil {
		popts.DecisionTimeout, then = opts.DecisionTimeout, opts.then
	}
	r.RegisterWorkflowWithOptions(func(ctx workflow.Context, in orders.OrderInput) (orders.OrderResult, error) {
		return orderWorkflow(ctx, in, &popts, then)
	}, workflow.RegisterOptions{Name: orders.WorkflowName})
}

// markFailedChange is the workflow.GetVersion change ID of marking the
// order failed after a terminal charge failure. Runs whose charge failed
// before the change (workflow.DefaultVersion) replay without the step.
const markFailedChange = "mark-failed-on-decline"

// OrderWorkflow charges the order, marks it paid and sends the receipt, each
// step once. It answers the pipeline.QueryStatus query with []pipeline.StepStatus:
// charge, mark_paid and receipt, plus mark_failed once that step has started;
// steps that will never run because an earlier one failed are
// pipeline.StateSkipped.
// It keeps the run's current details (workflow.SetCurrentDetails) as short
// markdown: each step's state, effect key and outcome ID.
//
// Its steps run through a pipeline.Run: a step that ends with an outcome
// keyed cannot know (Ambiguous, KeyReused, or retries that ran out) does
// not fail the run: the step is pipeline.StateWaiting, the KeyedAttention
// search attribute names it (such as "receipt:ambiguous"), and the run
// waits up to its decision timeout (WorkflowOpts) for an operator's
// pipeline.Decision, sent as the pipeline.UpdateDecide update. The decision
// is applied to the step's effect record (ApplyDecision, through
// effects.Resolve) and the step runs again in the same run: after
// ResolveRetry it acts again, after ResolveDone it returns the stored
// outcome. With no decision in time the run fails with a non-retryable
// error of type pipeline.ErrTypeDecisionTimeout.
//
// It returns a non-retryable application error of type
// step.ErrTypeInvalidInput, before any activity runs, for an input
// version it does not understand or IDs that cannot form an effect key; and
// the activity error of the first step that fails for good (a decline, an
// invalid state), in which case later steps do not run. When that step is
// the charge and its failure is terminal (see chargeFailedForGood), it first
// runs MarkFailed to move the order from pending to failed, and still
// returns the charge's error, of the same type (such as
// step.ErrTypeCardDeclined), whether or not MarkFailed succeeded.
func OrderWorkflow(ctx workflow.Context, in orders.OrderInput) (orders.OrderResult, error) {
	return orderWorkflow(ctx, in, nil, nil)
}

func orderWorkflow(ctx workflow.Context, in orders.OrderInput, opts *pipeline.Opts,
	then func(workflow.Context, *pipeline.Run) error) (orders.OrderResult, error) {
	var out orders.OrderResult
	if err := in.Validate(); err != nil {
		return out, temporal.NewNonRetryableApplicationError(
			fmt.Sprintf("order workflow %s/%s: %v", in.TenantID, in.OrderID, err), step.ErrTypeInvalidInput, nil)
	}
	o, err := pipeline.New(ctx, in, orderSteps, opts)
	if err != nil {
		return out, err
	}
	// Beside each step, the run's details show the ID of its outcome.
	intentID := func(r orders.ChargeResult) string { return r.PaymentIntentID }
	paid := func(r orders.MarkPaidResult) string { return r.Status }
	messageID := func(r orders.ReceiptResult) string { return r.MessageID }
	if err := runStep(ctx, o, steps.DeclCharge, &out.Charge, intentID); err != nil {
		if chargeFailedForGood(err) && workflow.GetVersion(ctx, markFailedChange, workflow.DefaultVersion, 1) >= 1 {
			markFailed(ctx, o)
		}
		return out, err
	}
	if err := runStep(ctx, o, steps.DeclMarkPaid, &out.Paid, paid); err != nil {
		return out, err
	}
	if err := runStep(ctx, o, steps.DeclSendReceipt, &out.Receipt, messageID); err != nil {
		return out, err
	}
	if then != nil {
		if err := then(ctx, o); err != nil {
			return out, err
		}
	}
	o.ShowDetails(ctx)
	return out, nil
}

// orderSteps lists the steps the status query shows from the start, in the
// order they run. MarkFailed joins them only when it runs.
var orderSteps = []step.Declaration{
	steps.DeclCharge.Declaration, steps.DeclMarkPaid.Declaration, steps.DeclSendReceipt.Declaration,
}

// runStep runs the order activity declared by k into out with
// pipeline.RunStep, which waits for a decision on an unknown outcome and
// shows outcome(*out) beside the step once it succeeds.
func runStep[T any](ctx workflow.Context, o *pipeline.Run, k step.Keyed[orders.OrderInput, T], out *T, outcome func(T) string) error {
	return pipeline.RunStep(ctx, o, k.Declaration, out, outcome)
}

// runAddedStep runs the step declared by k into out, as runStep does, in
// runs that reach it with the change changeID in effect: a step added to
// OrderWorkflow while runs are in flight. A run that passed this point
// before the change recorded no marker for changeID, so
// workflow.GetVersion returns workflow.DefaultVersion on its replay and the
// step is skipped, as it was then; without GetVersion that replay would
// schedule an activity its history does not have and fail as
// nondeterministic (TestReplayCatchesAStepAddedWithoutGetVersion).
func runAddedStep[T any](ctx workflow.Context, o *pipeline.Run, changeID string, k step.Keyed[orders.OrderInput, T], out *T) error {
	if workflow.GetVersion(ctx, changeID, workflow.DefaultVersion, 1) < 1 {
		return nil // a run from before the change
	}
	return runStep(ctx, o, k, out, nil)
}

// markFailed runs the mark_failed step. A failure is logged and shown in
// the status query; the charge's error remains the run's outcome either
// way.
func markFailed(ctx workflow.Context, o *pipeline.Run) {
	if _, err := o.Index(steps.DeclMarkFailed.Declaration); err != nil { // Only a tenant and order ID near the key limit.
		workflow.GetLogger(ctx).Error("cannot mark the order failed", "error", err.Error())
		return
	}
	var failed orders.MarkFailedResult
	if err := runStep(ctx, o, steps.DeclMarkFailed, &failed, func(r orders.MarkFailedResult) string { return r.Status }); err != nil {
		workflow.GetLogger(ctx).Warn("the order stays pending", "step", steps.DeclMarkFailed.Step, "error", err.Error())
	}
	o.ShowDetails(ctx)
}

// chargeFailedForGood reports whether err, the charge step's error, means
// the charge itself failed for good, so that the order is to be marked
// failed: an application error that is non-retryable or of a type the retry
// policy refuses to retry, such as CardDeclined or PaymentIncomplete. A
// missing order or an unusable input leaves nothing to mark. KeyReused and
// Ambiguous, a retryable failure that ran out of attempts or time
// (Transient, InProgress, a timeout), and a DecisionTimeout on any of them,
// leave open whether the card was charged; none of them counts, and
// MarkFailed would refuse them too.
func chargeFailedForGood(err error) bool {
	var app *temporal.ApplicationError
	if !errors.As(err, &app) {
		return false
	}
	switch app.Type() {
	case step.ErrTypeNotFound, step.ErrTypeInvalidInput, step.ErrTypeKeyReused, step.ErrTypeAmbiguous,
		pipeline.ErrTypeDecisionTimeout:
		return false
	}
	return app.NonRetryable() || slices.Contains(step.NonRetryableErrorTypes(), app.Type())
}
