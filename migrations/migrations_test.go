package migrations_test

import (
	"context"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/keyedhq/keyed/effects/effectstest"
	"github.com/keyedhq/keyed/migrations"
)

func TestAllIsOrderedAndWellFormed(t *testing.T) {
	t.Parallel()
	all, err := migrations.All()
	require.NoError(t, err)
	require.NotEmpty(t, all)
	for i, m := range all {
		require.Equal(t, i+1, m.Version, "versions must be 1..n without gaps: %s", m.Name)
		require.NotEmpty(t, m.SQL)
	}
}

// Several workers starting together: the advisory lock lets exactly one
// apply each file; the others find nothing to do.
func TestConcurrentApplyRunsEachFileOnce(t *testing.T) {
	t.Parallel()
	_, url := effectstest.NewSchema(t)
	ctx := context.Background()
	const workers = 6
	applied := make([][]int, workers)
	var wg sync.WaitGroup
	for i := 0; i < workers; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			pool, err := pgxpool.New(ctx, url)
			require.NoError(t, err)
			defer pool.Close()
			applied[i], err = migrations.Apply(ctx, pool)
			require.NoError(t, err)
		}(i)
	}
	wg.Wait()
	all, err := migrations.All()
	require.NoError(t, err)
	total := 0
	for _, a := range applied {
		total += len(a)
	}
	require.Equal(t, len(all), total)

	pool, err := pgxpool.New(ctx, url)
	require.NoError(t, err)
	defer pool.Close()
	again, err := migrations.Apply(ctx, pool)
	require.NoError(t, err)
	require.Empty(t, again)
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM keyed_schema_migrations`).Scan(&n))
	require.Equal(t, len(all), n)
}
