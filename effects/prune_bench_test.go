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
	sides := []func(context.Context, *effects.Client, effects.DB) (int64, error){
		func(ctx context.Context, _ *effects.Client, db effects.DB) (int64, error) {
			return effects.DeleteInBatches(ctx, db, 1000, lockingPruneSQL, retention.Microseconds())
		},
		func(ctx context.Context, c *effects.Client, _ effects.DB) (int64, error) {
			return c.Prune(ctx, &effects.PruneOpts{Retention: retention})
		},
	}
	var took [2]time.Duration
	var wal [2]int64
	b.StopTimer()
	for i := range b.N {
		for k := range sides {
			j := (i + k) % 2
			d, w := prunePass(b, rows, sides[j])
			took[j] += d
			wal[j] += w
		}
	}
	rate := func(j int) float64 { return float64(rows*b.N) / took[j].Seconds() }
	b.ReportMetric(rate(0), "locking_records/s")
	b.ReportMetric(rate(1), "records/s")
	b.ReportMetric(float64(wal[0])/float64(b.N)/(1<<20), "locking_wal_MiB")
	b.ReportMetric(float64(wal[1])/float64(b.N)/(1<<20), "wal_MiB")
	b.ReportMetric(rate(1)/rate(0), "speed-up")
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
	for _, sql := range []string{`VACUUM ANALYZE keyed_effects`, `CHECKPOINT`} {
		_, err = pool.Exec(ctx, sql)
		require.NoError(b, err)
	}
	lsn := func() (s string) {
		require.NoError(b, pool.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&s))
		return s
	}
	client := effectstest.NewClient(b, pool, nil)
	before := lsn()
	start := time.Now()
	n, err := prune(ctx, client, pool)
	d := time.Since(start)
	require.NoError(b, err)
	require.EqualValues(b, rows, n)
	var wal int64
	require.NoError(b, pool.QueryRow(ctx, `SELECT pg_wal_lsn_diff($1::pg_lsn, $2::pg_lsn)::bigint`, lsn(), before).Scan(&wal))
	return d, wal
}
