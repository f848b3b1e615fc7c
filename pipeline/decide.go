package pipeline

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/step"
)

// NameApplyDecision is the registered name of the activity that applies a
// Decision.
const NameApplyDecision = "ApplyDecision"

// stepDecision is ApplyDecision's step; it has no effect key of its own.
const stepDecision = "decision"

// DecisionInput is ApplyDecision's input. WorkflowID and RunID are empty
// for a decision applied outside a run; Via then says how it came, for the
// audit, such as "starter resolve".
type DecisionInput struct {
	EffectKey  string             `json:"effect_key"`
	Step       string             `json:"step"`
	Resolution effects.Resolution `json:"resolution"`
	Result     json.RawMessage    `json:"result,omitempty"`
	Reason     string             `json:"reason"`
	By         string             `json:"by"`
	Unverified bool               `json:"unverified,omitempty"`
	WorkflowID string             `json:"workflow_id"`
	RunID      string             `json:"run_id"`
	Via        string             `json:"via,omitempty"`
}

// DeclDecision declares ApplyDecision: an absolute write of the decided
// step's record, retried for a few minutes.
var DeclDecision = step.Declaration{Name: NameApplyDecision, Class: effects.ClassAbsoluteWrite, Step: stepDecision,
	Options: step.Options{ScheduleToClose: 5 * time.Minute}}

// decisionActivityOptions returns ApplyDecision's options for the record
// of key.
func decisionActivityOptions(key string) workflow.ActivityOptions {
	o := DeclDecision.ActivityOptions(key)
	o.Summary = "apply decision · effect " + key
	return o
}

// ErrTypeDecisionRefused is the error type of a "done" the Decider refused
// (a *RefusedError). Non-retryable; a waiting run keeps waiting.
const ErrTypeDecisionRefused = "DecisionRefused"

// verifyTimeout bounds one Verify; past it the record could not be read.
const verifyTimeout = 15 * time.Second

// Decider applies operators' decisions; its ApplyDecision is the activity
// the UpdateDecide update runs. A worker registers it once, made with every
// pipeline's definitions.
type Decider struct {
	claims *effects.Client
	steps  map[string]step.Definition
}

// NewDecider returns a Decider over claims that checks a "done" on a step
// of defs with the step's declared Outcome and its Verify. It returns an
// error if claims is nil or two of defs declare one step.
func NewDecider(claims *effects.Client, defs ...step.Definition) (*Decider, error) {
	if claims == nil {
		return nil, errors.New("pipeline: NewDecider: effects client is nil")
	}
	steps := make(map[string]step.Definition, len(defs))
	for _, def := range defs {
		if def.Step == stepDecision {
			continue
		}
		if prev, ok := steps[def.Step]; ok {
			return nil, fmt.Errorf("pipeline: NewDecider: %q and %q both declare step %q", prev.Name, def.Name, def.Step)
		}
		steps[def.Step] = def
	}
	return &Decider{claims: claims, steps: steps}, nil
}

// Definition returns ApplyDecision bound to DeclDecision, for step.Register.
func (d *Decider) Definition() step.Definition {
	return DeclDecision.Bind(d.ApplyDecision)
}

// Check returns every problem of dec as a decision on its own step
// (CheckDecision), for a decision applied outside a run.
func (d *Decider) Check(dec Decision) error {
	return CheckDecision(dec, dec.Step, d.steps[dec.Step].Outcome)
}

// RefusedError is a "done" the Decider refused before resolving anything.
type RefusedError struct {
	Step      string
	EffectKey string
	// Why says what refused it, such as "Stripe has no PaymentIntent pi_1".
	Why string
	// Unverifiable: the record could not be read; the same decision with
	// Unverified applies it.
	Unverifiable bool
}

func (e *RefusedError) Error() string {
	msg := fmt.Sprintf("%s: done on %s %s refused: %s", ErrTypeDecisionRefused, e.Step, e.EffectKey, e.Why)
	if e.Unverifiable {
		msg += `; check the provider yourself, then send the decision again with "unverified": true ` +
			"(starter resolve --unverified) to apply it unverified: the record keeps that it was"
	}
	return msg
}

// ApplyDecision applies in as Apply does, for Temporal: a refusal is a
// non-retryable ErrTypeDecisionRefused error, a record that cannot be
// resolved an InvalidState one, anything else goes through step.ToTemporal.
func (d *Decider) ApplyDecision(ctx context.Context, in DecisionInput) (DecisionResult, error) {
	res, err := d.Apply(ctx, in)
	if err == nil && activity.IsActivity(ctx) {
		by := "person"
		if in.By == ByKeyed {
			by = ByKeyed
		}
		activity.GetMetricsHandler(ctx).WithTags(map[string]string{"by": by}).Counter(MetricDecisions).Inc(1)
	}
	var refused *RefusedError
	switch {
	case errors.As(err, &refused):
		return res, temporal.NewNonRetryableApplicationError(refused.Error(), ErrTypeDecisionRefused, nil)
	case errors.Is(err, effects.ErrNotResolvable):
		return res, temporal.NewNonRetryableApplicationError(err.Error(), step.ErrTypeInvalidState, nil)
	}
	return res, step.ToTemporal(err)
}

// Apply resolves in.EffectKey with effects.Resolve, idempotently: "done"
// stores the outcome, "retry" lets the next attempt act again, and the record
// keeps who decided and why. A "done" is refused (*RefusedError) for a
// refusal, a result that is not the step's outcome, a contradicting Verify,
// or an unreadable provider record unless in.Unverified. Other errors wrap
// effects.ErrNotResolvable, a bad key or the database's.
func (d *Decider) Apply(ctx context.Context, in DecisionInput) (DecisionResult, error) {
	out := DecisionResult{Step: in.Step, EffectKey: in.EffectKey, Resolution: string(in.Resolution)}
	key, err := effects.ParseKey(in.EffectKey)
	if err != nil {
		return out, fmt.Errorf("apply decision on %s: %w", in.EffectKey, err)
	}
	if d.steps[in.Step].SelfGuarded {
		// A record under the key is an older worker's: resolve it as usual.
		if _, err := d.claims.Get(ctx, key); errors.Is(err, effects.ErrNotFound) {
			return d.applySelfGuarded(ctx, key, in, out)
		}
	}
	p := effects.ResolveParams{Resolution: in.Resolution}
	if in.Resolution == effects.ResolveDone {
		rec, err := d.doneable(ctx, key, in)
		if err != nil || rec.State == effects.StateSucceeded {
			// Applied by an earlier attempt, or the step finished after
			// all: its outcome stands.
			out.State, out.Generation = string(rec.State), rec.Generation
			return out, err
		}
		if p.Result, out.Verification, err = d.confirm(ctx, key, in); err != nil {
			return out, err
		}
	}
	p.Reason = audit(in, out.Verification)
	rec, err := d.claims.Resolve(ctx, key, p)
	switch {
	case err == nil:
	case errors.Is(err, effects.ErrNotFound) && in.Resolution == effects.ResolveRetry:
		out.State = "absent"
		return out, nil
	case errors.Is(err, effects.ErrNotResolvable) && rec != nil && rec.State == effects.StateSucceeded && in.Resolution == effects.ResolveDone:
		// The step finished while the outcome was being checked.
	case errors.Is(err, effects.ErrNotResolvable):
		return out, fmt.Errorf("%s %s: decision %s refused: %w; wait for a live claim's lease to run out, or decide \"done\" for a record that succeeded",
			in.Step, in.EffectKey, in.Resolution, err)
	default:
		return out, fmt.Errorf("apply decision on %s: %w", in.EffectKey, err)
	}
	out.State, out.Generation = string(rec.State), rec.Generation
	return out, nil
}

// applySelfGuarded applies in to a self-guarded step, which keeps no record
// to resolve: its own row is its record. "retry" has nothing to undo: the
// step runs again and finds its row or writes it. "done" is applied only
// when the step's Verify finds that row, and never unverified, since
// nothing could keep the outcome.
func (d *Decider) applySelfGuarded(ctx context.Context, key effects.Key, in DecisionInput, out DecisionResult) (DecisionResult, error) {
	if in.Resolution != effects.ResolveDone {
		out.State = "absent"
		return out, nil
	}
	_, how, err := d.confirm(ctx, key, DecisionInput{Step: in.Step, EffectKey: in.EffectKey, Result: in.Result})
	var refused *RefusedError
	if errors.As(err, &refused) {
		refused.Unverifiable = false
		refused.Why += `; this step keeps no effect record, its own write is its record: decide "retry" and it finds that write or makes it`
	}
	if err != nil {
		return out, err
	}
	out.State, out.Verification = string(effects.StateSucceeded), how
	return out, nil
}

// doneable returns key's record when a "done" may settle it, and a
// *RefusedError when there is none or it failed with a refusal.
func (d *Decider) doneable(ctx context.Context, key effects.Key, in DecisionInput) (*effects.Record, error) {
	rec, err := d.claims.Get(ctx, key)
	switch {
	case errors.Is(err, effects.ErrNotFound):
		return &effects.Record{}, &RefusedError{Step: in.Step, EffectKey: in.EffectKey,
			Why: "there is no effect record under this key: the step never claimed it, so it did not happen"}
	case err != nil:
		return &effects.Record{}, fmt.Errorf("apply decision on %s: %w", key, err)
	case rec.State == effects.StateFailedTerminal && step.RefusedForGood(rec.ErrorCode):
		return &effects.Record{}, &RefusedError{Step: in.Step, EffectKey: in.EffectKey, Why: fmt.Sprintf(
			"the step refused for good (%s: %s): it did not act and would refuse again, so it cannot be done; its run failed with it",
			rec.ErrorCode, firstLine(rec.ErrorMessage, 200))}
	}
	return rec, nil
}

// confirm decodes in's result with the step's Outcome, checks it with its
// Verify, and returns the outcome to store and how it was checked.
func (d *Decider) confirm(ctx context.Context, key effects.Key, in DecisionInput) (any, string, error) {
	refuse := func(why string, unverifiable bool) error {
		return &RefusedError{Step: in.Step, EffectKey: in.EffectKey, Why: why, Unverifiable: unverifiable}
	}
	def, known := d.steps[in.Step]
	var outcome any = in.Result
	if def.Outcome != nil {
		v, err := def.Outcome.Decode(in.Result)
		if err != nil {
			return nil, "", refuse(err.Error(), false)
		}
		outcome = v
	} else if text := resultProblem(in.Result, nil); text != "" {
		return nil, "", refuse("result "+text, false)
	}
	verr := step.Unverifiable("no check of step %q against its provider is registered with this Decider", in.Step)
	if known && def.Verify != nil {
		vctx, cancel := context.WithTimeout(ctx, verifyTimeout)
		verr = def.Verify(vctx, key, outcome)
		cancel()
	}
	switch {
	case verr == nil:
		return outcome, "confirmed", nil
	case errors.Is(verr, step.ErrContradicted):
		return nil, "", refuse(verr.Error(), false)
	case !in.Unverified:
		return nil, "", refuse("the record could not be checked: "+verr.Error(), true)
	}
	return outcome, "unverified: " + verr.Error(), nil
}

// audit is the reason a decision stores: who decided what, where, why and
// how it was checked, cut to effects.MaxReasonBytes.
func audit(in DecisionInput, note string) string {
	where := "outside any run"
	switch {
	case in.RunID != "":
		where = fmt.Sprintf("via the %s update of run %s", UpdateDecide, in.RunID)
	case in.Via != "":
		where = "via " + in.Via
	}
	s := fmt.Sprintf("%s decided %s %s: %s", in.By, in.Resolution, where, in.Reason)
	if note == "" {
		return s
	}
	room := effects.MaxReasonBytes - len(s) - len(" ()")
	if room <= 0 {
		return s
	}
	if len(note) > room {
		note = strings.ToValidUTF8(note[:max(room-len("…"), 0)], "") + "…"
	}
	return s + " (" + note + ")"
}
