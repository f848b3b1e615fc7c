package workflows

import (
	"strings"

	"go.temporal.io/sdk/workflow"
)

// showDetails sets the run's current details (workflow.SetCurrentDetails),
// shown by the Web UI and `temporal workflow describe`: one markdown line
// per step with its state, effect key and outcome ID (the payment intent,
// the message ID), and, while a step waits, what the operator is to do.
func (o *orderRun) showDetails(ctx workflow.Context) {
	workflow.SetCurrentDetails(ctx, o.details())
}

func (o *orderRun) details() string {
	var b strings.Builder
	for i, s := range o.status {
		b.WriteString("- **" + s.Step + "** " + s.State + " · `" + s.EffectKey + "`")
		if i < len(o.outcome) && o.outcome[i] != "" {
			b.WriteString(" · `" + o.outcome[i] + "`")
		}
		if s.Error != "" && s.State != StateDone {
			b.WriteString("\n  - " + firstLine(s.Error, 300))
		}
		b.WriteString("\n")
	}
	if w := o.wait; w != nil {
		s := o.status[w.step]
		b.WriteString("\n**Needs a decision** (" + SearchAttrAttentionName + " = `" + s.Step + ":" + w.reason + "`): " +
			"check the provider for `" + s.EffectKey + "`, then send the `" + UpdateDecide + "` update with " +
			"`{\"step\":\"" + s.Step + "\",\"resolution\":\"done\"|\"retry\",\"by\":\"…\",\"reason\":\"…\"}` " +
			"(and `\"result\"` with done).\n")
	}
	return b.String()
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
