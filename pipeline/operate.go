package pipeline

import (
	"context"
	"errors"
	"fmt"
	"time"

	commonpb "go.temporal.io/api/common/v1"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/converter"

	"github.com/keyedhq/keyed/orders"
)

// ErrNotWaiting means the run is not waiting for a decision: it is running
// a step, closed, or waits on no step.
var ErrNotWaiting = errors.New("run is not waiting for a decision")

// Attention is one run, of any pipeline, that waits for an operator's
// decision. TenantID and OrderID are the run's search attributes, empty
// for a run started without them.
type Attention struct {
	WorkflowID   string    `json:"workflow_id"`
	RunID        string    `json:"run_id"`
	WorkflowType string    `json:"workflow_type"` // Such as "OrderWorkflow" or "RefundWorkflow".
	TenantID     string    `json:"tenant_id"`
	OrderID      string    `json:"order_id"`
	Attention    string    `json:"attention"` // Such as "receipt:ambiguous".
	StartTime    time.Time `json:"start_time"`
}

// ListAttention returns the runs of c's namespace that wait for a decision
// (AttentionQuery), oldest first as the server orders them, reading every
// page. It returns the client's error if the list fails, for example when
// the namespace has no KeyedAttention search attribute.
func ListAttention(ctx context.Context, c client.Client) ([]Attention, error) {
	if c == nil {
		return nil, errors.New("list attention: client is nil")
	}
	var out []Attention
	var token []byte
	for {
		resp, err := c.ListWorkflow(ctx, &workflowservice.ListWorkflowExecutionsRequest{Query: AttentionQuery, NextPageToken: token})
		if err != nil {
			return nil, fmt.Errorf("list attention (%s): %w", AttentionQuery, err)
		}
		for _, e := range resp.GetExecutions() {
			fields := e.GetSearchAttributes().GetIndexedFields()
			out = append(out, Attention{
				WorkflowID: e.GetExecution().GetWorkflowId(), RunID: e.GetExecution().GetRunId(), WorkflowType: e.GetType().GetName(),
				TenantID: keyword(fields, orders.SearchAttrTenantID), OrderID: keyword(fields, orders.SearchAttrOrderID),
				Attention: keyword(fields, SearchAttrAttentionName), StartTime: e.GetStartTime().AsTime(),
			})
		}
		if token = resp.GetNextPageToken(); len(token) == 0 {
			return out, nil
		}
	}
}

// AttentionOf returns what the current run of the workflow id waits for,
// such as "receipt:ambiguous", and its run ID. The ID is the pipeline's own,
// such as orders.WorkflowID's or refunds.RefundInput.WorkflowID's. It
// returns an error wrapping ErrNotWaiting when the run is closed or waits
// for nothing, and the client's error (such as serviceerror.NotFound) when
// it cannot describe it.
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
	if value == "" || info.GetCloseTime() != nil {
		return "", "", fmt.Errorf("%s: %w", id, ErrNotWaiting)
	}
	return value, info.GetExecution().GetRunId(), nil
}

// SendDecision sends d as the UpdateDecide update to the run runID of the
// workflow id (empty runID means the current run) and waits until it is applied. The
// workflow's validator refuses a bad decision before it enters history (no
// step waiting, another step, an unknown resolution, no reason or operator,
// a "done" without the step's outcome: a *DecisionError's text);
// ApplyDecision's refusal (a DecisionRefused "done" the provider
// contradicts or cannot confirm, a live claim) comes back as its error,
// and the run keeps waiting. Errors wrap the update's failure or the
// client's error.
func SendDecision(ctx context.Context, c client.Client, id, runID string, d Decision) (*DecisionResult, error) {
	if c == nil {
		return nil, errors.New("send decision: client is nil")
	}
	h, err := c.UpdateWorkflow(ctx, client.UpdateWorkflowOptions{
		WorkflowID: id, RunID: runID, UpdateName: UpdateDecide, Args: []any{d},
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
