package effects_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keyedhq/keyed/effects"
)

func TestLockEntityTxSerializesOneEntityOnly(t *testing.T) {
	t.Parallel()
	b := setup(t)
	order := effects.MustKey("acme", "order", "9f3a")

	first, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	defer first.Rollback(b.ctx)
	require.NoError(t, effects.LockEntityTx(b.ctx, first, order))

	// Another entity is not held up.
	other, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	require.NoError(t, effects.LockEntityTx(b.ctx, other, effects.MustKey("acme", "order", "b7c1")))
	require.NoError(t, other.Commit(b.ctx))

	// The same entity waits for the first transaction to end.
	got := make(chan error, 1)
	go func() {
		tx, err := b.pool.Begin(b.ctx)
		if err != nil {
			got <- err
			return
		}
		defer tx.Rollback(b.ctx)
		got <- effects.LockEntityTx(b.ctx, tx, order)
	}()
	select {
	case err := <-got:
		t.Fatalf("second lock did not wait: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	require.NoError(t, first.Commit(b.ctx))
	select {
	case err := <-got:
		require.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("second lock still waiting after the first transaction committed")
	}

	// A cancelled wait returns the context's error.
	hold, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	defer hold.Rollback(b.ctx)
	require.NoError(t, effects.LockEntityTx(b.ctx, hold, order))
	waiter, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	defer waiter.Rollback(b.ctx)
	ctx, cancel := context.WithTimeout(b.ctx, 200*time.Millisecond)
	defer cancel()
	require.Error(t, effects.LockEntityTx(ctx, waiter, order))

	var zero effects.Key
	require.ErrorIs(t, effects.LockEntityTx(b.ctx, hold, zero), effects.ErrInvalidKey)
}
