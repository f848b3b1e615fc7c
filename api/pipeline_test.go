package api_test

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.temporal.io/api/workflowservice/v1"

	orderacts "github.com/keyedhq/keyed/activities/order"
	"github.com/keyedhq/keyed/api"
	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/internal/fxapp/fxapptest"
	"github.com/keyedhq/keyed/orders"
)

// The whole path, as deployed: the API in front, the worker app (its
// Temporal worker, activities and outbox relay, wired by fxapp exactly as
// cmd/worker wires them) behind, fake Stripe and SendGrid at the edge. A
// client retries the same POST 20 times, the first eight at once: one
// order, one workflow run, one charge, one receipt, and every 2xx response
// identical.
func TestRetriedPostsRunThePipelineOnce(t *testing.T) {
	t.Parallel()
	w := fxapptest.Start(t, &fxapptest.Opts{Server: devServer,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	tenant, key := "p"+randomID(4), "sk_test_"+randomID(12)
	keys, err := api.ParseKeys(tenant + "=" + key)
	require.NoError(t, err)
	h, err := api.NewHandler(w.Pool, keys, &api.HandlerOpts{Effects: w.Effects,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)

	body := orderBody("ord_pipeline", 2599)
	retryStorm(t, http.StatusCreated, func() response {
		return doAt(t, srv.Client(), srv.URL, "POST", "/v1/orders", key, "checkout-attempt-1", body)
	})

	// The relay inside the worker starts the run; the worker runs it: an
	// effect for each step a paid order takes.
	var detail api.OrderDetail
	require.Eventually(t, func() bool {
		r := doAt(t, srv.Client(), srv.URL, "GET", "/v1/orders/ord_pipeline", key, "", "")
		require.Equal(t, http.StatusOK, r.status, "%s", r.body)
		require.NoError(t, json.Unmarshal(r.body, &detail))
		if detail.Order.Status != orders.StatusPaid || len(detail.Effects) != len(orderacts.PaidPath()) {
			return false
		}
		for _, e := range detail.Effects {
			if e.State != effects.StateSucceeded {
				return false
			}
		}
		return true
	}, 60*time.Second, 100*time.Millisecond, "the order is paid and its effects succeeded")

	require.Equal(t, "started", detail.Start.State)
	kinds := map[string]string{}
	for _, e := range detail.Effects {
		kinds[e.Kind] = e.Key
		require.NotEmpty(t, e.Outcome, "%s has a stored outcome", e.Key)
	}
	for _, kind := range []string{orders.StepCharge, orders.StepMarkPaid, orders.StepReceipt} {
		require.Equal(t, tenant+":order:ord_pipeline:"+kind, kinds[kind], "the %s effect", kind)
	}

	wf := orders.WorkflowID(tenant, "ord_pipeline")
	runs, err := w.Client.CountWorkflow(t.Context(), &workflowservice.CountWorkflowExecutionsRequest{
		Query: fmt.Sprintf("WorkflowId = '%s'", wf),
	})
	require.NoError(t, err)
	require.EqualValues(t, 1, runs.GetCount(), "one workflow run")
	require.Equal(t, 1, w.Stripe.Charges(), "one charge")
	require.Equal(t, 1, w.SendGrid.Count(), "one receipt")
	var orderRows int
	require.NoError(t, w.Pool.QueryRow(t.Context(), `SELECT count(*) FROM orders`).Scan(&orderRows))
	require.Equal(t, 1, orderRows, "one order")
	// The request's record, the three steps' and the worker's prune
	// schedule's: none holds the customer's email.
	require.GreaterOrEqual(t, requireNoPersonalData(t, w.Pool), 4)
}
