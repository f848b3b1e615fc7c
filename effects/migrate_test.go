package effects_test

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/effects/effectstest"
)

var quiet = &effects.MigratorOpts{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}

// emptyPool returns a pool on a fresh schema with no tables at all.
func emptyPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	_, url := effectstest.NewSchema(t)
	pool, err := pgxpool.New(context.Background(), url)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// applyMigrations applies migs to pool one by one, as a release whose
// schema stops at them would have.
func applyMigrations(t *testing.T, pool *pgxpool.Pool, migs []effects.Migration) {
	t.Helper()
	for _, m := range migs {
		_, err := pool.Exec(context.Background(), m.SQL)
		require.NoError(t, err, m.Name)
	}
}

// poolAtMigration returns a pool on an empty schema migrated to version n.
func poolAtMigration(t *testing.T, n int) *pgxpool.Pool {
	t.Helper()
	pool := emptyPool(t)
	applyMigrations(t, pool, effects.Migrations()[:n])
	return pool
}

func allVersions() []int {
	var out []int
	for _, m := range effects.Migrations() {
		out = append(out, m.Version)
	}
	return out
}

func TestMigrationsAreNumberedWithoutGaps(t *testing.T) {
	t.Parallel()
	all := effects.Migrations()
	require.NotEmpty(t, all)
	for i, m := range all {
		require.Equal(t, i+1, m.Version, m.Name)
		require.NotEmpty(t, m.SQL, m.Name)
	}
}

func TestNewMigratorRefusesNilDB(t *testing.T) {
	t.Parallel()
	_, err := effects.NewMigrator(nil, nil)
	require.Error(t, err)
}

func TestMigrateAppliesEachVersionOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := emptyPool(t)
	m, err := effects.NewMigrator(pool, quiet)
	require.NoError(t, err)

	pending, err := m.Pending(ctx)
	require.NoError(t, err)
	require.Equal(t, allVersions(), pending, "a new database has every version pending")

	applied, err := m.Migrate(ctx)
	require.NoError(t, err)
	require.Equal(t, allVersions(), applied)

	applied, err = m.Migrate(ctx)
	require.NoError(t, err)
	require.Empty(t, applied)
	pending, err = m.Pending(ctx)
	require.NoError(t, err)
	require.Empty(t, pending)

	var line string
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT min(line), count(*) FROM keyed_effects_migrations`).Scan(&line, &n))
	require.Equal(t, effects.MigrationLine, line)
	require.Equal(t, len(allVersions()), n)

	c, err := effects.NewClient(pool, nil)
	require.NoError(t, err)
	_, err = c.Claim(ctx, effects.ClaimParams{Key: effects.MustKey("acme", "order", "1", "charge"), Owner: "wf/charge"})
	require.NoError(t, err, "the migrated schema serves claims")
}

// A schema a newer release migrated further is named by Ahead, and still
// migrates (nothing to do) without a word: the release before a migration
// keeps working on it.
func TestAheadNamesVersionsOfANewerRelease(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := emptyPool(t)
	m, err := effects.NewMigrator(pool, quiet)
	require.NoError(t, err)
	ahead, err := m.Ahead(ctx)
	require.NoError(t, err)
	require.Empty(t, ahead, "nothing migrated yet")
	_, err = m.Migrate(ctx)
	require.NoError(t, err)
	next := len(allVersions()) + 1
	_, err = pool.Exec(ctx, `INSERT INTO keyed_effects_migrations (line, version, name) VALUES ($1, $2, 'from_a_newer_release.sql')`,
		effects.MigrationLine, next)
	require.NoError(t, err)
	ahead, err = m.Ahead(ctx)
	require.NoError(t, err)
	require.Equal(t, []int{next}, ahead)
	applied, err := m.Migrate(ctx)
	require.NoError(t, err)
	require.Empty(t, applied)
}

// A search_path that names no existing schema is ErrNoSchema, before any
// lock or table.
func TestMigrateWithoutASchema(t *testing.T) {
	t.Parallel()
	_, url := effectstest.NewSchema(t)
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	cfg.ConnConfig.RuntimeParams["search_path"] = "keyed_no_such_schema_here"
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	m, err := effects.NewMigrator(pool, quiet)
	require.NoError(t, err)
	_, err = m.Migrate(context.Background())
	require.ErrorIs(t, err, effects.ErrNoSchema)
	require.Contains(t, err.Error(), "search_path keyed_no_such_schema_here")
}

// MigrateTx leaves nothing behind when the caller rolls back.
func TestMigrateTxRollsBackWithTheCaller(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := emptyPool(t)
	m, err := effects.NewMigrator(pool, quiet)
	require.NoError(t, err)

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	applied, err := m.MigrateTx(ctx, tx)
	require.NoError(t, err)
	require.Equal(t, allVersions(), applied)
	require.NoError(t, tx.Rollback(ctx))

	var exists bool
	require.NoError(t, pool.QueryRow(ctx, `SELECT to_regclass('keyed_effects') IS NOT NULL`).Scan(&exists))
	require.False(t, exists)
	pending, err := m.Pending(ctx)
	require.NoError(t, err)
	require.Equal(t, allVersions(), pending)
}

// Several processes starting together: the advisory lock lets exactly one
// apply each version; the others wait and find nothing to do.
func TestConcurrentMigrateAppliesEachVersionOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := emptyPool(t)
	const workers = 6
	applied := make([][]int, workers)
	var wg sync.WaitGroup
	for i := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m, err := effects.NewMigrator(pool, quiet)
			require.NoError(t, err)
			applied[i], err = m.Migrate(ctx)
			require.NoError(t, err)
		}()
	}
	wg.Wait()
	total := 0
	for _, a := range applied {
		total += len(a)
	}
	require.Equal(t, len(allVersions()), total)
}

// A failing migration names its file and leaves no version recorded.
func TestMigrateTxFailureNamesTheFile(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := emptyPool(t)
	// A view in the table's place makes the first file fail.
	_, err := pool.Exec(ctx, `CREATE VIEW keyed_effects AS SELECT 1 AS key`)
	require.NoError(t, err)
	m, err := effects.NewMigrator(pool, quiet)
	require.NoError(t, err)
	_, err = m.Migrate(ctx)
	require.ErrorContains(t, err, effects.Migrations()[0].Name)

	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var n int
		require.NoError(t, tx.QueryRow(ctx, `SELECT count(*) FROM pg_tables
			WHERE schemaname = current_schema() AND tablename = 'keyed_effects_migrations'`).Scan(&n))
		require.Zero(t, n, "the failed run rolled back its bookkeeping too")
		return nil
	})
	require.NoError(t, err)
}

// Migration 4 moves a leaf's bounds from its CHECK into its comment and
// drops the CHECK of the leaves that take inserts: a leaf a killed Retire
// left detached is still found with its bounds, and claims still land.
func TestLeanerClaimMigrationKeepsLeavesFindable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := poolAtMigration(t, 3)
	_, err := pool.Exec(ctx, `SELECT keyed_effects_ensure_leaves(interval '10 days', interval '2 days')`)
	require.NoError(t, err)
	var old string
	require.NoError(t, pool.QueryRow(ctx, `SELECT leaf FROM keyed_effects_leaf_bounds('keyed_effects_default') ORDER BY lo LIMIT 1`).Scan(&old))
	_, err = pool.Exec(ctx, `ALTER TABLE keyed_effects_default DETACH PARTITION `+pgx.Identifier{old}.Sanitize())
	require.NoError(t, err)

	applyMigrations(t, pool, effects.Migrations()[3:])

	var checked []string
	rows, err := pool.Query(ctx, `SELECT b.leaf FROM keyed_effects_leaf_bounds('keyed_effects_default') b
JOIN pg_constraint k ON k.conrelid = b.leaf::regclass AND k.conname = b.leaf || '_check' WHERE b.hi > now()`)
	require.NoError(t, err)
	checked, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Empty(t, checked, "leaves taking inserts keep no CHECK")

	client := effectstest.NewClient(t, pool, nil)
	detached, err := client.DetachedLeaves(ctx)
	require.NoError(t, err)
	require.Len(t, detached, 1)
	require.Equal(t, old, detached[0].Name)
	require.Equal(t, "default", detached[0].Class)
	require.Equal(t, detached[0].To.Sub(detached[0].From), 24*time.Hour)

	cl, err := client.Claim(ctx, effects.ClaimParams{Key: effects.MustKey("acme", "order", "1", "charge"), Owner: "o"})
	require.NoError(t, err)
	require.Equal(t, effects.ModeNew, cl.Mode)
	require.NoError(t, client.Complete(ctx, cl, map[string]string{"id": "pi_1"}))
}

// A release whose workers migrate nothing at start claims on a schema
// before migration 5, whose claim takes no NotBefore: Claim falls back to
// the claim that looks in every leaf, and ClaimTx, whose transaction the
// failed call aborted, returns a transient error until the schema is
// migrated.
func TestClaimOnASchemaBeforeMigration5(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := poolAtMigration(t, 4)
	client := effectstest.NewClient(t, pool, nil)
	key := effects.MustKey("acme", "order", "1", "charge")
	p := effects.ClaimParams{Key: key, Owner: "o", NotBefore: time.Now().Add(-time.Minute)}
	cl, err := client.Claim(ctx, p)
	require.NoError(t, err)
	require.Equal(t, effects.ModeNew, cl.Mode)
	require.NoError(t, client.Complete(ctx, cl, map[string]string{"id": "pi_1"}))
	again, err := client.Claim(ctx, p)
	require.NoError(t, err)
	require.True(t, again.Done)

	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := client.ClaimTx(ctx, tx, effects.ClaimParams{Key: effects.MustKey("acme", "order", "2", "charge"), Owner: "o"})
		return err
	})
	require.Error(t, err)
	require.True(t, effects.IsTransient(err), "%v", err)
}

// A release with effects migration 6 whose workers migrate nothing at start
// makes leaves on a schema before it: there is no claim naming leaves to
// rewrite, and claims go on.
func TestEnsureLeavesOnASchemaBeforeMigration6(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := poolAtMigration(t, 5)
	client := effectstest.NewClient(t, pool, nil)
	made, err := client.EnsureLeaves(ctx, 0, 30*24*time.Hour)
	require.NoError(t, err)
	require.NotEmpty(t, made)
	cl, err := client.Claim(ctx, effects.ClaimParams{Key: effects.MustKey("acme", "order", "1", "charge"), Owner: "o",
		NotBefore: time.Now().Add(-time.Minute)})
	require.NoError(t, err)
	require.Equal(t, effects.ModeNew, cl.Mode)
}
