package pipelinetest

import (
	"context"
	"log/slog"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/mock"
	"github.com/stretchr/testify/require"
	sdkpb "go.temporal.io/api/sdk/v1"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/log"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"

	"github.com/keyedhq/keyed/pipeline"
	"github.com/keyedhq/keyed/step"
)

// queryMetadata is the SDK's built-in query answered with the run's
// sdkpb.WorkflowMetadata, which holds the current details.
const queryMetadata = "__temporal_workflow_metadata"

// Unset is what Attention records when an upsert clears KeyedAttention.
const Unset = "<unset>"

// NewEnv returns a workflow test environment whose logger discards
// everything, and asserts the expectations of its mocks (OnActivity and the
// like) when the test ends.
func NewEnv(t testing.TB) *testsuite.TestWorkflowEnvironment {
	t.Helper()
	var suite testsuite.WorkflowTestSuite
	suite.SetLogger(log.NewStructuredLogger(slog.New(slog.DiscardHandler)))
	env := suite.NewTestWorkflowEnvironment()
	t.Cleanup(func() { env.AssertExpectations(t) })
	return env
}

// Status returns the run's answer to the status query (pipeline.QueryStatus).
// It fails the test when the query fails or its answer does not decode.
func Status(t testing.TB, env *testsuite.TestWorkflowEnvironment) []pipeline.StepStatus {
	t.Helper()
	val, err := env.QueryWorkflow(pipeline.QueryStatus)
	require.NoError(t, err, "query %s", pipeline.QueryStatus)
	var st []pipeline.StepStatus
	require.NoError(t, val.Get(&st), "decode %s", pipeline.QueryStatus)
	return st
}

// States returns each step of the status query as "step=state", such as
// "receipt=waiting", in the query's order. It fails the test as Status does.
func States(t testing.TB, env *testsuite.TestWorkflowEnvironment) []string {
	t.Helper()
	return StepStates(Status(t, env))
}

// StepStates returns each step of st as "step=state", in order, and nil for
// no steps.
func StepStates(st []pipeline.StepStatus) []string {
	var out []string
	for _, s := range st {
		out = append(out, s.Step+"="+s.State)
	}
	return out
}

// Details returns the run's current details (workflow.SetCurrentDetails),
// read through the SDK's metadata query. It fails the test when the query
// fails or its answer does not decode.
func Details(t testing.TB, env *testsuite.TestWorkflowEnvironment) string {
	t.Helper()
	val, err := env.QueryWorkflow(queryMetadata)
	require.NoError(t, err, "query %s", queryMetadata)
	var md sdkpb.WorkflowMetadata
	require.NoError(t, val.Get(&md), "decode %s", queryMetadata)
	return md.GetCurrentDetails()
}

// Update is what became of one decide update sent by Decide. Read it after
// ExecuteWorkflow returned.
type Update struct {
	// Accepted is true when the update's validator accepted the decision.
	Accepted bool
	// Rejected is the validator's error, nil when it accepted the decision.
	Rejected error
	// Completed is the error the accepted update ended with (the
	// ApplyDecision activity's, for one).
	Completed error
	// Result is what the accepted update returned.
	Result pipeline.DecisionResult
}

// Err returns Rejected, or else Completed: nil when the decision was
// accepted and applied, or when the update was never sent.
func (u *Update) Err() error {
	if u.Rejected != nil {
		return u.Rejected
	}
	return u.Completed
}

// Decide sends d as the decide update (pipeline.UpdateDecide) when the
// workflow clock is at after, measured from the run's start, and returns
// the Update that records what became of it. Call it before
// ExecuteWorkflow.
func Decide(env *testsuite.TestWorkflowEnvironment, d pipeline.Decision, after time.Duration) *Update {
	u := &Update{}
	env.RegisterDelayedCallback(func() {
		env.UpdateWorkflow(pipeline.UpdateDecide, "", &testsuite.TestUpdateCallback{
			OnAccept: func() { u.Accepted = true },
			OnReject: func(err error) { u.Rejected = err },
			OnComplete: func(res any, err error) {
				u.Completed = err
				if r, ok := res.(pipeline.DecisionResult); ok {
					u.Result = r
				}
			},
		}, d)
	}, after)
	return u
}

// Attention records the values a run gives KeyedAttention
// (pipeline.SearchAttrAttention), in order.
type Attention struct {
	mu     sync.Mutex
	values []string
}

// RecordAttention mocks the search attribute upserts of env, any number of
// them including none, and returns the Attention that records each value
// KeyedAttention is set to, or Unset when an upsert clears it. Call it
// before ExecuteWorkflow.
func RecordAttention(env *testsuite.TestWorkflowEnvironment) *Attention {
	a := &Attention{}
	env.OnUpsertTypedSearchAttributes(mock.Anything).Run(func(args mock.Arguments) {
		sa, _ := args.Get(0).(temporal.SearchAttributes)
		v, ok := sa.GetKeyword(pipeline.SearchAttrAttention)
		if !ok {
			v = Unset
		}
		a.mu.Lock()
		defer a.mu.Unlock()
		a.values = append(a.values, v)
	}).Return(nil).Maybe()
	return a
}

// Values returns the recorded values in order, nil when there are none.
func (a *Attention) Values() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.values == nil {
		return nil
	}
	return append([]string(nil), a.values...)
}

// Started records the activities a run starts, in order, retries included.
type Started struct {
	mu    sync.Mutex
	infos []activity.Info
}

// RecordStarted sets the activity-started and local-activity-started
// listeners of env and returns the Started that records each activity the
// run starts, local or not. It replaces any listener set before. Call it
// before ExecuteWorkflow.
func RecordStarted(env *testsuite.TestWorkflowEnvironment) *Started {
	s := &Started{}
	record := func(info *activity.Info) {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.infos = append(s.infos, *info)
	}
	env.SetOnActivityStartedListener(func(info *activity.Info, _ context.Context, _ converter.EncodedValues) { record(info) })
	env.SetOnLocalActivityStartedListener(func(info *activity.Info, _ context.Context, _ []any) { record(info) })
	return s
}

// Names returns the activity type of each start in order, nil when none
// started.
func (s *Started) Names() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, info := range s.infos {
		out = append(out, info.ActivityType.Name)
	}
	return out
}

// Local says, for each start in Names' order, whether it was a local
// activity.
func (s *Started) Local() []bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []bool
	for _, info := range s.infos {
		out = append(out, info.IsLocalActivity)
	}
	return out
}

// Info returns the activity.Info of the last start of the activity type
// name, or the zero Info when it never started.
func (s *Started) Info(name string) activity.Info {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := len(s.infos) - 1; i >= 0; i-- {
		if s.infos[i].ActivityType.Name == name {
			return s.infos[i]
		}
	}
	return activity.Info{}
}

// MockApplyDecision mocks one run of the ApplyDecision activity
// (pipeline.NameApplyDecision) that applies whatever it is given: it
// returns the decision's step, effect key and resolution with the record
// "succeeded" at generation. The returned DecisionInput is what the
// activity was given, once it ran. Call it before ExecuteWorkflow; the
// environment's AssertExpectations fails the test when it did not run.
func MockApplyDecision(env *testsuite.TestWorkflowEnvironment, generation int64) *pipeline.DecisionInput {
	applied := &pipeline.DecisionInput{}
	env.OnActivity(pipeline.NameApplyDecision, mock.Anything, mock.Anything).Return(
		func(_ context.Context, di pipeline.DecisionInput) (pipeline.DecisionResult, error) {
			*applied = di
			return pipeline.DecisionResult{Step: di.Step, EffectKey: di.EffectKey, Resolution: string(di.Resolution),
				State: "succeeded", Generation: generation}, nil
		}).Once()
	return applied
}

// RequireRefused applies in with d (pipeline.Decider.Apply) and fails the
// test unless d refuses it with a *pipeline.RefusedError whose text holds
// want and whose Unverifiable is unverifiable.
func RequireRefused(t testing.TB, d *pipeline.Decider, in pipeline.DecisionInput, want string, unverifiable bool) {
	t.Helper()
	_, err := d.Apply(context.Background(), in)
	var refused *pipeline.RefusedError
	require.ErrorAs(t, err, &refused, "want a refusal saying %q", want)
	require.ErrorContains(t, err, want)
	require.Equal(t, unverifiable, refused.Unverifiable, "unverifiable: %v", err)
}

// RequireVerified fails the test unless every step of spec, bound to a
// zero pipeline.Deps, declares an Outcome and has a Verify, in the order of
// its declarations.
func RequireVerified(t testing.TB, spec pipeline.Spec) {
	t.Helper()
	defs, err := spec.Activities(pipeline.Deps{})
	require.NoError(t, err)
	require.Len(t, defs, len(spec.Steps))
	for i, def := range defs {
		require.Equal(t, spec.Steps[i], def.Declaration)
		require.NotNil(t, def.Outcome, "%s declares the rule for a done outcome", def.Name)
		require.NotNil(t, def.Verify, "%s checks a done at its provider", def.Name)
	}
}

// Register registers with env every spec's workflow, configured by opts,
// every declared step under its name (bound to a zero pipeline.Deps: tests
// mock them) and ApplyDecision, for OnActivity and MockRest.
func Register(t testing.TB, env *testsuite.TestWorkflowEnvironment, opts *pipeline.Opts, specs ...pipeline.Spec) {
	t.Helper()
	defs, err := pipeline.Definitions(specs, pipeline.Deps{})
	require.NoError(t, err)
	for _, s := range specs {
		s.Register(env, opts)
	}
	var d *pipeline.Decider
	require.NoError(t, step.Register(env, append(defs, d.Definition())...))
}

// MockRest mocks every declared step of specs to succeed with its zero
// outcome, any number of times, behind the test's own mocks: call it after
// them, before ExecuteWorkflow, so that a step added to a workflow does not
// break the tests that do not mock it.
func MockRest(env *testsuite.TestWorkflowEnvironment, specs ...pipeline.Spec) {
	for _, d := range Stubs(specs, nil) {
		env.OnActivity(d.Name, mock.Anything, mock.Anything).Return(d.Fn).Maybe()
	}
}

// Stubs returns every declared step of specs bound to a function that
// succeeds with its zero outcome, or to fns[name], a function of the
// step's type, when given: for a real worker in a test whose steps must
// not touch a database or a provider.
func Stubs(specs []pipeline.Spec, fns map[string]any) []step.Definition {
	defs, err := pipeline.Definitions(specs, pipeline.Deps{})
	if err != nil {
		panic(err)
	}
	for i, d := range defs {
		if fn, ok := fns[d.Name]; ok {
			defs[i].Fn = fn
			continue
		}
		fn := reflect.TypeOf(d.Fn)
		defs[i].Fn = reflect.MakeFunc(fn, func([]reflect.Value) []reflect.Value {
			return []reflect.Value{reflect.Zero(fn.Out(0)), reflect.Zero(fn.Out(1))}
		}).Interface()
	}
	return defs
}

// RequireSteps asserts that the entries of got that name a step of want
// equal want: activity names ("Charge") or states ("charge=done", by the
// step before "="). A test states the steps it drives, so a step added to
// the workflow later leaves it standing.
func RequireSteps(t testing.TB, want, got []string, msgAndArgs ...any) {
	t.Helper()
	keep := map[string]bool{}
	for _, w := range want {
		keep[stepOf(w)] = true
	}
	var only []string
	for _, g := range got {
		if keep[stepOf(g)] {
			only = append(only, g)
		}
	}
	require.Equal(t, want, only, msgAndArgs...)
}

// OnlySteps returns the statuses of st whose step is one of steps, in order.
func OnlySteps(st []pipeline.StepStatus, steps ...string) []pipeline.StepStatus {
	var out []pipeline.StepStatus
	for _, s := range st {
		if slices.Contains(steps, s.Step) {
			out = append(out, s)
		}
	}
	return out
}

func stepOf(entry string) string {
	name, _, _ := strings.Cut(entry, "=")
	return name
}
