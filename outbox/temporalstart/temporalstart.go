// Package temporalstart is the outbox.Starter for Temporal: it starts the
// workflow an outbox row names, under the row's workflow ID, with the row's
// payload as its one argument. A start that finds a run of the ID going, or
// one the reuse policy keeps (default ALLOW_DUPLICATE_FAILED_ONLY), returns
// that run with Created=false instead of an error. A ConfigureFunc sets search
// attributes, memo, summary or timeouts per start (see Example).
package temporalstart

import (
	"cmp"
	"context"
	"errors"
	"fmt"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/client"

	"github.com/keyedhq/keyed/outbox"
)

// ConfigureFunc adjusts the options of one start after Starter filled in the
// workflow ID, task queue and reuse policy. It runs within the relay's start
// timeout; its error fails the start (wrap outbox.ErrInvalid when the request
// can never start). The workflow ID and conflict handling are overwritten.
type ConfigureFunc func(ctx context.Context, req outbox.Request, o *client.StartWorkflowOptions) error

// Opts configures a Starter. A nil *Opts means all defaults.
type Opts struct {
	// TaskQueue is the queue of a request that names none. A start of such
	// a request fails when TaskQueue is empty too.
	TaskQueue string
	// Configure, if set, adjusts each start's options.
	Configure ConfigureFunc
}

// Starter starts outbox rows' workflows on Temporal. It implements
// outbox.Starter and is safe for concurrent use.
type Starter struct {
	client client.Client
	opts   Opts
}

// New returns a Starter that starts workflows with c.
func New(c client.Client, opts *Opts) *Starter {
	s := &Starter{client: c}
	if opts != nil {
		s.opts = *opts
	}
	return s
}

// Start starts req's workflow (req.TaskQueue or Opts.TaskQueue, req.Payload as
// its one argument) and reports Created=true when this call created the run,
// or Created=false with the existing run's ID (see Execute). It returns an
// error wrapping outbox.ErrInvalid for a missing workflow type, ID or task
// queue, Configure's error, and the client's error otherwise.
func (s *Starter) Start(ctx context.Context, req outbox.Request) (*outbox.Started, error) {
	o, err := s.options(ctx, req)
	if err != nil {
		return nil, err
	}
	return Execute(ctx, s.client, o, req.WorkflowType, req.Payload)
}

// UpdateWithStart sends upd to req's run, starting the run as Start would
// (same options, conflict policy USE_EXISTING) when none is going, in one
// atomic call, and returns the update's handle once upd.WaitForStage is
// reached. Unlike Start it never starts a run after a closed one (reuse
// policy REJECT_DUPLICATE): a closed run is the client's error, for the
// caller to read the outcome elsewhere. It returns Start's option errors and
// the client's.
func (s *Starter) UpdateWithStart(ctx context.Context, req outbox.Request, upd client.UpdateWorkflowOptions) (client.WorkflowUpdateHandle, error) {
	o, err := s.options(ctx, req)
	if err != nil {
		return nil, err
	}
	o.WorkflowIDConflictPolicy = enumspb.WORKFLOW_ID_CONFLICT_POLICY_USE_EXISTING
	o.WorkflowIDReusePolicy = enumspb.WORKFLOW_ID_REUSE_POLICY_REJECT_DUPLICATE
	op := s.client.NewWithStartWorkflowOperation(o, req.WorkflowType, req.Payload)
	h, err := s.client.UpdateWithStartWorkflow(ctx, client.UpdateWithStartWorkflowOptions{StartWorkflowOperation: op, UpdateOptions: upd})
	if err != nil {
		return nil, fmt.Errorf("update-with-start %s: %w", req.WorkflowID, err)
	}
	return h, nil
}

// options returns the start options of req: its ID and task queue, reuse
// policy ALLOW_DUPLICATE_FAILED_ONLY, and Configure's changes.
func (s *Starter) options(ctx context.Context, req outbox.Request) (client.StartWorkflowOptions, error) {
	if s.client == nil {
		return client.StartWorkflowOptions{}, errors.New("start workflow: client is nil")
	}
	if req.WorkflowType == "" || req.WorkflowID == "" {
		return client.StartWorkflowOptions{}, fmt.Errorf("start workflow: %w: workflow type %q, ID %q", outbox.ErrInvalid, req.WorkflowType, req.WorkflowID)
	}
	o := client.StartWorkflowOptions{
		ID:                    req.WorkflowID,
		TaskQueue:             cmp.Or(req.TaskQueue, s.opts.TaskQueue),
		WorkflowIDReusePolicy: enumspb.WORKFLOW_ID_REUSE_POLICY_ALLOW_DUPLICATE_FAILED_ONLY,
	}
	if s.opts.Configure != nil {
		if err := s.opts.Configure(ctx, req, &o); err != nil {
			return o, fmt.Errorf("start %s: configure: %w", req.WorkflowID, err)
		}
	}
	if o.TaskQueue == "" {
		return o, fmt.Errorf("start %s: %w: no task queue", req.WorkflowID, outbox.ErrInvalid)
	}
	// What the relay's guarantee rests on, whatever Configure did.
	o.ID = req.WorkflowID
	return o, nil
}

// Execute starts workflow with arg under o in one atomic call (conflict
// policy FAIL) and reports a run already going, or one the reuse policy kept,
// as Created=false with its run ID. It returns the client's other errors.
// The start is eager: when c also runs a worker on o's task queue with a
// free slot (the worker's relay), the run's first workflow task comes back
// with the start, with no trip through the task queue; otherwise the
// server dispatches it as usual.
func Execute(ctx context.Context, c client.Client, o client.StartWorkflowOptions, workflow string, arg any) (*outbox.Started, error) {
	o.WorkflowIDConflictPolicy = enumspb.WORKFLOW_ID_CONFLICT_POLICY_FAIL
	o.WorkflowExecutionErrorWhenAlreadyStarted = true
	o.EnableEagerStart = true
	run, err := c.ExecuteWorkflow(ctx, o, workflow, arg)
	var already *serviceerror.WorkflowExecutionAlreadyStarted
	if errors.As(err, &already) {
		return &outbox.Started{WorkflowID: o.ID, RunID: already.RunId, Created: false}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("start %s %s: %w", workflow, o.ID, err)
	}
	return &outbox.Started{WorkflowID: run.GetID(), RunID: run.GetRunID(), Created: true}, nil
}
