// Package slotshare keeps one tenant from holding every activity slot of a
// worker. Temporal's fairness orders a task queue's backlog across fairness
// keys, but it cannot free a slot: when one key's activities are slow (its
// provider answers in seconds) they can fill all of a worker's slots, and
// another key's task then waits for one of them to finish. A Limiter is a
// worker interceptor that lets each fairness key (keyed's runs carry their
// tenant) hold at most Share of the worker's Slots; an attempt over its
// key's share returns at once with a retryable error and a retry delay of
// about as long as that key's activities take, so its slot goes back to the
// queue and the slots kept back stay free for the other keys.
//
// A refused attempt never reaches the activity: no claim, no effect. It
// counts as an attempt in Temporal (the Web UI shows its error type,
// ErrorType) and is benign: the SDK neither logs it as a failure nor counts
// it in its failure metrics. Local activities and activities without a
// fairness key are never refused.
package slotshare

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/interceptor"
	"go.temporal.io/sdk/temporal"
)

// ErrorType is the Temporal error type of a refused attempt. It is
// retryable: keep it out of a retry policy's NonRetryableErrorTypes.
const ErrorType = "KeyedOverShare"

// Retry delays of a refused attempt: about as long as its key's activities
// take, within these bounds.
const (
	DefaultMinDelay = time.Second
	DefaultMaxDelay = 30 * time.Second
)

// ErrInvalidOpts is returned by New for options it cannot work with.
var ErrInvalidOpts = errors.New("invalid slot share options")

// Opts configures a Limiter.
type Opts struct {
	// Slots is the worker's activity slots
	// (worker.Options.MaxConcurrentActivityExecutionSize). Required.
	Slots int
	// Share is how many of them one fairness key may hold at once, 1 to
	// Slots; Slots turns the limit off. Zero means DefaultShare(Slots).
	Share int
	// MinDelay and MaxDelay bound a refused attempt's retry delay. Zero
	// means DefaultMinDelay and DefaultMaxDelay.
	MinDelay, MaxDelay time.Duration
}

// DefaultShare is the share of a worker with slots activity slots: all but
// an eighth of them, and at least one kept back when there are two or more.
func DefaultShare(slots int) int {
	return max(1, slots-max(1, slots/8))
}

// Limiter is the worker interceptor; give it to one worker only
// (worker.Options.Interceptors), since Slots is that worker's.
type Limiter struct {
	interceptor.WorkerInterceptorBase
	share              int
	minDelay, maxDelay time.Duration

	mu      sync.Mutex
	keys    map[string]*keyState
	nextID  uint64
	refused atomic.Int64
}

// keyState is what a Limiter knows of one fairness key: its attempts
// running now, by start time, and how long its recent attempts took.
type keyState struct {
	running map[uint64]time.Time
	took    time.Duration // moving average; zero until one has finished
}

// New returns a Limiter. It returns an error wrapping ErrInvalidOpts when
// Slots is not positive, Share is outside 0..Slots, or a delay is negative
// or MinDelay exceeds MaxDelay.
func New(opts *Opts) (*Limiter, error) {
	if opts == nil || opts.Slots <= 0 {
		return nil, fmt.Errorf("%w: Slots must be positive", ErrInvalidOpts)
	}
	share, lo, hi := opts.Share, opts.MinDelay, opts.MaxDelay
	if share == 0 {
		share = DefaultShare(opts.Slots)
	}
	if lo == 0 {
		lo = DefaultMinDelay
	}
	if hi == 0 {
		hi = DefaultMaxDelay
	}
	switch {
	case share < 1 || share > opts.Slots:
		return nil, fmt.Errorf("%w: Share %d is outside 1..%d (the worker's slots)", ErrInvalidOpts, opts.Share, opts.Slots)
	case lo < 0 || hi < lo:
		return nil, fmt.Errorf("%w: delays %s..%s", ErrInvalidOpts, lo, hi)
	}
	return &Limiter{share: share, minDelay: lo, maxDelay: hi, keys: map[string]*keyState{}}, nil
}

// Share returns how many slots one fairness key may hold.
func (l *Limiter) Share() int { return l.share }

// Refused returns how many attempts the Limiter has refused.
func (l *Limiter) Refused() int64 { return l.refused.Load() }

// InterceptActivity implements interceptor.WorkerInterceptor.
func (l *Limiter) InterceptActivity(_ context.Context, next interceptor.ActivityInboundInterceptor) interceptor.ActivityInboundInterceptor {
	return &inbound{ActivityInboundInterceptorBase: interceptor.ActivityInboundInterceptorBase{Next: next}, l: l}
}

type inbound struct {
	interceptor.ActivityInboundInterceptorBase
	l *Limiter
}

func (i *inbound) ExecuteActivity(ctx context.Context, in *interceptor.ExecuteActivityInput) (any, error) {
	info := activity.GetInfo(ctx)
	key := info.Priority.FairnessKey
	if info.IsLocalActivity || key == "" {
		return i.Next.ExecuteActivity(ctx, in)
	}
	id, wait, ok := i.l.enter(key, time.Now())
	if !ok {
		return nil, temporal.NewApplicationErrorWithOptions(
			fmt.Sprintf("this run's tenant holds its share of the worker's activity slots (%d); retrying in %s",
				i.l.share, wait.Round(time.Millisecond)),
			ErrorType, temporal.ApplicationErrorOptions{NextRetryDelay: wait, Category: temporal.ApplicationErrorCategoryBenign})
	}
	defer func() { i.l.leave(key, id, time.Now()) }()
	return i.Next.ExecuteActivity(ctx, in)
}

// Admit takes a slot of key's share for work other than an activity
// attempt (such as a step's first attempt in a workflow task) and returns
// the function that gives it back, or false when key holds its share.
func (l *Limiter) Admit(key string) (release func(), ok bool) {
	id, _, ok := l.enter(key, time.Now())
	if !ok {
		return nil, false
	}
	return func() { l.leave(key, id, time.Now()) }, true
}

// enter takes a slot of key's share at now, or returns the retry delay and
// false when key holds its whole share.
func (l *Limiter) enter(key string, now time.Time) (uint64, time.Duration, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.keys[key]
	if s == nil {
		s = &keyState{running: map[uint64]time.Time{}}
		l.keys[key] = s
	}
	if len(s.running) >= l.share {
		l.refused.Add(1)
		return 0, l.delay(s, now), false
	}
	l.nextID++
	s.running[l.nextID] = now
	return l.nextID, 0, true
}

// leave gives back the slot id of key took, at now.
func (l *Limiter) leave(key string, id uint64, now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.keys[key]
	if s == nil {
		return
	}
	took := now.Sub(s.running[id])
	delete(s.running, id)
	if s.took == 0 {
		s.took = took
	} else {
		s.took += (took - s.took) / 4
	}
	if len(s.running) == 0 {
		delete(l.keys, key)
	}
}

// delay is a refused attempt's retry delay: about as long as the key's
// attempts take (until one has finished, as long as its oldest has run),
// times a jitter of 0.75 to 1.25 so that refused attempts do not come back
// together, within the bounds.
func (l *Limiter) delay(s *keyState, now time.Time) time.Duration {
	d := s.took
	if d == 0 {
		for _, at := range s.running {
			d = max(d, now.Sub(at))
		}
	}
	d = time.Duration(float64(d) * (0.75 + rand.Float64()/2))
	return min(max(d, l.minDelay), l.maxDelay)
}
