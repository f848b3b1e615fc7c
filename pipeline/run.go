package pipeline

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/step"
)

// Step states reported by the status query (orders.QueryStatus).
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

// Keyer is a pipeline's workflow input: it derives the effect key of each
// of the run's steps, and every step's activity takes it as its input.
// orders.OrderInput and refunds.RefundInput are Keyers.
type Keyer interface {
	EffectKey(step string) (effects.Key, error)
}

// Opts configures a Run. A nil *Opts means all defaults.
type Opts struct {
	// DecisionTimeout is how long a run waits for an operator's decision
	// before it fails (DECISION_TIMEOUT). Zero means DefaultDecisionTimeout.
	// A change applies to waits that begin after it: a wait already begun
	// keeps the timer it started with.
	DecisionTimeout time.Duration
}

// Run is the workflow side of one run of a pipeline of keyed steps: its
// input, the steps' status and outcomes, and the decision being waited
// for. It answers the status query, takes the UpdateDecide update and keeps
// the run's current details. Use it from one workflow function only.
type Run struct {
	in      Keyer
	status  []orders.StepStatus
	outcome []string
	// decls[i] declares step i: its Outcome checks a "done" decision.
	decls []step.Declaration
	wait  *waiting
	// decisionTimeout bounds each wait for an operator's decision.
	decisionTimeout time.Duration
}

// New returns the Run of the workflow whose context is ctx and whose input
// is in, showing steps (pending) from the start, in the order they run; a
// step not among them joins the status when it first runs (Index). It
// registers the status query (orders.QueryStatus, answered with
// []orders.StepStatus) and the UpdateDecide update, and shows the current
// details. It returns a non-retryable application error of type
// step.ErrTypeInvalidInput when in cannot key one of steps, and the
// SDK's error when a handler cannot be registered.
func New(ctx workflow.Context, in Keyer, steps []step.Declaration, opts *Opts) (*Run, error) {
	r := &Run{in: in, decisionTimeout: DefaultDecisionTimeout}
	if opts != nil && opts.DecisionTimeout > 0 {
		r.decisionTimeout = opts.DecisionTimeout
	}
	for _, d := range steps {
		if _, err := r.Index(d); err != nil {
			return nil, temporal.NewNonRetryableApplicationError(err.Error(), step.ErrTypeInvalidInput, nil)
		}
	}
	err := workflow.SetQueryHandler(ctx, orders.QueryStatus, func() ([]orders.StepStatus, error) {
		return append([]orders.StepStatus(nil), r.status...), nil
	})
	if err != nil {
		return nil, fmt.Errorf("register status query: %w", err)
	}
	if err := r.setDecideHandler(ctx); err != nil {
		return nil, err
	}
	r.ShowDetails(ctx)
	return r, nil
}

// Index returns the position of d's step in the status query, adding it
// (pending) when it is not there yet. It returns an error when the run's
// input cannot key d's step.
func (r *Run) Index(d step.Declaration) (int, error) {
	for i, s := range r.status {
		if s.Step == d.Step {
			return i, nil
		}
	}
	key, err := r.in.EffectKey(d.Step)
	if err != nil {
		return 0, fmt.Errorf("derive the effect key of %s: %w", d.Step, err)
	}
	r.status = append(r.status, orders.StepStatus{Step: d.Step, EffectKey: key.String(), State: StatePending})
	r.outcome = append(r.outcome, "")
	r.decls = append(r.decls, d)
	return len(r.status) - 1, nil
}

// RunStep runs the activity declared by d, whose result is a T, into out
// (see Run.Step) and, once it succeeds, shows outcome(*out) beside the step
// in the current details when outcome is not nil. It returns a
// non-retryable InvalidInput error when the input cannot key the step, and
// Step's error.
func RunStep[T any](ctx workflow.Context, r *Run, d step.Declaration, out *T, outcome func(T) string) error {
	i, err := r.Index(d)
	if err != nil {
		return temporal.NewNonRetryableApplicationError(err.Error(), step.ErrTypeInvalidInput, nil)
	}
	if err := r.Step(ctx, i, d, out); err != nil {
		return err
	}
	if outcome != nil {
		r.outcome[i] = outcome(*out)
	}
	return nil
}

// Step executes step i's activity, declared by d, with the run's input and
// d's options, into result. When the step ends with an outcome keyed cannot
// know (needsAttention: Ambiguous, KeyReused, retries that ran out) it waits
// for a decision and runs the step again; with no decision in time it fails
// with a non-retryable ErrTypeDecisionTimeout error. Any other failure marks
// the later steps skipped and is returned as a non-retryable application
// error of the step's type whose message is the step's one line. Runs that
// reached an unknown outcome before waiting existed replay as they failed
// then (the change ID "wait-for-decision").
func (r *Run) Step(ctx workflow.Context, i int, d step.Declaration, result any) error {
	s := &r.status[i]
	for {
		s.State, s.Error = StateRunning, ""
		r.ShowDetails(ctx)
		actx := workflow.WithActivityOptions(ctx, d.ActivityOptions(s.EffectKey))
		err := workflow.ExecuteActivity(actx, d.Name, r.in).Get(ctx, result)
		if err == nil {
			s.State = StateDone
			return nil
		}
		s.State, s.Error = StateFailed, stepError(err)
		workflow.GetLogger(ctx).Error("step failed", "step", s.Step, "effect_key", s.EffectKey, "error", s.Error)
		reason, unknown := needsAttention(err)
		if !unknown || workflow.GetVersion(ctx, attentionChange, workflow.DefaultVersion, 1) < 1 {
			r.skipAfter(i)
			r.ShowDetails(ctx)
			return finalError(err)
		}
		if err := r.awaitDecision(ctx, i, reason, err); err != nil {
			r.skipAfter(i)
			r.ShowDetails(ctx)
			return err
		}
	}
}

// skipAfter marks every pending step after step i skipped: it will never run.
func (r *Run) skipAfter(i int) {
	for j := i + 1; j < len(r.status); j++ {
		if r.status[j].State == StatePending {
			r.status[j].State = StateSkipped
		}
	}
}

// stepError renders a step's failure for the status query and the current
// details: the activity's one-line message (see step.OperatorMessage,
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
