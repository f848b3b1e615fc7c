package pipeline

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"

	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"
	"golang.org/x/sync/singleflight"

	"github.com/keyedhq/keyed/outbox"
	"github.com/keyedhq/keyed/outbox/temporalstart"
)

// Start starts a run of workflow with input in under o and says whether this
// call created it. A run of o.ID already going, or one the reuse policy keeps,
// is not started again: Start returns its IDs with Created=false. Concurrent
// calls for one workflow ID, client and task queue in this process share one
// request. The run gets MemoLocalSteps and MemoLocalFirst. It returns in's
// validation error (when in has a Validate method) before calling Temporal,
// and the client's error otherwise.
func Start(ctx context.Context, c client.Client, o client.StartWorkflowOptions, workflow string, in any) (*outbox.Started, error) {
	if v, ok := in.(interface{ Validate() error }); ok {
		if err := v.Validate(); err != nil {
			return nil, fmt.Errorf("start %s: %w", workflow, err)
		}
	}
	if c == nil {
		return nil, errors.New("start " + workflow + ": client is nil")
	}
	o.Memo = withLocalSteps(o.Memo)
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

// withLocalSteps returns memo with MemoLocalSteps and MemoLocalFirst set,
// leaving memo as it was.
func withLocalSteps(memo map[string]any) map[string]any {
	out := make(map[string]any, len(memo)+2)
	maps.Copy(out, memo)
	out[MemoLocalSteps] = true
	out[MemoLocalFirst] = true
	return out
}

// starts collapses concurrent starts of one workflow ID into one request:
// a storm of duplicate starts in one process costs one round trip.
var starts singleflight.Group

// MaxFairnessKey is the longest fairness key Temporal accepts, in bytes.
const MaxFairnessKey = 64

// TenantPriority returns the Temporal priority of a tenant's runs: its
// fairness key is the tenant (a longer tenant ID, its SHA-256 in hex), so
// that a server with fairness on (1.29: matching.enableFairness) hands out
// each task queue's tasks round robin across tenants, and one tenant's
// burst does not delay another's. The run's activities inherit it.
func TenantPriority(tenant string) temporal.Priority {
	key := tenant
	if len(key) > MaxFairnessKey {
		sum := sha256.Sum256([]byte(tenant))
		key = hex.EncodeToString(sum[:])
	}
	return temporal.Priority{FairnessKey: key}
}
