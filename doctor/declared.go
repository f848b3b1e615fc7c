package doctor

import (
	"go.temporal.io/sdk/workflow"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/pipeline"
)

// Activity is a declared activity as the checks see it: name, effect class,
// key step, workflow ("" for ApplyDecision, which every workflow runs),
// options, effect key shape, such as "{tenant}:order:{order}:charge", and
// whether it is self-guarded (claims no effect record).
type Activity struct {
	Name        string
	Class       effects.Class
	Step        string
	Workflow    string
	Options     workflow.ActivityOptions
	KeyShape    string
	SelfGuarded bool
}

// Declared returns every activity a worker of specs registers: each
// spec's steps, with key shapes from its Placeholder, then ApplyDecision.
func Declared(specs []pipeline.Spec) []Activity {
	var out []Activity
	for _, s := range specs {
		for _, d := range s.Steps {
			out = append(out, Activity{Name: d.Name, Class: d.Class, Step: d.Step, Workflow: s.Workflow,
				Options: d.ActivityOptions(""), KeyShape: keyShape(s.Placeholder, d.Step), SelfGuarded: d.SelfGuarded})
		}
	}
	d := pipeline.DeclDecision
	return append(out, Activity{Name: d.Name, Class: d.Class, Step: d.Step, Options: d.ActivityOptions("")})
}

// keyShape returns the shape of a step's effect keys, with placeholder's
// IDs for the parts that vary; for a step that cannot end a key (which
// Register refuses), a shape no key matches.
func keyShape(placeholder pipeline.Keyer, step string) string {
	k, err := placeholder.EffectKey(step)
	if err != nil {
		return "{tenant}:…:" + step
	}
	return k.String()
}
