// Package workflows holds the order pipeline's Temporal workflow and the one
// way to start it.
//
// OrderWorkflow runs three steps, each its own activity with its own effect
// key: charge, mark paid, send receipt. The workflow carries only the
// versioned orders.CheckoutInput; the activities load the order when they
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
	"github.com/keyedhq/keyed/orders"
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

// Activity timeouts and retries. A killed worker is noticed through the
// heartbeat timeout of the external calls, so it is short; the retry then
// re-enters the same effect claim at once.
const (
	// ExternalStartToClose bounds one attempt of a provider call (charge,
	// receipt): a request is capped at 30s, plus the claim and the record.
	ExternalStartToClose = time.Minute
	// HeartbeatTimeout is how long a provider call may go without a
	// heartbeat before Temporal retries it on another worker.
	HeartbeatTimeout = 15 * time.Second
	// DatabaseStartToClose bounds one attempt of mark paid or mark failed.
	DatabaseStartToClose = 30 * time.Second
	// StepScheduleToClose is how long a step keeps retrying transient
	// failures before the run fails: long enough to ride out a Postgres
	// restart, a provider outage of several minutes, and SendGrid's
	// indexing lag while a receipt's fate is looked up (notify's
	// DefaultLookupLag plus DefaultLookupGiveUp, 15 minutes).
	StepScheduleToClose = 30 * time.Minute
)

// RetryPolicy returns the retry policy of every step: exponential backoff
// from 1s doubling up to 30s, attempts bounded by StepScheduleToClose rather
// than by a count, and no retry for the activities' terminal error types.
func RetryPolicy() *temporal.RetryPolicy {
	return &temporal.RetryPolicy{
		InitialInterval:        time.Second,
		BackoffCoefficient:     2,
		MaximumInterval:        30 * time.Second,
		NonRetryableErrorTypes: activities.NonRetryableErrorTypes(),
	}
}

// ActivityOptions returns the options of step (orders.StepCharge,
// StepMarkPaid, StepReceipt or StepMarkFailed) whose effect key is key. The
// database steps have a shorter timeout and no heartbeat. The Summary, shown
// in the Web UI and the CLI, names the effect key.
func ActivityOptions(step, key string) workflow.ActivityOptions {
	o := workflow.ActivityOptions{
		ScheduleToCloseTimeout: StepScheduleToClose,
		StartToCloseTimeout:    ExternalStartToClose,
		HeartbeatTimeout:       HeartbeatTimeout,
		RetryPolicy:            RetryPolicy(),
		Summary:                step + " · effect " + key,
	}
	if step == orders.StepMarkPaid || step == orders.StepMarkFailed {
		o.StartToCloseTimeout, o.HeartbeatTimeout = DatabaseStartToClose, 0
	}
	return o
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

// LongestRun returns the longest an order run can take while it is retrying
// its steps: the sum of each step's RetryWindow. Effect records must be kept
// at least this long beyond the namespace's retention.
func LongestRun() time.Duration {
	var total time.Duration
	for _, step := range []string{orders.StepCharge, orders.StepMarkPaid, orders.StepReceipt, orders.StepMarkFailed} {
		total += RetryWindow(ActivityOptions(step, ""))
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
}

// RegisterWithOpts registers the order workflow with r under
// orders.WorkflowName, configured by opts.
func RegisterWithOpts(r worker.WorkflowRegistry, opts *WorkflowOpts) {
	timeout := DefaultDecisionTimeout
	if opts != nil && opts.DecisionTimeout > 0 {
		timeout = opts.DecisionTimeout
	}
	r.RegisterWorkflowWithOptions(func(ctx workflow.Context, in orders.CheckoutInput) (orders.CheckoutResult, error) {
		return orderWorkflow(ctx, in, timeout)
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
func OrderWorkflow(ctx workflow.Context, in orders.CheckoutInput) (orders.CheckoutResult, error) {
	return orderWorkflow(ctx, in, DefaultDecisionTimeout)
}

func orderWorkflow(ctx workflow.Context, in orders.CheckoutInput, decisionTimeout time.Duration) (orders.CheckoutResult, error) {
	var out orders.CheckoutResult
	if err := in.Validate(); err != nil {
		return out, temporal.NewNonRetryableApplicationError(
			fmt.Sprintf("order workflow %s/%s: %v", in.TenantID, in.OrderID, err), activities.ErrTypeInvalidInput, nil)
	}
	o, err := newOrderRun(ctx, in)
	if err != nil {
		return out, err
	}
	o.decisionTimeout = decisionTimeout
	var a *activities.Activities // Names the activities; never called.
	if err := o.run(ctx, 0, a.Charge, &out.Charge); err != nil {
		if chargeFailedForGood(err) && workflow.GetVersion(ctx, markFailedChange, workflow.DefaultVersion, 1) >= 1 {
			o.markFailed(ctx, a)
		}
		return out, err
	}
	o.outcome[0] = out.Charge.PaymentIntentID
	if err := o.run(ctx, 1, a.MarkPaid, &out.Paid); err != nil {
		return out, err
	}
	o.outcome[1] = out.Paid.Status
	if err := o.run(ctx, 2, a.SendReceipt, &out.Receipt); err != nil {
		return out, err
	}
	o.outcome[2] = out.Receipt.MessageID
	o.showDetails(ctx)
	return out, nil
}

// orderRun is one run's state: its input, the steps' status and outcomes,
// and the decision being waited for.
type orderRun struct {
	in      orders.CheckoutInput
	status  []orders.StepStatus
	outcome []string
	wait    *waiting
	// decisionTimeout bounds each wait for an operator's decision.
	decisionTimeout time.Duration
}

func newOrderRun(ctx workflow.Context, in orders.CheckoutInput) (*orderRun, error) {
	steps := []string{orders.StepCharge, orders.StepMarkPaid, orders.StepReceipt}
	o := &orderRun{in: in, status: make([]orders.StepStatus, len(steps)), outcome: make([]string, len(steps))}
	for i, step := range steps {
		key, err := in.EffectKey(step)
		if err != nil { // Validate checked the key; this cannot happen.
			return nil, temporal.NewNonRetryableApplicationError(err.Error(), activities.ErrTypeInvalidInput, nil)
		}
		o.status[i] = orders.StepStatus{Step: step, EffectKey: key.String(), State: StatePending}
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

// run executes step i's activity fn into result. When the step ends with an
// outcome keyed cannot know, it waits for a decision and runs the step
// again; otherwise a failure marks the later steps skipped and is returned.
func (o *orderRun) run(ctx workflow.Context, i int, fn, result any) error {
	s := &o.status[i]
	for {
		s.State, s.Error = StateRunning, ""
		o.showDetails(ctx)
		actx := workflow.WithActivityOptions(ctx, ActivityOptions(s.Step, s.EffectKey))
		err := workflow.ExecuteActivity(actx, fn, o.in).Get(ctx, result)
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

// markFailed appends the mark_failed step and runs it. A failure is logged
// and shown in the status query; the charge's error remains the run's
// outcome either way.
func (o *orderRun) markFailed(ctx workflow.Context, a *activities.Activities) {
	key, err := o.in.EffectKey(orders.StepMarkFailed)
	if err != nil { // Only a tenant and order ID near the key limit.
		workflow.GetLogger(ctx).Error("cannot mark the order failed", "error", err.Error())
		return
	}
	o.status = append(o.status, orders.StepStatus{Step: orders.StepMarkFailed, EffectKey: key.String(), State: StatePending})
	o.outcome = append(o.outcome, "")
	var failed orders.MarkFailedResult
	if err := o.run(ctx, len(o.status)-1, a.MarkFailed, &failed); err == nil {
		o.outcome[len(o.outcome)-1] = failed.Status
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
