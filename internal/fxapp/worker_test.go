package fxapp_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	enumspb "go.temporal.io/api/enums/v1"
	taskqueuepb "go.temporal.io/api/taskqueue/v1"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/worker"

	orderacts "github.com/keyedhq/keyed/activities/order"
	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/internal/config"
	"github.com/keyedhq/keyed/internal/fxapp"
	"github.com/keyedhq/keyed/internal/fxapp/fxapptest"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/retention"
	orderflow "github.com/keyedhq/keyed/workflows/order"
)

// TestWorkerAppRunsAnOrder starts the real worker app against a dev
// server, a fresh schema and the provider fakes, runs one order through
// checkout, and stops the app.
func TestWorkerAppRunsAnOrder(t *testing.T) {
	t.Parallel()
	w := fxapptest.Start(t, &fxapptest.Opts{Env: map[string]string{"RECONCILE_EVERY": "1h", "EFFECTS_LEAVES_PER_LIFETIME": "6"}})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	order, created, err := w.Orders.Create(ctx, orders.NewOrder{
		TenantID: "acme", ID: "smoke-1", AmountMinor: 1999, Currency: "usd",
		CustomerEmail: "ann@example.com", PaymentMethod: "pm_card_visa",
	})
	require.NoError(t, err)
	require.True(t, created)
	in := orders.NewOrderInput("acme", "smoke-1")
	st, err := orderflow.Start(ctx, w.Client, in, &orderflow.StartOpts{TaskQueue: w.Config.Temporal.TaskQueue, Order: order})
	require.NoError(t, err)
	require.True(t, st.Created)
	require.Equal(t, in.WorkflowID(), st.WorkflowID)

	var res orders.OrderResult
	require.NoError(t, w.Client.GetWorkflow(ctx, st.WorkflowID, st.RunID).Get(ctx, &res))
	require.NotEmpty(t, res.Charge.PaymentIntentID)
	require.Equal(t, int64(1999), res.Charge.AmountMinor)

	require.Equal(t, 1, w.Stripe.Charges(), "one charge")
	require.Len(t, w.SendGrid.Messages(), 1, "one receipt")
	require.Equal(t, []string{"ann@example.com"}, w.SendGrid.Messages()[0].To)
	got, err := w.Orders.Get(ctx, "acme", "smoke-1")
	require.NoError(t, err)
	require.Equal(t, orders.StatusPaid, got.Status)
	prefix, err := orders.OrderKey("acme", "smoke-1")
	require.NoError(t, err)
	recs, err := w.Orders.Effects(ctx, w.Effects, prefix)
	require.NoError(t, err)
	var made []string
	for _, r := range recs {
		require.Equal(t, effects.StateSucceeded, r.State, r.Key)
		made = append(made, r.Key[strings.LastIndex(r.Key, ":")+1:])
	}
	require.Subset(t, made, []string{orders.StepCharge, orders.StepMarkPaid, orders.StepReceipt}, "a record per step")

	// The worker pruned once, for the current window, under a keyed window.
	var prunes []*effects.Record
	require.Eventually(t, func() bool {
		prunes, err = w.Effects.List(ctx, effects.MustKey(retention.SystemTenant, "schedule", "prune"))
		return err == nil && len(prunes) == 1 && prunes[0].State == effects.StateSucceeded
	}, 10*time.Second, 50*time.Millisecond, "one prune window recorded: %v", prunes)
	require.Contains(t, string(prunes[0].Result), `"effects":`)
	// The window set the lifetimes, a charge's cut into six leaves.
	var width time.Duration
	require.NoError(t, w.Pool.QueryRow(ctx, `SELECT width FROM keyed_effect_lifetimes WHERE kind = $1`, orders.StepCharge).Scan(&width))
	require.Equal(t, config.DefaultMoneyRetention/6, width)
	// And reconciled with Stripe for its window, exporting the findings.
	require.Eventually(t, func() bool {
		runs, err := w.Effects.List(ctx, effects.MustKey(retention.SystemTenant, "schedule", "reconcile"))
		return err == nil && len(runs) == 1 && runs[0].State == effects.StateSucceeded
	}, 10*time.Second, 50*time.Millisecond, "one reconcile window recorded")
	// And ran the settler for its window, under a keyed window too.
	require.Eventually(t, func() bool {
		settles, err := w.Effects.List(ctx, effects.MustKey(retention.SystemTenant, "schedule", "settle"))
		return err == nil && len(settles) >= 1 && settles[0].State == effects.StateSucceeded
	}, 10*time.Second, 50*time.Millisecond, "a settle window recorded")

	// /healthz sees both dependencies; /metrics carries the effect counters.
	base := "http://" + w.Metrics.Addr()
	resp, err := http.Get(base + "/healthz")
	require.NoError(t, err)
	var health struct {
		Status string            `json:"status"`
		Checks map[string]string `json:"checks"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&health))
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "ok", health.Status)
	require.Equal(t, map[string]string{"postgres": "ok", "temporal": "ok"}, health.Checks)
	resp, err = http.Get(base + "/metrics")
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	require.Contains(t, string(body), `keyed_effect_claims_acquired_total{kind="charge",mode="new"} 1`)
	_, poolSize := fxapp.PoolNeeds(w.Config)
	require.Regexp(t, fmt.Sprintf(`(?m)^keyed_db_pool_max_conns %d$`, poolSize), string(body), "the pool's statistics are served")
	require.Regexp(t, `(?m)^keyed_db_pool_acquires_total [1-9]`, string(body))
	// The steps ran in the workflow task (first attempts), as local activities.
	require.Contains(t, string(body), "temporal_local_activity_execution_latency_seconds_bucket{", "the Temporal SDK's metrics are served too")
	require.Regexp(t, `(?m)^keyed_reconcile_last_success_timestamp_seconds [1-9]`, string(body), "the reconciliation's findings are served")
	require.Contains(t, string(body), "temporal_workflow_completed_total{")
	require.Contains(t, string(body), "keyed_sdk_metrics_dropped_total 0\n", "no SDK sample was dropped")

	// A duplicate start after success starts nothing and charges nothing.
	again, err := orderflow.Start(ctx, w.Client, in, &orderflow.StartOpts{TaskQueue: w.Config.Temporal.TaskQueue, Order: got})
	require.NoError(t, err)
	require.False(t, again.Created)
	require.Equal(t, st.RunID, again.RunID)
	require.Equal(t, 1, w.Stripe.Charges())

	stopped := time.Now()
	require.NoError(t, w.Stop(), "the app stops cleanly")
	require.Less(t, time.Since(stopped), 10*time.Second, "an idle worker stops at once")
	_, err = http.Get(base + "/healthz")
	require.Error(t, err, "the metrics server is closed after stop")
}

// With STRIPE_CALLS_PER_SECOND and SENDGRID_CALLS_PER_SECOND set, the
// worker app runs the charge and the receipt on the providers' own task
// queues, which it polls with their rate limits, and the order still pays.
func TestWorkerAppBoundsProviderCalls(t *testing.T) {
	t.Parallel()
	w := fxapptest.Start(t, &fxapptest.Opts{Env: map[string]string{"STRIPE_CALLS_PER_SECOND": "5", "SENDGRID_CALLS_PER_SECOND": "7"}})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	order, _, err := w.Orders.Create(ctx, orders.NewOrder{TenantID: "acme", ID: "bounded-1", AmountMinor: 1999, Currency: "usd",
		CustomerEmail: "ann@example.com", PaymentMethod: "pm_card_visa"})
	require.NoError(t, err)
	tq := w.Config.Temporal.TaskQueue
	st, err := orderflow.Start(ctx, w.Client, orders.NewOrderInput("acme", "bounded-1"), &orderflow.StartOpts{TaskQueue: tq, Order: order})
	require.NoError(t, err)
	require.NoError(t, w.Client.GetWorkflow(ctx, st.WorkflowID, st.RunID).Get(ctx, nil))
	require.Equal(t, 1, w.Stripe.Charges(), "one charge")
	require.Len(t, w.SendGrid.Messages(), 1, "one receipt")

	queues := map[string]string{}
	iter := w.Client.GetWorkflowHistory(ctx, st.WorkflowID, st.RunID, false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	for iter.HasNext() {
		e, err := iter.Next()
		require.NoError(t, err)
		if a := e.GetActivityTaskScheduledEventAttributes(); a != nil {
			queues[a.GetActivityType().GetName()] = a.GetTaskQueue().GetName()
		}
	}
	// Each step went to its provider's queue when that provider's calls are
	// bounded, else to the worker's; a local one to none.
	rates := map[string]float32{}
	providerQueue := map[string]string{}
	for _, l := range fxapp.ProviderRates(tq, w.Config.Stripe, w.Config.SendGrid) {
		if l.PerSecond > 0 {
			providerQueue[l.Provider], rates[l.TaskQueue] = l.TaskQueue, float32(l.PerSecond)
		}
	}
	for _, d := range orderacts.Declarations() {
		queue, scheduled := queues[d.Name]
		switch {
		case d.Local:
			require.False(t, scheduled, "%s is a local activity: no task queue", d.Name)
		case scheduled && providerQueue[d.Provider] != "":
			require.Equal(t, providerQueue[d.Provider], queue, d.Name)
		case scheduled:
			require.Equal(t, tq, queue, d.Name)
		}
	}
	require.Contains(t, queues, orderacts.NameCharge)
	require.Contains(t, queues, orderacts.NameSendReceipt)
	require.Equal(t, map[string]float32{tq + "-stripe": 5, tq + "-sendgrid": 7}, rates, "the rates the test set")
	for queue, rate := range rates {
		resp, err := w.Client.WorkflowService().DescribeTaskQueue(ctx, &workflowservice.DescribeTaskQueueRequest{Namespace: w.Config.Temporal.Namespace,
			TaskQueue: &taskqueuepb.TaskQueue{Name: queue}, TaskQueueType: enumspb.TASK_QUEUE_TYPE_ACTIVITY, ReportConfig: true})
		require.NoError(t, err)
		require.Equal(t, rate, resp.GetEffectiveRateLimit().GetRequestsPerSecond(), queue)
	}
}

// TestWorkerOptionsPollBothWorkflowQueues pins what closes the minute-long
// stall (issue 23): for every WORKER_POLLERS the settings accept, the
// workflow-task pollers are the SDK's two-queue behaviour, which keeps a
// task-queue poll outstanding however the sticky queue's backlog hint
// reads, and not the one pool that picks a queue per poll
// (NewPollerBehaviorSimpleMaximum, what MaxConcurrentWorkflowTaskPollers
// sets).
func TestWorkerOptionsPollBothWorkflowQueues(t *testing.T) {
	t.Parallel()
	for p := 2; p <= 64; p++ {
		opts := fxapp.WorkerOptions(config.WorkerTuning{Pollers: p, MaxConcurrentActivities: 64, StopTimeout: time.Second})
		require.Equal(t, worker.NewPollerBehaviorAutoscaling(worker.PollerBehaviorAutoscalingOptions{
			InitialNumberOfPollers: p / 2, MinimumNumberOfPollers: 1, MaximumNumberOfPollers: p,
		}), opts.WorkflowTaskPollerBehavior, "WORKER_POLLERS=%d", p)
		require.Zero(t, opts.MaxConcurrentWorkflowTaskPollers, "WORKER_POLLERS=%d: a fixed count would make the SDK pool them", p)
		require.Equal(t, p, opts.MaxConcurrentActivityTaskPollers)
	}
}
