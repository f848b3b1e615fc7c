package outbox_test

import (
	"context"
	"flag"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/keyedhq/keyed/effects/effectstest"
	"github.com/keyedhq/keyed/internal/dbtest"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/outbox"
)

var (
	benchFlood   = flag.Int("relay.flood", 10_000, "orders tenant A commits in BenchmarkRelayFairness before B's")
	benchVictims = flag.Int("relay.victims", 50, "orders tenant B commits in BenchmarkRelayFairness, at 10 a second")
)

// BenchmarkRelayFairness measures what tenant A's flood costs tenant B.
// With a relay running (woken by Listen, default options, the production
// starter on the shared dev server), A commits -relay.flood orders, 100 per
// transaction, as fast as Postgres takes them; then B commits
// -relay.victims orders, one per transaction, ten a second. It reports B's
// latency from each commit's return to its start's return (p50-ms, p99-ms,
// max-ms), A's unsent rows when B's first order committed (a-backlog), and
// how long the relay took to start every order, counted from its start
// (drain-s), and its starts per second over that time (starts/s): the same
// work for the FIFO claim the relay had before (claim=fifo) as for the fair
// claim (claim=fair), side by side in one run. Run it with `make
// bench-fair`.
func BenchmarkRelayFairness(b *testing.B) {
	for _, claim := range []string{"fifo", "fair"} {
		b.Run("claim="+claim, func(b *testing.B) {
			for range b.N {
				fairnessLoad(b, claim == "fifo")
			}
		})
	}
}

func fairnessLoad(b *testing.B, fifo bool) {
	_, url := effectstest.NewSchema(b)
	apiPool := dbtest.Connect(b, url, &effectstest.PoolOpts{MaxConns: 8})
	relayPool := dbtest.Connect(b, url, &effectstest.PoolOpts{MaxConns: 8})
	store, err := orders.NewStore(apiPool)
	require.NoError(b, err)
	c := dialBench(b)
	tenantA, tenantB, queue := "flood"+randomHex(4), "quiet"+randomHex(4), "outbox-fair-"+randomHex(4)
	starter := &timedStarter{next: orderStarter(c, queue), at: map[string]time.Time{}}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	wake := make(chan struct{}, 1)
	go outbox.Listen(ctx, relayPool, wake, quietSlog())
	r, err := outbox.NewRelay(relayPool, starter, &outbox.RelayOpts{Wake: wake, Logger: quietSlog()})
	require.NoError(b, err)
	if fifo {
		r.UseFIFOClaimForTest()
	}
	relayDone := make(chan error, 1)
	began := time.Now()
	go func() { relayDone <- r.Run(ctx) }()
	<-wake // listening; the relay's first poll is under way

	create := func(tx pgx.Tx, tenant string, i int) error {
		o := orders.NewOrder{TenantID: tenant, ID: fmt.Sprintf("o%06d", i), AmountMinor: 1999, Currency: "usd",
			CustomerEmail: "ada@example.com", PaymentMethod: "pm_card_visa"}
		_, _, err := store.CreateAndEnqueueTx(ctx, tx, o)
		return err
	}
	for i := 0; i < *benchFlood; i += 100 {
		require.NoError(b, pgx.BeginFunc(ctx, apiPool, func(tx pgx.Tx) error {
			for j := i; j < min(i+100, *benchFlood); j++ {
				if err := create(tx, tenantA, j); err != nil {
					return err
				}
			}
			return nil
		}))
	}
	var backlog int
	require.NoError(b, apiPool.QueryRow(ctx, `SELECT count(*) FROM keyed_outbox WHERE sent_at IS NULL`).Scan(&backlog))

	committed := offer(b, 10, *benchVictims, func(i int) (string, error) {
		err := pgx.BeginFunc(ctx, apiPool, func(tx pgx.Tx) error { return create(tx, tenantB, i) })
		return orders.WorkflowID(tenantB, fmt.Sprintf("o%06d", i)), err
	})
	total := *benchFlood + len(committed)
	require.Eventually(b, func() bool { return starter.count() >= total }, 30*time.Minute, 10*time.Millisecond,
		"every order is started")
	elapsed := time.Since(began)
	cancel()
	require.NoError(b, <-relayDone)
	b.ReportMetric(float64(backlog), "a-backlog")
	b.ReportMetric(elapsed.Seconds(), "drain-s")
	b.ReportMetric(float64(total)/elapsed.Seconds(), "starts/s")
	reportLatencies(b, starter.since(committed))
}
