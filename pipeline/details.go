package pipeline

import (
	"github.com/keyedhq/keyed/step"

	"strings"

	"go.temporal.io/sdk/workflow"
)

// ShowDetails sets the run's current details, shown by the Web UI: one
// markdown line per step (state, effect key, outcome ID, error) and, while
// a step waits, what the operator is to do. Call it before returning.
func (r *Run) ShowDetails(ctx workflow.Context) {
	workflow.SetCurrentDetails(ctx, r.details())
}

func (r *Run) details() string {
	var b strings.Builder
	for i, s := range r.status {
		b.WriteString("- **" + s.Step + "** " + s.State + " · `" + s.EffectKey + "`")
		if i < len(r.outcome) && r.outcome[i] != "" {
			b.WriteString(" · `" + r.outcome[i] + "`")
		}
		if s.Error != "" && s.State != StateDone {
			b.WriteString("\n  - " + firstLine(s.Error, 300))
		}
		b.WriteString("\n")
	}
	if w := r.wait; w != nil {
		s := r.status[w.step]
		b.WriteString("\n**Needs a decision** (" + SearchAttrAttentionName + " = `" + s.Step + ":" + w.reason + "`): " +
			"check the provider for `" + s.EffectKey + "`, then send the `" + UpdateDecide + "` update with " +
			"`{\"step\":\"" + s.Step + "\",\"resolution\":\"done\"|\"retry\",\"by\":\"…\",\"reason\":\"…\"}` " +
			"and with done its outcome, `\"result\":" + outcomeShape(r.decls[w.step].Outcome) + "`, which is checked at the provider.\n")
	}
	return b.String()
}

// outcomeShape is the JSON shape of a step's outcome for the details, or
// a placeholder when its declaration has no Outcome.
func outcomeShape(o step.Outcome) string {
	if o == nil {
		return "{…}"
	}
	return o.Shape()
}

// firstLine returns s up to its first newline, cut to at most n bytes.
func firstLine(s string, n int) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	if len(s) > n {
		s = s[:n] + "…"
	}
	return s
}
