package tempcluster_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.temporal.io/api/operatorservice/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/keyedhq/keyed/internal/devserver"
	"github.com/keyedhq/keyed/internal/tempcluster"
)

func echo(ctx workflow.Context, s string) (string, error) { return s, nil }

// TestClusterServesThroughANodeKill starts a two-node cluster, checks that
// keyed's search attributes are registered and that a workflow runs
// through the load balancer, SIGKILLs one node, runs another workflow on
// the surviving one, restarts the killed node and runs a third.
func TestClusterServesThroughANodeKill(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	// Small pools: the suite's other packages share this Postgres.
	c, err := tempcluster.Start(ctx, &tempcluster.Opts{UIPort: -1, MaxConns: 4})
	require.NoError(t, err, "start a cluster (run `make tools` first)")
	t.Cleanup(func() { require.NoError(t, c.Stop()) })
	require.Equal(t, 2, c.Nodes())

	tc, err := client.Dial(client.Options{HostPort: c.Address(), Namespace: tempcluster.Namespace})
	require.NoError(t, err)
	defer tc.Close()
	resp, err := tc.OperatorService().ListSearchAttributes(ctx, &operatorservice.ListSearchAttributesRequest{Namespace: tempcluster.Namespace})
	require.NoError(t, err)
	for _, sa := range devserver.SearchAttributes() {
		name, _, _ := strings.Cut(sa, "=")
		require.Contains(t, resp.CustomAttributes, name)
	}

	w := worker.New(tc, "tempcluster-test", worker.Options{})
	w.RegisterWorkflow(echo)
	require.NoError(t, w.Start())
	defer w.Stop()
	// run runs the workflow id like a client that retries a failed call:
	// while a killed node's shards move, a start or a wait can fail.
	run := func(id string) {
		t.Helper()
		began := time.Now()
		var err error
		for try := 1; try <= 10; try++ {
			// Each try has a deadline of its own: a task lost while the
			// cluster's membership settles (a fresh cluster under load)
			// is retried, not waited on until the test's end.
			tctx, cancel := context.WithTimeout(ctx, 20*time.Second)
			var r client.WorkflowRun
			if r, err = tc.ExecuteWorkflow(tctx, client.StartWorkflowOptions{ID: id, TaskQueue: "tempcluster-test"}, echo, id); err == nil {
				var got string
				err = r.Get(tctx, &got)
				cancel()
				if err == nil {
					require.Equal(t, id, got)
					t.Logf("%s: done after %s and %d tries", id, time.Since(began).Round(time.Millisecond), try)
					return
				}
			}
			cancel()
			t.Logf("%s: try %d: %v", id, try, err)
			time.Sleep(time.Second)
		}
		require.NoError(t, err, "run %s", id)
	}
	run("before")
	require.NoError(t, c.Kill(1))
	run("one-node")
	began := time.Now()
	require.NoError(t, c.Restart(ctx, 1))
	t.Logf("node 1 serving again after %s", time.Since(began).Round(time.Millisecond))
	run("after")
}
