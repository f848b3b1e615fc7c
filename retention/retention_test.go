package retention_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/effects/effectstest"
	"github.com/keyedhq/keyed/internal/dbtest"
	"github.com/keyedhq/keyed/retention"
)

type bundle struct {
	ctx    context.Context
	claims *effects.Client
	runs   atomic.Int64
	fail   atomic.Bool
}

func setup(t *testing.T) *bundle {
	t.Helper()
	pool := dbtest.NewPool(t)
	return &bundle{ctx: context.Background(), claims: effectstest.NewClient(t, pool, &effects.ClientOpts{Logger: quiet()})}
}

func (b *bundle) pruner(t *testing.T, owner string) *retention.Pruner {
	t.Helper()
	p, err := retention.New(b.claims, []retention.Job{{Name: "things", Run: func(context.Context) (int64, error) {
		if b.fail.Load() {
			return 0, errors.New("database went away")
		}
		b.runs.Add(1)
		return 7, nil
	}}}, &retention.Opts{Owner: owner, Logger: quiet()})
	require.NoError(t, err)
	return p
}

// Three replicas ticking in the same hour prune once; the next hour prunes
// again.
func TestReplicasPruneEachWindowOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	at := time.Date(2026, 11, 29, 20, 17, 0, 0, time.UTC)
	var wg sync.WaitGroup
	var ranCount atomic.Int64
	for i := 0; i < 3; i++ {
		p := b.pruner(t, fmt.Sprintf("replica-%d", i))
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Each replica ticks in sequence; the replicas race each other.
			for _, tick := range []time.Duration{0, 10 * time.Minute, 40 * time.Minute} {
				_, ran, err := p.RunWindow(b.ctx, at.Add(tick))
				require.NoError(t, err)
				if ran {
					ranCount.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	require.EqualValues(t, 1, b.runs.Load())
	require.EqualValues(t, 1, ranCount.Load())

	key, err := retention.WindowKey(at.Truncate(time.Hour))
	require.NoError(t, err)
	require.Equal(t, "keyed:schedule:prune:20261129T2000Z", key.String())
	rec, err := b.claims.Get(b.ctx, key)
	require.NoError(t, err)
	require.Equal(t, effects.StateSucceeded, rec.State)
	require.JSONEq(t, `{"window":"2026-11-29T20:00:00Z","deleted":{"things":7}}`, string(rec.Result))

	_, ran, err := b.pruner(t, "replica-0").RunWindow(b.ctx, at.Add(time.Hour))
	require.NoError(t, err)
	require.True(t, ran)
	require.EqualValues(t, 2, b.runs.Load())
}

// A failed prune is retried on the next tick of the same window.
func TestFailedWindowIsRetried(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := b.pruner(t, "r")
	at := time.Date(2026, 11, 29, 9, 5, 0, 0, time.UTC)
	b.fail.Store(true)
	_, _, err := p.RunWindow(b.ctx, at)
	require.ErrorContains(t, err, "database went away")
	b.fail.Store(false)
	res, ran, err := p.RunWindow(b.ctx, at.Add(5*time.Minute))
	require.NoError(t, err)
	require.True(t, ran)
	require.Equal(t, map[string]int64{"things": 7}, res.Deleted)
}

func TestNewRefusesBadConfig(t *testing.T) {
	t.Parallel()
	b := setup(t)
	job := []retention.Job{{Name: "x", Run: func(context.Context) (int64, error) { return 0, nil }}}
	_, err := retention.New(nil, job, nil)
	require.Error(t, err)
	_, err = retention.New(b.claims, nil, nil)
	require.Error(t, err)
	_, err = retention.New(b.claims, []retention.Job{{Name: "x"}}, nil)
	require.Error(t, err)
	_, err = retention.New(b.claims, job, &retention.Opts{Every: time.Millisecond})
	require.ErrorContains(t, err, "under one second")
	_, err = retention.New(b.claims, job, &retention.Opts{Schedule: "a:b"})
	require.ErrorContains(t, err, `schedule "a:b"`)
}

func TestStartStop(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := b.pruner(t, "r")
	require.NoError(t, p.Start(b.ctx))
	require.Eventually(t, func() bool { return b.runs.Load() == 1 }, 10*time.Second, 20*time.Millisecond)
	require.NoError(t, p.Stop(b.ctx))
}

func quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }

// A job reads the start of its window from its context, whenever it runs:
// the window is the interval's, not the clock's.
func TestJobsReadTheirWindowStart(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var got time.Time
	p, err := retention.New(b.claims, []retention.Job{{Name: "w", Run: func(ctx context.Context) (int64, error) {
		got = retention.WindowStart(ctx)
		return 0, nil
	}}}, &retention.Opts{Every: time.Minute, Schedule: "window-test", Logger: quiet()})
	require.NoError(t, err)
	at := time.Date(2026, 12, 2, 10, 7, 42, 0, time.UTC)
	_, ran, err := p.RunWindow(b.ctx, at)
	require.NoError(t, err)
	require.True(t, ran)
	require.Equal(t, at.Truncate(time.Minute), got)
	require.True(t, retention.WindowStart(b.ctx).IsZero())
}
