package pipeline

import (
	"errors"
	"fmt"
	"slices"

	"go.temporal.io/sdk/workflow"
)

// UpdateAwaitSteps is the name of a run's update that returns once the
// steps it names have settled: the "early return" an API answers a request
// with (Update-with-Start). Its argument is an AwaitSteps, its result the
// named steps' []StepStatus.
const UpdateAwaitSteps = "await_steps"

// AwaitSteps is UpdateAwaitSteps's argument: the steps that decide a
// request, such as the order's charge and mark_paid.
type AwaitSteps struct {
	Steps []string `json:"steps"`
}

// settled reports whether a step in state s will not change without
// something outside the run: done, failed, skipped, or waiting for a
// decision.
func settled(s string) bool {
	return s != StatePending && s != StateRunning
}

// awaited returns the status of the named steps the run has reached and
// whether every one of them has settled (and at least one is known).
func (r *Run) awaited(names []string) ([]StepStatus, bool) {
	var out []StepStatus
	done := true
	for _, s := range r.status {
		if !slices.Contains(names, s.Step) {
			continue
		}
		out = append(out, s)
		done = done && settled(s.State)
	}
	return out, done && len(out) > 0
}

// setAwaitHandler registers UpdateAwaitSteps. It adds no command: a run
// that never receives the update replays as before, so it needs no
// workflow.GetVersion.
func (r *Run) setAwaitHandler(ctx workflow.Context) error {
	err := workflow.SetUpdateHandlerWithOptions(ctx, UpdateAwaitSteps,
		func(ctx workflow.Context, a AwaitSteps) ([]StepStatus, error) {
			var out []StepStatus
			err := workflow.Await(ctx, func() bool {
				var ok bool
				out, ok = r.awaited(a.Steps)
				return ok
			})
			return out, err
		},
		workflow.UpdateHandlerOptions{Validator: func(_ workflow.Context, a AwaitSteps) error {
			if len(a.Steps) == 0 {
				return errors.New("name the steps to await")
			}
			return nil
		}})
	if err != nil {
		return fmt.Errorf("register %s update: %w", UpdateAwaitSteps, err)
	}
	return nil
}
