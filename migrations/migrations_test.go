package migrations_test

import (
	"context"
	"crypto/rand"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/effects/effectstest"
	"github.com/keyedhq/keyed/internal/dbtest"
	"github.com/keyedhq/keyed/migrations"
)

// quiet applies migrations without logging them.
var quiet = &migrations.Opts{Logger: slog.New(slog.DiscardHandler)}

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
			applied[i], err = migrations.Apply(ctx, pool, quiet)
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
	again, err := migrations.Apply(ctx, pool, quiet)
	require.NoError(t, err)
	require.Empty(t, again)
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM keyed_schema_migrations`).Scan(&n))
	require.Equal(t, len(all), n)
}

// A NoTransaction file splits at semicolons that end a line outside a
// comment, and only such files are flagged.
func TestNoTransactionFilesSplitIntoStatements(t *testing.T) {
	t.Parallel()
	require.Equal(t, []string{
		"-- keyed:no-transaction\n-- a comment;\nDROP INDEX CONCURRENTLY IF EXISTS x;",
		"CREATE INDEX CONCURRENTLY x ON t (a)\n    WHERE b = 'c;d';",
		"-- trailing\nSELECT 1\n-- the end;",
	}, migrations.StatementsForTest("-- keyed:no-transaction\n-- a comment;\nDROP INDEX CONCURRENTLY IF EXISTS x;\nCREATE INDEX CONCURRENTLY x ON t (a)\n    WHERE b = 'c;d';\n\n-- trailing\nSELECT 1\n-- the end;\n"))
	all, err := migrations.All()
	require.NoError(t, err)
	for _, m := range all {
		require.Equal(t, strings.HasPrefix(m.SQL, migrations.NoTransaction+"\n"), m.NoTransaction, m.Name)
		if m.NoTransaction {
			require.NotContains(t, m.SQL, "BEGIN", "%s runs outside a transaction", m.Name)
		}
	}
}

// A concurrent index build that failed leaves an invalid index and no
// record; the next Apply builds it again.
func TestApplyRebuildsAnIndexWhoseConcurrentBuildFailed(t *testing.T) {
	t.Parallel()
	_, url := effectstest.NewSchema(t)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url)
	require.NoError(t, err)
	defer pool.Close()
	_, err = migrations.Apply(ctx, pool, quiet)
	require.NoError(t, err)
	all, err := migrations.All()
	require.NoError(t, err)
	for _, m := range all {
		if !m.NoTransaction {
			continue
		}
		_, err = pool.Exec(ctx, `DELETE FROM keyed_schema_migrations WHERE version = $1`, m.Version)
		require.NoError(t, err)
	}
	_, err = pool.Exec(ctx, `UPDATE pg_index SET indisvalid = false WHERE indexrelid = 'keyed_outbox_refunds_idx'::regclass`)
	require.NoError(t, err)
	again, err := migrations.Apply(ctx, pool, quiet)
	require.NoError(t, err)
	require.Contains(t, again, 17)
	var valid bool
	require.NoError(t, pool.QueryRow(ctx, `SELECT indisvalid FROM pg_index WHERE indexrelid = 'keyed_outbox_refunds_idx'::regclass`).Scan(&valid))
	require.True(t, valid)
}

// Pending lists what a schema lacks, effects and app files apart, and
// nothing once Apply has run.
func TestPendingListsWhatApplyWouldRun(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, url := effectstest.NewSchema(t)
	pool, err := pgxpool.New(ctx, url)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	effectsPending, appPending, err := migrations.Pending(ctx, pool)
	require.NoError(t, err)
	require.Len(t, effectsPending, len(effects.Migrations()))
	all, err := migrations.All()
	require.NoError(t, err)
	require.Len(t, appPending, len(all))

	_, err = migrations.Apply(ctx, pool, quiet)
	require.NoError(t, err)
	effectsPending, appPending, err = migrations.Pending(ctx, pool)
	require.NoError(t, err)
	require.Empty(t, effectsPending)
	require.Empty(t, appPending)
}

// A schema a newer build migrated records versions this build lacks: Ahead
// names them, Apply leaves them alone, and Pending does not count them.
func TestAheadNamesWhatANewerBuildApplied(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.NewPool(t)
	effectsAhead, appAhead, err := migrations.Ahead(ctx, pool)
	require.NoError(t, err)
	require.Empty(t, effectsAhead)
	require.Empty(t, appAhead)

	all, err := migrations.All()
	require.NoError(t, err)
	nextApp, nextEffects := len(all)+1, len(effects.Migrations())+1
	_, err = pool.Exec(ctx, `INSERT INTO keyed_schema_migrations (version, name) VALUES ($1, 'newer.sql')`, nextApp)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO keyed_effects_migrations (line, version, name) VALUES ($1, $2, 'newer.sql')`,
		effects.MigrationLine, nextEffects)
	require.NoError(t, err)

	effectsAhead, appAhead, err = migrations.Ahead(ctx, pool)
	require.NoError(t, err)
	require.Equal(t, []int{nextEffects}, effectsAhead)
	require.Equal(t, []int{nextApp}, appAhead)
	applied, err := migrations.Apply(ctx, pool, quiet)
	require.NoError(t, err)
	require.Empty(t, applied)
	effectsPending, appPending, err := migrations.Pending(ctx, pool)
	require.NoError(t, err)
	require.Empty(t, effectsPending)
	require.Empty(t, appPending)
}

// A search_path that names no existing schema leaves Postgres nowhere to
// put the tables: Apply says so instead of failing on the lock's key.
func TestApplyNamesASearchPathWithoutASchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	absent := "keyed_test_absent_" + strings.ToLower(rand.Text())[:12]
	pool, err := pgxpool.New(ctx, effectstest.WithSearchPath(effectstest.DatabaseURL(), absent))
	require.NoError(t, err)
	defer pool.Close()

	_, err = migrations.Apply(ctx, pool, quiet)
	var nse *migrations.NoSchemaError
	require.ErrorAs(t, err, &nse)
	require.Equal(t, absent, nse.SearchPath)
	require.EqualError(t, err, "search_path "+absent+" names no existing schema")
	_, err = migrations.CurrentSchema(ctx, pool)
	require.ErrorAs(t, err, &nse)
}
