package effects_test

import (
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/keyedhq/keyed/effects"
)

// TestCompleteIsHOTUpdate pins migration 0009's point: no index covers a
// column that Complete changes, so completing a fresh claim is a HOT update
// (no new index entries). The transaction's own statistics count it.
func TestCompleteIsHOTUpdate(t *testing.T) {
	t.Parallel()
	b := setup(t)
	key := effects.MustKey("acme", "order", "hot1", "charge")
	err := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		cl, err := b.client.ClaimTx(b.ctx, tx, effects.ClaimParams{Key: key, Owner: "wf/charge"})
		require.NoError(t, err)
		require.NoError(t, b.client.CompleteTx(b.ctx, tx, cl, outcome{ID: "pi_1", Amount: 500}))
		var upd, hot int64
		require.NoError(t, tx.QueryRow(b.ctx, `SELECT coalesce(sum(n_tup_upd), 0), coalesce(sum(n_tup_hot_upd), 0)
			FROM pg_stat_xact_user_tables WHERE schemaname = current_schema() AND relname LIKE 'keyed\_effects\_%'`).Scan(&upd, &hot))
		require.EqualValues(t, 1, upd)
		require.EqualValues(t, 1, hot, "Complete must be a HOT update")
		return nil
	})
	require.NoError(t, err)
}

// TestListUsesPrimaryKey pins that List's prefix scan can run on each
// leaf's key index (the key is in the "C" collation), with no tenant index.
func TestListUsesPrimaryKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var indexes []string
	leaves, err := b.client.Leaves(b.ctx)
	require.NoError(t, err)
	require.NotEmpty(t, leaves)
	rows, err := b.pool.Query(b.ctx, `SELECT indexname FROM pg_indexes
		WHERE tablename = $1 AND schemaname = current_schema() ORDER BY indexname`, leaves[0].Name)
	require.NoError(t, err)
	indexes, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{leaves[0].Name + "_created", leaves[0].Name + "_key"}, indexes)

	err = pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		_, err := tx.Exec(b.ctx, `SET LOCAL enable_seqscan = off`)
		require.NoError(t, err)
		rows, err := tx.Query(b.ctx, `EXPLAIN SELECT * FROM keyed_effects
			WHERE tenant_id = 'acme' AND starts_with(key, 'acme:order:9f3a:') ORDER BY created_at, key`)
		require.NoError(t, err)
		plan, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		require.Contains(t, strings.Join(plan, "\n"), "Index Cond: ((key >= 'acme:order:9f3a:'::text) AND (key < 'acme:order:9f3a;'::text))")
		return nil
	})
	require.NoError(t, err)
}
