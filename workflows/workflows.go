// Package workflows lists keyed's pipelines. Each pipeline's workflow
// lives in a sub-package (workflows/order, workflows/refund) with its
// pipeline.Spec; the worker, the relay, doctor, the retention check, the
// starter and the dev server read them from Pipelines.
package workflows

import (
	"github.com/keyedhq/keyed/pipeline"
	"github.com/keyedhq/keyed/workflows/order"
	"github.com/keyedhq/keyed/workflows/refund"
)

// Pipelines returns every registered pipeline. A new pipeline is one line
// here.
func Pipelines() []pipeline.Spec {
	return []pipeline.Spec{
		order.Pipeline(),
		refund.Pipeline(),
	}
}
