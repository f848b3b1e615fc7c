package pipeline

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/worker"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/outbox"
	"github.com/keyedhq/keyed/outbox/temporalstart"
	"github.com/keyedhq/keyed/step"
)

// Spec is one pipeline, registered once (package workflows lists them). The
// worker, the relay, doctor, the retention check and the starter iterate
// the registered specs; nothing else names a pipeline.
type Spec struct {
	// Name names the pipeline, such as "order".
	Name string
	// Workflow is the registered name of its workflow, such as
	// "OrderWorkflow": outbox rows of this type start its runs.
	Workflow string
	// Register registers the workflow with r, configured by opts.
	Register func(r worker.WorkflowRegistry, opts *Opts)
	// Steps declares every step a run may take.
	Steps []step.Declaration
	// LongestPath lists the steps of a run's longest path, whose retry
	// windows add up to the run's (LongestRun). Nil means Steps.
	LongestPath []step.Declaration
	// Activities binds the steps to d, each with its Verify. With a zero
	// Deps the definitions only name the steps; a step whose provider d
	// lacks fails when it runs, and its Verify finds the record
	// unverifiable.
	Activities func(d Deps) ([]step.Definition, error)
	// Placeholder derives the steps' key shapes from placeholder IDs such
	// as "{tenant}", for doctor.
	Placeholder Keyer
	// RunOfKey returns the workflow ID of the run whose step makes the
	// effect k, and that step, or false for another pipeline's key.
	RunOfKey func(k effects.Key) (workflowID, step string, ok bool)
	// Configure gives a run started from the outbox the options its
	// pipeline's own starts have (search attributes, summary). db may be
	// nil. An error wrapping outbox.ErrInvalid means the row never starts.
	Configure func(ctx context.Context, db effects.DB, req outbox.Request, o *client.StartWorkflowOptions) error
	// SearchAttributes lists the search attributes its runs set besides
	// the framework's (the tenant and KeyedAttention).
	SearchAttributes []SearchAttribute
	// Final, if set, reports whether the failed run workflowID ended for
	// good (its business outcome is final, such as a declined order), so
	// that doctor does not count it as a dead letter.
	Final func(ctx context.Context, db effects.DB, workflowID string) bool
}

// SearchAttribute is a custom search attribute a pipeline's runs set, such
// as {"OrderID", "Keyword"}. The namespace must have it registered.
type SearchAttribute struct {
	Name string
	Type string
}

// frameworkSearchAttributes returns the search attributes every pipeline's
// runs set: the tenant, the attention marker and when the wait began.
func frameworkSearchAttributes() []SearchAttribute {
	return []SearchAttribute{{SearchAttrTenantIDName, "Keyword"}, {SearchAttrAttentionName, "Keyword"}, {SearchAttrWaitingSinceName, "Datetime"}}
}

// SearchAttributes returns the framework's search attributes and every
// spec's, each once, in that order.
func SearchAttributes(specs []Spec) []SearchAttribute {
	out := frameworkSearchAttributes()
	for _, s := range specs {
		for _, sa := range s.SearchAttributes {
			if !slices.Contains(out, sa) {
				out = append(out, sa)
			}
		}
	}
	return out
}

// Deps is what a pipeline's steps need: the database, the effects client,
// a logger (nil: slog.Default()), and the worker's provider clients, one
// per type, which a step asks for with Provider.
type Deps struct {
	DB        *pgxpool.Pool
	Effects   *effects.Client
	Logger    *slog.Logger
	Providers []any
	// Gate decides which first attempts run in the workflow task; nil
	// runs them all there.
	Gate *step.LocalGate
}

// Runner returns what step.Keyed.Run claims with.
func (d Deps) Runner() step.Runner {
	return step.Runner{DB: d.DB, Effects: d.Effects, Logger: d.Logger, Gate: d.Gate}
}

// Provider returns d's provider client of type T, such as
// *stripeclient.API, or the zero T and false.
func Provider[T any](d Deps) (T, bool) {
	for _, p := range d.Providers {
		if c, ok := p.(T); ok {
			return c, true
		}
	}
	var zero T
	return zero, false
}

// Registry is what a worker (or a test environment) registers with.
type Registry interface {
	worker.WorkflowRegistry
	worker.ActivityRegistry
}

// Register registers every spec's workflow with r, configured by opts, and
// every spec's steps and ApplyDecision (a Decider over all of them) in one
// step.Register call, which refuses two steps that claim one name or key
// step. It returns the first spec's binding error or step.Register's.
func Register(r Registry, specs []Spec, d Deps, opts *Opts) error {
	defs, err := Definitions(specs, d)
	if err != nil {
		return err
	}
	decider, err := NewDecider(d.Effects, defs...)
	if err != nil {
		return err
	}
	for _, s := range specs {
		s.Register(r, opts)
	}
	return step.Register(r, append(defs, decider.Definition())...)
}

// Definitions returns every spec's steps bound to d.
func Definitions(specs []Spec, d Deps) ([]step.Definition, error) {
	var defs []step.Definition
	for _, s := range specs {
		got, err := s.Activities(d)
		if err != nil {
			return nil, fmt.Errorf("pipeline %s: %w", s.Name, err)
		}
		defs = append(defs, got...)
	}
	return defs, nil
}

// NewDeciderOf returns a Decider over every spec's steps bound to d, for
// deciding outside a worker (starter resolve).
func NewDeciderOf(specs []Spec, d Deps) (*Decider, error) {
	defs, err := Definitions(specs, d)
	if err != nil {
		return nil, err
	}
	return NewDecider(d.Effects, defs...)
}

// LongestRun returns the longest any spec's run can keep retrying its
// steps: the largest sum of its longest path's retry windows. Effect
// records must be kept at least this long beyond the namespace's retention.
func LongestRun(specs []Spec) time.Duration {
	var longest time.Duration
	for _, s := range specs {
		path := s.LongestPath
		if path == nil {
			path = s.Steps
		}
		var total time.Duration
		for _, d := range path {
			total += step.RetryWindow(d.ActivityOptions(""))
		}
		longest = max(longest, total)
	}
	return longest
}

// Lifetimes returns the table of effect kinds and lifetimes the specs'
// declarations give: every step whose Keep is not KeepDefault keeps its
// records keep[Keep], and every other kind keep[KeepDefault]. It returns an
// error for a Keep without a duration.
func Lifetimes(specs []Spec, keep map[step.Keep]time.Duration) ([]effects.Lifetime, error) {
	def, ok := keep[step.KeepDefault]
	if !ok {
		return nil, errors.New("lifetimes: no duration for KeepDefault")
	}
	out, seen := []effects.Lifetime{{Kind: "", Keep: def}}, map[string]bool{}
	for _, s := range specs {
		for _, d := range s.Steps {
			if d.Keep == step.KeepDefault || seen[d.Step] {
				continue
			}
			k, ok := keep[d.Keep]
			if !ok {
				return nil, fmt.Errorf("lifetimes: step %s: no duration for its Keep %d", d.Name, d.Keep)
			}
			seen[d.Step] = true
			out = append(out, effects.Lifetime{Kind: d.Step, Keep: k})
		}
	}
	return out, nil
}

// RunOfKey returns the workflow ID of the run whose step makes the effect
// k, and that step, as the spec that owns k's shape derives it.
func RunOfKey(specs []Spec, k effects.Key) (workflowID, stepName string, ok bool) {
	for _, s := range specs {
		if id, st, ok := s.RunOfKey(k); ok {
			return id, st, true
		}
	}
	return "", "", false
}

// Configure returns the relay's temporalstart.ConfigureFunc: a row of a
// spec's workflow gets that spec's Configure, MemoLocalSteps and
// MemoLocalFirst; other rows pass untouched.
func Configure(specs []Spec, db effects.DB) temporalstart.ConfigureFunc {
	return func(ctx context.Context, req outbox.Request, o *client.StartWorkflowOptions) error {
		for _, s := range specs {
			if s.Workflow != req.WorkflowType {
				continue
			}
			if s.Configure != nil {
				if err := s.Configure(ctx, db, req, o); err != nil {
					return err
				}
			}
			o.Memo = withLocalSteps(o.Memo)
			return nil
		}
		return nil
	}
}

// Starter returns the relay's outbox.Starter on taskQueue, configured by
// every spec (Configure).
func Starter(c client.Client, db effects.DB, taskQueue string, specs []Spec) outbox.Starter {
	return temporalstart.New(c, &temporalstart.Opts{TaskQueue: taskQueue, Configure: Configure(specs, db)})
}
