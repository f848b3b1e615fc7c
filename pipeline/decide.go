package pipeline

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/keyedhq/keyed/activities"
	"github.com/keyedhq/keyed/effects"
)

// NameApplyDecision is the registered name of the activity that applies an
// operator's Decision to an effect record.
const NameApplyDecision = "ApplyDecision"

// StepDecision is the Definition step of ApplyDecision. It has no effect
// key of its own: it rewrites the record of the step it decides.
const StepDecision = "decision"

// DecisionInput is ApplyDecision's input: the decision and what it is about.
type DecisionInput struct {
	EffectKey  string             `json:"effect_key"`
	Step       string             `json:"step"`
	Resolution effects.Resolution `json:"resolution"`
	Result     json.RawMessage    `json:"result,omitempty"`
	Reason     string             `json:"reason"`
	By         string             `json:"by"`
	WorkflowID string             `json:"workflow_id"`
	RunID      string             `json:"run_id"`
}

// DeclDecision declares ApplyDecision: an absolute write (applying a
// decision twice leaves the record as once) of the decided step's record,
// a database call retried on transient failures for a few minutes.
var DeclDecision = activities.Declaration{Name: NameApplyDecision, Class: effects.ClassAbsoluteWrite, Step: StepDecision,
	Options: activities.Options{ScheduleToClose: 5 * time.Minute}}

// DecisionActivityOptions returns ApplyDecision's options, its
// declaration's, for a decision on the record of key.
func DecisionActivityOptions(key string) workflow.ActivityOptions {
	o := DeclDecision.ActivityOptions(key)
	o.Summary = "apply decision · effect " + key
	return o
}

// Decider applies operators' decisions; its ApplyDecision is the activity
// the UpdateDecide update runs. Register it exactly once with every worker
// of a workflow that uses Run, whichever pipelines it runs:
// workflows.RegisterActivities does.
type Decider struct {
	claims *effects.Client
}

// NewDecider returns a Decider over the effects client claims. It returns
// an error if claims is nil.
func NewDecider(claims *effects.Client) (*Decider, error) {
	if claims == nil {
		return nil, errors.New("pipeline: NewDecider: effects client is nil")
	}
	return &Decider{claims: claims}, nil
}

// Definition returns ApplyDecision bound to its declaration, DeclDecision,
// for activities.Register (workflows.RegisterActivities does it).
func (d *Decider) Definition() activities.Definition {
	return DeclDecision.Bind(d.ApplyDecision)
}

// ApplyDecision resolves in.EffectKey with effects.Resolve: "done" stores
// in.Result as the outcome, "retry" makes the record a transient failure so
// the next attempt acts again. The record keeps who decided, why and from
// which run; the generation bump fences off any owner that wakes up later.
// It is idempotent: a "done" that finds the record already succeeded, and a
// "retry" that finds no record (the effect was never claimed), succeed.
//
// Errors (through activities.ToTemporal): a record that cannot be resolved
// (a live claim, or succeeded when the decision is "retry") or a bad key or
// result is terminal, with a message saying what to do; a database failure
// is transient.
func (d *Decider) ApplyDecision(ctx context.Context, in DecisionInput) (DecisionResult, error) {
	res, err := d.apply(ctx, in)
	return res, activities.ToTemporal(err)
}

func (d *Decider) apply(ctx context.Context, in DecisionInput) (DecisionResult, error) {
	out := DecisionResult{Step: in.Step, EffectKey: in.EffectKey, Resolution: string(in.Resolution)}
	key, err := effects.ParseKey(in.EffectKey)
	if err != nil {
		return out, fmt.Errorf("apply decision on %s: %w", in.EffectKey, err)
	}
	var result any
	if len(in.Result) > 0 {
		result = in.Result
	}
	reason := fmt.Sprintf("%s decided %s via the %s update of run %s: %s", in.By, in.Resolution, UpdateDecide, in.RunID, in.Reason)
	rec, err := d.claims.Resolve(ctx, key, effects.ResolveParams{Resolution: in.Resolution, Result: result, Reason: reason})
	switch {
	case err == nil:
	case errors.Is(err, effects.ErrNotFound) && in.Resolution == effects.ResolveRetry:
		out.State = "absent"
		return out, nil
	case errors.Is(err, effects.ErrNotResolvable) && rec != nil && rec.State == effects.StateSucceeded && in.Resolution == effects.ResolveDone:
		// Applied by an earlier attempt, or the step finished after all:
		// its outcome stands.
	case errors.Is(err, effects.ErrNotResolvable):
		return out, temporal.NewNonRetryableApplicationError(fmt.Sprintf(
			"%s %s: decision %s refused: %v; wait for a live claim's lease to run out, or decide \"done\" for a record that succeeded",
			in.Step, in.EffectKey, in.Resolution, err), activities.ErrTypeInvalidState, nil)
	default:
		return out, fmt.Errorf("apply decision on %s: %w", in.EffectKey, err)
	}
	out.State, out.Generation = string(rec.State), rec.Generation
	return out, nil
}
