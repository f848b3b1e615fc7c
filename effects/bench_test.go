package effects_test

import (
	"context"
	"fmt"
	"log/slog"
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
// the Client against the same two SQL statements sent through raw pgx, at 1,
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

// rawClaimComplete is the baseline: the claim INSERT and the completing
// UPDATE that the Client sends, without anything around them.
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
