package api_test

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keyedhq/keyed/api"
	"github.com/keyedhq/keyed/internal/fxapp/fxapptest"
	"github.com/keyedhq/keyed/orders"
)

// Refunds through the whole path, as deployed: the API in front of the
// worker app (its relay and RefundWorkflow). A client retries one partial
// refund 20 times, the first eight at once: one Stripe refund and one
// refund email. The rest is then refunded in full, and a third refund is
// refused before anything is queued.
func TestRetriedRefundPostsRefundOnceThroughTheWorker(t *testing.T) {
	t.Parallel()
	w := fxapptest.Start(t, &fxapptest.Opts{Server: devServer, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	tenant, key := "q"+randomID(4), "sk_test_"+randomID(12)
	keys, err := api.ParseKeys(tenant + "=" + key)
	require.NoError(t, err)
	h, err := api.NewHandler(w.Pool, keys, &api.HandlerOpts{Effects: w.Effects, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	do := func(method, path, idem, body string) response {
		return doAt(t, srv.Client(), srv.URL, method, path, key, idem, body)
	}
	order := func() api.OrderDetail {
		r := do("GET", "/v1/orders/ord_rf", "", "")
		require.Equal(t, http.StatusOK, r.status, "%s", r.body)
		var d api.OrderDetail
		require.NoError(t, json.Unmarshal(r.body, &d))
		return d
	}

	require.Equal(t, http.StatusCreated, do("POST", "/v1/orders", "checkout", orderBody("ord_rf", 2599)).status)
	require.Eventually(t, func() bool { return order().Order.Status == orders.StatusPaid && w.SendGrid.Count() == 1 },
		60*time.Second, 100*time.Millisecond, "the order is paid and its receipt sent")

	retryStorm(t, http.StatusAccepted, func() response {
		return do("POST", "/v1/orders/ord_rf/refunds", "refund-attempt-1", refundBody("r1", 1000, "damaged"))
	})
	var d api.OrderDetail
	require.Eventually(t, func() bool {
		d = order()
		return d.Order.Status == orders.StatusPartiallyRefunded && len(d.Refunds) == 1 && d.Refunds[0].State == api.RefundRefunded &&
			w.SendGrid.Count() == 2
	}, 60*time.Second, 100*time.Millisecond, "the refund went through")
	require.EqualValues(t, 1000, d.RefundedMinor)
	require.NotEmpty(t, d.Refunds[0].StripeRefundID)
	require.Equal(t, 1, w.Stripe.Refunds(), "one Stripe refund")

	// The rest, in full.
	r := do("POST", "/v1/orders/ord_rf/refunds", "refund-attempt-2", refundBody("r2", 1599, ""))
	require.Equal(t, http.StatusAccepted, r.status, "%s", r.body)
	require.Eventually(t, func() bool {
		d = order()
		return d.Order.Status == orders.StatusRefunded && len(d.Refunds) == 2 && d.Refunds[1].State == api.RefundRefunded
	}, 60*time.Second, 100*time.Millisecond, "the order is refunded in full")
	require.EqualValues(t, 2599, d.RefundedMinor)
	require.Equal(t, 2, w.Stripe.Refunds())
	// Each refund's effects are under it, and the order's list has only its
	// own: nothing is shown twice.
	for _, e := range d.Effects {
		require.NotContains(t, e.Key, ":refund:", "a refund's effect in the order's own list")
	}
	require.NotEmpty(t, d.Effects)
	for _, rf := range d.Refunds {
		require.NotEmpty(t, rf.Effects, rf.RefundID)
		for _, e := range rf.Effects {
			require.Contains(t, e.Key, ":refund:"+rf.RefundID+":")
		}
	}

	// Nothing is left: refused, nothing queued.
	r = do("POST", "/v1/orders/ord_rf/refunds", "refund-attempt-3", refundBody("r3", 1, ""))
	require.Equal(t, http.StatusConflict, r.status, "%s", r.body)
	require.Equal(t, api.CodeOrderNotRefundable, decodeError(t, r).Code)
	require.Len(t, order().Refunds, 2)
}
