package dbtest_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/keyedhq/keyed/internal/dbtest"
)

func TestNewPoolHasEffectsAndAppTables(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	for _, table := range []string{"keyed_effects", "keyed_effects_migrations", "keyed_schema_migrations", "orders", "keyed_outbox"} {
		var exists bool
		require.NoError(t, pool.QueryRow(context.Background(), `SELECT to_regclass($1) IS NOT NULL`, table).Scan(&exists))
		require.True(t, exists, table)
	}
}
