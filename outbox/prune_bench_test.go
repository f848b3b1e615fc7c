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
	locking := func() (time.Duration, int64) {
		return prunePass(b, rows, func(ctx context.Context, db *pgxpool.Pool) (int64, error) {
			return effects.DeleteInBatches(ctx, db, 1000, lockingPruneSQL, retention)
		})
	}
	shipped := func() (time.Duration, int64) {
		return prunePass(b, rows, func(ctx context.Context, db *pgxpool.Pool) (int64, error) { return outbox.Prune(ctx, db, nil) })
	}
	effectstest.ComparePasses(b, rows, "rows", "locking", locking, shipped)
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
	return effectstest.TimePass(b, pool, "keyed_outbox", int64(rows), func(ctx context.Context) (int64, error) {
		return prune(ctx, pool)
	})
}
