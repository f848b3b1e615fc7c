package effects_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/effects/effectstest"
)

// BenchmarkClaimComplete measures claim plus complete of fresh keys through
// the Client against the bare two SQL statements sent through raw pgx, at 1,
// 8 and 32 connections, in the same run. It reports both rates and
// keyed/raw, the ratio to watch (target: 0.9 or better).
func BenchmarkClaimComplete(b *testing.B) {
	for _, conns := range []int{1, 8, 32} {
		b.Run(fmt.Sprintf("conns=%d", conns), func(b *testing.B) {
			pool := effectstest.NewPool(b, &effectstest.PoolOpts{MaxConns: int32(conns)})
			metrics, err := effects.NewMetrics(prometheus.NewRegistry())
			require.NoError(b, err)
			// Logging is switched off: the benchmark measures the library,
			// not a log handler's formatting.
			client := effectstest.NewClient(b, pool, &effects.ClientOpts{
				Metrics: metrics,
				Logger:  slog.New(slog.DiscardHandler),
			})
			ctx := context.Background()
			var seq atomic.Int64

			keyed := func() error {
				key := effects.MustKey("bench", "order", fmt.Sprint(seq.Add(1)), "charge")
				cl, err := client.Claim(ctx, effects.ClaimParams{Key: key, Owner: "bench"})
				if err != nil {
					return err
				}
				return client.Complete(ctx, cl, map[string]any{"id": "pi_123", "amount": 500})
			}
			raw := func() error { return rawClaimComplete(ctx, pool, fmt.Sprintf("bench:order:%d:charge", seq.Add(1))) }

			b.ResetTimer()
			// Alternate in small chunks, swapping which side goes first, so
			// that both see the same table size, cache and machine load.
			const chunk = 250
			var keyedTime, rawTime time.Duration
			done := 0
			for round := 0; done < b.N; round++ {
				n := min(chunk, b.N-done)
				if round%2 == 0 {
					keyedTime += runConcurrent(b, conns, n, keyed)
					rawTime += runConcurrent(b, conns, n, raw)
				} else {
					rawTime += runConcurrent(b, conns, n, raw)
					keyedTime += runConcurrent(b, conns, n, keyed)
				}
				done += n
			}
			b.StopTimer()
			ops := float64(b.N)
			keyedRate, rawRate := ops/keyedTime.Seconds(), ops/rawTime.Seconds()
			b.ReportMetric(keyedRate, "keyed_ops/s")
			b.ReportMetric(rawRate, "raw_ops/s")
			b.ReportMetric(keyedRate/rawRate, "keyed/raw")
		})
	}
}

func runConcurrent(b *testing.B, workers, n int, op func() error) time.Duration {
	var wg sync.WaitGroup
	var next atomic.Int64
	start := time.Now()
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(n) {
				if err := op(); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	return time.Since(start)
}

// rawClaimComplete is the baseline: the plain claim INSERT (the Client's
// claim statement wraps it so that it also reads an existing record in the
// same round trip) and the completing UPDATE the Client sends, without
// anything around them.
func rawClaimComplete(ctx context.Context, pool *pgxpool.Pool, key string) error {
	var gen int64
	var attempts int
	var lease time.Time
	err := pool.QueryRow(ctx, `
INSERT INTO keyed_effects (key, tenant_id, kind, state, owner, fingerprint, lease_until)
VALUES ($1, $2, $3, 'claimed', $4, $5, now() + $6 * interval '1 microsecond')
ON CONFLICT (key) DO NOTHING
RETURNING generation, attempts, lease_until`, key, "bench", "charge", "bench", "", int64(300_000_000)).Scan(&gen, &attempts, &lease)
	if err != nil {
		return err
	}
	_, err = pool.Exec(ctx, `
UPDATE keyed_effects
SET state = 'succeeded', result = $3, lease_until = NULL, finished_at = now(), updated_at = now()
WHERE key = $1 AND generation = $2 AND state = 'claimed'`, key, gen, []byte(`{"amount":500,"id":"pi_123"}`))
	return err
}

// legacyLayoutSQL undoes migration 0009: the key in the database's default
// collation, the tenant, finished and kind/created indexes.
// BenchmarkEffectStorage compares it with the current layout.
const legacyLayoutSQL = `
ALTER TABLE keyed_effects ALTER COLUMN key TYPE text COLLATE "default";
DROP INDEX keyed_effects_created_idx;
CREATE INDEX keyed_effects_finished_idx ON keyed_effects (finished_at) WHERE state <> 'claimed';
CREATE INDEX keyed_effects_tenant_idx ON keyed_effects (tenant_id, key text_pattern_ops);
CREATE INDEX keyed_effects_kind_created_idx ON keyed_effects (kind, created_at);`

// BenchmarkEffectStorage loads the same records into the layout before
// migration 0009 and the current one, as the pipeline writes them (a batch
// of claims, then the same batch completed), and reports bytes per million
// records (table and indexes, as loaded and after VACUUM), the share of HOT
// completions, and how fast Prune deletes them. It ignores b.N: run it with
// -benchtime 1x. STORAGE_ROWS sets the record count (default 100000).
func BenchmarkEffectStorage(b *testing.B) {
	rows := 100_000
	if v := os.Getenv("STORAGE_ROWS"); v != "" {
		n, err := strconv.Atoi(v)
		require.NoError(b, err, "STORAGE_ROWS")
		rows = n
	}
	for _, layout := range []string{"before", "after"} {
		b.Run("layout="+layout, func(b *testing.B) {
			pool := effectstest.NewPool(b, &effectstest.PoolOpts{MaxConns: 4})
			ctx := context.Background()
			if layout == "before" {
				_, err := pool.Exec(ctx, legacyLayoutSQL)
				require.NoError(b, err)
			}
			loadEffects(b, pool, rows)
			perM := func(bytes int64) float64 { return float64(bytes) * 1e6 / float64(rows) / (1 << 20) }
			heap, idx := effectSizes(b, pool)
			b.ReportMetric(perM(heap+idx), "MiB/M_loaded")
			var hot, upd int64
			require.NoError(b, pool.QueryRow(ctx, `SELECT n_tup_hot_upd, n_tup_upd FROM pg_stat_user_tables
				WHERE relid = 'keyed_effects'::regclass`).Scan(&hot, &upd))
			if upd > 0 {
				b.ReportMetric(float64(hot)/float64(upd), "hot_share")
			}
			_, err := pool.Exec(ctx, `VACUUM ANALYZE keyed_effects`)
			require.NoError(b, err)
			heap, idx = effectSizes(b, pool)
			b.ReportMetric(perM(heap), "heap_MiB/M")
			b.ReportMetric(perM(idx), "index_MiB/M")
			b.ReportMetric(perM(heap+idx), "MiB/M")

			client := effectstest.NewClient(b, pool, &effects.ClientOpts{Logger: slog.New(slog.DiscardHandler)})
			start := time.Now()
			n, err := client.Prune(ctx, &effects.PruneOpts{Retention: effects.DefaultRetention})
			require.NoError(b, err)
			require.EqualValues(b, rows, n, "every loaded record is past the retention")
			b.ReportMetric(float64(n)/time.Since(start).Seconds(), "pruned/s")
		})
	}
}

// loadEffects writes rows finished records, 40 days old, in batches of 5:
// the batch's claims (the claim INSERT's columns), then the batch completed
// (the Complete UPDATE's columns), so that completions find their rows in
// the page still being filled, as they do in the pipeline, where a step
// completes its claim milliseconds after making it.
func loadEffects(b *testing.B, pool *pgxpool.Pool, rows int) {
	ctx := context.Background()
	const batch = 5
	kinds := []string{"charge", "mark_paid", "receipt"}
	for from := 0; from < rows; from += batch {
		var keys, tenants, ks, owners []string
		var ages []int64
		for g := from; g < min(from+batch, rows); g++ {
			tenant, id, kind := fmt.Sprintf("tenant%d", g%50), fmt.Sprintf("%032x", uint64(g)*0x9e3779b97f4a7c15), kinds[g%3]
			keys = append(keys, tenant+":order:"+id+":"+kind)
			tenants, ks = append(tenants, tenant), append(ks, kind)
			owners = append(owners, "checkout:"+tenant+":"+id+"/"+kind)
			ages = append(ages, int64(rows-g))
		}
		_, err := pool.Exec(ctx, `
INSERT INTO keyed_effects (key, tenant_id, kind, state, owner, fingerprint, lease_until, created_at)
SELECT k, t, kind, 'claimed', o, 'sha256:' || left(md5(k), 32), now() + interval '5 minutes',
       now() - interval '40 days' - age * interval '1 millisecond'
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bigint[]) AS u(k, t, kind, o, age)`,
			keys, tenants, ks, owners, ages)
		require.NoError(b, err)
		_, err = pool.Exec(ctx, `
UPDATE keyed_effects
SET state = 'succeeded', result = '{"amount":500,"id":"pi_3PqRsTuVwXyZ123456789012"}', lease_until = NULL,
    finished_at = created_at + interval '1 second', updated_at = now()
WHERE key = ANY($1)`, keys)
		require.NoError(b, err)
	}
}

// effectSizes returns keyed_effects' heap (with TOAST) and index sizes.
func effectSizes(b *testing.B, pool *pgxpool.Pool) (heap, idx int64) {
	err := pool.QueryRow(context.Background(), `SELECT pg_table_size('keyed_effects'), pg_indexes_size('keyed_effects')`).
		Scan(&heap, &idx)
	require.NoError(b, err)
	return heap, idx
}
