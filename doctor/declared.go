package doctor

import (
	"go.temporal.io/sdk/workflow"

	refundsteps "github.com/keyedhq/keyed/activities/refund"
	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/pipeline"
	"github.com/keyedhq/keyed/refunds"
	"github.com/keyedhq/keyed/step"
	orderflow "github.com/keyedhq/keyed/workflows/order"
)

// Activity is a declared activity as the checks see it: its name, effect
// class and key step, the workflow that runs it, the options the workflow
// runs it with, and the shape of its effect keys.
type Activity struct {
	Name  string
	Class effects.Class
	Step  string
	// Workflow is the registered name of the workflow that runs it, such as
	// orders.WorkflowName: the suppression check reads the histories of its
	// recent runs. Empty means the order workflow.
	Workflow string
	Options  workflow.ActivityOptions
	// KeyShape is the shape of its effect keys, with {tenant}, {order} and
	// {refund_id} standing for any part, such as
	// "{tenant}:order:{order}:charge"; empty for an activity that claims no
	// key of its own (ApplyDecision).
	KeyShape string
}

// keyer derives a pipeline's effect keys: its workflow input.
type keyer interface {
	EffectKey(step string) (effects.Key, error)
}

// Declared returns every activity a worker registers, with its resolved
// options: the order pipeline's (orderflow.Declarations), whose keys are
// "{tenant}:order:{order}:<step>", then the refund pipeline's
// (refundsteps.Declarations), whose keys are
// "{tenant}:order:{order}:refund:{refund_id}:<step>". It is the one adapter
// between doctor and the declarations in packages activities, workflows and
// refunds.
func Declared() []Activity {
	order := orders.NewOrderInput("{tenant}", "{order}")
	refund := refunds.NewInput("{tenant}", "{order}", "{refund_id}", 0, "")
	out := declared(orderflow.Declarations(), orders.WorkflowName, order)
	return append(out, declared(refundsteps.Declarations(), refunds.WorkflowName, refund)...)
}

// declared returns the Activities of one pipeline's declarations, run by
// the workflow named wf, whose key shapes placeholder derives.
func declared(decls []step.Declaration, wf string, placeholder keyer) []Activity {
	out := make([]Activity, 0, len(decls))
	for _, d := range decls {
		act := Activity{Name: d.Name, Class: d.Class, Step: d.Step, Workflow: wf, Options: d.ActivityOptions("")}
		if d.Step != pipeline.StepDecision {
			act.KeyShape = keyShape(placeholder, d.Step)
		}
		out = append(out, act)
	}
	return out
}

// keyShape returns the shape of a step's effect keys, with placeholder's
// IDs for the parts that vary; for a step that cannot end a key (which
// Register refuses), a shape no key matches.
func keyShape(placeholder keyer, step string) string {
	k, err := placeholder.EffectKey(step)
	if err != nil {
		return "{tenant}:…:" + step
	}
	return k.String()
}
