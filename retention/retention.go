// Package retention prunes keyed's tables on a schedule keyed by interval:
// every replica ticks, and each tick claims the effect key of the window it
// covers through effects.Do, so each window's prune runs once however many
// replicas there are (docs/design.md, "Notes moved from the code").
package retention

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/keyedhq/keyed/effects"
)

// SystemTenant is the tenant of keyed's own effect keys.
const SystemTenant = "keyed"

// DefaultEvery is the default interval between prunes.
const DefaultEvery = time.Hour

// Job is one table's prune. Run returns how many rows it deleted.
type Job struct {
	Name string
	Run  func(ctx context.Context) (int64, error)
}

// Opts configures a Pruner. A nil *Opts means all defaults.
type Opts struct {
	// Every is the interval; each window of this length is pruned once.
	// Zero means DefaultEvery. Under one second is refused.
	Every time.Duration
	// Schedule names the schedule in its window keys, such as "settle".
	// Empty means "prune".
	Schedule string
	// Owner names this replica in the claim. Empty means host name and PID.
	Owner string
	// Logger receives one record per window. Nil means slog.Default().
	Logger *slog.Logger
	// Now is the clock. Nil means time.Now.
	Now func() time.Time
}

// Pruner runs its jobs once per window across all replicas.
type Pruner struct {
	claims   *effects.Client
	jobs     []Job
	every    time.Duration
	schedule string
	owner    string
	logger   *slog.Logger
	now      func() time.Time

	stop chan struct{}
	done sync.WaitGroup
}

// New returns a Pruner running jobs through claims. It returns an error for a
// nil client, no jobs, a job without a name or function, or an interval
// under one minute.
func New(claims *effects.Client, jobs []Job, opts *Opts) (*Pruner, error) {
	if claims == nil {
		return nil, errors.New("retention: New: effects client is nil")
	}
	if len(jobs) == 0 {
		return nil, errors.New("retention: New: no jobs")
	}
	for i, j := range jobs {
		if j.Name == "" || j.Run == nil {
			return nil, fmt.Errorf("retention: New: job %d has no name or no Run", i)
		}
	}
	if opts == nil {
		opts = &Opts{}
	}
	p := &Pruner{claims: claims, jobs: jobs, every: opts.Every, schedule: opts.Schedule, owner: opts.Owner, logger: opts.Logger, now: opts.Now}
	if p.every == 0 {
		p.every = DefaultEvery
	}
	if p.every < time.Second {
		return nil, fmt.Errorf("retention: New: interval %s is under one second", p.every)
	}
	if p.schedule == "" {
		p.schedule = "prune"
	}
	if _, err := ScheduleKey(p.schedule, time.Unix(0, 0)); err != nil {
		return nil, fmt.Errorf("retention: New: schedule %q: %w", p.schedule, err)
	}
	if p.owner == "" {
		host, err := os.Hostname()
		if err != nil {
			host = "worker" // the owner only tells replicas apart in records
		}
		p.owner = host + "/" + strconv.Itoa(os.Getpid())
	}
	if p.logger == nil {
		p.logger = slog.Default()
	}
	if p.now == nil {
		p.now = time.Now
	}
	return p, nil
}

// Result is what one window's prune stored: rows deleted per job.
type Result struct {
	Window  time.Time        `json:"window"`
	Deleted map[string]int64 `json:"deleted"`
}

// WindowKey returns the effect key of the prune window starting at start.
func WindowKey(start time.Time) (effects.Key, error) { return ScheduleKey("prune", start) }

// ScheduleKey returns the effect key of the window of schedule starting at
// start, such as "keyed:schedule:prune:20261129T2000Z"; a window that
// starts off the minute has its seconds too.
func ScheduleKey(schedule string, start time.Time) (effects.Key, error) {
	layout := "20060102T1504Z"
	if start.Second() != 0 {
		layout = "20060102T150405Z"
	}
	return effects.NewKey(SystemTenant, "schedule", schedule, start.UTC().Format(layout))
}

type windowStartKey struct{}

// WindowStart returns the start of the window a Job's Run runs for, from
// its ctx, or the zero time outside a Run.
func WindowStart(ctx context.Context) time.Time {
	t, _ := ctx.Value(windowStartKey{}).(time.Time)
	return t
}

// RunWindow prunes the window that contains at, unless another replica has
// or is doing it. ran is false when this call did no work. A job's failure
// is recorded as transient, so the window is retried on the next tick, and
// returned.
func (p *Pruner) RunWindow(ctx context.Context, at time.Time) (res Result, ran bool, err error) {
	start := at.UTC().Truncate(p.every)
	key, err := ScheduleKey(p.schedule, start)
	if err != nil {
		return Result{}, false, err
	}
	res, err = effects.Do(ctx, p.claims, effects.ClaimParams{Key: key, Kind: p.schedule, Owner: p.owner},
		func(ctx context.Context, _ *effects.Claim) (Result, error) {
			ran = true
			ctx = context.WithValue(ctx, windowStartKey{}, start)
			out := Result{Window: start, Deleted: map[string]int64{}}
			for _, j := range p.jobs {
				n, err := j.Run(ctx)
				if err != nil {
					return Result{}, effects.Transient(fmt.Errorf("prune %s: %w", j.Name, err))
				}
				out.Deleted[j.Name] = n
			}
			return out, nil
		}, nil)
	if errors.Is(err, effects.ErrInProgress) {
		return Result{}, false, nil
	}
	return res, ran, err
}

// Start runs a window now and then on every interval tick, in the
// background, until Stop. It never blocks.
func (p *Pruner) Start(context.Context) error {
	p.stop = make(chan struct{})
	p.done.Add(1)
	go func() {
		defer p.done.Done()
		t := time.NewTicker(p.every / 4)
		defer t.Stop()
		for {
			ctx, cancel := context.WithTimeout(context.Background(), p.every/2)
			res, ran, err := p.RunWindow(ctx, p.now())
			cancel()
			switch {
			case err != nil:
				p.logger.Warn("prune window failed", "error", err)
			case ran:
				p.logger.Info(p.schedule+" window done", "window", res.Window, "rows", res.Deleted)
			}
			select {
			case <-p.stop:
				return
			case <-t.C:
			}
		}
	}()
	return nil
}

// Stop ends the background loop, waiting for a running window to finish
// or ctx to end.
func (p *Pruner) Stop(ctx context.Context) error {
	if p.stop == nil {
		return nil
	}
	close(p.stop)
	waited := make(chan struct{})
	go func() { p.done.Wait(); close(waited) }()
	select {
	case <-waited:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
