package pipeline

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	workflowpb "go.temporal.io/api/workflow/v1"
	"go.temporal.io/sdk/client"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/step"
)

// ByKeyed is the By of the decisions the Settler makes; a person's
// decisions carry their own name.
const ByKeyed = "keyed"

// MetricDecisions counts applied decisions, tagged by="keyed" (the
// Settler) or by="person"; Prometheus shows keyed_decisions_total.
const MetricDecisions = "keyed_decisions"

// DefaultSettleRetries is how many "retry" decisions the Settler makes on
// one step of one run unless SettlerOpts.MaxRetries says otherwise.
const DefaultSettleRetries = 2

// gatherTimeout bounds one provider look-up of a Settler.
const gatherTimeout = 30 * time.Second

// SettlerOpts configures a Settler. A nil *SettlerOpts means all defaults.
type SettlerOpts struct {
	// MaxRetries bounds the "retry" decisions on one step of one run; later
	// waits of that step are left for a person. Zero means
	// DefaultSettleRetries.
	MaxRetries int
	// Logger receives one record per decision. Nil means slog.Default().
	Logger *slog.Logger
	// Query selects the runs Pass settles, AND-ed with AttentionQuery, such
	// as "TaskQueue = 'orders'" (the worker's). Empty means every waiting
	// run of the namespace.
	Query string
}

// Settler settles waits for a decision from provider evidence: for a run
// waiting on a step whose Definition has a Gather, it asks the provider
// and, when the evidence is definitive, sends the decide update as
// ByKeyed, "done" with the outcome found or "retry" for a proven absence.
// The run's ApplyDecision checks a "done" with the step's Verify, as it
// does a person's. What stays unknown is left for a person, saying why.
type Settler struct {
	client     client.Client
	steps      map[string]step.Definition
	maxRetries int
	logger     *slog.Logger
	query      string
}

// NewSettler returns a Settler over c for the steps of defs. It returns an
// error for a nil client.
func NewSettler(c client.Client, defs []step.Definition, opts *SettlerOpts) (*Settler, error) {
	if c == nil {
		return nil, errors.New("pipeline: NewSettler: client is nil")
	}
	if opts == nil {
		opts = &SettlerOpts{}
	}
	s := &Settler{client: c, steps: map[string]step.Definition{}, maxRetries: opts.MaxRetries, logger: opts.Logger, query: opts.Query}
	if s.maxRetries <= 0 {
		s.maxRetries = DefaultSettleRetries
	}
	if s.logger == nil {
		s.logger = slog.Default()
	}
	for _, d := range defs {
		s.steps[d.Step] = d
	}
	return s, nil
}

// Verdict is what the Settler made of one wait.
type Verdict struct {
	Wait
	// Resolution is the decision the evidence supports, "done" or "retry";
	// empty when the wait is left for a person.
	Resolution effects.Resolution `json:"resolution,omitempty"`
	// Result is the outcome found, with "done".
	Result json.RawMessage `json:"result,omitempty"`
	// Evidence is what the provider showed, or why nothing definitive.
	Evidence string `json:"evidence"`
	// Applied: Settle sent the decision and the run applied it.
	Applied bool `json:"applied,omitempty"`
	// Error says why a decision Settle sent was not applied.
	Error string `json:"error,omitempty"`
}

// Examine gathers the evidence for w without deciding anything.
func (s *Settler) Examine(ctx context.Context, w *Wait) Verdict {
	v := Verdict{Wait: *w}
	def, ok := s.steps[w.Step]
	switch {
	case !ok || def.Gather == nil:
		v.Evidence = "no provider look-up is declared for step " + w.Step
		return v
	case waitNumber(w.Wait) > s.maxRetries+1:
		v.Evidence = fmt.Sprintf("keyed retried this step %d times in this run; a person decides", s.maxRetries)
		return v
	}
	key, err := effects.ParseKey(w.EffectKey)
	if err != nil {
		v.Evidence = err.Error()
		return v
	}
	gctx, cancel := context.WithTimeout(ctx, gatherTimeout)
	defer cancel()
	ev, err := def.Gather(gctx, key)
	switch {
	case err != nil:
		v.Evidence = "not definitive: " + err.Error()
	case ev.Outcome != nil:
		if v.Result, err = json.Marshal(ev.Outcome); err != nil {
			v.Evidence = "encode the outcome found: " + err.Error()
			return v
		}
		v.Resolution, v.Evidence = effects.ResolveDone, ev.Detail
	case ev.Absent:
		v.Resolution, v.Evidence = effects.ResolveRetry, ev.Detail
	default:
		v.Evidence = "the look-up found nothing definitive"
	}
	return v
}

// Settle examines w and, when the evidence is definitive, sends the
// decision and waits until the run applied or refused it.
func (s *Settler) Settle(ctx context.Context, w *Wait) Verdict {
	v := s.Examine(ctx, w)
	if v.Resolution == "" {
		return v
	}
	d := Decision{Step: w.Step, Wait: w.Wait, Resolution: v.Resolution, Result: v.Result, By: ByKeyed,
		Reason: firstLine("settled from provider evidence: "+v.Evidence, MaxDecisionReason)}
	if _, err := SendDecision(ctx, s.client, w.WorkflowID, w.RunID, d); err != nil {
		v.Error = err.Error()
		s.logger.WarnContext(ctx, "settler's decision not applied", "workflow_id", w.WorkflowID, "wait", w.Wait, "error", err)
		return v
	}
	v.Applied = true
	s.logger.InfoContext(ctx, "settled a wait from provider evidence", "workflow_id", w.WorkflowID, "wait", w.Wait,
		"resolution", string(v.Resolution), "evidence", v.Evidence)
	return v
}

// Pass settles every run waiting for a decision that the Settler's query
// selects and returns a verdict per wait. It returns an error only when
// the waits cannot be listed.
func (s *Settler) Pass(ctx context.Context) ([]Verdict, error) {
	waits, err := ListWaits(ctx, s.client, s.query)
	if err != nil {
		return nil, err
	}
	out := make([]Verdict, 0, len(waits))
	for _, w := range waits {
		out = append(out, s.Settle(ctx, w))
	}
	return out, nil
}

// ListWaits returns the wait of every run that query (empty:
// AttentionQuery) lists and that waits for a decision; a run that stopped
// waiting meanwhile is left out. It returns the client's error when the
// list fails, and a query's when one cannot be asked.
func ListWaits(ctx context.Context, c client.Client, query string) ([]*Wait, error) {
	if query == "" {
		query = AttentionQuery
	} else if !strings.Contains(query, SearchAttrAttentionName) {
		query = "(" + query + ") AND " + AttentionQuery
	}
	var ids []string
	err := eachRun(ctx, c, query, func(e *workflowpb.WorkflowExecutionInfo) { ids = append(ids, e.GetExecution().GetWorkflowId()) })
	if err != nil {
		return nil, fmt.Errorf("list waiting runs (%s): %w", query, err)
	}
	var out []*Wait
	for _, id := range ids {
		w, err := WaitOf(ctx, c, id)
		switch {
		case errors.Is(err, ErrNotWaiting):
			continue
		case err != nil:
			return nil, err
		}
		out = append(out, w)
	}
	return out, nil
}

// waitNumber returns n of a wait ID "<effect key>#<n>", or 0.
func waitNumber(id string) int {
	i := strings.LastIndexByte(id, '#')
	if i < 0 {
		return 0
	}
	n, err := strconv.Atoi(id[i+1:])
	if err != nil {
		return 0 // Not a wait ID: nothing to cap.
	}
	return n
}
