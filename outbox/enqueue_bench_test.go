package outbox_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/keyedhq/keyed/effects/effectstest"
	"github.com/keyedhq/keyed/internal/dbtest"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/outbox"
)

// BenchmarkEnqueue commits orders with their outbox rows, each in its own
// transaction as the API does, from 8 and 32 concurrent callers while a
// listener waits on the schema's channel, and reports orders/s and the p99
// of one transaction for two ways of waking relays, side by side in
// alternating chunks: every enqueue notifying (notify-each, the baseline)
// and one enqueue per NotifyWindow notifying (coalesced, as shipped).
func BenchmarkEnqueue(b *testing.B) {
	for _, conns := range []int{8, 32} {
		b.Run(fmt.Sprintf("conns=%d", conns), func(b *testing.B) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			_, url := effectstest.NewSchema(b)
			pool := dbtest.Connect(b, url, &effectstest.PoolOpts{MaxConns: int32(conns)})
			store, err := orders.NewStore(pool)
			require.NoError(b, err)
			wake := make(chan struct{}, 1)
			go outbox.Listen(ctx, dbtest.Connect(b, url, &effectstest.PoolOpts{MaxConns: 1}), wake, quietSlog())
			<-wake
			go func() {
				for range wake { // a relay drains its wake-ups
				}
			}()
			var seq atomic.Int64
			enqueue := func() (time.Duration, error) {
				began := time.Now()
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					_, _, err := store.CreateAndEnqueueTx(ctx, tx, orders.NewOrder{TenantID: "bench", ID: fmt.Sprintf("o%08d", seq.Add(1)),
						AmountMinor: 1999, Currency: "usd", CustomerEmail: "ada@example.com", PaymentMethod: "pm_card_visa"})
					return err
				})
				return time.Since(began), err
			}
			sides := []struct {
				name   string
				before func() (restore func())
				took   time.Duration
				lat    []time.Duration
			}{
				{name: "notify-each", before: outbox.NotifyEveryEnqueueForTest},
				{name: "coalesced", before: func() func() { return func() {} }},
			}
			b.ResetTimer()
			const chunk = 500
			for done, round := 0, 0; done < b.N; round++ {
				n := min(chunk, b.N-done)
				for i := range sides {
					s := &sides[(i+round)%len(sides)]
					restore := s.before()
					took, lat := enqueueConcurrently(b, conns, n, enqueue)
					restore()
					s.took += took
					s.lat = append(s.lat, lat...)
				}
				done += n
			}
			b.StopTimer()
			for _, s := range sides {
				slices.Sort(s.lat)
				b.ReportMetric(float64(b.N)/s.took.Seconds(), s.name+"_orders/s")
				b.ReportMetric(percentile(s.lat, 0.99), s.name+"_p99_ms")
			}
			b.ReportMetric(sides[0].took.Seconds()/sides[1].took.Seconds(), "coalesced/notify-each")
		})
	}
}

// enqueueConcurrently runs op n times from workers goroutines and returns
// how long that took and each call's latency.
func enqueueConcurrently(b *testing.B, workers, n int, op func() (time.Duration, error)) (time.Duration, []time.Duration) {
	var wg sync.WaitGroup
	var next atomic.Int64
	lat := make([]time.Duration, n)
	began := time.Now()
	for range workers {
		wg.Go(func() {
			for i := next.Add(1); i <= int64(n); i = next.Add(1) {
				d, err := op()
				if err != nil {
					b.Error(err)
					return
				}
				lat[i-1] = d
			}
		})
	}
	wg.Wait()
	return time.Since(began), lat
}
