// Package workflows holds the order pipeline's Temporal workflow and the one
// way to start it.
//
// OrderWorkflow runs three steps, each its own activity with its own effect
// key: charge, mark paid, send receipt. The workflow carries only the
// versioned orders.OrderInput; the activities load the order when they
// run and make their effects exactly once (see package activities). A step
// that fails terminally fails the workflow; later steps do not run. A charge
// that fails terminally (a decline) first marks the order failed, through
// the fourth step, mark failed. A step whose outcome keyed cannot know
// (ambiguous, a reused key, retries that ran out) does not fail the run: it
// waits, with the KeyedAttention search attribute set, for an operator's
// Decision sent as the UpdateDecide update, applied by the ApplyDecision
// activity (Decider), and the step runs again in the same run.
//
// Start starts it under a workflow ID derived from the order, so that a
// duplicate start collapses into the run already going, a start after a
// success is refused, and a start after a failure is a deliberate re-run.
// ListAttention, AttentionOf and SendDecision are the operator's side of the
// waiting.
package workflows

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/keyedhq/keyed/activities"
	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/refunds"
)

// Step states reported by the status query.
const (
	StatePending = "pending"
	StateRunning = "running"
	StateDone    = "done"
	StateFailed  = "failed"
	// StateWaiting: the step's outcome is unknown and the run waits for an
	// operator's decision (see UpdateDecide).
	StateWaiting = "waiting"
	// StateSkipped: the step will never run, because an earlier one failed.
	StateSkipped = "skipped"
)

// Activity timeouts, the defaults of activities.Declaration.ActivityOptions
// (see there for which class gets which).
const (
	ExternalStartToClose = activities.ExternalStartToClose
	HeartbeatTimeout     = activities.HeartbeatTimeout
	DatabaseStartToClose = activities.DatabaseStartToClose
	StepScheduleToClose  = activities.StepScheduleToClose
)

// RetryPolicy returns the retry policy of every step: activities.RetryPolicy.
func RetryPolicy() *temporal.RetryPolicy { return activities.RetryPolicy() }

// ActivityOptions returns the options of the order activity declared with
// step (orders.StepCharge, StepMarkPaid, StepReceipt or StepMarkFailed)
// whose effect key is key: its declaration's ActivityOptions. An undeclared
// step gets the options of an external create.
func ActivityOptions(step, key string) workflow.ActivityOptions {
	for _, d := range activities.Declarations() {
		if d.Step == step {
			return d.ActivityOptions(key)
		}
	}
	return activities.Declaration{Class: effects.ClassExternalCreate, Step: step}.ActivityOptions(key)
}

// Declarations returns the declaration of every activity a worker of the
// order workflow registers, in the order RegisterActivities registers
// them: the order pipeline's (activities.Declarations), then ApplyDecision.
// Each one's resolved options are its ActivityOptions.
func Declarations() []activities.Declaration {
	return append(activities.Declarations(), decisionDecl)
}

// RegisterActivities registers with r every activity the order workflow
// runs: acts's (activities.Activities.Definitions) and d's ApplyDecision.
// It returns activities.Register's error.
func RegisterActivities(r worker.ActivityRegistry, acts *activities.Activities, d *Decider) error {
	return activities.Register(r, append(acts.Definitions(), d.Definition())...)
}

// RetryWindow returns the longest time one step with options o can keep
// retrying: its schedule-to-close timeout, or, when the retry policy caps
// the attempts and that is sooner, every attempt running to its
// start-to-close timeout plus every backoff. It is what an effect record
// must outlive.
func RetryWindow(o workflow.ActivityOptions) time.Duration {
	p := o.RetryPolicy
	if p == nil || p.MaximumAttempts <= 0 {
		return o.ScheduleToCloseTimeout // Unbounded attempts: only a schedule-to-close bounds them.
	}
	total := time.Duration(p.MaximumAttempts) * o.StartToCloseTimeout
	interval := p.InitialInterval
	for i := int32(1); i < p.MaximumAttempts; i++ {
		total += interval
		interval = min(time.Duration(float64(interval)*p.BackoffCoefficient), p.MaximumInterval)
	}
	if o.ScheduleToCloseTimeout > 0 {
		return min(total, o.ScheduleToCloseTimeout)
	}
	return total
}

// LongestRun returns the longest a run of either pipeline can take while it
// is retrying its steps: the larger of the sums of the RetryWindow of each
// declared order activity (activities.Declarations) and of each refund
// activity (refunds.Declarations). Effect records must be kept at least this
// long beyond the namespace's retention.
func LongestRun() time.Duration {
	return max(retryWindows(activities.Declarations()), retryWindows(refunds.Declarations()))
}

// retryWindows returns the sum of the RetryWindow of each of decls.
func retryWindows(decls []activities.Declaration) time.Duration {
	var total time.Duration
	for _, d := range decls {
		total += RetryWindow(d.ActivityOptions(""))
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
	// before it fails (DECISION_TIMEOUT). Zero means DefaultDecisionTimeout.
	// A change applies to waits that begin after it: a wait already begun
	// keeps the timer it started with.
	DecisionTimeout time.Duration
	// then runs after the receipt: the tests' stand-in for a step added
	// later (see runAddedStep).
	then func(workflow.Context, *orderRun) error
}

// RegisterWithOpts registers the order workflow with r under
// orders.WorkflowName, configured by opts.
func RegisterWithOpts(r worker.WorkflowRegistry, opts *WorkflowOpts) {
	timeout := DefaultDecisionTimeout
	var then func(workflow.Context, *orderRun) error
	if opts != nil {
		then = opts.then
		if opts.DecisionTimeout > 0 {
			timeout = opts.DecisionTimeout
		}
	}
	r.RegisterWorkflowWithOptions(func(ctx workflow.Context, in orders.OrderInput) (orders.OrderResult, error) {
		return orderWorkflow(ctx, in, timeout, then)
	}, workflow.RegisterOptions{Name: orders.WorkflowName})
}

// markFailedChange is the workflow.GetVersion change ID of marking the
// order failed after a terminal charge failure. Runs whose charge failed
// before the change (workflow.DefaultVersion) replay without the step.
const markFailedChange = "mark-failed-on-decline"

// OrderWorkflow charges the order, marks it paid and sends the receipt, each
// step once. It answers the orders.QueryStatus query with []orders.StepStatus:
// charge, mark_paid and receipt, plus mark_failed once that step has started;
// steps that will never run because an earlier one failed are StateSkipped.
// It keeps the run's current details (workflow.SetCurrentDetails) as short
// markdown: each step's state, effect key and outcome ID.
//
// A step that ends with an outcome keyed cannot know (see needsAttention:
// Ambiguous, KeyReused, or retries that ran out) does not fail the run: the
// step is StateWaiting, the KeyedAttention search attribute names it (such
// as "receipt:ambiguous"), and the run waits up to its decision timeout
// (WorkflowOpts) for an operator's Decision, sent as the UpdateDecide update. The decision is
// applied to the step's effect record (ApplyDecision, through
// effects.Resolve) and the step runs again in the same run: after
// ResolveRetry it acts again, after ResolveDone it returns the stored
// outcome. With no decision in time the run fails with a non-retryable
// error of type ErrTypeDecisionTimeout.
//
// It returns a non-retryable application error of type
// activities.ErrTypeInvalidInput, before any activity runs, for an input
// version it does not understand or IDs that cannot form an effect key; and
// the activity error of the first step that fails for good (a decline, an
// invalid state), in which case later steps do not run. When that step is
// the charge and its failure is terminal (see chargeFailedForGood), it first
// runs MarkFailed to move the order from pending to failed, and still
// returns the charge's error, of the same type (such as
// activities.ErrTypeCardDeclined), whether or not MarkFailed succeeded.
func OrderWorkflow(ctx workflow.Context, in orders.OrderInput) (orders.OrderResult, error) {
	return orderWorkflow(ctx, in, DefaultDecisionTimeout, nil)
}

func orderWorkflow(ctx workflow.Context, in orders.OrderInput, decisionTimeout time.Duration,
	then func(workflow.Context, *orderRun) error) (orders.OrderResult, error) {
	var out orders.OrderResult
	if err := in.Validate(); err != nil {
		return out, temporal.NewNonRetryableApplicationError(
			fmt.Sprintf("order workflow %s/%s: %v", in.TenantID, in.OrderID, err), activities.ErrTypeInvalidInput, nil)
	}
	o, err := newOrderRun(ctx, in)
	if err != nil {
		return out, err
	}
	o.decisionTimeout = decisionTimeout
	// Beside each step, the run's details show the ID of its outcome.
	intentID := func(r orders.ChargeResult) string { return r.PaymentIntentID }
	paid := func(r orders.MarkPaidResult) string { return r.Status }
	messageID := func(r orders.ReceiptResult) string { return r.MessageID }
	if err := runStep(ctx, o, activities.DeclCharge, &out.Charge, intentID); err != nil {
		if chargeFailedForGood(err) && workflow.GetVersion(ctx, markFailedChange, workflow.DefaultVersion, 1) >= 1 {
			o.markFailed(ctx)
		}
		return out, err
	}
	if err := runStep(ctx, o, activities.DeclMarkPaid, &out.Paid, paid); err != nil {
		return out, err
	}
	if err := runStep(ctx, o, activities.DeclSendReceipt, &out.Receipt, messageID); err != nil {
		return out, err
	}
	if then != nil {
		if err := then(ctx, o); err != nil {
			return out, err
		}
	}
	o.showDetails(ctx)
	return out, nil
}

// pipeline lists the steps the status query shows from the start, in the
// order they run. MarkFailed joins them only when it runs.
var pipeline = []activities.Declaration{
	activities.DeclCharge.Declaration, activities.DeclMarkPaid.Declaration, activities.DeclSendReceipt.Declaration,
}

// orderRun is one run's state: its input, the steps' status and outcomes,
// and the decision being waited for.
type orderRun struct {
	in      orders.OrderInput
	status  []orders.StepStatus
	outcome []string
	wait    *waiting
	// decisionTimeout bounds each wait for an operator's decision.
	decisionTimeout time.Duration
}

func newOrderRun(ctx workflow.Context, in orders.OrderInput) (*orderRun, error) {
	o := &orderRun{in: in}
	for _, d := range pipeline {
		if _, err := o.index(d); err != nil { // Validate checked the key; this cannot happen.
			return nil, temporal.NewNonRetryableApplicationError(err.Error(), activities.ErrTypeInvalidInput, nil)
		}
	}
	err := workflow.SetQueryHandler(ctx, orders.QueryStatus, func() ([]orders.StepStatus, error) {
		return append([]orders.StepStatus(nil), o.status...), nil
	})
	if err != nil {
		return nil, fmt.Errorf("register status query: %w", err)
	}
	if err := o.setDecideHandler(ctx); err != nil {
		return nil, err
	}
	o.showDetails(ctx)
	return o, nil
}

// index returns the position of d's step in the status query, adding it
// (pending) when it is not there yet. It returns an error when the run's
// input cannot key d's step.
func (o *orderRun) index(d activities.Declaration) (int, error) {
	for i, s := range o.status {
		if s.Step == d.Step {
			return i, nil
		}
	}
	key, err := o.in.EffectKey(d.Step)
	if err != nil {
		return 0, fmt.Errorf("derive the effect key of %s: %w", d.Step, err)
	}
	o.status = append(o.status, orders.StepStatus{Step: d.Step, EffectKey: key.String(), State: StatePending})
	o.outcome = append(o.outcome, "")
	return len(o.status) - 1, nil
}

// runStep runs the activity declared by k into out (see orderRun.run) and,
// once it succeeds, shows outcome(*out) beside the step when outcome is not
// nil. It returns an error when the input cannot key the step, and run's
// error.
func runStep[T any](ctx workflow.Context, o *orderRun, k activities.Keyed[T], out *T, outcome func(T) string) error {
	i, err := o.index(k.Declaration)
	if err != nil {
		return temporal.NewNonRetryableApplicationError(err.Error(), activities.ErrTypeInvalidInput, nil)
	}
	if err := o.run(ctx, i, k.Declaration, out); err != nil {
		return err
	}
	if outcome != nil {
		o.outcome[i] = outcome(*out)
	}
	return nil
}

// runAddedStep runs the step declared by k into out, as runStep does, in
// runs that reach it with the change changeID in effect: a step added to
// OrderWorkflow while runs are in flight. A run that passed this point
// before the change recorded no marker for changeID, so
// workflow.GetVersion returns workflow.DefaultVersion on its replay and the
// step is skipped, as it was then; without GetVersion that replay would
// schedule an activity its history does not have and fail as
// nondeterministic (TestReplayCatchesAStepAddedWithoutGetVersion).
func runAddedStep[T any](ctx workflow.Context, o *orderRun, changeID string, k activities.Keyed[T], out *T) error {
	if workflow.GetVersion(ctx, changeID, workflow.DefaultVersion, 1) < 1 {
		return nil // a run from before the change
	}
	return runStep(ctx, o, k, out, nil)
}

// run executes step i's activity, declared by d, into result. When the step
// ends with an outcome keyed cannot know, it waits for a decision and runs
// the step again; otherwise a failure marks the later steps skipped and is
// returned.
func (o *orderRun) run(ctx workflow.Context, i int, d activities.Declaration, result any) error {
	s := &o.status[i]
	for {
		s.State, s.Error = StateRunning, ""
		o.showDetails(ctx)
		actx := workflow.WithActivityOptions(ctx, d.ActivityOptions(s.EffectKey))
		err := workflow.ExecuteActivity(actx, d.Name, o.in).Get(ctx, result)
		if err == nil {
			s.State = StateDone
			return nil
		}
		s.State, s.Error = StateFailed, stepError(err)
		workflow.GetLogger(ctx).Error("order step failed", "step", s.Step, "effect_key", s.EffectKey, "error", s.Error)
		reason, unknown := needsAttention(err)
		if !unknown || workflow.GetVersion(ctx, attentionChange, workflow.DefaultVersion, 1) < 1 {
			o.skipAfter(i)
			o.showDetails(ctx)
			return finalError(err)
		}
		if err := o.awaitDecision(ctx, i, reason, err); err != nil {
			o.skipAfter(i)
			o.showDetails(ctx)
			return err
		}
	}
}

// markFailed runs the mark_failed step. A failure is logged and shown in
// the status query; the charge's error remains the run's outcome either
// way.
func (o *orderRun) markFailed(ctx workflow.Context) {
	if _, err := o.index(activities.DeclMarkFailed.Declaration); err != nil { // Only a tenant and order ID near the key limit.
		workflow.GetLogger(ctx).Error("cannot mark the order failed", "error", err.Error())
		return
	}
	var failed orders.MarkFailedResult
	if err := runStep(ctx, o, activities.DeclMarkFailed, &failed, func(r orders.MarkFailedResult) string { return r.Status }); err != nil {
		workflow.GetLogger(ctx).Warn("the order stays pending", "step", activities.DeclMarkFailed.Step, "error", err.Error())
	}
	o.showDetails(ctx)
}

// skipAfter marks every pending step after step i skipped: it will never run.
func (o *orderRun) skipAfter(i int) {
	for j := i + 1; j < len(o.status); j++ {
		if o.status[j].State == StatePending {
			o.status[j].State = StateSkipped
		}
	}
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
	case activities.ErrTypeOrderNotFound, activities.ErrTypeInvalidInput, activities.ErrTypeKeyReused, activities.ErrTypeAmbiguous,
		ErrTypeDecisionTimeout:
		return false
	}
	return app.NonRetryable() || slices.Contains(activities.NonRetryableErrorTypes(), app.Type())
}

// stepError renders a step's failure for the status query and the current
// details: the activity's one-line message (see activities.OperatorMessage,
// which starts with the error type), without the activity error's
// envelope or the cause chain.
func stepError(err error) string {
	var timeout *temporal.TimeoutError
	if errors.As(err, &timeout) {
		last := ""
		if cause := timeout.Unwrap(); cause != nil {
			last = "; last failure: " + stepError(cause)
		}
		return fmt.Sprintf("Timeout: the step's retries ran out (%s timeout)%s", timeoutName(timeout), last)
	}
	var app *temporal.ApplicationError
	if errors.As(err, &app) {
		msg := app.Message()
		if !strings.HasPrefix(msg, app.Type()+":") {
			msg = app.Type() + ": " + msg
		}
		return firstLine(msg, 500)
	}
	return firstLine(err.Error(), 500)
}

// timeoutName names a timeout's type for people, such as "schedule-to-close".
func timeoutName(t *temporal.TimeoutError) string {
	name := strings.ToLower(strings.TrimPrefix(t.TimeoutType().String(), "TIMEOUT_TYPE_"))
	return strings.ReplaceAll(name, "_", "-")
}

// finalError is the error a run fails with when step fails for good: a
// non-retryable application error of the step's error type whose message
// is the step's one line (stepError), with no cause chain, so that the Web
// UI and the CLI show it once. Errors that are not application errors are
// returned unchanged.
func finalError(err error) error {
	var app *temporal.ApplicationError
	if !errors.As(err, &app) {
		return err
	}
	return temporal.NewNonRetryableApplicationError(stepError(err), app.Type(), nil)
}
