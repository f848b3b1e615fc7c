package doctor

import (
	"go.temporal.io/sdk/workflow"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/workflows"
)

// Activity is a declared activity as the checks see it: its name, effect
// class and key step, the options the workflow runs it with, and the shape
// of its effect keys.
type Activity struct {
	Name    string
	Class   effects.Class
	Step    string
	Options workflow.ActivityOptions
	// KeyShape is the shape of its effect keys, with {tenant} and {order}
	// standing for any part, such as "{tenant}:order:{order}:charge"; empty
	// for an activity that claims no key of its own (ApplyDecision).
	KeyShape string
}

// Declared returns every activity a worker registers, with its resolved
// options (workflows.Declarations). It is the one adapter between doctor
// and the declarations in packages activities and workflows.
func Declared() []Activity {
	decls := workflows.Declarations()
	out := make([]Activity, 0, len(decls))
	for _, d := range decls {
		act := Activity{Name: d.Name, Class: d.Class, Step: d.Step, Options: d.ActivityOptions("")}
		if d.Step != workflows.StepDecision {
			act.KeyShape = keyShape(d.Step)
		}
		out = append(out, act)
	}
	return out
}

// keyShape returns the shape of an order step's effect keys.
func keyShape(step string) string {
	k, err := orders.CheckoutInput{V: 1, TenantID: "{tenant}", OrderID: "{order}"}.EffectKey(step)
	if err != nil {
		return "{tenant}:order:{order}:" + step
	}
	return k.String()
}
