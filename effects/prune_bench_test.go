package effects_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/effects/effectstest"
)

// lockingPruneSQL is the DELETE Prune sent before: each batch locked its
// records and found them again by key.
const lockingPruneSQL = `
DELETE FROM keyed_effects WHERE key IN (
	SELECT key FROM keyed_effects
	WHERE class = 'legacy' AND created_at < now() - $1 * interval '1 microsecond'
	  AND state <> 'claimed' AND finished_at < now() - $1 * interval '1 microsecond'
	ORDER BY created_at LIMIT $2
	FOR UPDATE SKIP LOCKED)
AND state <> 'claimed'`

// BenchmarkPruneLegacy prunes 300 000 expired records of an unpartitioned
// table (as on an install not converted yet, or a converted one's legacy
// partition), each pass on a fresh table after a CHECKPOINT, alternating
// the locking DELETE Prune sent before (the baseline) with Prune as
// shipped, in batches of 1000. It reports each one's records/s and WAL MiB.
//
//	go test -run '^$' -bench PruneLegacy -benchtime 3x ./effects
func BenchmarkPruneLegacy(b *testing.B) {
	const rows = 300_000
	retention := 30 * 24 * time.Hour
	locking := func() (time.Duration, int64) {
		return prunePass(b, rows, func(ctx context.Context, _ *effects.Client, db effects.DB) (int64, error) {
			return effects.DeleteInBatches(ctx, db, 1000, lockingPruneSQL, retention.Microseconds())
		})
	}
	shipped := func() (time.Duration, int64) {
		return prunePass(b, rows, func(ctx context.Context, c *effects.Client, _ effects.DB) (int64, error) {
			return c.Prune(ctx, &effects.PruneOpts{Retention: retention})
		})
	}
	effectstest.ComparePasses(b, rows, "records", "locking", locking, shipped)
}

// prunePass fills a fresh unpartitioned table with rows charges finished
// 40 days ago, checkpoints, and times prune deleting all of them; it
// returns the time and the WAL bytes written meanwhile.
func prunePass(b *testing.B, rows int, prune func(context.Context, *effects.Client, effects.DB) (int64, error)) (time.Duration, int64) {
	ctx := context.Background()
	pool := effectstest.NewPool(b, &effectstest.PoolOpts{MaxConns: 2, Unpartitioned: true})
	_, err := pool.Exec(ctx, `
INSERT INTO keyed_effects (key, tenant_id, kind, class, state, owner, result, created_at, finished_at)
SELECT 'acme:order:' || lpad(i::text, 32, '0') || ':charge', 'acme', 'charge', 'legacy',
    'succeeded', 'bench', '{"amount":500,"id":"pi_123"}', now() - interval '40 days', now() - interval '40 days'
FROM generate_series(1, $1::int) i`, rows)
	require.NoError(b, err)
	client := effectstest.NewClient(b, pool, nil)
	return effectstest.TimePass(b, pool, "keyed_effects", int64(rows), func(ctx context.Context) (int64, error) {
		return prune(ctx, client, pool)
	})
}
