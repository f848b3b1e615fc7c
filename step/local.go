package step

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/keyedhq/keyed/slotshare"
)

// FirstAttemptTimeout bounds a step's first attempt in the workflow task
// (Declaration.FirstAttemptOptions): a provider that has not answered by
// then is asked again from the task queue, under the step's retry policy.
// Stripe and SendGrid answer well inside it; the workflow task stays open
// without a heartbeat for less than Temporal's 10 seconds.
const FirstAttemptTimeout = 5 * time.Second

// ErrTypeNotLocal is the Temporal error type of a first attempt the worker
// did not run in the workflow task (LocalGate): the run schedules the step
// as an activity at once. It is retryable and never reaches an effect
// record.
const ErrTypeNotLocal = "KeyedNotLocal"

// FirstAttemptOptions returns the local activity options of the first
// attempt of d, a step that is not Local, for the effect key key: one
// attempt, at most FirstAttemptTimeout or d's own StartToClose if shorter,
// counted from when the workflow asks for it, and the step's summary.
func (d Declaration) FirstAttemptOptions(key string) workflow.LocalActivityOptions {
	o := d.ActivityOptions(key)
	limit := min(FirstAttemptTimeout, o.StartToCloseTimeout)
	return workflow.LocalActivityOptions{
		ScheduleToCloseTimeout: limit,
		StartToCloseTimeout:    limit,
		RetryPolicy:            &temporal.RetryPolicy{MaximumAttempts: 1},
		Summary:                o.Summary,
	}
}

// LocalGate decides, in the worker, which first attempts run in the
// workflow task: none of a provider whose calls are bounded through its own
// task queue (so that the bound holds), at most Slots at once, and at most
// a tenant's share of them (so that one tenant's slow provider cannot hold
// the workflow tasks of the others). A refused attempt returns at once with
// ErrTypeNotLocal, before any claim, and the run schedules the step as an
// activity. A nil *LocalGate admits every first attempt.
type LocalGate struct {
	queued map[string]bool
	slots  int
	share  *slotshare.Limiter

	mu      sync.Mutex
	running int
	refused atomic.Int64
}

// Refused returns how many first attempts g has refused.
func (g *LocalGate) Refused() int64 { return g.refused.Load() }

// NewLocalGate returns a LocalGate for a worker with slots activity slots,
// share of which one tenant may hold (0: slotshare.DefaultShare), whose
// calls to the providers in queued go through their own task queues. It
// returns an error wrapping slotshare.ErrInvalidOpts for slots or share
// that slotshare.New refuses.
func NewLocalGate(slots, share int, queued []string) (*LocalGate, error) {
	l, err := slotshare.New(&slotshare.Opts{Slots: slots, Share: share})
	if err != nil {
		return nil, fmt.Errorf("local first attempts: %w", err)
	}
	g := &LocalGate{queued: map[string]bool{}, slots: slots, share: l}
	for _, p := range queued {
		g.queued[p] = true
	}
	return g, nil
}

// admit takes a place for a first attempt of provider's step for tenant, or
// returns the refusal.
func (g *LocalGate) admit(provider, tenant string) (release func(), err error) {
	if g == nil {
		return func() {}, nil
	}
	refuse := func(why string) error {
		g.refused.Add(1)
		return temporal.NewApplicationErrorWithOptions("first attempt not run in the workflow task: "+why, ErrTypeNotLocal,
			temporal.ApplicationErrorOptions{Category: temporal.ApplicationErrorCategoryBenign})
	}
	if g.queued[provider] {
		return nil, refuse(provider + "'s calls are bounded through its own task queue")
	}
	g.mu.Lock()
	full := g.running >= g.slots
	if !full {
		g.running++
	}
	g.mu.Unlock()
	if full {
		return nil, refuse("the worker runs as many as it has activity slots")
	}
	leave, ok := g.share.Admit(tenant)
	if !ok {
		g.done()
		return nil, refuse("the tenant holds its share of them")
	}
	return func() { leave(); g.done() }, nil
}

func (g *LocalGate) done() {
	g.mu.Lock()
	g.running--
	g.mu.Unlock()
}
