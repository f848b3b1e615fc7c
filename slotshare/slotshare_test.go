package slotshare_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"io"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/interceptor"
	"go.temporal.io/sdk/log"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/keyedhq/keyed/internal/devserver"
	"github.com/keyedhq/keyed/slotshare"
)

// temporalAddr is the dev server the package's tests share; they keep apart
// by task queue.
var temporalAddr string

func TestMain(m *testing.M) {
	os.Exit(devserver.RunTests(m, "slotshare", func(s *devserver.Server) { temporalAddr = s.Address() }))
}

func TestNewValidates(t *testing.T) {
	t.Parallel()
	for _, o := range []*slotshare.Opts{
		nil,
		{},
		{Slots: -1},
		{Slots: 4, Share: 5},
		{Slots: 4, Share: -1},
		{Slots: 4, MinDelay: -time.Second},
		{Slots: 4, MinDelay: time.Minute, MaxDelay: time.Second},
	} {
		_, err := slotshare.New(o)
		require.ErrorIs(t, err, slotshare.ErrInvalidOpts, "%+v", o)
	}
	l, err := slotshare.New(&slotshare.Opts{Slots: 64})
	require.NoError(t, err)
	require.Equal(t, slotshare.DefaultShare(64), l.Share())
}

func TestDefaultShareKeepsSlotsBack(t *testing.T) {
	t.Parallel()
	for slots, share := range map[int]int{1: 1, 2: 1, 4: 3, 8: 7, 16: 14, 64: 56, 100: 88} {
		require.Equal(t, share, slotshare.DefaultShare(slots), "%d slots", slots)
	}
}

// The worker has 4 slots and tenant a may hold 3. Tenant a's run starts
// six activities that do not return until the test lets them; tenant b's
// run, started after them, finishes while all of a's are still held: a's
// attempts over its share are refused and its fourth slot stays free. Once
// let go, each of a's activities runs exactly once: a refused attempt
// never reaches the activity.
func TestOneTenantCannotTakeEverySlot(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	lim, err := slotshare.New(&slotshare.Opts{Slots: 4, Share: 3, MinDelay: 50 * time.Millisecond, MaxDelay: 200 * time.Millisecond})
	require.NoError(t, err)
	c, err := client.Dial(client.Options{HostPort: temporalAddr, Logger: log.NewStructuredLogger(slog.New(slog.NewTextHandler(io.Discard, nil)))})
	require.NoError(t, err)
	defer c.Close()
	queue := "slotshare-" + randomID(t)
	w := worker.New(c, queue, worker.Options{MaxConcurrentActivityExecutionSize: 4, Interceptors: []interceptor.WorkerInterceptor{lim}})
	release := make(chan struct{})
	var mu sync.Mutex
	ran := map[string]int{}
	var holding atomic.Int32
	w.RegisterWorkflowWithOptions(fan, workflow.RegisterOptions{Name: "Fan"})
	w.RegisterActivityWithOptions(func(ctx context.Context, n int) error {
		mu.Lock()
		ran[activity.GetInfo(ctx).ActivityID]++
		mu.Unlock()
		holding.Add(1)
		defer holding.Add(-1)
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}, activity.RegisterOptions{Name: "Hold"})
	w.RegisterActivityWithOptions(func(context.Context, int) error { return nil }, activity.RegisterOptions{Name: "Quick"})
	require.NoError(t, w.Start())
	defer w.Stop()

	start := func(tenant, activity string, n int) client.WorkflowRun {
		run, err := c.ExecuteWorkflow(ctx, client.StartWorkflowOptions{TaskQueue: queue, ID: queue + "-" + tenant,
			Priority: temporal.Priority{FairnessKey: tenant}}, "Fan", activity, n)
		require.NoError(t, err)
		return run
	}
	a := start("a", "Hold", 6)
	require.Eventually(t, func() bool { return holding.Load() == 3 && lim.Refused() > 0 }, time.Minute, 10*time.Millisecond,
		"tenant a holds its share, 3 slots, and its other attempts are refused")
	b := start("b", "Quick", 1)
	require.NoError(t, b.Get(ctx, nil), "tenant b's run finishes while a's activities are held")
	require.EqualValues(t, 3, holding.Load(), "a's activities are still held")

	close(release)
	require.NoError(t, a.Get(ctx, nil))
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, ran, 6)
	for id, n := range ran {
		require.Equal(t, 1, n, "activity %s ran once", id)
	}
}

// fan runs n activities called name at once.
func fan(ctx workflow.Context, name string, n int) error {
	ctx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{StartToCloseTimeout: time.Minute})
	var fs []workflow.Future
	for i := range n {
		fs = append(fs, workflow.ExecuteActivity(ctx, name, i))
	}
	for _, f := range fs {
		if err := f.Get(ctx, nil); err != nil {
			return err
		}
	}
	return nil
}

func randomID(t *testing.T) string {
	b := make([]byte, 4)
	_, err := rand.Read(b)
	require.NoError(t, err)
	return hex.EncodeToString(b)
}
