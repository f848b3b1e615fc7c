package migrations_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/keyedhq/keyed/migrations"
)

// Migration 0016 gives the unsent rows of an existing outbox their rounds,
// in id order per tenant (rows without a tenant count as one tenant),
// so that a backlog from before the upgrade is claimed fairly too. Sent
// rows keep round 0.
func TestOutboxRoundsFillOnUpgrade(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newPool(t)
	applyOld(t, pool, 15)
	_, err := pool.Exec(ctx, `
INSERT INTO keyed_outbox (tenant_id, workflow_type, workflow_id, payload, sent_at) VALUES
	('a', 'W', 'a1', '{}', now()),
	('a', 'W', 'a2', '{}', NULL),
	('b', 'W', 'b1', '{}', NULL),
	('a', 'W', 'a3', '{}', NULL),
	(NULL, 'W', 'n1', '{}', NULL),
	('b', 'W', 'b2', '{}', NULL),
	(NULL, 'W', 'n2', '{}', NULL),
	('a', 'W', 'a4', '{}', NULL)`)
	require.NoError(t, err)

	applied, err := migrations.Apply(ctx, pool, quiet)
	require.NoError(t, err)
	require.Contains(t, applied, 16)
	rows, err := pool.Query(ctx, `SELECT workflow_id, fair_round FROM keyed_outbox`)
	require.NoError(t, err)
	rounds := map[string]int64{}
	var id string
	var round int64
	_, err = pgx.ForEachRow(rows, []any{&id, &round}, func() error { rounds[id] = round; return nil })
	require.NoError(t, err)
	require.Equal(t, map[string]int64{"a1": 0, "a2": 0, "a3": 1, "a4": 2, "b1": 0, "b2": 1, "n1": 0, "n2": 1}, rounds)
}
