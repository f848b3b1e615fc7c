package main

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/client"

	"github.com/keyedhq/keyed/internal/fxapp/fxapptest"
)

// A run that does not finish fails the demo within its wait, saying what
// it waits on, instead of holding the demo until the run's retries end.
func TestAStuckRunFailsTheDemoSayingWhy(t *testing.T) {
	t.Parallel()
	srv := fxapptest.StartServer(t)
	tc, err := client.Dial(client.Options{HostPort: srv.Address(), Namespace: srv.Namespace()})
	require.NoError(t, err)
	t.Cleanup(tc.Close)
	s := &stack{tc: tc, taskQueue: "demo-stuck-nobody", logPath: ".demo/worker-test.log"}
	ctx := context.Background()
	run, err := tc.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: "stuck-1", TaskQueue: s.taskQueue}, "OrderWorkflow")
	require.NoError(t, err)

	start := time.Now()
	err = s.await(ctx, run.GetID(), run.GetRunID(), time.Second, nil)
	require.ErrorIs(t, err, errStuck)
	require.Less(t, time.Since(start), 10*time.Second)
	require.Contains(t, err.Error(), "stuck-1 after 1s: no activity is running: is a worker polling task queue demo-stuck-nobody?")
	require.Contains(t, err.Error(), ".demo/worker-test.log")
}
