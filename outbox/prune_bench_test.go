package outbox_test

import (
	"context"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/effects/effectstest"
	"github.com/keyedhq/keyed/internal/dbtest"
	"github.com/keyedhq/keyed/outbox"
)

// lockingPruneSQL is the DELETE Prune sent before: each batch locked its
// rows and found them again through the primary key.
const lockingPruneSQL = `
DELETE FROM keyed_outbox WHERE id IN (
	SELECT id FROM keyed_outbox
	WHERE sent_at IS NOT NULL AND sent_at < now() - $1 * interval '1 microsecond'
	ORDER BY sent_at LIMIT $2
	FOR UPDATE SKIP LOCKED)`

// BenchmarkPrune retires PRUNE_ROWS (default 500 000) sent rows past the
// retention, each pass on a fresh table after a CHECKPOINT, alternating the
// locking DELETE Prune used before (the baseline) with Prune as shipped,
// in batches of 1000. It reports each one's rows/s and WAL MiB, and their
// ratio.
//
//	go test -run '^$' -bench 'Prune$' -benchtime 3x ./outbox
func BenchmarkPrune(b *testing.B) {
	rows := 500_000
	if v := os.Getenv("PRUNE_ROWS"); v != "" {
		n, err := strconv.Atoi(v)
		require.NoError(b, err)
		rows = n
	}
	retention := (7 * 24 * time.Hour).Microseconds()
	sides := []func(context.Context, *pgxpool.Pool) (int64, error){
		func(ctx context.Context, db *pgxpool.Pool) (int64, error) {
			return effects.DeleteInBatches(ctx, db, 1000, lockingPruneSQL, retention)
		},
		func(ctx context.Context, db *pgxpool.Pool) (int64, error) { return outbox.Prune(ctx, db, nil) },
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
	b.ReportMetric(rate(0), "locking_rows/s")
	b.ReportMetric(rate(1), "rows/s")
	b.ReportMetric(float64(wal[0])/float64(b.N)/(1<<20), "locking_wal_MiB")
	b.ReportMetric(float64(wal[1])/float64(b.N)/(1<<20), "wal_MiB")
	b.ReportMetric(rate(1)/rate(0), "speed-up")
}

// prunePass fills a fresh schema's outbox with rows sent eight days ago,
// checkpoints, and times prune deleting all of them; it returns the time
// and the WAL bytes written meanwhile.
func prunePass(b *testing.B, rows int, prune func(context.Context, *pgxpool.Pool) (int64, error)) (time.Duration, int64) {
	ctx := context.Background()
	pool := dbtest.NewPool(b, &effectstest.PoolOpts{MaxConns: 2})
	_, err := pool.Exec(ctx, `
INSERT INTO keyed_outbox (tenant_id, workflow_type, workflow_id, payload, created_at, available_at, sent_at, run_id,
    amount_minor, currency, task_queue, trace_context)
SELECT 'acme', 'OrderWorkflow', 'order:acme:ord_' || i || ':fulfil',
    jsonb_build_object('tenant_id', 'acme', 'order_id', 'ord_' || i),
    now() - interval '8 days', now() - interval '8 days', now() - interval '8 days' + i * interval '1 millisecond',
    '0193a5f2-7c1e-7d3a-9b8e-' || lpad(i::text, 12, '0'), 4999, 'usd', 'orders',
    '{"traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}'::jsonb
FROM generate_series(1, $1::int) i`, rows)
	require.NoError(b, err)
	for _, sql := range []string{`VACUUM ANALYZE keyed_outbox`, `CHECKPOINT`} {
		_, err = pool.Exec(ctx, sql)
		require.NoError(b, err)
	}
	lsn := func() (s string) {
		require.NoError(b, pool.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&s))
		return s
	}
	before := lsn()
	start := time.Now()
	n, err := prune(ctx, pool)
	d := time.Since(start)
	require.NoError(b, err)
	require.EqualValues(b, rows, n)
	var wal int64
	require.NoError(b, pool.QueryRow(ctx, `SELECT pg_wal_lsn_diff($1::pg_lsn, $2::pg_lsn)::bigint`, lsn(), before).Scan(&wal))
	return d, wal
}
