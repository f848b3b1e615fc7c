package fxapp_test

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keyedhq/keyed/internal/config"
	"github.com/keyedhq/keyed/internal/fxapp"
	"github.com/keyedhq/keyed/internal/fxapp/fxapptest"
	"github.com/keyedhq/keyed/notify"
	"github.com/keyedhq/keyed/orders"
	orderflow "github.com/keyedhq/keyed/workflows/order"
)

// runOrders creates n orders, starts each run twice from 32 concurrent
// clients, and waits until every order is paid; it returns how many are.
func runOrders(t *testing.T, w *fxapptest.Worker, prefix string, n int) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	sem := make(chan struct{}, 32)
	errs := make(chan error, 2*n)
	for i := range n {
		id := fmt.Sprintf("%s-%03d", prefix, i)
		o, _, err := w.Orders.Create(ctx, orders.NewOrder{TenantID: "acme", ID: id, AmountMinor: 1000 + int64(i),
			Currency: "eur", CustomerEmail: "ann@example.com", PaymentMethod: "pm_card_visa"})
		require.NoError(t, err)
		in := orders.NewOrderInput("acme", id)
		for range 2 {
			wg.Go(func() {
				sem <- struct{}{}
				defer func() { <-sem }()
				_, err := orderflow.Start(ctx, w.Client, in, &orderflow.StartOpts{TaskQueue: w.Config.Temporal.TaskQueue, Order: o})
				errs <- err
			})
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	var paid int
	require.Eventually(t, func() bool {
		err := w.Pool.QueryRow(ctx, `SELECT count(*) FROM orders WHERE id LIKE $1 AND status = 'paid'`, prefix+"-%").Scan(&paid)
		return err == nil && paid == n && w.SendGrid.Count() >= n
	}, 4*time.Minute, 200*time.Millisecond, "orders paid: %d of %d", paid, n)
	return paid
}

// TestWorkerUnderLoadAndOnTheSmallestPool bursts 500 orders at the default
// settings, then runs orders on the smallest pool the worker accepts; every
// order ends paid with one charge and one receipt. It also checks the
// configurations the worker refuses at start.
func TestWorkerUnderLoadAndOnTheSmallestPool(t *testing.T) {
	t.Parallel()
	srv := fxapptest.StartServer(t)

	t.Run("burst of 500 at default settings", func(t *testing.T) {
		w := fxapptest.Start(t, &fxapptest.Opts{Server: srv})
		require.Equal(t, 500, runOrders(t, w, "burst", 500))
		require.Equal(t, 500, w.Stripe.Charges())
		require.Len(t, w.SendGrid.Messages(), 500)
		requireOneEach(t, w)
	})

	t.Run("smallest pool", func(t *testing.T) {
		d := fxapptest.Prepare(t, &fxapptest.Opts{Server: srv})
		least, _ := fxapp.PoolNeeds(&config.Config{Role: config.Worker, Worker: config.WorkerTuning{MaxConcurrentActivities: 64}})
		d.Env["DATABASE_URL"] += fmt.Sprintf("&pool_max_conns=%d", least)
		w, err := fxapptest.StartOn(t, d, nil)
		require.NoError(t, err)
		require.EqualValues(t, least, w.Pool.Config().MaxConns)
		require.Equal(t, 40, runOrders(t, w, "small", 40))
		require.Equal(t, 40, w.Stripe.Charges())
		require.Len(t, w.SendGrid.Messages(), 40)
		requireOneEach(t, w)
	})

	t.Run("a smaller pool is refused", func(t *testing.T) {
		d := fxapptest.Prepare(t, &fxapptest.Opts{Server: srv})
		d.Env["DATABASE_URL"] += "&pool_max_conns=1"
		_, err := fxapptest.StartOn(t, d, nil)
		require.ErrorContains(t, err, "pool_max_conns=1 is below the 4 connections the worker needs")
		require.ErrorIs(t, err, config.ErrInvalid, "bad configuration: the worker exits 2")
	})

	t.Run("a retention shorter than the namespace's is refused", func(t *testing.T) {
		d := fxapptest.Prepare(t, &fxapptest.Opts{Server: srv})
		d.Env["EFFECTS_RETENTION"] = "2h"
		_, err := fxapptest.StartOn(t, d, nil)
		require.Error(t, err)
		require.True(t, strings.HasPrefix(err.Error(), "EFFECTS_RETENTION 2h0m0s is shorter than namespace"), err.Error())
		require.ErrorContains(t, err, "set it to at least")
		require.ErrorIs(t, err, config.ErrInvalid, "bad configuration: the worker exits 2")
	})
}

func TestPoolNeeds(t *testing.T) {
	t.Parallel()
	least, def := fxapp.PoolNeeds(&config.Config{Role: config.Worker, Worker: config.WorkerTuning{MaxConcurrentActivities: 64}})
	require.EqualValues(t, 4, least)
	require.Equal(t, 3+fxapp.ActivityConns(64, runtime.GOMAXPROCS(0)), def)
	least, def = fxapp.PoolNeeds(&config.Config{Role: config.Worker, Worker: config.WorkerTuning{MaxConcurrentActivities: 2}})
	require.EqualValues(t, 4, least)
	require.EqualValues(t, 5, def)
	for _, c := range []struct{ slots, cores, want int }{
		{64, 1, 4}, {64, 2, 4}, {64, 4, 8}, {64, 8, 16}, {64, 32, 16}, {2, 8, 2}, {0, 2, 1},
	} {
		require.EqualValues(t, c.want, fxapp.ActivityConns(c.slots, c.cores), "%d slots on %d cores", c.slots, c.cores)
	}
	least, _ = fxapp.PoolNeeds(&config.Config{Role: config.Starter})
	require.EqualValues(t, 1, least, "every starter command runs on one connection (cmd/starter TestEveryCommandOnOneConnection)")
}

// requireOneEach checks at the fakes that no order was charged or mailed
// twice.
func requireOneEach(t *testing.T, w *fxapptest.Worker) {
	t.Helper()
	seen := map[string]bool{}
	for _, m := range w.SendGrid.Messages() {
		k := m.CustomArgs[notify.CustomArgEffectKey]
		require.False(t, seen[k], "two receipts under %s", k)
		seen[k] = true
	}
}
