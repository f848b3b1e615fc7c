// Package temporalstart is the outbox.Starter for Temporal: it starts the
// workflow an outbox row names, under the row's workflow ID, with the row's
// payload as the workflow's one argument.
//
// A start that finds a run of the ID already going, or a finished
// successful one, collapses into it: Start returns that run's ID with
// Created=false instead of an error, which is what lets a relay start a row
// again after a crash without a second run. The conflict handling is fixed;
// the reuse policy defaults to ALLOW_DUPLICATE_FAILED_ONLY (no second run
// after a success, a deliberate re-run after a failure) and, like search
// attributes, a memo, a summary or timeouts, can be set per start by a
// ConfigureFunc:
//
//	starter := temporalstart.New(c, &temporalstart.Opts{
//		TaskQueue: "invoices",
//		Configure: func(ctx context.Context, req outbox.Request, o *client.StartWorkflowOptions) error {
//			o.StaticSummary = "invoice for " + req.TenantID
//			return nil
//		},
//	})
//	relay, err := outbox.NewRelay(pool, starter, nil)
//
// orderflow.ConfigureOutboxStart is the ConfigureFunc of keyed's order
// pipeline.
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

// ConfigureFunc adjusts the options of one start after Starter has filled
// in the workflow ID, the task queue and the reuse policy: to add search
// attributes, a memo, a static summary or timeouts, or to change the task
// queue or reuse policy. It must not block for long: it runs within the
// relay's start timeout. An error fails the start, which the relay retries
// with backoff; wrap outbox.ErrInvalid when the request can never start.
// The workflow ID and conflict handling it sets are overwritten.
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

// Start starts req's workflow: type req.WorkflowType, ID req.WorkflowID,
// task queue req.TaskQueue or else Opts.TaskQueue, and req.Payload as its
// one argument, which the client's data converter sends as JSON, so the
// workflow receives it as its typed input. It reports Created=true when
// this call created the run, and Created=false with the existing run's ID
// when a run of the ID is going or the reuse policy refused a new one (by
// default, after a success; see Execute).
//
// It returns an error wrapping outbox.ErrInvalid for a request without a
// workflow type or ID, or with no task queue to go to, before calling
// Temporal; Configure's error; and the client's error otherwise.
func (s *Starter) Start(ctx context.Context, req outbox.Request) (*outbox.Started, error) {
	if s.client == nil {
		return nil, errors.New("start workflow: client is nil")
	}
	if req.WorkflowType == "" || req.WorkflowID == "" {
		return nil, fmt.Errorf("start workflow: %w: workflow type %q, ID %q", outbox.ErrInvalid, req.WorkflowType, req.WorkflowID)
	}
	o := client.StartWorkflowOptions{
		ID:                    req.WorkflowID,
		TaskQueue:             cmp.Or(req.TaskQueue, s.opts.TaskQueue),
		WorkflowIDReusePolicy: enumspb.WORKFLOW_ID_REUSE_POLICY_ALLOW_DUPLICATE_FAILED_ONLY,
	}
	if s.opts.Configure != nil {
		if err := s.opts.Configure(ctx, req, &o); err != nil {
			return nil, fmt.Errorf("start %s: configure: %w", req.WorkflowID, err)
		}
	}
	if o.TaskQueue == "" {
		return nil, fmt.Errorf("start %s: %w: no task queue", req.WorkflowID, outbox.ErrInvalid)
	}
	// What the relay's guarantee rests on, whatever Configure did.
	o.ID = req.WorkflowID
	return Execute(ctx, s.client, o, req.WorkflowType, req.Payload)
}

// Execute starts workflow with arg under o and says whether this call
// created the run: it sends conflict policy FAIL with
// WorkflowExecutionErrorWhenAlreadyStarted, so that the server decides in
// one atomic call, and reports a run already going (or one the reuse policy
// kept, by default after a success) as Created=false with that run's ID. It
// returns the client's other errors.
func Execute(ctx context.Context, c client.Client, o client.StartWorkflowOptions, workflow string, arg any) (*outbox.Started, error) {
	o.WorkflowIDConflictPolicy = enumspb.WORKFLOW_ID_CONFLICT_POLICY_FAIL
	o.WorkflowExecutionErrorWhenAlreadyStarted = true
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
