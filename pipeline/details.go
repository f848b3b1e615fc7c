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
		if i < len(r.verdicts) && r.verdicts[i] != "" && s.State != StateWaiting {
			b.WriteString("\n  - " + r.verdicts[i])
		}
		b.WriteString("\n")
	}
	if w := r.wait; w != nil {
		s := r.status[w.step]
		b.WriteString("\n**Needs a decision** (" + SearchAttrAttentionName + " = `" + s.Step + ":" + w.reason + "`, since " +
			s.WaitingSince.Format("2006-01-02 15:04:05 MST") + "): check the provider for `" + s.EffectKey + "`, then send the `" +
			UpdateDecide + "` update:\n\n`" + decisionTemplate(s, r.decls[w.step].Outcome) + "`\n\n" +
			"or `\"resolution\":\"retry\"` without a result if it did not happen.\n")
	}
	return b.String()
}

// decisionTemplate is the decide update's JSON for a "done" on the waiting
// step s, with placeholders for who, why and the outcome.
func decisionTemplate(s StepStatus, o step.Outcome) string {
	return `{"step":"` + s.Step + `","wait":"` + s.Wait + `","resolution":"done","by":"…","reason":"…","result":` + outcomeShape(o) + `}`
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
