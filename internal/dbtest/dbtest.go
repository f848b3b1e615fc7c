// Package dbtest gives the app's tests a fresh Postgres schema with every
// keyed migration applied: the effects tables and the app's own (orders,
// sends, outbox, api requests). It builds on effectstest.NewSchema; tests of
// package effects itself use effectstest, which applies only the effects
// migrations.
package dbtest

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/keyedhq/keyed/effects/effectstest"
	"github.com/keyedhq/keyed/migrations"
)

// NewPool creates a fresh schema (see effectstest.NewSchema), applies all of
// keyed's migrations to it and returns a pool bound to it, closed when the
// test ends. It fails the test when Postgres cannot be reached or a migration
// fails.
func NewPool(t testing.TB, opts ...*effectstest.PoolOpts) *pgxpool.Pool {
	t.Helper()
	_, url := effectstest.NewSchema(t)
	return Connect(t, url, opts...)
}

// Connect opens a pool on url (see effectstest.Connect), applies all of
// keyed's migrations, and closes the pool when the test ends. It fails the
// test when a migration fails.
func Connect(t testing.TB, url string, opts ...*effectstest.PoolOpts) *pgxpool.Pool {
	t.Helper()
	pool := effectstest.Connect(t, url, opts...)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := migrations.Apply(ctx, pool, &migrations.Opts{Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err, "apply migrations")
	return pool
}

// Begin starts a transaction on pool, for a test that holds rows or locks
// while something else runs. It is rolled back when the test ends unless
// the test committed or rolled it back before.
func Begin(t testing.TB, pool *pgxpool.Pool) pgx.Tx {
	t.Helper()
	tx, err := pool.Begin(context.Background())
	require.NoError(t, err)
	t.Cleanup(func() {
		if err := tx.Rollback(context.Background()); err != nil && !errors.Is(err, pgx.ErrTxClosed) {
			t.Error(err)
		}
	})
	return tx
}
