package order

import (
	steps "github.com/keyedhq/keyed/activities/order"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/pipeline"
	"github.com/keyedhq/keyed/step"
)

// Pipeline returns the order pipeline's registration.
func Pipeline() pipeline.Spec {
	return pipeline.Spec{
		Name:     "order",
		Workflow: orders.WorkflowName,
		Register: Register,
		Steps:    steps.Declarations(),
		Activities: func(d pipeline.Deps) ([]step.Definition, error) {
			a, err := steps.New(d)
			if err != nil {
				return nil, err
			}
			return a.Definitions(), nil
		},
		Placeholder:      orders.NewOrderInput("{tenant}", "{order}"),
		RunOfKey:         orders.WorkflowIDOfKey,
		Configure:        configure,
		SearchAttributes: []pipeline.SearchAttribute{{Name: orders.SearchAttrOrderID, Type: "Keyword"}},
		Final:            final,
	}
}
