package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

// runWait bounds how long the demo waits for one run: its runs take a
// second or two, so one still going after this is stuck on a step (a
// provider the demo does not serve, a worker that died).
const runWait = time.Minute

// errStuck is await's error for a run that did not finish within its wait.
var errStuck = errors.New("the run has not finished")

// await waits up to wait for the run id/runID and decodes its result into
// out (nil: none), returning the run's error. A run still going fails with
// errStuck, naming the activities it waits on and their last failures.
func (s *stack) await(ctx context.Context, id, runID string, wait time.Duration, out any) error {
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	err := s.tc.GetWorkflow(wctx, id, runID).Get(wctx, out)
	if err == nil || ctx.Err() != nil {
		return err
	}
	// A run that ended returns its own error; one still open ran out the
	// wait (whose deadline the RPC may report before wctx does).
	what, open := s.stuck(ctx, id, runID)
	if !open {
		return err
	}
	return fmt.Errorf("%w: %s after %s: %s; the worker's log is %s", errStuck, id, wait, what, s.logPath)
}

// stuck reports whether the run is still open and, if so, which activities
// it waits on, with each one's attempt and last failure; open is false when
// Temporal cannot say.
func (s *stack) stuck(ctx context.Context, id, runID string) (what string, open bool) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	desc, err := s.tc.DescribeWorkflow(ctx, id, runID)
	if err != nil || desc.RawResponse.GetWorkflowExecutionInfo().GetCloseTime() != nil {
		return "", false
	}
	var parts []string
	for _, a := range desc.RawResponse.GetPendingActivities() {
		p := fmt.Sprintf("%s on attempt %d", a.GetActivityType().GetName(), a.GetAttempt())
		if msg := a.GetLastFailure().GetMessage(); msg != "" {
			p += " (last failure: " + msg + ")"
		}
		parts = append(parts, p)
	}
	if len(parts) == 0 {
		return "no activity is running: is a worker polling task queue " + s.taskQueue + "?", true
	}
	return "waiting on " + strings.Join(parts, ", "), true
}
