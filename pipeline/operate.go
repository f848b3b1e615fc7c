package pipeline

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	commonpb "go.temporal.io/api/common/v1"
	workflowpb "go.temporal.io/api/workflow/v1"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/converter"
)

// ErrNotWaiting means the run is not waiting for a decision: it is running
// a step, closed, or waits on no step.
var ErrNotWaiting = errors.New("run is not waiting for a decision")

// ErrRunning wraps ErrNotWaiting for a run that is still running and does
// not wait for a decision: it settles its steps itself, so a decision
// written beside it would race it.
var ErrRunning = fmt.Errorf("%w: it is still running", ErrNotWaiting)

// Attention is one run, of any pipeline, that waits for an operator's
// decision.
type Attention struct {
	WorkflowID   string `json:"workflow_id"`
	RunID        string `json:"run_id"`
	WorkflowType string `json:"workflow_type"`
	TenantID     string `json:"tenant_id"`
	// Keywords holds the run's Keyword search attributes ListAttention was
	// asked for, such as "OrderID", when set.
	Keywords  map[string]string `json:"keywords,omitempty"`
	Attention string            `json:"attention"` // such as "receipt:ambiguous"
	StartTime time.Time         `json:"start_time"`
	// WaitingSince is when the wait began (KeyedWaitingSince; zero for a
	// run that began waiting before the attribute); Wait is its ID, once
	// ReadWait has asked the run.
	Wait         string    `json:"wait,omitempty"`
	WaitingSince time.Time `json:"waiting_since,omitzero"`
}

// ReadWait asks a's run for its wait (WaitOf) and sets a.Wait and
// a.WaitingSince. It returns WaitOf's error.
func (a *Attention) ReadWait(ctx context.Context, c client.Client) error {
	w, err := WaitOf(ctx, c, a.WorkflowID)
	if err != nil {
		return err
	}
	a.Wait, a.WaitingSince = w.Wait, w.WaitingSince
	return nil
}

// ListAttention returns the runs of c's namespace that wait for a decision
// (AttentionQuery), reading every page, with the Keyword search attributes
// named by keywords. It returns the client's error if the list fails, for
// example when the namespace has no KeyedAttention search attribute.
func ListAttention(ctx context.Context, c client.Client, keywords ...string) ([]Attention, error) {
	if c == nil {
		return nil, errors.New("list attention: client is nil")
	}
	var out []Attention
	err := eachRun(ctx, c, AttentionQuery, func(e *workflowpb.WorkflowExecutionInfo) {
		fields := e.GetSearchAttributes().GetIndexedFields()
		a := Attention{WorkflowID: e.GetExecution().GetWorkflowId(), RunID: e.GetExecution().GetRunId(),
			WorkflowType: e.GetType().GetName(), TenantID: keyword(fields, SearchAttrTenantIDName),
			Attention: keyword(fields, SearchAttrAttentionName), StartTime: e.GetStartTime().AsTime(),
			WaitingSince: datetime(fields, SearchAttrWaitingSinceName)}
		for _, name := range keywords {
			if v := keyword(fields, name); v != "" {
				if a.Keywords == nil {
					a.Keywords = map[string]string{}
				}
				a.Keywords[name] = v
			}
		}
		out = append(out, a)
	})
	if err != nil {
		return nil, fmt.Errorf("list attention (%s): %w", AttentionQuery, err)
	}
	return out, nil
}

// eachRun calls fn for every run query lists, reading every page. It
// returns the client's error.
func eachRun(ctx context.Context, c client.Client, query string, fn func(*workflowpb.WorkflowExecutionInfo)) error {
	var token []byte
	for {
		resp, err := c.ListWorkflow(ctx, &workflowservice.ListWorkflowExecutionsRequest{Query: query, NextPageToken: token})
		if err != nil {
			return err
		}
		for _, e := range resp.GetExecutions() {
			fn(e)
		}
		if token = resp.GetNextPageToken(); len(token) == 0 {
			return nil
		}
	}
}

// AttentionOf returns what the current run of the workflow id waits for,
// such as "receipt:ambiguous", and its run ID. It returns an error wrapping
// ErrNotWaiting when the run is closed or waits for nothing (ErrRunning
// when it is open), and the client's error (such as serviceerror.NotFound) when it cannot describe it.
func AttentionOf(ctx context.Context, c client.Client, id string) (value, runID string, err error) {
	if c == nil {
		return "", "", errors.New("attention of run: client is nil")
	}
	desc, err := c.DescribeWorkflow(ctx, id, "")
	if err != nil {
		return "", "", fmt.Errorf("describe %s: %w", id, err)
	}
	info := desc.RawResponse.GetWorkflowExecutionInfo()
	value = keyword(info.GetSearchAttributes().GetIndexedFields(), SearchAttrAttentionName)
	switch {
	case info.GetCloseTime() != nil:
		return "", "", fmt.Errorf("%s: %w", id, ErrNotWaiting)
	case value == "":
		return "", "", fmt.Errorf("%s: %w", id, ErrRunning)
	}
	return value, info.GetExecution().GetRunId(), nil
}

// SendDecision sends d as the UpdateDecide update to the run runID of the
// workflow id (empty runID: the current run) and waits until it is applied.
// The validator's refusal (a *DecisionError's text) and ApplyDecision's (a
// DecisionRefused "done", a live claim) come back as its error; the run
// keeps waiting. A d naming its Wait is sent under an Update ID derived
// from the wait and the decision, so that sending it again returns the
// first outcome instead of deciding again.
func SendDecision(ctx context.Context, c client.Client, id, runID string, d Decision) (*DecisionResult, error) {
	if c == nil {
		return nil, errors.New("send decision: client is nil")
	}
	h, err := c.UpdateWorkflow(ctx, client.UpdateWorkflowOptions{
		UpdateID: DecisionUpdateID(d), WorkflowID: id, RunID: runID, UpdateName: UpdateDecide, Args: []any{d},
		WaitForStage: client.WorkflowUpdateStageCompleted,
	})
	if err != nil {
		return nil, fmt.Errorf("send decision to %s: %w", id, err)
	}
	var res DecisionResult
	if err := h.Get(ctx, &res); err != nil {
		return nil, fmt.Errorf("decision on %s: %w", id, err)
	}
	return &res, nil
}

// DecisionUpdateID returns the Update ID SendDecision sends d under:
// "decide/<wait>/<digest of d>" for a d naming its Wait, so that a repeated
// decision (a retried command, a double click, the settler racing a
// person with the same verdict) returns the first one's outcome; "" (a
// random ID) otherwise.
func DecisionUpdateID(d Decision) string {
	if d.Wait == "" {
		return ""
	}
	b, err := json.Marshal(d)
	if err != nil {
		return "" // A Decision always marshals; a random ID is safe anyway.
	}
	sum := sha256.Sum256(b)
	return "decide/" + d.Wait + "/" + hex.EncodeToString(sum[:8])
}

// Wait is the wait of a run for a decision, as WaitOf reads it.
type Wait struct {
	WorkflowID string
	RunID      string
	StepStatus
	// Attention is the run's KeyedAttention, such as "receipt:ambiguous".
	Attention string
}

// WaitOf returns the wait of the current run of the workflow id: the
// waiting step's status (its Wait ID and since when) from the status query.
// It returns an error wrapping ErrNotWaiting when the run waits for
// nothing (ErrRunning when it is open), and the client's error when it cannot describe or query it.
func WaitOf(ctx context.Context, c client.Client, id string) (*Wait, error) {
	value, runID, err := AttentionOf(ctx, c, id)
	if err != nil {
		return nil, err
	}
	resp, err := c.QueryWorkflow(ctx, id, runID, QueryStatus)
	if err != nil {
		return nil, fmt.Errorf("query %s status: %w", id, err)
	}
	var status []StepStatus
	if err := resp.Get(&status); err != nil {
		return nil, fmt.Errorf("decode %s status: %w", id, err)
	}
	for _, s := range status {
		if s.State == StateWaiting {
			return &Wait{WorkflowID: id, RunID: runID, StepStatus: s, Attention: value}, nil
		}
	}
	return nil, fmt.Errorf("%s: %w", id, ErrRunning)
}

// datetime decodes the Datetime search attribute name from fields, or the
// zero time.
func datetime(fields map[string]*commonpb.Payload, name string) time.Time {
	p, ok := fields[name]
	if !ok {
		return time.Time{}
	}
	var t time.Time
	if err := converter.GetDefaultDataConverter().FromPayload(p, &t); err != nil {
		return time.Time{} // Not a single time: treated as unset.
	}
	return t
}

// keyword decodes the Keyword search attribute name from fields, or "".
func keyword(fields map[string]*commonpb.Payload, name string) string {
	p, ok := fields[name]
	if !ok {
		return ""
	}
	var s string
	if err := converter.GetDefaultDataConverter().FromPayload(p, &s); err != nil {
		return "" // Not a single keyword: treated as unset.
	}
	return s
}
