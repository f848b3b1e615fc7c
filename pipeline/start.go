package pipeline

import (
	"context"
	"errors"
	"fmt"

	"go.temporal.io/sdk/client"
	"golang.org/x/sync/singleflight"

	"github.com/keyedhq/keyed/outbox"
	"github.com/keyedhq/keyed/outbox/temporalstart"
)

// Start starts a run of workflow with input in under o, the pipeline's
// start options, and says whether this call created it. Every pipeline's
// starts go through it, and the relay's through the same
// temporalstart.Execute:
//
//   - a run of o.ID already going, or one the reuse policy keeps (by
//     default after a success), is not started again: Start returns its IDs
//     with Created=false instead of an error;
//   - concurrent calls for one workflow ID, client and task queue in this
//     process share one request: one reports Created, the others share its
//     outcome.
//
// It returns an error wrapping in's validation error, when in has a
// Validate method, before calling Temporal, and the client's error
// otherwise.
func Start(ctx context.Context, c client.Client, o client.StartWorkflowOptions, workflow string, in any) (*outbox.Started, error) {
	if v, ok := in.(interface{ Validate() error }); ok {
		if err := v.Validate(); err != nil {
			return nil, fmt.Errorf("start %s: %w", workflow, err)
		}
	}
	if c == nil {
		return nil, errors.New("start " + workflow + ": client is nil")
	}
	leader := false
	v, err, _ := starts.Do(fmt.Sprintf("%p\x00%s\x00%s", c, o.TaskQueue, o.ID), func() (any, error) {
		leader = true
		return temporalstart.Execute(ctx, c, o, workflow, in)
	})
	if err != nil {
		return nil, err
	}
	st := *v.(*outbox.Started)
	st.Created = st.Created && leader
	return &st, nil
}

// starts collapses concurrent starts of one workflow ID into one request:
// a storm of duplicate starts in one process costs one round trip.
var starts singleflight.Group
