package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/outbox"
)

// With a listener, a relay whose poll interval is an hour still starts a
// committed order at once; a rolled-back enqueue wakes nobody.
func TestListenWakesTheRelayOnCommit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithCancel(b.ctx)
	defer cancel()
	wake := make(chan struct{}, 1)
	go outbox.Listen(ctx, b.pool, wake, b.logger)
	// The listener's first wake says it is listening.
	select {
	case <-wake:
	case <-time.After(10 * time.Second):
		t.Fatal("listener never started")
	}

	rollback := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		_, _, err := outbox.CreateOrderTx(b.ctx, tx, b.store, b.newOrder("rolled-back"))
		require.NoError(t, err)
		return context.Canceled
	})
	require.ErrorIs(t, rollback, context.Canceled)
	select {
	case <-wake:
		t.Fatal("a rolled-back enqueue must not wake the relay")
	case <-time.After(300 * time.Millisecond):
	}

	r := b.relay(t, &outbox.RelayOpts{PollInterval: time.Hour, Wake: wake})
	go func() { _ = r.Run(ctx) }()
	// Let the relay's first poll (of an empty outbox) pass.
	time.Sleep(300 * time.Millisecond)

	ids := b.createOrders(t, 1)
	require.Eventually(t, func() bool { return b.unsent(t) == 0 }, 10*time.Second, 20*time.Millisecond,
		"the committed order was not started before the hour-long poll")
	b.requireOneRunEach(t, ids)
	calls, _ := b.starter.counts()
	require.Equal(t, 1, calls[orders.WorkflowID(b.tenant, ids[0])])
}
