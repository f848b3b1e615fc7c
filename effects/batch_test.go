package effects_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/effects/effectstest"
)

func TestDeleteInBatchesRunsBatchesUntilAShortOne(t *testing.T) {
	t.Parallel()
	pool := effectstest.NewPool(t)
	ctx := context.Background()
	_, err := pool.Exec(ctx, `CREATE TABLE things (id int PRIMARY KEY, old bool NOT NULL);
		INSERT INTO things SELECT g, g <= 25 FROM generate_series(1, 40) g`)
	require.NoError(t, err)

	n, err := effects.DeleteInBatches(ctx, pool, 10,
		`DELETE FROM things WHERE id IN (SELECT id FROM things WHERE old = $1 LIMIT $2)`, true)
	require.NoError(t, err)
	require.EqualValues(t, 25, n)
	var left int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM things`).Scan(&left))
	require.Equal(t, 15, left, "only old rows go")

	_, err = effects.DeleteInBatches(ctx, pool, 10, `DELETE FROM nowhere LIMIT $2`, true)
	require.Error(t, err)
}
