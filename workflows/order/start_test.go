package order_test

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/log"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/worker"

	ordersteps "github.com/keyedhq/keyed/activities/order"
	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/internal/devserver"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/outbox"
	"github.com/keyedhq/keyed/pipeline"
	"github.com/keyedhq/keyed/pipeline/pipelinetest"
	"github.com/keyedhq/keyed/step"
	"github.com/keyedhq/keyed/workflows"
	orderflow "github.com/keyedhq/keyed/workflows/order"
)

// startOptions returns StartOptions' options, failing the test on an error.
func startOptions(t *testing.T, in orders.OrderInput, opts *orderflow.StartOpts) client.StartWorkflowOptions {
	t.Helper()
	o, err := orderflow.StartOptions(in, opts)
	require.NoError(t, err)
	return o
}

// start starts in's run with pipeline.Start.
func start(ctx context.Context, t *testing.T, c client.Client, in orders.OrderInput, opts *orderflow.StartOpts) (*outbox.Started, error) {
	t.Helper()
	o, err := orderflow.StartOptions(in, opts)
	if err != nil {
		return nil, err
	}
	return pipeline.Start(ctx, c, o, orders.WorkflowName, in)
}

func TestStartOptions(t *testing.T) {
	t.Parallel()
	o := startOptions(t, in, nil)
	require.Equal(t, "order:acme:9f3a:fulfil", o.ID)
	require.Equal(t, orders.TaskQueue, o.TaskQueue)
	require.Equal(t, enumspb.WORKFLOW_ID_CONFLICT_POLICY_USE_EXISTING, o.WorkflowIDConflictPolicy)
	require.Equal(t, enumspb.WORKFLOW_ID_REUSE_POLICY_ALLOW_DUPLICATE_FAILED_ONLY, o.WorkflowIDReusePolicy)
	require.Equal(t, "tenant acme · order 9f3a", o.StaticSummary)
	require.Equal(t, "acme", o.Priority.FairnessKey, "the tenant is the run's fairness key")
	tenant, ok := o.TypedSearchAttributes.GetKeyword(pipeline.SearchAttrTenantID)
	require.True(t, ok)
	require.Equal(t, "acme", tenant)
	order, ok := o.TypedSearchAttributes.GetKeyword(temporal.NewSearchAttributeKeyKeyword(orders.SearchAttrOrderID))
	require.True(t, ok)
	require.Equal(t, "9f3a", order)

	ord := &orders.Order{TenantID: "acme", ID: "9f3a", AmountMinor: 1250, Currency: "eur"}
	o = startOptions(t, in, &orderflow.StartOpts{TaskQueue: "q", Order: ord})
	require.Equal(t, "q", o.TaskQueue)
	require.Equal(t, "tenant acme · order 9f3a · 12.50 EUR", o.StaticSummary)

	other := &orders.Order{TenantID: "acme", ID: "other", AmountMinor: 1, Currency: "eur"}
	require.Equal(t, "tenant acme · order 9f3a", startOptions(t, in, &orderflow.StartOpts{Order: other}).StaticSummary)
}

func TestStartRefusesBadInputBeforeTemporal(t *testing.T) {
	t.Parallel()
	future := in
	future.V = 2
	_, err := start(context.Background(), t, nil, future, nil)
	require.ErrorIs(t, err, step.ErrUnsupportedVersion)
	_, err = start(context.Background(), t, nil, orders.NewOrderInput("ac me", "1"), nil)
	require.ErrorIs(t, err, effects.ErrInvalidKey)
	_, err = start(context.Background(), t, nil, in, nil)
	require.ErrorContains(t, err, "client is nil")
}

// countingClient counts the start requests that reach the server.
type countingClient struct {
	client.Client
	calls atomic.Int64
}

func (c *countingClient) ExecuteWorkflow(ctx context.Context, o client.StartWorkflowOptions, wf any, args ...any) (client.WorkflowRun, error) {
	c.calls.Add(1)
	return c.Client.ExecuteWorkflow(ctx, o, wf, args...)
}

func TestStartAgainstDevServer(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv, err := devserver.Start(ctx, devserver.ForTests())
	if errors.Is(err, devserver.ErrNoBinary) {
		t.Fatalf("%v", err)
	}
	require.NoError(t, err)
	t.Cleanup(func() { _ = srv.Stop() })
	quiet := log.NewStructuredLogger(slog.New(slog.DiscardHandler))
	c, err := client.Dial(client.Options{HostPort: srv.Address(), Namespace: srv.Namespace(), Logger: quiet})
	require.NoError(t, err)
	t.Cleanup(c.Close)
	const tq = "start-test"
	opts := &orderflow.StartOpts{TaskQueue: tq, Order: &orders.Order{TenantID: "acme", ID: "9f3a", AmountMinor: 1250, Currency: "eur"}}

	// No worker yet, so the run stays open.
	first, err := start(ctx, t, c, in, opts)
	require.NoError(t, err)
	require.True(t, first.Created)
	require.Equal(t, in.WorkflowID(), first.WorkflowID)
	require.NotEmpty(t, first.RunID)

	dup, err := start(ctx, t, c, in, opts)
	require.NoError(t, err)
	require.Equal(t, outbox.Started{WorkflowID: first.WorkflowID, RunID: first.RunID, Created: false}, *dup)

	desc, err := c.DescribeWorkflow(ctx, first.WorkflowID, first.RunID)
	require.NoError(t, err)
	summary, err := desc.GetStaticSummary()
	require.NoError(t, err)
	require.Equal(t, "tenant acme · order 9f3a · 12.50 EUR", summary)
	tenant, _ := desc.TypedSearchAttributes.GetKeyword(pipeline.SearchAttrTenantID)
	require.Equal(t, "acme", tenant)

	w := worker.New(c, tq, worker.Options{})
	orderflow.Register(w, nil)
	require.NoError(t, step.Register(w, pipelinetest.Stubs(workflows.Pipelines(), map[string]any{
		ordersteps.NameCharge: func(_ context.Context, in orders.OrderInput) (orders.ChargeResult, error) {
			if in.OrderID == "declined" {
				return orders.ChargeResult{}, temporal.NewNonRetryableApplicationError("card declined", step.ErrTypeCardDeclined, nil)
			}
			return charged, nil
		},
	})...))
	require.NoError(t, w.Start())
	t.Cleanup(w.Stop)

	var res orders.OrderResult
	require.NoError(t, c.GetWorkflow(ctx, first.WorkflowID, first.RunID).Get(ctx, &res))
	require.Equal(t, charged, res.Charge)

	// The order completed: a new start is refused and names that run.
	after, err := start(ctx, t, c, in, opts)
	require.NoError(t, err)
	require.Equal(t, outbox.Started{WorkflowID: first.WorkflowID, RunID: first.RunID, Created: false}, *after)

	// A failed order may be re-run deliberately.
	declined := orders.NewOrderInput("acme", "declined")
	failed, err := start(ctx, t, c, declined, opts)
	require.NoError(t, err)
	require.True(t, failed.Created)
	err = c.GetWorkflow(ctx, failed.WorkflowID, failed.RunID).Get(ctx, nil)
	var app *temporal.ApplicationError
	require.ErrorAs(t, err, &app)
	require.Equal(t, step.ErrTypeCardDeclined, app.Type())
	rerun, err := start(ctx, t, c, declined, opts)
	require.NoError(t, err)
	require.True(t, rerun.Created)
	require.NotEqual(t, failed.RunID, rerun.RunID)

	// A failed order is final: with the order at hand, Start refuses it
	// before calling Temporal.
	_, err = start(ctx, t, c, declined, &orderflow.StartOpts{TaskQueue: tq,
		Order: &orders.Order{TenantID: "acme", ID: "declined", Status: orders.StatusFailed}})
	require.ErrorIs(t, err, orders.ErrFinal)

	// A storm of concurrent starts of one order in this process is one
	// request: one start creates the run, every other one joins it.
	storm := orders.NewOrderInput("acme", "storm")
	counting := &countingClient{Client: c}
	var wg sync.WaitGroup
	results := make(chan *outbox.Started, 100)
	for range 100 {
		wg.Go(func() {
			st, err := start(ctx, t, counting, storm, &orderflow.StartOpts{TaskQueue: tq})
			if assert.NoError(t, err) {
				results <- st
			}
		})
	}
	wg.Wait()
	close(results)
	created, runIDs := 0, map[string]bool{}
	for st := range results {
		runIDs[st.RunID] = true
		if st.Created {
			created++
		}
	}
	require.Equal(t, 1, created, "one start created the run")
	require.Len(t, runIDs, 1, "every start names the one run")
	require.Less(t, counting.calls.Load(), int64(100), "duplicates shared requests")

	// StartOptions with ExecuteWorkflow, as a starter might use it, returns
	// the existing run too (USE_EXISTING).
	run, err := c.ExecuteWorkflow(ctx, startOptions(t, in, opts), orders.WorkflowName, in)
	require.NoError(t, err)
	require.Equal(t, first.RunID, run.GetRunID())
}
