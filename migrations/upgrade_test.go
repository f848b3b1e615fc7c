package migrations_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/effects/effectstest"
	"github.com/keyedhq/keyed/migrations"
)

// oldEffectsFiles are the app migrations that created the effects tables
// before effects had its own migration line, as they were then.
var oldEffectsFiles = map[int]string{
	1: "testdata/old_0001_effects.sql",
	6: "testdata/old_0006_effects_kind_idx.sql",
	9: "testdata/old_0009_effects_slim.sql",
}

// A database that ran the old app files up to version 1, 6 or 9 upgrades,
// then converts (effects.Partition), to exactly the effects schema of a new
// database, keeping its records.
func TestUpgradeFromAppOwnedEffectsTables(t *testing.T) {
	t.Parallel()
	fresh := newPool(t)
	_, err := migrations.Apply(context.Background(), fresh, quiet)
	require.NoError(t, err)
	want := effectsSchema(t, fresh)
	for _, upTo := range []int{1, 6, 9} {
		t.Run(filepath.Base(oldEffectsFiles[upTo]), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool := newPool(t)
			applyOld(t, pool, upTo)
			if upTo < 9 {
				require.NotEqual(t, want, effectsSchema(t, pool), "the old files leave an older shape")
			}
			_, err := pool.Exec(ctx, `INSERT INTO keyed_effects (key, tenant_id, kind, state, owner, lease_until)
				VALUES ('acme:order:1:charge', 'acme', 'charge', 'claimed', 'wf/charge', now() + interval '1 minute')`)
			require.NoError(t, err)

			applied, err := migrations.Apply(ctx, pool, quiet)
			require.NoError(t, err)
			require.NotContains(t, applied, upTo, "recorded versions still match")
			converted, err := effects.Partition(ctx, pool)
			require.NoError(t, err)
			require.True(t, converted, "a table with records converts on request, not in the migration")
			require.Equal(t, want, effectsSchema(t, pool))

			var owner string
			require.NoError(t, pool.QueryRow(ctx, `SELECT owner FROM keyed_effects WHERE key = 'acme:order:1:charge'`).Scan(&owner))
			require.Equal(t, "wf/charge", owner, "records survive the upgrade")
		})
	}
}

func newPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	_, url := effectstest.NewSchema(t)
	pool, err := pgxpool.New(context.Background(), url)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// applyOld migrates pool as keyed's Apply did before the effects line: the
// files up to version upTo, with the old SQL for the effects files, each
// recorded in keyed_schema_migrations.
func applyOld(t *testing.T, pool *pgxpool.Pool, upTo int) {
	t.Helper()
	ctx := context.Background()
	all, err := migrations.All()
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `CREATE TABLE keyed_schema_migrations (
		version    integer     PRIMARY KEY,
		name       text        NOT NULL,
		applied_at timestamptz NOT NULL DEFAULT now())`)
	require.NoError(t, err)
	for _, m := range all {
		if m.Version > upTo {
			break
		}
		sql := m.SQL
		if old, ok := oldEffectsFiles[m.Version]; ok {
			b, err := os.ReadFile(old)
			require.NoError(t, err)
			sql = string(b)
		}
		_, err := pool.Exec(ctx, sql)
		require.NoError(t, err, m.Name)
		_, err = pool.Exec(ctx, `INSERT INTO keyed_schema_migrations (version, name) VALUES ($1, $2)`, m.Version, m.Name)
		require.NoError(t, err)
	}
}

// effectsSchema describes keyed_effects in the pool's schema: its columns,
// indexes and constraints, with the schema's name left out.
func effectsSchema(t *testing.T, pool *pgxpool.Pool) []string {
	t.Helper()
	ctx := context.Background()
	var schema string
	require.NoError(t, pool.QueryRow(ctx, `SELECT current_schema()`).Scan(&schema))
	rows, err := pool.Query(ctx, `
SELECT format('column %s %s collation=%s nullable=%s default=%s', column_name, data_type,
	coalesce(collation_name, '-'), is_nullable, coalesce(column_default, '-'))
FROM information_schema.columns
WHERE table_schema = current_schema() AND table_name = 'keyed_effects'
UNION ALL
SELECT 'index ' || indexdef FROM pg_indexes WHERE schemaname = current_schema() AND tablename = 'keyed_effects'
UNION ALL
SELECT format('constraint %s %s', conname, pg_get_constraintdef(oid)) FROM pg_constraint
WHERE conrelid = 'keyed_effects'::regclass
ORDER BY 1`)
	require.NoError(t, err)
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.NotEmpty(t, lines)
	for i, l := range lines {
		lines[i] = strings.ReplaceAll(l, schema+".", "")
	}
	return lines
}
