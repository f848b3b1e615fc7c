package pipeline

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/step"
)

// QueryStatus is the name of a run's status query, answered with
// []StepStatus.
const QueryStatus = "status"

// StepStatus is a run's view of one step, as the status query returns it.
type StepStatus struct {
	Step      string `json:"step"`
	EffectKey string `json:"effect_key"`
	State     string `json:"state"` // one of the State constants
	Error     string `json:"error,omitempty"`
	// Wait names the step's current or last wait for a decision,
	// "<effect key>#<n>" for its n-th wait in this run; a Decision that
	// names it is applied to that wait only.
	Wait string `json:"wait,omitempty"`
	// WaitingSince is when the current wait began; zero when none.
	WaitingSince time.Time `json:"waiting_since,omitzero"`
}

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

// Keyer is a pipeline's workflow input: it derives the effect key of each
// of the run's steps, and every step's activity takes it as its input.
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
	// ProviderQueues maps a provider (step.Declaration.Provider) to the
	// task queue its steps are scheduled on, so that a worker polling it
	// with an activity rate limit bounds the provider's calls per second
	// across all workers. A provider not in it runs on the run's queue.
	ProviderQueues map[string]string
}

// Run is the workflow side of one run of a pipeline: its input, the steps'
// status and outcomes, and the decision being waited for. Use it from one
// workflow function only.
type Run struct {
	in      Keyer
	status  []StepStatus
	outcome []string
	// decls[i] declares step i: its Outcome checks a "done" decision.
	decls []step.Declaration
	// waits[i] counts step i's waits for a decision so far; verdicts[i]
	// says who decided its last one, and how, for the details.
	waits    []int
	verdicts []string
	wait     *waiting
	// decisionTimeout bounds each wait for an operator's decision.
	decisionTimeout time.Duration
	// providerQueues is Opts.ProviderQueues.
	providerQueues map[string]string
}

// New returns the Run of the workflow ctx with input in, showing steps
// (pending) from the start; a step not among them joins when it first runs.
// It registers the status query and the UpdateDecide and UpdateAwaitSteps
// updates. It returns a non-retryable InvalidInput error when in cannot key one of steps, and the
// SDK's error when a handler cannot be registered.
func New(ctx workflow.Context, in Keyer, steps []step.Declaration, opts *Opts) (*Run, error) {
	r := &Run{in: in, decisionTimeout: DefaultDecisionTimeout}
	if opts != nil && opts.DecisionTimeout > 0 {
		r.decisionTimeout = opts.DecisionTimeout
	}
	if opts != nil {
		r.providerQueues = opts.ProviderQueues
	}
	for _, d := range steps {
		if _, err := r.Index(d); err != nil {
			return nil, temporal.NewNonRetryableApplicationError(err.Error(), step.ErrTypeInvalidInput, nil)
		}
	}
	err := workflow.SetQueryHandler(ctx, QueryStatus, func() ([]StepStatus, error) {
		return append([]StepStatus(nil), r.status...), nil
	})
	if err != nil {
		return nil, fmt.Errorf("register status query: %w", err)
	}
	if err := r.setDecideHandler(ctx); err != nil {
		return nil, err
	}
	if err := r.setAwaitHandler(ctx); err != nil {
		return nil, err
	}
	r.ShowDetails(ctx)
	return r, nil
}

// Index returns the position of d's step in the status query, adding it
// (pending) when it is not there yet, or an error when the input cannot
// key it.
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
	r.status = append(r.status, StepStatus{Step: d.Step, EffectKey: key.String(), State: StatePending})
	r.outcome = append(r.outcome, "")
	r.decls = append(r.decls, d)
	r.waits, r.verdicts = append(r.waits, 0), append(r.verdicts, "")
	return len(r.status) - 1, nil
}

// RunStep runs the step declared by d into out (Run.Step) and, once it
// succeeds, shows outcome(*out) beside it in the current details when
// outcome is not nil.
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

// RunAddedStep runs the step declared by d into out, as RunStep does, only
// in runs that reach it with the change changeID in effect: a step added to
// a workflow while runs are in flight. A run that passed this point before
// the change replays without it (workflow.GetVersion).
func RunAddedStep[T any](ctx workflow.Context, r *Run, changeID string, d step.Declaration, out *T) error {
	if workflow.GetVersion(ctx, changeID, workflow.DefaultVersion, 1) < 1 {
		return nil // a run from before the change
	}
	return RunStep(ctx, r, d, out, nil)
}

// Step executes step i's activity, declared by d, with the run's input and
// d's options, into result. On an outcome keyed cannot know (Ambiguous,
// KeyReused, retries that ran out) it waits for a Decision and runs the
// step again, failing with ErrTypeDecisionTimeout when none comes in time.
// Any other failure skips the later steps and is returned as a
// non-retryable error of the step's type with the step's one line.
func (r *Run) Step(ctx workflow.Context, i int, d step.Declaration, result any) error {
	s := &r.status[i]
	for {
		s.State, s.Error = StateRunning, ""
		r.ShowDetails(ctx)
		err := r.execute(ctx, d, s.EffectKey, result)
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

// localStepsChange is the workflow.GetVersion change ID of running Local
// steps as local activities; runs from before it run them as activities.
const localStepsChange = "local-database-steps"

// MemoLocalSteps is the memo field (value true) that Start and Configure
// give every run: the run executes Local steps as local activities from
// its start, so it needs no version marker (and no search attribute
// upsert) to say so. A run without it decides with localStepsChange.
const MemoLocalSteps = "keyed.local_steps"

// MemoLocalFirst is the memo field (value true) that Start and Configure
// give every run: the run makes the first attempt of each step that is
// neither Local nor Queued as a local activity, in the workflow task, and
// schedules the step as an activity only when that attempt fails with a
// retryable error, times out or is refused (step.LocalGate). A run without
// it schedules such steps as activities from the first attempt.
const MemoLocalFirst = "keyed.local_first"

// execute runs the step declared by d, whose effect key is key, into
// result: a Local step (step.Declaration.Local) as a local activity in runs
// started with MemoLocalSteps or with localStepsChange; any other step
// first as a local activity in runs started with MemoLocalFirst (unless it
// is Queued), then as an activity. It returns the step's error.
func (r *Run) execute(ctx workflow.Context, d step.Declaration, key string, result any) error {
	if d.Local && localSteps(ctx) {
		lctx := workflow.WithLocalActivityOptions(ctx, d.LocalActivityOptions(key))
		return workflow.ExecuteLocalActivity(lctx, d.Name, r.in).Get(ctx, result)
	}
	if !d.Local && !d.Queued && hasMemo(ctx, MemoLocalFirst) {
		lctx := workflow.WithLocalActivityOptions(ctx, d.FirstAttemptOptions(key))
		err := workflow.ExecuteLocalActivity(lctx, d.Name, r.in).Get(ctx, result)
		if err == nil || !againFromQueue(err) {
			return err
		}
		workflow.GetLogger(ctx).Debug("first attempt not done in the workflow task; scheduling the step",
			"step", d.Step, "effect_key", key, "error", stepError(err))
	}
	ao := d.ActivityOptions(key)
	if q := r.providerQueues[d.Provider]; d.Provider != "" && q != "" {
		ao.TaskQueue = q // replay does not compare an activity's task queue
	}
	return workflow.ExecuteActivity(workflow.WithActivityOptions(ctx, ao), d.Name, r.in).Get(ctx, result)
}

// againFromQueue reports whether a first attempt's error leaves the step to
// its activity: a timeout, a refusal or a retryable failure, but not a
// cancellation or a failure of a type the step's retry policy never
// retries.
func againFromQueue(err error) bool {
	if temporal.IsCanceledError(err) {
		return false
	}
	var app *temporal.ApplicationError
	if errors.As(err, &app) {
		return !app.NonRetryable() && !slices.Contains(step.NonRetryableErrorTypes(), app.Type())
	}
	return true
}

// hasMemo reports whether the run was started with the memo field name.
func hasMemo(ctx workflow.Context, name string) bool {
	_, ok := workflow.GetInfo(ctx).Memo.GetFields()[name]
	return ok
}

// localSteps reports whether the run executes Local steps as local
// activities: a run started with MemoLocalSteps does; any other asks
// workflow.GetVersion, which records its answer in runs that reach here
// first on code with localStepsChange.
func localSteps(ctx workflow.Context) bool {
	if hasMemo(ctx, MemoLocalSteps) {
		return true
	}
	return workflow.GetVersion(ctx, localStepsChange, workflow.DefaultVersion, 1) >= 1
}

// skipAfter marks every pending step after step i skipped.
func (r *Run) skipAfter(i int) {
	for j := i + 1; j < len(r.status); j++ {
		if r.status[j].State == StatePending {
			r.status[j].State = StateSkipped
		}
	}
}

// stepError renders a step's failure for the status query and the
// details: the activity's one-line message, without the activity error's
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

// finalError is the error a run fails with when a step fails for good: a
// non-retryable error of the step's type with its one line and no cause
// chain, so that the Web UI shows it once.
func finalError(err error) error {
	var app *temporal.ApplicationError
	if !errors.As(err, &app) {
		return err
	}
	return temporal.NewNonRetryableApplicationError(stepError(err), app.Type(), nil)
}
