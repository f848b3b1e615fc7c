package pipeline

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/step"
)

// Search attributes every pipeline's runs use: the tenant (set by the
// pipeline's start options) and, while a run waits for a decision,
// KeyedAttention, such as "receipt:ambiguous".
const (
	SearchAttrTenantIDName     = "TenantID"
	SearchAttrAttentionName    = "KeyedAttention"
	SearchAttrWaitingSinceName = "KeyedWaitingSince"
)

// Typed keys of the framework's search attributes. KeyedWaitingSince
// (Datetime) is when the current wait began, beside KeyedAttention, so
// that the Web UI's list shows since when each run waits.
var (
	SearchAttrTenantID     = temporal.NewSearchAttributeKeyKeyword(SearchAttrTenantIDName)
	SearchAttrAttention    = temporal.NewSearchAttributeKeyKeyword(SearchAttrAttentionName)
	SearchAttrWaitingSince = temporal.NewSearchAttributeKeyTime(SearchAttrWaitingSinceName)
)

// AttentionQuery is the visibility query that lists the runs, of every
// pipeline, that wait for a decision.
const AttentionQuery = SearchAttrAttentionName + " IS NOT NULL"

// UpdateDecide is the name of a run's update that delivers an operator's
// Decision about the step it waits on.
const UpdateDecide = "decide"

// DefaultDecisionTimeout is how long a run waits for a decision unless
// Opts.DecisionTimeout says otherwise.
const DefaultDecisionTimeout = 7 * 24 * time.Hour

// ErrTypeDecisionTimeout is the error type of a run that waited its
// decision timeout for a decision and got none. Non-retryable.
const ErrTypeDecisionTimeout = "DecisionTimeout"

// MetricDecisionTimeouts counts runs that failed with no decision in time,
// for an alert; MetricAttentionWaits counts the waits that began.
const (
	MetricDecisionTimeouts = "keyed_decision_timeouts"
	MetricAttentionWaits   = "keyed_attention_waits"
)

// Limits on a Decision's reason and operator (CheckDecision), so that the
// audit line fits effects.MaxReasonBytes.
const (
	MaxDecisionReason = 200
	MaxDecisionBy     = 64
)

// attentionChange is the workflow.GetVersion change ID of waiting for a
// decision: runs that failed on an unknown outcome before it replay so.
const attentionChange = "wait-for-decision"

// Decision is an operator's verdict on the step a run waits on, the
// argument of the UpdateDecide update:
//
//	{"step":"receipt","resolution":"done","by":"ada","reason":"found in SendGrid",
//	 "result":{"message_id":"msg_1"}}
type Decision struct {
	// Step is the waiting step, such as "receipt".
	Step string `json:"step"`
	// Resolution is "done" (the effect happened: Result is its outcome) or
	// "retry" (it did not: the step acts again).
	Resolution effects.Resolution `json:"resolution"`
	// Result is the step's outcome, required with "done" and checked by
	// the step's declared Outcome; at most effects.MaxResultBytes.
	Result json.RawMessage `json:"result,omitempty"`
	// Reason says why, for the audit trail. Required: one line of
	// printable text, at most MaxDecisionReason bytes.
	Reason string `json:"reason"`
	// By names the operator. Required: one line of printable text, at
	// most MaxDecisionBy bytes.
	By string `json:"by"`
	// Unverified applies a "done" whose provider record cannot be read;
	// the record keeps that it was not verified. A contradiction still
	// refuses it.
	Unverified bool `json:"unverified,omitempty"`
	// Wait, if set, is the wait this decision is for (StepStatus.Wait): a
	// decision for a wait that is over is refused, never applied to the
	// step's next wait, and SendDecision derives its Update ID from it.
	Wait string `json:"wait,omitempty"`
}

// DecisionResult is what the UpdateDecide update returns once the decision
// is applied to the effect record.
type DecisionResult struct {
	Step       string `json:"step"`
	EffectKey  string `json:"effect_key"`
	Resolution string `json:"resolution"`
	// State is the effect record's state after the decision ("succeeded",
	// "failed_transient", or "absent" for a retry of an effect never
	// claimed).
	State string `json:"state"`
	// Generation is the record's generation after the decision: an owner
	// holding an older one is fenced off.
	Generation int64 `json:"generation"`
	// Verification says how a "done" outcome was checked: "confirmed"
	// by the provider's record, or "unverified: " and why it could not be.
	Verification string `json:"verification,omitempty"`
}

// waiting is the step a run waits on and the decision once applied.
type waiting struct {
	step     int
	id       string
	reason   string
	applying bool
	decided  bool
}

// needsAttention reports whether err, a step's final error, is an outcome
// keyed cannot know, and the reason for KeyedAttention: "timeout" when the
// retries ran out at the schedule-to-close timeout, else the error table's
// reason for the error's type (step.AttentionReason).
func needsAttention(err error) (string, bool) {
	var timeout *temporal.TimeoutError
	if errors.As(err, &timeout) {
		return "timeout", true
	}
	var app *temporal.ApplicationError
	if !errors.As(err, &app) {
		return "", false
	}
	return step.AttentionReason(app.Type())
}

// awaitDecision marks step i waiting, sets KeyedAttention and waits until a
// decision has been applied (nil) or the decision timeout passes (a
// non-retryable ErrTypeDecisionTimeout error with cause as its cause).
func (r *Run) awaitDecision(ctx workflow.Context, i int, reason string, cause error) error {
	s := &r.status[i]
	s.State = StateWaiting
	r.waits[i]++
	s.Wait, s.WaitingSince = fmt.Sprintf("%s#%d", s.EffectKey, r.waits[i]), workflow.Now(ctx).UTC()
	r.wait = &waiting{step: i, id: s.Wait, reason: reason}
	value := s.Step + ":" + reason
	workflow.GetMetricsHandler(ctx).Counter(MetricAttentionWaits).Inc(1)
	workflow.GetLogger(ctx).Warn("step waits for a decision", "step", s.Step, "effect_key", s.EffectKey, "attention", value)
	if err := workflow.UpsertTypedSearchAttributes(ctx, SearchAttrAttention.ValueSet(value), SearchAttrWaitingSince.ValueSet(s.WaitingSince)); err != nil {
		return fmt.Errorf("set %s: %w", SearchAttrAttentionName, err)
	}
	r.ShowDetails(ctx)
	w := r.wait
	decided, err := r.awaitDecided(ctx, w, workflow.TimerOptions{Summary: "decision on " + value + " · effect " + s.EffectKey})
	if err == nil && !decided && w.applying { // A decision arrived as time ran out: let it finish.
		err = workflow.Await(ctx, func() bool { return !w.applying })
		decided = w.decided
	}
	r.wait, s.WaitingSince = nil, time.Time{}
	if uerr := workflow.UpsertTypedSearchAttributes(ctx, SearchAttrAttention.ValueUnset(), SearchAttrWaitingSince.ValueUnset()); uerr != nil && err == nil {
		err = fmt.Errorf("clear %s: %w", SearchAttrAttentionName, uerr)
	}
	switch {
	case err != nil:
		return err
	case decided:
		return nil
	}
	workflow.GetMetricsHandler(ctx).Counter(MetricDecisionTimeouts).Inc(1)
	msg := fmt.Sprintf("%s: %s %s: no operator decision within %s on an unknown outcome (%s: %s) — not retried: "+
		"check the provider, then `starter resolve` the key and start the run again",
		ErrTypeDecisionTimeout, s.Step, s.EffectKey, r.decisionTimeout, reason, stepError(cause))
	s.State, s.Error = StateFailed, firstLine(msg, 500)
	return temporal.NewNonRetryableApplicationError(msg, ErrTypeDecisionTimeout, nil)
}

// cancelDecisionTimerChange is the workflow.GetVersion change ID of
// canceling the decision timer once a decision is applied, so that the
// Web UI shows it canceled, not started, on a run that went on.
const cancelDecisionTimerChange = "cancel-decision-timer"

// awaitDecided waits until w is decided (true) or the decision timeout
// passes (false). Runs from cancelDecisionTimerChange on cancel the timer
// once decided; the SDK's AwaitWithOptions leaves it running.
func (r *Run) awaitDecided(ctx workflow.Context, w *waiting, opts workflow.TimerOptions) (bool, error) {
	if workflow.GetVersion(ctx, cancelDecisionTimerChange, workflow.DefaultVersion, 1) < 1 {
		return workflow.AwaitWithOptions(ctx, workflow.AwaitOptions{Timeout: r.decisionTimeout, TimerOptions: opts},
			func() bool { return w.decided })
	}
	tctx, cancel := workflow.WithCancel(ctx)
	defer cancel()
	timer := workflow.NewTimerWithOptions(tctx, r.decisionTimeout, opts)
	if err := workflow.Await(ctx, func() bool { return w.decided || timer.IsReady() }); err != nil {
		return false, err
	}
	return w.decided, nil
}

// setDecideHandler registers the UpdateDecide handler: its validator refuses
// a decision before it enters history, and the handler applies it through
// the ApplyDecision activity and lets the waiting step run again.
func (r *Run) setDecideHandler(ctx workflow.Context) error {
	err := workflow.SetUpdateHandlerWithOptions(ctx, UpdateDecide, r.decide,
		workflow.UpdateHandlerOptions{Validator: r.validateDecision})
	if err != nil {
		return fmt.Errorf("register %s update: %w", UpdateDecide, err)
	}
	return nil
}

// validateDecision refuses a decision when no step waits, or another
// decision is being applied, and otherwise every problem CheckDecision
// finds with it as a decision on the waiting step under its declared
// Outcome, at once.
func (r *Run) validateDecision(_ workflow.Context, d Decision) error {
	w := r.wait
	switch {
	case d.Wait != "" && (w == nil || d.Wait != w.id):
		return fmt.Errorf("wait %s is over (%s): this decision is not applied to a later wait", d.Wait, r.waitNow())
	case w == nil:
		return errors.New("no step of this run is waiting for a decision")
	case w.applying || w.decided:
		return errors.New("a decision is already being applied")
	}
	return CheckDecision(d, r.status[w.step].Step, r.decls[w.step].Outcome)
}

// waitNow says what the run waits on now, for a refused decision.
func (r *Run) waitNow() string {
	if r.wait == nil {
		return "no step of this run is waiting for a decision"
	}
	return "the run waits on " + r.wait.id + " now"
}

// decide applies d to the waiting step's effect record through the
// ApplyDecision activity. On success the waiting step runs again; on
// failure (a refused "done", a live claim, a record already succeeded by a
// retry) the run keeps waiting and the caller gets why.
func (r *Run) decide(ctx workflow.Context, d Decision) (DecisionResult, error) {
	w := r.wait
	if w == nil || w.applying || w.decided { // The validator checked; replay safety only.
		return DecisionResult{}, errors.New("no step of this run is waiting for a decision")
	}
	w.applying = true
	defer func() { w.applying = false }()
	s := r.status[w.step]
	info := workflow.GetInfo(ctx)
	in := DecisionInput{
		EffectKey: s.EffectKey, Step: s.Step, Resolution: d.Resolution, Result: d.Result,
		Reason: strings.TrimSpace(d.Reason), By: strings.TrimSpace(d.By), Unverified: d.Unverified,
		WorkflowID: info.WorkflowExecution.ID, RunID: info.WorkflowExecution.RunID,
	}
	var res DecisionResult
	actx := workflow.WithActivityOptions(ctx, decisionActivityOptions(s.EffectKey))
	if err := workflow.ExecuteActivity(actx, NameApplyDecision, in).Get(ctx, &res); err != nil {
		return res, refusal(err)
	}
	w.decided = true
	r.verdicts[w.step] = fmt.Sprintf("%s decided %s by %s: %s", w.id, d.Resolution, in.By, firstLine(in.Reason, 160))
	return res, nil
}

// refusal returns the error the decide update fails with when
// ApplyDecision failed with err: its application error's type and message
// (such as DecisionRefused and why), without the activity error's
// envelope, so that the operator reads why and nothing else; any other
// error unchanged.
func refusal(err error) error {
	var app *temporal.ApplicationError
	if !errors.As(err, &app) {
		return err
	}
	return temporal.NewNonRetryableApplicationError(app.Message(), app.Type(), nil)
}
